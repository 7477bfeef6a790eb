/* SPDX-License-Identifier: Apache-2.0 */
/*
 * `kvtier demo --components`: the library's parts one by one (the reference engine's demo is
 * demo_engine.c).
 *
 * Part 1 runs a multi-turn chat workload (shared system prompts, conversations that come back
 * after other traffic) through an engine-side GPU block pool with prefix caching, exactly as an
 * engine uses kvt_pool: chained block hashes, longest-hit search, touch, alloc, insert, ordered
 * free. Every block's KV bytes live in a "device" buffer (host memory here) and are a pure
 * function of the block's hash, so any block can be checked. The workload runs twice:
 *   (a) GPU tier only: conversations whose history was evicted from the GPU recompute it;
 *   (b) with a host tier: kvt_offload stores every confirmed block (eager) and loads evicted
 *       history back; an in-process kvt_worker copies the bytes each event asks for, and every
 *       loaded block is compared byte for byte with what computing it would have produced.
 *   (c) three tiers: a host tier only as large as the GPU's, with a disk tier (a private file
 *       under the working directory, io_uring) behind it: every block that reaches the host
 *       tier is written back to disk, and history the host tier evicted is promoted back
 *       from disk before it is loaded to the GPU, again verified byte for byte.
 * Same workload, same seed: (b) and (c) must recompute less and hit the same content.
 *
 * Part 2 carries one step's metadata across the wire: the scheduler's offload metadata encoded
 * and decoded bit-exactly, worker reports aggregated across ranks (store counts summed; the
 * encoder-cache `loaded` sets intersected, a non-receiving rank contributing nothing).
 *
 * Every figure printed is checked: pools must end fully free, loaded bytes must match, round
 * trips must be equal; the exit code says whether all checks passed.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_util.h"
#include "demo.h"
#include "kvtier/disk.h"
#include "ec_cmds.h"
#include "kvtier/kvtier.h"

#define BT          16u   /* tokens per block */
#define GPU_BLOCKS  1024u /* engine's GPU tier: 16,368 usable token slots */
#define HOST_BLOCKS 8192u /* host tier */
#define SMALL_HOST  1024u /* host tier in front of the disk tier */
#define DISK_SLOTS  8192u /* disk tier */
#define BLOCK_BYTES 4096u /* KV bytes per block in this demo */
#define N_SYSTEM    4u
#define SYSTEM_TOK  768u
#define N_CONV      48u
#define N_TURNS     4u
#define ANSWER_TOK  64u
#define MAX_TOK     (SYSTEM_TOK + N_TURNS * (320u + ANSWER_TOK) + BT)
#define MAX_BLK     (MAX_TOK / BT + 1)

struct conv {
    char id[16];
    uint32_t sys;
    uint32_t len;      /* tokens of history (system prompt included) */
    uint32_t computed; /* tokens whose KV was computed in an earlier turn */
    uint32_t tok[MAX_TOK];
};

struct stats {
    uint64_t prompt_tokens, gpu_hit_tokens, host_hit_tokens, recomputed, evictions, turns;
    uint64_t loaded_blocks, stored_blocks, verified_bytes, bad_blocks;
    uint64_t promoted, written_back;
    uint64_t faults, resets, recovered, stuck, preemptions, delayed; /* soak */
    uint64_t leaked_blocks, leaked_requests;
};

enum { TIER_GPU, TIER_HOST, TIER_DISK };

/* The engine and, optionally, its host tier with an in-process worker. */
struct engine {
    kvt_pool *gpu;
    unsigned char *device; /* GPU_BLOCKS x BLOCK_BYTES: the "GPU" KV memory */
    kvt_offload *off;      /* NULL: GPU tier only */
    kvt_layout *layout;    /* the device memory as one region of GPU_BLOCKS blocks */
    kvt_mirror *mirror;    /* the host tier: HOST_BLOCKS blocks */
    kvt_layout *mlayout;   /* three tiers: the mirror's arrays, the disk's layout */
    kvt_disk *disk;        /* three tiers: DISK_SLOTS slots */
    kvt_worker *worker;
    kvt_offload_meta meta;
    kvt_offload_worker_meta wm;
    uint64_t seed;
    /* soak */
    const kvt_demo_faults *faults;
    uint64_t fault_seq, fault_hits; /* updated by the disk's pipeline threads (atomics) */
    uint64_t torn_failed;           /* the same: torn writes that could not be made */
    int torn_fd;
    uint32_t invalid[GPU_BLOCKS]; /* blocks whose load failed this turn */
    uint32_t n_invalid;
    uint64_t rng;                 /* the engine's own faults (delays, preemptions) */
    kvt_offload_worker_meta held; /* a delayed report, applied with a later step's */
    char held_ids[64][64];        /* and its finished loads */
    uint32_t n_held;
    bool holding;
    uint64_t preemptions, delayed;
};

static int check(int rc, const char *what)
{
    if (rc < 0)
        fprintf(stderr, "demo: %s failed: %s (%s)\n", what, kvt_strerror(rc), kvt_last_error());
    return rc < 0;
}

