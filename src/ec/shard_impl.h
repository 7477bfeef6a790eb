/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The consumer shard's private state, shared by its three files: shard.c (records, life
 * cycle, reserve, complete, cancel, take, expiry), shard_res.c (the resident pool: residents
 * by mm_hash, their LRU, leases and fenced frees) and shard_step.c (the consumer worker's
 * step and the metrics).
 */
#ifndef KVI_EC_SHARD_IMPL_H
#define KVI_EC_SHARD_IMPL_H

#include "base/array.h"
#include "base/map.h"
#include "base/ring.h"
#include "ec/ec_key.h"
#include "ec/shard_internal.h"

#define NONE  UINT32_MAX
#define NEVER UINT64_MAX

typedef struct desc {
    uint64_t nbytes;
    uint32_t ndim;
    uint64_t shape[KVT_EC_MAX_DIMS];
    char dtype[24];
} desc;

typedef struct rec {
    bool used;
    uint8_t state;
    bool cached;
    bool has_alloc; /* a writer's own allocation */
    ec_key tid, h;
    char rid[KVT_EC_RID_LEN + 1];
    char owner[KVT_EC_RID_LEN + 1]; /* the network client that made it ("" in process) */
    desc d;
    kvt_slab_view alloc;
    uint32_t lease;  /* resident entry leased, NONE */
    uint32_t writer; /* a follower's writer, NONE */
    uint32_t ffirst; /* a writer's first follower */
    uint32_t fnext;  /* next follower of the same writer */
    uint32_t fprev;  /* previous one (NONE: the first), so a follower leaves in O(1) */
    bool is_writer;  /* in the writers index */
    uint64_t expires;
    kvi_ilink tomb; /* the tombstone FIFO */
    uint32_t free_next;
} rec;

typedef struct res {
    bool used, current, pinned, in_lru;
    ec_key h;
    desc d;
    kvt_slab_view view;
    uint32_t leases;
    kvt_ec_fence fence;
    kvi_ilink lru;
    uint32_t free_next;
} res;

typedef struct pending_free {
    kvt_slab_view view;
    kvt_ec_fence fence;
} pending_free;

struct kvt_ec_shard {
    kvt_ec_shard_config cfg;
    kvt_slab *slab;
    rec *recs;
    uint32_t n_recs, cap_recs, free_rec, live, tomb;
    kvi_ilist tombs; /* terminal records, oldest first */
    kvi_map rec_map, writer_map, res_map;
    res *res;
    uint32_t n_res, cap_res, free_res, res_count;
    kvi_ilist lru; /* evictable residents, oldest first */
    pending_free *defer;
    uint32_t n_defer, cap_defer;
    kvi_ring ev;   /* kvt_ec_ready_event; the oldest goes when full */
    kvi_ring recl; /* reclaimed mm_hashes, KVT_EC_KEY_MAX + 1 bytes each; likewise */
    uint64_t next_deadline;
    uint64_t rid_state[2];
    bool shutting_down;
    kvt_ec_shard_stats st;
};

/* the resident pool (shard_res.c) */
res *kvi_shard_res_find(const kvt_ec_shard *sh, const ec_key *h);
uint32_t kvi_shard_res_idx(const kvt_ec_shard *sh, const res *e);
void kvi_shard_lru_remove(kvt_ec_shard *sh, res *e);
void kvi_shard_poll_deferred(kvt_ec_shard *sh);
void kvi_shard_res_free(kvt_ec_shard *sh, res *e);
void kvi_shard_res_settle(kvt_ec_shard *sh, res *e);
void kvi_shard_lease_take(kvt_ec_shard *sh, rec *r, res *e);
void kvi_shard_lease_release(kvt_ec_shard *sh, rec *r);
/* Makes (h, d, view) the current entry of h; the one it displaces lives on while leased and
 * is reused only after its retire fence, or `fence` if it was never retired. */
res *kvi_shard_res_publish(kvt_ec_shard *sh, const ec_key *h, const desc *d, const kvt_slab_view *v,
                           bool pinned, const kvt_ec_fence *fence);
/* records (shard.c) */
int kvi_shard_key_set(ec_key *k, const char *s, uint32_t len, const char *what);

#endif
