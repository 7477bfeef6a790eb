/* SPDX-License-Identifier: Apache-2.0 */
/*
 * `kvtier bench pool`: the cost of the scheduler-side block pool.
 *
 * Setup: a pool of 1 M blocks (--blocks), filled with cached 64-block prompts whose keys are
 * real chained hashes of random tokens (16-token blocks, 16-byte XXH3-128 hashes), freed so
 * they sit in the LRU queue as evictable cached blocks — the state of a warm host tier.
 *
 * Measured, on one thread:
 *   lookup_blocks_per_s        longest-hit search of random cached prompts (every block hits)
 *   lookup_miss_prompts_per_s  searches whose first block misses (the common cold case), over
 *                              4,096 distinct never-cached prompts chosen at random
 *   alloc_free_blocks_per_s    alloc 64 blocks from the LRU head, free them back
 *   alloc_cache_free_blocks_per_s  the same with a key inserted on each block before the
 *                              free, so every alloc also evicts a key (steady-state churn)
 * There is no external baseline for this benchmark (see BENCHMARKS.md): the figures are
 * absolute, with the target of >= 10 M lookups per second.
 */
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "kvtier/pool.h"

#define PROMPT_BLOCKS 64u
#define MISS_PROMPTS  4096u /* distinct never-cached prompts the miss figure searches */
#define BLOCK_TOKENS  16u
#define HASH_LEN      KVT_BLOCK_HASH_LEN

static int fail(const char *what, int rc)
{
    fprintf(stderr, "bench pool: %s: %s (%s)\n", what, kvt_strerror(rc), kvt_last_error());
    return 1;
}

/* Longest-hit searches of random cached prompts for `seconds`: blocks and prompts found per
 * second; each must hit every block. */
static int search_hits(kvt_pool *pool, const uint8_t *hashes, uint32_t n_prompts, double seconds,
                       uint64_t *rng, double *bps, double *pps)
{
    uint32_t out[PROMPT_BLOCKS], *outs[1] = {out};
    const uint32_t max_len =
        PROMPT_BLOCKS * BLOCK_TOKENS; /* num_tokens - 1 of a 1025-token prompt */
    uint64_t blocks = 0, prompts = 0;
    double start = kvt_now_s(), now = start;
    while (now - start < seconds) {
        for (int k = 0; k < 1024; k++) {
            uint32_t p = kvt_rand_below(rng, n_prompts);
            kvt_hit hit;
            int rc = kvt_pool_find_longest_hit(pool, hashes + (size_t)p * PROMPT_BLOCKS * HASH_LEN,
                                               PROMPT_BLOCKS, max_len, outs, &hit);
            if (rc)
                return fail("find_longest_hit", rc);
            if (hit.n_blocks[0] != PROMPT_BLOCKS) {
                fprintf(stderr, "bench pool: prompt %u hit %u of %u blocks\n", p, hit.n_blocks[0],
                        PROMPT_BLOCKS);
                return 1;
            }
            blocks += hit.n_blocks[0];
        }
        prompts += 1024;
        now = kvt_now_s();
    }
    *bps = (double)blocks / (now - start);
    *pps = (double)prompts / (now - start);
    return 0;
}

/* Searches of prompts never cached (MISS_PROMPTS of them in miss) for `seconds`: misses per
 * second. */
static void search_misses(kvt_pool *pool, const uint8_t *miss, double seconds, uint64_t *rng,
                          double *pps)
{
    uint32_t out[PROMPT_BLOCKS], *outs[1] = {out};
    uint64_t misses = 0;
    double start = kvt_now_s(), now = start;
    while (now - start < seconds) {
        for (int k = 0; k < 4096; k++) {
            kvt_hit hit;
            const uint8_t *q =
                miss + (size_t)kvt_rand_below(rng, MISS_PROMPTS) * PROMPT_BLOCKS * HASH_LEN;
            kvt_pool_find_longest_hit(pool, q, PROMPT_BLOCKS, PROMPT_BLOCKS * BLOCK_TOKENS, outs,
                                      &hit);
            misses += hit.n_blocks[0] == 0;
        }
        now = kvt_now_s();
    }
    *pps = (double)misses / (now - start);
}

/* Alloc + free of a prompt's blocks for `seconds`, with a new key per block when key is given
 * (its counter): blocks per second. */
static int churn(kvt_pool *pool, double seconds, uint64_t *key, uint32_t *ids, double *bps)
{
    uint64_t cycles = 0;
    int rc;
    double start = kvt_now_s(), now = start;
    while (now - start < seconds) {
        for (int k = 0; k < 256; k++) {
            if ((rc = kvt_pool_alloc(pool, PROMPT_BLOCKS, ids)))
                return fail("alloc", rc);
            for (uint32_t b = 0; key && b < PROMPT_BLOCKS; b++) {
                uint8_t h[HASH_LEN] = {0};
                ++*key;
                memcpy(h, key, sizeof(*key));
                if ((rc = kvt_pool_insert(pool, ids[b], h, 0, BLOCK_TOKENS)))
                    return fail("insert", rc);
            }
            if ((rc = kvt_pool_free(pool, ids, PROMPT_BLOCKS)))
                return fail("free", rc);
        }
        cycles += 256;
        now = kvt_now_s();
    }
    *bps = (double)cycles * PROMPT_BLOCKS / (now - start);
    return 0;
}

