/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The producer's push records (spec ec-transfer §1.4 steps 2-6 and 14, §3.5), one test per
 * behaviour of §7's "Worker and producer" list that belongs to the records (sockets, staging
 * pools and CUDA streams are issue 7's), named after it. The consumer is in process (inproc.h):
 * real shards, real buffers, so every test can check the bytes that arrived.
 */
#include "ec/inproc.h"

#define TOK 2 /* 2 KiB items */

/* Every test runs twice: the consumer's single calls, then its batched forms. */
static bool g_batched;

typedef struct rig {
    kvt_manual_clock clock;
    inproc c;
    kvt_ec_producer *p;
    unsigned char src[4][TOK * 1024];
} rig;

static void rig_open(rig *g, uint32_t shards, uint64_t cap)
{
    memset(g, 0, sizeof(*g));
    kvt_clock_manual(&g->clock, 1);
    inproc_open(&g->c, shards, cap, &g->clock);
    kvt_ec_producer_config pc;
    kvt_ec_producer_config_init(&pc);
    pc.ops = g_batched ? inproc_batch_ops(&g->c) : inproc_ops(&g->c);
    pc.clock = kvt_clock_manual(&g->clock, g->clock.now_ns);
    KVT_OK_(kvt_ec_producer_create(&pc, &g->p));
    for (int i = 0; i < 4; i++)
        for (int b = 0; b < TOK * 1024; b++)
            g->src[i][b] = (unsigned char)(i * 31 + b * 7);
}

static void rig_close(rig *g)
{
    kvt_ec_producer_destroy(g->p);
    inproc_close(&g->c);
}

static void push(rig *g, const char *t, const char *h, const char *req)
{
    kvt_ec_push_spec s = inproc_spec(t, h, TOK, req);
    KVT_OK_(kvt_ec_producer_push(g->p, &s));
}

static int pstate(rig *g, const char *t)
{
    return kvt_ec_producer_state(g->p, t, (uint32_t)strlen(t));
}

static int bind(rig *g, const char *h, int i, const kvt_ec_fence *f)
{
    return kvt_ec_producer_bind_source(g->p, h, (uint32_t)strlen(h), g->src[i], TOK * 1024, f);
}

/* The consumer side takes transfer t of h on shard k and checks it holds source i. */
static void expect_bytes(rig *g, uint32_t k, const char *t, const char *h, int i)
{
    kvt_slab_view v;
    KVT_OK_(
        kvt_ec_shard_take(g->c.sh[k], t, (uint32_t)strlen(t), h, (uint32_t)strlen(h), NULL, &v));
    assert_int_equal(v.nbytes, TOK * 1024);
    assert_memory_equal(g->c.buf[k] + v.offset, g->src[i], TOK * 1024);
}

static bool fence_done(void *ctx)
{
    return *(bool *)ctx;
}

static void push_reaches_every_consumer_shard(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, 3, 64 * 1024);
    push(&g, "t", "h", "r");
    assert_int_equal(pstate(&g, "t"), KVT_ECP_WAITING_INPUTS);
    for (uint32_t k = 0; k < 3; k++)
        assert_int_equal(g.c.calls[OP_RESERVE][k], 1); /* reserved before the output exists */
    assert_true(kvt_ec_producer_pending(g.p));
    assert_int_equal(bind(&g, "h", 0, NULL), 1);
    assert_int_equal(kvt_ec_producer_dispatch(g.p), 1);
    assert_int_equal(pstate(&g, "t"), KVT_ECP_DONE);
    for (uint32_t k = 0; k < 3; k++) {
        assert_int_equal(g.c.calls[OP_WRITE][k], 1); /* 3 writes of one source */
        expect_bytes(&g, k, "t", "h", 0);
    }
    assert_false(kvt_ec_producer_pending(g.p));
    rig_close(&g);
}

static void duplicate_pushes_share_one_transfer_per_reservation(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, 1, 64 * 1024);
    push(&g, "t", "h", "r1");
    push(&g, "t", "h", "r2"); /* the same encoding for another request: one record */
    bind(&g, "h", 0, NULL);
    kvt_ec_producer_dispatch(g.p);
    assert_int_equal(g.c.calls[OP_WRITE][0], 1);
    kvt_ec_producer_stats st;
    kvt_ec_producer_get_stats(g.p, &st);
    assert_int_equal(st.reused, 1);
    expect_bytes(&g, 0, "t", "h", 0); /* now resident on the consumer */
    push(&g, "t2", "h", "r3");        /* a later push of a resident item writes nothing */
    bind(&g, "h", 0, NULL);
    kvt_ec_producer_dispatch(g.p);
    assert_int_equal(g.c.calls[OP_WRITE][0], 1);
    assert_int_equal(pstate(&g, "t2"), KVT_ECP_DONE);
    rig_close(&g);
}

