/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Copy layer on the CPU backend: coalescing (the three examples of spec §3.2), region-major
 * descriptors, layouts (K/V, MLA, padding, shared storage, cross-layer), the host mirror, and
 * the engine: bytes stored and loaded back verified, ids checked before anything moves,
 * events reported in order, flush covering queued events.
 */
#include "kvt_test.h"

#include "copy/copy_internal.h"

static void test_coalesce_spec_examples(void **state)
{
    (void)state;
    kvi_run runs[8];
    uint32_t a_src[] = {1, 2, 3}, a_dst[] = {5, 6, 7};
    assert_int_equal(kvi_copy_coalesce(a_src, a_dst, 3, runs), 1);
    assert_int_equal(runs[0].src, 1);
    assert_int_equal(runs[0].dst, 5);
    assert_int_equal(runs[0].len, 3);
    uint32_t b_src[] = {3, 2, 1}, b_dst[] = {6, 5, 4};
    assert_int_equal(kvi_copy_coalesce(b_src, b_dst, 3, runs), 3);
    uint32_t c_src[] = {1, 1, 2}, c_dst[] = {2, 4, 5};
    assert_int_equal(kvi_copy_coalesce(c_src, c_dst, 3, runs), 2);
    assert_int_equal(runs[0].len, 1);
    assert_int_equal(runs[1].src, 1);
    assert_int_equal(runs[1].dst, 4);
    assert_int_equal(runs[1].len, 2);
    /* only the source ascending, or only the destination: not merged */
    uint32_t d_src[] = {1, 2, 3}, d_dst[] = {5, 9, 10};
    assert_int_equal(kvi_copy_coalesce(d_src, d_dst, 3, runs), 2);
    assert_int_equal(kvi_copy_coalesce(d_src, d_dst, 0, runs), 0);
    uint32_t e_src[] = {UINT32_MAX, 0}, e_dst[] = {4, 5};
    assert_int_equal(kvi_copy_coalesce(e_src, e_dst, 2, runs), 2);
}

static void test_descs_region_major(void **state)
{
    (void)state;
    kvt_region src[2] = {{1000, 10}, {50000, 4}}, dst[2] = {{2000, 10}, {90000, 4}};
    kvi_run runs[2] = {{1, 5, 3}, {9, 0, 1}};
    kvi_desc d[4];
    kvi_copy_build_descs(src, dst, 2, runs, 2, d);
    assert_true(d[0].src == 1010 && d[0].dst == 2050 && d[0].size == 30);
    assert_true(d[1].src == 1090 && d[1].dst == 2000 && d[1].size == 10);
    assert_true(d[2].src == 50004 && d[2].dst == 90020 && d[2].size == 12);
    assert_true(d[3].src == 50036 && d[3].dst == 90000 && d[3].size == 4);
    assert_int_equal(kvi_copy_batches(0, 0), 0);
    assert_int_equal(kvi_copy_batches(9000, 0), 1);
    assert_int_equal(kvi_copy_batches(9000, 8192), 2);
    assert_int_equal(kvi_copy_batches(8192, 8192), 1);
}

