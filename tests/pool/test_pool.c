/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Block pool rules (spec kv-offload §2.1, §2.3, and the pool behaviours of §5), one test per
 * rule, named after the behaviour.
 */
#include "kvt_test.h"

#define HL 16

static void key_of(uint32_t i, uint8_t out[HL])
{
    memset(out, 0, HL);
    memcpy(out, &i, sizeof(i));
    out[HL - 1] = 0xa5;
}

static kvt_pool *make_pool(uint32_t n, uint32_t events, uint32_t keys_per_block)
{
    kvt_pool_config c;
    kvt_pool_config_init(&c);
    c.num_blocks = n;
    c.event_capacity = events;
    c.keys_per_block = keys_per_block;
    kvt_pool *p = NULL;
    KVT_OK_(kvt_pool_create(&c, &p));
    return p;
}

static uint32_t ref_of(kvt_pool *p, uint32_t id)
{
    kvt_block_info bi;
    KVT_OK_(kvt_pool_block_info(p, id, &bi));
    return bi.ref_cnt;
}

/* Stores a "request": allocates n blocks, caches them under keys base..base+n-1, frees them in
 * the order given (vLLM frees a request's blocks tail first). */
static void store_request(kvt_pool *p, uint32_t base, uint32_t n, uint32_t *ids)
{
    KVT_OK_(kvt_pool_alloc(p, n, ids));
    for (uint32_t i = 0; i < n; i++) {
        uint8_t k[HL];
        key_of(base + i, k);
        KVT_OK_(kvt_pool_insert(p, ids[i], k, 0, 16));
    }
    KVT_OK_(kvt_pool_free(p, ids, n));
}

static bool cached(kvt_pool *p, uint32_t key)
{
    uint8_t k[HL];
    uint32_t b;
    key_of(key, k);
    int rc = kvt_pool_lookup(p, k, 0, &b);
    assert_true(rc >= 0);
    return rc == 1;
}

static void null_block_is_never_handed_out_or_counted(void **state)
{
    (void)state;
    kvt_pool *p = make_pool(5, 0, 1);
    assert_int_equal(kvt_pool_num_blocks(p), 5);
    assert_int_equal(kvt_pool_num_free(p), 4); /* "5 total = 4 usable" */
    uint32_t ids[4];
    KVT_OK_(kvt_pool_alloc(p, 4, ids));
    for (int i = 0; i < 4; i++)
        assert_int_not_equal(ids[i], KVT_NULL_BLOCK);
    KVT_ERR_(kvt_pool_alloc(p, 1, ids), KVT_ENOSPC);
    /* touching and freeing the null block change nothing */
    uint32_t null_id = KVT_NULL_BLOCK;
    KVT_OK_(kvt_pool_touch(p, &null_id, 1));
    KVT_OK_(kvt_pool_free(p, &null_id, 1));
    KVT_OK_(kvt_pool_free(p, &null_id, 1));
    kvt_block_info bi;
    KVT_OK_(kvt_pool_block_info(p, KVT_NULL_BLOCK, &bi));
    assert_true(bi.is_null);
    assert_int_equal(bi.ref_cnt, 0);
    assert_false(bi.is_free);
    assert_int_equal(kvt_pool_num_free(p), 0);
    uint8_t k[HL];
    key_of(1, k);
    KVT_ERR_(kvt_pool_insert(p, KVT_NULL_BLOCK, k, 0, 16), KVT_ERANGE);
    kvt_pool_destroy(p);
}

static void alloc_pops_from_lru_head_in_order(void **state)
{
    (void)state;
    kvt_pool *p = make_pool(6, 0, 1);
    uint32_t ids[5];
    KVT_OK_(kvt_pool_alloc(p, 2, ids));
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 2);
    for (uint32_t i = 0; i < 2; i++)
        assert_int_equal(ref_of(p, ids[i]), 1);
    assert_int_equal(kvt_pool_num_free(p), 3);
    assert_int_equal(kvt_pool_lru_first(p), 3);
    kvt_pool_destroy(p);
}

