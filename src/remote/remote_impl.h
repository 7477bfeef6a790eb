/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The remote tier's own state, shared by its files (and nothing else):
 *   remote.c   configuration, create, destroy, composition, stats
 *   owner.c    the server thread: registration, sessions, serving reads
 *   publish.c  slot records, publish, withdraw, lookup, block tags
 *   reader.c   reads: sessions with owners, posted receives, the poll loop, tag checks
 * The directory (dir_redis.c, remote_internal.h) and the read channel's wire (chan_wire.c)
 * and keys (auth.c) sit below them.
 */
#ifndef KVT_REMOTE_IMPL_H
#define KVT_REMOTE_IMPL_H

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>
#include <openssl/crypto.h>
#include <zmq.h>

#include "base/error.h"
#include "base/hash.h"
#include "base/log.h"
#include "port/remote_port.h"
#include "base/util.h"
#include "net/ucx.h"
#include "remote/auth.h"
#include "remote/remote_internal.h"

#define REPUBLISH_BATCH 1024u
#define MAX_SESSIONS    1024u /* connections an owner keeps a session for (oldest dropped) */
#define SEND_WINDOW     16u   /* sends in flight per piece of a block */
#define MAX_SEND_WINDOW 256u
#define MAX_REQ_BYTES   (96u + KVI_RADDR_MAX + KVT_REMOTE_MAX_READ * (12u + 32u))
#define MAX_REP_BYTES   (64u + KVT_REMOTE_MAX_READ * 20u)

typedef struct slotrec {
    uint64_t gen;
    uint8_t tag[KVI_RTAG]; /* GMAC of the hash and the bytes at publish (auth.h) */
    bool published;
    uint8_t hash[KVT_REMOTE_MAX_HASH];
} slotrec;

/* An owner in a table of owners (the lookup side's, the reader's): who and where, its name
 * for messages, and the lookup or read that last named it. */
typedef struct peer_key {
    kvt_remote_peer id;
    char name[KVT_REMOTE_NAME_MAX + KVI_RDIR_EP_MAX + 4];
    uint64_t used;
} peer_key;

/* An owner as a reader sees it: where it is, and the session of the connection to it. */
typedef struct rpeer {
    peer_key k;
    void *sock; /* DEALER; NULL until used or after a failure */
    /* the session: none, hello sent (nr kept), or ready (keys derived) */
    enum { SESS_NONE, SESS_HELLO, SESS_READY } sess;
    uint8_t nr[KVI_RNONCE];
    uint8_t er[KVI_RDH], er_priv[KVI_RDH]; /* this handshake's key pair (the private half
                                              wiped once the session keys exist) */
    uint8_t mac_key[KVI_RKEY], enc_key[KVI_RKEY];
    uint8_t block_key[KVI_RKEY]; /* the owner's, from its boot id */
    uint64_t seq;
} rpeer;

/* A connection as the owner sees it (routing id), once it said hello. */
typedef struct osess {
    uint8_t id[256];
    uint32_t id_len;
    uint8_t nr[KVI_RNONCE], no[KVI_RNONCE];
    uint8_t mac_key[KVI_RKEY], enc_key[KVI_RKEY];
    uint64_t last_seq;
    uint64_t used; /* tick of its last message: the oldest goes first when the table is full */
} osess;

typedef struct zombie {
    kvi_ucx_recv *r;
    struct zombie *next;
} zombie;

struct kvt_remote {
    kvi_remote_port rport; /* first: the offload manager's way in (port/remote_port.h) */
    kvt_remote_config cfg;
    /* a block's pieces, in order: one array per piece, n_slots blocks each (one piece for a
     * plain region; a reader that serves nothing still knows their sizes) */
    kvt_region *piece;
    uint32_t n_pieces;
    bool serves;      /* region or regions with slots */
    bool lookup_only; /* KVT_REMOTE_NO_RANK: the scheduler's directory client */
    uint32_t parts;   /* ranks of every instance of the space: a block's parts */
    char *strs;       /* copies of the config's strings; cfg.instance is this rank's name
                         ("<instance>#<rank>" with ranks > 1), base the instance's */
    const char *base;
    char endpoint[KVI_RDIR_EP_MAX + 1];
    kvi_rdir_self self;
    kvi_rdir dir;     /* the lookup side's connection */
    kvi_rdir dir_pub; /* the publisher side's (publish, withdraw) */
    kvi_rdir dir_srv; /* the server thread's */
    _Atomic uint64_t epoch;
    bool registered_once;

    pthread_mutex_t mu; /* slots */
    slotrec *slots;
    /* the publisher side's scratch for publish and withdraw (KVT_REMOTE_MAX_READ entries; one
     * thread at a time calls them): no allocation on the engine's store path */
    uint8_t *sc_hashes;
    uint32_t *sc_slots;
    uint64_t *sc_gens;

    void *zctx;
    void *router;
    uint16_t port;
    kvi_ucx *ucx_srv, *ucx_cli;
    pthread_t thr;
    bool thr_started;
    atomic_bool stop;

