/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The encoder-cache slab allocator (spec ec-transfer §3.1): the spec's examples, coalescing
 * with both neighbours, refused double frees and forged views, and a randomized test against
 * a granule map.
 */
#include "kvt_test.h"

static kvt_slab_view alloc_ok(kvt_slab *s, uint64_t n, uint64_t off, uint64_t rounded)
{
    kvt_slab_view v;
    KVT_OK_(kvt_slab_alloc(s, n, &v));
    assert_int_equal(v.offset, off);
    assert_int_equal(v.rounded, rounded);
    assert_int_equal(v.nbytes, n);
    return v;
}

static void spec_examples(void **state)
{
    (void)state;
    kvt_slab *s;
    KVT_OK_(kvt_slab_create(NULL, 1024, &s));
    kvt_slab_view a = alloc_ok(s, 1, 0, 256);
    kvt_slab_view b = alloc_ok(s, 300, 256, 512);
    kvt_slab_view none;
    KVT_ERR_(kvt_slab_alloc(s, 300, &none), KVT_ENOSPC);
    assert_int_equal(none.rounded, 0);
    KVT_OK_(kvt_slab_free(s, &a));
    KVT_OK_(kvt_slab_free(s, &b));
    assert_int_equal(kvt_slab_free_extents(s), 1);
    alloc_ok(s, 1024, 0, 1024);
    kvt_slab_destroy(s);

    KVT_OK_(kvt_slab_create(NULL, 768, &s));
    alloc_ok(s, 257, 0, 512);
    alloc_ok(s, 1, 512, 256);
    KVT_ERR_(kvt_slab_alloc(s, 1, &none), KVT_ENOSPC);
    assert_int_equal(kvt_slab_free_bytes(s), 0);
    kvt_slab_destroy(s);
}

static void views_point_into_the_buffer(void **state)
{
    (void)state;
    static unsigned char buf[4096];
    kvt_slab *s;
    KVT_OK_(kvt_slab_create(buf, sizeof(buf) + 100, &s)); /* rounded down to the granule */
    assert_int_equal(kvt_slab_capacity(s), 4096);
    kvt_slab_view a = alloc_ok(s, 10, 0, 256), b = alloc_ok(s, 1000, 256, 1024);
    assert_ptr_equal(a.ptr, buf);
    assert_ptr_equal(b.ptr, buf + 256);
    kvt_slab_view none;
    KVT_ERR_(kvt_slab_alloc(s, 0, &none), KVT_EINVAL);
    KVT_ERR_(kvt_slab_alloc(s, 5000, &none), KVT_ENOSPC);
    kvt_slab_destroy(s);
    KVT_ERR_(kvt_slab_create(buf, 255, &s), KVT_EINVAL);
}

static void free_coalesces_and_refuses_double_frees(void **state)
{
    (void)state;
    kvt_slab *s;
    KVT_OK_(kvt_slab_create(NULL, 2048, &s));
    kvt_slab_view v[8];
    for (int i = 0; i < 8; i++)
        v[i] = alloc_ok(s, 256, 256 * (uint64_t)i, 256);
    KVT_OK_(kvt_slab_free(s, &v[1]));
    KVT_OK_(kvt_slab_free(s, &v[3]));
    assert_int_equal(kvt_slab_free_extents(s), 2);
    KVT_OK_(kvt_slab_free(s, &v[2])); /* joins both neighbours */
    assert_int_equal(kvt_slab_free_extents(s), 1);
    assert_int_equal(kvt_slab_largest_free(s), 768);
    KVT_ERR_(kvt_slab_free(s, &v[2]), KVT_EINVAL); /* double free */
    assert_non_null(strstr(kvt_last_error(), "double free"));
    kvt_slab_view forged = {256 + 128, 256, 256, NULL};
    KVT_ERR_(kvt_slab_free(s, &forged), KVT_EINVAL); /* not aligned */
    forged = (kvt_slab_view){1792, 512, 512, NULL};
    KVT_ERR_(kvt_slab_free(s, &forged), KVT_EINVAL); /* past the end */
    forged = (kvt_slab_view){512, 512, 512, NULL};
    KVT_ERR_(kvt_slab_free(s, &forged), KVT_EINVAL); /* overlaps free space */
    assert_int_equal(kvt_slab_free_bytes(s), 768);
    /* first fit reuses the lowest hole */
    alloc_ok(s, 200, 256, 256);
    kvt_slab_destroy(s);
}

/* Random allocations and frees against a map of which granules are taken. */
static void random_traffic_matches_a_granule_map(void **state)
{
    (void)state;
    uint64_t seed = kvt_test_seed();
    enum { G = 512, LIVE = 64 };
    kvt_slab *s;
    KVT_OK_(kvt_slab_create(NULL, (uint64_t)G * KVT_SLAB_GRANULE, &s));
    unsigned char map[G] = {0};
    kvt_slab_view live[LIVE];
    uint32_t n_live = 0;
    uint32_t ops = (uint32_t)(200000 * kvt_test_scale());
    for (uint32_t op = 0; op < ops; op++) {
        if (n_live < LIVE && (n_live == 0 || kvt_test_below(&seed, 2))) {
            uint64_t want = 1 + kvt_test_below(&seed, 40 * KVT_SLAB_GRANULE);
            uint64_t g = (want + KVT_SLAB_GRANULE - 1) / KVT_SLAB_GRANULE;
            /* the model's first fit */
            int64_t fit = -1;
            for (uint32_t i = 0, run = 0; i < G; i++) {
                run = map[i] ? 0 : run + 1;
                if (run == g) {
                    fit = i + 1 - g;
                    break;
                }
            }
            kvt_slab_view v;
            int rc = kvt_slab_alloc(s, want, &v);
            if (fit < 0) {
                if (rc != KVT_ENOSPC)
                    fail_msg("seed %llu op %u: expected no room", (unsigned long long)seed, op);
                continue;
            }
            if (rc || v.offset != (uint64_t)fit * KVT_SLAB_GRANULE)
                fail_msg("seed %llu op %u: got offset %llu rc %d, model first fit %lld",
                         (unsigned long long)seed, op, (unsigned long long)v.offset, rc,
                         (long long)fit * KVT_SLAB_GRANULE);
            for (uint64_t i = 0; i < g; i++)
                map[fit + i] = 1;
            live[n_live++] = v;
        } else {
            uint32_t k = kvt_test_below(&seed, n_live);
            KVT_OK_(kvt_slab_free(s, &live[k]));
            for (uint64_t i = 0; i < live[k].rounded / KVT_SLAB_GRANULE; i++)
                map[live[k].offset / KVT_SLAB_GRANULE + i] = 0;
            live[k] = live[--n_live];
        }
        uint64_t free_g = 0;
        for (uint32_t i = 0; i < G; i++)
            free_g += !map[i];
        if (kvt_slab_free_bytes(s) != free_g * KVT_SLAB_GRANULE)
            fail_msg("seed %llu op %u: free bytes differ", (unsigned long long)seed, op);
    }
    print_message("slab model: %u operations (seed %llu)\n", ops, (unsigned long long)seed);
    while (n_live)
        KVT_OK_(kvt_slab_free(s, &live[--n_live]));
    assert_int_equal(kvt_slab_free_bytes(s), (uint64_t)G * KVT_SLAB_GRANULE);
    assert_int_equal(kvt_slab_free_extents(s), 1);
    kvt_slab_destroy(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(spec_examples),
        cmocka_unit_test(views_point_into_the_buffer),
        cmocka_unit_test(free_coalesces_and_refuses_double_frees),
        cmocka_unit_test(random_traffic_matches_a_granule_map),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
