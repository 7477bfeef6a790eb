/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvtier block pool: reference-counted KV blocks with an LRU free queue and a prefix-hash index.
 *
 * The same structure serves an engine's GPU blocks and kvtier's host and disk tiers, with the
 * semantics of vLLM's BlockPool:
 *   - Block 0 is the null block. It is never handed out, counted, freed, touched or copied;
 *     ids 1..num_blocks-1 are usable.
 *   - Every block with no reference sits in the free queue, ordered for eviction: the head is
 *     the least recently used block and is reused first. A free block may still carry hash keys
 *     (it is "cached"): it can be found by lookups and revived with touch until it is reused.
 *   - kvt_pool_alloc pops blocks from the head; a popped block loses its keys (a "removed"
 *     event per key) and gets one reference.
 *   - kvt_pool_free drops one reference per listed id and appends the blocks that reach zero to
 *     the tail in the order given, so the first one listed is evicted first among them.
 *   - A block carries up to keys_per_block keys (hash bytes + group id): the first inserted is
 *     its primary key, later ones are secondary keys with their own token counts (finer-grained
 *     prefixes). Several blocks may carry the same key; a lookup returns one of them.
 *
 * Errors: every call validates all its arguments before changing anything, so a failing call
 * leaves the pool exactly as it was (a double free, an id out of range, a null-block key).
 *
 * Thread rules: a pool is not thread-safe; one thread (the scheduler) owns it. Nothing
 * allocates after kvt_pool_create.
 */
#ifndef KVTIER_POOL_H
#define KVTIER_POOL_H

#include "kvtier/base.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVT_NULL_BLOCK     0u         /* id of the null block */
#define KVT_BLOCK_NONE     UINT32_MAX /* "no block" (end of an iteration, a miss) */
#define KVT_HASH_MAX       32u        /* longest block hash, bytes (sha256) */
#define KVT_MAX_GROUPS     32u        /* most KV cache groups a pool indexes */
#define KVT_BLOCK_HASH_LEN 16u        /* bytes produced by kvt_hash_block (XXH3-128) */

/* How a KV cache group reuses cached blocks (vLLM's find_longest_cache_hit per spec). */
enum kvt_group_kind {
    KVT_GROUP_FULL = 0,    /* full attention: a hit is a run of cached blocks from the start */
    KVT_GROUP_SLIDING = 1, /* sliding window: only the last ceil((window-1)/block) blocks
                              before the hit point are needed; earlier ones are null */
    KVT_GROUP_MAMBA = 2,   /* state-space layers: only the last block's state is needed */
    /* Not prefix-cacheable (vLLM's prefix_cacheable False): never cached, searched, stored,
     * loaded, in events or in the lazy window; their block size need not be a multiple (or a
     * divisor) of hash_block_size and does not enter the scheduler block size. */
    KVT_GROUP_SCRATCH = 3, /* short scratch or hot-set groups (HiSparse) */
    KVT_GROUP_RING = 4,    /* circular-buffer attention (CircularBufferSpec) */
    /* Mamba in vLLM's `align` mode: a state exists only at block boundaries and its block is
     * not stable by position, so an offload manager stores it only when the engine hands it
     * over (kvt_offload_boundary_states), never by scanning the table. Searched as Mamba. */
    KVT_GROUP_MAMBA_ALIGN = 5
};

/* True for the kinds whose blocks can be cached and reused (full, sliding window, Mamba). */
static inline bool kvt_group_kind_cacheable(uint32_t kind)
{
    return kind <= KVT_GROUP_MAMBA || kind == KVT_GROUP_MAMBA_ALIGN;
}

typedef struct kvt_group_spec {
    uint32_t kind;           /* kvt_group_kind */
    uint32_t block_size;     /* tokens per block, already multiplied by the context-parallel
                                world size; a multiple of hash_block_size */
    uint32_t sliding_window; /* tokens; KVT_GROUP_SLIDING only */
} kvt_group_spec;

