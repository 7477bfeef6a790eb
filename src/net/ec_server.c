/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The consumer shard's control server (include/kvtier/ec_net.h, spec §4.1).
 *
 * One thread per shard loops:
 *   1. under the lock: take the shard's new events into a bounded ring (oldest dropped and
 *      counted when nobody pulls), run the TTL pass every expire_interval;
 *   2. push what the ring holds with non-blocking sends until ZeroMQ would block;
 *   3. wait up to poll_ms for a request, decode it (a REP socket must always answer: a request
 *      that does not decode gets {code: KVT_EPROTO, "malformed control request: ..."}), run
 *      it on the shard under the lock, reply.
 * The sockets are the thread's alone; the lock guards the shard, which the engine's worker
 * reaches through kvt_ec_server_apply.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "base/error.h"
#include "base/util.h"
#include "base/fd.h"
#include "base/log.h"
#include "base/map.h"
#include "base/ring.h"
#include "net/ec_ctl.h"
#include "net/ec_server_internal.h"
#include "ec/shard_internal.h"
#include "net/spin.h"
#include "net/ucx.h"
#include "kvtier/ec_net.h"

#define NONE UINT32_MAX

/* A receive posted on a writer's region, by reservation id. */
typedef struct rx {
    bool used;
    char rid[KVT_EC_RID_LEN + 1];
    char tid[KVT_EC_KEY_MAX + 1];
    kvi_ucx_recv *r;
    uint64_t nbytes;
    bool complete_pending; /* its writer completed before the bytes landed: complete on landing */
    uint32_t pend_at;      /* its place in the server's pending list */
    uint32_t next_free;
} rx;

struct kvt_ec_server {
    kvt_ec_server_config cfg;
    kvt_ec_shard *shard;
    pthread_mutex_t lock;
    pthread_t thread;
    atomic_bool stop;
    void *ctx, *rep, *push;
    uint32_t port, event_port; /* event_port: 0 for a unix socket (event_ep) */
    char event_ep[320];
    bool event_file; /* event_ep is a unix socket this server bound: removed at teardown */
    /* event ring (the thread's) */
    kvi_ring ring; /* kvt_ec_ready_event */
    /* codec state (the thread's) */
    kvi_ecc_request req;
    kvi_ecc_reply rep_msg;
    uint8_t *out;
    size_t out_cap;
    uint64_t next_expire;
    pthread_mutex_t st_lock;
    kvt_ec_server_stats st;
    /* data plane (the thread's) */
    kvi_ucx *ucx;
    int efd;
    rx *rx;
    kvi_map rx_map;
    uint32_t rx_free;
    uint32_t n_pending; /* receives with complete_pending ... */
    kvi_spin spin;      /* after UCX's last progress: poll without sleeping how long */
    uint32_t *pend;     /* ... listed here (so a pass looks at them alone, not at every slot) */
    /* the consumer's owner key, and whether this server wrote it to the key file */
    char owner[KVT_EC_RID_LEN + 1];
    bool owner_file;
    kvi_ecc_zap zap; /* CURVE with an allowlist: its handler (ec_curve.c) */
};

static void teardown(kvt_ec_server *s);

void kvt_ec_server_config_init(kvt_ec_server_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->tp_size = 1;
    cfg->max_events = 4096;
    cfg->expire_interval_ns = 1000000000ull;
    cfg->poll_ms = 100;
    cfg->spin_us = 300;
    cfg->data_plane = true;
    cfg->complete_wait_ms = 2000;
    cfg->max_receives = 4096;
}

static int zfail(const char *what, const char *endpoint)
{
    return kvt_fail(KVT_EIO, "ec server: %s %s: %s", what, endpoint ? endpoint : "",
                    zmq_strerror(zmq_errno()));
}

/* tcp://host:port, with brackets around an IPv6 address. */
static int endpoint(char *buf, size_t cap, const char *host, uint32_t port)
{
    bool v6 = strchr(host, ':') != NULL;
    int n = port ? snprintf(buf, cap, v6 ? "tcp://[%s]:%u" : "tcp://%s:%u", host, port)
                 : snprintf(buf, cap, v6 ? "tcp://[%s]:*" : "tcp://%s:*", host);
    if (n < 0 || (size_t)n >= cap)
        return kvt_fail(KVT_EINVAL, "ec server: host name too long");
    return 0;
}

