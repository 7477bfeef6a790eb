/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The reader side of the remote tier (remote_impl.h), on the caller's thread: per owner, a
 * handshake when its connection has no session yet (the owner's proof checked: a directory
 * entry naming a process without the credential never gets a request or an address), then
 * receives posted and one request, all owners at once in one poll loop (ZeroMQ sockets and
 * UCX's event fd) until every block is decided or timeout_ms passed. A block counts only when
 * its tag checks on the bytes that landed: GMAC under the owner's block key (or GCM decryption
 * under the session). A socket whose owner did not answer is closed (the next read reconnects
 * and shakes hands again); receives not completed are cancelled before read returns.
 */
#include "remote/remote_impl.h"

/* The reader-side connection for owner id (under rd_mu): the same instance at the same
 * endpoint keeps its connection unless its epoch changed; else the least recently used entry
 * not needed by this read is replaced. UINT32_MAX when every entry is needed by this read. */
static uint32_t reader_peer(kvt_remote *r, const kvt_remote_peer *id)
{
    int kind;
    uint32_t i =
        kvi_remote_peer_slot(r->peers, sizeof(r->peers[0]), &r->n_peers, id, r->reads_seq, &kind);
    if (i == UINT32_MAX)
        return i;
    rpeer *p = &r->peers[i];
    if (kind != PEER_SAME)
        close_peer(p); /* a restarted owner, or another one: its session is not this one's */
    if (kind == PEER_NEW) {
        OPENSSL_cleanse(p, sizeof(*p));
        kvi_remote_peer_key_set(&p->k, id, r->reads_seq);
    }
    return i;
}

/* Ends the receives UCX did not give back (zombies): once more with a wait, then, if any is
 * still held, by destroying the reader's worker (nothing writes their buffers after that) and
 * making a new one unless `final`. */
int kvi_remote_bury(kvt_remote *r, bool final)
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
    return rc ? rc : kvi_remote_map_pieces(r, r->ucx_cli);
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
    return kvi_remote_block_tag(r, r->gcm_rd, r->peers[x->bs[i].peer].block_key, x->locs[i].slot,
                                x->locs[i].generation, x->hashes + (size_t)i * r->cfg.hash_len, pc,
                                tag);
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
    if (r->zombies && kvi_remote_bury(r, false))
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
