/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What the offload manager needs of a node tier (kvtier/node.h): binding its host pool, and
 * the lock every manager call that touches the host pool runs under. Locks nest (a depth
 * count); the outermost one refreshes the pool's view of the peers' slots.
 */
#ifndef KVT_NODE_INTERNAL_H
#define KVT_NODE_INTERNAL_H

#include "kvtier/node.h"
#include "kvtier/pool.h"

/* Makes pool (every slot of the node, null block included) this replica's view of the tier:
 * its own slots allocatable, the peers' findable. Only once, on a pool nothing used. */
int kvi_node_bind(kvt_node *n, kvt_pool *pool);
/* Unbinds (the pool is going away): releases this replica's pins of peers' slots. */
void kvi_node_unbind(kvt_node *n);
int kvi_node_lock(kvt_node *n);
void kvi_node_unlock(kvt_node *n);

#endif
