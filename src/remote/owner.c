/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The owner side of the remote tier (remote_impl.h): one thread answers handshakes and
 * serves read requests arriving on a ROUTER socket, and keeps the liveness key fresh
 * (registering again, with a new epoch, when the key is gone: a Redis restart or a stall
 * longer than ttl_ms; it then publishes again every block it holds). A connection's first
 * message is a hello; the owner answers with its nonce, ephemeral key, boot id and a proof of
 * membership, and keeps the connection's session (bounded table, oldest dropped). A request
 * is read only once its MAC under that session checks and its sequence number grew (a replay
 * is refused); then the epoch (a request for entries of an earlier start of this instance
 * gets nothing) and per block the slot's record (published, same generation and hash) and,
 * with owner_checksum, the slot's bytes against the tag recorded at publish. The bytes go by
 * UCX tagged sends into the receives the reader posted (encrypted under the session on the
 * way, when asked); after the sends completed the generation is looked at again, so a slot
 * withdrawn meanwhile is reported stale; the reply, MACed, carries each sent block's tag.
 */
#include "remote/remote_impl.h"

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
int kvi_remote_enter(kvt_remote *r, kvi_rdir *dir)
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
    int rc = kvi_remote_enter(r, &r->dir_srv);
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
        if (kvi_remote_block_tag(r, sc->chk, r->block_key, slot, sc->gen[i], sc->hashes[i], pc,
                                 tag) ||
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

void *kvi_remote_server_main(void *arg)
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
