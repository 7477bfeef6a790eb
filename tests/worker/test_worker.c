/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The offload worker on the CPU backend: bind validation, launching after get_finished,
 * translating finished loads through load_event_to_reqs, {event: 1} once per store, flush on
 * need_flush, and the bytes themselves.
 */
#include "kvt_test.h"

#define DEV_BLOCKS  32
#define HOST_BLOCKS 48
#define BPB         8192

typedef struct wrig {
    unsigned char *dev;
    kvt_layout *layout;
    kvt_mirror *mirror;
    kvt_worker *w;
    kvt_offload_meta meta;
    kvt_offload_worker_meta wm;
} wrig;

static void wrig_init(wrig *g)
{
    g->dev = malloc(2 * DEV_BLOCKS * BPB);
    KVT_OK_(kvt_layout_create(KVT_HOST_DEVICE, DEV_BLOCKS, &g->layout));
    kvt_kv_tensor t = {KVT_HOST_DEVICE, (uint64_t)(uintptr_t)g->dev, 2 * DEV_BLOCKS * BPB,
                       DEV_BLOCKS, BPB};
    KVT_OK_(kvt_layout_add_tensor(g->layout, &t));
    kvt_mirror_config mc;
    kvt_mirror_config_init(&mc);
    mc.host_blocks = HOST_BLOCKS;
    KVT_OK_(kvt_mirror_create(&mc, g->layout, &g->mirror));
    kvt_worker_config wc;
    kvt_worker_config_init(&wc);
    wc.copy.threads = 2;
    wc.copy.chunk_bytes = 4096;
    KVT_OK_(kvt_worker_create(&wc, g->layout, g->mirror, &g->w));
    kvt_offload_meta_init(&g->meta);
    kvt_offload_worker_meta_init(&g->wm);
}

static void wrig_fini(wrig *g)
{
    kvt_worker_destroy(g->w);
    kvt_mirror_destroy(g->mirror);
    kvt_layout_destroy(g->layout);
    kvt_offload_meta_release(&g->meta);
    kvt_offload_worker_meta_release(&g->wm);
    free(g->dev);
}

static void fill(wrig *g, uint32_t b, unsigned char v)
{
    memset(g->dev + (size_t)b * BPB, v, BPB);
    memset(g->dev + (size_t)(DEV_BLOCKS + b) * BPB, v ^ 0xFF, BPB);
}

static void expect_dev(wrig *g, uint32_t b, unsigned char v)
{
    for (size_t o = 0; o < BPB; o++) {
        assert_int_equal(g->dev[(size_t)b * BPB + o], v);
        assert_int_equal(g->dev[(size_t)(DEV_BLOCKS + b) * BPB + o], (unsigned char)(v ^ 0xFF));
    }
}

/* Steps until the worker reports store event e, returning the reports seen. */
static void step_until_store(wrig *g, int64_t e)
{
    kvt_wait w = kvt_wait_start();
    do {
        const kvt_str *reqs;
        uint32_t n;
        KVT_OK_(kvt_worker_get_finished(g->w, NULL, &reqs, &n));
        KVT_OK_(kvt_worker_build_meta(g->w, &g->wm));
        if (g->wm.stores.n_completed) {
            assert_int_equal(g->wm.stores.n_completed, 1);
            assert_int_equal(g->wm.stores.events[0], e);
            assert_int_equal(g->wm.stores.counts[0], 1);
            return;
        }
    } while (kvt_wait_more(&w));
    fail_msg("store event %lld never completed", (long long)e);
}

static void test_bind_rejects_bad_meta(void **state)
{
    (void)state;
    wrig g;
    wrig_init(&g);
    g.meta.store_event = 0;
    KVT_OK_(kvt_offload_meta_add_store(&g.meta, DEV_BLOCKS, 1));
    KVT_ERR_(kvt_worker_bind(g.w, &g.meta), KVT_ERANGE);
    assert_non_null(strstr(kvt_last_error(), "store device block 32"));
    kvt_offload_meta_clear(&g.meta);
    g.meta.store_event = 0;
    KVT_OK_(kvt_offload_meta_add_store(&g.meta, 1, HOST_BLOCKS));
    KVT_ERR_(kvt_worker_bind(g.w, &g.meta), KVT_ERANGE);
    kvt_offload_meta_clear(&g.meta);
    /* event without blocks breaks the invariants */
    g.meta.store_event = 3;
    KVT_ERR_(kvt_worker_bind(g.w, &g.meta), KVT_EINVAL);
    kvt_offload_meta_clear(&g.meta);
    g.meta.store_event = 3;
    KVT_OK_(kvt_offload_meta_add_store(&g.meta, 1, 1));
    KVT_OK_(kvt_worker_bind(g.w, &g.meta));
    const kvt_str *reqs;
    uint32_t n;
    KVT_OK_(kvt_worker_get_finished(g.w, NULL, &reqs, &n));
    kvt_worker_clear(g.w);
    /* a store event not above the last one is refused */
    KVT_ERR_(kvt_worker_bind(g.w, &g.meta), KVT_EINVAL);
    step_until_store(&g, 3);
    wrig_fini(&g);
}

