/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The CUDA copy backend on a real GPU (skipped cleanly where kvt_cuda_available() is false):
 * bytes stored and loaded back through cuMemcpyBatchAsync, the per-descriptor fallback,
 * descriptor caps and the gather/scatter kernel; stores ordered after the engine's compute
 * stream through the wait event, by DMA and by the kernel;
 * ids rejected before anything moves; the worker end to end.
 */
#include "kvt_test.h"

#include "copy/copy_internal.h"
#include "base/cuda.h"
#include "copy/cuda_frag.h"

#define NB   64
#define HB   96
#define BPB0 (64u << 10)
#define BPB1 4096u

typedef struct grig {
    const kvi_cuda_api *cu;
    kvi_CUdeviceptr dev[2];
    kvt_layout *layout;
    kvt_mirror *mirror;
    kvt_copy *copy;
    kvi_CUstream compute;
    unsigned char *pinned; /* staging for the compute stream */
} grig;

static const uint64_t BPB[2] = {BPB0, BPB1};

static unsigned char pat(uint64_t tag, int r, uint64_t o)
{
    uint64_t x =
        (tag + 1) * 0x9E3779B97F4A7C15ull ^ ((uint64_t)r << 40) ^ o * 0xD6E8FEB86659FD93ull;
    return (unsigned char)(x >> 33 ^ x >> 52);
}

static int setup(void **state)
{
    if (!kvt_cuda_available()) {
        /* On a machine that has a GPU, bench/gpu/run.sh sets KVT_REQUIRE_CUDA: a skip there
         * would hide a broken driver load. */
        if (getenv("KVT_REQUIRE_CUDA"))
            fail_msg("KVT_REQUIRE_CUDA is set but CUDA is unavailable: %s",
                     kvt_cuda_unavailable_reason());
        printf("# CUDA tests skipped: %s\n", kvt_cuda_unavailable_reason());
        *state = NULL;
        return 0;
    }
    grig *g = calloc(1, sizeof(*g));
    g->cu = kvi_cuda();
    KVT_OK_(kvi_cuda_use_device(0, NULL));
    KVT_OK_(kvt_layout_create(0, NB, &g->layout));
    for (int r = 0; r < 2; r++) {
        assert_int_equal(g->cu->MemAlloc(&g->dev[r], NB * BPB[r]), 0);
        assert_int_equal(g->cu->MemsetD8(g->dev[r], 0, NB * BPB[r]), 0);
        KVT_OK_(kvt_layout_add_region(g->layout, g->dev[r], BPB[r]));
    }
    kvt_mirror_config mc;
    kvt_mirror_config_init(&mc);
    mc.host_blocks = HB;
    mc.pin_chunk = 1u << 20; /* several registrations */
    KVT_OK_(kvt_mirror_create(&mc, g->layout, &g->mirror));
    assert_true(kvt_mirror_pinned(g->mirror));
    assert_int_equal(g->cu->StreamCreateWithPriority(&g->compute, KVT_CU_STREAM_NON_BLOCKING, 0),
                     0);
    assert_int_equal(g->cu->MemAllocHost((void **)&g->pinned, 256u << 20), 0);
    *state = g;
    return 0;
}

static int teardown(void **state)
{
    grig *g = *state;
    if (!g)
        return 0;
    g->cu->StreamSynchronize(g->compute);
    g->cu->StreamDestroy(g->compute);
    g->cu->MemFreeHost(g->pinned);
    kvt_mirror_destroy(g->mirror);
    kvt_layout_destroy(g->layout);
    for (int r = 0; r < 2; r++)
        g->cu->MemFree(g->dev[r]);
    free(g);
    return 0;
}

#define NEED_GPU(g)                                                                                \
    grig *g = *state;                                                                              \
    if (!g)                                                                                        \
        KVT_SKIP("no CUDA driver or device here");

static void fill_dev(grig *g, uint32_t b, uint64_t tag)
{
    unsigned char buf[BPB0];
    for (int r = 0; r < 2; r++) {
        for (uint64_t o = 0; o < BPB[r]; o++)
            buf[o] = pat(tag, r, o);
        assert_int_equal(g->cu->MemcpyHtoD(g->dev[r] + b * BPB[r], buf, BPB[r]), 0);
    }
}