/* The KV bytes a block holds once computed: a function of its hash only. */
static void kv_content(const uint8_t *hash, unsigned char *out)
{
    uint64_t x = kvt_hash64(hash, KVT_BLOCK_HASH_LEN, 0) | 1;
    for (uint32_t i = 0; i < BLOCK_BYTES; i += 8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        memcpy(out + i, &x, 8);
    }
}

/* The worker (one rank, kvt_worker over the CPU copy engine): binds the step's metadata,
 * launches its copies after the "forward", waits for them (the demo runs steps
 * synchronously), and hands the manager what the worker reports. */
/* Appends the requests a get_finished call reported (their strings live in the bound
 * metadata; only the array is reused by the next call). */
static int collect_finished(struct engine *e, kvt_str *all, uint32_t *n_all, uint32_t cap)
{
    const kvt_str *fin;
    uint32_t n;
    int rc = kvt_worker_get_finished(e->worker, NULL, &fin, &n);
    for (uint32_t i = 0; !rc && i < n; i++) {
        if (*n_all == cap)
            return check(KVT_ELIMIT, "demo: too many finished loads in one step");
        all[(*n_all)++] = fin[i];
    }
    return rc;
}

static bool chance(struct engine *e, double p)
{
    return p > 0 && kvt_rand_below(&e->rng, 1000000) < p * 1e6;
}

/* Hands the manager this step's report. Under the soak's faults a report is now and then held
 * back one step (a slow rank) and then delivered before or after the next one (reordered). */
static int deliver_report(struct engine *e, const kvt_str *fin, uint32_t n_fin)
{
    const kvt_demo_faults *f = e->faults;
    if (f && !e->holding && chance(e, f->delay_report) && n_fin <= 64) {
        int rc = kvt_offload_worker_meta_aggregate(&e->held, &e->wm);
        for (uint32_t i = 0; !rc && i < n_fin; i++) {
            if (fin[i].len >= sizeof(e->held_ids[0]))
                return check(KVT_ELIMIT, "demo: request id too long to hold");
            memcpy(e->held_ids[i], fin[i].ptr, fin[i].len);
            e->held_ids[i][fin[i].len] = 0;
        }
        e->n_held = n_fin;
        e->holding = !rc;
        e->delayed += !rc;
        return check(rc, "hold report");
    }
    kvt_str held[64];
    for (uint32_t i = 0; i < e->n_held; i++)
        held[i] = (kvt_str){e->held_ids[i], (uint32_t)strlen(e->held_ids[i])};
    bool late_first = chance(e, 0.5);
    int rc = 0;
    if (e->holding && late_first)
        rc = kvt_offload_apply_output(e->off, held, e->n_held, &e->held);
    if (!rc)
        rc = kvt_offload_apply_output(e->off, fin, n_fin, &e->wm);
    if (!rc && e->holding && !late_first)
        rc = kvt_offload_apply_output(e->off, held, e->n_held, &e->held);
    if (e->holding) {
        kvt_offload_worker_meta_clear(&e->held);
        e->n_held = 0;
        e->holding = false;
    }
    return rc;
}

static int run_worker(struct engine *e)
{
    kvt_str fin[64];
    uint32_t n_fin = 0;
    int rc = kvt_worker_bind(e->worker, &e->meta);
    if (!rc)
        rc = kvt_worker_handle_preemptions(e->worker);
    if (!rc) /* launches the copies; a fast load may already be reported here */
        rc = collect_finished(e, fin, &n_fin, 64);
    if (!rc)
        rc = kvt_worker_flush(e->worker);
    if (!rc)
        rc = collect_finished(e, fin, &n_fin, 64);
    if (!rc)
        rc = kvt_worker_build_meta(e->worker, &e->wm);
    if (!rc)
        rc = deliver_report(e, fin, n_fin);
    if (!rc) /* loads that failed (a disk error under a promotion): recomputed by the turn */
        e->n_invalid += kvt_worker_take_invalid_blocks(e->worker, e->invalid + e->n_invalid,
                                                       GPU_BLOCKS - e->n_invalid);
    kvt_worker_clear(e->worker);
    return check(rc, "worker step");
}

/* Engine steps until nothing is in flight: a load (three tiers: after its promotion), the
 * stores, and the write-backs their completion queues. A handful suffice; the soak's delayed
 * reports add one step each. */
#define QUIET_STEPS 16
static int run_until_quiet(struct engine *e, struct stats *st)
{
    for (int i = 0; i < QUIET_STEPS; i++) {
        /* soak: a preemption in this step makes the workers flush before blocks are reused */
        bool preempted = e->faults && chance(e, e->faults->preempt);
        e->preemptions += preempted;
        if (check(kvt_offload_build_meta(e->off, preempted, &e->meta), "build_meta"))
            return -1;
        st->stored_blocks += e->meta.n_stores;
        st->written_back += e->meta.tiers[0].n_stores;
        if (run_worker(e))
            return -1;
        if (!kvt_offload_has_pending(e->off))
            return 0;
    }
    st->stuck++;
    kvt_offload_stats os;
    kvt_offload_get_stats(e->off, &os);
    fprintf(stderr,
            "demo: transfers still pending after %d steps: load events %u, store events %u, "
            "promotions %u, write-backs %u; %u store blocks pending\n",
            QUIET_STEPS, os.load_events_in_flight, os.store_events_in_flight,
            os.disk_load_events_in_flight, os.disk_store_events_in_flight, os.pending_store_blocks);
    return -1;
}

