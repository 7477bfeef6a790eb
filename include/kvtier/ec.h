/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvtier encoder-cache transfer (vLLM ECMooncakeConnector): memory management.
 *
 *   kvt_slab   the allocator over one registered buffer that producers stage embeddings in
 *              and consumers reserve receive space in: 256-byte
 *              granularity, first fit over a sorted free list, split from the front, free
 *              coalescing with both neighbours.
 *
 *   kvt_ec_shard
 *              one consumer shard's receive side: the slab, the reservation table
 *              (writers, followers, cached hits with leases, deferred cancels and expiries,
 *              refresh-abandon, tombstones) and the resident pool (pins, leases, retirement,
 *              LRU reclaim behind fences). Its first rule: memory that a remote writer may still
 *              be writing is never freed by a timeout or a consumer-side cancel — only by the
 *              writer's completion or its explicit abandon.
 *
 *   kvt_ec_sched
 *              the consumer scheduler's transfer table:
 *              readiness only when every shard reported, the AVAILABLE / LOADING / READY /
 *              RESIDENT life cycle with its deadlines, local handoffs, abandoned pushes that
 *              fail a waiting request at once, the load specs of the step's metadata.
 *
 *   kvt_ec_producer
 *              the producer worker's push records: reserve on
 *              every consumer shard before the encoder output exists, bind sources behind a
 *              readiness fence, push ready records per consumer in batches, complete, and on
 *              any failure abandon every shard's reservation; conflicting payloads under one
 *              transfer id are reported through failed_saves, never raised.
 *   kvt_ec_planner
 *              the producer scheduler: push specs prepared once per transfer id,
 *              emitted once in the step's metadata, the bindings a response reports, and
 *              has_pending_push_work.
 *
 * Thread rules: a slab or a shard is used by one thread at a time.
 */
#ifndef KVTIER_EC_H
#define KVTIER_EC_H

#include "kvtier/base.h"
#include "kvtier/meta.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVT_SLAB_GRANULE 256u

/* An allocation: nbytes exactly as asked (what a view of it exposes), at offset; rounded is
 * what it occupies and what kvt_slab_free gives back. ptr is base + offset (NULL when the
 * slab manages offsets only). */
typedef struct kvt_slab_view {
    uint64_t offset;
    uint64_t nbytes;
    uint64_t rounded;
    void *ptr;
} kvt_slab_view;

typedef struct kvt_slab kvt_slab;

/* A slab of capacity bytes (rounded down to the granule) over base (borrowed; may be NULL to
 * manage offsets only). KVT_EINVAL if capacity is below one granule. */
KVT_API int kvt_slab_create(void *base, uint64_t capacity, kvt_slab **out);
KVT_API void kvt_slab_destroy(kvt_slab *s);
/* First fit of nbytes (> 0) rounded up to the granule. KVT_ENOSPC (and *out zeroed) when no
 * free extent is large enough; the slab is unchanged. */
KVT_API int kvt_slab_alloc(kvt_slab *s, uint64_t nbytes, kvt_slab_view *out);
/* Gives an allocation back, coalescing with its free neighbours. A view that is not
 * granule-aligned, lies outside the slab or overlaps free space (a double free) is refused
 * with KVT_EINVAL and changes nothing. */
KVT_API int kvt_slab_free(kvt_slab *s, const kvt_slab_view *v);
KVT_API uint64_t kvt_slab_capacity(const kvt_slab *s);
KVT_API uint64_t kvt_slab_free_bytes(const kvt_slab *s);
/* Free extents (fragmentation): 1 when everything free is one piece. */
KVT_API uint32_t kvt_slab_free_extents(const kvt_slab *s);
/* Largest single allocation that would succeed now. */
KVT_API uint64_t kvt_slab_largest_free(const kvt_slab *s);

/* ---- consumer shard ------------------------------- */

#define KVT_EC_KEY_MAX 255u /* longest transfer id or mm_hash, bytes */
#define KVT_EC_RID_LEN 32u  /* reservation ids: 32 lowercase hex digits (128 random bits) */

/* What a reservation holds: the item's key and tensor description. nbytes must equal
 * prod(shape) x the dtype's size (kvt_dtype_size). */
typedef struct kvt_ec_item {
    const char *mm_hash;
    uint32_t mm_hash_len;
    uint64_t nbytes;
    uint32_t ndim;
    uint64_t shape[KVT_EC_MAX_DIMS];
    const char *dtype; /* torch dtype name, e.g. "bfloat16" */
    uint32_t dtype_len;
} kvt_ec_item;

/* A fence that must have passed before retired memory may be reused (a CUDA event recorded
 * after the last kernel that read it). done() is polled; NULL fn means already passed. */
