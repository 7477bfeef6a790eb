/* SPDX-License-Identifier: Apache-2.0 */
/*
 * One consumer shard's receive side (spec ec-transfer §3.3, §3.4): reservations over the slab
 * and the resident pool (shard_res.c); the worker's step is shard_step.c.
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

#include "base/error.h"
#include "base/util.h"
#include "base/prom.h"
#include "ec/shard_impl.h"

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

int kvi_shard_key_set(ec_key *k, const char *s, uint32_t len, const char *what)
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

/* What a record says of its item (mm_hash, reservation, size, shape, dtype) into dst, a
 * kvt_ec_ready_event or a kvt_ec_status (the same field names). */
#define ITEM_OF(dst, r)                                                                            \
    do {                                                                                           \
        memcpy((dst)->mm_hash, (r)->h.s, (r)->h.len + 1);                                          \
        memcpy((dst)->reservation_id, (r)->rid, sizeof((dst)->reservation_id));                    \
        (dst)->nbytes = (r)->d.nbytes;                                                             \
        (dst)->ndim = (r)->d.ndim;                                                                 \
        memcpy((dst)->shape, (r)->d.shape, sizeof((dst)->shape));                                  \
        memcpy((dst)->dtype, (r)->d.dtype, sizeof((dst)->dtype));                                  \
    } while (0)

static void push_event(kvt_ec_shard *sh, const rec *r, bool abandoned)
{
    bool dropped = false; /* the backlog is bounded: the oldest goes */
    kvt_ec_ready_event *e = kvi_ring_push_over(&sh->ev, &dropped);
    sh->st.events_dropped += dropped || !e;
    if (!e)
        return;
    memcpy(e->transfer_id, r->tid.s, r->tid.len + 1);
    ITEM_OF(e, r);
    e->abandoned = abandoned;
}

