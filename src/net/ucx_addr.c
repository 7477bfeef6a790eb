/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A peer's UCX worker address, parsed in full before UCX sees it (ucx.h).
 *
 * UCX unpacks a worker address without knowing its length and trusts every byte: a crafted
 * header aborts the process (an assertion on the format version), and lengths that run past
 * the end make it read whatever follows. So a peer's address is first parsed here as UCX
 * 1.13's packer writes a worker address (ucp_address_pack with the default worker flags, not
 * unified mode; src/ucp/wireup/address.c of UCX 1.13, whose layout this restates): every
 * length must fit in the bytes given, every count within UCX's own limits, every flag one the
 * packer sets, and the parse must end exactly at the last byte. UCX's format versions 1 and 2
 * (0 and 1 in the header) are both read; a peer must speak the version this build packs.
 *
 *   header       v1: one byte, version (4 bits) and flags (4 bits); v2: version byte, flags
 *                byte. Flags: debug info (the worker's name follows), uuid, client id, AM only.
 *   uuid         8 bytes (always in v1: the unpacker reads it for worker addresses)
 *   client id    8 bytes, if flagged
 *   name         length byte and that many bytes, if debug info
 *   devices      0xff alone: none. Else per device: md index byte (0x80: no transports;
 *                v2 extends 0x7f into a second byte), length byte of the device address with
 *                flags (0x80 last device, 0x40 a paths byte follows, 0x20 a system device byte
 *                follows; v2 extends 0x1f), those bytes, the device address; then, unless
 *                empty, per transport: name checksum (2 bytes), attributes (v1: 16 bytes,
 *                three floats and a word; v2: 8 bytes), length byte of the interface address
 *                with flags (0x80 last transport, 0x40 endpoint addresses follow, which a
 *                worker address never has; v2 extends 0x3f), the interface address.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/error.h"
#include "net/ucx.h"

#define MAX_RESOURCES 128 /* UCP_MAX_RESOURCES */
#define MAX_MDS       64  /* UCP_MAX_MDS */
#define NULL_RESOURCE 0xffu
#define V1            0u /* UCP_OBJECT_VERSION_V1: the format's "version 1" is 0 on the wire */
#define V2            1u

typedef struct rd {
    const uint8_t *p, *end;
    unsigned version;
} rd;

static int bad(const rd *r, const uint8_t *base, const char *what)
{
    return kvt_fail(KVT_EPROTO, "ucx: a peer's worker address: %s at byte %zu", what,
                    (size_t)(r->p - base));
}

static bool take(rd *r, size_t n, const uint8_t **out)
{
    if ((size_t)(r->end - r->p) < n)
        return false;
    if (out)
        *out = r->p;
    r->p += n;
    return true;
}

/* A byte whose low bits (mask) are a value; in v2 the all-ones value means "the next byte". */
static bool extended(rd *r, unsigned mask, unsigned *flags, unsigned *value)
{
    const uint8_t *b;
    if (!take(r, 1, &b))
        return false;
    *flags = *b & ~mask & 0xffu;
    *value = *b & mask;
    if (r->version != V1 && *value == mask) {
        if (!take(r, 1, &b))
            return false;
        *value = *b;
    }
    return true;
}

static bool float_in(const uint8_t *p, float lo, float hi)
{
    float f;
    memcpy(&f, p, sizeof(f));
    return isfinite(f) && f >= lo && f <= hi;
}

/* Version 1's attributes: overhead and latency overhead in seconds, bandwidth in bytes per
 * second (this build never packs the negative form of UCX <= 1.11), a word of priority (8
 * bits), interface flags (13), the event flag (1) and two atomics bits (30, 31). Out-of-range
 * values make UCX's lane scores negative, which its assertions do not survive. */
static bool attrs_v1_ok(const uint8_t *b)
{
    uint32_t w;
    memcpy(&w, b + 12, 4);
    return float_in(b, 0.0f, 1.0f) && float_in(b + 4, 1.0f, 1e15f) && float_in(b + 8, 0.0f, 1.0f) &&
           (w & 0x3fc00000u) == 0;
}

/* One transport of the address, for the checks against our own (kvi_ucx_addr_ref). */
typedef struct entry {
    uint16_t csum;
    unsigned dev_len, if_len;
} entry;

static bool known_lengths(const kvi_ucx_addr_ref *ref, const entry *e, const char **why)
{
    bool known = false;
    for (uint32_t i = 0; i < ref->n; i++) {
        if (ref->e[i].csum != e->csum)
            continue;
        known = true;
        if (ref->e[i].if_len != e->if_len) {
            *why = "an interface address of another length than this transport's";
            return false;
        }
        if (ref->e[i].dev_len == e->dev_len || ref->e[i].any_dev_len)
            return true;
    }
    *why = "a device address of another length than this transport's";
    return !known; /* a transport we do not have: UCX ignores it */
}

/* The header: format version, flags, and the worker's id, client id and name it announces.
 * Leaves r->p at the device list; *v receives the version. */
static int parse_header(rd *r, const uint8_t *a, size_t len, unsigned version, unsigned *v)
{
    if (!a || len < 2 || len > KVI_UCX_ADDR_MAX)
        return kvt_fail(KVT_EPROTO, "ucx: a peer's worker address of %zu bytes", len);
    unsigned flags;
    *v = a[0] & 0x0fu;
    if (*v != version || (*v != V1 && *v != V2))
        return kvt_fail(KVT_EPROTO,
                        "ucx: a peer's worker address of format version %u; this build's UCX "
                        "packs version %u (another UCX version, or a forged address)",
                        *v, version);
    if (*v == V1) {
        flags = a[0] >> 4;
        r->p = a + 1;
    } else {
        if (a[0] >> 4)
            return bad(r, a, "header bits this UCX never sets");
        flags = a[1];
        r->p = a + 2;
    }
    if (flags & ~0x0fu)
        return bad(r, a, "unknown header flags");
    const uint8_t *b;
    if ((*v == V1 || (flags & 0x2)) && !take(r, 8, NULL)) /* uuid */
        return bad(r, a, "truncated worker id");
    if ((flags & 0x4) && !take(r, 8, NULL)) /* client id */
        return bad(r, a, "truncated client id");
    if ((flags & 0x1) && (!take(r, 1, &b) || !take(r, *b, NULL))) /* the worker's name */
        return bad(r, a, "truncated worker name");
    return 0;
}

/* One transport of a device (dev_len: the device address's length): checked against ref's
 * lengths if given, recorded in out if given; *last: it was the device's last. */
static int parse_transport(rd *r, const uint8_t *a, unsigned v, unsigned dev_len,
                           const kvi_ucx_addr_ref *ref, kvi_ucx_addr_ref *out, bool *last)
{
    const uint8_t *b;
    entry e = {.dev_len = dev_len};
    if (!take(r, 2, &b)) /* transport name checksum */
        return bad(r, a, "truncated transport");
    memcpy(&e.csum, b, 2);
    if (v == V1) {
        if (!take(r, 16, &b))
            return bad(r, a, "truncated transport attributes");
        if (!attrs_v1_ok(b))
            return bad(r, a, "transport attributes out of range");
    } else if (!take(r, 8, NULL)) {
        return bad(r, a, "truncated transport attributes");
    }
    unsigned tlf, if_len;
    if (!extended(r, 0x3fu, &tlf, &if_len))
        return bad(r, a, "truncated interface address length");
    if (tlf & 0x40u)
        return bad(r, a, "endpoint addresses in a worker address");
    *last = tlf & 0x80u;
    if (!take(r, if_len, NULL))
        return bad(r, a, "an interface address past the end");
    e.if_len = if_len;
    const char *why;
    if (ref && !known_lengths(ref, &e, &why))
        return bad(r, a, why);
    if (out && out->n < KVI_UCX_ADDR_REF_MAX)
        out->e[out->n++] = (kvi_ucx_addr_ref_entry){e.csum, e.dev_len, e.if_len, false};
    return 0;
}

int kvi_ucx_addr_parse(const void *addr, size_t len, unsigned version, const kvi_ucx_addr_ref *ref,
                       kvi_ucx_addr_ref *out)
{
    const uint8_t *a = addr;
    rd r = {a, a + len, version};
    if (out)
        out->n = 0;
    unsigned v = 0;
    int rc = parse_header(&r, a, len, version, &v);
    if (rc)
        return rc;
    if (r.p < r.end && *r.p == NULL_RESOURCE) /* no device at all */
        return r.p + 1 == r.end ? 0 : bad(&r, a, "bytes after an empty device list");
    unsigned entries = 0;
    const uint8_t *b;
    for (bool last_dev = false; !last_dev;) {
        unsigned mdf, md, devf, dev_len;
        if (!extended(&r, v == V1 ? 0x1fu : 0x7fu, &mdf, &md))
            return bad(&r, a, "truncated device");
        if (md >= MAX_MDS)
            return bad(&r, a, "a memory domain index out of range");
        bool empty = mdf & 0x80u;
        if (!extended(&r, 0x1fu, &devf, &dev_len))
            return bad(&r, a, "truncated device address length");
        last_dev = devf & 0x80u;
        if ((devf & 0x40u) && (!take(&r, 1, &b) || *b == 0)) /* paths */
            return bad(&r, a, "a bad path count");
        if ((devf & 0x20u) && !take(&r, 1, NULL)) /* system device */
            return bad(&r, a, "truncated system device");
        if (!take(&r, dev_len, NULL))
            return bad(&r, a, "a device address past the end");
        for (bool last_tl = empty; !last_tl;) {
            if (++entries > MAX_RESOURCES)
                return bad(&r, a, "more transports than UCX handles");
            if ((rc = parse_transport(&r, a, v, dev_len, ref, out, &last_tl)))
                return rc;
        }
    }
    return r.p == r.end ? 0 : bad(&r, a, "bytes after the last device");
}