static void test_layout_rules(void **state)
{
    (void)state;
    kvt_layout *l;
    KVT_OK_(kvt_layout_create(KVT_HOST_DEVICE, 100, &l));
    /* FlashAttention (2, 100, 16, 8, 128) bf16: block stride 16*8*128*2 = 32 KiB */
    kvt_kv_tensor fa = {KVT_HOST_DEVICE, 1u << 20, 2ull * 100 * 32768, 100, 32768};
    KVT_OK_(kvt_layout_add_tensor(l, &fa));
    assert_int_equal(kvt_layout_num_regions(l), 2);
    const kvt_region *r = kvt_layout_regions(l);
    assert_true(r[0].base == (1u << 20) && r[0].block_bytes == 32768);
    assert_true(r[1].base == (1u << 20) + 100ull * 32768);
    /* another layer's view of the same storage: deduplicated */
    KVT_OK_(kvt_layout_add_tensor(l, &fa));
    assert_int_equal(kvt_layout_num_regions(l), 2);
    /* the same storage with another block size: refused */
    kvt_kv_tensor bad = fa;
    bad.block_stride = 16384;
    KVT_ERR_(kvt_layout_add_tensor(l, &bad), KVT_EINVAL);
    /* MLA (100 x 2 physical pages, 576 B each) plus 100 bytes of padding: one region */
    kvt_kv_tensor mla = {KVT_HOST_DEVICE, 1ull << 30, 200ull * 576 + 100, 200, 576};
    KVT_OK_(kvt_layout_add_tensor(l, &mla));
    assert_int_equal(kvt_layout_num_regions(l), 3);
    assert_true(kvt_layout_regions(l)[2].block_bytes == 1152);
    assert_true(kvt_layout_block_bytes(l) == 2 * 32768 + 1152);
    /* head groups hoisted outside the block dimension: one region per group */
    kvt_kv_tensor hg = {KVT_HOST_DEVICE, 1ull << 32, 4ull * 100 * 256, 100, 256};
    KVT_OK_(kvt_layout_add_tensor(l, &hg));
    assert_int_equal(kvt_layout_num_regions(l), 7);
    /* errors */
    kvt_kv_tensor odd = {KVT_HOST_DEVICE, 1ull << 33, 1u << 20, 150, 64};
    KVT_ERR_(kvt_layout_add_tensor(l, &odd), KVT_EINVAL);
    kvt_kv_tensor small = {KVT_HOST_DEVICE, 1ull << 34, 99 * 64, 100, 64};
    KVT_ERR_(kvt_layout_add_tensor(l, &small), KVT_EINVAL);
    kvt_kv_tensor dev = {0, 1ull << 35, 100 * 64, 100, 64};
    KVT_ERR_(kvt_layout_add_tensor(l, &dev), KVT_EINVAL);
    kvt_kv_tensor zero = {KVT_HOST_DEVICE, 1ull << 36, 100 * 64, 100, 0};
    KVT_ERR_(kvt_layout_add_tensor(l, &zero), KVT_EINVAL);
    kvt_kv_tensor over = {KVT_HOST_DEVICE, 1ull << 37, 100 * 64, 100, 64, 200 * 64};
    KVT_ERR_(kvt_layout_add_tensor(l, &over), KVT_EINVAL); /* a size beyond the storage */
    kvt_kv_tensor tiny = {KVT_HOST_DEVICE, 1ull << 38, 400 * 64, 100, 64, 99 * 64};
    KVT_ERR_(kvt_layout_add_tensor(l, &tiny), KVT_EINVAL); /* a size under one region */
    assert_int_equal(kvt_layout_num_regions(l), 7);
    kvt_layout_destroy(l);

    KVT_ERR_(kvt_layout_create(KVT_HOST_DEVICE, 0, &l), KVT_EINVAL);
    KVT_ERR_(kvt_layout_create(-2, 10, &l), KVT_EINVAL);
}

/* Spec §2.14: an allocator that pads the storage by more than a region (here 1.5 regions)
 * must not add a region of padding: the configured size decides. */
static void test_layout_padding_is_not_a_region(void **state)
{
    (void)state;
    kvt_layout *l;
    KVT_OK_(kvt_layout_create(KVT_HOST_DEVICE, 100, &l));
    uint64_t span = 100ull * 256, size = 2 * span;
    kvt_kv_tensor kv = {KVT_HOST_DEVICE, 1ull << 30, size + span + span / 2, 100, 256, size};
    KVT_OK_(kvt_layout_add_tensor(l, &kv));
    assert_int_equal(kvt_layout_num_regions(l), 2);
    assert_true(kvt_layout_block_bytes(l) == 2 * 256);
    kvt_layout_destroy(l);
    /* without the configured size the padding's whole region counts (the old rule) */
    KVT_OK_(kvt_layout_create(KVT_HOST_DEVICE, 100, &l));
    kv.size_bytes = 0;
    KVT_OK_(kvt_layout_add_tensor(l, &kv));
    assert_int_equal(kvt_layout_num_regions(l), 3);
    kvt_layout_destroy(l);
}

static void test_layout_cross_layer(void **state)
{
    (void)state;
    kvt_layout *l;
    KVT_OK_(kvt_layout_create(KVT_HOST_DEVICE, 10, &l));
    KVT_ERR_(kvt_layout_add_cross_layer(l, 4096, 10 * 32 * 1000 + 1, 1000, 32), KVT_EINVAL);
    KVT_ERR_(kvt_layout_add_cross_layer(l, 4096, 0, 1000, 32), KVT_EINVAL);
    KVT_ERR_(kvt_layout_add_cross_layer(l, 4096, 1000, 0, 32), KVT_EINVAL);
    KVT_OK_(kvt_layout_add_cross_layer(l, 4096, 10 * 32 * 1000, 1000, 32));
    assert_int_equal(kvt_layout_num_regions(l), 1);
    assert_true(kvt_layout_regions(l)[0].block_bytes == 32000);
    KVT_ERR_(kvt_layout_add_region(l, 0, 0), KVT_EINVAL);
    KVT_ERR_(kvt_layout_add_region(l, UINT64_MAX - 100, 64), KVT_ERANGE);
    kvt_layout_destroy(l);
}

