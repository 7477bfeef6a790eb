/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvtier offload manager: the scheduler side of KV-cache offload (vLLM's
 * SimpleCPUOffloadScheduler). It owns the host tier's block pool, decides every step which
 * KV blocks to store from the engine's GPU pool to the host tier and which to load back,
 * assigns event ids, and turns the workers' completion reports back into requests and
 * findable blocks. It never touches KV bytes: workers do, driven by the kvt_offload_meta it
 * writes each step.
 *
 * One engine step, in the order the engine calls it:
 *
 *   for each waiting request:
 *       kvt_offload_match()          host-tier hit beyond the GPU hit; pins it
 *       (engine allocates GPU blocks for GPU hit + accepted external tokens)
 *       kvt_offload_after_alloc()    pairs host hit blocks with GPU blocks, queues the load
 *   for each scheduled request:
 *       kvt_offload_schedule()       eager mode: selects newly confirmed blocks to store
 *   kvt_offload_build_meta()         this step's load and store events -> workers
 *   (workers copy; engine collects their outputs)
 *   kvt_offload_apply_output()       finished loads by request, store reports by event
 *   for each finished request:
 *       kvt_offload_request_finished()
 *
 * Invariants the manager keeps:
 *   - a host block becomes findable only when all world_size workers reported its store;
 *   - every in-flight transfer holds one reference on each GPU and host block it touches,
 *     released exactly once, so the engine may free its own references at any time and no
 *     GPU block targeted by a transfer can be handed out again;
 *   - host hits are pinned from match until after_alloc (or request_finished), closing the
 *     TOCTOU of vLLM #39702;
 *   - event ids per direction only grow, even across reset.
 *
 * Tiers behind the host (disk_blocks > 0: a disk as tier 1; kvt_offload_add_tier: more, up to
 * KVT_MAX_TIERS in all): GPU -> host -> tier 1 -> tier 2 ... Every block whose host store
 * completed is written back into each tier behind that lacks it (the host block stays pinned
 * until the write lands) and becomes findable there only when all workers reported the write,
 * so a host eviction drops nothing a tier behind holds. match continues the search past the
 * host hit through the tiers behind in order, each where the ones before it stopped;
 * after_alloc promotes the accepted part to freshly allocated host blocks (one load event per
 * tier that has some), and only when every promotion of the request completed on every rank
 * does its single GPU load (host part + promoted part) get queued. A failed promotion is never
 * a hit: its GPU destinations go out in the load's load_invalid_blocks and the workers report
 * them invalid (the engine recomputes them). Every group kind: each tier's part is searched
 * with each group's rules as a continuation of the hit so far; with one full-attention group
 * it shortens to the host room there is, with several it is promoted whole or not at all.
 * A tier behind exchanges blocks with the host only (write-backs from it, promotions into
 * it): the worker's stage at the tier's index moves them (kvt_worker_attach_disk_tier).
 *
 * Errors: a call that fails (unknown request where one is required, block ids out of range,
 * events the manager never issued, malformed arguments) returns a negative KVT_E* code with
 * kvt_last_error() and changes nothing.
 *
 * Thread rules: single-threaded; the engine's scheduler thread makes every call. No call
 * allocates memory after kvt_offload_create, except that a kvt_offload_meta grows its own
 * arrays until it has seen its largest step.
 */
#ifndef KVTIER_OFFLOAD_H
#define KVTIER_OFFLOAD_H

#include "kvtier/base.h"
#include "kvtier/meta.h"
#include "kvtier/node.h"
#include "kvtier/pool.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVT_REQ_ID_MAX 256u /* longest request id, bytes */

typedef struct kvt_offload_config {
    uint32_t host_blocks;        /* host-tier blocks, null block included (kvt_offload_size_host) */
    uint32_t world_size;         /* workers that must report each store event; default 1 */
    bool lazy;                   /* store blocks only as they near eviction from the GPU (vLLM
                                    lazy_offload); default false: eager write-through */
    uint32_t max_requests;       /* requests tracked at once (running, waiting with a pinned
                                    hit, or finished with a load in flight); default 4096 */
    uint32_t max_batched_tokens; /* engine's per-step token budget (lazy watermark);
                                    default 8192 */
    uint32_t max_model_len;      /* longest request, tokens: bounds a host-tier search (a
                                    longer prompt is searched up to it); default 1 Mi */
    uint32_t keys_per_block;     /* keys a host block keeps (primary + secondary); default:
                                    the GPU pool's */
    uint32_t restore_budget;     /* eager: blocks per step re-stored after the host tier
                                    evicted them while still in use on the GPU; default 256,
                                    0 disables */
    uint32_t event_capacity;     /* cache events kept between take_events calls (host and
                                    disk tiers); 0 = off (default) */
    uint64_t block_bytes;        /* bytes one block occupies across all ranks (for the byte
                                    counters); 0 = unknown */
    uint32_t disk_blocks;        /* three tiers: disk slots, null slot included (as host_blocks;
                                    kvt_disk_num_slots); 0 (default) = two tiers */
    bool defer_schedule_pins;    /* pins taken by kvt_offload_schedule(_hashed) reach the GPU
                                    pool with the next call of any other kvt_offload_* function
                                    (build_meta at the latest): one batch per step instead of
                                    one per request. Only for an engine that frees no GPU block
                                    between its schedule calls and that next call (vLLM's
                                    connector schedules inside build_connector_meta); default
                                    false */
    uint32_t max_num_seqs;       /* lazy: the engine's most running requests (vLLM
                                    max_num_seqs): each may cross into a new block in one
                                    step, so a full-attention group's window grows by it;
                                    0 (default) leaves that term out */
    uint32_t remote_miss_ms;     /* remote tier: a lookup that found nothing, or whose owner
                                    did not answer in time, is not repeated for the same span
                                    of hashes for this long (a waiting request is matched again
                                    every step: a directory round trip, or a stall of the
                                    remote's timeout_ms, each); default 1000, 0 = always look
                                    up */
    /* room for fields to come, so the struct keeps its size: zero (as *_config_init
     * leaves it); a create refuses a config whose room is not zero */
    uint64_t reserved[7];
} kvt_offload_config;

