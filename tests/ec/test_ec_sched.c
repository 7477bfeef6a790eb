/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The consumer scheduler's transfer table (spec ec-transfer §1.4 steps 8-12, §2.4, §3.4, §4.4),
 * one test per behaviour of §7's "Scheduler table" and "Scheduler connector" lists that
 * belong to the table (the sockets are issue 7's), named after it. Time is a manual clock.
 */
#include "kvt_test.h"

#define S_NS        1000000000ull
#define PUSH_WAIT   (60 * S_NS)
#define LEASE       (300 * S_NS)
#define ITEM_TOKENS 4

typedef struct rig {
    kvt_manual_clock clock;
    kvt_ec_sched *s;
    kvt_ec_meta meta;
} rig;

static void rig_open(rig *g, uint32_t shards)
{
    memset(g, 0, sizeof(*g));
    kvt_ec_sched_config c;
    kvt_ec_sched_config_init(&c);
    c.shards = shards;
    c.clock = kvt_clock_manual(&g->clock, 1);
    c.resident_capacity = 3 * ITEM_TOKENS * 1024;
    c.max_tombstones = 8;
    KVT_OK_(kvt_ec_sched_create(&c, &g->s));
    kvt_ec_meta_init(&g->meta);
}

static void rig_close(rig *g)
{
    kvt_ec_sched_destroy(g->s);
    kvt_ec_meta_release(&g->meta);
}

static void ready(rig *g, const char *t, const char *h, uint32_t shard)
{
    kvt_ec_ready ev = {
        t,
        (uint32_t)strlen(t),
        {h, (uint32_t)strlen(h), ITEM_TOKENS * 1024, 2, {ITEM_TOKENS, 256}, "float32", 7},
        shard};
    KVT_OK_(kvt_ec_sched_observe_ready(g->s, &ev));
}

static bool ensure(rig *g, const char *req, const char *h, const char *t)
{
    kvt_ec_feature f = {h, (uint32_t)strlen(h), t, t ? (uint32_t)strlen(t) : 0};
    bool ok;
    KVT_OK_(kvt_ec_sched_ensure(g->s, req, (uint32_t)strlen(req), &f, 1, &ok));
    return ok;
}

static int state(rig *g, const char *t)
{
    return kvt_ec_sched_state(g->s, t, (uint32_t)strlen(t));
}

static void build(rig *g)
{
    KVT_OK_(kvt_ec_sched_build_meta(g->s, &g->meta));
}

static void report(rig *g, const char *loaded, const char *failed, const char *reclaimed,
                   const char *failed_save)
{
    kvt_ec_worker_meta wm;
    kvt_ec_worker_meta_init(&wm);
    if (loaded)
        KVT_OK_(kvt_ec_worker_meta_add(&wm, KVT_EC_LOADED, loaded, (uint32_t)strlen(loaded)));
    if (failed)
        KVT_OK_(kvt_ec_worker_meta_add(&wm, KVT_EC_FAILED_LOADS, failed, (uint32_t)strlen(failed)));
    if (reclaimed)
        KVT_OK_(
            kvt_ec_worker_meta_add(&wm, KVT_EC_RECLAIMED, reclaimed, (uint32_t)strlen(reclaimed)));
    if (failed_save)
        KVT_OK_(kvt_ec_worker_meta_add(&wm, KVT_EC_FAILED_SAVES, failed_save,
                                       (uint32_t)strlen(failed_save)));
    KVT_OK_(kvt_ec_sched_apply_output(g->s, &wm));
    kvt_ec_worker_meta_release(&wm);
}

static uint32_t unavailable(rig *g, char (*out)[KVT_EC_KEY_MAX + 1])
{
    return kvt_ec_sched_take_unavailable(g->s, out, 8);
}

static uint32_t cancels(rig *g, char (*out)[KVT_EC_KEY_MAX + 1])
{
    return kvt_ec_sched_take_cancels(g->s, out, 8);
}

static void advance(rig *g, uint64_t ns)
{
    kvt_clock_manual_advance(&g->clock, ns);
    kvt_ec_sched_expire(g->s);
}

/* A request r loads h through transfer t until READY. */
static void load_ready(rig *g, const char *r, const char *h, const char *t)
{
    assert_false(ensure(g, r, h, t));
    build(g);
    report(g, h, NULL, NULL, NULL);
    assert_true(ensure(g, r, h, t));
}

static void readiness_needs_every_consumer_shard(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, 3);
    ready(&g, "t", "h", 0);
    ready(&g, "t", "h", 0); /* the same shard twice is not two shards */
    ready(&g, "t", "h", 1);
    assert_false(kvt_ec_sched_has_cache_item(g.s, "h", 1));
    ready(&g, "t", "h", 2);
    assert_int_equal(state(&g, "t"), KVT_ECT_AVAILABLE);
    assert_true(kvt_ec_sched_has_cache_item(g.s, "h", 1));
    kvt_ec_ready bad = {"t", 1, {"h", 1, 4, 1, {1}, "float32", 7}, 3};
    KVT_ERR_(kvt_ec_sched_observe_ready(g.s, &bad), KVT_ERANGE);
    rig_close(&g);
}

