/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvtier metadata: the per-step messages between an engine's scheduler and its workers, as C
 * types, their aggregation rules and their wire encoding.
 *
 *   KV offload (vLLM SimpleCPUOffloadConnector)
 *     kvt_offload_meta          scheduler -> worker: this step's load and store events
 *     kvt_offload_worker_meta   worker -> scheduler: completed events {event: count}
 *   Encoder-cache transfer (vLLM ECMooncakeConnector)
 *     kvt_ec_load_spec, kvt_ec_push_spec
 *     kvt_ec_meta               scheduler -> worker: loads, pushes, freed
 *     kvt_ec_worker_meta        worker -> scheduler: loaded, failed, reclaimed, pending saves
 *
 * Memory: each message object owns its arrays and strings. *_init prepares an empty object,
 * *_clear empties it but keeps its memory (a message reused every step stops allocating once
 * it has seen its largest step), *_release frees everything. Strings (kvt_str) point into the
 * object's own storage and stay valid until the next clear, decode or release; they are also
 * NUL-terminated. Array pointers may move whenever an element is added.
 *
 * Wire format: a 12-byte header (magic "KVTM", u16 version, u16 kind, u32 body length) and a
 * body of little-endian fixed-width integers and length-prefixed strings; see docs/wire.md.
 * Decoders check every length and range before use, reject trailing bytes and anything that
 * breaks the invariants *_validate() checks, and never read outside the buffer. On failure a
 * decoder returns KVT_EPROTO / KVT_EVERSION / KVT_ELIMIT with a message and leaves the target
 * empty.
 *
 * Thread rules: an object is used by one thread at a time; distinct objects are independent.
 */
#ifndef KVTIER_META_H
#define KVTIER_META_H

#include "kvtier/base.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVT_NO_EVENT        (-1) /* INVALID_JOB_ID: no event this step */
#define KVT_META_VERSION    4u   /* wire version this build writes and reads (4: EC capabilities) */
#define KVT_META_HEADER_LEN 12u
#define KVT_META_MAX_BLOCKS (1u << 24) /* block ids per list */
#define KVT_META_MAX_ITEMS  (1u << 20) /* events, ids, specs or set members per list */
#define KVT_META_MAX_STR    1024u      /* bytes per string (request id, mm_hash, address) */
#define KVT_EC_MAX_DIMS     8u         /* tensor rank */

enum kvt_meta_kind {
    KVT_META_OFFLOAD = 1,
    KVT_META_OFFLOAD_WORKER = 2,
    KVT_META_EC = 3,
    KVT_META_EC_WORKER = 4,
    KVT_META_EC_LOAD_SPEC = 5,
    KVT_META_EC_PUSH_SPEC = 6,
    KVT_META_EC_CTL_REQUEST = 7, /* encoder-cache control plane (internal to kvtier) */
    KVT_META_EC_CTL_REPLY = 8,
    KVT_META_EC_CTL_EVENT = 9
};

/* A string inside a message: len bytes at ptr (also NUL-terminated). */
typedef struct kvt_str {
    const char *ptr;
    uint32_t len;
} kvt_str;

/* Reads the header of an encoded message: its kind and version. Fails if buf is shorter than a
 * header or the magic is wrong; does not check the body. */
KVT_API int kvt_meta_peek(const void *buf, size_t len, uint32_t *kind, uint32_t *version);

/* ---- KV offload: scheduler -> worker ---------------------------------------------------- */

/* The offload tiers behind the engine's GPU memory, in order: tier 0 the host (its transfers
 * with the GPU are the seed's fields of kvt_offload_meta), tier 1 the local disk behind it. */
#define KVT_MAX_TIERS 2

/* One step's transfers between tier t >= 1 and the tier in front of it (t - 1): loads
 * (promotions, t -> t - 1) and stores (write-backs, t - 1 -> t), one event each, numbered per
 * tier and direction like the others; KVT_NO_EVENT exactly when the lists are empty. */