typedef struct kvt_offload kvt_offload;
typedef struct kvt_remote kvt_remote; /* kvtier/remote.h */

KVT_API void kvt_offload_config_init(kvt_offload_config *cfg);

/* Host-tier size handshake, step 1: blocks that capacity_bytes holds at block_bytes each
 * (null block slot included). KVT_EINVAL if that is fewer than 2. Workers then allocate that
 * many and report what they actually got; see kvt_offload_lower_host_blocks. */
KVT_API int kvt_offload_size_host(uint64_t capacity_bytes, uint64_t block_bytes, uint32_t *blocks);

/* Creates a manager for the engine's GPU pool (not owned; it must outlive the manager and is
 * used by the manager on the same thread). The host pool mirrors the GPU pool's KV-cache
 * groups, hash length and block sizes. */
KVT_API int kvt_offload_create(const kvt_offload_config *cfg, kvt_pool *gpu_pool,
                               kvt_offload **out);
KVT_API void kvt_offload_destroy(kvt_offload *m);

/* ---- an engine's own GPU block pool ---------------------------------------------------- */

/* An engine that keeps its GPU blocks in its own allocator (vLLM's BlockPool) gives the
 * manager these callbacks instead of a kvt_pool, and the request's chained hashes with every
 * call that may store (kvt_offload_schedule_hashed, kvt_offload_request_finished_hashed): the
 * key a GPU block is stored under is the hash at its last hash-block boundary and its group,
 * as vLLM keys its prefix cache. Nothing of the pool is copied.
 *
 * Every callback runs on the thread that called the manager, inside a kvt_offload_* call, and
 * gets whole lists: one call for all the blocks of a transfer, not one per block. Ids given to
 * the callbacks are in 1..num_blocks-1 (never the null block) and may repeat. A callback must
 * not call back into the manager. */
typedef struct kvt_gpu_pool_ops {
    /* Required. One reference more on each listed block: a transfer pins it, so the engine
     * must neither reallocate nor evict it until the matching free. A free (cached) block
     * leaves the free queue, as vLLM's BlockPool.touch. */
    void (*touch)(void *ctx, const uint32_t *ids, uint32_t n);
    /* Required. One reference less per listed id; blocks that reach zero go back to the free
     * queue in list order (vLLM's BlockPool.free_blocks). */
    void (*free)(void *ctx, const uint32_t *ids, uint32_t n);
    /* Lazy mode only (required then): the first (at most cap) blocks of the free queue, least
     * recently used first, into ids[], with each block's primary key in keys[] (hash, group,
     * num_tokens; num_tokens 0 for a block that carries no key). Returns how many. The
     * manager scans from the head every step (upstream's current rule, no cursor). */
    uint32_t (*lru_scan)(void *ctx, uint32_t cap, uint32_t *ids, kvt_pool_key *keys);
    /* Optional. The block cached under (hash, group), or KVT_BLOCK_NONE, with its reference
     * count in *ref_cnt. Used to re-store a block the host tier evicted while the GPU still
     * uses it (restore_budget); NULL turns re-stores off. */
    uint32_t (*lookup)(void *ctx, const uint8_t *hash, uint32_t group, uint32_t *ref_cnt);
} kvt_gpu_pool_ops;

/* Creates a manager over an engine's own GPU pool: gpu_cfg describes it as a kvt_pool_config
 * would (num_blocks with the null block, hash_len, hash_block_size, the groups; see
 * kvt_pool_config_validate), ops and ctx reach it. ops is copied; ctx must outlive the
 * manager. KVT_EINVAL names a missing callback or a bad configuration. */
KVT_API int kvt_offload_create_ext(const kvt_offload_config *cfg, const kvt_pool_config *gpu_cfg,
                                   const kvt_gpu_pool_ops *ops, void *ctx, kvt_offload **out);

/* Host-tier size handshake, step 2: lowers the host tier to the fewest blocks any worker
 * allocated, so the manager never addresses a block some worker lacks. Only before the first
 * transfer (KVT_ESTATE afterwards); raising is refused (KVT_EINVAL). */
KVT_API int kvt_offload_lower_host_blocks(kvt_offload *m, uint32_t worker_blocks);

/* Three tiers: lowers the disk tier to the fewest slots any worker has, as
 * kvt_offload_lower_host_blocks (KVT_ESTATE without a disk tier or after its first transfer). */
KVT_API int kvt_offload_lower_disk_blocks(kvt_offload *m, uint32_t worker_slots);
/* The same for tier `tier` (1 is the disk of disk_blocks; KVT_ERANGE past KVT_MAX_TIERS). */
KVT_API int kvt_offload_lower_tier_blocks(kvt_offload *m, uint32_t tier, uint32_t worker_blocks);

/* Adds a tier of `blocks` blocks (null block included, at least 2) behind the last one (the
 * host, or the disk of disk_blocks), named `name` (1 to 15 characters of a-z, 0-9 and _, not
 * taken: it labels the tier's metrics and messages); *index (may be NULL) gets its position.
 * Before the first step (KVT_ESTATE once a tier was used); KVT_ENOSPC past KVT_MAX_TIERS.
 * The workers attach the tier's stage at the same index. With a node tier the tiers behind
 * are this replica's own: they take its stores and promote into its own slots, which the
 * peers then find. */