typedef struct kvt_pool_config {
    uint32_t num_blocks;           /* including the null block; >= 2 */
    uint32_t hash_len;             /* bytes per block hash, 1..KVT_HASH_MAX; default 16 */
    uint32_t keys_per_block;       /* primary + secondary keys a block may carry; default 1 */
    uint32_t event_capacity;       /* cache events kept between kvt_pool_take_events calls;
                                      0 disables events (default) */
    uint32_t hash_block_size;      /* tokens covered by each hash searched; default 16 */
    uint32_t scheduler_block_size; /* hit lengths are multiples of it; 0 = LCM of the groups'
                                      block sizes (default) */
    bool eagle;                    /* EAGLE speculative decoding: drop the last matched block */
    uint32_t n_groups;             /* KV cache groups (key group ids 0..n_groups-1); default 1 */
    kvt_group_spec groups[KVT_MAX_GROUPS]; /* default: groups[0] full attention, 16 tokens */
    /* room for fields to come, so the struct keeps its size: zero (as *_config_init
     * leaves it); a create refuses a config whose room is not zero */
    uint64_t reserved[8];
} kvt_pool_config;

typedef struct kvt_pool kvt_pool;

/* Fills defaults: 16-byte hashes, one key per block, one full-attention group of 16 tokens,
 * events off. num_blocks must still be set. */
KVT_API void kvt_pool_config_init(kvt_pool_config *cfg);
/* Checks a configuration as kvt_pool_create would, without creating anything; on success
 * *scheduler_block_size (may be NULL) receives the scheduler block size the pool would use
 * (the configured one, or the LCM of the groups' block sizes). */
KVT_API int kvt_pool_config_validate(const kvt_pool_config *cfg, uint32_t *scheduler_block_size);
/* Creates a pool; everything it will need is allocated here. */
KVT_API int kvt_pool_create(const kvt_pool_config *cfg, kvt_pool **out);
KVT_API void kvt_pool_destroy(kvt_pool *pool);

/* Copies the configuration the pool was created with. */
KVT_API void kvt_pool_get_config(const kvt_pool *pool, kvt_pool_config *cfg);
/* Total blocks, the null block included. */
KVT_API uint32_t kvt_pool_num_blocks(const kvt_pool *pool);
/* Blocks in the free queue (vLLM get_num_free_blocks): includes evictable cached blocks. */
KVT_API uint32_t kvt_pool_num_free(const kvt_pool *pool);
/* Blocks carrying at least one key. */
KVT_API uint32_t kvt_pool_num_cached(const kvt_pool *pool);
/* Fraction of usable blocks that are referenced: 1 - free / (num_blocks - 1). */
KVT_API double kvt_pool_usage(const kvt_pool *pool);

/* Takes n blocks from the head of the free queue into ids[0..n). Keys of reused blocks are
 * dropped (removed events). KVT_ENOSPC if fewer than n are free. */
KVT_API int kvt_pool_alloc(kvt_pool *pool, uint32_t n, uint32_t *ids);
/* Adds one reference to each listed block, taking free ones out of the free queue (prefix hit,
 * pin). The null block is skipped. */
KVT_API int kvt_pool_touch(kvt_pool *pool, const uint32_t *ids, uint32_t n);
/* Drops one reference per listed id (an id may repeat); blocks reaching zero go to the tail of
 * the free queue in list order. The null block is skipped. KVT_ESTATE if any block would drop
 * below zero references (nothing is changed). */
KVT_API int kvt_pool_free(kvt_pool *pool, const uint32_t *ids, uint32_t n);

/* Registers key (hash_len bytes of hash, group) on a referenced block, with the number of
 * tokens the key covers (a primary key covers the whole block; a secondary key a prefix of
 * it). The first key of a block is its primary key. Re-inserting a key the block already has
 * is a no-op; KVT_ELIMIT when the block already carries keys_per_block keys. Emits a stored
 * event. */
