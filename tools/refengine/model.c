/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The reference engine's transformer and vision encoder (model.h). Float32 throughout; matrix
 * products through OpenBLAS in fixed tiles, attention in hand-vectorized loops whose lane
 * order never depends on the batch (see model.h, "Batch invariance").
 */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvtier/base.h"
#include "model.h"

#define MAX_LEN 16384u /* longest sequence the attention scratch holds */

typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

void ref_config_default(ref_config *c)
{
    memset(c, 0, sizeof(*c));
    c->vocab = 2048;
    c->d_model = 256;
    c->n_layers = 4;
    c->n_heads = 8;
    c->n_kv_heads = 4;
    c->ffn = 768;
    c->tp = 1;
    c->seed = 1;
}

int ref_config_check(const ref_config *c, char *err, size_t cap)
{
    if (c->tp == 0 || c->n_kv_heads % c->tp || c->ffn % c->tp) {
        snprintf(err, cap,
                 "tensor-parallel size %u must divide the %u KV heads and the %u MLP "
                 "columns (1, 2 or 4 with the default model)",
                 c->tp, c->n_kv_heads, c->ffn);
        return -1;
    }
    if (c->n_heads % c->n_kv_heads || c->n_heads * REF_HD != c->d_model || c->vocab < 16) {
        snprintf(err, cap, "model shape does not fit: %u heads of %u for d_model %u", c->n_heads,
                 REF_HD, c->d_model);
        return -1;
    }
    return 0;
}

uint64_t ref_kv_bytes_per_token(const ref_config *c)
{
    return 2ull * c->n_layers * (c->n_kv_heads / c->tp) * REF_HD * sizeof(float);
}

uint64_t ref_embedding_bytes(const ref_config *c)
{
    return (uint64_t)REF_IMG_TOKENS * c->d_model * sizeof(float);
}

static uint32_t round_tile(uint32_t n)
{
    return (n + REF_TILE - 1) / REF_TILE * REF_TILE;
}

static float *falloc(size_t n)
{
    size_t bytes = (n * sizeof(float) + 63) & ~(size_t)63;
    float *p = aligned_alloc(64, bytes ? bytes : 64);
    if (p)
        memset(p, 0, bytes ? bytes : 64);
    return p;
}

/* ---- KV cache ------------------------------------------------------------------------------ */

int ref_kv_create(const ref_config *c, uint32_t num_blocks, ref_kv *kv)
{
    memset(kv, 0, sizeof(*kv));
    kv->num_blocks = num_blocks;
    kv->n_regions = 2 * c->n_layers;
    kv->block_bytes = (uint64_t)(c->n_kv_heads / c->tp) * REF_HD * REF_BT * sizeof(float);
    kv->region = calloc(kv->n_regions, sizeof(float *));
    if (!kv->region)
        return -1;
    for (uint32_t i = 0; i < kv->n_regions; i++) {
        size_t bytes = (size_t)num_blocks * kv->block_bytes;
        kv->region[i] = aligned_alloc(4096, bytes);
        if (!kv->region[i]) {
            ref_kv_destroy(kv);
            return -1;
        }
        memset(kv->region[i], 0, bytes);
    }
    return 0;
}

void ref_kv_destroy(ref_kv *kv)
{
    for (uint32_t i = 0; kv->region && i < kv->n_regions; i++)
        free(kv->region[i]);
    free(kv->region);
    memset(kv, 0, sizeof(*kv));
}

/* ---- seeded weights ------------------------------------------------------------------------ */

/* Tensor id's full [rows x cols] matrix, uniform in [-scale, scale]. */
static void gen(uint64_t seed, uint32_t id, uint32_t rows, uint32_t cols, float scale, float *out)
{
    uint64_t x = (seed + 1) * 0x9E3779B97F4A7C15ull ^ ((uint64_t)id * 0xD1B54A32D192ED03ull);
    for (size_t i = 0; i < (size_t)rows * cols; i++) {
        x += 0x9E3779B97F4A7C15ull;
        uint64_t z = x;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        out[i] = scale * (float)((double)(z >> 40) * 0x1.0p-23 - 1.0);
    }
}

/* Rows [r0, r0 + n) of a full matrix. */
static float *gen_rows(uint64_t seed, uint32_t id, uint32_t rows, uint32_t cols, float scale,
                       uint32_t r0, uint32_t n)
{
    float *full = falloc((size_t)rows * cols), *out = falloc((size_t)n * cols);
    if (full && out) {
        gen(seed, id, rows, cols, scale, full);
        memcpy(out, full + (size_t)r0 * cols, (size_t)n * cols * sizeof(float));
    }
    free(full);
    return out;
}

/* Columns [c0, c0 + n) of a full matrix, as an [rows x n] matrix. */
static float *gen_cols(uint64_t seed, uint32_t id, uint32_t rows, uint32_t cols, float scale,
                       uint32_t c0, uint32_t n)
{
    float *full = falloc((size_t)rows * cols), *out = falloc((size_t)rows * n);
    if (full && out) {
        gen(seed, id, rows, cols, scale, full);
        for (uint32_t r = 0; r < rows; r++)
            memcpy(out + (size_t)r * n, full + (size_t)r * cols + c0, n * sizeof(float));
    }
    free(full);
    return out;
}