static void a_conflicting_payload_is_reported_through_failed_saves(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, 1, 64 * 1024);
    push(&g, "t", "h", "r1");
    kvt_ec_push_spec other = inproc_spec("t", "other", TOK, "r2");
    KVT_OK_(kvt_ec_producer_push(g.p, &other)); /* never raised */
    kvt_ec_worker_meta wm;
    kvt_ec_worker_meta_init(&wm);
    KVT_OK_(kvt_ec_producer_report(g.p, &wm));
    assert_int_equal(wm.failed_saves.n, 1);
    assert_string_equal(wm.failed_saves.items[0].ptr, "r2");
    assert_true(wm.pending_saves);
    assert_int_equal(pstate(&g, "t"), KVT_ECP_WAITING_INPUTS); /* the first push stands */
    kvt_ec_worker_meta_clear(&wm);
    KVT_OK_(kvt_ec_producer_report(g.p, &wm));
    assert_int_equal(wm.failed_saves.n, 0); /* reported once */
    kvt_ec_worker_meta_release(&wm);
    KVT_OK_(kvt_ec_producer_request_finished(g.p, "r1", 2));
    rig_close(&g);
}

static void partial_reserve_is_compensated_before_its_future_fails(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, 3, 64 * 1024);
    g.c.fail_next[OP_RESERVE][1] = 1; /* shard 1 refuses */
    push(&g, "t", "h", "r");
    assert_int_equal(pstate(&g, "t"), KVT_ECP_FAILED);
    assert_int_equal(g.c.calls[OP_RESERVE][2], 0);
    assert_int_equal(g.c.calls[OP_CANCEL][0], 1); /* shard 0's reservation abandoned */
    assert_int_equal(kvt_ec_shard_state(g.c.sh[0], "t", 1), KVT_EC_CANCELLED);
    kvt_ec_push_failure f[2];
    assert_int_equal(kvt_ec_producer_take_failures(g.p, f, 2), 1);
    assert_string_equal(f[0].mm_hash, "h");
    assert_non_null(strstr(f[0].error, "reserving"));
    assert_int_equal(kvt_ec_producer_take_failures(g.p, f, 2), 0); /* once */
    rig_close(&g);
}

static void reservation_requires_confirmed_topology_before_any_rpc(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, 2, 64 * 1024);
    g.c.no_topology = true;
    push(&g, "t", "h", "r");
    assert_int_equal(pstate(&g, "t"), KVT_ECP_FAILED);
    assert_int_equal(g.c.calls[OP_RESERVE][0] + g.c.calls[OP_CANCEL][0], 0);
    rig_close(&g);
}

static void a_ready_push_does_not_wait_for_another_item(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, 1, 64 * 1024);
    push(&g, "t1", "h1", "r");
    push(&g, "t2", "h2", "r");
    bind(&g, "h2", 1, NULL);
    assert_int_equal(kvt_ec_producer_dispatch(g.p), 1);
    assert_int_equal(pstate(&g, "t2"), KVT_ECP_DONE);
    assert_int_equal(pstate(&g, "t1"), KVT_ECP_WAITING_INPUTS);
    expect_bytes(&g, 0, "t2", "h2", 1);
    bind(&g, "h1", 0, NULL);
    kvt_ec_producer_dispatch(g.p);
    expect_bytes(&g, 0, "t1", "h1", 0);
    rig_close(&g);
}

static void batches_pushes_from_one_model_step(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, 1, 64 * 1024);
    push(&g, "t1", "h1", "r");
    push(&g, "t2", "h2", "r");
    bind(&g, "h1", 0, NULL);
    bind(&g, "h2", 1, NULL);
    assert_int_equal(kvt_ec_producer_dispatch(g.p), 2);
    kvt_ec_producer_stats st;
    kvt_ec_producer_get_stats(g.p, &st);
    assert_int_equal(st.batches, 1); /* one consumer: one batch */
    rig_close(&g);
}

static void source_waits_for_its_readiness_fence(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, 1, 64 * 1024);
    push(&g, "t", "h", "r");
    bool passed = false;
    kvt_ec_fence f = {fence_done, &passed};
    bind(&g, "h", 0, &f); /* the encoder's kernels may still write it */
    assert_int_equal(kvt_ec_producer_dispatch(g.p), 0);
    assert_int_equal(g.c.calls[OP_WRITE][0], 0);
    passed = true;
    assert_int_equal(kvt_ec_producer_dispatch(g.p), 1);
    expect_bytes(&g, 0, "t", "h", 0);
    rig_close(&g);
}