typedef struct kvt_ec_fence {
    bool (*done)(void *ctx);
    void *ctx;
} kvt_ec_fence;

typedef struct kvt_ec_shard_config {
    void *base;              /* the registered receive buffer (borrowed; NULL: offsets only) */
    uint64_t capacity;       /* its bytes (rounded down to the 256-byte granule) */
    uint64_t ttl_ns;         /* reservation TTL and tombstone lifetime; default 300 s */
    uint32_t max_records;    /* live reservations; default 65,536 */
    uint32_t max_tombstones; /* terminal records kept, oldest dropped first; default 65,536 */
    uint32_t max_residents;  /* resident entries (current and displaced); default 65,536 */
    uint32_t max_events;     /* readiness / abandoned / reclaimed backlog each; default 4,096 */
    kvt_clock clock;         /* default: the monotonic clock */
    /* room for fields to come, so the struct keeps its size: zero (as *_config_init
     * leaves it); a create refuses a config whose room is not zero */
    uint64_t reserved[8];
} kvt_ec_shard_config;

/* The reply to a reserve (the control server adds dst_session). */
typedef struct kvt_ec_reply {
    char reservation_id[KVT_EC_RID_LEN + 1]; /* "" when cancelled */
    uint64_t offset;                         /* destination in the buffer */
    void *ptr;                               /* base + offset (NULL without a base) */
    uint64_t nbytes;
    bool write;     /* the producer must write the bytes */
    bool ready;     /* already complete (a resident hit) */
    bool cached;    /* served from the resident pool */
    bool cancelled; /* the consumer cancelled this transfer before it was reserved */
} kvt_ec_reply;

/* A transfer that became ready on this shard (the control server's readiness event). */
typedef struct kvt_ec_ready_event {
    char transfer_id[KVT_EC_KEY_MAX + 1];
    char mm_hash[KVT_EC_KEY_MAX + 1];
    char reservation_id[KVT_EC_RID_LEN + 1];
    uint64_t nbytes;
    uint32_t ndim; /* the tensor, as reserved */
    uint64_t shape[KVT_EC_MAX_DIMS];
    char dtype[24];
    bool abandoned; /* an abandoned writer or follower: the waiting request fails at once */
} kvt_ec_ready_event;

/* Reservation states, as kvt_ec_shard_state reports them. */
enum kvt_ec_rstate {
    KVT_EC_NONE = 0, /* unknown transfer (or reaped) */
    KVT_EC_WRITING,
    KVT_EC_READY,
    KVT_EC_CANCEL_PENDING,
    KVT_EC_EXPIRE_PENDING,
    KVT_EC_CANCELLED,
    KVT_EC_EXPIRED
};

typedef struct kvt_ec_shard kvt_ec_shard;

KVT_API void kvt_ec_shard_config_init(kvt_ec_shard_config *cfg);
KVT_API int kvt_ec_shard_create(const kvt_ec_shard_config *cfg, kvt_ec_shard **out);
/* Frees everything. Refused (KVT_EBUSY, nothing freed) while a remote writer may still write
 * into the buffer (kvt_ec_shard_writers): the caller keeps the buffer registered and may try
 * again. */
KVT_API int kvt_ec_shard_destroy(kvt_ec_shard *sh);

/* reserve(T, H, ...): a resident hit, a follower of the in-flight writer of H, or a
 * new allocation. Errors: KVT_EINVAL (bad item, a conflicting reservation or cached tensor),
 * KVT_ESTATE (shutting down; an expired writer still active: refresh-abandon first),
 * KVT_ENOSPC (the pool is full after expiry and reclaim), KVT_ELIMIT (record table full). */
KVT_API int kvt_ec_shard_reserve(kvt_ec_shard *sh, const char *transfer_id, uint32_t len,
                                 const kvt_ec_item *item, kvt_ec_reply *out);
/* complete(T, reservation_id): *accepted (the writer's completion or a repeat) and
 * *became_ready (WRITING -> READY now). A wrong id or unknown transfer is (false, false). */
KVT_API int kvt_ec_shard_complete(kvt_ec_shard *sh, const char *transfer_id, uint32_t len,
                                  const char *reservation_id, bool *accepted, bool *became_ready);
/* cancel(T, reservation_id, abandon, refresh); reservation_id NULL or "" matches any.
 * *done is the Python return value. A consumer-side cancel (abandon false) never frees memory
 * a writer may still write: it defers (CANCEL_PENDING). */
KVT_API int kvt_ec_shard_cancel(kvt_ec_shard *sh, const char *transfer_id, uint32_t len,
                                const char *reservation_id, bool abandon, bool refresh, bool *done);