KVT_API int kvt_offload_add_tier(kvt_offload *m, const char *name, uint32_t blocks,
                                 uint32_t *index);

/* The host tier's pool, for inspection (hits, keys, LRU); do not modify it. */
/* Makes the host tier this replica's part of node tier `node` (kvtier/node.h): the host pool
 * then holds every slot of the node (host_blocks must be kvt_node_num_slots), allocates and
 * evicts only this replica's own slots, publishes what it stored and finds what the peers
 * published. Eager mode, before the first step (tiers behind it, kvt_offload_add_tier or
 * disk_blocks, are this replica's own); node is borrowed until
 * kvt_offload_destroy, which withdraws this replica's slots and pins (destroy the manager
 * before detaching the node). Every call that touches the host tier takes the node's lock. */
KVT_API int kvt_offload_attach_node(kvt_offload *m, kvt_node *node);
/* Adds the remote tier (kvtier/remote.h) as the last tier of this manager's chain, behind the
 * host tier and the tiers behind it (add those first; kvt_offload_remote_tier says its index):
 *   lookups   past what the host and the tiers behind it hold, match looks the request's
 *             remaining hashes up in the directory (one round trip, the only network call on
 *             the scheduler's thread) and makes the blocks other instances hold promotions
 *             into freshly allocated host blocks, as any tier behind does: the workers read
 *             them (kvt_worker_attach_remote, every block checked), and the request's GPU load
 *             goes once they landed. A block a worker could not read whole is an invalid
 *             block (the engine recomputes from it) and gets no key. A span that found nothing
 *             is not looked up again for remote_miss_ms; an owner a read from failed is not
 *             read from again for as long (docs/remote.md).
 *   stores    each host block whose store completed is published, and a host block is
 *             withdrawn before it is reused (every one at kvt_offload_reset and with the first
 *             step), by the workers: the next step's metadata tells them (kvtier/meta.h), and
 *             their remote stage tags the bytes and writes the directory on its own thread.
 * Either the remote serves this host tier's own bytes — its slots are the host blocks (n_slots
 * = the host tier's blocks, null block included; its regions the mirror's), so the worker that
 * fills them runs in this process, one rank (world_size 1) — or it is a lookup-only client
 * (KVT_REMOTE_NO_RANK) of world_size ranks, each rank's worker serving its part through a
 * remote of its own. One full-attention group whose hash block is the scheduler block, the same
 * hash length. Beside a node tier (a replica's remote serves the node's data region: n_slots =
 * every slot of the node) a replica publishes its own slots only, and match lets the node's
 * lock go for the directory's round trip, then searches again (an answer for a hit that moved
 * meanwhile is dropped: kvt_tier_stats.lookups_dropped). remote is borrowed until
 * kvt_offload_destroy; blocks stored before the attach are not published. */
KVT_API int kvt_offload_attach_remote(kvt_offload *m, kvt_remote *remote);
/* The remote tier's index in the chain (kvt_worker_attach_remote takes it), 0 without one. */
KVT_API uint32_t kvt_offload_remote_tier(const kvt_offload *m);
KVT_API const kvt_pool *kvt_offload_host_pool(const kvt_offload *m);
/* The disk tier's pool (tier 1; NULL with two tiers). */
KVT_API const kvt_pool *kvt_offload_disk_pool(const kvt_offload *m);
/* Tier t's pool (0 the host; NULL for a tier that is not there). */
KVT_API const kvt_pool *kvt_offload_tier_pool(const kvt_offload *m, uint32_t tier);

/* ---- per-step hooks -------------------------------------------------------------------- */

/* get_num_new_matched_tokens. hashes: the request's chained block hashes (one per
 * hash_block_size tokens, GPU pool's hash length), num_tokens its length, num_computed the
 * GPU prefix hit. Sets *hit_tokens to the host-tier hit beyond the GPU hit, capped so the
 * last token is always recomputed; when it is > 0 the hit is pinned until after_alloc or
 * request_finished, and the load is asynchronous. A second match for the same request
 * releases the first pin. A GPU hit that is not a multiple of the scheduler block size (an
 * engine's fine-grained local hit) is a miss, not an error: hit 0, a warning logged once,
 * counted in lookups_misaligned. */
KVT_API int kvt_offload_match(kvt_offload *m, const char *req_id, uint32_t req_id_len,
                              const uint8_t *hashes, uint32_t n_hashes, uint32_t num_tokens,
                              uint32_t num_computed, uint32_t *hit_tokens);

/* kvt_offload_match with flags (KVT_MATCH_*; kvt_offload_match passes 0). */
#define KVT_MATCH_SKIP_PREFIX_CACHE                                                                \
    1u /* the request must not reuse cached prefixes (it wants prompt logprobs): no lookup,        \
          hit 0; its blocks are still stored */
KVT_API int kvt_offload_match_flags(kvt_offload *m, const char *req_id, uint32_t req_id_len,
                                    const uint8_t *hashes, uint32_t n_hashes, uint32_t num_tokens,
                                    uint32_t num_computed, uint32_t flags, uint32_t *hit_tokens);

/* update_state_after_alloc. blocks[g] / n_blocks[g]: the request's GPU block table per
 * KV-cache group after allocation; num_external: tokens the engine accepted from the host hit
 * (0..hit, a multiple of the scheduler block size; fewer than offered is fine, except where a
 * sliding-window or Mamba group needs, at the shorter end, blocks the offered hit left out as
 * null: KVT_EINVAL, take the whole hit or none). Registers the
 * request for eager stores, pairs the accepted host blocks with the GPU blocks that follow the
 * GPU hit, pins both sides and queues the load for the next build_meta. */
