/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A pool whose blocks are slots of a host tier shared by several replicas (src/node): the
 * pool holds every slot of the node, but owns only a range of them. Only owned blocks are
 * ever in the free queue, so only they are allocated and evicted here; the others ("peer
 * blocks") carry the keys their owner published, are found by searches like any block, and
 * are pinned and released with kvt_pool_touch / kvt_pool_free without ever becoming free.
 *
 * The pool reports what the node must mirror into shared memory through the ops: the first
 * reference taken on a peer block and the last one dropped (pins), a key inserted on an owned
 * block (it is published) and an owned block losing its keys (unpublished). Changes the node
 * makes to peer blocks' keys (kvi_pool_share_set_keys) report nothing and emit no cache
 * events: they are the peers' blocks, not this engine's.
 */
#ifndef KVT_POOL_SHARE_H
#define KVT_POOL_SHARE_H

#include "kvtier/pool.h"

struct kvi_pool_share_ops {
    /* peer block: first reference taken (on) or last dropped (off) */
    void (*pin)(void *ctx, uint32_t block, bool on);
    /* owned block: a key was inserted */
    void (*publish)(void *ctx, uint32_t block, const uint8_t *hash, uint32_t group,
                    uint32_t num_tokens);
    /* owned block: its keys were dropped (evicted, reused, reset) */
    void (*unpublish)(void *ctx, uint32_t block);
};

/* Makes [own_lo, own_hi) the pool's own blocks and every other non-null block a peer block.
 * Only on a pool that nothing used yet (every block free and uncached); ops and ctx are
 * borrowed for the pool's life. */
int kvi_pool_share(kvt_pool *p, uint32_t own_lo, uint32_t own_hi,
                   const struct kvi_pool_share_ops *ops, void *ctx);
/* Replaces peer block b's keys by n keys (hashes n x hash_len bytes, groups, num_tokens). */
int kvi_pool_share_set_keys(kvt_pool *p, uint32_t b, uint32_t n, const uint8_t *hashes,
                            const uint32_t *groups, const uint32_t *num_tokens);
/* Whether block b is a peer's (false for owned blocks, the null block and pools not shared). */
bool kvi_pool_is_peer(const kvt_pool *p, uint32_t b);

#endif
