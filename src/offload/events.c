/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Cache events with request context (spec kv-offload §2.12, §2.14).
 *
 * The tiers' pools queue stored, removed and all-cleared events as their keys change. The
 * manager drains them, in order, into its own ring of kvt_offload_event, adding what a pool
 * does not know: the medium (which tier), the group's kind and window, and for blocks an
 * eager store selected for a request with a context, that context, the block's first token
 * and its parent hash. Those three are noted at selection (kvi_ofl_events_note), follow the
 * host block through its store pair (bind) and are attached when the pair completes and the
 * pool queues the block's stored events (kvi_ofl_events_stored): the host pool is drained
 * right before and right after the registration, so every event of that drain is the block's.
 *
 * A request's slot stays while host blocks in store pairs name it (ctx_refs), so a finished
 * request's last stores still carry its context; freeing the slot queues CONTEXT_DONE, after
 * every event naming it. Nothing here allocates after setup.
 */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/util.h"
#include "offload/offload_internal.h"

#define PULL_BATCH 64u

int kvi_ofl_events_setup(kvt_offload *m)
{
    struct kvi_ofl_events *ev = &m->ev;
    uint32_t cap = m->cfg.event_capacity, nb = m->tier[0].nb;
    if (!cap)
        return 0;
    size_t par = (size_t)m->hash_len + 1;
    int rc = kvi_ring_init(&ev->ring, sizeof(kvt_offload_event), cap);
    if (rc)
        return kvi_fail_wrap(rc, "offload: cache events");
    ev->hslot = malloc((size_t)nb * sizeof(uint32_t));
    ev->htok = calloc(nb, sizeof(uint32_t));
    ev->hpar = calloc(nb, par);
    ev->seltok = calloc(nb, sizeof(uint32_t));
    ev->selpar = calloc(nb, par);
    if (!ev->hslot || !ev->htok || !ev->hpar || !ev->seltok || !ev->selpar)
        return kvt_fail(KVT_ENOMEM, "offload: cannot allocate %u cache events", cap);
    for (uint32_t i = 0; i < nb; i++)
        ev->hslot[i] = OFL_NONE;
    return 0;
}

void kvi_ofl_events_teardown(kvt_offload *m)
{
    struct kvi_ofl_events *ev = &m->ev;
    kvi_ring_free(&ev->ring);
    free(ev->hslot);
    free(ev->htok);
    free(ev->hpar);
    free(ev->seltok);
    free(ev->selpar);
    memset(ev, 0, sizeof(*ev));
}

static kvt_offload_event *push(kvt_offload *m)
{
    struct kvi_ofl_events *ev = &m->ev;
    kvt_offload_event *e = kvi_ring_push(&ev->ring);
    if (!e) {
        ev->dropped++;
        return NULL;
    }
    memset(e, 0, sizeof(*e));
    return e;
}

void kvi_ofl_events_note_at(kvt_offload *m, const struct kvi_ofl_req *r, uint32_t n,
                            uint32_t token_start, const uint8_t *parent)
{
    if (!m->ev.ring.cap || !r->ctx)
        return;
    m->ev.seltok[n] = token_start;
    uint8_t *par = m->ev.selpar + (size_t)n * (m->hash_len + 1);
    par[0] = parent != NULL;
    if (parent)
        memcpy(par + 1, parent, m->hash_len);
}

void kvi_ofl_events_note(kvt_offload *m, const struct kvi_ofl_req *r, uint32_t n, uint32_t g,
                         uint32_t j, const uint32_t *const *blocks, const uint8_t *hashes,
                         uint32_t n_hashes)
{
    if (!m->ev.ring.cap || !r->ctx)
        return;
    kvt_pool_key pk;
    /* the key of the block before, in this group: from the request's hashes when the engine
     * gives them, else from the GPU pool (a masked predecessor then leaves it unknown) */
    bool ok = j > 0 && (kvi_ofl_key_from_hashes(m, hashes, n_hashes, g, j - 1, &pk) ||
                        (!m->ext && !hashes && blocks[g][j - 1] != KVT_NULL_BLOCK &&
                         kvi_ofl_gpu_primary(m, blocks[g][j - 1], &pk)));
    kvi_ofl_events_note_at(m, r, n, j * m->gcfg.groups[g].block_size, ok ? pk.hash : NULL);
}

void kvi_ofl_events_bind(kvt_offload *m, struct kvi_ofl_req *r, uint32_t i, uint32_t h)
{
    struct kvi_ofl_events *ev = &m->ev;
    if (!ev->ring.cap)
        return;
    if (!r || !r->ctx) {
        ev->hslot[h] = OFL_NONE;
        return;
    }
    size_t par = (size_t)m->hash_len + 1;
    ev->hslot[h] = kvi_ofl_req_slot(m, r);
    ev->htok[h] = ev->seltok[i];
    memcpy(ev->hpar + (size_t)h * par, ev->selpar + (size_t)i * par, par);
    r->ctx_refs++;
}

