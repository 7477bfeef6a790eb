/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A consumer shard's reservations and resident pool (spec ec-transfer §3.3, §3.4), one test per
 * behaviour of §7 ("Reservations", "Memory", the [later] abandoned-push and reservation files),
 * named after it. Time is a manual clock; the buffer is real memory so that offsets can be
 * compared.
 */
#include "kvt_test.h"

#define CAP    (16 * 1024)
#define TTL_NS (300ull * 1000000000ull)

typedef struct rig {
    kvt_manual_clock clock;
    kvt_ec_shard *sh;
    unsigned char *buf;
} rig;

static void rig_open(rig *g, uint64_t capacity, uint32_t max_tombstones)
{
    memset(g, 0, sizeof(*g));
    g->buf = aligned_alloc(256, capacity);
    kvt_ec_shard_config c;
    kvt_ec_shard_config_init(&c);
    c.base = g->buf;
    c.capacity = capacity;
    c.clock = kvt_clock_manual(&g->clock, 1000);
    if (max_tombstones)
        c.max_tombstones = max_tombstones;
    KVT_OK_(kvt_ec_shard_create(&c, &g->sh));
}

static void rig_close(rig *g)
{
    KVT_OK_(kvt_ec_shard_destroy(g->sh));
    free(g->buf);
}

/* An item of `tokens` x 256 float32 (1 KiB per token). */
static kvt_ec_item item(const char *h, uint64_t tokens)
{
    kvt_ec_item it = {h, (uint32_t)strlen(h), tokens * 1024, 2, {tokens, 256}, "float32", 7};
    return it;
}

static kvt_ec_reply reserve(rig *g, const char *t, const char *h, uint64_t tokens)
{
    kvt_ec_item it = item(h, tokens);
    kvt_ec_reply r;
    KVT_OK_(kvt_ec_shard_reserve(g->sh, t, (uint32_t)strlen(t), &it, &r));
    return r;
}

static void complete(rig *g, const char *t, const char *rid, bool accepted, bool ready)
{
    bool a, b;
    KVT_OK_(kvt_ec_shard_complete(g->sh, t, (uint32_t)strlen(t), rid, &a, &b));
    assert_int_equal(a, accepted);
    assert_int_equal(b, ready);
}

static bool cancel(rig *g, const char *t, const char *rid, bool abandon, bool refresh)
{
    bool done;
    KVT_OK_(kvt_ec_shard_cancel(g->sh, t, (uint32_t)strlen(t), rid, abandon, refresh, &done));
    return done;
}

static int state(rig *g, const char *t)
{
    return kvt_ec_shard_state(g->sh, t, (uint32_t)strlen(t));
}

static kvt_slab_view take(rig *g, const char *t, const char *h)
{
    kvt_slab_view v;
    KVT_OK_(kvt_ec_shard_take(g->sh, t, (uint32_t)strlen(t), h, (uint32_t)strlen(h), NULL, &v));
    return v;
}

static uint64_t free_bytes(rig *g)
{
    kvt_ec_shard_stats st;
    kvt_ec_shard_get_stats(g->sh, &st);
    return st.free_bytes;
}

static uint32_t events(rig *g, kvt_ec_ready_event *ev, uint32_t cap)
{
    return kvt_ec_shard_take_events(g->sh, ev, cap);
}

/* A fence a test opens by hand. */
static bool fence_done(void *ctx)
{
    return *(bool *)ctx;
}

/* ---- Reservations ------------------------------------------------------------------------- */

static void inflight_duplicates_share_memory_and_cancel_independently(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, CAP, 0);
    kvt_ec_reply w = reserve(&g, "t1", "h", 2);
    kvt_ec_reply f1 = reserve(&g, "t2", "h", 2), f2 = reserve(&g, "t3", "h", 2);
    assert_true(w.write);
    assert_false(f1.write);
    assert_int_equal(f1.offset, w.offset); /* one destination */
    assert_int_equal(f2.offset, w.offset);
    assert_int_equal(free_bytes(&g), CAP - 2048);
    assert_true(cancel(&g, "t3", f2.reservation_id, false, false)); /* detach only */
    assert_int_equal(state(&g, "t3"), KVT_EC_CANCELLED);
    complete(&g, "t1", w.reservation_id, true, true);
    assert_int_equal(state(&g, "t2"), KVT_EC_READY);
    kvt_slab_view a = take(&g, "t1", "h"), b = take(&g, "t2", "h");
    assert_int_equal(a.offset, w.offset);
    assert_int_equal(b.offset, w.offset); /* each non-cancelled id takes the same bytes */
    assert_int_equal(a.nbytes, 2048);
    rig_close(&g);
}

