/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Encoder-cache metadata: specs and their tensor checks, the step metadata (freed None vs
 * empty), worker reports as sorted sets, and the aggregation rules of the seed (loaded
 * intersected, failures and reclaims united, pending saves or-ed, a non-receiving rank
 * contributing nothing).
 */
#include "kvt_test.h"
#include "meta/meta_samples.h"
#include "meta/wire_builder.h"

static void specs_round_trip_on_their_own(void **state)
{
    (void)state;
    kvt_ec_load_spec l, lb;
    kvt_ec_push_spec p, pb;
    kvt_sample_load_spec(&l, "sha256:01", true);
    kvt_sample_push_spec(&p, "sha256:02", "");
    unsigned char buf[512];
    size_t len;
    kvt_bump strings = {0};
    KVT_OK_(kvt_ec_load_spec_encode(&l, buf, sizeof(buf), &len));
    KVT_OK_(kvt_ec_load_spec_decode(&lb, &strings, buf, len));
    assert_true(kvt_ec_load_spec_equal(&l, &lb));
    assert_true(lb.local);
    KVT_OK_(kvt_ec_push_spec_encode(&p, buf, sizeof(buf), &len));
    KVT_OK_(kvt_ec_push_spec_decode(&pb, &strings, buf, len));
    assert_true(kvt_ec_push_spec_equal(&p, &pb));
    assert_int_equal(pb.request_id.len, 0); /* request_id may be empty */
    assert_string_equal(pb.consumer_zmq.ptr, "tcp://10.0.0.7:17100");
    KVT_ERR_(kvt_ec_push_spec_decode(&pb, &strings, buf, len - 1), KVT_EPROTO);
    kvt_bump_release(&strings);
}

static void nbytes_must_match_shape_and_known_dtype(void **state)
{
    (void)state;
    kvt_ec_load_spec l;
    kvt_sample_load_spec(&l, "h", false);
    KVT_OK_(kvt_ec_load_spec_validate(&l));
    l.nbytes += 1;
    KVT_ERR_(kvt_ec_load_spec_validate(&l), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "nbytes"));
    l.dtype = (kvt_str){"float32", 7};
    l.nbytes = 576ull * 1024 * 4;
    KVT_OK_(kvt_ec_load_spec_validate(&l));
    l.dtype = (kvt_str){"future_fp6", 10}; /* unknown dtype names pass */
    l.nbytes = 12345;
    KVT_OK_(kvt_ec_load_spec_validate(&l));
    l.dtype = (kvt_str){"Float32", 7};
    KVT_ERR_(kvt_ec_load_spec_validate(&l), KVT_EINVAL);
    l.dtype = (kvt_str){"", 0};
    KVT_ERR_(kvt_ec_load_spec_validate(&l), KVT_EINVAL);
    kvt_sample_load_spec(&l, "h", false);
    l.ndim = KVT_EC_MAX_DIMS + 1;
    KVT_ERR_(kvt_ec_load_spec_validate(&l), KVT_ELIMIT);
    kvt_sample_load_spec(&l, "h", false);
    l.shape[0] = UINT64_MAX / 2;
    KVT_ERR_(kvt_ec_load_spec_validate(&l), KVT_EINVAL);
    assert_int_equal(kvt_dtype_size("bfloat16", 8), 2);
    assert_int_equal(kvt_dtype_size("float8_e4m3fn", 13), 1);
    assert_int_equal(kvt_dtype_size("bfloat", 6), 0);
}

static void identifiers_are_required_and_never_hold_nul(void **state)
{
    (void)state;
    kvt_ec_push_spec p;
    kvt_sample_push_spec(&p, "h", "r");
    p.mm_hash.len = 0;
    KVT_ERR_(kvt_ec_push_spec_validate(&p), KVT_EINVAL);
    kvt_sample_push_spec(&p, "h", "r");
    p.transfer_id = (kvt_str){"a\0b", 3};
    KVT_ERR_(kvt_ec_push_spec_validate(&p), KVT_EINVAL);
    kvt_sample_push_spec(&p, "h", "r");
    p.consumer_zmq = (kvt_str){"", 0};
    KVT_ERR_(kvt_ec_push_spec_validate(&p), KVT_EINVAL);
}