static void check_host(grig *g, uint32_t b, uint64_t tag)
{
    for (int r = 0; r < 2; r++) {
        const unsigned char *p =
            (const unsigned char *)(uintptr_t)kvt_mirror_regions(g->mirror)[r].base + b * BPB[r];
        for (uint64_t o = 0; o < BPB[r]; o++)
            if (p[o] != pat(tag, r, o))
                fail_msg("host block %u region %d byte %llu", b, r, (unsigned long long)o);
    }
}

static void check_dev(grig *g, uint32_t b, uint64_t tag)
{
    unsigned char buf[BPB0];
    for (int r = 0; r < 2; r++) {
        assert_int_equal(g->cu->MemcpyDtoH(buf, g->dev[r] + b * BPB[r], BPB[r]), 0);
        for (uint64_t o = 0; o < BPB[r]; o++)
            if (buf[o] != pat(tag, r, o))
                fail_msg("device block %u region %d byte %llu", b, r, (unsigned long long)o);
    }
}

static void wait_hwm(kvt_copy *c, int dir, int64_t ev)
{
    int64_t hwm = -1;
    kvt_wait w = kvt_wait_start();
    do
        KVT_OK_(kvt_copy_poll(c, dir, &hwm));
    while (hwm < ev && kvt_wait_more(&w));
    assert_true(hwm >= ev);
}

/* The gather/scatter kernel must load wherever its PTX was built in; on a GPU machine
 * (KVT_REQUIRE_CUDA) a kernel that did not load fails the test, elsewhere it skips. */
static bool need_kernel(kvt_copy *c)
{
    const char *why = "";
    if (strcmp(kvi_copy_cuda_kernel(c, 4096, &why), "cuda_gather") == 0)
        return true;
    if (getenv("KVT_REQUIRE_CUDA") && kvi_cuda_frag_ptx_len > 0)
        fail_msg("the gather/scatter kernel did not load: %s", why);
    print_message("SKIPPED: gather/scatter kernel not available: %s\n", why);
    kvt_test_skips++;
    return false;
}

/* kernel_max: kvt_copy_config.kernel_max_bytes (0: DMA only; UINT64_MAX: the kernel for all) */
static void roundtrip(grig *g, bool fallback, uint32_t max_desc, uint64_t kernel_max)
{
    kvt_copy_config cc;
    kvt_copy_config_init(&cc);
    cc.force_fallback = fallback;
    cc.max_descriptors = max_desc;
    cc.kernel_max_bytes = kernel_max;
    kvt_copy *c;
    KVT_OK_(kvt_copy_create(&cc, g->layout, g->mirror, &c));
    assert_int_equal(kvt_copy_backend_kind(c), KVT_BACKEND_CUDA);
    if (kernel_max == 0)
        assert_string_equal(kvt_copy_kernel_name(c, 4096), "dma");
    else if (!need_kernel(c)) {
        kvt_copy_destroy(c);
        return;
    }
    assert_int_equal(kvt_copy_batched(c), !fallback && g->cu->MemcpyBatchAsync != NULL);
    /* Two events each way: one run of 10 blocks (2 descriptors averaging 340 KiB: DMA under
     * the default 128 KiB), then 10 scattered blocks (20 averaging 34 KiB: the kernel). */
    uint32_t src[20], dst[20], back[20];
    for (uint32_t i = 0; i < 20; i++) {
        src[i] = i < 10 ? 3 + i : 40 - 2 * (i - 10);
        dst[i] = i < 10 ? 50 + i : 5 + 3 * (i - 10);
        back[i] = (src[i] + 21) % NB;
        fill_dev(g, src[i], 1000 * fallback + max_desc + src[i]);
    }
    KVT_OK_(kvt_copy_submit(c, KVT_COPY_STORE, 0, src, dst, 10, NULL));
    KVT_OK_(kvt_copy_submit(c, KVT_COPY_STORE, 1, src + 10, dst + 10, 10, NULL));
    wait_hwm(c, KVT_COPY_STORE, 1);
    for (uint32_t i = 0; i < 20; i++)
        check_host(g, dst[i], 1000 * fallback + max_desc + src[i]);
    KVT_OK_(kvt_copy_submit(c, KVT_COPY_LOAD, 4, dst, back, 10, NULL));
    KVT_OK_(kvt_copy_submit(c, KVT_COPY_LOAD, 5, dst + 10, back + 10, 10, NULL));
    KVT_OK_(kvt_copy_flush(c));
    wait_hwm(c, KVT_COPY_LOAD, 5);
    for (uint32_t i = 0; i < 20; i++)
        check_dev(g, back[i], 1000 * fallback + max_desc + src[i]);
    /* each event took the path its fragments' mean size asks for */
    kvt_copy_stats st;
    kvt_copy_get_stats(c, &st);
    uint64_t by_kernel = kernel_max == 0 ? 0 : kernel_max == UINT64_MAX ? 2 : 1;
    for (int d = 0; d < 2; d++) {
        assert_int_equal(st.events[d], 2);
        assert_int_equal(st.kernel_events[d], by_kernel);
    }
    int64_t failed[2];
    assert_int_equal(kvt_copy_take_failed(c, KVT_COPY_LOAD, failed, 2), 0);
    kvt_copy_destroy(c);
}

