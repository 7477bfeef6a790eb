/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Open-addressing multimap from a 64-bit hash to a 32-bit value.
 *
 * Design: callers keep their keys elsewhere (an entry array) and store here only the key's
 * 64-bit hash and the entry's index. A lookup walks the probe sequence, and the caller compares
 * its full key for every value whose hash matches; equal hashes may therefore appear any
 * number of times (a multimap), which is what a prefix cache with duplicate blocks needs.
 *
 * Linear probing with backward-shift deletion: no tombstones, so lookups stay short however
 * many inserts and removals a long-running pool performs. The table is allocated once at init
 * with at least twice as many slots as the capacity (load factor <= 1/2, so a probe always
 * meets an empty slot) and never grows: inserting past the capacity fails with KVT_ENOSPC.
 * Nothing allocates after init.
 *
 * Not thread-safe; the owner serialises access.
 */
#ifndef KVT_BASE_MAP_H
#define KVT_BASE_MAP_H

#include "base/export.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct kvi_map_slot {
    uint64_t hash;
    uint32_t value;
    uint32_t used;
} kvi_map_slot;

typedef struct kvi_map {
    kvi_map_slot *slots;
    uint64_t mask;     /* number of slots - 1 */
    uint32_t count;    /* values stored */
    uint32_t capacity; /* most values that may be stored */
} kvi_map;

/* Allocates a table for up to capacity values (capacity >= 1). */
KVI_EXPORT int kvi_map_init(kvi_map *m, uint32_t capacity);
KVI_EXPORT void kvi_map_free(kvi_map *m);
/* Adds (hash, value); duplicates are allowed. KVT_ENOSPC when full. */
KVI_EXPORT int kvi_map_insert(kvi_map *m, uint64_t hash, uint32_t value);
/* Removes one (hash, value) pair; false if absent. */
KVI_EXPORT bool kvi_map_remove(kvi_map *m, uint64_t hash, uint32_t value);
/* Removes everything, keeping the table. */
void kvi_map_clear(kvi_map *m);

/* Iteration over the values stored under one hash:
 *     uint64_t pos = kvi_map_probe_start(m, h); uint32_t v;
 *     while (kvi_map_probe_next(m, h, &pos, &v)) { ...compare full key of v... }
 * The map must not be modified during the walk. */
static inline uint64_t kvi_map_probe_start(const kvi_map *m, uint64_t hash)
{
    return hash & m->mask;
}

static inline bool kvi_map_probe_next(const kvi_map *m, uint64_t hash, uint64_t *pos,
                                      uint32_t *value)
{
    for (;;) {
        const kvi_map_slot *s = &m->slots[*pos & m->mask];
        if (!s->used)
            return false;
        (*pos)++;
        if (s->hash == hash) {
            *value = s->value;
            return true;
        }
    }
}

/* Hints the CPU to fetch the first probe slot of hash. */
static inline void kvi_map_prefetch(const kvi_map *m, uint64_t hash)
{
    __builtin_prefetch(&m->slots[hash & m->mask], 0, 1);
}

#endif