static int check_config(const kvt_ec_server_config *c)
{
    if (!c->host || !c->host[0])
        return kvt_fail(KVT_EINVAL, "ec server: no host to bind (give an address; \"0.0.0.0\" "
                                    "binds every interface)");
    if (c->tp_size < 1 || c->tp_size > KVT_EC_MAX_SHARDS || c->tp_rank >= c->tp_size)
        return kvt_fail(KVT_EINVAL, "ec server: rank %u of %u shards (at most %u)", c->tp_rank,
                        c->tp_size, KVT_EC_MAX_SHARDS);
    uint64_t last = (uint64_t)c->base_port + (uint64_t)c->dp_index * c->tp_size + c->tp_size - 1;
    if (c->base_port < 1 || last > 65535)
        return kvt_fail(KVT_ERANGE,
                        "ec server: ports %u + %u x %u + rank run past 65535 (or base is 0)",
                        c->base_port, c->dp_index, c->tp_size);
    if (c->max_events < 1 || c->max_events > (1u << 20) || c->poll_ms < 1 || c->poll_ms > 10000 ||
        c->expire_interval_ns == 0)
        return kvt_fail(KVT_EINVAL, "ec server: max_events 1..2^20, poll_ms 1..10000 and a "
                                    "non-zero expire interval");
    if (c->data_plane && (c->max_receives < 1 || c->max_receives > (1u << 24)))
        return kvt_fail(KVT_EINVAL, "ec server: max_receives 1..2^24");
    if (c->spin_us > 100000)
        return kvt_fail(KVT_EINVAL, "ec server: spin_us 0..100000");
    if (c->owner_key && kvi_ecc_key_check(c->owner_key))
        return kvt_fail(KVT_EINVAL, "ec server: owner_key is not 32 lowercase hex digits");
    if (c->event_host && !c->event_host[0])
        return kvt_fail(KVT_EINVAL, "ec server: an empty event_host (NULL: a unix socket of this "
                                    "user)");
    if (c->event_host && !c->curve_secret_key)
        return kvt_fail(KVT_EINVAL,
                        "ec server: event_host %s needs CURVE (curve_secret_key and "
                        "curve_clients): without it, whoever connects takes readiness events",
                        c->event_host);
    return 0;
}

static uint32_t shard_port(const kvt_ec_server_config *c, uint32_t rank)
{
    return c->base_port + c->dp_index * c->tp_size + rank;
}

/* ---- handling one request ------------------------------------------------------------------ */

static void fill_error(kvi_ecc_result *x, int rc)
{
    memset(x, 0, sizeof(*x));
    x->code = rc;
    const char *m = kvt_last_error();
    x->error = (kvt_str){m[0] ? m : "failed", (uint32_t)(m[0] ? strlen(m) : 6)};
}

/* ---- data plane: receives on writers' regions --------------------------------------------- */

static void count(kvt_ec_server *s, uint64_t *field, uint64_t n)
{
    pthread_mutex_lock(&s->st_lock);
    *field += n;
    pthread_mutex_unlock(&s->st_lock);
}

static uint32_t rx_find(const kvt_ec_server *s, const char *rid)
{
    uint64_t h = kvi_ecc_rid_tag(rid), pos = kvi_map_probe_start(&s->rx_map, h);
    uint32_t v;
    while (kvi_map_probe_next(&s->rx_map, h, &pos, &v))
        if (strcmp(s->rx[v].rid, rid) == 0)
            return v;
    return NONE;
}

static void pend_add(kvt_ec_server *s, uint32_t i)
{
    s->rx[i].complete_pending = true;
    s->rx[i].pend_at = s->n_pending;
    s->pend[s->n_pending++] = i;
}

static void pend_del(kvt_ec_server *s, uint32_t i)
{
    if (!s->rx[i].complete_pending)
        return;
    uint32_t at = s->rx[i].pend_at, last = s->pend[--s->n_pending];
    s->pend[at] = last;
    s->rx[last].pend_at = at;
    s->rx[i].complete_pending = false;
}

static void rx_remove(kvt_ec_server *s, uint32_t i)
{
    pend_del(s, i);
    (void)kvi_map_remove(&s->rx_map, kvi_ecc_rid_tag(s->rx[i].rid), i);
    s->rx[i].used = false;
    s->rx[i].r = NULL;
    s->rx[i].next_free = s->rx_free;
    s->rx_free = i;
}

/* A writer got [ptr, +nbytes): its bytes may only land there, through a receive posted now. */
static int rx_post(kvt_ec_server *s, const char *tid, uint32_t tid_len, const kvt_ec_reply *r)
{
    if (rx_find(s, r->reservation_id) != NONE)
        return 0; /* a repeated reserve: its receive is already posted */
    if (!r->ptr)
        return kvt_fail(KVT_ESTATE, "ec server: the data plane needs a shard with a buffer");
    if (s->rx_free == NONE)
        return kvt_fail(KVT_ELIMIT, "ec server: %u receives already posted (max_receives)",
                        s->cfg.max_receives);
    kvi_ucx_recv *q;
    int rc = kvi_ucx_recv_post(s->ucx, r->ptr, r->nbytes, kvi_ecc_rid_tag(r->reservation_id), &q);
    if (rc)
        return rc;
    uint32_t i = s->rx_free;
    s->rx_free = s->rx[i].next_free;
    s->rx[i].used = true;
    s->rx[i].r = q;
    s->rx[i].nbytes = r->nbytes;
    memcpy(s->rx[i].rid, r->reservation_id, sizeof(s->rx[i].rid));
    memcpy(s->rx[i].tid, tid, tid_len);
    s->rx[i].tid[tid_len] = 0;
    (void)kvi_map_insert(&s->rx_map, kvi_ecc_rid_tag(r->reservation_id), i); /* room: rx_free */
    count(s, &s->st.receives_posted, 1);
    return 0;
}

/* A receive whose bytes all arrived: it ends, and its writer's completion may go ahead. */
static void rx_finish(kvt_ec_server *s, uint32_t i)
{
    (void)kvi_ucx_recv_end(s->ucx, s->rx[i].r, 0);
    count(s, &s->st.receives_done, 1);
    count(s, &s->st.bytes_received, s->rx[i].nbytes);
    rx_remove(s, i);
}