static void push_reclaimed(kvt_ec_shard *sh, const ec_key *h)
{
    bool dropped = false;
    char *e = kvi_ring_push_over(&sh->recl, &dropped);
    sh->st.events_dropped += dropped || !e;
    if (e)
        memcpy(e, h->s, h->len + 1);
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
    kvi_shard_lease_release(sh, r);
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
    if (kvi_check_reserved(cfg->reserved, sizeof(cfg->reserved), "ec shard config"))
        return KVT_EINVAL;
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
    if (!rc)
        rc = kvi_ring_init(&sh->ev, sizeof(kvt_ec_ready_event), cfg->max_events);
    if (!rc)
        rc = kvi_ring_init(&sh->recl, KVT_EC_KEY_MAX + 1, cfg->max_events);
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
    kvi_ring_free(&sh->ev);
    kvi_ring_free(&sh->recl);
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
    kvi_shard_poll_deferred(sh);
    if (kvt_slab_alloc(sh->slab, nbytes, v) == 0)
        return 0;
    /* whatever is due expires first (next_deadline is never later than the earliest expiry,
     * so a forced full pass would find nothing more: it cost a scan of every record on each
     * reserve once the buffer was full of retired residents) */
    kvt_ec_shard_expire(sh);
    kvi_shard_poll_deferred(sh);
    if (kvt_slab_alloc(sh->slab, nbytes, v) == 0)
        return 0;
    while (sh->lru.head != NONE) { /* evict retired residents no reader holds, oldest first */
        res *e = &sh->res[sh->lru.head];
        push_reclaimed(sh, &e->h);
        sh->st.reclaims++;
        kvi_shard_res_free(sh, e);
        kvi_shard_poll_deferred(sh);
        if (kvt_slab_alloc(sh->slab, nbytes, v) == 0)
            return 0;
    }
    kvi_shard_poll_deferred(sh);
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

/* A new record for transfer t of item (h, d) in state st, owned by owner (NULL: none): its
 * reservation id drawn. NULL when out of memory (rec_new may move the record array). */
static rec *rec_start(kvt_ec_shard *sh, const ec_key *t, const ec_key *h, const desc *d, int st,
                      const char *owner)
{
    rec *r = rec_new(sh, t);
    if (!r)
        return NULL;
    r->h = *h;
    r->d = *d;
    r->state = st;
    new_rid(sh, r->rid);
    own(r, owner);
    return r;
}

/* Transfer t reserved again (a retry): the same answer, or why not. */
static int reserve_again(kvt_ec_shard *sh, rec *r, const ec_key *t, const ec_key *h, const desc *d,
                         kvt_ec_reply *out)
{
    if (r->state == KVT_EC_CANCELLED) {
        memset(out, 0, sizeof(*out));
        out->nbytes = d->nbytes;
        out->cancelled = true;
        return 0;
    }
    if (r->state == KVT_EC_EXPIRE_PENDING)
        return kvt_fail(KVT_ESTATE,
                        "ec shard: transfer %s still has an active writer (refresh-abandon it "
                        "first)",
                        t->s);
    if (!ec_key_eq(&r->h, h) || !desc_eq(&r->d, d))
        return kvt_fail(KVT_EINVAL, "ec shard: conflicting reservation for transfer_id %s", t->s);
    fill_reply(sh, r, rec_view(sh, r), out);
    if (r->state == KVT_EC_WRITING)
        set_expiry(sh, r);
    out->ready = r->state == KVT_EC_READY;
    out->cached = r->cached;
    out->cancelled = r->state == KVT_EC_CANCEL_PENDING;
    return 0;
}

/* A resident hit: the record leases the cached tensor and is READY at once. */
static int reserve_cached(kvt_ec_shard *sh, const ec_key *t, const ec_key *h, const desc *d, res *e,
                          const char *owner, kvt_ec_reply *out)
{
    if (!desc_eq(&e->d, d))
        return kvt_fail(KVT_EINVAL, "ec shard: conflicting cached tensor for %s", h->s);
    rec *r = rec_start(sh, t, h, d, KVT_EC_READY, owner);
    if (!r)
        return kvt_fail(KVT_ENOMEM, "ec shard: out of memory");
    r->cached = true;
    kvi_shard_lease_take(sh, r, e);
    set_expiry(sh, r);
    fill_reply(sh, r, &e->view, out);
    out->ready = out->cached = true;
    push_event(sh, r, false);
    sh->st.cached_hits++;
    return 0;
}

/* A follower of writer w in flight for the same item: it waits for w's bytes. */
static int reserve_follower(kvt_ec_shard *sh, const ec_key *t, const ec_key *h, const desc *d,
                            rec *w, const char *owner, kvt_ec_reply *out)
{
    if (!desc_eq(&w->d, d))
        return kvt_fail(KVT_EINVAL, "ec shard: conflicting reservation for %s in flight", h->s);
    uint32_t wi = rec_idx(sh, w);
    rec *r = rec_start(sh, t, h, d, KVT_EC_WRITING, owner);
    if (!r)
        return kvt_fail(KVT_ENOMEM, "ec shard: out of memory");
    w = &sh->recs[wi]; /* rec_new may have moved the record array */
    r->writer = wi;
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

/* The item's writer: room allocated (reclaiming cached tensors if need be) for its bytes. */
static int reserve_writer(kvt_ec_shard *sh, const ec_key *t, const ec_key *h, const desc *d,
                          const char *owner, kvt_ec_reply *out)
{
    kvt_slab_view v;
    int rc = alloc_with_reclaim(sh, d->nbytes, &v);
    if (rc)
        return rc;
    rec *r = rec_start(sh, t, h, d, KVT_EC_WRITING, owner);
    if (!r) {
        (void)kvt_slab_free(sh->slab, &v);
        return kvt_fail(KVT_ENOMEM, "ec shard: out of memory");
    }
    v.nbytes = d->nbytes;
    r->alloc = v;
    r->has_alloc = true;
    (void)kvi_map_insert(&sh->writer_map, h->hash, rec_idx(sh, r)); /* room: max_records */
    r->is_writer = true;
    set_expiry(sh, r);
    fill_reply(sh, r, &v, out);
    out->write = true;
    sh->st.writes++;
    return 0;
}

int kvi_ec_shard_reserve_as(kvt_ec_shard *sh, const char *tid, uint32_t tid_len,
                            const kvt_ec_item *item, const char *owner, kvt_ec_reply *out)
{
    ec_key t, h;
    desc d;
    int rc;
    if (!out || !item)
        return kvt_fail(KVT_EINVAL, "ec shard: reserve: NULL argument");
    if ((rc = kvi_shard_key_set(&t, tid, tid_len, "transfer id")) ||
        (rc = kvi_shard_key_set(&h, item->mm_hash, item->mm_hash_len, "mm_hash")) ||
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
        strncmp(r->owner, owner, sizeof(r->owner)) != 0)
        return kvt_fail(KVT_EEXIST, "ec shard: transfer %s is reserved by another client", t.s);
    if (r)
        return reserve_again(sh, r, &t, &h, &d, out);
    if (sh->live >= sh->cfg.max_records)
        return kvt_fail(KVT_ELIMIT, "ec shard: %u reservations live (max_records)", sh->live);
    res *e = kvi_shard_res_find(sh, &h);
    if (e)
        return reserve_cached(sh, &t, &h, &d, e, owner, out);
    rec *w = writer_find(sh, &h);
    if (w && w->state == KVT_EC_WRITING)
        return reserve_follower(sh, &t, &h, &d, w, owner, out);
    if (w) /* a deferred writer of h: settled by its completion, no longer followed */
        writer_unregister(sh, w);
    return reserve_writer(sh, &t, &h, &d, owner, out);
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
    if ((rc = kvi_shard_key_set(&t, tid, tid_len, "transfer id")))
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
        res *e = kvi_shard_res_find(sh, &r->h);
        if (e && desc_eq(&e->d, &r->d))
            (void)kvt_slab_free(sh->slab, &r->alloc);
        else
            e = kvi_shard_res_publish(sh, &r->h, &r->d, &r->alloc, false, NULL);
        r->has_alloc = false;
        while (r->ffirst != NONE) {
            rec *f = &sh->recs[r->ffirst];
            detach_follower(sh, f);
            if (e) {
                kvi_shard_lease_take(sh, f, e);
                f->state = KVT_EC_READY;
                set_expiry(sh, f);
                push_event(sh, f, false);
            } else {
                make_terminal(sh, f, KVT_EC_CANCELLED);
            }
        }
        if (e)
            kvi_shard_lease_take(sh, r, e);
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
    if ((rc = kvi_shard_key_set(&t, tid, tid_len, "transfer id")))
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
    if ((rc = kvi_shard_key_set(&t, tid, tid_len, "transfer id")) ||
        (rc = kvi_shard_key_set(&h, mm_hash, hash_len, "mm_hash")))
        return rc;
    rec *r = rec_find(sh, &t);
    if (!r || r->state != KVT_EC_READY || !ec_key_eq(&r->h, &h) ||
        (r->lease == NONE && !r->has_alloc))
        return kvt_fail(KVT_ESTATE, "ec shard: pushed EC tensor %s of transfer %s is not ready",
                        h.s, t.s);
    res *e;
    if (r->lease != NONE) { /* the canonical entry: possibly a newer replacement */
        e = kvi_shard_res_find(sh, &h);
        if (!e) { /* (the leased one was displaced by an entry since evicted) */
            e = &sh->res[r->lease];
            e->current = true;
            (void)kvi_map_insert(&sh->res_map, h.hash, kvi_shard_res_idx(sh, e));
        }
        e->pinned = true;
        kvi_shard_lru_remove(sh, e);
        kvi_shard_lease_release(sh, r);
    } else {
        e = kvi_shard_res_publish(sh, &h, &r->d, &r->alloc, true, fence);
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
    if ((rc = kvi_shard_key_set(&h, item->mm_hash, item->mm_hash_len, "mm_hash")) ||
        (rc = desc_set(&d, item)))
        return rc;
    res *e = kvi_shard_res_find(sh, &h);
    if (!e || !desc_eq(&e->d, &d))
        return kvt_fail(KVT_ENOENT, "ec shard: %s is not resident with this shape and dtype", h.s);
    e->pinned = true;
    e->fence = (kvt_ec_fence){NULL, NULL}; /* in use again: its retire fence no longer matters */
    kvi_shard_lru_remove(sh, e);
    *out = e->view;
    out->nbytes = e->d.nbytes;
    return 0;
}

int kvt_ec_shard_retire(kvt_ec_shard *sh, const char *mm_hash, uint32_t len,
                        const kvt_ec_fence *fence)
{
    ec_key h;
    int rc = kvi_shard_key_set(&h, mm_hash, len, "mm_hash");
    if (rc)
        return rc;
    res *e = kvi_shard_res_find(sh, &h);
    if (!e || !e->pinned)
        return 0;
    e->pinned = false;
    e->fence = fence ? *fence : (kvt_ec_fence){NULL, NULL};
    kvi_shard_res_settle(sh, e);
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
    if (kvi_shard_key_set(&t, tid, len, "transfer id"))
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
    int rc = kvi_shard_key_set(&t, tid, len, "transfer id");
    if (rc)
        return rc;
    const rec *r = rec_find(sh, &t);
    if (!r || r->state < KVT_EC_WRITING || r->state > KVT_EC_EXPIRE_PENDING)
        return 0; /* unknown, reaped or a tombstone: no active record */
    ITEM_OF(out, r);
    out->state = r->state;
    out->ready = r->state == KVT_EC_READY;
    return 1;
}

uint32_t kvt_ec_shard_take_events(kvt_ec_shard *sh, kvt_ec_ready_event *out, uint32_t cap)
{
    return kvi_ring_take(&sh->ev, out, cap);
}

uint32_t kvt_ec_shard_take_reclaimed(kvt_ec_shard *sh, char (*out)[KVT_EC_KEY_MAX + 1],
                                     uint32_t cap)
{
    return kvi_ring_take(&sh->recl, out, cap);
}

void kvt_ec_shard_get_stats(const kvt_ec_shard *sh, kvt_ec_shard_stats *st)
{
    if (!kvi_stats_begin(sh, st, sizeof(*st)))
        return;
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
