/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Chained block hashes for engines: h_i = XXH3-128(h_{i-1} || n_tokens || tokens || extra_len ||
 * extra, seed). The root "parent" of the first block is derived from the seed alone, so two
 * processes (a scheduler and its workers, two engine replicas sharing a host tier) agree on
 * every hash as long as they agree on the seed — unlike a hash seeded per process at random.
 *
 * Every integer is fed little-endian and every variable-length field is preceded by its
 * length, so no two different inputs share a byte stream.
 */
#include <string.h>

#include "base/error.h"
#include "base/hash.h"
#include "kvtier/pool.h"

static const char root_tag[] = "kvtier.block-hash.root.v1";

static void put_le32(uint8_t *b, uint32_t v)
{
    b[0] = (uint8_t)v;
    b[1] = (uint8_t)(v >> 8);
    b[2] = (uint8_t)(v >> 16);
    b[3] = (uint8_t)(v >> 24);
}

static void put_le64(uint8_t *b, uint64_t v)
{
    put_le32(b, (uint32_t)v);
    put_le32(b + 4, (uint32_t)(v >> 32));
}

static void digest(XXH3_state_t *st, uint8_t out[KVT_BLOCK_HASH_LEN])
{
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest(st));
    memcpy(out, c.digest, KVT_BLOCK_HASH_LEN);
}

int kvt_hash_block(uint64_t seed, const uint8_t *parent, const uint32_t *tokens, uint32_t n_tokens,
                   const void *extra, size_t extra_len, uint8_t out[KVT_BLOCK_HASH_LEN])
{
    if (!out || (n_tokens && !tokens) || (extra_len && !extra))
        return kvt_fail(KVT_EINVAL, "hash_block: NULL argument");
    /* Zeroed: XXH3_*_reset_withSeed compares the seed already in the state to decide whether
     * to derive its secret, so an uninitialised state could skip the derivation. */
    XXH3_state_t st;
    memset(&st, 0, sizeof(st));
    uint8_t root[KVT_BLOCK_HASH_LEN];
    if (!parent) {
        XXH3_128bits_reset_withSeed(&st, seed);
        XXH3_128bits_update(&st, root_tag, sizeof(root_tag) - 1);
        digest(&st, root);
        parent = root;
    }
    XXH3_128bits_reset_withSeed(&st, seed);
    XXH3_128bits_update(&st, parent, KVT_BLOCK_HASH_LEN);
    uint8_t le[256];
    put_le32(le, n_tokens);
    XXH3_128bits_update(&st, le, 4);
    /* Tokens in little-endian, converted in chunks so big-endian hosts agree. */
    uint32_t i = 0;
    while (i < n_tokens) {
        uint32_t chunk = n_tokens - i < 64 ? n_tokens - i : 64;
        for (uint32_t k = 0; k < chunk; k++)
            put_le32(le + 4 * k, tokens[i + k]);
        XXH3_128bits_update(&st, le, (size_t)chunk * 4);
        i += chunk;
    }
    put_le64(le, (uint64_t)extra_len);
    XXH3_128bits_update(&st, le, 8);
    if (extra_len)
        XXH3_128bits_update(&st, extra, extra_len);
    digest(&st, out);
    return 0;
}

int kvt_hash_prompt(uint64_t seed, const uint32_t *tokens, uint32_t n_tokens, uint32_t block_size,
                    const void *extra, size_t extra_len, uint8_t *out, uint32_t cap,
                    uint32_t *n_out)
{
    if (!n_out || block_size == 0 || (n_tokens && !tokens) || (extra_len && !extra))
        return kvt_fail(KVT_EINVAL, "hash_prompt: invalid argument (block_size %u)", block_size);
    uint32_t n = n_tokens / block_size;
    *n_out = n;
    if (n > cap)
        return kvt_fail(KVT_ELIMIT, "hash_prompt: %u full blocks but room for %u hashes", n, cap);
    if (n && !out)
        return kvt_fail(KVT_EINVAL, "hash_prompt: out is NULL");
    const uint8_t *parent = NULL;
    for (uint32_t i = 0; i < n; i++) {
        uint8_t *h = out + (size_t)i * KVT_BLOCK_HASH_LEN;
        (void)kvt_hash_block(seed, parent, tokens + (size_t)i * block_size, block_size, extra,
                             extra_len, h);
        parent = h;
    }
    return 0;
}
