/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Randomized model-based test of encoder-cache transfer end to end, in process: a producer
 * (kvt_ec_producer) pushes items into a consumer of 1-3 shards (kvt_ec_shard, real buffers),
 * whose scheduler (kvt_ec_sched) gates requests and sends load specs to one simulated worker
 * per shard; the workers take the pushed bytes into their encoder caches and report back,
 * aggregated across ranks. Every message between the scheduler and the shards (readiness and
 * abandoned events, cancels) is delayed, duplicated, reordered or lost at random; producers
 * bind their sources late, fail writes, or give up; the engine evicts items from its encoder
 * cache. Time moves one second per step.
 *
 * Checked throughout: a request the scheduler calls ready has every feature's bytes, exactly
 * as the producer encoded them, in the encoder cache of every rank; every request ends —
 * loaded or failed — and never stays waiting past a bound derived from push_wait; at the end
 * no shard holds memory for a writer.
 *
 * >= 100,000 operations per run (KVTIER_TEST_SCALE multiplies); KVTIER_TEST_SEED replays.
 */
#include "ec/inproc.h"

#define MAX_SH  3
#define N_H     6
#define MAX_REQ 8
#define MAX_MSG 4096
#define TOK     2
#define S_NS    1000000000ull
#define WAIT_S  60
#define STUCK_S (4 * WAIT_S + 20)

static uint64_t g_seed, g_ops;

#define CHECK(cond, ...) KVT_MODEL_CHECK("ec model", "op", g_ops, g_seed, cond, __VA_ARGS__)

enum { M_READY, M_ABANDONED, M_CANCEL };

struct msg {
    int kind;
    uint32_t shard;
    uint64_t at; /* delivery step */
    kvt_ec_ready_event ev;
    char tid[KVT_EC_KEY_MAX + 1];
};

struct req {
    bool used;
    char id[16];
    uint32_t n;
    uint32_t h[2];
    char tid[2][16];
    uint64_t start;
    uint32_t bind_at; /* producer binds its sources at this step */
    bool bound, producer_done;
};

struct rank_cache { /* a worker's encoder cache */
    bool has[N_H];
    uint64_t off[N_H];
};

static struct {
    kvt_manual_clock clock;
    inproc c;
    kvt_ec_sched *s;
    kvt_ec_planner *plan; /* the producer instance's scheduler */
    kvt_ec_producer *p;
    kvt_ec_meta pmeta; /* its metadata to its worker */
    uint32_t shards;
    uint64_t step;
    struct req reqs[MAX_REQ];
    struct rank_cache cache[MAX_SH];
    struct msg q[MAX_MSG];
    uint32_t n_q;
    uint32_t next_id;
    unsigned char src[N_H][TOK * 1024];
    kvt_ec_meta meta;
    uint64_t loaded, failed, pushed, lost;
} S;

static const char *hname(uint32_t h)
{
    static const char *n[N_H] = {"img:0", "img:1", "img:2", "img:3", "img:4", "img:5"};
    return n[h];
}

static int h_index(const char *s)
{
    for (int h = 0; h < N_H; h++)
        if (strcmp(hname((uint32_t)h), s) == 0)
            return h;
    return -1;
}

static kvt_ec_item item(uint32_t h)
{
    kvt_ec_item it = {hname(h), 5, TOK * 1024, 2, {TOK, 256}, "float32", 7};
    return it;
}

static void send(uint64_t *rng, struct msg m)
{
    uint32_t copies = kvt_test_below(rng, 10) == 0 ? 2 : 1; /* duplicated */
    if (kvt_test_below(rng, 25) == 0) {                     /* lost */
        S.lost++;
        return;
    }
    for (uint32_t i = 0; i < copies && S.n_q < MAX_MSG; i++) {
        m.at = S.step + kvt_test_below(rng, 4); /* delayed, hence reordered */
        S.q[S.n_q++] = m;
    }
}

/* ---- the consumer's shards and workers ------------------------------------------------------- */

static void shards_step(uint64_t *rng)
{
    for (uint32_t k = 0; k < S.shards; k++) {
        kvt_ec_shard_expire(S.c.sh[k]);
        kvt_ec_ready_event ev[32];
        uint32_t n;
        while ((n = kvt_ec_shard_take_events(S.c.sh[k], ev, 32)) > 0)
            for (uint32_t i = 0; i < n; i++) {
                struct msg m = {ev[i].abandoned ? M_ABANDONED : M_READY, k, 0, ev[i], ""};
                send(rng, m);
            }
    }
}

/* A rank's encoder cache, as kvt_ec_shard_apply reaches it. */
static bool cache_holds(void *ctx, const char *h, uint32_t len, const kvt_slab_view *v)
{
    struct rank_cache *c = ctx;
    (void)len;
    int i = h_index(h);
    return i >= 0 && c->has[i] && (!v || v->offset == c->off[i]);
}

