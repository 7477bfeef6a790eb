/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Cache events with request context (spec kv-offload §2.12, §2.14), one behaviour per test:
 * stored events name the request's context, the block's first token and its parent hash;
 * the context's CONTEXT_DONE comes after the last event that names it; stores without a
 * request carry none; evictions remove primary and secondary keys; the disk tier's events
 * name the disk; a full buffer counts what it lost.
 */
#include "offload/sim.h"

#define CAP 256

typedef struct evs {
    kvt_offload_event e[CAP];
    uint32_t n;
    uint64_t dropped;
} evs;

static void take(sim *s, evs *v)
{
    v->n = kvt_offload_take_events(s->m, v->e, CAP, &v->dropped);
}

static uint32_t count(const evs *v, uint32_t type, uint32_t medium)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < v->n; i++)
        n += v->e[i].type == type &&
             (type == KVT_OFFLOAD_EV_CONTEXT_DONE || v->e[i].medium == medium);
    return n;
}

static int set_ctx(sim *s, const sim_req *r, uint64_t ctx)
{
    return kvt_offload_set_request_context(s->m, r->id, (uint32_t)strlen(r->id), ctx);
}

static const uint8_t *hash_of(const sim_req *r, uint32_t block)
{
    return r->hashes + (size_t)block * KVT_BLOCK_HASH_LEN;
}

/* Admits r, gives it context ctx (set_request_context must answer `took`), computes its prompt
 * and runs the step that selects its full blocks for a store. */
static void admit_with_context(sim *s, sim_req *r, uint64_t ctx, int took)
{
    sim_admit(s, r, 0);
    assert_int_equal(set_ctx(s, r, ctx), took);
    sim_compute(s, r, r->n_tokens);
    sim_schedule(s, r, 1, false);
    sim_build(s, false);
}

static void stored_events_carry_the_request_context(void **state)
{
    (void)state;
    sim s;
    sim_init(&s, 64, 32, false, 1, 64);
    sim_req a;
    sim_req_make(&a, "a", 3 * SIM_BS + 1, 1, 3 * SIM_BS + 1, 0);
    admit_with_context(&s, &a, 77, 1);
    assert_int_equal(set_ctx(&s, &a, 77), 1); /* the same again is fine */
    evs v;
    take(&s, &v);
    assert_int_equal(v.n, 0); /* nothing is findable before the report */
    sim_report_store(&s, s.meta.store_event, 1);
    take(&s, &v);
    assert_int_equal(v.n, 3);
    for (uint32_t i = 0; i < 3; i++) {
        const kvt_offload_event *e = &v.e[i];
        assert_int_equal(e->type, KVT_OFFLOAD_EV_STORED);
        assert_int_equal(e->medium, KVT_MEDIUM_HOST);
        assert_int_equal(e->ctx, 77);
        assert_int_equal(e->token_start, i * SIM_BS);
        assert_int_equal(e->num_tokens, SIM_BS);
        assert_int_equal(e->group, 0);
        assert_int_equal(e->kind, KVT_GROUP_FULL);
        assert_int_equal(e->window, 0);
        assert_memory_equal(e->hash, hash_of(&a, i), KVT_BLOCK_HASH_LEN);
        assert_int_equal(e->has_parent, i > 0);
        if (i > 0)
            assert_memory_equal(e->parent_hash, hash_of(&a, i - 1), KVT_BLOCK_HASH_LEN);
    }
    assert_int_equal(v.dropped, 0);
    sim_finish(&s, &a); /* nothing in flight: the context is done at once */
    take(&s, &v);
    assert_int_equal(v.n, 1);
    assert_int_equal(v.e[0].type, KVT_OFFLOAD_EV_CONTEXT_DONE);
    assert_int_equal(v.e[0].ctx, 77);
    take(&s, &v);
    assert_int_equal(v.n, 0); /* once */
    sim_fini(&s);
}

