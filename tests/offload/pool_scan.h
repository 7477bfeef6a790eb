/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The engine-pool callback the model tests give kvt_offload_create_ext for lazy mode: the first
 * cap blocks of a kvt_pool's free queue with their primary keys (num_tokens 0: no key).
 */
#ifndef KVT_TEST_POOL_SCAN_H
#define KVT_TEST_POOL_SCAN_H

#include "kvt_test.h"

static inline uint32_t kvt_test_lru_scan(const kvt_pool *pool, uint32_t cap, uint32_t *ids,
                                         kvt_pool_key *keys)
{
    uint32_t n = 0;
    for (uint32_t b = kvt_pool_lru_first(pool); b != KVT_BLOCK_NONE && n < cap;
         b = kvt_pool_lru_next(pool, b), n++) {
        uint32_t nk = 0;
        ids[n] = b;
        KVT_OK_(kvt_pool_block_keys(pool, b, &keys[n], 1, &nk));
        if (!nk)
            keys[n].num_tokens = 0;
    }
    return n;
}

#endif
