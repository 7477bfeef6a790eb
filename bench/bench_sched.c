/* SPDX-License-Identifier: Apache-2.0 */
/*
 * `kvtier bench sched`: the scheduler-side cost of the offload manager per engine step.
 *
 * A simulated engine keeps N requests running (16-token blocks): each arrives with one of 8
 * shared 512-token system prompts plus 256 tokens of its own — or, one time in three, as a
 * returning conversation (an earlier request's whole history plus a new turn), prefills in
 * one step, decodes 128-384 tokens, finishes and is replaced (the engine defers an arrival
 * while the GPU pool lacks room for it). The GPU pool holds 80 blocks per request, so finished
 * conversations age out of the GPU and come back from the host tier (4x the GPU). Two
 * workers complete every event by the next step.
 *
 * A third mode runs three tiers: the host tier is only as large as the GPU and a disk tier 4x
 * the GPU behind it, so returning conversations are also promoted from disk and every block
 * stored is written back (the workers complete promotions and write-backs by the next step
 * too).
 *
 * A fourth mode runs a hybrid model (eager, two tiers): a full-attention group, a sliding-
 * window group (128-token window) whose blocks behind the window the engine frees and nulls
 * in the table as vLLM does (they stay cached in the GPU pool, so the manager recovers them
 * through the pool's index when it stores), and a scratch group (one 8-token block per
 * request, never stored); the calls carry the requests' hashes.
 *
 * A fifth mode is the eager one with the host tier in a node tier (kvtier/node.h): this
 * replica is rank 0 of two (rank 1 attached and idle), so every call takes the shared lock
 * and every store and eviction is published through the shared metadata.
 *
 * Timed: only the manager's calls of a step (match and after_alloc of arrivals, schedule of
 * every running request, build_meta, apply_output, request_finished) — not the engine's own
 * pool work or hashing. Reported per mode (eager, lazy, three tiers, hybrid, node) and per N (64,
 * 256, 1024): median and 99th-percentile step time, and blocks moved (stored + loaded) per second
 * of manager time. No baseline: absolute figures (target: eager p50 <= 20 us at 256 requests on one
 * core).
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_util.h"
#include "kvtier/kvtier.h"

#define BT      16u
#define SYS_TOK 512u
#define OWN_TOK 256u
#define MAX_TOK 2048u
#define MAX_BLK (MAX_TOK / BT)
#define N_SYS   8u
#define HL      KVT_BLOCK_HASH_LEN
#define SEED    11u
#define SW_TOK  128u /* the hybrid mode's sliding window */
#define NG      3u   /* hybrid: full attention, sliding window, scratch */

struct breq {
    char id[24];
    uint32_t id_len;
    uint32_t n_tokens, max_tokens, computed;
    bool loading, active;
    uint32_t blocks[MAX_BLK], n_blocks;
    uint32_t sw[MAX_BLK], scratch; /* hybrid: the window group's table, the scratch block */
    uint32_t tokens[MAX_TOK];
    uint8_t hashes[MAX_BLK * HL];
};

struct hist {
    uint32_t n;
    uint32_t tokens[MAX_TOK - 256];
};

struct sim {
    bool hybrid;
    kvt_pool *gpu;
    kvt_offload *m;
    struct breq *reqs;
    uint32_t n;
    struct hist *hist;
    uint32_t n_hist; /* finished conversations remembered: 2 per running request */
    uint32_t sys[N_SYS][SYS_TOK];
    uint64_t rng, next_id;
    kvt_offload_meta meta;
    kvt_offload_worker_meta wm;
    kvt_str done_ids[4096];
    uint32_t n_done;
    double t; /* manager seconds of the current step */
};

static double tick(void)
{
    return kvt_now_s();
}

static int die(const char *what, int rc)
{
    fprintf(stderr, "bench sched: %s: %s (%s)\n", what, kvt_strerror(rc), kvt_last_error());
    exit(1);
}

