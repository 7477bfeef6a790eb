/* SPDX-License-Identifier: Apache-2.0 */
/*
 * One consumer shard's receive side (spec ec-transfer §3.3, §3.4): reservations over the slab
 * and the resident pool.
 *
 * Records live in one array (live reservations and tombstones), found by transfer id through
 * a hash map; writers are also indexed by mm_hash (a second reserve of an item in flight
 * becomes a follower sharing the writer's destination), resident entries by mm_hash (the
 * current entry; displaced ones live on until their last lease). Followers hang off their
 * writer in a doubly linked list (one leaves in constant time: expiring 60,000 followers of one
 * writer is linear); tombstones form a FIFO (oldest dropped first at the cap,
 * reaped after the TTL); evictable residents (unpinned, unleased) form an LRU list.
 *
 * Memory ownership, the invariant everything else serves:
 *   - a writer owns its allocation until its completion (then it is READY's, or the resident
 *     pool's when followers share it) or its explicit abandon; a consumer cancel or a TTL only
 *     defers (CANCEL_PENDING / EXPIRE_PENDING, no deadline);
 *   - a follower never owns memory; a resident entry is freed only when current-and-evicted
 *     or displaced-and-unleased, and only after its retire fence passed (deferred frees are
 *     polled before every allocation).
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "base/array.h"
#include "base/error.h"
#include "base/map.h"
#include "base/prom.h"
#include "ec/ec_key.h"
#include "ec/shard_internal.h"

#define NONE  UINT32_MAX
#define NEVER UINT64_MAX

typedef struct desc {
    uint64_t nbytes;
    uint32_t ndim;
    uint64_t shape[KVT_EC_MAX_DIMS];
    char dtype[24];
} desc;

typedef struct rec {
    bool used;
    uint8_t state;
    bool cached;
    bool has_alloc; /* a writer's own allocation */
    ec_key tid, h;
    char rid[KVT_EC_RID_LEN + 1];
    char owner[KVT_EC_RID_LEN + 1]; /* the network client that made it ("" in process) */
    desc d;
    kvt_slab_view alloc;
    uint32_t lease;  /* resident entry leased, NONE */
    uint32_t writer; /* a follower's writer, NONE */
    uint32_t ffirst; /* a writer's first follower */
    uint32_t fnext;  /* next follower of the same writer */
    uint32_t fprev;  /* previous one (NONE: the first), so a follower leaves in O(1) */
    bool is_writer;  /* in the writers index */
    uint64_t expires;
    kvi_ilink tomb; /* the tombstone FIFO */
    uint32_t free_next;
} rec;

typedef struct res {
    bool used, current, pinned, in_lru;
    ec_key h;
    desc d;
    kvt_slab_view view;
    uint32_t leases;
    kvt_ec_fence fence;
    kvi_ilink lru;
    uint32_t free_next;
} res;

typedef struct pending_free {
    kvt_slab_view view;
    kvt_ec_fence fence;
} pending_free;

struct kvt_ec_shard {
    kvt_ec_shard_config cfg;
    kvt_slab *slab;
    rec *recs;
    uint32_t n_recs, cap_recs, free_rec, live, tomb;
    kvi_ilist tombs; /* terminal records, oldest first */
    kvi_map rec_map, writer_map, res_map;
    res *res;
    uint32_t n_res, cap_res, free_res, res_count;
    kvi_ilist lru; /* evictable residents, oldest first */
    pending_free *defer;
    uint32_t n_defer, cap_defer;
    kvt_ec_ready_event *ev;
    uint32_t ev_head, ev_n;
    char (*recl)[KVT_EC_KEY_MAX + 1];
    uint32_t recl_head, recl_n;
    uint64_t next_deadline;
    uint64_t rid_state[2];
    bool shutting_down;
    kvt_ec_shard_stats st;
};

/* ---- small helpers --------------------------------------------------------------------- */

static uint64_t now(const kvt_ec_shard *sh)
{
    return kvt_clock_now(&sh->cfg.clock);
}

static uint64_t deadline(const kvt_ec_shard *sh)
{
    uint64_t t = now(sh);
    return t > NEVER - sh->cfg.ttl_ns ? NEVER - 1 : t + sh->cfg.ttl_ns;
}

static int key_set(ec_key *k, const char *s, uint32_t len, const char *what)
{
    return ec_key_set(k, s, len, false, "ec shard", what);
}

static int desc_set(desc *d, const kvt_ec_item *it)
{
    if (it->ndim > KVT_EC_MAX_DIMS)
        return kvt_fail(KVT_EINVAL, "ec shard: %u dimensions (at most %u)", it->ndim,
                        KVT_EC_MAX_DIMS);
    if (!it->dtype || it->dtype_len == 0 || it->dtype_len >= sizeof(d->dtype))
        return kvt_fail(KVT_EINVAL, "ec shard: dtype missing or too long");
    uint32_t esize = kvt_dtype_size(it->dtype, it->dtype_len);
    if (esize == 0)
        return kvt_fail(KVT_EINVAL, "ec shard: unknown dtype %.*s", (int)it->dtype_len, it->dtype);
    uint64_t n = esize;
    for (uint32_t i = 0; i < it->ndim; i++)
        if (__builtin_mul_overflow(n, it->shape[i], &n))
            return kvt_fail(KVT_EINVAL, "ec shard: shape overflows");
    if (n != it->nbytes || n == 0)
        return kvt_fail(KVT_EINVAL,
                        "ec shard: nbytes %llu does not match shape x dtype (%llu bytes)",
                        (unsigned long long)it->nbytes, (unsigned long long)n);
    memset(d, 0, sizeof(*d));
    d->nbytes = n;
    d->ndim = it->ndim;
    memcpy(d->shape, it->shape, it->ndim * sizeof(uint64_t));
    memcpy(d->dtype, it->dtype, it->dtype_len);
    return 0;
}

static bool desc_eq(const desc *a, const desc *b)
{
    return memcmp(a, b, sizeof(*a)) == 0;
}

/* 128 random bits from the kernel as hex, like uuid4().hex: a capability the completion must
 * present, so it must not be predictable from earlier ids. Should getrandom fail, a generator
 * seeded from it at create (xorshift128+) keeps ids unique. */