static void test_cuda_roundtrip_batched(void **state)
{
    NEED_GPU(g);
    if (!g->cu->MemcpyBatchAsync)
        printf("# driver %d lacks cuMemcpyBatchAsync: %s\n", g->cu->driver_version,
               g->cu->batch_missing);
    roundtrip(g, false, 0, 0);
    roundtrip(g, false, 3, 0);
}

static void test_cuda_roundtrip_fallback(void **state)
{
    NEED_GPU(g);
    roundtrip(g, true, 0, 0);
}

/* Every job through the kernel (long runs too), then the default: events whose fragments
 * average up to 128 KiB by the kernel, the event of one long run by DMA. */
static void test_cuda_roundtrip_kernel(void **state)
{
    NEED_GPU(g);
    roundtrip(g, false, 0, UINT64_MAX);
    roundtrip(g, false, 0, 128u << 10);
}

/* The engine writes block 7 on its compute stream behind 256 MiB of other work; a store
 * that waits on the compute-done event must see the new bytes. */
static void store_waits_for_compute(grig *g, uint64_t kernel_max)
{
    kvt_copy_config cc;
    kvt_copy_config_init(&cc);
    cc.kernel_max_bytes = kernel_max;
    kvt_copy *c;
    KVT_OK_(kvt_copy_create(&cc, g->layout, g->mirror, &c));
    if (kernel_max && !need_kernel(c)) {
        kvt_copy_destroy(c);
        return;
    }
    kvi_CUdeviceptr scratch;
    assert_int_equal(g->cu->MemAlloc(&scratch, 256u << 20), 0);
    kvi_CUevent done;
    assert_int_equal(g->cu->EventCreate(&done, KVT_CU_EVENT_DISABLE_TIMING), 0);
    for (int round = 0; round < 5; round++) {
        fill_dev(g, 7, 1);
        uint64_t tag = 77 + round;
        for (int r = 0; r < 2; r++)
            for (uint64_t o = 0; o < BPB[r]; o++)
                g->pinned[(r ? BPB0 : 0) + o] = pat(tag, r, o);
        /* slow compute: a big copy, then the block's new contents */
        assert_int_equal(g->cu->MemcpyAsync(scratch, (kvi_CUdeviceptr)(uintptr_t)g->pinned,
                                            256u << 20, g->compute),
                         0);
        for (int r = 0; r < 2; r++)
            assert_int_equal(
                g->cu->MemcpyAsync(g->dev[r] + 7 * BPB[r],
                                   (kvi_CUdeviceptr)(uintptr_t)(g->pinned + (r ? BPB0 : 0)), BPB[r],
                                   g->compute),
                0);
        assert_int_equal(g->cu->EventRecord(done, g->compute), 0);
        uint32_t s = 7, d = 11 + (uint32_t)round;
        KVT_OK_(kvt_copy_submit(c, KVT_COPY_STORE, round, &s, &d, 1, done));
        wait_hwm(c, KVT_COPY_STORE, round);
        check_host(g, d, tag);
    }
    g->cu->EventDestroy(done);
    g->cu->MemFree(scratch);
    kvt_copy_destroy(c);
}

