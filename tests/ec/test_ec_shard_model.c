/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Randomized model-based test of a consumer shard (spec ec-transfer §3.3, §3.4).
 *
 * Producers (one per transfer id) reserve, write their bytes into the real receive buffer at
 * any time while they own a destination — also after the consumer cancelled them or their TTL
 * ran out, as a remote writer that has not heard would — then complete, or abandon, or
 * refresh-abandon and reserve again, or go silent (a lost message) until the end. The
 * consumer cancels, takes, loads residents locally, retires them behind fences that pass
 * later, and time jumps past TTLs. Requests are repeated (duplicated messages) as often as
 * they are new.
 *
 * Checked after every operation, from the model only:
 *   - a destination handed to a writer never overlaps memory a producer may still write, a
 *     pinned resident the worker reads, or retired memory whose fence has not passed;
 *   - every take and local load finds exactly the bytes its producer wrote;
 * and at the end, after every producer finished and everything was cancelled and retired, the
 * whole buffer can be allocated again (free bytes back to capacity).
 *
 * >= 100,000 operations per run (KVTIER_TEST_SCALE multiplies); KVTIER_TEST_SEED replays.
 */
#include "kvt_test.h"

#define N_T     16
#define N_H     5
#define TTL     (300ull * 1000000000ull)
#define MAX_CAP (32 * 1024)
#define MAX_FEN 256

static uint64_t g_seed, g_ops;

#define CHECK(cond, ...) KVT_MODEL_CHECK("ec shard model", "op", g_ops, g_seed, cond, __VA_ARGS__)

typedef struct region {
    uint64_t off, len;
} region;

struct producer {
    bool active; /* owns a destination it may write: write=true, not completed nor abandoned */
    char rid[KVT_EC_RID_LEN + 1];
    region dst;
};

struct fence { /* a CUDA event on the worker's stream: they pass in the order recorded */
    bool used, passed;
    uint64_t seq;
    region r; /* memory it guards */
};

static struct {
    kvt_manual_clock clock;
    kvt_ec_shard *sh;
    unsigned char *buf;
    uint64_t cap;
    struct producer p[N_T];
    bool in_use[N_H]; /* the worker holds H's resident (taken or loaded, not retired) */
    region use[N_H];
    struct fence fences[MAX_FEN];
    uint64_t takes, loads, writes, reclaims, fence_seq;
} S;

static const char *tid(uint32_t t)
{
    static char buf[N_T][8];
    snprintf(buf[t], sizeof(buf[t]), "t%u", t);
    return buf[t];
}

static uint32_t h_of(uint32_t t)
{
    return t % N_H;
}

static const char *hname(uint32_t h)
{
    static const char *names[N_H] = {"sha256:a", "sha256:b", "sha256:c", "sha256:d", "sha256:e"};
    return names[h];
}

static kvt_ec_item item(uint32_t h)
{
    uint64_t tokens = 1 + h % 4; /* 1..4 KiB */
    kvt_ec_item it = {
        hname(h), (uint32_t)strlen(hname(h)), tokens * 1024, 2, {tokens, 256}, "float32", 7};
    return it;
}

static unsigned char pat(uint32_t h, uint64_t i)
{
    return (unsigned char)(h * 37 + i * 13 + (i >> 8));
}

static bool overlap(region a, region b)
{
    return a.off < b.off + b.len && b.off < a.off + a.len;
}

static bool fence_done(void *ctx)
{
    return ((struct fence *)ctx)->passed;
}

static struct fence *new_fence(region r)
{
    for (uint32_t i = 0; i < MAX_FEN; i++)
        if (!S.fences[i].used) {
            S.fences[i] = (struct fence){true, false, ++S.fence_seq, r};
            return &S.fences[i];
        }
    return NULL; /* full: the caller passes none (treated as already passed) only if safe */
}