/* The model's seeded tensors: one description shared by the ranks' shards and the plain
 * reference, so the two cannot drift apart. Layer l's weight w is tensor 100 + 10 l + w. */
enum { TENSOR_EMBED = 1, TENSOR_LM_HEAD = 2, TENSOR_ENC1 = 3, TENSOR_ENC2 = 4, TENSOR_ENC_POS = 5 };
enum { W_Q, W_K, W_V, W_O, W_GATE, W_UP, W_DOWN };

static float init_scale(uint32_t fan_in)
{
    return 1.0f / sqrtf((float)fan_in) * 1.7f;
}

typedef struct tensor {
    uint32_t id, rows, cols;
    float scale;
} tensor;

static tensor layer_tensor(const ref_config *c, uint32_t layer, int w)
{
    const uint32_t d = c->d_model, qd = c->n_heads * REF_HD, kd = c->n_kv_heads * REF_HD;
    const uint32_t rows[] = {qd, kd, kd, d, c->ffn, c->ffn, d};
    const uint32_t cols[] = {d, d, d, qd, d, d, c->ffn}; /* the fan-in */
    return (tensor){100 + layer * 10 + (uint32_t)w, rows[w], cols[w], init_scale(cols[w])};
}

static tensor lm_head_tensor(const ref_config *c)
{
    return (tensor){TENSOR_LM_HEAD, c->vocab, c->d_model, 2 * init_scale(c->d_model)};
}

static tensor embed_tensor(const ref_config *c)
{
    return (tensor){TENSOR_EMBED, c->vocab, c->d_model, 1.0f};
}

/* Rank rank's shard of layer weight w: rows of the column-parallel weights, columns of the
 * row-parallel ones (W_O, W_DOWN), whose products the ranks sum. */
static float *layer_shard(const ref_config *c, uint32_t layer, int w, uint32_t rank)
{
    tensor t = layer_tensor(c, layer, w);
    bool by_cols = w == W_O || w == W_DOWN;
    uint32_t n = (by_cols ? t.cols : t.rows) / c->tp;
    return by_cols ? gen_cols(c->seed, t.id, t.rows, t.cols, t.scale, rank * n, n)
                   : gen_rows(c->seed, t.id, t.rows, t.cols, t.scale, rank * n, n);
}

/* ---- the ranks ----------------------------------------------------------------------------- */

struct ref_shared {
    pthread_barrier_t barrier;
    uint32_t tp, rows, d;
    float *x;     /* [rows x d] the residual stream, one copy for all ranks */
    float **part; /* tp x [rows x d]: each rank's partial sums */
};

ref_shared *ref_shared_create(const ref_config *c, uint32_t max_tokens)
{
    ref_shared *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->tp = c->tp;
    s->d = c->d_model;
    s->rows = round_tile(max_tokens);
    s->x = falloc((size_t)s->rows * s->d);
    s->part = calloc(c->tp, sizeof(float *));
    bool ok = s->x && s->part && pthread_barrier_init(&s->barrier, NULL, c->tp) == 0;
    for (uint32_t r = 0; ok && r < c->tp; r++)
        ok = (s->part[r] = falloc((size_t)s->rows * s->d)) != NULL;
    if (!ok) {
        for (uint32_t r = 0; s->part && r < c->tp; r++)
            free(s->part[r]);
        free(s->part);
        free(s->x);
        free(s);
        return NULL;
    }
    return s;
}

void ref_shared_destroy(ref_shared *s)
{
    if (!s)
        return;
    pthread_barrier_destroy(&s->barrier);
    for (uint32_t r = 0; r < s->tp; r++)
        free(s->part[r]);
    free(s->part);
    free(s->x);
    free(s);
}

static void pick_kernels(void);

struct layer {
    float *attn_norm, *mlp_norm;
    float *wq, *wk, *wv; /* [heads_local * HD x d] */
    float *wo;           /* [d x n_heads_local * HD] */
    float *wg, *wu;      /* [ffn_local x d] */
    float *wd;           /* [d x ffn_local] */
};

struct ref_rank {
    ref_config c;
    uint32_t rank, nhl, nkvl, ffl, rows;
    ref_shared *sh;
    struct layer *l;
    float *embed, *final_norm, *lm_head; /* replicated; lm_head on rank 0 only */
    float *h, *q, *k, *v, *att, *g, *u, *cs, *logits, *scores;
};

void ref_rank_destroy(ref_rank *r)
{
    if (!r)
        return;
    for (uint32_t i = 0; r->l && i < r->c.n_layers; i++) {
        struct layer *L = &r->l[i];
        float *p[] = {L->attn_norm, L->mlp_norm, L->wq, L->wk, L->wv, L->wo, L->wg, L->wu, L->wd};
        for (size_t j = 0; j < sizeof(p) / sizeof(p[0]); j++)
            free(p[j]);
    }
    free(r->l);
    float *p[] = {r->embed, r->final_norm, r->lm_head, r->h,  r->q,      r->k,     r->v,
                  r->att,   r->g,          r->u,       r->cs, r->logits, r->scores};
    for (size_t j = 0; j < sizeof(p) / sizeof(p[0]); j++)
        free(p[j]);
    free(r);
}

