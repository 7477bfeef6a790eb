/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Chunked id lists; see idlist.h.
 */
#include "base/idlist.h"

#include <stdlib.h>
#include <string.h>

#include "base/error.h"

int kvi_idpool_init(kvi_idpool *p, uint32_t ids)
{
    memset(p, 0, sizeof(*p));
    uint64_t n = ((uint64_t)ids + KVT_IDCHUNK_IDS - 1) / KVT_IDCHUNK_IDS;
    if (n == 0)
        n = 1;
    if (n >= KVT_IDNONE)
        return kvt_fail(KVT_EINVAL, "idpool: %u ids is too many", ids);
    p->chunks = malloc(n * 16 * sizeof(uint32_t));
    if (!p->chunks)
        return kvt_fail(KVT_ENOMEM, "idpool: cannot allocate %llu chunks", (unsigned long long)n);
    p->n_chunks = (uint32_t)n;
    for (uint32_t i = 0; i < n; i++)
        p->chunks[(uint64_t)i * 16] = i + 1 < n ? i + 1 : KVT_IDNONE;
    p->free_head = 0;
    p->n_free = (uint32_t)n;
    return 0;
}

void kvi_idpool_free(kvi_idpool *p)
{
    free(p->chunks);
    memset(p, 0, sizeof(*p));
}

bool kvi_idpool_can_hold(const kvi_idpool *p, const kvi_idlist *l, uint32_t n)
{
    uint32_t room = l->len ? (KVT_IDCHUNK_IDS - (l->len - 1) % KVT_IDCHUNK_IDS - 1) : 0;
    if (n <= room)
        return true;
    uint64_t need = ((uint64_t)n - room + KVT_IDCHUNK_IDS - 1) / KVT_IDCHUNK_IDS;
    return need <= p->n_free;
}

int kvi_idlist_push(kvi_idpool *p, kvi_idlist *l, uint32_t v)
{
    uint32_t slot = l->len % KVT_IDCHUNK_IDS;
    if (slot == 0) {
        if (p->free_head == KVT_IDNONE)
            return kvt_fail(KVT_ENOSPC, "idpool: all %u chunks in use", p->n_chunks);
        uint32_t c = p->free_head;
        p->free_head = p->chunks[(uint64_t)c * 16];
        p->n_free--;
        p->chunks[(uint64_t)c * 16] = KVT_IDNONE;
        if (l->tail == KVT_IDNONE)
            l->head = c;
        else
            p->chunks[(uint64_t)l->tail * 16] = c;
        l->tail = c;
    }
    p->chunks[(uint64_t)l->tail * 16 + 1 + slot] = v;
    l->len++;
    return 0;
}

void kvi_idlist_release(kvi_idpool *p, kvi_idlist *l)
{
    uint32_t c = l->head;
    while (c != KVT_IDNONE) {
        uint32_t next = p->chunks[(uint64_t)c * 16];
        p->chunks[(uint64_t)c * 16] = p->free_head;
        p->free_head = c;
        p->n_free++;
        c = next;
    }
    kvi_idlist_init(l);
}