static void hash_full(struct breq *r, uint32_t from_block)
{
    for (uint32_t j = from_block; j < r->n_tokens / BT; j++)
        kvt_hash_block(SEED, j ? r->hashes + (j - 1) * HL : NULL, r->tokens + j * BT, BT, NULL, 0,
                       r->hashes + j * HL);
}

static void arrive(struct sim *s, struct breq *r)
{
    memset(r, 0, offsetof(struct breq, blocks));
    r->active = true;
    r->id_len =
        (uint32_t)snprintf(r->id, sizeof(r->id), "cmpl-%llu-0", (unsigned long long)s->next_id++);
    struct hist *h = &s->hist[kvt_rand_below(&s->rng, s->n_hist)];
    if (h->n && kvt_rand_below(&s->rng, 3) == 0) {
        memcpy(r->tokens, h->tokens, h->n * sizeof(uint32_t));
        r->n_tokens = h->n;
    } else {
        memcpy(r->tokens, s->sys[kvt_rand_below(&s->rng, N_SYS)], sizeof(s->sys[0]));
        r->n_tokens = SYS_TOK;
    }
    for (uint32_t i = 0; i < OWN_TOK && r->n_tokens < MAX_TOK - 400; i++)
        r->tokens[r->n_tokens++] = 1000 + kvt_rand_below(&s->rng, 30000);
    r->max_tokens = r->n_tokens + 128 + kvt_rand_below(&s->rng, 257);
    if (r->max_tokens > MAX_TOK)
        r->max_tokens = MAX_TOK;
    hash_full(r, 0);

    uint32_t out[MAX_BLK], out_sw[MAX_BLK], *outs[NG] = {out, out_sw, NULL};
    kvt_hit gh;
    kvt_pool_find_longest_hit(s->gpu, r->hashes, r->n_tokens / BT, r->n_tokens - 1, outs, &gh);
    /* room for the prompt and its decode (hit blocks still free count as taken) */
    if (kvt_pool_num_free(s->gpu) < (r->max_tokens / BT + 1) * (s->hybrid ? 2 : 1) + 1) {
        r->active = false; /* the engine keeps it waiting; it is retried next step */
        return;
    }
    kvt_pool_touch(s->gpu, out, gh.n_blocks[0]);
    memcpy(r->blocks, out, gh.n_blocks[0] * sizeof(uint32_t));
    if (s->hybrid) { /* the window's hit: nulls before it, cached blocks in it */
        for (uint32_t j = 0; j < gh.n_blocks[1]; j++) {
            r->sw[j] = out_sw[j];
            if (out_sw[j] != KVT_NULL_BLOCK)
                kvt_pool_touch(s->gpu, &out_sw[j], 1);
        }
    }
    uint32_t hit;
    double t0 = tick();
    int rc = kvt_offload_match(s->m, r->id, r->id_len, r->hashes, r->n_tokens / BT, r->n_tokens,
                               gh.length, &hit);
    s->t += tick() - t0;
    if (rc)
        die("match", rc);
    r->n_blocks = (r->n_tokens + BT - 1) / BT;
    if ((rc = kvt_pool_alloc(s->gpu, r->n_blocks - gh.n_blocks[0], r->blocks + gh.n_blocks[0])))
        die("GPU pool too small", rc);
    if (s->hybrid &&
        ((rc = kvt_pool_alloc(s->gpu, r->n_blocks - gh.n_blocks[1], r->sw + gh.n_blocks[1])) ||
         (rc = kvt_pool_alloc(s->gpu, 1, &r->scratch))))
        die("GPU pool too small", rc);
    const uint32_t *tab[NG] = {r->blocks, r->sw, &r->scratch};
    uint32_t nb[NG] = {r->n_blocks, r->n_blocks, 1};
    t0 = tick();
    rc = kvt_offload_after_alloc(s->m, r->id, r->id_len, tab, nb, hit);
    s->t += tick() - t0;
    if (rc)
        die("after_alloc", rc);
    r->computed = gh.length + hit;
    r->loading = hit > 0;
}