static float *ones(uint32_t n)
{
    float *p = falloc(n);
    for (uint32_t i = 0; p && i < n; i++)
        p[i] = 1.0f;
    return p;
}

ref_rank *ref_rank_create(const ref_config *c, uint32_t rank, uint32_t max_tokens,
                          ref_shared *shared)
{
    ref_rank *r = calloc(1, sizeof(*r));
    if (!r)
        return NULL;
    pick_kernels(); /* before any rank thread runs (the same choice every time) */
    r->c = *c;
    r->rank = rank;
    r->sh = shared;
    r->nhl = c->n_heads / c->tp;
    r->nkvl = c->n_kv_heads / c->tp;
    r->ffl = c->ffn / c->tp;
    r->rows = round_tile(max_tokens);
    uint32_t d = c->d_model;
    bool ok = (r->l = calloc(c->n_layers, sizeof(*r->l))) != NULL;
    for (uint32_t i = 0; ok && i < c->n_layers; i++) {
        struct layer *L = &r->l[i];
        L->attn_norm = ones(d);
        L->mlp_norm = ones(d);
        L->wq = layer_shard(c, i, W_Q, rank);
        L->wk = layer_shard(c, i, W_K, rank);
        L->wv = layer_shard(c, i, W_V, rank);
        L->wo = layer_shard(c, i, W_O, rank);
        L->wg = layer_shard(c, i, W_GATE, rank);
        L->wu = layer_shard(c, i, W_UP, rank);
        L->wd = layer_shard(c, i, W_DOWN, rank);
        ok = L->attn_norm && L->mlp_norm && L->wq && L->wk && L->wv && L->wo && L->wg && L->wu &&
             L->wd;
    }
    if (ok) {
        tensor te = embed_tensor(c), th = lm_head_tensor(c);
        r->embed = gen_rows(c->seed, te.id, te.rows, te.cols, te.scale, 0, te.rows);
        r->final_norm = ones(d);
        r->lm_head =
            rank == 0 ? gen_rows(c->seed, th.id, th.rows, th.cols, th.scale, 0, th.rows) : ones(1);
        size_t R = r->rows;
        r->h = falloc(R * d);
        r->q = falloc(R * r->nhl * REF_HD);
        r->k = falloc(R * r->nkvl * REF_HD);
        r->v = falloc(R * r->nkvl * REF_HD);
        r->att = falloc(R * r->nhl * REF_HD);
        r->g = falloc(R * r->ffl);
        r->u = falloc(R * r->ffl);
        r->cs = falloc(R * REF_HD);
        r->logits = falloc((size_t)REF_TILE * c->vocab);
        r->scores = falloc((size_t)(c->n_heads / c->n_kv_heads) * (MAX_LEN + REF_BT));
        ok = r->embed && r->final_norm && r->lm_head && r->h && r->q && r->k && r->v && r->att &&
             r->g && r->u && r->cs && r->logits && r->scores;
    }
    if (!ok) {
        ref_rank_destroy(r);
        return NULL;
    }
    return r;
}

/* Rows per BLAS call, REF_TILE or fewer: see pick_tile. */
static uint32_t mm_tile = REF_TILE;

/* Y[rows x n] = X[rows x k] W[n x k]^T in one BLAS call. */
static void product(const float *X, uint32_t rows, uint32_t k, const float *W, uint32_t n, float *Y)
{
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, (int)n, (int)k, 1.0f, X, (int)k,
                W, (int)k, 0.0f, Y, (int)n);
}

/* Y[rows x n] = X[rows x k] W[n x k]^T in whole tiles of mm_tile rows: every call has the same
 * shape, and pick_tile made sure a row's result does not depend on its place in the tile or on
 * the rows it shares it with. X and Y hold round_tile(rows) rows. */
static void mm(const float *X, uint32_t rows, uint32_t k, const float *W, uint32_t n, float *Y)
{
    for (uint32_t i = 0; i < rows; i += mm_tile)
        product(X + (size_t)i * k, mm_tile, k, W, n, Y + (size_t)i * n);
}

static void swap_rows(float *X, uint32_t k, uint32_t a, uint32_t b)
{
    for (uint32_t e = 0; e < k; e++) {
        float t = X[(size_t)a * k + e];
        X[(size_t)a * k + e] = X[(size_t)b * k + e];
        X[(size_t)b * k + e] = t;
    }
}

