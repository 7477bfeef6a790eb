/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Offload manager behaviours (spec kv-offload §2.5-2.10 and the manager tests of §5), one test
 * per behaviour, named after it.
 */
#include "offload/sim.h"

/* vLLM test_eager_store_and_load_roundtrip */
static void stored_prompt_is_hit_and_loaded_back(void **state)
{
    (void)state;
    sim s;
    sim_init(&s, 64, 32, false, 1, 64);
    sim_req a, b;
    sim_req_make(&a, "a", 4 * SIM_BS + 1, 1, 4 * SIM_BS + 1, 0);
    assert_int_equal(sim_admit(&s, &a, 0), 0);
    sim_schedule(&s, &a, a.n_tokens, false);
    sim_build(&s, false);
    assert_int_equal(s.meta.store_event, KVT_NO_EVENT); /* nothing confirmed yet: one-step lag */
    sim_compute(&s, &a, a.n_tokens);
    sim_schedule(&s, &a, 1, false);
    sim_build(&s, false);
    assert_int_equal(s.meta.store_event, 0);
    assert_int_equal(s.meta.n_stores, 4);
    for (uint32_t i = 0; i < 4; i++)
        assert_int_equal(s.meta.store_gpu_blocks[i], a.blocks[i]);
    assert_false(sim_host_has(&s, &a, 0)); /* not findable before the report */
    sim_report_store(&s, 0, 1);
    for (uint32_t i = 0; i < 4; i++)
        assert_true(sim_host_has(&s, &a, i));
    sim_finish(&s, &a);
    KVT_OK_(kvt_pool_reset_prefix_cache(s.gpu)); /* the GPU forgets: only the host has it */

    sim_req_make(&b, "b", 4 * SIM_BS + 1, 1, 4 * SIM_BS + 1, 0);
    assert_int_equal(sim_admit(&s, &b, UINT32_MAX), 4 * SIM_BS);
    sim_build(&s, false);
    assert_int_equal(s.meta.load_event, 0);
    assert_int_equal(s.meta.n_loads, 4);
    assert_int_equal(s.meta.n_load_events, 1);
    assert_string_equal(s.meta.load_req_ids[0].ptr, "b");
    for (uint32_t i = 0; i < 4; i++)
        assert_int_equal(s.meta.load_gpu_blocks[i], b.blocks[i]);
    assert_true(kvt_offload_has_pending(s.m));
    sim_report_load(&s, &b);
    assert_false(kvt_offload_has_pending(s.m));
    kvt_offload_stats st;
    kvt_offload_get_stats(s.m, &st);
    assert_int_equal(st.host_used_blocks, 0);
    assert_int_equal(st.loads_completed, 4);
    assert_int_equal(st.bytes_loaded, 4000);
    assert_int_equal(st.hit_requests, 1); /* b's match (a's missed) */
    /* the sized read: a shorter struct gets its bytes and nothing past them, a longer one
     * zeros past the library's; the old symbol reads the frozen 448 bytes */
    unsigned char buf[sizeof(st) + 32];
    memset(buf, 0xA5, sizeof(buf));
    assert_int_equal(kvt_offload_stats_read(s.m, (kvt_offload_stats *)buf, 16), sizeof(st));
    assert_memory_equal(buf, &st, 16);
    assert_int_equal(buf[16], 0xA5);
    memset(buf, 0xA5, sizeof(buf));
    assert_int_equal(kvt_offload_stats_read(s.m, (kvt_offload_stats *)buf, sizeof(buf)),
                     sizeof(st));
    assert_memory_equal(buf, &st, sizeof(st));
    for (size_t i = sizeof(st); i < sizeof(buf); i++)
        assert_int_equal(buf[i], 0);
    assert_int_equal(kvt_offload_stats_read(s.m, NULL, 0), sizeof(st));
    memset(buf, 0xA5, sizeof(buf));
    (kvt_offload_get_stats)(s.m, (kvt_offload_stats *)buf);
    assert_memory_equal(buf, &st, KVT_OFFLOAD_STATS_SIZE_0);
    assert_int_equal(buf[KVT_OFFLOAD_STATS_SIZE_0], 0xA5);
    sim_finish(&s, &b);
    assert_int_equal(kvt_pool_num_free(s.gpu), 63);
    sim_fini(&s);
}

/* vLLM test_max_hit_len_cap_drops_last_full_block */
static void exact_multiple_prompt_never_hits_its_last_block(void **state)
{
    (void)state;
    sim s;
    sim_init(&s, 64, 32, false, 1, 64);
    sim_req a, b;
    sim_req_make(&a, "a", 4 * SIM_BS, 1, 4 * SIM_BS, 0);
    sim_store_prompt(&s, &a, 1);
    KVT_OK_(kvt_pool_reset_prefix_cache(s.gpu));
    sim_req_make(&b, "b", 4 * SIM_BS, 1, 4 * SIM_BS, 0);
    assert_int_equal(sim_admit(&s, &b, UINT32_MAX), 3 * SIM_BS);
    sim_fini(&s);
}

/* vLLM test_eager_duplicate_store_skipped */
static void eager_skips_blocks_already_in_the_host_tier(void **state)
{
    (void)state;
    sim s;
    sim_init(&s, 64, 32, false, 1, 64);
    sim_req a, b;
    sim_req_make(&a, "a", 3 * SIM_BS + 1, 1, 3 * SIM_BS + 1, 0);
    sim_store_prompt(&s, &a, 1);
    KVT_OK_(kvt_pool_reset_prefix_cache(s.gpu));
    sim_req_make(&b, "b", 3 * SIM_BS + 1, 1, 3 * SIM_BS + 1, 0);
    sim_admit(&s, &b, 0); /* declines the hit: recomputes */
    sim_schedule(&s, &b, b.n_tokens, false);
    sim_build(&s, false);
    sim_compute(&s, &b, b.n_tokens);
    uint32_t before = kvt_pool_num_free(kvt_offload_host_pool(s.m));
    sim_schedule(&s, &b, 1, false);
    sim_build(&s, false);
    assert_int_equal(s.meta.store_event, KVT_NO_EVENT);
    assert_int_equal(kvt_pool_num_free(kvt_offload_host_pool(s.m)), before);
    kvt_offload_stats st;
    kvt_offload_get_stats(s.m, &st);
    assert_int_equal(st.store_skipped_cached, 3);
    sim_fini(&s);
}

/* vLLM test_eager_in_flight_store_dedup_across_steps */
static void blocks_in_flight_are_not_stored_twice(void **state)
{
    (void)state;
    sim s;
    sim_init(&s, 64, 32, false, 1, 64);
    sim_req a, b;
    sim_req_make(&a, "a", 2 * SIM_BS + 1, 1, 2 * SIM_BS + 1, 0);
    sim_admit_and_store(&s, &a);
    int64_t ev = s.meta.store_event;
    assert_int_equal(s.meta.n_stores, 2);
    /* b shares a's GPU blocks (a GPU prefix hit) while a's store is in flight */
    sim_req_make(&b, "b", 2 * SIM_BS + 5, 1, 2 * SIM_BS + 1, 1);
    sim_admit(&s, &b, 0);
    assert_int_equal(b.blocks[0], a.blocks[0]);
    sim_compute(&s, &b, b.n_tokens);
    uint32_t before = kvt_pool_num_free(kvt_offload_host_pool(s.m));
    sim_schedule(&s, &b, 1, false);
    sim_schedule(&s, &a, 1, false); /* and a again, one step later */
    sim_build(&s, false);
    assert_int_equal(s.meta.store_event, KVT_NO_EVENT);
    assert_int_equal(kvt_pool_num_free(kvt_offload_host_pool(s.m)), before);
    sim_report_store(&s, ev, 1);
    assert_true(sim_host_has(&s, &a, 1));
    kvt_offload_stats st;
    kvt_offload_get_stats(s.m, &st);
    assert_int_equal(st.store_skipped_in_flight, 2);
    assert_int_equal(st.pending_store_blocks, 0);
    sim_fini(&s);
}

/* vLLM test_lru_eviction_order: 5 host blocks (4 usable), storing c evicts a, keeps b and c. */
static void host_tier_evicts_the_oldest_request_first(void **state)
{
    (void)state;
    sim s;
    sim_init(&s, 64, 5, false, 1, 64);
    sim_req a, b, c;
    sim_req_make(&a, "a", 2 * SIM_BS + 1, 1, 2 * SIM_BS + 1, 0);
    sim_req_make(&b, "b", 2 * SIM_BS + 1, 2, 2 * SIM_BS + 1, 0);
    sim_req_make(&c, "c", 2 * SIM_BS + 1, 3, 2 * SIM_BS + 1, 0);
    sim_store_prompt(&s, &a, 1);
    sim_store_prompt(&s, &b, 1);
    sim_store_prompt(&s, &c, 1);
    assert_false(sim_host_has(&s, &a, 0) || sim_host_has(&s, &a, 1));
    assert_true(sim_host_has(&s, &b, 0) && sim_host_has(&s, &b, 1));
    assert_true(sim_host_has(&s, &c, 0) && sim_host_has(&s, &c, 1));
    kvt_offload_stats st;
    kvt_offload_get_stats(s.m, &st);
    assert_int_equal(st.host_evictions, 2);
    sim_fini(&s);
}

/* vLLM test_touched_blocks_survive_eviction: a hit (load) refreshes a's host blocks, so c's
 * store evicts b instead. */
static void hit_blocks_move_to_the_back_of_the_host_lru(void **state)
{
    (void)state;
    sim s;
    sim_init(&s, 64, 5, false, 1, 64);
    sim_req a, b, c, a2;
    sim_req_make(&a, "a", 2 * SIM_BS + 1, 1, 2 * SIM_BS + 1, 0);
    sim_req_make(&b, "b", 2 * SIM_BS + 1, 2, 2 * SIM_BS + 1, 0);
    sim_req_make(&c, "c", 2 * SIM_BS + 1, 3, 2 * SIM_BS + 1, 0);
    sim_store_prompt(&s, &a, 1);
    sim_store_prompt(&s, &b, 1);
    KVT_OK_(kvt_pool_reset_prefix_cache(s.gpu));
    sim_req_make(&a2, "a2", 2 * SIM_BS + 1, 1, 2 * SIM_BS + 1, 0);
    assert_int_equal(sim_admit(&s, &a2, UINT32_MAX), 2 * SIM_BS);
    sim_build(&s, false);
    sim_report_load(&s, &a2);
    sim_finish(&s, &a2);
    KVT_OK_(kvt_pool_reset_prefix_cache(s.gpu));
    sim_store_prompt(&s, &c, 1);
    assert_true(sim_host_has(&s, &a, 0) && sim_host_has(&s, &a, 1));
    assert_false(sim_host_has(&s, &b, 0) || sim_host_has(&s, &b, 1));
    sim_fini(&s);
}

/* vLLM test_inflight_finish_deferred_cleanup */
static void finishing_during_a_load_defers_cleanup_until_it_completes(void **state)
{
    (void)state;
    sim s;
    sim_init(&s, 64, 32, false, 1, 64);
    sim_req a, b;
    sim_req_make(&a, "a", 3 * SIM_BS + 1, 1, 3 * SIM_BS + 1, 0);
    sim_store_prompt(&s, &a, 1);
    KVT_OK_(kvt_pool_reset_prefix_cache(s.gpu));
    sim_req_make(&b, "b", 3 * SIM_BS + 1, 1, 3 * SIM_BS + 1, 0);
    sim_admit(&s, &b, UINT32_MAX);
    sim_build(&s, false);
    uint32_t dst = b.blocks[0];
    sim_finish(&s, &b); /* aborted while loading: the engine frees its blocks at once */
    assert_int_equal(sim_gpu_ref(&s, dst), 1); /* the load still holds the destination */
    kvt_offload_stats st;
    kvt_offload_get_stats(s.m, &st);
    assert_int_equal(st.host_used_blocks, 3);
    assert_int_equal(st.requests, 1);
    sim_report_load(&s, &b);
    assert_int_equal(sim_gpu_ref(&s, dst), 0);
    kvt_offload_get_stats(s.m, &st);
    assert_int_equal(st.host_used_blocks, 0);
    assert_int_equal(st.requests, 0);
    sim_fini(&s);
}

/* vLLM test_eager_store_preemption_cleanup. vLLM keeps the finished request's record until its
 * stores complete; kvtier frees the record at once (the store event holds the references),
 * which keeps the request table for requests that still need it. */
static void finishing_during_a_store_keeps_the_blocks_pinned_until_it_completes(void **state)
{
    (void)state;
    sim s;
    sim_init(&s, 64, 32, false, 1, 64);
    sim_req a;
    sim_req_make(&a, "a", 3 * SIM_BS + 1, 1, 3 * SIM_BS + 1, 0);
    sim_admit_and_store(&s, &a);
    int64_t ev = s.meta.store_event;
    uint32_t src = a.blocks[0];
    sim_finish(&s, &a);
    assert_int_equal(sim_gpu_ref(&s, src), 1); /* pinned by the store */
    kvt_offload_stats st;
    kvt_offload_get_stats(s.m, &st);
    assert_int_equal(st.requests, 0);
    assert_true(kvt_offload_has_pending(s.m));
    sim_report_store(&s, ev, 1);
    assert_true(sim_host_has(&s, &a, 2));
    assert_int_equal(sim_gpu_ref(&s, src), 0);
    assert_false(kvt_offload_has_pending(s.m));
    sim_fini(&s);
}

/* vLLM test_chunked_prefill_reads_live_block_ids */
static void chunked_prefill_stores_only_the_new_blocks(void **state)
{
    (void)state;
    sim s;
    sim_init(&s, 64, 32, false, 1, 64);
    sim_req a;
    sim_req_make(&a, "a", 4 * SIM_BS + 1, 1, 4 * SIM_BS + 1, 0);
    sim_admit(&s, &a, 0);
    uint32_t all = a.n_blocks;
    a.n_blocks = 2; /* the engine's block table grows chunk by chunk */
    sim_schedule(&s, &a, 2 * SIM_BS, false);
    sim_build(&s, false);
    sim_compute(&s, &a, 2 * SIM_BS);
    a.n_blocks = all;
    sim_schedule(&s, &a, 2 * SIM_BS + 1, false);
    sim_build(&s, false);
    assert_int_equal(s.meta.n_stores, 2); /* chunk 1 */
    int64_t ev1 = s.meta.store_event;
    sim_compute(&s, &a, a.n_tokens);
    sim_schedule(&s, &a, 1, false);
    sim_build(&s, false);
    assert_int_equal(s.meta.n_stores, 2); /* only chunk 2's blocks */
    assert_int_equal(s.meta.store_gpu_blocks[0], a.blocks[2]);
    assert_int_equal(s.meta.store_gpu_blocks[1], a.blocks[3]);
    kvt_offload_stats st;
    kvt_offload_get_stats(s.m, &st);
    assert_int_equal(st.requests, 1);
    sim_report_store(&s, ev1, 1);
    sim_report_store(&s, s.meta.store_event, 1);
    sim_fini(&s);
}

