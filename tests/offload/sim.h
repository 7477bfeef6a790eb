/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A minimal engine around kvt_offload for tests: a GPU pool with prefix caching, requests with
 * real chained hashes and block tables, and workers that "complete" events on demand. Each
 * helper does what an engine's scheduler does at that hook, nothing more.
 */
#ifndef KVT_TEST_OFFLOAD_SIM_H
#define KVT_TEST_OFFLOAD_SIM_H

#include "kvt_test.h"
#include "kvtier/worker.h"

#define SIM_BS      16
#define SIM_MAX_BLK 64
#define SIM_SEED    7

typedef struct sim_req {
    char id[32];
    uint32_t n_tokens;
    uint32_t tokens[SIM_MAX_BLK * SIM_BS];
    uint8_t hashes[SIM_MAX_BLK * KVT_BLOCK_HASH_LEN];
    uint32_t n_hashes;
    uint32_t blocks[SIM_MAX_BLK]; /* GPU block table (one group) */
    uint32_t n_blocks;
    uint32_t gpu_hit, ext; /* tokens */
    uint32_t computed;     /* tokens whose KV is in its GPU blocks */
} sim_req;

typedef struct sim {
    kvt_pool *gpu;
    kvt_offload *m;
    kvt_offload_meta meta;
    kvt_offload_worker_meta wm;
} sim;

/* A GPU pool of gpu_blocks and a manager created with oc. */
static inline void sim_init_cfg(sim *s, uint32_t gpu_blocks, const kvt_offload_config *oc)
{
    kvt_pool_config pc;
    kvt_pool_config_init(&pc);
    pc.num_blocks = gpu_blocks;
    pc.keys_per_block = 4;
    KVT_OK_(kvt_pool_create(&pc, &s->gpu));
    KVT_OK_(kvt_offload_create(oc, s->gpu, &s->m));
    kvt_offload_meta_init(&s->meta);
    kvt_offload_worker_meta_init(&s->wm);
}

/* disk_blocks > 0: three tiers; event_capacity 0: events off */
static inline void sim_init_ev(sim *s, uint32_t gpu_blocks, uint32_t host_blocks, bool lazy,
                               uint32_t world, uint32_t max_batched, uint32_t disk_blocks,
                               uint32_t event_capacity)
{
    kvt_offload_config oc;
    kvt_offload_config_init(&oc);
    oc.host_blocks = host_blocks;
    oc.lazy = lazy;
    oc.world_size = world;
    oc.max_batched_tokens = max_batched;
    oc.event_capacity = event_capacity;
    oc.block_bytes = 1000;
    oc.disk_blocks = disk_blocks;
    sim_init_cfg(s, gpu_blocks, &oc);
}

static inline void sim_init3(sim *s, uint32_t gpu_blocks, uint32_t host_blocks, bool lazy,
                             uint32_t world, uint32_t max_batched, uint32_t disk_blocks)
{
    sim_init_ev(s, gpu_blocks, host_blocks, lazy, world, max_batched, disk_blocks, 256);
}

static inline void sim_init(sim *s, uint32_t gpu_blocks, uint32_t host_blocks, bool lazy,
                            uint32_t world, uint32_t max_batched)
{
    sim_init3(s, gpu_blocks, host_blocks, lazy, world, max_batched, 0);
}

static inline void sim_fini(sim *s)
{
    kvt_offload_destroy(s->m);
    kvt_pool_destroy(s->gpu);
    kvt_offload_meta_release(&s->meta);
    kvt_offload_worker_meta_release(&s->wm);
}

/* A prompt of n tokens whose first `shared` tokens are those of prefix seed `p`. */
static inline void sim_req_make(sim_req *r, const char *id, uint32_t n, uint32_t p, uint32_t shared,
                                uint32_t own)
{
    memset(r, 0, sizeof(*r));
    snprintf(r->id, sizeof(r->id), "%s", id);
    r->n_tokens = n;
    for (uint32_t i = 0; i < n; i++)
        r->tokens[i] = i < shared ? 1000 * p + i : 100000 + 1000 * own + i;
    KVT_OK_(kvt_hash_prompt(SIM_SEED, r->tokens, n, SIM_BS, NULL, 0, r->hashes, SIM_MAX_BLK,
                            &r->n_hashes));
}

static inline const uint32_t *const *sim_tab(sim_req *r, const uint32_t **one)
{
    one[0] = r->blocks;
    return one;
}

/* Phase A + allocation + phase B for a waiting request; accepts up to `accept` external
 * tokens (UINT32_MAX: all offered). Returns the host hit offered. */
