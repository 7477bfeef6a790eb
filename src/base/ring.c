/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Bounded rings; see ring.h.
 */
#include "base/ring.h"

#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/util.h"

int kvi_ring_init(kvi_ring *r, uint32_t elem, uint32_t cap)
{
    memset(r, 0, sizeof(*r));
    if (elem == 0 || cap > KVI_RING_MAX)
        return kvt_fail(KVT_EINVAL, "ring: %u elements of %u bytes is not a ring", cap, elem);
    if (cap && !(r->buf = calloc(cap, elem)))
        return kvt_fail(KVT_ENOMEM, "ring: cannot allocate %u elements of %u bytes", cap, elem);
    r->elem = elem;
    r->cap = cap;
    return 0;
}

void kvi_ring_free(kvi_ring *r)
{
    free(r->buf);
    memset(r, 0, sizeof(*r));
}

uint32_t kvi_ring_take(kvi_ring *r, void *out, uint32_t max)
{
    uint32_t n = out ? kvi_min_u32(max, r->n) : 0;
    /* at most two runs: up to the end of the array, then from its start */
    uint32_t first = kvi_min_u32(n, r->cap - r->head);
    if (first)
        memcpy(out, r->buf + (size_t)r->head * r->elem, (size_t)first * r->elem);
    if (n > first)
        memcpy((unsigned char *)out + (size_t)first * r->elem, r->buf,
               (size_t)(n - first) * r->elem);
    kvi_ring_drop(r, n);
    return n;
}