KVT_API int kvt_offload_after_alloc(kvt_offload *m, const char *req_id, uint32_t req_id_len,
                                    const uint32_t *const *blocks, const uint32_t *n_blocks,
                                    uint32_t num_external);

/* Eager mode, once per scheduled request per step before build_meta: blocks[g] / n_blocks[g]
 * the current GPU block table, num_confirmed the tokens whose KV is computed and confirmed
 * before this step runs (vLLM: num_computed_tokens - num_output_placeholders), num_scheduled
 * this step's tokens, resumed true if the request resumed from preemption this step (its
 * blocks were reallocated; stores restart from its first block). Selects confirmed, hashed
 * blocks not yet stored or in flight (one-step lag). A request never registered by
 * after_alloc (or cleared by reset) is skipped, as in vLLM. No-op in lazy mode. */
KVT_API int kvt_offload_schedule(kvt_offload *m, const char *req_id, uint32_t req_id_len,
                                 const uint32_t *const *blocks, const uint32_t *n_blocks,
                                 uint32_t num_confirmed, uint32_t num_scheduled, bool resumed);

/* kvt_offload_schedule and kvt_offload_request_finished with the request's chained hashes
 * (one per hash_block_size tokens, hash_len bytes each; the same list kvt_offload_match got,
 * grown as the request decodes). Required by a manager over an engine's own pool
 * (kvt_offload_create_ext), where the blocks from the first position with no hash yet wait
 * for a later call that gives it; a
 * manager over a kvt_pool takes the keys from the pool and ignores them (may be NULL).
 * kvt_offload_schedule_hashed returns, on success, the number of the request's confirmed
 * blocks it left for a later call (no host block free, no hash yet), 0 when all are covered:
 * while it is 0 and no new block is confirmed, an engine may skip the call. */
KVT_API int kvt_offload_schedule_hashed(kvt_offload *m, const char *req_id, uint32_t req_id_len,
                                        const uint32_t *const *blocks, const uint32_t *n_blocks,
                                        const uint8_t *hashes, uint32_t n_hashes,
                                        uint32_t num_confirmed, uint32_t num_scheduled,
                                        bool resumed);
KVT_API int kvt_offload_request_finished_hashed(kvt_offload *m, const char *req_id,
                                                uint32_t req_id_len, const uint32_t *const *blocks,
                                                const uint32_t *n_blocks, const uint8_t *hashes,
                                                uint32_t n_hashes, uint32_t num_confirmed);

/* Mamba in align mode (KVT_GROUP_MAMBA_ALIGN): a state exists only where a request crossed a
 * block boundary, in a block whose position in the table is not stable, so the schedule calls
 * never store that group by position. Instead the engine hands over, once per step before
 * build_meta, the states its requests reached this step. */
typedef struct kvt_offload_boundary {
    const char *req_id;
    uint32_t req_id_len;
    uint32_t group;             /* a KVT_GROUP_MAMBA_ALIGN group */
    uint32_t gpu_block;         /* the GPU block holding the state (not the null block) */
    uint32_t num_tokens;        /* tokens the state covers: a positive multiple of the group's block
                                   size (of the hash block size with partial hash hits,
                                   kvt_offload_hit_alignment) */
    const uint8_t *hash;        /* the request's chained hash at num_tokens (hash_len bytes): the
                                   state's key, as a lookup of a prompt of that prefix finds it */
    const uint8_t *parent_hash; /* optional, for cache events: the hash where the group's block
                                   before ends (num_tokens - block size); NULL: none */
} kvt_offload_boundary;

/* Eager mode: stores the n handed-over states with this step's other stores (one store event;
 * a store pins the GPU block until it completes, as any other). A state of a request that is
 * unknown, finished or not registered for eager stores is dropped and counted
 * (boundary_dropped_gone); one already in the host tier or being stored is skipped as a
 * positional block would be; with no free host block it is dropped (store_dropped). The engine
 * must not hand over the states of a request it preempted this step (their blocks are gone).
 * A malformed entry (group of another kind, block out of range or null, token count not a
 * positive multiple of the block size — the hash block size with partial hash hits —, NULL
 * hash or id) fails the call with KVT_EINVAL before
 * anything is applied. Lazy mode: a no-op (the scan finds the cached state blocks near
 * eviction like any other). Returns the number of states selected for a store. */
KVT_API int kvt_offload_boundary_states(kvt_offload *m, const kvt_offload_boundary *states,
                                        uint32_t n);

/* One request of kvt_offload_schedule_many: the arguments of kvt_offload_schedule_hashed,
 * and its result in left. An engine can keep one per request and update only what changed. */
typedef struct kvt_offload_sched_req {
    const char *req_id;
    uint32_t req_id_len;
    uint32_t num_confirmed;
    uint32_t num_scheduled;
    uint32_t n_hashes;
    const uint8_t *hashes;
    const uint32_t *const *blocks; /* per group */
    const uint32_t *n_blocks;      /* per group */
    bool resumed;
    int32_t left; /* out: what kvt_offload_schedule_hashed would have returned */
} kvt_offload_sched_req;

/* kvt_offload_schedule_hashed for n requests of a step in one call (a caller in a language
 * where each call is dear makes one per step). Stops at the first failure and returns it:
 * requests before it were applied, it and those after were not; *n_done (may be NULL)
 * receives how many were applied. */
