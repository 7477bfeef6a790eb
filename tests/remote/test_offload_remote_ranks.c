/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Engines of tensor parallelism 2 sharing prefixes through the remote tier (issue 41). Each
 * instance is a manager whose remote tier is a lookup-only client (ranks 2, world_size 2) and
 * two workers, each with its own "GPU", host mirror and kvt_remote of its rank; a block's bytes
 * differ by rank (each rank holds other heads), so every byte a rank loads is checked against
 * its own rank's. The ranks publish and withdraw their own parts, told by the scheduler's
 * metadata; a block is a hit only when every rank's part is there, and a part that cannot be
 * read on one rank makes the block invalid for the engine.
 */
#include "offload_inst.h"

#define RANKS 2

typedef struct rank_part {
    unsigned char *kv;
    kvt_layout *layout;
    kvt_mirror *mirror;
    kvt_worker *w;
    kvt_remote *r;
} rank_part;

typedef struct tp {
    sim s;
    kvt_remote *sched;
    rank_part rk[RANKS];
    kvt_offload_worker_meta wm[RANKS];
} tp;

static void tp_open(tp *x, const char *name)
{
    kvt_offload_config oc;
    kvt_offload_config_init(&oc);
    oc.host_blocks = HOST_NB;
    oc.world_size = RANKS;
    oc.remote_miss_ms = g_miss_ms;
    sim_init_cfg(&x->s, GPU_NB, &oc);
    kvt_remote_config c;
    test_remote_config(&c, g_space, name, NULL);
    c.listen_host = NULL;
    c.ranks = RANKS;
    c.rank = KVT_REMOTE_NO_RANK;
    c.hash_len = KVT_BLOCK_HASH_LEN;
    c.hash_seed = SIM_SEED;
    KVT_OK_(kvt_remote_create(&c, &x->sched));
    KVT_OK_(kvt_offload_attach_remote(x->s.m, x->sched));
    for (uint32_t k = 0; k < RANKS; k++) {
        rank_part *p = &x->rk[k];
        sim_host_kv(GPU_NB, KV_BPB, &p->kv, &p->layout);
        kvt_mirror_config mc;
        kvt_mirror_config_init(&mc);
        mc.host_blocks = HOST_NB;
        KVT_OK_(kvt_mirror_create(&mc, p->layout, &p->mirror));
        kvt_worker_config wc;
        kvt_worker_config_init(&wc);
        wc.rank = k;
        wc.copy.threads = 1;
        KVT_OK_(kvt_worker_create(&wc, p->layout, p->mirror, &p->w));
        remote_config_over(&c, p->mirror, name, HOST_NB, KVT_BLOCK_HASH_LEN);
        c.ranks = RANKS;
        c.rank = k;
        KVT_OK_(kvt_remote_create(&c, &p->r));
        KVT_OK_(kvt_worker_attach_remote(p->w, kvt_offload_remote_tier(x->s.m), p->r));
        kvt_offload_worker_meta_init(&x->wm[k]);
    }
}

static void tp_close(tp *x)
{
    sim_fini(&x->s);
    kvt_remote_destroy(x->sched);
    for (uint32_t k = 0; k < RANKS; k++) {
        rank_part *p = &x->rk[k];
        kvt_remote_destroy(p->r); /* finished by the worker's destroy: its stage reads through it */
        kvt_worker_destroy(p->w);
        kvt_mirror_destroy(p->mirror);
        kvt_layout_destroy(p->layout);
        free(p->kv);
        kvt_offload_worker_meta_release(&x->wm[k]);
    }
}

/* Rank k's byte `off` of region `reg` of the block tagged `tag`. */
static unsigned char rank_byte(uint64_t tag, uint32_t k, uint32_t reg, uint32_t off)
{
    return sim_kv_byte(tag ^ ((uint64_t)(k + 1) << 56), reg, off);
}

/* Writes (every rank computes) / checks (every rank loaded) r's first n blocks. */
static void tp_kv(tp *x, const sim_req *r, uint32_t n, bool write)
{
    for (uint32_t k = 0; k < RANKS; k++)
        for (uint32_t j = 0; j < n; j++)
            for (uint32_t reg = 0; reg < 2; reg++) {
                unsigned char *d = sim_kv_block(x->rk[k].kv, GPU_NB, KV_BPB, reg, r->blocks[j]);
                for (uint32_t o = 0; o < KV_BPB; o++) {
                    unsigned char want = rank_byte(sim_tag(r, j), k, reg, o);
                    if (write)
                        d[o] = want;
                    else if (d[o] != want)
                        fail_msg("request %s block %u rank %u region %u byte %u differs", r->id, j,
                                 k, reg, o);
                }
            }
}

/* The metadata to both ranks, their reports aggregated (a request's load finished when both
 * finished it), as vLLM's multiprocess executor does; then copies to completion. */
