/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Longest prefix hit per group kind and across groups (spec kv-offload §2.3, §2.4): full
 * attention, sliding window, Mamba-style state, EAGLE, coarse block sizes viewed through
 * finer hashes, and the hybrid fixed point aligned to the scheduler block size.
 */
#include "kvt_test.h"

#define HL 16
#define NH 16 /* hashes per request in these tests */

static uint8_t req_hashes[NH * HL];

static void fill_hashes(void)
{
    for (uint32_t i = 0; i < NH; i++) {
        memset(req_hashes + i * HL, 0, HL);
        uint32_t v = 1000 + i;
        memcpy(req_hashes + i * HL, &v, 4);
    }
}

static kvt_pool *make(kvt_pool_config *c)
{
    kvt_pool *p;
    KVT_OK_(kvt_pool_create(c, &p));
    return p;
}

static kvt_pool_config base_cfg(void)
{
    kvt_pool_config c;
    kvt_pool_config_init(&c);
    c.num_blocks = 256;
    return c;
}

/* Caches group g's block j (hash (j+1)*k-1) on a fresh block and returns its id. */
static uint32_t cache_block(kvt_pool *p, const kvt_pool_config *c, uint32_t g, uint32_t j)
{
    uint32_t k = c->groups[g].block_size / c->hash_block_size;
    uint32_t id;
    KVT_OK_(kvt_pool_alloc(p, 1, &id));
    KVT_OK_(
        kvt_pool_insert(p, id, req_hashes + ((j + 1) * k - 1) * HL, g, c->groups[g].block_size));
    return id;
}

static kvt_hit search(kvt_pool *p, uint32_t n_hashes, uint32_t max_len, uint32_t out[][NH])
{
    uint32_t *outs[KVT_MAX_GROUPS];
    for (uint32_t g = 0; g < KVT_MAX_GROUPS; g++)
        outs[g] = out[g];
    kvt_hit hit;
    KVT_OK_(kvt_pool_find_longest_hit(p, req_hashes, n_hashes, max_len, outs, &hit));
    return hit;
}

static uint32_t out[KVT_MAX_GROUPS][NH];

static void full_attention_hit_is_the_cached_prefix_up_to_the_first_miss(void **state)
{
    (void)state;
    kvt_pool_config c = base_cfg();
    kvt_pool *p = make(&c);
    uint32_t ids[5];
    for (uint32_t j = 0; j < 5; j++)
        ids[j] = j == 3 ? 0 : cache_block(p, &c, 0, j);
    kvt_hit h = search(p, 8, 8 * 16, out);
    assert_int_equal(h.length, 48);
    assert_int_equal(h.n_blocks[0], 3);
    assert_memory_equal(out[0], ids, 3 * sizeof(uint32_t));
    /* the search does not pin anything */
    kvt_block_info bi;
    KVT_OK_(kvt_pool_block_info(p, ids[0], &bi));
    assert_int_equal(bi.ref_cnt, 1);
    kvt_pool_destroy(p);
}

/* spec §5 test_max_hit_len_cap_drops_last_full_block: engines pass num_tokens - 1, so a prompt
 * of exactly n blocks hits n - 1 of them. */
static void last_token_is_always_recomputed(void **state)
{
    (void)state;
    kvt_pool_config c = base_cfg();
    kvt_pool *p = make(&c);
    for (uint32_t j = 0; j < 4; j++)
        cache_block(p, &c, 0, j);
    assert_int_equal(search(p, 4, 64 - 1, out).n_blocks[0], 3);
    assert_int_equal(search(p, 4, 65 - 1, out).n_blocks[0], 4);
    /* max_length beyond the hashes is clamped to them */
    assert_int_equal(search(p, 4, 1000, out).length, 64);
    assert_int_equal(search(p, 0, 1000, out).length, 0);
    kvt_pool_destroy(p);
}