/* The final flush's stores still name the context; CONTEXT_DONE follows them. */
static void context_done_comes_after_the_last_store_of_a_finished_request(void **state)
{
    (void)state;
    sim s;
    sim_init(&s, 64, 32, false, 1, 64);
    sim_req a;
    sim_req_make(&a, "a", 2 * SIM_BS + 1, 1, 2 * SIM_BS + 1, 0);
    sim_admit(&s, &a, 0);
    assert_int_equal(set_ctx(&s, &a, 5), 1);
    sim_schedule(&s, &a, a.n_tokens, false);
    sim_build(&s, false);
    sim_compute(&s, &a, a.n_tokens);
    sim_finish(&s, &a); /* the final flush selects both blocks */
    sim_build(&s, false);
    assert_int_equal(s.meta.n_stores, 2);
    kvt_offload_stats st;
    kvt_offload_get_stats(s.m, &st);
    assert_int_equal(st.requests, 1); /* kept for its context */
    evs v;
    take(&s, &v);
    assert_int_equal(v.n, 0);
    sim_report_store(&s, s.meta.store_event, 1);
    take(&s, &v);
    assert_int_equal(v.n, 3);
    assert_int_equal(v.e[0].ctx, 5);
    assert_int_equal(v.e[1].ctx, 5);
    assert_int_equal(v.e[1].token_start, SIM_BS);
    assert_int_equal(v.e[2].type, KVT_OFFLOAD_EV_CONTEXT_DONE);
    assert_int_equal(v.e[2].ctx, 5);
    kvt_offload_get_stats(s.m, &st);
    assert_int_equal(st.requests, 0);
    sim_fini(&s);
}

/* A reset abandons the store: no stored event, but the context is still given back. */
static void abandoned_stores_store_nothing_and_release_the_context(void **state)
{
    (void)state;
    sim s;
    sim_init(&s, 64, 32, false, 1, 64);
    sim_req a;
    sim_req_make(&a, "a", 2 * SIM_BS + 1, 1, 2 * SIM_BS + 1, 0);
    admit_with_context(&s, &a, 9, 1);
    int64_t ev = s.meta.store_event;
    assert_int_equal(kvt_offload_reset(s.m), KVT_EBUSY);
    assert_int_equal(set_ctx(&s, &a, 9), 0); /* the reset cleared its registration */
    sim_finish(&s, &a);
    evs v;
    take(&s, &v);
    assert_int_equal(v.n, 0);
    sim_report_store(&s, ev, 1);
    take(&s, &v);
    assert_int_equal(v.n, 1);
    assert_int_equal(v.e[0].type, KVT_OFFLOAD_EV_CONTEXT_DONE);
    assert_int_equal(v.e[0].ctx, 9);
    KVT_OK_(kvt_offload_reset(s.m));
    take(&s, &v);
    assert_int_equal(count(&v, KVT_OFFLOAD_EV_ALL_CLEARED, KVT_MEDIUM_HOST), 1);
    sim_fini(&s);
}

/* A failed store makes nothing findable and gives the context back too. */
static void failed_stores_store_nothing_and_release_the_context(void **state)
{
    (void)state;
    sim s;
    sim_init(&s, 64, 32, false, 1, 64);
    sim_req a;
    sim_req_make(&a, "a", 2 * SIM_BS + 1, 1, 2 * SIM_BS + 1, 0);
    admit_with_context(&s, &a, 3, 1);
    int64_t ev = s.meta.store_event;
    sim_finish(&s, &a);
    kvt_offload_worker_meta_clear(&s.wm);
    KVT_OK_(kvt_event_report_add(&s.wm.stores, ev, 1));
    KVT_OK_(kvt_event_report_add_failed(&s.wm.stores, ev));
    KVT_OK_(kvt_offload_apply_output(s.m, NULL, 0, &s.wm));
    evs v;
    take(&s, &v);
    assert_int_equal(v.n, 1);
    assert_int_equal(v.e[0].type, KVT_OFFLOAD_EV_CONTEXT_DONE);
    sim_fini(&s);
}