KVT_API int kvt_pool_insert(kvt_pool *pool, uint32_t block, const uint8_t *hash, uint32_t group,
                            uint32_t num_tokens);
/* Looks a key up. Returns 1 and sets *block on a hit, 0 on a miss, a negative code on invalid
 * arguments. Does not touch the block. */
KVT_API int kvt_pool_lookup(const kvt_pool *pool, const uint8_t *hash, uint32_t group,
                            uint32_t *block);
/* Drops every key of the listed blocks (vLLM evict_blocks); references are unchanged. */
KVT_API int kvt_pool_evict(kvt_pool *pool, const uint32_t *ids, uint32_t n);
/* Drops every key of every block, with one all-cleared event. Refuses with KVT_EBUSY while any
 * block other than the null block is referenced. */
KVT_API int kvt_pool_reset_prefix_cache(kvt_pool *pool);

typedef struct kvt_block_info {
    uint32_t ref_cnt;
    uint32_t n_keys;
    bool is_null;
    bool is_free; /* in the free queue */
} kvt_block_info;

KVT_API int kvt_pool_block_info(const kvt_pool *pool, uint32_t block, kvt_block_info *info);

typedef struct kvt_pool_key {
    uint8_t hash[KVT_HASH_MAX]; /* hash_len bytes used, the rest zero */
    uint32_t group;
    uint32_t num_tokens;
} kvt_pool_key;

/* Copies up to cap keys of block (primary first, then secondary keys in insertion order) and
 * sets *n to the number of keys the block carries (which may exceed cap). */
KVT_API int kvt_pool_block_keys(const kvt_pool *pool, uint32_t block, kvt_pool_key *keys,
                                uint32_t cap, uint32_t *n);

/* Walks the free queue from the LRU head: first block, or KVT_BLOCK_NONE when empty. */
KVT_API uint32_t kvt_pool_lru_first(const kvt_pool *pool);
/* Block after `block` in the free queue; KVT_BLOCK_NONE at the end or if `block` is not free
 * (a cursor that was allocated meanwhile is thereby detected). */
KVT_API uint32_t kvt_pool_lru_next(const kvt_pool *pool, uint32_t block);

/* ---- cache events ---------------------------------------------------------------------- */

enum kvt_pool_event_type {
    KVT_POOL_EV_STORED = 1,     /* a key was registered on a block */
    KVT_POOL_EV_REMOVED = 2,    /* a key was dropped (reuse, evict) */
    KVT_POOL_EV_ALL_CLEARED = 3 /* reset_prefix_cache dropped every key */
};

typedef struct kvt_pool_event {
    uint32_t type; /* kvt_pool_event_type */
    uint32_t block;
    uint32_t group;
    uint32_t num_tokens;
    uint8_t hash[KVT_HASH_MAX]; /* hash_len bytes used; unused for ALL_CLEARED */
} kvt_pool_event;

/* Moves up to cap queued events, oldest first, into out and returns how many. If the buffer
 * overflowed since the last call, *dropped (when not NULL) receives the number of events lost
 * (the newest ones); a consumer mirroring the cache should then resynchronise. */
KVT_API uint32_t kvt_pool_take_events(kvt_pool *pool, kvt_pool_event *out, uint32_t cap,
                                      uint64_t *dropped);

/* ---- longest prefix hit ---------------------------------------------------------------- */

typedef struct kvt_hit {
    uint32_t length;                   /* tokens covered by the hit; 0 on a miss */
    uint32_t n_blocks[KVT_MAX_GROUPS]; /* block ids written per group (null blocks included) */
} kvt_hit;

/* Entries group `group` may need in its output array for a search over n_hashes hashes
 * capped at max_length tokens (with or without KVT_HIT_PARTIAL). */