static void follower_refresh_does_not_abandon_the_shared_writer(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, CAP, 0);
    kvt_ec_reply w = reserve(&g, "t1", "h", 1), f = reserve(&g, "t2", "h", 1);
    assert_true(cancel(&g, "t2", f.reservation_id, true, true));
    assert_int_equal(state(&g, "t1"), KVT_EC_WRITING);
    kvt_ec_ready_event ev[4];
    assert_int_equal(events(&g, ev, 4), 0); /* a refreshing producer re-reserves: not reported */
    complete(&g, "t1", w.reservation_id, true, true);
    rig_close(&g);
}

static void complete_is_idempotent(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, CAP, 0);
    kvt_ec_reply w = reserve(&g, "t1", "h", 1);
    complete(&g, "t1", w.reservation_id, true, true);
    complete(&g, "t1", w.reservation_id, true, false);
    kvt_ec_ready_event ev[4];
    assert_int_equal(events(&g, ev, 4), 1); /* published once */
    assert_string_equal(ev[0].transfer_id, "t1");
    assert_false(ev[0].abandoned);
    rig_close(&g);
}

static void complete_rejects_unknown_transfer_and_wrong_id(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, CAP, 0);
    complete(&g, "nobody", "0123", false, false);
    kvt_ec_reply w = reserve(&g, "t1", "h", 1);
    complete(&g, "t1", "not-the-id", false, false);
    complete(&g, "t1", NULL, false, false); /* completion must present the capability */
    assert_int_equal(state(&g, "t1"), KVT_EC_WRITING);
    complete(&g, "t1", w.reservation_id, true, true);
    rig_close(&g);
}

static void follower_complete_is_idempotent_noop(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, CAP, 0);
    kvt_ec_reply w = reserve(&g, "t1", "h", 1), f = reserve(&g, "t2", "h", 1);
    complete(&g, "t2", f.reservation_id, true, false); /* the writer publishes it */
    assert_int_equal(state(&g, "t2"), KVT_EC_WRITING);
    complete(&g, "t1", w.reservation_id, true, true);
    assert_int_equal(state(&g, "t2"), KVT_EC_READY);
    rig_close(&g);
}

static void cancel_waits_for_an_active_writer(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, CAP, 0);
    kvt_ec_reply w = reserve(&g, "t1", "h", 4);
    assert_false(cancel(&g, "t1", "wrong-id", false, false));
    assert_true(cancel(&g, "t1", w.reservation_id, false, false));
    assert_int_equal(state(&g, "t1"), KVT_EC_CANCEL_PENDING);
    assert_int_equal(free_bytes(&g), CAP - 4096); /* the writer may still write */
    complete(&g, "t1", w.reservation_id, true, false);
    assert_int_equal(state(&g, "t1"), KVT_EC_CANCELLED);
    assert_int_equal(free_bytes(&g), CAP); /* freed once, by the completion */
    complete(&g, "t1", w.reservation_id, false, false);
    assert_int_equal(free_bytes(&g), CAP);
    rig_close(&g);
}

static void a_deferred_release_requires_writer_completion(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, CAP, 0);
    kvt_ec_reply w = reserve(&g, "t1", "h", 4);
    assert_true(cancel(&g, "t1", NULL, false, false));
    kvt_clock_manual_advance(&g.clock, 10 * TTL_NS);
    kvt_ec_shard_expire(g.sh);
    /* a TTL after the cancel it counts as a writer gone quiet (the network layer's reaper
     * frees it once its receive is cancelled); no deadline frees the memory by itself */
    assert_int_equal(state(&g, "t1"), KVT_EC_EXPIRE_PENDING);
    assert_int_equal(free_bytes(&g), CAP - 4096);
    KVT_ERR_(kvt_ec_shard_destroy(g.sh), KVT_EBUSY); /* the buffer must stay registered */
    complete(&g, "t1", w.reservation_id, true, false);
    assert_int_equal(state(&g, "t1"), KVT_EC_EXPIRED);
    assert_int_equal(free_bytes(&g), CAP);
    rig_close(&g);
}

/* Followers leave their writer's list from anywhere (head, middle, tail, by cancel or by
 * expiry) and the ones left all become ready on the writer's bytes. */
