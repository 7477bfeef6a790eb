/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The worker's one view of what moves blocks between two tiers: the copy engine (CPU
 * threads or CUDA, GPU <-> host mirror) and the disk tier (GPU or host mirror <-> the rank's
 * file) both answer it, and the worker drives a stack of them (stage 0: the engine's KV to
 * the first offload tier; stage 1: the host mirror to the disk behind it) without asking
 * which is which. Each backend implements it beside its own code (copy/copy_xfer.c,
 * disk/disk_xfer.c).
 *
 * Every verb is per direction (KVT_COPY_STORE / KVT_COPY_LOAD) and event-ordered as
 * kvt_copy_submit / kvt_disk_submit are. What differs between backends is said by data:
 * whether a KVT_EIO means the backend is gone for good (a disk whose ring failed: the stage
 * turns dead and later transfers fail without I/O), whether a failed store leaves the rank in
 * an unknown state (a DMA fault: the rank must restart), and whether load failures are known
 * per block (take_invalid) as well as per event.
 */
#ifndef KVI_BASE_XFER_H
#define KVI_BASE_XFER_H

#include <stdbool.h>
#include <stdint.h>

#include "kvtier/copy.h"

struct kvt_offload_meta;

typedef struct kvi_xfer_ops {
    const char *name;         /* "copy", "disk" */
    bool eio_is_final;        /* KVT_EIO from submit, poll or flush: the backend stopped */
    bool store_fail_is_fatal; /* a failed store: the rank must restart */
    int (*submit)(void *impl, int dir, int64_t event, const uint32_t *src, const uint32_t *dst,
                  uint32_t n, void *wait);
    int (*poll)(void *impl, int dir, int64_t *hwm);
    /* finished events of dir that failed, oldest first, each once */
    uint32_t (*take_failed)(void *impl, int dir, int64_t *out, uint32_t cap);
    /* destination blocks of loads that failed, each once; NULL: failures are per event */
    uint32_t (*take_invalid)(void *impl, uint32_t *out, uint32_t cap);
    int (*flush)(void *impl);
    uint32_t (*outstanding)(const void *impl, int dir);
    /* Optional: the step's metadata, before its transfers are submitted, for a backend whose
     * sources are described there rather than by a block id alone (the remote tier: a load's
     * source id names an owner, slot, generation and hash in meta->remote). Kept only until
     * the submits of that step return. */
    int (*set_meta)(void *impl, const struct kvt_offload_meta *meta);
    /* Optional: frees a backend the worker created itself (kvt_worker_attach_remote); NULL
     * for the ones it borrows (the disk). */
    void (*close)(void *impl);
} kvi_xfer_ops;

typedef struct kvi_xfer {
    const kvi_xfer_ops *ops;
    void *impl;
} kvi_xfer;

/* A backend whose handle a program creates and lends to the worker (the disk) starts that
 * handle with a port: the worker, in libkvtier, reaches the backend through it without linking
 * the backend's own library (libkvtier_disk), so programs that move no bytes to disk never
 * load liburing. */
typedef struct kvi_xfer_port {
    const kvi_xfer_ops *ops;
    const kvt_layout *layout; /* the blocks on the near side */
    uint32_t num_slots;       /* blocks of the tier the backend fills */
} kvi_xfer_port;

/* The port at the start of a lent handle (C11 6.7.2.1: a pointer to a structure, suitably
 * converted, points to its first member). */
static inline const kvi_xfer_port *kvi_xfer_port_of(const void *handle)
{
    return (const kvi_xfer_port *)handle;
}

/* The copy engine, created and owned by the worker. */
kvi_xfer kvi_xfer_copy(kvt_copy *c);

#endif