/* One turn: prefix lookups, allocation, load, prefill + answer, caching, store, release. */
static int run_turn(struct engine *e, struct conv *c, uint64_t *rng, struct stats *st)
{
    static uint8_t hashes[MAX_BLK * KVT_BLOCK_HASH_LEN];
    static uint32_t ids[MAX_BLK], hit_ids[MAX_BLK];
    static unsigned char expect[BLOCK_BYTES];
    uint32_t user = 96 + kvt_rand_below(rng, 225);
    for (uint32_t i = 0; i < user; i++)
        c->tok[c->len + i] = 1000 + kvt_rand_below(rng, 30000);
    uint32_t n = c->len + user, nh, total = n + ANSWER_TOK;
    for (uint32_t i = 0; i < ANSWER_TOK; i++)
        c->tok[n + i] = 1000 + kvt_rand_below(rng, 30000);
    /* hashes of every full block the turn will have (prompt and answer) */
    if (check(kvt_hash_prompt(e->seed, c->tok, total, BT, NULL, 0, hashes, MAX_BLK, &nh),
              "hash_prompt"))
        return -1;
    uint32_t prompt_blocks = n / BT;
    uint32_t *outs[1] = {hit_ids};
    kvt_hit hit;
    if (check(kvt_pool_find_longest_hit(e->gpu, hashes, prompt_blocks, n - 1, outs, &hit),
              "find_longest_hit"))
        return -1;
    uint32_t nhit = hit.n_blocks[0], host_hit = 0;
    if (e->off && check(kvt_offload_match(e->off, c->id, (uint32_t)strlen(c->id), hashes,
                                          prompt_blocks, n, hit.length, &host_hit),
                        "match"))
        return -1;
    if (check(kvt_pool_touch(e->gpu, hit_ids, nhit), "touch"))
        return -1;
    memcpy(ids, hit_ids, nhit * sizeof(uint32_t));
    uint32_t need = (total + BT - 1) / BT;
    if (check(kvt_pool_alloc(e->gpu, need - nhit, ids + nhit), "alloc"))
        return -1;
    const uint32_t *tab[1] = {ids};
    uint32_t nb[1] = {need};
    uint32_t loaded = host_hit / BT;
    if (e->off) {
        e->n_invalid = 0;
        if (check(
                kvt_offload_after_alloc(e->off, c->id, (uint32_t)strlen(c->id), tab, nb, host_hit),
                "after_alloc") ||
            run_until_quiet(e, st))
            return -1;
        /* every loaded block must hold exactly what computing it would have produced; one the
         * worker reported invalid (its promotion failed) is recomputed instead, as an engine
         * does with invalid blocks */
        for (uint32_t b = nhit; b < nhit + loaded; b++) {
            kv_content(hashes + b * KVT_BLOCK_HASH_LEN, expect);
            bool invalid = false;
            for (uint32_t k = 0; k < e->n_invalid && !invalid; k++)
                invalid = e->invalid[k] == ids[b];
            if (invalid) {
                memcpy(e->device + (size_t)ids[b] * BLOCK_BYTES, expect, BLOCK_BYTES);
                st->recovered++;
                continue;
            }
            if (memcmp(e->device + (size_t)ids[b] * BLOCK_BYTES, expect, BLOCK_BYTES) != 0)
                st->bad_blocks++;
            st->verified_bytes += BLOCK_BYTES;
        }
        st->loaded_blocks += loaded;
    }
    uint32_t have = hit.length + host_hit; /* tokens whose KV is in place */
    st->prompt_tokens += n;
    st->gpu_hit_tokens += hit.length;
    st->host_hit_tokens += host_hit;
    if (c->computed > have)
        st->recomputed += c->computed - have;
    st->turns++;

    /* prefill the rest and decode the answer: compute, then cache every full block */
    uint32_t full = total / BT;
    for (uint32_t b = nhit + loaded; b < need; b++)
        kv_content(hashes + (b < full ? b : 0) * KVT_BLOCK_HASH_LEN,
                   e->device + (size_t)ids[b] * BLOCK_BYTES);
    for (uint32_t b = nhit; b < full; b++)
        if (check(kvt_pool_insert(e->gpu, ids[b], hashes + b * KVT_BLOCK_HASH_LEN, 0, BT),
                  "insert"))
            return -1;
    if (e->off) {
        /* finished: the final flush queues the confirmed blocks not yet in the host tier */
        if (check(kvt_offload_request_finished(e->off, c->id, (uint32_t)strlen(c->id), tab, nb,
                                               total),
                  "request_finished") ||
            run_until_quiet(e, st))
            return -1;
    }
    if (e->off && e->faults && e->faults->reset > 0 &&
        kvt_rand_below(rng, 1000000) < e->faults->reset * 1e6) {
        /* a prefix-cache reset (weight update) between turns: "not yet" while transfers run */
        int rc = KVT_EBUSY;
        for (int i = 0; i < 8 && rc == KVT_EBUSY; i++)
            if ((rc = kvt_offload_reset(e->off)) == KVT_EBUSY && run_until_quiet(e, st))
                return -1;
        if (check(rc, "reset"))
            return -1;
        st->resets++;
    }
    for (uint32_t i = 0; i < need / 2; i++) { /* free tail first */
        uint32_t t = ids[i];
        ids[i] = ids[need - 1 - i];
        ids[need - 1 - i] = t;
    }
    if (check(kvt_pool_free(e->gpu, ids, need), "free"))
        return -1;
    c->len = total;
    c->computed = full * BT;
    kvt_pool_event ev[256];
    uint32_t got;
    while ((got = kvt_pool_take_events(e->gpu, ev, 256, NULL)) > 0)
        for (uint32_t i = 0; i < got; i++)
            st->evictions += ev[i].type == KVT_POOL_EV_REMOVED;
    return 0;
}