/* complete(T, rid) on the network. Never waits: bytes that have landed complete the
 * reservation now; bytes still arriving are answered pending, and the server completes the
 * reservation itself when they land (finish_pending), so one message naming an unlanded
 * reservation thousands of times costs thousands of lookups, not thousands of timeouts. */
static int complete_item(kvt_ec_server *s, const kvi_ecc_item *it, kvi_ecc_result *x)
{
    const char *rid = it->reservation_id.ptr;
    uint32_t i = s->ucx ? rx_find(s, rid) : NONE;
    if (i != NONE && strcmp(s->rx[i].tid, it->transfer_id.ptr) != 0)
        return 0;    /* a receive of another transfer: not this reservation (not accepted) */
    if (i != NONE) { /* (UCX was progressed once for the whole request: handle) */
        int rc = kvi_ucx_recv_wait(s->ucx, s->rx[i].r, 0);
        if (rc < 0) {
            count(s, &s->st.receives_failed, 1);
            return rc; /* the writer abandons next: the receive ends then */
        }
        if (rc == 0) {
            if (!s->rx[i].complete_pending) {
                pend_add(s, i);
                count(s, &s->st.completes_pending, 1);
            }
            x->completed = x->pending = true;
            return 0;
        }
        rx_finish(s, i);
    }
    /* landed, a follower, or no receive of ours (a forged or stale id: the shard decides) */
    return kvt_ec_shard_complete(s->shard, it->transfer_id.ptr, it->transfer_id.len, rid,
                                 &x->completed, &x->became_ready);
}

/* Completions answered pending whose bytes have landed since: complete them now (the shard
 * queues the readiness event). Under the lock. */
static void finish_pending(kvt_ec_server *s)
{
    for (uint32_t k = 0; k < s->n_pending;) { /* a finished one leaves: k then holds another */
        uint32_t i = s->pend[k];
        rx *e = &s->rx[i];
        int rc = kvi_ucx_recv_wait(s->ucx, e->r, 0);
        if (rc == 0) {
            k++;
            continue;
        }
        if (rc < 0) { /* never landing: the writer abandons, or the reaper ends it at its TTL */
            count(s, &s->st.receives_failed, 1);
            pend_del(s, i);
            continue;
        }
        char tid[KVT_EC_KEY_MAX + 1], rid[KVT_EC_RID_LEN + 1];
        memcpy(tid, e->tid, sizeof(tid));
        memcpy(rid, e->rid, sizeof(rid));
        rx_finish(s, i);
        bool accepted, ready;
        if (kvt_ec_shard_complete(s->shard, tid, (uint32_t)strlen(tid), rid, &accepted, &ready))
            KVT_LOG_W("ec server port %u: completing %s: %s", s->port, tid, kvt_last_error());
    }
}

/* Before an abandon: the receive on the writer's region ends first (UCX lets go of it), or the
 * abandon is refused and the memory stays the writer's. */
static int rx_end(kvt_ec_server *s, const kvi_ecc_item *it)
{
    uint32_t i = rx_find(s, it->reservation_id.ptr); /* an abandon always names its id */
    if (i == NONE || strcmp(s->rx[i].tid, it->transfer_id.ptr) != 0)
        return 0;
    int rc = kvi_ucx_recv_end(s->ucx, s->rx[i].r, 2000);
    if (rc < 0)
        return rc;
    count(s, &s->st.receives_cancelled, 1);
    rx_remove(s, i);
    return 0;
}

/* A writer past its TTL (EXPIRE_PENDING) that never sent its bytes: a producer that died or
 * lost its way. Its memory may be released only once nobody can write it any more, and with
 * tagged receives that moment is known: when UCX has given the cancelled receive back, no
 * byte can land in the region. So the receive is cancelled (one that is under way is left to
 * finish and looked at again next pass), then the reservation abandoned: the region is free,
 * the waiting request fails at once (abandoned event) and a late completion is rejected. */
static void reap_dead_writers(kvt_ec_server *s)
{
    static _Thread_local kvt_ec_status st;
    uint64_t reaped = 0;
    for (uint32_t i = 0; i < s->cfg.max_receives; i++) {
        rx *e = &s->rx[i];
        if (!e->used || kvt_ec_shard_status(s->shard, e->tid, (uint32_t)strlen(e->tid), &st) != 1 ||
            st.state != KVT_EC_EXPIRE_PENDING || strcmp(st.reservation_id, e->rid) != 0)
            continue;
        if (kvi_ucx_recv_wait(s->ucx, e->r, 0) == 1)
            continue; /* the bytes are there: its completion is on the way */
        int rc = kvi_ucx_recv_end(s->ucx, e->r, 0);
        if (rc < 0)
            continue; /* a receive under way: looked at again next pass */
        rx_remove(s, i);
        if (rc == 1)
            continue; /* landed while being cancelled: the completion is trusted */
        bool done;
        (void)kvt_ec_shard_cancel(s->shard, e->tid, (uint32_t)strlen(e->tid), e->rid, true, false,
                                  &done);
        KVT_LOG_W("ec server port %u: writer of %s expired without its bytes; receive cancelled, "
                  "memory released",
                  s->port, e->tid);
        reaped++;
    }
    if (reaped)
        count(s, &s->st.writers_reaped, reaped);
}

