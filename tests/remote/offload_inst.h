/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Engine instances joined by a remote tier, for the tests of kvt_offload_attach_remote
 * (test_offload_remote, test_offload_remote_model): each one a manager over a sim GPU pool, a
 * worker, a host mirror of two regions and the kvt_remote serving it, against a redis-server
 * the test starts on a unix socket. KV bytes are a function of the block hash, so any block
 * loaded anywhere can be checked. An instance may be a replica of a node tier (inst_open_on):
 * its host tier is then the node's (every replica's HOST_NB slots), its mirror the node's data
 * region, and its remote serves that region (what it publishes: its own slots).
 */
#ifndef KVT_TEST_OFFLOAD_INST_H
#define KVT_TEST_OFFLOAD_INST_H

#include <stdlib.h>
#include <unistd.h>

#include "redis_group.h"
#include "kvtier/disk.h"
#include "kvtier/node.h"
#include "kvtier/remote.h"
#include "kvtier/worker.h"
#include "offload/sim.h"

#define GPU_NB  64
#define HOST_NB 24 /* null block included */
#define KV_BPB  2048
#define CRED    "a-shared-secret-of-the-space"

static char g_space[32];
static uint32_t g_timeout_ms = 2000, g_ttl_ms = 600; /* the remotes' timeout_ms, ttl_ms */
static uint32_t g_dir_timeout_ms = 250;              /* their directory_timeout_ms */
static uint32_t g_miss_ms; /* the managers' remote_miss_ms: 0 (look up every time) unless a
                              case says otherwise */

static inline int each_setup(void **state)
{
    (void)state;
    static int n;
    snprintf(g_space, sizeof(g_space), "o%d-%d", (int)getpid(), n++);
    g_miss_ms = 0;
    g_timeout_ms = 2000;
    g_dir_timeout_ms = 250;
    return 0;
}

/* One engine instance: its "GPU" (two regions of GPU_NB blocks in host memory), host mirror,
 * worker, manager and remote tier, and optionally a disk tier between the host and the remote
 * (its file in a directory of the working directory, removed at close). */
typedef struct inst {
    sim s;
    unsigned char *kv;
    kvt_layout *layout;
    kvt_mirror *mirror;
    kvt_worker *w;
    kvt_remote *r;
    kvt_disk *disk;
    kvt_layout *ml; /* the disk's near side: the mirror's layout (borrowed by the disk) */
    char dir[32];
    kvt_node *node; /* a node tier's replica, or NULL */
    uint32_t rank;  /* its rank */
} inst;

/* The config of instance `name`'s remote serving a mirror's n_slots blocks. */
static inline void remote_config_over(kvt_remote_config *c, kvt_mirror *mirror, const char *name,
                                      uint32_t n_slots, uint32_t hash_len)
{
    test_remote_config(c, g_space, name, CRED);
    c->regions = kvt_mirror_regions(mirror);
    c->n_regions = kvt_mirror_num_regions(mirror);
    c->n_slots = n_slots;
    c->hash_len = hash_len;
    c->hash_seed = SIM_SEED;
    c->ttl_ms = g_ttl_ms;
    c->timeout_ms = g_timeout_ms;
    c->directory_timeout_ms = g_dir_timeout_ms;
}

static inline int remote_open(inst *x, const char *name, uint32_t n_slots, uint32_t hash_len)
{
    kvt_remote_config c;
    remote_config_over(&c, x->mirror, name, n_slots, hash_len);
    return kvt_remote_create(&c, &x->r);
}

/* sim_init with the manager's remote_miss_ms set, a host tier of host_blocks */
static inline void sim_open_n(sim *s, uint32_t host_blocks)
{
    kvt_offload_config oc;
    kvt_offload_config_init(&oc);
    oc.host_blocks = host_blocks;
    oc.remote_miss_ms = g_miss_ms;
    sim_init_cfg(s, GPU_NB, &oc);
}

static inline void sim_open(sim *s)
{
    sim_open_n(s, HOST_NB);
}

/* A disk tier of `blocks` blocks behind x's host tier (before the remote is attached). */
static inline void inst_add_disk(inst *x, uint32_t blocks)
{
    snprintf(x->dir, sizeof(x->dir), "kvt-rdisk-XXXXXX");
    assert_non_null(mkdtemp(x->dir));
    KVT_OK_(kvt_offload_add_tier(x->s.m, "disk", blocks, NULL));
    KVT_OK_(kvt_mirror_layout(x->mirror, &x->ml));
    kvt_disk_config dc;
    kvt_disk_config_init(&dc);
    char path[64];
    snprintf(path, sizeof(path), "%s/kv", x->dir);
    dc.path = path;
    dc.page_cache = true;
    dc.capacity_bytes = (uint64_t)blocks * 2 * KV_BPB;
    KVT_OK_(kvt_disk_create(&dc, x->ml, &x->disk));
    KVT_OK_(kvt_worker_attach_disk_tier(x->w, 1, x->disk));
}

/* Replica `rank` of node tier `node_name` (ranks replicas of HOST_NB slots each). */
static inline kvt_node *node_join(const char *node_name, uint32_t rank, uint32_t ranks)
{
    kvt_node_config nc;
    kvt_node_config_init(&nc);
    nc.name = node_name;
    nc.rank = rank;
    nc.ranks = ranks;
    nc.blocks_per_rank = HOST_NB;
    nc.hash_len = KVT_BLOCK_HASH_LEN;
    nc.keys_per_block = 4; /* sim's GPU pool, which the host pool copies */
    nc.hash_seed = SIM_SEED;
    nc.reap_interval_ms = 0;
    nc.lock_timeout_ms = 3000; /* a replica that kept the lock would fail a peer's call here */
    kvt_node *n = NULL;
    KVT_OK_(kvt_node_attach(&nc, &n));
    return n;
}