typedef struct kvt_tier_xfers {
    int64_t load_event;
    uint32_t n_loads;
    uint32_t *load_src; /* tier t blocks */
    uint32_t *load_dst; /* tier t - 1 blocks, pairwise */
    int64_t store_event;
    uint32_t n_stores;
    uint32_t *store_src; /* tier t - 1 blocks */
    uint32_t *store_dst; /* tier t blocks, pairwise */
    /* private */
    uint32_t cap_loads, cap_stores;
} kvt_tier_xfers;

typedef struct kvt_offload_meta {
    int64_t load_event; /* KVT_NO_EVENT when nothing loads this step */
    uint32_t n_loads;
    uint32_t *load_gpu_blocks; /* destination GPU blocks */
    uint32_t *load_cpu_blocks; /* source host blocks, pairwise with load_gpu_blocks */
    /* load_event_to_reqs: every outstanding load event (ascending) and its request ids:
     * event load_events[i] owns load_req_ids[load_req_first[i] .. load_req_first[i + 1]). */
    uint32_t n_load_events;
    int64_t *load_events;
    uint32_t *load_req_first; /* n_load_events + 1 offsets */
    uint32_t n_load_reqs;
    kvt_str *load_req_ids;
    int64_t store_event; /* KVT_NO_EVENT when nothing stores this step */
    uint32_t n_stores;
    uint32_t *store_gpu_blocks; /* source GPU blocks */
    uint32_t *store_cpu_blocks; /* destination host blocks (or disk slots), pairwise */
    bool need_flush;            /* a request was preempted: finish in-flight copies first */
    /* load_invalid_blocks: destination GPU blocks of this step's load event whose host source
     * could not be promoted from disk; the worker reports them invalid when the event
     * finishes (the engine recomputes them). A subset of load_gpu_blocks. */
    uint32_t n_load_invalid;
    uint32_t *load_invalid_blocks;
    /* tiers[t - 1]: the transfers of tier t with the tier in front of it (with three tiers,
     * tiers[0] holds the disk's promotions and write-backs; empty otherwise) */
    kvt_tier_xfers tiers[KVT_MAX_TIERS - 1];
    /* private */
    uint32_t cap_loads, cap_events, cap_first, cap_reqs, cap_stores, cap_invalid;
    kvt_bump strings;
} kvt_offload_meta;

KVT_API void kvt_offload_meta_init(kvt_offload_meta *m);
KVT_API void kvt_offload_meta_clear(kvt_offload_meta *m);
KVT_API void kvt_offload_meta_release(kvt_offload_meta *m);
/* Appends one (gpu, cpu) pair to the load lists / store lists. */
KVT_API int kvt_offload_meta_add_load(kvt_offload_meta *m, uint32_t gpu_block, uint32_t cpu_block);
KVT_API int kvt_offload_meta_add_store(kvt_offload_meta *m, uint32_t gpu_block, uint32_t cpu_block);
/* Appends a GPU block to load_invalid_blocks. */
KVT_API int kvt_offload_meta_add_load_invalid(kvt_offload_meta *m, uint32_t gpu_block);
/* Appends a pair to tier t's (1 <= t < KVT_MAX_TIERS) loads (src a block of tier t, dst of
 * tier t - 1) or stores (src a block of tier t - 1, dst of tier t); KVT_ERANGE for another t. */
KVT_API int kvt_offload_meta_add_tier_load(kvt_offload_meta *m, uint32_t tier, uint32_t src,
                                           uint32_t dst);
KVT_API int kvt_offload_meta_add_tier_store(kvt_offload_meta *m, uint32_t tier, uint32_t src,
                                            uint32_t dst);
/* Appends a request to load event `event`. Events must be added in ascending order, all
 * requests of one event together (call repeatedly with the same event). */
KVT_API int kvt_offload_meta_add_load_req(kvt_offload_meta *m, int64_t event, const char *req_id,
                                          uint32_t len);
/* Makes room for that many more loads, stores, load events, load request ids and request-id
 * bytes, so the adds that follow cannot fail. */
KVT_API int kvt_offload_meta_reserve(kvt_offload_meta *m, uint32_t loads, uint32_t stores,
                                     uint32_t events, uint32_t reqs, size_t req_bytes);