static void new_rid(kvt_ec_shard *sh, char *out)
{
    static const char hex[] = "0123456789abcdef";
    uint64_t v[2];
    if (getrandom(v, sizeof(v), GRND_NONBLOCK) != (ssize_t)sizeof(v)) {
        for (int w = 0; w < 2; w++) {
            uint64_t s1 = sh->rid_state[0], s0 = sh->rid_state[1];
            sh->rid_state[0] = s0;
            s1 ^= s1 << 23;
            sh->rid_state[1] = s1 ^ s0 ^ (s1 >> 17) ^ (s0 >> 26);
            v[w] = sh->rid_state[1] + s0;
        }
    }
    for (int w = 0; w < 2; w++)
        for (int i = 0; i < 16; i++)
            out[w * 16 + i] = hex[(v[w] >> (4 * i)) & 15];
    out[KVT_EC_RID_LEN] = 0;
}

static void push_event(kvt_ec_shard *sh, const rec *r, bool abandoned)
{
    uint32_t cap = sh->cfg.max_events;
    if (sh->ev_n == cap) { /* the backlog is bounded: the oldest goes */
        sh->ev_head = (sh->ev_head + 1) % cap;
        sh->ev_n--;
        sh->st.events_dropped++;
    }
    kvt_ec_ready_event *e = &sh->ev[(sh->ev_head + sh->ev_n++) % cap];
    memcpy(e->transfer_id, r->tid.s, r->tid.len + 1);
    memcpy(e->mm_hash, r->h.s, r->h.len + 1);
    memcpy(e->reservation_id, r->rid, sizeof(e->reservation_id));
    e->nbytes = r->d.nbytes;
    e->ndim = r->d.ndim;
    memcpy(e->shape, r->d.shape, sizeof(e->shape));
    memcpy(e->dtype, r->d.dtype, sizeof(e->dtype));
    e->abandoned = abandoned;
}

static void push_reclaimed(kvt_ec_shard *sh, const ec_key *h)
{
    uint32_t cap = sh->cfg.max_events;
    if (sh->recl_n == cap) {
        sh->recl_head = (sh->recl_head + 1) % cap;
        sh->recl_n--;
        sh->st.events_dropped++;
    }
    memcpy(sh->recl[(sh->recl_head + sh->recl_n++) % cap], h->s, h->len + 1);
}

/* ---- resident pool --------------------------------------------------------------------- */

static res *res_find(const kvt_ec_shard *sh, const ec_key *h)
{
    uint32_t i = ec_key_find(&sh->res_map, sh->res, sizeof(res), offsetof(res, h), h);
    return i == NONE ? NULL : &sh->res[i];
}

static uint32_t res_idx(const kvt_ec_shard *sh, const res *e)
{
    return (uint32_t)(e - sh->res);
}

static void lru_remove(kvt_ec_shard *sh, res *e)
{
    if (!e->in_lru)
        return;
    KVI_ILIST_REMOVE(&sh->lru, sh->res, lru, res_idx(sh, e));
    e->in_lru = false;
}

static void lru_append(kvt_ec_shard *sh, res *e)
{
    KVI_ILIST_PUSH_BACK(&sh->lru, sh->res, lru, res_idx(sh, e));
    e->in_lru = true;
}

static bool fence_passed(const kvt_ec_fence *f)
{
    return !f->done || f->done(f->ctx);
}

/* Frees an allocation once its fence passed (now, or at a later poll). */
static void free_after(kvt_ec_shard *sh, const kvt_slab_view *v, const kvt_ec_fence *f)
{
    if (!f || fence_passed(f)) {
        (void)kvt_slab_free(sh->slab, v);
        return;
    }
    if (kvi_array_grow((void **)&sh->defer, &sh->cap_defer, sh->n_defer + 1ull,
                       sizeof(pending_free)) != 0) {
        /* cannot remember it: leaking the bytes is safe, reusing them early is not */
        kvt_fail(KVT_ENOMEM, "ec shard: cannot defer a free; %llu bytes leaked",
                 (unsigned long long)v->rounded);
        return;
    }
    sh->defer[sh->n_defer++] = (pending_free){*v, *f};
    sh->st.deferred_frees++;
}

static void poll_deferred(kvt_ec_shard *sh)
{
    uint32_t k = 0;
    for (uint32_t i = 0; i < sh->n_defer; i++) {
        if (fence_passed(&sh->defer[i].fence))
            (void)kvt_slab_free(sh->slab, &sh->defer[i].view);
        else
            sh->defer[k++] = sh->defer[i];
    }
    sh->n_defer = k;
}

static void res_free(kvt_ec_shard *sh, res *e)
{
    lru_remove(sh, e);
    if (e->current)
        kvi_map_remove(&sh->res_map, e->h.hash, res_idx(sh, e));
    free_after(sh, &e->view, &e->fence);
    e->used = false;
    kvi_slot_give(sh->res, &sh->free_res, sizeof(res), offsetof(res, free_next), res_idx(sh, e));
    sh->res_count--;
}

/* An entry's holders changed: evictable when current, unpinned and unleased; freed when
 * displaced and unleased. */
static void res_settle(kvt_ec_shard *sh, res *e)
{
    if (e->leases || e->pinned) {
        lru_remove(sh, e);
        return;
    }
    if (!e->current)
        res_free(sh, e);
    else if (!e->in_lru)
        lru_append(sh, e);
}

static res *res_new(kvt_ec_shard *sh)
{
    if (sh->free_res == NONE && sh->n_res >= sh->cfg.max_residents)
        return NULL;
    uint32_t i = kvi_slot_take((void **)&sh->res, &sh->n_res, &sh->cap_res, &sh->free_res,
                               sizeof(res), offsetof(res, free_next));
    if (i == NONE)
        return NULL;
    res *e = &sh->res[i];
    memset(e, 0, sizeof(*e));
    e->used = true;
    e->lru.prev = e->lru.next = NONE;
    sh->res_count++;
    return e;
}

/* Makes (h, d, view) the current entry of h; the one it displaces lives on while leased and
 * is reused only after its retire fence, or `fence` (recorded now) if it was never retired. */
static res *res_publish(kvt_ec_shard *sh, const ec_key *h, const desc *d, const kvt_slab_view *v,
                        bool pinned, const kvt_ec_fence *fence)
{
    res *e = res_new(sh);
    if (!e) { /* table full: the bytes stay with nobody; give them back */
        (void)kvt_slab_free(sh->slab, v);
        return NULL;
    }
    res *old = res_find(sh, h);
    if (old) {
        kvi_map_remove(&sh->res_map, old->h.hash, res_idx(sh, old));
        old->current = false;
        if (old->pinned) { /* still in the encoder cache: kernels may read it until fence */
            old->pinned = false;
            old->fence = fence ? *fence : (kvt_ec_fence){NULL, NULL};
        }
        lru_remove(sh, old);
        res_settle(sh, old);
    }
    e->h = *h;
    e->d = *d;
    e->view = *v;
    e->pinned = pinned;
    e->current = true;
    (void)kvi_map_insert(&sh->res_map, h->hash, res_idx(sh, e)); /* room: max_residents */
    res_settle(sh, e);
    return e;
}

