/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Three tiers (GPU -> host -> disk), one behaviour per test: write-backs become findable on
 * disk only when every worker reported them, a failed one never does; a disk hit is promoted
 * before the request's single GPU load, a failed promotion is never a hit and comes back as
 * invalid load destinations; finishing during a promotion, reset and the configuration rules.
 */
#include "offload/sim.h"
#include "offload/offload_internal.h" /* a third tier, opened by hand */

enum { R_STORES, R_DISK_STORES, R_DISK_LOADS };

static void report(sim *s, int which, int64_t ev, uint32_t ranks, bool failed)
{
    kvt_offload_worker_meta_clear(&s->wm);
    kvt_event_report *r = which == R_STORES        ? &s->wm.stores
                          : which == R_DISK_STORES ? &s->wm.tier_stores[0]
                                                   : &s->wm.tier_loads[0];
    KVT_OK_(kvt_event_report_add(r, ev, ranks));
    if (failed)
        KVT_OK_(kvt_event_report_add_failed(r, ev));
    KVT_OK_(kvt_offload_apply_output(s->m, NULL, 0, &s->wm));
}

static bool disk_has(sim *s, const sim_req *r, uint32_t block)
{
    uint32_t b;
    return kvt_pool_lookup(kvt_offload_disk_pool(s->m), r->hashes + block * KVT_BLOCK_HASH_LEN, 0,
                           &b) == 1;
}

static uint32_t host_ref(sim *s, uint32_t h)
{
    kvt_block_info bi;
    KVT_OK_(kvt_pool_block_info(kvt_offload_host_pool(s->m), h, &bi));
    return bi.ref_cnt;
}

/* Stores r to the host tier and lets its write-back complete (world 1). */
static void store_through(sim *s, sim_req *r)
{
    sim_store_prompt(s, r, 1);
    sim_build(s, false);
    if (s->meta.tiers[0].store_event != KVT_NO_EVENT)
        report(s, R_DISK_STORES, s->meta.tiers[0].store_event, 1, false);
}

/* Stores a, then other prompts until the host tier holds none of a's 4 blocks. */
static void push_out_of_host(sim *s, sim_req *a)
{
    store_through(s, a);
    for (uint32_t i = 0; i < 8 && (sim_host_has(s, a, 0) || sim_host_has(s, a, 3)); i++) {
        sim_req o;
        char id[16];
        snprintf(id, sizeof(id), "o%u", i);
        sim_req_make(&o, id, 4 * SIM_BS + 1, 50 + i, 4 * SIM_BS + 1, 50 + i);
        store_through(s, &o);
    }
    for (uint32_t b = 0; b < 4; b++) {
        assert_false(sim_host_has(s, a, b));
        assert_true(disk_has(s, a, b));
    }
    KVT_OK_(kvt_pool_reset_prefix_cache(s->gpu)); /* only the disk has a now */
}

/* A small host tier (8 blocks) with a disk tier behind it, prompt a (4 blocks) only on disk,
 * and b, the same prompt, ready to be admitted. */
static void disk_only_setup(sim *s, sim_req *a, sim_req *b)
{
    sim_init3(s, 64, 8, false, 1, 64, 64);
    sim_req_make(a, "a", 4 * SIM_BS + 1, 1, 4 * SIM_BS + 1, 0);
    push_out_of_host(s, a);
    sim_req_make(b, "b", 4 * SIM_BS + 1, 1, 4 * SIM_BS + 1, 0);
}

static void write_back_is_findable_on_disk_only_when_every_worker_reported(void **state)
{
    (void)state;
    sim s;
    sim_init3(&s, 64, 32, false, 2, 64, 32);
    sim_req a;
    sim_req_make(&a, "a", 4 * SIM_BS + 1, 1, 4 * SIM_BS + 1, 0);
    sim_store_prompt(&s, &a, 2); /* host store completed: write-backs queued */
    assert_true(sim_host_has(&s, &a, 0));
    sim_build(&s, false);
    assert_int_equal(s.meta.tiers[0].store_event, 0);
    assert_int_equal(s.meta.tiers[0].n_stores, 4);
    uint32_t h0 = s.meta.tiers[0].store_src[0];
    assert_int_equal(host_ref(&s, h0), 1); /* pinned until the write landed */
    assert_false(disk_has(&s, &a, 0));
    report(&s, R_DISK_STORES, 0, 1, false);
    assert_false(disk_has(&s, &a, 0)); /* one of two workers */
    report(&s, R_DISK_STORES, 0, 1, false);
    for (uint32_t b = 0; b < 4; b++)
        assert_true(disk_has(&s, &a, b));
    assert_int_equal(host_ref(&s, h0), 0);
    kvt_offload_stats st;
    kvt_offload_get_stats(s.m, &st);
    assert_int_equal(st.disk_stores_completed, 4);
    assert_int_equal(st.disk_cached_blocks, 4);
    assert_false(kvt_offload_has_pending(s.m));
    sim_fini(&s);
}