/* Whether a tile of `tile` rows gives every row the bits it gets in row 0, for one shape. */
static bool tile_is_invariant(uint32_t tile, uint32_t k, uint32_t n)
{
    float *W = falloc((size_t)n * k), *X = falloc((size_t)tile * k), *Y = falloc((size_t)tile * n);
    float *R = falloc(n);
    bool ok = W && X && Y && R;
    if (ok) {
        gen(0, 1, n, k, 0.5f, W);
        gen(0, 2, tile, k, 0.5f, X);
        product(X, tile, k, W, n, Y);
        memcpy(R, Y, n * sizeof(float));
    }
    for (uint32_t p = 1; ok && p < tile; p++) { /* row 0's inputs moved to row p */
        swap_rows(X, k, 0, p);
        product(X, tile, k, W, n, Y);
        ok = memcmp(R, Y + (size_t)p * n, n * sizeof(float)) == 0;
        swap_rows(X, k, 0, p);
    }
    free(W);
    free(X);
    free(Y);
    free(R);
    return ok;
}

/* The largest tile (REF_TILE, halved down to 1) whose rows are computed alike. A BLAS kernel
 * may compute some rows of a product in another order than others: OpenBLAS 0.3.21's Haswell
 * and Zen sgemm kernels on one thread treat rows 6..11 of each 12 apart, so with 32-row tiles
 * a token's KV depended on how its prompt was chunked (AMD EPYC machines; Intel ones passed).
 * Probed once, on one thread, with the shapes the default model multiplies. */
static void pick_tile(void)
{
    static const uint32_t shapes[][2] = {{256, 128},  {256, 256}, {768, 256}, {256, 768},
                                         {256, 2048}, {96, 100},  {128, 256}};
    for (uint32_t tile = REF_TILE; tile >= 1; tile /= 2) {
        bool ok = true;
        for (size_t i = 0; ok && i < sizeof(shapes) / sizeof(shapes[0]); i++)
            ok = tile_is_invariant(tile, shapes[i][0], shapes[i][1]);
        mm_tile = tile;
        if (ok)
            return;
    }
}

static void rmsnorm(const float *x, const float *w, uint32_t d, float *out)
{
    float ss = 0;
    for (uint32_t i = 0; i < d; i++)
        ss += x[i] * x[i];
    float s = 1.0f / sqrtf(ss / (float)d + 1e-5f);
    for (uint32_t i = 0; i < d; i++)
        out[i] = x[i] * s * w[i];
}

/* Rotates pairs (i, i + HD/2) of one head by the position's angles (cs: cos then sin). */
static void rope(float *v, const float *cs)
{
    for (uint32_t i = 0; i < REF_HD / 2; i++) {
        float a = v[i], b = v[i + REF_HD / 2], c = cs[i], s = cs[i + REF_HD / 2];
        v[i] = a * c - b * s;
        v[i + REF_HD / 2] = a * s + b * c;
    }
}

static inline v8f load8(const float *p)
{
    v8f x;
    memcpy(&x, p, sizeof(x));
    return x;
}

static inline void store8(float *p, v8f x)
{
    memcpy(p, &x, sizeof(x));
}

/* e^x for x <= 0 (clamped at -87), to about 2 ulp, the same on every call. */
static inline v8f vexp(v8f x)
{
    const v8f lo = (v8f){0} - 87.0f, magic = (v8f){0} + 12582912.0f;
    v8i m = x < lo;
    x = (v8f)(((v8i)lo & m) | ((v8i)x & ~m));
    v8f t = x * 1.44269504f + magic;
    v8i n = (v8i)t - (v8i)magic;
    v8f nf = t - magic;
    v8f r = x - nf * 0.693145752f - nf * 1.42860677e-6f;
    v8f p = 1.0f + r * (1.0f + r * (0.5f + r * (0.166666672f +
                                                r * (0.0416666679f +
                                                     r * (0.00833333377f + r * 0.00138888892f)))));
    v8i e = (n + 127) << 23;
    return p * (v8f)e;
}

/* One token's attention for the rank's heads: q (rotated, nhl heads), positions lo .. npos - 1
 * of the sequence's block table (lo > 0: a sliding window; blocks before lo's are never read,
 * and may be the null block), into out (nhl heads). Built twice, for x86-64-v3 (AVX2, FMA) and for
 * the baseline; ref_rank_create picks one per machine (no ifunc: sanitizers cannot run a
 * resolver), so a machine always computes the same bits. */
typedef void attend_fn(ref_rank *, const ref_kv *, uint32_t, const float *, const uint32_t *,
                       uint32_t, uint32_t, float *);
static attend_fn *attend;