static void lease_take(kvt_ec_shard *sh, rec *r, res *e)
{
    e->leases++;
    r->lease = res_idx(sh, e);
    lru_remove(sh, e);
}

static void lease_release(kvt_ec_shard *sh, rec *r)
{
    if (r->lease == NONE)
        return;
    res *e = &sh->res[r->lease];
    r->lease = NONE;
    e->leases--;
    res_settle(sh, e);
}

/* ---- records --------------------------------------------------------------------------- */

static rec *rec_find(const kvt_ec_shard *sh, const ec_key *t)
{
    uint32_t i = ec_key_find(&sh->rec_map, sh->recs, sizeof(rec), offsetof(rec, tid), t);
    return i == NONE ? NULL : &sh->recs[i];
}

static uint32_t rec_idx(const kvt_ec_shard *sh, const rec *r)
{
    return (uint32_t)(r - sh->recs);
}

static bool terminal(const rec *r)
{
    return r->state == KVT_EC_CANCELLED || r->state == KVT_EC_EXPIRED;
}

static rec *writer_find(const kvt_ec_shard *sh, const ec_key *h)
{
    uint32_t i = ec_key_find(&sh->writer_map, sh->recs, sizeof(rec), offsetof(rec, h), h);
    return i == NONE ? NULL : &sh->recs[i];
}

static void writer_unregister(kvt_ec_shard *sh, rec *r)
{
    if (r->is_writer)
        kvi_map_remove(&sh->writer_map, r->h.hash, rec_idx(sh, r));
    r->is_writer = false;
}

static rec *rec_new(kvt_ec_shard *sh, const ec_key *t)
{
    uint32_t i = kvi_slot_take((void **)&sh->recs, &sh->n_recs, &sh->cap_recs, &sh->free_rec,
                               sizeof(rec), offsetof(rec, free_next));
    if (i == NONE)
        return NULL;
    rec *r = &sh->recs[i];
    memset(r, 0, sizeof(*r));
    r->used = true;
    r->tid = *t;
    r->lease = r->writer = r->ffirst = r->fnext = r->fprev = r->tomb.prev = r->tomb.next = NONE;
    (void)kvi_map_insert(&sh->rec_map, t->hash, rec_idx(sh, r)); /* room: live + tombstones */
    sh->live++;
    return r;
}

static void rec_free(kvt_ec_shard *sh, rec *r)
{
    if (terminal(r)) {
        KVI_ILIST_REMOVE(&sh->tombs, sh->recs, tomb, rec_idx(sh, r));
        sh->tomb--;
    } else {
        sh->live--;
    }
    writer_unregister(sh, r);
    kvi_map_remove(&sh->rec_map, r->tid.hash, rec_idx(sh, r));
    r->used = false;
    kvi_slot_give(sh->recs, &sh->free_rec, sizeof(rec), offsetof(rec, free_next), rec_idx(sh, r));
}

/* Appends r (already terminal) to the tombstone FIFO, dropping the oldest at the cap. */
static void tomb_append(kvt_ec_shard *sh, rec *r)
{
    r->expires = deadline(sh);
    KVI_ILIST_PUSH_BACK(&sh->tombs, sh->recs, tomb, rec_idx(sh, r));
    sh->tomb++;
    if (r->expires < sh->next_deadline)
        sh->next_deadline = r->expires;
    while (sh->tomb > sh->cfg.max_tombstones) {
        rec_free(sh, &sh->recs[sh->tombs.head]);
        sh->st.tombstones_dropped++;
    }
}

/* A follower leaves its writer's list. */
static void detach_follower(kvt_ec_shard *sh, rec *f)
{
    if (f->writer == NONE)
        return;
    rec *w = &sh->recs[f->writer];
    if (f->fprev == NONE)
        w->ffirst = f->fnext;
    else
        sh->recs[f->fprev].fnext = f->fnext;
    if (f->fnext != NONE)
        sh->recs[f->fnext].fprev = f->fprev;
    f->writer = f->fnext = f->fprev = NONE;
}

static void make_terminal(kvt_ec_shard *sh, rec *r, uint8_t state);

/* Gives back what r holds: its lease, or a writer's allocation (its followers are cancelled,
 * and reported abandoned when report is set). */
static void release(kvt_ec_shard *sh, rec *r, bool report)
{
    lease_release(sh, r);
    detach_follower(sh, r);
    while (r->ffirst != NONE) {
        rec *f = &sh->recs[r->ffirst];
        detach_follower(sh, f);
        if (report)
            push_event(sh, f, true);
        make_terminal(sh, f, KVT_EC_CANCELLED);
    }
    if (r->has_alloc) {
        (void)kvt_slab_free(sh->slab, &r->alloc);
        r->has_alloc = false;
    }
    writer_unregister(sh, r);
}

static void make_terminal(kvt_ec_shard *sh, rec *r, uint8_t state)
{
    if (terminal(r)) { /* refresh the tombstone */
        KVI_ILIST_REMOVE(&sh->tombs, sh->recs, tomb, rec_idx(sh, r));
        sh->tomb--;
    } else {
        sh->live--;
    }
    r->state = state;
    tomb_append(sh, r);
}

/* ---- life cycle ------------------------------------------------------------------------ */

void kvt_ec_shard_config_init(kvt_ec_shard_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->ttl_ns = 300ull * 1000000000ull;
    cfg->max_records = 65536;
    cfg->max_tombstones = 65536;
    cfg->max_residents = 65536;
    cfg->max_events = 4096;
    cfg->clock = kvt_clock_monotonic();
}

