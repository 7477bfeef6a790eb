/* SPDX-License-Identifier: Apache-2.0 */
/*
 * KV-offload metadata: builders, the seed's invariants, aggregation of worker reports, and the
 * wire encoding (round trips and the decoder's rejections, each named after the rule).
 */
#include "kvt_test.h"
#include "meta/wire_builder.h"

static void roundtrip(const kvt_offload_meta *m, kvt_offload_meta *back)
{
    size_t need = kvt_offload_meta_encoded_size(m), len;
    unsigned char *buf = malloc(need);
    KVT_OK_(kvt_offload_meta_encode(m, buf, need, &len));
    assert_int_equal(len, need);
    KVT_OK_(kvt_offload_meta_decode(back, buf, len));
    assert_true(kvt_offload_meta_equal(m, back));
    free(buf);
}

static void empty_step_has_no_events_and_round_trips(void **state)
{
    (void)state;
    kvt_offload_meta m, back;
    kvt_offload_meta_init(&m);
    kvt_offload_meta_init(&back);
    assert_int_equal(m.load_event, KVT_NO_EVENT);
    assert_int_equal(m.store_event, KVT_NO_EVENT);
    KVT_OK_(kvt_offload_meta_validate(&m));
    roundtrip(&m, &back);
    assert_int_equal(kvt_offload_meta_encoded_size(&m),
                     12 + 8 + 8 + 4 + 8 + 8 + 1 + 4 + 1 + 1); /* no tiers, no remote */
    kvt_offload_meta_release(&m);
    kvt_offload_meta_release(&back);
}

static void full_step_round_trips_and_reuses_its_memory(void **state)
{
    (void)state;
    kvt_offload_meta m, back;
    kvt_offload_meta_init(&m);
    kvt_offload_meta_init(&back);
    for (int step = 0; step < 3; step++) {
        kvt_offload_meta_clear(&m);
        m.load_event = 5 + step;
        for (uint32_t i = 0; i < 300; i++)
            KVT_OK_(kvt_offload_meta_add_load(&m, 1 + i, 1000 + i));
        KVT_OK_(kvt_offload_meta_add_load_req(&m, 2, "old-request", 11));
        KVT_OK_(kvt_offload_meta_add_load_req(&m, 5 + step, "r1", 2));
        KVT_OK_(kvt_offload_meta_add_load_req(&m, 5 + step, "r2", 2));
        m.store_event = 9;
        KVT_OK_(kvt_offload_meta_add_store(&m, 7, 8));
        m.need_flush = step == 1;
        roundtrip(&m, &back);
        assert_int_equal(back.n_load_events, 2);
        assert_int_equal(back.load_req_first[1], 1);
        assert_int_equal(back.load_req_first[2], 3);
        assert_string_equal(back.load_req_ids[2].ptr, "r2");
        assert_int_equal(back.need_flush, step == 1);
    }
    kvt_offload_meta_release(&m);
    kvt_offload_meta_release(&back);
}

static void load_events_must_ascend(void **state)
{
    (void)state;
    kvt_offload_meta m;
    kvt_offload_meta_init(&m);
    KVT_OK_(kvt_offload_meta_add_load_req(&m, 4, "a", 1));
    KVT_ERR_(kvt_offload_meta_add_load_req(&m, 3, "b", 1), KVT_EINVAL);
    KVT_ERR_(kvt_offload_meta_add_load_req(&m, -1, "b", 1), KVT_EINVAL);
    KVT_ERR_(kvt_offload_meta_add_load_req(&m, 5, "", 0), KVT_EINVAL);
    KVT_ERR_(kvt_offload_meta_add_load_req(&m, 5, "a\0b", 3), KVT_EINVAL);
    assert_int_equal(m.n_load_events, 1);
    assert_int_equal(m.n_load_reqs, 1);
    kvt_offload_meta_release(&m);
}

static void event_is_none_exactly_when_its_lists_are_empty(void **state)
{
    (void)state;
    kvt_offload_meta m;
    kvt_offload_meta_init(&m);
    KVT_OK_(kvt_offload_meta_add_store(&m, 1, 2));
    KVT_ERR_(kvt_offload_meta_validate(&m), KVT_EINVAL); /* blocks without an event */
    m.store_event = 0;
    KVT_OK_(kvt_offload_meta_validate(&m));
    m.load_event = 3; /* an event without blocks */
    KVT_ERR_(kvt_offload_meta_validate(&m), KVT_EINVAL);
    m.load_event = -2;
    KVT_ERR_(kvt_offload_meta_validate(&m), KVT_EINVAL);
    unsigned char buf[256];
    size_t len;
    KVT_ERR_(kvt_offload_meta_encode(&m, buf, sizeof(buf), &len), KVT_EINVAL);
    kvt_offload_meta_release(&m);
}

static void null_block_never_appears_in_a_transfer(void **state)
{
    (void)state;
    kvt_offload_meta m;
    kvt_offload_meta_init(&m);
    m.store_event = 1;
    KVT_OK_(kvt_offload_meta_add_store(&m, 4, 0));
    KVT_ERR_(kvt_offload_meta_validate(&m), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "null block"));
    kvt_offload_meta_release(&m);
}

static void this_steps_load_event_is_listed_with_its_requests(void **state)
{
    (void)state;
    kvt_offload_meta m;
    kvt_offload_meta_init(&m);
    m.load_event = 6;
    KVT_OK_(kvt_offload_meta_add_load(&m, 2, 3));
    KVT_ERR_(kvt_offload_meta_validate(&m), KVT_EINVAL);
    KVT_OK_(kvt_offload_meta_add_load_req(&m, 5, "x", 1));
    KVT_ERR_(kvt_offload_meta_validate(&m), KVT_EINVAL);
    KVT_OK_(kvt_offload_meta_add_load_req(&m, 6, "y", 1));
    KVT_OK_(kvt_offload_meta_validate(&m));
    kvt_offload_meta_release(&m);
}

