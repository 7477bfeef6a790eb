/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Event tables; see evtable.h.
 */
#include "base/evtable.h"

#include <stdlib.h>
#include <string.h>

#include "base/error.h"

/* Event ids are consecutive: mixed (splitmix64's finalizer) so they spread over the map. */
static uint64_t id_hash(int64_t id)
{
    uint64_t z = (uint64_t)id + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

int kvi_evtable_init(kvi_evtable *t, uint32_t cap, size_t rec_size)
{
    memset(t, 0, sizeof(*t));
    kvi_ilist_init(&t->active);
    t->free_head = KVI_NIL;
    if (!cap)
        return 0;
    t->s = calloc(cap, sizeof(*t->s));
    t->rec = calloc(cap, rec_size);
    if (!t->s || !t->rec) {
        kvi_evtable_free(t);
        return kvt_fail(KVT_ENOMEM, "cannot allocate %u event entries", cap);
    }
    int rc = kvi_map_init(&t->map, cap);
    if (rc) {
        kvi_evtable_free(t);
        return rc;
    }
    t->cap = cap;
    t->rec_size = rec_size;
    for (uint32_t i = 0; i < cap; i++) {
        t->s[i].free_next = i + 1 < cap ? i + 1 : KVI_NIL;
        t->s[i].link.prev = t->s[i].link.next = KVI_NIL;
    }
    t->free_head = 0;
    return 0;
}

void kvi_evtable_free(kvi_evtable *t)
{
    free(t->s);
    free(t->rec);
    kvi_map_free(&t->map);
    memset(t, 0, sizeof(*t));
    kvi_ilist_init(&t->active);
    t->free_head = KVI_NIL;
}

uint32_t kvi_evtable_add(kvi_evtable *t, int64_t id)
{
    uint32_t i = t->free_head;
    if (i == KVI_NIL)
        return KVI_NIL;
    t->free_head = t->s[i].free_next;
    t->s[i].id = id;
    memset(kvi_evtable_rec(t, i), 0, t->rec_size);
    KVI_ILIST_PUSH_BACK(&t->active, t->s, link, i);
    (void)kvi_map_insert(&t->map, id_hash(id), i); /* room for every entry */
    t->n++;
    return i;
}

uint32_t kvi_evtable_find(const kvi_evtable *t, int64_t id)
{
    if (!t->cap)
        return KVI_NIL;
    uint64_t h = id_hash(id), pos = kvi_map_probe_start(&t->map, h);
    uint32_t i;
    while (kvi_map_probe_next(&t->map, h, &pos, &i))
        if (t->s[i].id == id)
            return i;
    return KVI_NIL;
}

void kvi_evtable_remove(kvi_evtable *t, uint32_t i)
{
    kvi_map_remove(&t->map, id_hash(t->s[i].id), i);
    KVI_ILIST_REMOVE(&t->active, t->s, link, i);
    t->s[i].free_next = t->free_head;
    t->free_head = i;
    t->n--;
}
