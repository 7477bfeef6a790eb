/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Records kept in arrays and linked by index, not by pointer: the array may be reallocated as
 * it grows, an index is half a pointer, and a record can sit on several lists at once through
 * several links. Two containers, both generic over the record type through (array, stride,
 * offset of the field):
 *
 *   slot tables  an array grown on demand whose free slots are threaded through a uint32_t
 *                field (kvi_slot_take / kvi_slot_give);
 *   index lists  doubly linked lists through a kvi_ilink field (head and tail in a kvi_ilist):
 *                FIFOs, LRU orders and tombstone queues.
 *
 * The macros take the array and the field's name: KVI_ILIST_PUSH_BACK(&sh->lru, sh->res, lru, i).
 * KVI_NIL ends a list and marks an unlinked record.
 */
#ifndef KVI_BASE_ILIST_H
#define KVI_BASE_ILIST_H

#include <stddef.h>
#include <stdint.h>

#include "base/array.h"

#define KVI_NIL UINT32_MAX

typedef struct kvi_ilink {
    uint32_t prev, next;
} kvi_ilink;

typedef struct kvi_ilist {
    uint32_t head, tail;
} kvi_ilist;

static inline void kvi_ilist_init(kvi_ilist *l)
{
    l->head = l->tail = KVI_NIL;
}

static inline kvi_ilink *kvi_ilink_at(void *base, size_t stride, size_t off, uint32_t i)
{
    return (kvi_ilink *)((char *)base + (size_t)i * stride + off);
}

static inline void kvi_ilist_push_back(kvi_ilist *l, void *base, size_t stride, size_t off,
                                       uint32_t i)
{
    kvi_ilink *e = kvi_ilink_at(base, stride, off, i);
    e->prev = l->tail;
    e->next = KVI_NIL;
    if (l->tail == KVI_NIL)
        l->head = i;
    else
        kvi_ilink_at(base, stride, off, l->tail)->next = i;
    l->tail = i;
}

/* Unlinks i (which must be on l) and marks it unlinked. */
static inline void kvi_ilist_remove(kvi_ilist *l, void *base, size_t stride, size_t off, uint32_t i)
{
    kvi_ilink *e = kvi_ilink_at(base, stride, off, i);
    if (e->prev == KVI_NIL)
        l->head = e->next;
    else
        kvi_ilink_at(base, stride, off, e->prev)->next = e->next;
    if (e->next == KVI_NIL)
        l->tail = e->prev;
    else
        kvi_ilink_at(base, stride, off, e->next)->prev = e->prev;
    e->prev = e->next = KVI_NIL;
}

#define KVI_ILIST_ARGS(arr, field) (arr), sizeof(*(arr)), offsetof(__typeof__(*(arr)), field)
#define KVI_ILIST_PUSH_BACK(l, arr, field, i)                                                      \
    kvi_ilist_push_back((l), KVI_ILIST_ARGS(arr, field), (i))
#define KVI_ILIST_REMOVE(l, arr, field, i) kvi_ilist_remove((l), KVI_ILIST_ARGS(arr, field), (i))

/* ---- slot tables -------------------------------------------------------------------------- */

static inline uint32_t *kvi_slot_next(void *arr, size_t elem, size_t next_off, uint32_t i)
{
    return (uint32_t *)((char *)arr + (size_t)i * elem + next_off);
}

/* A free slot of *arr (n used so far, cap allocated, free_head the free list; the array grows
 * when the list is empty), or KVI_NIL if memory ran out. The caller initialises it. */
static inline uint32_t kvi_slot_take(void **arr, uint32_t *n, uint32_t *cap, uint32_t *free_head,
                                     size_t elem, size_t next_off)
{
    if (*free_head == KVI_NIL) {
        if (kvi_array_grow(arr, cap, *n + 1ull, elem))
            return KVI_NIL;
        *kvi_slot_next(*arr, elem, next_off, *n) = KVI_NIL;
        *free_head = (*n)++;
    }
    uint32_t i = *free_head;
    *free_head = *kvi_slot_next(*arr, elem, next_off, i);
    return i;
}

/* Puts slot i back on the free list. */
static inline void kvi_slot_give(void *arr, uint32_t *free_head, size_t elem, size_t next_off,
                                 uint32_t i)
{
    *kvi_slot_next(arr, elem, next_off, i) = *free_head;
    *free_head = i;
}

#endif