static void followers_leave_from_anywhere(void **state_)
{
    (void)state_;
    enum { N = 2000 };
    rig g;
    rig_open(&g, CAP, 0);
    kvt_ec_reply w = reserve(&g, "w", "h", 4);
    char t[32];
    for (int i = 0; i < N; i++) {
        snprintf(t, sizeof(t), "f%d", i);
        kvt_ec_reply f = reserve(&g, t, "h", 4);
        assert_false(f.write);
    }
    uint64_t seed = 7;
    bool gone[N] = {false};
    for (int k = 0; k < N / 2; k++) { /* half of them cancelled, in a scattered order */
        int i = (int)((seed = seed * 6364136223846793005ull + 1442695040888963407ull) >> 33) % N;
        while (gone[i])
            i = (i + 1) % N;
        gone[i] = true;
        snprintf(t, sizeof(t), "f%d", i);
        assert_true(cancel(&g, t, NULL, false, false));
        assert_int_equal(state(&g, t), KVT_EC_CANCELLED);
    }
    complete(&g, "w", w.reservation_id, true, true);
    for (int i = 0; i < N; i++) {
        snprintf(t, sizeof(t), "f%d", i);
        assert_int_equal(state(&g, t), gone[i] ? KVT_EC_CANCELLED : KVT_EC_READY);
    }
    /* the rest expire together (one pass, each leaves in constant time) */
    kvt_clock_manual_advance(&g.clock, TTL_NS + 1);
    kvt_ec_shard_expire(g.sh);
    for (int i = 0; i < N; i++) {
        snprintf(t, sizeof(t), "f%d", i);
        assert_true(state(&g, t) == KVT_EC_EXPIRED || state(&g, t) == KVT_EC_CANCELLED ||
                    state(&g, t) == KVT_EC_NONE);
    }
    rig_close(&g);
}

static void an_unconfirmed_writer_keeps_its_destination_reserved(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, CAP, 0);
    kvt_ec_reply w = reserve(&g, "t1", "h", 4);
    kvt_clock_manual_advance(&g.clock, TTL_NS + 1);
    kvt_ec_shard_expire(g.sh);
    assert_int_equal(state(&g, "t1"), KVT_EC_EXPIRE_PENDING);
    assert_true(cancel(&g, "t1", NULL, false, false)); /* a consumer cancel: no-op */
    assert_int_equal(state(&g, "t1"), KVT_EC_EXPIRE_PENDING);
    assert_int_equal(free_bytes(&g), CAP - 4096);
    assert_int_equal(kvt_ec_shard_writers(g.sh), 1);
    complete(&g, "t1", w.reservation_id, true, false);
    assert_int_equal(state(&g, "t1"), KVT_EC_EXPIRED);
    assert_int_equal(free_bytes(&g), CAP);
    rig_close(&g);
}

static void expired_writer_is_replaced_only_after_refresh_abandon(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, CAP, 0);
    kvt_ec_reply old = reserve(&g, "t1", "h", 1);
    kvt_clock_manual_advance(&g.clock, TTL_NS + 1);
    kvt_ec_item it = item("h", 1);
    kvt_ec_reply r;
    KVT_ERR_(kvt_ec_shard_reserve(g.sh, "t1", 2, &it, &r), KVT_ESTATE);
    assert_non_null(strstr(kvt_last_error(), "active writer"));
    assert_false(cancel(&g, "t1", NULL, false, true)); /* refresh needs abandon */
    assert_true(cancel(&g, "t1", old.reservation_id, true, true));
    assert_int_equal(state(&g, "t1"), KVT_EC_EXPIRED);
    kvt_ec_reply fresh = reserve(&g, "t1", "h", 1);
    assert_true(fresh.write);
    assert_string_not_equal(fresh.reservation_id, old.reservation_id);
    complete(&g, "t1", old.reservation_id, false, false); /* late: rejected */
    complete(&g, "t1", fresh.reservation_id, true, true);
    rig_close(&g);
}

static void late_completion_cannot_complete_new_reservation(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, CAP, 0);
    kvt_ec_reply old = reserve(&g, "t1", "h", 1);
    assert_true(cancel(&g, "t1", old.reservation_id, true, true));
    complete(&g, "t1", old.reservation_id, false, false); /* the tombstone rejects it */
    kvt_ec_reply fresh = reserve(&g, "t1", "h", 1);
    complete(&g, "t1", old.reservation_id, false, false);
    assert_int_equal(state(&g, "t1"), KVT_EC_WRITING);
    complete(&g, "t1", fresh.reservation_id, true, true);
    rig_close(&g);
}

static void ready_expiry_releases_once(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, CAP, 0);
    kvt_ec_reply w = reserve(&g, "t1", "h", 3);
    complete(&g, "t1", w.reservation_id, true, true);
    kvt_clock_manual_advance(&g.clock, TTL_NS + 1);
    kvt_ec_shard_expire(g.sh);
    assert_int_equal(state(&g, "t1"), KVT_EC_EXPIRED);
    assert_int_equal(free_bytes(&g), CAP);
    kvt_ec_shard_expire(g.sh);
    assert_true(cancel(&g, "t1", NULL, true, false) == false); /* nothing left to release */
    assert_int_equal(free_bytes(&g), CAP);
    kvt_clock_manual_advance(&g.clock, TTL_NS + 1);
    kvt_ec_shard_expire(g.sh); /* the tombstone is reaped */
    assert_int_equal(state(&g, "t1"), KVT_EC_NONE);
    rig_close(&g);
}

