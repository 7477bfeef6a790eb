/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The consumer scheduler's link to its shards (kvtier/ec_net.h: kvt_ec_inbox).
 *
 * Two threads share this object. The background thread owns the control client: it runs
 * discovery until it succeeds, then sends queued cancels. The scheduler thread owns the PULL
 * socket: it connects it once discovery published the event endpoints, drains it without
 * waiting, and queues cancels. A mutex guards what they share (the published topology, the
 * cancel queue, the stats); neither ever waits for the other on the network.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "base/error.h"
#include "base/util.h"
#include "base/fd.h"
#include "base/log.h"
#include "base/ring.h"
#include "net/ec_ctl.h"
#include "kvtier/ec_net.h"

typedef char tid_t[KVT_EC_KEY_MAX + 1];

struct kvt_ec_inbox {
    kvt_ec_inbox_config cfg;
    char consumer[160];
    char host[128];
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_bool stop;
    /* published by the thread once discovery succeeded (under mu) */
    bool discovered;
    uint32_t n;
    uint32_t ports[KVT_EC_MAX_SHARDS], event_ports[KVT_EC_MAX_SHARDS];
    /* cancel queue (under mu) */
    kvi_ring q; /* tid_t: cancels for the thread; the newest is dropped when full */
    kvt_ec_inbox_stats st;
    /* the scheduler thread's */
    void *ctx, *pull;
    bool connected;
    bool curve;
    char server_key[41], public_key[41], secret_key[41];
    char event_host[128];
    bool local_events;              /* no event_host: the shards' unix sockets */
    char owner[KVT_EC_RID_LEN + 1]; /* configured owner key, or "" (read per shard) */
    /* the thread's: each shard's key as read from its server's file ("" until read, and
     * again after a refused cancel: a restarted server writes a new one) */
    char shard_key[KVT_EC_MAX_SHARDS][KVT_EC_RID_LEN + 1];
};

void kvt_ec_inbox_config_init(kvt_ec_inbox_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->control_timeout_ms = 30000;
    cfg->retry_ms = 1000;
    cfg->max_cancels = 65536;
}

static void endpoint(char *buf, size_t cap, const char *host, uint32_t port)
{
    snprintf(buf, cap, strchr(host, ':') ? "tcp://[%s]:%u" : "tcp://%s:%u", host, port);
}

/* ---- the background thread ----------------------------------------------------------------- */

static bool discover(kvt_ec_inbox *in, kvi_ecc_client *cli, kvi_ecc_request *q, kvi_ecc_reply *p,
                     uint32_t port0)
{
    char ep[200];
    uint32_t ports[KVT_EC_MAX_SHARDS], evs[KVT_EC_MAX_SHARDS], n;
    endpoint(ep, sizeof(ep), in->host, port0);
    kvi_ecc_request_begin(q, KVT_ECC_PEERS);
    if (kvi_ecc_client_call(cli, ep, q, p))
        return false;
    n = p->n_ports;
    memcpy(ports, p->ports, n * sizeof(uint32_t));
    for (uint32_t k = 0; k < n; k++) { /* every shard, or the whole topology again later */
        endpoint(ep, sizeof(ep), in->host, ports[k]);
        kvi_ecc_request_begin(q, KVT_ECC_EVENT_PORT);
        if (kvi_ecc_client_call(cli, ep, q, p))
            return false;
        evs[k] = p->port;
    }
    pthread_mutex_lock(&in->mu);
    in->n = n;
    memcpy(in->ports, ports, sizeof(ports));
    memcpy(in->event_ports, evs, sizeof(evs));
    in->discovered = true;
    memset(in->shard_key, 0, sizeof(in->shard_key)); /* (only this thread reads them) */
    in->st.shards = n;
    pthread_mutex_unlock(&in->mu);
    KVT_LOG_I("ec inbox: %s has %u shards", in->consumer, n);
    return true;
}