int kvt_ec_shard_create(const kvt_ec_shard_config *cfg, kvt_ec_shard **out)
{
    if (!cfg || !out)
        return kvt_fail(KVT_EINVAL, "ec shard: NULL argument");
    *out = NULL;
    if (cfg->ttl_ns == 0 || cfg->max_records == 0 || cfg->max_residents == 0 ||
        cfg->max_events == 0 || !cfg->clock.now_ns || cfg->max_records > (1u << 24) ||
        cfg->max_tombstones > (1u << 24) || cfg->max_residents > (1u << 24))
        return kvt_fail(KVT_EINVAL, "ec shard: ttl, table sizes (1..16 Mi) and clock are required");
    kvt_ec_shard *sh = calloc(1, sizeof(*sh));
    if (!sh)
        return kvt_fail(KVT_ENOMEM, "ec shard: out of memory");
    sh->cfg = *cfg;
    sh->free_rec = sh->free_res = NONE;
    kvi_ilist_init(&sh->tombs);
    kvi_ilist_init(&sh->lru);
    sh->next_deadline = NEVER;
    int rc = kvt_slab_create(cfg->base, cfg->capacity, &sh->slab);
    if (!rc)
        rc = kvi_map_init(&sh->rec_map, cfg->max_records + cfg->max_tombstones + 1);
    if (!rc)
        rc = kvi_map_init(&sh->writer_map, cfg->max_records);
    if (!rc)
        rc = kvi_map_init(&sh->res_map, cfg->max_residents);
    if (!rc) {
        sh->ev = calloc(cfg->max_events, sizeof(*sh->ev));
        sh->recl = calloc(cfg->max_events, sizeof(*sh->recl));
        if (!sh->ev || !sh->recl)
            rc = kvt_fail(KVT_ENOMEM, "ec shard: out of memory");
    }
    if (!rc && getrandom(sh->rid_state, sizeof(sh->rid_state), 0) != sizeof(sh->rid_state))
        rc = kvt_fail(KVT_ESYS, "ec shard: getrandom failed");
    sh->rid_state[0] |= 1; /* never all zero */
    if (rc) {
        sh->cfg.capacity = 0;
        kvt_ec_shard_destroy(sh);
        return kvi_fail_wrap(rc, "ec shard");
    }
    *out = sh;
    return 0;
}

uint32_t kvt_ec_shard_writers(const kvt_ec_shard *sh)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < sh->n_recs; i++)
        n += sh->recs[i].used && sh->recs[i].has_alloc && sh->recs[i].state != KVT_EC_READY;
    return n;
}

int kvt_ec_shard_destroy(kvt_ec_shard *sh)
{
    if (!sh)
        return 0;
    if (sh->recs && kvt_ec_shard_writers(sh))
        return kvt_fail(KVT_EBUSY,
                        "ec shard: %u remote writers may still write into the receive buffer; "
                        "keep it registered",
                        kvt_ec_shard_writers(sh));
    kvt_slab_destroy(sh->slab);
    kvi_map_free(&sh->rec_map);
    kvi_map_free(&sh->writer_map);
    kvi_map_free(&sh->res_map);
    free(sh->recs);
    free(sh->res);
    free(sh->defer);
    free(sh->ev);
    free(sh->recl);
    free(sh);
    return 0;
}

/* ---- expiry ------------------------------------------------------------------------------ */

void kvt_ec_shard_expire(kvt_ec_shard *sh)
{
    uint64_t t = now(sh);
    if (t < sh->next_deadline)
        return;
    uint64_t next = NEVER;
    for (uint32_t i = 0; i < sh->n_recs; i++) {
        rec *r = &sh->recs[i];
        if (!r->used || terminal(r))
            continue;
        if (r->expires > t) {
            if (r->expires < next)
                next = r->expires;
            continue;
        }
        if (r->state == KVT_EC_READY) {
            release(sh, r, false);
            make_terminal(sh, r, KVT_EC_EXPIRED);
            sh->st.expiries++;
        } else if (r->state == KVT_EC_WRITING && r->writer != NONE) {
            detach_follower(sh, r); /* a follower owns nothing */
            make_terminal(sh, r, KVT_EC_CANCELLED);
            sh->st.expiries++;
        } else if (r->state == KVT_EC_WRITING || r->state == KVT_EC_CANCEL_PENDING) {
            /* its writer may still write: keep the memory. A writer cancelled by the consumer
             * whose producer never completes ends here too, a TTL after the cancel, so the
             * network layer's reaper frees it like any writer that went quiet. */
            r->state = KVT_EC_EXPIRE_PENDING;
            r->expires = NEVER;
            sh->st.expiries++;
        }
    }
    while (sh->tombs.head != NONE && sh->recs[sh->tombs.head].expires <= t)
        rec_free(sh, &sh->recs[sh->tombs.head]);
    if (sh->tombs.head != NONE && sh->recs[sh->tombs.head].expires < next)
        next = sh->recs[sh->tombs.head].expires;
    sh->next_deadline = next;
}

static void set_expiry(kvt_ec_shard *sh, rec *r)
{
    r->expires = deadline(sh);
    if (r->expires < sh->next_deadline)
        sh->next_deadline = r->expires;
}

/* ---- reserve ------------------------------------------------------------------------------- */

static int alloc_with_reclaim(kvt_ec_shard *sh, uint64_t nbytes, kvt_slab_view *v)
{
    poll_deferred(sh);
    if (kvt_slab_alloc(sh->slab, nbytes, v) == 0)
        return 0;
    /* whatever is due expires first (next_deadline is never later than the earliest expiry,
     * so a forced full pass would find nothing more: it cost a scan of every record on each
     * reserve once the buffer was full of retired residents) */
    kvt_ec_shard_expire(sh);
    poll_deferred(sh);
    if (kvt_slab_alloc(sh->slab, nbytes, v) == 0)
        return 0;
    while (sh->lru.head != NONE) { /* evict retired residents no reader holds, oldest first */
        res *e = &sh->res[sh->lru.head];
        push_reclaimed(sh, &e->h);
        sh->st.reclaims++;
        res_free(sh, e);
        poll_deferred(sh);
        if (kvt_slab_alloc(sh->slab, nbytes, v) == 0)
            return 0;
    }
    poll_deferred(sh);
    if (kvt_slab_alloc(sh->slab, nbytes, v) == 0)
        return 0;
    return kvt_fail(KVT_ENOSPC,
                    "EC consumer buffer pool is full (%llu bytes asked, %llu free in %u pieces)",
                    (unsigned long long)nbytes, (unsigned long long)kvt_slab_free_bytes(sh->slab),
                    kvt_slab_free_extents(sh->slab));
}

static void fill_reply(const kvt_ec_shard *sh, const rec *r, const kvt_slab_view *v,
                       kvt_ec_reply *out)
{
    (void)sh;
    memset(out, 0, sizeof(*out));
    memcpy(out->reservation_id, r->rid, sizeof(out->reservation_id));
    out->nbytes = r->d.nbytes;
    if (v) {
        out->offset = v->offset;
        out->ptr = v->ptr;
    }
}