/* vLLM test_partial_gpu_prefix_plus_cpu_load: GPU hit 2 blocks, host hit 4 more offered, the
 * engine accepts 2: the load targets exactly GPU blocks 2 and 3. */
static void engine_accepting_fewer_tokens_loads_only_the_accepted_blocks(void **state)
{
    (void)state;
    sim s;
    sim_init(&s, 64, 32, false, 1, 64);
    sim_req a, b;
    sim_req_make(&a, "a", 6 * SIM_BS + 1, 1, 6 * SIM_BS + 1, 0);
    sim_store_prompt(&s, &a, 1);
    /* the GPU keeps only a's first two blocks */
    KVT_OK_(kvt_pool_reset_prefix_cache(s.gpu));
    uint32_t two[2];
    KVT_OK_(kvt_pool_alloc(s.gpu, 2, two));
    KVT_OK_(kvt_pool_insert(s.gpu, two[0], a.hashes, 0, SIM_BS));
    KVT_OK_(kvt_pool_insert(s.gpu, two[1], a.hashes + KVT_BLOCK_HASH_LEN, 0, SIM_BS));
    KVT_OK_(kvt_pool_free(s.gpu, two, 2));
    sim_req_make(&b, "b", 6 * SIM_BS + 1, 1, 6 * SIM_BS + 1, 0);
    uint32_t offered = sim_admit(&s, &b, 2 * SIM_BS);
    assert_int_equal(b.gpu_hit, 2 * SIM_BS);
    assert_int_equal(offered, 4 * SIM_BS);
    sim_build(&s, false);
    assert_int_equal(s.meta.n_loads, 2);
    assert_int_equal(s.meta.load_gpu_blocks[0], b.blocks[2]);
    assert_int_equal(s.meta.load_gpu_blocks[1], b.blocks[3]);
    uint32_t hb;
    assert_int_equal(
        kvt_pool_lookup(kvt_offload_host_pool(s.m), a.hashes + 2 * KVT_BLOCK_HASH_LEN, 0, &hb), 1);
    assert_int_equal(s.meta.load_cpu_blocks[0], hb);
    kvt_offload_stats st;
    kvt_offload_get_stats(s.m, &st);
    assert_int_equal(st.host_used_blocks, 2); /* the declined part of the hit is unpinned */
    sim_report_load(&s, &b);
    sim_fini(&s);
}

/* vLLM test_toctou_cpu_hit_evicted_between_phases_no_crash (#39702) */
static void hit_survives_eviction_pressure_between_match_and_allocation(void **state)
{
    (void)state;
    sim s;
    sim_init(&s, 64, 5, false, 1, 64);
    sim_req a, b, c, d;
    sim_req_make(&a, "a", 2 * SIM_BS + 1, 1, 2 * SIM_BS + 1, 0);
    sim_store_prompt(&s, &a, 1);
    KVT_OK_(kvt_pool_reset_prefix_cache(s.gpu));
    sim_req_make(&b, "b", 2 * SIM_BS + 1, 1, 2 * SIM_BS + 1, 0);
    uint32_t hit;
    KVT_OK_(kvt_offload_match(s.m, "b", 1, b.hashes, b.n_hashes, b.n_tokens, 0, &hit));
    assert_int_equal(hit, 2 * SIM_BS);
    /* other requests fill the host tier before b is allocated */
    sim_req_make(&c, "c", 2 * SIM_BS + 1, 2, 2 * SIM_BS + 1, 0);
    sim_req_make(&d, "d", 2 * SIM_BS + 1, 3, 2 * SIM_BS + 1, 0);
    sim_store_prompt(&s, &c, 1);
    sim_store_prompt(&s, &d, 1); /* evicts c: a's pinned blocks cannot be taken */
    assert_true(sim_host_has(&s, &a, 0) && sim_host_has(&s, &a, 1));
    assert_false(sim_host_has(&s, &c, 0) || sim_host_has(&s, &c, 1));
    assert_true(sim_host_has(&s, &d, 0) && sim_host_has(&s, &d, 1));
    b.n_blocks = 3;
    KVT_OK_(kvt_pool_alloc(s.gpu, 3, b.blocks));
    const uint32_t *one[1] = {b.blocks};
    uint32_t nb[1] = {3};
    KVT_OK_(kvt_offload_after_alloc(s.m, "b", 1, one, nb, hit));
    sim_build(&s, false);
    assert_int_equal(s.meta.n_loads, 2);
    sim_report_load(&s, &b);
    sim_fini(&s);
}

static void a_second_match_releases_the_first_pin(void **state)
{
    (void)state;
    sim s;
    sim_init(&s, 64, 32, false, 1, 64);
    sim_req a, b;
    sim_req_make(&a, "a", 3 * SIM_BS + 1, 1, 3 * SIM_BS + 1, 0);
    sim_store_prompt(&s, &a, 1);
    sim_req_make(&b, "b", 3 * SIM_BS + 1, 1, 3 * SIM_BS + 1, 0);
    uint32_t hit;
    kvt_offload_stats st;
    for (int i = 0; i < 3; i++) {
        KVT_OK_(kvt_offload_match(s.m, "b", 1, b.hashes, b.n_hashes, b.n_tokens, 0, &hit));
        kvt_offload_get_stats(s.m, &st);
        assert_int_equal(st.host_used_blocks, 3);
    }
    KVT_OK_(kvt_offload_request_finished(s.m, "b", 1, NULL, NULL, 0)); /* never allocated */
    kvt_offload_get_stats(s.m, &st);
    assert_int_equal(st.host_used_blocks, 0);
    assert_int_equal(st.requests, 0);
    sim_fini(&s);
}

/* Two KV-cache groups over a kvt_pool of 64 blocks: full attention (group 0) and group 1 of
 * the given kind, block size and window; a manager with 32 host blocks. */
typedef struct sim2 {
    kvt_pool *gpu;
    kvt_offload *m;
    kvt_offload_meta meta;
    kvt_offload_worker_meta wm;
} sim2;

/* Full attention of fa_bs tokens per block and a second group; lazy or eager stores. */
/* full attention of fa_bs tokens per block beside a group of `kind`, under decode context
 * parallelism of dcp ranks (0: none; fa_bs is the effective size) */
static void sim2_init_cp(sim2 *t, uint32_t fa_bs, uint32_t kind, uint32_t block_size,
                         uint32_t window, bool lazy, uint32_t dcp)
{
    kvt_pool_config pc;
    kvt_pool_config_init(&pc);
    pc.num_blocks = 64;
    pc.n_groups = 2;
    pc.groups[0].block_size = fa_bs;
    pc.groups[1].kind = kind;
    pc.groups[1].block_size = block_size;
    pc.groups[1].sliding_window = window;
    pc.dcp_world_size = dcp;
    KVT_OK_(kvt_pool_create(&pc, &t->gpu));
    kvt_offload_config oc;
    kvt_offload_config_init(&oc);
    oc.host_blocks = 32;
    oc.lazy = lazy;
    KVT_OK_(kvt_offload_create(&oc, t->gpu, &t->m));
    kvt_offload_meta_init(&t->meta);
    kvt_offload_worker_meta_init(&t->wm);
}

static void sim2_init_ex(sim2 *t, uint32_t fa_bs, uint32_t kind, uint32_t block_size,
                         uint32_t window, bool lazy)
{
    sim2_init_cp(t, fa_bs, kind, block_size, window, lazy, 0);
}

static void sim2_init(sim2 *t, uint32_t kind, uint32_t block_size, uint32_t window)
{
    sim2_init_ex(t, SIM_BS, kind, block_size, window, false);
}

/* The worker reports the last build_meta's store event done. */
static void sim2_report_store(sim2 *t)
{
    kvt_offload_worker_meta_clear(&t->wm);
    KVT_OK_(kvt_offload_worker_meta_add(&t->wm, t->meta.store_event, 1));
    KVT_OK_(kvt_offload_apply_output(t->m, NULL, 0, &t->wm));
}

static void sim2_fini(sim2 *t)
{
    kvt_offload_meta_release(&t->meta);
    kvt_offload_worker_meta_release(&t->wm);
    kvt_offload_destroy(t->m);
    kvt_pool_destroy(t->gpu);
}

/* vLLM test_multi_group_null_blocks_skipped: full attention + sliding window. */
static void null_blocks_never_appear_in_transfers(void **state)
{
    (void)state;
    sim2 t;
    sim2_init(&t, KVT_GROUP_SLIDING, SIM_BS, SIM_BS + 1); /* a window of one block */
    kvt_pool *gpu = t.gpu;
    kvt_offload *m = t.m;
    sim_req r;
    sim_req_make(&r, "r", 3 * SIM_BS + 1, 1, 3 * SIM_BS + 1, 0);
    uint32_t fa[4], sw[4];
    KVT_OK_(kvt_pool_alloc(gpu, 4, fa));
    KVT_OK_(kvt_pool_alloc(gpu, 2, sw + 2));
    sw[0] = sw[1] = KVT_NULL_BLOCK; /* outside the window */
    for (uint32_t j = 0; j < 3; j++) {
        KVT_OK_(kvt_pool_insert(gpu, fa[j], r.hashes + j * KVT_BLOCK_HASH_LEN, 0, SIM_BS));
        if (j == 2)
            KVT_OK_(kvt_pool_insert(gpu, sw[j], r.hashes + j * KVT_BLOCK_HASH_LEN, 1, SIM_BS));
    }
    const uint32_t *tab[2] = {fa, sw};
    uint32_t nb[2] = {4, 4};
    uint32_t hit;
    KVT_OK_(kvt_offload_match(m, "r", 1, r.hashes, r.n_hashes, r.n_tokens, 0, &hit));
    KVT_OK_(kvt_offload_after_alloc(m, "r", 1, tab, nb, 0));
    KVT_OK_(kvt_offload_schedule(m, "r", 1, tab, nb, r.n_tokens, 1, false));
    kvt_offload_meta *meta = &t.meta;
    KVT_OK_(kvt_offload_build_meta(m, false, meta));
    assert_int_equal(meta->n_stores, 4); /* 3 full-attention blocks + the hashed window block */
    for (uint32_t i = 0; i < meta->n_stores; i++)
        assert_int_not_equal(meta->store_gpu_blocks[i], KVT_NULL_BLOCK);
    sim2_report_store(&t);
    KVT_OK_(kvt_offload_request_finished(m, "r", 1, tab, nb, r.n_tokens));
    /* a second request hits both groups; null positions are not loaded */
    KVT_OK_(kvt_pool_free(gpu, fa, 4));
    KVT_OK_(kvt_pool_free(gpu, sw + 2, 2));
    KVT_OK_(kvt_pool_reset_prefix_cache(gpu));
    KVT_OK_(kvt_offload_match(m, "q", 1, r.hashes, r.n_hashes, r.n_tokens, 0, &hit));
    assert_int_equal(hit, 3 * SIM_BS);
    KVT_OK_(kvt_pool_alloc(gpu, 4, fa));
    KVT_OK_(kvt_pool_alloc(gpu, 2, sw + 2));
    /* two blocks of the three: the window needs block 1, which the hit left out */
    KVT_ERR_(kvt_offload_after_alloc(m, "q", 1, tab, nb, 2 * SIM_BS), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "take the whole hit or none"));
    KVT_OK_(kvt_offload_after_alloc(m, "q", 1, tab, nb, hit));
    KVT_OK_(kvt_offload_build_meta(m, false, meta));
    assert_int_equal(meta->n_loads, 4); /* 3 + the one window block */
    for (uint32_t i = 0; i < meta->n_loads; i++)
        assert_int_not_equal(meta->load_gpu_blocks[i], KVT_NULL_BLOCK);
    kvt_str q = {"q", 1};
    KVT_OK_(kvt_offload_apply_output(m, &q, 1, NULL));
    sim2_fini(&t);
}

/* #41704 / #53498: blocks confirmed in the request's last step are stored by the final
 * flush in request_finished. */
static void final_flush_stores_the_last_confirmed_blocks(void **state)
{
    (void)state;
    sim s;
    sim_init(&s, 64, 32, false, 1, 64);
    sim_req a;
    sim_req_make(&a, "a", 5 * SIM_BS + 1, 1, 5 * SIM_BS + 1, 0);
    sim_admit(&s, &a, 0);
    sim_schedule(&s, &a, a.n_tokens, false);
    sim_build(&s, false);
    sim_compute(&s, &a, a.n_tokens); /* the only step: prefill, then finished */
    sim_finish(&s, &a);
    sim_build(&s, false);
    assert_int_equal(s.meta.n_stores, 5);
    sim_report_store(&s, s.meta.store_event, 1);
    for (uint32_t i = 0; i < 5; i++)
        assert_true(sim_host_has(&s, &a, i));
    assert_int_equal(kvt_pool_num_free(s.gpu), 63);
    sim_fini(&s);
}

static void store_completes_only_when_every_worker_reported(void **state)
{
    (void)state;
    sim s;
    sim_init(&s, 64, 32, false, 3, 64);
    sim_req a;
    sim_req_make(&a, "a", 2 * SIM_BS + 1, 1, 2 * SIM_BS + 1, 0);
    sim_admit_and_store(&s, &a);
    int64_t ev = s.meta.store_event;
    sim_report_store(&s, ev, 1);
    assert_false(sim_host_has(&s, &a, 0));
    sim_report_store(&s, ev, 1); /* a later step */
    assert_false(sim_host_has(&s, &a, 0));
    sim_report_store(&s, ev, 1);
    assert_true(sim_host_has(&s, &a, 0) && sim_host_has(&s, &a, 1));
    sim_report_store(&s, ev, 1); /* a stray extra report is ignored and counted */
    kvt_offload_stats st;
    kvt_offload_get_stats(s.m, &st);
    assert_int_equal(st.stale_reports, 1);
    assert_int_equal(st.stores_completed, 2);
    sim_finish(&s, &a);
    sim_fini(&s);
}