static void cancel_tombstones_are_bounded(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, CAP, 3);
    const char *order[] = {"a", "b", "c", "a", "d"};
    for (int i = 0; i < 5; i++)
        assert_true(cancel(&g, order[i], NULL, false, false)); /* pre-reservation cancels */
    assert_int_equal(state(&g, "b"), KVT_EC_NONE);             /* the oldest was dropped */
    assert_int_equal(state(&g, "c"), KVT_EC_CANCELLED);
    assert_int_equal(state(&g, "a"), KVT_EC_CANCELLED);
    assert_int_equal(state(&g, "d"), KVT_EC_CANCELLED);
    kvt_ec_shard_stats st;
    kvt_ec_shard_get_stats(g.sh, &st);
    assert_int_equal(st.tombstones, 3);
    assert_int_equal(st.tombstones_dropped, 1);
    rig_close(&g);
}

static void a_cancel_before_the_producer_reserved_answers_cancelled(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, CAP, 0);
    assert_true(cancel(&g, "t1", NULL, false, false));
    kvt_ec_reply r = reserve(&g, "t1", "h", 1);
    assert_true(r.cancelled);
    assert_false(r.write);
    assert_string_equal(r.reservation_id, "");
    assert_int_equal(free_bytes(&g), CAP);
    rig_close(&g);
}

static void shutdown_rejects_new_reservations_and_drains_writers(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, CAP, 0);
    kvt_ec_reply w = reserve(&g, "t1", "h", 1);
    reserve(&g, "t2", "h", 1); /* a follower */
    kvt_ec_reply r = reserve(&g, "t3", "k", 1);
    complete(&g, "t3", r.reservation_id, true, true);
    kvt_ec_shard_begin_shutdown(g.sh);
    kvt_ec_item it = item("x", 1);
    KVT_ERR_(kvt_ec_shard_reserve(g.sh, "t4", 2, &it, &r), KVT_ESTATE);
    assert_int_equal(state(&g, "t1"), KVT_EC_CANCEL_PENDING);
    assert_int_equal(state(&g, "t2"), KVT_EC_CANCELLED);
    assert_int_equal(state(&g, "t3"), KVT_EC_CANCELLED);
    KVT_ERR_(kvt_ec_shard_destroy(g.sh), KVT_EBUSY); /* a writer has not settled */
    complete(&g, "t1", w.reservation_id, true, false);
    assert_int_equal(kvt_ec_shard_writers(g.sh), 0);
    assert_int_equal(free_bytes(&g), CAP);
    rig_close(&g);
}

static void conflicting_reservations_and_bad_items_are_refused(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, CAP, 0);
    reserve(&g, "t1", "h", 1);
    kvt_ec_item other = item("other", 1), wrong_shape = item("h", 2), r_bytes = item("h", 1);
    kvt_ec_reply r;
    KVT_ERR_(kvt_ec_shard_reserve(g.sh, "t1", 2, &other, &r), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "conflicting reservation"));
    KVT_ERR_(kvt_ec_shard_reserve(g.sh, "t2", 2, &wrong_shape, &r), KVT_EINVAL); /* vs writer */
    r_bytes.nbytes = 1000;
    KVT_ERR_(kvt_ec_shard_reserve(g.sh, "t3", 2, &r_bytes, &r), KVT_EINVAL);
    r_bytes = item("h", 1);
    r_bytes.dtype = "float33";
    KVT_ERR_(kvt_ec_shard_reserve(g.sh, "t3", 2, &r_bytes, &r), KVT_EINVAL);
    KVT_ERR_(kvt_ec_shard_reserve(g.sh, "", 0, &other, &r), KVT_EINVAL);
    /* a repeat of the same reservation is idempotent */
    kvt_ec_reply again = reserve(&g, "t1", "h", 1);
    assert_false(again.write);
    assert_true(cancel(&g, "t1", NULL, true, false)); /* the producer gives up */
    rig_close(&g);
}

static void a_full_pool_is_reported(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, 4096, 0);
    reserve(&g, "t1", "h1", 3);
    kvt_ec_item it = item("h2", 2);
    kvt_ec_reply r;
    KVT_ERR_(kvt_ec_shard_reserve(g.sh, "t2", 2, &it, &r), KVT_ENOSPC);
    assert_non_null(strstr(kvt_last_error(), "EC consumer buffer pool is full"));
    assert_true(cancel(&g, "t1", NULL, true, false));
    rig_close(&g);
}