/* cancel(T, "") on every shard: two rounds, the second only where the first failed. */
static void cancel_everywhere(kvt_ec_inbox *in, kvi_ecc_client *cli, kvi_ecc_request *q,
                              kvi_ecc_reply *p, const char *tid)
{
    bool done[KVT_EC_MAX_SHARDS] = {false};
    uint32_t left = in->n;
    kvi_ecc_item it = {.transfer_id = {tid, (uint32_t)strlen(tid)}, .reservation_id = {"", 0}};
    for (int round = 0; round < 2 && left; round++)
        for (uint32_t k = 0; k < in->n; k++) {
            if (done[k])
                continue;
            /* the owner key: configured, or the one this shard's server left for us */
            const char *key = in->owner[0] ? in->owner : in->shard_key[k];
            if (!key[0] && kvi_ecc_owner_read(in->ports[k], in->shard_key[k]) != 0) {
                KVT_LOG_W("ec inbox: cancel of %s on shard %u: %s", tid, k, kvt_last_error());
                continue;
            }
            it.client_key = (kvt_str){key, KVT_EC_RID_LEN};
            char ep[200];
            endpoint(ep, sizeof(ep), in->host, in->ports[k]);
            kvi_ecc_request_begin(q, KVT_ECC_CANCEL);
            int rc = kvi_ecc_request_add(q, &it);
            if (!rc)
                rc = kvi_ecc_client_call(cli, ep, q, p);
            if (!rc && p->results[0].code == 0) {
                done[k] = true;
                left--;
            } else if (!rc && !in->owner[0]) {
                in->shard_key[k][0] = 0; /* refused: read the file again next round */
            }
        }
    pthread_mutex_lock(&in->mu);
    if (left) {
        in->st.cancels_failed++;
        KVT_LOG_W("ec inbox: cancel of %s reached %u of %u shards", tid, in->n - left, in->n);
    } else {
        in->st.cancels_sent++;
    }
    pthread_mutex_unlock(&in->mu);
}

static void *inbox_main(void *arg)
{
    kvt_ec_inbox *in = arg;
    kvi_ecc_client *cli = NULL;
    kvi_ecc_request q;
    kvi_ecc_reply p;
    kvi_ecc_request_init(&q);
    kvi_ecc_reply_init(&p);
    uint32_t port0 = (uint32_t)atoi(strrchr(in->consumer, ':') + 1);
    kvi_ecc_curve k = {in->cfg.curve_server_key, in->cfg.curve_public_key,
                       in->cfg.curve_secret_key};
    if (kvi_ecc_client_create((int)in->cfg.control_timeout_ms, &k, &cli)) {
        KVT_LOG_E("ec inbox: %s", kvt_last_error());
        return NULL;
    }
    tid_t tid;
    while (!atomic_load(&in->stop)) {
        pthread_mutex_lock(&in->mu);
        bool disc = in->discovered;
        in->st.discoveries += !disc;
        pthread_mutex_unlock(&in->mu);
        if (!disc && !discover(in, cli, &q, &p, port0)) {
            KVT_LOG_W("ec inbox: discovery of %s failed (retrying in %u ms): %s", in->consumer,
                      in->cfg.retry_ms, kvt_last_error());
            pthread_mutex_lock(&in->mu);
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            uint64_t ns = (uint64_t)ts.tv_nsec + (uint64_t)in->cfg.retry_ms * 1000000ull;
            ts.tv_sec += (time_t)(ns / 1000000000ull);
            ts.tv_nsec = (long)(ns % 1000000000ull);
            if (!atomic_load(&in->stop))
                pthread_cond_timedwait(&in->cv, &in->mu, &ts);
            pthread_mutex_unlock(&in->mu);
            continue;
        }
        pthread_mutex_lock(&in->mu);
        while (!kvi_ring_len(&in->q) && !atomic_load(&in->stop))
            pthread_cond_wait(&in->cv, &in->mu);
        bool have = kvi_ring_take(&in->q, tid, 1) == 1;
        pthread_mutex_unlock(&in->mu);
        if (have)
            cancel_everywhere(in, cli, &q, &p, tid);
    }
    kvi_ecc_client_destroy(cli);
    kvi_ecc_request_release(&q);
    kvi_ecc_reply_release(&p);
    return NULL;
}