static void finish(struct sim *s, struct breq *r)
{
    const uint32_t *tab[NG] = {r->blocks, r->sw, &r->scratch};
    uint32_t nb[NG] = {r->n_blocks, r->n_blocks, 1};
    double t0 = tick();
    int rc = s->hybrid
                 ? kvt_offload_request_finished_hashed(s->m, r->id, r->id_len, tab, nb, r->hashes,
                                                       r->n_tokens / BT, r->computed)
                 : kvt_offload_request_finished(s->m, r->id, r->id_len, tab, nb, r->computed);
    s->t += tick() - t0;
    if (rc)
        die("request_finished", rc);
    struct hist *h = &s->hist[kvt_rand_below(&s->rng, s->n_hist)];
    if (r->n_tokens <= MAX_TOK - 256) {
        memcpy(h->tokens, r->tokens, r->n_tokens * sizeof(uint32_t));
        h->n = r->n_tokens;
    }
    uint32_t rev[MAX_BLK];
    for (uint32_t i = 0; i < r->n_blocks; i++)
        rev[i] = r->blocks[r->n_blocks - 1 - i];
    kvt_pool_free(s->gpu, rev, r->n_blocks);
    if (s->hybrid) {
        uint32_t n = 0;
        for (uint32_t i = r->n_blocks; i-- > 0;)
            if (r->sw[i] != KVT_NULL_BLOCK)
                rev[n++] = r->sw[i];
        rev[n++] = r->scratch;
        kvt_pool_free(s->gpu, rev, n);
    }
    r->active = false;
}