static int cache_place(void *ctx, const kvt_ec_load_spec *sp, const kvt_slab_view *v)
{
    struct rank_cache *c = ctx;
    int i = h_index(sp->mm_hash.ptr);
    if (i < 0)
        return kvt_fail(KVT_EINVAL, "unknown item");
    c->has[i] = true;
    c->off[i] = v->offset;
    return 0;
}

/* One worker per shard runs the step's metadata through kvt_ec_shard_apply; the reports are
 * aggregated. Now and then a rank misses a load spec altogether (reports neither loaded nor
 * failed): only the load deadline can end that. */
static void workers_step(uint64_t *rng)
{
    kvt_ec_worker_meta per[MAX_SH], agg;
    const kvt_ec_worker_meta *ranks[MAX_SH];
    kvt_ec_meta mine;
    kvt_ec_meta_init(&mine);
    kvt_ec_worker_meta_init(&agg);
    for (uint32_t k = 0; k < S.shards; k++) {
        kvt_ec_worker_meta_init(&per[k]);
        ranks[k] = &per[k];
        kvt_ec_meta_clear(&mine); /* this rank's view of the step's metadata */
        for (uint32_t i = 0; i < S.meta.n_loads; i++)
            if (kvt_test_below(rng, 40) != 0)
                KVT_OK_(kvt_ec_meta_add_load(&mine, &S.meta.loads[i]));
        for (uint32_t i = 0; S.meta.has_freed && i < S.meta.n_freed; i++) {
            int h = h_index(S.meta.freed[i].ptr);
            if (h >= 0)
                S.cache[k].has[h] = false; /* the model runner freed it */
            KVT_OK_(kvt_ec_meta_add_freed(&mine, S.meta.freed[i].ptr, S.meta.freed[i].len));
        }
        mine.has_freed = S.meta.has_freed;
        kvt_ec_cache_ops ops = {cache_holds, cache_place, NULL, &S.cache[k]};
        KVT_OK_(kvt_ec_shard_apply(S.c.sh[k], &mine, &ops, &per[k]));
    }
    KVT_OK_(kvt_ec_worker_meta_aggregate_ranks(&agg, ranks, S.shards, NULL));
    kvt_ec_worker_meta prod; /* the producer's own report goes to its own scheduler */
    kvt_ec_worker_meta_init(&prod);
    KVT_OK_(kvt_ec_producer_report(S.p, &prod));
    KVT_OK_(kvt_ec_planner_apply_output(S.plan, &prod));
    kvt_ec_worker_meta_release(&prod);
    KVT_OK_(kvt_ec_sched_apply_output(S.s, &agg));
    for (uint32_t k = 0; k < S.shards; k++)
        kvt_ec_worker_meta_release(&per[k]);
    kvt_ec_worker_meta_release(&agg);
    kvt_ec_meta_release(&mine);
}

static void deliver(void)
{
    uint32_t keep = 0;
    for (uint32_t i = 0; i < S.n_q; i++) {
        struct msg *m = &S.q[i];
        if (m->at > S.step) {
            S.q[keep++] = *m;
            continue;
        }
        if (m->kind == M_READY) {
            int h = h_index(m->ev.mm_hash);
            CHECK(h >= 0, "readiness of an unknown item");
            kvt_ec_ready r = {m->ev.transfer_id, (uint32_t)strlen(m->ev.transfer_id),
                              item((uint32_t)h), m->shard};
            KVT_OK_(kvt_ec_sched_observe_ready(S.s, &r));
        } else if (m->kind == M_ABANDONED) {
            KVT_OK_(kvt_ec_sched_observe_abandoned(S.s, m->ev.transfer_id,
                                                   (uint32_t)strlen(m->ev.transfer_id)));
        } else {
            bool done;
            KVT_OK_(kvt_ec_shard_cancel(S.c.sh[m->shard], m->tid, (uint32_t)strlen(m->tid), NULL,
                                        false, false, &done));
        }
    }
    S.n_q = keep;
}

/* ---- the engine ------------------------------------------------------------------------------ */

