/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The rows of kvt_node_config, one per field in the header's order (the row format and what reads
 * the rows: src/base/config.h). The node tier (node.c) sets its defaults and checks its bounds
 * from them; kvt_describe_config hands them to bindings; scripts/gen-config-doc writes them into
 * docs/configuration.md. A new field is a row here, a line in the header and the code that
 * uses it.
 */
#ifndef KVI_NODE_CONFIG_H
#define KVI_NODE_CONFIG_H

#include "base/config.h"
#include "kvtier/node.h"

#define KVI_NODE_CONFIG(X)                                                                         \
    X(name, STRING, 0, 0, 0,                                                                       \
      "the node tier's name (required): 1..KVT_NODE_NAME_MAX bytes of [A-Za-z0-9_.-]; its "        \
      "objects are /kvtier.NAME.<32 random hex>.meta and .data in /dev/shm, the random part "      \
      "kept in DIR/NAME.rendezvous (dir)")                                                         \
    X(rank, UINT, 0, 0, KVT_NODE_MAX_RANKS - 1, "this replica, 0 .. ranks - 1")                    \
    X(ranks, UINT, 1, 1, KVT_NODE_MAX_RANKS, "replicas sharing the tier")                          \
    X(blocks_per_rank, REQUIRED, 0, 2, KVI_U32_MAX - 1,                                            \
      "slots each replica owns, its unused first slot included (ranks x blocks_per_rank below "    \
      "2^32 - 1)")                                                                                 \
    X(hash_len, UINT, 16, 1, KVT_HASH_MAX, "bytes per block hash, as the pools'")                  \
    X(keys_per_block, UINT, 1, 1, 64, "keys a host block carries, as the host pool's")             \
    X(hash_block_size, UINT, 16, 1, KVI_U32_MAX, "tokens per hash block, as the pools'")           \
    X(block_bytes, UINT, 0, 0, KVI_U64_MAX,                                                        \
      "bytes of one block in the workers' layout; 0: not compared")                                \
    X(hash_seed, UINT, 0, 0, KVI_U64_MAX,                                                          \
      "fingerprint of the hash function and its seed (vLLM: the first 8 bytes of the root "        \
      "hash); every replica must agree")                                                           \
    X(signature, BYTES, 0, 0, 0,                                                                   \
      "digest of whatever else must agree (model, dtype, cache groups), compared byte for byte")   \
    X(reap_interval_ms, UINT, 1000, 0, KVI_U32_MAX,                                                \
      "how often a locked call checks the peers' liveness; 0: only at attach, after a dead "       \
      "holder, and on kvt_node_reap")                                                              \
    X(lock_timeout_ms, UINT, 10000, 1, KVI_U32_MAX,                                                \
      "longest wait for the metadata lock: a call that waits longer fails with KVT_EBUSY naming "  \
      "the holder (a live but stopped replica) instead of hanging")                                \
    X(group, STRING, 0, 0, 0,                                                                      \
      "NULL: only this user's processes share the tier (objects 0600). A group name (1..63 "       \
      "bytes): replicas running as different users of that group share it (objects 0660 in that "  \
      "group; an existing object is used only if it has that group and gives nobody outside it "   \
      "access; every replica and the workers' mirrors name it)")                                   \
    X(dir, STRING, 0, 0, 0,                                                                        \
      "the directory of the tier's rendezvous, only the sharers may enter it (the objects' names " \
      "are unguessable to everyone else). NULL: $XDG_RUNTIME_DIR/kvtier if that is this user's "   \
      "and closed to others, else $HOME/.kvtier; with group it must be given (the group's, "       \
      "chmod 2770); every replica and the workers' mirrors name the same")                         \
    X(reserved, ROOM, 0, 0, 0, "room for fields to come: zero")

/* a row of kvt_node_config (KVI_CONFIG_ROW) */
#define KVI_NODE_CONFIG_ROW(...) KVI_CONFIG_ROW(kvt_node_config, __VA_ARGS__)

/* the table of these rows (node) */
extern const kvi_config_table kvi_node_config_table;

#endif