static void test_mirror(void **state)
{
    (void)state;
    kvt_layout *l;
    KVT_OK_(kvt_layout_create(KVT_HOST_DEVICE, 8, &l));
    KVT_OK_(kvt_layout_add_region(l, 1 << 20, 3000));
    KVT_OK_(kvt_layout_add_region(l, 2 << 20, 64));
    assert_int_equal(kvt_mirror_blocks_for(l, 10 * 3064 + 5), 10);
    assert_int_equal(kvt_mirror_blocks_for(l, 5), 1);
    kvt_mirror_config mc;
    kvt_mirror_config_init(&mc);
    kvt_mirror *m;
    mc.host_blocks = 0;
    KVT_ERR_(kvt_mirror_create(&mc, l, &m), KVT_EINVAL);
    mc.host_blocks = 33;
    KVT_OK_(kvt_mirror_create(&mc, l, &m));
    assert_int_equal(kvt_mirror_num_blocks(m), 33);
    assert_int_equal(kvt_mirror_num_regions(m), 2);
    const kvt_region *r = kvt_mirror_regions(m);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(r[i].base % 4096, 0);
        const unsigned char *p = (const unsigned char *)(uintptr_t)r[i].base;
        for (uint64_t b = 0; b < 33 * r[i].block_bytes; b++)
            assert_int_equal(p[b], 0);
    }
    assert_true(r[0].block_bytes == 3000 && r[1].block_bytes == 64);
    assert_true(r[1].base >= r[0].base + 33 * 3000);
    kvt_mirror_destroy(m);
    kvt_layout_destroy(l);
}

/* A "device" of host memory: n_regions regions of dev_blocks blocks, and its mirror. */
typedef struct rig {
    kvt_layout *layout;
    kvt_mirror *mirror;
    unsigned char *dev;
    uint32_t dev_blocks, host_blocks, n_regions;
    uint64_t bpb[3];
} rig;

static void rig_init(rig *g, uint32_t dev_blocks, uint32_t host_blocks, uint64_t bpb0)
{
    memset(g, 0, sizeof(*g));
    g->dev_blocks = dev_blocks;
    g->host_blocks = host_blocks;
    g->n_regions = 3;
    g->bpb[0] = bpb0;
    g->bpb[1] = bpb0 / 2 + 64;
    g->bpb[2] = 80;
    uint64_t total = 0;
    for (int r = 0; r < 3; r++)
        total += g->bpb[r] * dev_blocks;
    g->dev = malloc(total);
    assert_non_null(g->dev);
    KVT_OK_(kvt_layout_create(KVT_HOST_DEVICE, dev_blocks, &g->layout));
    uint64_t off = 0;
    for (int r = 0; r < 3; r++) {
        KVT_OK_(kvt_layout_add_region(g->layout, (uint64_t)(uintptr_t)(g->dev + off), g->bpb[r]));
        off += g->bpb[r] * dev_blocks;
    }
    kvt_mirror_config mc;
    kvt_mirror_config_init(&mc);
    mc.host_blocks = host_blocks;
    KVT_OK_(kvt_mirror_create(&mc, g->layout, &g->mirror));
}

static void rig_fini(rig *g)
{
    kvt_mirror_destroy(g->mirror);
    kvt_layout_destroy(g->layout);
    free(g->dev);
}

static unsigned char *dev_block(rig *g, int r, uint32_t b)
{
    return (unsigned char *)(uintptr_t)kvt_layout_regions(g->layout)[r].base + b * g->bpb[r];
}

static unsigned char *host_block(rig *g, int r, uint32_t b)
{
    return (unsigned char *)(uintptr_t)kvt_mirror_regions(g->mirror)[r].base + b * g->bpb[r];
}

