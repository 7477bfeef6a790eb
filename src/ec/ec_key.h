/* SPDX-License-Identifier: Apache-2.0 */
/*
 * String keys of the encoder-cache tables (transfer ids, mm_hashes, request ids, consumer
 * addresses): a bounded copy, its length and its XXH3 hash, and the lookup of a record array
 * through a kvi_map keyed by that hash (the map stores indices; candidates are compared by
 * key, so hash collisions are harmless).
 */
#ifndef KVT_EC_KEY_H
#define KVT_EC_KEY_H

#include <stddef.h>
#include <string.h>

#include "base/array.h"
#include "base/ilist.h"
#include "base/error.h"
#include "base/hash.h"
#include "base/map.h"
#include "kvtier/ec.h"

typedef struct ec_key {
    char s[KVT_EC_KEY_MAX + 1];
    uint32_t len;
    uint64_t hash;
} ec_key;

/* Copies len bytes of s (1..KVT_EC_KEY_MAX, or 0 when may_be_empty; no NUL byte); otherwise
 * KVT_EINVAL naming `who` and `what`. */
static inline int ec_key_set(ec_key *k, const char *s, uint32_t len, bool may_be_empty,
                             const char *who, const char *what)
{
    if ((len == 0 && !may_be_empty) || len > KVT_EC_KEY_MAX || (len && (!s || memchr(s, 0, len))))
        return kvt_fail(KVT_EINVAL, "%s: %s must be %u..%u bytes without NUL (got %u)", who, what,
                        may_be_empty ? 0u : 1u, KVT_EC_KEY_MAX, s ? len : 0);
    if (len)
        memcpy(k->s, s, len);
    k->s[len] = 0;
    k->len = len;
    k->hash = kvi_xxh3_64(k->s, len, 0);
    return 0;
}

static inline bool ec_key_eq(const ec_key *a, const ec_key *b)
{
    return a->len == b->len && memcmp(a->s, b->s, a->len) == 0;
}

/* Index of the element of `base` (elements of `stride` bytes, an ec_key at `key_off`) whose
 * key equals k among those the map holds under k's hash; UINT32_MAX if none. */
static inline uint32_t ec_key_find(const kvi_map *m, const void *base, size_t stride,
                                   size_t key_off, const ec_key *k)
{
    uint64_t pos = kvi_map_probe_start(m, k->hash);
    uint32_t i;
    while (kvi_map_probe_next(m, k->hash, &pos, &i))
        if (ec_key_eq((const ec_key *)((const char *)base + (size_t)i * stride + key_off), k))
            return i;
    return UINT32_MAX;
}

#endif