static void load_completion_and_resident_reload(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, 1);
    ready(&g, "t", "h", 0);
    assert_false(ensure(&g, "r1", "h", "t"));
    assert_int_equal(state(&g, "t"), KVT_ECT_LOADING);
    build(&g);
    assert_int_equal(g.meta.n_loads, 1);
    assert_false(g.meta.loads[0].local);
    assert_string_equal(g.meta.loads[0].transfer_id.ptr, "t");
    assert_int_equal(g.meta.loads[0].nbytes, ITEM_TOKENS * 1024);
    assert_false(ensure(&g, "r1", "h", "t")); /* loading: not yet */
    report(&g, "h", NULL, NULL, NULL);
    assert_int_equal(state(&g, "t"), KVT_ECT_READY);
    assert_true(ensure(&g, "r1", "h", "t"));
    KVT_OK_(kvt_ec_sched_cache_freed(g.s, "h", 1)); /* the encoder cache evicted it */
    assert_int_equal(state(&g, "t"), KVT_ECT_RESIDENT);
    build(&g);
    assert_true(g.meta.has_freed);
    assert_int_equal(g.meta.n_freed, 1);
    assert_false(ensure(&g, "r2", "h", NULL)); /* a later request: a local handoff */
    build(&g);
    assert_int_equal(g.meta.n_loads, 1);
    assert_true(g.meta.loads[0].local);
    rig_close(&g);
}

static void same_hash_index_preserves_order_and_identity(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, 1);
    ready(&g, "t1", "h", 0);
    ready(&g, "t2", "h", 0);
    assert_false(ensure(&g, "r", "h", "other")); /* its own transfer is not there: the oldest */
    assert_int_equal(state(&g, "t1"), KVT_ECT_LOADING);
    assert_int_equal(state(&g, "t2"), KVT_ECT_AVAILABLE);
    ready(&g, "t1", "k", 0); /* a colliding id is refused, not raised */
    assert_int_equal(state(&g, "t1"), KVT_ECT_LOADING);
    rig_close(&g);
}

static void item_with_no_transfer_in_flight_is_reported_as_stalled(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, 1);
    assert_false(ensure(&g, "req", "h", NULL)); /* waits under "req:0" */
    assert_int_equal(state(&g, "req:0"), KVT_ECT_WAITING);
    advance(&g, PUSH_WAIT + 1);
    assert_int_equal(state(&g, "req:0"), KVT_ECT_UNAVAILABLE);
    char out[8][KVT_EC_KEY_MAX + 1];
    assert_int_equal(unavailable(&g, out), 1);
    assert_string_equal(out[0], "req");
    assert_int_equal(unavailable(&g, out), 0); /* once */
    assert_int_equal(cancels(&g, out), 0);     /* nothing to cancel: no RPC */
    assert_false(ensure(&g, "req", "h", NULL));
    assert_int_equal(unavailable(&g, out), 0);
    rig_close(&g);
}