static void encode_reports_a_small_buffer(void **state)
{
    (void)state;
    kvt_offload_meta m;
    kvt_offload_meta_init(&m);
    unsigned char buf[8];
    size_t len;
    KVT_ERR_(kvt_offload_meta_encode(&m, buf, sizeof(buf), &len), KVT_ENOSPC);
    KVT_ERR_(kvt_offload_meta_encode(&m, NULL, 100, &len), KVT_EINVAL);
    kvt_offload_meta_release(&m);
}

/* The end of an offload message: no invalid load destinations, no tier sections, no remote
 * reads. */
static void wb_disk_none(wb *w)
{
    wb_u32(w, 0);
    wb_u8(w, 0);
    wb_u8(w, 0);
}

/* The end of a worker message: no failed load sources or promotions, no tier sections. */
static void wb_disk_reports_none(wb *w)
{
    wb_u32(w, 0);
    wb_u32(w, 0);
    wb_u8(w, 0);
}

/* An offload message up to its tier sections: no load, no store, no flush, no invalid blocks. */
static void wb_offload_seed_fields(wb *w)
{
    wb_begin(w, KVT_META_OFFLOAD);
    wb_u64(w, (uint64_t)-1);
    wb_u32(w, 0);
    wb_u32(w, 0);
    wb_u32(w, 0);
    wb_u64(w, (uint64_t)-1);
    wb_u32(w, 0);
    wb_u32(w, 0);
    wb_u8(w, 0);
    wb_u32(w, 0);
}

/* Hand-built messages that break one rule each. */
static void wb_offload(wb *w, int64_t load_ev, uint32_t n_g, uint32_t n_c, int64_t ev_key,
                       uint32_t n_reqs, uint8_t flush)
{
    wb_begin(w, KVT_META_OFFLOAD);
    wb_u64(w, (uint64_t)load_ev);
    wb_u32(w, n_g);
    for (uint32_t i = 0; i < n_g; i++)
        wb_u32(w, 10 + i);
    wb_u32(w, n_c);
    for (uint32_t i = 0; i < n_c; i++)
        wb_u32(w, 20 + i);
    wb_u32(w, ev_key >= 0 ? 1 : 0);
    if (ev_key >= 0) {
        wb_u64(w, (uint64_t)ev_key);
        wb_u32(w, n_reqs);
        for (uint32_t i = 0; i < n_reqs; i++)
            wb_str(w, "req", 3);
    }
    wb_u64(w, (uint64_t)-1);
    wb_u32(w, 0);
    wb_u32(w, 0);
    wb_u8(w, flush);
    wb_disk_none(w);
    wb_done(w);
}

static void decoder_enforces_the_invariants(void **state)
{
    (void)state;
    kvt_offload_meta m;
    kvt_offload_meta_init(&m);
    wb w;
    wb_offload(&w, 3, 2, 2, 3, 1, 0);
    KVT_OK_(kvt_offload_meta_decode(&m, w.b, w.n));
    assert_int_equal(m.n_loads, 2);
    wb_offload(&w, 3, 2, 1, 3, 1, 0); /* pairwise lengths differ */
    KVT_ERR_(kvt_offload_meta_decode(&m, w.b, w.n), KVT_EPROTO);
    assert_non_null(strstr(kvt_last_error(), "load_cpu_blocks has 1"));
    assert_int_equal(m.n_loads, 0);    /* left empty */
    wb_offload(&w, -1, 2, 2, 3, 1, 0); /* no event but blocks */
    KVT_ERR_(kvt_offload_meta_decode(&m, w.b, w.n), KVT_EPROTO);
    wb_offload(&w, 3, 2, 2, 3, 0, 0); /* event with no requests */
    KVT_ERR_(kvt_offload_meta_decode(&m, w.b, w.n), KVT_EPROTO);
    wb_offload(&w, 3, 2, 2, 4, 1, 0); /* this step's event unlisted */
    KVT_ERR_(kvt_offload_meta_decode(&m, w.b, w.n), KVT_EPROTO);
    wb_offload(&w, 3, 2, 2, 3, 1, 2); /* need_flush not a bool */
    KVT_ERR_(kvt_offload_meta_decode(&m, w.b, w.n), KVT_EPROTO);
    wb_offload(&w, 3, 2, 2, 3, 1, 0);
    w.b[w.n++] = 0; /* trailing byte (header still says the old length) */
    KVT_ERR_(kvt_offload_meta_decode(&m, w.b, w.n), KVT_EPROTO);
    wb_done(&w); /* now the header covers it: a trailing byte after the body */
    KVT_ERR_(kvt_offload_meta_decode(&m, w.b, w.n), KVT_EPROTO);
    assert_non_null(strstr(kvt_last_error(), "trailing"));
    kvt_offload_meta_release(&m);
}

static void decoder_bounds_request_ids(void **state)
{
    (void)state;
    kvt_offload_meta m;
    kvt_offload_meta_init(&m);
    wb *w = calloc(1, sizeof(wb));
    wb_begin(w, KVT_META_OFFLOAD);
    wb_u64(w, (uint64_t)-1);
    wb_u32(w, 0);
    wb_u32(w, 0);
    wb_u32(w, 1);
    wb_u64(w, 1);
    wb_u32(w, 1);
    wb_u32(w, KVT_META_MAX_STR + 1); /* one byte over the limit; bytes omitted */
    wb_done(w);
    KVT_ERR_(kvt_offload_meta_decode(&m, w->b, w->n), KVT_ELIMIT);
    kvt_offload_meta_release(&m);
    free(w);
}