/* ---- the scheduler thread ------------------------------------------------------------------ */

/* The configuration's values, and the consumer's host (*h, *hl: in cfg->consumer, brackets
 * of an IPv6 literal left out) from its "tcp://host:port". */
static int check_config(const kvt_ec_inbox_config *cfg, const char **h, size_t *hl)
{
    if (kvi_check_reserved(cfg->reserved, sizeof(cfg->reserved), "ec inbox config"))
        return KVT_EINVAL;
    if (cfg->control_timeout_ms < 1 || cfg->retry_ms < 1 || cfg->max_cancels < 1 ||
        cfg->max_cancels > (1u << 24))
        return kvt_fail(KVT_EINVAL, "ec inbox: timeouts >= 1 ms, max_cancels 1..2^24");
    if (cfg->owner_key && kvi_ecc_key_check(cfg->owner_key))
        return kvt_fail(KVT_EINVAL, "ec inbox: owner_key is not 32 lowercase hex digits");
    if (cfg->event_host && (!cfg->event_host[0] || strlen(cfg->event_host) >= 128))
        return kvt_fail(KVT_EINVAL, "ec inbox: event_host empty or too long");
    *h = strncmp(cfg->consumer, "tcp://", 6) == 0 ? cfg->consumer + 6 : cfg->consumer;
    const char *colon = strrchr(*h, ':');
    *hl = colon ? (size_t)(colon - *h) : 0;
    if (*hl && (*h)[0] == '[' && colon[-1] == ']')
        (*h)++, *hl -= 2;
    int port = colon ? atoi(colon + 1) : 0;
    if (!colon || *hl == 0 || *hl >= 128 || port < 1 || port > 65535 ||
        strlen(cfg->consumer) >= 160)
        return kvt_fail(KVT_EINVAL, "ec inbox: consumer address %s is not host:port",
                        cfg->consumer);
    return 0;
}

/* The inbox keeps its own copies of what the thread and the step read later: the CURVE keys,
 * the consumer's address and host, the event host, the owner key. */
static void keep_config(kvt_ec_inbox *in, const kvt_ec_inbox_config *cfg, bool curve, const char *h,
                        size_t hl)
{
    in->cfg = *cfg;
    if ((in->curve = curve)) {
        memcpy(in->server_key, cfg->curve_server_key, 40);
        memcpy(in->public_key, cfg->curve_public_key, 40);
        memcpy(in->secret_key, cfg->curve_secret_key, 40);
    }
    in->cfg.curve_server_key = curve ? in->server_key : NULL;
    in->cfg.curve_public_key = curve ? in->public_key : NULL;
    in->cfg.curve_secret_key = curve ? in->secret_key : NULL;
    snprintf(in->consumer, sizeof(in->consumer), "%s", cfg->consumer);
    memcpy(in->host, h, hl);
    snprintf(in->event_host, sizeof(in->event_host), "%s",
             cfg->event_host ? cfg->event_host : "127.0.0.1");
    in->local_events = cfg->event_host == NULL;
    in->cfg.event_host = in->event_host;
    if (cfg->owner_key)
        memcpy(in->owner, cfg->owner_key, KVT_EC_RID_LEN + 1);
    in->cfg.owner_key = NULL;
    in->cfg.consumer = in->consumer;
}