static void failed_write_back_is_never_findable_and_releases_its_blocks(void **state)
{
    (void)state;
    sim s;
    sim_init3(&s, 64, 32, false, 1, 64, 32);
    sim_req a;
    sim_req_make(&a, "a", 4 * SIM_BS + 1, 1, 4 * SIM_BS + 1, 0);
    sim_store_prompt(&s, &a, 1);
    sim_build(&s, false);
    uint32_t h0 = s.meta.tiers[0].store_src[0];
    report(&s, R_DISK_STORES, 0, 1, true);
    for (uint32_t b = 0; b < 4; b++)
        assert_false(disk_has(&s, &a, b));
    assert_true(sim_host_has(&s, &a, 0)); /* the host copy is fine */
    assert_int_equal(host_ref(&s, h0), 0);
    kvt_offload_stats st;
    kvt_offload_get_stats(s.m, &st);
    assert_int_equal(st.disk_stores_failed, 4);
    assert_int_equal(st.disk_used_blocks, 0);
    sim_fini(&s);
}

static void disk_hit_is_promoted_before_the_single_gpu_load(void **state)
{
    (void)state;
    sim s;
    sim_req a, b;
    disk_only_setup(&s, &a, &b);
    assert_int_equal(sim_admit(&s, &b, UINT32_MAX), 4 * SIM_BS);
    sim_build(&s, false);
    assert_int_equal(s.meta.load_event, KVT_NO_EVENT); /* waits for the promotion */
    assert_int_equal(s.meta.tiers[0].load_event, 0);
    assert_int_equal(s.meta.tiers[0].n_loads, 4);
    uint32_t hosts[4];
    memcpy(hosts, s.meta.tiers[0].load_dst, sizeof(hosts));
    assert_false(sim_host_has(&s, &b, 0)); /* not findable before the promotion landed */
    sim_build(&s, false);
    assert_int_equal(s.meta.load_event, KVT_NO_EVENT);
    report(&s, R_DISK_LOADS, 0, 1, false);
    for (uint32_t i = 0; i < 4; i++)
        assert_true(sim_host_has(&s, &b, i));
    sim_build(&s, false);
    assert_int_equal(s.meta.load_event, 0);
    assert_int_equal(s.meta.n_loads, 4);
    assert_int_equal(s.meta.n_load_invalid, 0);
    for (uint32_t i = 0; i < 4; i++) {
        assert_int_equal(s.meta.load_gpu_blocks[i], b.blocks[i]);
        assert_int_equal(s.meta.load_cpu_blocks[i], hosts[i]);
    }
    assert_string_equal(s.meta.load_req_ids[0].ptr, "b");
    sim_report_load(&s, &b);
    sim_finish(&s, &b);
    kvt_offload_stats st;
    kvt_offload_get_stats(s.m, &st);
    assert_int_equal(st.promotions, 4);
    assert_int_equal(st.disk_hit_tokens, 4 * SIM_BS);
    assert_int_equal(st.disk_used_blocks, 0);
    /* the same figures per tier, by index: a hit's tokens counted by the tier serving them */
    kvt_tier_stats h, d;
    assert_int_equal(kvt_offload_num_tiers(s.m), 2);
    KVT_OK_(kvt_offload_get_tier_stats(s.m, 0, &h));
    KVT_OK_(kvt_offload_get_tier_stats(s.m, 1, &d));
    assert_string_equal(h.name, "host");
    assert_string_equal(d.name, "disk");
    assert_int_equal(d.hit_tokens, st.disk_hit_tokens);
    assert_int_equal(h.hit_tokens + d.hit_tokens, st.hit_tokens);
    assert_int_equal(d.hit_blocks, st.disk_hit_blocks);
    assert_int_equal(h.hit_blocks, st.hit_blocks);
    assert_int_equal(d.load_events, st.disk_load_events);
    assert_int_equal(d.load_events, 1);
    assert_int_equal(h.load_events, st.load_events);
    assert_int_equal(d.stores_completed, st.disk_stores_completed);
    assert_true(d.stores_completed > 0);
    assert_int_equal(h.stores_completed, st.stores_completed);
    assert_int_equal(h.evictions, st.host_evictions);
    assert_int_equal(d.blocks, st.disk_blocks);
    assert_int_equal(h.cached_blocks, st.host_cached_blocks);
    uint64_t disk_tokens = d.hit_tokens;
    KVT_ERR_(kvt_offload_get_tier_stats(s.m, 2, &d), KVT_ERANGE);
    assert_null(d.name); /* zeroed */
    char buf[32768];
    size_t len;
    KVT_OK_(kvt_offload_prometheus(s.m, buf, sizeof(buf), &len));
    KVT_PROMTOOL_OK(buf);
    char want[96];
    snprintf(want, sizeof(want), "kvtier_offload_tier_hit_tokens_total{tier=\"disk\"} %llu\n",
             (unsigned long long)disk_tokens);
    assert_non_null(strstr(buf, want));
    assert_false(kvt_offload_has_pending(s.m));
    sim_fini(&s);
}