/* Lazy stores have no request (spec §2.12): no context is taken and none is reported. */
static void lazy_stores_carry_no_request_context(void **state)
{
    (void)state;
    sim s;
    sim_init(&s, 5, 32, true, 1, 64); /* a window of 8 covers the whole free queue */
    sim_req a;
    sim_req_make(&a, "a", 2 * SIM_BS + 1, 1, 2 * SIM_BS + 1, 0);
    sim_admit(&s, &a, 0);
    assert_int_equal(set_ctx(&s, &a, 4), 0);
    sim_compute(&s, &a, a.n_tokens);
    sim_finish(&s, &a); /* its blocks go to the GPU free queue, inside the lazy window */
    sim_build(&s, false);
    assert_int_equal(s.meta.n_stores, 2);
    sim_report_store(&s, s.meta.store_event, 1);
    evs v;
    take(&s, &v);
    assert_int_equal(count(&v, KVT_OFFLOAD_EV_STORED, KVT_MEDIUM_HOST), 2);
    assert_int_equal(count(&v, KVT_OFFLOAD_EV_CONTEXT_DONE, 0), 0);
    for (uint32_t i = 0; i < v.n; i++) {
        assert_int_equal(v.e[i].ctx, 0);
        assert_int_equal(v.e[i].has_parent, 0);
    }
    sim_fini(&s);
}

static void with_events_off_no_context_is_taken(void **state)
{
    (void)state;
    sim s;
    sim_init_ev(&s, 64, 32, false, 1, 64, 0, 0);
    sim_req a;
    sim_req_make(&a, "a", 2 * SIM_BS + 1, 1, 2 * SIM_BS + 1, 0);
    admit_with_context(&s, &a, 4, 0);
    sim_report_store(&s, s.meta.store_event, 1);
    sim_finish(&s, &a);
    evs v;
    take(&s, &v);
    assert_int_equal(v.n, 0);
    assert_int_equal(v.dropped, 0);
    sim_fini(&s);
}

static void set_request_context_refuses_bad_input(void **state)
{
    (void)state;
    sim s;
    sim_init(&s, 64, 32, false, 1, 64);
    sim_req a, b;
    sim_req_make(&a, "a", 2 * SIM_BS + 1, 1, 2 * SIM_BS + 1, 0);
    sim_req_make(&b, "b", 2 * SIM_BS + 1, 2, 2 * SIM_BS + 1, 0);
    sim_admit(&s, &a, 0);
    assert_int_equal(set_ctx(&s, &a, 0), KVT_EINVAL);
    assert_int_equal(kvt_offload_set_request_context(s.m, NULL, 3, 1), KVT_EINVAL);
    assert_int_equal(kvt_offload_set_request_context(s.m, "a", 0, 1), KVT_EINVAL);
    assert_int_equal(set_ctx(&s, &b, 1), 0); /* unknown: nothing to name */
    assert_int_equal(set_ctx(&s, &a, 1), 1);
    assert_int_equal(set_ctx(&s, &a, 2), KVT_ESTATE);
    assert_non_null(strstr(kvt_last_error(), "already has context 1"));
    sim_finish(&s, &a);
    assert_int_equal(set_ctx(&s, &a, 1), 0); /* finished */
    sim_fini(&s);
}

/* Evicting a host block removes every key it had, primary and secondary. */
static void evictions_remove_primary_and_secondary_keys(void **state)
{
    (void)state;
    sim s;
    sim_init(&s, 64, 3, false, 1, 64); /* two usable host blocks */
    sim_req a, b;
    sim_req_make(&a, "a", 2 * SIM_BS + 1, 1, 2 * SIM_BS + 1, 0);
    sim_admit(&s, &a, 0);
    sim_compute(&s, &a, a.n_tokens);
    uint8_t sec[KVT_BLOCK_HASH_LEN] = {9, 9, 9};
    KVT_OK_(kvt_pool_insert(s.gpu, a.blocks[0], sec, 0, 8));
    sim_schedule(&s, &a, 1, false);
    sim_build(&s, false);
    sim_report_store(&s, s.meta.store_event, 1);
    sim_finish(&s, &a);
    evs v;
    take(&s, &v);
    assert_int_equal(count(&v, KVT_OFFLOAD_EV_STORED, KVT_MEDIUM_HOST), 3);
    sim_req_make(&b, "b", 2 * SIM_BS + 1, 2, 2 * SIM_BS + 1, 0);
    sim_store_prompt(&s, &b, 1);
    take(&s, &v);
    assert_int_equal(count(&v, KVT_OFFLOAD_EV_REMOVED, KVT_MEDIUM_HOST), 3);
    bool saw_sec = false;
    for (uint32_t i = 0; i < v.n; i++)
        if (v.e[i].type == KVT_OFFLOAD_EV_REMOVED && memcmp(v.e[i].hash, sec, sizeof(sec)) == 0) {
            saw_sec = true;
            assert_int_equal(v.e[i].num_tokens, 8);
        }
    assert_true(saw_sec);
    assert_int_equal(count(&v, KVT_OFFLOAD_EV_STORED, KVT_MEDIUM_HOST), 2);
    sim_fini(&s);
}