KVT_API int kvt_offload_schedule_many(kvt_offload *m, kvt_offload_sched_req *const *reqs,
                                      uint32_t n, uint32_t *n_done);

/* build_connector_meta: writes this step's events into out (cleared first): at most one load
 * event and one store event, load_event_to_reqs with every outstanding load event, and
 * need_flush = preempted (a request was preempted this step). */
KVT_API int kvt_offload_build_meta(kvt_offload *m, bool preempted, kvt_offload_meta *out);

/* update_connector_output: finished_loads (request ids all workers reported, may be NULL when
 * n is 0) and the workers' aggregated store reports (may be NULL). Store counts add up across
 * steps; an event completes when world_size reports arrived, and only then do its blocks
 * become findable — unless any worker listed it in failed_store_events, in which case its
 * references are released and its blocks are never findable (counted in stores_failed). Reports for
 * events already completed or abandoned are ignored (counted); an unknown request, a request
 * without a load in flight, or an event never issued fails the whole call before anything is
 * applied. */
KVT_API int kvt_offload_apply_output(kvt_offload *m, const kvt_str *finished_loads, uint32_t n,
                                     const kvt_offload_worker_meta *stores);

/* request_finished (all groups). With eager stores, first queues the request's remaining
 * confirmed blocks for the next store event (the final flush that vLLM #53498 lacked), then
 * releases its pins. A load still in flight keeps the request's record until the workers report
 * it; stores in flight need no record. The engine may free its GPU blocks right after: in-flight
 * transfers hold their own references. Finishing a request the
 * manager never saw is a no-op. */
KVT_API int kvt_offload_request_finished(kvt_offload *m, const char *req_id, uint32_t req_id_len,
                                         const uint32_t *const *blocks, const uint32_t *n_blocks,
                                         uint32_t num_confirmed);

/* reset (prefix-cache reset, weight update): abandons in-flight work and clears the host
 * tier. Returns KVT_EBUSY ("not yet") while abandoned transfers or pinned hits remain; call
 * again after their completions arrived. Event ids are never reused. */
KVT_API int kvt_offload_reset(kvt_offload *m);

/* reset without waiting for the workers: abandons in-flight work and clears every tier now.
 * Nothing stored before the call is found after it; blocks that abandoned transfers still read
 * or write stay allocated, without keys, until the workers report them (they are then freed,
 * never findable). Loads already sent complete as usual. Returns KVT_EBUSY, changing nothing,
 * while a request that has not finished holds a hit or a load of the tiers (it would read
 * bytes from before the clear). Counted in resets. */
KVT_API int kvt_offload_clear(kvt_offload *m);

/* Lets the engine clear its own prefix cache while stores are in flight (vLLM's pause with
 * clear_cache, LLM.sleep, release_kv_cache_memory: its block pool refuses to reset while any
 * block is referenced). Abandons every store as kvt_offload_reset does (in flight, queued,
 * re-stores) and releases the engine blocks in-flight stores read now, not when the workers
 * report them. The engine may reuse and rewrite those blocks at once: an abandoned store's bytes
 * are never findable, and the host blocks it writes stay allocated until its completion arrives
 * (a worker may still be writing them). Loads, queued or sent, keep their engine blocks (a
 * worker writes them): *held_by_loads (may be NULL) says how many. The host tier keeps what it
 * holds; kvt_offload_reset clears it. */
KVT_API int kvt_offload_release_engine_blocks(kvt_offload *m, uint32_t *held_by_loads);

/* Lazy mode: the GPU blocks the store scan looks at each step, from the head of the GPU free
 * queue (an engine sizes its GPU reserve by it); 0 in eager mode. Per prefix-cacheable group
 * of block size B (context parallelism already in B): full attention
 * ceil(max_batched_tokens / B) + max_num_seqs, sliding window ceil(window / B) + 1, Mamba 2,
 * Mamba in align mode ceil(max_batched_tokens / B) (one prefill step can fill that many);
 * the sum times 2 (upstream's watermark ratio 1.0). */
KVT_API uint32_t kvt_offload_lazy_window(const kvt_offload *m);

/* Tokens every host-tier hit is a multiple of: the scheduler block size, or the hash block
 * size when the manager offers partial hash hits (spec §2.14: eager mode, over groups for
 * which kvt_pool_hit_alignment(KVT_HIT_PARTIAL) is finer — full attention and Mamba align
 * with a Mamba align block wider than a hash block). A partial hit's last full-attention
 * block is loaded whole but valid only up to the hit's end: the engine computes the rest of
 * it. */
KVT_API uint32_t kvt_offload_hit_alignment(const kvt_offload *m);

/* True while transfers are in flight, stores are queued or a remote tier's publications and
 * withdrawals wait for the ranks (behind a lookup-only client): the engine keeps stepping. */
KVT_API bool kvt_offload_has_pending(const kvt_offload *m);

/* ---- cache events with request context ------------------------------------------------ */

/* With event_capacity > 0 the manager reports what its tiers cache (vLLM's KV cache events,
 * spec §2.12 and §2.14). Locality is always local (these tiers belong to this engine). */
enum kvt_offload_event_type {
    KVT_OFFLOAD_EV_STORED = 1,      /* a key became findable in a tier */
    KVT_OFFLOAD_EV_REMOVED = 2,     /* a key left a tier (eviction) */
    KVT_OFFLOAD_EV_ALL_CLEARED = 3, /* a reset dropped every key of a tier */
    KVT_OFFLOAD_EV_CONTEXT_DONE = 4 /* no later event names ctx (see set_request_context) */
};