static unsigned char pattern(uint64_t tag, int r, uint64_t off)
{
    uint64_t x = tag * 0x9E3779B97F4A7C15ull + (uint64_t)r * 0x632BE59BD9B4E019ull + off;
    x ^= x >> 29;
    return (unsigned char)(x * 0xBF58476D1CE4E5B9ull >> 56);
}

static void fill_dev(rig *g, uint32_t b, uint64_t tag)
{
    for (int r = 0; r < 3; r++) {
        unsigned char *p = dev_block(g, r, b);
        for (uint64_t o = 0; o < g->bpb[r]; o++)
            p[o] = pattern(tag, r, o);
    }
}

static void check_block(rig *g, bool host, uint32_t b, uint64_t tag)
{
    for (int r = 0; r < 3; r++) {
        unsigned char *p = host ? host_block(g, r, b) : dev_block(g, r, b);
        for (uint64_t o = 0; o < g->bpb[r]; o++)
            if (p[o] != pattern(tag, r, o))
                fail_msg("%s block %u region %d byte %llu: %u != %u", host ? "host" : "device", b,
                         r, (unsigned long long)o, p[o], pattern(tag, r, o));
    }
}

static void wait_hwm(kvt_copy *c, int dir, int64_t event)
{
    int64_t hwm = -1;
    kvt_wait w = kvt_wait_start();
    do
        KVT_OK_(kvt_copy_poll(c, dir, &hwm));
    while (hwm < event && kvt_wait_more(&w));
    assert_true(hwm >= event);
}

/* Random stores then loads into other device blocks, through every thread count and chunk
 * size, with a second tag overwriting some host blocks before they are loaded. */
static void roundtrip(uint32_t threads, uint64_t chunk, uint64_t bpb0, uint64_t nt_min)
{
    uint64_t seed = kvt_test_seed();
    rig g;
    rig_init(&g, 64, 96, bpb0);
    kvt_copy_config cc;
    kvt_copy_config_init(&cc);
    cc.threads = threads;
    cc.chunk_bytes = chunk;
    cc.nt_min_bytes = nt_min;
    kvt_copy *c;
    KVT_OK_(kvt_copy_create(&cc, g.layout, g.mirror, &c));
    assert_int_equal(kvt_copy_backend_kind(c), KVT_BACKEND_CPU);
    assert_false(kvt_copy_batched(c));
    uint64_t host_tag[96] = {0};
    int64_t store_ev = 0, load_ev = 0;
    for (int round = 0; round < 20; round++) {
        /* store up to 16 distinct device blocks into distinct host blocks (sometimes runs) */
        uint32_t n = 1 + kvt_test_below(&seed, 16), src[16], dst[16];
        uint32_t dev0 = kvt_test_below(&seed, 64 - 16), host0 = kvt_test_below(&seed, 96 - 16);
        bool run = kvt_test_below(&seed, 2);
        for (uint32_t i = 0; i < n; i++) {
            src[i] = run ? dev0 + i : (dev0 + i * 7) % 64;
            dst[i] = run ? host0 + i : (host0 + i * 13) % 96;
            uint64_t tag = (uint64_t)round << 32 | src[i];
            fill_dev(&g, src[i], tag);
            host_tag[dst[i]] = tag;
        }
        KVT_OK_(kvt_copy_submit(c, KVT_COPY_STORE, store_ev, src, dst, n, NULL));
        wait_hwm(c, KVT_COPY_STORE, store_ev++);
        for (uint32_t i = 0; i < n; i++)
            check_block(&g, true, dst[i], host_tag[dst[i]]);
        /* load them back into other device blocks */
        uint32_t ldst[16];
        for (uint32_t i = 0; i < n; i++)
            ldst[i] = (src[i] + 17) % 64;
        KVT_OK_(kvt_copy_submit(c, KVT_COPY_LOAD, load_ev, dst, ldst, n, NULL));
        wait_hwm(c, KVT_COPY_LOAD, load_ev++);
        for (uint32_t i = 0; i < n; i++)
            check_block(&g, false, ldst[i], host_tag[dst[i]]);
    }
    kvt_copy_destroy(c);
    rig_fini(&g);
}

static void test_roundtrip_threads(void **state)
{
    (void)state;
    roundtrip(1, 1 << 20, 4096, 256 << 10);
    roundtrip(2, 4096, 12288, 0);
    roundtrip(4, 8192, 100000, 256 << 10);
    roundtrip(0, 1 << 20, 64, UINT64_MAX);
}

