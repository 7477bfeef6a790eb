/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The offload manager's step: build_meta assembles what the workers do this step (loads,
 * stores of every tier, re-stores, promotions) into one metadata message, apply_output takes
 * their reports back (finished loads, completed and failed events), reset drops everything
 * that is not in flight. Each public call runs under the node tier's lock when there is one.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "offload/offload_internal.h"
#include "pool/pool_internal.h"

/* ---- step ------------------------------------------------------------------------------ */

static int build_meta_unlocked(kvt_offload *m, bool preempted, kvt_offload_meta *out)
{
    kvi_ofl_gpu_flush(m); /* pins a deferred schedule left */
    if (!out)
        return kvt_fail(KVT_EINVAL, "offload: build_meta: out is NULL");
    kvt_offload_meta_clear(out);
    if (m->cfg.lazy)
        kvi_ofl_select_lazy(m);
    else
        kvi_ofl_select_restores(m);
    int rc = kvi_ofl_reserve_step(m, out);
    if (rc)
        return rc; /* nothing issued: loads and stores stay queued for the next step */
    kvi_ofl_emit_loads(m, out);
    kvi_ofl_emit_stores(m, 0, out);
    kvi_ofl_tier_emit(m, out);
    out->need_flush = preempted;
    kvi_ofl_req_sweep(m);
    kvi_ofl_gpu_flush(m);
    return 0;
}

int kvt_offload_build_meta(kvt_offload *m, bool preempted, kvt_offload_meta *out)
{
    KVI_OFL_LOCKED(m, build_meta_unlocked(m, preempted, out));
}

static int apply_output_unlocked(kvt_offload *m, const kvt_str *finished_loads, uint32_t n,
                                 const kvt_offload_worker_meta *stores)
{
    kvi_ofl_gpu_flush(m); /* pins a deferred schedule left */
    int rc = kvi_ofl_check_load_done(m, finished_loads, n);
    if (rc)
        return rc;
    if (stores) {
        if ((rc = kvt_offload_worker_meta_validate(stores)))
            return kvi_fail_wrap(rc, "offload: apply_output");
        for (uint32_t i = 0; i < stores->stores.n_completed; i++)
            if (stores->stores.events[i] >= m->tier[0].store_counter)
                return kvt_fail(KVT_ERANGE,
                                "offload: apply_output: store event %" PRId64
                                " was never issued (next is %" PRId64 ")",
                                stores->stores.events[i], m->tier[0].store_counter);
        if ((rc = kvi_ofl_tier_check_output(m, stores)))
            return rc;
        for (uint32_t i = 0; i < stores->n_failed_load_src; i++)
            if (stores->failed_load_src[i] >= m->tier[0].nb)
                return kvt_fail(KVT_ERANGE,
                                "offload: apply_output: failed load source %u out of range (the "
                                "%s tier has %u blocks)",
                                stores->failed_load_src[i], kvi_ofl_tier_name(m, 0), m->tier[0].nb);
        /* blocks a worker could not read are forgotten before their loads release them */
        for (uint32_t i = 0; i < stores->n_failed_load_src; i++)
            kvi_ofl_load_failed(m, 0, stores->failed_load_src[i]);
    }
    for (uint32_t i = 0; i < n; i++)
        kvi_ofl_apply_load_done(m,
                                kvi_ofl_req_find(m, finished_loads[i].ptr, finished_loads[i].len));
    for (uint32_t i = 0; stores && i < stores->stores.n_completed; i++) {
        struct kvi_ofl_event *e =
            kvi_ofl_evtable_find(&m->tier[0].stores, stores->stores.events[i]);
        if (!e) {
            m->st.stale_reports++;
            continue;
        }
        if (kvt_offload_worker_meta_failed(stores, stores->stores.events[i]))
            e->failed = true;
        uint64_t total = (uint64_t)e->reported + stores->stores.counts[i];
        e->reported = total > UINT32_MAX ? UINT32_MAX : (uint32_t)total;
        if (e->reported >= m->cfg.world_size)
            kvi_ofl_complete_store(m, 0, e);
    }
    if (stores)
        kvi_ofl_tier_apply_output(m, stores); /* after the stores: they queue write-backs */
    kvi_ofl_req_sweep(m);
    kvi_ofl_gpu_flush(m);
    return 0;
}

int kvt_offload_apply_output(kvt_offload *m, const kvt_str *finished_loads, uint32_t n,
                             const kvt_offload_worker_meta *stores)
{
    KVI_OFL_LOCKED(m, apply_output_unlocked(m, finished_loads, n, stores));
}

/* Abandons every store: in-flight events' blocks are never made findable (their completions
 * only free them), queued selections and re-stores are dropped. let_go releases the engine
 * blocks in-flight stores read now instead of at their completions (a released source is
 * OFL_NONE); the tier blocks they write stay allocated until then. */