static void invalid_source_fails_before_staging(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, 2, 64 * 1024);
    push(&g, "t", "h", "r");
    KVT_OK_(kvt_ec_producer_bind_source(g.p, "h", 1, g.src[0], 1000, NULL) == 1 ? 0 : -1);
    kvt_ec_producer_dispatch(g.p);
    assert_int_equal(pstate(&g, "t"), KVT_ECP_FAILED);
    assert_int_equal(g.c.calls[OP_WRITE][0] + g.c.calls[OP_WRITE][1], 0);
    for (uint32_t k = 0; k < 2; k++) /* both reservations abandoned */
        assert_int_equal(kvt_ec_shard_state(g.c.sh[k], "t", 1), KVT_EC_CANCELLED);
    rig_close(&g);
}

/* An output of the right size and the wrong shape or dtype is never pushed (issue 37): bound
 * with its description, each push that says otherwise fails and frees its reservations; one
 * that agrees is bound and pushed; a bad description changes nothing. */
static void a_source_of_another_shape_or_dtype_is_refused(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, 2, 64 * 1024);
    push(&g, "t", "h", "r"); /* (TOK, 256) float32 */
    push(&g, "u", "h2", "r2");
    push(&g, "v", "h3", "r3");
    kvt_ec_source_desc d = {2, {TOK * 2, 128}, "float32"}; /* same bytes, another shape */
    KVT_ERR_(kvt_ec_producer_bind_source_typed(g.p, "h", 1, g.src[0], TOK * 1024, NULL, NULL),
             KVT_EINVAL);
    kvt_ec_source_desc bad = {KVT_EC_MAX_DIMS + 1, {0}, "float32"};
    KVT_ERR_(kvt_ec_producer_bind_source_typed(g.p, "h", 1, g.src[0], TOK * 1024, &bad, NULL),
             KVT_EINVAL);
    bad = (kvt_ec_source_desc){2, {TOK, 256}, ""};
    KVT_ERR_(kvt_ec_producer_bind_source_typed(g.p, "h", 1, g.src[0], TOK * 1024, &bad, NULL),
             KVT_EINVAL);
    assert_int_equal(pstate(&g, "t"), KVT_ECP_WAITING_INPUTS); /* nothing changed */
    assert_int_equal(kvt_ec_producer_bind_source_typed(g.p, "h", 1, g.src[0], TOK * 1024, &d, NULL),
                     0);
    assert_int_equal(pstate(&g, "t"), KVT_ECP_FAILED);
    for (uint32_t k = 0; k < 2; k++)
        assert_int_equal(kvt_ec_shard_state(g.c.sh[k], "t", 1), KVT_EC_CANCELLED);
    kvt_ec_push_failure f[2];
    assert_int_equal(kvt_ec_producer_take_failures(g.p, f, 2), 1);
    assert_non_null(strstr(f[0].error, "(4,128) float32 but the push says (2,256) float32"));
    /* the message is this failure's alone: before, it ended with a stale error of an earlier
     * call (here the refused desc's "dtype must be 1..64 bytes") */
    assert_null(strstr(f[0].error, "dtype must be"));
    d = (kvt_ec_source_desc){2, {TOK, 256}, "bfloat16"}; /* the right shape, another dtype */
    assert_int_equal(
        kvt_ec_producer_bind_source_typed(g.p, "h2", 2, g.src[1], TOK * 1024, &d, NULL), 0);
    assert_int_equal(pstate(&g, "u"), KVT_ECP_FAILED);
    /* both requests fail through failed_saves, as ec.h promises (before: neither was there) */
    kvt_ec_worker_meta wm;
    kvt_ec_worker_meta_init(&wm);
    KVT_OK_(kvt_ec_producer_report(g.p, &wm));
    assert_int_equal(wm.failed_saves.n, 2);
    assert_true(kvt_strset_contains(&wm.failed_saves, "r", 1));
    assert_true(kvt_strset_contains(&wm.failed_saves, "r2", 2));
    assert_false(kvt_strset_contains(&wm.failed_saves, "r3", 2));
    kvt_ec_worker_meta_release(&wm);
    d.dtype = "float32";
    assert_int_equal(
        kvt_ec_producer_bind_source_typed(g.p, "h3", 2, g.src[2], TOK * 1024, &d, NULL), 1);
    assert_int_equal(kvt_ec_producer_dispatch(g.p), 1);
    expect_bytes(&g, 0, "v", "h3", 2);
    rig_close(&g);
}