static void tp_round(tp *x)
{
    kvt_str fin[RANKS][64];
    uint32_t nf[RANKS];
    for (uint32_t k = 0; k < RANKS; k++) {
        const kvt_str *f;
        KVT_OK_(kvt_worker_bind(x->rk[k].w, &x->s.meta));
        KVT_OK_(kvt_worker_get_finished(x->rk[k].w, NULL, &f, &nf[k]));
        assert_true(nf[k] <= 64);
        if (nf[k])
            memcpy(fin[k], f, nf[k] * sizeof(*f));
        KVT_OK_(kvt_worker_build_meta(x->rk[k].w, &x->wm[k]));
    }
    KVT_OK_(kvt_offload_worker_meta_aggregate(&x->wm[0], &x->wm[1]));
    kvt_str both[64];
    uint32_t nb = 0;
    for (uint32_t i = 0; i < nf[0]; i++)
        for (uint32_t j = 0; j < nf[1]; j++)
            if (fin[0][i].len == fin[1][j].len &&
                memcmp(fin[0][i].ptr, fin[1][j].ptr, fin[0][i].len) == 0)
                both[nb++] = fin[0][i];
    KVT_OK_(kvt_offload_apply_output(x->s.m, both, nb, &x->wm[0]));
    for (uint32_t k = 0; k < RANKS; k++) {
        kvt_worker_clear(x->rk[k].w);
        KVT_OK_(kvt_worker_flush(x->rk[k].w)); /* the publications made, the reads landed */
    }
}

static void tp_step(tp *x)
{
    for (int i = 0; i < 4; i++) {
        sim_build(&x->s, false);
        tp_round(x);
    }
}

static void tp_compute_and_store(tp *x, sim_req *p, const char *id, uint32_t seed,
                                 uint32_t n_blocks)
{
    sim_req_make(p, id, n_blocks * SIM_BS + 5, seed, n_blocks * SIM_BS + 5, 0);
    sim_admit(&x->s, p, 0);
    tp_kv(x, p, n_blocks, true);
    sim_compute(&x->s, p, p->n_tokens);
    sim_schedule(&x->s, p, 1, false);
    tp_step(x);
    sim_finish(&x->s, p);
    tp_step(x); /* the step that tells the ranks to publish */
}

static uint32_t g_tp_invalid;

/* y admits prompt `seed`; returns the blocks of its hit that every rank loaded, each of their
 * bytes checked on every rank. */
static uint32_t tp_admit_and_check(tp *y, sim_req *q, const char *id, uint32_t seed,
                                   uint32_t n_blocks)
{
    sim_req_make(q, id, n_blocks * SIM_BS + 5, seed, n_blocks * SIM_BS + 5, 1);
    uint32_t hit = sim_admit(&y->s, q, UINT32_MAX);
    assert_int_equal(hit % SIM_BS, 0);
    tp_step(y);
    uint32_t good = hit / SIM_BS;
    g_tp_invalid = 0;
    for (uint32_t k = 0; k < RANKS; k++) {
        uint32_t inv[GPU_NB];
        uint32_t n = kvt_worker_take_invalid_blocks(y->rk[k].w, inv, GPU_NB);
        g_tp_invalid += n;
        for (uint32_t i = 0; i < n; i++)
            for (uint32_t j = 0; j < good; j++)
                if (q->blocks[j] == inv[i])
                    good = j;
    }
    tp_kv(y, q, good, false);
    sim_finish(&y->s, q);
    return good;
}

static kvt_remote_stats tp_rstats(tp *x, uint32_t k)
{
    kvt_remote_stats st;
    kvt_remote_get_stats(x->rk[k].r, &st);
    return st;
}

static void each_rank_reads_its_own_part_of_what_the_other_engine_stored(void **state)
{
    (void)state;
    NEED_REDIS();
    tp a, b;
    tp_open(&a, "a");
    tp_open(&b, "b");
    sim_req p, q, q2;
    tp_compute_and_store(&a, &p, "p", 3, 9);
    for (uint32_t k = 0; k < RANKS; k++) /* each rank published its part of the 9 blocks */
        assert_int_equal(tp_rstats(&a, k).published, 9);
    kvt_remote_stats ss;
    kvt_remote_get_stats(a.sched, &ss);
    assert_int_equal(ss.published, 0); /* the scheduler's client publishes nothing */
    assert_int_equal(tp_admit_and_check(&b, &q, "q", 3, 9), 9);
    assert_int_equal(g_tp_invalid, 0);
    for (uint32_t k = 0; k < RANKS; k++) {
        assert_int_equal(tp_rstats(&b, k).read_ok, 9);
        assert_int_equal(tp_rstats(&a, k).served_blocks, 9);
    }
    kvt_offload_stats os;
    kvt_offload_get_stats(b.s.m, &os);
    assert_int_equal(os.remote_hit_blocks, 9);
    /* b's host tier has them now: the next request hits there */
    assert_int_equal(tp_admit_and_check(&b, &q2, "q2", 3, 9), 9);
    assert_int_equal(tp_rstats(&b, 0).reads, 1);
    tp_close(&b);
    tp_close(&a);
}

/* Rank 1's part of block 4 changed under a's rank 1: only rank 1's read of it fails, and the
 * block is invalid for the engine (both ranks recompute from there). */