/* Soak: the disk's pipelines fail a read or write now and then (called from their threads). */
static int disk_fault(void *ctx, int dir, uint32_t slot, int res)
{
    struct engine *e = ctx;
    uint64_t n = __atomic_fetch_add(&e->fault_seq, 1, __ATOMIC_RELAXED);
    uint64_t x = (n + 1) * 0x9E3779B97F4A7C15ull ^ e->seed;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    if ((double)(x >> 11) * 0x1.0p-53 >= e->faults->disk_eio)
        return res;
    __atomic_fetch_add(&e->fault_hits, 1, __ATOMIC_RELAXED);
    if (dir == KVT_COPY_STORE && e->torn_fd >= 0) { /* a torn write: the slot holds garbage */
        static const unsigned char junk[BLOCK_BYTES] = {0xEE, 0xEE, 0xEE, 0xEE};
        uint64_t sb = kvt_disk_slot_bytes(e->disk);
        if (pwrite(e->torn_fd, junk, sizeof(junk), (off_t)(slot * sb)) != (ssize_t)sizeof(junk))
            __atomic_fetch_add(&e->torn_failed, 1, __ATOMIC_RELAXED);
    }
    return -EIO;
}

static int engine_open(struct engine *e, uint64_t seed, int tiers, const kvt_demo_faults *faults)
{
    memset(e, 0, sizeof(*e));
    e->torn_fd = -1;
    e->seed = seed;
    e->faults = faults;
    kvt_pool_config cfg;
    kvt_pool_config_init(&cfg);
    cfg.num_blocks = GPU_BLOCKS;
    cfg.event_capacity = 4096;
    if (check(kvt_pool_create(&cfg, &e->gpu), "pool create"))
        return -1;
    e->device = calloc(GPU_BLOCKS, BLOCK_BYTES);
    if (!e->device)
        return -1;
    if (tiers == TIER_GPU)
        return 0;
    uint32_t host_blocks = tiers == TIER_DISK ? SMALL_HOST : HOST_BLOCKS;
    kvt_mirror_config mc;
    kvt_mirror_config_init(&mc);
    mc.host_blocks = host_blocks;
    kvt_worker_config wc;
    kvt_worker_config_init(&wc);
    kvt_offload_config oc;
    kvt_offload_config_init(&oc);
    oc.host_blocks = host_blocks;
    oc.block_bytes = BLOCK_BYTES;
    oc.disk_blocks = tiers == TIER_DISK ? DISK_SLOTS : 0;
    if (check(kvt_layout_create(KVT_HOST_DEVICE, GPU_BLOCKS, &e->layout), "layout") ||
        check(kvt_layout_add_region(e->layout, (uint64_t)(uintptr_t)e->device, BLOCK_BYTES),
              "layout region") ||
        check(kvt_mirror_create(&mc, e->layout, &e->mirror), "host mirror") ||
        check(kvt_worker_create(&wc, e->layout, e->mirror, &e->worker), "worker") ||
        check(kvt_offload_create(&oc, e->gpu, &e->off), "offload create"))
        return -1;
    if (tiers == TIER_DISK) {
        kvt_disk_config dc;
        kvt_disk_config_init(&dc);
        dc.path = "kvtier-demo-disk"; /* + ".rank0" in the working directory, unlinked at exit */
        dc.capacity_bytes = (uint64_t)DISK_SLOTS * BLOCK_BYTES;
        if (check(kvt_mirror_layout(e->mirror, &e->mlayout), "mirror layout"))
            return -1;
        int rc = kvt_disk_create(&dc, e->mlayout, &e->disk);
        if (rc == KVT_ESYS && strstr(kvt_last_error(), "O_DIRECT")) { /* tmpfs: buffered */
            dc.page_cache = true;
            rc = kvt_disk_create(&dc, e->mlayout, &e->disk);
        }
        if (check(rc, "disk") || check(kvt_worker_attach_disk(e->worker, e->disk), "attach disk"))
            return -1;
        if (e->faults && e->faults->disk_eio > 0) {
            /* a second descriptor on the rank's file, to tear the writes the hook fails */
            e->torn_fd = open("kvtier-demo-disk.rank0", O_WRONLY | O_CLOEXEC);
            kvt_disk_set_fault(e->disk, disk_fault, e);
        }
    }
    kvt_offload_meta_init(&e->meta);
    kvt_offload_worker_meta_init(&e->wm);
    kvt_offload_worker_meta_init(&e->held);
    e->rng = seed ^ 0xfa017u;
    return 0;
}