static void test_ids_checked_before_copy(void **state)
{
    (void)state;
    rig g;
    rig_init(&g, 16, 8, 256);
    kvt_copy_config cc;
    kvt_copy_config_init(&cc);
    cc.threads = 2;
    kvt_copy *c;
    KVT_OK_(kvt_copy_create(&cc, g.layout, g.mirror, &c));
    fill_dev(&g, 3, 42);
    uint32_t src[] = {3, 4}, dst_bad[] = {1, 8}, dst[] = {1, 2};
    KVT_ERR_(kvt_copy_submit(c, KVT_COPY_STORE, 0, src, dst_bad, 2, NULL), KVT_ERANGE);
    assert_non_null(strstr(kvt_last_error(), "host block 8"));
    uint32_t src_bad[] = {3, 16};
    KVT_ERR_(kvt_copy_submit(c, KVT_COPY_STORE, 0, src_bad, dst, 2, NULL), KVT_ERANGE);
    KVT_ERR_(kvt_copy_submit(c, KVT_COPY_LOAD, 0, dst_bad, src, 2, NULL), KVT_ERANGE);
    KVT_ERR_(kvt_copy_submit(c, KVT_COPY_STORE, 0, src, dst, 0, NULL), KVT_EINVAL);
    KVT_ERR_(kvt_copy_submit(c, 7, 0, src, dst, 2, NULL), KVT_EINVAL);
    assert_int_equal(kvt_copy_outstanding(c, KVT_COPY_STORE), 0);
    /* nothing moved: host block 1 still zero */
    for (uint64_t o = 0; o < 256; o++)
        assert_int_equal(host_block(&g, 0, 1)[o], 0);
    KVT_OK_(kvt_copy_submit(c, KVT_COPY_STORE, 5, src, dst, 2, NULL));
    /* event ids must grow per direction; the other direction is independent */
    KVT_ERR_(kvt_copy_submit(c, KVT_COPY_STORE, 5, src, dst, 2, NULL), KVT_EINVAL);
    KVT_ERR_(kvt_copy_submit(c, KVT_COPY_STORE, 4, src, dst, 2, NULL), KVT_EINVAL);
    /* directions are not ordered with each other: the load touches other blocks */
    uint32_t lsrc[] = {6, 7}, ldst[] = {8, 9};
    KVT_OK_(kvt_copy_submit(c, KVT_COPY_LOAD, 0, lsrc, ldst, 2, NULL));
    KVT_OK_(kvt_copy_flush(c));
    int64_t hwm;
    KVT_OK_(kvt_copy_poll(c, KVT_COPY_STORE, &hwm));
    assert_int_equal(hwm, 5);
    KVT_ERR_(kvt_copy_poll(c, 2, &hwm), KVT_EINVAL);
    int64_t failed[4];
    assert_int_equal(kvt_copy_take_failed(c, KVT_COPY_STORE, failed, 4), 0);
    check_block(&g, true, 1, 42);
    /* counters: refused submits count nothing; 3 regions, blocks 3,4 -> 1,2 is one run */
    kvt_copy_stats st;
    kvt_copy_get_stats(c, &st);
    assert_int_equal(st.events[KVT_COPY_STORE], 1);
    assert_int_equal(st.events_done[KVT_COPY_STORE], 1);
    assert_int_equal(st.blocks[KVT_COPY_STORE], 2);
    assert_int_equal(st.bytes[KVT_COPY_STORE], 2 * (g.bpb[0] + g.bpb[1] + g.bpb[2]));
    assert_int_equal(st.descriptors[KVT_COPY_STORE], 3);
    assert_int_equal(st.events[KVT_COPY_LOAD], 1);
    assert_int_equal(st.outstanding[KVT_COPY_LOAD], 1); /* not polled yet */
    char text[4096];
    size_t len;
    KVT_ERR_(kvt_copy_prometheus(c, text, 16, &len), KVT_ENOSPC);
    assert_true(len > 16);
    KVT_OK_(kvt_copy_prometheus(c, text, sizeof(text), &len));
    KVT_PROMTOOL_OK(text);
    assert_non_null(strstr(text, "kvtier_copy_events_total{direction=\"store\"} 1\n"));
    assert_non_null(strstr(text, "# TYPE kvtier_copy_outstanding_events gauge"));
    kvt_copy_destroy(c);
    rig_fini(&g);
}