/* TTL pass: READY past expiry -> EXPIRED (released); WRITING past expiry -> a follower is
 * cancelled, a writer deferred (EXPIRE_PENDING, memory kept); tombstones reaped. */
KVT_API void kvt_ec_shard_expire(kvt_ec_shard *sh);
/* take(T, H): a READY reservation becomes a pinned resident (the record goes); *out is the
 * canonical allocation of H. KVT_ESTATE ("not ready") otherwise: a failed load. fence (may be
 * NULL), recorded on the stream now, guards a pinned entry of H that this take displaces: it
 * is reused only after the fence passed. */
KVT_API int kvt_ec_shard_take(kvt_ec_shard *sh, const char *transfer_id, uint32_t len,
                              const char *mm_hash, uint32_t hash_len, const kvt_ec_fence *fence,
                              kvt_slab_view *out);
/* Local handoff: pins the resident entry of item->mm_hash if it has the same shape and dtype.
 * KVT_ENOENT otherwise (a failed load). */
KVT_API int kvt_ec_shard_take_resident(kvt_ec_shard *sh, const kvt_ec_item *item,
                                       kvt_slab_view *out);
/* Retires H (`freed`): unpins its resident entry, which stays reusable (hits, local loads) and
 * becomes evictable once no lease holds it; its memory is reused only after fence passed.
 * Returns 1 if an entry was retired, 0 if H has no pinned entry. */
KVT_API int kvt_ec_shard_retire(kvt_ec_shard *sh, const char *mm_hash, uint32_t len,
                                const kvt_ec_fence *fence);
/* Stops new reservations; cancels followers and READY records, defers writers. */
KVT_API void kvt_ec_shard_begin_shutdown(kvt_ec_shard *sh);
/* Reservations whose writer may still write into the buffer (WRITING, CANCEL_PENDING,
 * EXPIRE_PENDING writers). */
KVT_API uint32_t kvt_ec_shard_writers(const kvt_ec_shard *sh);
KVT_API int kvt_ec_shard_state(const kvt_ec_shard *sh, const char *transfer_id, uint32_t len);
/* The receive buffer (config base, NULL for offsets only) and its usable bytes. */
KVT_API void *kvt_ec_shard_buffer(const kvt_ec_shard *sh, uint64_t *capacity);
/* The control plane's `status`: a transfer's active record (WRITING, READY or pending a
 * writer), if any. */
typedef struct kvt_ec_status {
    char mm_hash[KVT_EC_KEY_MAX + 1];
    char reservation_id[KVT_EC_RID_LEN + 1];
    uint64_t nbytes;
    uint32_t ndim;
    uint64_t shape[KVT_EC_MAX_DIMS];
    char dtype[24];
    int state; /* enum kvt_ec_rstate */
    bool ready;
} kvt_ec_status;
/* 1 and *out filled when transfer_id has an active record, 0 when not (tombstones and unknown
 * ids included), KVT_EINVAL for a bad id. */
KVT_API int kvt_ec_shard_status(const kvt_ec_shard *sh, const char *transfer_id, uint32_t len,
                                kvt_ec_status *out);

/* Readiness events (and abandoned notices) queued since the last call, oldest first. */
KVT_API uint32_t kvt_ec_shard_take_events(kvt_ec_shard *sh, kvt_ec_ready_event *out, uint32_t cap);
/* mm_hashes evicted under pressure since the last call (the `reclaimed` report), into out as
 * NUL-terminated strings of KVT_EC_KEY_MAX + 1 bytes each. */
KVT_API uint32_t kvt_ec_shard_take_reclaimed(kvt_ec_shard *sh, char (*out)[KVT_EC_KEY_MAX + 1],
                                             uint32_t cap);

/* The rank's encoder cache, as the worker step below reaches it. */
typedef struct kvt_ec_cache_ops {
    /* H is in the encoder cache (and, when view is not NULL, as that very allocation) */
    bool (*holds)(void *ctx, const char *mm_hash, uint32_t len, const kvt_slab_view *view);
    /* puts a loaded item (a view into the shard's buffer, shaped by spec) in the cache */
    int (*place)(void *ctx, const kvt_ec_load_spec *spec, const kvt_slab_view *view);
    /* a fence recorded now on the stream that reads the cache (NULL fn: nothing reads) */
    kvt_ec_fence (*fence)(void *ctx);
    void *ctx;
} kvt_ec_cache_ops;