/* STATUS: what the shard knows of the transfer (never its reservation id: a capability of
 * its client alone). */
static int status_item(kvt_ec_server *s, const kvi_ecc_item *it, kvi_ecc_result *x)
{
    static _Thread_local kvt_ec_status st;
    int rc = kvt_ec_shard_status(s->shard, it->transfer_id.ptr, it->transfer_id.len, &st);
    if (rc != 1)
        return rc;
    x->found = true;
    x->mm_hash = (kvt_str){st.mm_hash, (uint32_t)strlen(st.mm_hash)};
    x->ready = st.ready;
    x->nbytes = st.nbytes;
    x->ndim = st.ndim;
    memcpy(x->shape, st.shape, sizeof(x->shape));
    x->dtype = (kvt_str){st.dtype, (uint32_t)strlen(st.dtype)};
    return 0;
}

/* RESERVE: the shard's answer, and for a writer the receive of exactly its region posted
 * (no receive, no writer: the reservation is given back before anyone writes). */
static int reserve_item(kvt_ec_server *s, const kvi_ecc_item *it, kvi_ecc_result *x)
{
    static _Thread_local kvt_ec_reply r;
    kvt_ec_item item = {it->mm_hash.ptr, it->mm_hash.len, it->nbytes, it->ndim, {0},
                        it->dtype.ptr,   it->dtype.len};
    memcpy(item.shape, it->shape, sizeof(item.shape));
    int rc = kvi_ec_shard_reserve_as(s->shard, it->transfer_id.ptr, it->transfer_id.len, &item,
                                     it->client_key.ptr, &r);
    if (rc == KVT_EEXIST)
        count(s, &s->st.refused, 1);
    if (!rc && r.write && s->ucx &&
        (rc = rx_post(s, it->transfer_id.ptr, it->transfer_id.len, &r))) {
        char msg[512];
        bool done;
        snprintf(msg, sizeof(msg), "%s", kvt_last_error());
        (void)kvt_ec_shard_cancel(s->shard, it->transfer_id.ptr, it->transfer_id.len,
                                  r.reservation_id, true, false, &done);
        return kvt_fail(rc, "%s", msg);
    }
    if (rc)
        return rc;
    x->reservation_id = (kvt_str){r.reservation_id, (uint32_t)strlen(r.reservation_id)};
    x->offset = r.offset;
    x->nbytes = r.nbytes;
    x->tag = kvi_ecc_rid_tag(r.reservation_id);
    x->write = r.write;
    x->ready = r.ready;
    x->cached = r.cached;
    x->cancelled = r.cancelled;
    return 0;
}

/* CANCEL: without a reservation id only the consumer's own scheduler, who must show the owner
 * key (no one else may cancel a transfer or plant a tombstone ahead of its producer). */
static int cancel_item(kvt_ec_server *s, const kvi_ecc_item *it, kvi_ecc_result *x)
{
    if (it->reservation_id.len == 0 && !kvi_ecc_key_equal(it->client_key.ptr, s->owner)) {
        count(s, &s->st.refused, 1);
        return kvt_fail(KVT_EINVAL, "ec server: a cancel without reservation id needs the "
                                    "consumer's owner key");
    }
    int rc = 0;
    if (!s->ucx || !it->abandon || !(rc = rx_end(s, it)))
        rc = kvt_ec_shard_cancel(s->shard, it->transfer_id.ptr, it->transfer_id.len,
                                 it->reservation_id.len ? it->reservation_id.ptr : NULL,
                                 it->abandon, it->refresh, &x->cancelled);
    return rc;
}

static int do_item(kvt_ec_server *s, uint32_t op, const kvi_ecc_item *it, kvi_ecc_result *x)
{
    int rc = 0;
    memset(x, 0, sizeof(*x));
    switch (op) {
    case KVT_ECC_STATUS:
        rc = status_item(s, it, x);
        break;
    case KVT_ECC_RESERVE:
    case KVT_ECC_RESERVE_BATCH:
        rc = reserve_item(s, it, x);
        break;
    case KVT_ECC_COMPLETE:
    case KVT_ECC_COMPLETE_BATCH:
        rc = complete_item(s, it, x);
        break;
    case KVT_ECC_CANCEL:
    case KVT_ECC_CANCEL_BATCH:
        rc = cancel_item(s, it, x);
        break;
    }
    if (rc < 0)
        fill_error(x, rc);
    return rc < 0 ? rc : 0;
}