/* A destination a writer was just given must not overlap anything still in use. */
static void check_new_destination(uint32_t t, region d)
{
    for (uint32_t u = 0; u < N_T; u++)
        if (u != t && S.p[u].active)
            CHECK(!overlap(d, S.p[u].dst),
                  "%s got [%llu,+%llu) while %s may still write [%llu,+%llu)", tid(t),
                  (unsigned long long)d.off, (unsigned long long)d.len, tid(u),
                  (unsigned long long)S.p[u].dst.off, (unsigned long long)S.p[u].dst.len);
    for (uint32_t h = 0; h < N_H; h++)
        if (S.in_use[h])
            CHECK(!overlap(d, S.use[h]), "%s got memory of %s, which the worker still reads",
                  tid(t), hname(h));
    for (uint32_t i = 0; i < MAX_FEN; i++)
        if (S.fences[i].used && !S.fences[i].passed)
            CHECK(!overlap(d, S.fences[i].r), "%s got retired memory before its fence passed",
                  tid(t));
}

static void write_bytes(uint32_t t)
{
    struct producer *p = &S.p[t];
    for (uint64_t i = 0; i < p->dst.len; i++)
        S.buf[p->dst.off + i] = pat(h_of(t), i);
    S.writes++;
}

static void verify(uint32_t h, const kvt_slab_view *v, const char *what)
{
    kvt_ec_item it = item(h);
    CHECK(v->nbytes == it.nbytes, "%s of %s: %llu bytes", what, hname(h),
          (unsigned long long)v->nbytes);
    for (uint64_t i = 0; i < v->nbytes; i++)
        CHECK(S.buf[v->offset + i] == pat(h, i), "%s of %s: byte %llu is not what was written",
              what, hname(h), (unsigned long long)i);
}

/* ---- operations ------------------------------------------------------------------------------ */

static void op_reserve(uint32_t t)
{
    kvt_ec_item it = item(h_of(t));
    kvt_ec_reply r;
    int rc = kvt_ec_shard_reserve(S.sh, tid(t), (uint32_t)strlen(tid(t)), &it, &r);
    CHECK(rc == 0 || rc == KVT_ENOSPC || rc == KVT_ESTATE, "reserve: %s", kvt_last_error());
    if (rc)
        return;
    struct producer *p = &S.p[t];
    if (r.write) {
        CHECK(!p->active, "%s was given a second destination while writing the first", tid(t));
        region d = {r.offset, it.nbytes};
        check_new_destination(t, d);
        p->active = true;
        p->dst = d;
        memcpy(p->rid, r.reservation_id, sizeof(p->rid));
    } else if (p->active) {
        CHECK(r.offset == p->dst.off || r.cancelled, "a repeated reserve moved %s", tid(t));
    } else if (!r.cancelled) {
        memcpy(p->rid, r.reservation_id, sizeof(p->rid)); /* a follower or a cached hit */
    }
}

static void op_complete(uint32_t t)
{
    struct producer *p = &S.p[t];
    if (p->active)
        write_bytes(t); /* the producer writes everything before it completes */
    bool a, b;
    int rc = kvt_ec_shard_complete(S.sh, tid(t), (uint32_t)strlen(tid(t)), p->rid, &a, &b);
    CHECK(rc == 0, "complete: %s", kvt_last_error());
    if (p->active)
        CHECK(a, "the writer's completion of %s was refused", tid(t));
    p->active = false;
}

static void op_abandon(uint32_t t, bool refresh)
{
    struct producer *p = &S.p[t];
    if (!p->rid[0])
        return;
    bool done;
    int rc =
        kvt_ec_shard_cancel(S.sh, tid(t), (uint32_t)strlen(tid(t)), p->rid, true, refresh, &done);
    CHECK(rc == 0, "abandon: %s", kvt_last_error());
    if (refresh && !done)
        rc =
            kvt_ec_shard_cancel(S.sh, tid(t), (uint32_t)strlen(tid(t)), p->rid, true, false, &done);
    p->active = false; /* it stops writing either way */
}

static void op_consumer_cancel(uint32_t t)
{
    bool done;
    CHECK(kvt_ec_shard_cancel(S.sh, tid(t), (uint32_t)strlen(tid(t)), NULL, false, false, &done) ==
              0,
          "cancel: %s", kvt_last_error());
}