/* The consumer worker's step on its shard (vLLM's start_load_caches): retires the
 * metadata's freed hashes (has_freed false: every pinned resident the cache no longer holds),
 * skipping one the cache still holds as that very allocation; runs every load spec — an item
 * the cache holds already is reported loaded (a pushed one's reservation is released), a
 * local one comes from the resident pool, a pushed one from its READY reservation — and
 * reports into out: loaded, failed_loads, and the hashes reclaimed since the last step. */
KVT_API int kvt_ec_shard_apply(kvt_ec_shard *sh, const kvt_ec_meta *meta,
                               const kvt_ec_cache_ops *cache, kvt_ec_worker_meta *out);

typedef struct kvt_ec_shard_stats {
    uint64_t reserves, writes, follows, cached_hits, completes, cancels, expiries, takes;
    uint64_t reclaims, deferred_frees, tombstones_dropped, events_dropped;
    uint32_t records, tombstones, residents, writers;
    uint64_t free_bytes, capacity;
    uint64_t held_bytes;  /* held by writers' reservations, resident entries and frees waiting
                             for a fence: capacity - free_bytes unless bytes were lost */
    uint64_t reserved[8]; /* room for figures to come (zero) */
} kvt_ec_shard_stats;
KVT_API void kvt_ec_shard_get_stats(const kvt_ec_shard *sh, kvt_ec_shard_stats *st);
/* The stats in Prometheus text (kvtier_ec_shard_* families); *len receives the length,
 * KVT_ENOSPC (and the length needed) if cap is too small. */
KVT_API int kvt_ec_shard_prometheus(const kvt_ec_shard *sh, char *buf, size_t cap, size_t *len);

/* ---- consumer scheduler: the transfer table ------------------------------------------------ */

#define KVT_EC_MAX_SHARDS 64u

/* Transfer states as kvt_ec_sched_state reports them. */
enum kvt_ec_tstate {
    KVT_ECT_NONE = 0,
    KVT_ECT_WAITING,   /* a request waits for the push's readiness */
    KVT_ECT_AVAILABLE, /* every shard reported it ready: a load may be scheduled */
    KVT_ECT_LOADING,   /* its load spec went (or goes) to the workers */
    KVT_ECT_READY,     /* every rank placed it in its encoder cache */
    KVT_ECT_RESIDENT,  /* evicted from the encoder cache, still in the shards' pools */
    KVT_ECT_FAILED,    /* tombstones from here on */
    KVT_ECT_UNAVAILABLE,
    KVT_ECT_EXPIRED,
    KVT_ECT_CANCELLED
};

typedef struct kvt_ec_sched_config {
    uint32_t shards;            /* consumer TP shards that must each report readiness; 1..64 */
    uint64_t push_wait_ns;      /* a waiting request or a load without report fails; 60 s */
    uint64_t lease_ns;          /* AVAILABLE lease and tombstone lifetime; default 300 s */
    uint64_t resident_capacity; /* bytes mirrored as RESIDENT (ec_buffer_size); default 1e9 */
    uint32_t max_transfers;     /* live transfer records; default 65,536 */
    uint32_t max_tombstones;    /* default 65,536, oldest dropped first */
    uint32_t max_partial;       /* transfers with readiness from some shards only; 4,096 */
    kvt_clock clock;
    /* room for fields to come, so the struct keeps its size: zero (as *_config_init
     * leaves it); a create refuses a config whose room is not zero */
    uint64_t reserved[8];
} kvt_ec_sched_config;

/* A readiness report of one shard (its control server's event). */
typedef struct kvt_ec_ready {
    const char *transfer_id;
    uint32_t transfer_id_len;
    kvt_ec_item item;
    uint32_t shard; /* 0 .. shards - 1 */
} kvt_ec_ready;

/* One multimodal feature of a request: its item key and the transfer the proxy named for it
 * (NULL / 0: none; the table then waits under "<request_id>:<index>"). */
typedef struct kvt_ec_feature {
    const char *mm_hash;
    uint32_t mm_hash_len;
    const char *transfer_id;
    uint32_t transfer_id_len;
} kvt_ec_feature;

typedef struct kvt_ec_sched kvt_ec_sched;

KVT_API void kvt_ec_sched_config_init(kvt_ec_sched_config *cfg);
KVT_API int kvt_ec_sched_create(const kvt_ec_sched_config *cfg, kvt_ec_sched **out);
KVT_API void kvt_ec_sched_destroy(kvt_ec_sched *s);

/* A shard's readiness event. Ignored for a transfer already finished (a tombstone) or whose
 * item collides with the one the table knows under that id; a repeat from one shard does
 * not count; when every shard reported, the transfer is AVAILABLE with a lease. */
KVT_API int kvt_ec_sched_observe_ready(kvt_ec_sched *s, const kvt_ec_ready *ev);
/* An abandoned push: a waiting request fails at once (or when it arrives); after
 * readiness it is ignored. */
