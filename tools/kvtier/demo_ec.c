/* SPDX-License-Identifier: Apache-2.0 */
/*
 * `kvtier demo`, part 3: encoder-cache transfer between an encoder and a prefill instance with
 * two TP shards, in one process (the network comes with issue 7; the state machines are the
 * ones it will drive).
 *
 * Requests carry 1-3 images from a pool that repeats (shared system images, popular uploads).
 * For each, the encoder side's scheduler prepares the pushes (kvt_ec_planner), its worker
 * reserves on both shards before the embeddings exist and pushes them once encoded
 * (kvt_ec_producer over kvt_ec_local_consumer_ops); the prefill side's scheduler (kvt_ec_sched)
 * learns readiness from both shards, gates the request and sends load specs; each rank's worker
 * takes the bytes into its encoder cache (kvt_ec_shard_apply). The encoder cache holds only a
 * few items, so evicted images come back from the shards' resident pools without a transfer.
 * Every image a request is scheduled with is compared byte for byte with what the encoder
 * produced, on both ranks.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvtier/base.h"
#include "bench_util.h"
#include "demo.h"
#include "kvtier/kvtier.h"

#define SHARDS      2u
#define N_IMAGES    12u
#define N_REQUESTS  48u
#define CACHE_SLOTS 32u /* room in a rank's encoder cache */
#define CACHE_KEEP  8u  /* images the engine keeps there between steps */
#define HIDDEN      1024u
#define POOL_BYTES  (8u << 20)

struct image {
    char hash[24];
    uint64_t tokens, nbytes;
    unsigned char *bytes; /* what the encoder produces */
};

struct rank {
    char h[CACHE_SLOTS][24];
    uint64_t off[CACHE_SLOTS];
    uint64_t used[CACHE_SLOTS];
    uint32_t n;
    uint64_t clock;
    unsigned char *buf; /* its shard's receive buffer */
};

struct ereq {
    char id[16];
    uint32_t n, img[3];
    char tid[3][24];
    bool active, done, pushed;
    uint32_t arrived_at;
};

static struct {
    struct image img[N_IMAGES];
    struct rank rank[SHARDS];
    struct ereq req[N_REQUESTS];
    uint64_t verified_bytes, mismatches, served, failed, evictions;
} D;

/* Soak faults: the consumer's shards behind a layer that fails writes at random. */
struct faulty {
    kvt_ec_consumer_ops inner;
    double p_write;
    uint64_t rng, injected;
};

static int f_shards(void *ctx, const char *c, uint32_t *n)
{
    struct faulty *f = ctx;
    return f->inner.shards(f->inner.ctx, c, n);
}

static int f_reserve(void *ctx, const char *c, uint32_t k, const char *t, uint32_t len,
                     const kvt_ec_item *it, kvt_ec_reply *out)
{
    struct faulty *f = ctx;
    return f->inner.reserve(f->inner.ctx, c, k, t, len, it, out);
}

static int f_write(void *ctx, const char *c, uint32_t k, const kvt_ec_reply *dst, const void *src,
                   uint64_t n)
{
    struct faulty *f = ctx;
    if (f->p_write > 0 && kvt_rand_below(&f->rng, 1000000) < f->p_write * 1e6) {
        f->injected++;
        return kvt_fail(KVT_EIO, "soak: injected write failure on shard %u", k);
    }
    return f->inner.write(f->inner.ctx, c, k, dst, src, n);
}

static int f_complete(void *ctx, const char *c, uint32_t k, const char *t, uint32_t len,
                      const char *rid, bool *accepted)
{
    struct faulty *f = ctx;
    return f->inner.complete(f->inner.ctx, c, k, t, len, rid, accepted);
}

static int f_cancel(void *ctx, const char *c, uint32_t k, const char *t, uint32_t len,
                    const char *rid, bool abandon, bool refresh)
{
    struct faulty *f = ctx;
    return f->inner.cancel(f->inner.ctx, c, k, t, len, rid, abandon, refresh);
}

