/* SPDX-License-Identifier: Apache-2.0 */
/*
 * KV offload across processes, world_size = 2: this process runs the scheduler (a GPU pool,
 * the offload manager and a scripted engine), two forked processes run one worker each
 * (their "device" is host memory, CPU copy backend), and they talk over ZeroMQ ipc:// through
 * kvt_link. The script stores prompts until the host tier evicts, loads prefixes back,
 * preempts while copies are in flight, resets and starts over.
 *
 * The engine's forward is played by the workers: each step's payload lists the device blocks
 * the engine "computed" (the worker fills them with bytes derived from its rank, the block's
 * hash and the offset before launching the step's copies) and the blocks each load must
 * produce; when a load's request is reported finished, the worker checks every byte of every
 * region of those blocks and fails the step on the first mismatch. At the end each worker
 * writes how many blocks it verified; the test requires that every expected block was.
 *
 * Three modes: the tier in host memory, on each worker's disk file (disk as the tier), and
 * three tiers (host memory backed by the disk file: write-backs and promotions, so loads
 * also bring back blocks the host tier evicted).
 */
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "kvt_test.h"
#include "base/error.h"
#include "kvtier/disk.h"
#include "offload/sim.h"

#define WORLD       2
#define GPU_BLOCKS  96
#define HOST_BLOCKS 40
#define KV_BPB      4096 /* K and V regions */
#define MLA_BPB     1000 /* a third region with another block size */
/* The link's waits are hang guards, not expectations: in the coverage build (-O0, atomic
 * counters) beside two CPU hogs, the workers' start (the copy kernels' calibration, twice at
 * once) kept the first hello more than 30 s away (issue 36: the parallel coverage run failed,
 * its rerun passed). ctest stops the test at 600 s. */
#define TIMEOUT_MS 300000
#define N_PROMPTS  14

#define DISK_SLOTS 128 /* three tiers: every prompt fits on disk */

enum { MODE_HOST, MODE_DISK, MODE_THREE };
static char g_dir[64];
static int g_mode;
static pid_t g_pids[WORLD]; /* the worker processes not yet reaped (reap_workers) */

/* Rank 1's disk cannot write slot 7: every store event (three tiers: write-back) that uses
 * it fails on that rank. */
static int fail_slot_7(void *ctx, int dir, uint32_t slot, int res)
{
    (void)ctx;
    return dir == KVT_COPY_STORE && slot == 7 ? -EIO : res;
}

static unsigned char kv_byte(uint32_t rank, uint64_t tag, uint32_t region, uint64_t off)
{
    uint64_t x =
        tag ^ ((uint64_t)rank << 56) ^ ((uint64_t)region << 48) ^ off * 0x9E3779B97F4A7C15ull;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    return (unsigned char)(x >> 40);
}

static uint64_t block_tag(const sim_req *r, uint32_t b)
{
    uint64_t t;
    memcpy(&t, r->hashes + b * KVT_BLOCK_HASH_LEN, sizeof(t));
    return t;
}

/* ---- worker process ----------------------------------------------------------------------- */

typedef struct expect {
    char id[32];
    uint32_t block;
    uint64_t tag;
} expect;

typedef struct wproc {
    uint32_t rank;
    unsigned char *kv, *mla;
    kvt_layout *layout;
    kvt_mirror *mirror;
    kvt_layout *mlayout; /* three tiers: the mirror's host arrays, the disk's layout */
    kvt_disk *disk;
    kvt_worker *w;
    kvt_link_worker *link;
    expect ex[4096];
    uint32_t n_ex;
    uint64_t verified;
} wproc;

static unsigned char *region_ptr(wproc *p, uint32_t region, uint32_t block)
{
    if (region < 2)
        return p->kv + ((size_t)region * GPU_BLOCKS + block) * KV_BPB;
    return p->mla + (size_t)block * MLA_BPB;
}

static uint64_t region_bpb(uint32_t region)
{
    return region < 2 ? KV_BPB : MLA_BPB;
}

static void compute_block(wproc *p, uint32_t block, uint64_t tag)
{
    for (uint32_t r = 0; r < 3; r++) {
        unsigned char *d = region_ptr(p, r, block);
        for (uint64_t o = 0; o < region_bpb(r); o++)
            d[o] = kv_byte(p->rank, tag, r, o);
    }
}

