/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Hand-built wire messages for decoder tests: lets a test write exactly the (possibly invalid)
 * bytes another implementation might send.
 */
#ifndef KVT_WIRE_BUILDER_H
#define KVT_WIRE_BUILDER_H

#include <stdint.h>
#include <string.h>

typedef struct wb {
    unsigned char b[4096];
    size_t n;
} wb;

static inline void wb_u8(wb *w, uint8_t v)
{
    w->b[w->n++] = v;
}

static inline void wb_u32(wb *w, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        wb_u8(w, (uint8_t)(v >> (8 * i)));
}

static inline void wb_u64(wb *w, uint64_t v)
{
    wb_u32(w, (uint32_t)v);
    wb_u32(w, (uint32_t)(v >> 32));
}

static inline void wb_str(wb *w, const char *s, uint32_t len)
{
    wb_u32(w, len);
    memcpy(w->b + w->n, s, len);
    w->n += len;
}

/* Starts a message of `kind`; wb_done fills in the body length. */
static inline void wb_begin(wb *w, uint32_t kind)
{
    w->n = 0;
    memcpy(w->b, "KVTM", 4);
    w->n = 4;
    wb_u8(w, (uint8_t)KVT_META_VERSION);
    wb_u8(w, 0);
    wb_u8(w, (uint8_t)kind);
    wb_u8(w, 0);
    wb_u32(w, 0);
}

static inline void wb_done(wb *w)
{
    uint32_t body = (uint32_t)(w->n - 12);
    for (int i = 0; i < 4; i++)
        w->b[8 + i] = (unsigned char)(body >> (8 * i));
}

#endif
