/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The encoder-cache control plane's messages (spec §4.2): what a producer or the consumer's
 * scheduler asks a consumer shard's control server, the server's replies, and the readiness
 * events it pushes. One binary encoding in the metadata's framing (docs/wire.md: header
 * "KVTM", version, kind 7 request / 8 reply / 9 event, body length), every field validated
 * on decode, canonical (a decoded message encodes to the same bytes).
 *
 * Decoded strings are NUL-terminated copies owned by the object; encoders read the caller's
 * strings (kvt_str) and never keep them. A failed decode leaves the object empty.
 */
#ifndef KVT_EC_CTL_H
#define KVT_EC_CTL_H

#include "base/bump.h"
#include "kvtier/ec.h"
#include "kvtier/meta.h"

enum kvi_ecc_op {
    KVT_ECC_PEERS = 1,      /* -> the shards' control ports */
    KVT_ECC_EVENT_PORT = 2, /* -> the port of this shard's event socket */
    KVT_ECC_STATUS = 3,     /* one transfer id -> its active record, if any */
    KVT_ECC_RESERVE = 4,    /* one item */
    KVT_ECC_RESERVE_BATCH = 5,
    KVT_ECC_COMPLETE = 6, /* one (transfer id, reservation id) */
    KVT_ECC_COMPLETE_BATCH = 7,
    KVT_ECC_CANCEL = 8,       /* one (transfer id, reservation id or "", abandon, refresh) */
    KVT_ECC_DATA_ADDRESS = 9, /* -> the shard's data-plane (UCX worker) address */
    KVT_ECC_CANCEL_BATCH = 10 /* cancels, 1..KVT_ECC_MAX_BATCH */
};

#define KVT_ECC_MAX_BATCH 4096u      /* items in one batch */
#define KVT_ECC_MAX_MSG   (8u << 20) /* bytes of any control message */
#define KVT_ECC_MAX_ADDR  8192u      /* bytes of a data-plane address */

/* One item of a request; which fields count depends on the op. */
typedef struct kvi_ecc_item {
    kvt_str transfer_id; /* every op with items */
    kvt_str mm_hash;     /* reserve */
    uint64_t nbytes;     /* reserve */
    uint32_t ndim;       /* reserve */
    uint64_t shape[KVT_EC_MAX_DIMS];
    kvt_str dtype;          /* reserve */
    kvt_str reservation_id; /* complete (32 hex digits), cancel ("" = the consumer's own) */
    bool abandon, refresh;  /* cancel (both need the reservation id) */
    /* reserve: the producer's secret (32 hex digits): only its holder is told the reservation
     * id again on a repeated reserve. cancel: the consumer's owner key, needed (and only
     * looked at) when reservation_id is "" */
    kvt_str client_key;
} kvi_ecc_item;

typedef struct kvi_ecc_request {
    uint32_t op;
    uint32_t n; /* 0 for peers and event_port, 1 for single ops, 1..KVT_ECC_MAX_BATCH */
    kvi_ecc_item *items;
    /* private */
    uint32_t cap;
    kvt_bump strings;
} kvi_ecc_request;

/* The outcome of one item. */
typedef struct kvi_ecc_result {
    int32_t code;  /* 0, or the KVT_E* code the shard answered for this item */
    kvt_str error; /* its message ("" when code is 0) */
    /* reserve: the reservation (kvt_ec_reply) and the data plane's tag for its bytes */
    kvt_str reservation_id;
    uint64_t offset, nbytes, tag;
    bool write, ready, cached, cancelled; /* cancel: cancelled = accepted */
    /* complete: pending = accepted, its bytes still arriving: the server completes it when
     * they land (readiness follows as an event), or abandons it when they never do */
    bool completed, became_ready, pending;
    /* status: found, then mm_hash, ready, nbytes and the tensor (never the reservation id) */
    bool found;
    kvt_str mm_hash, dtype;
    uint32_t ndim;
    uint64_t shape[KVT_EC_MAX_DIMS];
} kvi_ecc_result;

