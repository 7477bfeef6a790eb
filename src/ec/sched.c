/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The consumer scheduler's transfer table (spec ec-transfer §1.4 steps 8-12, §2.4, §3.4's
 * residency mirror, §4.4's deadlines).
 *
 * A transfer record per transfer id, found through a map; the same map type indexes records by
 * mm_hash as a multimap (candidates compared by key, the oldest first by creation sequence, so
 * a hash's transfers keep their FIFO order). Requests are kept while the engine runs them,
 * each feature bound to the transfer that serves it (its own, or one it borrowed), so a
 * transfer that fails can fail exactly the requests that depend on it, each reported once.
 *
 * Life cycle (terminal states are tombstones: late events and repeated ids never revive them):
 *
 *   (partial readiness) --all shards--> AVAILABLE --begin_load--> LOADING --loaded--> READY
 *   WAITING (a request waits) --all shards--> AVAILABLE           LOADING --failed--> FAILED
 *   WAITING --push_wait / abandoned--> UNAVAILABLE                LOADING --push_wait-->
 * UNAVAILABLE AVAILABLE --lease--> EXPIRED                                  READY --evicted-->
 * RESIDENT RESIDENT --begin_load (local)--> LOADING                      READY|RESIDENT
 * --orphaned--> EXPIRED any live --consumed / request finished--> CANCELLED
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/array.h"
#include "base/error.h"
#include "base/util.h"
#include "base/map.h"
#include "base/prom.h"
#include "ec/ec_key.h"

#define NONE         UINT32_MAX
#define ST_PARTIAL   100 /* internal: readiness from some shards, no request yet */
#define MAX_FEATURES 64u

typedef struct xfer {
    bool used, has_spec, local, queued, cancel_sent;
    bool orphan; /* LOADING with no request left: what the ranks load is released on arrival */
    uint8_t state;
    ec_key t, h;
    uint64_t nbytes;
    uint32_t ndim;
    uint64_t shape[KVT_EC_MAX_DIMS];
    char dtype[24];
    uint64_t mask, deadline, seq;
    kvi_ilink tomb; /* the tombstone FIFO */
    uint32_t free_next;
} xfer;

typedef struct sreq {
    bool used, reported;
    ec_key id;
    uint32_t n;
    uint32_t own[MAX_FEATURES];   /* the transfer each feature named */
    uint32_t used_[MAX_FEATURES]; /* the transfer serving it (its own or borrowed) */
    uint32_t free_next;
} sreq;

struct kvt_ec_sched {
    kvt_ec_sched_config cfg;
    xfer *x;
    uint32_t n_x, cap_x, free_x, live, tomb, partial;
    kvi_ilist tombs; /* terminal transfers, oldest first */
    uint64_t seq;
    kvi_map by_t, by_h;
    sreq *r;
    uint32_t n_r, cap_r, free_r;
    kvi_map by_req;
    ec_key *mirror; /* the engine's encoder cache */
    uint32_t n_mirror, cap_mirror;
    uint32_t *loadq;
    uint32_t n_loadq, cap_loadq;
    ec_key *freed, *unavail, *cancels;
    uint32_t n_freed, cap_freed, n_unavail, cap_unavail, n_cancels, cap_cancels;
    kvt_ec_sched_stats st;
};

/* ---- helpers ------------------------------------------------------------------------------ */

static int skey_set(ec_key *k, const char *s, uint32_t len, const char *what)
{
    return ec_key_set(k, s, len, false, "ec sched", what);
}

static uint64_t now(const kvt_ec_sched *s)
{
    return kvt_clock_now(&s->cfg.clock);
}

static uint64_t after(const kvt_ec_sched *s, uint64_t d)
{
    uint64_t t = now(s);
    return t > UINT64_MAX - d ? UINT64_MAX : t + d;
}

static bool terminal(const xfer *x)
{
    return x->state >= KVT_ECT_FAILED && x->state != ST_PARTIAL;
}

static uint32_t xi(const kvt_ec_sched *s, const xfer *x)
{
    return (uint32_t)(x - s->x);
}

/* Appends a key to a growable list; false (and a logged error) if memory ran out. */
static bool list_push(ec_key **l, uint32_t *n, uint32_t *cap, const ec_key *k)
{
    if (kvi_array_grow((void **)l, cap, *n + 1ull, sizeof(ec_key))) {
        kvt_fail(KVT_ENOMEM, "ec sched: cannot queue %s", k->s);
        return false;
    }
    (*l)[(*n)++] = *k;
    return true;
}

static xfer *find_t(const kvt_ec_sched *s, const ec_key *t)
{
    uint32_t i = ec_key_find(&s->by_t, s->x, sizeof(xfer), offsetof(xfer, t), t);
    return i == NONE ? NULL : &s->x[i];
}

/* The oldest transfer of h in one of the states of `mask` (bit per state), or NULL. */
static xfer *oldest_of(const kvt_ec_sched *s, const ec_key *h, unsigned mask)
{
    uint64_t pos = kvi_map_probe_start(&s->by_h, h->hash);
    uint32_t i;
    xfer *best = NULL;
    while (kvi_map_probe_next(&s->by_h, h->hash, &pos, &i)) {
        xfer *x = &s->x[i];
        if (x->state < 32 && (mask & (1u << x->state)) && ec_key_eq(&x->h, h) &&
            (!best || x->seq < best->seq))
            best = x;
    }
    return best;
}

#define BIT(st) (1u << (st))

/* A new record, or NULL with *err set (KVT_ELIMIT, KVT_ENOMEM). */
static xfer *x_new(kvt_ec_sched *s, const ec_key *t, const ec_key *h, uint8_t state, int *err)
{
    if (s->live >= s->cfg.max_transfers) {
        *err = kvt_fail(KVT_ELIMIT, "ec sched: %u transfers live (max_transfers)", s->live);
        return NULL;
    }
    uint32_t i = kvi_slot_take((void **)&s->x, &s->n_x, &s->cap_x, &s->free_x, sizeof(xfer),
                               offsetof(xfer, free_next));
    if (i == NONE) {
        *err = kvt_fail(KVT_ENOMEM, "ec sched: out of memory");
        return NULL;
    }
    xfer *x = &s->x[i];
    memset(x, 0, sizeof(*x));
    x->used = true;
    x->t = *t;
    if (h)
        x->h = *h;
    x->state = state;
    x->seq = ++s->seq;
    x->tomb.prev = x->tomb.next = NONE;
    (void)kvi_map_insert(&s->by_t, t->hash, xi(s, x)); /* room: live + tombstones */
    if (h)
        (void)kvi_map_insert(&s->by_h, h->hash, xi(s, x));
    s->live++;
    if (state == ST_PARTIAL)
        s->partial++;
    return x;
}

static void tomb_unlink(kvt_ec_sched *s, xfer *x)
{
    KVI_ILIST_REMOVE(&s->tombs, s->x, tomb, xi(s, x));
}

/* Requests no longer point at a freed slot. */
static void unbind(kvt_ec_sched *s, uint32_t idx)
{
    for (uint32_t i = 0; i < s->n_r; i++) {
        sreq *r = &s->r[i];
        for (uint32_t f = 0; r->used && f < r->n; f++) {
            if (r->own[f] == idx)
                r->own[f] = NONE;
            if (r->used_[f] == idx)
                r->used_[f] = NONE;
        }
    }
}

/* x leaves the live count or the tombstone FIFO, whichever it is in. */
static void uncount(kvt_ec_sched *s, xfer *x)
{
    if (terminal(x)) {
        tomb_unlink(s, x);
        s->tomb--;
    } else {
        s->live--;
        if (x->state == ST_PARTIAL)
            s->partial--;
    }
}

static void x_free(kvt_ec_sched *s, xfer *x)
{
    uncount(s, x);
    kvi_map_remove(&s->by_t, x->t.hash, xi(s, x));
    if (x->h.len)
        kvi_map_remove(&s->by_h, x->h.hash, xi(s, x));
    unbind(s, xi(s, x));
    x->used = false;
    kvi_slot_give(s->x, &s->free_x, sizeof(xfer), offsetof(xfer, free_next), xi(s, x));
}

static void queue_cancel(kvt_ec_sched *s, xfer *x)
{
    if (!x->cancel_sent && list_push(&s->cancels, &s->n_cancels, &s->cap_cancels, &x->t)) {
        x->cancel_sent = true;
        s->st.cancels++;
    }
}

/* Fails every request that depends on x (its own or borrowed), each reported once. */
static void fail_dependents(kvt_ec_sched *s, const xfer *x)
{
    uint32_t idx = xi(s, x);
    for (uint32_t i = 0; i < s->n_r; i++) {
        sreq *r = &s->r[i];
        if (!r->used || r->reported)
            continue;
        for (uint32_t f = 0; f < r->n; f++)
            if (r->own[f] == idx || r->used_[f] == idx) {
                if (list_push(&s->unavail, &s->n_unavail, &s->cap_unavail, &r->id)) {
                    r->reported = true;
                    s->st.unavailable++;
                }
                break;
            }
    }
}

/* x becomes a tombstone in `state`; cancel: tell every shard to release it. */
static void finish_x(kvt_ec_sched *s, xfer *x, uint8_t state, bool cancel)
{
    uncount(s, x);
    x->state = state;
    x->queued = false;
    x->deadline = after(s, s->cfg.lease_ns);
    KVI_ILIST_PUSH_BACK(&s->tombs, s->x, tomb, xi(s, x));
    s->tomb++;
    if (cancel)
        queue_cancel(s, x);
    if (state == KVT_ECT_FAILED || state == KVT_ECT_UNAVAILABLE)
        fail_dependents(s, x);
    while (s->tomb > s->cfg.max_tombstones)
        x_free(s, &s->x[s->tombs.head]);
}

static bool mirror_has(const kvt_ec_sched *s, const ec_key *h)
{
    for (uint32_t i = 0; i < s->n_mirror; i++)
        if (ec_key_eq(&s->mirror[i], h))
            return true;
    return false;
}

/* ---- life cycle ---------------------------------------------------------------------------- */

void kvt_ec_sched_config_init(kvt_ec_sched_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->shards = 1;
    cfg->push_wait_ns = 60ull * 1000000000ull;
    cfg->lease_ns = 300ull * 1000000000ull;
    cfg->resident_capacity = 1000000000ull;
    cfg->max_transfers = 65536;
    cfg->max_tombstones = 65536;
    cfg->max_partial = 4096;
    cfg->clock = kvt_clock_monotonic();
}

int kvt_ec_sched_create(const kvt_ec_sched_config *cfg, kvt_ec_sched **out)
{
    if (!cfg || !out)
        return kvt_fail(KVT_EINVAL, "ec sched: NULL argument");
    if (kvi_check_reserved(cfg->reserved, sizeof(cfg->reserved), "ec sched config"))
        return KVT_EINVAL;
    *out = NULL;
    if (cfg->shards < 1 || cfg->shards > KVT_EC_MAX_SHARDS)
        return kvt_fail(KVT_EINVAL, "ec sched: shards %u must be 1..%u", cfg->shards,
                        KVT_EC_MAX_SHARDS);
    if (!cfg->push_wait_ns || !cfg->lease_ns || !cfg->max_transfers || !cfg->clock.now_ns ||
        cfg->max_transfers > (1u << 24) || cfg->max_tombstones > (1u << 24))
        return kvt_fail(KVT_EINVAL, "ec sched: timeouts, table sizes (1..16 Mi) and clock needed");
    kvt_ec_sched *s = calloc(1, sizeof(*s));
    if (!s)
        return kvt_fail(KVT_ENOMEM, "ec sched: out of memory");
    s->cfg = *cfg;
    s->free_x = s->free_r = NONE;
    kvi_ilist_init(&s->tombs);
    uint32_t cap = cfg->max_transfers + cfg->max_tombstones + 1;
    int rc = kvi_map_init(&s->by_t, cap);
    if (!rc)
        rc = kvi_map_init(&s->by_h, cap);
    if (!rc)
        rc = kvi_map_init(&s->by_req, cfg->max_transfers);
    if (rc) {
        kvt_ec_sched_destroy(s);
        return kvi_fail_wrap(rc, "ec sched");
    }
    *out = s;
    return 0;
}

void kvt_ec_sched_destroy(kvt_ec_sched *s)
{
    if (!s)
        return;
    kvi_map_free(&s->by_t);
    kvi_map_free(&s->by_h);
    kvi_map_free(&s->by_req);
    free(s->x);
    free(s->r);
    free(s->mirror);
    free(s->loadq);
    free(s->freed);
    free(s->unavail);
    free(s->cancels);
    free(s);
}

/* ---- readiness ------------------------------------------------------------------------------ */

int kvt_ec_sched_observe_ready(kvt_ec_sched *s, const kvt_ec_ready *ev)
{
    ec_key t, h;
    int rc;
    if (!ev)
        return kvt_fail(KVT_EINVAL, "ec sched: NULL event");
    if ((rc = skey_set(&t, ev->transfer_id, ev->transfer_id_len, "transfer id")) ||
        (rc = skey_set(&h, ev->item.mm_hash, ev->item.mm_hash_len, "mm_hash")))
        return rc;
    if (ev->shard >= s->cfg.shards)
        return kvt_fail(KVT_ERANGE, "ec sched: shard %u of %u", ev->shard, s->cfg.shards);
    if (ev->item.ndim > KVT_EC_MAX_DIMS || !ev->item.dtype || !ev->item.dtype_len ||
        ev->item.dtype_len >= sizeof(((xfer *)0)->dtype))
        return kvt_fail(KVT_EINVAL, "ec sched: malformed tensor description");
    s->st.ready_events++;
    xfer *x = find_t(s, &t);
    if ((x && (terminal(x) || (x->h.len && !ec_key_eq(&x->h, &h)))) ||
        (x && x->state != KVT_ECT_WAITING && x->state != ST_PARTIAL) ||
        (!x && s->partial >= s->cfg.max_partial)) {
        /* finished, a colliding id (the transfer the table knows stands), a repeat after
         * readiness, or a transfer nobody asked for yet beyond the partial bound */
        s->st.ready_ignored++;
        return 0;
    }
    if (!x) {
        if (!(x = x_new(s, &t, &h, ST_PARTIAL, &rc)))
            return kvi_fail_wrap(rc, "ec sched: readiness");
        x->deadline = after(s, s->cfg.lease_ns);
    }
    if (!x->has_spec) {
        x->has_spec = true;
        x->nbytes = ev->item.nbytes;
        x->ndim = ev->item.ndim;
        memcpy(x->shape, ev->item.shape, ev->item.ndim * sizeof(uint64_t));
        memcpy(x->dtype, ev->item.dtype, ev->item.dtype_len);
        x->dtype[ev->item.dtype_len] = 0;
    }
    x->mask |= 1ull << ev->shard;
    if ((uint32_t)__builtin_popcountll(x->mask) < s->cfg.shards)
        return 0; /* the same shard twice does not make two */
    if (x->state == ST_PARTIAL)
        s->partial--;
    x->state = KVT_ECT_AVAILABLE;
    x->deadline = after(s, s->cfg.lease_ns);
    return 0;
}

int kvt_ec_sched_observe_abandoned(kvt_ec_sched *s, const char *tid, uint32_t len)
{
    ec_key t;
    int rc = skey_set(&t, tid, len, "transfer id");
    if (rc)
        return rc;
    s->st.abandoned++;
    xfer *x = find_t(s, &t);
    if (!x) { /* before the request: it fails when it arrives */
        if (!(x = x_new(s, &t, NULL, ST_PARTIAL, &rc)))
            return kvi_fail_wrap(rc, "ec sched: abandoned");
        finish_x(s, x, KVT_ECT_UNAVAILABLE, false);
        return 0;
    }
    if (x->state == KVT_ECT_WAITING || x->state == ST_PARTIAL)
        finish_x(s, x, KVT_ECT_UNAVAILABLE, false); /* fails its waiting requests at once */
    return 0;                                       /* after readiness: ignored */
}

bool kvt_ec_sched_has_cache_item(kvt_ec_sched *s, const char *mm_hash, uint32_t len)
{
    ec_key h;
    if (skey_set(&h, mm_hash, len, "mm_hash"))
        return false;
    return oldest_of(s, &h, BIT(KVT_ECT_READY) | BIT(KVT_ECT_RESIDENT) | BIT(KVT_ECT_AVAILABLE));
}

/* ---- requests ---------------------------------------------------------------------------------
 */

static sreq *req_find(const kvt_ec_sched *s, const ec_key *id)
{
    uint32_t i = ec_key_find(&s->by_req, s->r, sizeof(sreq), offsetof(sreq, id), id);
    return i == NONE ? NULL : &s->r[i];
}

/* The request's record, created if new; NULL with *err set (KVT_ELIMIT, KVT_ENOMEM). */
static sreq *req_get(kvt_ec_sched *s, const ec_key *id, int *err)
{
    sreq *r = req_find(s, id);
    if (r)
        return r;
    if (s->by_req.count >= s->by_req.capacity) {
        *err = kvt_fail(KVT_ELIMIT, "ec sched: too many requests tracked");
        return NULL;
    }
    uint32_t i = kvi_slot_take((void **)&s->r, &s->n_r, &s->cap_r, &s->free_r, sizeof(sreq),
                               offsetof(sreq, free_next));
    if (i == NONE) {
        *err = kvt_fail(KVT_ENOMEM, "ec sched: out of memory");
        return NULL;
    }
    r = &s->r[i];
    memset(r, 0, sizeof(*r));
    r->used = true;
    r->id = *id;
    (void)kvi_map_insert(&s->by_req, id->hash, (uint32_t)(r - s->r));
    return r;
}

static void fail_request(kvt_ec_sched *s, sreq *r)
{
    if (!r->reported && list_push(&s->unavail, &s->n_unavail, &s->cap_unavail, &r->id)) {
        r->reported = true;
        s->st.unavailable++;
    }
}

static void begin_load(kvt_ec_sched *s, xfer *y)
{
    y->local = y->state == KVT_ECT_RESIDENT;
    y->state = KVT_ECT_LOADING;
    s->st.loads_started++;
    s->st.local_loads += y->local;
    y->deadline = after(s, s->cfg.push_wait_ns);
    if (!y->queued && kvi_array_grow((void **)&s->loadq, &s->cap_loadq, s->n_loadq + 1ull,
                                     sizeof(uint32_t)) == 0) {
        s->loadq[s->n_loadq++] = xi(s, y);
        y->queued = true;
    }
}

/* One feature of ensure; returns whether it is available now. */
static bool ensure_one(kvt_ec_sched *s, sreq *r, uint32_t f, const ec_key *t, const ec_key *h)
{
    xfer *x = find_t(s, t);
    if (x && x->h.len && !ec_key_eq(&x->h, h)) { /* a colliding id: only this request fails */
        fail_request(s, r);
        return false;
    }
    if (x && x->state == ST_PARTIAL && !x->h.len) { /* (an abandon notice without its hash) */
        finish_x(s, x, KVT_ECT_UNAVAILABLE, false);
    }
    r->own[f] = x ? xi(s, x) : NONE;
    if (x && x->state == KVT_ECT_AVAILABLE)
        x->deadline = after(s, s->cfg.lease_ns); /* the lease is touched while asked for */
    if (mirror_has(s, h))
        return true;
    xfer *y = oldest_of(s, h, BIT(KVT_ECT_READY));
    if (y) {
        r->used_[f] = xi(s, y);
        return true;
    }
    if ((y = oldest_of(s, h, BIT(KVT_ECT_LOADING)))) {
        y->orphan = false; /* wanted again */
        r->used_[f] = xi(s, y);
        return false;
    }
    y = x && x->state == KVT_ECT_AVAILABLE
            ? x
            : oldest_of(s, h, BIT(KVT_ECT_AVAILABLE) | BIT(KVT_ECT_RESIDENT));
    if (y) {
        begin_load(s, y);
        r->used_[f] = xi(s, y);
        return false;
    }
    if (x && terminal(x)) { /* a finished transfer is never revived */
        fail_request(s, r);
        return false;
    }
    if (!x) {
        int err;
        if (!(x = x_new(s, t, h, KVT_ECT_WAITING, &err))) {
            fail_request(s, r);
            return false;
        }
        x->deadline = after(s, s->cfg.push_wait_ns);
    } else if (x->state == ST_PARTIAL) {
        s->partial--;
        x->state = KVT_ECT_WAITING;
        x->deadline = after(s, s->cfg.push_wait_ns);
    }
    r->own[f] = r->used_[f] = xi(s, x);
    return false;
}

static int feature_keys(const char *req, uint32_t req_len, const kvt_ec_feature *ft, uint32_t f,
                        ec_key *t, ec_key *h)
{
    int rc = skey_set(h, ft->mm_hash, ft->mm_hash_len, "mm_hash");
    if (rc)
        return rc;
    if (ft->transfer_id && ft->transfer_id_len)
        return skey_set(t, ft->transfer_id, ft->transfer_id_len, "transfer id");
    char buf[KVT_EC_KEY_MAX + 16]; /* the fallback the two sides no longer agree on */
    int n = snprintf(buf, sizeof(buf), "%.*s:%u", (int)req_len, req, f);
    return skey_set(t, buf, n > 0 && (uint32_t)n < sizeof(buf) ? (uint32_t)n : 0, "transfer id");
}

int kvt_ec_sched_ensure(kvt_ec_sched *s, const char *req_id, uint32_t req_len,
                        const kvt_ec_feature *features, uint32_t n, bool *ready)
{
    ec_key id;
    int rc;
    if (!ready || (n && !features))
        return kvt_fail(KVT_EINVAL, "ec sched: ensure: NULL argument");
    *ready = false;
    if ((rc = skey_set(&id, req_id, req_len, "request id")))
        return rc;
    if (n > MAX_FEATURES)
        return kvt_fail(KVT_ELIMIT, "ec sched: %u features (at most %u)", n, MAX_FEATURES);
    for (uint32_t f = 0; f < n; f++) { /* validate everything first */
        ec_key t, h;
        if ((rc = feature_keys(req_id, req_len, &features[f], f, &t, &h)))
            return rc;
    }
    sreq *r = req_get(s, &id, &rc);
    if (!r)
        return kvi_fail_wrap(rc, "ec sched: ensure");
    r->n = n;
    bool all = !r->reported;
    for (uint32_t f = 0; f < n; f++) {
        ec_key t, h;
        (void)feature_keys(req_id, req_len, &features[f], f, &t, &h);
        r->used_[f] = NONE;
        all &= ensure_one(s, r, f, &t, &h);
    }
    *ready = all && !r->reported;
    return 0;
}

/* ---- encoder cache ------------------------------------------------------------------------ */

int kvt_ec_sched_cache_added(kvt_ec_sched *s, const char *mm_hash, uint32_t len)
{
    ec_key h;
    int rc = skey_set(&h, mm_hash, len, "mm_hash");
    if (rc || mirror_has(s, &h))
        return rc;
    return list_push(&s->mirror, &s->n_mirror, &s->cap_mirror, &h) ? 0 : KVT_ENOMEM;
}

/* Keeps the mirrored resident bytes within the pool: the oldest RESIDENT transfers go. */
static void trim_residents(kvt_ec_sched *s)
{
    for (;;) {
        uint64_t bytes = 0;
        xfer *oldest = NULL;
        for (uint32_t i = 0; i < s->n_x; i++) {
            xfer *x = &s->x[i];
            if (!x->used || x->state != KVT_ECT_RESIDENT)
                continue;
            bytes += x->nbytes;
            if (!oldest || x->seq < oldest->seq)
                oldest = x;
        }
        if (!oldest || bytes <= s->cfg.resident_capacity)
            return;
        finish_x(s, oldest, KVT_ECT_EXPIRED, true);
    }
}

int kvt_ec_sched_cache_freed(kvt_ec_sched *s, const char *mm_hash, uint32_t len)
{
    ec_key h;
    int rc = skey_set(&h, mm_hash, len, "mm_hash");
    if (rc)
        return rc;
    for (uint32_t i = 0; i < s->n_mirror; i++)
        if (ec_key_eq(&s->mirror[i], &h)) {
            s->mirror[i] = s->mirror[--s->n_mirror];
            break;
        }
    if (!list_push(&s->freed, &s->n_freed, &s->cap_freed, &h))
        return KVT_ENOMEM;
    /* the newest READY transfer stays resident; other copies are orphans */
    xfer *keep = NULL;
    for (uint32_t i = 0; i < s->n_x; i++) {
        xfer *x = &s->x[i];
        if (x->used && x->state == KVT_ECT_READY && x->has_spec && ec_key_eq(&x->h, &h) &&
            (!keep || x->seq > keep->seq))
            keep = x;
    }
    for (uint32_t i = 0; i < s->n_x; i++) {
        xfer *x = &s->x[i];
        if (!x->used || x == keep || !ec_key_eq(&x->h, &h) ||
            (x->state != KVT_ECT_READY && x->state != KVT_ECT_RESIDENT))
            continue;
        finish_x(s, x, KVT_ECT_EXPIRED, true);
    }
    if (keep) {
        keep->state = KVT_ECT_RESIDENT;
        keep->local = true;
        trim_residents(s);
    }
    return 0;
}

static bool bound_by_other(const kvt_ec_sched *s, const sreq *self, uint32_t idx)
{
    for (uint32_t i = 0; i < s->n_r; i++) {
        const sreq *r = &s->r[i];
        if (!r->used || r == self)
            continue;
        for (uint32_t f = 0; f < r->n; f++)
            if (r->own[f] == idx || r->used_[f] == idx)
                return true;
    }
    return false;
}

int kvt_ec_sched_consumed(kvt_ec_sched *s, const char *req_id, uint32_t req_len,
                          const kvt_ec_feature *feature)
{
    ec_key id, t, h = {.len = 0};
    int rc;
    if (!feature)
        return kvt_fail(KVT_EINVAL, "ec sched: consumed: NULL feature");
    if ((rc = skey_set(&id, req_id, req_len, "request id")))
        return rc;
    if ((rc = skey_set(&h, feature->mm_hash, feature->mm_hash_len, "mm_hash")))
        return rc;
    sreq *r = req_find(s, &id);
    uint32_t f = 0; /* which of its features this is, for the "<request_id>:<index>" fallback */
    while (r && f < r->n && !(r->own[f] != NONE && ec_key_eq(&s->x[r->own[f]].h, &h)))
        f++;
    if ((rc = feature_keys(req_id, req_len, feature, f, &t, &h)))
        return rc;
    xfer *x = find_t(s, &t);
    /* the bytes were gathered: the shards release the reservation at once (the item itself
     * stays in the encoder cache, so the record stays READY and becomes RESIDENT when the
     * cache evicts it). A transfer never loaded is released too when another transfer of the
     * item serves it (READY, LOADING or RESIDENT): nothing will ever load it. It is kept only
     * when the engine's own encoder cache holds the item (a local hit: the engine says so with
     * cache_added / cache_freed) and no other transfer does, for a load after that copy is
     * evicted; otherwise its consumer memory would stay held until the lease expires. */
    if (x && x->state == KVT_ECT_READY) {
        queue_cancel(s, x);
    } else if (x && (x->state == KVT_ECT_AVAILABLE || x->state == KVT_ECT_WAITING) &&
               (!mirror_has(s, &h) ||
                oldest_of(s, &h,
                          BIT(KVT_ECT_READY) | BIT(KVT_ECT_LOADING) | BIT(KVT_ECT_RESIDENT))) &&
               !bound_by_other(s, r, xi(s, x))) {
        finish_x(s, x, KVT_ECT_CANCELLED, true);
    }
    return 0;
}

/* A finished request lets go of transfer x (no other request binds it). */
static void let_go(kvt_ec_sched *s, xfer *x)
{
    if (x->state == KVT_ECT_RESIDENT)
        return; /* the shards' pools serve later loads */
    if (x->state == KVT_ECT_LOADING && !x->queued) {
        /* its spec went to the ranks, who may be loading it right now: what they place is
         * released on arrival (on_loaded), or the record fails at its deadline */
        x->orphan = true;
        return;
    }
    if (x->state == KVT_ECT_READY && mirror_has(s, &x->h)) {
        queue_cancel(s, x); /* in the engine's encoder cache: only the reservation goes */
        return;
    }
    if (x->state == KVT_ECT_READY) /* loaded, but the engine never took it: the ranks drop it */
        (void)list_push(&s->freed, &s->n_freed, &s->cap_freed, &x->h);
    finish_x(s, x, KVT_ECT_CANCELLED, true);
}

int kvt_ec_sched_request_finished(kvt_ec_sched *s, const char *req_id, uint32_t req_len)
{
    return kvt_ec_sched_request_finished_bound(s, req_id, req_len, NULL, 0);
}

int kvt_ec_sched_request_finished_bound(kvt_ec_sched *s, const char *req_id, uint32_t req_len,
                                        const kvt_ec_feature *bindings, uint32_t n)
{
    ec_key id;
    int rc = skey_set(&id, req_id, req_len, "request id");
    if (rc)
        return rc;
    if (n && !bindings)
        return kvt_fail(KVT_EINVAL, "ec sched: request_finished: NULL bindings");
    if (n > MAX_FEATURES)
        return kvt_fail(KVT_ELIMIT, "ec sched: %u bindings (at most %u)", n, MAX_FEATURES);
    for (uint32_t f = 0; f < n; f++) { /* validate everything first */
        ec_key t;
        if (bindings[f].transfer_id_len &&
            (rc =
                 skey_set(&t, bindings[f].transfer_id, bindings[f].transfer_id_len, "transfer id")))
            return rc;
    }
    sreq *r = req_find(s, &id);
    for (uint32_t f = 0; r && f < r->n; f++) {
        /* its own transfer, and one it borrowed (whose owner may have finished first: the last
         * request that holds a transfer lets it go, or it would stay READY with nobody left,
         * its shard entry pinned); one another request borrowed or waits for survives */
        for (int k = 0; k < 2; k++) {
            uint32_t idx = k ? r->used_[f] : r->own[f];
            if (idx == NONE || (k && idx == r->own[f]) || !s->x[idx].used || terminal(&s->x[idx]))
                continue;
            if (!bound_by_other(s, r, idx))
                let_go(s, &s->x[idx]);
        }
    }
    /* the request's bindings: transfers ensure never saw (a request aborted before it) are
     * cancelled on the shards too, and a tombstone answers their readiness later */
    for (uint32_t f = 0; f < n; f++) {
        if (!bindings[f].transfer_id_len)
            continue;
        ec_key t;
        (void)skey_set(&t, bindings[f].transfer_id, bindings[f].transfer_id_len, "transfer id");
        xfer *x = find_t(s, &t);
        if (x && (terminal(x) || bound_by_other(s, r, xi(s, x))))
            continue;
        if (x) {
            let_go(s, x);
            continue;
        }
        int err;
        if ((x = x_new(s, &t, NULL, ST_PARTIAL, &err)))
            finish_x(s, x, KVT_ECT_CANCELLED, true);
    }
    if (!r)
        return 0;
    kvi_map_remove(&s->by_req, id.hash, (uint32_t)(r - s->r));
    r->used = false;
    kvi_slot_give(s->r, &s->free_r, sizeof(sreq), offsetof(sreq, free_next), (uint32_t)(r - s->r));
    return 0;
}

/* ---- step ----------------------------------------------------------------------------------- */

int kvt_ec_sched_build_meta(kvt_ec_sched *s, kvt_ec_meta *out)
{
    if (!out)
        return kvt_fail(KVT_EINVAL, "ec sched: build_meta: NULL out");
    kvt_ec_meta_clear(out);
    int rc = 0;
    for (uint32_t k = 0; k < s->n_loadq && !rc; k++) {
        xfer *x = &s->x[s->loadq[k]];
        if (!x->used || !x->queued || x->state != KVT_ECT_LOADING)
            continue;
        kvt_ec_load_spec sp;
        memset(&sp, 0, sizeof(sp));
        sp.mm_hash = (kvt_str){x->h.s, x->h.len};
        sp.nbytes = x->nbytes;
        sp.ndim = x->ndim;
        memcpy(sp.shape, x->shape, x->ndim * sizeof(uint64_t));
        sp.dtype = (kvt_str){x->dtype, (uint32_t)strlen(x->dtype)};
        sp.transfer_id = (kvt_str){x->t.s, x->t.len};
        sp.local = x->local;
        if (!(rc = kvt_ec_meta_add_load(out, &sp)))
            x->queued = false;
    }
    if (rc) /* what did not fit stays queued (emitted ones are skipped next time) */
        return kvi_fail_wrap(rc, "ec sched: build_meta");
    s->n_loadq = 0;
    out->has_freed = true;
    for (uint32_t i = 0; i < s->n_freed && !rc; i++)
        rc = kvt_ec_meta_add_freed(out, s->freed[i].s, s->freed[i].len);
    if (rc)
        return kvi_fail_wrap(rc, "ec sched: build_meta");
    s->n_freed = 0;
    return 0;
}

static void each_in(kvt_ec_sched *s, const kvt_strset *set, void (*fn)(kvt_ec_sched *, ec_key *))
{
    for (uint32_t i = 0; i < set->n; i++) {
        ec_key h;
        if (skey_set(&h, set->items[i].ptr, set->items[i].len, "mm_hash") == 0)
            fn(s, &h);
    }
}

static void on_loaded(kvt_ec_sched *s, ec_key *h)
{
    xfer *x = oldest_of(s, h, BIT(KVT_ECT_LOADING));
    if (x) {
        x->state = KVT_ECT_READY;
        x->queued = false;
        x->deadline = UINT64_MAX;
        s->st.loaded++;
        if (x->orphan) { /* its requests finished meanwhile: the ranks release it again */
            x->orphan = false;
            if (!mirror_has(s, h))
                (void)list_push(&s->freed, &s->n_freed, &s->cap_freed, h);
            finish_x(s, x, KVT_ECT_CANCELLED, true);
        }
    }
}

static void on_failed_load(kvt_ec_sched *s, ec_key *h)
{
    xfer *x = oldest_of(s, h, BIT(KVT_ECT_LOADING));
    if (x) {
        s->st.failed_loads++;
        finish_x(s, x, KVT_ECT_FAILED, true);
    }
}

static void on_reclaimed(kvt_ec_sched *s, ec_key *h)
{
    for (uint32_t i = 0; i < s->n_x; i++) {
        xfer *x = &s->x[i];
        if (!x->used || !ec_key_eq(&x->h, h))
            continue;
        if (x->state == KVT_ECT_READY)
            x->has_spec = false; /* it will expire instead of becoming resident */
        else if (x->state == KVT_ECT_RESIDENT)
            finish_x(s, x, KVT_ECT_EXPIRED, true);
    }
}

int kvt_ec_sched_apply_output(kvt_ec_sched *s, const kvt_ec_worker_meta *agg)
{
    if (!agg)
        return kvt_fail(KVT_EINVAL, "ec sched: apply_output: NULL report");
    int rc = kvt_ec_worker_meta_validate(agg);
    if (rc)
        return kvi_fail_wrap(rc, "ec sched: apply_output");
    each_in(s, &agg->loaded, on_loaded);
    each_in(s, &agg->failed_loads, on_failed_load);
    each_in(s, &agg->reclaimed, on_reclaimed);
    for (uint32_t i = 0; i < agg->failed_saves.n; i++) {
        ec_key id;
        if (skey_set(&id, agg->failed_saves.items[i].ptr, agg->failed_saves.items[i].len,
                     "request id"))
            continue;
        sreq *r = req_find(s, &id);
        if (r)
            fail_request(s, r);
        else
            (void)list_push(&s->unavail, &s->n_unavail, &s->cap_unavail, &id);
    }
    return 0;
}

void kvt_ec_sched_expire(kvt_ec_sched *s)
{
    uint64_t t = now(s);
    for (uint32_t i = 0; i < s->n_x; i++) {
        xfer *x = &s->x[i];
        if (!x->used || terminal(x) || x->deadline > t)
            continue;
        switch (x->state) {
        case KVT_ECT_AVAILABLE:
            finish_x(s, x, KVT_ECT_EXPIRED, true);
            break;
        case KVT_ECT_LOADING: /* it never reported back */
            finish_x(s, x, KVT_ECT_UNAVAILABLE, true);
            break;
        case KVT_ECT_WAITING: /* no push arrived: no RPC, the request fails */
            finish_x(s, x, KVT_ECT_UNAVAILABLE, false);
            break;
        case ST_PARTIAL:
            x_free(s, x);
            break;
        default:
            break;
        }
    }
    while (s->tombs.head != NONE && s->x[s->tombs.head].deadline <= t)
        x_free(s, &s->x[s->tombs.head]);
}

static uint32_t take_list(ec_key *l, uint32_t *n, char (*out)[KVT_EC_KEY_MAX + 1], uint32_t cap)
{
    uint32_t k = *n < cap ? *n : cap;
    if (k == 0)
        return 0;
    for (uint32_t i = 0; i < k; i++)
        memcpy(out[i], l[i].s, l[i].len + 1);
    memmove(l, l + k, (*n - k) * sizeof(ec_key));
    *n -= k;
    return k;
}

uint32_t kvt_ec_sched_take_unavailable(kvt_ec_sched *s, char (*out)[KVT_EC_KEY_MAX + 1],
                                       uint32_t cap)
{
    return take_list(s->unavail, &s->n_unavail, out, cap);
}

uint32_t kvt_ec_sched_take_cancels(kvt_ec_sched *s, char (*out)[KVT_EC_KEY_MAX + 1], uint32_t cap)
{
    return take_list(s->cancels, &s->n_cancels, out, cap);
}

int kvt_ec_sched_state(const kvt_ec_sched *s, const char *tid, uint32_t len)
{
    ec_key t;
    if (skey_set(&t, tid, len, "transfer id"))
        return KVT_ECT_NONE;
    const xfer *x = find_t(s, &t);
    return !x || x->state == ST_PARTIAL ? KVT_ECT_NONE : x->state;
}

void kvt_ec_sched_get_stats(const kvt_ec_sched *s, kvt_ec_sched_stats *st)
{
    if (!kvi_stats_begin(s, st, sizeof(*st)))
        return;
    *st = s->st;
    memset(st->transfers, 0, sizeof(st->transfers));
    for (uint32_t i = 0; i < s->n_x; i++)
        if (s->x[i].used && s->x[i].state <= KVT_ECT_CANCELLED)
            st->transfers[s->x[i].state]++;
    st->requests = s->by_req.count;
}

int kvt_ec_sched_prometheus(const kvt_ec_sched *s, char *buf, size_t cap, size_t *len)
{
    if (!s || !len || (cap && !buf))
        return kvt_fail(KVT_EINVAL, "ec sched: prometheus: NULL argument");
    kvt_ec_sched_stats st;
    kvt_ec_sched_get_stats(s, &st);
    kvi_prom p = {buf, cap, 0};
    const struct {
        const char *name, *help;
        uint64_t v;
    } m[] = {
        {"ready_events_total", "Shard readiness events observed.", st.ready_events},
        {"ready_ignored_total", "Readiness events for finished, colliding or ready transfers.",
         st.ready_ignored},
        {"abandoned_total", "Abandoned-push notices observed.", st.abandoned},
        {"loads_started_total", "Load specs queued.", st.loads_started},
        {"local_loads_total", "Loads served from the shards' resident pools.", st.local_loads},
        {"loaded_total", "Transfers ready on every rank.", st.loaded},
        {"failed_loads_total", "Transfers a rank failed to load.", st.failed_loads},
        {"unavailable_total", "Requests failed (timeouts, abandoned pushes, collisions).",
         st.unavailable},
        {"cancels_total", "Cancels queued for the shards.", st.cancels},
    };
    for (size_t i = 0; i < sizeof(m) / sizeof(m[0]); i++)
        kvi_prom_metric(&p, "kvtier_ec_sched", m[i].name, m[i].help, false, m[i].v);
    kvi_prom_metric(&p, "kvtier_ec_sched", "requests", "Requests tracked.", true, st.requests);
    static const char *const names[] = {"none",    "waiting",  "available", "loading",
                                        "ready",   "resident", "failed",    "unavailable",
                                        "expired", "cancelled"};
    kvi_prom_family(&p, "kvtier_ec_sched", "transfers", "Transfer records by state.", true);
    for (int i = KVT_ECT_WAITING; i <= KVT_ECT_CANCELLED; i++)
        kvi_prom_sample(&p, "kvtier_ec_sched", "transfers", "state", names[i], st.transfers[i]);
    return kvi_prom_finish(&p, len, "ec sched");
}
