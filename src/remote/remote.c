/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvt_remote (kvtier/remote.h): a directory (remote_internal.h) and the ZeroMQ + UCX data
 * channel, composed, with the space's credential turned into keys (auth.h) that never leave
 * the process.
 *
 * The owner side is one thread: it answers handshakes and serves read requests arriving on a
 * ROUTER socket, and keeps the liveness key fresh (registering again, with a new epoch, when
 * the key is gone: a Redis restart or a stall longer than ttl_ms; it then publishes again
 * every block it holds). A connection's first message is a hello; the owner answers with its
 * nonce, boot id and a proof of membership, and keeps the connection's session (bounded
 * table, oldest dropped). A request is read only once its MAC under that session checks and
 * its sequence number grew (a replay is refused); then the epoch (a request for entries of an
 * earlier start of this instance gets nothing) and per block the slot's record (published,
 * same generation and hash) and, with owner_checksum, the slot's bytes against the tag
 * recorded at publish. The bytes go by UCX tagged sends into the receives the reader posted
 * (encrypted under the session on the way, when asked); after the sends completed the
 * generation is looked at again, so a slot withdrawn meanwhile is reported stale; the reply,
 * MACed, carries each sent block's tag.
 *
 * The reader side runs on the caller's thread: per owner, a handshake when its connection has
 * no session yet (the owner's proof checked: a directory entry naming a process without the
 * credential never gets a request, an address or a tag), then receives posted and one request,
 * all owners at once in one poll loop (ZeroMQ sockets and UCX's event fd) until every block is
 * decided or timeout_ms passed. A block counts only when its tag checks on the bytes that
 * landed: GMAC under the owner's block key (or GCM decryption under the session). A socket
 * whose owner did not answer is closed (the next read reconnects and shakes hands again);
 * receives not completed are cancelled before read returns.
 */
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
#include "base/remote_port.h"
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
    kvi_remote_port rport; /* first: the offload manager's way in (base/remote_port.h) */
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
static uint8_t *piece_at(const kvt_remote *r, uint32_t j, uint32_t s)
{
    return (uint8_t *)(uintptr_t)(r->piece[j].base + (uint64_t)s * r->piece[j].block_bytes);
}

/* The tag of a block (its pieces at piece(j)) published as (slot, gen) with hash: GMAC under
 * key (auth.h). 0, or libcrypto's failure. Nothing orders an owner's read of its slot's bytes
 * after a write into the slot by another agent (a worker, a buggy store): comparing with the
 * tag recorded at publish is what catches that (tests/tsan.supp names this function). */
__attribute__((noinline)) static int block_tag(const kvt_remote *r, kvi_rgcm *g, const uint8_t *key,
                                               uint32_t slot, uint64_t gen, const uint8_t *hash,
                                               uint8_t *const *piece, uint8_t tag[KVI_RTAG])
{
    uint8_t nonce[12];
    kvi_rauth_block_nonce(slot, gen, nonce);
    int rc = kvi_rgcm_begin(g, key, nonce, 0);
    for (uint32_t j = 0; !rc && j < r->n_pieces; j++)
        rc = kvi_rgcm_piece(g, piece[j], NULL, r->piece[j].block_bytes);
    if (!rc)
        rc = kvi_rgcm_aad(g, hash, r->cfg.hash_len);
    return rc ? rc : kvi_rgcm_tag(g, tag);
}

/* The pieces of this instance's slot s. */
static void slot_pieces(const kvt_remote *r, uint32_t s, uint8_t **out)
{
    for (uint32_t j = 0; j < r->n_pieces; j++)
        out[j] = piece_at(r, j, s);
}

static void add(_Atomic uint64_t *c, uint64_t v)
{
    atomic_fetch_add_explicit(c, v, memory_order_relaxed);
}

static bool name_ok(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n > KVT_REMOTE_NAME_MAX)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '.' || c == '-'))
            return false;
    }
    return true;
}

void kvt_remote_config_init(kvt_remote_config *c)
{
    if (!c)
        return;
    memset(c, 0, sizeof(*c));
    c->hash_len = 16;
    c->ttl_ms = 3000;
    c->timeout_ms = 2000;
    c->directory_timeout_ms = 250;
    c->retry_ms = 1000;
    c->owner_checksum = 1;
}

/* The names: directory, space, instance, and rank of ranks (the instance's per-rank name fits). */
static int validate_names(const kvt_remote_config *c)
{
    if (!c->directory || !*c->directory)
        return kvt_fail(KVT_EINVAL, "remote: directory (the Redis server) is required");
    if (!name_ok(c->space) || !name_ok(c->instance))
        return kvt_fail(KVT_EINVAL,
                        "remote: space and instance must be 1..%u bytes of "
                        "[A-Za-z0-9_.-]",
                        KVT_REMOTE_NAME_MAX);
    if (c->ranks > KVT_REMOTE_MAX_RANKS ||
        (c->rank != KVT_REMOTE_NO_RANK && c->rank >= (c->ranks ? c->ranks : 1)))
        return kvt_fail(KVT_EINVAL,
                        "remote: rank %u of %u ranks (ranks 0..%u; rank below ranks, or "
                        "KVT_REMOTE_NO_RANK for lookups only)",
                        c->rank, c->ranks, KVT_REMOTE_MAX_RANKS);
    size_t suffix = c->ranks > 10 ? 3 : 2; /* "#<rank>" of the highest rank */
    if (c->ranks > 1 && c->rank != KVT_REMOTE_NO_RANK &&
        strlen(c->instance) + suffix > KVT_REMOTE_NAME_MAX)
        return kvt_fail(KVT_EINVAL,
                        "remote: instance '%s': a rank's name is \"<instance>#<rank>\", at most "
                        "%u bytes; with %u ranks the instance may have %zu",
                        c->instance, KVT_REMOTE_NAME_MAX, c->ranks, KVT_REMOTE_NAME_MAX - suffix);
    return 0;
}

/* The memory served and read into: one region or several (n_regions), their block bytes
 * (block_bytes 0: theirs) and slots. */
static int validate_regions(const kvt_remote_config *c)
{
    uint64_t bb = c->block_bytes;
    if (c->regions) {
        if (c->region || c->n_regions == 0 || c->n_regions > KVT_MAX_REGIONS)
            return kvt_fail(KVT_EINVAL,
                            "remote: regions: 1..%u of them (n_regions %u), and no "
                            "region beside them",
                            KVT_MAX_REGIONS, c->n_regions);
        uint64_t sum = 0;
        for (uint32_t j = 0; j < c->n_regions; j++) {
            if (c->regions[j].block_bytes == 0 || c->regions[j].block_bytes > (1ull << 32) ||
                (c->n_slots && !c->regions[j].base))
                return kvt_fail(KVT_EINVAL, "remote: region %u: no base or block bytes", j);
            sum += c->regions[j].block_bytes;
        }
        if (bb && bb != sum)
            return kvt_fail(KVT_EINVAL,
                            "remote: block_bytes %" PRIu64 " is not the regions' %" PRIu64
                            " (0: theirs)",
                            bb, sum);
        bb = sum;
    } else if (c->n_regions) {
        return kvt_fail(KVT_EINVAL, "remote: n_regions without regions");
    }
    if (bb == 0 || bb > (1ull << 32))
        return kvt_fail(KVT_EINVAL, "remote: block_bytes must be 1..4 GiB");
    if ((c->region || (c->regions && c->n_slots)) &&
        (c->n_slots == 0 || c->n_slots > (1ull << 40) / bb))
        return kvt_fail(KVT_EINVAL, "remote: a region needs 1.. slots (n_slots %u)", c->n_slots);
    if (!c->region && !c->regions && c->n_slots)
        return kvt_fail(KVT_EINVAL, "remote: n_slots without a region");
    return 0;
}

static int validate_hash_len(const kvt_remote_config *c)
{
    if (c->hash_len == 0 || c->hash_len > KVT_REMOTE_MAX_HASH)
        return kvt_fail(KVT_EINVAL, "remote: hash_len %u (1..%u)", c->hash_len,
                        KVT_REMOTE_MAX_HASH);
    return 0;
}

static int validate(const kvt_remote_config *c)
{
    int rc = kvi_check_reserved(c->reserved, sizeof(c->reserved), "remote config");
    if (rc || (rc = validate_names(c)))
        return rc;
    if (c->rank == KVT_REMOTE_NO_RANK) {
        if (c->region || c->regions || c->n_slots)
            return kvt_fail(KVT_EINVAL, "remote: a lookup-only client (KVT_REMOTE_NO_RANK) "
                                        "serves no region");
        if ((rc = validate_hash_len(c)))
            return rc;
        if (c->directory_timeout_ms == 0)
            return kvt_fail(KVT_EINVAL, "remote: directory_timeout_ms must be set");
        return 0; /* no server, no reads: no listen host, credential or block size */
    }
    if (!c->listen_host || !*c->listen_host || strlen(c->listen_host) > 64 ||
        (c->advertise_host && (!*c->advertise_host || strlen(c->advertise_host) > 64)))
        return kvt_fail(KVT_EINVAL, "remote: listen_host (and advertise_host) must be 1..64 "
                                    "bytes");
    size_t cl = c->credential ? strlen(c->credential) : 0;
    if (cl < 16 || cl > KVI_RCRED_MAX)
        return kvt_fail(KVT_EINVAL,
                        "remote: credential must be 16..%u bytes (the space's "
                        "shared secret)",
                        KVI_RCRED_MAX);
    if ((rc = validate_regions(c)))
        return rc;
    if (c->directory_password &&
        (!*c->directory_password || strlen(c->directory_password) > KVI_RCRED_MAX * 2))
        return kvt_fail(KVT_EINVAL, "remote: directory_password must be 1..%u bytes (or NULL)",
                        KVI_RCRED_MAX * 2);
    if (c->owner_checksum > 1 || c->encrypt > 1)
        return kvt_fail(KVT_EINVAL, "remote: owner_checksum and encrypt are 0 or 1");
    if ((rc = validate_hash_len(c)))
        return rc;
    if (c->ttl_ms < 30 || c->timeout_ms == 0 || c->directory_timeout_ms == 0)
        return kvt_fail(KVT_EINVAL, "remote: ttl_ms (>= 30), timeout_ms and "
                                    "directory_timeout_ms must be set");
    return 0;
}

/* ---- registration (server thread, and once at create) ------------------------------------ */

static void republish(kvt_remote *r, kvi_rdir *dir, uint64_t epoch)
{
    uint8_t *hashes = malloc((size_t)REPUBLISH_BATCH * r->cfg.hash_len);
    uint32_t slots[REPUBLISH_BATCH];
    uint64_t gens[REPUBLISH_BATCH];
    if (!hashes)
        return;
    uint32_t s = 0;
    while (s < r->cfg.n_slots) {
        uint32_t n = 0;
        pthread_mutex_lock(&r->mu);
        for (; s < r->cfg.n_slots && n < REPUBLISH_BATCH; s++)
            if (r->slots[s].published) {
                memcpy(hashes + (size_t)n * r->cfg.hash_len, r->slots[s].hash, r->cfg.hash_len);
                slots[n] = s, gens[n] = r->slots[s].gen, n++;
            }
        pthread_mutex_unlock(&r->mu);
        if (n && dir->ops->publish(dir->d, &r->self, epoch, hashes, slots, gens, n))
            break;
    }
    free(hashes);
}