enum kvt_offload_medium {
    KVT_MEDIUM_HOST = 0, /* the host tier (vLLM: CPU) */
    KVT_MEDIUM_DISK = 1  /* the disk tier behind it (vLLM: storage) */
};

typedef struct kvt_offload_event {
    uint32_t type;        /* kvt_offload_event_type */
    uint32_t medium;      /* kvt_offload_medium */
    uint32_t block;       /* the tier's block (slot) */
    uint32_t group;       /* KV-cache group of the key */
    uint32_t num_tokens;  /* tokens the key covers: the group's block size for a primary key,
                             fewer for a secondary key */
    uint32_t kind;        /* the group's kvt_group_kind */
    uint32_t window;      /* the group's sliding window, tokens (0 unless sliding) */
    uint32_t token_start; /* with ctx: the key covers tokens [token_start, token_start +
                             num_tokens) of that request */
    uint64_t ctx;         /* the request's context (kvt_offload_set_request_context); 0 when the
                             store had no request: lazy stores, re-stores, promotions from and
                             write-backs to the disk, a request without a context */
    uint32_t has_parent;  /* with ctx: 1 when parent_hash holds the key of the block before, in
                             the same group of the request (0 for its first block) */
    uint32_t reserved;
    uint8_t hash[KVT_HASH_MAX];        /* hash_len bytes used */
    uint8_t parent_hash[KVT_HASH_MAX]; /* hash_len bytes used when has_parent */
} kvt_offload_event;

/* Eager mode, events on: ties a request (after kvt_offload_after_alloc registered it) to the
 * engine's context ctx (nonzero; the engine's handle on its token ids, LoRA adapter and extra
 * keys). Stored events of blocks the request's stores select from then on carry ctx, the
 * block's first token and its parent hash. When the request is finished and the last of its
 * stores has completed, failed or been abandoned, a CONTEXT_DONE event names ctx, after every
 * event that names it: the engine may drop its context then. Returns 1 when the manager took
 * ctx, 0 when it has no use for it (events off, lazy mode, a request not registered for eager
 * stores, finished, or cleared by a reset): then no event will name ctx. A second call
 * replaces ctx for stores selected later. KVT_EINVAL for ctx 0 or a bad request id. */
KVT_API int kvt_offload_set_request_context(kvt_offload *m, const char *req_id, uint32_t req_id_len,
                                            uint64_t ctx);

/* Moves up to cap queued events, oldest first, into out and returns how many. Events of one
 * tier keep their order; host and disk events interleave only roughly. *dropped (may be NULL)
 * receives the events lost since the last call because the buffer (event_capacity) was full:
 * a consumer mirroring the tiers should then resynchronise, and an engine holding request
 * contexts may drop those of finished requests (their CONTEXT_DONE may be among the lost). */
KVT_API uint32_t kvt_offload_take_events(kvt_offload *m, kvt_offload_event *out, uint32_t cap,
                                         uint64_t *dropped);

/* ---- metrics --------------------------------------------------------------------------- */

/* The manager's counters and gauges, one row per field in the struct's order:
 *
 *   X(type, field, kind, family, help)
 *
 * kind: COUNTER or GAUGE, always exposed; DISK_COUNTER or DISK_GAUGE, exposed only with a
 * disk tier. family: its Prometheus family after "kvtier_offload_", or "" where the field is
 * exposed in another form (the labelled store_skipped_blocks_total, the tier families). The
 * struct below, kvt_describe's description of it (from which the Python binding builds its
 * mirror), the Prometheus exposition (kvt_offload_prometheus) and the table in
 * docs/offload.md all come from these rows: a new counter is one row, appended (the struct
 * only grows; see kvt_offload_stats_read), and its increment. */