static void free_appends_to_tail_in_given_order(void **state)
{
    (void)state;
    kvt_pool *p = make_pool(5, 0, 1);
    uint32_t ids[4];
    KVT_OK_(kvt_pool_alloc(p, 4, ids));
    uint32_t order[4] = {3, 1, 4, 2};
    KVT_OK_(kvt_pool_free(p, order, 4));
    uint32_t got[4], n = 0;
    for (uint32_t b = kvt_pool_lru_first(p); b != KVT_BLOCK_NONE; b = kvt_pool_lru_next(p, b))
        got[n++] = b;
    assert_int_equal(n, 4);
    assert_memory_equal(got, order, sizeof(order));
    /* the first listed is reused first */
    uint32_t one;
    KVT_OK_(kvt_pool_alloc(p, 1, &one));
    assert_int_equal(one, 3);
    kvt_pool_destroy(p);
}

static void free_with_references_left_keeps_block_out_of_queue(void **state)
{
    (void)state;
    kvt_pool *p = make_pool(4, 0, 1);
    uint32_t id;
    KVT_OK_(kvt_pool_alloc(p, 1, &id));
    KVT_OK_(kvt_pool_touch(p, &id, 1));
    KVT_OK_(kvt_pool_free(p, &id, 1));
    assert_int_equal(ref_of(p, id), 1);
    assert_int_equal(kvt_pool_num_free(p), 2);
    KVT_OK_(kvt_pool_free(p, &id, 1));
    assert_int_equal(kvt_pool_num_free(p), 3);
    kvt_pool_destroy(p);
}

static void reusing_a_cached_block_evicts_its_keys(void **state)
{
    (void)state;
    kvt_pool *p = make_pool(3, 16, 1);
    uint32_t ids[2];
    store_request(p, 100, 2, ids);
    assert_true(cached(p, 100));
    assert_true(cached(p, 101));
    assert_int_equal(kvt_pool_num_cached(p), 2);
    kvt_pool_event ev[8];
    assert_int_equal(kvt_pool_take_events(p, ev, 8, NULL), 2);
    assert_int_equal(ev[0].type, KVT_POOL_EV_STORED);
    uint32_t id;
    KVT_OK_(kvt_pool_alloc(p, 1, &id));
    assert_int_equal(id, ids[0]);
    assert_false(cached(p, 100));
    assert_true(cached(p, 101));
    assert_int_equal(kvt_pool_num_cached(p), 1);
    assert_int_equal(kvt_pool_take_events(p, ev, 8, NULL), 1);
    assert_int_equal(ev[0].type, KVT_POOL_EV_REMOVED);
    assert_int_equal(ev[0].block, ids[0]);
    uint8_t k[HL];
    key_of(100, k);
    assert_memory_equal(ev[0].hash, k, HL);
    kvt_pool_destroy(p);
}

static void alloc_beyond_free_fails_and_changes_nothing(void **state)
{
    (void)state;
    kvt_pool *p = make_pool(4, 0, 1);
    uint32_t ids[4];
    KVT_ERR_(kvt_pool_alloc(p, 4, ids), KVT_ENOSPC);
    assert_int_equal(kvt_pool_num_free(p), 3);
    KVT_OK_(kvt_pool_alloc(p, 3, ids));
    kvt_pool_destroy(p);
}

static void touch_revives_a_cached_free_block(void **state)
{
    (void)state;
    kvt_pool *p = make_pool(4, 0, 1);
    uint32_t ids[1];
    store_request(p, 7, 1, ids);
    assert_int_equal(kvt_pool_num_free(p), 3); /* cached blocks stay free (evictable) */
    uint8_t k[HL];
    uint32_t b;
    key_of(7, k);
    assert_int_equal(kvt_pool_lookup(p, k, 0, &b), 1);
    KVT_OK_(kvt_pool_touch(p, &b, 1));
    assert_int_equal(ref_of(p, b), 1);
    assert_int_equal(kvt_pool_num_free(p), 2);
    uint32_t more[2];
    KVT_OK_(kvt_pool_alloc(p, 2, more)); /* cannot take the touched block */
    assert_int_not_equal(more[0], b);
    assert_int_not_equal(more[1], b);
    assert_true(cached(p, 7));
    kvt_pool_destroy(p);
}

/* spec §5 test_lru_eviction_order: 5 blocks (4 usable), requests of 2 blocks: storing c evicts
 * the oldest (a), keeps b and c. */