KVT_API int kvt_ec_sched_observe_abandoned(kvt_ec_sched *s, const char *transfer_id, uint32_t len);
/* True when some transfer of mm_hash is READY, RESIDENT or AVAILABLE (the engine then treats
 * it as externally cached and does not encode it). */
KVT_API bool kvt_ec_sched_has_cache_item(kvt_ec_sched *s, const char *mm_hash, uint32_t len);
/* ensure_cache_available: *ready when every feature is in the encoder cache or READY; else
 * starts what is missing (a load of an AVAILABLE or RESIDENT transfer, or a wait for a push)
 * and the engine skips the request this step. A request whose transfer id collides with
 * another item, or whose push was abandoned, is failed (kvt_ec_sched_take_unavailable). */
KVT_API int kvt_ec_sched_ensure(kvt_ec_sched *s, const char *req_id, uint32_t req_len,
                                const kvt_ec_feature *features, uint32_t n, bool *ready);
/* The engine's encoder cache now holds mm_hash (update_state_after_alloc). */
KVT_API int kvt_ec_sched_cache_added(kvt_ec_sched *s, const char *mm_hash, uint32_t len);
/* The engine's encoder cache evicted mm_hash (free_encoder_mm_hashes): the newest READY
 * transfer becomes RESIDENT (a later load is a local handoff), other READY / RESIDENT ones of
 * it expire and are cancelled; the hash goes to the next metadata's `freed`. */
KVT_API int kvt_ec_sched_cache_freed(kvt_ec_sched *s, const char *mm_hash, uint32_t len);
/* The request consumed a feature (update_state_after_free): its transfer is released (a cancel
 * to every shard) unless the item is served from the encoder cache. */
KVT_API int kvt_ec_sched_consumed(kvt_ec_sched *s, const char *req_id, uint32_t req_len,
                                  const kvt_ec_feature *feature);
/* request_finished: cancels the request's transfers, except one another request still uses or
 * waits for, and forgets the request. A transfer the ranks are loading is released when it
 * arrives (its hash goes to the next `freed`), one loaded but never taken by the engine's
 * encoder cache at once. */
KVT_API int kvt_ec_sched_request_finished(kvt_ec_sched *s, const char *req_id, uint32_t req_len);
/* The same, given the request's bindings (its ec_items: mm_hash and transfer id per feature):
 * transfers named there that the table never saw (a request aborted before ensure) are
 * cancelled on every shard too, and their late readiness is ignored. */
KVT_API int kvt_ec_sched_request_finished_bound(kvt_ec_sched *s, const char *req_id,
                                                uint32_t req_len, const kvt_ec_feature *bindings,
                                                uint32_t n);
/* build_connector_meta: the queued load specs (each once) and the freed hashes, into out
 * (cleared first). */
KVT_API int kvt_ec_sched_build_meta(kvt_ec_sched *s, kvt_ec_meta *out);
/* update_connector_output with the ranks' aggregated report: loaded -> READY, failed_loads ->
 * FAILED, reclaimed -> residency dropped, failed_saves -> those requests fail. */
KVT_API int kvt_ec_sched_apply_output(kvt_ec_sched *s, const kvt_ec_worker_meta *agg);
/* Deadlines: an AVAILABLE lease runs out (EXPIRED, cancelled), a LOADING without report or a
 * wait without readiness (UNAVAILABLE, its requests failed), tombstones reaped. */
KVT_API void kvt_ec_sched_expire(kvt_ec_sched *s);
/* Requests to fail (a retryable error), each reported once; ids copied into out as
 * NUL-terminated strings of KVT_EC_KEY_MAX + 1 bytes. */
KVT_API uint32_t kvt_ec_sched_take_unavailable(kvt_ec_sched *s, char (*out)[KVT_EC_KEY_MAX + 1],
                                               uint32_t cap);
/* Transfer ids to cancel on every shard (cancel(T, "")), each once. */
KVT_API uint32_t kvt_ec_sched_take_cancels(kvt_ec_sched *s, char (*out)[KVT_EC_KEY_MAX + 1],
                                           uint32_t cap);
KVT_API int kvt_ec_sched_state(const kvt_ec_sched *s, const char *transfer_id, uint32_t len);

