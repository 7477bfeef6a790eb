/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Allocation-failure sweep: every allocation kvtier makes (malloc, calloc, realloc in the
 * library, wrapped at link time) is made to fail in turn, one per run of a scenario, for
 * N = 1, 2, ... until a run makes fewer than N allocations. Each run must end with every
 * call either succeeding or failing with KVT_ENOMEM and a message, never crashing; resources
 * are released on every path (the AddressSanitizer build checks that nothing leaks); and the
 * scenario, repeated without failures afterwards, still succeeds (nothing was left half
 * done).
 */
#include "kvt_test.h"

#include "copy/copy_internal.h"
#include "net/ec_ctl.h"

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t m);
void *__real_realloc(void *p, size_t n);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t n, size_t m);
void *__wrap_realloc(void *p, size_t n);

static _Thread_local long g_fail_at; /* 0: never; k: the k-th allocation fails */
static _Thread_local long g_count;

static bool should_fail(void)
{
    return g_fail_at && ++g_count == g_fail_at;
}

void *__wrap_malloc(size_t n)
{
    return should_fail() ? NULL : __real_malloc(n);
}

void *__wrap_calloc(size_t n, size_t m)
{
    return should_fail() ? NULL : __real_calloc(n, m);
}

void *__wrap_realloc(void *p, size_t n)
{
    return should_fail() ? NULL : __real_realloc(p, n);
}

#define TRY(call)                                                                                  \
    do {                                                                                           \
        rc = (call);                                                                               \
        if (rc)                                                                                    \
            goto out;                                                                              \
    } while (0)

/* Scheduler side: pools, the manager, a request stored and loaded back, metadata on the wire. */
static int scenario_offload(void)
{
    int rc = 0;
    kvt_pool *gpu = NULL;
    kvt_offload *m = NULL;
    kvt_offload_meta meta, back;
    kvt_offload_worker_meta wm;
    kvt_offload_meta_init(&meta);
    kvt_offload_meta_init(&back);
    kvt_offload_worker_meta_init(&wm);
    unsigned char wire[4096];
    size_t len;
    kvt_pool_config pc;
    kvt_pool_config_init(&pc);
    pc.num_blocks = 64;
    pc.event_capacity = 16;
    TRY(kvt_pool_create(&pc, &gpu));
    kvt_offload_config oc;
    kvt_offload_config_init(&oc);
    oc.host_blocks = 32;
    oc.max_requests = 8;
    oc.event_capacity = 16;
    TRY(kvt_offload_create(&oc, gpu, &m));
    uint32_t tokens[5 * 16 + 1], nh;
    uint8_t hashes[8 * KVT_BLOCK_HASH_LEN];
    for (uint32_t i = 0; i < 81; i++)
        tokens[i] = i * 7;
    TRY(kvt_hash_prompt(1, tokens, 81, 16, NULL, 0, hashes, 8, &nh));
    for (int round = 0; round < 2; round++) {
        char id[8];
        snprintf(id, sizeof(id), "r%d", round);
        uint32_t hit, blocks[6], nb[1] = {6};
        const uint32_t *tab[1] = {blocks};
        TRY(kvt_offload_match(m, id, 2, hashes, nh, 81, 0, &hit));
        TRY(kvt_pool_alloc(gpu, 6, blocks));
        TRY(kvt_offload_after_alloc(m, id, 2, tab, nb, hit));
        for (uint32_t b = hit / 16; b < 5; b++)
            TRY(kvt_pool_insert(gpu, blocks[b], hashes + b * KVT_BLOCK_HASH_LEN, 0, 16));
        TRY(kvt_offload_schedule(m, id, 2, tab, nb, 81, 1, false));
        TRY(kvt_offload_build_meta(m, false, &meta));
        TRY(kvt_offload_meta_encode(&meta, wire, sizeof(wire), &len));
        TRY(kvt_offload_meta_decode(&back, wire, len));
        kvt_offload_worker_meta_clear(&wm);
        if (meta.store_event != KVT_NO_EVENT)
            TRY(kvt_offload_worker_meta_add(&wm, meta.store_event, 1));
        kvt_str done = {id, 2};
        TRY(kvt_offload_apply_output(m, &done, meta.load_event != KVT_NO_EVENT, &wm));
        TRY(kvt_offload_request_finished(m, id, 2, tab, nb, 81));
        uint32_t rev[6];
        for (int i = 0; i < 6; i++)
            rev[i] = blocks[5 - i];
        TRY(kvt_pool_free(gpu, rev, 6));
        TRY(kvt_pool_reset_prefix_cache(gpu));
    }
out:
    kvt_offload_meta_release(&meta);
    kvt_offload_meta_release(&back);
    kvt_offload_worker_meta_release(&wm);
    kvt_offload_destroy(m);
    kvt_pool_destroy(gpu);
    return rc;
}