/* ---- worker metadata ------------------------------------------------------------------- */

static void worker_reports_sum_per_event(void **state)
{
    (void)state;
    kvt_offload_worker_meta a, b;
    kvt_offload_worker_meta_init(&a);
    kvt_offload_worker_meta_init(&b);
    KVT_OK_(kvt_offload_worker_meta_add(&a, 5, 1));
    KVT_OK_(kvt_offload_worker_meta_add(&a, 2, 1));
    KVT_OK_(kvt_offload_worker_meta_add(&a, 5, 1));
    assert_int_equal(a.stores.n_completed, 2);
    assert_int_equal(a.stores.events[0], 2);
    assert_int_equal(a.stores.counts[1], 2);
    KVT_OK_(kvt_offload_worker_meta_add(&b, 3, 1));
    KVT_OK_(kvt_offload_worker_meta_add(&b, 5, 1));
    KVT_OK_(kvt_offload_worker_meta_add(&b, 9, 4));
    KVT_OK_(kvt_offload_worker_meta_aggregate(&a, &b));
    int64_t ev[] = {2, 3, 5, 9};
    uint32_t ct[] = {1, 1, 3, 4};
    assert_int_equal(a.stores.n_completed, 4);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(a.stores.events[i], ev[i]);
        assert_int_equal(a.stores.counts[i], ct[i]);
    }
    kvt_offload_worker_meta empty;
    kvt_offload_worker_meta_init(&empty);
    KVT_OK_(kvt_offload_worker_meta_aggregate(&empty, &a));
    assert_true(kvt_offload_worker_meta_equal(&empty, &a));
    KVT_ERR_(kvt_offload_worker_meta_add(&a, -1, 1), KVT_EINVAL);
    KVT_ERR_(kvt_offload_worker_meta_add(&a, 1, 0), KVT_EINVAL);
    kvt_offload_worker_meta_release(&a);
    kvt_offload_worker_meta_release(&b);
    kvt_offload_worker_meta_release(&empty);
}

static void aggregate_overflow_fails_and_changes_nothing(void **state)
{
    (void)state;
    kvt_offload_worker_meta a, b;
    kvt_offload_worker_meta_init(&a);
    kvt_offload_worker_meta_init(&b);
    KVT_OK_(kvt_offload_worker_meta_add(&a, 1, 1));
    KVT_OK_(kvt_offload_worker_meta_add(&a, 7, UINT32_MAX));
    KVT_OK_(kvt_offload_worker_meta_add(&b, 0, 1));
    KVT_OK_(kvt_offload_worker_meta_add(&b, 7, 1));
    KVT_ERR_(kvt_offload_worker_meta_aggregate(&a, &b), KVT_ELIMIT);
    assert_int_equal(a.stores.n_completed, 2);
    assert_int_equal(a.stores.events[0], 1);
    assert_int_equal(a.stores.counts[1], UINT32_MAX);
    kvt_offload_worker_meta_release(&a);
    kvt_offload_worker_meta_release(&b);
}

static void worker_report_round_trips_and_decoder_wants_ascending_events(void **state)
{
    (void)state;
    kvt_offload_worker_meta a, back;
    kvt_offload_worker_meta_init(&a);
    kvt_offload_worker_meta_init(&back);
    KVT_OK_(kvt_offload_worker_meta_add(&a, 11, 1));
    KVT_OK_(kvt_offload_worker_meta_add(&a, 12, 2));
    unsigned char buf[128];
    size_t len;
    KVT_OK_(kvt_offload_worker_meta_encode(&a, buf, sizeof(buf), &len));
    KVT_OK_(kvt_offload_worker_meta_decode(&back, buf, len));
    assert_true(kvt_offload_worker_meta_equal(&a, &back));
    /* failed store events travel too, and only completed events can fail */
    KVT_ERR_(kvt_offload_worker_meta_add_failed(&a, 13), KVT_EINVAL);
    KVT_OK_(kvt_offload_worker_meta_add_failed(&a, 12));
    KVT_OK_(kvt_offload_worker_meta_add_failed(&a, 12));
    assert_int_equal(a.stores.n_failed, 1);
    assert_false(kvt_offload_worker_meta_equal(&a, &back));
    KVT_OK_(kvt_offload_worker_meta_encode(&a, buf, sizeof(buf), &len));
    KVT_OK_(kvt_offload_worker_meta_decode(&back, buf, len));
    assert_true(kvt_offload_worker_meta_equal(&a, &back));
    assert_true(kvt_offload_worker_meta_failed(&back, 12));
    assert_false(kvt_offload_worker_meta_failed(&back, 11));
    /* aggregation unites the failed sets */
    kvt_offload_worker_meta c;
    kvt_offload_worker_meta_init(&c);
    KVT_OK_(kvt_offload_worker_meta_add(&c, 11, 1));
    KVT_OK_(kvt_offload_worker_meta_add_failed(&c, 11));
    KVT_OK_(kvt_offload_worker_meta_aggregate(&back, &c));
    assert_int_equal(back.stores.n_failed, 2);
    assert_int_equal(back.stores.counts[0], 2);
    KVT_OK_(kvt_offload_worker_meta_validate(&back));
    kvt_offload_worker_meta_release(&c);
    wb w;
    wb_begin(&w, KVT_META_OFFLOAD_WORKER);
    wb_u32(&w, 2);
    wb_u64(&w, 12);
    wb_u32(&w, 1);
    wb_u64(&w, 11);
    wb_u32(&w, 1);
    wb_u32(&w, 0); /* no failed events */
    wb_disk_reports_none(&w);
    wb_done(&w);
    KVT_ERR_(kvt_offload_worker_meta_decode(&back, w.b, w.n), KVT_EPROTO);
    assert_int_equal(back.stores.n_completed, 0);
    /* a failed event must also be a completed one */
    wb_begin(&w, KVT_META_OFFLOAD_WORKER);
    wb_u32(&w, 1);
    wb_u64(&w, 11);
    wb_u32(&w, 1);
    wb_u32(&w, 1);
    wb_u64(&w, 12);
    wb_disk_reports_none(&w);
    wb_done(&w);
    KVT_ERR_(kvt_offload_worker_meta_decode(&back, w.b, w.n), KVT_EPROTO);
    assert_int_equal(back.stores.n_failed, 0);
    w.n = 12;
    wb_u32(&w, 1);
    wb_u64(&w, 3);
    wb_u32(&w, 0); /* count 0 */
    wb_disk_reports_none(&w);
    wb_done(&w);
    KVT_ERR_(kvt_offload_worker_meta_decode(&back, w.b, w.n), KVT_EPROTO);
    kvt_offload_worker_meta_release(&a);
    kvt_offload_worker_meta_release(&back);
}