static void coarse_block_uses_the_last_fine_hash_it_covers(void **state)
{
    (void)state;
    kvt_pool_config c = base_cfg();
    c.groups[0].block_size = 64; /* 4 hashes of 16 tokens per block */
    kvt_pool *p = make(&c);
    uint32_t a = cache_block(p, &c, 0, 0); /* hash 3 */
    uint32_t b = cache_block(p, &c, 0, 1); /* hash 7 */
    assert_int_equal(kvt_pool_hit_capacity(p, 0, 8, 1000), 2);
    kvt_hit h = search(p, 8, 8 * 16, out);
    assert_int_equal(h.length, 128);
    assert_int_equal(out[0][0], a);
    assert_int_equal(out[0][1], b);
    /* 7 hashes cover only one full 64-token block */
    assert_int_equal(search(p, 7, 1000, out).length, 64);
    kvt_pool_destroy(p);
}

static kvt_pool_config sliding_cfg(uint32_t window)
{
    kvt_pool_config c = base_cfg();
    c.groups[0].kind = KVT_GROUP_SLIDING;
    c.groups[0].sliding_window = window;
    return c;
}

static void sliding_window_needs_only_the_last_window(void **state)
{
    (void)state;
    kvt_pool_config c = sliding_cfg(48); /* ceil(47/16) = 3 blocks */
    kvt_pool *p = make(&c);
    uint32_t ids[8] = {0};
    for (uint32_t j = 4; j < 7; j++)
        ids[j] = cache_block(p, &c, 0, j);
    kvt_hit h = search(p, 8, 8 * 16, out);
    assert_int_equal(h.n_blocks[0], 7);
    assert_int_equal(h.length, 112);
    for (uint32_t j = 0; j < 4; j++)
        assert_int_equal(out[0][j], KVT_NULL_BLOCK);
    for (uint32_t j = 4; j < 7; j++)
        assert_int_equal(out[0][j], ids[j]);
    kvt_pool_destroy(p);
}

static void sliding_window_takes_the_rightmost_complete_run(void **state)
{
    (void)state;
    kvt_pool_config c = sliding_cfg(48);
    kvt_pool *p = make(&c);
    uint32_t ids[8] = {0};
    uint32_t cached[] = {2, 3, 4, 6, 7};
    for (uint32_t i = 0; i < 5; i++)
        ids[cached[i]] = cache_block(p, &c, 0, cached[i]);
    kvt_hit h = search(p, 8, 8 * 16, out);
    assert_int_equal(h.n_blocks[0], 5); /* run 2..4; 6..7 is one block short */
    assert_int_equal(out[0][0], KVT_NULL_BLOCK);
    assert_int_equal(out[0][1], KVT_NULL_BLOCK);
    assert_int_equal(out[0][4], ids[4]);
    kvt_pool_destroy(p);
}

static void sliding_window_short_run_counts_only_at_the_start(void **state)
{
    (void)state;
    kvt_pool_config c = sliding_cfg(48);
    kvt_pool *p = make(&c);
    uint32_t a = cache_block(p, &c, 0, 0);
    uint32_t b = cache_block(p, &c, 0, 1);
    kvt_hit h = search(p, 8, 8 * 16, out); /* the window never filled: 2 blocks count */
    assert_int_equal(h.n_blocks[0], 2);
    assert_int_equal(out[0][0], a);
    assert_int_equal(out[0][1], b);
    kvt_pool_destroy(p);

    p = make(&c);
    cache_block(p, &c, 0, 1);
    cache_block(p, &c, 0, 2);
    assert_int_equal(search(p, 8, 8 * 16, out).length, 0); /* a short run mid-prompt is no hit */
    kvt_pool_destroy(p);
}

static uint32_t g_kind_mamba = KVT_GROUP_MAMBA, g_kind_mamba_align = KVT_GROUP_MAMBA_ALIGN;