/* Runs a decoded request; the reply is built in s->rep_msg. */
static int handle(kvt_ec_server *s)
{
    const kvi_ecc_request *q = &s->req;
    kvi_ecc_reply *p = &s->rep_msg;
    kvi_ecc_reply_begin(p, q->op);
    if (q->op == KVT_ECC_PEERS) {
        p->n_ports = s->cfg.tp_size;
        for (uint32_t r = 0; r < s->cfg.tp_size; r++)
            p->ports[r] = shard_port(&s->cfg, r);
        return 0;
    }
    if (q->op == KVT_ECC_EVENT_PORT) {
        p->port = s->event_port;
        return 0;
    }
    if (q->op == KVT_ECC_DATA_ADDRESS) {
        const void *a;
        size_t n;
        if (!s->ucx)
            return kvt_fail(KVT_EUNSUPPORTED, "ec server: this shard runs without a data plane");
        (void)kvi_ucx_address(s->ucx, &a, &n);
        return kvi_ecc_reply_set_address(p, a, (uint32_t)n);
    }
    uint64_t errors = 0;
    if (s->ucx && (q->op == KVT_ECC_COMPLETE || q->op == KVT_ECC_COMPLETE_BATCH))
        while (kvi_ucx_progress(s->ucx)) /* what has arrived, once per request (no waiting) */
            ;
    pthread_mutex_lock(&s->lock);
    for (uint32_t i = 0; i < q->n; i++) {
        kvi_ecc_result x;
        errors += do_item(s, q->op, &q->items[i], &x) != 0;
        int rc = kvi_ecc_reply_add(p, &x); /* copies the strings out of the shard's buffers */
        if (rc) {
            pthread_mutex_unlock(&s->lock);
            return rc;
        }
    }
    pthread_mutex_unlock(&s->lock);
    pthread_mutex_lock(&s->st_lock);
    s->st.items += q->n;
    s->st.item_errors += errors;
    pthread_mutex_unlock(&s->st_lock);
    return 0;
}

/* Encodes s->rep_msg into s->out; the encoded length in *len. */
static int encode_reply(kvt_ec_server *s, size_t *len)
{
    size_t need = kvi_ecc_reply_encoded_size(&s->rep_msg);
    if (need > s->out_cap) {
        uint8_t *b = realloc(s->out, need);
        if (!b)
            return kvt_fail(KVT_ENOMEM, "ec server: out of memory for a %zu-byte reply", need);
        s->out = b;
        s->out_cap = need;
    }
    return kvi_ecc_reply_encode(&s->rep_msg, s->out, s->out_cap, len);
}

/* One request's bytes (or rc: a request that could not even be received whole) to its
 * encoded reply in s->out: whatever the bytes, the answer is a reply (an error one for what
 * does not decode). Used by the socket loop and, without sockets, by the fuzzer. */
static int answer(kvt_ec_server *s, const void *buf, size_t len, int rc, size_t *out_len)
{
    if (!rc)
        rc = kvi_ecc_request_decode(&s->req, buf, len);
    pthread_mutex_lock(&s->st_lock);
    s->st.requests++;
    s->st.malformed += rc != 0;
    pthread_mutex_unlock(&s->st_lock);
    if (rc) {
        char msg[600];
        snprintf(msg, sizeof(msg), "malformed control request: %s", kvt_last_error());
        KVT_LOG_W("ec server port %u: %s", s->port, msg);
        kvi_ecc_reply_begin(&s->rep_msg, KVT_ECC_PEERS);
        (void)kvi_ecc_reply_fail(&s->rep_msg, KVT_EPROTO, msg);
    } else if ((rc = handle(s))) {
        uint32_t op = s->req.op;
        char msg[600];
        snprintf(msg, sizeof(msg), "%s", kvt_last_error());
        kvi_ecc_reply_begin(&s->rep_msg, op);
        (void)kvi_ecc_reply_fail(&s->rep_msg, rc, msg);
    }
    if ((rc = encode_reply(s, out_len))) {
        /* a reply that cannot be encoded: say so in the smallest reply there is */
        KVT_LOG_W("ec server port %u: %s", s->port, kvt_last_error());
        kvi_ecc_reply_begin(&s->rep_msg, KVT_ECC_PEERS);
        (void)kvi_ecc_reply_fail(&s->rep_msg, KVT_EIO, "the server could not build its reply");
        rc = encode_reply(s, out_len);
    }
    return rc;
}

/* Answers one request; whatever goes wrong, the REP socket answers something. */
static void serve_one(kvt_ec_server *s)
{
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, s->rep, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&m);
        return; /* EAGAIN, or a message over ZMQ_MAXMSGSIZE (the peer is disconnected) */
    }
    bool more = zmq_msg_more(&m);
    int rc = more ? kvt_fail(KVT_EPROTO, "a request of more than one frame") : 0;
    while (more) { /* drain the other frames: REP answers the whole message once */
        zmq_msg_t t;
        zmq_msg_init(&t);
        more = zmq_msg_recv(&t, s->rep, 0) >= 0 && zmq_msg_more(&t);
        zmq_msg_close(&t);
    }
    size_t len = 0;
    rc = answer(s, zmq_msg_data(&m), zmq_msg_size(&m), rc, &len);
    zmq_msg_close(&m);
    if (rc || zmq_send(s->rep, s->out, len, 0) < 0) {
        KVT_LOG_W("ec server port %u: a reply could not be sent: %s", s->port,
                  rc ? kvt_last_error() : zmq_strerror(zmq_errno()));
        if (rc) /* a REP socket must answer before it can receive again */
            (void)zmq_send(s->rep, "", 0, 0);
    }
}

/* ---- without sockets (fuzzing) --------------------------------------------------------------- */