typedef struct kvi_ecc_reply {
    uint32_t op;
    int32_t code;  /* the whole request failed (malformed, shutting down): 0 or KVT_E* */
    kvt_str error; /* its message */
    uint32_t n;    /* results, one per request item (code 0 only) */
    kvi_ecc_result *results;
    uint32_t n_ports; /* peers: the shards' control ports, in rank order */
    uint32_t ports[KVT_EC_MAX_SHARDS];
    uint32_t port;            /* event_port */
    const uint8_t *data_addr; /* data_address: opaque bytes, 1..KVT_ECC_MAX_ADDR */
    uint32_t data_addr_len;
    /* private */
    uint32_t cap;
    kvt_bump strings;
} kvi_ecc_reply;

/* A readiness event (or an abandoned notice) pushed by a shard. */
typedef struct kvi_ecc_event {
    kvt_str transfer_id, mm_hash, reservation_id, dtype;
    uint64_t nbytes;
    uint32_t ndim;
    uint64_t shape[KVT_EC_MAX_DIMS];
    bool abandoned;
    uint32_t shard; /* the sending shard's rank */
    /* private */
    kvt_bump strings;
} kvi_ecc_event;

const char *kvi_ecc_op_name(uint32_t op);
/* The data plane's tag for a reservation: the first 64 bits of its (random) id. */
uint64_t kvi_ecc_rid_tag(const char *reservation_id);
/* Sets a data_address reply's bytes (copied). */
int kvi_ecc_reply_set_address(kvi_ecc_reply *r, const void *addr, uint32_t len);

void kvi_ecc_request_init(kvi_ecc_request *r);
void kvi_ecc_request_clear(kvi_ecc_request *r);
void kvi_ecc_request_release(kvi_ecc_request *r);
/* Starts a request of op (clears r). */
void kvi_ecc_request_begin(kvi_ecc_request *r, uint32_t op);
/* Appends an item (its strings are referenced, not copied, until r is cleared). */
int kvi_ecc_request_add(kvi_ecc_request *r, const kvi_ecc_item *it);
int kvi_ecc_request_validate(const kvi_ecc_request *r);
size_t kvi_ecc_request_encoded_size(const kvi_ecc_request *r);
int kvi_ecc_request_encode(const kvi_ecc_request *r, void *buf, size_t cap, size_t *len);
int kvi_ecc_request_decode(kvi_ecc_request *r, const void *buf, size_t len);

void kvi_ecc_reply_init(kvi_ecc_reply *r);
void kvi_ecc_reply_clear(kvi_ecc_reply *r);
void kvi_ecc_reply_release(kvi_ecc_reply *r);
/* Starts a reply to op (clears r). */
void kvi_ecc_reply_begin(kvi_ecc_reply *r, uint32_t op);
/* Appends a result; its strings are copied. */
int kvi_ecc_reply_add(kvi_ecc_reply *r, const kvi_ecc_result *res);
/* Makes r a whole-request failure (results dropped); the message is copied. */
int kvi_ecc_reply_fail(kvi_ecc_reply *r, int code, const char *msg);
int kvi_ecc_reply_validate(const kvi_ecc_reply *r);
size_t kvi_ecc_reply_encoded_size(const kvi_ecc_reply *r);
int kvi_ecc_reply_encode(const kvi_ecc_reply *r, void *buf, size_t cap, size_t *len);
int kvi_ecc_reply_decode(kvi_ecc_reply *r, const void *buf, size_t len);
/* The reply answers req: same op and, unless it failed as a whole, one result per item. */
int kvi_ecc_reply_check(const kvi_ecc_reply *rep, const kvi_ecc_request *req);

void kvi_ecc_event_init(kvi_ecc_event *e);
void kvi_ecc_event_release(kvi_ecc_event *e);
int kvi_ecc_event_validate(const kvi_ecc_event *e);
size_t kvi_ecc_event_encoded_size(const kvi_ecc_event *e);
int kvi_ecc_event_encode(const kvi_ecc_event *e, void *buf, size_t cap, size_t *len);
int kvi_ecc_event_decode(kvi_ecc_event *e, const void *buf, size_t len);

