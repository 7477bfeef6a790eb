/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The remote tier's read channel messages, version 3 (little endian, docs/wire.md):
 *
 *   hello      u32 magic "KVRH"; u32 version; 32 bytes nonce; 32 bytes X25519 ephemeral
 *              public key; u32 name_len, name
 *   challenge  u32 magic "KVRC"; u32 version; 32 bytes reader's nonce; 32 bytes owner's
 *              nonce; 32 bytes reader's ephemeral key (echoed); 32 bytes owner's ephemeral
 *              key; 16 bytes boot id; u32 name_len, name; 32 bytes proof
 *   request    u32 magic "KVRR"; u32 version; u64 seq; u64 req_id; u64 epoch;
 *              u32 flags; u32 hash_len; u32 addr_len, addr; u32 n;
 *              n x {u32 slot; u64 generation; hash_len bytes hash}; 16 bytes MAC
 *   reply      u32 magic "KVRP"; u32 version; u64 seq; u64 req_id; i32 status; u32 n;
 *              n x {i32 status; 16 bytes tag}; 16 bytes MAC
 *
 * Version 1 carried the credential itself in every request; version 2 derived the session
 * from the credential and the clear nonces alone (a member that saw a handshake could decrypt
 * it) and sent the reads' UCX tags in clear (a relay could send under them first). Both are
 * refused (KVT_EVERSION).
 * Decoding checks every length against what is left and every count against its limit before
 * anything is used, and refuses trailing bytes. The MACs are checked by the caller, who holds
 * the session key.
 */
#include <string.h>

#include "base/error.h"
#include "meta/wire.h"
#include "remote/remote_internal.h"

#define NAME_MAX_ KVT_REMOTE_NAME_MAX

uint32_t kvi_rwire_magic(const uint8_t *buf, size_t len)
{
    return len >= 4 ? ld_le32(buf) : 0;
}

static void wr_bytes(kvi_wr *w, const void *p, size_t n)
{
    memcpy(w->p, p, n);
    w->p += n;
}

static int rd_bytes(kvi_rd *r, void *out, size_t n, const char *what)
{
    int rc = rd_need(r, n, what);
    if (rc)
        return rc;
    memcpy(out, r->p, n);
    r->p += n;
    return 0;
}

static int head(kvi_rd *r, uint32_t magic, const char *what)
{
    uint32_t m, v;
    int rc = rd_u32(r, &m, "magic");
    if (rc)
        return rc;
    if (m != magic)
        return kvt_fail(KVT_EPROTO, "remote: not a %s (magic %08x)", what, m);
    if ((rc = rd_u32(r, &v, "version")))
        return rc;
    if (v != KVI_RWIRE_VERSION)
        return kvt_fail(KVT_EVERSION, "remote: %s version %u, this build speaks %u", what, v,
                        KVI_RWIRE_VERSION);
    return 0;
}

/* A length-prefixed byte string of 1..max bytes. */
static int bytes(kvi_rd *r, const uint8_t **p, uint32_t *len, uint32_t max, const char *what)
{
    int rc = rd_u32(r, len, what);
    if (rc)
        return rc;
    if (*len == 0 || *len > max)
        return kvt_fail(KVT_EPROTO, "remote: %s of %u bytes (1..%u)", what, *len, max);
    if ((rc = rd_need(r, *len, what)))
        return rc;
    *p = r->p;
    r->p += *len;
    return 0;
}

static int trailing(const kvi_rd *r, const char *what)
{
    return r->p == r->end ? 0
                          : kvt_fail(KVT_EPROTO, "remote: %zu bytes after the %s",
                                     (size_t)(r->end - r->p), what);
}

/* ---- hello and challenge ---------------------------------------------------------------- */

size_t kvi_rhello_size(const kvi_rhello *h)
{
    return 4 + 4 + 32 + 32 + 4 + h->name_len;
}

void kvi_rhello_encode(const kvi_rhello *h, uint8_t *buf)
{
    kvi_wr w = {buf};
    wr_u32(&w, KVI_RHELLO_MAGIC);
    wr_u32(&w, KVI_RWIRE_VERSION);
    wr_bytes(&w, h->nr, 32);
    wr_bytes(&w, h->er, 32);
    wr_u32(&w, h->name_len);
    wr_bytes(&w, h->name, h->name_len);
}