typedef struct kvt_ec_sched_stats {
    uint64_t ready_events;  /* shard readiness events observed */
    uint64_t ready_ignored; /* for finished, colliding or already-ready transfers */
    uint64_t abandoned;     /* abandoned notices observed */
    uint64_t loads_started; /* load specs queued (local ones included) */
    uint64_t local_loads;   /* of which local handoffs from the shards' pools */
    uint64_t loaded;        /* transfers READY on every rank */
    uint64_t failed_loads;  /* transfers FAILED by a rank's report */
    uint64_t unavailable;   /* requests failed (timeouts, abandoned pushes, collisions) */
    uint64_t cancels;       /* cancels queued for the shards */
    uint32_t transfers[KVT_ECT_CANCELLED + 1]; /* gauges: records per state (index = state) */
    uint32_t requests;                         /* gauge: requests tracked */
    uint64_t reserved[8];                      /* room for figures to come (zero) */
} kvt_ec_sched_stats;
KVT_API void kvt_ec_sched_get_stats(const kvt_ec_sched *s, kvt_ec_sched_stats *st);
/* The stats in Prometheus text (kvtier_ec_sched_* families; transfers by state label). */
KVT_API int kvt_ec_sched_prometheus(const kvt_ec_sched *s, char *buf, size_t cap, size_t *len);

/* ---- producer: push records -------------------------------------------------------------------
 */

/* One reserve, completion or cancel of a batch, for one shard. */
typedef struct kvt_ec_batch_op {
    const char *transfer_id;
    uint32_t len;
    const kvt_ec_item *item;    /* reserve */
    const char *reservation_id; /* complete, cancel */
    bool abandon, refresh;      /* cancel */
    int rc;                     /* out: 0 or the KVT_E* code of this operation */
    kvt_ec_reply reply;         /* out, reserve */
    bool accepted;              /* out, complete */
    char error[256];            /* out: the message when rc is not 0 */
} kvt_ec_batch_op;

/* One write of a batch: nbytes from src into the reservation dst of shard. */
typedef struct kvt_ec_write_op {
    uint32_t shard;
    const kvt_ec_reply *dst;
    const void *src;
    uint64_t nbytes;
    int rc;          /* out */
    char error[256]; /* out */
} kvt_ec_write_op;

/* The consumer shards as the producer reaches them: in-process shards in tests, the ZeroMQ
 * control plane and the UCX data plane (kvtier/ec_net.h). Each call returns 0 or a negative KVT_E*
 * code with kvt_last_error() set; `consumer` is the push spec's consumer address. */
typedef struct kvt_ec_consumer_ops {
    /* the consumer's shard count (its topology), 1..64 */
    int (*shards)(void *ctx, const char *consumer, uint32_t *n);
    int (*reserve)(void *ctx, const char *consumer, uint32_t shard, const char *transfer_id,
                   uint32_t len, const kvt_ec_item *item, kvt_ec_reply *out);
    /* writes nbytes from src into the reservation dst of that shard (one-sided) */
    int (*write)(void *ctx, const char *consumer, uint32_t shard, const kvt_ec_reply *dst,
                 const void *src, uint64_t nbytes);
    int (*complete)(void *ctx, const char *consumer, uint32_t shard, const char *transfer_id,
                    uint32_t len, const char *reservation_id, bool *accepted);
    int (*cancel)(void *ctx, const char *consumer, uint32_t shard, const char *transfer_id,
                  uint32_t len, const char *reservation_id, bool abandon, bool refresh);
    void *ctx;
    /* Batched forms, optional (NULL: the producer makes the single calls above, one by one).
     * Each handles n operations in one exchange per shard and sets every operation's rc (and
     * error when rc is not 0); it returns 0 when each operation's rc tells its outcome, or a
     * code when none could be tried (every rc then carries it too). */
    int (*reserve_batch)(void *ctx, const char *consumer, uint32_t shard, kvt_ec_batch_op *ops,
                         uint32_t n);
    /* writes may go to several shards; all are in flight at once (bounded by the transport) */
    int (*write_batch)(void *ctx, const char *consumer, kvt_ec_write_op *ops, uint32_t n);
    int (*complete_batch)(void *ctx, const char *consumer, uint32_t shard, kvt_ec_batch_op *ops,
                          uint32_t n);
    int (*cancel_batch)(void *ctx, const char *consumer, uint32_t shard, kvt_ec_batch_op *ops,
                        uint32_t n);
} kvt_ec_consumer_ops;

/* A consumer in the same process (an engine that encodes and prefills in one process, tests,
 * the demo): its shards reached by direct calls, writes copied into the reserved region
 * (shards must have a base). The struct must outlive the producer using its ops. */
typedef struct kvt_ec_local_consumer {
    kvt_ec_shard *shards[KVT_EC_MAX_SHARDS];
    uint32_t n;
} kvt_ec_local_consumer;
KVT_API kvt_ec_consumer_ops kvt_ec_local_consumer_ops(kvt_ec_local_consumer *c);

