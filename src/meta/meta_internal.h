/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Helpers shared by the metadata sources: array growth, string checks and copies, the string
 * sets of the encoder-cache worker metadata, the offload messages' block lists and tier
 * sections.
 */
#ifndef KVT_META_INTERNAL_H
#define KVT_META_INTERNAL_H

#include "base/export.h"

#include "base/bump.h"
#include "meta/wire.h"

/* Grows *arr (elements of elem bytes, capacity *cap) to hold need elements. */
KVI_EXPORT int kvi_meta_grow(void **arr, uint32_t *cap, uint32_t need, size_t elem);

/* Checks a string field: length within [min_len, KVT_META_MAX_STR], no NUL byte. */
KVI_EXPORT int kvi_meta_check_str(kvt_str s, uint32_t min_len, const char *what);

/* Copies s into b; the result points into b. */
KVI_EXPORT int kvi_meta_copy_str(kvt_bump *b, const char *s, uint32_t len, kvt_str *out);

/* Encoder-cache tensors: a dtype name (1..64 of [a-z0-9_]); a whole description (rank at most
 * KVT_EC_MAX_DIMS; for a dtype this build knows, nbytes = prod(shape) x its size). */
int kvi_meta_check_dtype(kvt_str d);
KVI_EXPORT int kvi_meta_check_tensor(uint64_t nbytes, uint32_t ndim, const uint64_t *shape,
                                     kvt_str dtype);
/* Shapes on the wire: u8 rank, rank x u64. */
KVI_EXPORT void kvi_meta_wr_shape(kvi_wr *w, uint32_t ndim, const uint64_t *shape);
KVI_EXPORT int kvi_meta_rd_shape(kvi_rd *r, uint32_t *ndim, uint64_t *shape);
/* Reads a string and copies it (NUL-terminated) into b. */
KVI_EXPORT int kvi_meta_rd_str_copy(kvi_rd *r, kvt_bump *b, kvt_str *out, const char *what);

/* Bytewise order of strings, shorter prefix first. */
int kvi_str_cmp(kvt_str a, kvt_str b);
bool kvi_str_equal(kvt_str a, kvt_str b);

/* Strings sets (sorted, unique). */
int kvi_strset_add(kvt_strset *set, kvt_bump *b, const char *s, uint32_t len);
void kvi_strset_release(kvt_strset *set);
int kvi_strset_validate(const kvt_strset *set, const char *what);
bool kvi_strset_equal(const kvt_strset *a, const kvt_strset *b);

/* The offload messages' block lists (u32 n; n x u32) and tier sections, both directions. */
bool kvi_meta_blocks_equal(const uint32_t *a, const uint32_t *b, uint32_t n);
void kvi_meta_wr_blocks(kvi_wr *w, const uint32_t *ids, uint32_t n);
/* Reads a list of at most KVT_META_MAX_BLOCKS into *a (capacity *cap, grown), its length *n. */
int kvi_meta_rd_blocks(kvi_rd *r, uint32_t **a, uint32_t *cap, uint32_t *n, const char *what);
/* The count of tier sections (at most KVT_MAX_TIERS - 1). */
int kvi_meta_rd_tier_count(kvi_rd *r, uint8_t *n);
/* Section i's tier into *tier, which holds the previous section's (0 before the first):
 * ascending, 1 .. KVT_MAX_TIERS - 1. */
int kvi_meta_rd_tier(kvi_rd *r, uint32_t i, uint8_t *tier);

#endif