static void lru_eviction_evicts_the_oldest_request(void **state)
{
    (void)state;
    kvt_pool *p = make_pool(5, 0, 1);
    uint32_t a[2], b[2], c[2];
    store_request(p, 10, 2, a);
    store_request(p, 20, 2, b);
    store_request(p, 30, 2, c);
    assert_false(cached(p, 10) || cached(p, 11));
    assert_true(cached(p, 20) && cached(p, 21));
    assert_true(cached(p, 30) && cached(p, 31));
    kvt_pool_destroy(p);
}

/* spec §5 test_touched_blocks_survive_eviction: touch + free moves a's blocks to MRU, so b is
 * evicted instead. */
static void touched_blocks_survive_eviction(void **state)
{
    (void)state;
    kvt_pool *p = make_pool(5, 0, 1);
    uint32_t a[2], b[2], c[2];
    store_request(p, 10, 2, a);
    store_request(p, 20, 2, b);
    KVT_OK_(kvt_pool_touch(p, a, 2));
    KVT_OK_(kvt_pool_free(p, a, 2));
    store_request(p, 30, 2, c);
    assert_true(cached(p, 10) && cached(p, 11));
    assert_false(cached(p, 20) || cached(p, 21));
    kvt_pool_destroy(p);
}

static void double_free_is_rejected_and_changes_nothing(void **state)
{
    (void)state;
    kvt_pool *p = make_pool(5, 0, 1);
    uint32_t ids[2];
    KVT_OK_(kvt_pool_alloc(p, 2, ids));
    uint32_t list[3] = {ids[0], ids[1], ids[0]}; /* ids[0] twice with one reference */
    KVT_ERR_(kvt_pool_free(p, list, 3), KVT_ESTATE);
    assert_int_equal(ref_of(p, ids[0]), 1);
    assert_int_equal(ref_of(p, ids[1]), 1);
    assert_int_equal(kvt_pool_num_free(p), 2);
    KVT_OK_(kvt_pool_free(p, ids, 2));
    KVT_ERR_(kvt_pool_free(p, ids, 1), KVT_ESTATE);
    assert_int_equal(kvt_pool_num_free(p), 4);
    kvt_pool_destroy(p);
}

static void repeated_id_with_enough_references_is_freed_once(void **state)
{
    (void)state;
    kvt_pool *p = make_pool(4, 0, 1);
    uint32_t id;
    KVT_OK_(kvt_pool_alloc(p, 1, &id));
    KVT_OK_(kvt_pool_touch(p, &id, 1));
    uint32_t list[2] = {id, id};
    KVT_OK_(kvt_pool_free(p, list, 2));
    assert_int_equal(kvt_pool_num_free(p), 3);
    uint32_t n = 0;
    for (uint32_t b = kvt_pool_lru_first(p); b != KVT_BLOCK_NONE; b = kvt_pool_lru_next(p, b))
        n++;
    assert_int_equal(n, 3);
    kvt_pool_destroy(p);
}

static void ids_out_of_range_are_rejected_before_any_change(void **state)
{
    (void)state;
    kvt_pool *p = make_pool(4, 0, 1);
    uint32_t ids[2];
    KVT_OK_(kvt_pool_alloc(p, 2, ids));
    uint32_t bad[2] = {ids[0], 4};
    KVT_ERR_(kvt_pool_free(p, bad, 2), KVT_ERANGE);
    KVT_ERR_(kvt_pool_touch(p, bad, 2), KVT_ERANGE);
    KVT_ERR_(kvt_pool_evict(p, bad, 2), KVT_ERANGE);
    assert_int_equal(ref_of(p, ids[0]), 1);
    KVT_ERR_(kvt_pool_free(p, NULL, 1), KVT_EINVAL);
    kvt_block_info bi;
    KVT_ERR_(kvt_pool_block_info(p, 99, &bi), KVT_ERANGE);
    kvt_pool_destroy(p);
}