static void step_metadata_round_trips_and_keeps_freed_none_apart_from_empty(void **state)
{
    (void)state;
    kvt_ec_meta m, back;
    kvt_ec_meta_init(&m);
    kvt_ec_meta_init(&back);
    kvt_ec_load_spec l;
    kvt_ec_push_spec p;
    char hash[32];
    for (int i = 0; i < 20; i++) {
        snprintf(hash, sizeof(hash), "sha256:%04d", i);
        kvt_sample_load_spec(&l, hash, i % 2);
        KVT_OK_(kvt_ec_meta_add_load(&m, &l));
        kvt_sample_push_spec(&p, hash, "req");
        KVT_OK_(kvt_ec_meta_add_push(&m, &p));
    }
    /* the metadata owns copies of every string */
    memset(hash, 'x', sizeof(hash));
    assert_string_equal(m.loads[19].mm_hash.ptr, "sha256:0019");
    unsigned char *buf = malloc(kvt_ec_meta_encoded_size(&m));
    size_t len;
    KVT_OK_(kvt_ec_meta_encode(&m, buf, kvt_ec_meta_encoded_size(&m), &len));
    KVT_OK_(kvt_ec_meta_decode(&back, buf, len));
    assert_true(kvt_ec_meta_equal(&m, &back));
    assert_false(back.has_freed); /* None */
    m.has_freed = true;           /* [] */
    free(buf);
    buf = malloc(kvt_ec_meta_encoded_size(&m));
    KVT_OK_(kvt_ec_meta_encode(&m, buf, kvt_ec_meta_encoded_size(&m), &len));
    KVT_OK_(kvt_ec_meta_decode(&back, buf, len));
    assert_true(back.has_freed);
    assert_int_equal(back.n_freed, 0);
    KVT_OK_(kvt_ec_meta_add_freed(&m, "sha256:0003", 11));
    m.has_freed = false;
    KVT_ERR_(kvt_ec_meta_validate(&m), KVT_EINVAL); /* None cannot hold entries */
    free(buf);
    kvt_ec_meta_release(&m);
    kvt_ec_meta_release(&back);
}

static void worker_sets_are_sorted_and_unique(void **state)
{
    (void)state;
    kvt_ec_worker_meta m;
    kvt_ec_worker_meta_init(&m);
    const char *in[] = {"c", "a", "b", "a", "ab"};
    for (int i = 0; i < 5; i++)
        KVT_OK_(kvt_ec_worker_meta_add(&m, KVT_EC_LOADED, in[i], (uint32_t)strlen(in[i])));
    const char *want[] = {"a", "ab", "b", "c"};
    assert_int_equal(m.loaded.n, 4);
    for (int i = 0; i < 4; i++)
        assert_string_equal(m.loaded.items[i].ptr, want[i]);
    assert_true(kvt_strset_contains(&m.loaded, "ab", 2));
    assert_false(kvt_strset_contains(&m.loaded, "d", 1));
    KVT_ERR_(kvt_ec_worker_meta_add(&m, 7, "x", 1), KVT_EINVAL);
    KVT_ERR_(kvt_ec_worker_meta_add(&m, KVT_EC_RECLAIMED, "", 0), KVT_EINVAL);
    kvt_ec_worker_meta_release(&m);
}

static void decoder_rejects_unsorted_or_repeated_set_members(void **state)
{
    (void)state;
    kvt_ec_worker_meta m;
    kvt_ec_worker_meta_init(&m);
    wb w;
    const char *orders[2][2] = {{"b", "a"}, {"a", "a"}};
    for (int t = 0; t < 2; t++) {
        wb_begin(&w, KVT_META_EC_WORKER);
        wb_u32(&w, 2);
        wb_str(&w, orders[t][0], 1);
        wb_str(&w, orders[t][1], 1);
        wb_u32(&w, 0);
        wb_u32(&w, 0);
        wb_u8(&w, 0);
        wb_u32(&w, 0);
        wb_done(&w);
        KVT_ERR_(kvt_ec_worker_meta_decode(&m, w.b, w.n), KVT_EPROTO);
        assert_int_equal(m.loaded.n, 0);
    }
    w.b[12 + 4 + 5 + 4] = 'b'; /* {"a", "b"} is fine */
    KVT_OK_(kvt_ec_worker_meta_decode(&m, w.b, w.n));
    assert_int_equal(m.loaded.n, 2);
    kvt_ec_worker_meta_release(&m);
}

static kvt_ec_worker_meta report(const char *loaded, const char *failed, const char *reclaimed,
                                 bool pending, const char *failed_saves)
{
    kvt_ec_worker_meta m;
    kvt_ec_worker_meta_init(&m);
    const char *lists[4] = {loaded, failed, reclaimed, failed_saves};
    for (int s = 0; s < 4; s++)
        for (const char *p = lists[s]; p && *p; p++)
            KVT_OK_(kvt_ec_worker_meta_add(&m, s, p, 1));
    m.pending_saves = pending;
    return m;
}