    /* the lookup side (lookup, lookup_peer, read, read_slots: one thread at a time): the owners
     * the last lookups named, by who and where only (kvt_remote_loc.peer indexes lk) */
    peer_key lk[KVT_REMOTE_MAX_PEERS];
    uint32_t n_lk;
    uint64_t lookups_seq;
    kvi_rdir_hit *hits; /* KVT_REMOTE_MAX_READ */

    /* the reader side (reads: one at a time, under rd_mu, on any thread; it may run beside the
     * lookup side): a connection and session per owner, the UCX worker the bytes land through,
     * its own GCM context */
    pthread_mutex_t rd_mu;
    rpeer peers[KVT_REMOTE_MAX_PEERS];
    uint32_t n_peers;
    uint64_t reads_seq;
    uint64_t next_req;
    zombie *zombies;
    kvi_rgcm *gcm_rd;

    /* keys (auth.h): the space's, this process's boot id and the block key it publishes under */
    kvi_rkeys keys;
    uint8_t boot[KVI_RBOOT];
    uint8_t block_key[KVI_RKEY];
    kvi_rgcm *gcm; /* the caller's (publish, reads) */
    /* the server thread's sessions */
    osess *sess;
    uint32_t n_sess;
    uint64_t sess_tick;

    kvt_remote_stats st; /* the lookup side's counters */
    _Atomic uint64_t a_registrations, a_served, a_served_stale, a_served_bytes, a_refused,
        a_handshakes, a_auth_failures;
    /* the publisher side's and the reader side's (kvt_remote_get_stats may run on the lookup
     * side meanwhile) */
    _Atomic uint64_t a_published, a_withdrawn, a_pub_dropped, a_pub_dir_errors;
    _Atomic uint64_t a_reads, a_read_blocks, a_read_ok, a_read_stale, a_read_failed, a_read_bytes;
};

/* Piece j of slot s. */
static inline uint8_t *piece_at(const kvt_remote *r, uint32_t j, uint32_t s)
{
    return (uint8_t *)(uintptr_t)(r->piece[j].base + (uint64_t)s * r->piece[j].block_bytes);
}

/* The pieces of this instance's slot s. */
static inline void slot_pieces(const kvt_remote *r, uint32_t s, uint8_t **out)
{
    for (uint32_t j = 0; j < r->n_pieces; j++)
        out[j] = piece_at(r, j, s);
}

static inline void add(_Atomic uint64_t *c, uint64_t v)
{
    atomic_fetch_add_explicit(c, v, memory_order_relaxed);
}

/* The nonce of block i of request seq, encrypted under a session. */
static inline void enc_nonce(uint64_t seq, uint32_t i, uint8_t nonce[12])
{
    for (int b = 0; b < 8; b++)
        nonce[b] = (uint8_t)(seq >> (8 * b));
    for (int b = 0; b < 4; b++)
        nonce[8 + b] = (uint8_t)(i >> (8 * b));
}

/* The base UCX tag of a session's request seq of n blocks of np pieces each: piece j of block
 * k travels with tag ^ (k * np + j), the bits above are the session's (kvi_rauth_tag), so a
 * relay that sees the request cannot send under them first; reader and owner both compute it. */
static inline int read_tag(const uint8_t mac_key[KVI_RKEY], uint64_t seq, uint32_t n, uint32_t np,
                           uint64_t *tag)
{
    int rc = kvi_rauth_tag(mac_key, seq, tag);
    uint64_t span = 1;
    while (span < (uint64_t)n * np)
        span <<= 1;
    *tag &= ~(span - 1);
    return rc;
}

static inline int zfail(const char *what)
{
    return kvt_fail(KVT_EIO, "remote: %s: %s", what, zmq_strerror(zmq_errno()));
}

static inline void close_peer(rpeer *p)
{
    if (p->sock)
        zmq_close(p->sock);
    p->sock = NULL;
    p->sess = SESS_NONE;
}

/* How an owner's entry was found (kvi_remote_peer_slot). */
enum { PEER_SAME, PEER_EPOCH, PEER_NEW };

/* publish.c */
int kvi_remote_block_tag(const kvt_remote *r, kvi_rgcm *g, const uint8_t *key, uint32_t slot,
                         uint64_t gen, const uint8_t *hash, uint8_t *const *piece,
                         uint8_t tag[KVI_RTAG]);
uint32_t kvi_remote_peer_slot(void *table, size_t stride, uint32_t *n, const kvt_remote_peer *id,
                              uint64_t seq, int *kind);
void kvi_remote_peer_key_set(peer_key *k, const kvt_remote_peer *id, uint64_t seq);
/* owner.c */
int kvi_remote_enter(kvt_remote *r, kvi_rdir *dir);
void *kvi_remote_server_main(void *arg);
/* remote.c */
int kvi_remote_map_pieces(kvt_remote *r, kvi_ucx *u);
/* reader.c */
int kvi_remote_bury(kvt_remote *r, bool final);

#endif
