/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The remote tier as the offload manager reaches it. A kvt_remote (libkvtier_net) starts
 * with this port, so the manager (libkvtier) calls it without linking UCX, ZeroMQ or hiredis
 * — the same arrangement as the disk's kvi_xfer_port.
 */
#ifndef KVI_BASE_REMOTE_PORT_H
#define KVI_BASE_REMOTE_PORT_H

#include <stdbool.h>
#include <stdint.h>

#include "kvtier/remote.h"

struct kvi_xfer_ops;

typedef struct kvi_remote_port {
    int (*lookup)(kvt_remote *r, const uint8_t *hashes, uint32_t n, kvt_remote_loc *out,
                  uint32_t *n_hit);
    int (*lookup_peer)(const kvt_remote *r, uint32_t index, kvt_remote_peer *out);
    /* The manager lets go of it (its teardown): if its owner destroyed it meanwhile, and no
     * worker reads through it, this completes that destroy. */
    void (*unlend)(kvt_remote *r);
    /* A worker's reads of remote blocks into the host mirror (kvt_worker_attach_remote): a
     * transfer backend (port/xfer.h) reading on a thread of its own, by owner, into this
     * remote's slots; its close lets go of r as unlend does. */
    int (*stage_open)(kvt_remote *r, uint32_t tier, const struct kvi_xfer_ops **ops, void **impl);
    /* kvt_remote_get_stats, for the manager's exposition */
    void (*stats)(kvt_remote *r, kvt_remote_stats *out);
    bool lent;     /* a manager holds it (set by the manager's attach) */
    bool staged;   /* a worker reads through it (set by stage_open) */
    bool orphaned; /* kvt_remote_destroy was called while lent or staged: the last to let
                      go destroys it */
    const kvt_region *regions; /* the arrays it serves and reads into, n_regions of them */
    uint32_t n_regions;
    uint32_t n_slots;     /* slots it serves (0: none) */
    uint32_t hash_len;    /* bytes per block hash */
    uint64_t block_bytes; /* bytes per block, all pieces */
    uint32_t parts;       /* ranks of every engine of the space (a block's parts), >= 1 */
    uint32_t rank;        /* this one's part, or KVT_REMOTE_NO_RANK */
    bool lookup_only;     /* a scheduler's directory client: the ranks serve, publish and
                             read, each through a remote of its own */
} kvi_remote_port;

/* The port at the start of a kvt_remote (C11 6.7.2.1: a pointer to a structure, suitably
 * converted, points to its first member). */
static inline kvi_remote_port *kvi_remote_port_of(kvt_remote *r)
{
    return (kvi_remote_port *)(void *)r;
}

#endif
