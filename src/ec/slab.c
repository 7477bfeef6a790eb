/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Slab allocator over one registered buffer (spec ec-transfer §3.1).
 *
 * The free space is a sorted array of disjoint, non-adjacent extents (offset, size), both
 * multiples of the 256-byte granule. Allocation is first fit: the lowest extent large enough
 * is shrunk from the front (removed on an exact fit), so allocations pack towards offset 0
 * and a freed prefix is reused first. Free finds the insertion point by binary search,
 * rejects overlap with free space (a double free or a forged view), and merges with the
 * neighbours it touches, so adjacent free extents never coexist and "all free" is exactly one
 * extent.
 *
 * Costs: alloc is linear in the number of free extents (fragments, not allocations); free is
 * logarithmic plus the array shift. Pools hold at most a few thousand live items.
 */
#include <stdlib.h>
#include <string.h>

#include "base/array.h"
#include "base/util.h"
#include "base/error.h"
#include "kvtier/ec.h"

typedef struct extent {
    uint64_t off, size;
} extent;

struct kvt_slab {
    unsigned char *base;
    uint64_t capacity, free_bytes;
    extent *free;
    uint32_t n, cap;
};

int kvt_slab_create(void *base, uint64_t capacity, kvt_slab **out)
{
    *out = NULL;
    capacity -= capacity % KVT_SLAB_GRANULE;
    if (capacity == 0)
        return kvt_fail(KVT_EINVAL, "slab: capacity below one %u-byte granule", KVT_SLAB_GRANULE);
    kvt_slab *s = calloc(1, sizeof(*s));
    if (!s || kvi_array_grow((void **)&s->free, &s->cap, 1, sizeof(extent))) {
        free(s);
        return kvt_fail(KVT_ENOMEM, "slab: out of memory");
    }
    s->base = base;
    s->capacity = s->free_bytes = capacity;
    s->free[0] = (extent){0, capacity};
    s->n = 1;
    *out = s;
    return 0;
}

void kvt_slab_destroy(kvt_slab *s)
{
    if (!s)
        return;
    free(s->free);
    free(s);
}

int kvt_slab_alloc(kvt_slab *s, uint64_t nbytes, kvt_slab_view *out)
{
    memset(out, 0, sizeof(*out));
    if (nbytes == 0 || nbytes > s->capacity)
        return nbytes ? kvt_fail(KVT_ENOSPC, "slab: %llu bytes exceed the capacity of %llu",
                                 (unsigned long long)nbytes, (unsigned long long)s->capacity)
                      : kvt_fail(KVT_EINVAL, "slab: allocation of 0 bytes");
    uint64_t need = (nbytes + KVT_SLAB_GRANULE - 1) / KVT_SLAB_GRANULE * KVT_SLAB_GRANULE;
    for (uint32_t i = 0; i < s->n; i++) {
        extent *e = &s->free[i];
        if (e->size < need)
            continue;
        out->offset = e->off;
        out->nbytes = nbytes;
        out->rounded = need;
        out->ptr = s->base ? s->base + e->off : NULL;
        if (e->size == need) {
            memmove(e, e + 1, (size_t)(s->n - i - 1) * sizeof(*e));
            s->n--;
        } else {
            e->off += need;
            e->size -= need;
        }
        s->free_bytes -= need;
        return 0;
    }
    return kvt_fail(KVT_ENOSPC, "slab: no free extent of %llu bytes (%llu free in %u pieces)",
                    (unsigned long long)need, (unsigned long long)s->free_bytes, s->n);
}

int kvt_slab_free(kvt_slab *s, const kvt_slab_view *v)
{
    uint64_t off = v->offset, size = v->rounded;
    if (size == 0 || off % KVT_SLAB_GRANULE || size % KVT_SLAB_GRANULE || off > s->capacity ||
        size > s->capacity - off)
        return kvt_fail(KVT_EINVAL, "slab: free of [%llu, +%llu) is not an allocation of this slab",
                        (unsigned long long)off, (unsigned long long)size);
    /* first free extent at or after off */
    uint32_t lo = 0, hi = s->n;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (s->free[mid].off < off)
            lo = mid + 1;
        else
            hi = mid;
    }
    extent *prev = lo ? &s->free[lo - 1] : NULL, *next = lo < s->n ? &s->free[lo] : NULL;
    if ((prev && prev->off + prev->size > off) || (next && off + size > next->off))
        return kvt_fail(KVT_EINVAL,
                        "slab: free of [%llu, +%llu) overlaps free space (double free?)",
                        (unsigned long long)off, (unsigned long long)size);
    bool join_prev = prev && prev->off + prev->size == off;
    bool join_next = next && off + size == next->off;
    if (join_prev && join_next) {
        prev->size += size + next->size;
        memmove(next, next + 1, (size_t)(s->n - lo - 1) * sizeof(*next));
        s->n--;
    } else if (join_prev) {
        prev->size += size;
    } else if (join_next) {
        next->off = off;
        next->size += size;
    } else {
        int rc = kvi_array_grow((void **)&s->free, &s->cap, s->n + 1ull, sizeof(extent));
        if (rc)
            return kvi_fail_wrap(rc, "slab");
        memmove(&s->free[lo + 1], &s->free[lo], (size_t)(s->n - lo) * sizeof(extent));
        s->free[lo] = (extent){off, size};
        s->n++;
    }
    s->free_bytes += size;
    return 0;
}

KVI_GETTER(uint64_t, kvt_slab_capacity, kvt_slab, capacity)
KVI_GETTER(uint64_t, kvt_slab_free_bytes, kvt_slab, free_bytes)
KVI_GETTER(uint32_t, kvt_slab_free_extents, kvt_slab, n)

uint64_t kvt_slab_largest_free(const kvt_slab *s)
{
    uint64_t m = 0;
    for (uint32_t i = 0; i < s->n; i++)
        if (s->free[i].size > m)
            m = s->free[i].size;
    return m;
}