/* Prometheus text of the host-tier run (manager + copy engine), kept for --metrics-port. */
static char *g_metrics;

char *kvt_demo_merge_metrics(const kvt_metrics_source *src, size_t n)
{
    size_t need = 0;
    if (kvt_metrics_merge(src, n, NULL, 0, &need) != KVT_ENOSPC)
        return NULL;
    char *t = malloc(need + 1);
    if (t && kvt_metrics_merge(src, n, t, need + 1, &need) != 0) {
        fprintf(stderr, "demo: metrics: %s\n", kvt_last_error());
        free(t);
        t = NULL;
    }
    return t;
}

static void snapshot_metrics(struct engine *e)
{
    char *off = NULL, *cp = NULL;
    KVT_DEMO_PROM_TEXT(kvt_offload_prometheus, e->off, off);
    KVT_DEMO_PROM_TEXT(kvt_copy_prometheus, kvt_worker_copy(e->worker), cp);
    free(g_metrics);
    g_metrics = NULL;
    if (off && cp) {
        kvt_metrics_source src[2] = {{off, strlen(off), NULL}, {cp, strlen(cp), "rank=\"0\""}};
        g_metrics = kvt_demo_merge_metrics(src, 2);
    }
    free(off);
    free(cp);
}

const char *kvt_demo_metrics(void)
{
    return g_metrics;
}

static int engine_close(struct engine *e, struct stats *st)
{
    /* after the last turn every block of every tier must be free again */
    st->leaked_blocks = GPU_BLOCKS - 1 - kvt_pool_num_free(e->gpu);
    int bad = st->leaked_blocks != 0;
    if (e->off) {
        if (!e->disk)
            snapshot_metrics(e);
        kvt_offload_stats os;
        kvt_offload_get_stats(e->off, &os);
        st->promoted = os.promotions;
        st->faults += __atomic_load_n(&e->fault_hits, __ATOMIC_RELAXED);
        st->preemptions += e->preemptions;
        st->delayed += e->delayed;
        st->leaked_blocks += os.host_used_blocks + os.disk_used_blocks;
        st->leaked_requests = os.requests;
        bad |= kvt_offload_has_pending(e->off) || os.host_used_blocks != 0 || os.requests != 0 ||
               os.disk_used_blocks != 0 || (os.promotions_failed != 0 && !e->faults);
        kvt_offload_destroy(e->off);
        kvt_offload_meta_release(&e->meta);
        kvt_offload_worker_meta_release(&e->wm);
        kvt_offload_worker_meta_release(&e->held);
        kvt_worker_destroy(e->worker);
        kvt_disk_destroy(e->disk);
        if (e->torn_fd >= 0)
            close(e->torn_fd);
        bad |= e->torn_failed != 0;
        kvt_layout_destroy(e->mlayout);
        kvt_mirror_destroy(e->mirror);
        kvt_layout_destroy(e->layout);
    }
    kvt_pool_destroy(e->gpu);
    free(e->device);
    return bad;
}

/* Runs the whole workload once; the same seed gives the same conversations. */
static int run_workload(uint64_t seed, int tiers, struct stats *st, double *secs,
                        const kvt_demo_faults *faults)
{
    struct engine e;
    memset(st, 0, sizeof(*st));
    if (engine_open(&e, seed, tiers, faults))
        return 1;
    uint64_t rng = seed;
    uint32_t sys_tok[N_SYSTEM][SYSTEM_TOK];
    for (uint32_t s = 0; s < N_SYSTEM; s++)
        for (uint32_t i = 0; i < SYSTEM_TOK; i++)
            sys_tok[s][i] = 1000 + kvt_rand_below(&rng, 30000);
    struct conv *convs = calloc(N_CONV, sizeof(*convs));
    if (!convs)
        return 1;
    for (uint32_t c = 0; c < N_CONV; c++) {
        snprintf(convs[c].id, sizeof(convs[c].id), "conv-%u", c);
        convs[c].sys = c % N_SYSTEM;
        memcpy(convs[c].tok, sys_tok[convs[c].sys], sizeof(sys_tok[0]));
        convs[c].len = SYSTEM_TOK;
    }
    double t0 = kvt_now_s();
    int bad = 0;
    for (uint32_t t = 0; t < N_TURNS && !bad; t++)
        for (uint32_t c = 0; c < N_CONV && !bad; c++)
            bad = run_turn(&e, &convs[c], &rng, st) != 0;
    *secs = kvt_now_s() - t0;
    free(convs);
    bad |= engine_close(&e, st);
    return bad || st->bad_blocks;
}