static int verify_block(wproc *p, uint32_t block, uint64_t tag)
{
    for (uint32_t r = 0; r < 3; r++) {
        const unsigned char *d = region_ptr(p, r, block);
        for (uint64_t o = 0; o < region_bpb(r); o++)
            if (d[o] != kv_byte(p->rank, tag, r, o))
                return kvt_fail(KVT_EIO, "rank %u: block %u region %u byte %llu differs", p->rank,
                                block, r, (unsigned long long)o);
    }
    p->verified++;
    return 0;
}

static uint32_t rd32(const unsigned char **q)
{
    uint32_t v;
    memcpy(&v, *q, 4);
    *q += 4;
    return v;
}

static uint64_t rd64(const unsigned char **q)
{
    uint64_t v;
    memcpy(&v, *q, 8);
    *q += 8;
    return v;
}

/* Payload: u32 n_compute, {u32 block, u64 tag}; u32 n_expect, {u8 len, id, u32 block, u64 tag} */
static void apply_payload(wproc *p, const unsigned char *q)
{
    uint32_t n = rd32(&q);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t b = rd32(&q);
        compute_block(p, b, rd64(&q));
    }
    n = rd32(&q);
    for (uint32_t i = 0; i < n && p->n_ex < 4096; i++) {
        expect *e = &p->ex[p->n_ex++];
        uint8_t len = *q++;
        memcpy(e->id, q, len);
        e->id[len] = 0;
        q += len;
        e->block = rd32(&q);
        e->tag = rd64(&q);
    }
}

static int verify_finished(wproc *p, const kvt_str *reqs, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t k = 0; k < p->n_ex;) {
            expect *e = &p->ex[k];
            if (strlen(e->id) == reqs[i].len && memcmp(e->id, reqs[i].ptr, reqs[i].len) == 0) {
                int rc = verify_block(p, e->block, e->tag);
                if (rc)
                    return rc;
                *e = p->ex[--p->n_ex];
            } else {
                k++;
            }
        }
    return 0;
}