/* A store event one worker could not write (a disk I/O error) completes — its references
 * go — but its blocks never become findable, even though the other ranks wrote theirs. */
static void failed_store_is_never_findable_and_releases_its_blocks(void **state)
{
    (void)state;
    sim s;
    sim_init(&s, 64, 32, false, 2, 64);
    sim_req a;
    sim_req_make(&a, "a", 2 * SIM_BS + 1, 1, 2 * SIM_BS + 1, 0);
    sim_admit_and_store(&s, &a);
    int64_t ev = s.meta.store_event;
    sim_finish(&s, &a);
    sim_report_store(&s, ev, 1); /* rank 0: fine */
    kvt_offload_worker_meta_clear(&s.wm);
    KVT_OK_(kvt_offload_worker_meta_add(&s.wm, ev, 1)); /* rank 1: done, with a failure */
    KVT_OK_(kvt_offload_worker_meta_add_failed(&s.wm, ev));
    KVT_OK_(kvt_offload_apply_output(s.m, NULL, 0, &s.wm));
    assert_false(sim_host_has(&s, &a, 0));
    assert_false(sim_host_has(&s, &a, 1));
    kvt_offload_stats st;
    kvt_offload_get_stats(s.m, &st);
    assert_int_equal(st.stores_failed, 2);
    assert_int_equal(st.stores_completed, 0);
    assert_int_equal(st.host_used_blocks, 0);
    assert_int_equal(st.store_events_in_flight, 0);
    assert_false(kvt_offload_has_pending(s.m));
    assert_int_equal(kvt_pool_num_free(s.gpu), 63); /* GPU blocks released too */
    /* the next request with the same prefix stores it again, successfully */
    sim_req b;
    sim_req_make(&b, "b", 2 * SIM_BS + 1, 1, 2 * SIM_BS + 1, 0);
    sim_admit_and_store(&s, &b);
    sim_report_store(&s, s.meta.store_event, 2);
    assert_true(sim_host_has(&s, &b, 0) && sim_host_has(&s, &b, 1));
    sim_finish(&s, &b);
    sim_fini(&s);
}

/* A worker that could not read some of a load's sources (a disk that is the tier, an I/O
 * error) names them with its report: their keys are dropped, counted and evented, so the next
 * request with the prompt misses them instead of failing on them again (issue 37; vLLM resets
 * the failed request's slots). A source out of range is refused before anything changes. */
static void a_failed_load_drops_its_sources_keys(void **state)
{
    (void)state;
    sim s;
    sim_init_ev(&s, 64, 32, false, 1, 64, 0, 64);
    sim_req a, b, c;
    sim_req_make(&a, "a", 4 * SIM_BS + 1, 1, 4 * SIM_BS + 1, 0);
    sim_admit_and_store(&s, &a);
    sim_report_store(&s, s.meta.store_event, 1);
    sim_finish(&s, &a);
    KVT_OK_(kvt_pool_reset_prefix_cache(s.gpu));
    kvt_offload_event ev[64];
    (void)kvt_offload_take_events(s.m, ev, 64, NULL);
    sim_req_make(&b, "b", 4 * SIM_BS + 1, 1, 4 * SIM_BS + 1, 0);
    assert_int_equal(sim_admit(&s, &b, UINT32_MAX), 4 * SIM_BS);
    sim_build(&s, false);
    assert_int_equal(s.meta.n_loads, 4);
    uint32_t bad = s.meta.load_cpu_blocks[2];
    kvt_offload_worker_meta_clear(&s.wm);
    KVT_OK_(kvt_offload_worker_meta_add_failed_load(&s.wm, 10000)); /* not a host block */
    kvt_str id = {"b", 1};
    KVT_ERR_(kvt_offload_apply_output(s.m, &id, 1, &s.wm), KVT_ERANGE);
    assert_true(sim_host_has(&s, &a, 2));
    kvt_offload_worker_meta_clear(&s.wm);
    KVT_OK_(kvt_offload_worker_meta_add_failed_load(&s.wm, bad));
    KVT_OK_(kvt_offload_apply_output(s.m, &id, 1, &s.wm));
    assert_false(sim_host_has(&s, &a, 2));
    assert_true(sim_host_has(&s, &a, 1));
    kvt_tier_stats ts;
    KVT_OK_(kvt_offload_get_tier_stats(s.m, 0, &ts));
    assert_int_equal(ts.loads_failed, 1);
    uint32_t n = kvt_offload_take_events(s.m, ev, 64, NULL), removed = 0;
    for (uint32_t i = 0; i < n; i++)
        removed += ev[i].type == KVT_OFFLOAD_EV_REMOVED && ev[i].block == bad;
    assert_int_equal(removed, 1);
    KVT_OK_(kvt_offload_apply_output(s.m, NULL, 0, &s.wm)); /* reported again: once */
    KVT_OK_(kvt_offload_get_tier_stats(s.m, 0, &ts));
    assert_int_equal(ts.loads_failed, 1);
    sim_finish(&s, &b);
    KVT_OK_(kvt_pool_reset_prefix_cache(s.gpu));
    sim_req_make(&c, "c", 4 * SIM_BS + 1, 1, 4 * SIM_BS + 1, 0);
    assert_int_equal(sim_admit(&s, &c, UINT32_MAX), 2 * SIM_BS); /* up to the bad block */
    sim_fini(&s);
}

/* #53532: secondary keys of a GPU block are registered on its host copy through the pool. */
static void secondary_keys_make_the_host_copy_findable_at_every_granularity(void **state)
{
    (void)state;
    sim s;
    sim_init(&s, 64, 32, false, 1, 64);
    sim_req a;
    sim_req_make(&a, "a", 2 * SIM_BS + 1, 1, 2 * SIM_BS + 1, 0);
    sim_admit(&s, &a, 0);
    sim_compute(&s, &a, a.n_tokens);
    uint8_t sec[KVT_BLOCK_HASH_LEN] = {9, 9, 9};
    KVT_OK_(kvt_pool_insert(s.gpu, a.blocks[0], sec, 0, 8));
    sim_schedule(&s, &a, 1, false);
    sim_build(&s, false);
    sim_report_store(&s, s.meta.store_event, 1);
    uint32_t h1, h2;
    assert_int_equal(kvt_pool_lookup(kvt_offload_host_pool(s.m), a.hashes, 0, &h1), 1);
    assert_int_equal(kvt_pool_lookup(kvt_offload_host_pool(s.m), sec, 0, &h2), 1);
    assert_int_equal(h1, h2);
    kvt_pool_key keys[4];
    uint32_t n;
    KVT_OK_(kvt_pool_block_keys(kvt_offload_host_pool(s.m), h1, keys, 4, &n));
    assert_int_equal(n, 2);
    assert_int_equal(keys[1].num_tokens, 8);
    kvt_offload_event ev[16];
    uint32_t ne = kvt_offload_take_events(s.m, ev, 16, NULL);
    uint32_t stored = 0;
    for (uint32_t i = 0; i < ne; i++)
        stored += ev[i].type == KVT_OFFLOAD_EV_STORED;
    assert_int_equal(stored, 3); /* 2 primary + 1 secondary, all at completion */
    sim_finish(&s, &a);
    sim_fini(&s);
}

/* Beyond vLLM's FIXME: a block the host tier evicts while it is still in use on the GPU is
 * stored again. */
static void block_evicted_from_host_while_in_use_on_gpu_is_stored_again(void **state)
{
    (void)state;
    sim s;
    sim_init(&s, 64, 3, false, 1, 64); /* 2 usable host blocks */
    sim_req a, b;
    sim_req_make(&a, "a", 2 * SIM_BS + 1, 1, 2 * SIM_BS + 1, 0);
    sim_admit_and_store(&s, &a);
    sim_report_store(&s, s.meta.store_event, 1); /* a stays running, its blocks on the GPU */
    sim_req_make(&b, "b", 2 * SIM_BS + 1, 2, 2 * SIM_BS + 1, 0);
    sim_store_prompt(&s, &b, 1); /* evicts a's two host copies */
    assert_false(sim_host_has(&s, &a, 0) || sim_host_has(&s, &a, 1));
    sim_schedule(&s, &a, 1, false);
    sim_build(&s, false); /* the re-store goes out with the next event */
    assert_int_equal(s.meta.n_stores, 2);
    assert_int_equal(s.meta.store_gpu_blocks[0], a.blocks[0]);
    sim_report_store(&s, s.meta.store_event, 1);
    assert_true(sim_host_has(&s, &a, 0) && sim_host_has(&s, &a, 1));
    kvt_offload_stats st;
    kvt_offload_get_stats(s.m, &st);
    assert_int_equal(st.restores, 2);
    sim_finish(&s, &a);
    sim_fini(&s);
}

/* A re-store evicts only cold blocks: with more blocks in use on the GPU than the host tier
 * holds, re-storing one would evict another in use, whose own re-store would evict the next,
 * step after step (found by the soak). The candidate is dropped and counted instead. */
static void re_store_never_evicts_a_block_in_use_on_the_gpu(void **state)
{
    (void)state;
    sim s;
    sim_init(&s, 64, 3, false, 1, 64); /* 2 usable host blocks */
    sim_req a, c;
    sim_req_make(&a, "a", 2 * SIM_BS + 1, 1, 2 * SIM_BS + 1, 0);
    sim_admit_and_store(&s, &a);
    sim_report_store(&s, s.meta.store_event, 1);
    sim_req_make(&c, "c", 2 * SIM_BS + 1, 2, 2 * SIM_BS + 1, 0);
    sim_admit_and_store(&s, &c); /* c keeps running; its store evicts a's two host copies */
    sim_report_store(&s, s.meta.store_event, 1);
    assert_false(sim_host_has(&s, &a, 0) || sim_host_has(&s, &a, 1));
    assert_true(sim_host_has(&s, &c, 0) && sim_host_has(&s, &c, 1));
    for (int step = 0; step < 3; step++) { /* dropped, not queued for ever */
        sim_schedule(&s, &a, 1, false);
        sim_schedule(&s, &c, 1, false);
        sim_build(&s, false);
        assert_int_equal(s.meta.n_stores, 0);
        assert_int_equal(s.meta.store_event, KVT_NO_EVENT);
    }
    assert_true(sim_host_has(&s, &c, 0) && sim_host_has(&s, &c, 1));
    kvt_offload_stats st;
    kvt_offload_get_stats(s.m, &st);
    assert_int_equal(st.restores, 0);
    assert_int_equal(st.restores_dropped_hot, 2);
    sim_finish(&s, &a);
    sim_finish(&s, &c);
    sim_fini(&s);
}

/* vLLM test_lazy_store_and_load_roundtrip: only hashed blocks nearing eviction are stored. */
static void lazy_mode_stores_hashed_blocks_at_the_gpu_lru_head(void **state)
{
    (void)state;
    sim s;
    /* max_batched 32 -> target_free = 2 x ceil(32/16) = 4 blocks watched at the LRU head */
    sim_init(&s, 16, 32, true, 1, 32);
    sim_req a, f;
    sim_req_make(&a, "a", 2 * SIM_BS + 1, 1, 2 * SIM_BS + 1, 0);
    sim_admit(&s, &a, 0);
    sim_compute(&s, &a, a.n_tokens);
    sim_schedule(&s, &a, 1, false); /* no-op in lazy mode */
    sim_build(&s, false);
    assert_int_equal(s.meta.store_event, KVT_NO_EVENT);
    uint32_t a0 = a.blocks[0], a1 = a.blocks[1];
    sim_finish(&s, &a); /* a's blocks go to the GPU free queue (tail first) */
    /* fillers take the free blocks ahead of a's so a's drift to the head */
    sim_req_make(&f, "f", 12 * SIM_BS, 5, 0, 5);
    f.n_blocks = 12;
    KVT_OK_(kvt_pool_alloc(s.gpu, 12, f.blocks));
    sim_build(&s, false);
    assert_int_equal(s.meta.n_stores, 2);
    bool seen0 = false, seen1 = false;
    for (uint32_t i = 0; i < 2; i++) {
        seen0 |= s.meta.store_gpu_blocks[i] == a0;
        seen1 |= s.meta.store_gpu_blocks[i] == a1;
    }
    assert_true(seen0 && seen1);
    sim_report_store(&s, s.meta.store_event, 1);
    assert_true(sim_host_has(&s, &a, 0) && sim_host_has(&s, &a, 1));
    sim_build(&s, false);
    assert_int_equal(s.meta.store_event, KVT_NO_EVENT); /* lazy dedup: already cached */
    KVT_OK_(kvt_pool_free(s.gpu, f.blocks, 12));
    sim_fini(&s);
}

/* Spec §2.14: a GPU hit that ends inside a scheduler block, and a request that must not reuse
 * cached prefixes, get hit 0 (no lookup, counted), never an error; a retry drops the earlier
 * pin; the skipping request's own blocks are still stored. */
