/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Event table: the transfers in flight of one kind, each named by the int64 event id it was
 * issued under and carrying a record of the caller's type, for a component that issues events
 * in ascending id and hears of their completion by id (the offload manager, per tier and
 * direction).
 *
 * Everything is allocated at init for cap entries: the records (rec_size bytes each, zeroed
 * when added), a free list, an id map (open addressing over a mixed id) and the active list in
 * ascending id, so completions are found in O(1) and a walk over what is in flight (reset,
 * stats, metadata assembly) goes oldest first. Entries are named by index; an index stays
 * valid until its entry is removed. Not thread-safe.
 */
#ifndef KVT_BASE_EVTABLE_H
#define KVT_BASE_EVTABLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/ilist.h"
#include "base/map.h"

struct kvi_evslot {
    int64_t id;
    kvi_ilink link;     /* the active list */
    uint32_t free_next; /* the free list */
};

typedef struct kvi_evtable {
    struct kvi_evslot *s;
    unsigned char *rec;
    size_t rec_size;
    uint32_t cap, n, free_head;
    kvi_ilist active; /* ascending id */
    kvi_map map;
} kvi_evtable;

/* Room for cap entries with records of rec_size bytes; KVT_ENOMEM (message set) when it cannot
 * be allocated. A table of capacity 0 holds nothing. */
int kvi_evtable_init(kvi_evtable *t, uint32_t cap, size_t rec_size);
void kvi_evtable_free(kvi_evtable *t);

/* A new entry under id, larger than every active one, with its record zeroed; KVI_NIL when
 * full. */
uint32_t kvi_evtable_add(kvi_evtable *t, int64_t id);
/* The entry of id, or KVI_NIL. */
uint32_t kvi_evtable_find(const kvi_evtable *t, int64_t id);
void kvi_evtable_remove(kvi_evtable *t, uint32_t i);

static inline void *kvi_evtable_rec(const kvi_evtable *t, uint32_t i)
{
    return t->rec + (size_t)i * t->rec_size;
}

/* The index of a record pointer of this table. */
static inline uint32_t kvi_evtable_index(const kvi_evtable *t, const void *rec)
{
    return (uint32_t)(((const unsigned char *)rec - t->rec) / t->rec_size);
}

static inline uint32_t kvi_evtable_len(const kvi_evtable *t)
{
    return t->n;
}

static inline bool kvi_evtable_full(const kvi_evtable *t)
{
    return t->n == t->cap;
}

/* Walk in ascending id: for (i = kvi_evtable_first(t); i != KVI_NIL; i = kvi_evtable_next(t, i));
 * the entry at i may be removed once its successor is read. */
static inline uint32_t kvi_evtable_first(const kvi_evtable *t)
{
    return t->active.head;
}

static inline uint32_t kvi_evtable_next(const kvi_evtable *t, uint32_t i)
{
    return t->s[i].link.next;
}

#endif