static void op_take(uint32_t t)
{
    uint32_t h = h_of(t);
    kvt_slab_view v;
    struct fence *f = NULL;
    kvt_ec_fence fence = {NULL, NULL};
    if (S.in_use[h] && (f = new_fence(S.use[h])))
        fence = (kvt_ec_fence){fence_done, f};
    if (S.in_use[h] && !f)
        return; /* no fence to guard what a take could displace: skip */
    int rc = kvt_ec_shard_take(S.sh, tid(t), (uint32_t)strlen(tid(t)), hname(h),
                               (uint32_t)strlen(hname(h)), &fence, &v);
    if (rc != 0) {
        CHECK(rc == KVT_ESTATE, "take: %s", kvt_last_error());
        if (f)
            f->used = false;
        return;
    }
    verify(h, &v, "take");
    S.takes++;
    if (f && overlap(S.use[h], (region){v.offset, v.nbytes}))
        f->used = false; /* the same entry: nothing was displaced */
    S.in_use[h] = true;
    S.use[h] = (region){v.offset, v.nbytes};
}

static void op_local_load(uint32_t h)
{
    kvt_ec_item it = item(h);
    kvt_slab_view v;
    int rc = kvt_ec_shard_take_resident(S.sh, &it, &v);
    if (rc) {
        CHECK(rc == KVT_ENOENT, "take_resident: %s", kvt_last_error());
        return;
    }
    verify(h, &v, "local load");
    S.loads++;
    if (S.in_use[h])
        CHECK(S.use[h].off == v.offset, "a local load of %s moved it", hname(h));
    S.in_use[h] = true;
    S.use[h] = (region){v.offset, v.nbytes};
}

static void op_retire(uint32_t h, uint64_t *rng)
{
    if (!S.in_use[h])
        return;
    struct fence *f = new_fence(S.use[h]);
    if (!f)
        return;
    kvt_ec_fence fence = {fence_done, f};
    /* no fence ("nothing reads it any more") only once every earlier fence passed: a later
     * point on the stream cannot pass before an earlier one */
    bool now = kvt_test_below(rng, 3) == 0;
    for (uint32_t i = 0; now && i < MAX_FEN; i++)
        now = !S.fences[i].used || &S.fences[i] == f;
    int rc = kvt_ec_shard_retire(S.sh, hname(h), (uint32_t)strlen(hname(h)), now ? NULL : &fence);
    CHECK(rc == 1, "retire of a resident the worker holds returned %d", rc);
    if (now)
        f->used = false;
    S.in_use[h] = false;
}

/* The stream moves on: the oldest pending fences pass. */
static void op_pass_fences(uint64_t *rng)
{
    for (uint32_t n = 1 + kvt_test_below(rng, 3); n; n--) {
        struct fence *oldest = NULL;
        for (uint32_t i = 0; i < MAX_FEN; i++)
            if (S.fences[i].used && (!oldest || S.fences[i].seq < oldest->seq))
                oldest = &S.fences[i];
        if (!oldest)
            return;
        oldest->used = false;
        oldest->passed = true;
    }
}

static void step(uint64_t *rng)
{
    g_ops++;
    uint32_t t = kvt_test_below(rng, N_T), h = kvt_test_below(rng, N_H);
    switch (kvt_test_below(rng, 20)) {
    case 0 ... 4:
        op_reserve(t);
        break;
    case 5:
    case 6:
        if (S.p[t].active)
            write_bytes(t);
        break;
    case 7 ... 9:
        op_complete(t);
        break;
    case 10:
        op_abandon(t, kvt_test_below(rng, 2));
        break;
    case 11:
        op_consumer_cancel(t);
        break;
    case 12:
    case 13:
        op_take(t);
        break;
    case 14:
        op_local_load(h);
        break;
    case 15:
        op_retire(h, rng);
        break;
    case 16:
        op_pass_fences(rng);
        break;
    case 17:
        kvt_clock_manual_advance(&S.clock, (uint64_t)kvt_test_below(rng, 1000) * (TTL / 700));
        kvt_ec_shard_expire(S.sh);
        break;
    default: { /* the control server drains its queues */
        kvt_ec_ready_event ev[16];
        char recl[16][KVT_EC_KEY_MAX + 1];
        (void)kvt_ec_shard_take_events(S.sh, ev, 16);
        S.reclaims += kvt_ec_shard_take_reclaimed(S.sh, recl, 16);
    }
    }
}