static void unavailable_notification_is_drained_once_and_rejects_late_ready(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, 1);
    assert_false(ensure(&g, "r", "h", "t"));
    advance(&g, PUSH_WAIT + 1);
    char out[8][KVT_EC_KEY_MAX + 1];
    assert_int_equal(unavailable(&g, out), 1);
    ready(&g, "t", "h", 0); /* late */
    assert_int_equal(state(&g, "t"), KVT_ECT_UNAVAILABLE);
    assert_false(kvt_ec_sched_has_cache_item(g.s, "h", 1));
    rig_close(&g);
}

static void a_load_that_never_reports_back_fails_its_request(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, 1);
    ready(&g, "t", "h", 0);
    assert_false(ensure(&g, "r", "h", "t"));
    build(&g);
    advance(&g, PUSH_WAIT + 1);
    assert_int_equal(state(&g, "t"), KVT_ECT_UNAVAILABLE);
    char out[8][KVT_EC_KEY_MAX + 1];
    assert_int_equal(unavailable(&g, out), 1);
    assert_string_equal(out[0], "r");
    assert_int_equal(cancels(&g, out), 1); /* and its reservations are released */
    assert_string_equal(out[0], "t");
    rig_close(&g);
}

static void a_colliding_transfer_id_fails_only_the_request_that_named_it(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, 1);
    ready(&g, "t", "h", 0);
    assert_false(ensure(&g, "bad", "other-item", "t"));
    char out[8][KVT_EC_KEY_MAX + 1];
    assert_int_equal(unavailable(&g, out), 1);
    assert_string_equal(out[0], "bad");
    assert_int_equal(state(&g, "t"), KVT_ECT_AVAILABLE); /* the existing transfer survives */
    assert_false(ensure(&g, "good", "h", "t"));
    assert_int_equal(state(&g, "t"), KVT_ECT_LOADING);
    rig_close(&g);
}

static void local_cache_hit_keeps_the_transfer(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, 1);
    ready(&g, "t", "h", 0);
    KVT_OK_(kvt_ec_sched_cache_added(g.s, "h", 1)); /* the engine computed it itself */
    assert_true(ensure(&g, "r1", "h", "t"));
    kvt_ec_feature f = {"h", 1, "t", 1};
    KVT_OK_(kvt_ec_sched_consumed(g.s, "r1", 2, &f));
    char out[8][KVT_EC_KEY_MAX + 1];
    assert_int_equal(cancels(&g, out), 0); /* a local hit must not cancel */
    assert_int_equal(state(&g, "t"), KVT_ECT_AVAILABLE);
    KVT_OK_(kvt_ec_sched_cache_freed(g.s, "h", 1));
    assert_false(ensure(&g, "r2", "h", "t")); /* after eviction the request still loads */
    assert_int_equal(state(&g, "t"), KVT_ECT_LOADING);
    rig_close(&g);
}

static void consumed_item_releases_its_transfer_immediately(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, 1);
    ready(&g, "t", "h", 0);
    load_ready(&g, "r", "h", "t");
    KVT_OK_(kvt_ec_sched_cache_added(g.s, "h", 1)); /* the engine allocated it for r */
    kvt_ec_feature f = {"h", 1, "t", 1};
    KVT_OK_(kvt_ec_sched_consumed(g.s, "r", 1, &f));
    char out[8][KVT_EC_KEY_MAX + 1];
    assert_int_equal(cancels(&g, out), 1); /* the shards release the reservation at once */
    KVT_OK_(kvt_ec_sched_consumed(g.s, "r", 1, &f)); /* idempotent */
    assert_int_equal(cancels(&g, out), 0);
    /* the item is still in the encoder cache: READY, and RESIDENT once evicted */
    assert_int_equal(state(&g, "t"), KVT_ECT_READY);
    KVT_OK_(kvt_ec_sched_request_finished(g.s, "r", 1));
    assert_int_equal(state(&g, "t"), KVT_ECT_READY);
    KVT_OK_(kvt_ec_sched_cache_freed(g.s, "h", 1));
    assert_int_equal(state(&g, "t"), KVT_ECT_RESIDENT);
    rig_close(&g);
}

