/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The reference engine: a vLLM-like scheduler loop around the model of model.h, with kvtier
 * where an engine would put it.
 *
 *  - Waiting and running queues, chunked prefill under a per-step token budget, continuous
 *    batching of prefills and decodes, preemption (recompute) when GPU blocks run out.
 *  - A GPU tier: a kvt_pool with prefix caching (chained block hashes, the images' mm_hash in
 *    the blocks they cover) over each rank's "device" KV memory (host memory here).
 *  - tp ranks, one thread each, each owning a shard of the KV heads, its own KV memory and
 *    its own kvt_worker (CPU copy engine) and host mirror; the scheduler's kvt_offload sees
 *    every rank's report, so a store completes only once all ranks wrote it.
 *  - Images: a local vision encoder with an encoder cache keyed by mm_hash, or (remote) one
 *    kvt_ec_server per rank receiving embeddings that an encoder process pushes over UCX; a
 *    request waits until its images have arrived on every rank, and every received
 *    embedding is compared with the locally computed one.
 */
#ifndef KVT_REFENGINE_ENGINE_H
#define KVT_REFENGINE_ENGINE_H

#include <stdbool.h>
#include <stdint.h>

#include "model.h"

typedef struct ref_engine_config {
    ref_config model;
    uint32_t gpu_blocks;         /* device KV blocks per rank (null block included) */
    uint32_t max_batched_tokens; /* tokens per step */
    uint32_t max_running;        /* requests running at once */
    uint32_t max_len;            /* longest request, tokens */
    uint64_t cpu_bytes;          /* host tier across all ranks; 0: no offload */
    bool lazy;                   /* lazy stores instead of eager */
    bool remote_images;          /* embeddings arrive from an encoder process */
    uint32_t ec_port;            /* remote: first control port tried (scans upward) */
    uint64_t image_seed;         /* pixels of image i: ref_image_pixels(image_seed, i) */
    uint64_t hash_seed;          /* block hashes */
    uint32_t inject;             /* ref_inject: a fault to show that the KV check catches it */
} ref_engine_config;

/* Faults injected on rank 0 so that anyone can watch the KV check fail (kvtier demo --inject). */
enum ref_inject {
    REF_INJECT_NONE = 0,
    REF_INJECT_CORRUPT, /* a byte of the first block of the first completed load flipped */
    REF_INJECT_SWAP,    /* the first two blocks of the first load of two or more swapped */
    REF_INJECT_DROP     /* every store reported done with its bytes lost (the host copy zeroed) */
};

void ref_engine_config_init(ref_engine_config *c);

typedef struct ref_image_ref {
    uint32_t pos;   /* first placeholder position in the prompt */
    uint32_t image; /* image number */
} ref_image_ref;

typedef struct ref_request_spec {
    const char *id;
    const uint32_t *tokens; /* the prompt, placeholders included */
    uint32_t n_tokens;
    const ref_image_ref *images;
    uint32_t n_images;
    uint32_t max_new; /* tokens to generate (greedy) */
} ref_request_spec;

typedef struct ref_result {
    char id[64];
    uint32_t *tokens; /* prompt + generated (malloc'd, the caller frees) */
    uint32_t n_tokens, n_prompt;
    double ttft_s;     /* arrival to first generated token */
    uint32_t gpu_hit;  /* prompt tokens found in the GPU prefix cache on admission */
    uint32_t host_hit; /* prompt tokens loaded from the host tier */
    uint32_t computed; /* prompt tokens computed (prefill work) */
    uint32_t preemptions;
} ref_result;

typedef struct ref_engine_stats {
    uint64_t steps, prefill_tokens, decode_tokens, preemptions;
    uint64_t gpu_hit_tokens, host_hit_tokens, prompt_tokens;
    uint64_t loaded_bytes, stored_bytes; /* across ranks */
    uint64_t loads;                      /* requests that loaded a host-tier hit */
    double load_seconds;                 /* summed over those loads: issue to every rank reported */
    uint64_t images_encoded;             /* local encoder runs */
    uint64_t images_received, image_bytes_received, image_mismatches; /* remote (per rank) */
    double image_wait_s; /* remote: summed first-need to arrival */
    /* the KV check: a checksum per rank of every block's KV, recorded when the engine first
     * computes a block with that hash; every block loaded from the host tier is compared with
     * it when its load completes, and every block computed again with it when it is cached */
    uint64_t kv_blocks_recorded, kv_blocks_verified, kv_blocks_mismatched;
    uint64_t kv_loads_verified;  /* of the verified: loaded from the host tier */
    char kv_first_mismatch[200]; /* which block, which rank, when */
} ref_engine_stats;

typedef struct ref_engine ref_engine;

/* 0, or -1 with a message in err. */
int ref_engine_create(const ref_engine_config *cfg, ref_engine **out, char *err, size_t cap);
void ref_engine_destroy(ref_engine *e);
/* Announces image number id (remote images: an embedding that arrives for it is checked and
 * kept even before a request needs it). 0, or -1 (out of memory). */
int ref_engine_register_image(ref_engine *e, uint32_t id);
/* Remote images: the control port of rank 0's encoder-cache server (0 otherwise). */
uint32_t ref_engine_ec_port(const ref_engine *e);
/* Queues a request (arrival now). 0, or -1 with a message in err. */
int ref_engine_add(ref_engine *e, const ref_request_spec *spec, char *err, size_t cap);
/* Runs one step (schedule, ranks' forward and transfers, outputs). Returns the number of
 * requests that finished, or -1 with a message in err. */
int ref_engine_step(ref_engine *e, char *err, size_t cap);
/* Moves up to cap finished requests into out; returns how many. */
uint32_t ref_engine_take_finished(ref_engine *e, ref_result *out, uint32_t cap);
/* Requests queued, running or finished but not taken. */
uint32_t ref_engine_pending(const ref_engine *e);
void ref_engine_get_stats(const ref_engine *e, ref_engine_stats *s);
/* A line per live request (state, tokens computed of its length, blocks) and the pool's free
 * blocks, into buf: what a stalled run reports. */
void ref_engine_describe(const ref_engine *e, char *buf, size_t cap);
/* Blocks still referenced in the GPU pool and the host tier once everything finished
 * (0 and 0 when nothing leaked); transfers still in flight count too. */
void ref_engine_leaks(ref_engine *e, uint32_t *gpu_blocks, uint32_t *host_blocks);

#endif