static void failed_promotion_is_never_a_hit_and_its_blocks_come_back_invalid(void **state)
{
    (void)state;
    sim s;
    sim_req a, b;
    disk_only_setup(&s, &a, &b);
    assert_int_equal(sim_admit(&s, &b, UINT32_MAX), 4 * SIM_BS);
    sim_build(&s, false);
    report(&s, R_DISK_LOADS, 0, 1, true);
    for (uint32_t i = 0; i < 4; i++)
        assert_false(sim_host_has(&s, &b, i));
    sim_build(&s, false);
    assert_int_equal(s.meta.load_event, 0); /* the load still runs: one event per request */
    assert_int_equal(s.meta.n_load_invalid, 4);
    for (uint32_t i = 0; i < 4; i++)
        assert_int_equal(s.meta.load_invalid_blocks[i], b.blocks[i]);
    sim_report_load(&s, &b);
    sim_finish(&s, &b);
    kvt_offload_stats st;
    kvt_offload_get_stats(s.m, &st);
    assert_int_equal(st.promotions_failed, 4);
    assert_int_equal(st.promotions, 0);
    /* the slots that failed are forgotten (vLLM resets the failed request's slots), counted
     * and evented: the next request with the prompt misses instead of failing on them again */
    for (uint32_t i = 0; i < 4; i++)
        assert_false(disk_has(&s, &a, i));
    kvt_tier_stats ts;
    KVT_OK_(kvt_offload_get_tier_stats(s.m, 1, &ts));
    assert_int_equal(ts.loads_failed, 4);
    kvt_offload_event ev[64];
    uint32_t n_ev = kvt_offload_take_events(s.m, ev, 64, NULL), removed = 0;
    for (uint32_t i = 0; i < n_ev; i++)
        removed += ev[i].type == KVT_OFFLOAD_EV_REMOVED && ev[i].medium == KVT_MEDIUM_DISK;
    assert_int_equal(removed, 4);
    sim_req c;
    sim_req_make(&c, "c", 4 * SIM_BS + 1, 1, 4 * SIM_BS + 1, 0);
    assert_int_equal(sim_admit(&s, &c, UINT32_MAX), 0);
    assert_false(kvt_offload_has_pending(s.m));
    sim_fini(&s);
}

static void host_hit_continues_on_disk(void **state)
{
    (void)state;
    sim s;
    sim_init3(&s, 64, 8, false, 1, 64, 64);
    sim_req a, b, c;
    sim_req_make(&a, "a", 4 * SIM_BS + 1, 1, 4 * SIM_BS + 1, 0);
    push_out_of_host(&s, &a);
    /* bring a's first two blocks back to the host tier: a prompt of exactly those */
    sim_req_make(&b, "b", 2 * SIM_BS + 1, 1, 2 * SIM_BS, 9);
    assert_int_equal(sim_admit(&s, &b, UINT32_MAX), 2 * SIM_BS);
    sim_build(&s, false);
    report(&s, R_DISK_LOADS, s.meta.tiers[0].load_event, 1, false);
    sim_build(&s, false);
    sim_report_load(&s, &b);
    sim_finish(&s, &b);
    KVT_OK_(kvt_pool_reset_prefix_cache(s.gpu));
    assert_true(sim_host_has(&s, &a, 1));
    assert_false(sim_host_has(&s, &a, 2));
    /* the whole prompt: two blocks from the host tier, two promoted, one GPU load */
    sim_req_make(&c, "c", 4 * SIM_BS + 1, 1, 4 * SIM_BS + 1, 0);
    assert_int_equal(sim_admit(&s, &c, UINT32_MAX), 4 * SIM_BS);
    sim_build(&s, false);
    assert_int_equal(s.meta.tiers[0].n_loads, 2);
    assert_int_equal(s.meta.load_event, KVT_NO_EVENT);
    report(&s, R_DISK_LOADS, s.meta.tiers[0].load_event, 1, false);
    sim_build(&s, false);
    assert_int_equal(s.meta.n_loads, 4);
    sim_report_load(&s, &c);
    sim_finish(&s, &c);
    assert_false(kvt_offload_has_pending(s.m));
    sim_fini(&s);
}

static void finishing_during_a_promotion_releases_everything_when_it_lands(void **state)
{
    (void)state;
    sim s;
    sim_req a, b;
    disk_only_setup(&s, &a, &b);
    sim_admit(&s, &b, UINT32_MAX);
    sim_build(&s, false);
    uint32_t gpu0 = b.blocks[0];
    sim_finish(&s, &b); /* the engine frees its GPU blocks; the manager still holds them */
    assert_int_equal(sim_gpu_ref(&s, gpu0), 1);
    assert_true(kvt_offload_has_pending(s.m));
    report(&s, R_DISK_LOADS, 0, 1, false);
    assert_int_equal(sim_gpu_ref(&s, gpu0), 0);
    sim_build(&s, false);
    assert_int_equal(s.meta.load_event, KVT_NO_EVENT); /* nobody waits for it */
    assert_true(sim_host_has(&s, &b, 0));              /* but the promotion is kept */
    kvt_offload_stats st;
    kvt_offload_get_stats(s.m, &st);
    assert_int_equal(st.requests, 0);
    assert_int_equal(st.host_used_blocks, 0);
    assert_int_equal(st.disk_used_blocks, 0);
    assert_false(kvt_offload_has_pending(s.m));
    sim_fini(&s);
}

static void reset_waits_for_write_backs_and_clears_the_disk(void **state)
{
    (void)state;
    sim s;
    sim_init3(&s, 64, 32, false, 1, 64, 32);
    sim_req a;
    sim_req_make(&a, "a", 4 * SIM_BS + 1, 1, 4 * SIM_BS + 1, 0);
    store_through(&s, &a);
    assert_true(disk_has(&s, &a, 0));
    sim_req b;
    sim_req_make(&b, "b", 4 * SIM_BS + 1, 2, 4 * SIM_BS + 1, 1);
    sim_store_prompt(&s, &b, 1);
    sim_build(&s, false); /* b's write-back in flight */
    int64_t ev = s.meta.tiers[0].store_event;
    assert_true(ev != KVT_NO_EVENT);
    KVT_ERR_(kvt_offload_reset(s.m), KVT_EBUSY);
    report(&s, R_DISK_STORES, ev, 1, false);
    KVT_OK_(kvt_offload_reset(s.m));
    assert_false(disk_has(&s, &a, 0)); /* cleared */
    assert_false(disk_has(&s, &b, 0)); /* abandoned: never cached */
    kvt_offload_stats st;
    kvt_offload_get_stats(s.m, &st);
    assert_int_equal(st.disk_stores_abandoned, 4);
    assert_int_equal(st.disk_cached_blocks, 0);
    sim_fini(&s);
}