static void mamba_hit_is_the_last_cached_state(void **state)
{
    (void)state;
    kvt_pool_config c = base_cfg();
    c.groups[0].kind = *(uint32_t *)*state; /* all mode, and align mode: the same search */
    kvt_pool *p = make(&c);
    cache_block(p, &c, 0, 1);
    uint32_t s = cache_block(p, &c, 0, 5);
    kvt_hit h = search(p, 8, 8 * 16, out);
    assert_int_equal(h.n_blocks[0], 6);
    for (uint32_t j = 0; j < 5; j++)
        assert_int_equal(out[0][j], KVT_NULL_BLOCK);
    assert_int_equal(out[0][5], s);
    assert_int_equal(search(p, 8, 5 * 16, out).n_blocks[0], 2); /* state 5 beyond the cap */
    kvt_pool_destroy(p);
}

static void eagle_drops_the_last_matched_block(void **state)
{
    (void)state;
    kvt_pool_config c = base_cfg();
    c.eagle = true;
    kvt_pool *p = make(&c);
    for (uint32_t j = 0; j < 4; j++)
        cache_block(p, &c, 0, j);
    assert_int_equal(search(p, 8, 8 * 16, out).n_blocks[0], 3);
    kvt_pool_destroy(p);

    c = sliding_cfg(48);
    c.eagle = true; /* needs one more block in the run, then drops it */
    p = make(&c);
    for (uint32_t j = 2; j < 6; j++)
        cache_block(p, &c, 0, j);
    assert_int_equal(search(p, 8, 8 * 16, out).n_blocks[0], 5);
    kvt_pool_destroy(p);
}

/* Full attention + sliding window: one pass settles the length (the "simple hybrid"). */
static void hybrid_groups_agree_on_one_length(void **state)
{
    (void)state;
    kvt_pool_config c = base_cfg();
    c.n_groups = 2;
    c.groups[1].kind = KVT_GROUP_SLIDING;
    c.groups[1].block_size = 16;
    c.groups[1].sliding_window = 32; /* 2 blocks */
    kvt_pool *p = make(&c);
    uint32_t fa[6], sw3, sw4;
    for (uint32_t j = 0; j < 6; j++)
        fa[j] = cache_block(p, &c, 0, j);
    sw3 = cache_block(p, &c, 1, 3);
    sw4 = cache_block(p, &c, 1, 4);
    kvt_hit h = search(p, 8, 8 * 16, out);
    assert_int_equal(h.length, 80);
    assert_int_equal(h.n_blocks[0], 5);
    assert_memory_equal(out[0], fa, 5 * sizeof(uint32_t));
    assert_int_equal(h.n_blocks[1], 5);
    assert_int_equal(out[1][2], KVT_NULL_BLOCK);
    assert_int_equal(out[1][3], sw3);
    assert_int_equal(out[1][4], sw4);
    kvt_pool_destroy(p);
}

/* Different block sizes: hits are multiples of the LCM (32 tokens). */
static void hybrid_hit_is_aligned_to_the_scheduler_block_size(void **state)
{
    (void)state;
    kvt_pool_config c = base_cfg();
    c.n_groups = 2;
    c.groups[1].kind = KVT_GROUP_SLIDING;
    c.groups[1].block_size = 32;
    c.groups[1].sliding_window = 33; /* one 32-token block */
    kvt_pool *p = make(&c);
    for (uint32_t j = 0; j < 5; j++)
        cache_block(p, &c, 0, j); /* 80 tokens: aligned down to 64 */
    uint32_t sw = cache_block(p, &c, 1, 1);
    kvt_hit h = search(p, 8, 8 * 16, out);
    assert_int_equal(h.length, 64);
    assert_int_equal(h.n_blocks[0], 4);
    assert_int_equal(h.n_blocks[1], 2);
    assert_int_equal(out[1][0], KVT_NULL_BLOCK);
    assert_int_equal(out[1][1], sw);
    kvt_pool_destroy(p);
}

