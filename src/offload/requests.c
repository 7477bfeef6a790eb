/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The offload manager's request table: requests found by their string id through an
 * open-addressing map from the id's XXH3 to a fixed slot (max_requests, allocated at create),
 * the FIFOs of request slots (queued loads, a load event's requests, promotions) and the list
 * of finished requests waiting for their transfers.
 *
 * A slot lives while the request holds anything: a pinned hit, a queued or in-flight load, or
 * an eager registration (while running). Finished requests whose load is still in flight sit
 * on the waiting list, swept after every step (kvi_ofl_req_sweep).
 */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/hash.h"
#include "offload/offload_internal.h"

/* ---- request FIFOs --------------------------------------------------------------------- */

static uint32_t *rq_link(kvt_offload *m, uint32_t slot, size_t link)
{
    return (uint32_t *)((char *)&m->reqs[slot] + link);
}

void kvi_ofl_rq_push(kvt_offload *m, uint32_t *head, uint32_t *tail, size_t link, uint32_t slot)
{
    *rq_link(m, slot, link) = OFL_NONE;
    if (*tail == OFL_NONE)
        *head = slot;
    else
        *rq_link(m, *tail, link) = slot;
    *tail = slot;
}

void kvi_ofl_rq_unlink(kvt_offload *m, uint32_t *head, uint32_t *tail, size_t link, uint32_t slot)
{
    uint32_t prev = OFL_NONE;
    for (uint32_t s = *head; s != OFL_NONE; prev = s, s = *rq_link(m, s, link)) {
        if (s != slot)
            continue;
        uint32_t next = *rq_link(m, s, link);
        if (prev == OFL_NONE)
            *head = next;
        else
            *rq_link(m, prev, link) = next;
        if (*tail == slot)
            *tail = prev;
        return;
    }
}

/* ---- requests -------------------------------------------------------------------------- */

int kvi_ofl_fail_id(const char *id, uint32_t len)
{
    return kvt_fail(KVT_EINVAL, "offload: request id must be 1..%u bytes (got %u%s)",
                    KVT_REQ_ID_MAX, len, id ? "" : ", NULL");
}

struct kvi_ofl_req *kvi_ofl_req_find(const kvt_offload *m, const char *id, uint32_t len)
{
    uint64_t h = kvi_xxh3_64(id, len, 0), pos = kvi_map_probe_start(&m->req_map, h);
    uint32_t slot;
    while (kvi_map_probe_next(&m->req_map, h, &pos, &slot)) {
        struct kvi_ofl_req *r = &m->reqs[slot];
        if (r->id_len == len && memcmp(r->id, id, len) == 0)
            return r;
    }
    return NULL;
}

struct kvi_ofl_req *kvi_ofl_req_get(kvt_offload *m, const char *id, uint32_t len)
{
    struct kvi_ofl_req *r = kvi_ofl_req_find(m, id, len);
    if (r)
        return r;
    if (m->free_req == OFL_NONE) {
        kvt_fail(KVT_ENOSPC, "offload: all %u request slots in use (max_requests)",
                 m->cfg.max_requests);
        return NULL;
    }
    uint32_t slot = m->free_req;
    r = &m->reqs[slot];
    m->free_req = r->free_next;
    memset(r, 0, sizeof(*r));
    memset(kvi_ofl_cursor(m, r), 0, m->ng * sizeof(uint32_t));
    r->used = true;
    r->id_hash = kvi_xxh3_64(id, len, 0);
    r->id_len = len;
    memcpy(r->id, id, len);
    kvi_idlist_init(&r->hit);
    r->load_event = KVT_NO_EVENT;
    r->load_head = r->load_next = r->wait_next = OFL_NONE;
    r->promo_head = r->promo_next = OFL_NONE;
    (void)kvi_map_insert(&m->req_map, r->id_hash, slot); /* room for every slot */
    m->n_reqs++;
    return r;
}

static bool req_busy(const struct kvi_ofl_req *r)
{
    if (r->ctx_refs) /* stores in flight will still name its context */
        return true;
    if (r->flags & (RQ_HIT | RQ_LOAD_QUEUED | RQ_LOAD_SENT | RQ_PROMO_QUEUED | RQ_PROMO_SENT))
        return true;
    return (r->flags & (RQ_EAGER | RQ_FINISHED)) == RQ_EAGER;
}

static void req_free(kvt_offload *m, struct kvi_ofl_req *r)
{
    uint32_t slot = kvi_ofl_req_slot(m, r);
    kvi_ofl_events_req_done(m, r);
    kvi_map_remove(&m->req_map, r->id_hash, slot);
    r->used = false;
    r->free_next = m->free_req;
    m->free_req = slot;
    m->n_reqs--;
}

void kvi_ofl_req_maybe_release(kvt_offload *m, struct kvi_ofl_req *r)
{
    if (req_busy(r)) {
        if ((r->flags & RQ_FINISHED) && !(r->flags & RQ_WAITING)) {
            r->flags |= RQ_WAITING;
            r->wait_next = m->wait_head;
            m->wait_head = kvi_ofl_req_slot(m, r);
        }
        return;
    }
    if (!(r->flags & RQ_WAITING)) /* on the list: the next sweep frees it */
        req_free(m, r);
}

/* Frees the finished requests whose transfers are all done. */
void kvi_ofl_req_sweep(kvt_offload *m)
{
    uint32_t s = m->wait_head;
    m->wait_head = OFL_NONE;
    while (s != OFL_NONE) {
        struct kvi_ofl_req *r = &m->reqs[s];
        s = r->wait_next;
        r->flags &= ~RQ_WAITING;
        kvi_ofl_req_maybe_release(m, r);
    }
}

int kvi_ofl_check_span(const kvt_offload *m, const uint32_t *const *blocks,
                       const uint32_t *n_blocks, const uint32_t *from, uint32_t end_tokens,
                       const char *what, bool *any)
{
    if (!blocks || !n_blocks)
        return kvt_fail(KVT_EINVAL, "offload: %s: NULL block table", what);
    bool found = false;
    for (uint32_t g = 0; g < m->ng; g++) {
        uint32_t start = from ? from[g] : 0, end = end_tokens / m->gcfg.groups[g].block_size;
        if (end > n_blocks[g])
            end = n_blocks[g];
        if (end <= start)
            continue;
        found = true;
        if (!blocks[g])
            return kvt_fail(KVT_EINVAL, "offload: %s: group %u has %u blocks but no list", what, g,
                            n_blocks[g]);
        for (uint32_t j = start; j < end; j++)
            if (blocks[g][j] >= m->gpu_nb)
                return kvt_fail(KVT_ERANGE,
                                "offload: %s: group %u block %u is GPU block %u, out "
                                "of range (GPU pool has %u blocks)",
                                what, g, j, blocks[g][j], m->gpu_nb);
    }
    if (any)
        *any = found;
    return 0;
}
