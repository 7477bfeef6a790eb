/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Chunked lists of 32-bit ids drawn from one preallocated pool (an unrolled linked list).
 *
 * For per-request lists of variable length on a path that must not allocate: every list takes
 * 64-byte chunks (15 ids and a link) from a pool sized once at init. Push, release and walk
 * are O(1) per id; kvt_idpool_can_hold tells in advance whether n more ids fit, so a caller
 * can check before it changes anything. Not thread-safe.
 */
#ifndef KVT_BASE_IDLIST_H
#define KVT_BASE_IDLIST_H

#include <stdbool.h>
#include <stdint.h>

#define KVT_IDCHUNK_IDS 15u
#define KVT_IDNONE      UINT32_MAX

typedef struct kvt_idpool {
    uint32_t *chunks; /* n_chunks x 16 words: word 0 links, words 1..15 hold ids */
    uint32_t n_chunks;
    uint32_t free_head;
    uint32_t n_free;
} kvt_idpool;

typedef struct kvt_idlist {
    uint32_t head, tail; /* chunk indices, KVT_IDNONE when empty */
    uint32_t len;
} kvt_idlist;

/* A pool able to hold at least `ids` ids in one list (more lists hold fewer: each list
 * wastes at most one partly filled chunk). */
int kvt_idpool_init(kvt_idpool *p, uint32_t ids);
void kvt_idpool_free(kvt_idpool *p);

static inline void kvt_idlist_init(kvt_idlist *l)
{
    l->head = l->tail = KVT_IDNONE;
    l->len = 0;
}

/* True if list l can take n more ids from the pool. */
bool kvt_idpool_can_hold(const kvt_idpool *p, const kvt_idlist *l, uint32_t n);
/* Appends v; KVT_ENOSPC when the pool is exhausted (l unchanged). */
int kvt_idlist_push(kvt_idpool *p, kvt_idlist *l, uint32_t v);
/* Returns every chunk of l to the pool and empties l. */
void kvt_idlist_release(kvt_idpool *p, kvt_idlist *l);

/* Walk: for (kvt_iditer it = kvt_idlist_begin(p, l); kvt_iditer_ok(&it); kvt_iditer_next(p, &it))
 *           use(kvt_iditer_get(p, &it)); */
typedef struct kvt_iditer {
    uint32_t chunk, slot, left;
} kvt_iditer;

static inline kvt_iditer kvt_idlist_begin(const kvt_idpool *p, const kvt_idlist *l)
{
    (void)p;
    kvt_iditer it = {l->head, 0, l->len};
    return it;
}

static inline bool kvt_iditer_ok(const kvt_iditer *it)
{
    return it->left > 0;
}

static inline uint32_t kvt_iditer_get(const kvt_idpool *p, const kvt_iditer *it)
{
    return p->chunks[(uint64_t)it->chunk * 16 + 1 + it->slot];
}

static inline void kvt_iditer_next(const kvt_idpool *p, kvt_iditer *it)
{
    it->left--;
    if (++it->slot == KVT_IDCHUNK_IDS) {
        it->slot = 0;
        it->chunk = p->chunks[(uint64_t)it->chunk * 16];
    }
}

#endif