/* Three groups need several rounds: each shortening makes another group search again. */
static void hybrid_search_iterates_to_a_fixed_point(void **state)
{
    (void)state;
    kvt_pool_config c = base_cfg();
    c.n_groups = 3;
    c.groups[1].kind = KVT_GROUP_SLIDING;
    c.groups[1].block_size = 16;
    c.groups[1].sliding_window = 32;
    c.groups[2].kind = KVT_GROUP_MAMBA;
    c.groups[2].block_size = 16;
    kvt_pool *p = make(&c);
    for (uint32_t j = 0; j < 8; j++)
        cache_block(p, &c, 0, j);
    uint32_t sw2 = cache_block(p, &c, 1, 2), sw3 = cache_block(p, &c, 1, 3);
    cache_block(p, &c, 1, 6);
    cache_block(p, &c, 1, 7);
    uint32_t m3 = cache_block(p, &c, 2, 3);
    cache_block(p, &c, 2, 5);
    kvt_hit h = search(p, 8, 8 * 16, out);
    assert_int_equal(h.length, 64);
    assert_int_equal(h.n_blocks[0], 4);
    assert_int_equal(h.n_blocks[1], 4);
    assert_int_equal(out[1][2], sw2);
    assert_int_equal(out[1][3], sw3);
    assert_int_equal(h.n_blocks[2], 4);
    assert_int_equal(out[2][3], m3);
    assert_int_equal(out[2][0], KVT_NULL_BLOCK);
    kvt_pool_destroy(p);
}

/* Spec §2.14: groups that are not prefix-cacheable (scratch, ring) are accepted with block
 * sizes that need not fit the hash block, leave the scheduler block size alone, are never
 * cached and never constrain or take part in a hit. */
static void scratch_and_ring_groups_take_no_part_in_hits(void **state)
{
    (void)state;
    kvt_pool_config c = base_cfg();
    c.n_groups = 4;
    c.groups[1].kind = KVT_GROUP_SCRATCH;
    c.groups[1].block_size = 5; /* neither a multiple nor a divisor of 16 */
    c.groups[2].kind = KVT_GROUP_SLIDING;
    c.groups[2].block_size = 16;
    c.groups[2].sliding_window = 17; /* 1 block */
    c.groups[3].kind = KVT_GROUP_RING;
    c.groups[3].block_size = 24;
    uint32_t sched_bs = 0;
    KVT_OK_(kvt_pool_config_validate(&c, &sched_bs));
    assert_int_equal(sched_bs, 16); /* not the LCM with 5 or 24 */
    kvt_pool *p = make(&c);
    uint32_t fa[4], sw;
    for (uint32_t j = 0; j < 4; j++)
        fa[j] = cache_block(p, &c, 0, j);
    sw = cache_block(p, &c, 2, 3);
    uint32_t id;
    KVT_OK_(kvt_pool_alloc(p, 1, &id));
    KVT_ERR_(kvt_pool_insert(p, id, req_hashes, 1, 5), KVT_EINVAL); /* never cached */
    assert_non_null(strstr(kvt_last_error(), "not prefix-cacheable"));
    KVT_ERR_(kvt_pool_insert(p, id, req_hashes, 3, 24), KVT_EINVAL);
    uint32_t *outs[KVT_MAX_GROUPS] = {out[0], NULL, out[2], NULL}; /* no room needed for them */
    kvt_hit h;
    KVT_OK_(kvt_pool_find_longest_hit(p, req_hashes, 8, 8 * 16, outs, &h));
    assert_int_equal(h.length, 64);
    assert_int_equal(h.n_blocks[0], 4);
    assert_memory_equal(out[0], fa, sizeof(fa));
    assert_int_equal(h.n_blocks[1], 0);
    assert_int_equal(h.n_blocks[2], 4);
    assert_int_equal(out[2][3], sw);
    assert_int_equal(h.n_blocks[3], 0);
    assert_int_equal(kvt_pool_hit_capacity(p, 1, 8, 128), 0);
    assert_int_equal(kvt_pool_hit_capacity(p, 0, 8, 128), 8);
    kvt_pool_destroy(p);
    /* a scheduler block size need only fit the cacheable groups */
    c.scheduler_block_size = 32;
    KVT_OK_(kvt_pool_config_validate(&c, &sched_bs));
    assert_int_equal(sched_bs, 32);
    /* no cacheable group at all, or an unknown kind: refused */
    kvt_pool_config only = base_cfg();
    only.groups[0].kind = KVT_GROUP_RING;
    KVT_ERR_(kvt_pool_config_validate(&only, NULL), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "none of the 1 groups is prefix-cacheable"));
    only.groups[0].kind = 6;
    KVT_ERR_(kvt_pool_config_validate(&only, NULL), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "unknown kind 6"));
}