/* ---- abandoned pushes ([later]) ------------------------------------------------------------ */

static void abandoned_writer_reports_its_followers(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, CAP, 0);
    kvt_ec_reply w = reserve(&g, "t1", "h", 1);
    reserve(&g, "t2", "h", 1);
    assert_true(cancel(&g, "t1", w.reservation_id, true, false)); /* a failed batch */
    kvt_ec_ready_event ev[4];
    assert_int_equal(events(&g, ev, 4), 2);
    assert_true(ev[0].abandoned && ev[1].abandoned);
    assert_string_equal(ev[0].transfer_id, "t1");
    assert_string_equal(ev[1].transfer_id, "t2");
    assert_int_equal(free_bytes(&g), CAP);
    /* a refresh reports the followers only: the writer re-reserves */
    w = reserve(&g, "t3", "k", 1);
    reserve(&g, "t4", "k", 1);
    assert_true(cancel(&g, "t3", w.reservation_id, true, true));
    assert_int_equal(events(&g, ev, 4), 1);
    assert_string_equal(ev[0].transfer_id, "t4");
    rig_close(&g);
}

static void abandoned_follower_is_reported_and_consumer_cancel_is_not(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, CAP, 0);
    reserve(&g, "t1", "h", 1);
    reserve(&g, "t2", "h", 1);
    reserve(&g, "t3", "h", 1);
    assert_true(cancel(&g, "t2", NULL, true, false));
    assert_true(cancel(&g, "t3", NULL, false, false));
    kvt_ec_ready_event ev[4];
    assert_int_equal(events(&g, ev, 4), 1);
    assert_string_equal(ev[0].transfer_id, "t2");
    assert_true(ev[0].abandoned);
    assert_int_equal(state(&g, "t1"), KVT_EC_WRITING);
    assert_true(cancel(&g, "t1", NULL, true, false));
    rig_close(&g);
}

/* ---- Memory (§3.4) ------------------------------------------------------------------------- */

static void resident_hit_is_ready_at_once_and_holds_a_lease(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, CAP, 0);
    kvt_ec_reply w = reserve(&g, "t1", "h", 2);
    complete(&g, "t1", w.reservation_id, true, true);
    kvt_ec_ready_event ev[4];
    events(&g, ev, 4);
    take(&g, "t1", "h");
    kvt_ec_reply hit = reserve(&g, "t2", "h", 2);
    assert_true(hit.ready && hit.cached);
    assert_false(hit.write);
    assert_int_equal(hit.offset, w.offset);
    assert_int_equal(events(&g, ev, 4), 1); /* readiness queued at once */
    kvt_ec_item conflicting = item("h", 3);
    kvt_ec_reply r;
    KVT_ERR_(kvt_ec_shard_reserve(g.sh, "t3", 2, &conflicting, &r), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "conflicting cached tensor"));
    rig_close(&g);
}

static void cached_take_uses_the_pool_canonical_allocation(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, CAP, 0);
    /* t1 writes h with a follower t2; the consumer cancels t1, so t3 writes h afresh */
    kvt_ec_reply w1 = reserve(&g, "t1", "h", 1);
    reserve(&g, "t2", "h", 1);
    assert_true(cancel(&g, "t1", NULL, false, false));
    kvt_ec_reply w3 = reserve(&g, "t3", "h", 1);
    assert_true(w3.write);
    assert_true(w3.offset != w1.offset);
    complete(&g, "t1", w1.reservation_id, true, false); /* t2 ready on t1's bytes (leased) */
    assert_int_equal(state(&g, "t2"), KVT_EC_READY);
    complete(&g, "t3", w3.reservation_id, true, true);
    kvt_slab_view v3 = take(&g, "t3", "h"); /* displaces the entry t2 leases */
    assert_int_equal(v3.offset, w3.offset);
    assert_int_equal(free_bytes(&g), CAP - 2048); /* the displaced entry waits for its lease */
    kvt_slab_view v2 = take(&g, "t2", "h");
    assert_int_equal(v2.offset, w3.offset); /* the canonical, newer allocation */
    assert_int_equal(free_bytes(&g), CAP - 1024);
    rig_close(&g);
}