static void failed_push_is_reported_not_raised(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, 2, 64 * 1024);
    push(&g, "t", "h", "r");
    bind(&g, "h", 0, NULL);
    g.c.fail_next[OP_WRITE][1] = 1;
    KVT_OK_(kvt_ec_producer_dispatch(g.p) >= 0 ? 0 : -1);
    assert_int_equal(pstate(&g, "t"), KVT_ECP_FAILED);
    for (uint32_t k = 0; k < 2; k++) /* the consumer frees both destinations */
        assert_int_equal(kvt_ec_shard_state(g.c.sh[k], "t", 1), KVT_EC_CANCELLED);
    kvt_ec_push_failure f[1];
    assert_int_equal(kvt_ec_producer_take_failures(g.p, f, 1), 1);
    assert_non_null(strstr(f[0].error, "writing"));
    rig_close(&g);
}

static void partial_complete_abandons_all_shards_before_releasing_source(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, 2, 64 * 1024);
    push(&g, "t", "h", "r");
    bind(&g, "h", 0, NULL);
    g.c.fail_next[OP_COMPLETE][1] = 1; /* shard 0 completes, shard 1 does not */
    kvt_ec_producer_dispatch(g.p);
    assert_int_equal(pstate(&g, "t"), KVT_ECP_FAILED);
    /* shard 0 had completed (READY): abandoned too */
    assert_int_equal(kvt_ec_shard_state(g.c.sh[0], "t", 1), KVT_EC_CANCELLED);
    assert_int_equal(kvt_ec_shard_state(g.c.sh[1], "t", 1), KVT_EC_CANCELLED);
    assert_false(kvt_ec_producer_pending(g.p));
    rig_close(&g);
}

/* The consumer let go of a cached item before the producer's completion arrived: that shard
 * rejects the completion; the push still finishes (logged, counted), nothing is abandoned. */
static void notify_completions_tolerates_rejected_reservation(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, 1, 64 * 1024);
    push(&g, "t0", "h", "r0"); /* h becomes resident on the shard */
    bind(&g, "h", 0, NULL);
    kvt_ec_producer_dispatch(g.p);
    expect_bytes(&g, 0, "t0", "h", 0);
    push(&g, "t1", "h", "r1"); /* a cached hit there: READY at once */
    bool done;
    KVT_OK_(kvt_ec_shard_cancel(g.c.sh[0], "t1", 2, NULL, false, false, &done)); /* consumed */
    bind(&g, "h", 0, NULL);
    assert_int_equal(kvt_ec_producer_dispatch(g.p), 1);
    kvt_ec_push_failure pf[1];
    if (kvt_ec_producer_take_failures(g.p, pf, 1))
        fail_msg("%s", pf[0].error);
    assert_int_equal(pstate(&g, "t1"), KVT_ECP_DONE);
    kvt_ec_producer_stats st;
    kvt_ec_producer_get_stats(g.p, &st);
    assert_int_equal(st.rejected, 1);
    assert_int_equal(st.failed, 0);
    rig_close(&g);
}

static void finished_request_cancels_unbound_reservation(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, 2, 64 * 1024);
    push(&g, "t1", "h1", "r");
    push(&g, "t2", "h2", "r");
    bind(&g, "h2", 1, NULL); /* t2 has its source: it is pushed, not cancelled */
    KVT_OK_(kvt_ec_producer_request_finished(g.p, "r", 1));
    assert_int_equal(pstate(&g, "t1"), KVT_ECP_CANCELLED);
    assert_int_equal(pstate(&g, "t2"), KVT_ECP_WAITING_INPUTS);
    assert_int_equal(kvt_ec_shard_state(g.c.sh[0], "t1", 2), KVT_EC_CANCELLED);
    kvt_ec_producer_dispatch(g.p);
    assert_int_equal(pstate(&g, "t2"), KVT_ECP_DONE);
    /* a cancel that fails twice on a shard leaves the push FAILED */
    push(&g, "t3", "h3", "q");
    g.c.fail_next[OP_CANCEL][0] = 2;
    KVT_OK_(kvt_ec_producer_request_finished(g.p, "q", 1));
    assert_int_equal(pstate(&g, "t3"), KVT_ECP_FAILED);
    /* shard 0 still holds t3's destination for a writer that will never come: abandon it */
    {
        bool done;
        kvt_ec_reply r;
        kvt_ec_item it = {"h3", 2, TOK * 1024, 2, {TOK, 256}, "float32", 7};
        KVT_OK_(kvt_ec_shard_reserve(g.c.sh[0], "t3", 2, &it, &r));
        KVT_OK_(kvt_ec_shard_cancel(g.c.sh[0], "t3", 2, NULL, true, false, &done));
    }
    rig_close(&g);
}