static void bad_search_arguments_are_rejected(void **state)
{
    (void)state;
    kvt_pool_config c = base_cfg();
    kvt_pool *p = make(&c);
    uint32_t *outs[1] = {NULL};
    kvt_hit h;
    KVT_ERR_(kvt_pool_find_longest_hit(p, req_hashes, 4, 64, outs, &h), KVT_EINVAL);
    KVT_OK_(kvt_pool_find_longest_hit(p, req_hashes, 0, 64, outs, &h)); /* nothing to write */
    KVT_ERR_(kvt_pool_find_longest_hit(p, NULL, 4, 64, outs, &h), KVT_EINVAL);
    KVT_ERR_(kvt_pool_find_longest_hit(p, req_hashes, 4, 64, NULL, &h), KVT_EINVAL);
    assert_int_equal(kvt_pool_hit_capacity(p, 5, 8, 100), 0);
    kvt_pool_destroy(p);
}

static int setup(void **state)
{
    (void)state;
    fill_hashes();
    return 0;
}

/* Caches a key at hash position pos (tokens (pos+1)*16) for group g on a fresh block. */
static uint32_t cache_at(kvt_pool *p, uint32_t g, uint32_t pos, uint32_t num_tokens)
{
    uint32_t id;
    KVT_OK_(kvt_pool_alloc(p, 1, &id));
    KVT_OK_(kvt_pool_insert(p, id, req_hashes + pos * HL, g, num_tokens));
    return id;
}

static kvt_hit search_flags(kvt_pool *p, uint32_t n_hashes, uint32_t max_len, uint32_t flags)
{
    uint32_t *outs[KVT_MAX_GROUPS];
    for (uint32_t g = 0; g < KVT_MAX_GROUPS; g++)
        outs[g] = out[g];
    kvt_hit hit;
    KVT_OK_(kvt_pool_find_longest_hit_flags(p, req_hashes, n_hashes, max_len, flags, outs, &hit));
    return hit;
}

/* Spec §2.14, partial hash hits: full attention and Mamba align of 64 tokens per block over
 * hash blocks of 16 (scheduler block 64). Attention: whole block 0, block 1 cached partly
 * (32 tokens, under the hash at 96). States at 64 and 96 tokens. Aligned: 64 tokens. Partial:
 * 96, the attention output ending with the partly filled block, the state at index 1. */