/* One engine step; returns the manager's time in seconds. */
static double step(struct sim *s)
{
    s->t = 0;
    for (uint32_t i = 0; i < s->n; i++) {
        struct breq *r = &s->reqs[i];
        if (r->active && !r->loading && r->computed >= r->max_tokens)
            finish(s, r);
        else if (!r->active)
            r->loading = false;
        if (!r->active)
            arrive(s, r);
    }
    /* decode slots for this step's tokens (engine work) */
    uint32_t sched[8192];
    for (uint32_t i = 0; i < s->n; i++) {
        struct breq *r = &s->reqs[i];
        sched[i] = 0;
        if (r->loading || !r->active)
            continue;
        if (r->computed < r->n_tokens) {
            sched[i] = r->n_tokens - r->computed;
        } else {
            if (r->n_tokens / BT >= r->n_blocks) {
                if (kvt_pool_num_free(s->gpu) < (s->hybrid ? 2u : 1u) ||
                    kvt_pool_alloc(s->gpu, 1, &r->blocks[r->n_blocks]))
                    continue; /* no slot this step */
                if (s->hybrid)
                    kvt_pool_alloc(s->gpu, 1, &r->sw[r->n_blocks]);
                r->n_blocks++;
            }
            r->tokens[r->n_tokens++] = 1000 + kvt_rand_below(&s->rng, 30000);
            sched[i] = 1;
        }
    }
    double t0 = tick();
    for (uint32_t i = 0; i < s->n; i++) {
        struct breq *r = &s->reqs[i];
        if (!sched[i])
            continue;
        const uint32_t *tab[NG] = {r->blocks, r->sw, &r->scratch};
        uint32_t nb[NG] = {r->n_blocks, r->n_blocks, 1};
        int rc = s->hybrid
                     ? kvt_offload_schedule_hashed(s->m, r->id, r->id_len, tab, nb, r->hashes,
                                                   r->computed / BT, r->computed, sched[i], false)
                     : kvt_offload_schedule(s->m, r->id, r->id_len, tab, nb, r->computed, sched[i],
                                            false);
        if (rc < 0)
            die("schedule", rc);
    }
    int rc = kvt_offload_build_meta(s->m, false, &s->meta);
    s->t += tick() - t0;
    if (rc)
        die("build_meta", rc);
    /* the workers finish this step's events; reports arrive with the next output */
    int64_t store_ev = s->meta.store_event, load_ev = s->meta.load_event;
    s->n_done = 0;
    for (uint32_t e = 0; e < s->meta.n_load_events && load_ev != KVT_NO_EVENT; e++)
        if (s->meta.load_events[e] == load_ev)
            for (uint32_t k = s->meta.load_req_first[e]; k < s->meta.load_req_first[e + 1]; k++)
                s->done_ids[s->n_done++] = s->meta.load_req_ids[k];
    kvt_offload_worker_meta_clear(&s->wm);
    if (store_ev != KVT_NO_EVENT)
        kvt_offload_worker_meta_add(&s->wm, store_ev, 2);
    if (s->meta.tiers[0].store_event != KVT_NO_EVENT)
        kvt_event_report_add(&s->wm.tier_stores[0], s->meta.tiers[0].store_event, 2);
    if (s->meta.tiers[0].load_event != KVT_NO_EVENT)
        kvt_event_report_add(&s->wm.tier_loads[0], s->meta.tiers[0].load_event, 2);
    t0 = tick();
    rc = kvt_offload_apply_output(s->m, s->done_ids, s->n_done, &s->wm);
    s->t += tick() - t0;
    if (rc)
        die("apply_output", rc);
    for (uint32_t i = 0; i < s->n; i++) {
        struct breq *r = &s->reqs[i];
        if (!r->active)
            continue;
        if (r->loading) {
            for (uint32_t k = 0; k < s->n_done; k++)
                if (s->done_ids[k].len == r->id_len &&
                    memcmp(s->done_ids[k].ptr, r->id, r->id_len) == 0)
                    r->loading = false;
            continue;
        }
        if (!sched[i])
            continue;
        uint32_t from = r->computed / BT;
        r->computed += sched[i];
        if (r->n_tokens % BT == 0 && sched[i] == 1)
            hash_full(r, r->n_tokens / BT - 1);
        for (uint32_t j = from; j < r->computed / BT; j++) {
            kvt_block_info bi;
            kvt_pool_block_info(s->gpu, r->blocks[j], &bi);
            if (!bi.n_keys)
                kvt_pool_insert(s->gpu, r->blocks[j], r->hashes + j * HL, 0, BT);
            if (s->hybrid && r->sw[j] != KVT_NULL_BLOCK) {
                kvt_pool_block_info(s->gpu, r->sw[j], &bi);
                if (!bi.n_keys)
                    kvt_pool_insert(s->gpu, r->sw[j], r->hashes + j * HL, 1, BT);
            }
        }
        /* the engine frees the window group's blocks that fell behind the window; they stay
         * cached in the GPU pool until reused */
        for (uint32_t j = 0; s->hybrid && (j + 1) * BT + SW_TOK <= r->computed; j++)
            if (r->sw[j] != KVT_NULL_BLOCK) {
                kvt_pool_free(s->gpu, &r->sw[j], 1);
                r->sw[j] = KVT_NULL_BLOCK;
            }
    }
    return s->t;
}

struct result {
    double p50_us, p99_us, blocks_per_s;
    uint64_t steps, loads, stores, promotions, recovered;
};

enum { M_EAGER, M_LAZY, M_THREE, M_HYBRID, M_NODE, N_MODES };