static void stale_shards_are_refreshed_before_writing(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, 1, 64 * 1024);
    push(&g, "t", "h", "r");
    kvt_clock_manual_advance(&g.clock, 151ull * 1000000000ull); /* older than TTL / 2 */
    bind(&g, "h", 0, NULL);
    kvt_ec_producer_dispatch(g.p);
    assert_int_equal(pstate(&g, "t"), KVT_ECP_DONE);
    assert_int_equal(g.c.calls[OP_RESERVE][0], 2); /* re-reserved with a new id */
    kvt_ec_producer_stats st;
    kvt_ec_producer_get_stats(g.p, &st);
    assert_int_equal(st.refreshes, 1);
    expect_bytes(&g, 0, "t", "h", 0);
    rig_close(&g);
}

/* Issue 56: stale reservations on several shards are all abandoned before any is reserved
 * again, as vLLM's Mooncake producer does (before: abandon and re-reserve shard by shard). */
static void every_stale_shard_is_abandoned_before_any_is_reserved_again(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, 3, 64 * 1024);
    push(&g, "t", "h", "r");
    kvt_clock_manual_advance(&g.clock, 151ull * 1000000000ull); /* older than TTL / 2 */
    bind(&g, "h", 0, NULL);
    uint32_t from = g.c.n_log;
    kvt_ec_producer_dispatch(g.p);
    assert_int_equal(pstate(&g, "t"), KVT_ECP_DONE);
    const uint32_t want[] = {OP_CANCEL * 100 + 0,  OP_CANCEL * 100 + 1,  OP_CANCEL * 100 + 2,
                             OP_RESERVE * 100 + 0, OP_RESERVE * 100 + 1, OP_RESERVE * 100 + 2};
    assert_true(g.c.n_log >= from + 6);
    for (uint32_t i = 0; i < 6; i++)
        if (g.c.log[from + i] != want[i])
            fail_msg("call %u of the refresh is op %u on shard %u, expected op %u on shard %u", i,
                     g.c.log[from + i] / 100, g.c.log[from + i] % 100, want[i] / 100,
                     want[i] % 100);
    kvt_ec_producer_stats st;
    kvt_ec_producer_get_stats(g.p, &st);
    assert_int_equal(st.refreshes, 3);
    for (uint32_t k = 0; k < 3; k++)
        expect_bytes(&g, k, "t", "h", 0);
    rig_close(&g);
}

static void pushes_into_followers_and_cached_items_write_once(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, 1, 64 * 1024);
    push(&g, "t1", "h", "r1");
    push(&g, "t2", "h", "r2"); /* another transfer of the same item: a follower there */
    bind(&g, "h", 0, NULL);
    kvt_ec_producer_dispatch(g.p);
    assert_int_equal(g.c.calls[OP_WRITE][0], 1);
    assert_int_equal(pstate(&g, "t1"), KVT_ECP_DONE);
    assert_int_equal(pstate(&g, "t2"), KVT_ECP_DONE);
    expect_bytes(&g, 0, "t1", "h", 0);
    expect_bytes(&g, 0, "t2", "h", 0);
    rig_close(&g);
}

/* The library's in-process consumer (kvt_ec_local_consumer_ops), and every component's
 * Prometheus text. */
static void local_consumer_delivers_and_metrics_count_it(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, 2, 64 * 1024);
    kvt_ec_local_consumer lc = {{g.c.sh[0], g.c.sh[1]}, 2};
    kvt_ec_producer_config pc;
    kvt_ec_producer_config_init(&pc);
    pc.ops = kvt_ec_local_consumer_ops(&lc);
    kvt_ec_producer *p;
    KVT_OK_(kvt_ec_producer_create(&pc, &p));
    kvt_ec_push_spec s = inproc_spec("t", "h", TOK, "r");
    KVT_OK_(kvt_ec_producer_push(p, &s));
    assert_int_equal(kvt_ec_producer_bind_source(p, "h", 1, g.src[2], TOK * 1024, NULL), 1);
    assert_int_equal(kvt_ec_producer_dispatch(p), 1);
    expect_bytes(&g, 0, "t", "h", 2);
    expect_bytes(&g, 1, "t", "h", 2);
    char buf[8192];
    size_t len;
    KVT_OK_(kvt_ec_producer_prometheus(p, buf, sizeof(buf), &len));
    KVT_PROMTOOL_OK(buf);
    assert_non_null(strstr(buf, "kvtier_ec_producer_writes_total 2"));
    assert_non_null(strstr(buf, "kvtier_ec_producer_pending 0"));
    KVT_OK_(kvt_ec_shard_prometheus(g.c.sh[0], buf, sizeof(buf), &len));
    KVT_PROMTOOL_OK(buf);
    assert_non_null(strstr(buf, "kvtier_ec_shard_takes_total 1"));
    assert_non_null(strstr(buf, "kvtier_ec_shard_residents 1"));
    KVT_ERR_(kvt_ec_shard_prometheus(g.c.sh[0], buf, 16, &len), KVT_ENOSPC);
    kvt_ec_sched_config sc;
    kvt_ec_sched_config_init(&sc);
    kvt_ec_sched *sched;
    KVT_OK_(kvt_ec_sched_create(&sc, &sched));
    kvt_ec_ready ev = {"t", 1, {"h", 1, TOK * 1024, 2, {TOK, 256}, "float32", 7}, 0};
    KVT_OK_(kvt_ec_sched_observe_ready(sched, &ev));
    KVT_OK_(kvt_ec_sched_prometheus(sched, buf, sizeof(buf), &len));
    KVT_PROMTOOL_OK(buf);
    assert_non_null(strstr(buf, "kvtier_ec_sched_transfers{state=\"available\"} 1"));
    assert_non_null(strstr(buf, "kvtier_ec_sched_ready_events_total 1"));
    kvt_ec_sched_destroy(sched);
    kvt_ec_producer_destroy(p);
    rig_close(&g);
}

