/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The reference engine's model: a small decoder-only transformer in float32 (RMSNorm, rotary
 * positions, grouped-query attention over a paged KV cache, SwiGLU MLP) and a small "vision
 * encoder" whose embeddings replace placeholder tokens. Weights come from a seed; nothing is
 * downloaded.
 *
 * Tensor parallelism: rank r of tp holds the query heads, KV heads, MLP columns and output
 * rows of its shard; the two row-parallel products (attention output, MLP down) are summed
 * across ranks in rank order (ref_allreduce), so results do not depend on thread timing.
 *
 * Batch invariance: every token's result depends only on its inputs (its token or embedding,
 * its position, the KV of the positions before it), never on which other tokens share its
 * step or how its prompt was chunked. Matrix products run in fixed tiles of at most REF_TILE
 * rows (one BLAS call shape per weight; a tile size whose rows the machine's BLAS kernel
 * computes alike, probed once per process), attention walks positions in order with fixed vector
 * lanes. So a prefix recomputed, loaded from the host tier or computed in another chunking
 * gives bit-identical KV, and generated tokens are identical across runs.
 */
#ifndef KVT_REFENGINE_MODEL_H
#define KVT_REFENGINE_MODEL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#define REF_TILE       32u /* most rows per matrix-product call (fewer where BLAS needs it) */
#define REF_BT         16u /* tokens per KV block */
#define REF_HD         32u /* head dimension */
#define REF_IMG_SIDE   32u /* images: REF_IMG_SIDE^2 RGB pixels (bytes) */
#define REF_PATCH      8u  /* square patches of REF_PATCH^2 pixels: one embedding each */
#define REF_IMG_TOKENS ((REF_IMG_SIDE / REF_PATCH) * (REF_IMG_SIDE / REF_PATCH))
#define REF_IMG_BYTES  (REF_IMG_SIDE * REF_IMG_SIDE * 3u)

typedef struct ref_config {
    uint32_t vocab, d_model, n_layers, n_heads, n_kv_heads, ffn;
    uint32_t tp;     /* ranks; divides n_kv_heads and ffn */
    uint64_t seed;   /* weights */
    uint32_t window; /* > 0: a hybrid model whose odd layers attend to the last `window`
                        positions only (sliding-window attention, their own KV-cache group
                        and block table); 0: full attention everywhere */
} ref_config;

/* Whether layer li attends through a sliding window (and the window group's block table). */
static inline bool ref_layer_windowed(const ref_config *c, uint32_t li)
{
    return c->window && (li & 1u);
}

/* Defaults: vocab 2048, d_model 256, 4 layers, 8 query heads and 4 KV heads of 32, ffn 768. */
void ref_config_default(ref_config *c);
/* 0, or -1 with a message in err (cap bytes) when the shape does not work for tp. */
int ref_config_check(const ref_config *c, char *err, size_t cap);
/* The placeholder token an image's positions carry. */
static inline uint32_t ref_img_token(const ref_config *c)
{
    return c->vocab - 1;
}
/* KV bytes per token on one rank, all layers (K and V). */
uint64_t ref_kv_bytes_per_token(const ref_config *c);

/* One rank's KV cache ("device" memory): per layer a K region and a V region of num_blocks
 * blocks. K blocks are [kv_head][dim][slot] (positions contiguous), V blocks
 * [kv_head][slot][dim]. */
typedef struct ref_kv {
    uint32_t num_blocks, n_regions;
    uint64_t block_bytes; /* per region */
    float **region;       /* 2 * n_layers: K0, V0, K1, V1, ... */
} ref_kv;

int ref_kv_create(const ref_config *c, uint32_t num_blocks, ref_kv *kv);
void ref_kv_destroy(ref_kv *kv);

typedef struct ref_rank ref_rank; /* one rank's weights and scratch */
typedef struct ref_shared ref_shared;

/* What every rank computes this step: n_tok tokens from n_seq sequences. */
typedef struct ref_seq {
    uint32_t first, n;         /* its tokens: rows first .. first + n - 1 of the batch */
    uint32_t start_pos;        /* position of its first token */
    const uint32_t *blocks;    /* block table (covers start_pos + n positions) */
    bool sample;               /* sample a token from its last row */
    const uint32_t *sw_blocks; /* hybrid: the windowed layers' block table (the same length;
                                  blocks wholly before every token's window may be null) */
} ref_seq;

typedef struct ref_batch {
    uint32_t n_tok, n_seq;
    const uint32_t *tokens;     /* n_tok ids */
    const float *const *embeds; /* n_tok: NULL, or d_model floats replacing the token */
    const ref_seq *seqs;
    uint32_t *sampled; /* n_seq: rank 0 writes the greedy token of each sampled seq */
} ref_batch;

/* The ranks' meeting point: a barrier and the buffers the all-reduce sums. */
ref_shared *ref_shared_create(const ref_config *c, uint32_t max_tokens);
void ref_shared_destroy(ref_shared *s);

/* Builds rank r's weight shard (same weights for every tp: shards of one seeded model). */
ref_rank *ref_rank_create(const ref_config *c, uint32_t rank, uint32_t max_tokens,
                          ref_shared *shared);
void ref_rank_destroy(ref_rank *r);
/* Runs the batch on rank r (all tp ranks call it together, each from its own thread), writing
 * the new tokens' K and V into kv. Returns 0. */
int ref_rank_forward(ref_rank *r, ref_kv *kv, const ref_batch *b);

/* The same model computed the plain way, for tests: one sequence, dense, unsharded, in double
 * precision, no paging, no tiles. Writes the greedy next token after each of the n tokens
 * (embeds as in ref_batch, may be NULL) into next[0..n). 0, or -1 out of memory. */
int ref_reference_forward(const ref_config *c, const uint32_t *tokens, const float *const *embeds,
                          uint32_t n, uint32_t *next);

/* ---- vision encoder ------------------------------------------------------------------------ */

/* The pixels of image number id (seeded). */
void ref_image_pixels(uint64_t seed, uint32_t id, uint8_t out[REF_IMG_BYTES]);
/* mm_hash: hex of a 128-bit hash of the pixels (32 characters + NUL). */
void ref_image_hash(const uint8_t px[REF_IMG_BYTES], char out[33]);

typedef struct ref_encoder ref_encoder;
ref_encoder *ref_encoder_create(const ref_config *c);
void ref_encoder_destroy(ref_encoder *e);
/* REF_IMG_TOKENS x d_model floats. */
void ref_encoder_run(ref_encoder *e, const uint8_t px[REF_IMG_BYTES], float *out);
uint64_t ref_embedding_bytes(const ref_config *c);

#endif
