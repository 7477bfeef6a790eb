/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The node tier against a reference model, over long random runs.
 *
 * Three replicas (each a GPU pool and an offload manager attached to one node tier, as in
 * test_node.c) run requests whose prompts share prefixes across replicas, with stores and
 * loads reported a random number of steps late, requests finished at random, and replicas
 * restarted at random (their manager destroyed with transfers in flight, then a new one).
 * The model is the shared data region: for each slot, which block's bytes it holds (the tag of
 * the block hash written into it), whether a store is still writing it, and which replicas are
 * reading it. Every transfer a manager issues is checked against it:
 *   - a store writes only into its replica's own slots, never into a slot any replica is still
 *     reading, and never into one a store of its own is still writing;
 *   - a load reads a slot that holds exactly the block the request needs, whose store has
 *     completed, and that the owner has not reused.
 * A slot of a restarted replica holds nothing any more (its old instance's stores may land
 * after the restart, which is why nothing may read it).
 */
#include "kvt_test.h"
#include "offload/sim.h"

#define RANKS   3
#define BPR     40
#define SLOTS   (RANKS * BPR)
#define GPU_NB  96
#define MAX_REQ 3
#define LAG     3 /* steps a report may wait */

static uint64_t g_seed, g_op, g_rng;
#define CHECK(cond, ...) KVT_MODEL_CHECK("node model", "op", g_op, g_seed, cond, __VA_ARGS__)

static char g_name[40];

/* the data region */
static uint64_t tag[SLOTS];     /* block hash tag of the bytes in the slot; 0: nothing valid */
static int64_t writing[SLOTS];  /* store event writing it (-1: none), of owner's instance... */
static uint32_t inst[SLOTS];    /* ... instance number of the replica that issued it */
static uint32_t readers[SLOTS]; /* loads from it not yet reported */

typedef struct mreq {
    sim_req r;
    bool used, loading;
    uint32_t phase; /* 0 admitted, 1 computed and scheduled */
    uint32_t n_src;
    uint32_t src[SIM_MAX_BLK]; /* slots its load reads */
    uint32_t lag;
} mreq;

typedef struct pending {
    int64_t ev;
    uint32_t lag;
} pending;

typedef struct rep {
    uint32_t rank, instance;
    kvt_node *node;
    sim s;
    mreq q[MAX_REQ];
    pending st[64];
    uint32_t n_st;
    uint32_t next_id;
} rep;

static rep reps[RANKS];
static uint64_t g_stored, g_loaded, g_loaded_peer; /* blocks checked against the model */

static uint64_t tag_of(const uint8_t *hash)
{
    uint64_t t;
    memcpy(&t, hash, 8);
    return t | 1; /* never 0 */
}

static void rep_open(rep *p)
{
    kvt_node_config c;
    kvt_node_config_init(&c);
    c.name = g_name;
    c.rank = p->rank;
    c.ranks = RANKS;
    c.blocks_per_rank = BPR;
    c.keys_per_block = 4;
    c.reap_interval_ms = 0;
    KVT_OK_(kvt_node_attach(&c, &p->node));
    sim_init(&p->s, GPU_NB, SLOTS, false, 1, 8192);
    KVT_OK_(kvt_offload_attach_node(p->s.m, p->node));
    p->instance++;
}

/* The replica goes away with whatever it had in flight: its loads end (no one reads for it
 * any more), its stores may still land in its slots, which hold nothing valid from now on. */
static void rep_close(rep *p)
{
    for (uint32_t i = 0; i < MAX_REQ; i++) {
        mreq *q = &p->q[i];
        if (q->used && q->loading)
            for (uint32_t k = 0; k < q->n_src; k++)
                readers[q->src[k]]--;
        q->used = false;
    }
    p->n_st = 0;
    sim_fini(&p->s);
    kvt_node_detach(p->node);
    for (uint32_t s = p->rank * BPR + 1; s < (p->rank + 1) * BPR; s++)
        tag[s] = 0;
}