/* Drains tier t's pool; stored events of block `block` get the context of host slot `slot`
 * (OFL_NONE: none). */
static void pull(kvt_offload *m, uint32_t t, uint32_t block, uint32_t slot)
{
    kvt_pool *p = m->tier[t].pool;
    kvt_pool_event buf[PULL_BATCH];
    uint64_t lost = 0;
    uint32_t n;
    do {
        n = kvt_pool_take_events(p, buf, PULL_BATCH, &lost);
        m->ev.dropped += lost;
        for (uint32_t i = 0; i < n; i++) {
            const kvt_pool_event *pe = &buf[i];
            kvt_offload_event *e = push(m);
            if (!e)
                continue;
            e->type = pe->type; /* the pool's numbering */
            e->medium = t == 0 ? KVT_MEDIUM_HOST : KVT_MEDIUM_DISK;
            e->block = pe->block;
            if (pe->type == KVT_POOL_EV_ALL_CLEARED)
                continue;
            const kvt_group_spec *gs = &m->gcfg.groups[pe->group < m->ng ? pe->group : 0];
            e->group = pe->group;
            e->num_tokens = pe->num_tokens;
            e->kind = gs->kind;
            e->window = gs->kind == KVT_GROUP_SLIDING ? gs->sliding_window : 0;
            memcpy(e->hash, pe->hash, m->hash_len);
            if (pe->type != KVT_POOL_EV_STORED || pe->block != block || slot == OFL_NONE)
                continue;
            const uint8_t *par = m->ev.hpar + (size_t)block * (m->hash_len + 1);
            e->ctx = m->reqs[slot].ctx;
            e->token_start = m->ev.htok[block];
            e->has_parent = par[0];
            if (par[0])
                memcpy(e->parent_hash, par + 1, m->hash_len);
        }
    } while (n == PULL_BATCH);
}

void kvi_ofl_events_pull(kvt_offload *m, uint32_t t)
{
    if (m->ev.ring.cap && m->tier[t].pool)
        pull(m, t, OFL_NONE, OFL_NONE);
}

void kvi_ofl_events_stored(kvt_offload *m, uint32_t h, bool registered)
{
    struct kvi_ofl_events *ev = &m->ev;
    if (!ev->ring.cap)
        return;
    uint32_t slot = ev->hslot[h];
    if (registered)
        pull(m, 0, h, slot);
    if (slot == OFL_NONE)
        return;
    ev->hslot[h] = OFL_NONE;
    m->reqs[slot].ctx_refs--; /* the slot goes at the next sweep once this reaches zero */
}

void kvi_ofl_events_req_done(kvt_offload *m, struct kvi_ofl_req *r)
{
    if (!m->ev.ring.cap || !r->ctx)
        return;
    kvt_offload_event *e = push(m);
    if (e) {
        e->type = KVT_OFFLOAD_EV_CONTEXT_DONE;
        e->ctx = r->ctx;
    }
    r->ctx = 0;
}

int kvt_offload_set_request_context(kvt_offload *m, const char *id, uint32_t id_len, uint64_t ctx)
{
    int rc = kvi_ofl_check_id(id, id_len);
    if (rc)
        return rc;
    if (!ctx)
        return kvt_fail(KVT_EINVAL, "offload: set_request_context: ctx must not be 0");
    if (!m->ev.ring.cap || m->cfg.lazy)
        return 0; /* events off, or lazy stores, which carry no request context */
    struct kvi_ofl_req *r = kvi_ofl_req_find(m, id, id_len);
    if (!r || !(r->flags & RQ_EAGER) || (r->flags & RQ_FINISHED))
        return 0;
    if (r->ctx && r->ctx != ctx)
        return kvt_fail(KVT_ESTATE,
                        "offload: set_request_context: request %.*s already has context %llu",
                        (int)id_len, id, (unsigned long long)r->ctx);
    r->ctx = ctx;
    return 1;
}

uint32_t kvt_offload_take_events(kvt_offload *m, kvt_offload_event *out, uint32_t cap,
                                 uint64_t *dropped)
{
    struct kvi_ofl_events *ev = &m->ev;
    uint32_t n = 0;
    if (ev->ring.cap) {
        for (uint32_t t = 0; t < KVI_OFL_TIERS; t++)
            kvi_ofl_events_pull(m, t);
        n = kvi_ring_take(&ev->ring, out, cap);
    }
    if (dropped) {
        *dropped = ev->dropped;
        ev->dropped = 0;
    }
    return n;
}