/* One step storing device block `dev` into host block `host`, then one loading it back into
 * device block `back`, through worker w; the metadata and reports are the caller's. */
static int store_then_load(kvt_worker *w, kvt_offload_meta *meta, kvt_offload_worker_meta *wm,
                           uint32_t dev, uint32_t host, uint32_t back)
{
    int rc = 0;
    const kvt_str *fin;
    uint32_t n;
    kvt_offload_meta_clear(meta);
    meta->store_event = 0;
    TRY(kvt_offload_meta_add_store(meta, dev, host));
    TRY(kvt_worker_bind(w, meta));
    TRY(kvt_worker_get_finished(w, NULL, &fin, &n));
    TRY(kvt_worker_flush(w));
    TRY(kvt_worker_get_finished(w, NULL, &fin, &n));
    TRY(kvt_worker_build_meta(w, wm));
    kvt_worker_clear(w);
    kvt_offload_meta_clear(meta);
    meta->load_event = 0;
    TRY(kvt_offload_meta_add_load(meta, back, host));
    TRY(kvt_offload_meta_add_load_req(meta, 0, "q", 1));
    TRY(kvt_worker_bind(w, meta));
    TRY(kvt_worker_get_finished(w, NULL, &fin, &n));
    TRY(kvt_worker_flush(w));
    TRY(kvt_worker_get_finished(w, NULL, &fin, &n));
out:
    kvt_worker_clear(w);
    return rc;
}

/* Worker side: a layout, a mirror, a worker; a store and a load through it. */
static int scenario_worker(void)
{
    int rc = 0;
    static unsigned char dev[16 * 4096];
    kvt_layout *l = NULL;
    kvt_mirror *mi = NULL;
    kvt_worker *w = NULL;
    kvt_offload_meta meta;
    kvt_offload_worker_meta wm;
    kvt_offload_meta_init(&meta);
    kvt_offload_worker_meta_init(&wm);
    TRY(kvt_layout_create(KVT_HOST_DEVICE, 16, &l));
    TRY(kvt_layout_add_region(l, (uint64_t)(uintptr_t)dev, 2048));
    TRY(kvt_layout_add_region(l, (uint64_t)(uintptr_t)dev + 16 * 2048, 2048));
    kvt_mirror_config mc;
    kvt_mirror_config_init(&mc);
    mc.host_blocks = 8;
    TRY(kvt_mirror_create(&mc, l, &mi));
    kvt_worker_config wc;
    kvt_worker_config_init(&wc);
    wc.copy.threads = 1;
    wc.copy.max_events = 4;
    TRY(kvt_worker_create(&wc, l, mi, &w));
    TRY(store_then_load(w, &meta, &wm, 3, 4, 9));
out:
    kvt_worker_destroy(w);
    kvt_mirror_destroy(mi);
    kvt_layout_destroy(l);
    kvt_offload_meta_release(&meta);
    kvt_offload_worker_meta_release(&wm);
    return rc;
}

/* The disk tier under a worker: a store and a load through the file. */
static int scenario_disk(void)
{
    int rc = 0;
    static unsigned char dev[8 * 4096] __attribute__((aligned(4096)));
    kvt_layout *l = NULL;
    kvt_disk *d = NULL;
    kvt_worker *w = NULL;
    kvt_offload_meta meta;
    kvt_offload_worker_meta wm;
    kvt_offload_meta_init(&meta);
    kvt_offload_worker_meta_init(&wm);
    TRY(kvt_layout_create(KVT_HOST_DEVICE, 8, &l));
    TRY(kvt_layout_add_region(l, (uint64_t)(uintptr_t)dev, 4096));
    kvt_disk_config dc;
    kvt_disk_config_init(&dc);
    dc.path = "kvt-alloc-fail-disk";
    dc.capacity_bytes = 8 * 4096;
    dc.queue_depth = 2;
    dc.page_cache = true; /* any file system */
    TRY(kvt_disk_create(&dc, l, &d));
    kvt_worker_config wc;
    kvt_worker_config_init(&wc);
    TRY(kvt_worker_create_disk(&wc, l, d, &w));
    TRY(store_then_load(w, &meta, &wm, 1, 2, 5));
out:
    kvt_worker_destroy(w);
    kvt_disk_destroy(d);
    kvt_layout_destroy(l);
    kvt_offload_meta_release(&meta);
    kvt_offload_worker_meta_release(&wm);
    return rc;
}