static void test_store_then_load(void **state)
{
    (void)state;
    wrig g;
    wrig_init(&g);
    const kvt_str *reqs;
    uint32_t n;
    for (uint32_t b = 1; b <= 4; b++)
        fill(&g, b, (unsigned char)(b * 17));
    /* step 1: store device 1..4 -> host 10..13 */
    g.meta.store_event = 0;
    for (uint32_t b = 1; b <= 4; b++)
        KVT_OK_(kvt_offload_meta_add_store(&g.meta, b, 9 + b));
    KVT_OK_(kvt_worker_bind(g.w, &g.meta));
    KVT_OK_(kvt_worker_handle_preemptions(g.w));
    step_until_store(&g, 0);
    /* reported once */
    KVT_OK_(kvt_worker_get_finished(g.w, NULL, &reqs, &n));
    KVT_OK_(kvt_worker_build_meta(g.w, &g.wm));
    assert_int_equal(g.wm.stores.n_completed, 0);
    kvt_worker_clear(g.w);
    /* step 2: two requests load host 10..13 into device 20..23, in one event */
    kvt_offload_meta_clear(&g.meta);
    g.meta.load_event = 7;
    for (uint32_t b = 0; b < 4; b++)
        KVT_OK_(kvt_offload_meta_add_load(&g.meta, 20 + b, 10 + b));
    KVT_OK_(kvt_offload_meta_add_load_req(&g.meta, 7, "req-a", 5));
    KVT_OK_(kvt_offload_meta_add_load_req(&g.meta, 7, "req-b", 5));
    KVT_OK_(kvt_worker_bind(g.w, &g.meta));
    KVT_OK_(kvt_worker_get_finished(g.w, NULL, &reqs, &n));
    kvt_worker_clear(g.w);
    /* step 3: nothing new; the manager still lists event 7 as outstanding */
    uint32_t got = n;
    kvt_offload_meta_clear(&g.meta);
    KVT_OK_(kvt_offload_meta_add_load_req(&g.meta, 7, "req-a", 5));
    KVT_OK_(kvt_offload_meta_add_load_req(&g.meta, 7, "req-b", 5));
    g.meta.need_flush = true; /* a preemption: everything finishes before the forward */
    KVT_OK_(kvt_worker_bind(g.w, &g.meta));
    KVT_OK_(kvt_worker_handle_preemptions(g.w));
    if (got == 0)
        KVT_OK_(kvt_worker_get_finished(g.w, NULL, &reqs, &n));
    assert_int_equal(n, 2);
    assert_string_equal(reqs[0].ptr, "req-a");
    assert_string_equal(reqs[1].ptr, "req-b");
    for (uint32_t b = 1; b <= 4; b++)
        expect_dev(&g, 19 + b, (unsigned char)(b * 17));
    KVT_OK_(kvt_worker_get_finished(g.w, NULL, &reqs, &n));
    assert_int_equal(n, 0);
    assert_int_equal(kvt_worker_pending(g.w, KVT_COPY_LOAD), 0);
    uint32_t inv[4];
    assert_int_equal(kvt_worker_take_invalid_blocks(g.w, inv, 4), 0);
    kvt_worker_clear(g.w);
    wrig_fini(&g);
}

/* Loads finished while no metadata is bound are reported at the next bind. */
static void test_finished_load_waits_for_meta(void **state)
{
    (void)state;
    wrig g;
    wrig_init(&g);
    g.meta.load_event = 0;
    for (uint32_t b = 0; b < 24; b++) /* enough bytes that the load rarely ends at once */
        KVT_OK_(kvt_offload_meta_add_load(&g.meta, 5 + b, 6 + b));
    KVT_OK_(kvt_offload_meta_add_load_req(&g.meta, 0, "r", 1));
    KVT_OK_(kvt_worker_bind(g.w, &g.meta));
    g.meta.need_flush = true;
    KVT_OK_(kvt_worker_handle_preemptions(g.w)); /* flushes nothing yet: not launched */
    const kvt_str *reqs;
    uint32_t n;
    KVT_OK_(kvt_worker_get_finished(g.w, NULL, &reqs, &n));
    kvt_worker_clear(g.w);
    if (n == 1) { /* the copy threads were faster than the poll: reported right away */
        assert_string_equal(reqs[0].ptr, "r");
        wrig_fini(&g);
        return;
    }
    KVT_OK_(kvt_copy_flush(kvt_worker_copy(g.w)));
    KVT_OK_(kvt_worker_get_finished(g.w, NULL, &reqs, &n));
    assert_int_equal(n, 0);
    assert_int_equal(kvt_worker_pending(g.w, KVT_COPY_LOAD), 1);
    kvt_offload_meta_clear(&g.meta);
    KVT_OK_(kvt_offload_meta_add_load_req(&g.meta, 0, "r", 1));
    KVT_OK_(kvt_worker_bind(g.w, &g.meta));
    KVT_OK_(kvt_worker_get_finished(g.w, NULL, &reqs, &n));
    assert_int_equal(n, 1);
    assert_string_equal(reqs[0].ptr, "r");
    kvt_worker_clear(g.w);
    wrig_fini(&g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bind_rejects_bad_meta),
        cmocka_unit_test(test_store_then_load),
        cmocka_unit_test(test_finished_load_waits_for_meta),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