static int find_img(const char *h, uint32_t len)
{
    for (uint32_t i = 0; i < N_IMAGES; i++)
        if (strlen(D.img[i].hash) == len && memcmp(D.img[i].hash, h, len) == 0)
            return (int)i;
    return -1;
}

static int slot_of(const struct rank *r, const char *h, uint32_t len)
{
    for (uint32_t i = 0; i < r->n; i++)
        if (strlen(r->h[i]) == len && memcmp(r->h[i], h, len) == 0)
            return (int)i;
    return -1;
}

static bool rk_holds(void *ctx, const char *h, uint32_t len, const kvt_slab_view *v)
{
    struct rank *r = ctx;
    int s = slot_of(r, h, len);
    return s >= 0 && (!v || r->off[s] == v->offset);
}

static int rk_place(void *ctx, const kvt_ec_load_spec *sp, const kvt_slab_view *v)
{
    struct rank *r = ctx;
    if (r->n == CACHE_SLOTS)
        return kvt_fail(KVT_ENOSPC, "demo: encoder cache full");
    snprintf(r->h[r->n], sizeof(r->h[0]), "%.*s", (int)sp->mm_hash.len, sp->mm_hash.ptr);
    r->off[r->n] = v->offset;
    r->used[r->n++] = ++r->clock;
    return 0;
}

static void make_spec(kvt_ec_push_spec *s, const struct image *im, const char *tid, const char *req)
{
    memset(s, 0, sizeof(*s));
    s->mm_hash = (kvt_str){im->hash, (uint32_t)strlen(im->hash)};
    s->nbytes = im->nbytes;
    s->ndim = 2;
    s->shape[0] = im->tokens;
    s->shape[1] = HIDDEN;
    s->dtype = (kvt_str){"bfloat16", 8};
    s->consumer_zmq = (kvt_str){"local://prefill", 15};
    s->transfer_id = (kvt_str){tid, (uint32_t)strlen(tid)};
    s->request_id = (kvt_str){req, (uint32_t)strlen(req)};
}

/* The engine evicts its least recently used images while over capacity (all ranks alike). */
static int evict(kvt_ec_sched *sched, uint32_t keep)
{
    while (D.rank[0].n > keep) {
        uint32_t lru = 0;
        for (uint32_t i = 1; i < D.rank[0].n; i++)
            if (D.rank[0].used[i] < D.rank[0].used[lru])
                lru = i;
        char h[24];
        snprintf(h, sizeof(h), "%s", D.rank[0].h[lru]);
        for (uint32_t k = 0; k < SHARDS; k++) {
            struct rank *r = &D.rank[k];
            int s = slot_of(r, h, (uint32_t)strlen(h));
            if (s < 0)
                continue;
            r->n--;
            memmove(r->h[s], r->h[r->n], sizeof(r->h[0]));
            r->off[s] = r->off[r->n];
            r->used[s] = r->used[r->n];
        }
        D.evictions++;
        int rc = kvt_ec_sched_cache_freed(sched, h, (uint32_t)strlen(h));
        if (rc)
            return rc;
    }
    return 0;
}

/* One run of the demo: the prefill instance's shards and scheduler, the encoder's planner and
 * producer, their metadata, the clock they share and the faults injected. */
struct ec_demo {
    const kvt_demo_faults *fl;
    uint64_t rng;
    kvt_manual_clock clock;
    kvt_ec_shard *shards[SHARDS];
    kvt_ec_local_consumer lc;
    struct faulty fy;
    kvt_ec_sched *sched;
    kvt_ec_producer *prod;
    kvt_ec_planner *plan;
    kvt_ec_meta pmeta, cmeta;
    kvt_ec_worker_meta wm[SHARDS], agg, prep;
    uint64_t lost; /* readiness events the fault injector dropped */
    uint32_t next, steps;
};

