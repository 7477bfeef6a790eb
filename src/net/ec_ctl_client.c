/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The control plane's client side (ctl.h): one REQ socket per endpoint, kept between calls;
 * RCVTIMEO = SNDTIMEO = the timeout, LINGER 0, IPv6 on. A REQ socket stuck mid-exchange is
 * unusable, so after any failure (a timeout included) the socket is closed and forgotten, and
 * the next call to that endpoint connects afresh (spec §4.1).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "base/error.h"
#include "base/fd.h"
#include "net/ec_ctl.h"

#define MAX_PEERS 128

struct kvi_ecc_client {
    void *ctx;
    int timeout_ms;
    bool curve;
    char server_key[41], public_key[41], secret_key[41];
    struct {
        char ep[160];
        void *sock;
    } peer[MAX_PEERS];
    uint32_t n, next_evict;
    uint8_t *buf;
    size_t cap;
};

int kvi_ecc_client_create(int timeout_ms, const kvi_ecc_curve *curve, kvi_ecc_client **out)
{
    if (!out || timeout_ms < 1)
        return kvt_fail(KVT_EINVAL, "ec control client: timeout must be at least 1 ms");
    bool on;
    int rc = kvi_ecc_curve_check(curve, &on);
    if (rc)
        return rc;
    kvi_ecc_client *c = calloc(1, sizeof(*c));
    if (!c)
        return kvt_fail(KVT_ENOMEM, "ec control client: out of memory");
    if (on) {
        c->curve = true;
        memcpy(c->server_key, curve->server_key, 40);
        memcpy(c->public_key, curve->public_key, 40);
        memcpy(c->secret_key, curve->secret_key, 40);
    }
    int room = kvi_fd_room(16, "ec control client");
    c->ctx = room ? NULL : zmq_ctx_new();
    if (room) {
        free(c);
        return room;
    }
    if (!c->ctx) {
        free(c);
        return kvt_fail(KVT_EIO, "ec control client: %s", zmq_strerror(zmq_errno()));
    }
    c->timeout_ms = timeout_ms;
    *out = c;
    return 0;
}

static void drop(kvi_ecc_client *c, uint32_t i)
{
    zmq_close(c->peer[i].sock);
    c->peer[i] = c->peer[--c->n];
}

void kvi_ecc_client_destroy(kvi_ecc_client *c)
{
    if (!c)
        return;
    while (c->n)
        drop(c, 0);
    zmq_ctx_term(c->ctx);
    free(c->buf);
    free(c);
}

static int zfail(const char *what, const char *ep)
{
    int e = zmq_errno();
    if (e == EAGAIN)
        return kvt_fail(KVT_EIO, "ec control: %s %s: no answer (timed out)", what, ep);
    return kvt_fail(KVT_EIO, "ec control: %s %s: %s", what, ep, zmq_strerror(e));
}

/* The socket for ep, connected on first use; its slot in *slot. */
static int peer_socket(kvi_ecc_client *c, const char *ep, uint32_t *slot)
{
    for (uint32_t i = 0; i < c->n; i++)
        if (strcmp(c->peer[i].ep, ep) == 0) {
            *slot = i;
            return 0;
        }
    if (strlen(ep) >= sizeof(c->peer[0].ep))
        return kvt_fail(KVT_EINVAL, "ec control: endpoint too long: %.40s...", ep);
    if (c->n == MAX_PEERS) /* many consumers: forget one (it reconnects when needed) */
        drop(c, c->next_evict++ % MAX_PEERS);
    void *s = zmq_socket(c->ctx, ZMQ_REQ);
    if (!s)
        return zfail("socket for", ep);
    int zero = 0, one = 1;
    int64_t maxmsg = KVT_ECC_MAX_MSG;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(s, ZMQ_IPV6, &one, sizeof(one));
    zmq_setsockopt(s, ZMQ_RCVTIMEO, &c->timeout_ms, sizeof(c->timeout_ms));
    zmq_setsockopt(s, ZMQ_SNDTIMEO, &c->timeout_ms, sizeof(c->timeout_ms));
    zmq_setsockopt(s, ZMQ_MAXMSGSIZE, &maxmsg, sizeof(maxmsg));
    kvi_ecc_curve k = {c->server_key, c->public_key, c->secret_key};
    int crc = c->curve ? kvi_ecc_curve_client(s, &k) : 0;
    if (crc) {
        zmq_close(s);
        return crc;
    }
    if (zmq_connect(s, ep) != 0) {
        int rc = zfail("connect to", ep);
        zmq_close(s);
        return rc;
    }
    snprintf(c->peer[c->n].ep, sizeof(c->peer[0].ep), "%s", ep);
    c->peer[c->n].sock = s;
    *slot = c->n++;
    return 0;
}

static int exchange(kvi_ecc_client *c, void *s, const char *ep, const kvi_ecc_request *req,
                    kvi_ecc_reply *rep)
{
    size_t need = kvi_ecc_request_encoded_size(req), len;
    if (need > c->cap) {
        uint8_t *b = realloc(c->buf, need);
        if (!b)
            return kvt_fail(KVT_ENOMEM, "ec control: out of memory for a %zu-byte request", need);
        c->buf = b;
        c->cap = need;
    }
    int rc = kvi_ecc_request_encode(req, c->buf, c->cap, &len);
    if (rc)
        return rc;
    if (zmq_send(s, c->buf, len, 0) < 0)
        return zfail("send to", ep);
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, s, 0) < 0) {
        zmq_msg_close(&m);
        return zfail("reply from", ep);
    }
    rc = zmq_msg_more(&m) ? kvt_fail(KVT_EPROTO, "ec control: a reply of several frames")
                          : kvi_ecc_reply_decode(rep, zmq_msg_data(&m), zmq_msg_size(&m));
    zmq_msg_close(&m);
    if (!rc)
        rc = kvi_ecc_reply_check(rep, req);
    return rc;
}

int kvi_ecc_client_call(kvi_ecc_client *c, const char *ep, const kvi_ecc_request *req,
                        kvi_ecc_reply *rep)
{
    if (!c || !ep || !req || !rep)
        return kvt_fail(KVT_EINVAL, "ec control: call: NULL argument");
    uint32_t slot = 0;
    int rc = peer_socket(c, ep, &slot);
    if (rc)
        return rc;
    rc = exchange(c, c->peer[slot].sock, ep, req, rep);
    if (rc) {
        drop(c, slot); /* stuck mid-exchange, or a peer that speaks nonsense */
        char what[200];
        snprintf(what, sizeof(what), "ec control: %s to %s", kvi_ecc_op_name(req->op), ep);
        return kvi_fail_wrap(rc, what);
    }
    if (rep->code) /* the server refused the whole request: its code and words */
        return kvt_fail(rep->code, "ec control: %s to %s: %s", kvi_ecc_op_name(req->op), ep,
                        rep->error.ptr);
    return 0;
}