static int part_pool(uint64_t seed)
{
    struct stats a, b, c;
    double ta, tb, tc;
    int bad = run_workload(seed, TIER_GPU, &a, &ta, NULL);
    bad |= run_workload(seed, TIER_HOST, &b, &tb, NULL);
    bad |= run_workload(seed, TIER_DISK, &c, &tc, NULL);
    printf("1. A multi-turn chat workload on an engine's GPU tier (kvt_pool), then with a host "
           "tier (kvt_offload),\n   then with three tiers (a small host tier and a disk tier "
           "behind it, kvt_disk)\n");
    printf("   %u conversations x %u turns, %u shared %u-token system prompts; GPU tier %u "
           "blocks of %u tokens (%u KiB each here);\n   host tier %u blocks; three tiers: "
           "host %u blocks, disk %u slots\n",
           N_CONV, N_TURNS, N_SYSTEM, SYSTEM_TOK, GPU_BLOCKS - 1, BT, BLOCK_BYTES / 1024,
           HOST_BLOCKS - 1, SMALL_HOST - 1, DISK_SLOTS - 1);
    printf("                                          GPU only   + host tier   three tiers\n");
    printf("   prompt tokens                         %9llu   %11llu   %11llu\n",
           (unsigned long long)a.prompt_tokens, (unsigned long long)b.prompt_tokens,
           (unsigned long long)c.prompt_tokens);
    printf("   served by the GPU prefix cache        %9llu   %11llu   %11llu\n",
           (unsigned long long)a.gpu_hit_tokens, (unsigned long long)b.gpu_hit_tokens,
           (unsigned long long)c.gpu_hit_tokens);
    printf("   loaded from the host tier             %9s   %11llu   %11llu\n", "-",
           (unsigned long long)b.host_hit_tokens, (unsigned long long)c.host_hit_tokens);
    printf("     of which promoted from disk first   %9s   %11s   %11llu\n", "-", "-",
           (unsigned long long)(c.promoted * BT));
    printf("   recomputed although computed before   %9llu   %11llu   %11llu\n",
           (unsigned long long)a.recomputed, (unsigned long long)b.recomputed,
           (unsigned long long)c.recomputed);
    printf("   prefill tokens computed               %9llu   %11llu   %11llu\n",
           (unsigned long long)(a.prompt_tokens - a.gpu_hit_tokens),
           (unsigned long long)(b.prompt_tokens - b.gpu_hit_tokens - b.host_hit_tokens),
           (unsigned long long)(c.prompt_tokens - c.gpu_hit_tokens - c.host_hit_tokens));
    printf("   GPU blocks evicted                    %9llu   %11llu   %11llu\n",
           (unsigned long long)a.evictions, (unsigned long long)b.evictions,
           (unsigned long long)c.evictions);
    printf("   blocks stored / loaded: %llu / %llu (host tier), %llu / %llu (three tiers, %llu "
           "written back to disk)\n",
           (unsigned long long)b.stored_blocks, (unsigned long long)b.loaded_blocks,
           (unsigned long long)c.stored_blocks, (unsigned long long)c.loaded_blocks,
           (unsigned long long)c.written_back);
    printf("   %.1f MiB of loaded KV compared byte for byte: %llu mismatches\n",
           (double)(b.verified_bytes + c.verified_bytes) / (1 << 20),
           (unsigned long long)(b.bad_blocks + c.bad_blocks));
    printf("   bookkeeping for %llu turns: %.1f ms GPU only, %.1f ms with the host tier, %.1f ms "
           "with three tiers (copies and disk I/O included); pools end %s\n",
           (unsigned long long)a.turns, ta * 1e3, tb * 1e3, tc * 1e3,
           bad ? "WITH LEAKS" : "fully free");
    bad |= b.recomputed >= a.recomputed || b.loaded_blocks == 0;
    bad |= c.recomputed >= a.recomputed || c.promoted == 0 || c.written_back == 0;
    return bad;
}