int kvi_ec_server_open_local(kvt_ec_shard *shard, kvt_ec_server **out)
{
    *out = NULL;
    kvt_ec_server *s = calloc(1, sizeof(*s));
    if (!s)
        return kvt_fail(KVT_ENOMEM, "ec server: out of memory");
    kvt_ec_server_config_init(&s->cfg);
    s->cfg.host = "127.0.0.1";
    s->cfg.base_port = 1;
    s->cfg.data_plane = false;
    s->shard = shard;
    s->port = 1;
    pthread_mutex_init(&s->lock, NULL);
    pthread_mutex_init(&s->st_lock, NULL);
    kvi_ecc_request_init(&s->req);
    kvi_ecc_reply_init(&s->rep_msg);
    int rc = kvi_ring_init(&s->ring, sizeof(kvt_ec_ready_event), s->cfg.max_events);
    if (!rc)
        rc = kvi_ecc_key_random(s->owner);
    if (rc) {
        teardown(s);
        return rc;
    }
    *out = s;
    return 0;
}

int kvi_ec_server_answer(kvt_ec_server *s, const void *req, size_t len, const uint8_t **reply,
                         size_t *reply_len)
{
    int rc = answer(s, req, len, 0, reply_len);
    *reply = s->out;
    return rc;
}

const char *kvi_ec_server_owner(const kvt_ec_server *s)
{
    return s->owner;
}

void kvi_ec_server_close_local(kvt_ec_server *s)
{
    if (s)
        teardown(s);
}

/* ---- events -------------------------------------------------------------------------------- */

static void collect_events(kvt_ec_server *s)
{
    kvt_ec_ready_event ev[32];
    uint32_t n, dropped = 0;
    while ((n = kvt_ec_shard_take_events(s->shard, ev, 32)) > 0)
        for (uint32_t i = 0; i < n; i++) {
            bool over = false; /* nobody pulls: the oldest goes */
            kvt_ec_ready_event *e = kvi_ring_push_over(&s->ring, &over);
            dropped += over || !e;
            if (e)
                *e = ev[i];
        }
    if (dropped) {
        KVT_LOG_W("ec server port %u: event backlog full, %u oldest events dropped", s->port,
                  dropped);
        pthread_mutex_lock(&s->st_lock);
        s->st.events_dropped += dropped;
        pthread_mutex_unlock(&s->st_lock);
    }
}

static void push_events(kvt_ec_server *s)
{
    uint8_t buf[2048];
    uint64_t sent = 0;
    while (kvi_ring_len(&s->ring)) {
        const kvt_ec_ready_event *e = KVI_RING_AT(&s->ring, kvt_ec_ready_event, 0);
        kvi_ecc_event m = {0};
        m.transfer_id = (kvt_str){e->transfer_id, (uint32_t)strlen(e->transfer_id)};
        m.mm_hash = (kvt_str){e->mm_hash, (uint32_t)strlen(e->mm_hash)};
        m.reservation_id = (kvt_str){e->reservation_id, (uint32_t)strlen(e->reservation_id)};
        m.dtype = (kvt_str){e->dtype, (uint32_t)strlen(e->dtype)};
        m.nbytes = e->nbytes;
        m.ndim = e->ndim;
        memcpy(m.shape, e->shape, sizeof(m.shape));
        m.abandoned = e->abandoned;
        m.shard = s->cfg.tp_rank;
        size_t len;
        if (kvi_ecc_event_encode(&m, buf, sizeof(buf), &len)) {
            KVT_LOG_E("ec server port %u: cannot encode an event: %s", s->port, kvt_last_error());
        } else if (zmq_send(s->push, buf, len, ZMQ_DONTWAIT) < 0) {
            if (zmq_errno() != EAGAIN)
                KVT_LOG_W("ec server port %u: event push: %s", s->port, zmq_strerror(zmq_errno()));
            break; /* no puller yet, or its queue is full: keep the rest */
        } else {
            sent++;
        }
        kvi_ring_drop(&s->ring, 1);
    }
    if (sent) {
        pthread_mutex_lock(&s->st_lock);
        s->st.events_sent += sent;
        pthread_mutex_unlock(&s->st_lock);
    }
}

/* A ZAP request waiting: answered, a refusal logged and counted. */
static void zap_one(kvt_ec_server *s)
{
    if (kvi_ecc_zap_answer(&s->zap))
        return;
    KVT_LOG_W("ec server port %u: refused a client whose CURVE key is not admitted", s->port);
    pthread_mutex_lock(&s->st_lock);
    s->st.clients_refused++;
    pthread_mutex_unlock(&s->st_lock);
}

static void *server_main(void *arg)
{
    kvt_ec_server *s = arg;
    while (!atomic_load(&s->stop)) {
        /* receives progress on their own (rendezvous needs the receiver), woken by UCX's fd;
         * progressed first, so that pending completions whose bytes landed finish now */
        if (s->ucx) {
            bool moved = false;
            while (kvi_ucx_progress(s->ucx))
                moved = true;
            if (moved)
                kvi_spin_busy(&s->spin);
        }
        pthread_mutex_lock(&s->lock);
        uint64_t now = kvt_monotonic_ns();
        if (s->n_pending)
            finish_pending(s);
        if (now >= s->next_expire) {
            kvt_ec_shard_expire(s->shard);
            if (s->ucx)
                reap_dead_writers(s);
            s->next_expire = now + s->cfg.expire_interval_ns;
        }
        collect_events(s);
        pthread_mutex_unlock(&s->lock);
        push_events(s);
        long timeout = (long)s->cfg.poll_ms;
        /* a burst goes on: poll without sleeping; otherwise arm UCX's descriptor (0 when events
         * are pending already: progress first) */
        if (s->ucx && (kvi_spin_idle(&s->spin, kvt_monotonic_ns()) || kvi_ucx_arm(s->ucx) != 0))
            timeout = 0;
        zmq_pollitem_t it[3] = {{s->rep, 0, ZMQ_POLLIN, 0},
                                {s->zap.sock, 0, ZMQ_POLLIN, 0},
                                {NULL, s->efd, ZMQ_POLLIN, 0}};
        int ni = 1;
        if (s->zap.sock)
            ni = 2;
        if (s->ucx)
            it[ni++] = (zmq_pollitem_t){NULL, s->efd, ZMQ_POLLIN, 0};
        int n = zmq_poll(it, ni, timeout);
        if (n > 0 && s->zap.sock && (it[1].revents & ZMQ_POLLIN))
            zap_one(s);
        if (n > 0 && (it[0].revents & ZMQ_POLLIN))
            serve_one(s);
        else if (n < 0 && zmq_errno() != EINTR) {
            KVT_LOG_E("ec server port %u: stopped serving: poll: %s", s->port,
                      zmq_strerror(zmq_errno()));
            break;
        }
    }
    return NULL;
}

