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
#define KVT_META_VERSION    7u   /* wire version written and read (7: remote parts per rank) */
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

/* The most offload tiers behind the engine's GPU memory, in order: tier 0 the first (the host;
 * its transfers with the GPU are the seed's fields of kvt_offload_meta), tier t >= 1 behind it
 * in the order a lookup consults them (the local disk is tier 1). Messages name the tiers they
 * carry. */
#define KVT_MAX_TIERS 4

/* One step's transfers between tier t >= 1 and tier 0 (the host: every tier behind exchanges
 * blocks with it only): loads (promotions, t -> 0) and stores (write-backs, 0 -> t), one event
 * each, numbered per tier and direction like the others; KVT_NO_EVENT exactly when the lists
 * are empty. */
typedef struct kvt_tier_xfers {
    int64_t load_event;
    uint32_t n_loads;
    uint32_t *load_src; /* tier t blocks */
    uint32_t *load_dst; /* tier 0 blocks, pairwise */
    int64_t store_event;
    uint32_t n_stores;
    uint32_t *store_src; /* tier 0 blocks */
    uint32_t *store_dst; /* tier t blocks, pairwise */
    /* private */
    uint32_t cap_loads, cap_stores;
} kvt_tier_xfers;

/* The remote tier's part of a step (a remote tier behind the host, kvtier/remote.h, whose
 * blocks other engine instances hold). tier 0: none (every list empty).
 *
 * Reads: tiers[tier - 1].load_src are source ids in 1 .. n_srcs (0 is null, as a block id
 * is). An engine of `parts` ranks (1 .. KVT_META_MAX_PARTS) splits a block into parts, one per
 * rank: srcs[(id - 1) * parts + k] says where rank k's part of block id is — an owner (an index
 * into owners: that owner's rank k), the slot and generation it was published with — and the
 * block's hash (the same in every part). Worker k reads part k into the paired host block.
 *
 * Publications (the workers serve the bytes, so they publish them): pub_blocks[i], a host block
 * whose store completed on every rank, now holds the block with hash
 * pub_hashes[i * hash_len ..]: each rank publishes its part. withdraw_blocks: host
 * blocks about to be written again, withdrawn by every rank before any transfer of this step
 * (after the publications); withdraw_all: every host block (a reset), before those. */
#define KVT_META_MAX_OWNERS 64u /* owners of one step's remote reads */
#define KVT_META_MAX_HASH   32u /* bytes of a remote block's hash */
#define KVT_META_MAX_PARTS  16u /* ranks of an engine whose blocks are read remotely */

typedef struct kvt_remote_owner {
    kvt_str instance; /* 1 .. 64 bytes */
    kvt_str endpoint; /* its read server, "host:port", 1 .. 80 bytes */
    uint64_t epoch;   /* its start that published the blocks */
} kvt_remote_owner;

typedef struct kvt_remote_src {
    uint32_t owner;
    uint32_t slot;
    uint64_t generation;
    uint8_t hash[KVT_META_MAX_HASH]; /* hash_len bytes used */
} kvt_remote_src;

typedef struct kvt_remote_reads {
    uint32_t tier;     /* 1 .. KVT_MAX_TIERS - 1, or 0: none */
    uint32_t hash_len; /* 1 .. KVT_META_MAX_HASH */
    uint32_t n_owners;
    kvt_remote_owner *owners;
    uint32_t n_srcs;      /* blocks read */
    kvt_remote_src *srcs; /* n_srcs * parts entries */
    uint32_t parts;       /* 1 .. KVT_META_MAX_PARTS (0 when tier is 0) */
    uint32_t n_pubs;
    uint32_t *pub_blocks; /* host blocks, not 0 */
    uint8_t *pub_hashes;  /* n_pubs * hash_len bytes */
    uint32_t n_withdraws;
    uint32_t *withdraw_blocks; /* host blocks, not 0 */
    bool withdraw_all;
    /* private */
    uint32_t cap_owners, cap_srcs, cap_pubs, cap_withdraws;
} kvt_remote_reads;

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
    uint32_t *store_cpu_blocks; /* destination blocks of tier 0, the first below the GPU (the
                                   host; a disk when it is the only tier), pairwise */
    bool need_flush;            /* a request was preempted: finish in-flight copies first */
    /* load_invalid_blocks: destination GPU blocks of this step's load event whose tier-0
     * source could not be promoted from the tier below; the worker reports them invalid when the
     * event finishes (the engine recomputes them). A subset of load_gpu_blocks. */
    uint32_t n_load_invalid;
    uint32_t *load_invalid_blocks;
    /* tiers[t - 1]: the transfers of tier t with the host (a disk behind the
     * host: tiers[0] holds its promotions and write-backs; empty for a tier that is absent) */
    kvt_tier_xfers tiers[KVT_MAX_TIERS - 1];
    /* private */
    uint32_t cap_loads, cap_events, cap_first, cap_reqs, cap_stores, cap_invalid;
    kvt_bump strings;
    /* where the loads of a remote tier come from (its strings in `strings`) */
    kvt_remote_reads remote;
} kvt_offload_meta;

