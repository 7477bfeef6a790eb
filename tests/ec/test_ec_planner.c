/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The producer scheduler's push planning (spec ec-transfer §1.4 step 1 and the [later]
 * scheduler file `test_mooncake_scheduler.py`), one test per behaviour, named after it.
 */
#include "ec/inproc.h"

static kvt_ec_push_spec spec(const char *t, const char *h, uint64_t tokens, const char *req)
{
    return inproc_spec(t, h, tokens, req);
}

static int prepare(kvt_ec_planner *p, const char *t, const char *h, uint64_t tokens,
                   const char *req)
{
    kvt_ec_push_spec s = spec(t, h, tokens, req);
    return kvt_ec_planner_prepare(p, &s);
}

static void producer_builds_push_metadata_once(void **state)
{
    (void)state;
    kvt_ec_planner *p;
    KVT_OK_(kvt_ec_planner_create(0, &p));
    assert_int_equal(prepare(p, "t", "h", 100, "r"), 1);
    assert_int_equal(prepare(p, "t", "h", 100, "r"), 0); /* a later step: no duplicate */
    kvt_ec_meta m;
    kvt_ec_meta_init(&m);
    KVT_OK_(kvt_ec_planner_build_meta(p, &m));
    assert_int_equal(m.n_pushes, 1);
    assert_int_equal(m.pushes[0].nbytes, 100 * 1024);
    assert_string_equal(m.pushes[0].transfer_id.ptr, "t");
    assert_string_equal(m.pushes[0].request_id.ptr, "r");
    kvt_ec_meta_clear(&m);
    KVT_OK_(kvt_ec_planner_build_meta(p, &m));
    assert_int_equal(m.n_pushes, 0); /* emitted exactly once */
    kvt_ec_meta_release(&m);
    kvt_ec_planner_destroy(p);
}

static void a_spec_without_a_consumer_is_not_prepared(void **state)
{
    (void)state;
    kvt_ec_planner *p;
    KVT_OK_(kvt_ec_planner_create(0, &p));
    kvt_ec_push_spec s = spec("t", "h", 1, "r");
    s.consumer_zmq = (kvt_str){"", 0};
    assert_int_equal(kvt_ec_planner_prepare(p, &s), 0);
    kvt_ec_binding b[2];
    assert_int_equal(kvt_ec_planner_bindings(p, "r", 1, b, 2), 0);
    kvt_ec_planner_destroy(p);
}

static void shared_transfer_is_reported_to_both_requests(void **state)
{
    (void)state;
    kvt_ec_planner *p;
    KVT_OK_(kvt_ec_planner_create(0, &p));
    assert_int_equal(prepare(p, "t", "h", 4, "r1"), 1);
    assert_int_equal(prepare(p, "t", "h", 4, "r2"), 0);
    kvt_ec_binding b[2];
    assert_int_equal(kvt_ec_planner_bindings(p, "r1", 2, b, 2), 1);
    assert_int_equal(kvt_ec_planner_bindings(p, "r2", 2, b, 2), 1);
    assert_string_equal(b[0].transfer_id, "t");
    assert_string_equal(b[0].mm_hash, "h");
    kvt_ec_planner_destroy(p);
}

static void conflicting_transfer_fails_the_request_and_is_not_a_shared_binding(void **state)
{
    (void)state;
    kvt_ec_planner *p;
    KVT_OK_(kvt_ec_planner_create(0, &p));
    assert_int_equal(prepare(p, "t", "h", 4, "r1"), 1);
    assert_int_equal(prepare(p, "t", "other", 4, "r2"), 0);
    kvt_ec_binding b[2];
    assert_int_equal(kvt_ec_planner_bindings(p, "r2", 2, b, 2), 0);
    char failed[4][KVT_EC_KEY_MAX + 1];
    assert_int_equal(kvt_ec_planner_take_failed(p, failed, 4), 1);
    assert_string_equal(failed[0], "r2");
    assert_int_equal(kvt_ec_planner_take_failed(p, failed, 4), 0);
    kvt_ec_planner_destroy(p);
}

static void finished_requests_release_their_transfer_ids(void **state)
{
    (void)state;
    kvt_ec_planner *p;
    KVT_OK_(kvt_ec_planner_create(2, &p));
    assert_int_equal(prepare(p, "t1", "h", 4, "r1"), 1);
    assert_int_equal(prepare(p, "t1", "h", 4, "r2"), 0);
    assert_int_equal(prepare(p, "t2", "k", 4, "r2"), 1);
    KVT_ERR_(prepare(p, "t3", "j", 4, "r3"), KVT_ELIMIT);
    KVT_OK_(kvt_ec_planner_request_finished(p, "r1", 2)); /* t1 still shared by r2 */
    KVT_ERR_(prepare(p, "t3", "j", 4, "r3"), KVT_ELIMIT);
    KVT_OK_(kvt_ec_planner_request_finished(p, "r2", 2));
    assert_int_equal(prepare(p, "t3", "j", 4, "r3"), 1);
    assert_int_equal(prepare(p, "t1", "h", 4, "r4"), 1); /* prepared anew */
    kvt_ec_binding b[2];
    assert_int_equal(kvt_ec_planner_bindings(p, "r2", 2, b, 2), 0);
    kvt_ec_planner_destroy(p);
}

static void pending_push_work_and_failed_saves_come_from_the_workers(void **state)
{
    (void)state;
    kvt_ec_planner *p;
    KVT_OK_(kvt_ec_planner_create(0, &p));
    kvt_ec_worker_meta wm;
    kvt_ec_worker_meta_init(&wm);
    wm.pending_saves = true;
    KVT_OK_(kvt_ec_worker_meta_add(&wm, KVT_EC_FAILED_SAVES, "r9", 2));
    KVT_OK_(kvt_ec_planner_apply_output(p, &wm));
    assert_true(kvt_ec_planner_has_pending_push_work(p));
    char failed[4][KVT_EC_KEY_MAX + 1];
    assert_int_equal(kvt_ec_planner_take_failed(p, failed, 4), 1);
    assert_string_equal(failed[0], "r9");
    kvt_ec_worker_meta_clear(&wm);
    KVT_OK_(kvt_ec_planner_apply_output(p, &wm));
    assert_false(kvt_ec_planner_has_pending_push_work(p));
    kvt_ec_worker_meta_release(&wm);
    kvt_ec_planner_destroy(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(producer_builds_push_metadata_once),
        cmocka_unit_test(a_spec_without_a_consumer_is_not_prepared),
        cmocka_unit_test(shared_transfer_is_reported_to_both_requests),
        cmocka_unit_test(conflicting_transfer_fails_the_request_and_is_not_a_shared_binding),
        cmocka_unit_test(finished_requests_release_their_transfer_ids),
        cmocka_unit_test(pending_push_work_and_failed_saves_come_from_the_workers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