/* Checks and applies a built step's transfers. */
static void issue(rep *p, mreq *q)
{
    kvt_offload_meta *m = &p->s.meta;
    for (uint32_t i = 0; i < m->n_stores; i++) {
        uint32_t slot = m->store_cpu_blocks[i], gpu = m->store_gpu_blocks[i];
        CHECK(slot > p->rank * BPR && slot < (p->rank + 1) * BPR,
              "replica %u stores into slot %u, not its own", p->rank, slot);
        CHECK(readers[slot] == 0, "replica %u stores into slot %u while %u loads read it", p->rank,
              slot, readers[slot]);
        CHECK(writing[slot] < 0 || inst[slot] != p->instance,
              "replica %u stores into slot %u, which its store event %lld still writes", p->rank,
              slot, (long long)writing[slot]);
        kvt_pool_key k;
        uint32_t nk;
        KVT_OK_(kvt_pool_block_keys(p->s.gpu, gpu, &k, 1, &nk));
        CHECK(nk >= 1, "replica %u stores GPU block %u, which has no key", p->rank, gpu);
        tag[slot] = tag_of(k.hash);
        writing[slot] = m->store_event;
        inst[slot] = p->instance;
        g_stored++;
    }
    if (m->store_event != KVT_NO_EVENT) {
        assert_true(p->n_st < 64);
        p->st[p->n_st++] = (pending){m->store_event, kvt_test_below(&g_rng, LAG + 1)};
    }
    for (uint32_t i = 0; i < m->n_loads; i++) {
        uint32_t slot = m->load_cpu_blocks[i], gpu = m->load_gpu_blocks[i];
        CHECK(q, "replica %u loads without a request being admitted", p->rank);
        uint32_t j = 0;
        while (j < q->r.n_blocks && q->r.blocks[j] != gpu)
            j++;
        CHECK(j < q->r.n_blocks, "load into GPU block %u outside the request", gpu);
        uint64_t want = tag_of(q->r.hashes + j * KVT_BLOCK_HASH_LEN);
        CHECK(slot < SLOTS && tag[slot] == want,
              "replica %u loads block %u of %s from slot %u, which holds %llx, not %llx", p->rank,
              j, q->r.id, slot, (unsigned long long)tag[slot], (unsigned long long)want);
        CHECK(writing[slot] < 0, "replica %u loads slot %u while store %lld still writes it",
              p->rank, slot, (long long)writing[slot]);
        readers[slot]++;
        g_loaded++;
        g_loaded_peer += slot / BPR != p->rank;
        q->src[q->n_src++] = slot;
        q->loading = true;
        q->lag = kvt_test_below(&g_rng, LAG + 1);
    }
}

static void report_stores(rep *p, bool all)
{
    for (uint32_t i = 0; i < p->n_st;) {
        if (!all && p->st[i].lag-- > 0) {
            i++;
            continue;
        }
        int64_t ev = p->st[i].ev;
        for (uint32_t s = 0; s < SLOTS; s++)
            if (writing[s] == ev && inst[s] == p->instance && s / BPR == p->rank)
                writing[s] = -1;
        sim_report_store(&p->s, ev, 1);
        p->st[i] = p->st[--p->n_st];
    }
}

static void end_load(rep *p, mreq *q)
{
    for (uint32_t k = 0; k < q->n_src; k++)
        readers[q->src[k]]--;
    q->n_src = 0;
    q->loading = false;
    sim_report_load(&p->s, &q->r);
}

static void build(rep *p, mreq *q)
{
    sim_build(&p->s, false);
    issue(p, q);
}