static void cancelled_transfer_ignores_late_ready_events(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, 4);
    assert_false(ensure(&g, "r", "h", "t"));
    KVT_OK_(kvt_ec_sched_request_finished(g.s, "r", 1));
    assert_int_equal(state(&g, "t"), KVT_ECT_CANCELLED);
    for (uint32_t k = 0; k < 4; k++) /* even when all 4 shards report */
        ready(&g, "t", "h", k);
    assert_int_equal(state(&g, "t"), KVT_ECT_CANCELLED);
    assert_false(kvt_ec_sched_has_cache_item(g.s, "h", 1));
    rig_close(&g);
}

static void same_hash_keeps_only_latest_resident(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, 1);
    ready(&g, "t1", "h", 0);
    load_ready(&g, "r1", "h", "t1");
    KVT_OK_(kvt_ec_sched_cache_freed(g.s, "h", 1));
    assert_int_equal(state(&g, "t1"), KVT_ECT_RESIDENT);
    /* a request with its own pushed copy loads that one rather than the resident */
    ready(&g, "t2", "h", 0);
    load_ready(&g, "r2", "h", "t2");
    assert_int_equal(state(&g, "t1"), KVT_ECT_RESIDENT);
    KVT_OK_(kvt_ec_sched_cache_freed(g.s, "h", 1));
    assert_int_equal(state(&g, "t2"), KVT_ECT_RESIDENT); /* the newest stays */
    assert_int_equal(state(&g, "t1"), KVT_ECT_EXPIRED);  /* the older is orphaned */
    char out[8][KVT_EC_KEY_MAX + 1];
    assert_int_equal(cancels(&g, out), 1); /* once */
    assert_string_equal(out[0], "t1");
    rig_close(&g);
}

static void orphaned_copies_of_an_evicted_item_are_cancelled_once(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, 1);
    /* two READY transfers of h (two requests loaded it through their own transfers) */
    ready(&g, "t1", "h", 0);
    ready(&g, "t2", "h", 0);
    assert_false(ensure(&g, "r1", "h", "t1"));
    build(&g);
    assert_false(ensure(&g, "r2", "h", "t2")); /* h is LOADING: not ready, no second load */
    assert_int_equal(state(&g, "t2"), KVT_ECT_AVAILABLE);
    report(&g, "h", NULL, NULL, NULL);
    KVT_OK_(kvt_ec_sched_cache_freed(g.s, "h", 1));
    assert_int_equal(state(&g, "t1"), KVT_ECT_RESIDENT);
    char out[8][KVT_EC_KEY_MAX + 1];
    KVT_OK_(kvt_ec_sched_cache_freed(g.s, "h", 1)); /* a second eviction: no READY copy left */
    assert_int_equal(state(&g, "t1"), KVT_ECT_EXPIRED);
    assert_int_equal(cancels(&g, out), 1);
    assert_string_equal(out[0], "t1");
    rig_close(&g);
}

static void reclaimed_item_stops_being_offered_as_resident(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, 1);
    ready(&g, "t", "h", 0);
    load_ready(&g, "r", "h", "t");
    KVT_OK_(kvt_ec_sched_cache_freed(g.s, "h", 1));
    assert_true(kvt_ec_sched_has_cache_item(g.s, "h", 1));
    report(&g, NULL, NULL, "h", NULL); /* a rank evicted it from its pool */
    assert_int_equal(state(&g, "t"), KVT_ECT_EXPIRED);
    assert_false(kvt_ec_sched_has_cache_item(g.s, "h", 1));
    /* a READY copy that a rank reclaimed expires instead of becoming resident */
    ready(&g, "t2", "k", 0);
    load_ready(&g, "r2", "k", "t2");
    report(&g, NULL, NULL, "k", NULL);
    KVT_OK_(kvt_ec_sched_cache_freed(g.s, "k", 1));
    assert_int_equal(state(&g, "t2"), KVT_ECT_EXPIRED);
    rig_close(&g);
}