/* Three tiers with a hybrid model (spec §2.14 item 10): full attention + a one-block sliding
 * window, 8 host blocks, 64 disk slots. r (4 blocks in each group, the window's first three
 * nulled and recovered) is stored and written back; other prompts push it out of the host
 * tier; a clone finds it on disk in both groups, the window group only where its end needs
 * it, and promotes those slots to the positions they continue; a shorter acceptance inside
 * the disk part is refused. */
static void a_hybrid_prefix_comes_back_from_disk_in_every_group(void **state)
{
    (void)state;
    kvt_pool_config pc;
    kvt_pool_config_init(&pc);
    pc.num_blocks = 64;
    pc.n_groups = 2;
    pc.groups[1] = (kvt_group_spec){KVT_GROUP_SLIDING, SIM_BS, SIM_BS + 1};
    sim s;
    KVT_OK_(kvt_pool_create(&pc, &s.gpu));
    kvt_offload_config oc;
    kvt_offload_config_init(&oc);
    oc.host_blocks = 9;
    oc.disk_blocks = 64;
    KVT_OK_(kvt_offload_create(&oc, s.gpu, &s.m));
    kvt_offload_meta_init(&s.meta);
    kvt_offload_worker_meta_init(&s.wm);
    /* store prompt p (5 blocks, tokens of seed `seed`) in both groups, through to disk */
    sim_req r[4];
    uint32_t fa[5], sw[5];
    const uint32_t *tab[2] = {fa, sw};
    uint32_t nb[2] = {5, 5}, hit;
    for (uint32_t p = 0; p < 4; p++) {
        char id[8];
        snprintf(id, sizeof(id), "r%u", p);
        sim_req_make(&r[p], id, 4 * SIM_BS + 1, 10 + p, 4 * SIM_BS + 1, 0);
        KVT_OK_(kvt_pool_alloc(s.gpu, 5, fa));
        KVT_OK_(kvt_pool_alloc(s.gpu, 5, sw));
        for (uint32_t j = 0; j < 4; j++) {
            KVT_OK_(kvt_pool_insert(s.gpu, fa[j], r[p].hashes + j * KVT_BLOCK_HASH_LEN, 0, SIM_BS));
            KVT_OK_(kvt_pool_insert(s.gpu, sw[j], r[p].hashes + j * KVT_BLOCK_HASH_LEN, 1, SIM_BS));
        }
        KVT_OK_(kvt_offload_match(s.m, id, 2, r[p].hashes, r[p].n_hashes, r[p].n_tokens, 0, &hit));
        KVT_OK_(kvt_offload_after_alloc(s.m, id, 2, tab, nb, 0));
        assert_true(kvt_offload_schedule_hashed(s.m, id, 2, tab, nb, r[p].hashes, r[p].n_hashes,
                                                r[p].n_tokens, 1, false) >= 0);
        KVT_OK_(kvt_offload_request_finished_hashed(s.m, id, 2, tab, nb, r[p].hashes, r[p].n_hashes,
                                                    r[p].n_tokens));
        KVT_OK_(kvt_pool_free(s.gpu, fa, 5));
        KVT_OK_(kvt_pool_free(s.gpu, sw, 5));
        sim_build(&s, false);
        assert_int_equal(s.meta.n_stores, 8);
        report(&s, R_STORES, s.meta.store_event, 1, false);
        sim_build(&s, false); /* the write-back */
        report(&s, R_DISK_STORES, s.meta.tiers[0].store_event, 1, false);
        KVT_OK_(kvt_pool_reset_prefix_cache(s.gpu));
    }
    for (uint32_t j = 0; j < 4; j++) { /* r0 left the host tier; the disk has it */
        assert_false(sim_host_has(&s, &r[0], j));
        assert_true(disk_has(&s, &r[0], j));
    }
    /* a clone of r0: the whole prefix from disk, the window group's last block only */
    KVT_OK_(kvt_offload_match(s.m, "c", 1, r[0].hashes, r[0].n_hashes, r[0].n_tokens, 0, &hit));
    assert_int_equal(hit, 4 * SIM_BS);
    KVT_OK_(kvt_pool_alloc(s.gpu, 5, fa));
    KVT_OK_(kvt_pool_alloc(s.gpu, 5, sw));
    KVT_ERR_(kvt_offload_after_alloc(s.m, "c", 1, tab, nb, 2 * SIM_BS), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "promoted from the tiers behind"));
    KVT_OK_(kvt_offload_after_alloc(s.m, "c", 1, tab, nb, hit));
    sim_build(&s, false);
    assert_int_equal(s.meta.tiers[0].n_loads, 5); /* promotions: 4 + the window's one */
    report(&s, R_DISK_LOADS, s.meta.tiers[0].load_event, 1, false);
    sim_build(&s, false); /* the GPU load, after the promotion */
    assert_int_equal(s.meta.n_loads, 5);
    bool window_block = false;
    for (uint32_t i = 0; i < s.meta.n_loads; i++) {
        assert_int_not_equal(s.meta.load_gpu_blocks[i], KVT_NULL_BLOCK);
        window_block |= s.meta.load_gpu_blocks[i] == sw[3];
        for (uint32_t j = 0; j < 3; j++)
            assert_int_not_equal(s.meta.load_gpu_blocks[i], sw[j]); /* not needed: not loaded */
    }
    assert_true(window_block);
    kvt_str c = {"c", 1};
    KVT_OK_(kvt_offload_apply_output(s.m, &c, 1, NULL));
    KVT_OK_(kvt_offload_request_finished(s.m, "c", 1, tab, nb, 0));
    KVT_OK_(kvt_pool_free(s.gpu, fa, 5));
    KVT_OK_(kvt_pool_free(s.gpu, sw, 5));
    sim_fini(&s);
}