/* Three-tier lists: promotions, write-backs and invalid load destinations travel, keep their
 * invariants and leave nothing behind on clear. */
static void disk_tier_lists_round_trip_and_are_checked(void **state)
{
    (void)state;
    kvt_offload_meta m, back;
    kvt_offload_meta_init(&m);
    kvt_offload_meta_init(&back);
    KVT_OK_(kvt_offload_meta_reserve_invalid(&m, 1));
    KVT_OK_(kvt_offload_meta_reserve_tier(&m, 1, 2, 3));
    KVT_ERR_(kvt_offload_meta_reserve_tier(&m, 0, 1, 1), KVT_ERANGE); /* tier 0: the seed's */
    KVT_ERR_(kvt_offload_meta_reserve_tier(&m, KVT_MAX_TIERS, 1, 1), KVT_ERANGE);
    KVT_ERR_(kvt_offload_meta_add_tier_load(&m, KVT_MAX_TIERS, 1, 1), KVT_ERANGE);
    KVT_ERR_(kvt_offload_meta_add_tier_store(&m, 0, 1, 1), KVT_ERANGE);
    m.load_event = 4;
    KVT_OK_(kvt_offload_meta_add_load(&m, 7, 70));
    KVT_OK_(kvt_offload_meta_add_load(&m, 8, 80));
    KVT_OK_(kvt_offload_meta_add_load_req(&m, 4, "r", 1));
    KVT_OK_(kvt_offload_meta_add_load_invalid(&m, 8));
    m.tiers[0].load_event = 2;
    KVT_OK_(kvt_offload_meta_add_tier_load(&m, 1, 5, 80));
    m.tiers[0].store_event = 9;
    for (uint32_t i = 1; i <= 3; i++)
        KVT_OK_(kvt_offload_meta_add_tier_store(&m, 1, 10 + i, 20 + i));
    roundtrip(&m, &back);
    assert_int_equal(back.tiers[0].n_stores, 3);
    assert_int_equal(back.tiers[0].store_dst[2], 23);
    assert_int_equal(back.tiers[0].load_dst[0], 80);
    assert_int_equal(back.load_invalid_blocks[0], 8);
    /* a promotion list without its event, and the reverse */
    m.tiers[0].load_event = KVT_NO_EVENT;
    KVT_ERR_(kvt_offload_meta_validate(&m), KVT_EINVAL);
    m.tiers[0].load_event = 2;
    m.tiers[0].store_dst[1] = 0; /* the null block */
    KVT_ERR_(kvt_offload_meta_validate(&m), KVT_EINVAL);
    m.tiers[0].store_dst[1] = 22;
    /* more invalid destinations than the load has */
    KVT_OK_(kvt_offload_meta_add_load_invalid(&m, 7));
    KVT_OK_(kvt_offload_meta_add_load_invalid(&m, 9));
    KVT_ERR_(kvt_offload_meta_validate(&m), KVT_EINVAL);
    kvt_offload_meta_clear(&m);
    assert_int_equal(m.tiers[0].load_event, KVT_NO_EVENT);
    assert_int_equal(m.n_load_invalid + m.tiers[0].n_loads + m.tiers[0].n_stores, 0);
    KVT_OK_(kvt_offload_meta_validate(&m));
    kvt_offload_meta_release(&m);
    kvt_offload_meta_release(&back);
}