/* ---- keys: a producer's client key, the consumer's owner key (owner.c) --------------------- */

/* 0 when k is 32 lowercase hex digits. */
int kvi_ecc_key_check(const char *k);
/* 128 random bits from the kernel, as 32 hex digits. */
int kvi_ecc_key_random(char out[KVT_EC_RID_LEN + 1]);
/* Both are keys and equal (in time independent of where they differ). */
bool kvi_ecc_key_equal(const char *a, const char *b);
/* The owner key file of the server on control port `port` (kvt_ec_owner_key_path): written
 * (0600, atomically) by a server that made its key, read by an inbox without a configured
 * key, removed by the server that wrote it. */
int kvi_ecc_owner_write(uint32_t port, const char *key);
int kvi_ecc_owner_read(uint32_t port, char out[KVT_EC_RID_LEN + 1]);
void kvi_ecc_owner_remove(uint32_t port, const char *key);
/* The event socket of the server on control port `port` when its events stay on this host:
 * "ipc://<the owner key's directory>/ec-events-<port>" (0700, this user's: other users cannot
 * connect). The server binds it, the inbox of the same host and user connects to it. */
int kvi_ecc_event_path(uint32_t port, char *buf, size_t cap);

/* ---- client ------------------------------------------------------------------------------ */

/* CURVE keys of a client: the server's public key and the client's pair (Z85, 40 chars). */
typedef struct kvi_ecc_curve {
    const char *server_key, *public_key, *secret_key;
} kvi_ecc_curve;
/* 0 when k is NULL or its keys are all unset (no CURVE), or all set, well formed and libzmq
 * has CURVE; KVT_EINVAL / KVT_EUNSUPPORTED otherwise. *on says which. */
int kvi_ecc_curve_check(const kvi_ecc_curve *k, bool *on);
/* Makes sock a CURVE client of k (a no-op without keys). */
int kvi_ecc_curve_client(void *sock, const kvi_ecc_curve *k);

/* ---- CURVE on a server (ec_curve.c) --------------------------------------------------------- */

/* The ZAP handler of a server with an allowlist: its socket (NULL without one) and the admitted
 * client keys (raw). */
typedef struct kvi_ecc_zap {
    void *sock;
    uint8_t (*clients)[32];
    uint32_t n_clients;
} kvi_ecc_zap;
/* Makes socks CURVE servers with secret_key (Z85), and with clients (a NULL-terminated list of
 * public keys) binds z's handler in ctx; without secret_key nothing (clients without it is
 * KVT_EINVAL). z is zeroed first: kvi_ecc_zap_close it whatever this returns. */
int kvi_ecc_curve_server(void *ctx, const char *secret_key, const char *const *clients,
                         void *const *socks, int n_socks, kvi_ecc_zap *z);
/* Answers the one ZAP request waiting on z->sock: whether its client key was admitted. */
bool kvi_ecc_zap_answer(kvi_ecc_zap *z);
void kvi_ecc_zap_close(kvi_ecc_zap *z);

/* REQ sockets to control servers, one per endpoint, reused; one client per thread. curve may
 * be NULL (copied otherwise). */
typedef struct kvi_ecc_client kvi_ecc_client;
int kvi_ecc_client_create(int timeout_ms, const kvi_ecc_curve *curve, kvi_ecc_client **out);
void kvi_ecc_client_destroy(kvi_ecc_client *c);
/* One exchange with the server at ep ("tcp://host:port"): encode, send, wait at most the
 * timeout, decode, check that the reply answers req. Any failure discards the socket (the next
 * call reconnects) and comes back as KVT_EIO (no answer, connection), KVT_EPROTO (a reply that
 * does not decode or match) or the server's own code and message when it refused the request
 * as a whole. Per-item outcomes are in rep->results. */
int kvi_ecc_client_call(kvi_ecc_client *c, const char *ep, const kvi_ecc_request *req,
                        kvi_ecc_reply *rep);

#endif