int kvi_rhello_decode(const uint8_t *buf, size_t len, kvi_rhello *h)
{
    kvi_rd r = {buf, buf, buf + len};
    int rc;
    if ((rc = head(&r, KVI_RHELLO_MAGIC, "hello")) || (rc = rd_bytes(&r, h->nr, 32, "nonce")) ||
        (rc = rd_bytes(&r, h->er, 32, "ephemeral key")) ||
        (rc = bytes(&r, &h->name, &h->name_len, NAME_MAX_, "name")))
        return rc;
    return trailing(&r, "hello");
}

size_t kvi_rchal_size(const kvi_rchal *c)
{
    return 4 + 4 + 32 + 32 + 32 + 32 + 16 + 4 + c->name_len + 32;
}

void kvi_rchal_encode(const kvi_rchal *c, uint8_t *buf)
{
    kvi_wr w = {buf};
    wr_u32(&w, KVI_RCHAL_MAGIC);
    wr_u32(&w, KVI_RWIRE_VERSION);
    wr_bytes(&w, c->nr, 32);
    wr_bytes(&w, c->no, 32);
    wr_bytes(&w, c->er, 32);
    wr_bytes(&w, c->eo, 32);
    wr_bytes(&w, c->boot, 16);
    wr_u32(&w, c->name_len);
    wr_bytes(&w, c->name, c->name_len);
    wr_bytes(&w, c->proof, 32);
}

int kvi_rchal_decode(const uint8_t *buf, size_t len, kvi_rchal *c)
{
    kvi_rd r = {buf, buf, buf + len};
    int rc;
    if ((rc = head(&r, KVI_RCHAL_MAGIC, "challenge")) || (rc = rd_bytes(&r, c->nr, 32, "nonce")) ||
        (rc = rd_bytes(&r, c->no, 32, "nonce")) ||
        (rc = rd_bytes(&r, c->er, 32, "ephemeral key")) ||
        (rc = rd_bytes(&r, c->eo, 32, "ephemeral key")) ||
        (rc = rd_bytes(&r, c->boot, 16, "boot id")) ||
        (rc = bytes(&r, &c->name, &c->name_len, NAME_MAX_, "name")) ||
        (rc = rd_bytes(&r, c->proof, 32, "proof")))
        return rc;
    return trailing(&r, "challenge");
}

/* ---- request and reply ------------------------------------------------------------------- */

size_t kvi_rreq_size(const kvi_rreq *q)
{
    return 4 + 4 + 8 + 8 + 8 + 4 + 4 + 4 + q->addr_len + 4 + (size_t)q->n * (4 + 8 + q->hash_len) +
           KVI_RMAC;
}

void kvi_rreq_encode(const kvi_rreq *q, uint8_t *buf)
{
    kvi_wr w = {buf};
    wr_u32(&w, KVI_RREQ_MAGIC);
    wr_u32(&w, KVI_RWIRE_VERSION);
    wr_u64(&w, q->seq);
    wr_u64(&w, q->req_id);
    wr_u64(&w, q->epoch);
    wr_u32(&w, q->flags);
    wr_u32(&w, q->hash_len);
    wr_u32(&w, q->addr_len);
    wr_bytes(&w, q->addr, q->addr_len);
    wr_u32(&w, q->n);
    for (uint32_t i = 0; i < q->n; i++) {
        wr_u32(&w, q->blocks[i].slot);
        wr_u64(&w, q->blocks[i].generation);
        wr_bytes(&w, q->blocks[i].hash, q->hash_len);
    }
    memset(w.p, 0, KVI_RMAC);
}