#define KVT_OFFLOAD_STATS_ROWS(X)                                                                  \
    X(uint64_t, lookups, COUNTER, "lookups_total", "Host-tier searches by match.")                 \
    X(uint64_t, lookup_tokens, COUNTER, "lookup_tokens_total",                                     \
      "Tokens those searches could have hit.")                                                     \
    X(uint64_t, hit_tokens, COUNTER, "hit_tokens_total", "Tokens hit in the host tier.")           \
    X(uint64_t, hit_blocks, COUNTER, "hit_blocks_total", "Host blocks pinned by hits.")            \
    X(uint64_t, miss_tokens, COUNTER, "miss_tokens_total",                                         \
      "Searchable tokens the host tier did not have.")                                             \
    X(uint64_t, miss_blocks, COUNTER, "miss_blocks_total", "Missed scheduler blocks.")             \
    X(uint64_t, hits_dropped, COUNTER, "hits_dropped_total", "Hits not offered for lack of room.") \
    X(uint64_t, untracked_requests, COUNTER, "untracked_requests_total",                           \
      "Eager requests not registered: request table full.")                                        \
    X(uint64_t, load_events, COUNTER, "load_events_total", "Load events issued.")                  \
    X(uint64_t, load_blocks, COUNTER, "load_blocks_total", "Blocks in issued load events.")        \
    X(uint64_t, loads_completed, COUNTER, "loads_completed_total", "Blocks whose load completed.") \
    X(uint64_t, store_events, COUNTER, "store_events_total", "Store events issued.")               \
    X(uint64_t, store_blocks, COUNTER, "store_blocks_total", "Blocks in issued store events.")     \
    X(uint64_t, stores_completed, COUNTER, "stores_completed_total",                               \
      "Blocks made findable in the host tier.")                                                    \
    X(uint64_t, stores_abandoned, COUNTER, "stores_abandoned_total",                               \
      "Blocks whose store completed after a reset.")                                               \
    X(uint64_t, stores_failed, COUNTER, "stores_failed_total",                                     \
      "Blocks of store events a worker could not write (not cached).")                             \
    X(uint64_t, store_skipped_cached, COUNTER, "", "Blocks not stored: already in the host tier.") \
    X(uint64_t, store_skipped_in_flight, COUNTER, "", "Blocks not stored: already being stored.")  \
    X(uint64_t, store_skipped_unhashed, COUNTER, "",                                               \
      "Blocks not stored: no hash (a masked position).")                                           \
    X(uint64_t, store_skipped_null, COUNTER, "", "Blocks not stored: the null block.")             \
    X(uint64_t, store_dropped_full, COUNTER, "", "Store selection stopped: no host block free.")   \
    X(uint64_t, restores, COUNTER, "restores_total",                                               \
      "Blocks re-stored after a host-tier eviction.")                                              \
    X(uint64_t, restores_dropped_hot, COUNTER, "restores_dropped_hot_total",                       \
      "Re-stores given up because they would have evicted a block in use on the GPU.")             \
    X(uint64_t, host_evictions, COUNTER, "host_evictions_total",                                   \
      "Cached host blocks reused for new stores.")                                                 \
    X(uint64_t, stale_reports, COUNTER, "stale_reports_total",                                     \
      "Store reports for completed or abandoned events.")                                          \
    X(uint64_t, bytes_loaded, COUNTER, "loaded_bytes_total",                                       \
      "Bytes loaded (blocks x block_bytes).")                                                      \
    X(uint64_t, bytes_stored, COUNTER, "stored_bytes_total",                                       \
      "Bytes stored (blocks x block_bytes).")                                                      \
    X(uint64_t, resets, COUNTER, "resets_total", "Successful resets.")                             \
    X(uint32_t, host_blocks, GAUGE, "host_blocks", "Usable host-tier blocks.")                     \
    X(uint32_t, host_used_blocks, GAUGE, "host_used_blocks",                                       \
      "Host blocks pinned by hits or transfers.")                                                  \
    X(uint32_t, host_cached_blocks, GAUGE, "host_cached_blocks", "Host blocks that can be hit.")   \
    X(uint32_t, requests, GAUGE, "requests", "Requests tracked.")                                  \
    X(uint32_t, load_events_in_flight, GAUGE, "load_events_in_flight",                             \
      "Load events not yet completed.")                                                            \
    X(uint32_t, store_events_in_flight, GAUGE, "store_events_in_flight",                           \
      "Store events not yet completed.")                                                           \
    X(uint32_t, pending_store_blocks, GAUGE, "pending_store_blocks",                               \
      "Blocks queued or in flight to the host tier.")                                              \
    X(uint64_t, disk_hit_tokens, DISK_COUNTER, "disk_hit_tokens_total",                            \
      "Tokens of hits served from the disk tier.")                                                 \
    X(uint64_t, disk_hit_blocks, DISK_COUNTER, "disk_hit_blocks_total",                            \
      "Disk slots pinned by hits.")                                                                \
    X(uint64_t, promotions, DISK_COUNTER, "promotions_total",                                      \
      "Blocks promoted from disk to host.")                                                        \
    X(uint64_t, promotions_failed, DISK_COUNTER, "promotions_failed_total",                        \
      "Blocks whose promotion failed (reported invalid).")                                         \
    X(uint64_t, disk_load_events, DISK_COUNTER, "disk_load_events_total",                          \
      "Promotion events issued.")                                                                  \
    X(uint64_t, disk_store_events, DISK_COUNTER, "disk_store_events_total",                        \
      "Write-back events issued.")                                                                 \
    X(uint64_t, disk_store_blocks, DISK_COUNTER, "disk_store_blocks_total",                        \
      "Blocks in write-back events.")                                                              \
    X(uint64_t, disk_stores_completed, DISK_COUNTER, "disk_stores_completed_total",                \
      "Blocks made findable on disk.")                                                             \
    X(uint64_t, disk_stores_failed, DISK_COUNTER, "disk_stores_failed_total",                      \
      "Write-back blocks a worker could not write.")                                               \
    X(uint64_t, disk_stores_abandoned, DISK_COUNTER, "disk_stores_abandoned_total",                \
      "Write-backs completed after a reset.")                                                      \
    X(uint64_t, disk_store_skipped_cached, DISK_COUNTER, "disk_store_skipped_cached_total",        \
      "Blocks not written back: already on disk.")                                                 \
    X(uint64_t, disk_store_dropped, DISK_COUNTER, "disk_store_dropped_total",                      \
      "Blocks not written back: no free slot or event room.")                                      \
    X(uint64_t, disk_evictions, DISK_COUNTER, "disk_evictions_total", "Cached disk slots reused.") \
    X(uint32_t, disk_blocks, DISK_GAUGE, "disk_blocks", "Usable disk-tier slots (0: two tiers).")  \
    X(uint32_t, disk_used_blocks, DISK_GAUGE, "disk_used_blocks",                                  \
      "Disk slots pinned by hits or transfers.")                                                   \
    X(uint32_t, disk_cached_blocks, DISK_GAUGE, "disk_cached_blocks",                              \
      "Disk slots that can be hit.")                                                               \
    X(uint32_t, disk_load_events_in_flight, DISK_GAUGE, "disk_load_events_in_flight",              \
      "Promotion events not yet completed.")                                                       \
    X(uint32_t, disk_store_events_in_flight, DISK_GAUGE, "disk_store_events_in_flight",            \
      "Write-back events not yet completed.")                                                      \
    X(uint64_t, lookups_misaligned, COUNTER, "lookups_misaligned_total",                           \
      "Matches whose GPU hit ended inside a scheduler block (a miss, no lookup).")                 \
    X(uint64_t, lookups_skipped, COUNTER, "lookups_skipped_total",                                 \
      "Matches of requests that reuse no cached prefix (no lookup).")                              \
    X(uint64_t, store_recovered_null, COUNTER, "store_recovered_null_total",                       \
      "Nulled table entries found in the GPU pool by their hash and stored.")                      \
    X(uint64_t, boundary_states, COUNTER, "boundary_states_total",                                 \
      "Mamba align: handed-over states selected for a store.")                                     \
    X(uint64_t, boundary_dropped_gone, COUNTER, "boundary_dropped_gone_total",                     \
      "Mamba align: handed-over states dropped because their request was gone.")                   \
    X(uint64_t, partial_hits, COUNTER, "partial_hits_total",                                       \
      "Host-tier hits that end inside a scheduler block.")                                         \
    X(uint64_t, partial_tails, COUNTER, "partial_tails_total",                                     \
      "Partly filled full-attention blocks stored at request finish (partial hash hits).")         \
    X(uint64_t, remote_hit_blocks, COUNTER, "remote_hit_blocks_total",                             \
      "Blocks read from the remote tier into hits.")                                               \
    /* the rows below came after the struct's size was frozen at 448 bytes */                      \
    /* (KVT_OFFLOAD_STATS_SIZE_0): a program built before them reads none of them */               \
    X(uint64_t, hit_requests, COUNTER, "hit_requests_total",                                       \
      "Matches that offered a hit (any tier): the request hit rate's numerator, lookups its "      \
      "denominator.")                                                                              \
    X(uint64_t, remote_lookups_spared, COUNTER, "remote_lookups_spared_total",                     \
      "Remote-tier lookups not sent: the same span missed less than remote_miss_ms ago.")