/* The disk reports of a worker message aggregate like the store report. */
static void worker_disk_reports_aggregate_and_round_trip(void **state)
{
    (void)state;
    kvt_offload_worker_meta a, b, back;
    kvt_offload_worker_meta_init(&a);
    kvt_offload_worker_meta_init(&b);
    kvt_offload_worker_meta_init(&back);
    KVT_OK_(kvt_event_report_add(&a.tier_stores[0], 3, 1));
    KVT_OK_(kvt_event_report_add(&b.tier_stores[0], 3, 1));
    KVT_OK_(kvt_event_report_add(&b.tier_loads[0], 1, 1));
    KVT_OK_(kvt_event_report_add_failed(&b.tier_loads[0], 1));
    KVT_ERR_(kvt_event_report_add_failed(&b.tier_loads[0], 2), KVT_EINVAL);
    KVT_OK_(kvt_offload_worker_meta_aggregate(&a, &b));
    assert_int_equal(a.tier_stores[0].counts[0], 2);
    assert_true(kvt_event_report_failed(&a.tier_loads[0], 1));
    assert_int_equal(a.stores.n_completed, 0);
    unsigned char buf[256];
    size_t len;
    KVT_OK_(kvt_offload_worker_meta_encode(&a, buf, sizeof(buf), &len));
    KVT_OK_(kvt_offload_worker_meta_decode(&back, buf, len));
    assert_true(kvt_offload_worker_meta_equal(&a, &back));
    kvt_offload_worker_meta_release(&a);
    kvt_offload_worker_meta_release(&b);
    kvt_offload_worker_meta_release(&back);
}

/* A chain of four tiers: each section names its tier, only the tiers that move something are
 * written, and a decoder refuses sections out of order, repeated, empty or past the last tier. */
static void tier_sections_name_their_tier(void **state)
{
    (void)state;
    kvt_offload_meta m, back;
    kvt_offload_meta_init(&m);
    kvt_offload_meta_init(&back);
    m.tiers[2].store_event = 6; /* tier 3 only: host -> 1 -> 2 -> 3 */
    KVT_OK_(kvt_offload_meta_add_tier_store(&m, 3, 40, 41));
    roundtrip(&m, &back);
    assert_int_equal(back.tiers[2].store_dst[0], 41);
    assert_int_equal(back.tiers[0].store_event, KVT_NO_EVENT);
    assert_int_equal(back.tiers[1].load_event, KVT_NO_EVENT);
    size_t empty = 12 + 8 + 8 + 4 + 8 + 8 + 1 + 4 + 1 + 1;
    assert_int_equal(kvt_offload_meta_encoded_size(&m), empty + 1 + 8 + 8 + 8 + 8 + 8);
    kvt_offload_meta_release(&m);
    kvt_offload_meta_release(&back);

    /* hand-built: an empty step, then n sections (tier, load event + pair, store event + pair) */
    static const struct {
        uint8_t n, tier[2];
        bool empty;
        const char *why;
    } bad[] = {
        {2, {2, 1}, false, "after tier 2"},
        {2, {1, 1}, false, "after tier 1"},
        {1, {0}, false, "names tier 0"},
        {1, {KVT_MAX_TIERS}, false, "names tier 4"},
        {KVT_MAX_TIERS, {1, 2}, false, "tier sections, this build"},
        {1, {2}, true, "tier 2: an empty section"},
    };
    kvt_offload_meta_init(&m);
    for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
        wb w;
        wb_offload_seed_fields(&w);
        wb_u8(&w, bad[k].n);
        for (uint32_t i = 0; i < bad[k].n && i < 2; i++) {
            wb_u8(&w, bad[k].tier[i]);
            wb_u64(&w, (uint64_t)-1); /* no promotions */
            wb_u32(&w, 0);
            wb_u32(&w, 0);
            wb_u64(&w, bad[k].empty ? (uint64_t)-1 : 3); /* one write-back, or nothing */
            uint32_t n = bad[k].empty ? 0 : 1;
            wb_u32(&w, n);
            if (n)
                wb_u32(&w, 5);
            wb_u32(&w, n);
            if (n)
                wb_u32(&w, 6);
        }
        wb_u8(&w, 0); /* no remote reads */
        wb_done(&w);
        KVT_ERR_(kvt_offload_meta_decode(&m, w.b, w.n), KVT_EPROTO);
        if (!strstr(kvt_last_error(), bad[k].why))
            fail_msg("case %zu: %s", k, kvt_last_error());
    }
    kvt_offload_meta_release(&m);

    /* worker side: tier 3's reports alone, and an empty section refused */
    kvt_offload_worker_meta a, wback;
    kvt_offload_worker_meta_init(&a);
    kvt_offload_worker_meta_init(&wback);
    KVT_OK_(kvt_event_report_add(&a.tier_loads[2], 4, 1));
    unsigned char buf[128];
    size_t len;
    KVT_OK_(kvt_offload_worker_meta_encode(&a, buf, sizeof(buf), &len));
    assert_int_equal(len, kvt_offload_worker_meta_encoded_size(&a));
    assert_int_equal(len, 12 + 8 + 4 + 4 + 1 + 1 + 8 + (4 + 12 + 4));
    KVT_OK_(kvt_offload_worker_meta_decode(&wback, buf, len));
    assert_true(kvt_offload_worker_meta_equal(&a, &wback));
    wb w;
    wb_begin(&w, KVT_META_OFFLOAD_WORKER);
    wb_u32(&w, 0);
    wb_u32(&w, 0);
    wb_u32(&w, 0); /* no failed load sources */
    wb_u32(&w, 0); /* no failed promotions */
    wb_u8(&w, 1);
    wb_u8(&w, 2);
    for (int i = 0; i < 4; i++)
        wb_u32(&w, 0);
    wb_done(&w);
    KVT_ERR_(kvt_offload_worker_meta_decode(&wback, w.b, w.n), KVT_EPROTO);
    assert_non_null(strstr(kvt_last_error(), "tier 2: an empty section"));
    kvt_offload_worker_meta_release(&a);
    kvt_offload_worker_meta_release(&wback);
}

/* The tier-0 blocks whose load failed travel with a worker's reports as an ascending set:
 * added in any order, united by aggregation, refused when null or out of order. */
