/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Encoders and decoders of the link's frames (see link_internal.h for the layout). Decoders
 * read through the bounds-checked kvi_rd reader: they fail with KVT_EPROTO on any length,
 * magic, version or range problem and never read outside the buffer.
 */
#include "base/error.h"
#include "meta/wire.h"
#include "net/link_internal.h"

static const uint8_t MAGIC[4] = {'K', 'V', 'T', 'L'};

void kvi_link_hdr_encode(uint8_t out[KVT_LINK_HDR_LEN], uint32_t type, uint64_t step)
{
    kvi_wr w = {out};
    memcpy(w.p, MAGIC, 4);
    w.p += 4;
    wr_u16(&w, KVT_LINK_VERSION);
    wr_u16(&w, (uint16_t)type);
    wr_u64(&w, step);
}

int kvi_link_hdr_decode(const void *buf, size_t len, uint32_t *type, uint64_t *step)
{
    if (len != KVT_LINK_HDR_LEN)
        return kvt_fail(KVT_EPROTO, "link: header of %zu bytes, expected %u", len,
                        KVT_LINK_HDR_LEN);
    const uint8_t *b = buf;
    if (memcmp(b, MAGIC, 4) != 0)
        return kvt_fail(KVT_EPROTO, "link: bad magic");
    uint32_t version = (uint32_t)b[4] | (uint32_t)b[5] << 8;
    if (version != KVT_LINK_VERSION)
        return kvt_fail(KVT_EVERSION, "link: version %u, this build speaks %u", version,
                        KVT_LINK_VERSION);
    *type = (uint32_t)b[6] | (uint32_t)b[7] << 8;
    if (*type < KVT_LINK_HELLO || *type > KVT_LINK_STOP)
        return kvt_fail(KVT_EPROTO, "link: unknown message type %u", *type);
    *step = ld_le64(b + 8);
    return 0;
}

void kvi_link_hello_encode(uint8_t out[KVT_LINK_HELLO_LEN], uint32_t rank, uint32_t world,
                           uint32_t host_blocks)
{
    kvi_wr w = {out};
    wr_u32(&w, rank);
    wr_u32(&w, world);
    wr_u32(&w, host_blocks);
}

int kvi_link_hello_decode(const void *buf, size_t len, uint32_t *rank, uint32_t *world,
                          uint32_t *host_blocks)
{
    if (len != KVT_LINK_HELLO_LEN)
        return kvt_fail(KVT_EPROTO, "link: hello of %zu bytes, expected %u", len,
                        KVT_LINK_HELLO_LEN);
    const uint8_t *b = buf;
    *rank = ld_le32(b);
    *world = ld_le32(b + 4);
    *host_blocks = ld_le32(b + 8);
    if (*world == 0 || *world > KVT_LINK_MAX_WORLD || *rank >= *world)
        return kvt_fail(KVT_EPROTO, "link: hello from rank %u of world %u", *rank, *world);
    if (*host_blocks < 2)
        return kvt_fail(KVT_EPROTO, "link: rank %u allocated %u host blocks (need >= 2)", *rank,
                        *host_blocks);
    return 0;
}

size_t kvi_link_status_size(uint32_t n_invalid, uint32_t msg_len)
{
    return 12 + (size_t)n_invalid * 4 + 4 + msg_len;
}

void kvi_link_status_encode(uint8_t *out, uint32_t rank, int32_t status, const uint32_t *invalid,
                            uint32_t n_invalid, const char *msg, uint32_t msg_len)
{
    kvi_wr w = {out};
    wr_u32(&w, rank);
    wr_u32(&w, (uint32_t)status);
    wr_u32(&w, n_invalid);
    for (uint32_t i = 0; i < n_invalid; i++)
        wr_u32(&w, invalid[i]);
    wr_str(&w, (kvt_str){msg, msg_len});
}

int kvi_link_status_decode(const void *buf, size_t len, kvi_link_status *st)
{
    kvi_rd r = {buf, buf, (const uint8_t *)buf + len};
    uint32_t s;
    int rc = rd_u32(&r, &st->rank, "rank");
    if (!rc)
        rc = rd_u32(&r, &s, "status");
    if (!rc)
        rc = rd_count(&r, &st->n_invalid, KVT_LINK_MAX_INVALID, 4, "invalid blocks");
    if (rc)
        return kvi_fail_wrap(rc == KVT_ELIMIT ? rc : KVT_EPROTO, "link: status");
    st->status = (int32_t)s;
    if (st->status > 0 || st->status < KVT_EUNSUPPORTED)
        return kvt_fail(KVT_EPROTO, "link: status %d is not a kvtier code", st->status);
    st->invalid = r.p;
    r.p += (size_t)st->n_invalid * 4;
    rc = rd_str(&r, &st->msg, &st->msg_len, "message");
    if (!rc && r.p != r.end)
        rc = kvt_fail(KVT_EPROTO, "link: status: %zu trailing bytes", (size_t)(r.end - r.p));
    if (rc)
        return kvi_fail_wrap(rc == KVT_ELIMIT ? rc : KVT_EPROTO, "link: status");
    return 0;
}

size_t kvi_link_ids_size(const kvt_str *ids, uint32_t n)
{
    size_t t = 4;
    for (uint32_t i = 0; i < n; i++)
        t += 4 + (size_t)ids[i].len;
    return t;
}

void kvi_link_ids_encode(uint8_t *out, const kvt_str *ids, uint32_t n)
{
    kvi_wr w = {out};
    wr_u32(&w, n);
    for (uint32_t i = 0; i < n; i++)
        wr_str(&w, ids[i]);
}

int kvi_link_ids_check(const void *buf, size_t len, uint32_t *n)
{
    kvi_rd r = {buf, buf, (const uint8_t *)buf + len};
    int rc = rd_count(&r, n, KVT_META_MAX_ITEMS, 5, "finished requests");
    for (uint32_t i = 0; !rc && i < *n; i++) {
        const char *s;
        uint32_t l;
        rc = rd_str(&r, &s, &l, "request id");
        if (!rc && (l == 0 || l > KVT_META_MAX_STR))
            rc = kvt_fail(KVT_EPROTO, "request id of %u bytes", l);
    }
    if (!rc && r.p != r.end)
        rc = kvt_fail(KVT_EPROTO, "%zu trailing bytes", (size_t)(r.end - r.p));
    if (rc)
        return kvi_fail_wrap(rc == KVT_ELIMIT ? rc : KVT_EPROTO, "link");
    return 0;
}