/* Enters the directory; 0 or the directory's code (KVT_EINVAL: refused for its seed). */
static int enter(kvt_remote *r, kvi_rdir *dir)
{
    uint64_t ep;
    int rc = dir->ops->enter(dir->d, &r->self, &ep);
    if (rc)
        return rc;
    atomic_store(&r->epoch, ep);
    KVT_LOG_I("remote: %s entered space %s as epoch %" PRIu64 " (%s)", r->cfg.instance,
              r->cfg.space, ep, r->endpoint);
    republish(r, dir, ep);
    add(&r->a_registrations, 1); /* counted once what it holds is published again */
    return 0;
}

static void heartbeat(kvt_remote *r)
{
    uint64_t ep = atomic_load(&r->epoch);
    if (ep) {
        int rc = r->dir_srv.ops->refresh(r->dir_srv.d, &r->self, ep);
        if (rc != KVT_ENOENT)
            return; /* fresh, or Redis unreachable (peers will see the key expire) */
        KVT_LOG_W("remote: %s: %s; entering again", r->cfg.instance, kvt_last_error());
        atomic_store(&r->epoch, 0);
    }
    int rc = enter(r, &r->dir_srv);
    if (rc && rc != KVT_EIO)
        KVT_LOG_W("remote: %s not registered: %s", r->cfg.instance, kvt_last_error());
}

/* ---- the owner: sessions -------------------------------------------------------------------- */

static osess *sess_find(kvt_remote *r, const void *id, size_t len)
{
    for (uint32_t i = 0; i < r->n_sess; i++)
        if (r->sess[i].id_len == len && memcmp(r->sess[i].id, id, len) == 0) {
            r->sess[i].used = ++r->sess_tick;
            return &r->sess[i];
        }
    return NULL;
}

/* A fresh session for connection id: its old one replaced, else a free entry, else the one
 * used longest ago among those whose reader never proved itself (a request that checked), and
 * only if every one did, the one used longest ago: a flood of hellos from strangers costs
 * other strangers their half-open sessions, not the members theirs. */
static osess *sess_new(kvt_remote *r, const void *id, size_t len)
{
    osess *s = sess_find(r, id, len);
    if (!s && r->n_sess < MAX_SESSIONS)
        s = &r->sess[r->n_sess++];
    for (int proven = 0; !s && proven < 2; proven++)
        for (uint32_t i = 0; i < r->n_sess; i++)
            if ((r->sess[i].last_seq != 0) == (proven != 0) && (!s || r->sess[i].used < s->used))
                s = &r->sess[i];
    memset(s, 0, sizeof(*s));
    memcpy(s->id, id, len);
    s->id_len = (uint32_t)len;
    s->used = ++r->sess_tick;
    return s;
}

/* A hello: a new session for this connection, answered with this owner's nonce, boot id and
 * proof of membership. 0 and *out_len, or the refusal (nothing is answered). */
static int on_hello(kvt_remote *r, const void *id, size_t id_len, const uint8_t *buf, size_t len,
                    uint8_t *out, size_t *out_len)
{
    kvi_rhello h;
    int rc = kvi_rhello_decode(buf, len, &h);
    if (rc)
        return rc;
    osess *s = sess_new(r, id, id_len);
    memcpy(s->nr, h.nr, KVI_RNONCE);
    kvi_rchal c = {.name = (const uint8_t *)r->cfg.instance,
                   .name_len = (uint32_t)strlen(r->cfg.instance)};
    memcpy(c.nr, h.nr, KVI_RNONCE);
    memcpy(c.er, h.er, KVI_RDH);
    memcpy(c.boot, r->boot, KVI_RBOOT);
    /* this handshake's key pair: the private half lives only until the session keys exist */
    uint8_t priv[KVI_RDH];
    kvi_rhs t = {s->nr, s->no, c.er, c.eo};
    if ((rc = kvi_rauth_random(s->no, KVI_RNONCE)) || (rc = kvi_rauth_ephemeral(priv, c.eo)) ||
        (rc = kvi_rauth_session(&r->keys, &t, priv, h.er, s->mac_key, s->enc_key)) ||
        (rc = kvi_rauth_proof(&r->keys, "owner", &t, r->cfg.instance, r->boot, c.proof))) {
        OPENSSL_cleanse(priv, sizeof(priv));
        s->id_len = 0; /* unusable */
        return rc;
    }
    OPENSSL_cleanse(priv, sizeof(priv));
    memcpy(c.no, s->no, KVI_RNONCE);
    kvi_rchal_encode(&c, out);
    *out_len = kvi_rchal_size(&c);
    return 0;
}

/* ---- the owner: serving one request --------------------------------------------------------- */

typedef struct serve_ctx {
    kvi_rreq_block blocks[KVT_REMOTE_MAX_READ];
    kvi_rrep_block out[KVT_REMOTE_MAX_READ];
    uint8_t want[KVT_REMOTE_MAX_READ][KVI_RTAG]; /* per block: the tag recorded at publish */
    uint64_t gen[KVT_REMOTE_MAX_READ];
    /* one send per piece of each block served, grown as requests need */
    kvi_ucx_send_item *items;
    uint32_t *item_block, cap;
    /* the request being served: its session, whether it asked for encryption, its seq */
    const osess *ss;
    bool enc, authed;
    uint64_t seq;
    const uint8_t *hashes[KVT_REMOTE_MAX_READ];
    kvi_rgcm *chk, *gcm; /* the owner's check of its bytes, the encryption of a block */
    uint8_t *stage;      /* encryption: one piece per window slot */
    size_t stage_piece;
    uint32_t stage_slots;
    kvt_remote *r;
} serve_ctx;

/* The nonce of block i of request seq, encrypted under a session. */
static void enc_nonce(uint64_t seq, uint32_t i, uint8_t nonce[12])
{
    for (int b = 0; b < 8; b++)
        nonce[b] = (uint8_t)(seq >> (8 * b));
    for (int b = 0; b < 4; b++)
        nonce[8 + b] = (uint8_t)(i >> (8 * b));
}

/* Just before item k is sent from window slot w (earlier ones in flight): at a block's first
 * piece, the bytes of all its pieces against the tag recorded at publish (always when the
 * block goes encrypted: the reader then sees the owner's encryption tag only); when
 * encrypted, the piece goes through the slot's staging buffer. A block that failed sends
 * nothing more. */
static int prep_item(void *arg, uint32_t k, uint32_t w)
{
    serve_ctx *sc = arg;
    kvt_remote *r = sc->r;
    uint32_t i = sc->item_block[k], j = k % r->n_pieces;
    kvi_rrep_block *o = &sc->out[i];
    if (o->status)
        return o->status;
    uint32_t slot = sc->blocks[i].slot;
    if (j == 0 && (r->cfg.owner_checksum || sc->enc)) {
        uint8_t tag[KVI_RTAG], *pc[KVT_MAX_REGIONS];
        slot_pieces(r, slot, pc);
        if (block_tag(r, sc->chk, r->block_key, slot, sc->gen[i], sc->hashes[i], pc, tag) ||
            !kvi_rauth_equal(tag, sc->want[i], KVI_RTAG)) {
            KVT_LOG_W("remote: slot %u's bytes changed since it was published (a store into a "
                      "published slot?); not served",
                      slot);
            o->status = KVT_ENOENT;
            return KVT_ENOENT;
        }
    }
    if (!sc->enc)
        return 0;
    uint8_t *dst = sc->stage + (size_t)w * sc->stage_piece;
    int rc = 0;
    if (j == 0) {
        uint8_t nonce[12];
        enc_nonce(sc->seq, i, nonce);
        if (!(rc = kvi_rgcm_begin(sc->gcm, sc->ss->enc_key, nonce, 1)))
            rc = kvi_rgcm_aad(sc->gcm, sc->hashes[i], r->cfg.hash_len);
    }
    if (!rc)
        rc = kvi_rgcm_piece(sc->gcm, sc->items[k].buf, dst, sc->items[k].len);
    if (!rc && j + 1 == r->n_pieces)
        rc = kvi_rgcm_tag(sc->gcm, o->tag);
    if (rc) {
        o->status = KVT_EIO;
        return KVT_EIO;
    }
    sc->items[k].buf = dst;
    return 0;
}

static int grow_items(serve_ctx *sc, uint32_t n)
{
    if (n <= sc->cap)
        return 0;
    kvi_ucx_send_item *it = realloc(sc->items, (size_t)n * sizeof(*it));
    if (it)
        sc->items = it;
    uint32_t *ib = it ? realloc(sc->item_block, (size_t)n * sizeof(*ib)) : NULL;
    if (!ib)
        return kvt_fail(KVT_ENOMEM, "remote: out of memory for a request of %u pieces", n);
    sc->item_block = ib;
    sc->cap = n;
    return 0;
}

/* The send window, and for encrypted requests a staging piece per window slot. */
static int send_window(serve_ctx *sc, uint32_t *window)
{
    kvt_remote *r = sc->r;
    *window = kvi_min_u32(SEND_WINDOW * r->n_pieces, MAX_SEND_WINDOW);
    if (!sc->enc || sc->stage)
        return 0;
    size_t piece = 0;
    for (uint32_t j = 0; j < r->n_pieces; j++)
        if (r->piece[j].block_bytes > piece)
            piece = r->piece[j].block_bytes;
    sc->stage = malloc(piece * *window);
    if (!sc->stage)
        return kvt_fail(KVT_ENOMEM, "remote: out of memory for encryption's staging");
    sc->stage_piece = piece;
    sc->stage_slots = *window;
    return 0;
}

/* The request's MAC under the session's key and its sequence (no replay): a request that
 * checks authenticates the reader; its first one counts as the handshake. */
static int check_request(kvt_remote *r, serve_ctx *sc, osess *ss, const uint8_t *buf, size_t len,
                         const kvi_rreq *q)
{
    if (!ss)
        return kvt_fail(KVT_ESTATE, "remote: a request on a connection without a session");
    uint8_t mac[KVI_RTAG];
    int rc = kvi_rauth_mac(ss->mac_key, "req", buf, len - KVI_RMAC, mac);
    if (rc)
        return rc;
    if (!kvi_rauth_equal(mac, buf + len - KVI_RMAC, KVI_RMAC) || q->seq <= ss->last_seq) {
        add(&r->a_auth_failures, 1);
        return kvt_fail(KVT_EINVAL, "remote: a request whose MAC does not check, or a replay");
    }
    if (ss->last_seq == 0)
        add(&r->a_handshakes, 1); /* the reader proved itself with its first request */
    ss->last_seq = q->seq;
    sc->authed = true;
    sc->ss = ss;
    sc->seq = q->seq;
    sc->enc = q->flags & KVI_RREQ_ENCRYPT;
    if (r->cfg.encrypt && !sc->enc)
        return kvt_fail(KVT_EINVAL, "remote: this owner serves encrypted reads only");
    if (q->hash_len != r->cfg.hash_len)
        return kvt_fail(KVT_EPROTO, "remote: hash_len %u, this space uses %u", q->hash_len,
                        r->cfg.hash_len);
    return 0;
}

/* The base UCX tag of a session's request seq of n blocks of np pieces each: piece j of block
 * k travels with tag ^ (k * np + j), the bits above are the session's (kvi_rauth_tag), so a
 * relay that sees the request cannot send under them first; reader and owner both compute it. */