static void an_item_one_rank_missed_is_not_loaded(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, 2);
    ready(&g, "t", "h", 0);
    ready(&g, "t", "h", 1);
    assert_false(ensure(&g, "r", "h", "t"));
    build(&g);
    /* rank 0 loaded it, rank 1 did not: the intersection is empty */
    kvt_ec_worker_meta r0, r1, agg;
    kvt_ec_worker_meta_init(&r0);
    kvt_ec_worker_meta_init(&r1);
    kvt_ec_worker_meta_init(&agg);
    KVT_OK_(kvt_ec_worker_meta_add(&r0, KVT_EC_LOADED, "h", 1));
    const kvt_ec_worker_meta *ranks[2] = {&r0, &r1};
    KVT_OK_(kvt_ec_worker_meta_aggregate_ranks(&agg, ranks, 2, NULL));
    KVT_OK_(kvt_ec_sched_apply_output(g.s, &agg));
    assert_int_equal(state(&g, "t"), KVT_ECT_LOADING);
    assert_false(ensure(&g, "r", "h", "t"));
    kvt_ec_worker_meta_release(&r0);
    kvt_ec_worker_meta_release(&r1);
    kvt_ec_worker_meta_release(&agg);
    rig_close(&g);
}

static void a_failed_load_fails_its_request(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, 1);
    ready(&g, "t", "h", 0);
    assert_false(ensure(&g, "r", "h", "t"));
    build(&g);
    report(&g, NULL, "h", NULL, NULL);
    assert_int_equal(state(&g, "t"), KVT_ECT_FAILED);
    char out[8][KVT_EC_KEY_MAX + 1];
    assert_int_equal(unavailable(&g, out), 1);
    assert_int_equal(cancels(&g, out), 1);
    rig_close(&g);
}

static void build_connector_meta_clears_pending(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, 1);
    ready(&g, "t", "h", 0);
    assert_false(ensure(&g, "r", "h", "t"));
    build(&g);
    assert_int_equal(g.meta.n_loads, 1);
    build(&g);
    assert_int_equal(g.meta.n_loads, 0);
    assert_int_equal(g.meta.n_freed, 0);
    rig_close(&g);
}

static void abandoned_report_fails_the_waiting_request(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, 1);
    assert_false(ensure(&g, "r", "h", "t"));
    KVT_OK_(kvt_ec_sched_observe_abandoned(g.s, "t", 1));
    char out[8][KVT_EC_KEY_MAX + 1];
    assert_int_equal(unavailable(&g, out), 1); /* at once, not after push_wait */
    assert_string_equal(out[0], "r");
    rig_close(&g);
}

static void abandoned_report_before_the_request_fails_it_on_arrival(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, 1);
    KVT_OK_(kvt_ec_sched_observe_abandoned(g.s, "t", 1));
    assert_false(ensure(&g, "r", "h", "t"));
    char out[8][KVT_EC_KEY_MAX + 1];
    assert_int_equal(unavailable(&g, out), 1);
    rig_close(&g);
}

static void abandoned_report_after_ready_is_ignored(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, 1);
    ready(&g, "t", "h", 0);
    KVT_OK_(kvt_ec_sched_observe_abandoned(g.s, "t", 1));
    assert_int_equal(state(&g, "t"), KVT_ECT_AVAILABLE);
    char out[8][KVT_EC_KEY_MAX + 1];
    assert_int_equal(unavailable(&g, out), 0);
    rig_close(&g);
}

static void finish_preserves_extra_transfer_loading_for_another_request(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, 1);
    ready(&g, "t", "h", 0);
    assert_false(ensure(&g, "r1", "h", "t"));
    assert_false(ensure(&g, "r2", "h", "t")); /* shares the transfer */
    build(&g);                                /* the load goes to the ranks */
    KVT_OK_(kvt_ec_sched_request_finished(g.s, "r1", 2));
    assert_int_equal(state(&g, "t"), KVT_ECT_LOADING); /* r2 still waits for it */
    KVT_OK_(kvt_ec_sched_request_finished(g.s, "r2", 2));
    /* nobody waits for it any more, but the ranks may be loading it: it stays LOADING until
     * they report, and what they placed is released then */
    assert_int_equal(state(&g, "t"), KVT_ECT_LOADING);
    build(&g);
    report(&g, "h", NULL, NULL, NULL);
    assert_int_equal(state(&g, "t"), KVT_ECT_CANCELLED);
    build(&g);
    assert_int_equal(g.meta.n_loads, 0);
    assert_int_equal(g.meta.n_freed, 1); /* the ranks retire it: nothing stays pinned */
    assert_string_equal(g.meta.freed[0].ptr, "h");
    char out[8][KVT_EC_KEY_MAX + 1];
    assert_int_equal(cancels(&g, out), 1);
    rig_close(&g);
}