/* vLLM test_an_item_one_rank_missed_is_not_loaded / a reclaim on any rank invalidates. */
static void aggregate_intersects_loaded_and_unites_the_rest(void **state)
{
    (void)state;
    kvt_ec_worker_meta r0 = report("abc", "x", "p", false, "");
    kvt_ec_worker_meta r1 = report("bcd", "y", "", true, "q");
    KVT_OK_(kvt_ec_worker_meta_aggregate(&r0, &r1));
    kvt_ec_worker_meta want = report("bc", "xy", "p", true, "q");
    assert_true(kvt_ec_worker_meta_equal(&r0, &want));
    kvt_ec_worker_meta_release(&r0);
    kvt_ec_worker_meta_release(&r1);
    kvt_ec_worker_meta_release(&want);
}

static void non_receiving_ranks_contribute_nothing(void **state)
{
    (void)state;
    kvt_ec_worker_meta r0 = report("ab", "", "", false, "");
    kvt_ec_worker_meta r2 = report("b", "", "z", false, "");
    kvt_ec_worker_meta agg;
    kvt_ec_worker_meta_init(&agg);
    const kvt_ec_worker_meta *ranks[4] = {NULL, &r0, NULL, &r2};
    uint32_t n;
    KVT_OK_(kvt_ec_worker_meta_aggregate_ranks(&agg, ranks, 4, &n));
    assert_int_equal(n, 2);
    kvt_ec_worker_meta want = report("b", "", "z", false, "");
    assert_true(kvt_ec_worker_meta_equal(&agg, &want));
    /* one report alone is copied, not intersected with an empty set */
    const kvt_ec_worker_meta *one[2] = {NULL, &r0};
    KVT_OK_(kvt_ec_worker_meta_aggregate_ranks(&agg, one, 2, &n));
    assert_int_equal(n, 1);
    assert_true(kvt_ec_worker_meta_equal(&agg, &r0));
    /* an empty `loaded` from a receiving rank does empty the intersection */
    kvt_ec_worker_meta e = report("", "", "", false, "");
    const kvt_ec_worker_meta *with_empty[2] = {&r0, &e};
    KVT_OK_(kvt_ec_worker_meta_aggregate_ranks(&agg, with_empty, 2, &n));
    assert_int_equal(agg.loaded.n, 0);
    const kvt_ec_worker_meta *none[2] = {NULL, NULL};
    KVT_OK_(kvt_ec_worker_meta_aggregate_ranks(&agg, none, 2, &n));
    assert_int_equal(n, 0);
    kvt_ec_worker_meta_release(&r0);
    kvt_ec_worker_meta_release(&r2);
    kvt_ec_worker_meta_release(&agg);
    kvt_ec_worker_meta_release(&want);
    kvt_ec_worker_meta_release(&e);
}

static void aggregated_report_outlives_its_sources(void **state)
{
    (void)state;
    kvt_ec_worker_meta agg;
    kvt_ec_worker_meta_init(&agg);
    for (int round = 0; round < 50; round++) {
        kvt_ec_worker_meta r = report("mn", "fg", "uv", round % 2, "st");
        const kvt_ec_worker_meta *ranks[1] = {&r};
        if (round == 0)
            KVT_OK_(kvt_ec_worker_meta_aggregate_ranks(&agg, ranks, 1, NULL));
        else
            KVT_OK_(kvt_ec_worker_meta_aggregate(&agg, &r));
        kvt_ec_worker_meta_release(&r); /* agg must hold its own copies */
    }
    assert_int_equal(agg.failed_loads.n, 2);
    assert_string_equal(agg.failed_loads.items[1].ptr, "g");
    assert_string_equal(agg.loaded.items[0].ptr, "m");
    assert_true(agg.pending_saves);
    kvt_ec_worker_meta_release(&agg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(specs_round_trip_on_their_own),
        cmocka_unit_test(nbytes_must_match_shape_and_known_dtype),
        cmocka_unit_test(identifiers_are_required_and_never_hold_nul),
        cmocka_unit_test(step_metadata_round_trips_and_keeps_freed_none_apart_from_empty),
        cmocka_unit_test(worker_sets_are_sorted_and_unique),
        cmocka_unit_test(decoder_rejects_unsorted_or_repeated_set_members),
        cmocka_unit_test(aggregate_intersects_loaded_and_unites_the_rest),
        cmocka_unit_test(non_receiving_ranks_contribute_nothing),
        cmocka_unit_test(aggregated_report_outlives_its_sources),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