static void failed_load_sources_are_an_ascending_set(void **state)
{
    (void)state;
    kvt_offload_worker_meta a, b, back;
    kvt_offload_worker_meta_init(&a);
    kvt_offload_worker_meta_init(&b);
    kvt_offload_worker_meta_init(&back);
    KVT_OK_(kvt_offload_worker_meta_add_failed_load(&a, 9));
    KVT_OK_(kvt_offload_worker_meta_add_failed_load(&a, 3));
    KVT_OK_(kvt_offload_worker_meta_add_failed_load(&a, 9)); /* once */
    KVT_ERR_(kvt_offload_worker_meta_add_failed_load(&a, 0), KVT_EINVAL);
    KVT_OK_(kvt_offload_worker_meta_add_failed_load(&b, 5));
    KVT_OK_(kvt_offload_worker_meta_add_failed_load(&b, 9));
    KVT_OK_(kvt_offload_worker_meta_aggregate(&a, &b));
    assert_int_equal(a.n_failed_load_src, 3);
    assert_int_equal(a.failed_load_src[0], 3);
    assert_int_equal(a.failed_load_src[1], 5);
    assert_int_equal(a.failed_load_src[2], 9);
    unsigned char buf[128];
    size_t len;
    KVT_OK_(kvt_offload_worker_meta_encode(&a, buf, sizeof(buf), &len));
    assert_int_equal(len, 12 + 8 + 4 + 3 * 4 + 4 + 1);
    KVT_OK_(kvt_offload_worker_meta_decode(&back, buf, len));
    assert_true(kvt_offload_worker_meta_equal(&a, &back));
    a.failed_load_src[1] = 2; /* out of order */
    KVT_ERR_(kvt_offload_worker_meta_validate(&a), KVT_EINVAL);
    a.failed_load_src[1] = 0; /* the null block */
    KVT_ERR_(kvt_offload_worker_meta_validate(&a), KVT_EINVAL);
    buf[12 + 8 + 4 + 4] = 2; /* on the wire: 3, 2, 9 */
    KVT_ERR_(kvt_offload_worker_meta_decode(&back, buf, len), KVT_EPROTO);
    assert_non_null(strstr(kvt_last_error(), "failed load sources"));
    kvt_offload_worker_meta_clear(&a);
    assert_int_equal(a.n_failed_load_src, 0);
    kvt_offload_worker_meta_release(&a);
    kvt_offload_worker_meta_release(&b);
    kvt_offload_worker_meta_release(&back);
}

/* The blocks whose promotion failed alone: a set like failed_load_src, its own list on the
 * wire after it. */
static void failed_promotions_are_an_ascending_set(void **state)
{
    (void)state;
    kvt_offload_worker_meta a, b, back;
    kvt_offload_worker_meta_init(&a);
    kvt_offload_worker_meta_init(&b);
    kvt_offload_worker_meta_init(&back);
    KVT_OK_(kvt_offload_worker_meta_add_failed_promo(&a, 7));
    KVT_OK_(kvt_offload_worker_meta_add_failed_promo(&a, 2));
    KVT_ERR_(kvt_offload_worker_meta_add_failed_promo(&a, 0), KVT_EINVAL);
    KVT_OK_(kvt_offload_worker_meta_add_failed_promo(&b, 7));
    KVT_OK_(kvt_offload_worker_meta_add_failed_promo(&b, 4));
    KVT_OK_(kvt_offload_worker_meta_add_failed_load(&b, 4)); /* a separate set */
    KVT_OK_(kvt_offload_worker_meta_aggregate(&a, &b));
    assert_int_equal(a.n_failed_promo, 3);
    assert_int_equal(a.failed_promo[0], 2);
    assert_int_equal(a.failed_promo[1], 4);
    assert_int_equal(a.failed_promo[2], 7);
    assert_int_equal(a.n_failed_load_src, 1);
    unsigned char buf[128];
    size_t len;
    KVT_OK_(kvt_offload_worker_meta_encode(&a, buf, sizeof(buf), &len));
    assert_int_equal(len, 12 + 8 + 4 + 4 + 4 + 3 * 4 + 1);
    KVT_OK_(kvt_offload_worker_meta_decode(&back, buf, len));
    assert_true(kvt_offload_worker_meta_equal(&a, &back));
    back.failed_promo[2] = 3;
    assert_false(kvt_offload_worker_meta_equal(&a, &back));
    KVT_ERR_(kvt_offload_worker_meta_validate(&back), KVT_EINVAL);
    buf[12 + 8 + 8 + 4 + 4] = 9; /* on the wire: 9, 4, 7 */
    KVT_ERR_(kvt_offload_worker_meta_decode(&back, buf, len), KVT_EPROTO);
    assert_non_null(strstr(kvt_last_error(), "failed promotions"));
    kvt_offload_worker_meta_release(&a);
    kvt_offload_worker_meta_release(&b);
    kvt_offload_worker_meta_release(&back);
}