/* Encoder-cache metadata and the slab. */
static int scenario_ec(void)
{
    int rc = 0;
    kvt_ec_worker_meta a, b;
    kvt_ec_worker_meta_init(&a);
    kvt_ec_worker_meta_init(&b);
    kvt_slab *s = NULL;
    unsigned char wire[1024];
    size_t len;
    TRY(kvt_ec_worker_meta_add(&a, KVT_EC_LOADED, "img-1", 5));
    TRY(kvt_ec_worker_meta_add(&a, KVT_EC_RECLAIMED, "img-2", 5));
    TRY(kvt_ec_worker_meta_encode(&a, wire, sizeof(wire), &len));
    TRY(kvt_ec_worker_meta_decode(&b, wire, len));
    TRY(kvt_ec_worker_meta_aggregate(&b, &a));
    TRY(kvt_slab_create(NULL, 1 << 16, &s));
    kvt_slab_view v[8];
    for (int i = 0; i < 8; i++)
        TRY(kvt_slab_alloc(s, 1000, &v[i]));
    for (int i = 0; i < 8; i += 2)
        TRY(kvt_slab_free(s, &v[i]));
    for (int i = 1; i < 8; i += 2)
        TRY(kvt_slab_free(s, &v[i]));
out:
    kvt_slab_destroy(s);
    kvt_ec_worker_meta_release(&a);
    kvt_ec_worker_meta_release(&b);
    return rc;
}

/* The encoder-cache control plane's messages: a batch request, a reply with per-item results,
 * a whole-request failure, a data address, an event; each encoded and decoded. */
static int scenario_ec_control(void)
{
    int rc = 0;
    kvi_ecc_request q, q2;
    kvi_ecc_reply p, p2;
    kvi_ecc_event e = {0}, e2;
    kvi_ecc_request_init(&q);
    kvi_ecc_request_init(&q2);
    kvi_ecc_reply_init(&p);
    kvi_ecc_reply_init(&p2);
    kvi_ecc_event_init(&e2);
    static unsigned char wire[8192];
    size_t len;
    const char *rid = "0123456789abcdef0123456789abcdef";
    kvi_ecc_request_begin(&q, KVT_ECC_RESERVE_BATCH);
    for (int i = 0; i < 5; i++) {
        kvi_ecc_item it = {.transfer_id = {"xfer", 4},
                           .mm_hash = {"img", 3},
                           .nbytes = 64,
                           .ndim = 1,
                           .shape = {32},
                           .dtype = {"float16", 7},
                           .client_key = {"0123456789abcdef0123456789abcdef", 32}};
        TRY(kvi_ecc_request_add(&q, &it));
    }
    TRY(kvi_ecc_request_encode(&q, wire, sizeof(wire), &len));
    TRY(kvi_ecc_request_decode(&q2, wire, len));
    kvi_ecc_reply_begin(&p, KVT_ECC_RESERVE_BATCH);
    for (int i = 0; i < 5; i++) {
        kvi_ecc_result x = {.reservation_id = {rid, 32}, .nbytes = 64, .write = true};
        kvi_ecc_result bad = {.code = KVT_ENOSPC, .error = {"pool full", 9}};
        TRY(kvi_ecc_reply_add(&p, i % 2 ? &bad : &x));
    }
    TRY(kvi_ecc_reply_encode(&p, wire, sizeof(wire), &len));
    TRY(kvi_ecc_reply_decode(&p2, wire, len));
    TRY(kvi_ecc_reply_fail(&p, KVT_ESTATE, "shutting down"));
    TRY(kvi_ecc_reply_encode(&p, wire, sizeof(wire), &len));
    TRY(kvi_ecc_reply_decode(&p2, wire, len));
    kvi_ecc_reply_begin(&p, KVT_ECC_DATA_ADDRESS);
    TRY(kvi_ecc_reply_set_address(&p, "\x01\x02\x03", 3));
    TRY(kvi_ecc_reply_encode(&p, wire, sizeof(wire), &len));
    TRY(kvi_ecc_reply_decode(&p2, wire, len));
    e.transfer_id = (kvt_str){"xfer", 4}, e.mm_hash = (kvt_str){"img", 3};
    e.reservation_id = (kvt_str){rid, 32}, e.dtype = (kvt_str){"float16", 7};
    e.nbytes = 64, e.ndim = 1, e.shape[0] = 32;
    TRY(kvi_ecc_event_encode(&e, wire, sizeof(wire), &len));
    TRY(kvi_ecc_event_decode(&e2, wire, len));
out:
    kvi_ecc_request_release(&q);
    kvi_ecc_request_release(&q2);
    kvi_ecc_reply_release(&p);
    kvi_ecc_reply_release(&p2);
    kvi_ecc_event_release(&e2);
    return rc;
}