static void displaced_entry_waits_for_every_lease(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, CAP, 0);
    kvt_ec_reply w1 = reserve(&g, "t1", "h", 1);
    complete(&g, "t1", w1.reservation_id, true, true);
    take(&g, "t1", "h");
    reserve(&g, "t2", "h", 1); /* two cached hits lease the entry */
    reserve(&g, "t3", "h", 1);
    assert_true(cancel(&g, "t2", NULL, false, false));
    assert_int_equal(free_bytes(&g), CAP - 1024);
    assert_int_equal(kvt_ec_shard_retire(g.sh, "h", 1, NULL), 1);
    kvt_ec_item big = item("z", 16); /* needs everything: the leased entry cannot go */
    kvt_ec_reply r;
    KVT_ERR_(kvt_ec_shard_reserve(g.sh, "t9", 2, &big, &r), KVT_ENOSPC);
    assert_true(cancel(&g, "t3", NULL, false, false)); /* the last lease */
    KVT_OK_(kvt_ec_shard_reserve(g.sh, "t9", 2, &big, &r));
    char recl[2][KVT_EC_KEY_MAX + 1];
    assert_int_equal(kvt_ec_shard_take_reclaimed(g.sh, recl, 2), 1);
    assert_string_equal(recl[0], "h");
    assert_true(cancel(&g, "t9", r.reservation_id, true, false));
    rig_close(&g);
}

static void consumer_defers_retired_reuse_until_event_completes(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, 2048, 0);
    kvt_ec_reply w = reserve(&g, "t1", "h", 2);
    complete(&g, "t1", w.reservation_id, true, true);
    take(&g, "t1", "h");
    bool passed = false;
    kvt_ec_fence fence = {fence_done, &passed};
    assert_int_equal(kvt_ec_shard_retire(g.sh, "h", 1, &fence), 1);
    kvt_ec_item other = item("k", 2);
    kvt_ec_reply r;
    KVT_ERR_(kvt_ec_shard_reserve(g.sh, "t2", 2, &other, &r), KVT_ENOSPC); /* kernels may read */
    char recl[2][KVT_EC_KEY_MAX + 1];
    assert_int_equal(kvt_ec_shard_take_reclaimed(g.sh, recl, 2), 1);
    assert_string_equal(recl[0], "h");
    passed = true;
    KVT_OK_(kvt_ec_shard_reserve(g.sh, "t2", 2, &other, &r));
    assert_int_equal(r.offset, w.offset); /* the same bytes, once the event completed */
    assert_true(cancel(&g, "t2", r.reservation_id, true, false));
    rig_close(&g);
}

static void retired_item_reserved_again_still_serves_a_local_load(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, CAP, 0);
    kvt_ec_reply w = reserve(&g, "t1", "h", 2);
    complete(&g, "t1", w.reservation_id, true, true);
    take(&g, "t1", "h");
    assert_int_equal(kvt_ec_shard_retire(g.sh, "h", 1, NULL), 1);
    assert_int_equal(kvt_ec_shard_retire(g.sh, "h", 1, NULL), 0); /* already retired */
    kvt_ec_reply hit = reserve(&g, "t2", "h", 2);
    assert_true(hit.cached);
    kvt_ec_item it = item("h", 2);
    kvt_slab_view v;
    KVT_OK_(kvt_ec_shard_take_resident(g.sh, &it, &v));
    assert_int_equal(v.offset, w.offset);
    kvt_ec_item wrong = item("h", 1);
    KVT_ERR_(kvt_ec_shard_take_resident(g.sh, &wrong, &v), KVT_ENOENT);
    kvt_ec_item absent = item("nope", 1);
    KVT_ERR_(kvt_ec_shard_take_resident(g.sh, &absent, &v), KVT_ENOENT);
    rig_close(&g);
}

static void take_of_a_transfer_not_ready_is_a_failed_load(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, CAP, 0);
    reserve(&g, "t1", "h", 1);
    kvt_slab_view v;
    KVT_ERR_(kvt_ec_shard_take(g.sh, "t1", 2, "h", 1, NULL, &v), KVT_ESTATE);
    assert_non_null(strstr(kvt_last_error(), "not ready"));
    KVT_ERR_(kvt_ec_shard_take(g.sh, "t9", 2, "h", 1, NULL, &v), KVT_ESTATE);
    assert_true(cancel(&g, "t1", NULL, true, false));
    rig_close(&g);
}

