/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Test hook of the disk tier: a fault injector called for every completed I/O with the
 * result the kernel gave (bytes transferred or -errno). It returns the result to use, so a
 * test can turn chosen I/Os into EIO or short transfers, or return KVT_DISK_FAULT_FATAL to
 * simulate a ring that can no longer be used. Set it before the first submit. Also what the
 * worker needs to know about a disk beyond the public API.
 */
#ifndef KVT_DISK_INTERNAL_H
#define KVT_DISK_INTERNAL_H

#include <limits.h>

#include "kvtier/disk.h"

#define KVT_DISK_FAULT_FATAL INT_MIN

typedef int (*kvt_disk_fault_fn)(void *ctx, int dir, uint32_t slot, int res);

void kvt_disk_set_fault(kvt_disk *d, kvt_disk_fault_fn fn, void *ctx);

/* The layout the disk was created over (the worker checks it is its host mirror's). */
const kvt_layout *kvt_disk_layout(const kvt_disk *d);

#endif
