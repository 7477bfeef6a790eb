/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Single-producer single-consumer queue of fixed-size elements (a lock-free ring).
 *
 * One thread pushes, one thread pops. The producer and consumer positions live on separate
 * cache lines, and each side keeps a private copy of the other's position so that it touches
 * the shared line only when its cached view says the ring is full (producer) or empty
 * (consumer). Release/acquire ordering on the positions publishes element bytes.
 *
 * Capacity is rounded up to a power of two; memory is allocated once at init.
 */
#ifndef KVT_BASE_SPSC_H
#define KVT_BASE_SPSC_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kvi_spsc {
    _Alignas(64) _Atomic uint64_t head; /* next slot to pop; written by the consumer */
    uint64_t tail_cache;                /* consumer's view of tail */
    _Alignas(64) _Atomic uint64_t tail; /* next slot to push; written by the producer */
    uint64_t head_cache;                /* producer's view of head */
    _Alignas(64) unsigned char *buf;
    uint64_t mask;
    uint32_t elem_size;
} kvi_spsc;

int kvi_spsc_init(kvi_spsc *q, uint32_t elem_size, uint32_t capacity);
void kvi_spsc_destroy(kvi_spsc *q);
/* Producer only. False when full. */
bool kvi_spsc_push(kvi_spsc *q, const void *elem);
/* Consumer only. False when empty. */
bool kvi_spsc_pop(kvi_spsc *q, void *elem);
/* Number of slots (a power of two). */
static inline uint64_t kvi_spsc_capacity(const kvi_spsc *q)
{
    return q->mask + 1;
}
/* Elements queued, as seen at some instant; exact only when both sides are quiet. */
uint64_t kvi_spsc_size(kvi_spsc *q);

#endif
