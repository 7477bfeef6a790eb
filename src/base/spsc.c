/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Single-producer single-consumer ring; see spsc.h.
 */
#include "base/spsc.h"

#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/util.h"

int kvi_spsc_init(kvi_spsc *q, uint32_t elem_size, uint32_t capacity)
{
    memset(q, 0, sizeof(*q));
    if (elem_size == 0 || capacity == 0 || capacity > (1u << 30))
        return kvt_fail(KVT_EINVAL, "spsc: element size %u and capacity %u must be in 1..2^30",
                        elem_size, capacity);
    uint64_t n = kvi_pow2_ceil(capacity);
    q->buf = aligned_alloc(KVT_CACHELINE, ((n * elem_size + 63) / 64) * 64);
    if (!q->buf)
        return kvt_fail(KVT_ENOMEM, "spsc: cannot allocate %llu elements of %u bytes",
                        (unsigned long long)n, elem_size);
    q->mask = n - 1;
    q->elem_size = elem_size;
    atomic_init(&q->head, 0);
    atomic_init(&q->tail, 0);
    return 0;
}

void kvi_spsc_destroy(kvi_spsc *q)
{
    free(q->buf);
    q->buf = NULL;
}

bool kvi_spsc_push(kvi_spsc *q, const void *elem)
{
    uint64_t tail = atomic_load_explicit(&q->tail, memory_order_relaxed);
    if (tail - q->head_cache > q->mask) {
        q->head_cache = atomic_load_explicit(&q->head, memory_order_acquire);
        if (tail - q->head_cache > q->mask)
            return false;
    }
    memcpy(q->buf + (tail & q->mask) * q->elem_size, elem, q->elem_size);
    atomic_store_explicit(&q->tail, tail + 1, memory_order_release);
    return true;
}

bool kvi_spsc_pop(kvi_spsc *q, void *elem)
{
    uint64_t head = atomic_load_explicit(&q->head, memory_order_relaxed);
    if (head == q->tail_cache) {
        q->tail_cache = atomic_load_explicit(&q->tail, memory_order_acquire);
        if (head == q->tail_cache)
            return false;
    }
    memcpy(elem, q->buf + (head & q->mask) * q->elem_size, q->elem_size);
    atomic_store_explicit(&q->head, head + 1, memory_order_release);
    return true;
}

uint64_t kvi_spsc_size(kvi_spsc *q)
{
    uint64_t head = atomic_load_explicit(&q->head, memory_order_acquire);
    uint64_t tail = atomic_load_explicit(&q->tail, memory_order_acquire);
    return tail - head;
}
