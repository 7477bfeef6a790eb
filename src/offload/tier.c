/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The tiers behind the host: GPU -> host -> disk (issue 5; LMCache and Mooncake have it,
 * vLLM's SimpleCPUOffloadConnector does not). A tier behind is a pool with its own events,
 * driven from the completions of the tier in front of it and from hits:
 *
 *   write-back   when a store event into tier t - 1 completes, each of its blocks that tier t
 *                lacks gets a block there (evicting tier t's LRU) and joins tier t's next
 *                store event; the block in front stays pinned until the write landed, and the
 *                new one becomes findable only when all world_size workers reported it. An
 *                eviction in front therefore drops nothing the tier behind holds, and never
 *                has to wait for a write. Stores, write-backs, completions, abandons and
 *                reports walk the tiers by index (any number up to KVT_MAX_TIERS).
 *   promotion    (the disk, tier 1, into the host) match continues past the host hit on
 *                disk, pins the slots it found and allocates a host block for each (so
 *                after_alloc cannot run out of host space); after_alloc pairs the accepted
 *                ones with GPU blocks and queues a disk load event; when all workers reported
 *                it, the promoted host blocks become findable and the request's single GPU
 *                load is queued.
 *   failures     a failed write-back is never findable; a failed promotion is never a hit:
 *                its host blocks get no keys and its GPU destinations go out in the load's
 *                load_invalid_blocks (the engine recomputes them, Dynamo #15079), and its
 *                slots' keys are dropped (the next request misses instead of failing again).
 *
 * Every group kind: the host hit ends where each group has what it needs (a window's blocks
 * before the end, the last Mamba state), so the disk part is searched as a prefix of its own
 * with the same per-group rules, and each group's slots are promoted to the positions they
 * continue. With one full-attention group a disk hit shortens to the host room there is;
 * with several groups it is promoted whole or not at all.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/util.h"
#include "offload/offload_internal.h"

#define MAX_DISK_EVENTS 1024u /* kvt_disk's default max_events per direction */

int kvi_ofl_tier_validate(const kvt_offload_config *c, const kvt_pool_config *g)
{
    if (c->disk_blocks == 0)
        return 0;
    if (c->disk_blocks < 2 || c->disk_blocks == UINT32_MAX)
        return kvt_fail(KVT_EINVAL, "offload: disk_blocks %u must be at least 2 (or 0: two tiers)",
                        c->disk_blocks);
    (void)g;
    return 0;
}

int kvi_ofl_tier_setup(kvt_offload *m, uint32_t disk_nb)
{
    if (disk_nb == 0)
        return 0;
    int rc = kvi_ofl_tier_open(m, 1, disk_nb, m->cfg.event_capacity, MAX_DISK_EVENTS);
    if (rc)
        return rc;
    for (uint32_t g = 0; g < m->ng; g++) {
        m->tier[1].search_out[g] = malloc(
            ((size_t)m->cfg.max_model_len / m->gcfg.groups[g].block_size + 1) * sizeof(uint32_t));
        if (!m->tier[1].search_out[g])
            return kvt_fail(KVT_ENOMEM, "offload: cannot allocate state for %u disk slots",
                            disk_nb);
    }
    return kvi_ofl_evtable_init(&m->tier[1].loads, kvi_min_u32(disk_nb, MAX_DISK_EVENTS));
}

void kvi_ofl_tier_teardown(kvt_offload *m)
{
    for (uint32_t t = 1; t < KVI_OFL_TIERS; t++) {
        kvi_ofl_tier_close(m, t);
        for (uint32_t g = 0; g < KVT_MAX_GROUPS; g++) {
            free(m->tier[t].search_out[g]);
            m->tier[t].search_out[g] = NULL;
        }
        kvi_evtable_free(&m->tier[t].loads);
    }
}

const kvt_pool *kvt_offload_disk_pool(const kvt_offload *m)
{
    return m->tier[1].pool;
}

/* ---- promotion: match and after_alloc ------------------------------------------------------ */

uint32_t kvi_ofl_tier_search(kvt_offload *m, const uint8_t *hashes, uint32_t n_hashes,
                             uint32_t from, uint32_t max_len)
{
    memset(m->tier[1].search_n, 0, sizeof(m->tier[1].search_n));
    if (!m->tier[1].pool || from >= n_hashes || max_len < m->hit_align)
        return 0;
    kvt_hit hit;
    if (kvt_pool_find_longest_hit_flags(m->tier[1].pool, hashes + (size_t)from * m->hash_len,
                                        n_hashes - from, max_len, m->partial ? KVT_HIT_PARTIAL : 0,
                                        m->tier[1].search_out, &hit))
        return 0; /* cannot fail on arguments the host search accepted; a miss is safe */
    memcpy(m->tier[1].search_n, hit.n_blocks, sizeof(m->tier[1].search_n));
    return hit.length;
}

uint32_t kvi_ofl_tier_pin(kvt_offload *m, struct kvi_ofl_req *r, uint32_t tokens)
{
    struct kvi_ofl_tier *D = &m->tier[1];
    uint32_t free_host = kvt_pool_num_free(m->tier[0].pool), found = 0;
    for (uint32_t g = 0; g < m->ng; g++)
        for (uint32_t i = 0; i < D->search_n[g]; i++)
            found += D->search_out[g][i] != KVT_NULL_BLOCK;
    bool one_full = m->ng == 1 && m->gcfg.groups[0].kind == KVT_GROUP_FULL;
    if (found > free_host) {
        if (!one_full)
            return 0; /* every group must reach the same end: whole or nothing */
        D->search_n[0] = found = free_host; /* a shorter prefix of one full-attention group */
        tokens = found * m->gcfg.groups[0].block_size;
    }
    if (found == 0)
        return 0;
    uint32_t *hosts = m->scratch; /* found <= host_nb */
    kvi_ofl_host_alloc(m, found, hosts);
    uint32_t tail = OFL_NONE, k = 0;
    for (uint32_t g = 0; g < m->ng; g++)
        for (uint32_t i = 0; i < D->search_n[g]; i++) {
            uint32_t d = D->search_out[g][i];
            if (d == KVT_NULL_BLOCK)
                continue;
            uint32_t h = hosts[k++];
            (void)kvt_pool_touch(D->pool, &d, 1);
            m->hpromo_src[h] = d;
            m->hpromo_gpu[h] = OFL_NONE;
            m->hpromo_next[h] = OFL_NONE;
            m->hpromo_grp[h] = (uint8_t)g;
            m->hpromo_idx[h] = r->hit_n[g] + i; /* its position in the request's hit */
            if (tail == OFL_NONE)
                r->promo_head = h;
            else
                m->hpromo_next[tail] = h;
            tail = h;
        }
    r->dhit_n = found;
    r->dhit_len = tokens;
    D->st.hit_blocks += found;
    D->st.hit_tokens += tokens;
    return tokens;
}

/* Frees one promotion pair: the host block (never findable: no keys) and the slot's pin. */
static void release_pair(kvt_offload *m, uint32_t h)
{
    uint32_t d = m->hpromo_src[h];
    (void)kvt_pool_free(m->tier[1].pool, &d, 1);
    m->hpromo_src[h] = m->hpromo_next[h] = m->hpromo_gpu[h] = OFL_NONE;
}

void kvi_ofl_tier_release_hit(kvt_offload *m, struct kvi_ofl_req *r)
{
    if (r->dhit_n == 0)
        return; /* none, or already paired by after_alloc (the chain is the load's now) */
    uint32_t h = r->promo_head;
    for (uint32_t k = 0; k < r->dhit_n; k++) {
        uint32_t next = m->hpromo_next[h];
        release_pair(m, h);
        (void)kvt_pool_free(m->tier[0].pool, &h, 1);
        h = next;
    }
    r->dhit_n = r->dhit_len = 0;
    r->promo_head = OFL_NONE;
}

/* The GPU block promotion h is accepted into (KVT_NULL_BLOCK: not accepted, or a null
 * position), or OFL_NONE when the table is too short. */
static uint32_t promo_dest(const kvt_offload *m, const struct kvi_ofl_req *r, uint32_t h,
                           const uint32_t *const *blocks, const uint32_t *n_blocks,
                           uint32_t num_external)
{
    uint32_t g = m->hpromo_grp[h], i = m->hpromo_idx[h];
    if (i >= kvi_ofl_ext_blocks(m, g, num_external))
        return KVT_NULL_BLOCK;
    uint64_t at = (uint64_t)kvi_ofl_load_start(m, r, g, num_external) + i;
    return !n_blocks || at < n_blocks[g] ? blocks[g][at] : OFL_NONE;
}

int kvi_ofl_tier_check_pairs(kvt_offload *m, const struct kvi_ofl_req *r,
                             const uint32_t *const *blocks, const uint32_t *n_blocks,
                             uint32_t num_external)
{
    uint32_t h = r->promo_head;
    for (uint32_t k = 0; k < r->dhit_n; k++, h = m->hpromo_next[h]) {
        uint32_t g = m->hpromo_grp[h], gpu = promo_dest(m, r, h, blocks, n_blocks, num_external);
        if (gpu == OFL_NONE)
            return kvt_fail(KVT_EINVAL,
                            "offload: after_alloc: group %u has %u GPU blocks; the load needs "
                            "more",
                            g, n_blocks[g]);
        if (gpu != KVT_NULL_BLOCK && (m->gload_src[gpu] != OFL_NONE || (m->gflags[gpu] & G_MARK)))
            return kvt_fail(KVT_ESTATE,
                            "offload: after_alloc: GPU block %u is already the destination of "
                            "a load",
                            gpu);
        if (gpu != KVT_NULL_BLOCK)
            m->gflags[gpu] |= G_MARK; /* the caller clears the marks */
    }
    return 0;
}

void kvi_ofl_tier_pair(kvt_offload *m, struct kvi_ofl_req *r, const uint32_t *const *blocks,
                       uint32_t num_external, uint32_t *load_tail)
{
    uint32_t h = r->promo_head, kept_tail = OFL_NONE, n = r->dhit_n;
    r->promo_head = OFL_NONE;
    r->dhit_n = r->dhit_len = 0;
    for (uint32_t k = 0; k < n; k++) {
        uint32_t next = m->hpromo_next[h];
        /* checked by kvi_ofl_tier_check_pairs: never OFL_NONE here */
        uint32_t gpu = promo_dest(m, r, h, blocks, NULL, num_external);
        if (gpu == KVT_NULL_BLOCK) { /* not accepted */
            release_pair(m, h);
            (void)kvt_pool_free(m->tier[0].pool, &h, 1);
            h = next;
            continue;
        }
        /* the allocation's reference on h becomes the load's pin; the slot keeps its pin */
        kvi_ofl_gpu_pin(m, gpu);
        m->gload_src[gpu] = h;
        m->gload_next[gpu] = OFL_NONE;
        if (*load_tail == OFL_NONE)
            r->load_head = gpu;
        else
            m->gload_next[*load_tail] = gpu;
        *load_tail = gpu;
        r->n_load++;
        m->hpromo_gpu[h] = gpu;
        m->hpromo_next[h] = OFL_NONE;
        if (kept_tail == OFL_NONE)
            r->promo_head = h;
        else
            m->hpromo_next[kept_tail] = h;
        kept_tail = h;
        r->n_promo++;
        h = next;
    }
    if (r->n_promo) {
        r->flags |= RQ_PROMO_QUEUED;
        kvi_ofl_rq_push(m, &m->promoq_head, &m->promoq_tail, OFL_PROMO_LINK,
                        kvi_ofl_req_slot(m, r));
    }
}

/* Drops r's accepted promotions (slot pins); the host blocks go with its load pairs. */
static void drop_promotions(kvt_offload *m, struct kvi_ofl_req *r)
{
    for (uint32_t h = r->promo_head, next; h != OFL_NONE; h = next) {
        next = m->hpromo_next[h];
        release_pair(m, h);
    }
    r->promo_head = OFL_NONE;
    r->n_promo = 0;
}

void kvi_ofl_tier_cancel_promo(kvt_offload *m, struct kvi_ofl_req *r)
{
    kvi_ofl_rq_unlink(m, &m->promoq_head, &m->promoq_tail, OFL_PROMO_LINK, kvi_ofl_req_slot(m, r));
    drop_promotions(m, r);
    kvi_ofl_release_load_pairs(m, r);
    r->flags &= ~RQ_PROMO_QUEUED;
}

/* ---- write-back ------------------------------------------------------------------------ */

void kvi_ofl_tier_writeback(kvt_offload *m, uint32_t t, uint32_t b)
{
    struct kvi_ofl_tier *F = &m->tier[t - 1], *T = &m->tier[t];
    if (!T->pool || F->keys_n[b] == 0)
        return;
    const uint8_t *keys = F->keys + (size_t)b * m->kpb * m->key_stride;
    uint32_t group, d;
    memcpy(&group, keys + m->hash_len, sizeof(group));
    if (kvt_pool_lookup(T->pool, keys, group, &d) == 1) {
        T->st.store_skipped_cached++;
        return;
    }
    if (kvi_evtable_full(&T->stores) || kvt_pool_num_free(T->pool) == 0) {
        T->st.store_dropped++;
        return;
    }
    uint32_t lru = kvt_pool_lru_first(T->pool), nk = 0;
    kvt_pool_key k;
    if (lru != KVT_BLOCK_NONE && kvt_pool_block_keys(T->pool, lru, &k, 1, &nk) == 0 && nk)
        T->st.evictions++;
    (void)kvt_pool_alloc(T->pool, 1, &d); /* a free block exists */
    memcpy(T->keys + (size_t)d * m->kpb * m->key_stride, keys,
           (size_t)F->keys_n[b] * m->key_stride);
    T->keys_n[d] = F->keys_n[b];
    (void)kvt_pool_touch(F->pool, &b, 1); /* pinned until the write landed */
    T->store_src[d] = b;
    T->store_next[d] = OFL_NONE;
    if (T->acc_tail == OFL_NONE)
        T->acc_head = d;
    else
        T->store_next[T->acc_tail] = d;
    T->acc_tail = d;
    T->acc_n++;
}

/* ---- step assembly --------------------------------------------------------------------- */

int kvi_ofl_tier_reserve(kvt_offload *m, kvt_offload_meta *out, uint32_t invalid)
{
    uint32_t promos = 0;
    if (m->tier[1].pool && !kvi_evtable_full(&m->tier[1].loads))
        for (uint32_t s = m->promoq_head; s != OFL_NONE; s = m->reqs[s].promo_next)
            promos += m->reqs[s].n_promo;
    int rc = kvt_offload_meta_reserve_invalid(out, invalid);
    for (uint32_t t = 1; t < KVI_OFL_TIERS && !rc && m->tier[t].pool; t++)
        rc = kvt_offload_meta_reserve_tier(out, t, t == 1 ? promos : 0, m->tier[t].acc_n);
    return rc ? kvi_fail_wrap(rc, "offload: build_meta") : 0;
}

void kvi_ofl_tier_emit(kvt_offload *m, kvt_offload_meta *out)
{
    if (!m->tier[1].pool)
        return;
    if (m->promoq_head != OFL_NONE && !kvi_evtable_full(&m->tier[1].loads)) {
        struct kvi_ofl_event *e = kvi_ofl_evtable_add(&m->tier[1].loads, m->tier[1].load_counter++);
        e->head = m->promoq_head;
        e->tail = m->promoq_tail;
        for (uint32_t s = m->promoq_head; s != OFL_NONE; s = m->reqs[s].promo_next) {
            struct kvi_ofl_req *r = &m->reqs[s];
            r->flags = (r->flags & ~RQ_PROMO_QUEUED) | RQ_PROMO_SENT;
            r->promo_event = e->id;
            e->n++;
            for (uint32_t h = r->promo_head; h != OFL_NONE; h = m->hpromo_next[h])
                (void)kvt_offload_meta_add_tier_load(out, 1, m->hpromo_src[h], h);
        }
        m->promoq_head = m->promoq_tail = OFL_NONE;
        out->tiers[0].load_event = e->id;
        m->tier[1].st.load_events++;
        m->tier[1].transferred = true;
    }
    for (uint32_t t = 1; t < KVI_OFL_TIERS && m->tier[t].pool; t++)
        kvi_ofl_emit_stores(m, t, out);
}

/* ---- completions ----------------------------------------------------------------------- */

/* Refuses reports of tier t's events (loads or stores) that were never issued; the message
 * is formatted only then (this runs every step). */
static int check_issued(const kvt_event_report *rep, int64_t next, uint32_t t, const char *kind)
{
    for (uint32_t i = 0; i < rep->n_completed; i++)
        if (rep->events[i] >= next)
            return kvt_fail(KVT_ERANGE,
                            "offload: apply_output: %s %s event %" PRId64
                            " was never issued (next is %" PRId64 ")",
                            kvi_ofl_tier_name(t), kind, rep->events[i], next);
    return 0;
}

int kvi_ofl_tier_check_output(const kvt_offload *m, const kvt_offload_worker_meta *wm)
{
    int rc = 0;
    for (uint32_t t = 1; t < KVI_OFL_TIERS && !rc; t++) {
        rc = check_issued(&wm->tier_stores[t - 1], m->tier[t].store_counter, t, "store");
        if (!rc)
            rc = check_issued(&wm->tier_loads[t - 1], m->tier[t].load_counter, t, "load");
    }
    return rc;
}

/* Counts a report towards its event; returns the event once all workers reported it. */
static struct kvi_ofl_event *count_report(kvt_offload *m, kvi_evtable *t,
                                          const kvt_event_report *rep, uint32_t i)
{
    struct kvi_ofl_event *e = kvi_ofl_evtable_find(t, rep->events[i]);
    if (!e) {
        m->st.stale_reports++;
        return NULL;
    }
    if (kvt_event_report_failed(rep, rep->events[i]))
        e->failed = true;
    uint64_t total = (uint64_t)e->reported + rep->counts[i];
    e->reported = total > UINT32_MAX ? UINT32_MAX : (uint32_t)total;
    return e->reported >= m->cfg.world_size ? e : NULL;
}

static void complete_promotion(kvt_offload *m, struct kvi_ofl_event *e)
{
    uint32_t s = e->head;
    while (s != OFL_NONE) {
        struct kvi_ofl_req *r = &m->reqs[s];
        s = r->promo_next;
        for (uint32_t h = r->promo_head; h != OFL_NONE; h = m->hpromo_next[h]) {
            uint32_t d = m->hpromo_src[h], nk = 0;
            if (e->failed) {
                m->gflags[m->hpromo_gpu[h]] |= G_INVALID; /* never a hit */
                m->st.promotions_failed++;
                kvi_ofl_load_failed(m, 1, d); /* the slot may be bad: forgotten */
                continue;
            }
            m->st.promotions++;
            if (e->abandoned)
                continue;
            /* the promoted block is findable in the host tier from now on */
            (void)kvt_pool_block_keys(m->tier[1].pool, d, m->keys, m->kpb, &nk);
            for (uint32_t k = 0; k < nk && k < m->kpb; k++) {
                uint32_t b;
                if (kvt_pool_lookup(m->tier[0].pool, m->keys[k].hash, m->keys[k].group, &b) != 1)
                    (void)kvt_pool_insert(m->tier[0].pool, h, m->keys[k].hash, m->keys[k].group,
                                          m->keys[k].num_tokens);
            }
        }
        drop_promotions(m, r);
        r->flags &= ~RQ_PROMO_SENT;
        r->promo_event = KVT_NO_EVENT;
        r->promo_next = OFL_NONE;
        if (r->flags & RQ_FINISHED) /* nobody waits for the GPU load any more */
            kvi_ofl_release_load_pairs(m, r);
        else
            kvi_ofl_queue_load(m, r);
        kvi_ofl_req_maybe_release(m, r);
    }
    kvi_ofl_evtable_remove(&m->tier[1].loads, e);
}

void kvi_ofl_tier_apply_output(kvt_offload *m, const kvt_offload_worker_meta *wm)
{
    /* stores front to back: a completion into tier t queues its write-back into tier t + 1 */
    for (uint32_t t = 1; t < KVI_OFL_TIERS && m->tier[t].pool; t++) {
        const kvt_event_report *rep = &wm->tier_stores[t - 1];
        for (uint32_t i = 0; i < rep->n_completed; i++) {
            struct kvi_ofl_event *e = count_report(m, &m->tier[t].stores, rep, i);
            if (e)
                kvi_ofl_complete_store(m, t, e);
        }
    }
    /* promotions: only the disk (tier 1) issues loads; reports of another tier's loads were
     * refused by kvi_ofl_tier_check_output (nothing was issued) */
    if (!m->tier[1].pool)
        return;
    for (uint32_t i = 0; i < wm->tier_loads[0].n_completed; i++) {
        struct kvi_ofl_event *e = count_report(m, &m->tier[1].loads, &wm->tier_loads[0], i);
        if (e)
            complete_promotion(m, e);
    }
}

/* ---- reset and metrics ----------------------------------------------------------------- */

void kvi_ofl_tier_abandon(kvt_offload *m)
{
    for (uint32_t t = 1; t < KVI_OFL_TIERS && m->tier[t].pool; t++) {
        KVI_OFL_FOR_EVENTS (e, &m->tier[t].stores)
            e->abandoned = true;
        KVI_OFL_FOR_EVENTS (e, &m->tier[t].loads)
            e->abandoned = true;
        kvi_ofl_release_accumulator(m, t);
    }
}

bool kvi_ofl_tier_pending(const kvt_offload *m)
{
    for (uint32_t t = 1; t < KVI_OFL_TIERS && m->tier[t].pool; t++)
        if (kvi_evtable_len(&m->tier[t].loads) || kvi_evtable_len(&m->tier[t].stores) ||
            m->tier[t].acc_n)
            return true;
    return m->promoq_head != OFL_NONE;
}