/* One random action of replica p. */
static void act(rep *p, uint64_t *rng, uint64_t *counts)
{
    uint32_t what = kvt_test_below(rng, 100);
    mreq *q = &p->q[kvt_test_below(rng, MAX_REQ)];
    if (what == 0 && kvt_test_below(rng, 4) == 0) { /* restart */
        rep_close(p);
        rep_open(p);
        counts[0]++;
        return;
    }
    if (!q->used) { /* a new request: one of 6 shared prefixes, 2..8 blocks of it */
        char id[32];
        snprintf(id, sizeof(id), "r%u-%u", p->rank, p->next_id++);
        uint32_t blocks = 2 + kvt_test_below(rng, 7), shared = kvt_test_below(rng, blocks + 1);
        memset(q, 0, sizeof(*q));
        sim_req_make(&q->r, id, blocks * SIM_BS + 1 + kvt_test_below(rng, SIM_BS - 1),
                     kvt_test_below(rng, 6), shared * SIM_BS, p->next_id);
        if (kvt_pool_num_free(p->s.gpu) < blocks + 2)
            return;
        q->used = true;
        sim_admit(&p->s, &q->r, kvt_test_below(rng, 4) ? UINT32_MAX : 0);
        sim_schedule(&p->s, &q->r, q->r.n_tokens - q->r.computed, false);
        build(p, q);
        counts[1]++;
        return;
    }
    if (q->loading) {
        if (q->lag-- == 0) {
            end_load(p, q);
            counts[2]++;
        }
        return;
    }
    if (q->phase == 0) { /* the prompt computed; its blocks selected for storing */
        sim_compute(&p->s, &q->r, q->r.n_tokens);
        sim_schedule(&p->s, &q->r, 1, false);
        build(p, NULL);
        q->phase = 1;
        counts[3]++;
        return;
    }
    sim_finish(&p->s, &q->r);
    q->used = false;
    counts[4]++;
}

static void the_node_tier_matches_its_model(void **state)
{
    (void)state;
    snprintf(g_name, sizeof(g_name), "model-%d", (int)getpid());
    kvt_node_unlink(g_name);
    g_seed = kvt_test_seed();
    g_rng = g_seed;
    uint64_t *rng = &g_rng;
    for (uint32_t s = 0; s < SLOTS; s++)
        writing[s] = -1;
    for (uint32_t i = 0; i < RANKS; i++) {
        reps[i].rank = i;
        rep_open(&reps[i]);
    }
    uint64_t total = (uint64_t)(60000 * kvt_test_scale()), counts[5] = {0};
    for (g_op = 0; g_op < total; g_op++) {
        rep *p = &reps[kvt_test_below(rng, RANKS)];
        act(p, rng, counts);
        if (kvt_test_below(rng, 4) == 0)
            report_stores(p, false);
        if (kvt_test_below(rng, 8) == 0) /* a step without new work */
            build(p, NULL);
    }
    /* every load ends: no pin may outlive them */
    for (uint32_t i = 0; i < RANKS; i++)
        for (uint32_t k = 0; k < MAX_REQ; k++)
            if (reps[i].q[k].used && reps[i].q[k].loading)
                end_load(&reps[i], &reps[i].q[k]);
    uint64_t pinned = 0;
    for (uint32_t i = 0; i < RANKS; i++) {
        kvt_node_stats ns;
        KVT_OK_(kvt_node_get_stats(reps[i].node, &ns));
        pinned += ns.pinned_of_peers + ns.peer_pinned;
    }
    print_message("node model: %llu ops (seed %llu): %llu restarts, %llu admissions, %llu loads "
                  "reported, %llu computed, %llu finished; blocks: %llu stored, %llu loaded "
                  "(%llu from a peer's slot)\n",
                  (unsigned long long)total, (unsigned long long)g_seed,
                  (unsigned long long)counts[0], (unsigned long long)counts[1],
                  (unsigned long long)counts[2], (unsigned long long)counts[3],
                  (unsigned long long)counts[4], (unsigned long long)g_stored,
                  (unsigned long long)g_loaded, (unsigned long long)g_loaded_peer);
    CHECK(g_loaded_peer > 0 && g_stored > 0, "no block moved between replicas: nothing checked");
    CHECK(pinned == 0, "%llu pins left after every load ended", (unsigned long long)pinned);
    for (uint32_t i = 0; i < RANKS; i++)
        rep_close(&reps[i]);
    kvt_node_unlink(g_name);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(the_node_tier_matches_its_model),
    };
    return kvt_test_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
