/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Chunked lists of 32-bit ids drawn from one preallocated pool (an unrolled linked list).
 *
 * For per-request lists of variable length on a path that must not allocate: every list takes
 * 64-byte chunks (15 ids and a link) from a pool sized once at init. Push, release and walk
 * are O(1) per id; kvi_idpool_can_hold tells in advance whether n more ids fit, so a caller
 * can check before it changes anything. Not thread-safe.
 */
#ifndef KVT_BASE_IDLIST_H
#define KVT_BASE_IDLIST_H

#include <stdbool.h>
#include <stdint.h>

#define KVT_IDCHUNK_IDS 15u
#define KVT_IDNONE      UINT32_MAX

typedef struct kvi_idpool {
    uint32_t *chunks; /* n_chunks x 16 words: word 0 links, words 1..15 hold ids */
    uint32_t n_chunks;
    uint32_t free_head;
    uint32_t n_free;
} kvi_idpool;

typedef struct kvi_idlist {
    uint32_t head, tail; /* chunk indices, KVT_IDNONE when empty */
    uint32_t len;
} kvi_idlist;

/* A pool able to hold at least `ids` ids in one list (more lists hold fewer: each list
 * wastes at most one partly filled chunk). */
int kvi_idpool_init(kvi_idpool *p, uint32_t ids);
void kvi_idpool_free(kvi_idpool *p);

static inline void kvi_idlist_init(kvi_idlist *l)
{
    l->head = l->tail = KVT_IDNONE;
    l->len = 0;
}

/* True if list l can take n more ids from the pool. */
bool kvi_idpool_can_hold(const kvi_idpool *p, const kvi_idlist *l, uint32_t n);
/* Appends v; KVT_ENOSPC when the pool is exhausted (l unchanged). */
int kvi_idlist_push(kvi_idpool *p, kvi_idlist *l, uint32_t v);
/* Returns every chunk of l to the pool and empties l. */
void kvi_idlist_release(kvi_idpool *p, kvi_idlist *l);

/* Walk: for (kvi_iditer it = kvi_idlist_begin(p, l); kvi_iditer_ok(&it); kvi_iditer_next(p, &it))
 *           use(kvi_iditer_get(p, &it)); */
typedef struct kvi_iditer {
    uint32_t chunk, slot, left;
} kvi_iditer;

static inline kvi_iditer kvi_idlist_begin(const kvi_idpool *p, const kvi_idlist *l)
{
    (void)p;
    kvi_iditer it = {l->head, 0, l->len};
    return it;
}

static inline bool kvi_iditer_ok(const kvi_iditer *it)
{
    return it->left > 0;
}

static inline uint32_t kvi_iditer_get(const kvi_idpool *p, const kvi_iditer *it)
{
    return p->chunks[(uint64_t)it->chunk * 16 + 1 + it->slot];
}

static inline void kvi_iditer_next(const kvi_idpool *p, kvi_iditer *it)
{
    it->left--;
    if (++it->slot == KVT_IDCHUNK_IDS) {
        it->slot = 0;
        it->chunk = p->chunks[(uint64_t)it->chunk * 16];
    }
}

#endif