#define KVT_STATS_FIELD_(type, field, kind, family, help) type field;
typedef struct kvt_offload_stats {
    KVT_OFFLOAD_STATS_ROWS(KVT_STATS_FIELD_)
} kvt_offload_stats;
#undef KVT_STATS_FIELD_

/* The stats into the caller's struct of `size` bytes, the struct's size in the caller's
 * header (sizeof *s): the library writes the first min(size, its own size) bytes and zeroes
 * the rest of the caller's, so a program built against an older, shorter struct reads its
 * own fields and nothing past them, and one built against a newer header reads zero for
 * fields this library lacks. Fields are only ever appended. Returns the library's size of
 * the struct (s may be NULL to ask only that). */
KVT_API size_t kvt_offload_stats_read(const kvt_offload *m, kvt_offload_stats *s, size_t size);
/* kvt_offload_stats_read with the size the struct had when it stopped growing in place
 * (448 bytes: every program built before the sized read came calls this symbol). Compiled
 * against this header, the name is a macro that passes sizeof *s instead. */
#define KVT_OFFLOAD_STATS_SIZE_0 448u
KVT_API void kvt_offload_get_stats(const kvt_offload *m, kvt_offload_stats *s);
#define kvt_offload_get_stats(m, s) ((void)kvt_offload_stats_read((m), (s), sizeof(*(s))))

/* The same figures for every tier (tier 0 the host, tier 1 the disk behind it), so a program
 * walks tiers by index instead of naming them; kvt_offload_stats' host_* / disk_* fields are
 * the flat view of these. */
typedef struct kvt_tier_stats {
    const char *name;              /* "host", "disk", "remote", or a name of add_tier */
    uint64_t hit_blocks;           /* blocks of this tier pinned by hits */
    uint64_t hit_tokens;           /* tokens of hits served from this tier */
    uint64_t load_events;          /* loads out of this tier issued (to the GPU, or promotions) */
    uint64_t store_events;         /* stores into this tier issued */
    uint64_t store_blocks;         /* blocks in them */
    uint64_t stores_completed;     /* blocks made findable */
    uint64_t stores_failed;        /* blocks of store events a worker could not write */
    uint64_t stores_abandoned;     /* blocks whose store completed after a reset */
    uint64_t store_skipped_cached; /* not stored: already in this tier */
    uint64_t store_dropped;        /* not stored: no free block or event room */
    uint64_t evictions;            /* cached blocks reused for new ones */
    uint32_t blocks, used_blocks, cached_blocks;
    uint32_t load_events_in_flight, store_events_in_flight;
    uint64_t loads_failed;    /* blocks a worker could not read out of this tier: their keys are
                                 dropped, so the next request misses rather than fails again */
    uint64_t lookups_dropped; /* the remote tier: directory answers not offered, as the hit in
                                 front of them had changed while a node tier's lock was let
                                 go for the round trip (the request looks up again) */
    uint64_t reserved[6];     /* room for figures to come (zero) */
} kvt_tier_stats;

/* Tiers this manager has, the host and every tier behind it, the remote tier (which has no
 * blocks of its own: its blocks, used and cached figures are 0) last; 0 for NULL. */
KVT_API uint32_t kvt_offload_num_tiers(const kvt_offload *m);
/* Tier `tier`'s figures; KVT_ERANGE (out zeroed) for a tier the manager does not have. */
KVT_API int kvt_offload_get_tier_stats(const kvt_offload *m, uint32_t tier, kvt_tier_stats *out);
/* Writes the stats in Prometheus text exposition format (kvtier_offload_* families) into buf;
 * *len receives the length. KVT_ENOSPC (and the length needed in *len) if cap is too small. */
KVT_API int kvt_offload_prometheus(const kvt_offload *m, char *buf, size_t cap, size_t *len);

#ifdef __cplusplus
}
#endif

#endif /* KVTIER_OFFLOAD_H */