static void test_cuda_store_waits_for_compute(void **state)
{
    NEED_GPU(g);
    store_waits_for_compute(g, 0);          /* DMA */
    store_waits_for_compute(g, UINT64_MAX); /* the kernel */
}

/* The public device-memory helpers: a filled allocation reads back as filled, and the
 * driver's copy rate is measured over pinned memory. */
static void test_cuda_public_helpers(void **state)
{
    grig *g = *state;
    if (!g)
        skip();
    const uint64_t n = 8u << 20;
    uint64_t d = 0;
    KVT_OK_(kvt_cuda_mem_alloc(0, 2 * n, &d));
    assert_true(d != 0);
    KVT_OK_(kvt_cuda_mem_fill(0, d, 0xA5, 2 * n));
    assert_int_equal(g->cu->MemcpyDtoH(g->pinned, d + n - 4096, 4096), 0);
    for (int i = 0; i < 4096; i++)
        assert_int_equal(g->pinned[i], 0xA5);
    double gbps[3];
    KVT_OK_(kvt_cuda_memcpy_rate(0, (uint64_t)(uintptr_t)g->pinned, d, n, 2, gbps));
    for (int i = 0; i < 3; i++)
        assert_true(gbps[i] > 0);
    assert_true(kvt_cuda_driver_version() > 0);
    kvt_cuda_mem_free(0, d);
    KVT_ERR_(kvt_cuda_mem_alloc(99, n, &d), KVT_EINVAL);
}

static void test_cuda_ids_checked(void **state)
{
    NEED_GPU(g);
    kvt_copy_config cc;
    kvt_copy_config_init(&cc);
    kvt_copy *c;
    KVT_OK_(kvt_copy_create(&cc, g->layout, g->mirror, &c));
    uint32_t s[2] = {1, NB}, d[2] = {1, 2};
    KVT_ERR_(kvt_copy_submit(c, KVT_COPY_STORE, 0, s, d, 2, NULL), KVT_ERANGE);
    uint32_t hs[2] = {HB, 1};
    KVT_ERR_(kvt_copy_submit(c, KVT_COPY_LOAD, 0, hs, d, 2, NULL), KVT_ERANGE);
    assert_int_equal(kvt_copy_outstanding(c, KVT_COPY_STORE), 0);
    kvt_copy_destroy(c);
    /* the CPU backend refuses device memory */
    cc.backend = KVT_BACKEND_CPU;
    KVT_ERR_(kvt_copy_create(&cc, g->layout, g->mirror, &c), KVT_EINVAL);
}

/* The worker on the GPU: a store and a load through bind / get_finished with the engine's
 * compute stream. */
static void test_cuda_worker(void **state)
{
    NEED_GPU(g);
    kvt_worker_config wc;
    kvt_worker_config_init(&wc);
    kvt_worker *w;
    KVT_OK_(kvt_worker_create(&wc, g->layout, g->mirror, &w));
    kvt_offload_meta m;
    kvt_offload_meta_init(&m);
    kvt_offload_worker_meta wm;
    kvt_offload_worker_meta_init(&wm);
    for (uint32_t b = 1; b <= 8; b++)
        fill_dev(g, b, 500 + b);
    m.store_event = 0;
    for (uint32_t b = 1; b <= 8; b++)
        KVT_OK_(kvt_offload_meta_add_store(&m, b, 80 + b));
    KVT_OK_(kvt_worker_bind(w, &m));
    const kvt_str *reqs;
    uint32_t n;
    KVT_OK_(kvt_worker_get_finished(w, g->compute, &reqs, &n));
    kvt_worker_clear(w);
    kvt_wait wt = kvt_wait_start();
    do {
        KVT_OK_(kvt_worker_get_finished(w, g->compute, &reqs, &n));
        KVT_OK_(kvt_worker_build_meta(w, &wm));
    } while (!wm.stores.n_completed && kvt_wait_more(&wt));
    assert_int_equal(wm.stores.n_completed, 1);
    for (uint32_t b = 1; b <= 8; b++)
        check_host(g, 80 + b, 500 + b);
    kvt_offload_meta_clear(&m);
    m.load_event = 0;
    for (uint32_t b = 1; b <= 8; b++)
        KVT_OK_(kvt_offload_meta_add_load(&m, 30 + b, 80 + b));
    KVT_OK_(kvt_offload_meta_add_load_req(&m, 0, "gpu-req", 7));
    m.need_flush = true;
    KVT_OK_(kvt_worker_bind(w, &m));
    KVT_OK_(kvt_worker_get_finished(w, g->compute, &reqs, &n));
    KVT_OK_(kvt_worker_handle_preemptions(w));
    if (n == 0)
        KVT_OK_(kvt_worker_get_finished(w, g->compute, &reqs, &n));
    assert_int_equal(n, 1);
    assert_string_equal(reqs[0].ptr, "gpu-req");
    for (uint32_t b = 1; b <= 8; b++)
        check_dev(g, 30 + b, 500 + b);
    kvt_worker_clear(w);
    kvt_worker_destroy(w);
    kvt_offload_meta_release(&m);
    kvt_offload_worker_meta_release(&wm);
}