int kvi_rreq_decode(const uint8_t *buf, size_t len, kvi_rreq *q)
{
    if (len < KVI_RMAC)
        return kvt_fail(KVT_EPROTO, "remote: a read request of %zu bytes", len);
    kvi_rd r = {buf, buf, buf + len - KVI_RMAC};
    int rc;
    if ((rc = head(&r, KVI_RREQ_MAGIC, "read request")) || (rc = rd_u64(&r, &q->seq, "seq")) ||
        (rc = rd_u64(&r, &q->req_id, "req_id")) || (rc = rd_u64(&r, &q->epoch, "epoch")) ||
        (rc = rd_u32(&r, &q->flags, "flags")) || (rc = rd_u32(&r, &q->hash_len, "hash_len")))
        return rc;
    if (q->flags & ~KVI_RREQ_ENCRYPT)
        return kvt_fail(KVT_EPROTO, "remote: unknown request flags %x", q->flags);
    if (q->hash_len == 0 || q->hash_len > KVT_REMOTE_MAX_HASH)
        return kvt_fail(KVT_EPROTO, "remote: hash_len %u (1..%u)", q->hash_len,
                        KVT_REMOTE_MAX_HASH);
    if ((rc = bytes(&r, &q->addr, &q->addr_len, KVI_RADDR_MAX, "data address")) ||
        (rc = rd_count(&r, &q->n, KVT_REMOTE_MAX_READ, 12 + (size_t)q->hash_len, "blocks")))
        return rc;
    if (q->n == 0)
        return kvt_fail(KVT_EPROTO, "remote: a read request of no block");
    for (uint32_t i = 0; i < q->n; i++) {
        kvi_rreq_block *b = &q->blocks[i];
        (void)rd_u32(&r, &b->slot, "slot"); /* rd_count checked the room */
        (void)rd_u64(&r, &b->generation, "generation");
        b->hash = r.p;
        r.p += q->hash_len;
    }
    return trailing(&r, "read request");
}

size_t kvi_rrep_size(const kvi_rrep *p)
{
    return 4 + 4 + 8 + 8 + 4 + 4 + (size_t)p->n * (4 + 16) + KVI_RMAC;
}

void kvi_rrep_encode(const kvi_rrep *p, uint8_t *buf)
{
    kvi_wr w = {buf};
    wr_u32(&w, KVI_RREP_MAGIC);
    wr_u32(&w, KVI_RWIRE_VERSION);
    wr_u64(&w, p->seq);
    wr_u64(&w, p->req_id);
    wr_u32(&w, (uint32_t)p->status);
    wr_u32(&w, p->n);
    for (uint32_t i = 0; i < p->n; i++) {
        wr_u32(&w, (uint32_t)p->blocks[i].status);
        wr_bytes(&w, p->blocks[i].tag, 16);
    }
    memset(w.p, 0, KVI_RMAC);
}

static bool known_status(int32_t s)
{
    return s == 0 || (s <= KVT_EINVAL && s >= KVT_EUNSUPPORTED);
}

int kvi_rrep_decode(const uint8_t *buf, size_t len, kvi_rrep *p)
{
    if (len < KVI_RMAC)
        return kvt_fail(KVT_EPROTO, "remote: a read reply of %zu bytes", len);
    kvi_rd r = {buf, buf, buf + len - KVI_RMAC};
    uint32_t st;
    int rc;
    if ((rc = head(&r, KVI_RREP_MAGIC, "read reply")) || (rc = rd_u64(&r, &p->seq, "seq")) ||
        (rc = rd_u64(&r, &p->req_id, "req_id")) || (rc = rd_u32(&r, &st, "status")) ||
        (rc = rd_count(&r, &p->n, KVT_REMOTE_MAX_READ, 20, "blocks")))
        return rc;
    p->status = (int32_t)st;
    if (!known_status(p->status))
        return kvt_fail(KVT_EPROTO, "remote: reply status %d", p->status);
    for (uint32_t i = 0; i < p->n; i++) {
        (void)rd_u32(&r, &st, "status");
        p->blocks[i].status = (int32_t)st;
        (void)rd_bytes(&r, p->blocks[i].tag, 16, "tag");
        if (!known_status(p->blocks[i].status))
            return kvt_fail(KVT_EPROTO, "remote: block %u status %d", i, p->blocks[i].status);
    }
    return trailing(&r, "read reply");
}