static inline uint32_t sim_admit(sim *s, sim_req *r, uint32_t accept)
{
    uint32_t out[SIM_MAX_BLK], *outs[1] = {out};
    kvt_hit gh;
    KVT_OK_(kvt_pool_find_longest_hit(s->gpu, r->hashes, r->n_hashes, r->n_tokens - 1, outs, &gh));
    KVT_OK_(kvt_pool_touch(s->gpu, out, gh.n_blocks[0]));
    memcpy(r->blocks, out, gh.n_blocks[0] * sizeof(uint32_t));
    r->gpu_hit = gh.length;
    uint32_t hit;
    KVT_OK_(kvt_offload_match(s->m, r->id, (uint32_t)strlen(r->id), r->hashes, r->n_hashes,
                              r->n_tokens, r->gpu_hit, &hit));
    r->ext = hit < accept ? hit : accept;
    r->n_blocks = (r->n_tokens + SIM_BS - 1) / SIM_BS;
    KVT_OK_(kvt_pool_alloc(s->gpu, r->n_blocks - gh.n_blocks[0], r->blocks + gh.n_blocks[0]));
    const uint32_t *one[1];
    uint32_t nb[1] = {r->n_blocks};
    KVT_OK_(
        kvt_offload_after_alloc(s->m, r->id, (uint32_t)strlen(r->id), sim_tab(r, one), nb, r->ext));
    r->computed = r->gpu_hit;
    return hit;
}

/* The engine computed tokens up to `to`: caches the newly full blocks in the GPU pool. */
static inline void sim_compute(sim *s, sim_req *r, uint32_t to)
{
    for (uint32_t b = r->computed / SIM_BS; b < to / SIM_BS; b++) {
        kvt_block_info bi;
        KVT_OK_(kvt_pool_block_info(s->gpu, r->blocks[b], &bi));
        if (bi.n_keys == 0)
            KVT_OK_(kvt_pool_insert(s->gpu, r->blocks[b], r->hashes + b * KVT_BLOCK_HASH_LEN, 0,
                                    SIM_BS));
    }
    r->computed = to;
}

static inline void sim_schedule(sim *s, sim_req *r, uint32_t scheduled, bool resumed)
{
    const uint32_t *one[1];
    uint32_t nb[1] = {r->n_blocks};
    KVT_OK_(kvt_offload_schedule(s->m, r->id, (uint32_t)strlen(r->id), sim_tab(r, one), nb,
                                 r->computed, scheduled, resumed));
}

static inline void sim_build(sim *s, bool preempted)
{
    KVT_OK_(kvt_offload_build_meta(s->m, preempted, &s->meta));
    KVT_OK_(kvt_offload_meta_validate(&s->meta));
}

/* Every one of `ranks` workers reports store event ev once. */
static inline void sim_report_store(sim *s, int64_t ev, uint32_t ranks)
{
    kvt_offload_worker_meta_clear(&s->wm);
    KVT_OK_(kvt_offload_worker_meta_add(&s->wm, ev, ranks));
    KVT_OK_(kvt_offload_apply_output(s->m, NULL, 0, &s->wm));
}

static inline void sim_report_load(sim *s, sim_req *r)
{
    kvt_str id = {r->id, (uint32_t)strlen(r->id)};
    KVT_OK_(kvt_offload_apply_output(s->m, &id, 1, NULL));
}

static inline void sim_finish(sim *s, sim_req *r)
{
    const uint32_t *one[1];
    uint32_t nb[1] = {r->n_blocks};
    KVT_OK_(kvt_offload_request_finished(s->m, r->id, (uint32_t)strlen(r->id), sim_tab(r, one), nb,
                                         r->computed));
    uint32_t rev[SIM_MAX_BLK];
    for (uint32_t i = 0; i < r->n_blocks; i++)
        rev[i] = r->blocks[r->n_blocks - 1 - i];
    KVT_OK_(kvt_pool_free(s->gpu, rev, r->n_blocks));
    r->n_blocks = 0;
}

/* Admits r without using a host hit, computes its whole prompt and runs the step that selects
 * its full blocks; returns that step's store event. */
static inline int64_t sim_admit_and_store(sim *s, sim_req *r)
{
    sim_admit(s, r, 0);
    sim_compute(s, r, r->n_tokens);
    sim_schedule(s, r, 1, false);
    sim_build(s, false);
    return s->meta.store_event;
}

/* Runs a request from admission to finish with everything stored: step 1 computes the whole
 * prompt, step 2 (one-step lag) stores its full blocks, the workers report. */
static inline void sim_store_prompt(sim *s, sim_req *r, uint32_t ranks)
{
    sim_admit(s, r, 0);
    sim_schedule(s, r, r->n_tokens, false);
    sim_build(s, false);
    int64_t ev1 = s->meta.store_event; /* GPU-hit blocks may already go out now */
    sim_compute(s, r, r->n_tokens);
    sim_schedule(s, r, 1, false);
    sim_build(s, false);
    int64_t ev2 = s->meta.store_event;
    sim_finish(s, r);
    if (ev1 != KVT_NO_EVENT)
        sim_report_store(s, ev1, ranks);
    if (ev2 != KVT_NO_EVENT)
        sim_report_store(s, ev2, ranks);
}