static bool cache_holds(void *ctx, const char *h, uint32_t len, const kvt_slab_view *v)
{
    (void)ctx, (void)h, (void)len, (void)v;
    return false;
}

static int cache_place(void *ctx, const kvt_ec_load_spec *sp, const kvt_slab_view *v)
{
    (void)sp;
    *(uint64_t *)ctx = v->offset;
    return 0;
}

/* Encoder-cache transfer in process: planner, producer, a shard, the consumer scheduler and
 * the worker's step, one item end to end. A push that fails for lack of memory is a failed
 * push (reported, not an error of the call); what must hold is that every call returns 0 or
 * KVT_ENOMEM and that everything is released. */
static int scenario_ec_transfer(void)
{
    int rc = 0;
    static unsigned char buf[1 << 16], src[4096];
    kvt_ec_shard *sh = NULL;
    kvt_ec_sched *sched = NULL;
    kvt_ec_producer *prod = NULL;
    kvt_ec_planner *plan = NULL;
    kvt_ec_meta pm, cm;
    kvt_ec_worker_meta wm;
    kvt_ec_meta_init(&pm);
    kvt_ec_meta_init(&cm);
    kvt_ec_worker_meta_init(&wm);
    kvt_ec_shard_config c;
    kvt_ec_shard_config_init(&c);
    c.base = buf;
    c.capacity = sizeof(buf);
    TRY(kvt_ec_shard_create(&c, &sh));
    kvt_ec_sched_config sc;
    kvt_ec_sched_config_init(&sc);
    TRY(kvt_ec_sched_create(&sc, &sched));
    kvt_ec_local_consumer lc = {{sh}, 1};
    kvt_ec_producer_config pc;
    kvt_ec_producer_config_init(&pc);
    pc.ops = kvt_ec_local_consumer_ops(&lc);
    TRY(kvt_ec_producer_create(&pc, &prod));
    TRY(kvt_ec_planner_create(16, &plan));
    kvt_ec_push_spec spec = {{"img", 3},       4096,      2,        {4, 256}, {"float32", 7},
                             {"local://p", 9}, {"x1", 2}, {"r1", 2}};
    rc = kvt_ec_planner_prepare(plan, &spec);
    if (rc < 0)
        goto out;
    TRY(kvt_ec_planner_build_meta(plan, &pm));
    for (uint32_t i = 0; i < pm.n_pushes; i++)
        TRY(kvt_ec_producer_push(prod, &pm.pushes[i]));
    if ((rc = kvt_ec_producer_bind_source(prod, "img", 3, src, sizeof(src), NULL)) < 0 ||
        (rc = kvt_ec_producer_dispatch(prod)) < 0)
        goto out;
    rc = 0;
    kvt_ec_ready_event ev[4];
    uint32_t n = kvt_ec_shard_take_events(sh, ev, 4);
    for (uint32_t i = 0; i < n; i++) {
        kvt_ec_ready r = {ev[i].transfer_id, 2, {"img", 3, 4096, 2, {4, 256}, "float32", 7}, 0};
        TRY(kvt_ec_sched_observe_ready(sched, &r));
    }
    kvt_ec_feature f = {"img", 3, "x1", 2};
    bool ready;
    TRY(kvt_ec_sched_ensure(sched, "r1", 2, &f, 1, &ready));
    TRY(kvt_ec_sched_build_meta(sched, &cm));
    uint64_t where = 0;
    kvt_ec_cache_ops ops = {cache_holds, cache_place, NULL, &where};
    TRY(kvt_ec_shard_apply(sh, &cm, &ops, &wm));
    TRY(kvt_ec_sched_apply_output(sched, &wm));
    TRY(kvt_ec_sched_ensure(sched, "r1", 2, &f, 1, &ready));
    TRY(kvt_ec_sched_consumed(sched, "r1", 2, &f));
    TRY(kvt_ec_sched_request_finished(sched, "r1", 2));
    TRY(kvt_ec_planner_request_finished(plan, "r1", 2));
    TRY(kvt_ec_producer_request_finished(prod, "r1", 2));
out:
    kvt_ec_planner_destroy(plan);
    kvt_ec_producer_destroy(prod); /* abandons whatever did not finish */
    kvt_ec_sched_destroy(sched);
    if (sh && kvt_ec_shard_destroy(sh) != 0 && rc == 0)
        rc = KVT_EBUSY; /* a writer left behind: a leak of the receive buffer */
    kvt_ec_meta_release(&pm);
    kvt_ec_meta_release(&cm);
    kvt_ec_worker_meta_release(&wm);
    return rc;
}

