/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvtier disk: a rank's KV blocks in slots of a private file on local disk, moved with
 * io_uring.
 *
 * One file per rank (path + ".rank<N>"): a stale file is unlinked first, the new one created
 * O_CREAT | O_EXCL | O_NOFOLLOW with mode 0600 (slot contents encode prompts), opened
 * O_DIRECT unless page_cache is set, and unlinked at shutdown. Slot s lives at byte
 * s * slot_bytes; within a slot the layout's regions are concatenated in region order and
 * the slot is padded to the direct-I/O alignment.
 *
 * Stores (device blocks -> slots) and loads (slots -> device blocks) run on separate
 * pipelines, each a thread with its own io_uring (the file registered as a fixed file, the
 * staging buffers as fixed buffers where the kernel allows it) and queue_depth staging
 * buffers, so a load never queues behind stores. Within a pipeline, copying one block between
 * the device and a staging buffer overlaps the disk I/O of the others; an event completes
 * only after all its I/O finished and its buffers are free again.
 *
 * Failures, per transfer: an I/O error or a short read/write fails that block only; the rest
 * of the event proceeds and the event still completes. A store event with a failed block is
 * listed by kvt_disk_take_failed (its slots must not become findable); a load's failed
 * destination blocks are listed by kvt_disk_take_invalid_blocks (the engine recomputes them).
 * A failure that makes the file unusable (the ring cannot be submitted to or waited on) is
 * fatal and sticky: every later submit and poll fails with KVT_EIO naming the file and the
 * first error.
 *
 * Layouts in host memory are read and written in place when aligned (vectored I/O) or through
 * the staging buffers; layouts on a CUDA device go through pinned staging buffers and a
 * lowest-priority copy stream per pipeline (no GPUDirect Storage), after the job's wait event.
 *
 * Thread rules: one thread drives a kvt_disk; its pipelines' threads are internal.
 */
#ifndef KVTIER_DISK_H
#define KVTIER_DISK_H

#include "kvtier/base.h"
#include "kvtier/layout.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvt_disk_config {
    const char *path;        /* base path of the rank's file (required) */
    uint32_t rank;           /* the file is path + ".rank<rank>" */
    uint64_t capacity_bytes; /* slots = capacity / slot_bytes (must be >= 1) */
    uint32_t alignment;      /* direct-I/O alignment, a power of two >= 512; default 4096 */
    bool page_cache;         /* buffered I/O instead of O_DIRECT; slots are not padded */
    uint32_t queue_depth;    /* I/Os in flight per pipeline (= staging buffers); default 16 */
    uint32_t max_events;     /* events outstanding per direction; default 1024 */
    /* room for fields to come, so the struct keeps its size: zero (as *_config_init
     * leaves it); a create refuses a config whose room is not zero */
    uint64_t reserved[8];
} kvt_disk_config;

typedef struct kvt_disk kvt_disk;

KVT_API void kvt_disk_config_init(kvt_disk_config *cfg);
/* Creates the rank's file and starts both pipelines. layout is borrowed (outlives the disk).
 * KVT_EINVAL for a bad configuration (capacity smaller than one slot, alignment not a power
 * of two), KVT_ESYS naming the path when the file cannot be created (a file system without
 * O_DIRECT says so and suggests page_cache). */
KVT_API int kvt_disk_create(const kvt_disk_config *cfg, const kvt_layout *layout, kvt_disk **out);
/* Waits for both pipelines (10 s at most each), then closes and unlinks the file. A pipeline
 * that does not stop keeps its descriptor open (a reused descriptor number would let a late
 * write land in another file). */
KVT_API void kvt_disk_destroy(kvt_disk *d);
KVT_API uint32_t kvt_disk_num_slots(const kvt_disk *d);
KVT_API uint64_t kvt_disk_slot_bytes(const kvt_disk *d);
/* The rank's file ("" after destroy). */
KVT_API const char *kvt_disk_path(const kvt_disk *d);

/* Queues an event: KVT_COPY_STORE copies device blocks src[i] to slots dst[i], KVT_COPY_LOAD
 * slots src[i] to device blocks dst[i]. Ids are checked first (KVT_ERANGE); event ids grow
 * per direction; KVT_EBUSY when max_events are outstanding; KVT_EIO after a fatal error.
 * wait (CUDA layouts: a CUevent, may be NULL; ignored for host layouts) is the compute point
 * the job's device copies wait for. */
KVT_API int kvt_disk_submit(kvt_disk *d, int dir, int64_t event, const uint32_t *src,
                            const uint32_t *dst, uint32_t n, void *wait);
/* Non-blocking: the direction's high-water mark over finished events (-1 before any). */
KVT_API int kvt_disk_poll(kvt_disk *d, int dir, int64_t *hwm);
/* Finished store events with a failed block, oldest first; each reported once. */
KVT_API uint32_t kvt_disk_take_failed(kvt_disk *d, int64_t *out, uint32_t cap);
/* Finished load events with a failed block, oldest first; each reported once (their blocks
 * are also listed by kvt_disk_take_invalid_blocks). */
KVT_API uint32_t kvt_disk_take_failed_loads(kvt_disk *d, int64_t *out, uint32_t cap);
/* Device blocks whose load failed, each reported once. */
KVT_API uint32_t kvt_disk_take_invalid_blocks(kvt_disk *d, uint32_t *out, uint32_t cap);
/* Blocks until every submitted event has finished (or a fatal error stopped the pipelines). */
KVT_API int kvt_disk_flush(kvt_disk *d);
KVT_API uint32_t kvt_disk_outstanding(const kvt_disk *d, int dir);

/* Counters per direction (index KVT_COPY_STORE = writes, KVT_COPY_LOAD = reads). */
typedef struct kvt_disk_stats {
    uint64_t events[2];      /* submitted */
    uint64_t events_done[2]; /* finished (including those with failed blocks) */
    uint64_t blocks[2];      /* blocks submitted */
    uint64_t bytes[2];       /* slot bytes moved successfully */
    uint64_t io_errors[2];   /* blocks whose I/O failed or was short */
    uint32_t fatal;          /* 1 once a fatal error stopped the tier */
    uint64_t reserved[8];    /* room for figures to come (zero) */
} kvt_disk_stats;

KVT_API void kvt_disk_get_stats(const kvt_disk *d, kvt_disk_stats *s);
/* The stats in Prometheus text (kvtier_disk_* families, label direction="write"|"read"). */
KVT_API int kvt_disk_prometheus(const kvt_disk *d, char *buf, size_t cap, size_t *len);

/* Fault injection, for tests and soak runs of the programs built on kvtier: fn is called for
 * every completed I/O (dir: KVT_COPY_STORE or KVT_COPY_LOAD) with the result the kernel gave
 * (bytes transferred or -errno) and returns the result to use, so a chosen I/O can become EIO
 * or a short transfer, or KVT_DISK_FAULT_FATAL simulates a ring that can no longer be used.
 * Set it before the first submit; fn NULL removes it. */
#define KVT_DISK_FAULT_FATAL (-2147483647 - 1)
typedef int (*kvt_disk_fault_fn)(void *ctx, int dir, uint32_t slot, int res);
KVT_API void kvt_disk_set_fault(kvt_disk *d, kvt_disk_fault_fn fn, void *ctx);

#ifdef __cplusplus
}
#endif

#endif /* KVTIER_DISK_H */