static int part_meta(void)
{
    int bad = 0;
    kvt_offload_meta m, back;
    kvt_offload_meta_init(&m);
    kvt_offload_meta_init(&back);
    m.store_event = 7;
    for (uint32_t i = 0; i < 48; i++)
        bad |= check(kvt_offload_meta_add_store(&m, 100 + i, 5000 + i), "add_store");
    m.load_event = 3;
    for (uint32_t i = 0; i < 16; i++)
        bad |= check(kvt_offload_meta_add_load(&m, 300 + i, 7000 + i), "add_load");
    bad |= check(kvt_offload_meta_add_load_req(&m, 2, "conv-17-turn-3", 14), "add_load_req");
    bad |= check(kvt_offload_meta_add_load_req(&m, 3, "conv-4-turn-2", 13), "add_load_req");
    bad |= check(kvt_offload_meta_add_load_req(&m, 3, "conv-9-turn-2", 13), "add_load_req");
    size_t need = kvt_offload_meta_encoded_size(&m), len = 0;
    unsigned char *buf = malloc(need);
    bad |= !buf || check(kvt_offload_meta_encode(&m, buf, need, &len), "encode");
    bad |= check(kvt_offload_meta_decode(&back, buf, len), "decode");
    bool same = kvt_offload_meta_equal(&m, &back);
    bad |= !same;

    kvt_offload_worker_meta r0, r1;
    kvt_offload_worker_meta_init(&r0);
    kvt_offload_worker_meta_init(&r1);
    bad |= check(kvt_offload_worker_meta_add(&r0, 7, 1), "worker add");
    bad |= check(kvt_offload_worker_meta_add(&r1, 6, 1), "worker add");
    bad |= check(kvt_offload_worker_meta_add(&r1, 7, 1), "worker add");
    bad |= check(kvt_offload_worker_meta_aggregate(&r0, &r1), "aggregate");
    bool sum_ok =
        r0.stores.n_completed == 2 && r0.stores.events[1] == 7 && r0.stores.counts[1] == 2;
    bad |= !sum_ok;

    kvt_ec_worker_meta e0, e1, agg;
    kvt_ec_worker_meta_init(&e0);
    kvt_ec_worker_meta_init(&e1);
    kvt_ec_worker_meta_init(&agg);
    bad |= check(kvt_ec_worker_meta_add(&e0, KVT_EC_LOADED, "img-a", 5), "ec add");
    bad |= check(kvt_ec_worker_meta_add(&e0, KVT_EC_LOADED, "img-b", 5), "ec add");
    bad |= check(kvt_ec_worker_meta_add(&e1, KVT_EC_LOADED, "img-a", 5), "ec add");
    const kvt_ec_worker_meta *ranks[3] = {&e0, &e1, NULL};
    uint32_t contrib = 0;
    bad |= check(kvt_ec_worker_meta_aggregate_ranks(&agg, ranks, 3, &contrib), "ec aggregate");
    bool inter_ok = agg.loaded.n == 1 && contrib == 2;
    bad |= !inter_ok;

    printf("\n2. One step's metadata across the wire (kvt_meta)\n");
    printf("   offload metadata: store event 7 (48 blocks), load event 3 (16 blocks, 3 "
           "outstanding requests) -> %zu bytes, decoded %s\n",
           len, same ? "bit-exact" : "DIFFERENTLY");
    printf("   store reports of 2 ranks aggregated: event 7 count %u (world_size 2: now "
           "findable) %s\n",
           r0.stores.n_completed == 2 ? r0.stores.counts[1] : 0, sum_ok ? "ok" : "WRONG");
    printf("   encoder-cache 'loaded' of ranks {a,b} and {a}, plus a non-receiving stage: {%s} "
           "from %u reports %s\n",
           agg.loaded.n ? agg.loaded.items[0].ptr : "", contrib, inter_ok ? "ok" : "WRONG");
    free(buf);
    kvt_offload_meta_release(&m);
    kvt_offload_meta_release(&back);
    kvt_offload_worker_meta_release(&r0);
    kvt_offload_worker_meta_release(&r1);
    kvt_ec_worker_meta_release(&e0);
    kvt_ec_worker_meta_release(&e1);
    kvt_ec_worker_meta_release(&agg);
    return bad;
}

int kvt_demo_run(uint64_t seed)
{
    printf("kvtier %s demo (seed %llu)\n\n", kvt_version(), (unsigned long long)seed);
    int bad = part_pool(seed);
    bad |= part_meta();
    char *ec_metrics = NULL;
    bad |= kvt_demo_ec(seed, &ec_metrics);
    if (ec_metrics && g_metrics) { /* /metrics serves both */
        kvt_metrics_source src[2] = {{g_metrics, strlen(g_metrics), NULL},
                                     {ec_metrics, strlen(ec_metrics), NULL}};
        char *both = kvt_demo_merge_metrics(src, 2);
        if (both) {
            free(g_metrics);
            g_metrics = both;
        }
    }
    free(ec_metrics);
    printf("\nThe reference engine with and without kvtier, with an encoder process over UCX: "
           "`kvtier demo` (docs/demo.md).\n");
    printf("\n%s\n", bad ? "demo: FAILED (see above)" : "demo: all checks passed");
    return bad ? 1 : 0;
}

/* ---- soak ---------------------------------------------------------------------------------- */

/* The soak's faults make the library warn thousands of times: the lines are counted (errors
 * still go to stderr) and the count printed in the summary; KVTIER_LOG=warn shows them. */
static uint64_t g_warnings;

static void soak_log(void *ctx, int level, const char *line)
{
    (void)ctx;
    if (level <= KVT_LOG_ERROR)
        fprintf(stderr, "%s\n", line);
    else
        __atomic_fetch_add(&g_warnings, 1, __ATOMIC_RELAXED);
}