/* The demo's two instances in one process: images, the prefill instance's shards and
 * scheduler, the encoder's producer (its consumer calls through the fault injector) and
 * planner. */
static int demo_open(struct ec_demo *e, uint64_t seed)
{
    memset(&D, 0, sizeof(D));
    e->rng = seed * 2654435761u + 17;
    kvt_clock_manual(&e->clock, 1);
    for (uint32_t i = 0; i < N_IMAGES; i++) {
        struct image *im = &D.img[i];
        snprintf(im->hash, sizeof(im->hash), "sha256:img%02u", i);
        im->tokens = 64 + kvt_rand_below(&e->rng, 193);
        im->nbytes = im->tokens * HIDDEN * 2;
        im->bytes = malloc(im->nbytes);
        if (!im->bytes)
            return 1;
        for (uint64_t b = 0; b < im->nbytes; b++)
            im->bytes[b] = (unsigned char)(i * 97 + b * 13 + (b >> 10));
    }
    e->lc = (kvt_ec_local_consumer){{NULL}, SHARDS};
    int rc = 0;
    for (uint32_t k = 0; k < SHARDS && !rc; k++) {
        D.rank[k].buf = aligned_alloc(256, POOL_BYTES);
        kvt_ec_shard_config c;
        kvt_ec_shard_config_init(&c);
        c.base = D.rank[k].buf;
        c.capacity = POOL_BYTES;
        c.clock = kvt_clock_manual(&e->clock, e->clock.now_ns);
        rc = D.rank[k].buf ? kvt_ec_shard_create(&c, &e->shards[k]) : KVT_ENOMEM;
        e->lc.shards[k] = e->shards[k];
    }
    kvt_ec_sched_config scfg;
    kvt_ec_sched_config_init(&scfg);
    scfg.shards = SHARDS;
    scfg.clock = kvt_clock_manual(&e->clock, e->clock.now_ns);
    scfg.resident_capacity = POOL_BYTES;
    kvt_ec_producer_config pcfg;
    kvt_ec_producer_config_init(&pcfg);
    e->fy =
        (struct faulty){kvt_ec_local_consumer_ops(&e->lc), e->fl->ec_write_fail, seed ^ 0x5eed, 0};
    pcfg.ops = (kvt_ec_consumer_ops){f_shards, f_reserve, f_write, f_complete, f_cancel, &e->fy};
    pcfg.clock = kvt_clock_manual(&e->clock, e->clock.now_ns);
    if (!rc)
        rc = kvt_ec_sched_create(&scfg, &e->sched);
    if (!rc)
        rc = kvt_ec_producer_create(&pcfg, &e->prod);
    if (!rc)
        rc = kvt_ec_planner_create(0, &e->plan);
    kvt_ec_meta_init(&e->pmeta);
    kvt_ec_meta_init(&e->cmeta);
    for (uint32_t k = 0; k < SHARDS; k++)
        kvt_ec_worker_meta_init(&e->wm[k]);
    kvt_ec_worker_meta_init(&e->agg);
    kvt_ec_worker_meta_init(&e->prep);
    return rc;
}

/* A new request every step, until all have arrived (the proxy sends it to the prefill
 * instance and its images to the encoder at once). */
static void arrive(struct ec_demo *e)
{
    if (e->next < N_REQUESTS) {
        struct ereq *q = &D.req[e->next];
        snprintf(q->id, sizeof(q->id), "chat-%u", e->next);
        q->n = 1 + kvt_rand_below(&e->rng, 3);
        for (uint32_t f = 0; f < q->n; f++) {
            q->img[f] = kvt_rand_below(&e->rng, N_IMAGES);
            for (uint32_t g = 0; g < f; g++)
                if (q->img[g] == q->img[f])
                    q->img[f] = (q->img[f] + 1) % N_IMAGES;
            snprintf(q->tid[f], sizeof(q->tid[f]), "xfer-%u-%u", e->next, f);
        }
        q->active = true;
        q->arrived_at = e->steps;
        e->next++;
    }
}