static void misaligned_gpu_hit_and_prefix_skip_are_misses(void **state)
{
    (void)state;
    sim s;
    sim_init(&s, 64, 32, false, 1, 64);
    sim_req a, b;
    sim_req_make(&a, "a", 2 * SIM_BS + 1, 1, 2 * SIM_BS + 1, 0);
    sim_store_prompt(&s, &a, 1);
    KVT_OK_(kvt_pool_reset_prefix_cache(s.gpu));
    sim_req_make(&b, "b", 2 * SIM_BS + 1, 1, 2 * SIM_BS + 1, 0);
    kvt_offload_stats st;
    kvt_offload_get_stats(s.m, &st);
    uint64_t lookups = st.lookups; /* a's own match */
    uint32_t hit = 99;
    KVT_OK_(kvt_offload_match(s.m, "b", 1, b.hashes, b.n_hashes, b.n_tokens, 5, &hit));
    assert_int_equal(hit, 0);
    KVT_OK_(kvt_offload_match(s.m, "b", 1, b.hashes, b.n_hashes, b.n_tokens, SIM_BS + 3, &hit));
    assert_int_equal(hit, 0);
    kvt_offload_get_stats(s.m, &st);
    assert_int_equal(st.lookups_misaligned, 2);
    assert_int_equal(st.lookups, lookups);
    /* aligned: the full hit, pinned */
    KVT_OK_(kvt_offload_match(s.m, "b", 1, b.hashes, b.n_hashes, b.n_tokens, 0, &hit));
    assert_int_equal(hit, 2 * SIM_BS);
    kvt_offload_get_stats(s.m, &st);
    assert_int_equal(st.host_used_blocks, 2);
    /* the same request again, now skipping cached prefixes: hit 0 and the pin is gone */
    KVT_OK_(kvt_offload_match_flags(s.m, "b", 1, b.hashes, b.n_hashes, b.n_tokens, 0,
                                    KVT_MATCH_SKIP_PREFIX_CACHE, &hit));
    assert_int_equal(hit, 0);
    kvt_offload_get_stats(s.m, &st);
    assert_int_equal(st.host_used_blocks, 0);
    assert_int_equal(st.lookups_skipped, 1);
    assert_int_equal(st.lookups, lookups + 1);
    assert_int_equal(st.lookups_misaligned, 2);
    /* a skipping request with a new prompt is still stored */
    sim_req c;
    sim_req_make(&c, "c", 2 * SIM_BS + 1, 2, 2 * SIM_BS + 1, 0);
    KVT_OK_(kvt_offload_match_flags(s.m, "c", 1, c.hashes, c.n_hashes, c.n_tokens, 0,
                                    KVT_MATCH_SKIP_PREFIX_CACHE, &hit));
    assert_int_equal(hit, 0);
    c.n_blocks = 3;
    KVT_OK_(kvt_pool_alloc(s.gpu, 3, c.blocks));
    const uint32_t *tab[1] = {c.blocks};
    uint32_t nb[1] = {3};
    KVT_OK_(kvt_offload_after_alloc(s.m, "c", 1, tab, nb, 0));
    sim_compute(&s, &c, c.n_tokens);
    sim_schedule(&s, &c, 1, false);
    sim_build(&s, false);
    assert_int_equal(s.meta.n_stores, 2);
    sim_report_store(&s, s.meta.store_event, 1);
    assert_true(sim_host_has(&s, &c, 0) && sim_host_has(&s, &c, 1));
    /* the counters reach Prometheus */
    char buf[16384];
    size_t len;
    KVT_OK_(kvt_offload_prometheus(s.m, buf, sizeof(buf), &len));
    KVT_PROMTOOL_OK(buf);
    assert_non_null(strstr(buf, "kvtier_offload_lookups_misaligned_total 2"));
    assert_non_null(strstr(buf, "kvtier_offload_lookups_skipped_total 2"));
    sim_finish(&s, &c);
    sim_fini(&s);
}

/* Spec §2.14 lazy window: per prefix-cacheable group of block size B, full attention
 * ceil(max_batched / B) + max_num_seqs, sliding window ceil(window / B) + 1, Mamba 2; the sum
 * times 2. Context parallelism is in B, so a larger dcp x pcp gives a smaller window. */
static void lazy_window_follows_the_upstream_formula(void **state)
{
    (void)state;
    static const struct {
        uint32_t n_groups;
        kvt_group_spec groups[3];
        uint32_t max_batched, max_num_seqs, window;
    } cases[] = {
        {1, {{KVT_GROUP_FULL, 16, 0}}, 32, 0, 2 * 2},
        {1, {{KVT_GROUP_FULL, 16, 0}}, 33, 0, 2 * 3},
        {1, {{KVT_GROUP_FULL, 16, 0}}, 32, 5, 2 * (2 + 5)},
        {1, {{KVT_GROUP_FULL, 64, 0}}, 256, 4, 2 * (4 + 4)},  /* CP x4 of 16 */
        {1, {{KVT_GROUP_FULL, 16, 0}}, 256, 4, 2 * (16 + 4)}, /* the same without CP */
        {2, {{KVT_GROUP_FULL, 16, 0}, {KVT_GROUP_SCRATCH, 5, 0}}, 32, 0, 2 * 2}, /* nothing */
        {2, {{KVT_GROUP_FULL, 16, 0}, {KVT_GROUP_SLIDING, 16, 40}}, 64, 2, 2 * ((4 + 2) + (3 + 1))},
        {3,
         {{KVT_GROUP_FULL, 32, 0}, {KVT_GROUP_SLIDING, 32, 64}, {KVT_GROUP_MAMBA, 32, 0}},
         64,
         1,
         2 * ((2 + 1) + (2 + 1) + 2)},
        /* Mamba in align mode: ceil(max_batched / B) state blocks per prefill step */
        {2, {{KVT_GROUP_FULL, 16, 0}, {KVT_GROUP_MAMBA_ALIGN, 32, 0}}, 64, 0, 2 * (4 + 2)},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        kvt_pool_config pc;
        kvt_pool_config_init(&pc);
        pc.num_blocks = 64;
        pc.n_groups = cases[i].n_groups;
        memcpy(pc.groups, cases[i].groups, sizeof(cases[i].groups));
        kvt_pool *gpu;
        KVT_OK_(kvt_pool_create(&pc, &gpu));
        kvt_offload_config oc;
        kvt_offload_config_init(&oc);
        oc.host_blocks = 32;
        oc.max_batched_tokens = cases[i].max_batched;
        oc.max_num_seqs = cases[i].max_num_seqs;
        kvt_offload *m;
        KVT_OK_(kvt_offload_create(&oc, gpu, &m));
        assert_int_equal(kvt_offload_lazy_window(m), 0); /* eager: no scan */
        kvt_offload_destroy(m);
        oc.lazy = true;
        KVT_OK_(kvt_offload_create(&oc, gpu, &m));
        if (kvt_offload_lazy_window(m) != cases[i].window)
            fail_msg("case %zu: window %u, want %u", i, kvt_offload_lazy_window(m),
                     cases[i].window);
        kvt_offload_destroy(m);
        kvt_pool_destroy(gpu);
    }
    assert_int_equal(kvt_offload_lazy_window(NULL), 0);
}

/* Spec §2.14: the lazy scan looks at the window at the head of the GPU free queue every step;
 * no cursor carries it deeper, so hashed blocks behind a window of unhashed ones wait (any
 * number of steps) until they drift up to the head. */
static void lazy_scan_starts_from_the_head_every_step(void **state)
{
    (void)state;
    sim s;
    sim_init(&s, 16, 32, true, 1, 32); /* window 2 x ceil(32/16) = 4 */
    assert_int_equal(kvt_offload_lazy_window(s.m), 4);
    sim_req a, f;
    sim_req_make(&a, "a", 2 * SIM_BS + 1, 1, 2 * SIM_BS + 1, 0);
    sim_admit(&s, &a, 0);
    sim_compute(&s, &a, a.n_tokens);
    uint32_t a0 = a.blocks[0], a1 = a.blocks[1];
    sim_finish(&s, &a); /* a's 3 blocks join the free queue's tail, behind 12 unhashed ones */
    for (int step = 0; step < 8; step++) { /* a cursor would have walked on to a's blocks */
        sim_build(&s, false);
        assert_int_equal(s.meta.store_event, KVT_NO_EVENT);
    }
    /* fillers take the 12 blocks ahead of a's: a's blocks come to the head */
    sim_req_make(&f, "f", 12 * SIM_BS, 5, 0, 5);
    f.n_blocks = 12;
    KVT_OK_(kvt_pool_alloc(s.gpu, 12, f.blocks));
    sim_build(&s, false);
    assert_int_equal(s.meta.n_stores, 2);
    assert_true((s.meta.store_gpu_blocks[0] == a0 && s.meta.store_gpu_blocks[1] == a1) ||
                (s.meta.store_gpu_blocks[0] == a1 && s.meta.store_gpu_blocks[1] == a0));
    sim_report_store(&s, s.meta.store_event, 1);
    KVT_OK_(kvt_pool_free(s.gpu, f.blocks, 12));
    sim_fini(&s);
}

/* Full attention + a one-block sliding window: r computed 3 blocks in both groups, then the
 * engine nulled its window's first two positions (freed: still cached in the GPU pool). r is
 * stored (hashed: with its hashes, so nulled entries can be looked up; plain: without) and a
 * request p whose prompt is r's first 2 blocks + 1 token is matched; returns p's hit. */
static uint32_t nulled_window_then_shorter_clone(bool hashed, uint64_t *recovered)
{
    sim2 t;
    sim2_init(&t, KVT_GROUP_SLIDING, SIM_BS, SIM_BS + 1); /* one block before the hit point */
    kvt_pool *gpu = t.gpu;
    kvt_offload *m = t.m;
    sim_req r, p;
    sim_req_make(&r, "r", 3 * SIM_BS + 1, 1, 3 * SIM_BS + 1, 0);
    uint32_t fa[4], sw[4], hit;
    KVT_OK_(kvt_pool_alloc(gpu, 4, fa));
    KVT_OK_(kvt_pool_alloc(gpu, 4, sw));
    for (uint32_t j = 0; j < 3; j++) {
        KVT_OK_(kvt_pool_insert(gpu, fa[j], r.hashes + j * KVT_BLOCK_HASH_LEN, 0, SIM_BS));
        KVT_OK_(kvt_pool_insert(gpu, sw[j], r.hashes + j * KVT_BLOCK_HASH_LEN, 1, SIM_BS));
    }
    KVT_OK_(kvt_offload_match(m, "r", 1, r.hashes, r.n_hashes, r.n_tokens, 0, &hit));
    const uint32_t *tab[2] = {fa, sw};
    uint32_t nb[2] = {4, 4};
    KVT_OK_(kvt_offload_after_alloc(m, "r", 1, tab, nb, 0));
    uint32_t gone[2] = {sw[1], sw[0]}; /* out of the window: freed, still cached */
    KVT_OK_(kvt_pool_free(gpu, gone, 2));
    sw[0] = sw[1] = KVT_NULL_BLOCK;
    if (hashed)
        KVT_OK_(kvt_offload_schedule_hashed(m, "r", 1, tab, nb, r.hashes, r.n_hashes, r.n_tokens, 1,
                                            false));
    else
        KVT_OK_(kvt_offload_schedule(m, "r", 1, tab, nb, r.n_tokens, 1, false));
    KVT_OK_(kvt_offload_build_meta(m, false, &t.meta));
    assert_int_equal(t.meta.n_stores, hashed ? 6 : 4);
    for (uint32_t i = 0; i < t.meta.n_stores; i++)
        assert_int_not_equal(t.meta.store_gpu_blocks[i], KVT_NULL_BLOCK);
    /* a recovered block is pinned while it is copied: out of the GPU free queue */
    kvt_block_info bi;
    KVT_OK_(kvt_pool_block_info(gpu, gone[1], &bi));
    assert_int_equal(bi.is_free, !hashed);
    sim2_report_store(&t);
    KVT_OK_(kvt_offload_request_finished(m, "r", 1, tab, nb, r.n_tokens));
    KVT_OK_(kvt_pool_free(gpu, fa, 4));
    KVT_OK_(kvt_pool_free(gpu, sw + 2, 2));
    KVT_OK_(kvt_pool_reset_prefix_cache(gpu));
    sim_req_make(&p, "p", 2 * SIM_BS + 1, 1, 2 * SIM_BS + 1, 0);
    KVT_OK_(kvt_offload_match(m, "p", 1, p.hashes, p.n_hashes, p.n_tokens, 0, &hit));
    kvt_offload_stats st;
    kvt_offload_get_stats(m, &st);
    *recovered = st.store_recovered_null;
    KVT_OK_(kvt_offload_request_finished(m, "p", 1, tab, (uint32_t[2]){0, 0}, 0));
    sim2_fini(&t);
    return hit;
}

/* Spec §2.14: a nulled entry whose hash the GPU pool still caches is found and stored, so a
 * request sharing a shorter prefix gets the full hit in every group; without the request's
 * hashes nothing can be recovered and the window group's gap ends the hit at 0. */
static void nulled_entries_still_cached_on_the_gpu_are_stored(void **state)
{
    (void)state;
    uint64_t recovered;
    assert_int_equal(nulled_window_then_shorter_clone(true, &recovered), 2 * SIM_BS);
    assert_int_equal(recovered, 2);
    assert_int_equal(nulled_window_then_shorter_clone(false, &recovered), 0);
    assert_int_equal(recovered, 0);
}

/* Mamba in align mode beside full attention (Mamba blocks of 32 tokens, hash blocks of 16):
 * r's two states, at 32 and 64 tokens, sit in GPU blocks the engine cached under the hash
 * where they end. Handed over (or not), they are stored; returns a clone's host-tier hit. */
static uint32_t mamba_align_clone_hit(bool hand_over, kvt_offload_stats *st)
{
    sim2 t;
    sim2_init(&t, KVT_GROUP_MAMBA_ALIGN, 2 * SIM_BS, 0);
    kvt_pool *gpu = t.gpu;
    kvt_offload *m = t.m;
    sim_req r;
    sim_req_make(&r, "r", 4 * SIM_BS + 1, 1, 4 * SIM_BS + 1, 0);
    uint32_t fa[5], mb[3], hit;
    KVT_OK_(kvt_pool_alloc(gpu, 5, fa));
    KVT_OK_(kvt_pool_alloc(gpu, 3, mb));
    for (uint32_t j = 0; j < 4; j++)
        KVT_OK_(kvt_pool_insert(gpu, fa[j], r.hashes + j * KVT_BLOCK_HASH_LEN, 0, SIM_BS));
    const uint8_t *h32 = r.hashes + 1 * KVT_BLOCK_HASH_LEN,
                  *h64 = r.hashes + 3 * KVT_BLOCK_HASH_LEN;
    KVT_OK_(kvt_pool_insert(gpu, mb[2], h32, 1, 2 * SIM_BS)); /* states in any block */
    KVT_OK_(kvt_pool_insert(gpu, mb[0], h64, 1, 2 * SIM_BS));
    const uint32_t *tab[2] = {fa, mb};
    uint32_t nb[2] = {5, 3};
    KVT_OK_(kvt_offload_match(m, "r", 1, r.hashes, r.n_hashes, r.n_tokens, 0, &hit));
    KVT_OK_(kvt_offload_after_alloc(m, "r", 1, tab, nb, 0));
    KVT_OK_(kvt_offload_schedule(m, "r", 1, tab, nb, r.n_tokens, 1, false));
    kvt_offload_boundary b[2] = {{"r", 1, 1, mb[2], 2 * SIM_BS, h32},
                                 {"r", 1, 1, mb[0], 4 * SIM_BS, h64}};
    if (hand_over) {
        /* malformed: refused whole, nothing applied */
        kvt_offload_boundary bad = b[1];
        bad.group = 0;
        KVT_ERR_(kvt_offload_boundary_states(m, (kvt_offload_boundary[]){b[0], bad}, 2),
                 KVT_EINVAL);
        bad = b[1];
        bad.num_tokens = SIM_BS / 2; /* not at a hash-block boundary */
        KVT_ERR_(kvt_offload_boundary_states(m, &bad, 1), KVT_EINVAL);
        bad = b[1];
        bad.gpu_block = KVT_NULL_BLOCK;
        KVT_ERR_(kvt_offload_boundary_states(m, &bad, 1), KVT_EINVAL);
        bad = b[1];
        bad.hash = NULL;
        KVT_ERR_(kvt_offload_boundary_states(m, &bad, 1), KVT_EINVAL);
        kvt_offload_get_stats(m, st);
        assert_int_equal(st->boundary_states, 0);
        assert_int_equal(kvt_offload_boundary_states(m, b, 2), 2);
        /* a departed request's state is dropped and counted */
        kvt_offload_boundary gone = {"x", 1, 1, mb[1], 2 * SIM_BS, h32};
        assert_int_equal(kvt_offload_boundary_states(m, &gone, 1), 0);
    }
    KVT_OK_(kvt_offload_build_meta(m, false, &t.meta));
    /* one event: the attention blocks and the states; never a state by its table position */
    assert_int_equal(t.meta.n_stores, hand_over ? 6 : 4);
    for (uint32_t i = 0; i < t.meta.n_stores; i++)
        assert_true(t.meta.store_gpu_blocks[i] != mb[1]);
    sim2_report_store(&t);
    KVT_OK_(kvt_offload_request_finished(m, "r", 1, tab, nb, r.n_tokens));
    KVT_OK_(kvt_pool_free(gpu, fa, 5));
    KVT_OK_(kvt_pool_free(gpu, mb, 3));
    KVT_OK_(kvt_pool_reset_prefix_cache(gpu));
    KVT_OK_(kvt_offload_match(m, "q", 1, r.hashes, r.n_hashes, r.n_tokens, 0, &hit));
    KVT_OK_(kvt_offload_request_finished(m, "q", 1, tab, (uint32_t[2]){0, 0}, 0));
    kvt_offload_get_stats(m, st);
    sim2_fini(&t);
    return hit;
}