/* A load not yet sent to the ranks is simply cancelled when its request finishes. */
static void an_undispatched_load_of_a_finished_request_is_cancelled(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, 1);
    ready(&g, "t", "h", 0);
    assert_false(ensure(&g, "r", "h", "t"));
    KVT_OK_(kvt_ec_sched_request_finished(g.s, "r", 1));
    assert_int_equal(state(&g, "t"), KVT_ECT_CANCELLED);
    build(&g);
    assert_int_equal(g.meta.n_loads, 0);
    rig_close(&g);
}

/* Loaded for a request that finished before the engine took the item: the ranks drop it (it is
 * named in the next `freed`) and the shards release the reservation. */
static void a_loaded_item_the_engine_never_took_is_released(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, 1);
    ready(&g, "t", "h", 0);
    load_ready(&g, "r", "h", "t");
    build(&g); /* (this step's meta, emptied) */
    KVT_OK_(kvt_ec_sched_request_finished(g.s, "r", 1));
    assert_int_equal(state(&g, "t"), KVT_ECT_CANCELLED);
    build(&g);
    assert_int_equal(g.meta.n_freed, 1);
    char out[8][KVT_EC_KEY_MAX + 1];
    assert_int_equal(cancels(&g, out), 1);
    assert_string_equal(out[0], "t");
    rig_close(&g);
}

/* request_finished given the request's bindings cancels transfers the table never saw (the
 * request was aborted before ensure): the shards release them, late readiness is ignored. */
static void finishing_with_bindings_cancels_unseen_transfers(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, 2);
    kvt_ec_feature b[2] = {{"h1", 2, "t1", 2}, {"h2", 2, "t2", 2}};
    ready(&g, "t2", "h2", 0); /* partial readiness of one of them */
    KVT_OK_(kvt_ec_sched_request_finished_bound(g.s, "r", 1, b, 2));
    assert_int_equal(state(&g, "t1"), KVT_ECT_CANCELLED);
    assert_int_equal(state(&g, "t2"), KVT_ECT_CANCELLED);
    char out[8][KVT_EC_KEY_MAX + 1];
    assert_int_equal(cancels(&g, out), 2);
    for (uint32_t k = 0; k < 2; k++) {
        ready(&g, "t1", "h1", k);
        ready(&g, "t2", "h2", k);
    }
    assert_false(kvt_ec_sched_has_cache_item(g.s, "h1", 2));
    assert_false(kvt_ec_sched_has_cache_item(g.s, "h2", 2));
    kvt_ec_feature bad = {"h", 1, "", 0};
    KVT_OK_(kvt_ec_sched_request_finished_bound(g.s, "r2", 2, &bad, 1)); /* no id: nothing */
    KVT_ERR_(kvt_ec_sched_request_finished_bound(g.s, "r3", 2, NULL, 1), KVT_EINVAL);
    rig_close(&g);
}

/* A feature served by another transfer of its item: on consumption the request's own transfer,
 * never loaded, is cancelled (nothing would ever load it); with the engine's own copy as the
 * only one it is kept (local_cache_hit_keeps_the_transfer). */
static void consuming_a_borrowed_feature_releases_its_own_transfer(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, 1);
    ready(&g, "t1", "h", 0);
    load_ready(&g, "r1", "h", "t1");
    KVT_OK_(kvt_ec_sched_cache_added(g.s, "h", 1));
    ready(&g, "t2", "h", 0); /* r2's own push of the same item */
    assert_true(ensure(&g, "r2", "h", "t2"));
    assert_int_equal(state(&g, "t2"), KVT_ECT_AVAILABLE);
    kvt_ec_feature f = {"h", 1, "t2", 2};
    KVT_OK_(kvt_ec_sched_consumed(g.s, "r2", 2, &f));
    assert_int_equal(state(&g, "t2"), KVT_ECT_CANCELLED);
    char out[8][KVT_EC_KEY_MAX + 1];
    assert_int_equal(cancels(&g, out), 1);
    assert_string_equal(out[0], "t2");
    rig_close(&g);
}