KVT_API void kvt_offload_meta_init(kvt_offload_meta *m);
/* Whether m gives the workers nothing to do (no transfer, event list or invalid block, no
 * remote publication or withdrawal; need_flush aside): a connector may skip sending it. */
KVT_API bool kvt_offload_meta_empty(const kvt_offload_meta *m);
KVT_API void kvt_offload_meta_clear(kvt_offload_meta *m);
KVT_API void kvt_offload_meta_release(kvt_offload_meta *m);
/* Appends one (gpu, cpu) pair to the load lists / store lists. */
KVT_API int kvt_offload_meta_add_load(kvt_offload_meta *m, uint32_t gpu_block, uint32_t cpu_block);
KVT_API int kvt_offload_meta_add_store(kvt_offload_meta *m, uint32_t gpu_block, uint32_t cpu_block);
/* Appends a GPU block to load_invalid_blocks. */
KVT_API int kvt_offload_meta_add_load_invalid(kvt_offload_meta *m, uint32_t gpu_block);
/* Appends a pair to tier t's (1 <= t < KVT_MAX_TIERS) loads (src a block of tier t, dst of
 * tier 0) or stores (src a block of tier 0, dst of tier t); KVT_ERANGE for another t. */
KVT_API int kvt_offload_meta_add_tier_load(kvt_offload_meta *m, uint32_t tier, uint32_t src,
                                           uint32_t dst);
KVT_API int kvt_offload_meta_add_tier_store(kvt_offload_meta *m, uint32_t tier, uint32_t src,
                                            uint32_t dst);
/* Appends an owner of remote blocks to m->remote (strings copied), its index in *index. */
KVT_API int kvt_offload_meta_add_remote_owner(kvt_offload_meta *m, const char *instance,
                                              const char *endpoint, uint64_t epoch,
                                              uint32_t *index);
/* Appends the source of a load of remote tier `tier` (the same tier, hash_len and parts for
 * every source of a message): owner index, slot, generation and hash (hash_len bytes); its
 * source id (1-based, for kvt_offload_meta_add_tier_load) in *id. A block of one part. */
KVT_API int kvt_offload_meta_add_remote_src(kvt_offload_meta *m, uint32_t tier, uint32_t owner,
                                            uint32_t slot, uint64_t generation, const uint8_t *hash,
                                            uint32_t hash_len, uint32_t *id);
/* The same for a block of `parts` parts: part k's owner, slot and generation in parts_of[k]
 * (their hash fields are not read). */
KVT_API int kvt_offload_meta_add_remote_parts(kvt_offload_meta *m, uint32_t tier, uint32_t parts,
                                              const kvt_remote_src *parts_of, const uint8_t *hash,
                                              uint32_t hash_len, uint32_t *id);
/* Opens remote tier `tier`'s section of the step (publications and withdrawals go with or
 * without reads) and appends to it: a publication of host
 * block `block` holding hash (hash_len bytes); a withdrawal of host block `block`; or every
 * host block's withdrawal. */
KVT_API int kvt_offload_meta_add_remote_pub(kvt_offload_meta *m, uint32_t tier, uint32_t block,
                                            const uint8_t *hash, uint32_t hash_len);
KVT_API int kvt_offload_meta_add_remote_withdraw(kvt_offload_meta *m, uint32_t tier, uint32_t block,
                                                 uint32_t hash_len);