static struct result run(uint32_t n, int mode, double seconds, uint64_t seed)
{
    struct sim *s = calloc(1, sizeof(*s));
    s->n = n;
    s->hybrid = mode == M_HYBRID;
    s->rng = seed;
    s->reqs = calloc(n, sizeof(*s->reqs));
    s->n_hist = 2 * n;
    s->hist = calloc(s->n_hist, sizeof(*s->hist));
    for (uint32_t p = 0; p < N_SYS; p++)
        for (uint32_t t = 0; t < SYS_TOK; t++)
            s->sys[p][t] = 100 + p * 1000 + t;
    kvt_pool_config pc;
    kvt_pool_config_init(&pc);
    pc.num_blocks = n * 80 + MAX_BLK * 4; /* tight: finished conversations age out */
    if (s->hybrid) {                      /* the same per group; the window's tail costs little */
        pc.num_blocks = n * 120 + MAX_BLK * 8;
        pc.n_groups = NG;
        pc.groups[1] = (kvt_group_spec){KVT_GROUP_SLIDING, BT, SW_TOK};
        pc.groups[2] = (kvt_group_spec){KVT_GROUP_SCRATCH, 8, 0};
    }
    int rc = kvt_pool_create(&pc, &s->gpu);
    if (rc)
        die("GPU pool", rc);
    kvt_offload_config oc;
    kvt_offload_config_init(&oc);
    oc.host_blocks = pc.num_blocks * (mode == M_THREE ? 1 : 4);
    oc.disk_blocks = mode == M_THREE ? pc.num_blocks * 4 : 0;
    oc.world_size = 2;
    oc.lazy = mode == M_LAZY;
    oc.max_requests = n * 2 + 64;
    oc.max_model_len = MAX_TOK;
    kvt_node *node = NULL, *peer = NULL;
    char name[48];
    if (mode == M_NODE) { /* eager, this replica rank 0 of a node tier whose rank 1 idles */
        snprintf(name, sizeof(name), "bench-sched-%d", (int)getpid());
        kvt_node_unlink(name);
        kvt_node_config nc;
        kvt_node_config_init(&nc);
        nc.name = name;
        nc.ranks = 2;
        nc.blocks_per_rank = oc.host_blocks;
        nc.keys_per_block = pc.keys_per_block;
        if ((rc = kvt_node_attach(&nc, &node)))
            die("node tier", rc);
        nc.rank = 1;
        if ((rc = kvt_node_attach(&nc, &peer)))
            die("node tier", rc);
        oc.host_blocks = kvt_node_num_slots(node);
    }
    if ((rc = kvt_offload_create(&oc, s->gpu, &s->m)))
        die("manager", rc);
    if (node && (rc = kvt_offload_attach_node(s->m, node)))
        die("node tier", rc);
    kvt_offload_meta_init(&s->meta);
    kvt_offload_worker_meta_init(&s->wm);
    /* stagger the requests so finishes spread over steps, then warm up */
    for (uint32_t i = 0; i < n; i++) {
        arrive(s, &s->reqs[i]);
        uint32_t mt = s->reqs[i].n_tokens + kvt_rand_below(&s->rng, 384) + 1;
        s->reqs[i].max_tokens = mt < MAX_TOK ? mt : MAX_TOK;
    }
    for (int i = 0; i < 600; i++)
        step(s);
    size_t cap = 1 << 16, k = 0;
    double *t = malloc(cap * sizeof(double)), total = 0;
    kvt_offload_stats st0, st1;
    kvt_offload_get_stats(s->m, &st0);
    double start = kvt_now_s();
    while (k < cap && (kvt_now_s() - start < seconds || k < 200)) {
        t[k] = step(s);
        total += t[k++];
    }
    kvt_offload_get_stats(s->m, &st1);
    qsort(t, k, sizeof(double), kvt_cmp_double);
    struct result res;
    res.p50_us = t[k / 2] * 1e6;
    res.p99_us = t[(k * 99) / 100] * 1e6;
    res.steps = k;
    res.loads = st1.load_blocks - st0.load_blocks;
    res.stores = st1.store_blocks - st0.store_blocks;
    res.promotions = st1.promotions - st0.promotions;
    res.recovered = st1.store_recovered_null - st0.store_recovered_null;
    res.blocks_per_s = (double)(res.loads + res.stores) / total;
    free(t);
    kvt_offload_meta_release(&s->meta);
    kvt_offload_worker_meta_release(&s->wm);
    kvt_offload_destroy(s->m);
    kvt_node_detach(peer);
    kvt_node_detach(node);
    kvt_pool_destroy(s->gpu);
    free(s->reqs);
    free(s->hist);
    free(s);
    return res;
}