static void abandon_stores(kvt_offload *m, bool let_go)
{
    struct kvi_ofl_tier *T = &m->tier[0];
    kvi_ofl_gpu_flush(m); /* pins a deferred schedule left */
    KVI_OFL_FOR_EVENTS (e, &T->stores) {
        for (uint32_t h = e->head; h != OFL_NONE; h = T->store_next[h]) {
            uint32_t g = T->store_src[h];
            if (g == OFL_NONE)
                continue; /* let go of before */
            if (!e->abandoned)
                m->gflags[g] &= (uint8_t)~G_STORING;
            if (let_go) {
                kvi_ofl_gpu_unpin(m, g);
                T->store_src[h] = OFL_NONE;
            }
        }
        e->abandoned = true;
    }
    kvi_ofl_tier_abandon(m); /* write-backs and promotions in flight, queued write-backs */
    kvi_ofl_release_accumulator(m, 0);
    for (uint32_t i = 0; i < kvi_ring_len(&m->restore); i++) {
        uint32_t gpu;
        memcpy(&gpu, kvi_ring_at(&m->restore, i), sizeof(gpu));
        m->gflags[gpu] &= (uint8_t)~G_RESTORE;
    }
    kvi_ring_clear(&m->restore);
    kvi_ofl_gpu_flush(m);
}

/* Requests forget their eager registration; loads never sent are cancelled, sent ones keep
 * their pins until the workers report them and then clean up as usual. */
static void forget_requests(kvt_offload *m)
{
    for (uint32_t s = 0; s < m->cfg.max_requests; s++) {
        struct kvi_ofl_req *r = &m->reqs[s];
        if (!r->used)
            continue;
        r->flags &= ~RQ_EAGER;
        if (r->flags & RQ_LOAD_QUEUED)
            kvi_ofl_cancel_queued_load(m, r);
        if (r->flags & RQ_PROMO_QUEUED)
            kvi_ofl_tier_cancel_promo(m, r);
        kvi_ofl_req_maybe_release(m, r);
    }
    kvi_ofl_req_sweep(m);
    kvi_ofl_gpu_flush(m);
}

static int reset_unlocked(kvt_offload *m)
{
    abandon_stores(m, false);
    forget_requests(m);
    uint32_t behind = 0; /* events of the tiers behind the first */
    for (uint32_t t = 1; t < KVI_OFL_TIERS && m->tier[t].src; t++)
        behind += kvi_evtable_len(&m->tier[t].stores) + kvi_evtable_len(&m->tier[t].loads);
    if (kvi_evtable_len(&m->tier[0].stores) || kvi_evtable_len(&m->tier[0].loads) || behind)
        return kvt_fail(KVT_EBUSY,
                        "offload: reset: %u store, %u load and %u events of the tiers behind "
                        "still in flight",
                        kvi_evtable_len(&m->tier[0].stores), kvi_evtable_len(&m->tier[0].loads),
                        behind);
    int rc = 0;
    for (uint32_t t = 0; t < KVI_OFL_TIERS && m->tier[t].pool && !rc; t++)
        rc = kvt_pool_reset_prefix_cache(m->tier[t].pool);
    if (rc)
        return kvi_fail_wrap(KVT_EBUSY, m->node ? "offload: reset: hits are still pinned, or "
                                                  "peers of the node tier read this replica's "
                                                  "slots"
                                                : "offload: reset: hits are still pinned");
    kvi_ofl_chain_host_forgotten(m);
    m->st.resets++;
    return 0;
}

int kvt_offload_reset(kvt_offload *m)
{
    KVI_OFL_LOCKED(m, reset_unlocked(m));
}

static int clear_unlocked(kvt_offload *m)
{
    uint32_t using = 0; /* requests that would read bytes from before the clear */
    for (uint32_t s = 0; s < m->cfg.max_requests; s++) {
        const struct kvi_ofl_req *r = &m->reqs[s];
        using +=
            r->used && !(r->flags & RQ_FINISHED) &&
            (r->flags & (RQ_HIT | RQ_LOAD_QUEUED | RQ_LOAD_SENT | RQ_PROMO_QUEUED | RQ_PROMO_SENT));
    }
    if (using)
        return kvt_fail(KVT_EBUSY,
                        "offload: clear: %u unfinished requests hold a hit or a load of the "
                        "tiers",
                        using);
    abandon_stores(m, false);
    forget_requests(m);
    for (uint32_t t = 0; t < KVI_OFL_TIERS && m->tier[t].pool; t++)
        kvi_pool_forget_keys(m->tier[t].pool);
    kvi_ofl_chain_host_forgotten(m);
    m->st.resets++;
    return 0;
}

int kvt_offload_clear(kvt_offload *m)
{
    KVI_OFL_LOCKED(m, clear_unlocked(m));
}

static int release_engine_blocks_unlocked(kvt_offload *m, uint32_t *held_by_loads)
{
    abandon_stores(m, true);
    uint32_t held = 0;
    for (uint32_t s = 0; s < m->cfg.max_requests; s++)
        if (m->reqs[s].used)
            held += m->reqs[s].n_load;
    if (held_by_loads)
        *held_by_loads = held;
    return 0;
}

int kvt_offload_release_engine_blocks(kvt_offload *m, uint32_t *held_by_loads)
{
    KVI_OFL_LOCKED(m, release_engine_blocks_unlocked(m, held_by_loads));
}

bool kvt_offload_has_pending(const kvt_offload *m)
{
    return kvi_evtable_len(&m->tier[0].loads) || kvi_evtable_len(&m->tier[0].stores) ||
           m->tier[0].acc_n || m->loadq_head != OFL_NONE || kvi_ofl_tier_pending(m);
}