/* Spec §2.14: in align mode the Mamba group is stored from the engine's handoffs only, with
 * the step's other stores; a clone of the prompt then gets the whole hit (the state where it
 * ends); without them the group has nothing and the hit is 0. */
static void mamba_align_states_are_stored_when_handed_over(void **state)
{
    (void)state;
    kvt_offload_stats st;
    assert_int_equal(mamba_align_clone_hit(true, &st), 4 * SIM_BS);
    assert_int_equal(st.boundary_states, 2);
    assert_int_equal(st.boundary_dropped_gone, 1);
    assert_int_equal(mamba_align_clone_hit(false, &st), 0);
    assert_int_equal(st.boundary_states, 0);
}

/* Spec §2.14, partial hash hits: full attention and Mamba align of 32 tokens per block over
 * hash blocks of 16. r's 81 tokens end inside its third attention block, which the engine
 * cached partly (16 tokens, under the hash at 80); its states at 64 and at 80 tokens are
 * handed over. A clone then gets 80 tokens — not the 64 that whole scheduler blocks give —
 * with the partly filled block and the state at 80 loaded; the partial block was stored once,
 * at r's finish. */
static void partial_hash_hits_load_a_partly_filled_block(void **state)
{
    (void)state;
    sim2 t;
    sim2_init_ex(&t, 2 * SIM_BS, KVT_GROUP_MAMBA_ALIGN, 2 * SIM_BS, 0, false);
    kvt_pool *gpu = t.gpu;
    kvt_offload *m = t.m;
    assert_int_equal(kvt_offload_hit_alignment(m), SIM_BS);
    sim_req r;
    sim_req_make(&r, "r", 5 * SIM_BS + 1, 1, 5 * SIM_BS + 1, 0);
    const uint8_t *h = r.hashes;
#define HASH_AT(tokens) (h + ((tokens) / SIM_BS - 1) * KVT_BLOCK_HASH_LEN)
    uint32_t fa[3], mb[3], hit;
    KVT_OK_(kvt_pool_alloc(gpu, 3, fa));
    KVT_OK_(kvt_pool_alloc(gpu, 3, mb));
    KVT_OK_(kvt_pool_insert(gpu, fa[0], HASH_AT(32), 0, 2 * SIM_BS));
    KVT_OK_(kvt_pool_insert(gpu, fa[1], HASH_AT(64), 0, 2 * SIM_BS));
    KVT_OK_(kvt_pool_insert(gpu, mb[1], HASH_AT(64), 1, 2 * SIM_BS));
    KVT_OK_(kvt_pool_insert(gpu, mb[2], HASH_AT(80), 1, SIM_BS));
    const uint32_t *tab[2] = {fa, mb};
    uint32_t nb[2] = {3, 3};
    KVT_OK_(kvt_offload_match(m, "r", 1, r.hashes, r.n_hashes, r.n_tokens, 0, &hit));
    KVT_OK_(kvt_offload_after_alloc(m, "r", 1, tab, nb, 0));
    KVT_OK_(kvt_offload_schedule(m, "r", 1, tab, nb, r.n_tokens, 1, false));
    kvt_offload_boundary b[2] = {{"r", 1, 1, mb[1], 64, HASH_AT(64), NULL},
                                 {"r", 1, 1, mb[2], 80, HASH_AT(80), NULL}};
    assert_int_equal(kvt_offload_boundary_states(m, b, 2), 2); /* 80: a hash-block boundary */
    KVT_OK_(kvt_offload_build_meta(m, false, &t.meta));
    assert_int_equal(t.meta.n_stores, 4); /* two whole attention blocks, two states */
    sim2_report_store(&t);
    /* at finish the engine has cached the partly filled block (16 tokens) */
    KVT_OK_(kvt_pool_insert(gpu, fa[2], HASH_AT(80), 0, SIM_BS));
    KVT_OK_(kvt_offload_request_finished(m, "r", 1, tab, nb, r.n_tokens));
    KVT_OK_(kvt_offload_build_meta(m, false, &t.meta));
    assert_int_equal(t.meta.n_stores, 1);
    assert_int_equal(t.meta.store_gpu_blocks[0], fa[2]);
    sim2_report_store(&t);
    kvt_offload_stats st;
    kvt_offload_get_stats(m, &st);
    assert_int_equal(st.partial_tails, 1);
    KVT_OK_(kvt_pool_free(gpu, fa, 3));
    KVT_OK_(kvt_pool_free(gpu, mb, 3));
    KVT_OK_(kvt_pool_reset_prefix_cache(gpu));

    /* a clone: 80 tokens, the last attention block partly valid, the state at 80 */
    uint32_t qf[3], qm[3];
    KVT_OK_(kvt_pool_alloc(gpu, 3, qf));
    KVT_OK_(kvt_pool_alloc(gpu, 3, qm));
    const uint32_t *qtab[2] = {qf, qm};
    KVT_OK_(kvt_offload_match(m, "q", 1, r.hashes, r.n_hashes, r.n_tokens, 0, &hit));
    assert_int_equal(hit, 80);
    KVT_ERR_(kvt_offload_after_alloc(m, "q", 1, qtab, nb, 72), KVT_EINVAL); /* off the grid */
    /* shorter: the state block holds the state at 80, not at 64 */
    KVT_ERR_(kvt_offload_after_alloc(m, "q", 1, qtab, nb, 64), KVT_EINVAL);
    KVT_OK_(kvt_offload_after_alloc(m, "q", 1, qtab, nb, 80));
    KVT_OK_(kvt_offload_build_meta(m, false, &t.meta));
    assert_int_equal(t.meta.n_loads, 4);
    bool seen[4] = {false};
    for (uint32_t i = 0; i < t.meta.n_loads; i++) {
        uint32_t g = t.meta.load_gpu_blocks[i];
        assert_true(g != qm[0] && g != qm[1]); /* states only where the hit ends */
        seen[0] |= g == qf[0];
        seen[1] |= g == qf[1];
        seen[2] |= g == qf[2];
        seen[3] |= g == qm[2];
    }
    assert_true(seen[0] && seen[1] && seen[2] && seen[3]);
    kvt_offload_get_stats(m, &st);
    assert_int_equal(st.partial_hits, 1);
    KVT_OK_(kvt_offload_apply_output(m, &(kvt_str){"q", 1}, 1, NULL));
    /* the same prompt finishing again stores its partial block no second time */
    KVT_OK_(kvt_pool_insert(gpu, qf[2], HASH_AT(80), 0, SIM_BS));
    KVT_OK_(kvt_offload_request_finished(m, "q", 1, qtab, nb, r.n_tokens));
    KVT_OK_(kvt_offload_build_meta(m, false, &t.meta));
    assert_int_equal(t.meta.n_stores, 0);
    kvt_offload_get_stats(m, &st);
    assert_int_equal(st.partial_tails, 1);
    KVT_OK_(kvt_pool_free(gpu, qf, 3));
    KVT_OK_(kvt_pool_free(gpu, qm, 3));
    sim2_fini(&t);
#undef HASH_AT
}

/* Issue 37, partial hash hits at store time: full attention of 32 tokens, Mamba align of 64
 * (scheduler block 64) over hash blocks of 16. r's states at 64, 128 and 160 tokens are handed
 * over with 161 tokens confirmed: the step stores every whole attention block up to 160 — the
 * last hash-block boundary, where a state is — not only those up to 128, the last scheduler
 * block. A clone then gets 160 tokens (it got 128 while the block of tokens 128..159 was
 * never stored, not even at finish). */
static void partial_hash_hits_store_up_to_the_last_state(void **state)
{
    (void)state;
    sim2 t;
    sim2_init_ex(&t, 2 * SIM_BS, KVT_GROUP_MAMBA_ALIGN, 4 * SIM_BS, 0, false);
    kvt_pool *gpu = t.gpu;
    kvt_offload *m = t.m;
    assert_int_equal(kvt_offload_hit_alignment(m), SIM_BS);
    sim_req r;
    sim_req_make(&r, "r", 10 * SIM_BS + 1, 1, 10 * SIM_BS + 1, 0);
    const uint8_t *h = r.hashes;
#define HASH_AT(tokens) (h + ((tokens) / SIM_BS - 1) * KVT_BLOCK_HASH_LEN)
    uint32_t fa[6], mb[3], hit;
    KVT_OK_(kvt_pool_alloc(gpu, 6, fa));
    KVT_OK_(kvt_pool_alloc(gpu, 3, mb));
    for (uint32_t j = 0; j < 5; j++)
        KVT_OK_(kvt_pool_insert(gpu, fa[j], HASH_AT(32 * (j + 1)), 0, 2 * SIM_BS));
    KVT_OK_(kvt_pool_insert(gpu, mb[0], HASH_AT(64), 1, 4 * SIM_BS));
    KVT_OK_(kvt_pool_insert(gpu, mb[1], HASH_AT(128), 1, 4 * SIM_BS));
    KVT_OK_(kvt_pool_insert(gpu, mb[2], HASH_AT(160), 1, 2 * SIM_BS));
    const uint32_t *tab[2] = {fa, mb};
    uint32_t nb[2] = {6, 3};
    KVT_OK_(kvt_offload_match(m, "r", 1, r.hashes, r.n_hashes, r.n_tokens, 0, &hit));
    assert_int_equal(hit, 0);
    KVT_OK_(kvt_offload_after_alloc(m, "r", 1, tab, nb, 0));
    KVT_OK_(kvt_offload_schedule(m, "r", 1, tab, nb, r.n_tokens, r.n_tokens, false));
    kvt_offload_boundary b[3] = {{"r", 1, 1, mb[0], 64, HASH_AT(64), NULL},
                                 {"r", 1, 1, mb[1], 128, HASH_AT(128), HASH_AT(64)},
                                 {"r", 1, 1, mb[2], 160, HASH_AT(160), HASH_AT(128)}};
    assert_int_equal(kvt_offload_boundary_states(m, b, 3), 3);
    KVT_OK_(kvt_offload_build_meta(m, false, &t.meta));
    assert_int_equal(t.meta.n_stores, 8); /* five whole attention blocks, three states */
    bool fa4 = false;
    for (uint32_t i = 0; i < t.meta.n_stores; i++)
        fa4 |= t.meta.store_gpu_blocks[i] == fa[4];
    assert_true(fa4);
    sim2_report_store(&t);
    KVT_OK_(kvt_offload_request_finished(m, "r", 1, tab, nb, r.n_tokens));
    KVT_OK_(kvt_offload_build_meta(m, false, &t.meta));
    assert_int_equal(t.meta.n_stores, 0); /* nothing left, no partly filled block */
    KVT_OK_(kvt_pool_free(gpu, fa, 6));
    KVT_OK_(kvt_pool_free(gpu, mb, 3));
    KVT_OK_(kvt_pool_reset_prefix_cache(gpu));

    uint32_t qf[6], qm[3];
    KVT_OK_(kvt_pool_alloc(gpu, 6, qf));
    KVT_OK_(kvt_pool_alloc(gpu, 3, qm));
    const uint32_t *qtab[2] = {qf, qm};
    KVT_OK_(kvt_offload_match(m, "q", 1, r.hashes, r.n_hashes, r.n_tokens, 0, &hit));
    assert_int_equal(hit, 160);
    KVT_OK_(kvt_offload_after_alloc(m, "q", 1, qtab, nb, 160));
    KVT_OK_(kvt_offload_build_meta(m, false, &t.meta));
    assert_int_equal(t.meta.n_loads, 6); /* five attention blocks and the state at 160 */
    KVT_OK_(kvt_offload_apply_output(m, &(kvt_str){"q", 1}, 1, NULL));
    KVT_OK_(kvt_offload_request_finished(m, "q", 1, qtab, nb, 0));
    KVT_OK_(kvt_pool_free(gpu, qf, 6));
    KVT_OK_(kvt_pool_free(gpu, qm, 3));
    sim2_fini(&t);
#undef HASH_AT
}

/* Issue 37, decode context parallelism (upstream's rule): it scales the attention blocks, so a
 * Mamba align block as large as the hash block allows partial hash hits — without it the block
 * must be larger. Hash 16, Mamba align 16, attention 64 x dcp 2 = 128: the hit alignment is 16,
 * not 128; r's 81 tokens end inside its one attention block, cached partly at 80 and stored at
 * finish; a clone gets 80 tokens (it got 0). */