/* Ends a reservation the producer left on shard k (as a consumer's TTL reaper would). */
static void abandon_by_hand(rig *g, uint32_t k, const char *t, const char *h)
{
    kvt_ec_push_spec x = inproc_spec(t, h, TOK, "r");
    kvt_ec_item it = {x.mm_hash.ptr, x.mm_hash.len, x.nbytes,   x.ndim,
                      {0},           x.dtype.ptr,   x.dtype.len};
    memcpy(it.shape, x.shape, sizeof(it.shape));
    kvt_ec_reply rep;
    bool done;
    KVT_OK_(kvt_ec_shard_reserve(g->c.sh[k], t, (uint32_t)strlen(t), &it, &rep)); /* the same one */
    KVT_OK_(kvt_ec_shard_cancel(g->c.sh[k], t, (uint32_t)strlen(t), rep.reservation_id, true, false,
                                &done));
}

/* A step's pushes: one reserve message per shard, one write batch, one completion message per
 * shard; every item's bytes arrive. */
static void push_many_sends_one_message_per_shard_and_step(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, 2, 64 * 1024);
    kvt_ec_push_spec s[4];
    const char *t[4] = {"t0", "t1", "t2", "t3"}, *h[4] = {"h0", "h1", "h2", "h3"};
    for (int i = 0; i < 4; i++)
        s[i] = inproc_spec(t[i], h[i], TOK, "r");
    KVT_OK_(kvt_ec_producer_push_many(g.p, s, 4));
    for (uint32_t k = 0; k < 2; k++) {
        assert_int_equal(g.c.batch_calls[OP_RESERVE][k], 1);
        assert_int_equal(g.c.calls[OP_RESERVE][k], 4);
    }
    for (int i = 0; i < 4; i++)
        assert_int_equal(bind(&g, h[i], i, NULL), 1);
    assert_int_equal(kvt_ec_producer_dispatch(g.p), 4);
    assert_int_equal(g.c.batch_calls[OP_WRITE][0], 1); /* both shards' writes in one batch */
    assert_int_equal(g.c.calls[OP_WRITE][0] + g.c.calls[OP_WRITE][1], 8);
    for (uint32_t k = 0; k < 2; k++)
        assert_int_equal(g.c.batch_calls[OP_COMPLETE][k], 1);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(pstate(&g, t[i]), KVT_ECP_DONE);
        for (uint32_t k = 0; k < 2; k++)
            expect_bytes(&g, k, t[i], h[i], i);
    }
    rig_close(&g);
}

/* One operation of a batch failing fails its record alone (every shard it holds abandoned); a
 * whole batch call failing fails every record in it. */
