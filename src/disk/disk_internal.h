/* SPDX-License-Identifier: Apache-2.0 */
/* What the worker needs to know about a disk beyond the public API. */
#ifndef KVT_DISK_INTERNAL_H
#define KVT_DISK_INTERNAL_H

#include "kvtier/disk.h"

/* The layout the disk was created over (the worker checks it is its host mirror's). */
const kvt_layout *kvi_disk_layout(const kvt_disk *d);

#endif
