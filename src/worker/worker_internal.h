/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What a tier behind the host costs on the worker side: a transfer backend (port/xfer.h) that
 * moves blocks between the host mirror and its own blocks, attached at the tier's index. The
 * disk is one (kvt_worker_attach_disk_tier); a tier kind of its own (tests/disk/test_disk.c
 * writes an in-memory one with injected latency) attaches through this call, and nothing in
 * the offload manager changes for it.
 */
#ifndef KVT_WORKER_INTERNAL_H
#define KVT_WORKER_INTERNAL_H

#include "port/xfer.h"
#include "kvtier/worker.h"

/* Attaches backend impl (whose port says its operations, its near-side layout — the host
 * mirror's, checked — and its block count) as tier `tier` (1 .. KVT_MAX_TIERS - 1) of worker
 * w; `what` names it in errors. KVT_ERANGE, KVT_ESTATE (index taken, a worker without a host
 * mirror) or KVT_EINVAL (another layout, or impl attached already) as
 * kvt_worker_attach_disk_tier. */
int kvi_worker_attach_xfer(kvt_worker *w, uint32_t tier, const kvi_xfer_port *port, void *impl,
                           const char *what);

#endif