/* The encoder schedules a request's images a step after they arrive (its own queue) and has
 * their embeddings a step later: its metadata to its worker, which reserves, then pushes. */
static int encoder_step(struct ec_demo *e)
{
    int rc = 0;
    for (uint32_t i = 0; !rc && i < e->next; i++) {
        struct ereq *q = &D.req[i];
        if (q->pushed || e->steps != q->arrived_at + 1)
            continue;
        for (uint32_t f = 0; f < q->n && !rc; f++) {
            kvt_ec_push_spec s;
            make_spec(&s, &D.img[q->img[f]], q->tid[f], q->id);
            rc = kvt_ec_planner_prepare(e->plan, &s) < 0;
        }
        q->pushed = true;
    }
    /* encoder instance: its metadata to its worker, which reserves, then pushes */
    kvt_ec_meta_clear(&e->pmeta);
    if (!rc)
        rc = kvt_ec_planner_build_meta(e->plan, &e->pmeta);
    for (uint32_t i = 0; !rc && i < e->pmeta.n_pushes; i++)
        rc = kvt_ec_producer_push(e->prod, &e->pmeta.pushes[i]);
    for (uint32_t i = 0; !rc && i < N_REQUESTS; i++) {
        struct ereq *q = &D.req[i];
        if (!q->pushed || q->arrived_at + 2 != e->steps)
            continue;
        for (uint32_t f = 0; f < q->n; f++) {
            const struct image *im = &D.img[q->img[f]];
            (void)kvt_ec_producer_bind_source(e->prod, im->hash, (uint32_t)strlen(im->hash),
                                              im->bytes, im->nbytes, NULL);
        }
    }
    if (!rc && kvt_ec_producer_dispatch(e->prod) < 0)
        rc = KVT_EIO;
    return rc;
}

/* The prefill instance: readiness from every shard (an injected fault loses some). */
static int prefill_events(struct ec_demo *e)
{
    int rc = 0;
    for (uint32_t k = 0; !rc && k < SHARDS; k++) {
        kvt_ec_ready_event ev[16];
        uint32_t n;
        while (!rc && (n = kvt_ec_shard_take_events(e->shards[k], ev, 16)) > 0)
            for (uint32_t i = 0; !rc && i < n; i++) {
                if (e->fl->ec_lost_event > 0 &&
                    kvt_rand_below(&e->rng, 1000000) < e->fl->ec_lost_event * 1e6) {
                    e->lost++; /* a message that never arrives */
                    continue;
                }
                if (ev[i].abandoned) {
                    rc = kvt_ec_sched_observe_abandoned(e->sched, ev[i].transfer_id,
                                                        (uint32_t)strlen(ev[i].transfer_id));
                    continue;
                }
                int im = find_img(ev[i].mm_hash, (uint32_t)strlen(ev[i].mm_hash));
                if (im < 0)
                    continue;
                kvt_ec_ready r = {ev[i].transfer_id,
                                  (uint32_t)strlen(ev[i].transfer_id),
                                  {D.img[im].hash,
                                   (uint32_t)strlen(D.img[im].hash),
                                   D.img[im].nbytes,
                                   2,
                                   {D.img[im].tokens, HIDDEN},
                                   "bfloat16",
                                   8},
                                  k};
                rc = kvt_ec_sched_observe_ready(e->sched, &r);
            }
    }
    return rc;
}

/* The prefill scheduler gates its requests: scheduled ones gather their embeddings, every
 * rank checked byte for byte. */