/* The disk tier over device memory: blocks go through pinned staging buffers and a copy
 * stream, after the engine's compute point; stored blocks come back byte for byte. */
static void test_cuda_disk_roundtrip(void **state)
{
    NEED_GPU(g);
    kvt_disk_config dc;
    kvt_disk_config_init(&dc);
    dc.path = "kvt-cuda-disk"; /* the current directory: the build tree, not tmpfs */
    dc.capacity_bytes = 32 * (BPB0 + BPB1);
    dc.queue_depth = 4;
    kvt_disk *d;
    int rc = kvt_disk_create(&dc, g->layout, &d);
    if (rc == KVT_ESYS && strstr(kvt_last_error(), "O_DIRECT")) {
        dc.page_cache = true;
        rc = kvt_disk_create(&dc, g->layout, &d);
    }
    KVT_OK_(rc);
    kvi_CUevent done;
    assert_int_equal(g->cu->EventCreate(&done, KVT_CU_EVENT_DISABLE_TIMING), 0);
    uint32_t src[6] = {1, 2, 3, 10, 11, 40}, slot[6] = {0, 1, 2, 7, 5, 30}, back[6];
    for (uint32_t i = 0; i < 6; i++) {
        fill_dev(g, src[i], 900 + i);
        back[i] = 50 + i;
    }
    assert_int_equal(g->cu->EventRecord(done, g->compute), 0);
    KVT_OK_(kvt_disk_submit(d, KVT_COPY_STORE, 0, src, slot, 6, done));
    KVT_OK_(kvt_disk_flush(d));
    KVT_OK_(kvt_disk_submit(d, KVT_COPY_LOAD, 0, slot, back, 6, done));
    KVT_OK_(kvt_disk_flush(d));
    int64_t hwm;
    KVT_OK_(kvt_disk_poll(d, KVT_COPY_LOAD, &hwm));
    assert_int_equal(hwm, 0);
    int64_t failed[2];
    uint32_t inv[2];
    assert_int_equal(kvt_disk_take_failed(d, failed, 2), 0);
    assert_int_equal(kvt_disk_take_invalid_blocks(d, inv, 2), 0);
    for (uint32_t i = 0; i < 6; i++)
        check_dev(g, back[i], 900 + i);
    kvt_disk_destroy(d);
    g->cu->EventDestroy(done);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cuda_roundtrip_batched),
        cmocka_unit_test(test_cuda_roundtrip_fallback),
        cmocka_unit_test(test_cuda_roundtrip_kernel),
        cmocka_unit_test(test_cuda_store_waits_for_compute),
        cmocka_unit_test(test_cuda_ids_checked),
        cmocka_unit_test(test_cuda_public_helpers),
        cmocka_unit_test(test_cuda_worker),
        cmocka_unit_test(test_cuda_disk_roundtrip),
    };
    return kvt_test_exit(cmocka_run_group_tests(tests, setup, teardown));
}