int kvt_ec_inbox_create(const kvt_ec_inbox_config *cfg, kvt_ec_inbox **out)
{
    if (!cfg || !out || !cfg->consumer)
        return kvt_fail(KVT_EINVAL, "ec inbox: create: NULL argument or no consumer address");
    const char *h = NULL;
    size_t hl = 0;
    int rc = check_config(cfg, &h, &hl);
    if (rc)
        return rc;
    kvi_ecc_curve keys = {cfg->curve_server_key, cfg->curve_public_key, cfg->curve_secret_key};
    bool curve;
    if ((rc = kvi_ecc_curve_check(&keys, &curve)))
        return rc;
    if ((rc = kvi_fd_room(24, "ec inbox"))) /* its context, and its thread's client */
        return rc;
    kvt_ec_inbox *in = calloc(1, sizeof(*in));
    if (!in)
        return kvt_fail(KVT_ENOMEM, "ec inbox: out of memory");
    keep_config(in, cfg, curve, h, hl);
    rc = kvi_ring_init(&in->q, sizeof(tid_t), cfg->max_cancels);
    if (!rc && !(in->ctx = zmq_ctx_new()))
        rc = kvt_fail(KVT_ENOMEM, "ec inbox: out of memory");
    if (rc) {
        kvi_ring_free(&in->q);
        free(in);
        return rc;
    }
    pthread_mutex_init(&in->mu, NULL);
    pthread_cond_init(&in->cv, NULL);
    if (pthread_create(&in->thread, NULL, inbox_main, in) != 0) {
        pthread_mutex_destroy(&in->mu);
        pthread_cond_destroy(&in->cv);
        zmq_ctx_term(in->ctx);
        kvi_ring_free(&in->q);
        free(in);
        return kvt_fail(KVT_ESYS, "ec inbox: cannot start its thread");
    }
    *out = in;
    return 0;
}

void kvt_ec_inbox_destroy(kvt_ec_inbox *in)
{
    if (!in)
        return;
    pthread_mutex_lock(&in->mu);
    atomic_store(&in->stop, true);
    pthread_cond_broadcast(&in->cv);
    pthread_mutex_unlock(&in->mu);
    pthread_join(in->thread, NULL); /* a call in flight ends within control_timeout_ms */
    if (in->pull)
        zmq_close(in->pull);
    zmq_ctx_term(in->ctx);
    pthread_mutex_destroy(&in->mu);
    pthread_cond_destroy(&in->cv);
    kvi_ring_free(&in->q);
    free(in);
}