/* The destination a record's bytes are (or will be) in. */
static const kvt_slab_view *rec_view(const kvt_ec_shard *sh, const rec *r)
{
    if (r->has_alloc)
        return &r->alloc;
    if (r->writer != NONE)
        return rec_view(sh, &sh->recs[r->writer]);
    if (r->lease != NONE)
        return &sh->res[r->lease].view;
    return NULL;
}

int kvt_ec_shard_reserve(kvt_ec_shard *sh, const char *tid, uint32_t tid_len,
                         const kvt_ec_item *item, kvt_ec_reply *out)
{
    return kvi_ec_shard_reserve_as(sh, tid, tid_len, item, NULL, out);
}

/* A new record's owner. */
static void own(rec *r, const char *owner)
{
    if (owner)
        snprintf(r->owner, sizeof(r->owner), "%s", owner);
}

int kvi_ec_shard_reserve_as(kvt_ec_shard *sh, const char *tid, uint32_t tid_len,
                            const kvt_ec_item *item, const char *owner, kvt_ec_reply *out)
{
    ec_key t, h;
    desc d;
    int rc;
    if (!out || !item)
        return kvt_fail(KVT_EINVAL, "ec shard: reserve: NULL argument");
    if ((rc = key_set(&t, tid, tid_len, "transfer id")) ||
        (rc = key_set(&h, item->mm_hash, item->mm_hash_len, "mm_hash")) ||
        (rc = desc_set(&d, item)))
        return rc;
    kvt_ec_shard_expire(sh);
    if (sh->shutting_down)
        return kvt_fail(KVT_ESTATE, "ec shard: shutting down: no new reservations");
    sh->st.reserves++;
    rec *r = rec_find(sh, &t);
    if (r && r->state == KVT_EC_EXPIRED) {
        rec_free(sh, r); /* a dead transfer may be reserved again */
        r = NULL;
    }
    if (r && owner && r->state != KVT_EC_CANCELLED &&
        strncmp(r->owner, owner, sizeof(r->owner)) != 0) {
        return kvt_fail(KVT_EEXIST, "ec shard: transfer %s is reserved by another client", t.s);
    }
    if (r) {
        if (r->state == KVT_EC_CANCELLED) {
            memset(out, 0, sizeof(*out));
            out->nbytes = d.nbytes;
            out->cancelled = true;
            return 0;
        }
        if (r->state == KVT_EC_EXPIRE_PENDING)
            return kvt_fail(KVT_ESTATE,
                            "ec shard: transfer %s still has an active writer (refresh-abandon "
                            "it first)",
                            t.s);
        if (!ec_key_eq(&r->h, &h) || !desc_eq(&r->d, &d))
            return kvt_fail(KVT_EINVAL, "ec shard: conflicting reservation for transfer_id %s",
                            t.s);
        fill_reply(sh, r, rec_view(sh, r), out);
        if (r->state == KVT_EC_WRITING)
            set_expiry(sh, r);
        out->ready = r->state == KVT_EC_READY;
        out->cached = r->cached;
        out->cancelled = r->state == KVT_EC_CANCEL_PENDING;
        return 0;
    }
    if (sh->live >= sh->cfg.max_records)
        return kvt_fail(KVT_ELIMIT, "ec shard: %u reservations live (max_records)", sh->live);
    res *e = res_find(sh, &h);
    if (e) { /* resident hit */
        if (!desc_eq(&e->d, &d))
            return kvt_fail(KVT_EINVAL, "ec shard: conflicting cached tensor for %s", h.s);
        if (!(r = rec_new(sh, &t)))
            return kvt_fail(KVT_ENOMEM, "ec shard: out of memory");
        r->h = h;
        r->d = d;
        r->state = KVT_EC_READY;
        r->cached = true;
        new_rid(sh, r->rid);
        own(r, owner);
        lease_take(sh, r, e);
        set_expiry(sh, r);
        fill_reply(sh, r, &e->view, out);
        out->ready = out->cached = true;
        push_event(sh, r, false);
        sh->st.cached_hits++;
        return 0;
    }
    rec *w = writer_find(sh, &h);
    if (w && w->state == KVT_EC_WRITING) { /* follower of the writer in flight */
        if (!desc_eq(&w->d, &d))
            return kvt_fail(KVT_EINVAL, "ec shard: conflicting reservation for %s in flight", h.s);
        uint32_t wi = rec_idx(sh, w);
        if (!(r = rec_new(sh, &t))) /* (may move the record array) */
            return kvt_fail(KVT_ENOMEM, "ec shard: out of memory");
        w = &sh->recs[wi];
        r->h = h;
        r->d = d;
        r->state = KVT_EC_WRITING;
        new_rid(sh, r->rid);
        own(r, owner);
        r->writer = rec_idx(sh, w);
        r->fnext = w->ffirst;
        r->fprev = NONE;
        if (w->ffirst != NONE)
            sh->recs[w->ffirst].fprev = rec_idx(sh, r);
        w->ffirst = rec_idx(sh, r);
        set_expiry(sh, r);
        fill_reply(sh, r, &w->alloc, out);
        sh->st.follows++;
        return 0;
    }
    if (w) /* a deferred writer of h: settled by its completion, no longer followed */
        writer_unregister(sh, w);
    kvt_slab_view v;
    if ((rc = alloc_with_reclaim(sh, d.nbytes, &v)))
        return rc;
    if (!(r = rec_new(sh, &t))) {
        (void)kvt_slab_free(sh->slab, &v);
        return kvt_fail(KVT_ENOMEM, "ec shard: out of memory");
    }
    r->h = h;
    r->d = d;
    r->state = KVT_EC_WRITING;
    new_rid(sh, r->rid);
    own(r, owner);
    v.nbytes = d.nbytes;
    r->alloc = v;
    r->has_alloc = true;
    (void)kvi_map_insert(&sh->writer_map, h.hash, rec_idx(sh, r)); /* room: max_records */
    r->is_writer = true;
    set_expiry(sh, r);
    fill_reply(sh, r, &v, out);
    out->write = true;
    sh->st.writes++;
    return 0;
}

/* ---- complete / cancel ----------------------------------------------------------------- */

static bool rid_matches(const rec *r, const char *rid)
{
    return !rid || !rid[0] || strncmp(r->rid, rid, KVT_EC_RID_LEN + 1) == 0;
}