static void partial_hash_hits_under_decode_context_parallelism(void **state)
{
    (void)state;
    sim2 t;
    sim2_init_cp(&t, 8 * SIM_BS, KVT_GROUP_MAMBA_ALIGN, SIM_BS, 0, false, 1);
    assert_int_equal(kvt_offload_hit_alignment(t.m), 8 * SIM_BS); /* no dcp: 16 is not wider */
    sim2_fini(&t);
    sim2_init_cp(&t, 8 * SIM_BS, KVT_GROUP_MAMBA_ALIGN, SIM_BS, 0, false, 2);
    kvt_pool *gpu = t.gpu;
    kvt_offload *m = t.m;
    assert_int_equal(kvt_offload_hit_alignment(m), SIM_BS);
    sim_req r;
    sim_req_make(&r, "r", 5 * SIM_BS + 1, 1, 5 * SIM_BS + 1, 0);
    const uint8_t *h = r.hashes;
    uint32_t fa[1], mb[6], hit;
    KVT_OK_(kvt_pool_alloc(gpu, 1, fa));
    KVT_OK_(kvt_pool_alloc(gpu, 6, mb));
    for (uint32_t j = 0; j < 5; j++)
        KVT_OK_(kvt_pool_insert(gpu, mb[j], h + j * KVT_BLOCK_HASH_LEN, 1, SIM_BS));
    const uint32_t *tab[2] = {fa, mb};
    uint32_t nb[2] = {1, 6};
    KVT_OK_(kvt_offload_match(m, "r", 1, r.hashes, r.n_hashes, r.n_tokens, 0, &hit));
    KVT_OK_(kvt_offload_after_alloc(m, "r", 1, tab, nb, 0));
    KVT_OK_(kvt_offload_schedule(m, "r", 1, tab, nb, r.n_tokens, r.n_tokens, false));
    kvt_offload_boundary b[2] = {{"r", 1, 1, mb[3], 64, h + 3 * KVT_BLOCK_HASH_LEN, NULL},
                                 {"r", 1, 1, mb[4], 80, h + 4 * KVT_BLOCK_HASH_LEN, NULL}};
    assert_int_equal(kvt_offload_boundary_states(m, b, 2), 2);
    KVT_OK_(kvt_offload_build_meta(m, false, &t.meta));
    assert_int_equal(t.meta.n_stores, 2); /* the states; the attention block is not full */
    sim2_report_store(&t);
    KVT_OK_(kvt_pool_insert(gpu, fa[0], h + 4 * KVT_BLOCK_HASH_LEN, 0, 5 * SIM_BS));
    KVT_OK_(kvt_offload_request_finished(m, "r", 1, tab, nb, r.n_tokens));
    KVT_OK_(kvt_offload_build_meta(m, false, &t.meta));
    assert_int_equal(t.meta.n_stores, 1);
    assert_int_equal(t.meta.store_gpu_blocks[0], fa[0]);
    sim2_report_store(&t);
    KVT_OK_(kvt_pool_free(gpu, fa, 1));
    KVT_OK_(kvt_pool_free(gpu, mb, 6));
    KVT_OK_(kvt_pool_reset_prefix_cache(gpu));
    KVT_OK_(kvt_offload_match(m, "q", 1, r.hashes, r.n_hashes, r.n_tokens, 0, &hit));
    assert_int_equal(hit, 80);
    KVT_OK_(kvt_offload_request_finished(m, "q", 1, tab, (uint32_t[2]){0, 0}, 0));
    sim2_fini(&t);

    /* what context parallelism cannot take is refused with the reason */
    kvt_pool_config pc;
    kvt_pool_config_init(&pc);
    pc.num_blocks = 16;
    pc.groups[0].block_size = 3 * SIM_BS;
    pc.dcp_world_size = 32; /* 48 tokens cannot be spread over 32 ranks */
    kvt_pool *p;
    KVT_ERR_(kvt_pool_create(&pc, &p), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "dcp_world_size 32"));
    pc.groups[0].block_size = 2 * SIM_BS;
    pc.dcp_world_size = 2;
    pc.n_groups = 2;
    pc.groups[1] = (kvt_group_spec){KVT_GROUP_SLIDING, SIM_BS, 2 * SIM_BS};
    KVT_ERR_(kvt_pool_create(&pc, &p), KVT_EINVAL);
    pc.groups[1] = (kvt_group_spec){KVT_GROUP_MAMBA_ALIGN, SIM_BS, 0};
    pc.dcp_world_size = 0;
    pc.pcp_world_size = 2;
    KVT_ERR_(kvt_pool_create(&pc, &p), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "prefill"));
    pc.pcp_world_size = 4096;
    KVT_ERR_(kvt_pool_create(&pc, &p), KVT_EINVAL);
}

/* Partial hash hits are an eager-mode rule, and need groups that allow them: lazy mode, or a
 * sliding window beside the Mamba align group, keeps hits on scheduler blocks. */
static void partial_hash_hits_only_where_the_rules_allow(void **state)
{
    (void)state;
    sim2 t;
    sim2_init_ex(&t, 2 * SIM_BS, KVT_GROUP_MAMBA_ALIGN, 2 * SIM_BS, 0, true);
    assert_int_equal(kvt_offload_hit_alignment(t.m), 2 * SIM_BS);
    sim2_fini(&t);
    sim2_init_ex(&t, 2 * SIM_BS, KVT_GROUP_MAMBA, 2 * SIM_BS, 0, false); /* all mode */
    assert_int_equal(kvt_offload_hit_alignment(t.m), 2 * SIM_BS);
    sim2_fini(&t);
    sim2_init_ex(&t, SIM_BS, KVT_GROUP_MAMBA_ALIGN, SIM_BS, 0, false); /* one hash block */
    assert_int_equal(kvt_offload_hit_alignment(t.m), SIM_BS);
    sim2_fini(&t);
    kvt_pool_config pc;
    kvt_pool_config_init(&pc);
    pc.num_blocks = 16;
    pc.n_groups = 3;
    pc.groups[1] = (kvt_group_spec){KVT_GROUP_MAMBA_ALIGN, 2 * SIM_BS, 0};
    pc.groups[2] = (kvt_group_spec){KVT_GROUP_SLIDING, SIM_BS, 2 * SIM_BS};
    kvt_pool *gpu;
    KVT_OK_(kvt_pool_create(&pc, &gpu));
    kvt_offload_config oc;
    kvt_offload_config_init(&oc);
    oc.host_blocks = 8;
    kvt_offload *m;
    KVT_OK_(kvt_offload_create(&oc, gpu, &m));
    assert_int_equal(kvt_offload_hit_alignment(m), 2 * SIM_BS);
    kvt_offload_destroy(m);
    kvt_pool_destroy(gpu);
}

/* Spec §2.14: a scratch group (block size unrelated to the hash block) beside full
 * attention: its blocks are never stored or loaded, and the full-attention hit is whole. */
static void scratch_groups_are_never_stored_or_loaded(void **state)
{
    (void)state;
    sim2 t;
    sim2_init(&t, KVT_GROUP_SCRATCH, 7, 0);
    kvt_pool *gpu = t.gpu;
    kvt_offload *m = t.m;
    kvt_offload_meta *meta = &t.meta;
    sim_req r;
    sim_req_make(&r, "r", 3 * SIM_BS + 1, 1, 3 * SIM_BS + 1, 0);
    uint32_t fa[4], sc[2], hit;
    KVT_OK_(kvt_pool_alloc(gpu, 4, fa));
    KVT_OK_(kvt_pool_alloc(gpu, 2, sc)); /* a small scratch table, whatever the length */
    for (uint32_t j = 0; j < 3; j++)
        KVT_OK_(kvt_pool_insert(gpu, fa[j], r.hashes + j * KVT_BLOCK_HASH_LEN, 0, SIM_BS));
    const uint32_t *tab[2] = {fa, sc};
    uint32_t nb[2] = {4, 2};
    KVT_OK_(kvt_offload_match(m, "r", 1, r.hashes, r.n_hashes, r.n_tokens, 0, &hit));
    KVT_OK_(kvt_offload_after_alloc(m, "r", 1, tab, nb, 0));
    assert_int_equal(
        kvt_offload_schedule_hashed(m, "r", 1, tab, nb, r.hashes, r.n_hashes, r.n_tokens, 1, false),
        0);
    KVT_OK_(kvt_offload_build_meta(m, false, meta));
    assert_int_equal(meta->n_stores, 3);
    for (uint32_t i = 0; i < meta->n_stores; i++)
        assert_true(meta->store_gpu_blocks[i] != sc[0] && meta->store_gpu_blocks[i] != sc[1]);
    sim2_report_store(&t);
    KVT_OK_(kvt_offload_request_finished(m, "r", 1, tab, nb, r.n_tokens));
    KVT_OK_(kvt_pool_free(gpu, fa, 4));
    KVT_OK_(kvt_pool_free(gpu, sc, 2));
    KVT_OK_(kvt_pool_reset_prefix_cache(gpu));
    KVT_OK_(kvt_offload_match(m, "q", 1, r.hashes, r.n_hashes, r.n_tokens, 0, &hit));
    assert_int_equal(hit, 3 * SIM_BS);
    KVT_OK_(kvt_pool_alloc(gpu, 4, fa));
    KVT_OK_(kvt_pool_alloc(gpu, 2, sc));
    KVT_OK_(kvt_offload_after_alloc(m, "q", 1, tab, nb, hit));
    KVT_OK_(kvt_offload_build_meta(m, false, meta));
    assert_int_equal(meta->n_loads, 3); /* the full-attention blocks alone */
    for (uint32_t i = 0; i < meta->n_loads; i++)
        assert_true(meta->load_gpu_blocks[i] != sc[0] && meta->load_gpu_blocks[i] != sc[1]);
    kvt_str q = {"q", 1};
    KVT_OK_(kvt_offload_apply_output(m, &q, 1, NULL));
    sim2_fini(&t);
}

/* vLLM test_reset_waits_for_pending_eager_store */
static void reset_waits_for_an_abandoned_store_and_never_caches_it(void **state)
{
    (void)state;
    sim s;
    sim_init(&s, 64, 32, false, 1, 64);
    sim_req a, x;
    sim_req_make(&x, "x", 2 * SIM_BS + 1, 9, 2 * SIM_BS + 1, 0);
    sim_store_prompt(&s, &x, 1);
    sim_req_make(&a, "a", 2 * SIM_BS + 1, 1, 2 * SIM_BS + 1, 0);
    sim_admit_and_store(&s, &a);
    int64_t ev = s.meta.store_event;
    sim_finish(&s, &a);
    KVT_ERR_(kvt_offload_reset(s.m), KVT_EBUSY);
    assert_true(kvt_offload_has_pending(s.m));
    sim_report_store(&s, ev, 1);
    assert_false(sim_host_has(&s, &a, 0)); /* abandoned: never findable */
    KVT_OK_(kvt_offload_reset(s.m));
    assert_false(sim_host_has(&s, &x, 0)); /* the host tier is cleared */
    assert_int_equal(kvt_pool_num_free(s.gpu), 63);
    kvt_offload_stats st;
    kvt_offload_get_stats(s.m, &st);
    assert_int_equal(st.stores_abandoned, 2);
    assert_int_equal(st.resets, 1);
    /* event ids keep counting */
    sim_store_prompt(&s, &x, 1);
    assert_true(sim_host_has(&s, &x, 0) && sim_host_has(&s, &x, 1));
    kvt_offload_get_stats(s.m, &st);
    assert_int_equal(st.store_events, (uint64_t)ev + 2); /* the new event is ev + 1 */
    sim_fini(&s);
}

/* A sim whose host tier holds prompt x (seed p) and whose GPU cache was reset since; b is a
 * request of the same prompt, not admitted: a host hit. */
static void host_holds_a_prompt_the_gpu_lost(sim *s, sim_req *x, sim_req *b, uint32_t p)
{
    sim_init(s, 64, 32, false, 1, 64);
    sim_req_make(x, "x", 2 * SIM_BS + 1, p, 2 * SIM_BS + 1, 0);
    sim_store_prompt(s, x, 1);
    KVT_OK_(kvt_pool_reset_prefix_cache(s->gpu));
    sim_req_make(b, "b", 2 * SIM_BS + 1, p, 2 * SIM_BS + 1, 0);
}

/* vLLM test_reset_waits_for_pending_load */
static void reset_waits_for_an_abandoned_load(void **state)
{
    (void)state;
    sim s;
    sim_req a, b, c;
    host_holds_a_prompt_the_gpu_lost(&s, &a, &b, 1);
    sim_admit(&s, &b, UINT32_MAX);
    sim_build(&s, false); /* b's load is in flight */
    sim_req_make(&c, "c", 2 * SIM_BS + 1, 1, 2 * SIM_BS + 1, 0);
    sim_admit(&s, &c, UINT32_MAX); /* c's load is queued, never sent */
    KVT_ERR_(kvt_offload_reset(s.m), KVT_EBUSY);
    sim_finish(&s, &c); /* its queued load was cancelled by the reset */
    sim_report_load(&s, &b);
    sim_finish(&s, &b);
    KVT_OK_(kvt_offload_reset(s.m));
    assert_int_equal(kvt_pool_num_free(s.gpu), 63); /* only the null block is left */
    kvt_offload_stats st;
    kvt_offload_get_stats(s.m, &st);
    assert_int_equal(st.host_used_blocks, 0);
    assert_int_equal(st.host_cached_blocks, 0);
    sim_fini(&s);
}

/* vLLM's pause with clear_cache resets its block pool before any connector hook: the engine
 * blocks that in-flight stores read are let go of first, the stores' bytes discarded when they
 * complete; a load in flight keeps its blocks until it is reported. */
