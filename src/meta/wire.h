/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Bounds-checked reading and unchecked-by-construction writing of the kvtier wire format.
 *
 * Reader: every rd_* call first checks that the bytes it needs lie inside the buffer and fails
 * with KVT_EPROTO (naming the field and offset) otherwise, so a decoder is a straight sequence
 * of reads with `if (rc) goto fail` and can never read out of bounds. rd_count additionally
 * bounds a count both by a protocol limit and by the bytes left (count * smallest element),
 * so a few hostile bytes cannot make a decoder allocate gigabytes.
 *
 * Writer: encoders compute the exact size first and write into a buffer of at least that size;
 * the writer only advances a pointer.
 *
 * All integers are little-endian.
 */
#ifndef KVT_META_WIRE_H
#define KVT_META_WIRE_H

#include "base/export.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "base/error.h"
#include "kvtier/meta.h"

typedef struct kvi_rd {
    const uint8_t *base, *p, *end;
} kvi_rd;

static inline size_t rd_off(const kvi_rd *r)
{
    return (size_t)(r->p - r->base);
}

static inline int rd_need(kvi_rd *r, size_t n, const char *what)
{
    if ((size_t)(r->end - r->p) < n)
        return kvt_fail(KVT_EPROTO, "truncated message: %s needs %zu bytes at offset %zu, %zu left",
                        what, n, rd_off(r), (size_t)(r->end - r->p));
    return 0;
}

static inline uint32_t ld_le32(const uint8_t *b)
{
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

static inline uint64_t ld_le64(const uint8_t *b)
{
    return (uint64_t)ld_le32(b) | (uint64_t)ld_le32(b + 4) << 32;
}

static inline int rd_u8(kvi_rd *r, uint8_t *v, const char *what)
{
    int rc = rd_need(r, 1, what);
    if (rc)
        return rc;
    *v = *r->p++;
    return 0;
}

static inline int rd_u32(kvi_rd *r, uint32_t *v, const char *what)
{
    int rc = rd_need(r, 4, what);
    if (rc)
        return rc;
    *v = ld_le32(r->p);
    r->p += 4;
    return 0;
}

static inline int rd_u64(kvi_rd *r, uint64_t *v, const char *what)
{
    int rc = rd_need(r, 8, what);
    if (rc)
        return rc;
    *v = ld_le64(r->p);
    r->p += 8;
    return 0;
}

static inline int rd_i64(kvi_rd *r, int64_t *v, const char *what)
{
    uint64_t u;
    int rc = rd_u64(r, &u, what);
    if (!rc)
        *v = (int64_t)u;
    return rc;
}

static inline int rd_bool(kvi_rd *r, bool *v, const char *what)
{
    uint8_t b;
    int rc = rd_u8(r, &b, what);
    if (rc)
        return rc;
    if (b > 1)
        return kvt_fail(KVT_EPROTO, "%s at offset %zu is %u, expected 0 or 1", what, rd_off(r) - 1,
                        b);
    *v = b;
    return 0;
}

/* A count of elements each at least min_elem bytes long, at most max. */
static inline int rd_count(kvi_rd *r, uint32_t *n, uint32_t max, size_t min_elem, const char *what)
{
    int rc = rd_u32(r, n, what);
    if (rc)
        return rc;
    if (*n > max)
        return kvt_fail(KVT_ELIMIT, "%s: %u exceeds the limit of %u", what, *n, max);
    if ((uint64_t)*n * min_elem > (uint64_t)(r->end - r->p))
        return kvt_fail(KVT_EPROTO, "%s: %u elements cannot fit in the %zu bytes left", what, *n,
                        (size_t)(r->end - r->p));
    return 0;
}

/* A length-prefixed string (not copied: *s points into the buffer). */
static inline int rd_str(kvi_rd *r, const char **s, uint32_t *len, const char *what)
{
    int rc = rd_u32(r, len, what);
    if (rc)
        return rc;
    if (*len > KVT_META_MAX_STR)
        return kvt_fail(KVT_ELIMIT, "%s: string of %u bytes exceeds the limit of %u", what, *len,
                        KVT_META_MAX_STR);
    rc = rd_need(r, *len, what);
    if (rc)
        return rc;
    *s = (const char *)r->p;
    r->p += *len;
    return 0;
}

/* Checks the header and points r at the body. */
int kvi_wire_begin(kvi_rd *r, const void *buf, size_t len, uint32_t kind);
/* Fails if bytes remain after the body. */
int kvi_wire_end(const kvi_rd *r);

/* Reads a message body into obj; returns 0 or a code. */
typedef int (*kvi_body_fn)(void *obj, kvi_rd *r);
/* One whole decode: header of `kind`, body, nothing after it. A validation failure inside the
 * body (KVT_EINVAL) becomes KVT_EPROTO, and the message is prefixed with `what`. The caller
 * empties its object when this fails. */
KVI_EXPORT int kvi_wire_decode(const void *buf, size_t len, uint32_t kind, kvi_body_fn body,
                               void *obj, const char *what);

typedef struct kvi_wr {
    uint8_t *p;
} kvi_wr;

static inline void wr_u8(kvi_wr *w, uint8_t v)
{
    *w->p++ = v;
}

static inline void wr_u16(kvi_wr *w, uint16_t v)
{
    w->p[0] = (uint8_t)v;
    w->p[1] = (uint8_t)(v >> 8);
    w->p += 2;
}

static inline void wr_u32(kvi_wr *w, uint32_t v)
{
    w->p[0] = (uint8_t)v;
    w->p[1] = (uint8_t)(v >> 8);
    w->p[2] = (uint8_t)(v >> 16);
    w->p[3] = (uint8_t)(v >> 24);
    w->p += 4;
}

static inline void wr_u64(kvi_wr *w, uint64_t v)
{
    wr_u32(w, (uint32_t)v);
    wr_u32(w, (uint32_t)(v >> 32));
}

static inline void wr_str(kvi_wr *w, kvt_str s)
{
    wr_u32(w, s.len);
    if (s.len)
        memcpy(w->p, s.ptr, s.len);
    w->p += s.len;
}

/* Writes the header for a body of body_len bytes. */
KVI_EXPORT void kvi_wire_header(kvi_wr *w, uint32_t kind, size_t body_len);

/* Common encode prologue: checks buf/cap against the exact size. */
KVI_EXPORT int kvi_wire_check_out(const void *buf, size_t cap, size_t need, size_t *len);

#endif
