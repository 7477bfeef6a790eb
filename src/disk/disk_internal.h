/*
 * Test hook of the disk tier: a fault injector called for every completed I/O with the
 * result the kernel gave (bytes transferred or -errno). It returns the result to use, so a
 * test can turn chosen I/Os into EIO or short transfers, or return KVT_DISK_FAULT_FATAL to
 * simulate a ring that can no longer be used. Set it before the first submit.
 */
#ifndef KVT_DISK_INTERNAL_H
#define KVT_DISK_INTERNAL_H

#include <limits.h>

#include "kvtier/disk.h"

#define KVT_DISK_FAULT_FATAL INT_MIN

typedef int (*kvt_disk_fault_fn)(void *ctx, int dir, uint32_t slot, int res);

void kvt_disk_set_fault(kvt_disk *d, kvt_disk_fault_fn fn, void *ctx);

#endif
