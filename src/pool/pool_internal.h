/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Internal layout of kvt_pool, shared by pool.c (blocks, keys, events) and hit.c (longest-hit
 * search). Nothing here is installed.
 */
#ifndef KVT_POOL_INTERNAL_H
#define KVT_POOL_INTERNAL_H

#include <string.h>

#include "base/hash.h"
#include "base/list.h"
#include "base/map.h"
#include "base/ring.h"
#include "kvtier/pool.h"

#define KVT_ENTRY_NONE UINT32_MAX

struct kvi_block {
    kvi_list link;   /* free-queue node; detached (points to itself) while referenced */
    uint32_t ref;    /* references held by requests and transfers */
    uint32_t keys;   /* first key entry, KVT_ENTRY_NONE when uncached */
    uint16_t n_keys; /* keys on the entry chain */
    uint8_t is_null;
    uint8_t peer; /* a shared pool's block owned by another replica (pool_share.h) */
};

/* One key of one block. Entries live in a flat array of entry_stride bytes each; the hash
 * bytes follow the fixed fields. `next` chains the keys of a block in insertion order, or the
 * free entries. */
struct kvi_entry {
    uint64_t kh; /* key hash (map slot), kept so removal need not rehash */
    uint32_t block;
    uint32_t group;
    uint32_t num_tokens;
    uint32_t next;
    uint8_t hash[];
};

struct kvt_pool {
    kvt_pool_config cfg;
    uint32_t nb;       /* total blocks */
    uint32_t hash_len; /* bytes per hash */
    uint32_t sched_bs; /* hit lengths are multiples of this */
    uint32_t n_free;
    uint32_t n_cached;
    struct kvi_block *blocks;
    kvi_list free_q; /* head = LRU */

    kvi_map map; /* key hash -> entry index */
    unsigned char *entries;
    size_t entry_stride;
    uint32_t entry_free; /* free-entry chain */

    kvi_ring ev; /* kvt_pool_event; the newest is lost when full */
    uint64_t ev_dropped;

    uint32_t order[KVT_MAX_GROUPS];     /* search order: full-attention groups first, then
                                           the other prefix-cacheable ones */
    uint32_t n_order;                   /* cacheable groups (entries of order) */
    uint32_t hash_step[KVT_MAX_GROUPS]; /* hashes per block of each group */
    bool simple_hybrid;                 /* two groups, the first searched is full attention */
    bool partial_ok; /* the groups allow hits at hash-block granularity (KVT_HIT_PARTIAL) */

    /* a node's shared pool (pool_share.h): NULL ops when not shared */
    const struct kvi_pool_share_ops *share;
    void *share_ctx;
    uint32_t n_own; /* blocks that can be free: nb - 1, or the owned range */
};

/* Every key of the pool's own blocks is forgotten, referenced blocks included (their holders
 * keep the bytes; freed, they come back uncached); kvt_pool_reset_prefix_cache without its
 * check that nothing is referenced. */
void kvi_pool_forget_keys(kvt_pool *p);

/* kvt_pool_insert unless some block already carries the key (then 0, nothing changes). */
int kvi_pool_insert_unique(kvt_pool *p, uint32_t block, const uint8_t *hash, uint32_t group,
                           uint32_t num_tokens);

static inline struct kvi_entry *kvi_pool_entry(const struct kvt_pool *p, uint32_t idx)
{
    return (struct kvi_entry *)(p->entries + (size_t)idx * p->entry_stride);
}

static inline uint64_t kvi_pool_key_hash(const struct kvt_pool *p, const uint8_t *hash,
                                         uint32_t group)
{
    return kvi_xxh3_64(hash, p->hash_len, group);
}

/* Whether two hashes of the pool's length are equal; the usual 16 bytes without a call. */
static inline bool kvi_pool_hash_eq(const struct kvt_pool *p, const uint8_t *a, const uint8_t *b)
{
    if (p->hash_len == 16) {
        uint64_t a0, a1, b0, b1;
        memcpy(&a0, a, 8);
        memcpy(&a1, a + 8, 8);
        memcpy(&b0, b, 8);
        memcpy(&b1, b + 8, 8);
        return ((a0 ^ b0) | (a1 ^ b1)) == 0;
    }
    return memcmp(a, b, p->hash_len) == 0;
}

/* Block carrying (hash, group) whose key hash is kh, or KVT_BLOCK_NONE. */
static inline uint32_t kvi_pool_find(const struct kvt_pool *p, const uint8_t *hash, uint32_t group,
                                     uint64_t kh)
{
    uint64_t pos = kvi_map_probe_start(&p->map, kh);
    uint32_t idx;
    while (kvi_map_probe_next(&p->map, kh, &pos, &idx)) {
        const struct kvi_entry *e = kvi_pool_entry(p, idx);
        if (e->group == group && kvi_pool_hash_eq(p, e->hash, hash))
            return e->block;
    }
    return KVT_BLOCK_NONE;
}

#endif