static void only_referenced_blocks_can_be_cached(void **state)
{
    (void)state;
    kvt_pool *p = make_pool(4, 0, 1);
    uint8_t k[HL];
    key_of(1, k);
    KVT_ERR_(kvt_pool_insert(p, 1, k, 0, 16), KVT_ESTATE);
    uint32_t id;
    KVT_OK_(kvt_pool_alloc(p, 1, &id));
    KVT_ERR_(kvt_pool_insert(p, id, k, 1, 16), KVT_ERANGE); /* group out of range */
    KVT_ERR_(kvt_pool_insert(p, id, k, 0, 0), KVT_ERANGE);  /* num_tokens */
    KVT_ERR_(kvt_pool_insert(p, id, k, 0, 17), KVT_ERANGE);
    KVT_ERR_(kvt_pool_insert(p, id, NULL, 0, 16), KVT_EINVAL);
    KVT_OK_(kvt_pool_insert(p, id, k, 0, 16));
    KVT_OK_(kvt_pool_insert(p, id, k, 0, 16)); /* same key again: no-op */
    kvt_block_info bi;
    KVT_OK_(kvt_pool_block_info(p, id, &bi));
    assert_int_equal(bi.n_keys, 1);
    uint8_t k2[HL];
    key_of(2, k2);
    KVT_ERR_(kvt_pool_insert(p, id, k2, 0, 16), KVT_ELIMIT); /* keys_per_block = 1 */
    kvt_pool_destroy(p);
}

/* #53498: secondary (finer-grained) keys are registered through the pool's own insert path,
 * found by lookup, listed after the primary, and all removed with the block. */
static void secondary_keys_are_indexed_and_evicted_with_the_block(void **state)
{
    (void)state;
    kvt_pool *p = make_pool(4, 32, 4);
    uint32_t id;
    KVT_OK_(kvt_pool_alloc(p, 1, &id));
    uint8_t prim[HL], sec1[HL], sec2[HL];
    key_of(50, prim);
    key_of(51, sec1);
    key_of(52, sec2);
    KVT_OK_(kvt_pool_insert(p, id, prim, 0, 16));
    KVT_OK_(kvt_pool_insert(p, id, sec1, 0, 4));
    KVT_OK_(kvt_pool_insert(p, id, sec2, 0, 8));
    kvt_pool_key keys[4];
    uint32_t n;
    KVT_OK_(kvt_pool_block_keys(p, id, keys, 4, &n));
    assert_int_equal(n, 3);
    assert_memory_equal(keys[0].hash, prim, HL);
    assert_int_equal(keys[0].num_tokens, 16);
    assert_memory_equal(keys[1].hash, sec1, HL);
    assert_int_equal(keys[1].num_tokens, 4);
    KVT_OK_(kvt_pool_block_keys(p, id, keys, 1, &n)); /* short buffer still reports the count */
    assert_int_equal(n, 3);
    uint32_t b;
    assert_int_equal(kvt_pool_lookup(p, sec2, 0, &b), 1);
    assert_int_equal(b, id);
    kvt_pool_event ev[8];
    assert_int_equal(kvt_pool_take_events(p, ev, 8, NULL), 3);
    KVT_OK_(kvt_pool_evict(p, &id, 1));
    assert_int_equal(kvt_pool_lookup(p, prim, 0, &b), 0);
    assert_int_equal(kvt_pool_lookup(p, sec1, 0, &b), 0);
    assert_int_equal(kvt_pool_lookup(p, sec2, 0, &b), 0);
    assert_int_equal(kvt_pool_take_events(p, ev, 8, NULL), 3);
    for (int i = 0; i < 3; i++)
        assert_int_equal(ev[i].type, KVT_POOL_EV_REMOVED);
    assert_int_equal(ref_of(p, id), 1); /* evict does not touch references */
    assert_int_equal(kvt_pool_num_cached(p), 0);
    kvt_pool_destroy(p);
}

static void key_includes_the_group_id(void **state)
{
    (void)state;
    kvt_pool_config c;
    kvt_pool_config_init(&c);
    c.num_blocks = 4;
    c.n_groups = 2;
    c.groups[1] = c.groups[0];
    kvt_pool *p;
    KVT_OK_(kvt_pool_create(&c, &p));
    uint32_t ids[2], b;
    KVT_OK_(kvt_pool_alloc(p, 2, ids));
    uint8_t k[HL];
    key_of(9, k);
    KVT_OK_(kvt_pool_insert(p, ids[0], k, 0, 16));
    assert_int_equal(kvt_pool_lookup(p, k, 1, &b), 0);
    KVT_OK_(kvt_pool_insert(p, ids[1], k, 1, 16));
    assert_int_equal(kvt_pool_lookup(p, k, 1, &b), 1);
    assert_int_equal(b, ids[1]);
    assert_int_equal(kvt_pool_lookup(p, k, 0, &b), 1);
    assert_int_equal(b, ids[0]);
    KVT_ERR_(kvt_pool_lookup(p, k, 2, &b), KVT_ERANGE);
    kvt_pool_destroy(p);
}