/* A "GPU" in host memory for tests with a real worker: two regions (K and V) of gpu_blocks
 * blocks of bpb bytes each, zeroed, and the layout over them. */
static inline void sim_host_kv(uint32_t gpu_blocks, uint32_t bpb, unsigned char **kv,
                               kvt_layout **layout)
{
    *kv = calloc(2 * (size_t)gpu_blocks, bpb);
    assert_non_null(*kv);
    KVT_OK_(kvt_layout_create(KVT_HOST_DEVICE, gpu_blocks, layout));
    kvt_kv_tensor t = {KVT_HOST_DEVICE, (uint64_t)(uintptr_t)*kv, 2ull * gpu_blocks * bpb,
                       gpu_blocks, bpb};
    KVT_OK_(kvt_layout_add_tensor(*layout, &t));
}

/* One engine step with a real worker: the manager's metadata to worker w, the copies run to
 * completion, the reports back — twice, as a step without new events collects what the
 * first one finished. */
static inline void sim_worker_step(sim *s, kvt_worker *w)
{
    sim_build(s, false);
    const kvt_str *fin;
    uint32_t n_fin;
    for (int round = 0; round < 2; round++) {
        KVT_OK_(kvt_worker_bind(w, &s->meta));
        KVT_OK_(kvt_worker_get_finished(w, NULL, &fin, &n_fin));
        KVT_OK_(kvt_worker_build_meta(w, &s->wm));
        KVT_OK_(kvt_offload_apply_output(s->m, fin, n_fin, &s->wm));
        kvt_worker_clear(w);
        KVT_OK_(kvt_worker_flush(w));
        if (round == 0)
            sim_build(s, false);
    }
}

/* Block j's tag: the first 8 bytes of its hash. */
static inline uint64_t sim_tag(const sim_req *q, uint32_t j)
{
    uint64_t t;
    memcpy(&t, q->hashes + j * KVT_BLOCK_HASH_LEN, 8);
    return t;
}

/* What computing block bytes writes in a test that checks them: byte `off` of region `region`
 * of the block whose tag (its hash's first 8 bytes) is `tag`. */
static inline unsigned char sim_kv_byte(uint64_t tag, uint32_t region, uint64_t off)
{
    uint64_t x = tag ^ ((uint64_t)region << 48) ^ off * 0x9E3779B97F4A7C15ull;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    return (unsigned char)(x >> 40);
}

/* In a "GPU" of sim_host_kv (kv: 2 regions of gpu_blocks blocks of bpb bytes): writes the
 * bytes of r's first n blocks as computing them would / checks every byte of them (the
 * failure names `what`, the block, region and byte). */
static inline unsigned char *sim_kv_block(unsigned char *kv, uint32_t gpu_blocks, uint32_t bpb,
                                          uint32_t region, uint32_t b)
{
    return kv + ((size_t)region * gpu_blocks + b) * bpb;
}

static inline void sim_kv_write(unsigned char *kv, uint32_t gpu_blocks, uint32_t bpb,
                                const sim_req *r, uint32_t n)
{
    for (uint32_t j = 0; j < n; j++)
        for (uint32_t reg = 0; reg < 2; reg++) {
            unsigned char *d = sim_kv_block(kv, gpu_blocks, bpb, reg, r->blocks[j]);
            for (uint32_t o = 0; o < bpb; o++)
                d[o] = sim_kv_byte(sim_tag(r, j), reg, o);
        }
}

static inline void sim_kv_expect(unsigned char *kv, uint32_t gpu_blocks, uint32_t bpb,
                                 const sim_req *r, uint32_t n, const char *what)
{
    for (uint32_t j = 0; j < n; j++)
        for (uint32_t reg = 0; reg < 2; reg++) {
            const unsigned char *d = sim_kv_block(kv, gpu_blocks, bpb, reg, r->blocks[j]);
            for (uint32_t o = 0; o < bpb; o++)
                if (d[o] != sim_kv_byte(sim_tag(r, j), reg, o))
                    fail_msg("%s: request %s block %u region %u byte %u differs", what, r->id, j,
                             reg, o);
        }
}

static inline bool sim_host_has(sim *s, const sim_req *r, uint32_t block)
{
    uint32_t b;
    return kvt_pool_lookup(kvt_offload_host_pool(s->m), r->hashes + block * KVT_BLOCK_HASH_LEN, 0,
                           &b) == 1;
}

static inline uint32_t sim_gpu_ref(sim *s, uint32_t b)
{
    kvt_block_info bi;
    KVT_OK_(kvt_pool_block_info(s->gpu, b, &bi));
    return bi.ref_cnt;
}

#endif