static inline __attribute__((always_inline)) void attend_body(ref_rank *r, const ref_kv *kv,
                                                              uint32_t layer, const float *q,
                                                              const uint32_t *blocks, uint32_t lo,
                                                              uint32_t npos, float *out)
{
    const uint32_t G = r->nhl / r->nkvl, nblk = (npos + REF_BT - 1) / REF_BT, b0 = lo / REF_BT;
    const float *K = kv->region[2 * layer], *V = kv->region[2 * layer + 1];
    const float scale = 1.0f / sqrtf((float)REF_HD);
    for (uint32_t g = 0; g < r->nkvl; g++) {
        for (uint32_t j = 0; j < G; j++) {
            const float *qh = q + (size_t)(g * G + j) * REF_HD;
            float *s = r->scores + (size_t)j * (MAX_LEN + REF_BT);
            for (uint32_t b = b0; b < nblk; b++) {
                const float *kb = K + ((size_t)blocks[b] * r->nkvl + g) * REF_HD * REF_BT;
                v8f a0 = {0}, a1 = {0};
                for (uint32_t d = 0; d < REF_HD; d++) {
                    a0 += qh[d] * load8(kb + d * REF_BT);
                    a1 += qh[d] * load8(kb + d * REF_BT + 8);
                }
                store8(s + b * REF_BT, a0 * scale);
                store8(s + b * REF_BT + 8, a1 * scale);
            }
            float mx = s[lo];
            for (uint32_t p = lo + 1; p < npos; p++)
                mx = s[p] > mx ? s[p] : mx;
            v8f acc = {0};
            for (uint32_t p = b0 * REF_BT; p < nblk * REF_BT; p += 8) {
                v8f e = vexp(load8(s + p) - mx);
                v8i idx = {0, 1, 2, 3, 4, 5, 6, 7};
                idx += (int32_t)p;
                v8i keep = (idx < (int32_t)npos) & (idx >= (int32_t)lo);
                e = (v8f)((v8i)e & keep);
                store8(s + p, e);
                acc += e;
            }
            float total = 0;
            for (int l = 0; l < 8; l++)
                total += acc[l];
            v8f o0 = {0}, o1 = {0}, o2 = {0}, o3 = {0};
            for (uint32_t p = lo; p < npos; p++) {
                const float *vb =
                    V + (((size_t)blocks[p / REF_BT] * r->nkvl + g) * REF_BT + p % REF_BT) * REF_HD;
                float w = s[p];
                o0 += w * load8(vb);
                o1 += w * load8(vb + 8);
                o2 += w * load8(vb + 16);
                o3 += w * load8(vb + 24);
            }
            float inv = 1.0f / total;
            float *oh = out + (size_t)(g * G + j) * REF_HD;
            store8(oh, o0 * inv);
            store8(oh + 8, o1 * inv);
            store8(oh + 16, o2 * inv);
            store8(oh + 24, o3 * inv);
        }
    }
}

__attribute__((noinline, target("arch=x86-64-v3"))) static void
attend_v3(ref_rank *r, const ref_kv *kv, uint32_t layer, const float *q, const uint32_t *blocks,
          uint32_t lo, uint32_t npos, float *out)
{
    attend_body(r, kv, layer, q, blocks, lo, npos, out);
}

__attribute__((noinline)) static void attend_base(ref_rank *r, const ref_kv *kv, uint32_t layer,
                                                  const float *q, const uint32_t *blocks,
                                                  uint32_t lo, uint32_t npos, float *out)
{
    attend_body(r, kv, layer, q, blocks, lo, npos, out);
}

static void pick_kernels(void)
{
    static bool picked;
    if (picked)
        return;
    picked = true;
    /* one BLAS thread per call: the ranks are the parallelism, and the process-wide setting is
     * made here, before any rank thread calls into BLAS */
    openblas_set_num_threads(1);
    pick_tile();
    __builtin_cpu_init();
    attend =
        __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? attend_v3 : attend_base;
}

/* Sums the ranks' partials into x (each rank a share of the rows, in rank order) and waits
 * until every rank has its result. */
static void allreduce(ref_rank *r, uint32_t n_tok)
{
    ref_shared *s = r->sh;
    pthread_barrier_wait(&s->barrier);
    uint32_t per = (n_tok + s->tp - 1) / s->tp, lo = r->rank * per;
    uint32_t hi = lo + per < n_tok ? lo + per : n_tok;
    for (uint32_t t = lo; t < hi; t++) {
        float *x = s->x + (size_t)t * s->d;
        for (uint32_t i = 0; i < s->d; i++) {
            float sum = 0;
            for (uint32_t k = 0; k < s->tp; k++)
                sum += s->part[k][(size_t)t * s->d + i];
            x[i] += sum;
        }
    }
    pthread_barrier_wait(&s->barrier);
}