/* min_points: how many allocation points the scenario has at least (today's count, less a
 * margin): a sweep that stops failing allocations — a wrapper no longer linked, a scenario that
 * no longer allocates — fails instead of passing vacuously. */
static void sweep(const char *name, int (*scenario)(void), long min_points)
{
    long n = 1, enomem = 0;
    for (;; n++) {
        g_fail_at = n;
        g_count = 0;
        int rc = scenario();
        long made = g_count;
        g_fail_at = 0;
        if (rc != 0 && rc != KVT_ENOMEM)
            fail_msg("%s: allocation %ld failed -> %s (%s), expected success or KVT_ENOMEM", name,
                     n, kvt_err_name(rc), kvt_last_error());
        if (rc == KVT_ENOMEM && kvt_last_error()[0] == '\0')
            fail_msg("%s: allocation %ld: KVT_ENOMEM without a message", name, n);
        enomem += rc == KVT_ENOMEM;
        if (made < n)
            break; /* every allocation point was failed once */
    }
    int rc = scenario();
    if (rc)
        fail_msg("%s: the scenario fails without injected failures: %s", name, kvt_last_error());
    printf("# %s: %ld allocation points each failed once, %ld reported KVT_ENOMEM\n", name, n - 1,
           enomem);
    if (n - 1 < min_points)
        fail_msg("%s: only %ld allocation points were failed, expected at least %ld", name, n - 1,
                 min_points);
    if (enomem == 0)
        fail_msg("%s: no injected failure was ever reported as KVT_ENOMEM", name);
}

static void every_allocation_failure_is_reported_offload(void **state)
{
    (void)state;
    sweep("offload", scenario_offload, 40);
}

static void every_allocation_failure_is_reported_worker(void **state)
{
    (void)state;
    sweep("worker", scenario_worker, 30);
}

static void every_allocation_failure_is_reported_disk(void **state)
{
    (void)state;
    sweep("disk", scenario_disk, 30);
}

static void every_allocation_failure_is_reported_ec(void **state)
{
    (void)state;
    sweep("ec", scenario_ec, 6);
}

static void every_allocation_failure_is_reported_ec_control(void **state)
{
    (void)state;
    sweep("ec control", scenario_ec_control, 6);
}

static void every_allocation_failure_is_reported_ec_transfer(void **state)
{
    (void)state;
    sweep("ec transfer", scenario_ec_transfer, 24);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_allocation_failure_is_reported_offload),
        cmocka_unit_test(every_allocation_failure_is_reported_worker),
        cmocka_unit_test(every_allocation_failure_is_reported_disk),
        cmocka_unit_test(every_allocation_failure_is_reported_ec),
        cmocka_unit_test(every_allocation_failure_is_reported_ec_transfer),
        cmocka_unit_test(every_allocation_failure_is_reported_ec_control),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