static void partial_hash_hits_end_at_hash_block_boundaries(void **state)
{
    (void)state;
    kvt_pool_config c = base_cfg();
    c.n_groups = 2;
    c.groups[0] = (kvt_group_spec){KVT_GROUP_FULL, 64, 0};
    c.groups[1] = (kvt_group_spec){KVT_GROUP_MAMBA_ALIGN, 64, 0};
    kvt_pool *p = make(&c);
    assert_int_equal(kvt_pool_hit_alignment(p, 0), 64);
    assert_int_equal(kvt_pool_hit_alignment(p, KVT_HIT_PARTIAL), 16);
    assert_int_equal(kvt_pool_hit_capacity(p, 0, 6, 96), 2); /* the partial block counts */
    uint32_t a0 = cache_at(p, 0, 3, 64), a1 = cache_at(p, 0, 5, 32);
    uint32_t s64 = cache_at(p, 1, 3, 64), s96 = cache_at(p, 1, 5, 32);
    kvt_hit h = search_flags(p, NH, NH * 16, 0);
    assert_int_equal(h.length, 64);
    assert_int_equal(h.n_blocks[0], 1);
    assert_int_equal(out[1][0], s64);
    h = search_flags(p, NH, NH * 16, KVT_HIT_PARTIAL);
    assert_int_equal(h.length, 96);
    assert_int_equal(h.n_blocks[0], 2);
    assert_int_equal(out[0][0], a0);
    assert_int_equal(out[0][1], a1);
    assert_int_equal(h.n_blocks[1], 2);
    assert_int_equal(out[1][0], KVT_NULL_BLOCK);
    assert_int_equal(out[1][1], s96);
    /* capped below the partial block's end: the state at 64 */
    h = search_flags(p, NH, 95, KVT_HIT_PARTIAL);
    assert_int_equal(h.length, 64);
    assert_int_equal(out[1][0], s64);
    /* a whole attention block serves any prefix of itself: block 1 whole, a state at 80 */
    uint32_t a1w = cache_at(p, 0, 7, 64), s80 = cache_at(p, 1, 4, 16);
    KVT_OK_(kvt_pool_evict(p, &s96, 1));
    h = search_flags(p, NH, NH * 16, KVT_HIT_PARTIAL);
    assert_int_equal(h.length, 80);
    assert_int_equal(h.n_blocks[0], 2);
    assert_int_equal(out[0][1], a1w);
    assert_int_equal(out[1][1], s80);
    KVT_ERR_(kvt_pool_find_longest_hit_flags(p, req_hashes, NH, 64, 2,
                                             (uint32_t *[]){out[0], out[1]}, &h),
             KVT_EINVAL);
    kvt_pool_destroy(p);
    /* a sliding window beside them: the flag changes nothing */
    c.n_groups = 3;
    c.groups[2] = (kvt_group_spec){KVT_GROUP_SLIDING, 16, 32};
    p = make(&c);
    assert_int_equal(kvt_pool_hit_alignment(p, KVT_HIT_PARTIAL), 64);
    kvt_pool_destroy(p);
}

/* Partial hash hits against a brute force: full attention and Mamba align of 32 tokens over
 * hash blocks of 16, random caches (whole and partly filled attention blocks, states at any
 * hash-block boundary), random caps. The hit must be the longest L (a multiple of 16, within
 * the cap) where every attention block before L is cached whole, the block holding L's last
 * token is cached whole or partly up to L or beyond, and a state sits exactly at L; every
 * block returned must carry the key that makes it so. */
static bool has_key(kvt_pool *p, uint32_t g, uint32_t pos, uint32_t *b)
{
    return kvt_pool_lookup(p, req_hashes + pos * HL, g, b) == 1;
}