static void lru_reclaim_skips_leased_and_pinned_entries(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, 4096, 0);
    const char *hs[] = {"a", "b", "c"};
    char t[8];
    for (int i = 0; i < 3; i++) {
        snprintf(t, sizeof(t), "w%d", i);
        kvt_ec_reply w = reserve(&g, t, hs[i], 1);
        complete(&g, t, w.reservation_id, true, true);
        take(&g, t, hs[i]);
    }
    assert_int_equal(kvt_ec_shard_retire(g.sh, "a", 1, NULL), 1); /* evictable */
    assert_int_equal(kvt_ec_shard_retire(g.sh, "c", 1, NULL), 1);
    reserve(&g, "r", "c", 1); /* c leased again: not evictable; b stays pinned */
    kvt_ec_item it = item("d", 2);
    kvt_ec_reply r;
    KVT_ERR_(kvt_ec_shard_reserve(g.sh, "n", 1, &it, &r), KVT_ENOSPC);
    char recl[4][KVT_EC_KEY_MAX + 1];
    assert_int_equal(kvt_ec_shard_take_reclaimed(g.sh, recl, 4), 1);
    assert_string_equal(recl[0], "a");
    kvt_ec_item one = item("e", 1);
    KVT_OK_(kvt_ec_shard_reserve(g.sh, "n", 1, &one, &r)); /* a's space */
    assert_true(cancel(&g, "n", NULL, true, false));
    rig_close(&g);
}

/* ---- the consumer worker's step (kvt_ec_shard_apply) ---------------------------------------- */

struct fake_cache {
    char h[4][16];
    uint64_t off[4];
    uint32_t n;
};

static bool fc_holds(void *ctx, const char *h, uint32_t len, const kvt_slab_view *v)
{
    struct fake_cache *c = ctx;
    (void)len;
    for (uint32_t i = 0; i < c->n; i++)
        if (strcmp(c->h[i], h) == 0 && (!v || v->offset == c->off[i]))
            return true;
    return false;
}

static int fc_place(void *ctx, const kvt_ec_load_spec *sp, const kvt_slab_view *v)
{
    struct fake_cache *c = ctx;
    snprintf(c->h[c->n], sizeof(c->h[0]), "%s", sp->mm_hash.ptr);
    c->off[c->n++] = v->offset;
    return 0;
}

static kvt_ec_load_spec load_spec(const char *t, const char *h, uint64_t tokens, bool local)
{
    kvt_ec_load_spec sp;
    memset(&sp, 0, sizeof(sp));
    sp.mm_hash = (kvt_str){h, (uint32_t)strlen(h)};
    sp.nbytes = tokens * 1024;
    sp.ndim = 2;
    sp.shape[0] = tokens;
    sp.shape[1] = 256;
    sp.dtype = (kvt_str){"float32", 7};
    sp.transfer_id = (kvt_str){t, (uint32_t)strlen(t)};
    sp.local = local;
    return sp;
}

static void worker_step_loads_pushed_cached_and_local_items(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, CAP, 0);
    struct fake_cache fc = {0};
    kvt_ec_cache_ops ops = {fc_holds, fc_place, NULL, &fc};
    kvt_ec_reply w = reserve(&g, "t1", "h", 2);
    complete(&g, "t1", w.reservation_id, true, true);
    kvt_ec_meta m;
    kvt_ec_meta_init(&m);
    kvt_ec_load_spec a = load_spec("t1", "h", 2, false), b = load_spec("t2", "nope", 1, false);
    KVT_OK_(kvt_ec_meta_add_load(&m, &a));
    KVT_OK_(kvt_ec_meta_add_load(&m, &b));
    kvt_ec_worker_meta out;
    kvt_ec_worker_meta_init(&out);
    KVT_OK_(kvt_ec_shard_apply(g.sh, &m, &ops, &out));
    assert_true(kvt_strset_contains(&out.loaded, "h", 1));
    assert_true(kvt_strset_contains(&out.failed_loads, "nope", 4)); /* nothing pushed */
    assert_int_equal(fc.n, 1);
    assert_int_equal(fc.off[0], w.offset);
    /* an item the cache holds already is loaded; its pushed reservation is released */
    kvt_ec_reply w2 = reserve(&g, "t3", "h", 2); /* a cached hit on the resident */
    assert_true(w2.cached);
    kvt_ec_meta_clear(&m);
    kvt_ec_worker_meta_clear(&out);
    kvt_ec_load_spec c = load_spec("t3", "h", 2, false);
    KVT_OK_(kvt_ec_meta_add_load(&m, &c));
    KVT_OK_(kvt_ec_shard_apply(g.sh, &m, &ops, &out));
    assert_true(kvt_strset_contains(&out.loaded, "h", 1));
    assert_int_equal(state(&g, "t3"), KVT_EC_CANCELLED);
    /* evicted from the cache (freed), then loaded locally from the resident pool */
    fc.n = 0;
    kvt_ec_meta_clear(&m);
    kvt_ec_worker_meta_clear(&out);
    KVT_OK_(kvt_ec_meta_add_freed(&m, "h", 1));
    kvt_ec_load_spec l = load_spec("t1", "h", 2, true);
    KVT_OK_(kvt_ec_meta_add_load(&m, &l));
    KVT_OK_(kvt_ec_shard_apply(g.sh, &m, &ops, &out));
    assert_true(kvt_strset_contains(&out.loaded, "h", 1));
    assert_int_equal(fc.off[0], w.offset);
    kvt_ec_worker_meta_release(&out);
    kvt_ec_meta_release(&m);
    rig_close(&g);
}