static void a_failed_operation_fails_its_record_not_the_batch(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, 2, 64 * 1024);
    kvt_ec_push_spec s[3] = {inproc_spec("a", "ha", TOK, "r"), inproc_spec("b", "hb", TOK, "r"),
                             inproc_spec("c", "hc", TOK, "r")};
    g.c.fail_next[OP_RESERVE][1] = 0;
    KVT_OK_(kvt_ec_producer_push_many(g.p, s, 1)); /* "a" alone */
    g.c.fail_next[OP_RESERVE][1] = 1;              /* "b" is refused by shard 1 */
    KVT_OK_(kvt_ec_producer_push_many(g.p, s + 1, 2));
    assert_int_equal(pstate(&g, "b"), KVT_ECP_FAILED);
    assert_int_equal(kvt_ec_shard_state(g.c.sh[0], "b", 1), KVT_EC_CANCELLED); /* abandoned */
    assert_int_equal(pstate(&g, "c"), KVT_ECP_WAITING_INPUTS);
    bind(&g, "ha", 0, NULL);
    bind(&g, "hc", 2, NULL);
    g.c.fail_next[OP_WRITE][0] = 1; /* the first write of the batch ("a" on shard 0) fails */
    assert_int_equal(kvt_ec_producer_dispatch(g.p), 2);
    assert_int_equal(pstate(&g, "a"), KVT_ECP_FAILED);
    assert_int_equal(kvt_ec_shard_state(g.c.sh[1], "a", 1), KVT_EC_CANCELLED);
    assert_int_equal(pstate(&g, "c"), KVT_ECP_DONE);
    expect_bytes(&g, 0, "c", "hc", 2);
    expect_bytes(&g, 1, "c", "hc", 2);
    kvt_ec_push_failure f[4];
    assert_int_equal(kvt_ec_producer_take_failures(g.p, f, 4), 2);
    assert_non_null(strstr(f[0].error, "injected failure"));
    /* a completion message lost as a whole: every record in it fails */
    kvt_ec_push_spec d[2] = {inproc_spec("d", "hd", TOK, "r"), inproc_spec("e", "he", TOK, "r")};
    KVT_OK_(kvt_ec_producer_push_many(g.p, d, 2));
    bind(&g, "hd", 0, NULL);
    bind(&g, "he", 1, NULL);
    g.c.fail_batch[OP_COMPLETE] = true; /* shard 0's completion message gets no answer */
    assert_int_equal(kvt_ec_producer_dispatch(g.p), 2);
    assert_int_equal(pstate(&g, "d"), KVT_ECP_FAILED);
    assert_int_equal(pstate(&g, "e"), KVT_ECP_FAILED);
    /* shard 1 answers: abandoned there; shard 0 did not answer: not asked again in this call,
     * its reservations stay the writer's (its TTL reaper ends them), nothing freed early */
    for (int i = 0; i < 2; i++) {
        const char *t = i ? "e" : "d";
        assert_int_equal(kvt_ec_shard_state(g.c.sh[1], t, 1), KVT_EC_CANCELLED);
        assert_int_equal(kvt_ec_shard_state(g.c.sh[0], t, 1), KVT_EC_WRITING);
        abandon_by_hand(&g, 0, t, i ? "he" : "hd");
    }
    rig_close(&g);
}

/* A consumer that stops answering while a batch is written: the first record's abandon waits
 * its two attempts, the others do not ask the silent shard again (their reservations are left
 * to the consumer's TTL) — a dead consumer costs one timeout per call, not two per record. The
 * next call asks again. */
static void a_silent_shard_is_not_asked_again_within_one_call(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, 1, 64 * 1024);
    kvt_ec_push_spec s[3] = {inproc_spec("a", "ha", TOK, "r"), inproc_spec("b", "hb", TOK, "r"),
                             inproc_spec("c", "hc", TOK, "r")};
    KVT_OK_(kvt_ec_producer_push_many(g.p, s, 3));
    for (int i = 0; i < 3; i++)
        bind(&g, (const char *[]){"ha", "hb", "hc"}[i], i, NULL);
    g.c.fail_next[OP_WRITE][0] = 3;    /* every write fails ... */
    g.c.fail_next[OP_CANCEL][0] = 100; /* ... and the shard answers no cancel (KVT_EIO) */
    assert_int_equal(kvt_ec_producer_dispatch(g.p), 3);
    /* two attempts, then silence: two cancel messages (batched), or two single cancels */
    uint32_t *cancels = g_batched ? &g.c.batch_calls[OP_CANCEL][0] : &g.c.calls[OP_CANCEL][0];
    assert_int_equal(*cancels, 2);
    kvt_ec_producer_stats st;
    kvt_ec_producer_get_stats(g.p, &st);
    assert_int_equal(st.failed, 3);
    assert_int_equal(st.silent_shards, 1);
    kvt_ec_push_failure f[3];
    assert_int_equal(kvt_ec_producer_take_failures(g.p, f, 3), 3);
    for (int i = 0; i < 3; i++) /* each keeps its first error: the write */
        assert_non_null(strstr(f[i].error, "writing"));
    /* a new call asks again */
    kvt_ec_push_spec d = inproc_spec("d", "hd", TOK, "r");
    KVT_OK_(kvt_ec_producer_push_many(g.p, &d, 1));
    KVT_OK_(kvt_ec_producer_request_finished(g.p, "r", 1));
    assert_int_equal(*cancels, 4);
    g.c.fail_next[OP_CANCEL][0] = 0;
    /* nothing was freed under a writer: the three reservations are still the writer's ... */
    assert_int_equal(kvt_ec_shard_writers(g.c.sh[0]), 4);
    /* ... until abandoned (here by hand; in a consumer, by its TTL reaper) */
    for (int i = 0; i < 4; i++)
        abandon_by_hand(&g, 0, (const char *[]){"a", "b", "c", "d"}[i],
                        (const char *[]){"ha", "hb", "hc", "hd"}[i]);
    rig_close(&g);
}