int ref_rank_forward(ref_rank *r, ref_kv *kv, const ref_batch *b)
{
    const ref_config *c = &r->c;
    const uint32_t d = c->d_model, T = b->n_tok, qd = r->nhl * REF_HD, kd = r->nkvl * REF_HD;
    ref_shared *sh = r->sh;
    /* embeddings (each rank a share of the rows) and the rotary angles of every row */
    uint32_t per = (T + sh->tp - 1) / sh->tp, lo = r->rank * per;
    for (uint32_t t = lo; t < T && t < lo + per; t++) {
        const float *e =
            b->embeds && b->embeds[t] ? b->embeds[t] : r->embed + (size_t)b->tokens[t] * d;
        memcpy(sh->x + (size_t)t * d, e, d * sizeof(float));
    }
    for (uint32_t s = 0; s < b->n_seq; s++) {
        const ref_seq *q = &b->seqs[s];
        for (uint32_t i = 0; i < q->n; i++) {
            float *cs = r->cs + (size_t)(q->first + i) * REF_HD;
            float pos = (float)(q->start_pos + i);
            for (uint32_t k = 0; k < REF_HD / 2; k++) {
                float ang = pos * powf(10000.0f, -2.0f * (float)k / (float)REF_HD);
                cs[k] = cosf(ang);
                cs[k + REF_HD / 2] = sinf(ang);
            }
        }
    }
    pthread_barrier_wait(&sh->barrier);
    float *part = sh->part[r->rank];
    for (uint32_t li = 0; li < c->n_layers; li++) {
        struct layer *L = &r->l[li];
        float *Kc = kv->region[2 * li], *Vc = kv->region[2 * li + 1];
        for (uint32_t t = 0; t < T; t++)
            rmsnorm(sh->x + (size_t)t * d, L->attn_norm, d, r->h + (size_t)t * d);
        mm(r->h, T, d, L->wq, qd, r->q);
        mm(r->h, T, d, L->wk, kd, r->k);
        mm(r->h, T, d, L->wv, kd, r->v);
        const bool win = ref_layer_windowed(c, li); /* its own group's block table */
        for (uint32_t s = 0; s < b->n_seq; s++) {
            const ref_seq *q = &b->seqs[s];
            const uint32_t *tab = win ? q->sw_blocks : q->blocks;
            for (uint32_t i = 0; i < q->n; i++) {
                uint32_t t = q->first + i, pos = q->start_pos + i;
                const float *cs = r->cs + (size_t)t * REF_HD;
                for (uint32_t h = 0; h < r->nhl; h++)
                    rope(r->q + (size_t)t * qd + h * REF_HD, cs);
                uint32_t blk = tab[pos / REF_BT], slot = pos % REF_BT;
                for (uint32_t g = 0; g < r->nkvl; g++) {
                    float *kr = r->k + (size_t)t * kd + g * REF_HD;
                    rope(kr, cs);
                    float *kb = Kc + ((size_t)blk * r->nkvl + g) * REF_HD * REF_BT;
                    for (uint32_t e = 0; e < REF_HD; e++)
                        kb[e * REF_BT + slot] = kr[e];
                    memcpy(Vc + (((size_t)blk * r->nkvl + g) * REF_BT + slot) * REF_HD,
                           r->v + (size_t)t * kd + g * REF_HD, REF_HD * sizeof(float));
                }
            }
        }
        for (uint32_t s = 0; s < b->n_seq; s++) {
            const ref_seq *q = &b->seqs[s];
            for (uint32_t i = 0; i < q->n; i++) {
                uint32_t t = q->first + i, npos = q->start_pos + i + 1;
                uint32_t from = win && npos > c->window ? npos - c->window : 0;
                attend(r, kv, li, r->q + (size_t)t * qd, win ? q->sw_blocks : q->blocks, from, npos,
                       r->att + (size_t)t * qd);
            }
        }
        mm(r->att, T, qd, L->wo, d, part);
        allreduce(r, T);
        for (uint32_t t = 0; t < T; t++)
            rmsnorm(sh->x + (size_t)t * d, L->mlp_norm, d, r->h + (size_t)t * d);
        mm(r->h, T, d, L->wg, r->ffl, r->g);
        mm(r->h, T, d, L->wu, r->ffl, r->u);
        for (size_t i = 0; i < (size_t)T * r->ffl; i++) {
            float gv = r->g[i];
            r->g[i] = gv / (1.0f + expf(-gv)) * r->u[i];
        }
        mm(r->g, T, r->ffl, L->wd, d, part);
        allreduce(r, T);
    }
    if (r->rank != 0)
        return 0;
    /* greedy sampling of the sequences that asked, REF_TILE at a time */
    uint32_t idx[REF_TILE], n = 0;
    for (uint32_t s = 0; s <= b->n_seq; s++) {
        if (s < b->n_seq && b->seqs[s].sample)
            idx[n++] = s;
        if (n == REF_TILE || (s == b->n_seq && n > 0)) {
            for (uint32_t i = 0; i < n; i++) {
                const ref_seq *q = &b->seqs[idx[i]];
                rmsnorm(sh->x + (size_t)(q->first + q->n - 1) * d, r->final_norm, d,
                        r->h + (size_t)i * d);
            }
            mm(r->h, n, d, r->lm_head, c->vocab, r->logits);
            for (uint32_t i = 0; i < n; i++) {
                const float *lg = r->logits + (size_t)i * c->vocab;
                uint32_t best = 0;
                for (uint32_t v = 1; v < c->vocab - 1; v++) /* never the image placeholder */
                    best = lg[v] > lg[best] ? v : best;
                b->sampled[idx[i]] = best;
            }
            n = 0;
        }
    }
    return 0;
}

/* ---- the plain reference ------------------------------------------------------------------ */

static void dnorm(const double *x, uint32_t d, double *out)
{
    double ss = 0;
    for (uint32_t i = 0; i < d; i++)
        ss += x[i] * x[i];
    double s = 1.0 / sqrt(ss / d + 1e-5);
    for (uint32_t i = 0; i < d; i++)
        out[i] = x[i] * s;
}