/* The same for load_invalid_blocks, and for tier t's loads and stores. */
KVT_API int kvt_offload_meta_reserve_invalid(kvt_offload_meta *m, uint32_t invalid);
KVT_API int kvt_offload_meta_reserve_tier(kvt_offload_meta *m, uint32_t tier, uint32_t loads,
                                          uint32_t stores);
/* Checks the invariants: pairwise lists of equal length; an event is KVT_NO_EVENT exactly when
 * its lists are empty; no null block (0) in any list; load events ascending, each with at least
 * one request; this step's load event listed among them; load_invalid_blocks only with a load
 * event and no longer than its list; limits respected. */
KVT_API int kvt_offload_meta_validate(const kvt_offload_meta *m);
KVT_API bool kvt_offload_meta_equal(const kvt_offload_meta *a, const kvt_offload_meta *b);
KVT_API size_t kvt_offload_meta_encoded_size(const kvt_offload_meta *m);
/* Validates, then writes the encoding into buf (cap bytes) and its length into *len. */
KVT_API int kvt_offload_meta_encode(const kvt_offload_meta *m, void *buf, size_t cap, size_t *len);
KVT_API int kvt_offload_meta_decode(kvt_offload_meta *m, const void *buf, size_t len);

/* ---- KV offload: worker -> scheduler ---------------------------------------------------- */

/* Completed events of one kind: {event: count}, events ascending and unique. A worker reports
 * {event: 1} once per finished event; aggregation sums counts per event. failed: finished
 * events of which some block could not be moved (a disk I/O error): each is also completed
 * (the transfer is over and its references can go), but its blocks must never become
 * findable. Ascending, unique; aggregation unites them. */
typedef struct kvt_event_report {
    uint32_t n_completed;
    int64_t *events;
    uint32_t *counts;
    uint32_t n_failed;
    int64_t *failed;
    /* private */
    uint32_t cap, cap_failed;
} kvt_event_report;

/* Adds count to event's entry (creating it). event >= 0, count >= 1. */
KVT_API int kvt_event_report_add(kvt_event_report *r, int64_t event, uint32_t count);
/* Marks event (already added as completed) as failed. */
KVT_API int kvt_event_report_add_failed(kvt_event_report *r, int64_t event);
/* True if event is in the failed set. */
KVT_API bool kvt_event_report_failed(const kvt_event_report *r, int64_t event);

/* stores: completed_store_events (GPU -> host) and failed_store_events.
 * tier_stores[t - 1] / tier_loads[t - 1]: tier t's stores (write-backs from tier t - 1) and
 * loads (promotions into tier t - 1), reported the same way (empty without tier t). */
typedef struct kvt_offload_worker_meta {
    kvt_event_report stores;
    kvt_event_report tier_stores[KVT_MAX_TIERS - 1];
    kvt_event_report tier_loads[KVT_MAX_TIERS - 1];
} kvt_offload_worker_meta;

KVT_API void kvt_offload_worker_meta_init(kvt_offload_worker_meta *m);
KVT_API void kvt_offload_worker_meta_clear(kvt_offload_worker_meta *m);
KVT_API void kvt_offload_worker_meta_release(kvt_offload_worker_meta *m);
/* kvt_event_report_add / _add_failed / _failed on m->stores. */
KVT_API int kvt_offload_worker_meta_add(kvt_offload_worker_meta *m, int64_t event, uint32_t count);
KVT_API int kvt_offload_worker_meta_add_failed(kvt_offload_worker_meta *m, int64_t event);
KVT_API bool kvt_offload_worker_meta_failed(const kvt_offload_worker_meta *m, int64_t event);
/* dst += src, report by report: counts summed per event (vLLM aggregate), failed sets united.
 * On failure dst is unchanged. */
KVT_API int kvt_offload_worker_meta_aggregate(kvt_offload_worker_meta *dst,
                                              const kvt_offload_worker_meta *src);
KVT_API int kvt_offload_worker_meta_validate(const kvt_offload_worker_meta *m);
KVT_API bool kvt_offload_worker_meta_equal(const kvt_offload_worker_meta *a,
                                           const kvt_offload_worker_meta *b);