/* A request that loads an item through another request's transfer keeps it after the owner
 * finished; when the borrower finishes too, the transfer is let go (the ranks drop the item,
 * the shards release it): nothing stays READY with no request (issue 37). */
static void a_borrowed_transfer_is_released_by_its_last_holder(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, 1);
    ready(&g, "t", "h", 0);
    load_ready(&g, "r1", "h", "t");
    assert_true(ensure(&g, "r2", "h", "t2")); /* r2's own push never came: it borrows t */
    build(&g);
    KVT_OK_(kvt_ec_sched_request_finished(g.s, "r1", 2));
    assert_int_equal(state(&g, "t"), KVT_ECT_READY); /* r2 still holds it */
    char out[8][KVT_EC_KEY_MAX + 1];
    assert_int_equal(cancels(&g, out), 0);
    kvt_ec_feature b = {"h", 1, "t2", 2};
    KVT_OK_(kvt_ec_sched_request_finished_bound(g.s, "r2", 2, &b, 1));
    assert_int_equal(state(&g, "t"), KVT_ECT_CANCELLED);
    build(&g);
    assert_int_equal(g.meta.n_freed, 1); /* the ranks drop the item: nothing stays pinned */
    assert_string_equal(g.meta.freed[0].ptr, "h");
    assert_int_equal(cancels(&g, out), 2); /* t, and r2's own t2 (never seen) */
    rig_close(&g);
}

/* An AVAILABLE transfer is kept after consumption only while the engine's own cache holds the
 * item (a local hit, for a reload after eviction); consumed when the engine says its cache no
 * longer holds it, the transfer is let go at once instead of holding consumer memory until
 * its lease expires (issue 37). */
static void an_available_transfer_is_kept_only_for_a_local_hit(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, 1);
    ready(&g, "t", "h", 0);
    KVT_OK_(kvt_ec_sched_cache_added(g.s, "h", 1));
    assert_true(ensure(&g, "r1", "h", "t")); /* served by the engine's cache */
    KVT_OK_(kvt_ec_sched_cache_freed(g.s, "h", 1));
    kvt_ec_feature f = {"h", 1, "t", 1};
    KVT_OK_(kvt_ec_sched_consumed(g.s, "r1", 2, &f));
    assert_int_equal(state(&g, "t"), KVT_ECT_CANCELLED);
    char out[8][KVT_EC_KEY_MAX + 1];
    assert_int_equal(cancels(&g, out), 1);
    rig_close(&g);
}

static void a_rejected_push_fails_its_request(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, 1);
    assert_false(ensure(&g, "r", "h", "t"));
    report(&g, NULL, NULL, NULL, "r"); /* failed_saves: a conflicting transfer id */
    char out[8][KVT_EC_KEY_MAX + 1];
    assert_int_equal(unavailable(&g, out), 1);
    assert_string_equal(out[0], "r");
    bool ok;
    kvt_ec_feature f = {"h", 1, "t", 1};
    KVT_OK_(kvt_ec_sched_ensure(g.s, "r", 1, &f, 1, &ok));
    assert_false(ok);
    rig_close(&g);
}

static void available_lease_is_touched_while_asked_for_and_expires_otherwise(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, 1);
    ready(&g, "t", "h", 0);
    KVT_OK_(kvt_ec_sched_cache_added(g.s, "h", 1)); /* served locally: t stays AVAILABLE */
    for (int i = 0; i < 3; i++) {
        advance(&g, LEASE - S_NS);
        assert_true(ensure(&g, "r", "h", "t")); /* re-arms the lease */
        assert_int_equal(state(&g, "t"), KVT_ECT_AVAILABLE);
    }
    advance(&g, LEASE + 1);
    assert_int_equal(state(&g, "t"), KVT_ECT_EXPIRED);
    char out[8][KVT_EC_KEY_MAX + 1];
    assert_int_equal(cancels(&g, out), 1);
    rig_close(&g);
}

