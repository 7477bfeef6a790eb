/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The reference engine (tools/refengine): the batch invariance that makes generated tokens
 * identical across runs, and the engine with and without the host tier (identical tokens,
 * host hits, preemption, nothing left referenced), and its refusal of bad requests.
 */
#include "engine.h"
#include "kvt_test.h"
#include "model.h"

/* Runs tokens[0..n) through a tp=1 rank in chunks of `chunk`, sampling after the last; returns
 * the sampled token; the KV lands in kv (block table: 0, 1, 2, ...). */
static uint32_t prefill(ref_rank *r, ref_kv *kv, const uint32_t *tokens, uint32_t n, uint32_t chunk,
                        const uint32_t *blocks)
{
    uint32_t sampled = UINT32_MAX;
    for (uint32_t at = 0; at < n; at += chunk) {
        uint32_t c = n - at < chunk ? n - at : chunk;
        ref_seq s = {0, c, at, blocks, at + c == n};
        uint32_t out = UINT32_MAX;
        ref_batch b = {c, 1, tokens + at, NULL, &s, &out};
        assert_int_equal(ref_rank_forward(r, kv, &b), 0);
        if (s.sample)
            sampled = out;
    }
    return sampled;
}

static void test_chunking_is_invisible(void **state)
{
    (void)state;
    ref_config c;
    ref_config_default(&c);
    ref_shared *sh = ref_shared_create(&c, 256);
    ref_rank *r = ref_rank_create(&c, 0, 256, sh);
    assert_non_null(r);
    ref_kv a, b;
    assert_int_equal(ref_kv_create(&c, 64, &a), 0);
    assert_int_equal(ref_kv_create(&c, 64, &b), 0);
    uint32_t tok[300], blocks[64];
    uint64_t rng = 5;
    for (uint32_t i = 0; i < 300; i++)
        tok[i] = 1 + kvt_rand_below(&rng, c.vocab - 2);
    for (uint32_t i = 0; i < 64; i++)
        blocks[i] = 63 - i; /* any block order */
    uint32_t t1 = prefill(r, &a, tok, 300, 256, blocks);
    uint32_t t2 = prefill(r, &b, tok, 300, 7, blocks);
    assert_int_equal(t1, t2);
    assert_true(t1 < c.vocab - 1);
    /* every K and V byte of the 300 positions is the same, however the prompt was chunked */
    for (uint32_t g = 0; g < a.n_regions; g++)
        for (uint32_t k = 0; k < (300 + REF_BT - 1) / REF_BT; k++) {
            size_t off = (size_t)blocks[k] * a.block_bytes;
            size_t len = k < 300 / REF_BT ? a.block_bytes : 0;
            if (len)
                assert_memory_equal((char *)a.region[g] + off, (char *)b.region[g] + off, len);
        }
    /* the same sequence batched together with another one: same result */
    ref_kv m;
    assert_int_equal(ref_kv_create(&c, 64, &m), 0);
    uint32_t other[40], both[340], blocks2[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    for (uint32_t i = 0; i < 40; i++)
        other[i] = 1 + kvt_rand_below(&rng, c.vocab - 2);
    /* the first 256 tokens alone, then the rest together with `other` in one batch */
    (void)prefill(r, &m, tok, 256, 256, blocks);
    memcpy(both, tok + 256, 44 * sizeof(uint32_t));
    memcpy(both + 44, other, 40 * sizeof(uint32_t));
    ref_seq s[2] = {{0, 44, 256, blocks, true}, {44, 40, 0, blocks2, true}};
    uint32_t out[2];
    ref_batch bb = {84, 2, both, NULL, s, out};
    assert_int_equal(ref_rank_forward(r, &m, &bb), 0);
    assert_int_equal(out[0], t1);
    ref_kv_destroy(&a);
    ref_kv_destroy(&b);
    ref_kv_destroy(&m);
    ref_rank_destroy(r);
    ref_shared_destroy(sh);
}

/* The engine (tp ranks, paged KV, chunked prefill, fixed tiles, vectorized attention) against
 * the plain double-precision computation of the same model: every generated token is the
 * reference's greedy choice after the same prefix. */
static void check_against_reference(uint32_t tp, uint32_t window)
{
    ref_engine_config cfg;
    ref_engine_config_init(&cfg);
    cfg.model.tp = tp;
    cfg.model.window = window;   /* > 0: odd layers attend to a sliding window */
    cfg.max_batched_tokens = 48; /* several chunks */
    cfg.gpu_blocks = 64;
    char err[256];
    ref_engine *e;
    if (ref_engine_create(&cfg, &e, err, sizeof(err)))
        fail_msg("%s", err);
    enum { N = 120, NEW = 10, IMG_AT = 40 };
    uint32_t tok[N];
    uint64_t rng = 99;
    for (uint32_t i = 0; i < N; i++)
        tok[i] = 1 + kvt_rand_below(&rng, cfg.model.vocab - 2);
    for (uint32_t i = 0; i < REF_IMG_TOKENS; i++)
        tok[IMG_AT + i] = ref_img_token(&cfg.model);
    ref_image_ref im = {IMG_AT, 3};
    ref_request_spec s = {"r", tok, N, &im, 1, NEW};
    if (ref_engine_add(e, &s, err, sizeof(err)))
        fail_msg("%s", err);
    ref_result out;
    uint32_t got = 0;
    for (kvt_wait w = kvt_wait_start(); !got && kvt_wait_left(&w);) {
        if (ref_engine_step(e, err, sizeof(err)) < 0)
            fail_msg("%s", err);
        got = ref_engine_take_finished(e, &out, 1);
    }
    assert_int_equal(got, 1);
    assert_int_equal(out.n_tokens, N + NEW);
    /* the reference, with the image's embedding in place of its placeholders */
    uint8_t px[REF_IMG_BYTES];
    ref_image_pixels(cfg.image_seed, 3, px);
    ref_encoder *enc = ref_encoder_create(&cfg.model);
    float *emb = malloc(ref_embedding_bytes(&cfg.model));
    ref_encoder_run(enc, px, emb);
    const float *embeds[N + NEW] = {0};
    for (uint32_t i = 0; i < REF_IMG_TOKENS; i++)
        embeds[IMG_AT + i] = emb + (size_t)i * cfg.model.d_model;
    uint32_t next[N + NEW];
    assert_int_equal(ref_reference_forward(&cfg.model, out.tokens, embeds, N + NEW - 1, next), 0);
    for (uint32_t t = N - 1; t < N + NEW - 1; t++)
        assert_int_equal(next[t], out.tokens[t + 1]);
    free(out.tokens);
    free(emb);
    ref_encoder_destroy(enc);
    ref_engine_destroy(e);
}

static void test_engine_computes_the_model(void **state)
{
    (void)state;
    check_against_reference(1, 0);
    check_against_reference(2, 0);
    check_against_reference(4, 0);
}

/* A hybrid model (full and sliding-window layers, two KV-cache groups, the window group's
 * blocks behind the window freed and nulled) computes the plain reference as well; a window
 * of 40 tokens is not a multiple of the block. */
static void test_hybrid_engine_computes_the_model(void **state)
{
    (void)state;
    check_against_reference(1, 40);
    check_against_reference(2, 40);
}

static void test_encoder_is_deterministic(void **state)
{
    (void)state;
    ref_config c;
    ref_config_default(&c);
    ref_encoder *e1 = ref_encoder_create(&c), *e2 = ref_encoder_create(&c);
    uint8_t px[REF_IMG_BYTES], px2[REF_IMG_BYTES];
    ref_image_pixels(3, 4, px);
    ref_image_pixels(3, 5, px2);
    char h1[33], h2[33];
    ref_image_hash(px, h1);
    ref_image_hash(px2, h2);
    assert_int_equal(strlen(h1), 32);
    assert_string_not_equal(h1, h2);
    size_t n = ref_embedding_bytes(&c);
    float *a = malloc(n), *b = malloc(n);
    ref_encoder_run(e1, px, a);
    ref_encoder_run(e2, px, b);
    assert_memory_equal(a, b, n);
    ref_encoder_run(e2, px2, b);
    assert_memory_not_equal(a, b, n);
    free(a);
    free(b);
    ref_encoder_destroy(e1);
    ref_encoder_destroy(e2);
}

/* A small chat workload: conversations with a long first turn and short follow-ups, some
 * images; returns every turn's generated tokens (convs x turns x answer). */
struct wl_result {
    uint32_t tok[6][3][8];
    ref_engine_stats st;
    uint32_t leaked_gpu, leaked_host;
    uint32_t host_hit_turns;
};

static void run_workload_w(uint32_t gpu_blocks, uint64_t cpu_bytes, bool lazy, uint32_t tp,
                           uint32_t window, struct wl_result *res)
{
    enum { CONVS = 6, TURNS = 3, ANSWER = 8 };
    ref_engine_config cfg;
    ref_engine_config_init(&cfg);
    cfg.model.tp = tp;
    cfg.model.window = window;
    cfg.gpu_blocks = gpu_blocks;
    cfg.max_batched_tokens = 128;
    cfg.max_running = 4;
    cfg.cpu_bytes = cpu_bytes;
    cfg.lazy = lazy;
    char err[256];
    ref_engine *e;
    if (ref_engine_create(&cfg, &e, err, sizeof(err)))
        fail_msg("%s", err);
    memset(res, 0, sizeof(*res));
    static uint32_t hist[CONVS][2048];
    static ref_image_ref img[CONVS][8];
    uint32_t len[CONVS] = {0}, nimg[CONVS] = {0};
    for (uint32_t t = 0; t < TURNS; t++) {
        for (uint32_t c = 0; c < CONVS; c++) { /* every conversation's turn t at once */
            uint64_t r = c * 1000 + t + 1;
            uint32_t n = t == 0 ? 300 + kvt_rand_below(&r, 100) : 20 + kvt_rand_below(&r, 20);
            for (uint32_t i = 0; i < n; i++)
                hist[c][len[c]++] = 1 + kvt_rand_below(&r, cfg.model.vocab - 2);
            if (c % 2 == 0) {
                img[c][nimg[c]].pos = len[c];
                img[c][nimg[c]++].image = (c + t) % 3;
                for (uint32_t i = 0; i < REF_IMG_TOKENS; i++)
                    hist[c][len[c]++] = ref_img_token(&cfg.model);
            }
            char id[32];
            snprintf(id, sizeof(id), "c%u-t%u", c, t);
            ref_request_spec s = {id, hist[c], len[c], img[c], nimg[c], ANSWER};
            if (ref_engine_add(e, &s, err, sizeof(err)))
                fail_msg("%s", err);
        }
        uint32_t got = 0;
        for (kvt_wait w = kvt_wait_start(); got < CONVS && kvt_wait_left(&w);) {
            if (ref_engine_step(e, err, sizeof(err)) < 0)
                fail_msg("%s", err);
            ref_result out;
            while (ref_engine_take_finished(e, &out, 1) == 1) {
                unsigned c, tt;
                assert_int_equal(sscanf(out.id, "c%u-t%u", &c, &tt), 2);
                assert_int_equal(tt, t);
                assert_int_equal(out.n_tokens, len[c] + ANSWER);
                memcpy(res->tok[c][t], out.tokens + len[c], ANSWER * sizeof(uint32_t));
                res->host_hit_turns += out.host_hit > 0;
                free(out.tokens);
                got++;
            }
        }
        if (got != CONVS) {
            static char desc[8192];
            ref_engine_describe(e, desc, sizeof(desc));
            fail_msg("turn %u: %u of %u requests finished after 20000 steps:\n%s", t, got, CONVS,
                     desc);
        }
        for (uint32_t c = 0; c < CONVS; c++) {
            memcpy(hist[c] + len[c], res->tok[c][t], ANSWER * sizeof(uint32_t));
            len[c] += ANSWER;
        }
    }
    ref_engine_leaks(e, &res->leaked_gpu, &res->leaked_host);
    ref_engine_get_stats(e, &res->st);
    ref_engine_destroy(e);
}

static void run_workload(uint32_t gpu_blocks, uint64_t cpu_bytes, bool lazy, uint32_t tp,
                         struct wl_result *res)
{
    run_workload_w(gpu_blocks, cpu_bytes, lazy, tp, 0, res);
}

static void test_host_tier_changes_nothing_but_the_work(void **state)
{
    (void)state;
    static struct wl_result without, with, lazy;
    /* a GPU tier of 64 blocks (1,008 tokens) holds about two conversations */
    run_workload(64, 0, false, 2, &without);
    run_workload(64, 64u << 20, false, 2, &with);
    run_workload(64, 64u << 20, true, 2, &lazy);
    assert_memory_equal(without.tok, with.tok, sizeof(with.tok));
    assert_memory_equal(without.tok, lazy.tok, sizeof(lazy.tok));
    assert_int_equal(without.st.host_hit_tokens, 0);
    assert_true(with.host_hit_turns > 0);
    assert_true(with.st.host_hit_tokens > 0 && with.st.loaded_bytes > 0);
    assert_true(with.st.prefill_tokens < without.st.prefill_tokens);
    assert_true(lazy.st.host_hit_tokens > 0);
    assert_int_equal(without.leaked_gpu + with.leaked_gpu + lazy.leaked_gpu, 0);
    assert_int_equal(with.leaked_host + lazy.leaked_host, 0);
    assert_int_equal(with.st.images_encoded, 3);
}

/* The hybrid model through the host tier: the same tokens, host hits in both groups (the
 * window group's nulled blocks recovered from the GPU pool's cache when stored), every loaded
 * block verified against the KV computed for its hash, nothing left referenced. */
static void test_hybrid_host_tier_changes_nothing_but_the_work(void **state)
{
    (void)state;
    static struct wl_result without, with;
    run_workload_w(128, 0, false, 2, 40, &without);
    run_workload_w(128, 64u << 20, false, 2, 40, &with);
    assert_memory_equal(without.tok, with.tok, sizeof(with.tok));
    assert_int_equal(without.st.host_hit_tokens, 0);
    assert_true(with.st.host_hit_tokens > 0 && with.st.loaded_bytes > 0);
    assert_true(with.st.prefill_tokens < without.st.prefill_tokens);
    assert_true(with.st.kv_loads_verified > 0);
    assert_int_equal(with.st.kv_blocks_mismatched, 0);
    assert_int_equal(without.leaked_gpu + with.leaked_gpu + with.leaked_host, 0);
}

static void test_preemption_recomputes_the_same(void **state)
{
    (void)state;
    static struct wl_result roomy, tight;
    /* 40 blocks: a 400-token first turn plus another request's does not fit: preemption */
    run_workload(200, 0, false, 1, &roomy);
    run_workload(40, 64u << 20, false, 1, &tight);
    assert_memory_equal(roomy.tok, tight.tok, sizeof(tight.tok));
    assert_int_equal(roomy.st.preemptions, 0);
    assert_true(tight.st.preemptions > 0);
    assert_int_equal(tight.leaked_gpu + tight.leaked_host, 0);
}

static void test_bad_requests_are_refused(void **state)
{
    (void)state;
    ref_engine_config cfg;
    ref_engine_config_init(&cfg);
    char err[256];
    ref_engine *e = NULL;
    cfg.model.tp = 3;
    assert_int_equal(ref_engine_create(&cfg, &e, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "must divide"));
    ref_engine_destroy(e);
    cfg.model.tp = 1;
    cfg.gpu_blocks = 16;
    if (ref_engine_create(&cfg, &e, err, sizeof(err)))
        fail_msg("%s", err);
    uint32_t tok[400];
    for (uint32_t i = 0; i < 400; i++)
        tok[i] = 5;
    ref_request_spec s = {"a", tok, 400, NULL, 0, 4};
    assert_int_equal(ref_engine_add(e, &s, err, sizeof(err)), -1); /* needs 26 blocks of 15 */
    assert_non_null(strstr(err, "KV blocks"));
    s.n_tokens = 100;
    tok[3] = cfg.model.vocab;
    assert_int_equal(ref_engine_add(e, &s, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "out of range"));
    tok[3] = 5;
    ref_image_ref im = {10, 0};
    s.images = &im;
    s.n_images = 1;
    assert_int_equal(ref_engine_add(e, &s, err, sizeof(err)), -1); /* no placeholders there */
    assert_non_null(strstr(err, "placeholder"));
    im.pos = 95;
    assert_int_equal(ref_engine_add(e, &s, err, sizeof(err)), -1);
    s.id = "";
    s.n_images = 0;
    assert_int_equal(ref_engine_add(e, &s, err, sizeof(err)), -1);
    assert_int_equal(ref_engine_pending(e), 0);
    ref_engine_destroy(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chunking_is_invisible),
        cmocka_unit_test(test_encoder_is_deterministic),
        cmocka_unit_test(test_engine_computes_the_model),
        cmocka_unit_test(test_hybrid_engine_computes_the_model),
        cmocka_unit_test(test_host_tier_changes_nothing_but_the_work),
        cmocka_unit_test(test_hybrid_host_tier_changes_nothing_but_the_work),
        cmocka_unit_test(test_preemption_recomputes_the_same),
        cmocka_unit_test(test_bad_requests_are_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