/* A finished request's records without a source are abandoned in one cancel message per
 * shard; a batch's failed records likewise. */
static void abandons_go_in_one_message_per_shard(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, 2, 64 * 1024);
    kvt_ec_push_spec s[3] = {inproc_spec("a", "ha", TOK, "r"), inproc_spec("b", "hb", TOK, "r"),
                             inproc_spec("c", "hc", TOK, "q")};
    KVT_OK_(kvt_ec_producer_push_many(g.p, s, 3));
    KVT_OK_(kvt_ec_producer_request_finished(g.p, "r", 1));
    for (uint32_t k = 0; k < 2; k++) {
        assert_int_equal(g.c.batch_calls[OP_CANCEL][k], 1);
        assert_int_equal(g.c.calls[OP_CANCEL][k], 2);
        assert_int_equal(kvt_ec_shard_state(g.c.sh[k], "a", 1), KVT_EC_CANCELLED);
        assert_int_equal(kvt_ec_shard_state(g.c.sh[k], "b", 1), KVT_EC_CANCELLED);
    }
    assert_int_equal(pstate(&g, "a"), KVT_ECP_CANCELLED);
    assert_int_equal(pstate(&g, "c"), KVT_ECP_WAITING_INPUTS);
    /* shard 0's completion message gets no answer: both records fail and are abandoned on
     * shard 1 in one message (shard 0, silent, is not asked again in this call) */
    kvt_ec_push_spec d = inproc_spec("d", "hd", TOK, "q");
    KVT_OK_(kvt_ec_producer_push_many(g.p, &d, 1));
    bind(&g, "hc", 2, NULL);
    bind(&g, "hd", 3, NULL);
    g.c.fail_batch[OP_COMPLETE] = true; /* shard 0's message */
    assert_int_equal(kvt_ec_producer_dispatch(g.p), 2);
    assert_int_equal(g.c.batch_calls[OP_CANCEL][1], 2);
    assert_int_equal(kvt_ec_shard_state(g.c.sh[1], "c", 1), KVT_EC_CANCELLED);
    assert_int_equal(kvt_ec_shard_state(g.c.sh[1], "d", 1), KVT_EC_CANCELLED);
    abandon_by_hand(&g, 0, "c", "hc"); /* shard 0 did not answer: left to its TTL */
    abandon_by_hand(&g, 0, "d", "hd");
    rig_close(&g);
}

static int batched(void **state_)
{
    (void)state_;
    g_batched = true;
    return 0;
}

int main(void)
{
    const struct CMUnitTest batch_only[] = {
        cmocka_unit_test(push_many_sends_one_message_per_shard_and_step),
        cmocka_unit_test(a_failed_operation_fails_its_record_not_the_batch),
        cmocka_unit_test(abandons_go_in_one_message_per_shard),
    };
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(push_reaches_every_consumer_shard),
        cmocka_unit_test(duplicate_pushes_share_one_transfer_per_reservation),
        cmocka_unit_test(a_conflicting_payload_is_reported_through_failed_saves),
        cmocka_unit_test(partial_reserve_is_compensated_before_its_future_fails),
        cmocka_unit_test(reservation_requires_confirmed_topology_before_any_rpc),
        cmocka_unit_test(a_ready_push_does_not_wait_for_another_item),
        cmocka_unit_test(batches_pushes_from_one_model_step),
        cmocka_unit_test(source_waits_for_its_readiness_fence),
        cmocka_unit_test(invalid_source_fails_before_staging),
        cmocka_unit_test(failed_push_is_reported_not_raised),
        cmocka_unit_test(a_source_of_another_shape_or_dtype_is_refused),
        cmocka_unit_test(partial_complete_abandons_all_shards_before_releasing_source),
        cmocka_unit_test(notify_completions_tolerates_rejected_reservation),
        cmocka_unit_test(finished_request_cancels_unbound_reservation),
        cmocka_unit_test(stale_shards_are_refreshed_before_writing),
        cmocka_unit_test(every_stale_shard_is_abandoned_before_any_is_reserved_again),
        cmocka_unit_test(pushes_into_followers_and_cached_items_write_once),
        cmocka_unit_test(local_consumer_delivers_and_metrics_count_it),
        cmocka_unit_test(a_silent_shard_is_not_asked_again_within_one_call),
    };
    int failed = cmocka_run_group_tests_name("single calls", tests, NULL, NULL);
    failed += cmocka_run_group_tests_name("batched calls", tests, batched, NULL);
    return failed + cmocka_run_group_tests_name("batched calls only", batch_only, batched, NULL);
}