static void two_blocks_may_carry_the_same_key(void **state)
{
    (void)state;
    kvt_pool *p = make_pool(4, 0, 1);
    uint32_t ids[2], b;
    KVT_OK_(kvt_pool_alloc(p, 2, ids));
    uint8_t k[HL];
    key_of(3, k);
    KVT_OK_(kvt_pool_insert(p, ids[0], k, 0, 16));
    KVT_OK_(kvt_pool_insert(p, ids[1], k, 0, 16));
    assert_int_equal(kvt_pool_lookup(p, k, 0, &b), 1);
    assert_true(b == ids[0] || b == ids[1]);
    KVT_OK_(kvt_pool_evict(p, &b, 1));
    uint32_t other = b == ids[0] ? ids[1] : ids[0];
    assert_int_equal(kvt_pool_lookup(p, k, 0, &b), 1);
    assert_int_equal(b, other);
    kvt_pool_destroy(p);
}

static void reset_prefix_cache_refuses_while_blocks_are_referenced(void **state)
{
    (void)state;
    kvt_pool *p = make_pool(5, 16, 1);
    uint32_t ids[4];
    store_request(p, 40, 2, ids);
    uint32_t held;
    KVT_OK_(kvt_pool_alloc(p, 1, &held));
    KVT_ERR_(kvt_pool_reset_prefix_cache(p), KVT_EBUSY);
    assert_true(cached(p, 40));
    KVT_OK_(kvt_pool_free(p, &held, 1));
    kvt_pool_event ev[8];
    kvt_pool_take_events(p, ev, 8, NULL);
    KVT_OK_(kvt_pool_reset_prefix_cache(p));
    assert_false(cached(p, 40) || cached(p, 41));
    assert_int_equal(kvt_pool_num_cached(p), 0);
    assert_int_equal(kvt_pool_num_free(p), 4);
    assert_int_equal(kvt_pool_take_events(p, ev, 8, NULL), 1);
    assert_int_equal(ev[0].type, KVT_POOL_EV_ALL_CLEARED);
    /* the pool is fully usable afterwards */
    store_request(p, 60, 4, ids);
    kvt_pool_destroy(p);
}

static void events_are_off_by_default_and_overflow_is_reported(void **state)
{
    (void)state;
    kvt_pool *p = make_pool(8, 0, 1);
    uint32_t ids[8];
    store_request(p, 1, 4, ids);
    kvt_pool_event ev[8];
    uint64_t dropped = 99;
    assert_int_equal(kvt_pool_take_events(p, ev, 8, &dropped), 0);
    assert_int_equal(dropped, 0);
    kvt_pool_destroy(p);

    p = make_pool(8, 3, 1);
    store_request(p, 1, 5, ids);
    assert_int_equal(kvt_pool_take_events(p, ev, 2, &dropped), 2);
    assert_int_equal(dropped, 2);
    assert_int_equal(kvt_pool_take_events(p, ev, 8, &dropped), 1);
    assert_int_equal(dropped, 0);
    uint8_t k[HL];
    key_of(3, k);
    assert_memory_equal(ev[0].hash, k, HL); /* oldest kept, newest dropped */
    kvt_pool_destroy(p);
}

static void lru_walk_detects_a_cursor_that_was_allocated(void **state)
{
    (void)state;
    kvt_pool *p = make_pool(5, 0, 1);
    uint32_t first = kvt_pool_lru_first(p);
    assert_int_equal(first, 1);
    assert_int_equal(kvt_pool_lru_next(p, first), 2);
    uint32_t id;
    KVT_OK_(kvt_pool_alloc(p, 1, &id));
    assert_int_equal(id, first);
    assert_int_equal(kvt_pool_lru_next(p, first), KVT_BLOCK_NONE);
    assert_int_equal(kvt_pool_lru_next(p, 4), KVT_BLOCK_NONE); /* tail */
    assert_int_equal(kvt_pool_lru_next(p, 77), KVT_BLOCK_NONE);
    uint32_t rest[3];
    KVT_OK_(kvt_pool_alloc(p, 3, rest));
    assert_int_equal(kvt_pool_lru_first(p), KVT_BLOCK_NONE);
    kvt_pool_destroy(p);
}