static void new_request(uint64_t *rng)
{
    for (uint32_t i = 0; i < MAX_REQ; i++) {
        struct req *r = &S.reqs[i];
        if (r->used)
            continue;
        memset(r, 0, sizeof(*r));
        r->used = true;
        snprintf(r->id, sizeof(r->id), "req%u", S.next_id++);
        r->n = 1 + kvt_test_below(rng, 2);
        r->h[0] = kvt_test_below(rng, N_H);
        r->h[1] = (r->h[0] + 1 + kvt_test_below(rng, N_H - 1)) % N_H;
        for (uint32_t f = 0; f < r->n; f++) {
            snprintf(r->tid[f], sizeof(r->tid[f]), "x%u.%u", S.next_id, f);
            kvt_ec_push_spec sp = inproc_spec(r->tid[f], hname(r->h[f]), TOK, r->id);
            int rc = kvt_ec_planner_prepare(S.plan, &sp); /* the producer's scheduler */
            CHECK(rc == 1, "prepare returned %d", rc);
        }
        /* its step's metadata reaches its worker, which starts the pushes */
        kvt_ec_meta_clear(&S.pmeta);
        KVT_OK_(kvt_ec_planner_build_meta(S.plan, &S.pmeta));
        CHECK(S.pmeta.n_pushes == r->n, "%u pushes for %u features", S.pmeta.n_pushes, r->n);
        for (uint32_t f = 0; f < S.pmeta.n_pushes; f++) {
            KVT_OK_(kvt_ec_producer_push(S.p, &S.pmeta.pushes[f]));
            S.pushed++;
        }
        r->start = S.step;
        r->bind_at = (uint32_t)S.step + kvt_test_below(rng, 8);
        if (kvt_test_below(rng, 12) == 0) /* the encoder gives up before its output exists */
            KVT_OK_(kvt_ec_producer_request_finished(S.p, r->id, (uint32_t)strlen(r->id)));
        return;
    }
}

static void verify_loaded(const struct req *r)
{
    for (uint32_t f = 0; f < r->n; f++)
        for (uint32_t k = 0; k < S.shards; k++) {
            uint32_t h = r->h[f];
            CHECK(S.cache[k].has[h], "%s is ready but rank %u has no %s", r->id, k, hname(h));
            CHECK(memcmp(S.c.buf[k] + S.cache[k].off[h], S.src[h], TOK * 1024) == 0,
                  "%s is ready but rank %u holds other bytes for %s", r->id, k, hname(h));
        }
}

static void end_request(struct req *r)
{
    KVT_OK_(kvt_ec_planner_request_finished(S.plan, r->id, (uint32_t)strlen(r->id)));
    KVT_OK_(kvt_ec_sched_request_finished(S.s, r->id, (uint32_t)strlen(r->id)));
    KVT_OK_(kvt_ec_producer_request_finished(S.p, r->id, (uint32_t)strlen(r->id)));
    r->used = false;
}

static void engine_step(uint64_t *rng, bool admit)
{
    if (admit && kvt_test_below(rng, 3) == 0)
        new_request(rng);
    /* the encoder side binds its outputs and pushes */
    for (uint32_t i = 0; i < MAX_REQ; i++) {
        struct req *r = &S.reqs[i];
        if (!r->used || r->bound || S.step < r->bind_at)
            continue;
        for (uint32_t f = 0; f < r->n; f++)
            (void)kvt_ec_producer_bind_source(S.p, hname(r->h[f]), 5, S.src[r->h[f]], TOK * 1024,
                                              NULL);
        r->bound = true;
    }
    if (kvt_test_below(rng, 30) == 0)
        S.c.fail_next[OP_WRITE][kvt_test_below(rng, S.shards)] = 1; /* a write fails */
    (void)kvt_ec_producer_dispatch(S.p);
    /* the consumer scheduler gates its requests */
    for (uint32_t i = 0; i < MAX_REQ; i++) {
        struct req *r = &S.reqs[i];
        if (!r->used)
            continue;
        kvt_ec_feature fs[2];
        for (uint32_t f = 0; f < r->n; f++)
            fs[f] = (kvt_ec_feature){hname(r->h[f]), 5, r->tid[f], (uint32_t)strlen(r->tid[f])};
        bool ready;
        g_ops++;
        KVT_OK_(kvt_ec_sched_ensure(S.s, r->id, (uint32_t)strlen(r->id), fs, r->n, &ready));
        if (ready) { /* scheduled: the embeddings are gathered from every rank */
            verify_loaded(r);
            for (uint32_t f = 0; f < r->n; f++)
                KVT_OK_(kvt_ec_sched_consumed(S.s, r->id, (uint32_t)strlen(r->id), &fs[f]));
            S.loaded++;
            end_request(r);
            continue;
        }
        CHECK(S.step - r->start <= STUCK_S, "%s waits for %llu steps", r->id,
              (unsigned long long)(S.step - r->start));
    }
    char ids[16][KVT_EC_KEY_MAX + 1];
    uint32_t n;
    while ((n = kvt_ec_sched_take_unavailable(S.s, ids, 16)) > 0)
        for (uint32_t i = 0; i < n; i++)
            for (uint32_t j = 0; j < MAX_REQ; j++)
                if (S.reqs[j].used && strcmp(S.reqs[j].id, ids[i]) == 0) {
                    S.failed++;
                    end_request(&S.reqs[j]);
                }
    while ((n = kvt_ec_sched_take_cancels(S.s, ids, 16)) > 0)
        for (uint32_t i = 0; i < n; i++)
            for (uint32_t k = 0; k < S.shards; k++) {
                struct msg m = {M_CANCEL, k, 0, {{0}}, ""};
                memcpy(m.tid, ids[i], sizeof(m.tid));
                send(rng, m);
            }
    /* the engine's encoder cache evicts an item now and then */
    if (kvt_test_below(rng, 6) == 0) {
        uint32_t h = kvt_test_below(rng, N_H);
        KVT_OK_(kvt_ec_sched_cache_freed(S.s, hname(h), 5));
    }
    KVT_OK_(kvt_ec_sched_build_meta(S.s, &S.meta));
}