static void terminal_records_expire_and_are_bounded(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, 1); /* 8 tombstones at most */
    char t[16];
    for (int i = 0; i < 12; i++) {
        snprintf(t, sizeof(t), "t%d", i);
        KVT_OK_(kvt_ec_sched_observe_abandoned(g.s, t, (uint32_t)strlen(t)));
    }
    assert_int_equal(state(&g, "t3"), KVT_ECT_NONE); /* the oldest were dropped */
    assert_int_equal(state(&g, "t4"), KVT_ECT_UNAVAILABLE);
    advance(&g, LEASE + 1);
    assert_int_equal(state(&g, "t11"), KVT_ECT_NONE); /* reaped after the TTL */
    rig_close(&g);
}

static void resident_mirror_is_bounded_by_the_pool(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, 1); /* room for 3 items */
    char t[8], r[8], h[8];
    for (int i = 0; i < 4; i++) {
        snprintf(t, sizeof(t), "t%d", i);
        snprintf(r, sizeof(r), "r%d", i);
        snprintf(h, sizeof(h), "h%d", i);
        ready(&g, t, h, 0);
        load_ready(&g, r, h, t);
        KVT_OK_(kvt_ec_sched_cache_freed(g.s, h, (uint32_t)strlen(h)));
    }
    assert_int_equal(state(&g, "t0"), KVT_ECT_EXPIRED); /* the oldest resident went */
    assert_int_equal(state(&g, "t3"), KVT_ECT_RESIDENT);
    rig_close(&g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(readiness_needs_every_consumer_shard),
        cmocka_unit_test(load_completion_and_resident_reload),
        cmocka_unit_test(same_hash_index_preserves_order_and_identity),
        cmocka_unit_test(item_with_no_transfer_in_flight_is_reported_as_stalled),
        cmocka_unit_test(unavailable_notification_is_drained_once_and_rejects_late_ready),
        cmocka_unit_test(a_load_that_never_reports_back_fails_its_request),
        cmocka_unit_test(a_colliding_transfer_id_fails_only_the_request_that_named_it),
        cmocka_unit_test(local_cache_hit_keeps_the_transfer),
        cmocka_unit_test(consumed_item_releases_its_transfer_immediately),
        cmocka_unit_test(a_loaded_item_the_engine_never_took_is_released),
        cmocka_unit_test(an_undispatched_load_of_a_finished_request_is_cancelled),
        cmocka_unit_test(finishing_with_bindings_cancels_unseen_transfers),
        cmocka_unit_test(consuming_a_borrowed_feature_releases_its_own_transfer),
        cmocka_unit_test(a_borrowed_transfer_is_released_by_its_last_holder),
        cmocka_unit_test(an_available_transfer_is_kept_only_for_a_local_hit),
        cmocka_unit_test(cancelled_transfer_ignores_late_ready_events),
        cmocka_unit_test(same_hash_keeps_only_latest_resident),
        cmocka_unit_test(orphaned_copies_of_an_evicted_item_are_cancelled_once),
        cmocka_unit_test(reclaimed_item_stops_being_offered_as_resident),
        cmocka_unit_test(an_item_one_rank_missed_is_not_loaded),
        cmocka_unit_test(a_failed_load_fails_its_request),
        cmocka_unit_test(build_connector_meta_clears_pending),
        cmocka_unit_test(abandoned_report_fails_the_waiting_request),
        cmocka_unit_test(abandoned_report_before_the_request_fails_it_on_arrival),
        cmocka_unit_test(abandoned_report_after_ready_is_ignored),
        cmocka_unit_test(finish_preserves_extra_transfer_loading_for_another_request),
        cmocka_unit_test(a_rejected_push_fails_its_request),
        cmocka_unit_test(available_lease_is_touched_while_asked_for_and_expires_otherwise),
        cmocka_unit_test(terminal_records_expire_and_are_bounded),
        cmocka_unit_test(resident_mirror_is_bounded_by_the_pool),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