static void three_tiers_need_a_real_disk_size(void **state)
{
    (void)state;
    kvt_pool_config pc;
    kvt_pool_config_init(&pc);
    pc.num_blocks = 32;
    kvt_pool *gpu;
    kvt_offload_config oc;
    kvt_offload_config_init(&oc);
    oc.host_blocks = 16;
    kvt_offload *m;
    KVT_OK_(kvt_pool_create(&pc, &gpu));
    oc.disk_blocks = 1;
    KVT_ERR_(kvt_offload_create(&oc, gpu, &m), KVT_EINVAL);
    oc.disk_blocks = 0; /* two tiers: no disk pool, no disk metrics, no disk resize */
    KVT_OK_(kvt_offload_create(&oc, gpu, &m));
    assert_null(kvt_offload_disk_pool(m));
    kvt_tier_stats ts;
    assert_int_equal(kvt_offload_num_tiers(m), 1);
    KVT_OK_(kvt_offload_get_tier_stats(m, 0, &ts));
    KVT_ERR_(kvt_offload_get_tier_stats(m, 1, &ts), KVT_ERANGE);
    assert_int_equal(kvt_offload_num_tiers(NULL), 0);
    KVT_ERR_(kvt_offload_lower_disk_blocks(m, 8), KVT_ESTATE);
    char buf[16384];
    size_t len;
    KVT_OK_(kvt_offload_prometheus(m, buf, sizeof(buf), &len));
    KVT_PROMTOOL_OK(buf);
    assert_null(strstr(buf, "disk"));
    kvt_offload_destroy(m);
    oc.disk_blocks = 16;
    KVT_OK_(kvt_offload_create(&oc, gpu, &m));
    KVT_ERR_(kvt_offload_lower_disk_blocks(m, 17), KVT_EINVAL);
    KVT_ERR_(kvt_offload_lower_disk_blocks(m, 1), KVT_EINVAL);
    KVT_OK_(kvt_offload_lower_disk_blocks(m, 12));
    kvt_offload_stats st;
    kvt_offload_get_stats(m, &st);
    assert_int_equal(st.disk_blocks, 11);
    KVT_OK_(kvt_offload_prometheus(m, buf, sizeof(buf), &len));
    KVT_PROMTOOL_OK(buf);
    assert_non_null(strstr(buf, "kvtier_offload_disk_blocks 11"));
    kvt_offload_destroy(m);
    kvt_pool_destroy(gpu);
}

static void reports_for_disk_events_never_issued_are_refused(void **state)
{
    (void)state;
    sim s;
    sim_init3(&s, 64, 32, false, 1, 64, 32);
    kvt_offload_worker_meta_clear(&s.wm);
    KVT_OK_(kvt_event_report_add(&s.wm.tier_loads[0], 0, 1));
    KVT_ERR_(kvt_offload_apply_output(s.m, NULL, 0, &s.wm), KVT_ERANGE);
    kvt_offload_worker_meta_clear(&s.wm);
    KVT_OK_(kvt_event_report_add(&s.wm.tier_stores[0], 3, 1));
    KVT_ERR_(kvt_offload_apply_output(s.m, NULL, 0, &s.wm), KVT_ERANGE);
    sim_fini(&s);
}

static bool tier_has(sim *s, uint32_t t, const sim_req *r, uint32_t block)
{
    uint32_t b;
    return kvt_pool_lookup(s->m->tier[t].pool, r->hashes + block * KVT_BLOCK_HASH_LEN, 0, &b) == 1;
}

/* Reports event ev of tier t's loads or stores for `ranks` workers, failed or not. */
static void report_tier(sim *s, uint32_t t, bool loads, int64_t ev, uint32_t ranks, bool failed)
{
    kvt_offload_worker_meta_clear(&s->wm);
    kvt_event_report *r = loads ? &s->wm.tier_loads[t - 1] : &s->wm.tier_stores[t - 1];
    KVT_OK_(kvt_event_report_add(r, ev, ranks));
    if (failed)
        KVT_OK_(kvt_event_report_add_failed(r, ev));
    KVT_OK_(kvt_offload_apply_output(s->m, NULL, 0, &s->wm));
}

/* Every tier behind exchanges blocks with the host: a tier added behind the disk gets each
 * block the host stored in the same step as the disk, from the host block, in its own tier
 * section of the metadata, findable only when every worker reported it, the host block pinned
 * until both writes landed; reset and has_pending see it. */
