/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Internal state of the offload manager, shared by manager.c (life cycle), requests.c (the
 * request table), step.c (step assembly, reset), metrics.c (stats, Prometheus), load.c
 * (match, after_alloc, loads), store.c (eager, lazy, re-store, store completion), tier.c (a
 * tier's state, the tiers behind the host), events.c (cache events), remote.c (the remote
 * tier), gpu.c (the engine's GPU pool). manager.c calls the others; none calls it.
 *
 * Everything is preallocated at create, sized from the pools and the config. Variable-length
 * per-transfer lists are threaded through per-block arrays instead of being allocated:
 *   - a request's load pairs: a list of destination GPU blocks (gload_next), each knowing
 *     its host source (gload_src) — a GPU block is the destination of at most one load;
 *   - a store event's pairs: a list of destination host blocks (hstore_next), each knowing its
 *     GPU source (hstore_src) — a freshly allocated host block belongs to one store;
 *   - requests of a load event, requests waiting for their transfers after finishing, and
 *     requests with stores queued this step: lists through the request slots.
 * A finished request keeps its slot only while its load is in flight: a store in flight holds
 * its own references and completes through its event, whatever became of the request.
 * Only phase-A hits (host blocks pinned between match and after_alloc, possibly shared by
 * several requests) live in chunked id lists from a preallocated pool (base/idlist.h).
 *
 * The tiers behind the host (tier.c) add, threaded the same way:
 *   - a request's promotions: a list of freshly allocated host blocks (promo.next), each
 *     knowing its source tier and block there (promo.tier, promo.src), its group and position
 *     in the request's hit (promo.grp, promo.idx) and, once the engine accepted it, its GPU
 *     destination (promo.gpu) and request (promo.req) — a new host block belongs to one
 *     request; a promotion event of tier t lists its pairs (promo.evnext);
 *   - a write-back event's pairs: a list of destination blocks of its tier (store_next), each
 *     knowing its host source (store_src);
 *   - requests of the promotion queue (promo_next).
 */
#ifndef KVT_OFFLOAD_INTERNAL_H
#define KVT_OFFLOAD_INTERNAL_H

#include <stddef.h>

#include "base/error.h"
#include "base/evtable.h"
#include "base/idlist.h"
#include "base/ilist.h"
#include "base/map.h"
#include "base/ring.h"
#include "base/util.h"
#include "kvtier/offload.h"
#include "kvtier/remote.h"
#include "node/node_internal.h"

#define OFL_NONE UINT32_MAX

/* request flags */
enum {
    RQ_EAGER = 1u << 0,        /* registered for eager stores */
    RQ_FINISHED = 1u << 1,     /* the engine finished it; cleanup waits for transfers */
    RQ_HIT = 1u << 2,          /* phase-A hit pinned */
    RQ_LOAD_QUEUED = 1u << 3,  /* load recorded by after_alloc, no event yet */
    RQ_LOAD_SENT = 1u << 4,    /* load event issued, completion pending */
    RQ_PROMO_QUEUED = 1u << 5, /* promotions into the host recorded, no event yet */
    RQ_PROMO_SENT = 1u << 6,   /* promotion events issued; the GPU load waits for them */
    RQ_WAITING = 1u << 7,      /* on the finished-waiting list */
    RQ_LISTED = 1u << 8        /* scratch mark while apply_output validates its input */
};

struct kvi_ofl_req {
    uint64_t id_hash;
    uint32_t id_len;
    uint32_t flags;
    char id[KVT_REQ_ID_MAX + 1];
    /* phase A: pinned host hit, group 0's blocks then group 1's ... (null blocks included) */
    kvi_idlist hit;
    uint32_t hit_n[KVT_MAX_GROUPS];
    uint32_t hit_len, hit_computed;
    /* load */
    int64_t load_event;
    uint32_t load_head; /* first destination GPU block (gload_next chain) */
    uint32_t n_load;
    uint32_t load_next; /* in the queued-load list or in its load event's list */
    /* the part of the hit behind the host (phase A: dhit_n pairs over dhit_pos[g] positions
     * per group, null ones included) or the accepted promotions (n_promo pairs not yet
     * completed), a list of host blocks through promo.next */
    uint32_t promo_head, dhit_n, n_promo;
    uint32_t dhit_len; /* tokens of the hit that the tiers behind the host add */
    uint32_t dhit_pos[KVT_MAX_GROUPS];
    uint32_t promo_next; /* in the promotion queue */
    /* eager stores: a cursor per group in m->cursors (kvi_ofl_cursor); stores in flight are
     * tracked by their events, not by requests */
    /* events: the engine's context (0: none) and the host blocks in store pairs that name it;
     * the slot stays while any does (their stored events must still name it) */
    uint64_t ctx;
    uint32_t ctx_refs;
    uint32_t wait_next; /* in the finished-waiting list */
    uint32_t free_next; /* in the free-slot list */
    bool used;
};

/* An in-flight event (the record of its entry in a base/evtable.h table): loads keep a list of
 * request slots, stores a list of blocks of the tier they fill. */
struct kvi_ofl_event {
    int64_t id;
    uint32_t head, tail, n;
    uint32_t reported; /* stores: worker reports so far */
    bool abandoned;
    bool failed; /* stores: a worker could not write some block (never made findable) */
};

/* An offload tier: tier[0] the first below the GPU (the host), tier[t >= 1] behind it, in the
 * order a lookup consults them (the disk from kvt_offload_config.disk_blocks first, then those
 * of kvt_offload_add_tier; tiers are consecutive). Tier 0's blocks are filled by store events
 * from the GPU; a tier behind exchanges blocks with the host only: write-backs of the host's
 * completed stores into it, promotions out of it into new host blocks. Everything a tier needs
 * for that is here, so the code that searches, stores, writes back, promotes, completes,
 * abandons and reports walks tiers by index. */
#define KVI_OFL_TIERS     KVT_MAX_TIERS
#define KVI_OFL_TIER_NAME 16

/* What the promotion code asks of the tier a promotion into host block h comes from (its
 * source: m->promo.src[h]). The tiers with a pool of their own answer from it (tier.c); the
 * remote tier, whose blocks other instances hold, from what its lookup said (remote.c). */
struct kvi_ofl_req;

struct kvi_ofl_src_ops {
    /* Looks the request's hashes up from index `from`, at most max_len tokens, as the part of
     * the hit that continues the tiers before it; returns its tokens (what it found kept for
     * pin). A search that waits on something outside this process (the remote tier's
     * directory) lets a node tier's lock go meanwhile and sets *let_go; such a tier is the
     * last of the chain. */
    uint32_t (*search)(kvt_offload *m, uint32_t t, const uint8_t *hashes, uint32_t n_hashes,
                       uint32_t from, uint32_t max_len, bool *let_go);
    /* Pins what the last search found (`tokens` of it, from hash index `from`) as promotions
     * of r into fresh host blocks; returns the tokens that adds to r's hit. */
    uint32_t (*pin)(kvt_offload *m, struct kvi_ofl_req *r, uint32_t t, const uint8_t *hashes,
                    uint32_t from, uint32_t tokens);
    /* the promotion is over (landed, failed or dropped): the source's pin goes */
    void (*release)(kvt_offload *m, uint32_t t, uint32_t h);
    /* the keys the promoted block takes, into m->keys (at most kpb); their count */
    uint32_t (*keys)(kvt_offload *m, uint32_t t, uint32_t h);
    /* the promotion failed: the source may be bad (its keys are dropped, counted) */
    void (*failed)(kvt_offload *m, uint32_t t, uint32_t h);
    /* room in the step's metadata for n more sources (before any event is added) */
    int (*reserve)(kvt_offload *m, uint32_t t, kvt_offload_meta *out, uint32_t n);
    /* the source id the metadata's load pair names (describing it there if need be) */
    uint32_t (*emit)(kvt_offload *m, uint32_t t, uint32_t h, kvt_offload_meta *out);
    /* Optional: what the tier sends every step besides its promotions, after the step's
     * room was reserved and before anything is issued (the remote tier: the workers'
     * publications and withdrawals). A failure fails the build; what it
     * would have sent is sent by the next one. */
    int (*step)(kvt_offload *m, uint32_t t, kvt_offload_meta *out);
    /* Optional: step has something to send (the engine keeps stepping until it went out) */
    bool (*step_pending)(const kvt_offload *m, uint32_t t);
    /* Optional, for a tier that serves the host tier's blocks to others (the remote tier
     * publishes them): host block h's store completed and its keys are registered; host
     * blocks ids[0 .. n) are about to be rewritten or forgotten; every host block was
     * forgotten (a reset, the manager's end). */
    void (*host_stored)(kvt_offload *m, uint32_t t, uint32_t h);
    void (*host_reused)(kvt_offload *m, uint32_t t, const uint32_t *ids, uint32_t n);
    void (*host_forgotten)(kvt_offload *m, uint32_t t);
    /* its blocks are this instance's own (stored here once): promoted into the host, they are
     * published to the remote tier again; a remote tier's are not (their owner is a peer) */
    bool own;
};
extern const struct kvi_ofl_src_ops kvi_ofl_pool_src, kvi_ofl_remote_src;

struct kvi_ofl_tier {
    kvt_pool *pool;                    /* NULL: no pool (no such tier, or the remote tier) */
    const struct kvi_ofl_src_ops *src; /* tiers behind: NULL when there is no such tier */
    char name[KVI_OFL_TIER_NAME];
    uint32_t nb; /* blocks, null block included */
    /* per block: the store pair that fills it (the source in the level in front) and the
     * list of the event being assembled or in flight */
    uint32_t *store_src, *store_next;
    uint8_t *keys;   /* keys to register on completion: kpb x key_stride bytes per block */
    uint8_t *keys_n; /* how many */
    uint32_t acc_head, acc_tail, acc_n; /* blocks selected for the next store event */
    uint32_t promo_queued;              /* tiers behind: pairs waiting for a promotion event */
    kvi_evtable loads, stores;          /* of struct kvi_ofl_event */
    int64_t load_counter, store_counter;
    bool transferred; /* any event issued yet (size fixed from then on) */
    struct {          /* counters, exported per tier by kvt_offload_get_stats */
        uint64_t store_events, store_blocks;                        /* issued */
        uint64_t stores_completed, stores_failed, stores_abandoned; /* blocks */
        uint64_t load_events;                                       /* issued */
        uint64_t evictions;              /* cached blocks reused for new stores */
        uint64_t hit_blocks, hit_tokens; /* tier 0's tokens: kvt_offload_get_tier_stats */
        uint64_t store_skipped_cached, store_dropped; /* blocks not stored into this tier */
        uint64_t loads_failed;    /* blocks whose load out of this tier failed: keys dropped */
        uint64_t lookups_dropped; /* remote: answers dropped, the hit before them had moved */
    } st;
    uint32_t *search_out[KVT_MAX_GROUPS]; /* scratch of the longest-hit search */
    uint32_t search_n[KVT_MAX_GROUPS];    /* ... entries per group of the last one */
};

/* Cache events with request context (events.c; only with event_capacity > 0). The tiers'
 * pools queue their own events; the manager drains them into its ring in order, and the host
 * pool's stored events of a block right at registration, when the store pair still says
 * which request selected it. */
struct kvi_ofl_events {
    kvi_ring ring; /* kvt_offload_event; capacity 0: events off */
    uint64_t dropped;
    /* per host block: the request slot whose store pair fills it (OFL_NONE: none), the
     * block's first token, and its parent (a has-parent byte, then hash_len bytes) */
    uint32_t *hslot, *htok;
    uint8_t *hpar;
    /* per selected block of the selection being made (parallel to scratch), as above */
    uint32_t *seltok;
    uint8_t *selpar;
};

struct kvt_offload {
    kvt_offload_config cfg;
    /* The engine's GPU pool: a kvt_pool (gpu), or an engine's own pool reached through
     * callbacks (ext: gops, gctx; gpu NULL). Pins and unpins go through kvi_ofl_gpu_pin/unpin,
     * batched per direction and flushed at the end of each batch (gpu.c). */
    kvt_pool *gpu;
    bool ext;
    kvt_gpu_pool_ops gops;
    void *gctx;
    uint32_t *gbuf; /* gpu_nb ids waiting for one touch or free callback */
    uint32_t gbuf_n;
    bool gbuf_pin;
    bool in_schedule; /* inside kvt_offload_schedule_hashed with defer_schedule_pins */
    /* ext: the primary key of each selected block (parallel to scratch) and the lazy scan's
     * window (target_free entries) */
    uint8_t *selkeys;
    uint32_t *scan_ids;
    kvt_pool_key *scan_keys;
    kvt_pool_config gcfg; /* the GPU pool's groups, hash and block sizes */
    uint32_t gpu_nb, ng, hash_len, kpb, sched_bs;
    uint32_t hit_align;     /* hits are multiples of this: sched_bs, or the hash block size with
                               partial hash hits (eager mode, groups that allow them) */
    bool partial;           /* partial hash hits: hit_align < sched_bs */
    uint32_t target_free;   /* lazy watermark, GPU blocks */
    bool warned_misaligned; /* the misaligned-hit warning was logged */
    uint32_t max_search_tokens;

    /* requests */
    struct kvi_ofl_req *reqs;
    uint32_t free_req;
    uint32_t n_reqs;
    kvi_map req_map;
    kvi_idpool hitpool;

    /* per GPU block */
    uint32_t *gload_src, *gload_next;
    uint8_t *gflags; /* G_* */
    /* the tiers: tier[0] the host, tier[1 ..] behind it */
    struct kvi_ofl_tier tier[KVI_OFL_TIERS];
    /* per host block: its promotion from a tier behind (see the top of this file) */
    struct kvi_ofl_promos {
        uint32_t *src, *next, *gpu, *idx, *evnext, *req;
        uint8_t *grp, *tier;
        uint8_t *bad; /* a worker reported it failed (failed_promo): fails at completion */
    } promo;
    size_t key_stride; /* hash_len + group + num_tokens */

    /* queues of the step being assembled */
    uint32_t loadq_head, loadq_tail; /* requests with a load but no event yet */
    uint32_t wait_head;              /* finished requests waiting for their load */

    /* eager re-store of GPU blocks whose host copy was evicted: a GPU block per entry, with
     * its packed key over an engine's pool (whose keys cannot be asked later) */
    kvi_ring restore;

    /* scratch */
    uint32_t *scratch; /* host blocks' worth of entries */
    /* eager cursors, ng per request slot: apart from the records, so that the schedule call of
     * a request with nothing new touches one line of its record and a dense array */
    uint32_t *cursors;
    uint64_t *evict_kh; /* host allocation: GPU-index key hashes of the blocks it evicts */
    kvt_pool_key *keys;

    uint32_t promoq_head, promoq_tail; /* requests with promotions but no event yet */

    struct kvi_ofl_events ev;
    kvt_offload_stats st;

    /* a node tier (kvt_offload_attach_node): the host pool is this replica's view of it, and
     * every call that touches the host pool runs under the node's lock */
    kvt_node *node;

    /* a remote tier (kvt_offload_attach_remote; remote.c): its port and index in the chain,
     * the locations a lookup found (KVT_REMOTE_MAX_READ), the owners that promotions in
     * flight read from (KVT_REMOTE_MAX_PEERS, shared by count), per host block promoted out
     * of it where its block is (per part: owner, slot, generation; its hash), and the host
     * blocks of completed stores waiting to be published with their hashes, for the workers
     * (each serves and publishes its part of a block: rparts of them), in the next step's
     * metadata: which host blocks they were told to publish (rpub), the withdrawals
     * (wd_slots), a reset (wd_all). */
    kvt_remote *remote;
    const struct kvi_remote_port *rport;
    uint32_t rtier;
    kvt_remote_loc *rloc;
    struct kvi_ofl_rpeer {
        kvt_remote_peer id;
        uint32_t refs;
        uint32_t wire;    /* its index among the owners of the metadata being built */
        uint64_t down_ns; /* a read from it failed: not read from again before then */
    } * rpeers;
    uint32_t *rs_peer, *rs_slot;
    uint64_t *rs_gen;
    uint8_t *rs_hash;
    uint32_t *pub_slots, pub_n;
    uint8_t *pub_hashes;
    uint32_t rparts;
    uint8_t *rpub;
    uint32_t *wd_slots, wd_n;
    bool wd_all;
    struct kvi_ofl_rmiss { /* recent lookups that found nothing: a span's hash, until when */
        uint64_t key, until_ns;
    } * rmiss; /* KVI_OFL_RMISS entries, direct mapped */
};
#define KVI_OFL_RMISS 1024u

static inline int kvi_ofl_lock(kvt_offload *m)
{
    return m->node ? kvi_node_lock(m->node) : 0;
}

static inline void kvi_ofl_unlock(kvt_offload *m)
{
    if (m->node)
        kvi_node_unlock(m->node);
}

/* The body of a public call that touches the host tier: `call` (its *_unlocked twin) under
 * the node tier's lock, when there is one. */
#define KVI_OFL_LOCKED(m, call)                                                                    \
    do {                                                                                           \
        int rc_ = kvi_ofl_lock(m);                                                                 \
        if (rc_)                                                                                   \
            return rc_;                                                                            \
        rc_ = (call);                                                                              \
        kvi_ofl_unlock(m);                                                                         \
        return rc_;                                                                                \
    } while (0)

enum {
    G_STORING = 1u << 0, /* source of an in-flight (non-abandoned) eager store */
    G_RESTORE = 1u << 1, /* queued for re-store */
    G_MARK = 1u << 2,    /* scratch mark during validation */
    G_INVALID = 1u << 3  /* load destination whose promotion failed: reported invalid */
};

/* the engine's GPU pool (gpu.c) */
int kvi_ofl_gpu_setup(kvt_offload *m);
void kvi_ofl_gpu_teardown(kvt_offload *m);
void kvi_ofl_gpu_pin(kvt_offload *m, uint32_t id);      /* one reference more (batched) */
void kvi_ofl_gpu_unpin(kvt_offload *m, uint32_t id);    /* one reference less (batched) */
void kvi_ofl_gpu_flush(kvt_offload *m);                 /* hands the batch to the pool */
void kvi_ofl_gpu_flush_unless_deferred(kvt_offload *m); /* ... unless schedule defers its pins */
/* Primary key of a GPU block (a kvt_pool only); false if it has none. */
bool kvi_ofl_gpu_primary(const kvt_offload *m, uint32_t gpu, kvt_pool_key *k);
/* The block cached under k and its reference count; KVT_BLOCK_NONE if none or unknowable. */
uint32_t kvi_ofl_gpu_lookup(const kvt_offload *m, const kvt_pool_key *k, uint32_t *ref);
/* kvi_ofl_gpu_lookup over a kvt_pool, with the key's hash in the GPU index given. */
uint32_t kvi_ofl_gpu_lookup_kh(const kvt_offload *m, const kvt_pool_key *k, uint64_t kh,
                               uint32_t *ref);
/* Whether re-stores can be decided (a kvt_pool, or an engine pool with a lookup callback). */
bool kvi_ofl_gpu_can_lookup(const kvt_offload *m);
/* *k = the key (hash of hash_len bytes, group, tokens of its block it covers). */
void kvi_ofl_key_set(const kvt_offload *m, const uint8_t *hash, uint32_t group, uint32_t num_tokens,
                     kvt_pool_key *k);
/* Key of block j of group g of a request from its chained hashes; false past the last hash. */
bool kvi_ofl_key_from_hashes(const kvt_offload *m, const uint8_t *hashes, uint32_t n_hashes,
                             uint32_t g, uint32_t j, kvt_pool_key *k);
/* Packed keys: hash_len bytes, group, num_tokens (key_stride bytes). */
void kvi_ofl_key_pack(const kvt_offload *m, uint8_t *dst, const kvt_pool_key *k);
void kvi_ofl_key_unpack(const kvt_offload *m, const uint8_t *src, kvt_pool_key *k);

/* tiers (tier.c): a tier's pool, per-block store pairs and keys, and store event table
 * (at most max_store_events, fewer for a small tier); close frees them. */
const char *kvi_ofl_tier_name(const kvt_offload *m, uint32_t t);
int kvi_ofl_tier_open(kvt_offload *m, uint32_t t, uint32_t nb, uint32_t event_capacity,
                      uint32_t max_store_events);
void kvi_ofl_tier_close(kvt_offload *m, uint32_t t);

/* event tables of struct kvi_ofl_event (base/evtable.h, typed) */
static inline int kvi_ofl_evtable_init(kvi_evtable *t, uint32_t cap)
{
    int rc = kvi_evtable_init(t, cap, sizeof(struct kvi_ofl_event));
    return rc ? kvi_fail_wrap(rc, "offload") : 0;
}

static inline struct kvi_ofl_event *kvi_ofl_ev_at(const kvi_evtable *t, uint32_t i)
{
    return i == KVI_NIL ? NULL : (struct kvi_ofl_event *)kvi_evtable_rec(t, i);
}

static inline struct kvi_ofl_event *kvi_ofl_evtable_find(const kvi_evtable *t, int64_t id)
{
    return kvi_ofl_ev_at(t, kvi_evtable_find(t, id));
}

/* Appends an event with a larger id than every active one, its lists empty; NULL when full. */
static inline struct kvi_ofl_event *kvi_ofl_evtable_add(kvi_evtable *t, int64_t id)
{
    struct kvi_ofl_event *e = kvi_ofl_ev_at(t, kvi_evtable_add(t, id));
    if (e) {
        e->id = id;
        e->head = e->tail = OFL_NONE;
    }
    return e;
}

static inline void kvi_ofl_evtable_remove(kvi_evtable *t, struct kvi_ofl_event *e)
{
    kvi_evtable_remove(t, kvi_evtable_index(t, e));
}

/* Walks table t's events in ascending id: KVI_OFL_FOR_EVENTS(e, &T->stores) { ... }; the body
 * must not remove e (the walk reads its successor after the body). */
#define KVI_OFL_FOR_EVENTS(e, t)                                                                   \
    for (struct kvi_ofl_event *e = kvi_ofl_ev_at((t), kvi_evtable_first(t)); e;                    \
         e = kvi_ofl_ev_at((t), kvi_evtable_next((t), kvi_evtable_index((t), e))))

/* FIFOs of request slots (the load queue, a load event's requests, the promotion queue),
 * linked through the uint32_t field at offset `link` of struct kvi_ofl_req (requests.c) */
#define OFL_LOAD_LINK  offsetof(struct kvi_ofl_req, load_next)
#define OFL_PROMO_LINK offsetof(struct kvi_ofl_req, promo_next)
void kvi_ofl_rq_push(kvt_offload *m, uint32_t *head, uint32_t *tail, size_t link, uint32_t slot);
void kvi_ofl_rq_unlink(kvt_offload *m, uint32_t *head, uint32_t *tail, size_t link, uint32_t slot);

/* requests (requests.c) */
struct kvi_ofl_req *kvi_ofl_req_find(const kvt_offload *m, const char *id, uint32_t len);
/* Finds or creates; NULL with KVT_ENOSPC / KVT_EINVAL set when impossible. */
struct kvi_ofl_req *kvi_ofl_req_get(kvt_offload *m, const char *id, uint32_t len);
static inline uint32_t kvi_ofl_req_slot(const kvt_offload *m, const struct kvi_ofl_req *r)
{
    return (uint32_t)(r - m->reqs);
}

/* Request r's eager cursors, one per group. */
static inline uint32_t *kvi_ofl_cursor(const kvt_offload *m, const struct kvi_ofl_req *r)
{
    return m->cursors + (size_t)kvi_ofl_req_slot(m, r) * m->ng;
}
/* Frees the slot if the request holds nothing any more (no hit, no load, no eager
 * registration of a running request). */
void kvi_ofl_req_maybe_release(kvt_offload *m, struct kvi_ofl_req *r);
/* Frees the finished requests whose transfers are all done (after every step). */
void kvi_ofl_req_sweep(kvt_offload *m);
int kvi_ofl_fail_id(const char *id, uint32_t len);
static inline int kvi_ofl_check_id(const char *id, uint32_t len)
{
    return (id && len && len <= KVT_REQ_ID_MAX) ? 0 : kvi_ofl_fail_id(id, len);
}
/* Checks the GPU block ids a call will read: entries [from[g], end) of group g's table, with
 * end = min(n_blocks[g], end_tokens / block_size_g); from NULL means 0, end_tokens UINT32_MAX
 * the whole table. *any (may be NULL) says whether any group has entries in that span. */
int kvi_ofl_check_span(const kvt_offload *m, const uint32_t *const *blocks,
                       const uint32_t *n_blocks, const uint32_t *from, uint32_t end_tokens,
                       const char *what, bool *any);

/* loads (load.c) */
void kvi_ofl_release_hit(kvt_offload *m, struct kvi_ofl_req *r);
void kvi_ofl_cancel_queued_load(kvt_offload *m, struct kvi_ofl_req *r);
int kvi_ofl_reserve_step(kvt_offload *m, kvt_offload_meta *out);
void kvi_ofl_emit_loads(kvt_offload *m, kvt_offload_meta *out);
int kvi_ofl_check_load_done(const kvt_offload *m, const kvt_str *ids, uint32_t n);
void kvi_ofl_apply_load_done(kvt_offload *m, struct kvi_ofl_req *r);
/* A worker could not read block b of tier t for a load (to the GPU, or a promotion): its keys
 * are dropped (REMOVED events, withdrawn from the remote tier for the host, counted once in
 * tier t's loads_failed) so the next request misses instead of failing on it again (vLLM
 * resets the failed request's slots). */
void kvi_ofl_load_failed(kvt_offload *m, uint32_t t, uint32_t b);

/* stores (store.c) */
/* Issues tier t's accumulated stores as one event into out. */
void kvi_ofl_emit_stores(kvt_offload *m, uint32_t t, kvt_offload_meta *out);
/* A store event into tier t that every worker reported: its blocks become findable (unless it
 * failed or was abandoned), move on to the tier behind, and release their sources. */
void kvi_ofl_complete_store(kvt_offload *m, uint32_t t, struct kvi_ofl_event *e);
/* Drops tier t's stores selected for the next event. */
void kvi_ofl_release_accumulator(kvt_offload *m, uint32_t t);
void kvi_ofl_select_lazy(kvt_offload *m);
void kvi_ofl_select_restores(kvt_offload *m);
/* Selects the blocks of one request in [cursor, ready) per group (eager rules); hashes (ext)
 * give the keys. */
void kvi_ofl_select_eager(kvt_offload *m, struct kvi_ofl_req *r, const uint32_t *const *blocks,
                          const uint32_t *n_blocks, const uint8_t *hashes, uint32_t n_hashes,
                          uint32_t num_confirmed);
uint32_t kvi_ofl_store_budget(const kvt_offload *m);
/* Allocates n <= free host blocks, evicting the LRU (eager: queues re-stores). */
void kvi_ofl_host_alloc(kvt_offload *m, uint32_t n, uint32_t *ids);
/* Registers the keys copied aside for host block h (hkeys) on pool p's block b. */
void kvi_ofl_register_keys(kvt_offload *m, kvt_pool *p, uint32_t b, const uint8_t *keys,
                           uint32_t n);
void kvi_ofl_release_load_pairs(kvt_offload *m, struct kvi_ofl_req *r);
/* Appends load pair (gpu <- host block) to r's load list (tail: its last GPU block, OFL_NONE
 * when empty) and pins gpu; the host block's pin is the caller's. */
void kvi_ofl_add_load_pair(kvt_offload *m, struct kvi_ofl_req *r, uint32_t gpu, uint32_t host,
                           uint32_t *tail);
void kvi_ofl_queue_load(kvt_offload *m, struct kvi_ofl_req *r);

/* Groups the eager scan stores by position: the cacheable ones but Mamba in align mode, whose
 * states the engine hands over (kvt_offload_boundary_states). */
static inline bool kvi_ofl_positional(uint32_t kind)
{
    return kvt_group_kind_cacheable(kind) && kind != KVT_GROUP_MAMBA_ALIGN;
}

/* events (events.c); every function but setup is a no-op with events off */
int kvi_ofl_events_setup(kvt_offload *m);
void kvi_ofl_events_teardown(kvt_offload *m);
/* Selection entry n of request r's eager store is block j of group g: notes its first token
 * and parent key (from hashes, or from the GPU pool when none are given), if r has a context. */
void kvi_ofl_events_note(kvt_offload *m, const struct kvi_ofl_req *r, uint32_t n, uint32_t g,
                         uint32_t j, const uint32_t *const *blocks, const uint8_t *hashes,
                         uint32_t n_hashes);
/* The same with the first token and the parent's hash (NULL: none) given. */
void kvi_ofl_events_note_at(kvt_offload *m, const struct kvi_ofl_req *r, uint32_t n,
                            uint32_t token_start, const uint8_t *parent);
/* Host block h receives selection entry i of request r (NULL: a store without a request). */
void kvi_ofl_events_bind(kvt_offload *m, struct kvi_ofl_req *r, uint32_t i, uint32_t h);
/* Drains tier t's pool into the ring. */
void kvi_ofl_events_pull(kvt_offload *m, uint32_t t);
/* Host block h's keys were just registered (stored events queued by the pool): drains them
 * with h's request context, then lets go of h's context. Called for every host store pair
 * that ends (registered or not: then only the context goes). */
void kvi_ofl_events_stored(kvt_offload *m, uint32_t h, bool registered);
/* Request r's slot is being freed: its context is done. */
void kvi_ofl_events_req_done(kvt_offload *m, struct kvi_ofl_req *r);

/* the remote tier (remote.c); a no-op without one */
void kvi_ofl_remote_teardown(kvt_offload *m);
/* What happens to host blocks, told to every tier of the chain that wants to know (the
 * src_ops' host_* hooks; tier.c). */
void kvi_ofl_chain_host_stored(kvt_offload *m, uint32_t h);
void kvi_ofl_chain_host_reused(kvt_offload *m, const uint32_t *ids, uint32_t n);
void kvi_ofl_chain_host_forgotten(kvt_offload *m);

/* the tiers behind the host (tier.c); every function is a no-op without one */
int kvi_ofl_tier_validate(const kvt_offload_config *c, const kvt_pool_config *g);
/* Tier t's search output, one array per group for a hit of max_model_len tokens at most;
 * *entries (may be NULL): their entries over all groups. */
int kvi_ofl_search_out_alloc(kvt_offload *m, uint32_t t, uint32_t *entries);
/* Opens tier t behind the host (name, nb blocks, null block included) / closes every one. */
int kvi_ofl_tier_setup(kvt_offload *m, uint32_t t, const char *name, uint32_t nb);
void kvi_ofl_tier_remove(kvt_offload *m, uint32_t t);
void kvi_ofl_tier_teardown(kvt_offload *m);
/* Reopens tier t (before its first transfer) with nb blocks. */
int kvi_ofl_tier_resize(kvt_offload *m, uint32_t t, uint32_t nb);
/* Number of tiers with a pool, the host included (tiers are consecutive: tier t exists only
 * behind tier t - 1; the remote tier, which has none, comes after them: kvt_offload_num_tiers
 * counts it). */
static inline uint32_t kvi_ofl_ntiers(const kvt_offload *m)
{
    uint32_t n = 1;
    while (n < KVI_OFL_TIERS && m->tier[n].pool)
        n++;
    return n;
}
/* Tiers of the chain, the host and the remote tier (which has no pool) included. */
static inline uint32_t kvi_ofl_chain_len(const kvt_offload *m)
{
    uint32_t n = 1;
    while (n < KVI_OFL_TIERS && m->tier[n].src)
        n++;
    return n;
}
/* Searches tier t past the hit so far: hashes from index `from`, at most max_len tokens, every
 * group agreeing on one length (the hit so far ends where each group has what it needs, so
 * the part of tier t is searched as a prefix of its own); partial: it may end inside a
 * scheduler block. Returns its tokens; the blocks found per group are in tier[t].search_out
 * / search_n. */
uint32_t kvi_ofl_tier_search(kvt_offload *m, uint32_t t, const uint8_t *hashes, uint32_t n_hashes,
                             uint32_t from, uint32_t max_len, bool partial);
/* What the tiers behind the host found past its hit: tier t's part is want[t] tokens from hash
 * index from[t]; let_go: the tier whose search let a node tier's lock go (0: none). */
struct kvi_ofl_chain_hit {
    uint32_t want[KVI_OFL_TIERS], from[KVI_OFL_TIERS];
    uint32_t let_go;
};
/* The tiers behind the host, before tier `upto`, past a host hit (from: its end's hash index,
 * max_len: tokens searchable past it): each tier continues where the ones before it stopped;
 * the last pool tier that adds anything is searched again with partial hits when the manager
 * allows them. Stops after a tier that let the lock go. Returns the tokens found behind. */
uint32_t kvi_ofl_tier_search_chain(kvt_offload *m, const uint8_t *hashes, uint32_t n_hashes,
                                   uint32_t from, uint32_t max_len, uint32_t upto,
                                   struct kvi_ofl_chain_hit *c);
/* Pins what the last kvi_ofl_tier_search_chain found, tier by tier, stopping at the first that
 * is shortened; returns the tokens that adds to r's hit. */
uint32_t kvi_ofl_tier_pin_chain(kvt_offload *m, struct kvi_ofl_req *r, const uint8_t *hashes,
                                const struct kvi_ofl_chain_hit *c);
/* Pins the blocks the last search of tier t found (non-null, every group; `tokens` the
 * search's length) and allocates a host block for each; returns the tokens that adds to r's
 * hit (one full-attention group: as many blocks as the host tier has room for; otherwise all
 * or nothing). */
uint32_t kvi_ofl_tier_pin(kvt_offload *m, struct kvi_ofl_req *r, uint32_t t, uint32_t tokens);
/* The last promotion of r's chain (OFL_NONE: none yet), and one more appended after *tail:
 * host block h from source src of tier t, at position idx of group g's hit. */
uint32_t kvi_ofl_promo_tail(const kvt_offload *m, const struct kvi_ofl_req *r);
void kvi_ofl_promo_link(kvt_offload *m, struct kvi_ofl_req *r, uint32_t *tail, uint32_t h,
                        uint32_t t, uint32_t src, uint32_t g, uint32_t idx);
/* Releases the phase-A pairs of r's part behind the host. */
void kvi_ofl_tier_release_hit(kvt_offload *m, struct kvi_ofl_req *r);
/* GPU blocks of group g that num_external accepted tokens reach (the last one partly with
 * partial hash hits). */
static inline uint32_t kvi_ofl_ext_blocks(const kvt_offload *m, uint32_t g, uint32_t num_external)
{
    return kvi_div_ceil_u32(num_external, m->gcfg.groups[g].block_size);
}

/* Position in a group's block table of the first block a load of num_external tokens fills. */
uint32_t kvi_ofl_load_start(const kvt_offload *m, const struct kvi_ofl_req *r, uint32_t g,
                            uint32_t num_external);
/* after_alloc: checks / pairs the part of r's hit behind the host with the GPU blocks at its
 * positions, for the accepted num_external tokens. */
int kvi_ofl_tier_check_pairs(kvt_offload *m, const struct kvi_ofl_req *r,
                             const uint32_t *const *blocks, const uint32_t *n_blocks,
                             uint32_t num_external);
void kvi_ofl_tier_pair(kvt_offload *m, struct kvi_ofl_req *r, const uint32_t *const *blocks,
                       uint32_t num_external, uint32_t *load_tail);
void kvi_ofl_tier_cancel_promo(kvt_offload *m, struct kvi_ofl_req *r);
/* Host block h was stored and registered: queues its write-back into every tier behind that
 * lacks it. */
void kvi_ofl_tier_writeback(kvt_offload *m, uint32_t h);
int kvi_ofl_tier_reserve(kvt_offload *m, kvt_offload_meta *out, uint32_t invalid);
void kvi_ofl_tier_emit(kvt_offload *m, kvt_offload_meta *out);
int kvi_ofl_tier_check_output(const kvt_offload *m, const kvt_offload_worker_meta *wm);
void kvi_ofl_tier_apply_output(kvt_offload *m, const kvt_offload_worker_meta *wm);
void kvi_ofl_tier_abandon(kvt_offload *m);
bool kvi_ofl_tier_pending(const kvt_offload *m);

#endif
