/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Inline xxHash for hot paths (pool key hashing). XXH_INLINE_ALL makes the XXH3 functions
 * static in each translation unit that includes this header, so the compiler can specialise
 * them for short fixed-size keys; cold callers use kvt_hash64()/kvt_hash128() instead.
 */
#ifndef KVT_BASE_HASH_H
#define KVT_BASE_HASH_H

#include <stddef.h>
#include <stdint.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

static inline uint64_t kvi_xxh3_64(const void *data, size_t len, uint64_t seed)
{
    return XXH3_64bits_withSeed(data, len, seed);
}

#endif
