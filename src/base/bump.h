/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Allocation side of kvt_bump (the type and clear/release are public, in base.h).
 */
#ifndef KVT_BASE_BUMP_H
#define KVT_BASE_BUMP_H

#include "base/export.h"

#include <stddef.h>
#include <stdint.h>

#include "kvtier/base.h"

/* n bytes aligned to 8; NULL when out of memory. */
KVI_EXPORT void *kvi_bump_alloc(kvt_bump *b, size_t n);
/* NUL-terminated copy of len bytes; NULL when out of memory. */
KVI_EXPORT char *kvi_bump_strdup(kvt_bump *b, const char *s, uint32_t len);
/* Makes sure the next allocations totalling n bytes (strdup: len + 1 each, plus up to 7 bytes
 * of alignment per call) succeed without allocating; KVT_ENOMEM otherwise. */
int kvi_bump_reserve(kvt_bump *b, size_t n);

#endif