/* An instance; disk_blocks > 0: with a disk tier of that many blocks between the host and the
 * remote tier; node_name: as replica `rank` of that node tier of `ranks` replicas. */
static inline void inst_open_on(inst *x, const char *name, uint32_t disk_blocks,
                                const char *node_name, uint32_t rank, uint32_t ranks)
{
    x->node = node_name ? node_join(node_name, rank, ranks) : NULL;
    x->rank = rank;
    uint32_t slots = x->node ? kvt_node_num_slots(x->node) : HOST_NB;
    sim_open_n(&x->s, slots);
    sim_host_kv(GPU_NB, KV_BPB, &x->kv, &x->layout);
    kvt_mirror_config mc;
    kvt_mirror_config_init(&mc);
    mc.host_blocks = slots;
    mc.node_name = node_name;
    KVT_OK_(kvt_mirror_create(&mc, x->layout, &x->mirror));
    assert_int_equal(kvt_mirror_num_regions(x->mirror), 2);
    kvt_worker_config wc;
    kvt_worker_config_init(&wc);
    wc.copy.threads = 1;
    KVT_OK_(kvt_worker_create(&wc, x->layout, x->mirror, &x->w));
    x->disk = NULL;
    x->ml = NULL;
    x->dir[0] = 0;
    if (disk_blocks)
        inst_add_disk(x, disk_blocks);
    if (x->node) /* after the disk: the peers' slots make the pool look used */
        KVT_OK_(kvt_offload_attach_node(x->s.m, x->node));
    KVT_OK_(remote_open(x, name, slots, KVT_BLOCK_HASH_LEN));
    KVT_OK_(kvt_offload_attach_remote(x->s.m, x->r));
    KVT_OK_(kvt_worker_attach_remote(x->w, kvt_offload_remote_tier(x->s.m), x->r));
}

static inline void inst_open_disk(inst *x, const char *name, uint32_t disk_blocks)
{
    inst_open_on(x, name, disk_blocks, NULL, 0, 1);
}

static inline void inst_open(inst *x, const char *name)
{
    inst_open_disk(x, name, 0);
}

static inline void inst_close(inst *x)
{
    sim_fini(&x->s); /* withdraws what it published, before the remote and the mirror go */
    kvt_remote_destroy(x->r);
    kvt_worker_destroy(x->w);
    kvt_disk_destroy(x->disk); /* unlinks its file */
    kvt_layout_destroy(x->ml);
    if (x->dir[0])
        rmdir(x->dir);
    kvt_mirror_destroy(x->mirror);
    kvt_layout_destroy(x->layout);
    free(x->kv);
    kvt_node_detach(x->node); /* after the manager: it withdrew this replica's slots */
}

static inline unsigned char *dev_block(inst *x, uint32_t region, uint32_t b)
{
    return x->kv + ((size_t)region * GPU_NB + b) * KV_BPB;
}

/* One engine step after scheduling: metadata to the worker, copies to completion, reports
 * back (twice: a step without new events collects what finished), then once more: a remote
 * hit is a promotion the workers read first, and its GPU load goes the step after. */
static inline void step(inst *x)
{
    sim_worker_step(&x->s, x->w);
    sim_worker_step(&x->s, x->w);
}

static uint32_t g_invalid; /* the last admit_and_check's invalid blocks */

/* x computes prompt p (n_blocks full blocks and a tail; its KV bytes tagged by block hash)
 * and stores it. */
static inline void compute_and_store(inst *x, sim_req *p, const char *id, uint32_t seed,
                                     uint32_t n_blocks)
{
    sim_req_make(p, id, n_blocks * SIM_BS + 5, seed, n_blocks * SIM_BS + 5, 0);
    sim_admit(&x->s, p, 0);
    sim_kv_write(x->kv, GPU_NB, KV_BPB, p, n_blocks);
    sim_compute(&x->s, p, p->n_tokens);
    sim_schedule(&x->s, p, 1, false);
    step(x);
    sim_finish(&x->s, p);
}

/* y admits prompt `seed` (as q); returns the blocks of its hit, every loaded byte checked. */
static inline uint32_t admit_and_check(inst *y, sim_req *q, const char *id, uint32_t seed,
                                       uint32_t n_blocks)
{
    sim_req_make(q, id, n_blocks * SIM_BS + 5, seed, n_blocks * SIM_BS + 5, 1);
    uint32_t hit = sim_admit(&y->s, q, UINT32_MAX);
    assert_int_equal(hit % SIM_BS, 0);
    step(y);
    /* blocks the worker could not read are invalid: the engine recomputes from the first */
    uint32_t inv[GPU_NB], good = hit / SIM_BS;
    g_invalid = kvt_worker_take_invalid_blocks(y->w, inv, GPU_NB);
    for (uint32_t k = 0; k < g_invalid; k++)
        for (uint32_t j = 0; j < good; j++)
            if (q->blocks[j] == inv[k])
                good = j;
    sim_kv_expect(y->kv, GPU_NB, KV_BPB, q, good, id);
    sim_finish(&y->s, q);
    return good;
}

static inline kvt_remote_stats rstats(inst *x)
{
    kvt_remote_stats st;
    kvt_remote_get_stats(x->r, &st);
    return st;
}

static inline kvt_offload_stats ostats(inst *x)
{
    kvt_offload_stats st;
    kvt_offload_get_stats(x->s.m, &st);
    return st;
}

#endif