/* Push record states, as kvt_ec_producer_state reports them. */
enum kvt_ec_pstate {
    KVT_ECP_NONE = 0,
    KVT_ECP_WAITING_INPUTS, /* reserved (or reserving); waits for its source */
    KVT_ECP_WRITING,
    KVT_ECP_NOTIFYING,
    KVT_ECP_DONE,
    KVT_ECP_CANCEL_PENDING,
    KVT_ECP_CANCELLED,
    KVT_ECP_FAILED
};

typedef struct kvt_ec_producer_config {
    kvt_ec_consumer_ops ops;
    uint64_t refresh_age_ns;  /* a reservation not yet ready and older than this is refreshed
                                 before writing (TTL / 2); default 150 s */
    uint32_t max_records;     /* push records kept, terminal ones reaped oldest first; 65,536 */
    uint32_t max_batch;       /* records one dispatch batch pushes together; default 1,024 */
    uint64_t max_batch_bytes; /* and their bytes (one record alone may be larger); 256 MiB */
    kvt_clock clock;
    /* room for fields to come, so the struct keeps its size: zero (as *_config_init
     * leaves it); a create refuses a config whose room is not zero */
    uint64_t reserved[8];
} kvt_ec_producer_config;

/* A push that failed, reported once: its mm_hash and the first error. */
typedef struct kvt_ec_push_failure {
    char mm_hash[KVT_EC_KEY_MAX + 1];
    char transfer_id[KVT_EC_KEY_MAX + 1];
    char error[256];
} kvt_ec_push_failure;

typedef struct kvt_ec_producer kvt_ec_producer;

KVT_API void kvt_ec_producer_config_init(kvt_ec_producer_config *cfg);
KVT_API int kvt_ec_producer_create(const kvt_ec_producer_config *cfg, kvt_ec_producer **out);
/* Abandons every reservation of a record that has not finished, then frees everything. */
KVT_API void kvt_ec_producer_destroy(kvt_ec_producer *p);
/* start_save_caches for one push spec. The same transfer id with the same push (item, shape,
 * dtype, consumer; the request id may differ) reuses its record; a different payload under
 * it puts the request id into failed_saves (returns 0: never an engine error). A new record
 * reserves on every shard of the consumer before the encoder output exists; if any shard
 * refuses, the reservations already made are abandoned and the record FAILED. */
KVT_API int kvt_ec_producer_push(kvt_ec_producer *p, const kvt_ec_push_spec *spec);
/* kvt_ec_producer_push for n specs (a step's start_save_caches), the new records' reserves
 * sent in one batch per shard (reserve_batch when the ops have it). Returns 0, or the first
 * spec's error that kvt_ec_producer_push would have returned (specs before it are pushed). */
KVT_API int kvt_ec_producer_push_many(kvt_ec_producer *p, const kvt_ec_push_spec *specs,
                                      uint32_t n);
/* save_caches: mm_hash's encoder output is nbytes at src (it must stay valid until its records
 * are no longer pending), readable once fence passed (NULL: now). Binds to every record of
 * mm_hash waiting without a source; returns how many. */
KVT_API int kvt_ec_producer_bind_source(kvt_ec_producer *p, const char *mm_hash, uint32_t len,
                                        const void *src, uint64_t nbytes,
                                        const kvt_ec_fence *fence);
/* An encoder output as the engine holds it: its shape (ndim <= KVT_EC_MAX_DIMS entries) and
 * dtype (a NUL-terminated name as in the push specs, e.g. "float16"). */
typedef struct kvt_ec_source_desc {
    uint32_t ndim;
    uint64_t shape[KVT_EC_MAX_DIMS];
    const char *dtype;
} kvt_ec_source_desc;
/* kvt_ec_producer_bind_source that also checks the output's shape and dtype against each
 * waiting push of mm_hash: a push that differs is not bound but FAILED (its reservations
 * abandoned, its request in failed_saves, the difference in its error), as a wrong size is at
 * dispatch. Returns how many were bound; KVT_EINVAL for a bad desc (nothing changed). */
KVT_API int kvt_ec_producer_bind_source_typed(kvt_ec_producer *p, const char *mm_hash, uint32_t len,
                                              const void *src, uint64_t nbytes,
                                              const kvt_ec_source_desc *desc,
                                              const kvt_ec_fence *fence);
/* The dispatcher: pushes every record whose source is bound and ready, in batches per consumer
 * of up to max_batch records and max_batch_bytes (a record still waiting never holds back a
 * ready one): refresh stale reservations, check each source against its spec, write every
 * shard that asked for the bytes (the batch's writes all in flight together: write_batch),
 * complete on every shard (one complete_batch per shard), DONE. Any failure abandons every shard's
 * reservation of the record (FAILED); a completion a shard rejects (it let go of the item
 * meanwhile) is logged and counted, not a failure. Returns the records pushed. */