static void test_backend_errors(void **state)
{
    (void)state;
    rig g;
    rig_init(&g, 16, 8, 256);
    kvt_copy_config cc;
    kvt_copy_config_init(&cc);
    kvt_copy *c;
    cc.backend = 9;
    KVT_ERR_(kvt_copy_create(&cc, g.layout, g.mirror, &c), KVT_EINVAL);
    kvt_copy_config_init(&cc);
    cc.max_events = 0;
    KVT_ERR_(kvt_copy_create(&cc, g.layout, g.mirror, &c), KVT_EINVAL);
    kvt_copy_config_init(&cc);
    cc.chunk_bytes = 100;
    KVT_ERR_(kvt_copy_create(&cc, g.layout, g.mirror, &c), KVT_EINVAL);
    if (!kvt_cuda_available()) {
        kvt_copy_config_init(&cc);
        cc.backend = KVT_BACKEND_CUDA;
        KVT_ERR_(kvt_copy_create(&cc, g.layout, g.mirror, &c), KVT_EUNSUPPORTED);
        assert_non_null(strstr(kvt_last_error(), "CUDA"));
        assert_true(kvt_cuda_unavailable_reason()[0] != '\0');
        /* the device-memory helpers say so too, and touch nothing */
        uint64_t dptr = 7;
        double gbps[3];
        assert_int_equal(kvt_cuda_driver_version(), 0);
        KVT_ERR_(kvt_cuda_mem_alloc(0, 4096, &dptr), KVT_EUNSUPPORTED);
        assert_int_equal(dptr, 7);
        KVT_ERR_(kvt_cuda_mem_fill(0, 4096, 0, 16), KVT_EUNSUPPORTED);
        KVT_ERR_(kvt_cuda_memcpy_rate(0, 4096, 8192, 16, 1, gbps), KVT_EUNSUPPORTED);
        kvt_cuda_mem_free(0, 4096);
    }
    KVT_ERR_(kvt_cuda_mem_alloc(0, 0, NULL), KVT_EINVAL);
    KVT_ERR_(kvt_cuda_memcpy_rate(0, 0, 0, 0, 0, NULL), KVT_EINVAL);
    kvt_copy_config_init(&cc);
    cc.backend = KVT_BACKEND_CPU;
    KVT_OK_(kvt_copy_create(&cc, g.layout, g.mirror, &c)); /* CPU: no CUDA kernel to miss */
    assert_string_equal(kvt_copy_kernel_unavailable(c), "");
    kvt_copy_destroy(c);
    /* a mirror built for another layout */
    kvt_layout *other;
    KVT_OK_(kvt_layout_create(KVT_HOST_DEVICE, 16, &other));
    KVT_OK_(kvt_layout_add_region(other, 4096, 512));
    kvt_copy_config_init(&cc);
    KVT_ERR_(kvt_copy_create(&cc, other, g.mirror, &c), KVT_EINVAL);
    kvt_layout_destroy(other);
    setenv("KVTIER_MAX_BATCH_DESCRIPTORS", "zero", 1);
    KVT_ERR_(kvt_copy_create(&cc, g.layout, g.mirror, &c), KVT_EINVAL);
    unsetenv("KVTIER_MAX_BATCH_DESCRIPTORS");
    const char *bad_max[] = {"128k", "-1", "", "99999999999999999999999"};
    for (size_t i = 0; i < 4; i++) {
        setenv("KVTIER_CUDA_KERNEL_MAX_BYTES", bad_max[i], 1);
        if (bad_max[i][0]) /* empty: as if unset */
            KVT_ERR_(kvt_copy_create(&cc, g.layout, g.mirror, &c), KVT_EINVAL);
        else {
            KVT_OK_(kvt_copy_create(&cc, g.layout, g.mirror, &c));
            kvt_copy_destroy(c);
        }
    }
    setenv("KVTIER_CUDA_KERNEL_MAX_BYTES", "0", 1); /* a byte count: accepted */
    KVT_OK_(kvt_copy_create(&cc, g.layout, g.mirror, &c));
    kvt_copy_destroy(c);
    unsetenv("KVTIER_CUDA_KERNEL_MAX_BYTES");
    rig_fini(&g);
}

/* Many queued events in both directions; flush returns only when all have copied, and poll
 * then reports every one, in order, exactly up to the last. max_events bounds the queue. */