static int bench_sched_run(const kvt_bench_opts *o)
{
    static const uint32_t ns[3] = {64, 256, 1024};
    static const char *const names[N_MODES] = {"eager", "lazy", "three", "hybrid", "node"};
    struct result r[N_MODES][3];
    for (int mode = 0; mode < N_MODES; mode++)
        for (int i = 0; i < 3; i++)
            r[mode][i] = run(ns[i], mode, o->seconds / N_MODES, o->seed);
    if (o->json) {
        kvt_json j;
        kvt_json_begin(&j, stdout);
        kvt_json_str(&j, "bench", "sched");
        kvt_json_int(&j, "block_tokens", BT);
        kvt_json_int(&j, "world_size", 2);
        kvt_json_num(&j, "step_us_p50", r[M_EAGER][1].p50_us);
        kvt_json_num(&j, "step_us_p99", r[M_EAGER][1].p99_us);
        for (int mode = 0; mode < N_MODES; mode++) {
            static const char *const prefix[N_MODES] = {"", "lazy_", "three_tier_", "hybrid_",
                                                        "node_"};
            const char *pre = prefix[mode];
            static const char *const n_req[3] = {"64", "256", "1024"};
            json_t *p50 = json_object(), *p99 = json_object();
            for (int i = 0; i < 3; i++) {
                json_object_set_new(p50, n_req[i], kvt_json_real(r[mode][i].p50_us));
                json_object_set_new(p99, n_req[i], kvt_json_real(r[mode][i].p99_us));
            }
            char key[64];
            snprintf(key, sizeof(key), "%sstep_us_p50_by_requests", pre);
            kvt_json_set(&j, key, p50);
            snprintf(key, sizeof(key), "%sstep_us_p99_by_requests", pre);
            kvt_json_set(&j, key, p99);
        }
        kvt_json_num(&j, "blocks_per_s", r[M_EAGER][1].blocks_per_s);
        kvt_json_num(&j, "lazy_blocks_per_s", r[M_LAZY][1].blocks_per_s);
        kvt_json_num(&j, "three_tier_blocks_per_s", r[M_THREE][1].blocks_per_s);
        kvt_json_num(&j, "hybrid_step_us_p50", r[M_HYBRID][1].p50_us);
        kvt_json_num(&j, "hybrid_blocks_per_s", r[M_HYBRID][1].blocks_per_s);
        kvt_json_int(&j, "hybrid_recovered_blocks_256", (long long)r[M_HYBRID][1].recovered);
        kvt_json_num(&j, "node_step_us_p50", r[M_NODE][1].p50_us);
        kvt_json_num(&j, "node_vs_eager_p50", r[M_NODE][1].p50_us / r[M_EAGER][1].p50_us);
        kvt_json_int(&j, "stored_blocks_256", (long long)r[M_EAGER][1].stores);
        kvt_json_int(&j, "loaded_blocks_256", (long long)r[M_EAGER][1].loads);
        kvt_json_int(&j, "three_tier_promoted_blocks_256", (long long)r[M_THREE][1].promotions);
        kvt_json_int(&j, "steps_256", (long long)r[M_EAGER][1].steps);
        kvt_json_host(&j);
        kvt_json_end(&j);
    } else {
        printf("sched: manager time per engine step (16-token blocks, world_size 2, one thread)\n");
        for (int mode = 0; mode < N_MODES; mode++)
            for (int i = 0; i < 3; i++)
                printf("  %-5s %5u requests: p50 %7.2f us  p99 %7.2f us  %8.2f M blocks/s  "
                       "(%llu steps, %llu stored, %llu loaded, %llu promoted)\n",
                       names[mode], ns[i], r[mode][i].p50_us, r[mode][i].p99_us,
                       r[mode][i].blocks_per_s / 1e6, (unsigned long long)r[mode][i].steps,
                       (unsigned long long)r[mode][i].stores, (unsigned long long)r[mode][i].loads,
                       (unsigned long long)r[mode][i].promotions);
        printf("  (target: eager p50 <= 20 us at 256 requests; three: host tier = GPU, disk 4x;\n"
               "   hybrid: full attention + %u-token sliding window + scratch, eager;\n"
               "   node: eager with a node tier, rank 0 of 2)\n",
               SW_TOK);
    }
    return 0;
}

const kvt_bench kvt_bench_sched = {"sched", "offload manager cost per engine step", bench_sched_run,
                                   "json,seconds,seed"};