static int worker_main(uint32_t rank, const char *endpoint)
{
    static wproc p;
    p.rank = rank;
    p.kv = calloc(2 * GPU_BLOCKS, KV_BPB);
    p.mla = calloc(GPU_BLOCKS, MLA_BPB);
    if (kvt_layout_create(KVT_HOST_DEVICE, GPU_BLOCKS, &p.layout))
        return 10;
    /* FlashAttention-style (2, blocks, ...) K/V tensor seen by two layers, and an MLA one */
    kvt_kv_tensor kv = {KVT_HOST_DEVICE, (uint64_t)(uintptr_t)p.kv, 2ull * GPU_BLOCKS * KV_BPB,
                        GPU_BLOCKS, KV_BPB};
    kvt_kv_tensor mla = {KVT_HOST_DEVICE, (uint64_t)(uintptr_t)p.mla,
                         (uint64_t)GPU_BLOCKS * MLA_BPB, GPU_BLOCKS, MLA_BPB};
    if (kvt_layout_add_tensor(p.layout, &kv) || kvt_layout_add_tensor(p.layout, &kv) ||
        kvt_layout_add_tensor(p.layout, &mla) || kvt_layout_num_regions(p.layout) != 3)
        return 11;
    uint32_t host_blocks = HOST_BLOCKS - 2 * rank; /* ranks allocate different sizes */
    kvt_worker_config wc;
    kvt_worker_config_init(&wc);
    wc.rank = rank;
    wc.copy.threads = 2;
    wc.copy.chunk_bytes = 4096;
    if (g_mode != MODE_DISK) {
        kvt_mirror_config mc;
        kvt_mirror_config_init(&mc);
        mc.host_blocks = host_blocks;
        if (kvt_mirror_create(&mc, p.layout, &p.mirror) ||
            kvt_worker_create(&wc, p.layout, p.mirror, &p.w))
            return 12;
    }
    if (g_mode != MODE_HOST) {
        char base[128];
        snprintf(base, sizeof(base), "%s/kv", g_dir);
        kvt_disk_config dc;
        kvt_disk_config_init(&dc);
        dc.path = base;
        dc.rank = rank;
        dc.queue_depth = 4;
        uint32_t slots = g_mode == MODE_DISK ? host_blocks : DISK_SLOTS;
        const kvt_layout *dl = p.layout;
        if (g_mode == MODE_THREE && kvt_mirror_layout(p.mirror, &p.mlayout))
            return 18;
        if (g_mode == MODE_THREE)
            dl = p.mlayout;
        uint64_t bpb = 2 * KV_BPB + MLA_BPB;
        dc.capacity_bytes = slots * ((bpb + 4095) / 4096 * 4096);
        int rc = kvt_disk_create(&dc, dl, &p.disk);
        if (rc == KVT_ESYS && strstr(kvt_last_error(), "O_DIRECT")) {
            dc.page_cache = true;
            dc.capacity_bytes = slots * bpb;
            rc = kvt_disk_create(&dc, dl, &p.disk);
        }
        if (rc || kvt_disk_num_slots(p.disk) != slots)
            return 16;
        if (rank == 1)
            kvt_disk_set_fault(p.disk, fail_slot_7, NULL);
        rc = g_mode == MODE_DISK ? kvt_worker_create_disk(&wc, p.layout, p.disk, &p.w)
                                 : kvt_worker_attach_disk(p.w, p.disk);
        if (rc)
            return 17;
    }
    if (kvt_link_worker_create(endpoint, rank, WORLD, host_blocks, &p.link))
        return 12;
    kvt_offload_meta meta;
    kvt_offload_meta_init(&meta);
    kvt_offload_worker_meta wm;
    kvt_offload_worker_meta_init(&wm);
    uint32_t invalid[256];
    for (;;) {
        const void *payload;
        size_t len;
        bool stop;
        int rc = kvt_link_worker_recv(p.link, TIMEOUT_MS, &meta, &payload, &len, &stop);
        if (rc) {
            fprintf(stderr, "worker %u: %s\n", rank, kvt_last_error());
            return 13;
        }
        if (stop)
            break;
        const kvt_str *fin = NULL;
        uint32_t n_fin = 0, n_inv = 0;
        rc = kvt_worker_bind(p.w, &meta);
        if (!rc)
            rc = kvt_worker_handle_preemptions(p.w);
        if (!rc)
            apply_payload(&p, payload); /* the forward */
        if (!rc)
            rc = kvt_worker_get_finished(p.w, NULL, &fin, &n_fin);
        if (!rc)
            rc = verify_finished(&p, fin, n_fin);
        if (!rc)
            rc = kvt_worker_build_meta(p.w, &wm);
        if (!rc)
            n_inv = kvt_worker_take_invalid_blocks(p.w, invalid, 256);
        rc =
            kvt_link_worker_reply(p.link, rc, rc ? NULL : fin, rc ? 0 : n_fin, &wm, invalid, n_inv);
        kvt_worker_clear(p.w);
        if (rc)
            return 14;
    }
    char path[128];
    snprintf(path, sizeof(path), "%s/verified-%u", g_dir, rank);
    FILE *f = fopen(path, "w");
    if (!f)
        return 15;
    fprintf(f, "%llu %u\n", (unsigned long long)p.verified, p.n_ex);
    fclose(f);
    kvt_link_worker_destroy(p.link);
    kvt_worker_destroy(p.w);
    kvt_disk_destroy(p.disk);
    kvt_layout_destroy(p.mlayout);
    kvt_mirror_destroy(p.mirror);
    kvt_layout_destroy(p.layout);
    kvt_offload_meta_release(&meta);
    kvt_offload_worker_meta_release(&wm);
    free(p.kv);
    free(p.mla);
    return 0;
}

/* ---- scheduler process -------------------------------------------------------------------- */

typedef struct engine {
    sim s;
    kvt_link_sched *link;
    unsigned char payload[1 << 16];
    unsigned char *computes, *expects;
    uint32_t n_computes, n_expects;
    unsigned char cbuf[1 << 15], ebuf[1 << 15];
    uint64_t expected_verified;
    uint32_t steps;
    kvt_offload_stats stats;
} engine;

static void wr32(unsigned char **q, uint32_t v)
{
    memcpy(*q, &v, 4);
    *q += 4;
}

static void wr64(unsigned char **q, uint64_t v)
{
    memcpy(*q, &v, 8);
    *q += 8;
}