static int serve_ready(struct ec_demo *e)
{
    int rc = 0;
    for (uint32_t i = 0; !rc && i < N_REQUESTS; i++) {
        struct ereq *q = &D.req[i];
        if (!q->active)
            continue;
        kvt_ec_feature fs[3];
        for (uint32_t f = 0; f < q->n; f++)
            fs[f] = (kvt_ec_feature){D.img[q->img[f]].hash, (uint32_t)strlen(D.img[q->img[f]].hash),
                                     q->tid[f], (uint32_t)strlen(q->tid[f])};
        bool ready;
        rc = kvt_ec_sched_ensure(e->sched, q->id, (uint32_t)strlen(q->id), fs, q->n, &ready);
        if (rc || !ready)
            continue;
        for (uint32_t f = 0; f < q->n; f++) { /* every rank must hold the exact bytes */
            const struct image *im = &D.img[q->img[f]];
            for (uint32_t k = 0; k < SHARDS; k++) {
                struct rank *r = &D.rank[k];
                int s = slot_of(r, im->hash, (uint32_t)strlen(im->hash));
                if (s < 0 || memcmp(r->buf + r->off[s], im->bytes, im->nbytes) != 0)
                    D.mismatches++;
                else
                    r->used[s] = ++r->clock;
                D.verified_bytes += im->nbytes;
            }
            /* the engine's encoder cache holds it (vLLM: update_state_after_alloc): a
             * transfer let go later keeps the shards' copy for a local reload */
            rc = kvt_ec_sched_cache_added(e->sched, im->hash, (uint32_t)strlen(im->hash));
            if (!rc)
                rc = kvt_ec_sched_consumed(e->sched, q->id, (uint32_t)strlen(q->id), &fs[f]);
        }
        if (!rc)
            rc = kvt_ec_sched_request_finished(e->sched, q->id, (uint32_t)strlen(q->id));
        if (!rc)
            rc = kvt_ec_planner_request_finished(e->plan, q->id, (uint32_t)strlen(q->id));
        if (!rc)
            rc = kvt_ec_producer_request_finished(e->prod, q->id, (uint32_t)strlen(q->id));
        q->active = false;
        q->done = true;
        D.served++;
    }
    return rc;
}

/* The requests whose embeddings cannot come fail (retryably); the cancels go to every shard. */
static int drop_unavailable(struct ec_demo *e)
{
    int rc = 0;
    char failed[16][KVT_EC_KEY_MAX + 1];
    uint32_t nf;
    while (!rc && (nf = kvt_ec_sched_take_unavailable(e->sched, failed, 16)) > 0)
        for (uint32_t i = 0; !rc && i < nf; i++) { /* the engine fails them (retryable) */
            uint32_t len = (uint32_t)strlen(failed[i]);
            rc = kvt_ec_sched_request_finished(e->sched, failed[i], len);
            if (!rc)
                rc = kvt_ec_planner_request_finished(e->plan, failed[i], len);
            if (!rc)
                rc = kvt_ec_producer_request_finished(e->prod, failed[i], len);
            for (uint32_t j = 0; j < N_REQUESTS; j++)
                if (D.req[j].active && strcmp(D.req[j].id, failed[i]) == 0)
                    D.req[j].active = false;
            D.failed++;
        }
    /* cancels go to both shards */
    uint32_t nc;
    while (!rc && (nc = kvt_ec_sched_take_cancels(e->sched, failed, 16)) > 0)
        for (uint32_t i = 0; i < nc; i++)
            for (uint32_t k = 0; k < SHARDS; k++) {
                bool done;
                (void)kvt_ec_shard_cancel(e->shards[k], failed[i], (uint32_t)strlen(failed[i]),
                                          NULL, false, false, &done);
            }
    return rc;
}

/* The engine's encoder cache keeps room for the next request's images; each rank's worker
 * runs the step's metadata on its shard, the reports aggregated back to both schedulers. */