KVT_API size_t kvt_offload_worker_meta_encoded_size(const kvt_offload_worker_meta *m);
KVT_API int kvt_offload_worker_meta_encode(const kvt_offload_worker_meta *m, void *buf, size_t cap,
                                           size_t *len);
KVT_API int kvt_offload_worker_meta_decode(kvt_offload_worker_meta *m, const void *buf, size_t len);

/* ---- encoder cache: specs ---------------------------------------------------------------- */

/* A remote reservation or a resident allocation to load (ECMooncakeLoadSpec). */
typedef struct kvt_ec_load_spec {
    kvt_str mm_hash;
    uint64_t nbytes; /* = product(shape) x dtype size */
    uint32_t ndim;
    uint64_t shape[KVT_EC_MAX_DIMS];
    kvt_str dtype; /* unqualified torch dtype name, e.g. "bfloat16" */
    kvt_str transfer_id;
    bool local; /* the consumer pool still holds the item: hand it off, no transfer */
} kvt_ec_load_spec;

/* A destination reservation to push into (ECMooncakePushSpec). */
typedef struct kvt_ec_push_spec {
    kvt_str mm_hash;
    uint64_t nbytes;
    uint32_t ndim;
    uint64_t shape[KVT_EC_MAX_DIMS];
    kvt_str dtype;
    kvt_str consumer_zmq; /* base control address of the consumer, "tcp://host:port" */
    kvt_str transfer_id;
    kvt_str request_id; /* may be empty */
} kvt_ec_push_spec;

/* Size in bytes of one element of a torch dtype name ("bfloat16" -> 2), 0 if unknown. */
KVT_API uint32_t kvt_dtype_size(const char *name, uint32_t len);

/* A spec encoded on its own (for control messages). The kvt_str fields of a decoded spec point
 * into `strings`, which the caller releases with kvt_bump_release. */
KVT_API int kvt_ec_load_spec_validate(const kvt_ec_load_spec *s);
KVT_API int kvt_ec_push_spec_validate(const kvt_ec_push_spec *s);
KVT_API bool kvt_ec_load_spec_equal(const kvt_ec_load_spec *a, const kvt_ec_load_spec *b);
KVT_API bool kvt_ec_push_spec_equal(const kvt_ec_push_spec *a, const kvt_ec_push_spec *b);
KVT_API size_t kvt_ec_load_spec_encoded_size(const kvt_ec_load_spec *s);
KVT_API size_t kvt_ec_push_spec_encoded_size(const kvt_ec_push_spec *s);
KVT_API int kvt_ec_load_spec_encode(const kvt_ec_load_spec *s, void *buf, size_t cap, size_t *len);
KVT_API int kvt_ec_push_spec_encode(const kvt_ec_push_spec *s, void *buf, size_t cap, size_t *len);
KVT_API int kvt_ec_load_spec_decode(kvt_ec_load_spec *s, kvt_bump *strings, const void *buf,
                                    size_t len);
KVT_API int kvt_ec_push_spec_decode(kvt_ec_push_spec *s, kvt_bump *strings, const void *buf,
                                    size_t len);

/* ---- encoder cache: scheduler -> worker --------------------------------------------------- */

typedef struct kvt_ec_meta {
    uint32_t n_loads;
    kvt_ec_load_spec *loads;
    uint32_t n_pushes;
    kvt_ec_push_spec *pushes;
    bool has_freed; /* false: freed is None (retire every resident no longer in use) */
    uint32_t n_freed;
    kvt_str *freed; /* the step's freed mm_hashes */
    /* private */
    uint32_t cap_loads, cap_pushes, cap_freed;
    kvt_bump strings;
} kvt_ec_meta;