/* The engine computed r's tokens up to `to`: its workers write those blocks next step. */
static void compute(engine *e, sim_req *r, uint32_t to)
{
    for (uint32_t b = r->computed / SIM_BS; b < (to + SIM_BS - 1) / SIM_BS && b < r->n_blocks;
         b++) {
        wr32(&e->computes, r->blocks[b]);
        wr64(&e->computes, block_tag(r, b));
        e->n_computes++;
    }
    sim_compute(&e->s, r, to);
}

/* r's accepted host hit is being loaded: the workers must find these blocks. */
static void expect_load(engine *e, sim_req *r)
{
    for (uint32_t b = r->gpu_hit / SIM_BS; b < (r->gpu_hit + r->ext) / SIM_BS; b++) {
        uint8_t len = (uint8_t)strlen(r->id);
        *e->expects++ = len;
        memcpy(e->expects, r->id, len);
        e->expects += len;
        wr32(&e->expects, r->blocks[b]);
        wr64(&e->expects, block_tag(r, b));
        e->n_expects++;
        e->expected_verified += WORLD;
    }
}

/* One engine step through the link; returns the requests whose load finished. */
static uint32_t step(engine *e, bool preempted, kvt_str *fin_out, uint32_t cap)
{
    sim_build(&e->s, preempted);
    unsigned char *q = e->payload;
    wr32(&q, e->n_computes);
    memcpy(q, e->cbuf, (size_t)(e->computes - e->cbuf));
    q += e->computes - e->cbuf;
    wr32(&q, e->n_expects);
    memcpy(q, e->ebuf, (size_t)(e->expects - e->ebuf));
    q += e->expects - e->ebuf;
    e->computes = e->cbuf;
    e->expects = e->ebuf;
    e->n_computes = e->n_expects = 0;
    kvt_link_result res;
    KVT_OK_(kvt_link_sched_step(e->link, &e->s.meta, e->payload, (size_t)(q - e->payload),
                                TIMEOUT_MS, &res));
    assert_int_equal(res.n_invalid, 0);
    KVT_OK_(kvt_offload_apply_output(e->s.m, res.finished_loads, res.n_finished, res.stores));
    uint32_t n = res.n_finished < cap ? res.n_finished : cap;
    if (n)
        memcpy(fin_out, res.finished_loads, n * sizeof(kvt_str));
    e->steps++;
    return res.n_finished;
}

/* Waiting for workers in other processes: the loops below step until a condition holds, under
 * the tests' one deadline (kvt_wait; under two CPU hogs a fixed 2,000 steps of 200 us ran out
 * in issue 36, and a fixed 5,000 reset attempts in issue 56). */
static void drain(engine *e)
{
    kvt_str fin[8];
    kvt_wait w = kvt_wait_start();
    while (kvt_offload_has_pending(e->s.m) && kvt_wait_more(&w))
        step(e, false, fin, 8);
    assert_false(kvt_offload_has_pending(e->s.m));
}

/* Prompt i: 5 full blocks plus a partial one; prompts share a 2-block prefix by pairs. */
static void make_prompt(sim_req *r, uint32_t i, uint32_t gen)
{
    char id[32];
    snprintf(id, sizeof(id), "g%u-p%u", gen, i);
    sim_req_make(r, id, 5 * SIM_BS + 3, 1000 * gen + i / 2, 2 * SIM_BS, 100 * gen + i);
}

static void store_prompt(engine *e, sim_req *r)
{
    kvt_str fin[8];
    sim_admit(&e->s, r, 0);
    sim_schedule(&e->s, r, r->n_tokens, false);
    step(e, false, fin, 8);
    compute(e, r, r->n_tokens);
    sim_schedule(&e->s, r, 1, false);
    step(e, false, fin, 8);
    sim_finish(&e->s, r);
}

/* Admits r taking its whole host hit, steps until its load finished (workers verify), then
 * computes the rest and finishes it. Returns the host hit in tokens. */