static int workers_step(struct ec_demo *e)
{
    int rc = 0;
    if (!rc)
        rc = evict(e->sched, CACHE_KEEP);
    kvt_ec_sched_expire(e->sched);
    kvt_ec_meta_clear(&e->cmeta);
    if (!rc)
        rc = kvt_ec_sched_build_meta(e->sched, &e->cmeta);
    /* each rank's worker runs the metadata on its shard; reports are aggregated */
    const kvt_ec_worker_meta *ranks[SHARDS];
    for (uint32_t k = 0; !rc && k < SHARDS; k++) {
        kvt_ec_worker_meta_clear(&e->wm[k]);
        kvt_ec_cache_ops ops = {rk_holds, rk_place, NULL, &D.rank[k]};
        rc = kvt_ec_shard_apply(e->shards[k], &e->cmeta, &ops, &e->wm[k]);
        ranks[k] = &e->wm[k];
        kvt_ec_shard_expire(e->shards[k]);
    }
    if (!rc)
        rc = kvt_ec_worker_meta_aggregate_ranks(&e->agg, ranks, SHARDS, NULL);
    if (!rc)
        rc = kvt_ec_sched_apply_output(e->sched, &e->agg);
    kvt_ec_worker_meta_clear(&e->prep);
    if (!rc)
        rc = kvt_ec_producer_report(e->prod, &e->prep);
    if (!rc)
        rc = kvt_ec_planner_apply_output(e->plan, &e->prep);
    return rc;
}

/* Everything demo_open made. */
static void demo_close(struct ec_demo *e)
{
    kvt_ec_planner_destroy(e->plan);
    kvt_ec_producer_destroy(e->prod);
    kvt_ec_sched_destroy(e->sched);
    for (uint32_t k = 0; k < SHARDS; k++) {
        if (e->shards[k] && kvt_ec_shard_destroy(e->shards[k]) == 0)
            free(D.rank[k].buf); /* (a shard with a writer keeps its buffer: never here) */
        kvt_ec_worker_meta_release(&e->wm[k]);
    }
    kvt_ec_worker_meta_release(&e->agg);
    kvt_ec_worker_meta_release(&e->prep);
    kvt_ec_meta_release(&e->pmeta);
    kvt_ec_meta_release(&e->cmeta);
    for (uint32_t i = 0; i < N_IMAGES; i++)
        free(D.img[i].bytes);
}