int kvt_ec_shard_complete(kvt_ec_shard *sh, const char *tid, uint32_t tid_len, const char *rid,
                          bool *accepted, bool *became_ready)
{
    ec_key t;
    int rc;
    if (!accepted || !became_ready)
        return kvt_fail(KVT_EINVAL, "ec shard: complete: NULL argument");
    *accepted = *became_ready = false;
    if ((rc = key_set(&t, tid, tid_len, "transfer id")))
        return rc;
    rec *r = rec_find(sh, &t);
    if (!r || !rid || !rid[0] || !rid_matches(r, rid) || terminal(r))
        return 0;
    sh->st.completes++;
    if (r->state == KVT_EC_READY || r->writer != NONE) { /* a repeat; a follower: a no-op */
        *accepted = true;
        return 0;
    }
    /* the writer: its followers become ready on the same bytes, held by the resident pool.
     * If H is resident already (written by another transfer meanwhile), that entry holds the
     * same content and may be in use: it stays, and this writer's copy goes. */
    if (r->ffirst != NONE) {
        res *e = res_find(sh, &r->h);
        if (e && desc_eq(&e->d, &r->d))
            (void)kvt_slab_free(sh->slab, &r->alloc);
        else
            e = res_publish(sh, &r->h, &r->d, &r->alloc, false, NULL);
        r->has_alloc = false;
        while (r->ffirst != NONE) {
            rec *f = &sh->recs[r->ffirst];
            detach_follower(sh, f);
            if (e) {
                lease_take(sh, f, e);
                f->state = KVT_EC_READY;
                set_expiry(sh, f);
                push_event(sh, f, false);
            } else {
                make_terminal(sh, f, KVT_EC_CANCELLED);
            }
        }
        if (e)
            lease_take(sh, r, e);
    }
    writer_unregister(sh, r);
    *accepted = true;
    if (r->state == KVT_EC_CANCEL_PENDING || r->state == KVT_EC_EXPIRE_PENDING) {
        uint8_t to = r->state == KVT_EC_CANCEL_PENDING ? KVT_EC_CANCELLED : KVT_EC_EXPIRED;
        release(sh, r, false);
        make_terminal(sh, r, to);
        return 0;
    }
    if (r->lease == NONE && !r->has_alloc) { /* the resident table was full */
        make_terminal(sh, r, KVT_EC_CANCELLED);
        return 0;
    }
    r->state = KVT_EC_READY;
    set_expiry(sh, r);
    push_event(sh, r, false);
    *became_ready = true;
    return 0;
}

int kvt_ec_shard_cancel(kvt_ec_shard *sh, const char *tid, uint32_t tid_len, const char *rid,
                        bool abandon, bool refresh, bool *done)
{
    ec_key t;
    int rc;
    if (!done)
        return kvt_fail(KVT_EINVAL, "ec shard: cancel: NULL argument");
    *done = false;
    if ((rc = key_set(&t, tid, tid_len, "transfer id")))
        return rc;
    rec *r = rec_find(sh, &t);
    if (r && !rid_matches(r, rid))
        return 0;
    if (!r && rid && rid[0])
        return 0; /* an id of no reservation: nothing to cancel, and no tombstone either */
    sh->st.cancels++;
    if (!r) { /* cancelled before the producer reserved: a tombstone answers it later */
        if (!(r = rec_new(sh, &t)))
            return kvt_fail(KVT_ENOMEM, "ec shard: out of memory");
        make_terminal(sh, r, KVT_EC_CANCELLED);
        *done = true;
        return 0;
    }
    if (r->state == KVT_EC_CANCELLED) {
        make_terminal(sh, r, KVT_EC_CANCELLED);
        *done = true;
        return 0;
    }
    bool writing = r->state == KVT_EC_WRITING || r->state == KVT_EC_EXPIRE_PENDING;
    if (refresh) { /* the producer re-reserves at once with a new id */
        if (!abandon || !writing)
            return 0;
        release(sh, r, true); /* its followers are reported; it is not */
        make_terminal(sh, r, KVT_EC_EXPIRED);
        *done = true;
        return 0;
    }
    if (r->writer != NONE) { /* a follower: detach; the memory stays the writer's */
        if (abandon)
            push_event(sh, r, true);
        detach_follower(sh, r);
        make_terminal(sh, r, KVT_EC_CANCELLED);
        *done = true;
        return 0;
    }
    bool deferred = r->state == KVT_EC_CANCEL_PENDING || r->state == KVT_EC_EXPIRE_PENDING;
    if (deferred && !abandon) {
        *done = true;
        return 0;
    }
    if (r->state == KVT_EC_WRITING && !abandon) { /* the writer may still write: defer */
        r->state = KVT_EC_CANCEL_PENDING;
        set_expiry(sh, r); /* a TTL for the writer to complete or abandon, then reaped */
        *done = true;
        return 0;
    }
    if (terminal(r))
        return 0;
    if (abandon)
        push_event(sh, r, true);
    release(sh, r, abandon);
    make_terminal(sh, r, KVT_EC_CANCELLED);
    *done = true;
    return 0;
}

/* ---- take, residents, shutdown ------------------------------------------------------------ */

int kvt_ec_shard_take(kvt_ec_shard *sh, const char *tid, uint32_t tid_len, const char *mm_hash,
                      uint32_t hash_len, const kvt_ec_fence *fence, kvt_slab_view *out)
{
    ec_key t, h;
    int rc;
    if (!out)
        return kvt_fail(KVT_EINVAL, "ec shard: take: NULL argument");
    memset(out, 0, sizeof(*out));
    if ((rc = key_set(&t, tid, tid_len, "transfer id")) ||
        (rc = key_set(&h, mm_hash, hash_len, "mm_hash")))
        return rc;
    rec *r = rec_find(sh, &t);
    if (!r || r->state != KVT_EC_READY || !ec_key_eq(&r->h, &h) ||
        (r->lease == NONE && !r->has_alloc))
        return kvt_fail(KVT_ESTATE, "ec shard: pushed EC tensor %s of transfer %s is not ready",
                        h.s, t.s);
    res *e;
    if (r->lease != NONE) { /* the canonical entry: possibly a newer replacement */
        e = res_find(sh, &h);
        if (!e) { /* (the leased one was displaced by an entry since evicted) */
            e = &sh->res[r->lease];
            e->current = true;
            (void)kvi_map_insert(&sh->res_map, h.hash, res_idx(sh, e));
        }
        e->pinned = true;
        lru_remove(sh, e);
        lease_release(sh, r);
    } else {
        e = res_publish(sh, &h, &r->d, &r->alloc, true, fence);
        r->has_alloc = false;
        if (!e) {
            rec_free(sh, r);
            return kvt_fail(KVT_ELIMIT, "ec shard: resident table full (max_residents)");
        }
    }
    *out = e->view;
    out->nbytes = e->d.nbytes;
    rec_free(sh, r);
    sh->st.takes++;
    return 0;
}