static void write_backs_go_from_the_host_into_every_tier_behind(void **state)
{
    (void)state;
    sim s;
    sim_init3(&s, 64, 32, false, 2, 64, 32);
    uint32_t idx = 0;
    KVT_OK_(kvt_offload_add_tier(s.m, "far", 16, &idx));
    assert_int_equal(idx, 2);
    assert_int_equal(kvt_offload_num_tiers(s.m), 3);
    sim_req a;
    sim_req_make(&a, "a", 4 * SIM_BS + 1, 1, 4 * SIM_BS + 1, 0);
    sim_store_prompt(&s, &a, 2); /* host store completed: write-backs queued */
    sim_build(&s, false);
    assert_int_equal(s.meta.tiers[0].n_stores, 4);
    assert_int_equal(s.meta.tiers[1].store_event, 0);
    assert_int_equal(s.meta.tiers[1].n_stores, 4);
    uint32_t h0 = s.meta.tiers[1].store_src[0];
    assert_int_equal(h0, s.meta.tiers[0].store_src[0]); /* both from the host block */
    assert_int_equal(host_ref(&s, h0), 2);              /* pinned by each write */
    report_tier(&s, 1, false, s.meta.tiers[0].store_event, 2, false);
    assert_true(disk_has(&s, &a, 0));
    assert_false(tier_has(&s, 2, &a, 0));
    assert_int_equal(host_ref(&s, h0), 1);
    assert_true(kvt_offload_has_pending(s.m));
    report_tier(&s, 2, false, 0, 1, false);
    assert_false(tier_has(&s, 2, &a, 0)); /* one of two workers */
    report_tier(&s, 2, false, 0, 1, false);
    for (uint32_t b = 0; b < 4; b++)
        assert_true(tier_has(&s, 2, &a, b));
    assert_int_equal(host_ref(&s, h0), 0);
    kvt_tier_stats ts;
    KVT_OK_(kvt_offload_get_tier_stats(s.m, 2, &ts));
    assert_string_equal(ts.name, "far");
    assert_int_equal(ts.stores_completed, 4);
    assert_int_equal(ts.cached_blocks, 4);
    /* a report for a tier-2 event never issued is refused by name */
    kvt_offload_worker_meta_clear(&s.wm);
    KVT_OK_(kvt_event_report_add(&s.wm.tier_stores[1], 7, 1));
    KVT_ERR_(kvt_offload_apply_output(s.m, NULL, 0, &s.wm), KVT_ERANGE);
    assert_non_null(strstr(kvt_last_error(), "far store event 7"));
    assert_false(kvt_offload_has_pending(s.m));
    KVT_OK_(kvt_offload_reset(s.m));
    assert_false(tier_has(&s, 2, &a, 0)); /* reset clears every tier */
    sim_fini(&s);
}

/* Host, disk and a tier behind it; x (a's first two blocks) on both, a's last two only on
 * the third tier (their disk write-back failed), nothing on the host any more. */
static void three_tier_setup(sim *s, sim_req *a)
{
    sim_init3(s, 64, 8, false, 1, 64, 64);
    KVT_OK_(kvt_offload_add_tier(s->m, "far", 64, NULL));
    sim_req x;
    sim_req_make(&x, "x", 2 * SIM_BS + 1, 1, 2 * SIM_BS, 9);
    sim_store_prompt(s, &x, 1);
    sim_build(s, false);
    report_tier(s, 1, false, s->meta.tiers[0].store_event, 1, false);
    report_tier(s, 2, false, s->meta.tiers[1].store_event, 1, false);
    sim_req_make(a, "a", 4 * SIM_BS + 1, 1, 4 * SIM_BS + 1, 0);
    sim_store_prompt(s, a, 1);
    sim_build(s, false);
    assert_int_equal(s->meta.tiers[0].n_stores, 2); /* the first two are there already */
    report_tier(s, 1, false, s->meta.tiers[0].store_event, 1, true);
    report_tier(s, 2, false, s->meta.tiers[1].store_event, 1, false);
    for (uint32_t i = 0; i < 8 && (sim_host_has(s, a, 0) || sim_host_has(s, a, 3)); i++) {
        sim_req o;
        char id[16];
        snprintf(id, sizeof(id), "o%u", i);
        sim_req_make(&o, id, 4 * SIM_BS + 1, 50 + i, 4 * SIM_BS + 1, 50 + i);
        sim_store_prompt(s, &o, 1);
        sim_build(s, false);
        report_tier(s, 1, false, s->meta.tiers[0].store_event, 1, false);
        report_tier(s, 2, false, s->meta.tiers[1].store_event, 1, false);
    }
    for (uint32_t b = 0; b < 4; b++) {
        assert_false(sim_host_has(s, a, b));
        assert_int_equal(disk_has(s, a, b), b < 2);
        assert_true(tier_has(s, 2, a, b));
    }
    KVT_OK_(kvt_pool_reset_prefix_cache(s->gpu));
}

/* A hit served by two tiers behind the host: the disk's part first, the third tier's where the
 * disk stops, one promotion event per tier in the same step, and the request's single GPU
 * load only when both landed, in the hit's order. */
