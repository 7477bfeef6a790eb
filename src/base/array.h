/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Growable arrays: one doubling rule for every list that grows to its largest size and then
 * stays there (metadata lists, per-job descriptor arrays, layout regions, reply buffers).
 */
#ifndef KVT_BASE_ARRAY_H
#define KVT_BASE_ARRAY_H

#include "base/export.h"

#include <stddef.h>
#include <stdint.h>

/* Makes room for need elements of elem bytes in *arr (capacity *cap, doubled from 16 as
 * needed, at most UINT32_MAX). KVT_ELIMIT past that, KVT_ENOMEM (message set) if realloc
 * fails; *arr and *cap are unchanged on failure. New elements are not initialized. */
KVI_EXPORT int kvi_array_grow(void **arr, uint32_t *cap, uint64_t need, size_t elem);

#endif