KVT_API void kvt_ec_meta_init(kvt_ec_meta *m);
KVT_API void kvt_ec_meta_clear(kvt_ec_meta *m);
KVT_API void kvt_ec_meta_release(kvt_ec_meta *m);
/* Appends a copy of the spec (its strings are copied into m). */
KVT_API int kvt_ec_meta_add_load(kvt_ec_meta *m, const kvt_ec_load_spec *s);
KVT_API int kvt_ec_meta_add_push(kvt_ec_meta *m, const kvt_ec_push_spec *s);
/* Appends an mm_hash to freed (and sets has_freed). */
KVT_API int kvt_ec_meta_add_freed(kvt_ec_meta *m, const char *mm_hash, uint32_t len);
KVT_API int kvt_ec_meta_validate(const kvt_ec_meta *m);
KVT_API bool kvt_ec_meta_equal(const kvt_ec_meta *a, const kvt_ec_meta *b);
KVT_API size_t kvt_ec_meta_encoded_size(const kvt_ec_meta *m);
KVT_API int kvt_ec_meta_encode(const kvt_ec_meta *m, void *buf, size_t cap, size_t *len);
KVT_API int kvt_ec_meta_decode(kvt_ec_meta *m, const void *buf, size_t len);

/* ---- encoder cache: worker -> scheduler --------------------------------------------------- */

/* A set of strings, kept sorted (bytewise) and unique. */
typedef struct kvt_strset {
    uint32_t n;
    kvt_str *items;
    uint32_t cap; /* private */
} kvt_strset;

typedef struct kvt_ec_worker_meta {
    kvt_strset loaded;       /* placed in this rank's encoder cache this step */
    kvt_strset failed_loads; /* load attempted and failed */
    kvt_strset reclaimed;    /* residents dropped under pressure since the last report */
    bool pending_saves;      /* the producer still owns push work */
    kvt_strset failed_saves; /* request ids whose push was rejected */
    /* private */
    kvt_bump strings;
} kvt_ec_worker_meta;

/* Which set of a kvt_ec_worker_meta an add refers to. */
enum kvt_ec_set {
    KVT_EC_LOADED = 0,
    KVT_EC_FAILED_LOADS = 1,
    KVT_EC_RECLAIMED = 2,
    KVT_EC_FAILED_SAVES = 3
};

KVT_API void kvt_ec_worker_meta_init(kvt_ec_worker_meta *m);
KVT_API void kvt_ec_worker_meta_clear(kvt_ec_worker_meta *m);
KVT_API void kvt_ec_worker_meta_release(kvt_ec_worker_meta *m);
/* Adds a string to one of the sets (a no-op if present). */
KVT_API int kvt_ec_worker_meta_add(kvt_ec_worker_meta *m, int set, const char *s, uint32_t len);
KVT_API bool kvt_strset_contains(const kvt_strset *set, const char *s, uint32_t len);
/* dst = aggregate(dst, src): loaded intersected, failed_loads / reclaimed / failed_saves
 * united, pending_saves or-ed (vLLM aggregate). On failure dst is unchanged. */
KVT_API int kvt_ec_worker_meta_aggregate(kvt_ec_worker_meta *dst, const kvt_ec_worker_meta *src);
/* dst = aggregate of the reports of n ranks. A NULL entry is a rank that does not receive
 * (a later pipeline stage): it contributes nothing, rather than an empty `loaded` set that
 * would empty the intersection. *n_contrib (may be NULL) receives the number of non-NULL
 * reports; with none, dst is empty. */
KVT_API int kvt_ec_worker_meta_aggregate_ranks(kvt_ec_worker_meta *dst,
                                               const kvt_ec_worker_meta *const *ranks, uint32_t n,
                                               uint32_t *n_contrib);
KVT_API int kvt_ec_worker_meta_validate(const kvt_ec_worker_meta *m);
KVT_API bool kvt_ec_worker_meta_equal(const kvt_ec_worker_meta *a, const kvt_ec_worker_meta *b);
KVT_API size_t kvt_ec_worker_meta_encoded_size(const kvt_ec_worker_meta *m);
KVT_API int kvt_ec_worker_meta_encode(const kvt_ec_worker_meta *m, void *buf, size_t cap,
                                      size_t *len);
KVT_API int kvt_ec_worker_meta_decode(kvt_ec_worker_meta *m, const void *buf, size_t len);

#ifdef __cplusplus
}
#endif

#endif /* KVTIER_META_H */