/* ---- life cycle ---------------------------------------------------------------------------- */

static void teardown(kvt_ec_server *s)
{
    if (s->owner_file)
        kvi_ecc_owner_remove(s->port, s->owner);
    if (s->ucx) {
        /* every receive ends before the worker goes; UCX writes nothing after that */
        for (uint32_t i = 0; s->rx && i < s->cfg.max_receives; i++)
            if (s->rx[i].used && kvi_ucx_recv_end(s->ucx, s->rx[i].r, 2000) < 0)
                KVT_LOG_E("ec server port %u: %s", s->port, kvt_last_error());
        kvi_ucx_destroy(s->ucx);
    }
    free(s->rx);
    free(s->pend);
    kvi_map_free(&s->rx_map);
    kvi_ecc_zap_close(&s->zap);
    if (s->rep)
        zmq_close(s->rep);
    if (s->push)
        zmq_close(s->push);
    if (s->ctx)
        zmq_ctx_term(s->ctx);
    /* the event socket's file, in this user's private directory: ZeroMQ leaves it behind */
    if (s->event_file)
        unlink(s->event_ep + strlen("ipc://"));
    kvi_ecc_request_release(&s->req);
    kvi_ecc_reply_release(&s->rep_msg);
    free(s->out);
    kvi_ring_free(&s->ring);
    pthread_mutex_destroy(&s->lock);
    pthread_mutex_destroy(&s->st_lock);
    free(s);
}