int kvt_demo_soak(uint64_t seed, double seconds)
{
    const kvt_demo_faults f = {.disk_eio = 0.01,
                               .reset = 0.02,
                               .delay_report = 0.05,
                               .preempt = 0.05,
                               .ec_write_fail = 0.05,
                               .ec_lost_event = 0.02};
    bool quiet = getenv("KVTIER_LOG") == NULL;
    if (quiet)
        kvt_log_set_handler(soak_log, NULL);
    printf("kvtier %s soak: %.0f s, seed %llu\n  faults: disk reads and writes failing (EIO) "
           "%.0f%%, prefix-cache resets after %.0f%% of turns,\n  worker reports delayed and "
           "reordered %.0f%%, preemption flushes %.0f%% of steps,\n  encoder-cache writes "
           "failing %.0f%%, readiness events lost %.0f%%; every 8th round a producer process\n"
           "  killed mid-push half the time\n",
           kvt_version(), seconds, (unsigned long long)seed, f.disk_eio * 100, f.reset * 100,
           f.delay_report * 100, f.preempt * 100, f.ec_write_fail * 100, f.ec_lost_event * 100);
    fflush(stdout);
    double t0 = kvt_now_s();
    struct stats tot = {0};
    kvt_demo_ec_result ect = {0};
    uint64_t rounds = 0, failed_rounds = 0, leaked_bytes = 0;
    kvt_ec_net_soak nt = {0}; /* the network rounds */
    uint64_t net_rounds = 0;
    while (kvt_now_s() - t0 < seconds) {
        uint64_t s = seed * 1000003u + rounds++;
        /* KV offload, three tiers: every loaded block verified, every tier free at the end */
        struct stats st;
        double secs;
        int r = run_workload(s, TIER_DISK, &st, &secs, &f);
        tot.turns += st.turns;
        tot.recovered += st.recovered;
        tot.faults += st.faults;
        tot.resets += st.resets;
        tot.delayed += st.delayed;
        tot.preemptions += st.preemptions;
        tot.bad_blocks += st.bad_blocks;
        tot.stuck += st.stuck;
        tot.leaked_blocks += st.leaked_blocks;
        tot.leaked_requests += st.leaked_requests;
        tot.verified_bytes += st.verified_bytes;
        leaked_bytes += st.leaked_blocks * BLOCK_BYTES;
        /* encoder cache: every served embedding verified, no writer or byte left behind */
        kvt_demo_ec_result er = {0};
        int q = kvt_demo_ec_run(s, &f, &er, NULL, false);
        ect.served += er.served;
        ect.failed += er.failed;
        ect.write_faults += er.write_faults;
        ect.lost_events += er.lost_events;
        ect.mismatches += er.mismatches;
        ect.stuck += er.stuck;
        ect.writers_left += er.writers_left;
        ect.pending_pushes |= er.pending_pushes;
        ect.verified_bytes += er.verified_bytes;
        leaked_bytes += er.leaked_bytes;
        /* every 8th round: the encoder cache across processes, a producer killed mid-push */
        int w = 0;
        if (rounds % 8 == 1) {
            kvt_ec_net_soak one;
            w = kvt_ec_net_soak_round(s, &one);
            if (w < 0)
                fprintf(stderr, "soak: network round: %s\n", kvt_last_error());
            nt.items_checked += one.items_checked;
            nt.corrupt += one.corrupt;
            nt.bytes += one.bytes;
            nt.killed += one.killed;
            nt.reaped += one.reaped;
            nt.writers_left += one.writers_left;
            leaked_bytes += one.leaked_bytes;
            net_rounds++;
        }
        if (r || q || w) {
            failed_rounds++;
            fprintf(stderr, "soak: round %llu (seed %llu) failed: %s%s%s\n",
                    (unsigned long long)rounds - 1, (unsigned long long)s, r ? "offload " : "",
                    q ? "encoder-cache " : "", w ? "network" : "");
        }
    }
    if (quiet)
        kvt_log_set_handler(NULL, NULL);
    uint64_t corrupt = tot.bad_blocks + ect.mismatches + nt.corrupt;
    uint64_t stuck = tot.stuck + ect.stuck + ect.pending_pushes;
    uint64_t leaked = tot.leaked_blocks + tot.leaked_requests + ect.writers_left + nt.writers_left;
    uint64_t faults = tot.faults + tot.resets + tot.delayed + tot.preemptions + ect.write_faults +
                      ect.lost_events + nt.killed;
    printf("soak: %llu rounds in %.0f s, %llu faults injected\n", (unsigned long long)rounds,
           kvt_now_s() - t0, (unsigned long long)faults);
    printf("  KV offload (GPU, host, disk): %llu turns served; %llu disk I/O errors, %llu resets, "
           "%llu delayed reports, %llu preemption flushes; %llu blocks recomputed after a "
           "failed load\n",
           (unsigned long long)tot.turns, (unsigned long long)tot.faults,
           (unsigned long long)tot.resets, (unsigned long long)tot.delayed,
           (unsigned long long)tot.preemptions, (unsigned long long)tot.recovered);
    printf("  encoder cache: %llu requests served, %llu failed (retryable); %llu failed writes, "
           "%llu lost events\n",
           (unsigned long long)ect.served, (unsigned long long)ect.failed,
           (unsigned long long)ect.write_faults, (unsigned long long)ect.lost_events);
    printf("  encoder cache across processes (ZeroMQ + UCX): %llu rounds, %llu items checked; "
           "%llu producers killed mid-push, %llu of their writers reaped\n",
           (unsigned long long)net_rounds, (unsigned long long)nt.items_checked,
           (unsigned long long)nt.killed, (unsigned long long)nt.reaped);
    printf("  verified byte for byte: %.2f GiB; library warnings: %llu\n",
           (double)(tot.verified_bytes + ect.verified_bytes + nt.bytes) / (1 << 30),
           (unsigned long long)__atomic_load_n(&g_warnings, __ATOMIC_RELAXED));
    printf("  corrupt blocks or embeddings: %llu\n  leaked blocks: %llu, leaked bytes: %llu, "
           "leaked requests or writers: %llu\n  stuck requests or pushes: %llu\n",
           (unsigned long long)corrupt, (unsigned long long)tot.leaked_blocks,
           (unsigned long long)leaked_bytes,
           (unsigned long long)(tot.leaked_requests + ect.writers_left), (unsigned long long)stuck);
    bool bad = failed_rounds || corrupt || leaked || leaked_bytes || stuck || rounds == 0;
    printf("%s\n", bad ? "soak: FAILED" : "soak: all checks passed");
    return bad ? 1 : 0;
}
