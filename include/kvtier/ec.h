/*
 * kvtier encoder-cache transfer (vLLM ECMooncakeConnector): memory management.
 *
 *   kvt_slab   the allocator over one registered buffer that producers stage embeddings in
 *              and consumers reserve receive space in (spec ec-transfer §3.1): 256-byte
 *              granularity, first fit over a sorted free list, split from the front, free
 *              coalescing with both neighbours.
 *
 * (The reservation table, resident pool and schedulers of issue 6 will join this header.)
 *
 * Thread rules: a slab is used by one thread at a time.
 */
#ifndef KVTIER_EC_H
#define KVTIER_EC_H

#include "kvtier/base.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVT_SLAB_GRANULE 256u

/* An allocation: nbytes exactly as asked (what a view of it exposes), at offset; rounded is
 * what it occupies and what kvt_slab_free gives back. ptr is base + offset (NULL when the
 * slab manages offsets only). */
typedef struct kvt_slab_view {
    uint64_t offset;
    uint64_t nbytes;
    uint64_t rounded;
    void *ptr;
} kvt_slab_view;

typedef struct kvt_slab kvt_slab;

/* A slab of capacity bytes (rounded down to the granule) over base (borrowed; may be NULL to
 * manage offsets only). KVT_EINVAL if capacity is below one granule. */
KVT_API int kvt_slab_create(void *base, uint64_t capacity, kvt_slab **out);
KVT_API void kvt_slab_destroy(kvt_slab *s);
/* First fit of nbytes (> 0) rounded up to the granule. KVT_ENOSPC (and *out zeroed) when no
 * free extent is large enough; the slab is unchanged. */
KVT_API int kvt_slab_alloc(kvt_slab *s, uint64_t nbytes, kvt_slab_view *out);
/* Gives an allocation back, coalescing with its free neighbours. A view that is not
 * granule-aligned, lies outside the slab or overlaps free space (a double free) is refused
 * with KVT_EINVAL and changes nothing. */
KVT_API int kvt_slab_free(kvt_slab *s, const kvt_slab_view *v);
KVT_API uint64_t kvt_slab_capacity(const kvt_slab *s);
KVT_API uint64_t kvt_slab_free_bytes(const kvt_slab *s);
/* Free extents (fragmentation): 1 when everything free is one piece. */
KVT_API uint32_t kvt_slab_free_extents(const kvt_slab *s);
/* Largest single allocation that would succeed now. */
KVT_API uint64_t kvt_slab_largest_free(const kvt_slab *s);

#ifdef __cplusplus
}
#endif

#endif /* KVTIER_EC_H */
