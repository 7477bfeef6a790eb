/* SPDX-License-Identifier: Apache-2.0 */
/*
 * CURVE on the encoder cache's control plane (ctl.h), both sides: a client's keys checked and
 * set on its sockets; a server's sockets made CURVE servers, and with an allowlist the ZAP
 * handler (RFC 27) that admits only the listed client keys. The handler's socket is the
 * server thread's: it polls it beside its own and calls kvi_ecc_zap_answer when it is readable.
 */
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "base/error.h"
#include "net/ec_ctl.h"

#define ZAP_ENDPOINT "inproc://zeromq.zap.01"

static bool z85_key(const char *k, uint8_t raw[32])
{
    return k && strlen(k) == 40 && zmq_z85_decode(raw, k) != NULL;
}

int kvi_ecc_curve_check(const kvi_ecc_curve *k, bool *on)
{
    uint8_t raw[32];
    *on = false;
    if (!k || (!k->server_key && !k->public_key && !k->secret_key))
        return 0;
    if (!z85_key(k->server_key, raw) || !z85_key(k->public_key, raw) ||
        !z85_key(k->secret_key, raw))
        return kvt_fail(KVT_EINVAL, "ec control: CURVE needs the server's public key and this "
                                    "side's key pair, each 40 Z85 characters");
    if (!zmq_has("curve"))
        return kvt_fail(KVT_EUNSUPPORTED, "ec control: this libzmq was built without CURVE");
    *on = true;
    return 0;
}

int kvi_ecc_curve_client(void *sock, const kvi_ecc_curve *k)
{
    bool on;
    int rc = kvi_ecc_curve_check(k, &on);
    if (rc || !on)
        return rc;
    if (zmq_setsockopt(sock, ZMQ_CURVE_SERVERKEY, k->server_key, 40) ||
        zmq_setsockopt(sock, ZMQ_CURVE_PUBLICKEY, k->public_key, 40) ||
        zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, k->secret_key, 40))
        return kvt_fail(KVT_EIO, "ec control: CURVE keys refused: %s", zmq_strerror(zmq_errno()));
    return 0;
}

static int zap_listen(void *ctx, const char *const *clients, kvi_ecc_zap *z)
{
    uint32_t n = 0;
    while (clients[n])
        n++;
    z->clients = calloc(n ? n : 1, 32);
    if (!z->clients)
        return kvt_fail(KVT_ENOMEM, "ec server: out of memory");
    for (uint32_t i = 0; i < n; i++)
        if (!z85_key(clients[i], z->clients[i]))
            return kvt_fail(KVT_EINVAL, "ec server: curve client key %u is not 40 Z85 characters",
                            i);
    z->n_clients = n;
    int zero = 0;
    if (!(z->sock = zmq_socket(ctx, ZMQ_REP)))
        return kvt_fail(KVT_EIO, "ec server: socket zap: %s", zmq_strerror(zmq_errno()));
    zmq_setsockopt(z->sock, ZMQ_LINGER, &zero, sizeof(zero));
    if (zmq_bind(z->sock, ZAP_ENDPOINT) != 0)
        return kvt_fail(KVT_EIO, "ec server: failed to bind " ZAP_ENDPOINT ": %s",
                        zmq_strerror(zmq_errno()));
    return 0;
}

int kvi_ecc_curve_server(void *ctx, const char *secret_key, const char *const *clients,
                         void *const *socks, int n_socks, kvi_ecc_zap *z)
{
    uint8_t raw[32];
    memset(z, 0, sizeof(*z));
    if (!secret_key)
        return clients ? kvt_fail(KVT_EINVAL, "ec server: curve_clients without a "
                                              "curve_secret_key")
                       : 0;
    if (!zmq_has("curve"))
        return kvt_fail(KVT_EUNSUPPORTED, "ec server: this libzmq was built without CURVE");
    if (!z85_key(secret_key, raw))
        return kvt_fail(KVT_EINVAL, "ec server: curve_secret_key is not 40 Z85 characters");
    int rc = clients ? zap_listen(ctx, clients, z) : 0;
    if (rc)
        return rc;
    int one = 1;
    for (int i = 0; i < n_socks; i++)
        if (zmq_setsockopt(socks[i], ZMQ_CURVE_SERVER, &one, sizeof(one)) ||
            zmq_setsockopt(socks[i], ZMQ_CURVE_SECRETKEY, secret_key, 40) ||
            zmq_setsockopt(socks[i], ZMQ_ZAP_DOMAIN, "kvtier", 6))
            return kvt_fail(KVT_EIO, "ec server: CURVE: %s", zmq_strerror(zmq_errno()));
    return 0;
}

bool kvi_ecc_zap_answer(kvi_ecc_zap *z)
{
    zmq_msg_t f[8];
    int n = 0;
    bool more = true;
    while (more && n < 8) {
        zmq_msg_init(&f[n]);
        if (zmq_msg_recv(&f[n], z->sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&f[n]);
            break;
        }
        more = zmq_msg_more(&f[n]);
        n++;
    }
    /* frames: version, request id, domain, address, identity, mechanism, client key */
    bool ok = false;
    if (n >= 7 && zmq_msg_size(&f[5]) == 5 && memcmp(zmq_msg_data(&f[5]), "CURVE", 5) == 0 &&
        zmq_msg_size(&f[6]) == 32)
        for (uint32_t i = 0; i < z->n_clients && !ok; i++)
            ok = memcmp(zmq_msg_data(&f[6]), z->clients[i], 32) == 0;
    if (n >= 2) {
        zmq_send(z->sock, "1.0", 3, ZMQ_SNDMORE);
        zmq_send(z->sock, zmq_msg_data(&f[1]), zmq_msg_size(&f[1]), ZMQ_SNDMORE);
        zmq_send(z->sock, ok ? "200" : "400", 3, ZMQ_SNDMORE);
        zmq_send(z->sock, ok ? "OK" : "client key not admitted", ok ? 2 : 23, ZMQ_SNDMORE);
        zmq_send(z->sock, "", 0, ZMQ_SNDMORE);
        zmq_send(z->sock, "", 0, 0);
    }
    for (int i = 0; i < n; i++)
        zmq_msg_close(&f[i]);
    return ok;
}

void kvi_ecc_zap_close(kvi_ecc_zap *z)
{
    if (z->sock)
        zmq_close(z->sock);
    free(z->clients);
    memset(z, 0, sizeof(*z));
}