/* out[rows] = W[rows x cols] in */
static void dmv(const float *W, uint32_t rows, uint32_t cols, const double *in, double *out)
{
    for (uint32_t r = 0; r < rows; r++) {
        double s = 0;
        for (uint32_t k = 0; k < cols; k++)
            s += (double)W[(size_t)r * cols + k] * in[k];
        out[r] = s;
    }
}

static void drope(double *v, uint32_t pos)
{
    for (uint32_t i = 0; i < REF_HD / 2; i++) {
        double ang = pos * pow(10000.0, -2.0 * i / REF_HD), c = cos(ang), s = sin(ang);
        double a = v[i], b = v[i + REF_HD / 2];
        v[i] = a * c - b * s;
        v[i + REF_HD / 2] = a * s + b * c;
    }
}

int ref_reference_forward(const ref_config *c0, const uint32_t *tokens, const float *const *embeds,
                          uint32_t n, uint32_t *next)
{
    ref_config c = *c0;
    c.tp = 1;
    const uint32_t d = c.d_model, nh = c.n_heads, nkv = c.n_kv_heads, G = nh / nkv;
    const uint32_t qd = nh * REF_HD, kd = nkv * REF_HD;
    float *full =
        falloc((size_t)c.vocab * d > (size_t)c.ffn * d ? (size_t)c.vocab * d : (size_t)c.ffn * d);
    float *wq = falloc((size_t)qd * d), *wk = falloc((size_t)kd * d), *wv = falloc((size_t)kd * d);
    float *wo = falloc((size_t)d * qd), *wg = falloc((size_t)c.ffn * d);
    float *wu = falloc((size_t)c.ffn * d), *wd = falloc((size_t)d * c.ffn);
    double *x = calloc((size_t)n * d, sizeof(double)), *K = calloc((size_t)n * kd, sizeof(double));
    double *V = calloc((size_t)n * kd, sizeof(double)), *h = calloc(d, sizeof(double));
    double *q = calloc(qd, sizeof(double)), *att = calloc(qd, sizeof(double));
    double *o = calloc(d > c.vocab ? d : c.vocab, sizeof(double)), *p = calloc(n, sizeof(double));
    double *g = calloc(c.ffn, sizeof(double)), *u = calloc(c.ffn, sizeof(double));
    int rc = -1;
    if (!full || !wq || !wk || !wv || !wo || !wg || !wu || !wd || !x || !K || !V || !h || !q ||
        !att || !o || !p || !g || !u)
        goto out;
    tensor te = embed_tensor(&c), th = lm_head_tensor(&c);
    gen(c.seed, te.id, te.rows, te.cols, te.scale, full);
    for (uint32_t t = 0; t < n; t++)
        for (uint32_t i = 0; i < d; i++)
            x[(size_t)t * d + i] =
                embeds && embeds[t] ? embeds[t][i] : full[(size_t)tokens[t] * d + i];
    for (uint32_t li = 0; li < c.n_layers; li++) {
        float *w[] = {wq, wk, wv, wo, wg, wu, wd}; /* in W_Q .. W_DOWN order */
        for (int k = W_Q; k <= W_DOWN; k++) {
            tensor t = layer_tensor(&c, li, k);
            gen(c.seed, t.id, t.rows, t.cols, t.scale, w[k]);
        }
        for (uint32_t t = 0; t < n; t++) { /* keys and values of every position first */
            dnorm(x + (size_t)t * d, d, h);
            dmv(wk, kd, d, h, K + (size_t)t * kd);
            dmv(wv, kd, d, h, V + (size_t)t * kd);
            for (uint32_t k = 0; k < nkv; k++)
                drope(K + (size_t)t * kd + k * REF_HD, t);
        }
        for (uint32_t t = 0; t < n; t++) { /* causal attention, then the MLP */
            dnorm(x + (size_t)t * d, d, h);
            dmv(wq, qd, d, h, q);
            for (uint32_t hh = 0; hh < nh; hh++) {
                double *qh = q + hh * REF_HD, mx = -1e300, sum = 0;
                drope(qh, t);
                const uint32_t kv = hh / G;
                const uint32_t lo = ref_layer_windowed(&c, li) && t + 1 > c.window
                                        ? t + 1 - c.window
                                        : 0; /* a sliding window: the last `window` positions */
                for (uint32_t j = lo; j <= t; j++) {
                    double s = 0;
                    for (uint32_t e = 0; e < REF_HD; e++)
                        s += qh[e] * K[(size_t)j * kd + kv * REF_HD + e];
                    p[j] = s / sqrt((double)REF_HD);
                    mx = p[j] > mx ? p[j] : mx;
                }
                for (uint32_t j = lo; j <= t; j++)
                    sum += p[j] = exp(p[j] - mx);
                for (uint32_t e = 0; e < REF_HD; e++) {
                    double a = 0;
                    for (uint32_t j = lo; j <= t; j++)
                        a += p[j] * V[(size_t)j * kd + kv * REF_HD + e];
                    att[hh * REF_HD + e] = a / sum;
                }
            }
            dmv(wo, d, qd, att, o);
            double *xt = x + (size_t)t * d;
            for (uint32_t i = 0; i < d; i++)
                xt[i] += o[i];
            dnorm(xt, d, h);
            dmv(wg, c.ffn, d, h, g);
            dmv(wu, c.ffn, d, h, u);
            for (uint32_t i = 0; i < c.ffn; i++)
                g[i] = g[i] / (1.0 + exp(-g[i])) * u[i];
            dmv(wd, d, c.ffn, g, o);
            for (uint32_t i = 0; i < d; i++)
                xt[i] += o[i];
        }
    }
    gen(c.seed, th.id, th.rows, th.cols, th.scale, full);
    for (uint32_t t = 0; t < n; t++) {
        dnorm(x + (size_t)t * d, d, h);
        dmv(full, c.vocab, d, h, o);
        uint32_t best = 0;
        for (uint32_t v = 1; v < c.vocab - 1; v++)
            best = o[v] > o[best] ? v : best;
        next[t] = best;
    }
    rc = 0;
out:
    free(full), free(wq), free(wk), free(wv), free(wo), free(wg), free(wu), free(wd);
    free(x), free(K), free(V), free(h), free(q), free(att), free(o), free(p), free(g), free(u);
    return rc;
}

