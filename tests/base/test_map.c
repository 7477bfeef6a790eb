/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Open-addressing multimap: duplicates, removal by (hash, value), backward-shift deletion
 * keeping every remaining entry reachable (checked against a plain array over long random
 * sequences with deliberately colliding hashes), and the fixed capacity.
 */
#include "base/map.h"
#include "kvt_test.h"

static uint32_t count_values(const kvi_map *m, uint64_t h, uint32_t v)
{
    uint64_t pos = kvi_map_probe_start(m, h);
    uint32_t got, n = 0;
    while (kvi_map_probe_next(m, h, &pos, &got))
        n += got == v;
    return n;
}

static void duplicates_are_kept_and_removed_one_at_a_time(void **state)
{
    (void)state;
    kvi_map m;
    KVT_OK_(kvi_map_init(&m, 8));
    KVT_OK_(kvi_map_insert(&m, 5, 1));
    KVT_OK_(kvi_map_insert(&m, 5, 1));
    KVT_OK_(kvi_map_insert(&m, 5, 2));
    assert_int_equal(count_values(&m, 5, 1), 2);
    assert_true(kvi_map_remove(&m, 5, 1));
    assert_int_equal(count_values(&m, 5, 1), 1);
    assert_false(kvi_map_remove(&m, 5, 3));
    assert_false(kvi_map_remove(&m, 6, 1));
    assert_int_equal(m.count, 2);
    kvi_map_clear(&m);
    assert_int_equal(m.count, 0);
    assert_int_equal(count_values(&m, 5, 2), 0);
    kvi_map_free(&m);
}

static void capacity_is_fixed(void **state)
{
    (void)state;
    kvi_map m;
    KVT_ERR_(kvi_map_init(&m, 0), KVT_EINVAL);
    KVT_OK_(kvi_map_init(&m, 3));
    for (uint32_t i = 0; i < 3; i++)
        KVT_OK_(kvi_map_insert(&m, i, i));
    KVT_ERR_(kvi_map_insert(&m, 9, 9), KVT_ENOSPC);
    assert_true(m.mask + 1 >= 6); /* load factor <= 1/2 */
    kvi_map_free(&m);
}

/* Random inserts and removals with hashes drawn from a tiny set (long collision chains that
 * wrap around the table) against a plain list of pairs. */
static void random_operations_match_a_plain_list(void **state)
{
    (void)state;
    uint64_t seed = kvt_test_seed(), rng = seed;
    enum { CAP = 64 };
    uint64_t hs[CAP];
    uint32_t vs[CAP], n = 0;
    kvi_map m;
    KVT_OK_(kvi_map_init(&m, CAP));
    uint64_t ops = (uint64_t)(200000 * kvt_test_scale());
    for (uint64_t op = 0; op < ops; op++) {
        /* hashes whose home slots cluster at the end of the table, to exercise wrap-around */
        uint64_t h = m.mask - kvt_test_below(&rng, 6) + ((uint64_t)kvt_test_below(&rng, 3) << 40);
        uint32_t v = kvt_test_below(&rng, 8);
        if (kvt_test_below(&rng, 2) && n < CAP) {
            KVT_OK_(kvi_map_insert(&m, h, v));
            hs[n] = h;
            vs[n++] = v;
        } else {
            bool present = false;
            for (uint32_t i = 0; i < n; i++)
                if (hs[i] == h && vs[i] == v) {
                    hs[i] = hs[n - 1];
                    vs[i] = vs[n - 1];
                    n--;
                    present = true;
                    break;
                }
            if (kvi_map_remove(&m, h, v) != present)
                fail_msg("remove mismatch at op %llu (KVTIER_TEST_SEED=%llu)",
                         (unsigned long long)op, (unsigned long long)seed);
        }
        if (op % 97 == 0) {
            assert_int_equal(m.count, n);
            for (uint32_t i = 0; i < n; i++) {
                uint32_t want = 0;
                for (uint32_t k = 0; k < n; k++)
                    want += hs[k] == hs[i] && vs[k] == vs[i];
                if (count_values(&m, hs[i], vs[i]) != want)
                    fail_msg("entry unreachable at op %llu (KVTIER_TEST_SEED=%llu)",
                             (unsigned long long)op, (unsigned long long)seed);
            }
        }
    }
    kvi_map_free(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(duplicates_are_kept_and_removed_one_at_a_time),
        cmocka_unit_test(capacity_is_fixed),
        cmocka_unit_test(random_operations_match_a_plain_list),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