static void a_hit_spans_two_tiers_behind_the_host(void **state)
{
    (void)state;
    sim s;
    sim_req a, b;
    three_tier_setup(&s, &a);
    sim_req_make(&b, "b", 4 * SIM_BS + 1, 1, 4 * SIM_BS + 1, 0);
    assert_int_equal(sim_admit(&s, &b, UINT32_MAX), 4 * SIM_BS);
    sim_build(&s, false);
    assert_int_equal(s.meta.load_event, KVT_NO_EVENT);
    assert_int_equal(s.meta.tiers[0].n_loads, 2);
    assert_int_equal(s.meta.tiers[1].n_loads, 2);
    int64_t e1 = s.meta.tiers[0].load_event, e2 = s.meta.tiers[1].load_event;
    assert_true(e1 != KVT_NO_EVENT && e2 != KVT_NO_EVENT);
    uint32_t hosts[4] = {s.meta.tiers[0].load_dst[0], s.meta.tiers[0].load_dst[1],
                         s.meta.tiers[1].load_dst[0], s.meta.tiers[1].load_dst[1]};
    uint32_t src2;
    assert_int_equal(
        kvt_pool_lookup(kvt_offload_tier_pool(s.m, 2), b.hashes + 2 * KVT_BLOCK_HASH_LEN, 0, &src2),
        1);
    assert_int_equal(s.meta.tiers[1].load_src[0], src2);
    report_tier(&s, 2, true, e2, 1, false);
    sim_build(&s, false);
    assert_int_equal(s.meta.load_event, KVT_NO_EVENT); /* the disk's part is not there yet */
    assert_true(sim_host_has(&s, &b, 2));
    assert_false(sim_host_has(&s, &b, 0));
    report_tier(&s, 1, true, e1, 1, false);
    sim_build(&s, false);
    assert_int_equal(s.meta.load_event, 0);
    assert_int_equal(s.meta.n_loads, 4);
    assert_int_equal(s.meta.n_load_invalid, 0);
    for (uint32_t i = 0; i < 4; i++) {
        assert_int_equal(s.meta.load_gpu_blocks[i], b.blocks[i]);
        assert_int_equal(s.meta.load_cpu_blocks[i], hosts[i]);
    }
    sim_report_load(&s, &b);
    sim_finish(&s, &b);
    kvt_tier_stats d, f, h;
    KVT_OK_(kvt_offload_get_tier_stats(s.m, 0, &h));
    KVT_OK_(kvt_offload_get_tier_stats(s.m, 1, &d));
    KVT_OK_(kvt_offload_get_tier_stats(s.m, 2, &f));
    assert_int_equal(d.hit_tokens, 2 * SIM_BS);
    assert_int_equal(f.hit_tokens, 2 * SIM_BS);
    assert_int_equal(h.hit_tokens, 0);
    assert_int_equal(d.load_events, 1);
    assert_int_equal(f.load_events, 1);
    assert_int_equal(d.used_blocks + f.used_blocks + h.used_blocks, 0);
    assert_false(kvt_offload_has_pending(s.m));
    sim_fini(&s);
}

/* One tier's promotion failing spoils only its part: those GPU blocks come back invalid, its
 * sources are forgotten, the other tier's part is a hit. Finishing before the promotions
 * landed releases everything when the last one does. */
static void a_failed_tier_spoils_only_its_part(void **state)
{
    (void)state;
    sim s;
    sim_req a, b, c;
    three_tier_setup(&s, &a);
    sim_req_make(&b, "b", 4 * SIM_BS + 1, 1, 4 * SIM_BS + 1, 0);
    sim_admit(&s, &b, UINT32_MAX);
    sim_build(&s, false);
    int64_t e1 = s.meta.tiers[0].load_event, e2 = s.meta.tiers[1].load_event;
    report_tier(&s, 2, true, e2, 1, true);
    report_tier(&s, 1, true, e1, 1, false);
    sim_build(&s, false);
    assert_int_equal(s.meta.n_loads, 4);
    assert_int_equal(s.meta.n_load_invalid, 2);
    assert_int_equal(s.meta.load_invalid_blocks[0], b.blocks[2]);
    assert_int_equal(s.meta.load_invalid_blocks[1], b.blocks[3]);
    assert_true(sim_host_has(&s, &b, 1));
    assert_false(sim_host_has(&s, &b, 2));
    assert_false(tier_has(&s, 2, &a, 2)); /* forgotten */
    sim_report_load(&s, &b);
    sim_finish(&s, &b);
    kvt_tier_stats f;
    KVT_OK_(kvt_offload_get_tier_stats(s.m, 2, &f));
    assert_int_equal(f.loads_failed, 2);
    /* the next request with the prompt: the host's two promoted blocks, then a miss */
    KVT_OK_(kvt_pool_reset_prefix_cache(s.gpu));
    sim_req_make(&c, "c", 4 * SIM_BS + 1, 1, 4 * SIM_BS + 1, 0);
    assert_int_equal(sim_admit(&s, &c, UINT32_MAX), 2 * SIM_BS);
    sim_build(&s, false);
    assert_int_equal(s.meta.n_loads, 2);
    sim_report_load(&s, &c);
    sim_finish(&s, &c);
    assert_false(kvt_offload_has_pending(s.m));
    sim_fini(&s);
}

/* A request that finishes while its promotions out of two tiers are in flight keeps its GPU
 * blocks until the last one landed, then lets everything go, with no GPU load. */