static uint32_t load_prompt(engine *e, sim_req *r, bool preempt_midway)
{
    uint32_t hit = sim_admit(&e->s, r, UINT32_MAX);
    if (r->ext)
        expect_load(e, r);
    bool done = r->ext == 0, first = true;
    kvt_wait w = kvt_wait_start();
    while (!done && (first || kvt_wait_more(&w))) {
        kvt_str fin[16];
        uint32_t n = step(e, preempt_midway && first, fin, 16);
        first = false;
        for (uint32_t k = 0; k < n; k++)
            if (fin[k].len == strlen(r->id) && memcmp(fin[k].ptr, r->id, fin[k].len) == 0)
                done = true;
    }
    assert_true(done);
    r->computed += r->ext;
    compute(e, r, r->n_tokens);
    sim_schedule(&e->s, r, 1, false);
    kvt_str fin[8];
    step(e, false, fin, 8);
    sim_finish(&e->s, r);
    return hit;
}

static void run_scheduler(engine *e, const char *endpoint)
{
    KVT_OK_(kvt_link_sched_create(endpoint, WORLD, &e->link));
    uint32_t host_blocks;
    KVT_OK_(kvt_link_sched_accept(e->link, TIMEOUT_MS, &host_blocks));
    assert_int_equal(host_blocks, HOST_BLOCKS - 2 * (WORLD - 1));
    sim_init3(&e->s, GPU_BLOCKS, HOST_BLOCKS, false, WORLD, 8192,
              g_mode == MODE_THREE ? DISK_SLOTS : 0);
    KVT_OK_(kvt_offload_lower_host_blocks(e->s.m, host_blocks));
    e->computes = e->cbuf;
    e->expects = e->ebuf;

    static sim_req reqs[N_PROMPTS];
    for (uint32_t gen = 0; gen < 2; gen++) {
        /* stores: 14 prompts x 5 full blocks (pairs share 2) > 38 host blocks: evictions */
        for (uint32_t i = 0; i < N_PROMPTS; i++) {
            make_prompt(&reqs[i], i, gen);
            store_prompt(e, &reqs[i]);
            /* a tier block stays pinned until its copy landed (the host store; three tiers:
             * the write-back; the disk as the tier: the store itself), so on a slow run
             * (ThreadSanitizer, a coverage build, or a loaded machine: the demo tests beside
             * it) stores found no evictable block and were dropped instead of evicting, in
             * every mode (a coverage CI run failed this way in host mode); letting each
             * prompt's copies land makes the evictions certain */
            drain(e);
        }
        drain(e);
        kvt_offload_stats st;
        kvt_offload_get_stats(e->s.m, &st);
        assert_true(st.host_evictions > 0);
        /* the GPU forgets everything, so hits come from the host tier */
        KVT_OK_(kvt_pool_reset_prefix_cache(e->s.gpu));
        uint32_t hits = 0;
        /* (three tiers: the older half too, which only the disk still holds) */
        uint32_t lowest = g_mode == MODE_THREE ? 0 : N_PROMPTS / 2;
        for (uint32_t i = N_PROMPTS; i-- > lowest;) {
            sim_req again;
            make_prompt(&again, i, gen);
            snprintf(again.id, sizeof(again.id), "g%u-load%u", gen, i);
            hits += load_prompt(e, &again, i % 3 == 0) > 0;
        }
        assert_true(hits >= 4);
        drain(e);
        /* a reset while copies are in flight: "not yet" until they complete */
        sim_req extra;
        make_prompt(&extra, 99, gen);
        sim_admit(&e->s, &extra, 0);
        compute(e, &extra, extra.n_tokens);
        sim_schedule(&e->s, &extra, 1, false);
        kvt_str fin[8];
        step(e, true, fin, 8);
        sim_finish(&e->s, &extra);
        int rc;
        kvt_wait w = kvt_wait_start();
        while ((rc = kvt_offload_reset(e->s.m)) == KVT_EBUSY && kvt_wait_more(&w))
            step(e, false, fin, 8);
        KVT_OK_(rc);
        KVT_OK_(kvt_pool_reset_prefix_cache(e->s.gpu));
        /* after the reset nothing is found */
        sim_req gone;
        make_prompt(&gone, 0, gen);
        snprintf(gone.id, sizeof(gone.id), "g%u-gone", gen);
        assert_int_equal(load_prompt(e, &gone, false), 0);
        drain(e);
    }
    kvt_offload_get_stats(e->s.m, &e->stats);
    KVT_OK_(kvt_link_sched_stop(e->link));
}

/* The scheduler side of the current test (a static: too large for the stack). */
static engine g_engine;