KVT_API int kvt_ec_producer_dispatch(kvt_ec_producer *p);
/* get_finished: the request's pushes that still have no source are cancelled on every shard
 * (CANCELLED, or FAILED if a shard could not be reached twice). */
KVT_API int kvt_ec_producer_request_finished(kvt_ec_producer *p, const char *req_id, uint32_t len);
/* pending_saves: some record is not terminal. */
KVT_API bool kvt_ec_producer_pending(const kvt_ec_producer *p);
/* build_connector_worker_meta: pending_saves and the failed_saves gathered since the last
 * call, added to out. */
KVT_API int kvt_ec_producer_report(kvt_ec_producer *p, kvt_ec_worker_meta *out);
/* Failed pushes not yet reported, each once (the worker logs them). */
KVT_API uint32_t kvt_ec_producer_take_failures(kvt_ec_producer *p, kvt_ec_push_failure *out,
                                               uint32_t cap);
KVT_API int kvt_ec_producer_state(const kvt_ec_producer *p, const char *transfer_id, uint32_t len);

typedef struct kvt_ec_producer_stats {
    uint64_t pushes, reused, conflicts, reservations, refreshes, batches, writes, bytes_written;
    uint64_t completes, rejected, abandons, failed, cancelled, done;
    uint64_t silent_shards; /* shards that let a control message time out: not asked again in
                               that call, their reservations left to the consumer's TTL */
    uint64_t reserved[8];   /* room for figures to come (zero) */
} kvt_ec_producer_stats;
KVT_API void kvt_ec_producer_get_stats(const kvt_ec_producer *p, kvt_ec_producer_stats *st);
/* The stats in Prometheus text (kvtier_ec_producer_* families, pending records as a gauge). */
KVT_API int kvt_ec_producer_prometheus(const kvt_ec_producer *p, char *buf, size_t cap,
                                       size_t *len);

/* ---- producer scheduler: push planning ------------------------------------------------------- */

typedef struct kvt_ec_planner kvt_ec_planner;

/* A binding a producer response reports for a request: {mm_hash, transfer_id}. */
typedef struct kvt_ec_binding {
    char mm_hash[KVT_EC_KEY_MAX + 1];
    char transfer_id[KVT_EC_KEY_MAX + 1];
} kvt_ec_binding;

/* max_prepared: transfer ids prepared and not yet forgotten at once (default 65,536 if 0). */
KVT_API int kvt_ec_planner_create(uint32_t max_prepared, kvt_ec_planner **out);
KVT_API void kvt_ec_planner_destroy(kvt_ec_planner *p);
/* prepare_push_spec (ensure_cache_available, update_state_after_alloc). A spec without a
 * consumer address is ignored (returns 0). A transfer id prepared already: the same push
 * (the request id may differ) adds the request as a sharer, returns 0; a different payload
 * fails that request up front (kvt_ec_planner_take_failed), returns 0. A new one is queued
 * for the next metadata, returns 1. KVT_ELIMIT when max_prepared ids are held. */
KVT_API int kvt_ec_planner_prepare(kvt_ec_planner *p, const kvt_ec_push_spec *spec);
/* build_connector_meta: appends the pushes prepared since the last call, each once. */
KVT_API int kvt_ec_planner_build_meta(kvt_ec_planner *p, kvt_ec_meta *out);
/* The bindings of every prepared push the request shares (its response's ec_items). */
KVT_API uint32_t kvt_ec_planner_bindings(const kvt_ec_planner *p, const char *req_id, uint32_t len,
                                         kvt_ec_binding *out, uint32_t cap);
/* request_finished: the request no longer shares its pushes; a transfer id no request shares
 * any more is forgotten (a later prepare of it is new). */
KVT_API int kvt_ec_planner_request_finished(kvt_ec_planner *p, const char *req_id, uint32_t len);
/* update_connector_output: pending_saves (has_pending_push_work) and failed_saves (those
 * requests fail). */
KVT_API int kvt_ec_planner_apply_output(kvt_ec_planner *p, const kvt_ec_worker_meta *agg);
KVT_API bool kvt_ec_planner_has_pending_push_work(const kvt_ec_planner *p);
/* Requests to fail (a conflicting transfer id, a rejected push), each once. */
KVT_API uint32_t kvt_ec_planner_take_failed(kvt_ec_planner *p, char (*out)[KVT_EC_KEY_MAX + 1],
                                            uint32_t cap);

#ifdef __cplusplus
}
#endif

#endif /* KVTIER_EC_H */