static int read_tag(const uint8_t mac_key[KVI_RKEY], uint64_t seq, uint32_t n, uint32_t np,
                    uint64_t *tag)
{
    int rc = kvi_rauth_tag(mac_key, seq, tag);
    uint64_t span = 1;
    while (span < (uint64_t)n * np)
        span <<= 1;
    *tag &= ~(span - 1);
    return rc;
}

/* The sends of the blocks this owner holds as asked (slot, generation, hash, this epoch):
 * one per piece, into sc->items; the others answer "stale". Returns how many sends. */
static uint32_t plan_sends(kvt_remote *r, serve_ctx *sc, const kvi_rreq *q, uint64_t tag)
{
    uint64_t ep = atomic_load(&r->epoch);
    uint32_t ni = 0;
    for (uint32_t i = 0; i < q->n; i++) {
        const kvi_rreq_block *b = &q->blocks[i];
        kvi_rrep_block *o = &sc->out[i];
        o->status = KVT_ENOENT;
        memset(o->tag, 0, KVI_RTAG);
        if (!r->serves || q->epoch != ep || ep == 0 || b->slot >= r->cfg.n_slots)
            continue;
        pthread_mutex_lock(&r->mu);
        const slotrec *s = &r->slots[b->slot];
        bool ok =
            s->published && s->gen == b->generation && memcmp(s->hash, b->hash, q->hash_len) == 0;
        memcpy(sc->want[i], s->tag, KVI_RTAG);
        pthread_mutex_unlock(&r->mu);
        if (!ok)
            continue;
        o->status = 0;
        if (!sc->enc)
            memcpy(o->tag, sc->want[i], KVI_RTAG);
        sc->gen[i] = b->generation;
        sc->hashes[i] = b->hash;
        for (uint32_t j = 0; j < r->n_pieces; j++) { /* piece j of block i: tag ^ (i * np + j) */
            sc->items[ni] = (kvi_ucx_send_item){.addr = q->addr,
                                                .addr_len = q->addr_len,
                                                .buf = piece_at(r, j, b->slot),
                                                .len = r->piece[j].block_bytes,
                                                .tag = tag ^ ((uint64_t)i * r->n_pieces + j)};
            sc->item_block[ni++] = i;
        }
    }
    return ni;
}

/* After the sends: a block whose send failed, or whose slot was reused meanwhile (its bytes
 * may be the new block's), is stale; the outcomes are counted. */
static void settle_sends(kvt_remote *r, serve_ctx *sc, const kvi_rreq *q, uint32_t ni)
{
    for (uint32_t k = 0; k < ni; k++) {
        uint32_t i = sc->item_block[k];
        if (sc->items[k].rc && !sc->out[i].status)
            sc->out[i].status = sc->items[k].rc == KVT_ENOENT ? KVT_ENOENT : KVT_EIO;
    }
    uint64_t sent = 0, stale = 0;
    for (uint32_t i = 0; i < q->n; i++) {
        if (!sc->out[i].status) {
            pthread_mutex_lock(&r->mu);
            bool same = r->slots[q->blocks[i].slot].gen == q->blocks[i].generation;
            pthread_mutex_unlock(&r->mu);
            if (!same)
                sc->out[i].status = KVT_ENOENT;
            else
                sent++;
        }
        if (sc->out[i].status)
            memset(sc->out[i].tag, 0, KVI_RTAG);
        stale += sc->out[i].status == KVT_ENOENT;
    }
    add(&r->a_served, sent);
    add(&r->a_served_stale, stale);
    add(&r->a_served_bytes, sent * r->cfg.block_bytes);
}

static int serve(kvt_remote *r, serve_ctx *sc, osess *ss, const uint8_t *buf, size_t len,
                 kvi_rrep *rep)
{
    kvi_rreq q = {.blocks = sc->blocks};
    rep->blocks = sc->out;
    rep->n = 0;
    sc->authed = false;
    int rc = kvi_rreq_decode(buf, len, &q);
    if (rc)
        return rc;
    rep->req_id = q.req_id;
    rep->seq = q.seq;
    uint32_t window;
    uint64_t tag;
    if ((rc = check_request(r, sc, ss, buf, len, &q)) ||
        (rc = kvi_ucx_address_check(r->ucx_srv, q.addr, q.addr_len)) ||
        (rc = grow_items(sc, q.n * r->n_pieces)) || (rc = send_window(sc, &window)) ||
        (rc = read_tag(sc->ss->mac_key, q.seq, q.n, r->n_pieces, &tag)))
        return rc;
    rep->n = q.n;
    uint32_t ni = plan_sends(r, sc, &q, tag);
    if (ni)
        (void)kvi_ucx_send_many_prep(r->ucx_srv, sc->items, ni, window, (int)r->cfg.timeout_ms,
                                     prep_item, sc);
    settle_sends(r, sc, &q, ni);
    return 0;
}

/* Sends the reply of one request: MACed under its session when the request's MAC checked,
 * else with a zero MAC (a refusal a reader believes only as "shake hands again"). */
static void send_reply(kvt_remote *r, serve_ctx *sc, const zmq_msg_t *id, kvi_rrep *rep,
                       uint8_t *rbuf)
{
    size_t n = kvi_rrep_size(rep);
    kvi_rrep_encode(rep, rbuf);
    if (sc->authed &&
        kvi_rauth_mac(sc->ss->mac_key, "rep", rbuf, n - KVI_RMAC, rbuf + n - KVI_RMAC) != 0)
        return; /* libcrypto failed: no reply, the reader's read times out */
    if (zmq_send(r->router, zmq_msg_data((zmq_msg_t *)id), zmq_msg_size((zmq_msg_t *)id),
                 ZMQ_SNDMORE | ZMQ_DONTWAIT) >= 0)
        (void)zmq_send(r->router, rbuf, n, ZMQ_DONTWAIT);
}

static void serve_one(kvt_remote *r, serve_ctx *sc, uint8_t *rbuf)
{
    zmq_msg_t id, body;
    zmq_msg_init(&id);
    zmq_msg_init(&body);
    if (zmq_msg_recv(&id, r->router, ZMQ_DONTWAIT) < 0)
        goto out;
    int more = zmq_msg_more(&id);
    if (!more || zmq_msg_recv(&body, r->router, ZMQ_DONTWAIT) < 0)
        goto out;
    while (zmq_msg_more(&body)) { /* a message is two parts; drop the rest */
        zmq_msg_t x;
        zmq_msg_init(&x);
        int got = zmq_msg_recv(&x, r->router, ZMQ_DONTWAIT);
        zmq_msg_close(&x);
        if (got < 0)
            break;
        zmq_msg_close(&body);
        zmq_msg_init(&body);
        add(&r->a_refused, 1);
        goto out;
    }
    const uint8_t *b = zmq_msg_data(&body);
    size_t len = zmq_msg_size(&body), idl = zmq_msg_size(&id);
    if (idl == 0 || idl > sizeof(((osess *)0)->id)) {
        add(&r->a_refused, 1);
        goto out;
    }
    int rc;
    if (kvi_rwire_magic(b, len) == KVI_RHELLO_MAGIC) {
        size_t n = 0;
        if ((rc = on_hello(r, zmq_msg_data(&id), idl, b, len, rbuf, &n)) == 0) {
            if (zmq_send(r->router, zmq_msg_data(&id), idl, ZMQ_SNDMORE | ZMQ_DONTWAIT) >= 0)
                (void)zmq_send(r->router, rbuf, n, ZMQ_DONTWAIT);
        } else {
            add(&r->a_refused, 1);
            KVT_LOG_D("remote: hello refused: %s", kvt_last_error());
        }
        goto out;
    }
    kvi_rrep rep = {0};
    rc = serve(r, sc, sess_find(r, zmq_msg_data(&id), idl), b, len, &rep);
    if (rc) {
        add(&r->a_refused, 1);
        KVT_LOG_D("remote: request refused: %s", kvt_last_error());
        rep.status = rc, rep.n = 0;
    }
    send_reply(r, sc, &id, &rep, rbuf);
out:
    zmq_msg_close(&id);
    zmq_msg_close(&body);
}

static void *server_main(void *arg)
{
    kvt_remote *r = arg;
    serve_ctx *sc = calloc(1, sizeof(*sc));
    if (sc) {
        sc->r = r;
        if (kvi_rgcm_new(&sc->chk) || kvi_rgcm_new(&sc->gcm)) {
            KVT_LOG_E("remote: %s: serving nothing", kvt_last_error());
            kvi_rgcm_free(sc->chk), kvi_rgcm_free(sc->gcm);
            free(sc);
            sc = NULL;
        }
    }
    uint8_t *rbuf = malloc(MAX_REP_BYTES + 512);
    uint64_t beat_ns = (uint64_t)r->cfg.ttl_ms * 1000000u / 3, next_beat = 0;
    while (sc && rbuf && !atomic_load(&r->stop)) {
        uint64_t now = kvt_monotonic_ns();
        if (now >= next_beat) {
            heartbeat(r);
            next_beat = kvt_monotonic_ns() + beat_ns;
            now = kvt_monotonic_ns();
        }
        long wait_ms = (long)((next_beat - now) / 1000000u);
        if (wait_ms > 50)
            wait_ms = 50; /* notice stop */
        zmq_pollitem_t it = {.socket = r->router, .events = ZMQ_POLLIN};
        if (zmq_poll(&it, 1, wait_ms) > 0)
            for (int k = 0; k < 64 && !atomic_load(&r->stop); k++) {
                uint32_t ev = 0;
                size_t el = sizeof(ev);
                if (zmq_getsockopt(r->router, ZMQ_EVENTS, &ev, &el) || !(ev & ZMQ_POLLIN))
                    break;
                serve_one(r, sc, rbuf);
            }
        kvi_ucx_progress(r->ucx_srv);
    }
    if (sc) {
        free(sc->items), free(sc->item_block), free(sc->stage);
        kvi_rgcm_free(sc->chk), kvi_rgcm_free(sc->gcm);
        OPENSSL_cleanse(sc, sizeof(*sc));
    }
    free(sc);
    free(rbuf);
    return NULL;
}

/* ---- create / destroy ---------------------------------------------------------------------- */

static char *dupcat(char **p, const char *s)
{
    if (!s)
        return NULL;
    size_t n = strlen(s) + 1;
    char *d = *p;
    memcpy(d, s, n);
    *p += n;
    return d;
}

static int zfail(const char *what)
{
    return kvt_fail(KVT_EIO, "remote: %s: %s", what, zmq_strerror(zmq_errno()));
}