int kvt_demo_ec_run(uint64_t seed, const kvt_demo_faults *fl, kvt_demo_ec_result *res,
                    char **metrics, bool print)
{
    static const kvt_demo_faults none;
    struct ec_demo ec = {.fl = fl ? fl : &none}, *e = &ec;
    int rc = demo_open(e, seed);
    double t0 = kvt_now_s();
    /* until every request is served or failed and the encoder has nothing left to push */
    while (!rc && (D.served + D.failed < N_REQUESTS || kvt_ec_producer_pending(e->prod)) &&
           e->steps < 10000) {
        e->steps++;
        kvt_clock_manual_advance(&e->clock, 1000000000ull);
        arrive(e);
        if ((rc = encoder_step(e)) || (rc = prefill_events(e)) || (rc = serve_ready(e)) ||
            (rc = drop_unavailable(e)))
            break;
        rc = workers_step(e);
    }
    double secs = kvt_now_s() - t0;
    if (rc)
        fprintf(stderr, "demo: encoder cache: %s\n", kvt_last_error());
    kvt_ec_producer_stats ps;
    kvt_ec_sched_stats ss;
    kvt_ec_shard_stats st0;
    kvt_ec_producer_get_stats(e->prod, &ps);
    kvt_ec_sched_get_stats(e->sched, &ss);
    kvt_ec_shard_get_stats(e->shards[0], &st0);
    uint64_t writers = 0, leaked = 0;
    for (uint32_t k = 0; k < SHARDS; k++) {
        kvt_ec_shard_stats hs;
        kvt_ec_shard_get_stats(e->shards[k], &hs);
        writers += hs.writers;
        leaked += hs.capacity - hs.free_bytes - hs.held_bytes;
    }
    if (res) {
        res->served = D.served;
        res->failed = D.failed;
        res->mismatches = D.mismatches;
        res->writers_left = writers;
        res->write_faults = e->fy.injected;
        res->lost_events = e->lost;
        res->leaked_bytes = leaked;
        res->stuck = D.served + D.failed < N_REQUESTS ? N_REQUESTS - D.served - D.failed : 0;
        res->pending_pushes = kvt_ec_producer_pending(e->prod);
        res->verified_bytes = D.verified_bytes;
    }
    if (print) {
        printf(
            "\n3. Encoder-cache transfer: an encoder pushes image embeddings into a prefill "
            "instance with %u TP shards\n   (kvt_ec_planner, kvt_ec_producer -> kvt_ec_shard x %u "
            "-> kvt_ec_sched; in one process until the network lands)\n",
            SHARDS, SHARDS);
        printf(
            "   %u requests with 1-3 of %u images (128-512 KiB of bf16 embeddings each); encoder "
            "cache of %u images per rank\n",
            N_REQUESTS, N_IMAGES, CACHE_KEEP);
        printf("   requests served %llu, failed %llu, in %u steps (%.1f ms)\n",
               (unsigned long long)D.served, (unsigned long long)D.failed, e->steps, secs * 1e3);
        printf(
            "   pushes %llu: %llu written to the shards (%.1f MiB), the rest shared or already "
            "resident; %llu loads, %llu of them local handoffs from the shards' pools after %llu "
            "evictions\n",
            (unsigned long long)ps.pushes, (unsigned long long)ps.writes,
            (double)ps.bytes_written / (1 << 20), (unsigned long long)ss.loads_started,
            (unsigned long long)ss.local_loads, (unsigned long long)D.evictions);
        printf("   %.1f MiB of embeddings compared byte for byte on every rank: %llu mismatches; "
               "shards end with %llu active writers\n",
               (double)D.verified_bytes / (1 << 20), (unsigned long long)D.mismatches,
               (unsigned long long)writers);
    }
    /* without faults every request is served; with them, some fail (retryably), none is
     * corrupt or stuck, nothing is left to a writer */
    bool faults = e->fl->ec_write_fail > 0 || e->fl->ec_lost_event > 0;
    int bad = rc != 0 || D.mismatches || writers || leaked || D.served + D.failed != N_REQUESTS ||
              kvt_ec_producer_pending(e->prod) ||
              (!faults && (D.failed || ss.local_loads == 0 || ps.writes == 0));
    if (metrics && !rc) { /* their Prometheus text, each shard with its label, for /metrics */
        char *t[2 + SHARDS] = {0};
        KVT_DEMO_PROM_TEXT(kvt_ec_sched_prometheus, e->sched, t[0]);
        KVT_DEMO_PROM_TEXT(kvt_ec_producer_prometheus, e->prod, t[1]);
        for (uint32_t k = 0; k < SHARDS; k++)
            KVT_DEMO_PROM_TEXT(kvt_ec_shard_prometheus, e->shards[k], t[2 + k]);
        static const char *const shard_label[] = {"shard=\"0\"", "shard=\"1\"", "shard=\"2\"",
                                                  "shard=\"3\""};
        kvt_metrics_source src[2 + SHARDS];
        bool all = true;
        for (uint32_t k = 0; k < 2 + SHARDS; k++) {
            all = all && t[k];
            src[k] = (kvt_metrics_source){t[k], t[k] ? strlen(t[k]) : 0,
                                          k < 2 ? NULL : shard_label[(k - 2) % 4]};
        }
        if (all)
            *metrics = kvt_demo_merge_metrics(src, 2 + SHARDS);
        for (uint32_t k = 0; k < 2 + SHARDS; k++)
            free(t[k]);
    }
    demo_close(e);
    return bad;
}

int kvt_demo_ec(uint64_t seed, char **metrics)
{
    return kvt_demo_ec_run(seed, NULL, NULL, metrics, true);
}
