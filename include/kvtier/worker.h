/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvtier worker: the worker side of KV-cache offload (vLLM SimpleCPUOffloadWorker), one per
 * tensor-parallel rank. It executes the manager's kvt_offload_meta on its rank's KV cache and
 * reports back: finished loads as request ids, finished stores as {event: 1} in a
 * kvt_offload_worker_meta, failed loads as invalid device block ids.
 *
 * One engine step, in the order the engine calls it:
 *
 *   kvt_worker_bind(meta)                 this step's metadata (borrowed until clear)
 *   kvt_worker_handle_preemptions()       need_flush: finish every queued and issued copy
 *   (engine runs the forward on its compute stream)
 *   kvt_worker_get_finished(stream)       launch this step's loads and stores after a
 *                                         compute-done point recorded on stream, poll,
 *                                         return finished load requests
 *   kvt_worker_build_meta(out)            completed store events since the last call
 *   kvt_worker_take_invalid_blocks()      device blocks whose load failed
 *   kvt_worker_clear()
 *
 * Safety: stores wait for the compute-done point (the forward may still be writing the KV
 * they read, vLLM #45704), and so do loads (an earlier step's attention may still read a
 * block a load overwrites, vLLM #47282). Every block id is checked against the layout and
 * the mirror at bind, before any byte moves.
 *
 * Failures: a load event the backend could not complete reports its requests as finished and
 * its destination blocks through kvt_worker_take_invalid_blocks (the engine recomputes them).
 * A failed store is never reported as complete (its bytes may be wrong, so the blocks must
 * not become findable); the worker then fails every later get_finished with KVT_EIO, since a
 * device error is sticky and the engine must restart the rank.
 *
 * Thread rules: one thread (the rank's engine thread) makes every call.
 */
#ifndef KVTIER_WORKER_H
#define KVTIER_WORKER_H

#include "kvtier/base.h"
#include "kvtier/copy.h"
#include "kvtier/disk.h"
#include "kvtier/meta.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvt_worker_config {
    uint32_t rank;        /* for messages */
    kvt_copy_config copy; /* the copy engine's configuration */
    /* room for fields to come, so the struct keeps its size: zero (as *_config_init
     * leaves it); a create refuses a config whose room is not zero */
    uint64_t reserved[8];
} kvt_worker_config;

typedef struct kvt_worker kvt_worker;
typedef struct kvt_remote kvt_remote; /* kvtier/remote.h */

KVT_API void kvt_worker_config_init(kvt_worker_config *cfg);
/* Creates the worker and its copy engine over layout (the rank's KV cache) and mirror (its
 * host tier); both are borrowed and must outlive the worker. */
KVT_API int kvt_worker_create(const kvt_worker_config *cfg, const kvt_layout *layout,
                              const kvt_mirror *mirror, kvt_worker **out);
/* A worker whose offload tier is a disk (disk slots are the "host" blocks of the metadata,
 * the manager's host pool sized to kvt_disk_num_slots). The disk is borrowed
 * (destroy the worker first). An I/O error fails one transfer: a store is reported
 * completed *and* failed (never findable), a load's failed blocks come back through
 * kvt_worker_take_invalid_blocks. A fatal disk error turns the tier off: from then on every
 * transfer fails at once, without I/O, and the engine keeps serving from its GPU. */
KVT_API int kvt_worker_create_disk(const kvt_worker_config *cfg, const kvt_layout *layout,
                                   kvt_disk *disk, kvt_worker **out);
/* A disk behind the host tier: disk becomes tier 1 behind this worker's host mirror. It must have
 * been created over kvt_mirror_layout(mirror) (its "device blocks" are the mirror's host blocks);
 * borrowed, destroy the worker first. From then on the metadata's write-backs (host block ->
 * slot) and promotions (slot -> host block) run on it and are reported in the worker
 * metadata's tier_stores[0] / tier_loads[0] (an I/O error: completed and failed). A fatal disk
 * error turns the third tier off: its transfers fail at once, without I/O, and the host tier
 * keeps working. KVT_EINVAL if the disk's layout does not cover the mirror's blocks,
 * KVT_ESTATE on a disk worker or a second call. The same as kvt_worker_attach_disk_tier(w, 1,
 * disk). */
KVT_API int kvt_worker_attach_disk(kvt_worker *w, kvt_disk *disk);
/* disk becomes tier `tier` (1 to KVT_MAX_TIERS - 1) behind this worker's host mirror, the
 * manager's tier of that index (kvt_offload_add_tier): as kvt_worker_attach_disk, with its
 * transfers in tiers[tier - 1] of the metadata and reported in tier_stores[tier - 1] /
 * tier_loads[tier - 1]. Every tier behind exchanges blocks with the host mirror only, so each
 * disk is created over kvt_mirror_layout(mirror). KVT_ERANGE for another index, KVT_ESTATE if
 * the index is taken, KVT_EINVAL if the disk is another index's already. */
KVT_API int kvt_worker_attach_disk_tier(kvt_worker *w, uint32_t tier, kvt_disk *disk);
/* The remote tier (kvtier/remote.h) becomes tier `tier` behind this worker's host mirror, the
 * manager's remote tier (kvt_offload_attach_remote; kvt_offload_remote_tier says its index):
 * its loads — reads of blocks other instances hold, described in the metadata's remote
 * section — are read on a thread of the worker's own, by owner, into the host blocks they
 * name (the remote's slots, which must be this mirror's regions), bounded by the remote's
 * timeout_ms. A block not read whole and checked is reported in failed_promo (the manager
 * makes it invalid; the engine recomputes it); the event completes either way. The remote is
 * borrowed until kvt_worker_destroy (a kvt_remote_destroy meanwhile is finished then).
 * KVT_ERANGE / KVT_ESTATE as kvt_worker_attach_disk_tier, KVT_EINVAL if the remote serves
 * other arrays than the mirror's. */
KVT_API int kvt_worker_attach_remote(kvt_worker *w, uint32_t tier, kvt_remote *remote);
/* Waits for every copy, then frees the worker. */
KVT_API void kvt_worker_destroy(kvt_worker *w);

/* bind_connector_metadata: validates meta (invariants, block ids within the layout and the
 * mirror) and borrows it until kvt_worker_clear; its events become pending. Fails without
 * binding anything if meta is invalid or an event does not exceed the previous one. */
KVT_API int kvt_worker_bind(kvt_worker *w, const kvt_offload_meta *meta);
/* handle_preemptions: if the bound metadata asks for a flush, blocks until every copy
 * submitted so far, queued or issued, has finished (reported by the next get_finished). */
KVT_API int kvt_worker_handle_preemptions(kvt_worker *w);
/* get_finished: submits the bound metadata's load and store events (once per bind; CUDA:
 * both wait for a compute-done event recorded on compute_stream, a CUstream, NULL meaning the
 * default stream; ignored by the CPU backend), then polls without blocking. *reqs / *n
 * receive the requests whose loads finished, translated through the bound metadata's
 * load_event_to_reqs; the strings point into that metadata and the array stays valid until
 * the next call. */
KVT_API int kvt_worker_get_finished(kvt_worker *w, void *compute_stream, const kvt_str **reqs,
                                    uint32_t *n);
/* build_connector_worker_meta: moves the store events completed since the last call into
 * out ({event: 1} each; out is cleared first). */
KVT_API int kvt_worker_build_meta(kvt_worker *w, kvt_offload_worker_meta *out);
/* Device block ids whose load failed since the last call (up to cap into out); returns how
 * many were written. The rest stay for the next call. */
KVT_API uint32_t kvt_worker_take_invalid_blocks(kvt_worker *w, uint32_t *out, uint32_t cap);
/* clear_connector_metadata: forgets the bound metadata. */
KVT_API void kvt_worker_clear(kvt_worker *w);
/* Blocks until every transfer submitted so far has finished. */
KVT_API int kvt_worker_flush(kvt_worker *w);
/* Load / store events submitted and not yet reported (KVT_COPY_LOAD / KVT_COPY_STORE; three
 * tiers: 2 + KVT_COPY_LOAD promotions, 2 + KVT_COPY_STORE write-backs). */
KVT_API uint32_t kvt_worker_pending(const kvt_worker *w, int dir);
/* The worker's copy engine (backend kind, outstanding counts); NULL for a disk worker. */
KVT_API kvt_copy *kvt_worker_copy(kvt_worker *w);

#ifdef __cplusplus
}
#endif

#endif /* KVTIER_WORKER_H */