static int connect_pull(kvt_ec_inbox *in)
{
    uint32_t n, evs[KVT_EC_MAX_SHARDS];
    pthread_mutex_lock(&in->mu);
    bool disc = in->discovered;
    n = in->n;
    memcpy(evs, in->event_ports, sizeof(evs));
    pthread_mutex_unlock(&in->mu);
    if (!disc)
        return 0;
    in->pull = zmq_socket(in->ctx, ZMQ_PULL);
    if (!in->pull)
        return kvt_fail(KVT_EIO, "ec inbox: socket: %s", zmq_strerror(zmq_errno()));
    int zero = 0, one = 1;
    int64_t maxmsg = KVT_ECC_MAX_MSG;
    zmq_setsockopt(in->pull, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(in->pull, ZMQ_IPV6, &one, sizeof(one));
    zmq_setsockopt(in->pull, ZMQ_MAXMSGSIZE, &maxmsg, sizeof(maxmsg));
    kvi_ecc_curve keys = {in->server_key, in->public_key, in->secret_key};
    int rc = in->curve ? kvi_ecc_curve_client(in->pull, &keys) : 0;
    if (rc)
        return rc;
    uint32_t ports[KVT_EC_MAX_SHARDS];
    pthread_mutex_lock(&in->mu);
    memcpy(ports, in->ports, sizeof(ports));
    pthread_mutex_unlock(&in->mu);
    for (uint32_t k = 0; k < n; k++) {
        char ep[200];
        if (in->local_events) { /* each shard's unix socket, in this user's directory */
            if ((rc = kvi_ecc_event_path(ports[k], ep, sizeof(ep))))
                return rc;
        } else {
            endpoint(ep, sizeof(ep), in->event_host, evs[k]);
        }
        if (zmq_connect(in->pull, ep) != 0)
            return kvt_fail(KVT_EIO, "ec inbox: connect %s: %s", ep, zmq_strerror(zmq_errno()));
    }
    in->connected = true;
    return 0;
}

static int deliver(kvt_ec_inbox *in, kvt_ec_sched *sched, const kvi_ecc_event *e)
{
    if (e->abandoned)
        return kvt_ec_sched_observe_abandoned(sched, e->transfer_id.ptr, e->transfer_id.len);
    kvt_ec_ready r = {
        e->transfer_id.ptr,
        e->transfer_id.len,
        {e->mm_hash.ptr, e->mm_hash.len, e->nbytes, e->ndim, {0}, e->dtype.ptr, e->dtype.len},
        e->shard};
    memcpy(r.item.shape, e->shape, sizeof(r.item.shape));
    if (e->shard >= in->n)
        return kvt_fail(KVT_EPROTO, "ec inbox: an event from shard %u of %u", e->shard, in->n);
    return kvt_ec_sched_observe_ready(sched, &r);
}

int kvt_ec_inbox_step(kvt_ec_inbox *in, kvt_ec_sched *sched)
{
    if (!in || !sched)
        return kvt_fail(KVT_EINVAL, "ec inbox: step: NULL argument");
    int rc = in->connected ? 0 : connect_pull(in);
    if (rc)
        return rc;
    int delivered = 0;
    uint64_t bad = 0;
    kvi_ecc_event e;
    kvi_ecc_event_init(&e);
    while (in->connected) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, in->pull, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            break; /* nothing more now (or a ZeroMQ error: the next step tries again) */
        }
        int d = kvi_ecc_event_decode(&e, zmq_msg_data(&m), zmq_msg_size(&m));
        zmq_msg_close(&m);
        if (d) {
            KVT_LOG_W("ec inbox: dropping an event: %s", kvt_last_error());
            bad++;
            continue;
        }
        if ((rc = deliver(in, sched, &e)) && rc != KVT_EPROTO)
            break;
        if (rc) { /* an event from a shard the topology does not know: dropped */
            KVT_LOG_W("ec inbox: %s", kvt_last_error());
            bad++;
            rc = 0;
            continue;
        }
        delivered++;
    }
    kvi_ecc_event_release(&e);
    /* the scheduler's cancels go to the thread */
    tid_t ids[16];
    uint32_t n;
    uint64_t dropped = 0;
    while (!rc && (n = kvt_ec_sched_take_cancels(sched, ids, 16)) > 0) {
        pthread_mutex_lock(&in->mu);
        for (uint32_t i = 0; i < n; i++) {
            char *slot = kvi_ring_push(&in->q);
            if (slot)
                memcpy(slot, ids[i], sizeof(tid_t));
            else
                dropped++;
        }
        pthread_cond_signal(&in->cv);
        pthread_mutex_unlock(&in->mu);
    }
    pthread_mutex_lock(&in->mu);
    in->st.events += (uint64_t)delivered;
    in->st.bad_events += bad;
    in->st.cancels_dropped += dropped;
    pthread_mutex_unlock(&in->mu);
    if (dropped)
        KVT_LOG_W("ec inbox: cancel queue full, %llu cancels dropped", (unsigned long long)dropped);
    return rc ? rc : delivered;
}

void kvt_ec_inbox_get_stats(kvt_ec_inbox *in, kvt_ec_inbox_stats *st)
{
    if (!kvi_stats_begin(in, st, sizeof(*st)))
        return;
    pthread_mutex_lock(&in->mu);
    *st = in->st;
    pthread_mutex_unlock(&in->mu);
}