static void usage_counts_referenced_blocks_only(void **state)
{
    (void)state;
    kvt_pool *p = make_pool(5, 0, 1);
    uint32_t ids[2];
    assert_true(kvt_pool_usage(p) == 0.0);
    KVT_OK_(kvt_pool_alloc(p, 2, ids));
    assert_true(kvt_pool_usage(p) == 0.5);
    kvt_pool_destroy(p);
}

static void invalid_configs_are_rejected_with_a_message(void **state)
{
    (void)state;
    kvt_pool_config c;
    kvt_pool *p = NULL;
    kvt_pool_config_init(&c);
    KVT_ERR_(kvt_pool_create(&c, &p), KVT_EINVAL); /* num_blocks unset */
    assert_null(p);
    c.num_blocks = 1;
    KVT_ERR_(kvt_pool_create(&c, &p), KVT_EINVAL);
    c.num_blocks = 16;
    c.hash_len = 33;
    KVT_ERR_(kvt_pool_create(&c, &p), KVT_EINVAL);
    c.hash_len = 16;
    c.keys_per_block = 0;
    KVT_ERR_(kvt_pool_create(&c, &p), KVT_EINVAL);
    c.keys_per_block = 1;
    c.n_groups = 0;
    KVT_ERR_(kvt_pool_create(&c, &p), KVT_EINVAL);
    c.n_groups = 1;
    c.groups[0].block_size = 24; /* not a multiple of hash_block_size 16 */
    KVT_ERR_(kvt_pool_create(&c, &p), KVT_EINVAL);
    c.groups[0].block_size = 16;
    c.groups[0].kind = 9;
    KVT_ERR_(kvt_pool_create(&c, &p), KVT_EINVAL);
    c.groups[0].kind = KVT_GROUP_SLIDING;
    c.groups[0].sliding_window = 0;
    KVT_ERR_(kvt_pool_create(&c, &p), KVT_EINVAL);
    c.groups[0].sliding_window = 64;
    c.scheduler_block_size = 24;
    KVT_ERR_(kvt_pool_create(&c, &p), KVT_EINVAL);
    c.scheduler_block_size = 32;
    KVT_OK_(kvt_pool_create(&c, &p));
    kvt_pool_destroy(p);
    KVT_ERR_(kvt_pool_create(NULL, &p), KVT_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(null_block_is_never_handed_out_or_counted),
        cmocka_unit_test(alloc_pops_from_lru_head_in_order),
        cmocka_unit_test(free_appends_to_tail_in_given_order),
        cmocka_unit_test(free_with_references_left_keeps_block_out_of_queue),
        cmocka_unit_test(reusing_a_cached_block_evicts_its_keys),
        cmocka_unit_test(alloc_beyond_free_fails_and_changes_nothing),
        cmocka_unit_test(touch_revives_a_cached_free_block),
        cmocka_unit_test(lru_eviction_evicts_the_oldest_request),
        cmocka_unit_test(touched_blocks_survive_eviction),
        cmocka_unit_test(double_free_is_rejected_and_changes_nothing),
        cmocka_unit_test(repeated_id_with_enough_references_is_freed_once),
        cmocka_unit_test(ids_out_of_range_are_rejected_before_any_change),
        cmocka_unit_test(only_referenced_blocks_can_be_cached),
        cmocka_unit_test(secondary_keys_are_indexed_and_evicted_with_the_block),
        cmocka_unit_test(key_includes_the_group_id),
        cmocka_unit_test(two_blocks_may_carry_the_same_key),
        cmocka_unit_test(reset_prefix_cache_refuses_while_blocks_are_referenced),
        cmocka_unit_test(events_are_off_by_default_and_overflow_is_reported),
        cmocka_unit_test(lru_walk_detects_a_cursor_that_was_allocated),
        cmocka_unit_test(usage_counts_referenced_blocks_only),
        cmocka_unit_test(invalid_configs_are_rejected_with_a_message),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