static void partial_hits_agree_with_a_brute_force(void **state)
{
    (void)state;
    uint64_t seed = kvt_test_seed(), rng = seed;
    print_message("partial hits vs brute force: seed %llu (KVTIER_TEST_SEED replays it)\n",
                  (unsigned long long)seed);
    kvt_pool_config c = base_cfg();
    c.n_groups = 2;
    c.groups[0] = (kvt_group_spec){KVT_GROUP_FULL, 32, 0};
    c.groups[1] = (kvt_group_spec){KVT_GROUP_MAMBA_ALIGN, 32, 0};
    uint32_t rounds = (uint32_t)(2000 * kvt_test_scale()), partial_seen = 0;
    for (uint32_t round = 0; round < rounds; round++) {
        kvt_pool *p = make(&c);
        for (uint32_t pos = 0; pos < NH; pos++) {
            uint32_t id;
            if (kvt_test_below(&rng, 4) != 0) { /* attention: whole at odd, partial at even */
                KVT_OK_(kvt_pool_alloc(p, 1, &id));
                KVT_OK_(kvt_pool_insert(p, id, req_hashes + pos * HL, 0, pos % 2 ? 32 : 16));
            }
            if (kvt_test_below(&rng, 3) == 0) { /* a state after pos + 1 hash blocks */
                KVT_OK_(kvt_pool_alloc(p, 1, &id));
                KVT_OK_(kvt_pool_insert(p, id, req_hashes + pos * HL, 1, pos % 2 ? 32 : 16));
            }
        }
        uint32_t nh = kvt_test_below(&rng, NH + 1), max_len = kvt_test_below(&rng, NH * 16 + 8);
        uint32_t top = nh * 16 < max_len ? nh * 16 : max_len, want = 0, b;
        for (uint32_t len = top / 16 * 16; len >= 16 && !want; len -= 16) {
            bool ok = has_key(p, 1, len / 16 - 1, &b);
            for (uint32_t j = 0; ok && j < len / 32; j++)
                ok = has_key(p, 0, 2 * j + 1, &b);
            if (ok && len % 32) /* partly up to len, or whole (its hash known) */
                ok = has_key(p, 0, len / 16 - 1, &b) ||
                     (len / 16 < nh && has_key(p, 0, len / 16, &b));
            if (ok)
                want = len;
        }
        kvt_hit h = search_flags(p, nh, max_len, KVT_HIT_PARTIAL);
        assert_int_equal(h.length, want);
        partial_seen += want % 32 != 0;
        if (want) {
            uint32_t n = (want + 31) / 32, last = want / 16 - 1;
            assert_int_equal(h.n_blocks[0], n);
            assert_int_equal(h.n_blocks[1], n);
            for (uint32_t j = 0; j + 1 < n || (j < n && want % 32 == 0); j++) {
                assert_true(has_key(p, 0, 2 * j + 1, &b));
                assert_int_equal(out[0][j], b);
            }
            if (want % 32) { /* the last attention block reaches at least the hit's end */
                kvt_pool_key k[2];
                uint32_t nk;
                KVT_OK_(kvt_pool_block_keys(p, out[0][n - 1], k, 2, &nk));
                assert_true(nk == 1 && (memcmp(k[0].hash, req_hashes + last * HL, HL) == 0 ||
                                        memcmp(k[0].hash, req_hashes + (last + 1) * HL, HL) == 0));
            }
            assert_true(has_key(p, 1, last, &b));
            assert_int_equal(out[1][n - 1], b);
            for (uint32_t j = 0; j + 1 < n; j++)
                assert_int_equal(out[1][j], KVT_NULL_BLOCK);
        }
        kvt_pool_destroy(p);
    }
    assert_true(partial_seen > 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(full_attention_hit_is_the_cached_prefix_up_to_the_first_miss),
        cmocka_unit_test(last_token_is_always_recomputed),
        cmocka_unit_test(coarse_block_uses_the_last_fine_hash_it_covers),
        cmocka_unit_test(sliding_window_needs_only_the_last_window),
        cmocka_unit_test(sliding_window_takes_the_rightmost_complete_run),
        cmocka_unit_test(sliding_window_short_run_counts_only_at_the_start),
        cmocka_unit_test_prestate(mamba_hit_is_the_last_cached_state, &g_kind_mamba),
        cmocka_unit_test_prestate(mamba_hit_is_the_last_cached_state, &g_kind_mamba_align),
        cmocka_unit_test(eagle_drops_the_last_matched_block),
        cmocka_unit_test(hybrid_groups_agree_on_one_length),
        cmocka_unit_test(hybrid_hit_is_aligned_to_the_scheduler_block_size),
        cmocka_unit_test(hybrid_search_iterates_to_a_fixed_point),
        cmocka_unit_test(scratch_and_ring_groups_take_no_part_in_hits),
        cmocka_unit_test(bad_search_arguments_are_rejected),
        cmocka_unit_test(partial_hash_hits_end_at_hash_block_boundaries),
        cmocka_unit_test(partial_hits_agree_with_a_brute_force),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