static void test_flush_covers_queued(void **state)
{
    (void)state;
    rig g;
    rig_init(&g, 64, 64, 65536);
    kvt_copy_config cc;
    kvt_copy_config_init(&cc);
    cc.threads = 2;
    cc.max_events = 32;
    cc.chunk_bytes = 4096;
    kvt_copy *c;
    KVT_OK_(kvt_copy_create(&cc, g.layout, g.mirror, &c));
    for (uint32_t b = 0; b < 64; b++)
        fill_dev(&g, b, 1000 + b);
    int rc = 0;
    int64_t ev = 0;
    for (; ev < 64 && rc == 0; ev++) {
        uint32_t src = (uint32_t)ev, dst = (uint32_t)(63 - ev);
        rc = kvt_copy_submit(c, KVT_COPY_STORE, ev * 3, &src, &dst, 1, NULL);
    }
    /* either all fit (the threads kept up) or the 33rd was refused */
    if (rc) {
        assert_int_equal(rc, KVT_EBUSY);
        ev--;
    }
    assert_true(ev >= 32);
    uint32_t ls = 0, ld = 0;
    KVT_OK_(kvt_copy_submit(c, KVT_COPY_LOAD, 0, &ls, &ld, 1, NULL));
    KVT_OK_(kvt_copy_flush(c));
    assert_true(kvt_copy_outstanding(c, KVT_COPY_STORE) <= 32);
    int64_t hwm;
    KVT_OK_(kvt_copy_poll(c, KVT_COPY_STORE, &hwm));
    assert_int_equal(hwm, (ev - 1) * 3);
    assert_int_equal(kvt_copy_outstanding(c, KVT_COPY_STORE), 0);
    for (int64_t e = 0; e < ev; e++)
        check_block(&g, true, (uint32_t)(63 - e), 1000 + (uint64_t)e);
    KVT_OK_(kvt_copy_poll(c, KVT_COPY_LOAD, &hwm));
    assert_int_equal(hwm, 0);
    kvt_copy_destroy(c);
    rig_fini(&g);
}

/* destroy with work still queued waits for it (no thread touches freed memory). */
static void test_destroy_drains(void **state)
{
    (void)state;
    rig g;
    rig_init(&g, 32, 32, 1 << 16);
    kvt_copy_config cc;
    kvt_copy_config_init(&cc);
    cc.threads = 3;
    cc.chunk_bytes = 4096;
    kvt_copy *c;
    KVT_OK_(kvt_copy_create(&cc, g.layout, g.mirror, &c));
    uint32_t src[32], dst[32];
    for (uint32_t i = 0; i < 32; i++) {
        src[i] = i;
        dst[i] = 31 - i;
        fill_dev(&g, i, 7 * i);
    }
    for (int64_t e = 0; e < 8; e++)
        KVT_OK_(kvt_copy_submit(c, KVT_COPY_STORE, e, src, dst, 32, NULL));
    kvt_copy_destroy(c);
    for (uint32_t i = 0; i < 32; i++)
        check_block(&g, true, 31 - i, 7 * i);
    rig_fini(&g);
}

static void test_nt_copy_edges(void **state)
{
    (void)state;
    unsigned char *a = malloc(5000), *b = malloc(5000);
    for (int i = 0; i < 5000; i++)
        a[i] = (unsigned char)(i * 31 + 7);
    for (size_t off = 0; off < 40; off += 3)
        for (size_t n = 0; n < 700; n += 37) {
            memset(b, 0xEE, 5000);
            kvi_copy_bytes_nt(b + off, a + 1, n);
            assert_memory_equal(b + off, a + 1, n);
            assert_int_equal(b[off + n], 0xEE);
            if (off)
                assert_int_equal(b[off - 1], 0xEE);
        }
    free(a);
    free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_coalesce_spec_examples),
        cmocka_unit_test(test_descs_region_major),
        cmocka_unit_test(test_layout_rules),
        cmocka_unit_test(test_layout_padding_is_not_a_region),
        cmocka_unit_test(test_layout_cross_layer),
        cmocka_unit_test(test_mirror),
        cmocka_unit_test(test_roundtrip_threads),
        cmocka_unit_test(test_ids_checked_before_copy),
        cmocka_unit_test(test_backend_errors),
        cmocka_unit_test(test_flush_covers_queued),
        cmocka_unit_test(test_destroy_drains),
        cmocka_unit_test(test_nt_copy_edges),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
