/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The consumer shard as the consumer worker drives it each step (kvt_ec_shard_apply: retire
 * what the cache freed, load what the scheduler asked for, report what was reclaimed), and
 * its metrics.
 */
#include <string.h>

#include "base/error.h"
#include "base/prom.h"
#include "ec/shard_impl.h"

/* ---- the consumer worker's step ------------------------------------------------------------ */

static kvt_ec_fence fence_now(const kvt_ec_cache_ops *c)
{
    return c->fence ? c->fence(c->ctx) : (kvt_ec_fence){NULL, NULL};
}

static int retire_freed(kvt_ec_shard *sh, const kvt_ec_meta *meta, const kvt_ec_cache_ops *c)
{
    if (meta->has_freed) {
        for (uint32_t i = 0; i < meta->n_freed; i++) {
            ec_key h;
            if (kvi_shard_key_set(&h, meta->freed[i].ptr, meta->freed[i].len, "freed mm_hash"))
                continue; /* a hash this shard could never hold */
            res *e = kvi_shard_res_find(sh, &h);
            if (!e || !e->pinned || c->holds(c->ctx, h.s, h.len, &e->view))
                continue; /* still this very tensor in the cache */
            kvt_ec_fence f = fence_now(c);
            (void)kvt_ec_shard_retire(sh, h.s, h.len, &f);
        }
        return 0;
    }
    for (uint32_t i = 0; i < sh->n_res; i++) { /* freed = None: every stale pinned resident */
        res *e = &sh->res[i];
        if (!e->used || !e->current || !e->pinned || c->holds(c->ctx, e->h.s, e->h.len, &e->view))
            continue;
        kvt_ec_fence f = fence_now(c);
        (void)kvt_ec_shard_retire(sh, e->h.s, e->h.len, &f);
    }
    return 0;
}

static int load_one(kvt_ec_shard *sh, const kvt_ec_load_spec *sp, const kvt_ec_cache_ops *c)
{
    if (c->holds(c->ctx, sp->mm_hash.ptr, sp->mm_hash.len, NULL)) {
        if (!sp->local) { /* already cached: the pushed copy is not needed */
            bool done;
            (void)kvt_ec_shard_cancel(sh, sp->transfer_id.ptr, sp->transfer_id.len, NULL, false,
                                      false, &done);
        }
        return 0;
    }
    kvt_slab_view v;
    int rc;
    if (sp->local) {
        kvt_ec_item it = {sp->mm_hash.ptr, sp->mm_hash.len, sp->nbytes, sp->ndim, {0},
                          sp->dtype.ptr,   sp->dtype.len};
        memcpy(it.shape, sp->shape, sp->ndim * sizeof(uint64_t));
        rc = kvt_ec_shard_take_resident(sh, &it, &v);
    } else {
        kvt_ec_fence f = fence_now(c);
        rc = kvt_ec_shard_take(sh, sp->transfer_id.ptr, sp->transfer_id.len, sp->mm_hash.ptr,
                               sp->mm_hash.len, &f, &v);
    }
    if (!rc && v.nbytes != sp->nbytes)
        rc =
            kvt_fail(KVT_EPROTO, "ec shard: %s holds %llu bytes, the load spec says %llu",
                     sp->mm_hash.ptr, (unsigned long long)v.nbytes, (unsigned long long)sp->nbytes);
    return rc ? rc : c->place(c->ctx, sp, &v);
}

int kvt_ec_shard_apply(kvt_ec_shard *sh, const kvt_ec_meta *meta, const kvt_ec_cache_ops *cache,
                       kvt_ec_worker_meta *out)
{
    if (!meta || !cache || !cache->holds || !cache->place || !out)
        return kvt_fail(KVT_EINVAL, "ec shard: apply: NULL argument");
    int rc = retire_freed(sh, meta, cache);
    for (uint32_t i = 0; !rc && i < meta->n_loads; i++) {
        const kvt_ec_load_spec *sp = &meta->loads[i];
        int set = load_one(sh, sp, cache) ? KVT_EC_FAILED_LOADS : KVT_EC_LOADED;
        rc = kvt_ec_worker_meta_add(out, set, sp->mm_hash.ptr, sp->mm_hash.len);
    }
    char recl[16][KVT_EC_KEY_MAX + 1];
    uint32_t n;
    while (!rc && (n = kvt_ec_shard_take_reclaimed(sh, recl, 16)) > 0)
        for (uint32_t i = 0; !rc && i < n; i++)
            rc = kvt_ec_worker_meta_add(out, KVT_EC_RECLAIMED, recl[i], (uint32_t)strlen(recl[i]));
    return rc ? kvi_fail_wrap(rc, "ec shard: apply") : 0;
}

int kvt_ec_shard_prometheus(const kvt_ec_shard *sh, char *buf, size_t cap, size_t *len)
{
    if (!sh || !len || (cap && !buf))
        return kvt_fail(KVT_EINVAL, "ec shard: prometheus: NULL argument");
    kvt_ec_shard_stats st;
    kvt_ec_shard_get_stats(sh, &st);
    kvi_prom p = {buf, cap, 0};
    const struct {
        const char *name, *help;
        uint64_t v;
        bool gauge;
    } m[] = {
        {"reserves_total", "Reserve requests.", st.reserves, false},
        {"writes_total", "Reservations answered write=true (new destinations).", st.writes, false},
        {"follows_total", "Reservations that followed a writer in flight.", st.follows, false},
        {"cached_hits_total", "Reservations served from the resident pool.", st.cached_hits, false},
        {"completes_total", "Completions accepted.", st.completes, false},
        {"cancels_total", "Cancel requests.", st.cancels, false},
        {"expiries_total", "Reservations expired or deferred by the TTL.", st.expiries, false},
        {"takes_total", "Pushed items taken into the encoder cache.", st.takes, false},
        {"reclaims_total", "Residents evicted under pressure.", st.reclaims, false},
        {"deferred_frees_total", "Frees deferred behind a fence.", st.deferred_frees, false},
        {"tombstones_dropped_total", "Tombstones dropped at the cap.", st.tombstones_dropped,
         false},
        {"events_dropped_total", "Events dropped from a full backlog.", st.events_dropped, false},
        {"records", "Live reservations.", st.records, true},
        {"tombstones", "Terminal records kept.", st.tombstones, true},
        {"residents", "Resident entries.", st.residents, true},
        {"writers", "Reservations a remote writer may still write.", st.writers, true},
        {"free_bytes", "Free bytes of the receive buffer.", st.free_bytes, true},
        {"capacity_bytes", "Bytes of the receive buffer.", st.capacity, true},
    };
    for (size_t i = 0; i < sizeof(m) / sizeof(m[0]); i++)
        kvi_prom_metric(&p, "kvtier_ec_shard", m[i].name, m[i].help, m[i].gauge, m[i].v);
    return kvi_prom_finish(&p, len, "ec shard");
}