/* ---- vision encoder ------------------------------------------------------------------------ */

struct ref_encoder {
    uint32_t d;
    float *w1, *w2, *pos, *in, *h, *o;
};

void ref_image_pixels(uint64_t seed, uint32_t id, uint8_t out[REF_IMG_BYTES])
{
    uint64_t x = (seed ^ 0x1a2b3c4du) * 0x9E3779B97F4A7C15ull + id * 0xD1B54A32D192ED03ull + 1;
    for (uint32_t i = 0; i < REF_IMG_BYTES; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out[i] = (uint8_t)(x >> 24);
    }
}

void ref_image_hash(const uint8_t px[REF_IMG_BYTES], char out[33])
{
    uint8_t h[16];
    kvt_hash128(px, REF_IMG_BYTES, 0x696d67, h);
    for (int i = 0; i < 16; i++)
        snprintf(out + 2 * i, 3, "%02x", h[i]);
}

ref_encoder *ref_encoder_create(const ref_config *c)
{
    ref_encoder *e = calloc(1, sizeof(*e));
    if (!e)
        return NULL;
    pick_kernels(); /* the tile its products use */
    const uint32_t pd = REF_PATCH * REF_PATCH * 3, d = c->d_model;
    e->d = d;
    e->w1 = falloc((size_t)d * pd);
    e->w2 = falloc((size_t)d * d);
    e->pos = falloc((size_t)REF_IMG_TOKENS * d);
    e->in = falloc((size_t)round_tile(REF_IMG_TOKENS) * pd);
    e->h = falloc((size_t)round_tile(REF_IMG_TOKENS) * d);
    e->o = falloc((size_t)round_tile(REF_IMG_TOKENS) * d);
    if (!e->w1 || !e->w2 || !e->pos || !e->in || !e->h || !e->o) {
        ref_encoder_destroy(e);
        return NULL;
    }
    gen(c->seed, TENSOR_ENC1, d, pd, 1.7f / sqrtf((float)pd), e->w1);
    gen(c->seed, TENSOR_ENC2, d, d, 1.7f / sqrtf((float)d), e->w2);
    gen(c->seed, TENSOR_ENC_POS, REF_IMG_TOKENS, d, 0.1f, e->pos);
    return e;
}

void ref_encoder_destroy(ref_encoder *e)
{
    if (!e)
        return;
    free(e->w1);
    free(e->w2);
    free(e->pos);
    free(e->in);
    free(e->h);
    free(e->o);
    free(e);
}

void ref_encoder_run(ref_encoder *e, const uint8_t px[REF_IMG_BYTES], float *out)
{
    const uint32_t side = REF_IMG_SIDE / REF_PATCH, pd = REF_PATCH * REF_PATCH * 3, d = e->d;
    for (uint32_t p = 0; p < REF_IMG_TOKENS; p++) { /* patch p: row p / side, column p % side */
        float *in = e->in + (size_t)p * pd;
        for (uint32_t y = 0; y < REF_PATCH; y++)
            for (uint32_t x = 0; x < REF_PATCH * 3; x++) {
                uint32_t py = (p / side) * REF_PATCH + y, px0 = (p % side) * REF_PATCH * 3 + x;
                in[y * REF_PATCH * 3 + x] = px[py * REF_IMG_SIDE * 3 + px0] / 255.0f - 0.5f;
            }
    }
    mm(e->in, REF_IMG_TOKENS, pd, e->w1, d, e->h);
    for (size_t i = 0; i < (size_t)REF_IMG_TOKENS * d; i++)
        e->h[i] = e->h[i] / (1.0f + expf(-e->h[i]));
    mm(e->h, REF_IMG_TOKENS, d, e->w2, d, e->o);
    for (size_t i = 0; i < (size_t)REF_IMG_TOKENS * d; i++)
        out[i] = e->o[i] + e->pos[i];
}
