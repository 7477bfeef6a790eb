/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Chunked bump storage. Chunks form a list; `cur` is the chunk being filled and every chunk
 * after it is empty (clear resets them all and rewinds cur to the head). A request that does
 * not fit moves cur forward to the first later chunk with room, or appends a new chunk at
 * least twice the size of the last one, so a long-lived object converges to a few chunks.
 */
#include "base/bump.h"

#include <stdlib.h>
#include <string.h>

#include "base/error.h"

#define MIN_CHUNK 1024u

struct kvt_bump_chunk {
    struct kvt_bump_chunk *next;
    size_t cap, used;
    _Alignas(16) unsigned char data[];
};

static size_t pad8(size_t x)
{
    return (8 - (x & 7)) & 7;
}

static struct kvt_bump_chunk *find_room(kvt_bump *b, size_t n)
{
    for (struct kvt_bump_chunk *c = b->cur; c; c = c->next) {
        size_t off = c->used + pad8(c->used);
        if (off <= c->cap && n <= c->cap - off) {
            b->cur = c;
            return c;
        }
    }
    size_t last = 0;
    struct kvt_bump_chunk **tail = &b->head;
    while (*tail) {
        last = (*tail)->cap;
        tail = &(*tail)->next;
    }
    size_t cap = last * 2 > MIN_CHUNK ? last * 2 : MIN_CHUNK;
    if (cap < n)
        cap = n;
    if (cap > SIZE_MAX - sizeof(struct kvt_bump_chunk))
        return NULL;
    struct kvt_bump_chunk *c = malloc(sizeof(*c) + cap);
    if (!c)
        return NULL;
    c->next = NULL;
    c->cap = cap;
    c->used = 0;
    *tail = c;
    b->cur = c;
    return c;
}

void *kvi_bump_alloc(kvt_bump *b, size_t n)
{
    struct kvt_bump_chunk *c = find_room(b, n);
    if (!c)
        return NULL;
    size_t off = c->used + pad8(c->used);
    c->used = off + n;
    return c->data + off;
}

char *kvi_bump_strdup(kvt_bump *b, const char *s, uint32_t len)
{
    char *d = kvi_bump_alloc(b, (size_t)len + 1);
    if (!d)
        return NULL;
    if (len)
        memcpy(d, s, len);
    d[len] = '\0';
    return d;
}

int kvi_bump_reserve(kvt_bump *b, size_t n)
{
    if (!find_room(b, n))
        return kvt_fail(KVT_ENOMEM, "out of memory reserving %zu bytes of strings", n);
    return 0;
}

void kvt_bump_clear(kvt_bump *b)
{
    for (struct kvt_bump_chunk *c = b->head; c; c = c->next)
        c->used = 0;
    b->cur = b->head;
}

void kvt_bump_release(kvt_bump *b)
{
    struct kvt_bump_chunk *c = b->head;
    while (c) {
        struct kvt_bump_chunk *n = c->next;
        free(c);
        c = n;
    }
    b->head = b->cur = NULL;
}