static void released_engine_blocks_let_the_engine_reset_with_stores_in_flight(void **state)
{
    (void)state;
    sim s;
    sim_req x, a, b;
    host_holds_a_prompt_the_gpu_lost(&s, &x, &b, 9);
    assert_int_equal(sim_admit(&s, &b, UINT32_MAX), 2 * SIM_BS);
    sim_build(&s, false); /* b's load is in flight */
    assert_int_equal(s.meta.n_loads, 2);
    sim_req_make(&a, "a", 2 * SIM_BS + 1, 1, 2 * SIM_BS + 1, 0);
    int64_t ev = sim_admit_and_store(&s, &a);
    assert_true(ev != KVT_NO_EVENT);
    sim_finish(&s, &a); /* aborted: its store stays in flight */
    KVT_ERR_(kvt_pool_reset_prefix_cache(s.gpu), KVT_EBUSY);
    uint32_t held = 99;
    KVT_OK_(kvt_offload_release_engine_blocks(s.m, &held));
    assert_int_equal(held, 2); /* b's load: a worker still writes its blocks */
    KVT_ERR_(kvt_pool_reset_prefix_cache(s.gpu), KVT_EBUSY);
    sim_report_load(&s, &b);
    sim_finish(&s, &b);
    KVT_OK_(kvt_offload_release_engine_blocks(s.m, NULL)); /* twice: nothing more to release */
    KVT_OK_(kvt_pool_reset_prefix_cache(s.gpu));           /* a's store is still in flight */
    assert_true(kvt_offload_has_pending(s.m));
    /* the engine reuses every block at once; the late completion releases nothing of its */
    uint32_t all[63];
    KVT_OK_(kvt_pool_alloc(s.gpu, 63, all));
    sim_report_store(&s, ev, 1);
    for (uint32_t i = 0; i < 63; i++)
        assert_int_equal(sim_gpu_ref(&s, all[i]), 1);
    assert_false(sim_host_has(&s, &a, 0)); /* abandoned: never findable */
    assert_true(sim_host_has(&s, &x, 0));  /* what the host tier held stays */
    kvt_offload_stats st;
    kvt_offload_get_stats(s.m, &st);
    assert_int_equal(st.stores_abandoned, 2);
    assert_int_equal(st.host_used_blocks, 0);   /* a's slots were freed at completion */
    assert_int_equal(st.host_cached_blocks, 2); /* x's */
    assert_false(kvt_offload_has_pending(s.m));
    KVT_OK_(kvt_offload_reset(s.m));
    assert_false(sim_host_has(&s, &x, 0));
    KVT_OK_(kvt_pool_free(s.gpu, all, 63));
    sim_fini(&s);
}

/* clear: the tiers are emptied at once, in-flight work abandoned and freed when reported; it
 * refuses while an unfinished request would still read bytes from before it */
static void clear_empties_the_tiers_without_waiting_for_the_workers(void **state)
{
    (void)state;
    sim s;
    sim_req x, a, b;
    host_holds_a_prompt_the_gpu_lost(&s, &x, &b, 9);
    uint32_t hit;
    KVT_OK_(kvt_offload_match(s.m, "b", 1, b.hashes, b.n_hashes, b.n_tokens, 0, &hit));
    assert_int_equal(hit, 2 * SIM_BS); /* b holds a hit of x's blocks */
    KVT_ERR_(kvt_offload_clear(s.m), KVT_EBUSY);
    assert_true(sim_host_has(&s, &x, 0)); /* refused: nothing changed */
    const uint32_t *none[1] = {NULL};
    uint32_t zero[1] = {0};
    KVT_OK_(kvt_offload_request_finished(s.m, "b", 1, none, zero, 0));
    sim_req_make(&a, "a", 2 * SIM_BS + 1, 1, 2 * SIM_BS + 1, 0);
    int64_t ev = sim_admit_and_store(&s, &a);
    sim_finish(&s, &a);
    KVT_ERR_(kvt_offload_reset(s.m), KVT_EBUSY); /* reset waits for a's store */
    KVT_OK_(kvt_offload_clear(s.m));             /* clear does not */
    assert_false(sim_host_has(&s, &x, 0));
    assert_true(kvt_offload_has_pending(s.m));
    kvt_offload_stats st;
    kvt_offload_get_stats(s.m, &st);
    assert_int_equal(st.host_cached_blocks, 0);
    assert_int_equal(st.host_used_blocks, 2); /* a's, until its store is reported */
    sim_report_store(&s, ev, 1);
    assert_false(sim_host_has(&s, &a, 0));
    kvt_offload_get_stats(s.m, &st);
    assert_int_equal(st.host_used_blocks, 0);
    assert_int_equal(st.host_cached_blocks, 0);
    assert_int_equal(st.stores_abandoned, 2);
    assert_int_equal(st.resets, 1);
    assert_int_equal(kvt_pool_num_free(s.gpu), 63);
    sim_store_prompt(&s, &x, 1); /* and the tier fills again */
    assert_true(sim_host_has(&s, &x, 0) && sim_host_has(&s, &x, 1));
    sim_fini(&s);
}

/* vLLM test_reset_waits_for_pending_lazy_store_and_clears_cpu_cache */
static void reset_waits_for_a_lazy_store(void **state)
{
    (void)state;
    sim s;
    sim_init(&s, 16, 32, true, 1, 16);
    sim_req a;
    sim_req_make(&a, "a", 2 * SIM_BS + 1, 1, 2 * SIM_BS + 1, 0);
    sim_admit(&s, &a, 0);
    sim_compute(&s, &a, a.n_tokens);
    sim_finish(&s, &a);
    uint32_t fill[13];
    KVT_OK_(kvt_pool_alloc(s.gpu, 13, fill)); /* a's blocks reach the LRU head */
    sim_build(&s, false);
    assert_int_equal(s.meta.n_stores, 2);
    KVT_ERR_(kvt_offload_reset(s.m), KVT_EBUSY);
    sim_report_store(&s, s.meta.store_event, 1);
    KVT_OK_(kvt_offload_reset(s.m));
    assert_false(sim_host_has(&s, &a, 0));
    KVT_OK_(kvt_pool_free(s.gpu, fill, 13));
    assert_int_equal(kvt_pool_num_free(s.gpu), 15);
    sim_fini(&s);
}

static void preemption_asks_for_a_flush_and_a_resumed_request_rescans_its_blocks(void **state)
{
    (void)state;
    sim s;
    sim_init(&s, 64, 32, false, 1, 64);
    sim_req a;
    sim_req_make(&a, "a", 2 * SIM_BS + 1, 1, 2 * SIM_BS + 1, 0);
    sim_admit(&s, &a, 0);
    sim_compute(&s, &a, a.n_tokens);
    sim_schedule(&s, &a, 1, false);
    sim_build(&s, true);
    assert_true(s.meta.need_flush);
    sim_report_store(&s, s.meta.store_event, 1);
    kvt_offload_stats st;
    sim_schedule(&s, &a, 1, false); /* cursor past both blocks: nothing rescanned */
    kvt_offload_get_stats(s.m, &st);
    assert_int_equal(st.store_skipped_cached, 0);
    /* preempted: the engine frees the blocks, later reallocates and recomputes them */
    KVT_OK_(kvt_pool_free(s.gpu, a.blocks, a.n_blocks));
    KVT_OK_(kvt_pool_reset_prefix_cache(s.gpu));
    KVT_OK_(kvt_pool_alloc(s.gpu, a.n_blocks, a.blocks));
    a.computed = 0;
    sim_compute(&s, &a, a.n_tokens);
    sim_schedule(&s, &a, 1, true); /* resumed: rescans from block 0 */
    sim_build(&s, false);
    assert_false(s.meta.need_flush);
    kvt_offload_get_stats(s.m, &st);
    assert_int_equal(st.store_skipped_cached, 2); /* the new blocks hold what is stored */
    assert_int_equal(s.meta.store_event, KVT_NO_EVENT);
    sim_finish(&s, &a);
    sim_fini(&s);
}

static void caller_errors_are_reported_and_change_nothing(void **state)
{
    (void)state;
    sim s;
    sim_init(&s, 64, 32, false, 1, 64);
    sim_req a;
    sim_req_make(&a, "a", 2 * SIM_BS + 1, 1, 2 * SIM_BS + 1, 0);
    sim_admit_and_store(&s, &a);
    kvt_offload_stats before, after;
    kvt_offload_get_stats(s.m, &before);
    kvt_str ghost = {"ghost", 5}, self = {"a", 1};
    KVT_ERR_(kvt_offload_apply_output(s.m, &ghost, 1, NULL), KVT_ENOENT);
    KVT_ERR_(kvt_offload_apply_output(s.m, &self, 1, NULL), KVT_ESTATE); /* no load */
    kvt_offload_worker_meta_clear(&s.wm);
    KVT_OK_(kvt_offload_worker_meta_add(&s.wm, 0, 1));
    KVT_OK_(kvt_offload_worker_meta_add(&s.wm, 99, 1));
    KVT_ERR_(kvt_offload_apply_output(s.m, NULL, 0, &s.wm), KVT_ERANGE); /* never issued */
    kvt_offload_get_stats(s.m, &after);
    assert_memory_equal(&before, &after, sizeof(before)); /* event 0 was not applied either */
    assert_false(sim_host_has(&s, &a, 0));
    uint32_t bad[3] = {a.blocks[0], a.blocks[1], 64};
    const uint32_t *tab[1] = {bad};
    uint32_t nb[1] = {3};
    KVT_ERR_(kvt_offload_after_alloc(s.m, "z", 1, tab, nb, 0), KVT_ERANGE);
    nb[0] = 2;
    KVT_ERR_(kvt_offload_after_alloc(s.m, "z", 1, tab, nb, 16), KVT_ESTATE); /* no hit */
    KVT_ERR_(kvt_offload_match(s.m, "", 0, a.hashes, 1, 20, 0, &nb[0]), KVT_EINVAL);
    KVT_ERR_(kvt_offload_match_flags(s.m, "a", 1, a.hashes, 2, 40, 0, 0x80, &nb[0]), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "unknown flags 0x80"));
    char long_id[KVT_REQ_ID_MAX + 2];
    memset(long_id, 'x', sizeof(long_id));
    KVT_ERR_(kvt_offload_schedule(s.m, long_id, KVT_REQ_ID_MAX + 1, tab, nb, 0, 1, false),
             KVT_EINVAL);
    kvt_offload_get_stats(s.m, &after);
    assert_memory_equal(&before, &after, sizeof(before));
    sim_report_store(&s, s.meta.store_event, 1);
    sim_finish(&s, &a);
    sim_fini(&s);
}

static void host_tier_size_comes_from_capacity_and_the_smallest_worker(void **state)
{
    (void)state;
    uint32_t n;
    KVT_OK_(kvt_offload_size_host(10ull << 30, 2u << 20, &n));
    assert_int_equal(n, 5120);
    KVT_ERR_(kvt_offload_size_host(3u << 20, 2u << 20, &n), KVT_EINVAL);
    KVT_ERR_(kvt_offload_size_host(1, 0, &n), KVT_EINVAL);
    sim s;
    sim_init(&s, 64, 32, false, 1, 64);
    KVT_ERR_(kvt_offload_lower_host_blocks(s.m, 40), KVT_EINVAL);
    KVT_OK_(kvt_offload_lower_host_blocks(s.m, 20));
    assert_int_equal(kvt_pool_num_blocks(kvt_offload_host_pool(s.m)), 20);
    sim_req a;
    sim_req_make(&a, "a", 2 * SIM_BS + 1, 1, 2 * SIM_BS + 1, 0);
    sim_store_prompt(&s, &a, 1);
    KVT_ERR_(kvt_offload_lower_host_blocks(s.m, 10), KVT_ESTATE);
    sim_fini(&s);
}

static void metrics_count_activity_in_prometheus_text(void **state)
{
    (void)state;
    sim s;
    sim_init(&s, 64, 32, false, 1, 64);
    sim_req a;
    sim_req_make(&a, "a", 3 * SIM_BS + 1, 1, 3 * SIM_BS + 1, 0);
    sim_store_prompt(&s, &a, 1);
    char buf[16384];
    size_t len;
    KVT_OK_(kvt_offload_prometheus(s.m, buf, sizeof(buf), &len));
    KVT_PROMTOOL_OK(buf);
    assert_int_equal(strlen(buf), len);
    assert_non_null(strstr(buf, "# TYPE kvtier_offload_stores_completed_total counter\n"
                                "kvtier_offload_stores_completed_total 3\n"));
    assert_non_null(strstr(buf, "kvtier_offload_stored_bytes_total 3000\n"));
    assert_non_null(strstr(buf, "kvtier_offload_host_cached_blocks 3\n"));
    /* a second prompt sharing 2 of a's 3 blocks: 2 blocks hit, 1 (and the tail) missed */
    sim_req b;
    sim_req_make(&b, "b", 4 * SIM_BS + 1, 1, 2 * SIM_BS, 2);
    KVT_OK_(kvt_pool_reset_prefix_cache(s.gpu));
    uint32_t hit;
    kvt_offload_stats st0, st;
    kvt_offload_get_stats(s.m, &st0); /* a's own admission already missed 48 tokens */
    assert_int_equal(st0.miss_tokens, 3 * SIM_BS);
    KVT_OK_(kvt_offload_match(s.m, "b", 1, b.hashes, b.n_hashes, b.n_tokens, 0, &hit));
    assert_int_equal(hit, 2 * SIM_BS);
    kvt_offload_get_stats(s.m, &st);
    assert_int_equal(st.hit_tokens - st0.hit_tokens, 2 * SIM_BS);
    assert_int_equal(st.miss_tokens - st0.miss_tokens, 2 * SIM_BS);
    assert_int_equal(st.miss_blocks - st0.miss_blocks, 2);
    KVT_OK_(kvt_offload_prometheus(s.m, buf, sizeof(buf), &len));
    KVT_PROMTOOL_OK(buf);
    assert_non_null(strstr(buf, "kvtier_offload_miss_blocks_total 5\n"));
    KVT_OK_(kvt_offload_request_finished(s.m, "b", 1, NULL, NULL, 0));
    assert_non_null(
        strstr(buf, "kvtier_offload_store_skipped_blocks_total{reason=\"host_full\"} 0"));
    char small[64];
    KVT_ERR_(kvt_offload_prometheus(s.m, small, sizeof(small), &len), KVT_ENOSPC);
    assert_true(len > sizeof(small));
    sim_fini(&s);
}

/* ---- a manager over an engine's own GPU pool (kvt_gpu_pool_ops) --------------------------- */

struct ext_log {
    kvt_pool *gpu;
    uint32_t touch_calls, free_calls, touched, freed;
};

static void ext_touch(void *ctx, const uint32_t *ids, uint32_t n)
{
    struct ext_log *l = ctx;
    l->touch_calls++;
    l->touched += n;
    KVT_OK_(kvt_pool_touch(l->gpu, ids, n));
}

static void ext_free(void *ctx, const uint32_t *ids, uint32_t n)
{
    struct ext_log *l = ctx;
    l->free_calls++;
    l->freed += n;
    KVT_OK_(kvt_pool_free(l->gpu, ids, n));
}

static uint32_t ext_scan(void *ctx, uint32_t cap, uint32_t *ids, kvt_pool_key *keys)
{
    (void)ctx;
    (void)cap;
    (void)ids;
    (void)keys;
    return 0;
}