static int bind_sockets(kvt_ec_server *s)
{
    int zero = 0, one = 1;
    int64_t maxmsg = KVT_ECC_MAX_MSG;
    char ep[300];
    int room = kvi_fd_room(16, "ec server"); /* libzmq aborts when it runs out of them */
    if (room)
        return room;
    s->ctx = zmq_ctx_new();
    if (!s->ctx)
        return zfail("context", NULL);
    s->rep = zmq_socket(s->ctx, ZMQ_REP);
    s->push = zmq_socket(s->ctx, ZMQ_PUSH);
    if (!s->rep || !s->push)
        return zfail("socket", NULL);
    zmq_setsockopt(s->rep, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(s->push, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(s->rep, ZMQ_IPV6, &one, sizeof(one));
    zmq_setsockopt(s->push, ZMQ_IPV6, &one, sizeof(one));
    zmq_setsockopt(s->rep, ZMQ_MAXMSGSIZE, &maxmsg, sizeof(maxmsg));
    void *socks[2] = {s->rep, s->push};
    int rc = kvi_ecc_curve_server(s->ctx, s->cfg.curve_secret_key, s->cfg.curve_clients, socks, 2,
                                  &s->zap);
    if (rc)
        return rc;
    rc = endpoint(ep, sizeof(ep), s->cfg.host, s->port);
    if (rc)
        return rc;
    if (zmq_bind(s->rep, ep) != 0)
        return zfail("failed to bind", ep);
    /* events: a unix socket in this user's private directory (no other user can connect, so
     * no outsider takes an event), unless the caller names an address, which needs CURVE */
    if (!s->cfg.event_host) {
        if ((rc = kvi_ecc_event_path(s->port, s->event_ep, sizeof(s->event_ep))))
            return rc;
        if (zmq_bind(s->push, s->event_ep) != 0)
            return zfail("failed to bind the event socket", s->event_ep);
        s->event_file = true;
        return 0;
    }
    if ((rc = endpoint(ep, sizeof(ep), s->cfg.event_host, 0)))
        return rc;
    if (zmq_bind(s->push, ep) != 0)
        return zfail("failed to bind the event socket", ep);
    char last[300];
    size_t ll = sizeof(last);
    if (zmq_getsockopt(s->push, ZMQ_LAST_ENDPOINT, last, &ll) != 0)
        return zfail("event endpoint", NULL);
    const char *colon = strrchr(last, ':');
    s->event_port = colon ? (uint32_t)strtoul(colon + 1, NULL, 10) : 0;
    if (s->event_port == 0)
        return kvt_fail(KVT_EIO, "ec server: cannot read the event port from %s", last);
    snprintf(s->event_ep, sizeof(s->event_ep), "%s", last);
    return 0;
}

static int data_plane_setup(kvt_ec_server *s)
{
    uint32_t n = s->cfg.max_receives;
    s->rx = calloc(n, sizeof(*s->rx));
    s->pend = calloc(n, sizeof(*s->pend));
    if (!s->rx || !s->pend)
        return kvt_fail(KVT_ENOMEM, "ec server: out of memory for %u receives", n);
    for (uint32_t i = 0; i < n; i++)
        s->rx[i].next_free = i + 1 < n ? i + 1 : NONE;
    s->rx_free = 0;
    int rc = kvi_map_init(&s->rx_map, n);
    if (!rc)
        rc = kvi_ucx_create(&s->ucx);
    if (!rc)
        rc = kvi_ucx_efd(s->ucx, &s->efd);
    uint64_t cap;
    void *base = kvt_ec_shard_buffer(s->shard, &cap);
    if (!rc && !base)
        rc = kvt_fail(KVT_EINVAL, "the shard has no buffer (config base) to receive into");
    if (!rc) /* the receive buffer is registered once, for zero-copy receives */
        rc = kvi_ucx_map(s->ucx, base, cap);
    return rc ? kvi_fail_wrap(rc, "ec server: data plane") : 0;
}

int kvt_ec_server_start(const kvt_ec_server_config *cfg, kvt_ec_shard *shard, kvt_ec_server **out)
{
    if (!cfg || !shard || !out)
        return kvt_fail(KVT_EINVAL, "ec server: start: NULL argument");
    if (kvi_check_reserved(cfg->reserved, sizeof(cfg->reserved), "ec server config"))
        return KVT_EINVAL;
    *out = NULL;
    int rc = check_config(cfg);
    if (rc)
        return rc;
    kvt_ec_server *s = calloc(1, sizeof(*s));
    if (!s)
        return kvt_fail(KVT_ENOMEM, "ec server: out of memory");
    s->cfg = *cfg;
    /* the server's spin does not adapt: between single pushes it is what catches the next item's
     * bytes (adaptive, the median 64 KiB push went from 0.22 to 0.44 ms on a quiet machine) */
    kvi_spin_init(&s->spin, (uint64_t)cfg->spin_us * 1000u, false);
    s->shard = shard;
    s->port = shard_port(cfg, cfg->tp_rank);
    pthread_mutex_init(&s->lock, NULL);
    pthread_mutex_init(&s->st_lock, NULL);
    kvi_ecc_request_init(&s->req);
    kvi_ecc_reply_init(&s->rep_msg);
    rc = kvi_ring_init(&s->ring, sizeof(kvt_ec_ready_event), cfg->max_events);
    if (!rc && cfg->data_plane)
        rc = data_plane_setup(s);
    if (!rc)
        rc = bind_sockets(s);
    if (!rc && cfg->owner_key) {
        memcpy(s->owner, cfg->owner_key, sizeof(s->owner));
    } else if (!rc && !(rc = kvi_ecc_key_random(s->owner))) {
        if (kvi_ecc_owner_write(s->port, s->owner) == 0)
            s->owner_file = true;
        else /* the inbox of this host cannot cancel; everything else works */
            KVT_LOG_W("ec server port %u: %s; consumer-side cancels will be refused unless the "
                      "inbox is given an owner_key",
                      s->port, kvt_last_error());
    }
    if (!rc && pthread_create(&s->thread, NULL, server_main, s) != 0)
        rc = kvt_fail(KVT_ESYS, "ec server: cannot start its thread");
    if (rc) {
        teardown(s);
        return rc;
    }
    KVT_LOG_I("ec server: shard %u of %u serving on port %u, events at %s", cfg->tp_rank,
              cfg->tp_size, s->port, s->event_ep);
    *out = s;
    return 0;
}

void kvt_ec_server_stop(kvt_ec_server *s)
{
    if (!s)
        return;
    atomic_store(&s->stop, true);
    pthread_join(s->thread, NULL);
    teardown(s);
}

KVI_GETTER(uint32_t, kvt_ec_server_port, kvt_ec_server, port)

const char *kvt_ec_server_event_endpoint(const kvt_ec_server *s)
{
    return s ? s->event_ep : NULL;
}

KVI_GETTER(uint32_t, kvt_ec_server_event_port, kvt_ec_server, event_port)

int kvt_ec_server_apply(kvt_ec_server *s, const kvt_ec_meta *meta, const kvt_ec_cache_ops *ops,
                        kvt_ec_worker_meta *out)
{
    pthread_mutex_lock(&s->lock);
    int rc = kvt_ec_shard_apply(s->shard, meta, ops, out);
    pthread_mutex_unlock(&s->lock);
    return rc;
}

int kvt_ec_server_with_shard(kvt_ec_server *s, int (*fn)(kvt_ec_shard *, void *), void *arg)
{
    if (!fn)
        return kvt_fail(KVT_EINVAL, "ec server: with_shard: NULL function");
    pthread_mutex_lock(&s->lock);
    int rc = fn(s->shard, arg);
    pthread_mutex_unlock(&s->lock);
    return rc;
}

void kvt_ec_server_get_stats(kvt_ec_server *s, kvt_ec_server_stats *st)
{
    if (!kvi_stats_begin(s, st, sizeof(*st)))
        return;
    pthread_mutex_lock(&s->st_lock);
    *st = s->st;
    pthread_mutex_unlock(&s->st_lock);
}