static void episode(uint64_t *rng, uint64_t ops)
{
    memset(&S, 0, sizeof(S));
    S.cap = (4 + kvt_test_below(rng, 29)) * 1024;
    S.buf = aligned_alloc(256, MAX_CAP);
    memset(S.buf, 0, MAX_CAP);
    kvt_ec_shard_config c;
    kvt_ec_shard_config_init(&c);
    c.base = S.buf;
    c.capacity = S.cap;
    c.max_tombstones = 1 + kvt_test_below(rng, 32);
    c.clock = kvt_clock_manual(&S.clock, 1);
    KVT_OK_(kvt_ec_shard_create(&c, &S.sh));
    for (uint64_t i = 0; i < ops; i++) {
        step(rng);
        /* every byte the allocator gave out is held by a writer, a resident or a fence */
        kvt_ec_shard_stats st;
        kvt_ec_shard_get_stats(S.sh, &st);
        CHECK(st.held_bytes == st.capacity - st.free_bytes,
              "the tables hold %llu bytes, the allocator gave out %llu",
              (unsigned long long)st.held_bytes, (unsigned long long)(st.capacity - st.free_bytes));
    }
    /* the end: every producer finishes, the consumer lets go of everything */
    for (uint32_t t = 0; t < N_T; t++)
        if (S.p[t].active)
            op_complete(t);
    CHECK(kvt_ec_shard_writers(S.sh) == 0, "%u writers left after every producer finished",
          kvt_ec_shard_writers(S.sh));
    for (uint32_t t = 0; t < N_T; t++)
        op_consumer_cancel(t);
    for (uint32_t h = 0; h < N_H; h++)
        if (S.in_use[h])
            KVT_OK_(kvt_ec_shard_retire(S.sh, hname(h), (uint32_t)strlen(hname(h)), NULL) == 1
                        ? 0
                        : KVT_ESTATE);
    for (uint32_t i = 0; i < MAX_FEN; i++)
        S.fences[i].passed = true;
    /* the whole buffer again: everything evictable is reclaimed */
    kvt_ec_item all = {"all", 3, S.cap, 1, {S.cap}, "uint8", 5};
    kvt_ec_reply r;
    int rc = kvt_ec_shard_reserve(S.sh, "final", 5, &all, &r);
    CHECK(rc == 0, "the whole buffer cannot be allocated at the end: %s", kvt_last_error());
    bool done;
    KVT_OK_(kvt_ec_shard_cancel(S.sh, "final", 5, r.reservation_id, true, false, &done));
    kvt_ec_shard_stats st;
    kvt_ec_shard_get_stats(S.sh, &st);
    CHECK(st.free_bytes == st.capacity, "free bytes %llu of %llu at the end",
          (unsigned long long)st.free_bytes, (unsigned long long)st.capacity);
    KVT_OK_(kvt_ec_shard_destroy(S.sh));
    free(S.buf);
}

static void shard_keeps_every_invariant_under_random_traffic(void **state)
{
    (void)state;
    g_seed = kvt_test_seed();
    uint64_t rng = g_seed, goal = (uint64_t)(100000 * kvt_test_scale());
    uint32_t episodes = 0;
    uint64_t takes = 0, loads = 0, writes = 0;
    g_ops = 0;
    while (g_ops < goal) {
        episode(&rng, 2000 + kvt_test_below(&rng, 8000));
        episodes++;
        takes += S.takes;
        loads += S.loads;
        writes += S.writes;
    }
    print_message("ec shard model: %llu operations in %u episodes (seed %llu): %llu producer "
                  "writes, %llu takes and %llu local loads verified byte for byte\n",
                  (unsigned long long)g_ops, episodes, (unsigned long long)g_seed,
                  (unsigned long long)writes, (unsigned long long)takes, (unsigned long long)loads);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(shard_keeps_every_invariant_under_random_traffic),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