static int bind_server(kvt_remote *r)
{
    r->router = zmq_socket(r->zctx, ZMQ_ROUTER);
    if (!r->router)
        return zfail("socket");
    int zero = 0, hwm = 1024;
    int64_t max = MAX_REQ_BYTES;
    zmq_setsockopt(r->router, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(r->router, ZMQ_MAXMSGSIZE, &max, sizeof(max));
    zmq_setsockopt(r->router, ZMQ_RCVHWM, &hwm, sizeof(hwm));
    char ep[128];
    snprintf(ep, sizeof(ep), "tcp://%s:%u", r->cfg.listen_host, r->cfg.listen_port);
    if (zmq_bind(r->router, ep) != 0)
        return kvt_fail(KVT_EIO, "remote: cannot bind %s: %s", ep, zmq_strerror(zmq_errno()));
    char last[128];
    size_t ll = sizeof(last);
    if (zmq_getsockopt(r->router, ZMQ_LAST_ENDPOINT, last, &ll) != 0)
        return zfail("endpoint");
    const char *colon = strrchr(last, ':');
    r->port = colon ? (uint16_t)atoi(colon + 1) : 0;
    const char *host = r->cfg.advertise_host ? r->cfg.advertise_host : r->cfg.listen_host;
    snprintf(r->endpoint, sizeof(r->endpoint), "%s:%u", host, r->port);
    return 0;
}

/* Registers the served arrays with a UCX worker (nothing when this instance serves none). */
static int map_pieces(kvt_remote *r, kvi_ucx *u)
{
    int rc = 0;
    for (uint32_t j = 0; r->serves && j < r->n_pieces && !rc; j++)
        rc = kvi_ucx_map(u, piece_at(r, j, 0), r->cfg.n_slots * r->piece[j].block_bytes);
    return rc;
}

static void remote_free(kvt_remote *r);

/* The manager let go (base/remote_port.h). */
static void unlend(kvt_remote *r)
{
    r->rport.lent = false;
    if (r->rport.orphaned && !r->rport.staged)
        remote_free(r);
}

/* The worker's stage let go (remote_xfer.c). */
void kvi_remote_unstage(kvt_remote *r)
{
    r->rport.staged = false;
    if (r->rport.orphaned && !r->rport.lent)
        remote_free(r);
}

/* The remote's copies of the configuration's strings, in one allocation (r->strs): the
 * credential and the directory's password are not kept (turned into keys; the directories
 * keep their own). A rank of several has the instance name "<instance>#<rank>". */
static void copy_strings(kvt_remote *r, const kvt_remote_config *c)
{
    char *p = r->strs;
    r->cfg.directory = dupcat(&p, c->directory);
    r->cfg.space = dupcat(&p, c->space);
    r->base = dupcat(&p, c->instance);
    r->cfg.instance = r->base;
    if (r->parts > 1 && !r->lookup_only) { /* validated: fits KVT_REMOTE_NAME_MAX */
        r->cfg.instance = p;
        p += (size_t)sprintf(p, "%s#%u", c->instance, c->rank) + 1;
    }
    r->cfg.listen_host = dupcat(&p, c->listen_host);
    r->cfg.credential = NULL;
    r->cfg.advertise_host = dupcat(&p, c->advertise_host);
    r->cfg.directory_password = NULL;
}

/* The pieces of a block (one region, or the configured regions) and the port the offload
 * manager and the workers reach this remote through. */
static void set_pieces_and_port(kvt_remote *r, const kvt_remote_config *c)
{
    uint32_t np = r->n_pieces;
    if (c->regions) {
        memcpy(r->piece, c->regions, np * sizeof(*r->piece));
        r->cfg.block_bytes = 0;
        for (uint32_t j = 0; j < np; j++)
            r->cfg.block_bytes += r->piece[j].block_bytes;
    } else {
        r->piece[0] =
            (kvt_region){.base = (uint64_t)(uintptr_t)c->region, .block_bytes = c->block_bytes};
    }
    r->cfg.regions = r->piece;
    r->rport = (kvi_remote_port){.lookup = kvt_remote_lookup,
                                 .lookup_peer = kvt_remote_lookup_peer,
                                 .unlend = unlend,
                                 .stage_open = kvi_remote_stage_open,
                                 .stats = kvt_remote_get_stats,
                                 .regions = r->piece,
                                 .n_regions = np,
                                 .n_slots = c->n_slots,
                                 .hash_len = c->hash_len,
                                 .block_bytes = r->cfg.block_bytes,
                                 .parts = r->parts,
                                 .rank = c->rank,
                                 .lookup_only = r->lookup_only};
}

/* The object with its copies of the configuration; nothing started yet. */
static int remote_alloc(const kvt_remote_config *c, kvt_remote **out)
{
    kvt_remote *r = calloc(1, sizeof(*r));
    size_t sl = strlen(c->directory) + strlen(c->space) + 2 * strlen(c->instance) + 8 +
                (c->listen_host ? strlen(c->listen_host) : 0) +
                (c->advertise_host ? strlen(c->advertise_host) : 0) + 6;
    uint32_t np = c->regions ? c->n_regions : 1, parts = c->ranks ? c->ranks : 1;
    if (!r || !(r->strs = malloc(sl)) ||
        !(r->hits = malloc((size_t)KVT_REMOTE_MAX_READ * parts * sizeof(*r->hits))) ||
        !(r->piece = malloc(np * sizeof(*r->piece))) ||
        (c->n_slots && (!(r->slots = calloc(c->n_slots, sizeof(*r->slots))) ||
                        !(r->sc_hashes = malloc((size_t)KVT_REMOTE_MAX_READ * c->hash_len)) ||
                        !(r->sc_slots = malloc(KVT_REMOTE_MAX_READ * sizeof(uint32_t))) ||
                        !(r->sc_gens = malloc(KVT_REMOTE_MAX_READ * sizeof(uint64_t)))))) {
        if (r) {
            free(r->strs);
            free(r->hits);
            free(r->piece);
            free(r->slots);
            free(r->sc_hashes);
            free(r->sc_slots);
            free(r->sc_gens);
        }
        free(r);
        return kvt_fail(KVT_ENOMEM, "remote: out of memory");
    }
    r->cfg = *c;
    r->n_pieces = np;
    r->serves = c->n_slots > 0;
    r->parts = parts;
    r->lookup_only = c->rank == KVT_REMOTE_NO_RANK;
    set_pieces_and_port(r, c);
    copy_strings(r, c);
    pthread_mutex_init(&r->mu, NULL);
    pthread_mutex_init(&r->rd_mu, NULL);
    r->next_req = ((uint64_t)getpid() << 32) ^ kvt_monotonic_ns();
    *out = r;
    return 0;
}

/* The space's keys, the directory connections, the server's socket, UCX, the registration and
 * the server thread; on failure kvt_remote_destroy undoes what was done. */
static int remote_start(kvt_remote *r, const kvt_remote_config *c)
{
    r->self = (kvi_rdir_self){.space = r->cfg.space,
                              .instance = r->cfg.instance,
                              .base = r->base,
                              .endpoint = r->endpoint,
                              .hash_seed = c->hash_seed,
                              .signature = r->cfg.signature,
                              .hash_len = c->hash_len,
                              .ttl_ms = c->ttl_ms,
                              .ranks = r->parts,
                              .rank = c->rank};
    if (r->lookup_only) /* the directory, for lookups: nothing to serve, read or register */
        return kvi_rdir_redis_open(c->directory, c->directory_password, c->directory_timeout_ms,
                                   c->retry_ms, &r->dir);
    int rc;
    /* the space's keys; the credential itself is not kept */
    if ((rc = kvi_rauth_keys(c->credential, strlen(c->credential), c->space, &r->keys)) ||
        (rc = kvi_rauth_random(r->boot, sizeof(r->boot))) ||
        (rc = kvi_rauth_block_key(&r->keys, r->cfg.instance, r->boot, r->block_key)) ||
        (rc = kvi_rgcm_new(&r->gcm)) || (rc = kvi_rgcm_new(&r->gcm_rd)))
        return rc;
    if (!(r->sess = calloc(MAX_SESSIONS, sizeof(*r->sess))))
        return kvt_fail(KVT_ENOMEM, "remote: out of memory");
    if ((rc = kvi_rdir_redis_open(c->directory, c->directory_password, c->directory_timeout_ms,
                                  c->retry_ms, &r->dir)) ||
        (rc = kvi_rdir_redis_open(c->directory, c->directory_password, c->directory_timeout_ms,
                                  c->retry_ms, &r->dir_pub)) ||
        (rc = kvi_rdir_redis_open(c->directory, c->directory_password, c->directory_timeout_ms,
                                  c->retry_ms, &r->dir_srv)))
        return rc;
    if (!(r->zctx = zmq_ctx_new()))
        return zfail("context");
    if ((rc = bind_server(r)) || (rc = kvi_ucx_create(&r->ucx_srv)) ||
        (rc = kvi_ucx_create(&r->ucx_cli)))
        return rc;
    if ((rc = map_pieces(r, r->ucx_srv)) || (rc = map_pieces(r, r->ucx_cli)))
        return rc;
    rc = enter(r, &r->dir);
    if (rc == KVT_EINVAL)
        return rc;
    if (rc)
        KVT_LOG_W("remote: %s starts unregistered (%s); it registers when it can", c->instance,
                  kvt_last_error());
    if (pthread_create(&r->thr, NULL, server_main, r) != 0)
        return kvt_fail(KVT_ESYS, "remote: cannot start the server thread");
    r->thr_started = true;
    return 0;
}

int kvt_remote_create(const kvt_remote_config *c, kvt_remote **out)
{
    if (!c || !out)
        return kvt_fail(KVT_EINVAL, "remote: create: NULL argument");
    *out = NULL;
    kvt_remote *r = NULL;
    int rc = validate(c);
    if (rc || (rc = remote_alloc(c, &r)))
        return rc;
    if ((rc = remote_start(r, c))) {
        char msg[512];
        snprintf(msg, sizeof(msg), "%s", kvt_last_error());
        kvt_remote_destroy(r);
        return kvt_fail(rc, "%s", msg);
    }
    *out = r;
    return 0;
}

/* Ends the receives UCX did not give back (zombies): once more with a wait, then, if any is
 * still held, by destroying the reader's worker (nothing writes their buffers after that) and
 * making a new one unless `final`. */
static int bury(kvt_remote *r, bool final)
{
    zombie *keep = r->zombies;
    uint64_t end = kvt_monotonic_ns() + 200 * 1000000ull;
    do {
        zombie *still = NULL;
        for (zombie *z = keep, *nx; z; z = nx) {
            nx = z->next;
            if (kvi_ucx_recv_end(r->ucx_cli, z->r, 0) == KVT_EBUSY)
                z->next = still, still = z;
            else
                free(z);
        }
        keep = still;
    } while (keep && kvt_monotonic_ns() < end);
    r->zombies = NULL;
    if (!keep)
        return 0;
    KVT_LOG_W("remote: UCX holds a receive of a read that ended; its worker is replaced");
    kvi_ucx_destroy(r->ucx_cli);
    r->ucx_cli = NULL;
    for (zombie *z = keep, *nx; z; z = nx) {
        nx = z->next;
        kvi_ucx_recv_forget(z->r);
        free(z);
    }
    if (final)
        return 0;
    int rc = kvi_ucx_create(&r->ucx_cli);
    return rc ? rc : map_pieces(r, r->ucx_cli);
}

static void close_peer(rpeer *p)
{
    if (p->sock)
        zmq_close(p->sock);
    p->sock = NULL;
    p->sess = SESS_NONE;
}

void kvt_remote_destroy(kvt_remote *r)
{
    if (!r)
        return;
    if (r->rport.lent || r->rport.staged) { /* the last borrower finishes it (any order) */
        r->rport.orphaned = true;
        return;
    }
    remote_free(r);
}

static void remote_free(kvt_remote *r)
{
    if (r->thr_started) {
        atomic_store(&r->stop, true);
        pthread_join(r->thr, NULL);
    }
    uint64_t ep = atomic_load(&r->epoch);
    if (ep && r->dir.ops)
        (void)r->dir.ops->leave(r->dir.d, &r->self, ep);
    bury(r, true);
    for (uint32_t i = 0; i < r->n_peers; i++)
        close_peer(&r->peers[i]);
    if (r->router)
        zmq_close(r->router);
    if (r->zctx)
        zmq_ctx_term(r->zctx);
    if (r->ucx_srv)
        kvi_ucx_destroy(r->ucx_srv);
    if (r->ucx_cli)
        kvi_ucx_destroy(r->ucx_cli);
    if (r->dir.ops)
        r->dir.ops->close(r->dir.d);
    if (r->dir_pub.ops)
        r->dir_pub.ops->close(r->dir_pub.d);
    if (r->dir_srv.ops)
        r->dir_srv.ops->close(r->dir_srv.d);
    pthread_mutex_destroy(&r->mu);
    pthread_mutex_destroy(&r->rd_mu);
    kvi_rgcm_free(r->gcm);
    kvi_rgcm_free(r->gcm_rd);
    free(r->sess);
    OPENSSL_cleanse(&r->keys, sizeof(r->keys));
    OPENSSL_cleanse(r->block_key, sizeof(r->block_key));
    for (uint32_t i = 0; i < r->n_peers; i++)
        OPENSSL_cleanse(&r->peers[i], sizeof(r->peers[i]));
    free(r->slots);
    free(r->sc_hashes);
    free(r->sc_slots);
    free(r->sc_gens);
    free(r->piece);
    free(r->hits);
    free(r->strs);
    free(r);
}

uint16_t kvt_remote_port(const kvt_remote *r)
{
    return r ? r->port : 0;
}

/* ---- publish / withdraw --------------------------------------------------------------------- */

static int check_slots(const kvt_remote *r, const uint32_t *slots, uint32_t n)
{
    if (!r->serves)
        return kvt_fail(KVT_ESTATE, "remote: this instance serves no region");
    if (!slots || n > KVT_REMOTE_MAX_READ)
        return kvt_fail(KVT_EINVAL, "remote: %u slots (at most %u per call)", n,
                        KVT_REMOTE_MAX_READ);
    for (uint32_t i = 0; i < n; i++)
        if (slots[i] >= r->cfg.n_slots)
            return kvt_fail(KVT_ERANGE, "remote: slot %u out of range (%u slots)", slots[i],
                            r->cfg.n_slots);
    return 0;
}

void kvi_remote_slot_gens(kvt_remote *r, const uint32_t *slots, uint32_t n, uint64_t *gens)
{
    pthread_mutex_lock(&r->mu);
    for (uint32_t i = 0; i < n; i++)
        gens[i] = slots[i] < r->cfg.n_slots ? r->slots[slots[i]].gen : 0;
    pthread_mutex_unlock(&r->mu);
}

int kvt_remote_publish(kvt_remote *r, const uint32_t *slots, const uint8_t *hashes, uint32_t n)
{
    return kvi_remote_publish_at(r, slots, hashes, NULL, n);
}

int kvi_remote_publish_at(kvt_remote *r, const uint32_t *slots, const uint8_t *hashes,
                          const uint64_t *expect, uint32_t n)
{
    if (!r || (n && !hashes))
        return kvt_fail(KVT_EINVAL, "remote: publish: NULL argument");
    int rc = check_slots(r, slots, n);
    if (rc || n == 0)
        return rc;
    uint64_t *gens = r->sc_gens;
    uint32_t *ok_slots = r->sc_slots;
    uint8_t *ok_hashes = r->sc_hashes;
    const uint32_t hl = r->cfg.hash_len;
    uint32_t m = 0;
    for (uint32_t i = 0; i < n; i++) {
        /* a new generation first (nothing is served from the slot meanwhile), then its tag over
         * the bytes as they are now, then it is servable */
        const uint8_t *h = hashes + (size_t)i * hl;
        pthread_mutex_lock(&r->mu);
        slotrec *s = &r->slots[slots[i]];
        if (expect && s->gen != expect[i]) { /* withdrawn since it was asked for: its bytes */
            pthread_mutex_unlock(&r->mu);    /* may be another block's already */
            continue;
        }
        uint64_t gen = ++s->gen;
        s->published = false;
        pthread_mutex_unlock(&r->mu);
        uint8_t tag[KVI_RTAG], *pc[KVT_MAX_REGIONS];
        slot_pieces(r, slots[i], pc);
        if (block_tag(r, r->gcm, r->block_key, slots[i], gen, h, pc, tag)) {
            KVT_LOG_E("remote: slot %u not published: %s", slots[i], kvt_last_error());
            add(&r->a_pub_dropped, 1);
            continue;
        }
        pthread_mutex_lock(&r->mu);
        bool still = s->gen == gen; /* not withdrawn while the tag was computed */
        if (still) {
            memcpy(s->tag, tag, KVI_RTAG);
            memcpy(s->hash, h, hl);
            s->published = true;
        }
        pthread_mutex_unlock(&r->mu);
        if (!still)
            continue;
        ok_slots[m] = slots[i], gens[m] = gen;
        memcpy(ok_hashes + (size_t)m * hl, h, hl);
        m++;
    }
    slots = ok_slots, hashes = ok_hashes, n = m;
    if (n == 0)
        return 0;
    /* Not registered at this moment (the directory lost the key and the server thread is
     * entering again, or it has not entered yet): nothing is lost, the slots are marked
     * published above and the entry republishes every published slot after it set the epoch
     * (enter), so they are written then, under the new epoch. */
    uint64_t ep = atomic_load(&r->epoch);
    if (!ep)
        return 0;
    if (r->dir_pub.ops->publish(r->dir_pub.d, &r->self, ep, hashes, slots, gens, n)) {
        add(&r->a_pub_dropped, n);
        add(&r->a_pub_dir_errors, 1);
    } else {
        add(&r->a_published, n);
    }
    return 0;
}

uint32_t kvi_remote_unpublish(kvt_remote *r, const uint32_t *slots, uint32_t n, uint8_t *hashes,
                              uint32_t *ws, uint64_t *gens)
{
    const uint32_t hl = r->cfg.hash_len;
    uint32_t m = 0;
    pthread_mutex_lock(&r->mu);
    for (uint32_t i = 0; i < (slots ? n : r->cfg.n_slots); i++) {
        uint32_t k = slots ? slots[i] : i;
        slotrec *s = &r->slots[k];
        s->gen++; /* a send under way now reports stale; a publication asked for before, not
                     yet made, is not made */
        if (!s->published)
            continue;
        memcpy(hashes + (size_t)m * hl, s->hash, hl);
        ws[m] = k, gens[m] = s->gen - 1, m++;
        s->published = false;
    }
    pthread_mutex_unlock(&r->mu);
    return m;
}

void kvi_remote_dir_withdraw(kvt_remote *r, const uint8_t *hashes, const uint32_t *slots,
                             const uint64_t *gens, uint32_t n)
{
    uint64_t ep = atomic_load(&r->epoch);
    for (uint32_t i = 0; ep && i < n; i += KVT_REMOTE_MAX_READ) {
        uint32_t k = n - i < KVT_REMOTE_MAX_READ ? n - i : KVT_REMOTE_MAX_READ;
        if (r->dir_pub.ops->withdraw(r->dir_pub.d, &r->self, ep,
                                     hashes + (size_t)i * r->cfg.hash_len, slots + i, gens + i, k))
            add(&r->a_pub_dir_errors, 1);
        else
            add(&r->a_withdrawn, k);
    }
}

int kvt_remote_withdraw(kvt_remote *r, const uint32_t *slots, uint32_t n)
{
    if (!r)
        return kvt_fail(KVT_EINVAL, "remote: withdraw: NULL argument");
    int rc = check_slots(r, slots, n);
    if (rc || n == 0)
        return rc;
    uint32_t m = kvi_remote_unpublish(r, slots, n, r->sc_hashes, r->sc_slots, r->sc_gens);
    kvi_remote_dir_withdraw(r, r->sc_hashes, r->sc_slots, r->sc_gens, m);
    return 0;
}

/* ---- lookup --------------------------------------------------------------------------------- */

/* How an owner's entry was found (peer_slot). */
enum { PEER_SAME, PEER_EPOCH, PEER_NEW };

static peer_key *key_at(void *table, size_t stride, uint32_t i)
{
    return (peer_key *)(void *)((char *)table + (size_t)i * stride);
}

/* The entry of owner id in a table of *n entries `stride` bytes apart, each starting with its
 * peer_key: the same instance at the same endpoint (its epoch and use updated: *kind PEER_SAME
 * or PEER_EPOCH), else a new entry or the least recently used one not named at seq (*kind
 * PEER_NEW: the caller resets what it holds, then peer_key_set). UINT32_MAX when every entry
 * was named at seq. */
static uint32_t peer_slot(void *table, size_t stride, uint32_t *n, const kvt_remote_peer *id,
                          uint64_t seq, int *kind)
{
    uint32_t victim = UINT32_MAX;
    for (uint32_t i = 0; i < *n; i++) {
        peer_key *k = key_at(table, stride, i);
        if (strcmp(k->id.instance, id->instance) == 0 &&
            strcmp(k->id.endpoint, id->endpoint) == 0) {
            *kind = k->id.epoch == id->epoch ? PEER_SAME : PEER_EPOCH;
            k->id.epoch = id->epoch;
            k->used = seq;
            return i;
        }
        if (k->used != seq &&
            (victim == UINT32_MAX || k->used < key_at(table, stride, victim)->used))
            victim = i;
    }
    *kind = PEER_NEW;
    return *n < KVT_REMOTE_MAX_PEERS ? (*n)++ : victim;
}

static void peer_key_set(peer_key *k, const kvt_remote_peer *id, uint64_t seq)
{
    k->id = *id;
    snprintf(k->name, sizeof(k->name), "%s@%s", id->instance, id->endpoint);
    k->used = seq;
}

/* The lookup-side index of the owner a hit names; UINT32_MAX when every entry was named by
 * this lookup. */
static uint32_t peer_for(kvt_remote *r, const kvi_rdir_hit *h)
{
    kvt_remote_peer id = {.epoch = h->epoch};
    snprintf(id.instance, sizeof(id.instance), "%s", h->instance);
    snprintf(id.endpoint, sizeof(id.endpoint), "%s", h->endpoint);
    int kind;
    uint32_t i = peer_slot(r->lk, sizeof(r->lk[0]), &r->n_lk, &id, r->lookups_seq, &kind);
    if (i != UINT32_MAX && kind == PEER_NEW)
        peer_key_set(&r->lk[i], &id, r->lookups_seq);
    return i;
}

int kvt_remote_lookup(kvt_remote *r, const uint8_t *hashes, uint32_t n, kvt_remote_loc *out,
                      uint32_t *n_hit)
{
    if (!r || !n_hit || (n && (!hashes || !out)))
        return kvt_fail(KVT_EINVAL, "remote: lookup: NULL argument");
    *n_hit = 0;
    if (n > KVT_REMOTE_MAX_READ)
        return kvt_fail(KVT_ELIMIT, "remote: lookup of %u blocks (at most %u)", n,
                        KVT_REMOTE_MAX_READ);
    if (n == 0)
        return 0;
    r->st.lookups++;
    r->st.lookup_blocks += n;
    r->lookups_seq++;
    uint32_t m = 0, np = r->parts;
    n = kvi_min_u32(n, KVT_REMOTE_MAX_READ / np); /* entries of one round trip */
    if (r->dir.ops->lookup(r->dir.d, &r->self, hashes, n, r->hits, &m)) {
        r->st.directory_errors++;
        return 0; /* Redis down: misses */
    }
    for (uint32_t i = 0; i < m; i++) {
        uint32_t k = 0;
        for (; k < np; k++) { /* a block counts with all its parts */
            const kvi_rdir_hit *h = &r->hits[(size_t)i * np + k];
            uint32_t pi = peer_for(r, h);
            if (pi == UINT32_MAX)
                break;
            out[(size_t)i * np + k] =
                (kvt_remote_loc){.peer = pi, .slot = h->slot, .generation = h->generation};
        }
        if (k < np)
            break;
        (*n_hit)++;
    }
    r->st.hit_blocks += *n_hit;
    return 0;
}

const char *kvt_remote_peer_name(const kvt_remote *r, uint32_t index)
{
    return r && index < r->n_lk ? r->lk[index].name : NULL;
}

int kvt_remote_lookup_peer(const kvt_remote *r, uint32_t index, kvt_remote_peer *out)
{
    if (!r || !out)
        return kvt_fail(KVT_EINVAL, "remote: lookup_peer: NULL argument");
    if (index >= r->n_lk)
        return kvt_fail(KVT_ERANGE, "remote: lookup_peer: peer %u (the lookups named %u)", index,
                        r->n_lk);
    *out = r->lk[index].id;
    return 0;
}

/* The reader-side connection for owner id (under rd_mu): the same instance at the same
 * endpoint keeps its connection unless its epoch changed; else the least recently used entry
 * not needed by this read is replaced. UINT32_MAX when every entry is needed by this read. */
static uint32_t reader_peer(kvt_remote *r, const kvt_remote_peer *id)
{
    int kind;
    uint32_t i = peer_slot(r->peers, sizeof(r->peers[0]), &r->n_peers, id, r->reads_seq, &kind);
    if (i == UINT32_MAX)
        return i;
    rpeer *p = &r->peers[i];
    if (kind != PEER_SAME)
        close_peer(p); /* a restarted owner, or another one: its session is not this one's */
    if (kind == PEER_NEW) {
        OPENSSL_cleanse(p, sizeof(*p));
        peer_key_set(&p->k, id, r->reads_seq);
    }
    return i;
}

/* ---- read ----------------------------------------------------------------------------------- */

/* A read refused before it started: every block's status says so (none read). */
static int refuse_read(int rc, int *status, uint32_t n)
{
    for (uint32_t i = 0; status && i < n && i < KVT_REMOTE_MAX_READ; i++)
        status[i] = rc;
    return rc;
}

typedef struct rd_block {
    kvi_ucx_recv **recv; /* one per piece */
    uint8_t tag[KVI_RTAG];
    uint8_t mine[KVI_RTAG]; /* the tag of what landed, when it landed before the reply */
    bool early;             /* mine holds it */
    uint32_t peer, k;       /* its owner, its index in that owner's request */
    int state;              /* 0 waiting for the reply, 1 waiting for the bytes, 2 decided */
} rd_block;

typedef struct rd_peer {
    uint64_t req_id, seq;
    uint32_t first, n; /* indices into order[] */
    uint64_t tag;      /* the receives' base tag */
    int stage;         /* 0 nothing sent, 1 hello sent, 2 request sent, 3 decided */
} rd_peer;

static int open_peer(kvt_remote *r, rpeer *p)
{
    if (p->sock)
        return 0;
    p->sess = SESS_NONE;
    p->sock = zmq_socket(r->zctx, ZMQ_DEALER);
    if (!p->sock)
        return zfail("socket");
    int zero = 0;
    int64_t max = MAX_REP_BYTES + 512;
    zmq_setsockopt(p->sock, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(p->sock, ZMQ_MAXMSGSIZE, &max, sizeof(max));
    char ep[KVI_RDIR_EP_MAX + 8];
    snprintf(ep, sizeof(ep), "tcp://%s", p->k.id.endpoint);
    if (zmq_connect(p->sock, ep) != 0) {
        int rc = kvt_fail(KVT_EIO, "remote: cannot connect %s: %s", ep, zmq_strerror(zmq_errno()));
        close_peer(p);
        return rc;
    }
    return 0;
}

static void end_recv(kvt_remote *r, rd_block *b)
{
    for (uint32_t j = 0; j < r->n_pieces; j++) {
        if (!b->recv[j])
            continue;
        if (kvi_ucx_recv_end(r->ucx_cli, b->recv[j], 0) == KVT_EBUSY) {
            zombie *z = malloc(sizeof(*z));
            if (z) { /* buried before read returns; without memory, leaked rather than freed */
                z->r = b->recv[j];
                z->next = r->zombies;
                r->zombies = z;
            }
        }
        b->recv[j] = NULL;
    }
}

/* Where piece j of block i of a read lands: in dst[i] (pieces back to back) or in slot
 * slots[i] of this instance's own arrays. */
typedef struct rd_dst {
    void *const *dst;
    const uint32_t *slots;
    uint64_t *off; /* per piece: its offset in a block */
} rd_dst;

static uint8_t *dst_piece(const kvt_remote *r, const rd_dst *d, uint32_t i, uint32_t j)
{
    return d->dst ? (uint8_t *)d->dst[i] + d->off[j] : piece_at(r, j, d->slots[i]);
}

/* One read, as its pieces move between the functions of the poll loop. */
typedef struct rd_ctx {
    kvt_remote *r;
    const kvt_remote_loc *locs;
    const uint8_t *hashes;
    const rd_dst *d;
    int *status;
    uint32_t n;
    rd_block *bs;
    rd_peer *rps;
    uint32_t *order;
    kvi_rreq_block *qb;
    kvi_rrep_block *tmp;
    const void *addr;
    size_t addr_len;
} rd_ctx;

/* The tag of block i's bytes as they landed (the owner's block key, the slot and generation
 * the read asked for: all known before the reply). */
static int tag_landed(rd_ctx *x, uint32_t i, uint8_t *tag)
{
    kvt_remote *r = x->r;
    uint8_t *pc[KVT_MAX_REGIONS];
    for (uint32_t j = 0; j < r->n_pieces; j++)
        pc[j] = dst_piece(r, x->d, i, j);
    return block_tag(r, r->gcm_rd, r->peers[x->bs[i].peer].block_key, x->locs[i].slot,
                     x->locs[i].generation, x->hashes + (size_t)i * r->cfg.hash_len, pc, tag);
}

/* Block i landed whole: accepted only if its tag checks on the bytes that landed (decrypted
 * first when the read was encrypted). */
static int landed(rd_ctx *x, uint32_t i)
{
    kvt_remote *r = x->r;
    rd_block *b = &x->bs[i];
    const rpeer *pe = &r->peers[b->peer];
    bool ok;
    if (r->cfg.encrypt) {
        const uint8_t *hash = x->hashes + (size_t)i * r->cfg.hash_len;
        uint8_t *pc[KVT_MAX_REGIONS], nonce[12];
        for (uint32_t j = 0; j < r->n_pieces; j++)
            pc[j] = dst_piece(r, x->d, i, j);
        enc_nonce(x->rps[b->peer].seq, b->k, nonce);
        ok = kvi_rgcm_begin(r->gcm_rd, pe->enc_key, nonce, -1) == 0 &&
             kvi_rgcm_aad(r->gcm_rd, hash, r->cfg.hash_len) == 0;
        for (uint32_t j = 0; ok && j < r->n_pieces; j++)
            ok = kvi_rgcm_piece(r->gcm_rd, pc[j], pc[j], r->piece[j].block_bytes) == 0;
        ok = ok && kvi_rgcm_check(r->gcm_rd, b->tag);
    } else { /* the tag of what landed: taken as it landed, or now */
        ok = (b->early || tag_landed(x, i, b->mine) == 0) &&
             kvi_rauth_equal(b->mine, b->tag, KVI_RTAG);
    }
    if (ok)
        return 0;
    add(&r->a_auth_failures, 1);
    KVT_LOG_W("remote: a block from %s failed its tag (bytes changed on the way, or not the "
              "owner's); not used",
              pe->k.name);
    return KVT_EPROTO;
}

/* A block whose state is 1 (the owner sent it): 0 while a piece is still under way, 1 when
 * every piece arrived, -1 when one failed. */
static int pieces_done(kvt_remote *r, rd_block *b)
{
    for (uint32_t j = 0; j < r->n_pieces; j++) {
        int w = kvi_ucx_recv_wait(r->ucx_cli, b->recv[j], 0);
        if (w != 1)
            return w == 0 ? 0 : -1;
    }
    return 1;
}

/* Every block of owner p fails with rc now; its connection is dropped when `drop` (a failed
 * or foreign handshake: the next read starts a fresh one). */
static void peer_fails(rd_ctx *x, uint32_t p, int rc, bool drop)
{
    rd_peer *rp = &x->rps[p];
    for (uint32_t k = 0; k < rp->n; k++) {
        rd_block *b = &x->bs[x->order[rp->first + k]];
        if (b->state == 2)
            continue;
        x->status[x->order[rp->first + k]] = rc;
        b->state = 2;
        end_recv(x->r, b);
    }
    rp->stage = 3;
    if (drop)
        close_peer(&x->r->peers[p]);
}

static int zsend(void *sock, const uint8_t *buf, size_t len)
{
    return zmq_send(sock, buf, len, ZMQ_DONTWAIT) == (int)len
               ? 0
               : kvt_fail(KVT_EIO, "remote: send: %s", zmq_strerror(zmq_errno()));
}

static int send_hello(rd_ctx *x, uint32_t p)
{
    kvt_remote *r = x->r;
    rpeer *pe = &r->peers[p];
    kvi_rhello h = {.name = (const uint8_t *)r->cfg.instance,
                    .name_len = (uint32_t)strlen(r->cfg.instance)};
    uint8_t buf[256];
    int rc = kvi_rauth_random(pe->nr, KVI_RNONCE);
    if (rc || (rc = kvi_rauth_ephemeral(pe->er_priv, pe->er)))
        return rc;
    memcpy(h.nr, pe->nr, KVI_RNONCE);
    memcpy(h.er, pe->er, KVI_RDH);
    kvi_rhello_encode(&h, buf);
    if ((rc = zsend(pe->sock, buf, kvi_rhello_size(&h))))
        return rc;
    pe->sess = SESS_HELLO;
    x->rps[p].stage = 1;
    return 0;
}

/* Posts the receives of owner p's blocks, then sends it the request, MACed. */
static int send_request(rd_ctx *x, uint32_t p)
{
    kvt_remote *r = x->r;
    rpeer *pe = &r->peers[p];
    rd_peer *rp = &x->rps[p];
    const uint32_t hl = r->cfg.hash_len, np = r->n_pieces;
    uint64_t tag = 0;
    rp->seq = ++pe->seq;
    int rc = read_tag(pe->mac_key, rp->seq, rp->n, np, &tag);
    if (rc)
        return rc;
    for (uint32_t k = 0; k < rp->n; k++) {
        uint32_t i = x->order[rp->first + k];
        for (uint32_t j = 0; j < np; j++)
            if ((rc = kvi_ucx_recv_post(r->ucx_cli, dst_piece(r, x->d, i, j),
                                        r->piece[j].block_bytes, tag ^ ((uint64_t)k * np + j),
                                        &x->bs[i].recv[j])))
                return rc;
        x->qb[k] = (kvi_rreq_block){.slot = x->locs[i].slot,
                                    .generation = x->locs[i].generation,
                                    .hash = x->hashes + (size_t)i * hl};
    }
    rp->req_id = ++r->next_req;
    kvi_rreq q = {.seq = rp->seq,
                  .req_id = rp->req_id,
                  .epoch = pe->k.id.epoch,
                  .flags = r->cfg.encrypt ? KVI_RREQ_ENCRYPT : 0,
                  .hash_len = hl,
                  .addr = x->addr,
                  .addr_len = (uint32_t)x->addr_len,
                  .n = rp->n,
                  .blocks = x->qb};
    size_t len = kvi_rreq_size(&q);
    uint8_t *buf = malloc(len);
    if (!buf)
        return kvt_fail(KVT_ENOMEM, "remote: out of memory");
    kvi_rreq_encode(&q, buf);
    rc = kvi_rauth_mac(pe->mac_key, "req", buf, len - KVI_RMAC, buf + len - KVI_RMAC);
    if (!rc)
        rc = zsend(pe->sock, buf, len);
    free(buf);
    if (!rc)
        rp->stage = 2;
    return rc;
}

/* Owner p's challenge: its proof checked (it holds the credential, and it is the instance the
 * directory named), the session's keys derived, and the request sent. */
static void take_challenge(rd_ctx *x, uint32_t p, const uint8_t *buf, size_t len)
{
    kvt_remote *r = x->r;
    rpeer *pe = &r->peers[p];
    kvi_rchal c;
    uint8_t proof[KVI_RKEY];
    char name[KVT_REMOTE_NAME_MAX + 1];
    int rc = kvi_rchal_decode(buf, len, &c);
    if (!rc && memchr(c.name, 0, c.name_len))
        rc = kvt_fail(KVT_EPROTO, "remote: %s: a challenge naming an instance with a NUL byte",
                      pe->k.name);
    kvi_rhs t = {pe->nr, c.no, pe->er, c.eo};
    if (!rc) {
        memcpy(name, c.name, c.name_len);
        name[c.name_len] = 0;
        rc = kvi_rauth_proof(&r->keys, "owner", &t, name, c.boot, proof);
    }
    if (!rc &&
        (!kvi_rauth_equal(c.nr, pe->nr, KVI_RNONCE) || !kvi_rauth_equal(c.er, pe->er, KVI_RDH) ||
         !kvi_rauth_equal(proof, c.proof, KVI_RKEY) || strcmp(name, pe->k.id.instance) != 0)) {
        add(&r->a_auth_failures, 1);
        rc = kvt_fail(KVT_EINVAL,
                      "remote: %s did not prove it holds the space's credential "
                      "(or is another instance than the directory named)",
                      pe->k.name);
    }
    if (!rc)
        rc = kvi_rauth_session(&r->keys, &t, pe->er_priv, c.eo, pe->mac_key, pe->enc_key);
    OPENSSL_cleanse(pe->er_priv, KVI_RDH); /* forward secrecy: gone once used */
    if (!rc && !(rc = kvi_rauth_block_key(&r->keys, name, c.boot, pe->block_key))) {
        pe->sess = SESS_READY;
        pe->seq = 0;
        add(&r->a_handshakes, 1);
        rc = send_request(x, p);
    }
    if (rc) {
        KVT_LOG_W("%s", kvt_last_error());
        peer_fails(x, p, rc == KVT_EINVAL ? KVT_EINVAL : KVT_EIO, true);
    }
}

/* Owner p's reply: believed only with a MAC under its session (a zero MAC is a refusal
 * before any session: shake hands again next time). */
static void take_reply(rd_ctx *x, uint32_t p, const uint8_t *buf, size_t len)
{
    kvt_remote *r = x->r;
    rpeer *pe = &r->peers[p];
    rd_peer *rp = &x->rps[p];
    kvi_rrep rep = {.blocks = x->tmp};
    if (kvi_rrep_decode(buf, len, &rep) || rep.req_id != rp->req_id || rep.seq != rp->seq) {
        KVT_LOG_D("remote: a late, foreign or malformed reply from %s dropped", pe->k.name);
        return; /* an earlier request's late reply */
    }
    uint8_t mac[KVI_RTAG];
    if (kvi_rauth_mac(pe->mac_key, "rep", buf, len - KVI_RMAC, mac) ||
        !kvi_rauth_equal(mac, buf + len - KVI_RMAC, KVI_RMAC)) {
        static const uint8_t zero[KVI_RMAC];
        if (!kvi_rauth_equal(buf + len - KVI_RMAC, zero, KVI_RMAC))
            add(&r->a_auth_failures, 1);
        KVT_LOG_W("remote: %s answered outside the session (%s); shaking hands again next time",
                  pe->k.name, kvt_strerror(rep.status));
        peer_fails(x, p, KVT_EIO, true);
        return;
    }
    rp->stage = 3;
    for (uint32_t k = 0; k < rp->n; k++) {
        uint32_t i = x->order[rp->first + k];
        rd_block *b = &x->bs[i];
        if (rep.status) {
            x->status[i] = rep.status == KVT_EINVAL ? KVT_EINVAL : KVT_EIO;
            b->state = 2;
        } else if (rep.n != rp->n) {
            x->status[i] = KVT_EPROTO, b->state = 2;
        } else if (x->tmp[k].status) {
            x->status[i] = x->tmp[k].status == KVT_ENOENT ? KVT_ENOENT : KVT_EIO;
            b->state = 2;
        } else {
            memcpy(b->tag, x->tmp[k].tag, KVI_RTAG);
            b->state = 1;
        }
        if (b->state == 2)
            end_recv(r, b);
    }
    if (rep.status)
        KVT_LOG_W("remote: %s refused a read: %s", pe->k.name, kvt_strerror(rep.status));
}

/* Takes what owner p's socket holds: its challenge or its reply. */
static void take(rd_ctx *x, uint32_t p)
{
    rpeer *pe = &x->r->peers[p];
    zmq_msg_t m;
    zmq_msg_init(&m);
    while (pe->sock && x->rps[p].stage < 3 && zmq_msg_recv(&m, pe->sock, ZMQ_DONTWAIT) >= 0) {
        const uint8_t *b = zmq_msg_data(&m);
        size_t len = zmq_msg_size(&m);
        if (zmq_msg_more(&m))
            continue; /* not ours: a message is one part */
        uint32_t magic = kvi_rwire_magic(b, len);
        if (x->rps[p].stage == 1 && magic == KVI_RCHAL_MAGIC)
            take_challenge(x, p, b, len);
        else if (x->rps[p].stage == 2 && magic == KVI_RREP_MAGIC)
            take_reply(x, p, b, len);
    }
    zmq_msg_close(&m);
}

/* Starts owner p's part of the read: a handshake if its connection has no session, else the
 * request at once. */
static void start_peer(rd_ctx *x, uint32_t p)
{
    kvt_remote *r = x->r;
    rpeer *pe = &r->peers[p];
    int rc = open_peer(r, pe);
    if (!rc)
        rc = pe->sess == SESS_READY ? send_request(x, p) : send_hello(x, p);
    if (rc) {
        KVT_LOG_D("remote: cannot ask %s: %s", pe->k.name, kvt_last_error());
        peer_fails(x, p, KVT_EIO, true);
    }
}

/* Groups the read's blocks by owner (a counting sort keeps each owner's blocks in request
 * order); every block's status starts as a failure. */
static void group_by_peer(rd_ctx *x)
{
    kvt_remote *r = x->r;
    for (uint32_t i = 0; i < x->n; i++)
        x->rps[x->locs[i].peer].n++;
    for (uint32_t p = 0, acc = 0; p < r->n_peers; p++)
        x->rps[p].first = acc, acc += x->rps[p].n, x->rps[p].n = 0;
    for (uint32_t i = 0; i < x->n; i++) {
        rd_peer *rp = &x->rps[x->locs[i].peer];
        x->bs[i].peer = x->locs[i].peer;
        x->bs[i].k = rp->n;
        x->order[rp->first + rp->n++] = i;
        x->status[i] = KVT_EIO;
    }
}

/* One look at every block: a block whose owner answered is decided once its pieces landed;
 * one still waiting for the reply is tagged as soon as its bytes landed (the reply comes after
 * the owner's last send: its tag now, while the others are under way, not all after). Returns
 * whether any block is still open. */
static bool sweep_blocks(rd_ctx *x)
{
    kvt_remote *r = x->r;
    bool open = false;
    for (uint32_t i = 0; i < x->n; i++) {
        rd_block *b = &x->bs[i];
        if (b->state == 1) {
            int w = pieces_done(r, b);
            if (w == 0) {
                open = true;
                continue;
            }
            x->status[i] = w == 1 ? landed(x, i) : KVT_EIO;
            b->state = 2;
            end_recv(r, b);
        } else if (b->state == 0) {
            open = true;
            if (!b->early && !r->cfg.encrypt && x->rps[b->peer].stage == 2 &&
                pieces_done(r, b) == 1)
                b->early = tag_landed(x, i, b->mine) == 0;
        }
    }
    return open;
}

/* Waits, until the deadline at most, for the owners' sockets (handshakes, replies) or UCX's
 * descriptor (bytes), and takes what the sockets have. */
static void wait_owners(rd_ctx *x, uint64_t now, uint64_t deadline, int efd)
{
    kvt_remote *r = x->r;
    zmq_pollitem_t items[KVT_REMOTE_MAX_PEERS + 1];
    uint32_t item_peer[KVT_REMOTE_MAX_PEERS];
    uint32_t ni = 0;
    for (uint32_t p = 0; p < r->n_peers; p++)
        if (x->rps[p].n && (x->rps[p].stage == 1 || x->rps[p].stage == 2) && r->peers[p].sock) {
            items[ni] = (zmq_pollitem_t){.socket = r->peers[p].sock, .events = ZMQ_POLLIN};
            item_peer[ni++] = p;
        }
    uint32_t nz = ni;
    long wait = (long)((deadline - now) / 1000000u) + 1;
    if (efd >= 0 && kvi_ucx_arm(r->ucx_cli) == 0)
        items[ni++] = (zmq_pollitem_t){.fd = efd, .events = ZMQ_POLLIN};
    else if (efd >= 0)
        wait = 0;
    if (efd < 0 && wait > 1)
        wait = 1;
    if (zmq_poll(items, (int)ni, wait) > 0)
        for (uint32_t k = 0; k < nz; k++)
            if (items[k].revents & ZMQ_POLLIN)
                take(x, item_peer[k]);
}

/* What is undecided at the end failed; an owner that did not answer loses its socket. Counts
 * the outcomes; returns the first failure's code (0: every block read). */
static int finish_read(rd_ctx *x)
{
    kvt_remote *r = x->r;
    int rc = 0;
    for (uint32_t p = 0; p < r->n_peers; p++)
        if (x->rps[p].n && (x->rps[p].stage == 1 || x->rps[p].stage == 2)) {
            KVT_LOG_W("remote: %s did not answer within %u ms", r->peers[p].k.name,
                      r->cfg.timeout_ms);
            close_peer(&r->peers[p]);
        }
    for (uint32_t i = 0; i < x->n; i++) {
        int *st = &x->status[i];
        if (x->bs[i].state != 2)
            *st = KVT_EIO;
        end_recv(r, &x->bs[i]);
        if (*st == 0)
            add(&r->a_read_ok, 1), add(&r->a_read_bytes, r->cfg.block_bytes);
        else if (*st == KVT_ENOENT)
            add(&r->a_read_stale, 1);
        else
            add(&r->a_read_failed, 1);
        if (*st && !rc)
            rc = *st;
    }
    return rc;
}

static int read_blocks(kvt_remote *r, const kvt_remote_loc *locs, const uint8_t *hashes, uint32_t n,
                       const rd_dst *d, int *status)
{
    const uint32_t np = r->n_pieces;
    rd_ctx x = {.r = r, .locs = locs, .hashes = hashes, .d = d, .status = status, .n = n};
    x.bs = calloc(n, sizeof(*x.bs));
    kvi_ucx_recv **recvs = calloc((size_t)n * np, sizeof(*recvs));
    x.order = malloc(n * sizeof(*x.order));
    x.rps = calloc(r->n_peers, sizeof(*x.rps));
    x.qb = malloc(n * sizeof(*x.qb));
    x.tmp = malloc(KVT_REMOTE_MAX_READ * sizeof(*x.tmp));
    int rc = 0;
    if (!x.bs || !recvs || !x.order || !x.rps || !x.qb || !x.tmp) {
        rc = refuse_read(kvt_fail(KVT_ENOMEM, "remote: out of memory"), status, n);
        goto out;
    }
    for (uint32_t i = 0; i < n; i++)
        x.bs[i].recv = recvs + (size_t)i * np;
    if ((rc = kvi_ucx_address(r->ucx_cli, &x.addr, &x.addr_len))) {
        refuse_read(rc, status, n);
        goto out;
    }
    add(&r->a_reads, 1);
    add(&r->a_read_blocks, n);
    group_by_peer(&x);
    uint64_t deadline = kvt_monotonic_ns() + (uint64_t)r->cfg.timeout_ms * 1000000u;
    for (uint32_t p = 0; p < r->n_peers; p++)
        if (x.rps[p].n)
            start_peer(&x, p);
    /* one loop: handshakes and replies on the owners' sockets, bytes through UCX */
    int efd = -1;
    (void)kvi_ucx_efd(r->ucx_cli, &efd);
    for (;;) {
        while (kvi_ucx_progress(r->ucx_cli))
            ;
        if (!sweep_blocks(&x))
            break;
        uint64_t now = kvt_monotonic_ns();
        if (now >= deadline)
            break;
        wait_owners(&x, now, deadline, efd);
    }
    rc = finish_read(&x);
    if (r->zombies && bury(r, false))
        KVT_LOG_E("remote: cannot make a new UCX worker: %s", kvt_last_error());
    if (rc)
        kvt_fail(rc, "remote: %u blocks read; the first failure: %s", n, kvt_strerror(rc));
out:
    free(x.bs), free(recvs), free(x.order), free(x.rps), free(x.qb), free(x.tmp);
    return rc;
}

static int check_read(const kvt_remote_loc *locs, uint32_t n, uint32_t n_peers)
{
    if (n > KVT_REMOTE_MAX_READ)
        return kvt_fail(KVT_ELIMIT, "remote: read of %u blocks (at most %u)", n,
                        KVT_REMOTE_MAX_READ);
    for (uint32_t i = 0; i < n; i++)
        if (locs[i].peer >= n_peers)
            return kvt_fail(KVT_EINVAL, "remote: read: block %u names peer %u (%u known)", i,
                            locs[i].peer, n_peers);
    return 0;
}

/* Rank r of an instance reads only from the owners' rank r ("<instance>#<r>"; with one rank,
 * from instances without a rank): any other owner holds other heads of the block, whose tag
 * would check. A directory entry filed under the wrong rank is refused here. */
static int check_rank(const kvt_remote *r, const kvt_remote_peer *id)
{
    if (kvi_rname_is_rank(id->instance, r->cfg.rank, r->parts))
        return 0;
    return kvt_fail(KVT_EINVAL, "remote: owner '%s' is not rank %u of an instance of %u ranks",
                    id->instance, r->parts > 1 ? r->cfg.rank : 0, r->parts);
}

/* The read of n blocks whose owners are ids[locs[i].peer] (an array of entries `stride` bytes
 * apart: the caller's peers, or the lookup side's table read in place), on the reader side:
 * each owner mapped to the reader's connection to it, under rd_mu. */
static int read_by_id(kvt_remote *r, const kvt_remote_peer *ids, size_t stride,
                      const kvt_remote_loc *locs, const uint8_t *hashes, uint32_t n,
                      const rd_dst *d, int *status)
{
    kvt_remote_loc *rl = malloc(n * sizeof(*rl));
    if (!rl)
        return refuse_read(kvt_fail(KVT_ENOMEM, "remote: out of memory"), status, n);
    uint32_t map[KVT_REMOTE_MAX_PEERS];
    memset(map, 0xff, sizeof(map));
    pthread_mutex_lock(&r->rd_mu);
    int rc = r->lookup_only ? kvt_fail(KVT_ESTATE, "remote: a lookup-only client reads nothing")
             : r->ucx_cli   ? 0
                            : kvt_fail(KVT_ESTATE,
                                       "remote: no UCX worker to read with (its replacement failed)");
    r->reads_seq++;
    for (uint32_t i = 0; i < n && !rc; i++) {
        uint32_t p = locs[i].peer;
        const kvt_remote_peer *id =
            (const kvt_remote_peer *)(const void *)((const char *)ids + (size_t)p * stride);
        if (map[p] == UINT32_MAX && !(rc = check_rank(r, id)))
            map[p] = reader_peer(r, id); /* at most KVT_REMOTE_MAX_PEERS owners: an entry */
        rl[i] = locs[i];
        rl[i].peer = map[p];
    }
    rc = rc ? refuse_read(rc, status, n) : read_blocks(r, rl, hashes, n, d, status);
    pthread_mutex_unlock(&r->rd_mu);
    free(rl);
    return rc;
}

int kvt_remote_read(kvt_remote *r, const kvt_remote_loc *locs, const uint8_t *hashes, uint32_t n,
                    void *const *dst, int *status)
{
    if (!r || (n && (!locs || !hashes || !dst || !status)))
        return refuse_read(kvt_fail(KVT_EINVAL, "remote: read: NULL argument"), status, n);
    int rc = check_read(locs, n, r->n_lk);
    for (uint32_t i = 0; i < n && !rc; i++)
        if (!dst[i])
            rc = kvt_fail(KVT_EINVAL, "remote: read: block %u has no destination", i);
    if (rc || n == 0)
        return refuse_read(rc, status, n);
    uint64_t *off = malloc(r->n_pieces * sizeof(*off));
    if (!off)
        return refuse_read(kvt_fail(KVT_ENOMEM, "remote: out of memory"), status, n);
    for (uint32_t j = 0, acc = 0; j < r->n_pieces; acc += (uint32_t)r->piece[j].block_bytes, j++)
        off[j] = acc;
    rd_dst d = {.dst = dst, .off = off};
    rc = read_by_id(r, &r->lk[0].id, sizeof(r->lk[0]), locs, hashes, n, &d, status);
    free(off);
    return rc;
}

/* The checks of a read into this instance's slots (what: the call, for its messages). */
static int check_slots_read(const kvt_remote *r, const uint32_t *slots, uint32_t n,
                            const char *what)
{
    if (n && !r->serves)
        return kvt_fail(KVT_ESTATE, "remote: %s: this instance has no slots", what);
    for (uint32_t i = 0; i < n; i++)
        if (slots[i] >= r->cfg.n_slots)
            return kvt_fail(KVT_ERANGE, "remote: %s: slot %u out of range (%u slots)", what,
                            slots[i], r->cfg.n_slots);
    return 0;
}

int kvt_remote_read_slots(kvt_remote *r, const kvt_remote_loc *locs, const uint8_t *hashes,
                          uint32_t n, const uint32_t *slots, int *status)
{
    if (!r || (n && (!locs || !hashes || !slots || !status)))
        return refuse_read(kvt_fail(KVT_EINVAL, "remote: read_slots: NULL argument"), status, n);
    int rc = check_read(locs, n, r->n_lk);
    if (!rc)
        rc = check_slots_read(r, slots, n, "read_slots");
    if (rc || n == 0)
        return refuse_read(rc, status, n);
    rd_dst d = {.slots = slots};
    return read_by_id(r, &r->lk[0].id, sizeof(r->lk[0]), locs, hashes, n, &d, status);
}

int kvt_remote_read_from(kvt_remote *r, const kvt_remote_peer *peers, uint32_t n_peers,
                         const kvt_remote_loc *locs, const uint8_t *hashes, uint32_t n,
                         const uint32_t *slots, int *status)
{
    if (!r || (n && (!peers || !locs || !hashes || !slots || !status)))
        return refuse_read(kvt_fail(KVT_EINVAL, "remote: read_from: NULL argument"), status, n);
    int rc = n_peers > KVT_REMOTE_MAX_PEERS
                 ? kvt_fail(KVT_ELIMIT, "remote: read_from: %u peers (at most %u)", n_peers,
                            KVT_REMOTE_MAX_PEERS)
                 : check_read(locs, n, n_peers);
    for (uint32_t k = 0; k < n_peers && !rc; k++)
        if (!memchr(peers[k].instance, 0, sizeof(peers[k].instance)) ||
            !memchr(peers[k].endpoint, 0, sizeof(peers[k].endpoint)) || !peers[k].endpoint[0])
            rc = kvt_fail(KVT_EINVAL,
                          "remote: read_from: peer %u has no endpoint or an "
                          "unterminated name",
                          k);
    if (!rc)
        rc = check_slots_read(r, slots, n, "read_from");
    if (rc || n == 0)
        return refuse_read(rc, status, n);
    rd_dst d = {.slots = slots};
    return read_by_id(r, peers, sizeof(*peers), locs, hashes, n, &d, status);
}

void kvt_remote_get_stats(kvt_remote *r, kvt_remote_stats *out)
{
    if (!r || !out)
        return;
    *out = r->st;
    out->epoch = atomic_load(&r->epoch);
    out->published = atomic_load(&r->a_published);
    out->withdrawn = atomic_load(&r->a_withdrawn);
    out->publish_dropped = atomic_load(&r->a_pub_dropped);
    out->directory_errors += atomic_load(&r->a_pub_dir_errors);
    out->reads = atomic_load(&r->a_reads);
    out->read_blocks = atomic_load(&r->a_read_blocks);
    out->read_ok = atomic_load(&r->a_read_ok);
    out->read_stale = atomic_load(&r->a_read_stale);
    out->read_failed = atomic_load(&r->a_read_failed);
    out->read_bytes = atomic_load(&r->a_read_bytes);
    out->registrations = atomic_load(&r->a_registrations);
    out->served_blocks = atomic_load(&r->a_served);
    out->served_stale = atomic_load(&r->a_served_stale);
    out->served_bytes = atomic_load(&r->a_served_bytes);
    out->refused_requests = atomic_load(&r->a_refused);
    out->handshakes = r->st.handshakes + atomic_load(&r->a_handshakes);
    out->auth_failures = r->st.auth_failures + atomic_load(&r->a_auth_failures);
}