static void a_part_that_fails_on_one_rank_invalidates_the_block(void **state)
{
    (void)state;
    NEED_REDIS();
    tp a, b;
    tp_open(&a, "a");
    tp_open(&b, "b");
    sim_req p, q;
    tp_compute_and_store(&a, &p, "p", 5, 8);
    uint32_t slot;
    assert_true(
        kvt_pool_lookup(kvt_offload_host_pool(a.s.m), p.hashes + 4 * KVT_BLOCK_HASH_LEN, 0, &slot));
    kvt_region reg = kvt_mirror_regions(a.rk[1].mirror)[0];
    ((unsigned char *)(uintptr_t)reg.base)[(size_t)slot * reg.block_bytes + 7] ^= 0xff;
    assert_int_equal(tp_admit_and_check(&b, &q, "q", 5, 8), 4);
    assert_int_equal(g_tp_invalid, 2); /* block 4, reported by both ranks: the scheduler made
                                          it invalid for the engine */
    assert_int_equal(tp_rstats(&b, 0).read_ok, 8);
    assert_int_equal(tp_rstats(&b, 1).read_ok, 7);
    tp_close(&b);
    tp_close(&a);
}

/* Evictions: the scheduler tells its ranks to withdraw what it reuses; a reset withdraws
 * everything. A peer then never gets a part that is not there, and never a wrong byte. */
static void evicted_and_reset_blocks_are_withdrawn_by_every_rank(void **state)
{
    (void)state;
    NEED_REDIS();
    tp a, b;
    tp_open(&a, "a");
    tp_open(&b, "b");
    sim_req p1, p2, q, q2;
    tp_compute_and_store(&a, &p1, "p1", 4, 12);
    tp_compute_and_store(&a, &p2, "p2", 6, 16); /* 28 blocks through 23 host slots */
    for (uint32_t k = 0; k < RANKS; k++)
        assert_true(tp_rstats(&a, k).withdrawn >= 5);
    uint32_t got = tp_admit_and_check(&b, &q, "q", 4, 12);
    assert_true(got < 12);
    for (uint32_t k = 0; k < RANKS; k++) {
        assert_int_equal(tp_rstats(&b, k).read_stale, 0);
        assert_int_equal(tp_rstats(&b, k).read_ok, got);
    }
    KVT_OK_(kvt_offload_reset(a.s.m));
    assert_true(kvt_offload_has_pending(a.s.m)); /* the engine steps until the ranks know */
    tp_step(&a); /* the reset reaches the ranks with the next step */
    assert_false(kvt_offload_has_pending(a.s.m));
    for (uint32_t k = 0; k < RANKS; k++)
        assert_int_equal(tp_rstats(&a, k).published - tp_rstats(&a, k).withdrawn, 0);
    assert_int_equal(tp_admit_and_check(&b, &q2, "q2", 6, 16), 0);
    tp_close(&b);
    tp_close(&a);
}

static void configurations_that_do_not_fit_are_refused(void **state)
{
    (void)state;
    NEED_REDIS();
    kvt_offload_config oc;
    kvt_offload_config_init(&oc);
    oc.host_blocks = HOST_NB;
    oc.world_size = 1; /* a client for engines of two ranks behind a manager of one */
    sim s;
    sim_init_cfg(&s, GPU_NB, &oc);
    kvt_remote_config c;
    test_remote_config(&c, g_space, "a", NULL);
    c.ranks = RANKS;
    c.rank = KVT_REMOTE_NO_RANK;
    c.hash_len = KVT_BLOCK_HASH_LEN;
    kvt_remote *r;
    KVT_OK_(kvt_remote_create(&c, &r));
    KVT_ERR_(kvt_offload_attach_remote(s.m, r), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "world_size"));
    sim_fini(&s);
    /* a worker cannot read through a lookup-only client */
    tp a;
    tp_open(&a, "a");
    kvt_worker *w = a.rk[0].w;
    KVT_ERR_(kvt_worker_attach_remote(w, kvt_offload_remote_tier(a.s.m) + 1, r), KVT_EINVAL);
    /* a worker that has no remote tier is refused publications */
    kvt_offload_meta m;
    kvt_offload_meta_init(&m);
    uint8_t h[KVT_BLOCK_HASH_LEN] = {1};
    KVT_OK_(kvt_offload_meta_add_remote_pub(&m, 1, 3, h, KVT_BLOCK_HASH_LEN));
    kvt_worker *bare;
    kvt_worker_config wc;
    kvt_worker_config_init(&wc);
    KVT_OK_(kvt_worker_create(&wc, a.rk[0].layout, a.rk[0].mirror, &bare));
    KVT_ERR_(kvt_worker_bind(bare, &m), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(), "no remote tier"));
    kvt_worker_destroy(bare);
    kvt_offload_meta_release(&m);
    kvt_remote_destroy(r);
    tp_close(&a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(each_rank_reads_its_own_part_of_what_the_other_engine_stored,
                               each_setup),
        cmocka_unit_test_setup(a_part_that_fails_on_one_rank_invalidates_the_block, each_setup),
        cmocka_unit_test_setup(evicted_and_reset_blocks_are_withdrawn_by_every_rank, each_setup),
        cmocka_unit_test_setup(configurations_that_do_not_fit_are_refused, each_setup),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
