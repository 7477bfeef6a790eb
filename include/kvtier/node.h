/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvtier node tier: one host tier shared by the engine replicas on a node (data-parallel
 * replicas of one model), so that a prefix one replica stored is a hit for the others
 * (vLLM's shared CPU pool, spec §3.9).
 *
 * Two POSIX shared-memory objects carry it, named /kvtier.<name>.<R>.data and .meta, where R is
 * 32 random hex digits kept in <dir>/<name>.rendezvous, a file in a directory only the sharers
 * can enter (kvt_node_config.dir): nobody else can know the names, so nobody else can create
 * them first (before, another user's empty /kvtier.<name>.meta kept a replica from attaching):
 *   .data  the blocks. Every replica's worker maps it as its host mirror
 *          (kvt_mirror_config.node_name); it has ranks x blocks_per_rank slots, and slot ids
 *          are global: a slot id means the same bytes in every replica.
 *   .meta  which keys each slot holds, who pins it, who is attached. The scheduler of each
 *          replica attaches it with kvt_node_attach and lends it to its offload manager
 *          (kvt_offload_attach_node), whose host pool then holds every slot of the node.
 *
 * Ownership: replica r owns slots [r*B + 1, (r+1)*B) for B = blocks_per_rank (slot r*B is
 * never used, like a pool's null block). Only the owner allocates, stores into and evicts its
 * slots; a slot's keys are published when its store completed on every worker, and withdrawn
 * before the slot is reused. Any replica may load a published slot: it pins the slot from
 * the hit until its load ended, and the owner reuses no slot a peer pins.
 *
 * Failure: the metadata lives under a process-shared robust mutex, which the kernel releases
 * when its holder dies (the next locker repairs: every replica rescans every slot). Each
 * attached replica holds an open-file-description lock on its own byte of the metadata object
 * for as long as its process lives; a peer whose lock is gone is dead and is reaped: its pins
 * are released and its slots withdrawn. A restarted replica starts empty, and its slots that
 * peers still pin stay out of use until they let go. Reaping happens at attach, after a
 * holder died in the lock, every reap_interval_ms inside the manager's calls, and on
 * kvt_node_reap.
 *
 * Mismatched configurations are refused at attach, with a message naming what differs: a
 * replica with another hash seed would never hit the others' blocks (and silently recompute
 * everything), one with another block layout would read garbage.
 *
 * Both objects are created O_EXCL with mode 0600 (0660 and the group, with `group`): only
 * processes of the same user (or group) share them. An object that already exists is used
 * only if it is owned by this user (or has that group) and its mode lets nobody else in, and
 * its header is checked field by field before anything in it is used: a name another user
 * holds is refused with KVT_EEXIST naming the holder, an object whose mode lets others in with
 * KVT_ESTATE, a damaged header with KVT_EPROTO or KVT_EVERSION. The names are removed when the
 * last replica detaches (kvt_node_unlink removes what crashed replicas left behind). A sharer
 * that shrinks an object under the others (ftruncate) costs them misses, never a signal: their
 * mappings are guarded, and a SIGBUS inside one puts zero pages in its place; loads from it fail
 * (the engine recomputes), peers' slots are misses from then on.
 *
 * Thread rules: a kvt_node is used by one thread at a time, the scheduler's (through the
 * manager it is attached to). Calls into the metadata take the mutex, held for microseconds.
 */
#ifndef KVTIER_NODE_H
#define KVTIER_NODE_H

#include "kvtier/base.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVT_NODE_MAX_RANKS 64u /* replicas sharing one node tier */
#define KVT_NODE_NAME_MAX  48u /* bytes of a node tier's name */

typedef struct kvt_node_config {
    const char *name;          /* the node tier's name: 1..KVT_NODE_NAME_MAX bytes of
                                  [A-Za-z0-9_.-]; required */
    uint32_t rank;             /* this replica, 0 .. ranks - 1 */
    uint32_t ranks;            /* replicas sharing the tier, 1 .. KVT_NODE_MAX_RANKS; default 1 */
    uint32_t blocks_per_rank;  /* slots each replica owns, its unused first slot included
                                  (>= 2); required */
    uint32_t hash_len;         /* bytes per block hash, as the pools'; default 16 */
    uint32_t keys_per_block;   /* keys a host block carries, as the host pool's; default 1 */
    uint32_t hash_block_size;  /* tokens per hash block, as the pools'; default 16 */
    uint64_t block_bytes;      /* bytes of one block in the workers' layout (0: not compared) */
    uint64_t hash_seed;        /* fingerprint of the hash function and its seed (for vLLM the
                                  first 8 bytes of the root hash): every replica must agree */
    uint8_t signature[32];     /* digest of whatever else must agree (model, dtype, cache
                                  groups); compared byte for byte */
    uint32_t reap_interval_ms; /* how often a locked call checks peers' liveness; default 1000 */
    uint32_t lock_timeout_ms;  /* longest wait for the metadata lock; a call that waits longer
                                  fails with KVT_EBUSY naming the holder (a live but stopped
                                  replica), instead of hanging; default 10000 */
    const char *group;         /* NULL: only this user's processes share the tier (default). A
                                  group name: replicas running as different users of that group
                                  share it (objects 0660, that group; every replica must name
                                  it, and the workers' mirrors too: kvt_mirror_config) */
    const char *dir;           /* the directory of the tier's rendezvous (see above); NULL:
                                  $XDG_RUNTIME_DIR/kvtier when that is this user's and private,
                                  else $HOME/.kvtier. Required with group: a directory of that
                                  group closed to others (chmod 2770). Every replica and the
                                  workers' mirrors (kvt_mirror_config.node_dir) name the same */
    /* room for fields to come, so the struct keeps its size: zero (as *_config_init
     * leaves it); a create refuses a config whose room is not zero */
    uint64_t reserved[5];
} kvt_node_config;

typedef struct kvt_node kvt_node;

typedef struct kvt_node_stats {
    uint32_t ranks_attached;  /* replicas attached now (this one included) */
    uint32_t published;       /* this replica's slots that carry keys */
    uint32_t peer_pinned;     /* this replica's slots that peers pin now */
    uint32_t pinned_of_peers; /* peers' slots this replica pins now */
    uint64_t epoch;           /* this attachment's number (attaches of the tier so far) */
    uint64_t full_rescans;    /* times this replica re-read every slot */
    uint64_t reaped;          /* dead peers this replica reaped */
    uint64_t lock_recoveries; /* times it found the lock's holder dead */
    uint64_t reserved[8];
} kvt_node_stats;

KVT_API void kvt_node_config_init(kvt_node_config *cfg);
/* Attaches this replica's scheduler to node tier cfg->name, creating it if no replica did.
 * KVT_EINVAL when the configuration differs from the tier's (the message names the field);
 * KVT_EBUSY when a live process is attached as cfg->rank already. A tier whose every replica
 * is dead and whose configuration differs is replaced. */
KVT_API int kvt_node_attach(const kvt_node_config *cfg, kvt_node **out);
/* Withdraws this replica's slots, releases its pins and detaches; the last replica to go
 * removes both names. Safe in any order with the manager it was lent to: while a manager
 * still holds it, the detach is deferred to that manager's kvt_offload_destroy (so finalizers
 * that run in no particular order, as at a Python interpreter's exit, never crash). */
KVT_API void kvt_node_detach(kvt_node *node);
/* Slots of the tier (ranks x blocks_per_rank): the manager's host_blocks and each worker's
 * mirror host_blocks. */
KVT_API uint32_t kvt_node_num_slots(const kvt_node *node);
/* Checks every peer's liveness now and reaps the dead; returns how many it reaped, or a
 * negative code. */
KVT_API int kvt_node_reap(kvt_node *node);
KVT_API int kvt_node_get_stats(kvt_node *node, kvt_node_stats *out);
/* Removes the names of node tier `name` (both objects and its rendezvous in the default
 * directory); mappings in use stay valid. 0 also when there was nothing to remove. */
KVT_API int kvt_node_unlink(const char *name);
/* kvt_node_unlink for a tier whose rendezvous is in `dir` (kvt_node_config.dir; NULL: the
 * default) and shared by `group` (NULL: this user only). */
KVT_API int kvt_node_unlink_at(const char *name, const char *dir, const char *group);

#ifdef __cplusplus
}
#endif

#endif