int kvt_ec_shard_take_resident(kvt_ec_shard *sh, const kvt_ec_item *item, kvt_slab_view *out)
{
    ec_key h;
    desc d;
    int rc;
    if (!out || !item)
        return kvt_fail(KVT_EINVAL, "ec shard: take_resident: NULL argument");
    memset(out, 0, sizeof(*out));
    if ((rc = key_set(&h, item->mm_hash, item->mm_hash_len, "mm_hash")) ||
        (rc = desc_set(&d, item)))
        return rc;
    res *e = res_find(sh, &h);
    if (!e || !desc_eq(&e->d, &d))
        return kvt_fail(KVT_ENOENT, "ec shard: %s is not resident with this shape and dtype", h.s);
    e->pinned = true;
    e->fence = (kvt_ec_fence){NULL, NULL}; /* in use again: its retire fence no longer matters */
    lru_remove(sh, e);
    *out = e->view;
    out->nbytes = e->d.nbytes;
    return 0;
}

int kvt_ec_shard_retire(kvt_ec_shard *sh, const char *mm_hash, uint32_t len,
                        const kvt_ec_fence *fence)
{
    ec_key h;
    int rc = key_set(&h, mm_hash, len, "mm_hash");
    if (rc)
        return rc;
    res *e = res_find(sh, &h);
    if (!e || !e->pinned)
        return 0;
    e->pinned = false;
    e->fence = fence ? *fence : (kvt_ec_fence){NULL, NULL};
    res_settle(sh, e);
    return 1;
}

void kvt_ec_shard_begin_shutdown(kvt_ec_shard *sh)
{
    sh->shutting_down = true;
    for (uint32_t i = 0; i < sh->n_recs; i++) {
        rec *r = &sh->recs[i];
        if (!r->used || terminal(r))
            continue;
        if (r->writer != NONE) {
            detach_follower(sh, r);
            make_terminal(sh, r, KVT_EC_CANCELLED);
        } else if (r->state == KVT_EC_READY) {
            release(sh, r, false);
            make_terminal(sh, r, KVT_EC_CANCELLED);
        } else if (r->state == KVT_EC_WRITING) {
            r->state = KVT_EC_CANCEL_PENDING; /* its writer settles it */
            r->expires = NEVER;
        }
    }
}

int kvt_ec_shard_state(const kvt_ec_shard *sh, const char *tid, uint32_t len)
{
    ec_key t;
    if (key_set(&t, tid, len, "transfer id"))
        return KVT_EC_NONE;
    const rec *r = rec_find(sh, &t);
    return r ? r->state : KVT_EC_NONE;
}

void *kvt_ec_shard_buffer(const kvt_ec_shard *sh, uint64_t *capacity)
{
    if (capacity)
        *capacity = kvt_slab_capacity(sh->slab);
    return sh->cfg.base;
}

int kvt_ec_shard_status(const kvt_ec_shard *sh, const char *tid, uint32_t len, kvt_ec_status *out)
{
    ec_key t;
    if (!out)
        return kvt_fail(KVT_EINVAL, "ec shard: status: NULL out");
    memset(out, 0, sizeof(*out));
    int rc = key_set(&t, tid, len, "transfer id");
    if (rc)
        return rc;
    const rec *r = rec_find(sh, &t);
    if (!r || r->state < KVT_EC_WRITING || r->state > KVT_EC_EXPIRE_PENDING)
        return 0; /* unknown, reaped or a tombstone: no active record */
    memcpy(out->mm_hash, r->h.s, r->h.len + 1);
    memcpy(out->reservation_id, r->rid, sizeof(out->reservation_id));
    out->nbytes = r->d.nbytes;
    out->ndim = r->d.ndim;
    memcpy(out->shape, r->d.shape, sizeof(out->shape));
    memcpy(out->dtype, r->d.dtype, sizeof(out->dtype));
    out->state = r->state;
    out->ready = r->state == KVT_EC_READY;
    return 1;
}

uint32_t kvt_ec_shard_take_events(kvt_ec_shard *sh, kvt_ec_ready_event *out, uint32_t cap)
{
    uint32_t n = 0;
    for (; n < cap && sh->ev_n; n++, sh->ev_n--) {
        out[n] = sh->ev[sh->ev_head];
        sh->ev_head = (sh->ev_head + 1) % sh->cfg.max_events;
    }
    return n;
}

uint32_t kvt_ec_shard_take_reclaimed(kvt_ec_shard *sh, char (*out)[KVT_EC_KEY_MAX + 1],
                                     uint32_t cap)
{
    uint32_t n = 0;
    for (; n < cap && sh->recl_n; n++, sh->recl_n--) {
        memcpy(out[n], sh->recl[sh->recl_head], KVT_EC_KEY_MAX + 1);
        sh->recl_head = (sh->recl_head + 1) % sh->cfg.max_events;
    }
    return n;
}

void kvt_ec_shard_get_stats(const kvt_ec_shard *sh, kvt_ec_shard_stats *st)
{
    if (!sh || !st) { /* an object that failed to be created reads as all zero */
        if (st)
            memset(st, 0, sizeof(*st));
        return;
    }
    *st = sh->st;
    st->records = sh->live;
    st->tombstones = sh->tomb;
    st->residents = sh->res_count;
    st->writers = kvt_ec_shard_writers(sh);
    st->free_bytes = kvt_slab_free_bytes(sh->slab);
    st->capacity = kvt_slab_capacity(sh->slab);
    /* what the tables say they hold; capacity - free_bytes when nothing is lost */
    st->held_bytes = 0;
    for (uint32_t i = 0; i < sh->n_recs; i++)
        if (sh->recs[i].used && sh->recs[i].has_alloc)
            st->held_bytes += sh->recs[i].alloc.rounded;
    for (uint32_t i = 0; i < sh->n_res; i++)
        if (sh->res[i].used)
            st->held_bytes += sh->res[i].view.rounded;
    for (uint32_t i = 0; i < sh->n_defer; i++)
        st->held_bytes += sh->defer[i].view.rounded;
}

/* ---- the consumer worker's step ------------------------------------------------------------ */

