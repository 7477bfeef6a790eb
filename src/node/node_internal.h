/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What the offload manager needs of a node tier (kvtier/node.h): binding its host pool, and
 * the lock every manager call that touches the host pool runs under. Locks nest (a depth
 * count); the outermost one refreshes the pool's view of the peers' slots.
 */
#ifndef KVT_NODE_INTERNAL_H
#define KVT_NODE_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

#include "kvtier/node.h"
#include "kvtier/pool.h"

/* The metadata object's header (node.c describes the object). Its fields before `lock` are
 * the shape and the layout, checked by kvi_node_header_check before anything else is read. */
struct node_rank {
    uint32_t attached;
    int32_t pid;
    uint64_t epoch;
};

struct node_hdr {
    uint64_t magic;
    uint32_t layout;
    uint32_t ready; /* 1 once the creator initialized everything (release / acquire) */
    /* what every replica must match */
    uint32_t ranks, bpr, hash_len, kpb, hash_block_size, pad0;
    uint64_t block_bytes, hash_seed;
    uint8_t signature[32];
    /* where things are */
    uint64_t slot_stride, slots_off, pins_off, log_off, size;
    uint32_t log_cap, pad1;
    pthread_mutex_t lock;
    int32_t holder; /* rank inside the lock, -1 none */
    uint32_t pad2;
    uint64_t log_seq;    /* log entries ever written */
    uint64_t rescan_seq; /* bumped when every replica must read every slot */
    uint64_t epochs;     /* attaches ever */
    struct node_rank rank[KVT_NODE_MAX_RANKS];
};

#define KVI_NODE_HDR_SHAPE_BYTES offsetof(struct node_hdr, lock)

/* Makes pool (every slot of the node, null block included) this replica's view of the tier:
 * its own slots allocatable, the peers' findable. Only once, on a pool nothing used. */
int kvi_node_bind(kvt_node *n, kvt_pool *pool);
/* Unbinds (the pool is going away): releases this replica's pins of peers' slots. If the
 * node's owner detached it meanwhile (kvt_node_detach while lent), this completes that detach
 * and frees n: the caller must not use n afterwards. */
void kvi_node_unbind(kvt_node *n);
int kvi_node_lock(kvt_node *n);
/* Checks a metadata object's header (p, the object's size bytes, mapped): magic, layout
 * version, every field in range, offsets and capacities exactly those its shape gives, the
 * recorded size the object's. 0, or KVT_EPROTO / KVT_EVERSION with a message. (The fuzz
 * target fuzz_node_header drives it.) */
int kvi_node_header_check(const void *p, size_t size);
void kvi_node_unlock(kvt_node *n);
/* Lets go of the lock inside a locked call, for a wait that must not hold every replica up (a
 * network round trip): true when it was let go (the outermost lock), false when it is held by
 * an enclosing call too (it stays held). kvi_node_lock takes it again and refreshes the view:
 * whatever the caller found in the pool before must be searched again. If that lock fails,
 * the enclosing call's kvi_node_unlock does nothing (the depth is 0). */
bool kvi_node_let_go(kvt_node *n);

#endif
