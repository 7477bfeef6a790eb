/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Public xxHash wrappers, linked against the system libxxhash (no inlining needed here).
 * kvt_hash128 writes the canonical big-endian form so hashes are byte-identical across hosts.
 */
#include "kvtier/base.h"

#include <string.h>
#include <xxhash.h>

uint64_t kvt_hash64(const void *data, size_t len, uint64_t seed)
{
    return XXH3_64bits_withSeed(data, len, seed);
}

void kvt_hash128(const void *data, size_t len, uint64_t seed, uint8_t out[16])
{
    XXH128_hash_t h = XXH3_128bits_withSeed(data, len, seed);
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, h);
    memcpy(out, c.digest, 16);
}