static int bench_pool_run(const kvt_bench_opts *o)
{
    uint32_t nb = o->blocks ? o->blocks : (1u << 20);
    if (nb < PROMPT_BLOCKS * 4 + 1) {
        fprintf(stderr, "bench pool: --blocks must be at least %u\n", PROMPT_BLOCKS * 4 + 1);
        return 1;
    }
    kvt_pool_config cfg;
    kvt_pool_config_init(&cfg);
    cfg.num_blocks = nb;
    kvt_pool *pool;
    int rc = kvt_pool_create(&cfg, &pool);
    if (rc)
        return fail("create", rc);

    uint32_t n_prompts = (nb - 1) / PROMPT_BLOCKS;
    uint8_t *hashes = malloc((size_t)n_prompts * PROMPT_BLOCKS * HASH_LEN);
    uint8_t *miss = malloc((size_t)MISS_PROMPTS * PROMPT_BLOCKS * HASH_LEN);
    uint32_t tokens[PROMPT_BLOCKS * BLOCK_TOKENS];
    uint32_t ids[PROMPT_BLOCKS];
    if (!hashes || !miss) {
        fprintf(stderr, "bench pool: out of memory\n");
        return 1;
    }
    uint64_t rng = o->seed;
    double t0 = kvt_now_s();
    for (uint32_t p = 0; p < n_prompts; p++) {
        uint8_t *h = hashes + (size_t)p * PROMPT_BLOCKS * HASH_LEN;
        uint32_t n;
        for (uint32_t t = 0; t < PROMPT_BLOCKS * BLOCK_TOKENS; t++)
            tokens[t] = kvt_rand_below(&rng, 128000);
        if ((rc = kvt_hash_prompt(o->seed, tokens, PROMPT_BLOCKS * BLOCK_TOKENS, BLOCK_TOKENS, NULL,
                                  0, h, PROMPT_BLOCKS, &n)) ||
            (rc = kvt_pool_alloc(pool, PROMPT_BLOCKS, ids)))
            return fail("fill", rc);
        for (uint32_t b = 0; b < PROMPT_BLOCKS; b++)
            if ((rc = kvt_pool_insert(pool, ids[b], h + (size_t)b * HASH_LEN, 0, BLOCK_TOKENS)))
                return fail("insert", rc);
        if ((rc = kvt_pool_free(pool, ids, PROMPT_BLOCKS)))
            return fail("free", rc);
    }
    double fill_s = kvt_now_s() - t0;
    /* cold misses: many distinct prompts that were never cached, so every search probes a
     * different slot of the map (one prompt searched over and over stays in the CPU cache) */
    for (uint32_t m = 0; m < MISS_PROMPTS; m++) {
        for (uint32_t t = 0; t < PROMPT_BLOCKS * BLOCK_TOKENS; t++)
            tokens[t] = kvt_rand_below(&rng, 128000) + 200000; /* never cached */
        uint32_t n_miss;
        kvt_hash_prompt(o->seed, tokens, PROMPT_BLOCKS * BLOCK_TOKENS, BLOCK_TOKENS, NULL, 0,
                        miss + (size_t)m * PROMPT_BLOCKS * HASH_LEN, PROMPT_BLOCKS, &n_miss);
    }

    /* Longest-hit search: every probe a full 64-block hit; then cold misses. */
    double lookup_bps, lookup_pps, miss_pps;
    if ((rc = search_hits(pool, hashes, n_prompts, o->seconds, &rng, &lookup_bps, &lookup_pps)))
        return rc;
    search_misses(pool, miss, o->seconds / 2, &rng, &miss_pps);

    /* Alloc + free churn, without and with a key per block. */
    double alloc_free_bps, churn_bps;
    uint64_t key = 0;
    if ((rc = churn(pool, o->seconds / 2, NULL, ids, &alloc_free_bps)) ||
        (rc = churn(pool, o->seconds / 2, &key, ids, &churn_bps)))
        return rc;

    if (o->json) {
        kvt_json j;
        kvt_json_begin(&j, stdout);
        kvt_json_str(&j, "bench", "pool");
        kvt_json_int(&j, "pool_blocks", nb);
        kvt_json_int(&j, "prompt_blocks", PROMPT_BLOCKS);
        kvt_json_int(&j, "block_tokens", BLOCK_TOKENS);
        kvt_json_int(&j, "hash_len", HASH_LEN);
        kvt_json_int(&j, "threads", 1);
        kvt_json_num(&j, "lookup_blocks_per_s", lookup_bps);
        kvt_json_num(&j, "lookup_prompts_per_s", lookup_pps);
        kvt_json_num(&j, "lookup_miss_prompts_per_s", miss_pps);
        kvt_json_num(&j, "alloc_free_blocks_per_s", alloc_free_bps);
        kvt_json_num(&j, "alloc_cache_free_blocks_per_s", churn_bps);
        kvt_json_num(&j, "fill_s", fill_s);
        kvt_json_num(&j, "seconds_per_phase", o->seconds);
        kvt_json_host(&j);
        kvt_json_end(&j);
    } else {
        printf("pool: %u blocks, %u-block prompts of %u tokens, %u-byte hashes, one thread\n", nb,
               PROMPT_BLOCKS, BLOCK_TOKENS, HASH_LEN);
        printf("  longest-hit lookup   %8.2f M blocks/s (%.0f prompts/s)\n", lookup_bps / 1e6,
               lookup_pps);
        printf("  first-block miss     %8.2f M prompts/s\n", miss_pps / 1e6);
        printf("  alloc + free         %8.2f M blocks/s\n", alloc_free_bps / 1e6);
        printf("  alloc + key + free   %8.2f M blocks/s\n", churn_bps / 1e6);
        printf("  (fill took %.2f s; target >= 10 M lookups/s)\n", fill_s);
    }
    free(hashes);
    free(miss);
    kvt_pool_destroy(pool);
    return 0;
}

const kvt_bench kvt_bench_pool = {"pool", "longest-hit lookup and alloc/free of the block pool",
                                  bench_pool_run, "json,seconds,seed,blocks"};