static void worker_step_retires_only_what_the_cache_no_longer_holds(void **state_)
{
    (void)state_;
    rig g;
    rig_open(&g, 4096, 0);
    struct fake_cache fc = {0};
    kvt_ec_cache_ops ops = {fc_holds, fc_place, NULL, &fc};
    kvt_ec_reply a = reserve(&g, "ta", "a", 2), b = reserve(&g, "tb", "b", 2);
    complete(&g, "ta", a.reservation_id, true, true);
    complete(&g, "tb", b.reservation_id, true, true);
    kvt_ec_meta m;
    kvt_ec_meta_init(&m);
    kvt_ec_load_spec la = load_spec("ta", "a", 2, false), lb = load_spec("tb", "b", 2, false);
    KVT_OK_(kvt_ec_meta_add_load(&m, &la));
    KVT_OK_(kvt_ec_meta_add_load(&m, &lb));
    kvt_ec_worker_meta out;
    kvt_ec_worker_meta_init(&out);
    KVT_OK_(kvt_ec_shard_apply(g.sh, &m, &ops, &out));
    assert_int_equal(out.loaded.n, 2);
    /* freed = None: every pinned resident the cache no longer holds is retired; b is held */
    snprintf(fc.h[0], sizeof(fc.h[0]), "b");
    fc.off[0] = b.offset;
    fc.n = 1;
    kvt_ec_meta_clear(&m);
    m.has_freed = false;
    kvt_ec_worker_meta_clear(&out);
    KVT_OK_(kvt_ec_shard_apply(g.sh, &m, &ops, &out));
    /* a new item needs a's space: a was retired, b was not */
    kvt_ec_reply c = reserve(&g, "tc", "c", 2);
    assert_int_equal(c.offset, a.offset);
    kvt_ec_meta_clear(&m);
    kvt_ec_worker_meta_clear(&out);
    KVT_OK_(kvt_ec_shard_apply(g.sh, &m, &ops, &out));
    assert_true(kvt_strset_contains(&out.reclaimed, "a", 1)); /* reported */
    assert_true(cancel(&g, "tc", NULL, true, false));
    kvt_ec_worker_meta_release(&out);
    kvt_ec_meta_release(&m);
    rig_close(&g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(inflight_duplicates_share_memory_and_cancel_independently),
        cmocka_unit_test(follower_refresh_does_not_abandon_the_shared_writer),
        cmocka_unit_test(complete_is_idempotent),
        cmocka_unit_test(complete_rejects_unknown_transfer_and_wrong_id),
        cmocka_unit_test(follower_complete_is_idempotent_noop),
        cmocka_unit_test(cancel_waits_for_an_active_writer),
        cmocka_unit_test(a_deferred_release_requires_writer_completion),
        cmocka_unit_test(followers_leave_from_anywhere),
        cmocka_unit_test(an_unconfirmed_writer_keeps_its_destination_reserved),
        cmocka_unit_test(expired_writer_is_replaced_only_after_refresh_abandon),
        cmocka_unit_test(late_completion_cannot_complete_new_reservation),
        cmocka_unit_test(ready_expiry_releases_once),
        cmocka_unit_test(cancel_tombstones_are_bounded),
        cmocka_unit_test(a_cancel_before_the_producer_reserved_answers_cancelled),
        cmocka_unit_test(shutdown_rejects_new_reservations_and_drains_writers),
        cmocka_unit_test(conflicting_reservations_and_bad_items_are_refused),
        cmocka_unit_test(a_full_pool_is_reported),
        cmocka_unit_test(abandoned_writer_reports_its_followers),
        cmocka_unit_test(abandoned_follower_is_reported_and_consumer_cancel_is_not),
        cmocka_unit_test(resident_hit_is_ready_at_once_and_holds_a_lease),
        cmocka_unit_test(cached_take_uses_the_pool_canonical_allocation),
        cmocka_unit_test(displaced_entry_waits_for_every_lease),
        cmocka_unit_test(consumer_defers_retired_reuse_until_event_completes),
        cmocka_unit_test(retired_item_reserved_again_still_serves_a_local_load),
        cmocka_unit_test(take_of_a_transfer_not_ready_is_a_failed_load),
        cmocka_unit_test(lru_reclaim_skips_leased_and_pinned_entries),
        cmocka_unit_test(worker_step_loads_pushed_cached_and_local_items),
        cmocka_unit_test(worker_step_retires_only_what_the_cache_no_longer_holds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