static void engine_pool_is_reached_through_batched_callbacks(void **state)
{
    (void)state;
    struct ext_log log = {0};
    kvt_pool_config pc;
    kvt_pool_config_init(&pc);
    pc.num_blocks = 64;
    KVT_OK_(kvt_pool_create(&pc, &log.gpu)); /* stands for the engine's allocator */
    kvt_offload_config oc;
    kvt_offload_config_init(&oc);
    oc.host_blocks = 32;
    kvt_gpu_pool_ops ops = {ext_touch, ext_free, NULL, NULL};
    kvt_offload *m;

    /* missing callbacks and bad pool configs are refused with a message */
    kvt_gpu_pool_ops none = {0};
    KVT_ERR_(kvt_offload_create_ext(&oc, &pc, &none, &log, &m), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "touch and free"));
    oc.lazy = true;
    KVT_ERR_(kvt_offload_create_ext(&oc, &pc, &ops, &log, &m), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "lru_scan"));
    oc.lazy = false;
    kvt_pool_config bad = pc;
    bad.groups[0].block_size = 24; /* not a multiple of the hash block size */
    KVT_ERR_(kvt_offload_create_ext(&oc, &bad, &ops, &log, &m), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "GPU pool config"));
    kvt_gpu_pool_ops lazy_ops = {ext_touch, ext_free, ext_scan, NULL};
    oc.lazy = true;
    KVT_OK_(kvt_offload_create_ext(&oc, &pc, &lazy_ops, &log, &m));
    kvt_offload_destroy(m);
    oc.lazy = false;
    KVT_OK_(kvt_offload_create_ext(&oc, &pc, &ops, &log, &m));

    /* a 5-block prompt is stored in one event: one touch of 5 blocks, one free of 5 */
    sim_req r;
    sim_req_make(&r, "r", 5 * SIM_BS, 1, 5 * SIM_BS, 0);
    KVT_OK_(kvt_pool_alloc(log.gpu, 5, r.blocks));
    const uint32_t *tab[1] = {r.blocks};
    uint32_t nb[1] = {5}, hit;
    KVT_OK_(kvt_offload_match(m, "r", 1, r.hashes, r.n_hashes, r.n_tokens, 0, &hit));
    KVT_OK_(kvt_offload_after_alloc(m, "r", 1, tab, nb, 0));
    /* without the hashes an engine-pool manager cannot key a block: the plain calls are
     * refused; no hashes at all (a request shorter than a block) stores nothing yet */
    KVT_ERR_(kvt_offload_schedule(m, "r", 1, tab, nb, r.n_tokens, 1, false), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "hashes"));
    KVT_ERR_(kvt_offload_request_finished(m, "r", 1, tab, nb, r.n_tokens), KVT_EINVAL);
    KVT_ERR_(kvt_offload_schedule_hashed(m, "r", 1, tab, nb, NULL, 2, r.n_tokens, 1, false),
             KVT_EINVAL);
    assert_int_equal(kvt_offload_schedule_hashed(m, "r", 1, tab, nb, NULL, 0, r.n_tokens, 1, false),
                     5);
    assert_int_equal(log.touch_calls, 0);
    /* only 3 hashes known yet: 3 blocks stored now, the rest at the final flush */
    assert_int_equal(
        kvt_offload_schedule_hashed(m, "r", 1, tab, nb, r.hashes, 3, r.n_tokens, 1, false), 2);
    assert_int_equal(log.touch_calls, 1);
    assert_int_equal(log.touched, 3);
    kvt_offload_meta meta;
    kvt_offload_meta_init(&meta);
    KVT_OK_(kvt_offload_build_meta(m, false, &meta));
    assert_int_equal(meta.n_stores, 3);
    KVT_OK_(
        kvt_offload_request_finished_hashed(m, "r", 1, tab, nb, r.hashes, r.n_hashes, r.n_tokens));
    assert_int_equal(log.touch_calls, 2);
    assert_int_equal(log.touched, 5);
    int64_t first = meta.store_event;
    KVT_OK_(kvt_offload_build_meta(m, false, &meta));
    assert_int_equal(meta.n_stores, 2);
    kvt_offload_worker_meta wm;
    kvt_offload_worker_meta_init(&wm);
    KVT_OK_(kvt_offload_worker_meta_add(&wm, first, 1));
    KVT_OK_(kvt_offload_worker_meta_add(&wm, meta.store_event, 1));
    KVT_OK_(kvt_offload_apply_output(m, NULL, 0, &wm));
    assert_int_equal(log.free_calls, 2); /* one per completed event */
    assert_int_equal(log.freed, 5);
    for (uint32_t j = 0; j < 5; j++) /* findable under the request's hashes */
        assert_true(sim_host_has(&(sim){.m = m}, &r, j));
    /* the engine frees its own references: every block is free again, nothing pinned */
    KVT_OK_(kvt_pool_free(log.gpu, r.blocks, 5));
    assert_int_equal(kvt_pool_num_free(log.gpu), 63);

    /* a clone loads the whole prefix but the last token: one touch of 4 destinations */
    uint32_t dst[5];
    KVT_OK_(kvt_pool_alloc(log.gpu, 5, dst));
    KVT_OK_(kvt_offload_match(m, "q", 1, r.hashes, r.n_hashes, r.n_tokens, 0, &hit));
    assert_int_equal(hit, 4 * SIM_BS);
    tab[0] = dst;
    KVT_OK_(kvt_offload_after_alloc(m, "q", 1, tab, nb, hit));
    assert_int_equal(log.touch_calls, 3);
    assert_int_equal(log.touched, 9);
    KVT_OK_(kvt_offload_build_meta(m, false, &meta));
    assert_int_equal(meta.n_loads, 4);
    kvt_str q = {"q", 1};
    KVT_OK_(kvt_offload_apply_output(m, &q, 1, NULL));
    assert_int_equal(log.free_calls, 3);
    assert_int_equal(log.freed, 9);
    KVT_OK_(kvt_offload_request_finished_hashed(m, "q", 1, tab, nb, r.hashes, r.n_hashes, hit));
    KVT_OK_(kvt_pool_free(log.gpu, dst, 5));
    assert_int_equal(kvt_pool_num_free(log.gpu), 63);
    kvt_offload_meta_release(&meta);
    kvt_offload_worker_meta_release(&wm);
    kvt_offload_destroy(m);

    /* defer_schedule_pins: two requests' selections reach the pool as one batch, at build_meta */
    oc.defer_schedule_pins = true;
    kvt_pool *gpu = log.gpu;
    memset(&log, 0, sizeof(log));
    log.gpu = gpu;
    KVT_OK_(kvt_offload_create_ext(&oc, &pc, &ops, &log, &m));
    kvt_offload_meta_init(&meta);
    kvt_offload_worker_meta_init(&wm);
    sim_req a, b;
    sim_req_make(&a, "a", 2 * SIM_BS, 2, 2 * SIM_BS, 1);
    sim_req_make(&b, "b", 3 * SIM_BS, 3, 3 * SIM_BS, 2);
    KVT_OK_(kvt_pool_alloc(gpu, 2, a.blocks));
    KVT_OK_(kvt_pool_alloc(gpu, 3, b.blocks));
    const uint32_t *ta[1] = {a.blocks}, *tb[1] = {b.blocks};
    uint32_t na[1] = {2}, nbb[1] = {3};
    KVT_OK_(kvt_offload_after_alloc(m, "a", 1, ta, na, 0));
    KVT_OK_(kvt_offload_after_alloc(m, "b", 1, tb, nbb, 0));
    /* both in one call; a third, malformed one stops it after the two */
    kvt_offload_sched_req qa = {"a", 1, a.n_tokens, 1, 2, a.hashes, ta, na, false, -1};
    kvt_offload_sched_req qb = {"b", 1, b.n_tokens, 1, 3, b.hashes, tb, nbb, false, -1};
    kvt_offload_sched_req qbad = {NULL, 3, 0, 1, 0, NULL, tb, nbb, false, -1};
    kvt_offload_sched_req *batch[3] = {&qa, &qb, &qbad};
    uint32_t done = 99;
    KVT_ERR_(kvt_offload_schedule_many(m, batch, 3, &done), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "schedule_many"));
    assert_int_equal(done, 2);
    assert_int_equal(qa.left, 0);
    assert_int_equal(qb.left, 0);
    assert_int_equal(qbad.left, -1);      /* untouched */
    assert_int_equal(log.touch_calls, 0); /* deferred */
    KVT_OK_(kvt_offload_build_meta(m, false, &meta));
    assert_int_equal(meta.n_stores, 5);
    assert_int_equal(log.touch_calls, 1);
    assert_int_equal(log.touched, 5);
    KVT_OK_(kvt_offload_worker_meta_add(&wm, meta.store_event, 1));
    KVT_OK_(kvt_offload_apply_output(m, NULL, 0, &wm));
    assert_int_equal(log.freed, 5);
    KVT_OK_(kvt_offload_request_finished_hashed(m, "a", 1, ta, na, a.hashes, 2, a.n_tokens));
    KVT_OK_(kvt_offload_request_finished_hashed(m, "b", 1, tb, nbb, b.hashes, 3, b.n_tokens));
    KVT_OK_(kvt_pool_free(gpu, a.blocks, 2));
    KVT_OK_(kvt_pool_free(gpu, b.blocks, 3));
    assert_int_equal(kvt_pool_num_free(gpu), 63);
    kvt_offload_meta_release(&meta);
    kvt_offload_worker_meta_release(&wm);
    kvt_offload_destroy(m);
    kvt_pool_destroy(gpu);
}

/* Configs keep room for fields to come: a create refuses a config whose room is not zero (a
 * field of a newer header than this library), and names the word. */
static void config_room_must_be_zero(void **state)
{
    (void)state;
    kvt_pool_config pc;
    kvt_pool_config_init(&pc);
    pc.num_blocks = 16;
    pc.reserved[5] = 1;
    kvt_pool *gpu = NULL;
    KVT_ERR_(kvt_pool_create(&pc, &gpu), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "reserved word 5"));
    pc.reserved[5] = 0;
    KVT_OK_(kvt_pool_create(&pc, &gpu));
    kvt_offload_config oc;
    kvt_offload_config_init(&oc);
    oc.host_blocks = 8;
    oc.reserved[6] = 42;
    kvt_offload *m = NULL;
    KVT_ERR_(kvt_offload_create(&oc, gpu, &m), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "offload config: reserved word 6"));
    oc.reserved[6] = 0;
    KVT_OK_(kvt_offload_create(&oc, gpu, &m));
    kvt_offload_destroy(m);
    kvt_ec_shard_config sc;
    kvt_ec_shard_config_init(&sc);
    sc.capacity = 1 << 20;
    sc.reserved[0] = 1;
    kvt_ec_shard *sh = NULL;
    KVT_ERR_(kvt_ec_shard_create(&sc, &sh), KVT_EINVAL);
    kvt_pool_destroy(gpu);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(stored_prompt_is_hit_and_loaded_back),
        cmocka_unit_test(config_room_must_be_zero),
        cmocka_unit_test(exact_multiple_prompt_never_hits_its_last_block),
        cmocka_unit_test(eager_skips_blocks_already_in_the_host_tier),
        cmocka_unit_test(blocks_in_flight_are_not_stored_twice),
        cmocka_unit_test(host_tier_evicts_the_oldest_request_first),
        cmocka_unit_test(hit_blocks_move_to_the_back_of_the_host_lru),
        cmocka_unit_test(finishing_during_a_load_defers_cleanup_until_it_completes),
        cmocka_unit_test(finishing_during_a_store_keeps_the_blocks_pinned_until_it_completes),
        cmocka_unit_test(chunked_prefill_stores_only_the_new_blocks),
        cmocka_unit_test(engine_accepting_fewer_tokens_loads_only_the_accepted_blocks),
        cmocka_unit_test(hit_survives_eviction_pressure_between_match_and_allocation),
        cmocka_unit_test(a_second_match_releases_the_first_pin),
        cmocka_unit_test(null_blocks_never_appear_in_transfers),
        cmocka_unit_test(final_flush_stores_the_last_confirmed_blocks),
        cmocka_unit_test(store_completes_only_when_every_worker_reported),
        cmocka_unit_test(failed_store_is_never_findable_and_releases_its_blocks),
        cmocka_unit_test(a_failed_load_drops_its_sources_keys),
        cmocka_unit_test(secondary_keys_make_the_host_copy_findable_at_every_granularity),
        cmocka_unit_test(block_evicted_from_host_while_in_use_on_gpu_is_stored_again),
        cmocka_unit_test(re_store_never_evicts_a_block_in_use_on_the_gpu),
        cmocka_unit_test(lazy_mode_stores_hashed_blocks_at_the_gpu_lru_head),
        cmocka_unit_test(reset_waits_for_an_abandoned_store_and_never_caches_it),
        cmocka_unit_test(reset_waits_for_an_abandoned_load),
        cmocka_unit_test(reset_waits_for_a_lazy_store),
        cmocka_unit_test(released_engine_blocks_let_the_engine_reset_with_stores_in_flight),
        cmocka_unit_test(clear_empties_the_tiers_without_waiting_for_the_workers),
        cmocka_unit_test(preemption_asks_for_a_flush_and_a_resumed_request_rescans_its_blocks),
        cmocka_unit_test(caller_errors_are_reported_and_change_nothing),
        cmocka_unit_test(misaligned_gpu_hit_and_prefix_skip_are_misses),
        cmocka_unit_test(lazy_window_follows_the_upstream_formula),
        cmocka_unit_test(lazy_scan_starts_from_the_head_every_step),
        cmocka_unit_test(nulled_entries_still_cached_on_the_gpu_are_stored),
        cmocka_unit_test(scratch_groups_are_never_stored_or_loaded),
        cmocka_unit_test(mamba_align_states_are_stored_when_handed_over),
        cmocka_unit_test(partial_hash_hits_load_a_partly_filled_block),
        cmocka_unit_test(partial_hash_hits_only_where_the_rules_allow),
        cmocka_unit_test(partial_hash_hits_store_up_to_the_last_state),
        cmocka_unit_test(partial_hash_hits_under_decode_context_parallelism),
        cmocka_unit_test(host_tier_size_comes_from_capacity_and_the_smallest_worker),
        cmocka_unit_test(metrics_count_activity_in_prometheus_text),
        cmocka_unit_test(engine_pool_is_reached_through_batched_callbacks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