/* A step with remote reads: tier 2's loads name sources 1 .. n, each an owner's slot. */
static void remote_reads_round_trip_and_are_checked(void **state)
{
    (void)state;
    kvt_offload_meta m, back;
    kvt_offload_meta_init(&m);
    kvt_offload_meta_init(&back);
    uint32_t o0, o1, id;
    uint8_t h[20];
    KVT_OK_(kvt_offload_meta_add_remote_owner(&m, "a", "10.0.0.1:5000", 3, &o0));
    KVT_OK_(kvt_offload_meta_add_remote_owner(&m, "bb", "10.0.0.2:5001", 9, &o1));
    assert_int_equal(o1, 1);
    m.tiers[1].load_event = 4;
    for (uint32_t i = 0; i < 3; i++) {
        memset(h, (int)(0x40 + i), sizeof(h));
        KVT_OK_(kvt_offload_meta_add_remote_src(&m, 2, i % 2, 10 + i, 100 + i, h, 20, &id));
        assert_int_equal(id, i + 1);
        KVT_OK_(kvt_offload_meta_add_tier_load(&m, 2, id, 30 + i));
    }
    /* every source of a message: one tier, one hash length */
    KVT_ERR_(kvt_offload_meta_add_remote_src(&m, 1, 0, 1, 1, h, 20, &id), KVT_EINVAL);
    KVT_ERR_(kvt_offload_meta_add_remote_src(&m, 2, 0, 1, 1, h, 33, &id), KVT_ERANGE);
    roundtrip(&m, &back);
    assert_int_equal(back.remote.tier, 2);
    assert_int_equal(back.remote.n_srcs, 3);
    assert_int_equal(back.remote.srcs[2].slot, 12);
    assert_int_equal(back.remote.srcs[2].generation, 102);
    assert_int_equal(back.remote.srcs[2].hash[19], 0x42);
    assert_string_equal(back.remote.owners[1].endpoint.ptr, "10.0.0.2:5001");
    assert_int_equal(back.remote.owners[1].epoch, 9);
    size_t empty = 12 + 8 + 8 + 4 + 8 + 8 + 1 + 4 + 1 + 1;
    assert_int_equal(kvt_offload_meta_encoded_size(&m),
                     empty + (1 + 8 + 4 + 12 + 4 + 12 + 8 + 4 + 4) + 1 + 1 + 4 +
                         (4 + 1 + 4 + 13 + 8) + (4 + 2 + 4 + 13 + 8) + 4 + 3 * (16 + 20) + 1 + 4 +
                         4);

    /* each rule broken once, by the validator (and so by encode and decode) */
    m.tiers[1].load_src[1] = 4; /* past the sources */
    KVT_ERR_(kvt_offload_meta_validate(&m), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "names source 4 of 3"));
    m.tiers[1].load_src[1] = 2;
    m.remote.srcs[0].owner = 2; /* not listed */
    KVT_ERR_(kvt_offload_meta_validate(&m), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "names owner 2 of 2"));
    m.remote.srcs[0].owner = 0;
    m.remote.owners[0].endpoint.len = 0;
    KVT_ERR_(kvt_offload_meta_validate(&m), KVT_EINVAL);
    m.remote.owners[0].endpoint.len = 13;
    m.remote.owners[0].instance.len = 65;
    KVT_ERR_(kvt_offload_meta_validate(&m), KVT_EINVAL);
    m.remote.owners[0].instance.len = 1;
    m.tiers[1].store_event = 5; /* a write-back into the remote tier */
    KVT_OK_(kvt_offload_meta_add_tier_store(&m, 2, 1, 1));
    KVT_ERR_(kvt_offload_meta_validate(&m), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "write-backs"));
    kvt_offload_meta_clear(&m);
    assert_int_equal(m.remote.tier, 0);
    m.remote.n_owners = 1; /* owners without a tier */
    KVT_ERR_(kvt_offload_meta_validate(&m), KVT_EINVAL);
    m.remote.n_owners = 0;
    KVT_OK_(kvt_offload_meta_validate(&m));

    /* hand-built: a remote section whose hash length is out of range, then one whose sources
     * claim more bytes than the message holds */
    for (int k = 0; k < 2; k++) {
        wb w;
        wb_offload_seed_fields(&w);
        wb_u8(&w, 0);                /* no tier sections */
        wb_u8(&w, 1);                /* remote tier 1 */
        wb_u8(&w, k == 0 ? 33 : 16); /* hash_len */
        wb_u8(&w, 1);                /* parts */
        wb_u32(&w, 0);               /* no owners */
        wb_u32(&w, 1000);            /* sources */
        wb_done(&w);
        KVT_ERR_(kvt_offload_meta_decode(&back, w.b, w.n), KVT_EPROTO);
        assert_non_null(strstr(kvt_last_error(), k == 0 ? "hash_len 33" : "cannot fit"));
    }
    kvt_offload_meta_release(&m);
    kvt_offload_meta_release(&back);
}

/* Engines of two ranks: each source has a part per rank, one hash; a lookup-only scheduler's
 * tier also carries publications and withdrawals, with or without reads. */
