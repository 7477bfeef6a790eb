/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Open-addressing multimap; see map.h for the design.
 */
#include "base/map.h"

#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/util.h"

int kvi_map_init(kvi_map *m, uint32_t capacity)
{
    memset(m, 0, sizeof(*m));
    if (capacity == 0)
        return kvt_fail(KVT_EINVAL, "map: capacity must be at least 1");
    uint64_t nslots = kvi_pow2_ceil((uint64_t)capacity * 2);
    m->slots = calloc(nslots, sizeof(kvi_map_slot));
    if (!m->slots)
        return kvt_fail(KVT_ENOMEM, "map: cannot allocate %llu slots", (unsigned long long)nslots);
    m->mask = nslots - 1;
    m->capacity = capacity;
    return 0;
}

void kvi_map_free(kvi_map *m)
{
    free(m->slots);
    memset(m, 0, sizeof(*m));
}

int kvi_map_insert(kvi_map *m, uint64_t hash, uint32_t value)
{
    if (m->count >= m->capacity)
        return kvt_fail(KVT_ENOSPC, "map: full (%u entries)", m->capacity);
    uint64_t i = hash & m->mask;
    while (m->slots[i].used)
        i = (i + 1) & m->mask;
    m->slots[i].hash = hash;
    m->slots[i].value = value;
    m->slots[i].used = 1;
    m->count++;
    return 0;
}

bool kvi_map_remove(kvi_map *m, uint64_t hash, uint32_t value)
{
    uint64_t i = hash & m->mask;
    for (;;) {
        kvi_map_slot *s = &m->slots[i];
        if (!s->used)
            return false;
        if (s->hash == hash && s->value == value)
            break;
        i = (i + 1) & m->mask;
    }
    /* Backward shift: pull later members of the cluster into the hole whenever their home
     * slot does not lie cyclically in (hole, j]; such a member would otherwise become
     * unreachable from its home. */
    uint64_t j = i;
    for (;;) {
        j = (j + 1) & m->mask;
        if (!m->slots[j].used)
            break;
        uint64_t home = m->slots[j].hash & m->mask;
        bool reachable = (i <= j) ? (home > i && home <= j) : (home > i || home <= j);
        if (!reachable) {
            m->slots[i] = m->slots[j];
            i = j;
        }
    }
    m->slots[i].used = 0;
    m->count--;
    return true;
}

void kvi_map_clear(kvi_map *m)
{
    memset(m->slots, 0, (m->mask + 1) * sizeof(kvi_map_slot));
    m->count = 0;
}