static void finishing_during_promotions_of_two_tiers_waits_for_the_last(void **state)
{
    (void)state;
    sim s;
    sim_req a, b;
    three_tier_setup(&s, &a);
    sim_req_make(&b, "b", 4 * SIM_BS + 1, 1, 4 * SIM_BS + 1, 0);
    sim_admit(&s, &b, UINT32_MAX);
    sim_build(&s, false);
    int64_t e1 = s.meta.tiers[0].load_event, e2 = s.meta.tiers[1].load_event;
    uint32_t gpu0 = b.blocks[0], gpu3 = b.blocks[3];
    sim_finish(&s, &b);
    report_tier(&s, 1, true, e1, 1, false);
    assert_int_equal(sim_gpu_ref(&s, gpu0), 1); /* still the load's */
    assert_true(kvt_offload_has_pending(s.m));
    report_tier(&s, 2, true, e2, 1, false);
    assert_int_equal(sim_gpu_ref(&s, gpu0), 0);
    assert_int_equal(sim_gpu_ref(&s, gpu3), 0);
    sim_build(&s, false);
    assert_int_equal(s.meta.load_event, KVT_NO_EVENT);
    assert_true(sim_host_has(&s, &b, 3)); /* the promotions are kept */
    kvt_offload_stats st;
    kvt_offload_get_stats(s.m, &st);
    assert_int_equal(st.requests, 0);
    assert_int_equal(st.host_used_blocks, 0);
    for (uint32_t t = 1; t < 3; t++) {
        kvt_tier_stats ts;
        KVT_OK_(kvt_offload_get_tier_stats(s.m, t, &ts));
        assert_int_equal(ts.used_blocks, 0);
    }
    assert_false(kvt_offload_has_pending(s.m));
    sim_fini(&s);
}

/* Tiers are added before the first step, with names that label metrics, up to
 * KVT_MAX_TIERS. */
static void tiers_are_added_before_the_first_step_with_distinct_names(void **state)
{
    (void)state;
    sim s;
    sim_init3(&s, 64, 32, false, 1, 64, 32);
    KVT_ERR_(kvt_offload_add_tier(s.m, "disk", 16, NULL), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "already named"));
    KVT_ERR_(kvt_offload_add_tier(s.m, "Bad-Name", 16, NULL), KVT_EINVAL);
    KVT_ERR_(kvt_offload_add_tier(s.m, "", 16, NULL), KVT_EINVAL);
    KVT_ERR_(kvt_offload_add_tier(s.m, "x", 1, NULL), KVT_EINVAL);
    KVT_ERR_(kvt_offload_lower_tier_blocks(s.m, 2, 8), KVT_ESTATE);
    KVT_OK_(kvt_offload_add_tier(s.m, "far", 16, NULL));
    KVT_OK_(kvt_offload_lower_tier_blocks(s.m, 2, 8));
    kvt_tier_stats ts;
    KVT_OK_(kvt_offload_get_tier_stats(s.m, 2, &ts));
    assert_string_equal(ts.name, "far"); /* the name survives the resize */
    assert_int_equal(ts.blocks, 7);
    KVT_OK_(kvt_offload_add_tier(s.m, "farther", 16, NULL));
    KVT_ERR_(kvt_offload_add_tier(s.m, "fifth", 16, NULL), KVT_ENOSPC);
    assert_int_equal(kvt_offload_num_tiers(s.m), KVT_MAX_TIERS);
    char buf[65536];
    size_t len;
    KVT_OK_(kvt_offload_prometheus(s.m, buf, sizeof(buf), &len));
    KVT_PROMTOOL_OK(buf);
    assert_non_null(strstr(buf, "kvtier_offload_tier_blocks{tier=\"farther\"} 15\n"));
    sim_fini(&s);
    /* after the first step: refused */
    sim_init3(&s, 64, 32, false, 1, 64, 32);
    sim_req a;
    sim_req_make(&a, "a", 2 * SIM_BS + 1, 1, 2 * SIM_BS + 1, 0);
    sim_store_prompt(&s, &a, 1);
    KVT_ERR_(kvt_offload_add_tier(s.m, "late", 16, NULL), KVT_ESTATE);
    sim_fini(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(write_back_is_findable_on_disk_only_when_every_worker_reported),
        cmocka_unit_test(failed_write_back_is_never_findable_and_releases_its_blocks),
        cmocka_unit_test(disk_hit_is_promoted_before_the_single_gpu_load),
        cmocka_unit_test(failed_promotion_is_never_a_hit_and_its_blocks_come_back_invalid),
        cmocka_unit_test(host_hit_continues_on_disk),
        cmocka_unit_test(finishing_during_a_promotion_releases_everything_when_it_lands),
        cmocka_unit_test(reset_waits_for_write_backs_and_clears_the_disk),
        cmocka_unit_test(three_tiers_need_a_real_disk_size),
        cmocka_unit_test(a_hybrid_prefix_comes_back_from_disk_in_every_group),
        cmocka_unit_test(reports_for_disk_events_never_issued_are_refused),
        cmocka_unit_test(write_backs_go_from_the_host_into_every_tier_behind),
        cmocka_unit_test(a_hit_spans_two_tiers_behind_the_host),
        cmocka_unit_test(a_failed_tier_spoils_only_its_part),
        cmocka_unit_test(finishing_during_promotions_of_two_tiers_waits_for_the_last),
        cmocka_unit_test(tiers_are_added_before_the_first_step_with_distinct_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