static void run_procs(int mode)
{
    g_mode = mode;
    /* in the working directory (the build tree): a disk tier needs a real file system */
    snprintf(g_dir, sizeof(g_dir), "kvt-procs-XXXXXX");
    assert_non_null(mkdtemp(g_dir));
    char endpoint[128];
    snprintf(endpoint, sizeof(endpoint), "ipc://%s/link", g_dir);
    for (uint32_t r = 0; r < WORLD; r++) {
        pid_t p = fork();
        assert_true(p >= 0);
        if (p == 0)
            _exit(worker_main(r, endpoint));
        g_pids[r] = p;
    }
    engine *e = &g_engine;
    run_scheduler(e, endpoint);
    for (uint32_t r = 0; r < WORLD; r++) {
        int status;
        assert_int_equal(waitpid(g_pids[r], &status, 0), g_pids[r]);
        g_pids[r] = 0;
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 0);
    }
    uint64_t total = 0;
    for (uint32_t r = 0; r < WORLD; r++) {
        char path[128];
        snprintf(path, sizeof(path), "%s/verified-%u", g_dir, r);
        FILE *f = fopen(path, "r");
        assert_non_null(f);
        unsigned long long v;
        unsigned left;
        assert_int_equal(fscanf(f, "%llu %u", &v, &left), 2);
        fclose(f);
        assert_int_equal(left, 0);
        total += v;
        unlink(path);
    }
    const char *names[] = {"host tier", "disk tier", "three tiers"};
    printf("# %s: %u steps, %llu blocks verified byte for byte across %u workers, %llu stored "
           "blocks failed; %llu promoted from disk, %llu written back (%llu failed)\n",
           names[mode], e->steps, (unsigned long long)total, WORLD,
           (unsigned long long)e->stats.stores_failed, (unsigned long long)e->stats.promotions,
           (unsigned long long)e->stats.disk_stores_completed,
           (unsigned long long)e->stats.disk_stores_failed);
    assert_true(total > 0);
    assert_int_equal(total, e->expected_verified);
    /* a failed write on one rank fails the event everywhere: never findable */
    if (mode == MODE_DISK)
        assert_true(e->stats.stores_failed > 0);
    else
        assert_int_equal(e->stats.stores_failed, 0);
    if (mode == MODE_THREE) { /* loads came back from disk; slot 7's write-backs failed */
        assert_true(e->stats.promotions > 0);
        assert_int_equal(e->stats.promotions_failed, 0);
        assert_true(e->stats.disk_stores_failed > 0);
    }
    kvt_link_sched_destroy(e->link);
    sim_fini(&e->s);
    memset(e, 0, sizeof(*e));
    rmdir(g_dir);
}

/* After each test, whether it passed or failed mid-way: workers still running are killed (a
 * scheduler that failed an assertion would leave them waiting on the link for TIMEOUT_MS, and
 * the next test would start beside them), the link and the engine are let go. */
static int reap_workers(void **state)
{
    (void)state;
    for (uint32_t r = 0; r < WORLD; r++)
        if (g_pids[r] > 0) {
            kill(g_pids[r], SIGKILL);
            waitpid(g_pids[r], NULL, 0);
            g_pids[r] = 0;
        }
    if (g_engine.link) {
        kvt_link_sched_destroy(g_engine.link);
        sim_fini(&g_engine.s);
        memset(&g_engine, 0, sizeof(g_engine));
    }
    return 0;
}

static void test_two_workers_over_ipc(void **state)
{
    (void)state;
    run_procs(MODE_HOST);
}

/* The same script with each worker's tier on its own disk file; rank 1 cannot write one
 * slot, so some store events fail there and must never become findable. */
static void test_two_disk_workers_over_ipc(void **state)
{
    (void)state;
    run_procs(MODE_DISK);
}

/* Three tiers: the host tier in memory, backed by each worker's disk file. Loads after the
 * host tier evicted come back through promotions, verified byte for byte; rank 1 cannot
 * write one slot, so the write-backs using it fail and are never found. */
static void test_two_three_tier_workers_over_ipc(void **state)
{
    (void)state;
    run_procs(MODE_THREE);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_two_workers_over_ipc, reap_workers),
        cmocka_unit_test_teardown(test_two_disk_workers_over_ipc, reap_workers),
        cmocka_unit_test_teardown(test_two_three_tier_workers_over_ipc, reap_workers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