static kvt_ec_fence fence_now(const kvt_ec_cache_ops *c)
{
    return c->fence ? c->fence(c->ctx) : (kvt_ec_fence){NULL, NULL};
}

static int retire_freed(kvt_ec_shard *sh, const kvt_ec_meta *meta, const kvt_ec_cache_ops *c)
{
    if (meta->has_freed) {
        for (uint32_t i = 0; i < meta->n_freed; i++) {
            ec_key h;
            if (key_set(&h, meta->freed[i].ptr, meta->freed[i].len, "freed mm_hash"))
                continue; /* a hash this shard could never hold */
            res *e = res_find(sh, &h);
            if (!e || !e->pinned || c->holds(c->ctx, h.s, h.len, &e->view))
                continue; /* still this very tensor in the cache */
            kvt_ec_fence f = fence_now(c);
            (void)kvt_ec_shard_retire(sh, h.s, h.len, &f);
        }
        return 0;
    }
    for (uint32_t i = 0; i < sh->n_res; i++) { /* freed = None: every stale pinned resident */
        res *e = &sh->res[i];
        if (!e->used || !e->current || !e->pinned || c->holds(c->ctx, e->h.s, e->h.len, &e->view))
            continue;
        kvt_ec_fence f = fence_now(c);
        (void)kvt_ec_shard_retire(sh, e->h.s, e->h.len, &f);
    }
    return 0;
}

static int load_one(kvt_ec_shard *sh, const kvt_ec_load_spec *sp, const kvt_ec_cache_ops *c)
{
    if (c->holds(c->ctx, sp->mm_hash.ptr, sp->mm_hash.len, NULL)) {
        if (!sp->local) { /* already cached: the pushed copy is not needed */
            bool done;
            (void)kvt_ec_shard_cancel(sh, sp->transfer_id.ptr, sp->transfer_id.len, NULL, false,
                                      false, &done);
        }
        return 0;
    }
    kvt_slab_view v;
    int rc;
    if (sp->local) {
        kvt_ec_item it = {sp->mm_hash.ptr, sp->mm_hash.len, sp->nbytes, sp->ndim, {0},
                          sp->dtype.ptr,   sp->dtype.len};
        memcpy(it.shape, sp->shape, sp->ndim * sizeof(uint64_t));
        rc = kvt_ec_shard_take_resident(sh, &it, &v);
    } else {
        kvt_ec_fence f = fence_now(c);
        rc = kvt_ec_shard_take(sh, sp->transfer_id.ptr, sp->transfer_id.len, sp->mm_hash.ptr,
                               sp->mm_hash.len, &f, &v);
    }
    if (!rc && v.nbytes != sp->nbytes)
        rc =
            kvt_fail(KVT_EPROTO, "ec shard: %s holds %llu bytes, the load spec says %llu",
                     sp->mm_hash.ptr, (unsigned long long)v.nbytes, (unsigned long long)sp->nbytes);
    return rc ? rc : c->place(c->ctx, sp, &v);
}

int kvt_ec_shard_apply(kvt_ec_shard *sh, const kvt_ec_meta *meta, const kvt_ec_cache_ops *cache,
                       kvt_ec_worker_meta *out)
{
    if (!meta || !cache || !cache->holds || !cache->place || !out)
        return kvt_fail(KVT_EINVAL, "ec shard: apply: NULL argument");
    int rc = retire_freed(sh, meta, cache);
    for (uint32_t i = 0; !rc && i < meta->n_loads; i++) {
        const kvt_ec_load_spec *sp = &meta->loads[i];
        int set = load_one(sh, sp, cache) ? KVT_EC_FAILED_LOADS : KVT_EC_LOADED;
        rc = kvt_ec_worker_meta_add(out, set, sp->mm_hash.ptr, sp->mm_hash.len);
    }
    char recl[16][KVT_EC_KEY_MAX + 1];
    uint32_t n;
    while (!rc && (n = kvt_ec_shard_take_reclaimed(sh, recl, 16)) > 0)
        for (uint32_t i = 0; !rc && i < n; i++)
            rc = kvt_ec_worker_meta_add(out, KVT_EC_RECLAIMED, recl[i], (uint32_t)strlen(recl[i]));
    return rc ? kvi_fail_wrap(rc, "ec shard: apply") : 0;
}

int kvt_ec_shard_prometheus(const kvt_ec_shard *sh, char *buf, size_t cap, size_t *len)
{
    if (!sh || !len || (cap && !buf))
        return kvt_fail(KVT_EINVAL, "ec shard: prometheus: NULL argument");
    kvt_ec_shard_stats st;
    kvt_ec_shard_get_stats(sh, &st);
    kvi_prom p = {buf, cap, 0};
    const struct {
        const char *name, *help;
        uint64_t v;
        bool gauge;
    } m[] = {
        {"reserves_total", "Reserve requests.", st.reserves, false},
        {"writes_total", "Reservations answered write=true (new destinations).", st.writes, false},
        {"follows_total", "Reservations that followed a writer in flight.", st.follows, false},
        {"cached_hits_total", "Reservations served from the resident pool.", st.cached_hits, false},
        {"completes_total", "Completions accepted.", st.completes, false},
        {"cancels_total", "Cancel requests.", st.cancels, false},
        {"expiries_total", "Reservations expired or deferred by the TTL.", st.expiries, false},
        {"takes_total", "Pushed items taken into the encoder cache.", st.takes, false},
        {"reclaims_total", "Residents evicted under pressure.", st.reclaims, false},
        {"deferred_frees_total", "Frees deferred behind a fence.", st.deferred_frees, false},
        {"tombstones_dropped_total", "Tombstones dropped at the cap.", st.tombstones_dropped,
         false},
        {"events_dropped_total", "Events dropped from a full backlog.", st.events_dropped, false},
        {"records", "Live reservations.", st.records, true},
        {"tombstones", "Terminal records kept.", st.tombstones, true},
        {"residents", "Resident entries.", st.residents, true},
        {"writers", "Reservations a remote writer may still write.", st.writers, true},
        {"free_bytes", "Free bytes of the receive buffer.", st.free_bytes, true},
        {"capacity_bytes", "Bytes of the receive buffer.", st.capacity, true},
    };
    for (size_t i = 0; i < sizeof(m) / sizeof(m[0]); i++)
        kvi_prom_metric(&p, "kvtier_ec_shard", m[i].name, m[i].help, m[i].gauge, m[i].v);
    return kvi_prom_finish(&p, len, "ec shard");
}