/* Three tiers: a write-back's stored events and the disk's evictions name the disk. */
static void disk_tier_events_name_the_disk(void **state)
{
    (void)state;
    sim s;
    sim_init3(&s, 64, 32, false, 1, 64, 32);
    sim_req a;
    sim_req_make(&a, "a", 2 * SIM_BS + 1, 1, 2 * SIM_BS + 1, 0);
    admit_with_context(&s, &a, 11, 1);
    sim_report_store(&s, s.meta.store_event, 1);
    sim_build(&s, false); /* the write-back */
    int64_t wb = s.meta.tiers[0].store_event;
    assert_int_not_equal(wb, KVT_NO_EVENT);
    kvt_offload_worker_meta_clear(&s.wm);
    KVT_OK_(kvt_event_report_add(&s.wm.tier_stores[0], wb, 1));
    KVT_OK_(kvt_offload_apply_output(s.m, NULL, 0, &s.wm));
    evs v;
    take(&s, &v);
    assert_int_equal(count(&v, KVT_OFFLOAD_EV_STORED, KVT_MEDIUM_HOST), 2);
    assert_int_equal(count(&v, KVT_OFFLOAD_EV_STORED, KVT_MEDIUM_DISK), 2);
    for (uint32_t i = 0; i < v.n; i++)
        if (v.e[i].medium == KVT_MEDIUM_DISK)
            assert_int_equal(v.e[i].ctx, 0); /* written back for the tier, not a request */
        else
            assert_int_equal(v.e[i].ctx, 11);
    sim_finish(&s, &a);
    KVT_OK_(kvt_offload_reset(s.m));
    take(&s, &v);
    assert_int_equal(count(&v, KVT_OFFLOAD_EV_CONTEXT_DONE, 0), 1);
    assert_int_equal(count(&v, KVT_OFFLOAD_EV_ALL_CLEARED, KVT_MEDIUM_HOST), 1);
    assert_int_equal(count(&v, KVT_OFFLOAD_EV_ALL_CLEARED, KVT_MEDIUM_DISK), 1);
    sim_fini(&s);
}

/* A buffer that fills loses the newest events and says how many, once. */
static void a_full_buffer_counts_what_it_lost(void **state)
{
    (void)state;
    sim s;
    sim_init_ev(&s, 64, 32, false, 1, 64, 0, 2);
    sim_req a;
    sim_req_make(&a, "a", 4 * SIM_BS + 1, 1, 4 * SIM_BS + 1, 0);
    admit_with_context(&s, &a, 8, 1);
    sim_report_store(&s, s.meta.store_event, 1);
    sim_finish(&s, &a);
    evs v;
    take(&s, &v);
    assert_int_equal(v.n, 2);
    assert_int_equal(v.e[0].token_start, 0);
    assert_int_equal(v.e[1].token_start, SIM_BS);
    assert_int_equal(v.dropped, 3); /* two stored events and the context's end */
    take(&s, &v);
    assert_int_equal(v.n, 0);
    assert_int_equal(v.dropped, 0);
    sim_fini(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(stored_events_carry_the_request_context),
        cmocka_unit_test(context_done_comes_after_the_last_store_of_a_finished_request),
        cmocka_unit_test(abandoned_stores_store_nothing_and_release_the_context),
        cmocka_unit_test(failed_stores_store_nothing_and_release_the_context),
        cmocka_unit_test(lazy_stores_carry_no_request_context),
        cmocka_unit_test(with_events_off_no_context_is_taken),
        cmocka_unit_test(set_request_context_refuses_bad_input),
        cmocka_unit_test(evictions_remove_primary_and_secondary_keys),
        cmocka_unit_test(disk_tier_events_name_the_disk),
        cmocka_unit_test(a_full_buffer_counts_what_it_lost),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