static void remote_parts_publications_and_withdrawals_round_trip(void **state)
{
    (void)state;
    kvt_offload_meta m, back;
    kvt_offload_meta_init(&m);
    kvt_offload_meta_init(&back);
    uint8_t h[16];
    uint32_t o[2], id;
    KVT_OK_(kvt_offload_meta_add_remote_owner(&m, "a#0", "10.0.0.1:5000", 3, &o[0]));
    KVT_OK_(kvt_offload_meta_add_remote_owner(&m, "a#1", "10.0.0.1:5001", 4, &o[1]));
    m.tiers[0].load_event = 7;
    for (uint32_t i = 0; i < 2; i++) {
        kvt_remote_src parts[2] = {{.owner = 0, .slot = 5 + i, .generation = 1},
                                   {.owner = 1, .slot = 5 + i, .generation = 2}};
        memset(h, (int)(0x60 + i), sizeof(h));
        KVT_OK_(kvt_offload_meta_add_remote_parts(&m, 1, 2, parts, h, 16, &id));
        KVT_OK_(kvt_offload_meta_add_tier_load(&m, 1, id, 20 + i));
    }
    kvt_remote_src one = {0};
    KVT_ERR_(kvt_offload_meta_add_remote_parts(&m, 1, 1, &one, h, 16, &id), KVT_EINVAL);
    KVT_ERR_(kvt_offload_meta_add_remote_parts(&m, 1, KVT_META_MAX_PARTS + 1, &one, h, 16, &id),
             KVT_ERANGE);
    memset(h, 0x11, sizeof(h));
    KVT_OK_(kvt_offload_meta_add_remote_pub(&m, 1, 9, h, 16));
    KVT_OK_(kvt_offload_meta_add_remote_withdraw(&m, 1, 30, 16));
    KVT_OK_(kvt_offload_meta_add_remote_withdraw(&m, 1, 31, 16));
    KVT_OK_(kvt_offload_meta_remote_withdraw_all(&m, 1, 16));
    KVT_ERR_(kvt_offload_meta_add_remote_pub(&m, 2, 9, h, 16), KVT_EINVAL); /* another tier */
    roundtrip(&m, &back);
    assert_int_equal(back.remote.parts, 2);
    assert_int_equal(back.remote.n_srcs, 2);
    assert_int_equal(back.remote.srcs[3].owner, 1); /* block 2's rank 1 */
    assert_int_equal(back.remote.srcs[3].slot, 6);
    assert_int_equal(back.remote.srcs[3].generation, 2);
    assert_int_equal(back.remote.srcs[3].hash[15], 0x61);
    assert_int_equal(back.remote.n_pubs, 1);
    assert_int_equal(back.remote.pub_blocks[0], 9);
    assert_int_equal(back.remote.pub_hashes[15], 0x11);
    assert_int_equal(back.remote.n_withdraws, 2);
    assert_int_equal(back.remote.withdraw_blocks[1], 31);
    assert_true(back.remote.withdraw_all);

    /* each rule broken once */
    m.remote.srcs[1].hash[0] ^= 1; /* a part of another block */
    KVT_ERR_(kvt_offload_meta_validate(&m), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "parts of other hashes"));
    m.remote.srcs[1].hash[0] ^= 1;
    m.remote.pub_blocks[0] = 0;
    KVT_ERR_(kvt_offload_meta_validate(&m), KVT_EINVAL);
    m.remote.pub_blocks[0] = 9;
    m.remote.withdraw_blocks[0] = 0;
    KVT_ERR_(kvt_offload_meta_validate(&m), KVT_EINVAL);
    m.remote.withdraw_blocks[0] = 30;
    m.remote.parts = 0;
    KVT_ERR_(kvt_offload_meta_validate(&m), KVT_EINVAL);
    m.remote.parts = 2;
    KVT_OK_(kvt_offload_meta_validate(&m));

    /* publications alone: a section without reads */
    kvt_offload_meta_clear(&m);
    KVT_OK_(kvt_offload_meta_add_remote_pub(&m, 1, 3, h, 16));
    roundtrip(&m, &back);
    assert_int_equal(back.remote.tier, 1);
    assert_int_equal(back.remote.n_srcs, 0);
    assert_int_equal(back.remote.n_pubs, 1);
    kvt_offload_meta_clear(&m);
    m.remote.n_pubs = 1; /* publications without a tier */
    KVT_ERR_(kvt_offload_meta_validate(&m), KVT_EINVAL);
    m.remote.n_pubs = 0;

    /* hand-built: 17 parts; withdraw_all 2 */
    for (int k = 0; k < 2; k++) {
        wb w;
        wb_offload_seed_fields(&w);
        wb_u8(&w, 0);               /* no tier sections */
        wb_u8(&w, 1);               /* remote tier 1 */
        wb_u8(&w, 16);              /* hash_len */
        wb_u8(&w, k == 0 ? 17 : 1); /* parts */
        wb_u32(&w, 0);              /* no owners */
        wb_u32(&w, 0);              /* no sources */
        wb_u8(&w, 2);               /* withdraw_all */
        wb_u32(&w, 0);
        wb_u32(&w, 0);
        wb_done(&w);
        KVT_ERR_(kvt_offload_meta_decode(&back, w.b, w.n), KVT_EPROTO);
        assert_non_null(strstr(kvt_last_error(), k == 0 ? "17 parts" : "withdraw_all"));
    }
    kvt_offload_meta_release(&m);
    kvt_offload_meta_release(&back);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(empty_step_has_no_events_and_round_trips),
        cmocka_unit_test(full_step_round_trips_and_reuses_its_memory),
        cmocka_unit_test(load_events_must_ascend),
        cmocka_unit_test(event_is_none_exactly_when_its_lists_are_empty),
        cmocka_unit_test(null_block_never_appears_in_a_transfer),
        cmocka_unit_test(this_steps_load_event_is_listed_with_its_requests),
        cmocka_unit_test(encode_reports_a_small_buffer),
        cmocka_unit_test(decoder_enforces_the_invariants),
        cmocka_unit_test(decoder_bounds_request_ids),
        cmocka_unit_test(worker_reports_sum_per_event),
        cmocka_unit_test(aggregate_overflow_fails_and_changes_nothing),
        cmocka_unit_test(worker_report_round_trips_and_decoder_wants_ascending_events),
        cmocka_unit_test(disk_tier_lists_round_trip_and_are_checked),
        cmocka_unit_test(worker_disk_reports_aggregate_and_round_trip),
        cmocka_unit_test(tier_sections_name_their_tier),
        cmocka_unit_test(failed_load_sources_are_an_ascending_set),
        cmocka_unit_test(failed_promotions_are_an_ascending_set),
        cmocka_unit_test(remote_reads_round_trip_and_are_checked),
        cmocka_unit_test(remote_parts_publications_and_withdrawals_round_trip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
