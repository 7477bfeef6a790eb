/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Bounded FIFO of fixed-size elements in one array allocated at init (a ring buffer), for the
 * single-threaded backlogs every component keeps: event backlogs that drop what does not fit
 * (the pools', the offload manager's, the encoder-cache shard's and server's), queues whose
 * room is guaranteed by construction (re-stores, cancels, the copy engine's submissions).
 *
 * Two ways to add when full, chosen by the caller: kvi_ring_push refuses (the newest is lost,
 * the caller counts it), kvi_ring_push_over drops the oldest. Element 0 is the oldest.
 * Not thread-safe: callers that share a ring hold their own lock (kvi_spsc is the lock-free
 * one for two threads). A ring of capacity 0 holds nothing and allocates nothing.
 */
#ifndef KVT_BASE_RING_H
#define KVT_BASE_RING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/export.h"

typedef struct kvi_ring {
    unsigned char *buf;
    uint32_t elem;    /* bytes per element */
    uint32_t cap;     /* elements; at most KVI_RING_MAX */
    uint32_t head, n; /* the oldest element's index, and how many are held */
} kvi_ring;

#define KVI_RING_MAX (1u << 31)

/* Allocates room for cap elements of elem bytes (cap 0: none). KVT_EINVAL past KVI_RING_MAX or
 * for elem 0, KVT_ENOMEM (message set) if the allocation fails; *r is empty either way. */
KVI_EXPORT int kvi_ring_init(kvi_ring *r, uint32_t elem, uint32_t cap);
KVI_EXPORT void kvi_ring_free(kvi_ring *r);

/* Copies at most max of the oldest elements to out (NULL: none) and drops them; returns how
 * many. */
KVI_EXPORT uint32_t kvi_ring_take(kvi_ring *r, void *out, uint32_t max);

static inline uint32_t kvi_ring_len(const kvi_ring *r)
{
    return r->n;
}

static inline bool kvi_ring_full(const kvi_ring *r)
{
    return r->n == r->cap;
}

/* Element i, 0 the oldest; i < kvi_ring_len. */
static inline void *kvi_ring_at(const kvi_ring *r, uint32_t i)
{
    uint32_t k = r->head + i; /* < 2^32: head, i < cap <= 2^31 */
    if (k >= r->cap)
        k -= r->cap;
    return r->buf + (size_t)k * r->elem;
}

/* Room for a new newest element, or NULL when full (the ring is unchanged). The caller fills
 * every byte it will read back: the room is not cleared. */
static inline void *kvi_ring_push(kvi_ring *r)
{
    if (r->n == r->cap)
        return NULL;
    return kvi_ring_at(r, r->n++);
}

/* Drops the k oldest elements (k <= kvi_ring_len). */
static inline void kvi_ring_drop(kvi_ring *r, uint32_t k)
{
    r->n -= k;
    r->head = r->n ? (uint32_t)(((uint64_t)r->head + k) % r->cap) : 0;
}

/* As kvi_ring_push, but when full the oldest element goes to make room (*dropped set, else
 * left alone). NULL only for a ring of capacity 0. */
static inline void *kvi_ring_push_over(kvi_ring *r, bool *dropped)
{
    if (r->cap == 0)
        return NULL;
    if (r->n == r->cap) {
        r->head = r->head + 1 == r->cap ? 0 : r->head + 1;
        r->n--;
        *dropped = true;
    }
    return kvi_ring_at(r, r->n++);
}

static inline void kvi_ring_clear(kvi_ring *r)
{
    r->head = r->n = 0;
}

/* Typed access: KVI_RING_AT(&q, kvt_pool_event, i). */
#define KVI_RING_AT(r, type, i) ((type *)kvi_ring_at((r), (i)))

#endif