KVT_API int kvt_offload_meta_remote_withdraw_all(kvt_offload_meta *m, uint32_t tier,
                                                 uint32_t hash_len);
/* Appends a request to load event `event`. Events must be added in ascending order, all
 * requests of one event together (call repeatedly with the same event). */
KVT_API int kvt_offload_meta_add_load_req(kvt_offload_meta *m, int64_t event, const char *req_id,
                                          uint32_t len);
/* Makes room for that many more loads, stores, load events, load request ids and request-id
 * bytes, so the adds that follow cannot fail. */
KVT_API int kvt_offload_meta_reserve(kvt_offload_meta *m, uint32_t loads, uint32_t stores,
                                     uint32_t events, uint32_t reqs, size_t req_bytes);
/* The same for load_invalid_blocks, for tier t's loads and stores, and for remote owners
 * (their names at their longest) and source entries (blocks times their parts). */
KVT_API int kvt_offload_meta_reserve_remote(kvt_offload_meta *m, uint32_t owners, uint32_t srcs);
KVT_API int kvt_offload_meta_reserve_invalid(kvt_offload_meta *m, uint32_t invalid);
KVT_API int kvt_offload_meta_reserve_tier(kvt_offload_meta *m, uint32_t tier, uint32_t loads,
                                          uint32_t stores);
/* Checks the invariants: pairwise lists of equal length; an event is KVT_NO_EVENT exactly when
 * its lists are empty; no null block (0) in any list; load events ascending, each with at least
 * one request; this step's load event listed among them; load_invalid_blocks only with a load
 * event and no longer than its list; remote reads only with a remote tier that writes nothing
 * back, every source id of its loads in range, every source's owner listed, owners' names and
 * endpoints non-empty and within their lengths; limits respected. */
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
 * tier_stores[t - 1] / tier_loads[t - 1]: tier t's stores (write-backs from the host) and
 * loads (promotions into the host), reported the same way (empty without tier t). */
typedef struct kvt_offload_worker_meta {
    kvt_event_report stores;
    kvt_event_report tier_stores[KVT_MAX_TIERS - 1];
    kvt_event_report tier_loads[KVT_MAX_TIERS - 1];
    /* tier-0 blocks whose load to the GPU failed on this worker (strictly ascending, no null
     * block): the manager drops their keys, so the next request misses instead of reading
     * them again (vLLM resets a failed load's slots). Aggregation unites them. */
    uint32_t n_failed_load_src;
    uint32_t *failed_load_src;
    /* private */
    uint32_t cap_failed_load_src;
    /* tier-0 blocks whose promotion from a tier behind failed on this worker while the rest of
     * its event landed (a remote block gone stale, say; strictly ascending, no null block):
     * the manager makes each one invalid, as if its event had failed for it alone.
     * Aggregation unites them. */
    uint32_t n_failed_promo;
    uint32_t *failed_promo;
    uint32_t cap_failed_promo; /* private */
} kvt_offload_worker_meta;

KVT_API void kvt_offload_worker_meta_init(kvt_offload_worker_meta *m);
KVT_API void kvt_offload_worker_meta_clear(kvt_offload_worker_meta *m);
KVT_API void kvt_offload_worker_meta_release(kvt_offload_worker_meta *m);
/* kvt_event_report_add / _add_failed / _failed on m->stores. */
KVT_API int kvt_offload_worker_meta_add(kvt_offload_worker_meta *m, int64_t event, uint32_t count);
KVT_API int kvt_offload_worker_meta_add_failed(kvt_offload_worker_meta *m, int64_t event);
KVT_API bool kvt_offload_worker_meta_failed(const kvt_offload_worker_meta *m, int64_t event);
/* Adds a tier-0 block to failed_load_src (kept ascending; a block already there is fine). */
KVT_API int kvt_offload_worker_meta_add_failed_load(kvt_offload_worker_meta *m, uint32_t block);
/* Adds a tier-0 block to failed_promo (kept ascending; a block already there is fine). */
KVT_API int kvt_offload_worker_meta_add_failed_promo(kvt_offload_worker_meta *m, uint32_t block);
/* dst += src, report by report: counts summed per event (vLLM aggregate), failed sets united,
 * failed_load_src and failed_promo united. On failure dst is unchanged. */
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
