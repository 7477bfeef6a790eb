/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A producer's remote consumers (kvtier/ec_net.h): kvt_ec_consumer_ops over the control plane
 * (ZeroMQ REQ, src/net/ec_ctl_client.c) and the data plane (UCX tag sends, src/net/ucx.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "net/ec_ctl.h"
#include "net/ucx.h"
#include "kvtier/ec_net.h"

#define MAX_CONSUMERS 64

typedef struct remote {
    char name[160]; /* as the push spec names it */
    char host[128];
    uint32_t n; /* shards, 0 until peers answered */
    uint32_t ports[KVT_EC_MAX_SHARDS];
    uint8_t *addr[KVT_EC_MAX_SHARDS]; /* data-plane addresses, fetched on first write */
    uint32_t addr_len[KVT_EC_MAX_SHARDS];
} remote;

struct kvt_ec_net_consumer {
    kvt_ec_net_config cfg;
    kvi_ecc_client *cli;
    kvi_ucx *ucx;
    remote *rem[MAX_CONSUMERS];
    uint32_t n_rem, evict;
    kvi_ecc_request q;
    kvi_ecc_reply p;
    /* this producer's secret: a shard tells a reservation's id again (a repeated reserve
     * after a lost reply) only to the client that made it */
    char key[KVT_EC_RID_LEN + 1];
    kvi_ucx_send_item *send; /* a write batch's sends, and the write each one is */
    uint32_t *send_op, cap_send;
};

void kvt_ec_net_config_init(kvt_ec_net_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->control_timeout_ms = 30000;
    cfg->write_timeout_ms = 30000;
    cfg->write_window = 64;
}

int kvt_ec_net_consumer_create(const kvt_ec_net_config *cfg, kvt_ec_net_consumer **out)
{
    if (!cfg || !out)
        return kvt_fail(KVT_EINVAL, "ec net: create: NULL argument");
    if (kvi_check_reserved(cfg->reserved, sizeof(cfg->reserved), "ec net config"))
        return KVT_EINVAL;
    if (cfg->control_timeout_ms < 1 || cfg->write_timeout_ms < 1 ||
        cfg->control_timeout_ms > 3600000 || cfg->write_timeout_ms > 3600000)
        return kvt_fail(KVT_EINVAL, "ec net: timeouts must be 1 ms .. 1 h");
    if (cfg->write_window < 1 || cfg->write_window > 4096)
        return kvt_fail(KVT_EINVAL, "ec net: write_window must be 1..4096");
    kvt_ec_net_consumer *c = calloc(1, sizeof(*c));
    if (!c)
        return kvt_fail(KVT_ENOMEM, "ec net: out of memory");
    c->cfg = *cfg;
    kvi_ecc_request_init(&c->q);
    kvi_ecc_reply_init(&c->p);
    kvi_ecc_curve k = {cfg->curve_server_key, cfg->curve_public_key, cfg->curve_secret_key};
    int rc = kvi_ecc_key_random(c->key);
    if (!rc)
        rc = kvi_ecc_client_create((int)cfg->control_timeout_ms, &k, &c->cli);
    if (!rc)
        rc = kvi_ucx_create_as(&c->ucx, KVI_UCX_EC_SENDER);
    if (!rc)
        kvi_ucx_set_peer_failure(c->ucx, cfg->detect_peer_failure);
    if (rc) {
        kvt_ec_net_consumer_destroy(c);
        return rc;
    }
    *out = c;
    return 0;
}

static void remote_free(remote *r)
{
    for (uint32_t k = 0; k < KVT_EC_MAX_SHARDS; k++)
        free(r->addr[k]);
    free(r);
}

void kvt_ec_net_consumer_destroy(kvt_ec_net_consumer *c)
{
    if (!c)
        return;
    for (uint32_t i = 0; i < c->n_rem; i++)
        remote_free(c->rem[i]);
    kvi_ecc_client_destroy(c->cli);
    kvi_ucx_destroy(c->ucx);
    kvi_ecc_request_release(&c->q);
    kvi_ecc_reply_release(&c->p);
    free(c->send);
    free(c->send_op);
    free(c);
}

/* "tcp://host:port", "host:port" or "[v6]:port" -> host and port. */
static int parse(const char *name, char *host, size_t cap, uint32_t *port)
{
    const char *h = strncmp(name, "tcp://", 6) == 0 ? name + 6 : name;
    const char *colon = strrchr(h, ':');
    if (!colon || colon == h)
        return kvt_fail(KVT_EINVAL, "ec net: consumer address %s is not host:port", name);
    size_t n = (size_t)(colon - h);
    if (h[0] == '[' && colon[-1] == ']')
        h++, n -= 2;
    char *end;
    unsigned long p = strtoul(colon + 1, &end, 10);
    if (*end || p < 1 || p > 65535 || n == 0 || n >= cap)
        return kvt_fail(KVT_EINVAL, "ec net: consumer address %s is not host:port", name);
    memcpy(host, h, n);
    host[n] = 0;
    *port = (uint32_t)p;
    return 0;
}

static void endpoint(char *buf, size_t cap, const char *host, uint32_t port)
{
    snprintf(buf, cap, strchr(host, ':') ? "tcp://[%s]:%u" : "tcp://%s:%u", host, port);
}

static int call(kvt_ec_net_consumer *c, const char *host, uint32_t port)
{
    char ep[160];
    endpoint(ep, sizeof(ep), host, port);
    return kvi_ecc_client_call(c->cli, ep, &c->q, &c->p);
}

/* The consumer's entry, its topology discovered if needed. */
static int consumer(kvt_ec_net_consumer *c, const char *name, remote **out)
{
    remote *r = NULL;
    for (uint32_t i = 0; i < c->n_rem && !r; i++)
        if (strcmp(c->rem[i]->name, name) == 0)
            r = c->rem[i];
    if (!r) {
        if (strlen(name) >= sizeof(r->name))
            return kvt_fail(KVT_EINVAL, "ec net: consumer address too long");
        r = calloc(1, sizeof(*r));
        if (!r)
            return kvt_fail(KVT_ENOMEM, "ec net: out of memory");
        uint32_t port = 0;
        int rc = parse(name, r->host, sizeof(r->host), &port);
        if (rc) {
            free(r);
            return rc;
        }
        snprintf(r->name, sizeof(r->name), "%s", name);
        r->ports[0] = port;
        if (c->n_rem == MAX_CONSUMERS) { /* forget one; it is rediscovered when needed */
            uint32_t v = c->evict++ % MAX_CONSUMERS;
            remote_free(c->rem[v]);
            c->rem[v] = c->rem[--c->n_rem];
        }
        c->rem[c->n_rem++] = r;
    }
    if (r->n == 0) {
        /* two attempts, as vLLM's Mooncake producer makes: a consumer still starting, or whose
         * answer was lost, answers the second (the client made a fresh socket); a refusal is
         * an answer and is not asked again */
        int rc = KVT_EIO;
        for (uint32_t attempt = 0; attempt < 2 && rc == KVT_EIO; attempt++) {
            kvi_ecc_request_begin(&c->q, KVT_ECC_PEERS);
            rc = call(c, r->host, r->ports[0]);
        }
        if (rc)
            return rc;
        memcpy(r->ports, c->p.ports, sizeof(r->ports));
        r->n = c->p.n_ports; /* cached: successes only */
    }
    *out = r;
    return 0;
}

static int shard_of(kvt_ec_net_consumer *c, const char *name, uint32_t k, remote **out)
{
    int rc = consumer(c, name, out);
    if (!rc && k >= (*out)->n)
        rc = kvt_fail(KVT_ERANGE, "ec net: consumer %s has %u shards, not %u", name, (*out)->n,
                      k + 1);
    return rc;
}

/* One item to shard k of consumer `name`; its result's code becomes the return value, with the
 * shard's words. */
static int call_item(kvt_ec_net_consumer *c, const char *name, uint32_t k, uint32_t op,
                     const kvi_ecc_item *it)
{
    remote *r;
    int rc = shard_of(c, name, k, &r);
    if (rc)
        return rc;
    kvi_ecc_request_begin(&c->q, op);
    rc = kvi_ecc_request_add(&c->q, it);
    if (!rc)
        rc = call(c, r->host, r->ports[k]);
    if (!rc && c->p.results[0].code)
        rc = kvt_fail(c->p.results[0].code, "ec net: %s on %s shard %u: %s", kvi_ecc_op_name(op),
                      r->name, k, c->p.results[0].error.ptr);
    return rc;
}

/* A reserve's wire item: the producer's item and this producer's key. */
static kvi_ecc_item reserve_item(const kvt_ec_net_consumer *c, const char *tid, uint32_t len,
                                 const kvt_ec_item *item)
{
    kvi_ecc_item it = {.transfer_id = {tid, len},
                       .mm_hash = {item->mm_hash, item->mm_hash_len},
                       .nbytes = item->nbytes,
                       .ndim = item->ndim,
                       .dtype = {item->dtype, item->dtype_len},
                       .client_key = {c->key, KVT_EC_RID_LEN}};
    memcpy(it.shape, item->shape, sizeof(it.shape));
    return it;
}

/* A reserve's result as the producer's reply. */
static void reply_of(const kvi_ecc_result *x, kvt_ec_reply *out)
{
    memset(out, 0, sizeof(*out));
    memcpy(out->reservation_id, x->reservation_id.ptr, x->reservation_id.len);
    out->offset = x->offset;
    out->nbytes = x->nbytes;
    out->write = x->write;
    out->ready = x->ready;
    out->cached = x->cached;
    out->cancelled = x->cancelled;
}

static int op_shards(void *ctx, const char *name, uint32_t *n)
{
    remote *r;
    int rc = consumer(ctx, name, &r);
    if (!rc)
        *n = r->n;
    return rc;
}

static int op_reserve(void *ctx, const char *name, uint32_t k, const char *tid, uint32_t len,
                      const kvt_ec_item *item, kvt_ec_reply *out)
{
    kvt_ec_net_consumer *c = ctx;
    kvi_ecc_item it = reserve_item(c, tid, len, item);
    int rc = call_item(c, name, k, KVT_ECC_RESERVE, &it);
    if (rc)
        return rc;
    reply_of(&c->p.results[0], out);
    return 0;
}

/* Shard k's data-plane address, asked for once and kept until a write to it fails. */
static int data_address(kvt_ec_net_consumer *c, remote *r, uint32_t k)
{
    if (r->addr[k])
        return 0;
    kvi_ecc_request_begin(&c->q, KVT_ECC_DATA_ADDRESS);
    int rc = call(c, r->host, r->ports[k]);
    if (rc)
        return rc;
    if ((rc = kvi_ucx_address_check(c->ucx, c->p.data_addr, c->p.data_addr_len))) {
        char what[220];
        snprintf(what, sizeof(what), "ec net: %s shard %u's data address", r->name, k);
        return kvi_fail_wrap(rc, what);
    }
    r->addr[k] = malloc(c->p.data_addr_len);
    if (!r->addr[k])
        return kvt_fail(KVT_ENOMEM, "ec net: out of memory");
    memcpy(r->addr[k], c->p.data_addr, c->p.data_addr_len);
    r->addr_len[k] = c->p.data_addr_len;
    return 0;
}

static void op_fail(int rc, int *out_rc, char *err, size_t cap)
{
    *out_rc = rc;
    snprintf(err, cap, "%s", kvt_last_error());
}

static int op_write_batch(void *ctx, const char *name, kvt_ec_write_op *w, uint32_t n)
{
    kvt_ec_net_consumer *c = ctx;
    remote *r;
    int rc = consumer(c, name, &r);
    if (!rc && n > c->cap_send) {
        kvi_ucx_send_item *g = realloc(c->send, n * sizeof(*g));
        uint32_t *o = g ? realloc(c->send_op, n * sizeof(*o)) : NULL;
        if (g)
            c->send = g;
        if (o)
            c->send_op = o, c->cap_send = n;
        else
            rc = kvt_fail(KVT_ENOMEM, "ec net: out of memory for %u writes", n);
    }
    if (rc) {
        for (uint32_t i = 0; i < n; i++)
            op_fail(rc, &w[i].rc, w[i].error, sizeof(w[i].error));
        return rc;
    }
    uint32_t m = 0; /* the writes with a destination, all in one batch */
    for (uint32_t i = 0; i < n; i++) {
        w[i].rc = 0;
        w[i].error[0] = 0;
        uint32_t k = w[i].shard;
        if (k >= r->n)
            rc = kvt_fail(KVT_ERANGE, "ec net: consumer %s has %u shards, not %u", name, r->n,
                          k + 1);
        else if (w[i].nbytes != w[i].dst->nbytes)
            rc = kvt_fail(KVT_EINVAL, "ec net: %llu bytes for a reservation of %llu",
                          (unsigned long long)w[i].nbytes, (unsigned long long)w[i].dst->nbytes);
        else
            rc = data_address(c, r, k);
        if (rc) {
            op_fail(rc, &w[i].rc, w[i].error, sizeof(w[i].error));
            continue;
        }
        c->send_op[m] = i;
        c->send[m++] = (kvi_ucx_send_item){r->addr[k],
                                           r->addr_len[k],
                                           w[i].src,
                                           w[i].nbytes,
                                           kvi_ecc_rid_tag(w[i].dst->reservation_id),
                                           0};
    }
    (void)kvi_ucx_send_many(c->ucx, c->send, m, c->cfg.write_window, (int)c->cfg.write_timeout_ms);
    for (uint32_t j = 0; j < m; j++) {
        kvt_ec_write_op *x = &w[c->send_op[j]];
        if (!c->send[j].rc)
            continue;
        /* the shard may have restarted with a new address: ask again next time */
        free(r->addr[x->shard]);
        r->addr[x->shard] = NULL;
        x->rc = c->send[j].rc;
        snprintf(x->error, sizeof(x->error), "ec net: write to %.80s shard %u: %.140s", r->name,
                 x->shard, kvt_last_error());
    }
    return 0;
}

static int op_write(void *ctx, const char *name, uint32_t k, const kvt_ec_reply *dst,
                    const void *src, uint64_t n)
{
    kvt_ec_write_op w = {k, dst, src, n, 0, {0}};
    int rc = op_write_batch(ctx, name, &w, 1);
    if (!rc && w.rc)
        rc = kvt_fail(w.rc, "%s", w.error);
    return rc;
}

static int op_complete(void *ctx, const char *name, uint32_t k, const char *tid, uint32_t len,
                       const char *rid, bool *accepted)
{
    kvi_ecc_item it = {.transfer_id = {tid, len}, .reservation_id = {rid, (uint32_t)strlen(rid)}};
    kvt_ec_net_consumer *c = ctx;
    int rc = call_item(c, name, k, KVT_ECC_COMPLETE, &it);
    if (rc)
        return rc;
    *accepted = c->p.results[0].completed;
    return 0;
}

static int op_cancel(void *ctx, const char *name, uint32_t k, const char *tid, uint32_t len,
                     const char *rid, bool abandon, bool refresh)
{
    kvi_ecc_item it = {.transfer_id = {tid, len},
                       .reservation_id = {rid ? rid : "", rid ? (uint32_t)strlen(rid) : 0},
                       .abandon = abandon,
                       .refresh = refresh};
    return call_item(ctx, name, k, KVT_ECC_CANCEL, &it);
}

/* The batched control calls: chunks of KVT_ECC_MAX_BATCH, one exchange each; every item's
 * outcome in its op. */
static int batch_call(kvt_ec_net_consumer *c, const char *name, uint32_t k, uint32_t op,
                      kvt_ec_batch_op *ops, uint32_t n)
{
    remote *r;
    int rc = shard_of(c, name, k, &r);
    for (uint32_t at = 0; at < n; at += KVT_ECC_MAX_BATCH) {
        uint32_t m = n - at < KVT_ECC_MAX_BATCH ? n - at : KVT_ECC_MAX_BATCH;
        int crc = rc;
        if (!crc) {
            kvi_ecc_request_begin(&c->q, op);
            for (uint32_t i = 0; i < m && !crc; i++) {
                kvt_ec_batch_op *b = &ops[at + i];
                kvi_ecc_item it = {.transfer_id = {b->transfer_id, b->len}};
                if (op == KVT_ECC_RESERVE_BATCH) {
                    it = reserve_item(c, b->transfer_id, b->len, b->item);
                } else {
                    it.reservation_id =
                        (kvt_str){b->reservation_id, (uint32_t)strlen(b->reservation_id)};
                    it.abandon = b->abandon;
                    it.refresh = b->refresh;
                }
                crc = kvi_ecc_request_add(&c->q, &it);
            }
            if (!crc)
                crc = call(c, r->host, r->ports[k]);
        }
        for (uint32_t i = 0; i < m; i++) {
            kvt_ec_batch_op *b = &ops[at + i];
            const kvi_ecc_result *x = crc ? NULL : &c->p.results[i];
            b->error[0] = 0;
            if (crc || x->code) {
                b->rc = crc ? crc : x->code;
                if (crc)
                    snprintf(b->error, sizeof(b->error), "%s", kvt_last_error());
                else
                    snprintf(b->error, sizeof(b->error), "ec net: %s on %s shard %u: %s",
                             kvi_ecc_op_name(op), name, k, x->error.ptr);
                continue;
            }
            b->rc = 0;
            if (op != KVT_ECC_RESERVE_BATCH) { /* complete: accepted; cancel: cancelled */
                b->accepted = op == KVT_ECC_COMPLETE_BATCH ? x->completed : x->cancelled;
                continue;
            }
            reply_of(x, &b->reply);
        }
    }
    return rc;
}

static int op_reserve_batch(void *ctx, const char *name, uint32_t k, kvt_ec_batch_op *ops,
                            uint32_t n)
{
    return batch_call(ctx, name, k, KVT_ECC_RESERVE_BATCH, ops, n);
}

static int op_complete_batch(void *ctx, const char *name, uint32_t k, kvt_ec_batch_op *ops,
                             uint32_t n)
{
    return batch_call(ctx, name, k, KVT_ECC_COMPLETE_BATCH, ops, n);
}

static int op_cancel_batch(void *ctx, const char *name, uint32_t k, kvt_ec_batch_op *ops,
                           uint32_t n)
{
    return batch_call(ctx, name, k, KVT_ECC_CANCEL_BATCH, ops, n);
}

kvt_ec_consumer_ops kvt_ec_net_consumer_ops(kvt_ec_net_consumer *c)
{
    return (kvt_ec_consumer_ops){
        op_shards, op_reserve,       op_write,       op_complete,       op_cancel,
        c,         op_reserve_batch, op_write_batch, op_complete_batch, op_cancel_batch};
}
