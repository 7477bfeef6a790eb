/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The consumer shard's resident pool: completed items kept by mm_hash so a later reserve or
 * load of the same content is served without a transfer. The current entry of an mm_hash is
 * found through res_map; a displaced entry lives on until its last lease. Evictable residents
 * (current, unpinned, unleased) form an LRU list; a freed entry's memory goes back to the
 * slab only after its retire fence passed (deferred frees, polled before every allocation).
 */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "ec/shard_impl.h"

/* ---- resident pool --------------------------------------------------------------------- */

res *kvi_shard_res_find(const kvt_ec_shard *sh, const ec_key *h)
{
    uint32_t i = ec_key_find(&sh->res_map, sh->res, sizeof(res), offsetof(res, h), h);
    return i == NONE ? NULL : &sh->res[i];
}

uint32_t kvi_shard_res_idx(const kvt_ec_shard *sh, const res *e)
{
    return (uint32_t)(e - sh->res);
}

void kvi_shard_lru_remove(kvt_ec_shard *sh, res *e)
{
    if (!e->in_lru)
        return;
    KVI_ILIST_REMOVE(&sh->lru, sh->res, lru, kvi_shard_res_idx(sh, e));
    e->in_lru = false;
}

static void lru_append(kvt_ec_shard *sh, res *e)
{
    KVI_ILIST_PUSH_BACK(&sh->lru, sh->res, lru, kvi_shard_res_idx(sh, e));
    e->in_lru = true;
}

static bool fence_passed(const kvt_ec_fence *f)
{
    return !f->done || f->done(f->ctx);
}

/* Frees an allocation once its fence passed (now, or at a later poll). */
static void free_after(kvt_ec_shard *sh, const kvt_slab_view *v, const kvt_ec_fence *f)
{
    if (!f || fence_passed(f)) {
        (void)kvt_slab_free(sh->slab, v);
        return;
    }
    if (kvi_array_grow((void **)&sh->defer, &sh->cap_defer, sh->n_defer + 1ull,
                       sizeof(pending_free)) != 0) {
        /* cannot remember it: leaking the bytes is safe, reusing them early is not */
        kvt_fail(KVT_ENOMEM, "ec shard: cannot defer a free; %llu bytes leaked",
                 (unsigned long long)v->rounded);
        return;
    }
    sh->defer[sh->n_defer++] = (pending_free){*v, *f};
    sh->st.deferred_frees++;
}

void kvi_shard_poll_deferred(kvt_ec_shard *sh)
{
    uint32_t k = 0;
    for (uint32_t i = 0; i < sh->n_defer; i++) {
        if (fence_passed(&sh->defer[i].fence))
            (void)kvt_slab_free(sh->slab, &sh->defer[i].view);
        else
            sh->defer[k++] = sh->defer[i];
    }
    sh->n_defer = k;
}

void kvi_shard_res_free(kvt_ec_shard *sh, res *e)
{
    kvi_shard_lru_remove(sh, e);
    if (e->current)
        kvi_map_remove(&sh->res_map, e->h.hash, kvi_shard_res_idx(sh, e));
    free_after(sh, &e->view, &e->fence);
    e->used = false;
    kvi_slot_give(sh->res, &sh->free_res, sizeof(res), offsetof(res, free_next),
                  kvi_shard_res_idx(sh, e));
    sh->res_count--;
}

/* An entry's holders changed: evictable when current, unpinned and unleased; freed when
 * displaced and unleased. */
void kvi_shard_res_settle(kvt_ec_shard *sh, res *e)
{
    if (e->leases || e->pinned) {
        kvi_shard_lru_remove(sh, e);
        return;
    }
    if (!e->current)
        kvi_shard_res_free(sh, e);
    else if (!e->in_lru)
        lru_append(sh, e);
}

static res *res_new(kvt_ec_shard *sh)
{
    if (sh->free_res == NONE && sh->n_res >= sh->cfg.max_residents)
        return NULL;
    uint32_t i = kvi_slot_take((void **)&sh->res, &sh->n_res, &sh->cap_res, &sh->free_res,
                               sizeof(res), offsetof(res, free_next));
    if (i == NONE)
        return NULL;
    res *e = &sh->res[i];
    memset(e, 0, sizeof(*e));
    e->used = true;
    e->lru.prev = e->lru.next = NONE;
    sh->res_count++;
    return e;
}

/* Makes (h, d, view) the current entry of h; the one it displaces lives on while leased and
 * is reused only after its retire fence, or `fence` (recorded now) if it was never retired. */
res *kvi_shard_res_publish(kvt_ec_shard *sh, const ec_key *h, const desc *d, const kvt_slab_view *v,
                           bool pinned, const kvt_ec_fence *fence)
{
    res *e = res_new(sh);
    if (!e) { /* table full: the bytes stay with nobody; give them back */
        (void)kvt_slab_free(sh->slab, v);
        return NULL;
    }
    res *old = kvi_shard_res_find(sh, h);
    if (old) {
        kvi_map_remove(&sh->res_map, old->h.hash, kvi_shard_res_idx(sh, old));
        old->current = false;
        if (old->pinned) { /* still in the encoder cache: kernels may read it until fence */
            old->pinned = false;
            old->fence = fence ? *fence : (kvt_ec_fence){NULL, NULL};
        }
        kvi_shard_lru_remove(sh, old);
        kvi_shard_res_settle(sh, old);
    }
    e->h = *h;
    e->d = *d;
    e->view = *v;
    e->pinned = pinned;
    e->current = true;
    (void)kvi_map_insert(&sh->res_map, h->hash, kvi_shard_res_idx(sh, e)); /* room: max_residents */
    kvi_shard_res_settle(sh, e);
    return e;
}

void kvi_shard_lease_take(kvt_ec_shard *sh, rec *r, res *e)
{
    e->leases++;
    r->lease = kvi_shard_res_idx(sh, e);
    kvi_shard_lru_remove(sh, e);
}

void kvi_shard_lease_release(kvt_ec_shard *sh, rec *r)
{
    if (r->lease == NONE)
        return;
    res *e = &sh->res[r->lease];
    r->lease = NONE;
    e->leases--;
    kvi_shard_res_settle(sh, e);
}