static void step(uint64_t *rng, bool admit)
{
    S.step++;
    kvt_clock_manual_advance(&S.clock, S_NS);
    kvt_ec_sched_expire(S.s);
    engine_step(rng, admit);
    workers_step(rng);
    shards_step(rng);
    deliver();
}

static void episode(uint64_t *rng, uint64_t ops)
{
    memset(&S, 0, sizeof(S));
    kvt_clock_manual(&S.clock, 1);
    S.shards = 1 + kvt_test_below(rng, MAX_SH);
    inproc_open(&S.c, S.shards, (8 + kvt_test_below(rng, 24)) * 1024, &S.clock);
    for (uint32_t h = 0; h < N_H; h++)
        for (uint32_t b = 0; b < TOK * 1024; b++)
            S.src[h][b] = (unsigned char)(h * 53 + b * 11 + (b >> 9));
    kvt_ec_sched_config sc;
    kvt_ec_sched_config_init(&sc);
    sc.shards = S.shards;
    sc.clock = kvt_clock_manual(&S.clock, S.clock.now_ns);
    sc.resident_capacity = S.c.cap;
    KVT_OK_(kvt_ec_sched_create(&sc, &S.s));
    kvt_ec_producer_config pc;
    kvt_ec_producer_config_init(&pc);
    pc.ops = inproc_ops(&S.c);
    pc.clock = kvt_clock_manual(&S.clock, S.clock.now_ns);
    KVT_OK_(kvt_ec_producer_create(&pc, &S.p));
    KVT_OK_(kvt_ec_planner_create(0, &S.plan));
    kvt_ec_meta_init(&S.meta);
    kvt_ec_meta_init(&S.pmeta);
    uint64_t start = g_ops;
    while (g_ops - start < ops)
        step(rng, true);
    /* drain: no new requests; everything in flight must end */
    for (uint32_t i = 0; i < 2 * STUCK_S; i++)
        step(rng, false);
    for (uint32_t i = 0; i < MAX_REQ; i++)
        CHECK(!S.reqs[i].used, "%s never ended", S.reqs[i].id);
    CHECK(!kvt_ec_producer_pending(S.p), "the producer still has pending pushes");
    CHECK(!kvt_ec_planner_has_pending_push_work(S.plan), "the producer scheduler still waits");
    kvt_ec_binding b[1];
    CHECK(kvt_ec_planner_bindings(S.plan, "req0", 4, b, 1) == 0, "a finished request's binding");
    kvt_ec_planner_destroy(S.plan);
    kvt_ec_meta_release(&S.pmeta);
    kvt_ec_producer_destroy(S.p);
    for (uint32_t k = 0; k < S.shards; k++)
        CHECK(kvt_ec_shard_writers(S.c.sh[k]) == 0, "shard %u still holds memory for a writer", k);
    kvt_ec_sched_destroy(S.s);
    kvt_ec_meta_release(&S.meta);
    inproc_close(&S.c);
}

static void transfers_end_loaded_or_failed_under_lossy_messages(void **state)
{
    (void)state;
    g_seed = kvt_test_seed();
    uint64_t rng = g_seed, goal = (uint64_t)(100000 * kvt_test_scale());
    uint64_t loaded = 0, failed = 0, pushed = 0, lost = 0;
    uint32_t episodes = 0;
    g_ops = 0;
    while (g_ops < goal) {
        episode(&rng, 3000 + kvt_test_below(&rng, 7000));
        episodes++;
        loaded += S.loaded;
        failed += S.failed;
        pushed += S.pushed;
        lost += S.lost;
    }
    print_message("ec model: %llu scheduler calls in %u episodes (seed %llu): %llu pushes, %llu "
                  "requests loaded and verified on every rank, %llu failed, %llu messages lost\n",
                  (unsigned long long)g_ops, episodes, (unsigned long long)g_seed,
                  (unsigned long long)pushed, (unsigned long long)loaded,
                  (unsigned long long)failed, (unsigned long long)lost);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(transfers_end_loaded_or_failed_under_lossy_messages),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