KVT_API uint32_t kvt_pool_hit_capacity(const kvt_pool *pool, uint32_t group, uint32_t n_hashes,
                                       uint32_t max_length);

/* Longest cached prefix of a request, all groups agreeing on one length (vLLM's coordinator
 * find_longest_cache_hit):
 *   hashes     n_hashes chained hashes of hash_len bytes, one per hash_block_size tokens
 *              (group g's block j uses hash (j+1)*k-1, k = block_size_g / hash_block_size);
 *   max_length most tokens the hit may cover (engines pass num_tokens - 1 so the last token is
 *              always recomputed);
 *   blocks     blocks[g] receives group g's block ids, at least kvt_pool_hit_capacity()
 *              entries; positions a group does not need hold KVT_NULL_BLOCK.
 * The hit length is a multiple of the scheduler block size. Blocks are not touched: the
 * caller pins what it keeps. */
KVT_API int kvt_pool_find_longest_hit(const kvt_pool *pool, const uint8_t *hashes,
                                      uint32_t n_hashes, uint32_t max_length,
                                      uint32_t *const *blocks, kvt_hit *hit);

/* Partial hash hits (vLLM's enable_partial_hash_hits): a hit may end at any hash-block boundary,
 * not only at a scheduler-block boundary. Honoured when the pool's prefix-cacheable groups are
 * full attention and Mamba align, at least one Mamba align group has blocks larger than
 * hash_block_size, and EAGLE is off; otherwise the flag changes nothing. Then:
 *   full attention  after its run of whole cached blocks, the next block may be a partial one,
 *                   found under the key of a hash-block boundary inside it (a key whose
 *                   num_tokens is less than the block size: a partly filled block cached with
 *                   its token count); a whole block also serves any prefix of itself;
 *   Mamba align     the rightmost cached state at any hash-block boundary; it sits at index
 *                   ceil(length / block_size) - 1 of the group's output, earlier entries null.
 * Group g's output then holds ceil(length / block_size_g) entries; the last block of a full-
 * attention group may be valid only up to the hit's end. */
#define KVT_HIT_PARTIAL 1u

KVT_API int kvt_pool_find_longest_hit_flags(const kvt_pool *pool, const uint8_t *hashes,
                                            uint32_t n_hashes, uint32_t max_length, uint32_t flags,
                                            uint32_t *const *blocks, kvt_hit *hit);

/* Tokens every hit length is a multiple of for a search with these flags: hash_block_size when
 * KVT_HIT_PARTIAL is honoured, else the scheduler block size. */
KVT_API uint32_t kvt_pool_hit_alignment(const kvt_pool *pool, uint32_t flags);

/* ---- chained block hashes -------------------------------------------------------------- */

/* h = XXH3-128(parent, tokens, extra) with a caller-chosen seed, so every process that uses the
 * same seed computes the same hashes. parent NULL means the first block (the root is derived
 * from the seed). extra carries what else distinguishes the block (multimodal hashes, LoRA,
 * cache salt); it may be NULL when extra_len is 0. Writes KVT_BLOCK_HASH_LEN bytes. */
KVT_API int kvt_hash_block(uint64_t seed, const uint8_t *parent, const uint32_t *tokens,
                           uint32_t n_tokens, const void *extra, size_t extra_len,
                           uint8_t out[KVT_BLOCK_HASH_LEN]);
/* Hashes every full block of block_size tokens of a prompt, chaining them, with the same
 * extra bytes on every block. Writes floor(n_tokens / block_size) hashes (KVT_ELIMIT if that
 * exceeds cap) and sets *n_out. */
KVT_API int kvt_hash_prompt(uint64_t seed, const uint32_t *tokens, uint32_t n_tokens,
                            uint32_t block_size, const void *extra, size_t extra_len, uint8_t *out,
                            uint32_t cap, uint32_t *n_out);

#ifdef __cplusplus
}
#endif

#endif /* KVTIER_POOL_H */
