/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Stores: GPU -> host tier (spec kv-offload §2.6-2.8).
 *
 * Eager (write-through): each scheduled request keeps a cursor per group over its confirmed
 * full blocks; kvt_offload_schedule selects the blocks between the cursor and the confirmed
 * end that are hashed, not already in the host tier and not already being stored, up to the
 * host blocks the step may take (free blocks, cached ones included: storing evicts the host
 * tier's LRU). request_finished runs the same selection once more with the final counts (the
 * final flush). Going beyond vLLM, when a store evicts a cached host block whose GPU copy is
 * still referenced by a running request, that GPU block is queued for a re-store, so a prefix
 * that stays hot on the GPU does not silently drop out of the host tier (§2.6 FIXME).
 *
 * Lazy (write-back on pressure): each step looks at the first target_free blocks of the GPU
 * free queue, from its head, and stores the hashed ones nearest eviction.
 *
 * Every selected block gets a freshly allocated host block; the GPU block's keys (primary and
 * secondary) are copied aside, both blocks are pinned, and the pair joins the accumulator
 * that build_meta turns into one store event. When all world_size workers reported the event,
 * the keys are registered on the host blocks — only then can they be found — and the pins go.
 */
#include <string.h>

#include "base/error.h"
#include "offload/offload_internal.h"
#include "pool/pool_internal.h"

static bool host_has_key(const kvt_offload *m, const kvt_pool_key *k)
{
    uint32_t b;
    return kvt_pool_lookup(m->tier[0].pool, k->hash, k->group, &b) == 1;
}

/* Whether a block under key k is stored as the n-th of this step's selection: 0 yes; 1 no,
 * the host tier has it already; -1 no, the step's budget is spent (both counted). */
static int room_for(kvt_offload *m, const kvt_pool_key *k, uint32_t n, uint32_t budget)
{
    if (host_has_key(m, k)) {
        m->tier[0].st.store_skipped_cached++;
        return 1;
    }
    if (n >= budget) {
        m->tier[0].st.store_dropped++;
        return -1;
    }
    return 0;
}

/* Queues GPU block gpu (known under key k) for a re-store: never full, as a block is queued
 * at most once (G_RESTORE) and the queue holds every GPU block. */
static void queue_restore(kvt_offload *m, uint32_t gpu, const kvt_pool_key *k)
{
    unsigned char *e = kvi_ring_push(&m->restore);
    m->gflags[gpu] |= G_RESTORE;
    memcpy(e, &gpu, sizeof(gpu));
    if (m->ext)
        kvi_ofl_key_pack(m, e + sizeof(gpu), k);
}

/* Allocates n host blocks (n <= free). Eager mode first looks at the cached blocks about to be
 * evicted: a GPU block that still carries the same key and is in use is queued for re-store. */
void kvi_ofl_host_alloc(kvt_offload *m, uint32_t n, uint32_t *ids)
{
    kvt_pool *hp = m->tier[0].pool;
    bool restore = !m->cfg.lazy && m->cfg.restore_budget > 0 && kvi_ofl_gpu_can_lookup(m);
    /* The blocks the allocation takes, from the LRU head (ids is the allocation's own output,
     * written again below in the same order). Their key entries, the host index slots their
     * eviction probes and, over a kvt_pool, the GPU index slots the re-store check probes are
     * fetched for all of them first: the cache misses of a long selection overlap instead of
     * coming one after another (about six per block). */
    uint32_t got = 0;
    for (uint32_t h = kvt_pool_lru_first(hp); got < n && h != KVT_BLOCK_NONE;
         h = kvt_pool_lru_next(hp, h)) {
        ids[got++] = h;
        if (hp->blocks[h].keys != KVT_ENTRY_NONE)
            __builtin_prefetch(kvi_pool_entry(hp, hp->blocks[h].keys), 0, 1);
    }
    bool kh = restore && !m->ext && got > 1;
    for (uint32_t i = 0; i < got; i++) {
        const struct kvi_block *b = &hp->blocks[ids[i]];
        if (b->keys == KVT_ENTRY_NONE)
            continue;
        const struct kvi_entry *e = kvi_pool_entry(hp, b->keys);
        kvi_map_prefetch(&hp->map, e->kh);
        if (kh && e->group < m->ng) {
            m->evict_kh[i] = kvi_pool_key_hash(m->gpu, e->hash, e->group);
            kvi_map_prefetch(&m->gpu->map, m->evict_kh[i]);
        }
    }
    for (uint32_t i = 0; i < got; i++) {
        uint32_t nk = 0, ref, h = ids[i];
        kvt_pool_key *k = &m->keys[0];
        (void)kvt_pool_block_keys(hp, h, k, 1, &nk);
        if (!nk)
            continue;
        m->tier[0].st.evictions++;
        if (!restore)
            continue;
        uint32_t gpu =
            kh ? kvi_ofl_gpu_lookup_kh(m, k, m->evict_kh[i], &ref) : kvi_ofl_gpu_lookup(m, k, &ref);
        if (gpu == KVT_BLOCK_NONE || (m->gflags[gpu] & (G_STORING | G_RESTORE | G_MARK)) ||
            ref == 0 || kvi_ring_full(&m->restore))
            continue;
        queue_restore(m, gpu, k);
    }
    (void)kvt_pool_alloc(hp, n, ids);     /* n <= free: cannot fail */
    kvi_ofl_chain_host_reused(m, ids, n); /* before anything rewrites them */
}

/* Turns n selected GPU blocks (m->scratch[0..n), marked G_MARK; with an engine's pool their
 * keys in m->selkeys) into queued store pairs. */
static void commit_selection(kvt_offload *m, uint32_t n, struct kvi_ofl_req *r)
{
    uint32_t *gpus = m->scratch, *hosts = m->scratch + m->tier[0].nb;
    kvi_ofl_host_alloc(m, n, hosts);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t g = gpus[i], h = hosts[i], nk = 0;
        uint8_t *dst = m->tier[0].keys + (size_t)h * m->kpb * m->key_stride;
        if (m->ext) {
            memcpy(dst, m->selkeys + (size_t)i * m->key_stride, m->key_stride);
            nk = 1;
        } else {
            (void)kvt_pool_block_keys(m->gpu, g, m->keys, m->kpb, &nk);
            if (nk > m->kpb)
                nk = m->kpb;
            for (uint32_t k = 0; k < nk; k++, dst += m->key_stride)
                kvi_ofl_key_pack(m, dst, &m->keys[k]);
        }
        m->tier[0].keys_n[h] = (uint8_t)nk;
        kvi_ofl_events_bind(m, r, i, h);
        kvi_ofl_gpu_pin(m, g);
        m->gflags[g] = (uint8_t)((m->gflags[g] & ~G_MARK) | G_STORING);
        m->tier[0].store_src[h] = g;
        m->tier[0].store_next[h] = OFL_NONE;
        if (m->tier[0].acc_tail == OFL_NONE)
            m->tier[0].acc_head = h;
        else
            m->tier[0].store_next[m->tier[0].acc_tail] = h;
        m->tier[0].acc_tail = h;
    }
    m->tier[0].acc_n += n;
    kvi_ofl_gpu_flush_unless_deferred(m);
}

/* Marks gpu (known under k) as the n-th selected block. */
static void select_block(kvt_offload *m, uint32_t n, uint32_t gpu, const kvt_pool_key *k)
{
    m->gflags[gpu] |= G_MARK;
    m->scratch[n] = gpu;
    if (m->ext)
        kvi_ofl_key_pack(m, m->selkeys + (size_t)n * m->key_stride, k);
}

uint32_t kvi_ofl_store_budget(const kvt_offload *m)
{
    /* Free host blocks, cached ones included (storing evicts the LRU): each selection takes
     * its blocks at once, so the count already reflects earlier selections and pins of the
     * step. No room for another in-flight store event: select nothing. */
    return !kvi_evtable_full(&m->tier[0].stores) ? kvt_pool_num_free(m->tier[0].pool) : 0;
}

/* Where a store selection ends: the last scheduler-block boundary of the confirmed tokens —
 * or, with partial hash hits, the last hash-block boundary, where a hit may end and a state
 * may be (spec §2.14): the whole attention blocks before it are stored in the same step as
 * that state, not only once the scheduler block around it is confirmed. */
static uint32_t store_end(const kvt_offload *m, uint32_t num_confirmed)
{
    uint32_t unit = m->partial ? m->hit_align : m->sched_bs;
    return num_confirmed / unit * unit;
}

void kvi_ofl_select_eager(kvt_offload *m, struct kvi_ofl_req *r, const uint32_t *const *blocks,
                          const uint32_t *n_blocks, const uint8_t *hashes, uint32_t n_hashes,
                          uint32_t num_confirmed)
{
    uint32_t budget = kvi_ofl_store_budget(m), *cursor = kvi_ofl_cursor(m, r);
    uint32_t aligned = store_end(m, num_confirmed), n = 0;
    bool full = false;
    kvt_pool_key k;
    for (uint32_t g = 0; g < m->ng && !full; g++) {
        if (!kvi_ofl_positional(m->gcfg.groups[g].kind))
            continue; /* scratch and ring groups are never stored; Mamba align by handoff */
        uint32_t ready = aligned / m->gcfg.groups[g].block_size;
        if (ready > n_blocks[g])
            ready = n_blocks[g];
        uint32_t j = cursor[g];
        for (; j < ready; j++) {
            uint32_t gpu = blocks[g][j];
            bool recovered = false;
            if (gpu == KVT_NULL_BLOCK) {
                /* A nulled entry (a sliding window's masked position, a slot the engine let
                 * go) whose position's hash is still cached in the GPU pool: found through the
                 * pool's index, pinned and stored like the others, so a clone of the prompt
                 * gets the full hit in every group (spec §2.14). Needs the request's hashes. */
                uint32_t ref;
                if (!kvi_ofl_key_from_hashes(m, hashes, n_hashes, g, j, &k) ||
                    (gpu = kvi_ofl_gpu_lookup(m, &k, &ref)) == KVT_BLOCK_NONE) {
                    m->st.store_skipped_null++;
                    continue;
                }
                recovered = true;
            }
            if (m->gflags[gpu] & (G_STORING | G_MARK)) { /* cheapest test first */
                m->st.store_skipped_in_flight++;
                continue;
            }
            if (m->gload_src[gpu] != OFL_NONE) {
                /* a load into it is still in flight (an engine that counts a request's
                 * loading tokens as confirmed, e.g. when it finishes before its load did):
                 * its bytes are not its key's yet. Its source is in the host tier anyway. */
                m->st.store_skipped_in_flight++;
                continue;
            }
            if (!recovered && m->ext && !kvi_ofl_key_from_hashes(m, hashes, n_hashes, g, j, &k))
                break; /* its hash is not known yet: stop here, later calls resume */
            if (!recovered && !m->ext && !kvi_ofl_gpu_primary(m, gpu, &k)) {
                m->st.store_skipped_unhashed++;
                continue;
            }
            int room = room_for(m, &k, n, budget);
            if (room > 0)
                continue;
            if (room < 0) {
                full = true; /* retried next step from here */
                break;
            }
            kvi_ofl_events_note(m, r, n, g, j, blocks, hashes, n_hashes);
            select_block(m, n++, gpu, &k);
            m->st.store_recovered_null += recovered;
        }
        cursor[g] = j;
    }
    if (!n)
        return;
    commit_selection(m, n, r);
}

/* Partial hash hits: at request finish, each full-attention group's last block, when the final
 * count ends inside it past at least one hash-block boundary, is stored under the key of that
 * boundary with its token count (spec §2.14), so a request with the same prompt gets the whole
 * hit. Once: the request is finished, and a key already cached or being stored is skipped. */
static void select_partial_tails(kvt_offload *m, struct kvi_ofl_req *r,
                                 const uint32_t *const *blocks, const uint32_t *n_blocks,
                                 const uint8_t *hashes, uint32_t n_hashes, uint32_t num_confirmed)
{
    uint32_t budget = kvi_ofl_store_budget(m), hbs = m->gcfg.hash_block_size, n = 0;
    for (uint32_t g = 0; g < m->ng; g++) {
        const kvt_group_spec *gs = &m->gcfg.groups[g];
        uint32_t j = num_confirmed / gs->block_size;
        uint32_t tail = (num_confirmed - j * gs->block_size) / hbs * hbs;
        if (gs->kind != KVT_GROUP_FULL || tail == 0 || j >= n_blocks[g])
            continue;
        uint32_t gpu = blocks[g][j], pos = (j * gs->block_size + tail) / hbs - 1;
        if (gpu == KVT_NULL_BLOCK || (m->gflags[gpu] & (G_STORING | G_MARK)) ||
            m->gload_src[gpu] != OFL_NONE)
            continue;
        const uint8_t *h = hashes ? hashes + (size_t)pos * m->hash_len : NULL;
        if ((m->ext || hashes) && pos >= n_hashes) /* its hash is not known */
            continue;
        /* over a kvt_pool the block's own keys are stored: it must be cached partly, under
         * this key (the engine caches a partly filled block with its token count) */
        kvt_pool_key k;
        if (m->ext) {
            kvi_ofl_key_set(m, h, g, tail, &k);
        } else if (!kvi_ofl_gpu_primary(m, gpu, &k) || k.group != g || k.num_tokens != tail ||
                   (h && memcmp(k.hash, h, m->hash_len) != 0)) {
            m->st.store_skipped_unhashed++;
            continue;
        }
        int room = room_for(m, &k, n, budget);
        if (room > 0)
            continue;
        if (room < 0)
            break;
        kvi_ofl_events_note(m, r, n, g, j, blocks, hashes, n_hashes);
        select_block(m, n++, gpu, &k);
    }
    if (!n)
        return;
    commit_selection(m, n, r);
    m->st.partial_tails += n;
}

static int need_hashes(const kvt_offload *m, const uint8_t *hashes, uint32_t n_hashes,
                       const char *what)
{
    (void)m;
    if (!hashes && n_hashes) /* no hashes at all is fine: a request shorter than a block */
        return kvt_fail(KVT_EINVAL, "offload: %s: %u hashes given as NULL", what, n_hashes);
    return 0;
}

static int plain_call(const kvt_offload *m, const char *what)
{
    if (m->ext)
        return kvt_fail(KVT_EINVAL,
                        "offload: %s: this manager works over the engine's own GPU pool and "
                        "needs the request's hashes (use the _hashed call)",
                        what);
    return 0;
}

static int schedule_hashed_unlocked(kvt_offload *m, const char *id, uint32_t id_len,
                                    const uint32_t *const *blocks, const uint32_t *n_blocks,
                                    const uint8_t *hashes, uint32_t n_hashes,
                                    uint32_t num_confirmed, uint32_t num_scheduled, bool resumed)
{
    int rc = kvi_ofl_check_id(id, id_len);
    if (rc || m->cfg.lazy)
        return rc;
    if ((rc = need_hashes(m, hashes, n_hashes, "schedule")))
        return rc;
    struct kvi_ofl_req *r = kvi_ofl_req_find(m, id, id_len);
    if (!r || !(r->flags & RQ_EAGER) || (r->flags & RQ_FINISHED))
        return 0; /* unknown to the eager path, as in vLLM */
    uint32_t *cursor = kvi_ofl_cursor(m, r);
    if (resumed)
        memset(cursor, 0, m->ng * sizeof(uint32_t)); /* its blocks were freed and reallocated */
    if (num_scheduled == 0)
        return 0;
    /* most decode steps confirm no new full block: then the span is empty and we stop here */
    uint32_t aligned = store_end(m, num_confirmed);
    bool news = false;
    if ((rc = kvi_ofl_check_span(m, blocks, n_blocks, cursor, aligned, "schedule", &news)) || !news)
        return rc;
    m->in_schedule = m->cfg.defer_schedule_pins;
    kvi_ofl_select_eager(m, r, blocks, n_blocks, hashes, n_hashes, num_confirmed);
    m->in_schedule = false;
    /* what is left for later calls (no room, no hash yet): an engine may skip the call for a
     * request while this is 0 and no new block was confirmed */
    uint64_t left = 0;
    for (uint32_t g = 0; g < m->ng; g++) {
        if (!kvi_ofl_positional(m->gcfg.groups[g].kind))
            continue;
        uint32_t ready = aligned / m->gcfg.groups[g].block_size;
        if (ready > n_blocks[g])
            ready = n_blocks[g];
        if (ready > cursor[g])
            left += ready - cursor[g];
    }
    return left > INT32_MAX ? INT32_MAX : (int)left;
}

int kvt_offload_schedule_hashed(kvt_offload *m, const char *id, uint32_t id_len,
                                const uint32_t *const *blocks, const uint32_t *n_blocks,
                                const uint8_t *hashes, uint32_t n_hashes, uint32_t num_confirmed,
                                uint32_t num_scheduled, bool resumed)
{
    KVI_OFL_LOCKED(m, schedule_hashed_unlocked(m, id, id_len, blocks, n_blocks, hashes, n_hashes,
                                               num_confirmed, num_scheduled, resumed));
}

static int check_boundary(const kvt_offload *m, const kvt_offload_boundary *b, uint32_t i)
{
    int rc = kvi_ofl_check_id(b->req_id, b->req_id_len);
    if (rc)
        return kvi_fail_wrap(rc, "offload: boundary_states");
    const kvt_group_spec *gs = b->group < m->ng ? &m->gcfg.groups[b->group] : NULL;
    if (!gs || gs->kind != KVT_GROUP_MAMBA_ALIGN)
        return kvt_fail(KVT_EINVAL,
                        "offload: boundary_states: state %u names group %u, which is not a Mamba "
                        "align group",
                        i, b->group);
    if (b->gpu_block == KVT_NULL_BLOCK || b->gpu_block >= m->gpu_nb)
        return kvt_fail(KVT_EINVAL,
                        "offload: boundary_states: state %u is in GPU block %u (1..%u expected)", i,
                        b->gpu_block, m->gpu_nb - 1);
    /* with partial hash hits a state may end at any hash-block boundary */
    uint32_t unit = m->partial ? m->hit_align : gs->block_size;
    if (b->num_tokens == 0 || b->num_tokens % unit)
        return kvt_fail(KVT_EINVAL,
                        "offload: boundary_states: state %u covers %u tokens, not a positive "
                        "multiple of %u (the %s)",
                        i, b->num_tokens, unit,
                        m->partial ? "hash block size" : "group's block size");
    if (!b->hash)
        return kvt_fail(KVT_EINVAL, "offload: boundary_states: state %u has no hash", i);
    return 0;
}

static int boundary_states_unlocked(kvt_offload *m, const kvt_offload_boundary *states, uint32_t n)
{
    if (n && !states)
        return kvt_fail(KVT_EINVAL, "offload: boundary_states: %u states given as NULL", n);
    for (uint32_t i = 0; i < n; i++) {
        int rc = check_boundary(m, &states[i], i);
        if (rc)
            return rc;
    }
    if (m->cfg.lazy)
        return 0;
    uint32_t selected = 0;
    for (uint32_t i = 0; i < n; i++) {
        const kvt_offload_boundary *b = &states[i];
        struct kvi_ofl_req *r = kvi_ofl_req_find(m, b->req_id, b->req_id_len);
        if (!r || !(r->flags & RQ_EAGER) || (r->flags & RQ_FINISHED)) {
            m->st.boundary_dropped_gone++;
            continue;
        }
        uint32_t gpu = b->gpu_block, bs = m->gcfg.groups[b->group].block_size;
        if ((m->gflags[gpu] & (G_STORING | G_MARK)) || m->gload_src[gpu] != OFL_NONE) {
            m->st.store_skipped_in_flight++;
            continue;
        }
        kvt_pool_key k; /* the tokens of its block the state reached: bs, or fewer (partial) */
        kvi_ofl_key_set(m, b->hash, b->group, b->num_tokens - (b->num_tokens - 1) / bs * bs, &k);
        kvt_pool_key pk; /* over a kvt_pool the block's own keys are stored: they must agree */
        if (!m->ext && (!kvi_ofl_gpu_primary(m, gpu, &pk) || pk.group != k.group ||
                        memcmp(pk.hash, k.hash, m->hash_len) != 0)) {
            m->st.store_skipped_unhashed++;
            continue;
        }
        if (host_has_key(m, &k)) {
            m->tier[0].st.store_skipped_cached++;
            continue;
        }
        if (kvi_ofl_store_budget(m) == 0) {
            m->tier[0].st.store_dropped++;
            continue;
        }
        /* one at a time: each commit binds its block to its own request's context */
        kvi_ofl_events_note_at(m, r, 0, b->num_tokens - k.num_tokens,
                               b->num_tokens > bs ? b->parent_hash : NULL);
        select_block(m, 0, gpu, &k);
        commit_selection(m, 1, r);
        selected++;
    }
    m->st.boundary_states += selected;
    return (int)selected;
}

int kvt_offload_boundary_states(kvt_offload *m, const kvt_offload_boundary *states, uint32_t n)
{
    KVI_OFL_LOCKED(m, boundary_states_unlocked(m, states, n));
}

static int schedule_many_unlocked(kvt_offload *m, kvt_offload_sched_req *const *reqs, uint32_t n,
                                  uint32_t *n_done)
{
    uint32_t i = 0;
    int rc = 0;
    if (n && !reqs)
        rc = kvt_fail(KVT_EINVAL, "offload: schedule_many: %u requests given as NULL", n);
    for (; i < n && !rc; i++) {
        kvt_offload_sched_req *q = reqs[i];
        if (!q) {
            rc = kvt_fail(KVT_EINVAL, "offload: schedule_many: request %u is NULL", i);
            break;
        }
        int left = kvt_offload_schedule_hashed(m, q->req_id, q->req_id_len, q->blocks, q->n_blocks,
                                               q->hashes, q->n_hashes, q->num_confirmed,
                                               q->num_scheduled, q->resumed);
        if (left < 0) {
            rc = kvi_fail_wrap(left, "offload: schedule_many");
            break;
        }
        q->left = left;
    }
    if (n_done)
        *n_done = i;
    return rc;
}

int kvt_offload_schedule_many(kvt_offload *m, kvt_offload_sched_req *const *reqs, uint32_t n,
                              uint32_t *n_done)
{
    KVI_OFL_LOCKED(m, schedule_many_unlocked(m, reqs, n, n_done));
}

static int schedule_unlocked(kvt_offload *m, const char *id, uint32_t id_len,
                             const uint32_t *const *blocks, const uint32_t *n_blocks,
                             uint32_t num_confirmed, uint32_t num_scheduled, bool resumed)
{
    int rc = plain_call(m, "schedule");
    if (!rc)
        rc = kvt_offload_schedule_hashed(m, id, id_len, blocks, n_blocks, NULL, 0, num_confirmed,
                                         num_scheduled, resumed);
    return rc > 0 ? 0 : rc;
}

int kvt_offload_schedule(kvt_offload *m, const char *id, uint32_t id_len,
                         const uint32_t *const *blocks, const uint32_t *n_blocks,
                         uint32_t num_confirmed, uint32_t num_scheduled, bool resumed)
{
    KVI_OFL_LOCKED(m, schedule_unlocked(m, id, id_len, blocks, n_blocks, num_confirmed,
                                        num_scheduled, resumed));
}

static int request_finished_hashed_unlocked(kvt_offload *m, const char *id, uint32_t id_len,
                                            const uint32_t *const *blocks, const uint32_t *n_blocks,
                                            const uint8_t *hashes, uint32_t n_hashes,
                                            uint32_t num_confirmed)
{
    kvi_ofl_gpu_flush(m); /* pins a deferred schedule left */
    int rc = kvi_ofl_check_id(id, id_len);
    if (rc)
        return rc;
    struct kvi_ofl_req *r = kvi_ofl_req_find(m, id, id_len);
    if (!r || (r->flags & RQ_FINISHED))
        return 0;
    bool flush = (r->flags & RQ_EAGER) && !m->cfg.lazy;
    if (flush) {
        uint32_t aligned = num_confirmed / m->sched_bs * m->sched_bs;
        if (m->partial && num_confirmed / m->hit_align * m->hit_align > aligned)
            aligned += m->sched_bs; /* the partly filled blocks after it too */
        if ((rc = need_hashes(m, hashes, n_hashes, "request_finished")) ||
            (rc = kvi_ofl_check_span(m, blocks, n_blocks, kvi_ofl_cursor(m, r), aligned,
                                     "request_finished", NULL)))
            return rc;
    }
    kvi_ofl_release_hit(m, r);
    if (flush) { /* the final flush */
        kvi_ofl_select_eager(m, r, blocks, n_blocks, hashes, n_hashes, num_confirmed);
        if (m->partial)
            select_partial_tails(m, r, blocks, n_blocks, hashes, n_hashes, num_confirmed);
    }
    r->flags = (r->flags | RQ_FINISHED) & ~RQ_EAGER;
    if (r->flags & RQ_LOAD_QUEUED)
        kvi_ofl_cancel_queued_load(m, r);
    if (r->flags & RQ_PROMO_QUEUED)
        kvi_ofl_tier_cancel_promo(m, r);
    kvi_ofl_req_maybe_release(m, r);
    kvi_ofl_gpu_flush(m);
    return 0;
}

int kvt_offload_request_finished_hashed(kvt_offload *m, const char *id, uint32_t id_len,
                                        const uint32_t *const *blocks, const uint32_t *n_blocks,
                                        const uint8_t *hashes, uint32_t n_hashes,
                                        uint32_t num_confirmed)
{
    KVI_OFL_LOCKED(m, request_finished_hashed_unlocked(m, id, id_len, blocks, n_blocks, hashes,
                                                       n_hashes, num_confirmed));
}

static int request_finished_unlocked(kvt_offload *m, const char *id, uint32_t id_len,
                                     const uint32_t *const *blocks, const uint32_t *n_blocks,
                                     uint32_t num_confirmed)
{
    int rc = plain_call(m, "request_finished");
    return rc ? rc
              : kvt_offload_request_finished_hashed(m, id, id_len, blocks, n_blocks, NULL, 0,
                                                    num_confirmed);
}

int kvt_offload_request_finished(kvt_offload *m, const char *id, uint32_t id_len,
                                 const uint32_t *const *blocks, const uint32_t *n_blocks,
                                 uint32_t num_confirmed)
{
    KVI_OFL_LOCKED(m, request_finished_unlocked(m, id, id_len, blocks, n_blocks, num_confirmed));
}

/* How many host blocks, from the LRU head, a store could take before the first one whose key
 * a referenced GPU block still carries (at most limit). */
static uint32_t cold_victims(const kvt_offload *m, uint32_t limit)
{
    uint32_t n = 0;
    for (uint32_t h = kvt_pool_lru_first(m->tier[0].pool); h != KVT_BLOCK_NONE && n < limit;
         h = kvt_pool_lru_next(m->tier[0].pool, h), n++) {
        kvt_pool_key k;
        uint32_t nk = 0, ref;
        (void)kvt_pool_block_keys(m->tier[0].pool, h, &k, 1, &nk);
        if (nk && kvi_ofl_gpu_lookup(m, &k, &ref) != KVT_BLOCK_NONE && ref > 0)
            break;
    }
    return n;
}

/* Whether queued re-store entry e (GPU block gpu, then its packed key over an engine's pool) is
 * still wanted: in use on the GPU under its key and not back in the host tier. Sets *k to that
 * key. */
static bool restore_wanted(const kvt_offload *m, uint32_t gpu, const unsigned char *e,
                           kvt_pool_key *k)
{
    uint32_t ref;
    if (m->gflags[gpu] & (G_STORING | G_MARK))
        return false; /* being stored */
    if (m->ext) {
        kvi_ofl_key_unpack(m, e + sizeof(gpu), k);
        if (kvi_ofl_gpu_lookup(m, k, &ref) != gpu || ref == 0)
            return false; /* gone or reused */
    } else {
        kvt_block_info bi;
        (void)kvt_pool_block_info(m->gpu, gpu, &bi);
        if (bi.ref_cnt == 0 || !kvi_ofl_gpu_primary(m, gpu, k))
            return false;
    }
    return !host_has_key(m, k);
}

void kvi_ofl_select_restores(kvt_offload *m)
{
    if (!kvi_ring_len(&m->restore))
        return;
    uint32_t budget = kvi_ofl_store_budget(m);
    if (budget > m->cfg.restore_budget)
        budget = m->cfg.restore_budget;
    /* A re-store evicts only cold blocks. Evicting one that is in use on the GPU as well
     * would queue its own re-store: with more blocks in use than the host tier holds, the
     * blocks would chase each other through the tier, step after step, copying and writing
     * back the same bytes (the soak found this). Such a candidate is dropped instead: the
     * host tier has no room that is worth less to it. */
    uint32_t cold = cold_victims(m, budget);
    uint32_t n = 0, todo = kvi_ring_len(&m->restore), gpu;
    kvt_pool_key k;
    for (uint32_t i = 0; i < todo; i++) {
        const unsigned char *e = kvi_ring_at(&m->restore, 0);
        memcpy(&gpu, e, sizeof(gpu));
        bool wanted = restore_wanted(m, gpu, e, &k); /* before its room can be reused */
        kvi_ring_drop(&m->restore, 1);
        m->gflags[gpu] &= (uint8_t)~G_RESTORE;
        if (!wanted)
            continue;      /* gone, being stored, or back in the host tier */
        if (n >= budget) { /* still wanted: keep it queued for the next step */
            queue_restore(m, gpu, &k);
            continue;
        }
        if (n >= cold) {
            m->st.restores_dropped_hot++;
            continue;
        }
        select_block(m, n++, gpu, &k);
    }
    if (!n)
        return;
    commit_selection(m, n, NULL);
    m->st.restores += n;
}

/* Lazy mode over an engine's own pool: the window at the head of its free queue, every step
 * from the head (upstream's current rule), as kvi_ofl_select_lazy does over a kvt_pool. */
static void select_lazy_ext(kvt_offload *m, uint32_t budget)
{
    uint32_t got = m->gops.lru_scan(m->gctx, m->target_free, m->scan_ids, m->scan_keys), n = 0;
    if (got > m->target_free)
        got = m->target_free;
    for (uint32_t i = 0; i < got && n < budget; i++) {
        uint32_t node = m->scan_ids[i];
        kvt_pool_key *k = &m->scan_keys[i];
        if (node == KVT_NULL_BLOCK || node >= m->gpu_nb || k->num_tokens == 0 ||
            k->group >= m->ng || !kvt_group_kind_cacheable(m->gcfg.groups[k->group].kind) ||
            (m->gflags[node] & (G_STORING | G_MARK)) || host_has_key(m, k))
            continue;
        select_block(m, n++, node, k);
    }
    if (n)
        commit_selection(m, n, NULL);
}

void kvi_ofl_select_lazy(kvt_offload *m)
{
    if (m->target_free == 0)
        return;
    uint32_t budget = kvi_ofl_store_budget(m);
    if (m->ext) {
        select_lazy_ext(m, budget);
        return;
    }
    /* the first target_free entries of the GPU free queue, from its head, every step (spec
     * §2.14: no cursor carried across steps; a block deeper than the window waits until it
     * drifts up) */
    uint32_t node = kvt_pool_lru_first(m->gpu), visited = 0, n = 0;
    kvt_pool_key k;
    while (node != KVT_BLOCK_NONE && visited < m->target_free && n < budget) {
        visited++;
        if (!(m->gflags[node] & (G_STORING | G_MARK)) && kvi_ofl_gpu_primary(m, node, &k) &&
            !host_has_key(m, &k))
            select_block(m, n++, node, &k);
        node = kvt_pool_lru_next(m->gpu, node);
    }
    if (!n)
        return;
    commit_selection(m, n, NULL); /* touching takes the blocks out of the GPU free queue */
}

void kvi_ofl_emit_stores(kvt_offload *m, uint32_t t, kvt_offload_meta *out)
{
    struct kvi_ofl_tier *T = &m->tier[t];
    if (!T->acc_n)
        return;
    /* Room in the table is certain: blocks are only selected while there is (the host's
     * kvi_ofl_store_budget, the disk's write-back check). */
    struct kvi_ofl_event *e = kvi_ofl_evtable_add(&T->stores, T->store_counter++);
    e->head = T->acc_head;
    e->tail = T->acc_tail;
    e->n = T->acc_n;
    for (uint32_t b = e->head; b != OFL_NONE; b = T->store_next[b])
        (void)(t == 0 ? kvt_offload_meta_add_store(out, T->store_src[b], b)
                      : kvt_offload_meta_add_tier_store(out, t, T->store_src[b], b));
    /* tier 0's stores are the seed's fields; tier t's are tiers[t - 1] */
    *(t == 0 ? &out->store_event : &out->tiers[t - 1].store_event) = e->id;
    T->st.store_events++;
    T->st.store_blocks += T->acc_n;
    T->acc_head = T->acc_tail = OFL_NONE;
    T->acc_n = 0;
    T->transferred = true;
}

void kvi_ofl_register_keys(kvt_offload *m, kvt_pool *p, uint32_t b, const uint8_t *k, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++, k += m->key_stride) {
        uint32_t group, ntok;
        memcpy(&group, k + m->hash_len, sizeof(group));
        memcpy(&ntok, k + m->hash_len + sizeof(uint32_t), sizeof(ntok));
        /* now findable; another block may have got the key meanwhile (a promotion): then
         * one copy stays */
        (void)kvi_pool_insert_unique(p, b, k, group, ntok);
    }
}

/* Gives back the source of a store pair into tier t: a GPU block (tier 0: pinned, and marked
 * storing unless a reset already cleared the mark) or a host block (pinned until the write
 * landed). */
static void release_store_source(kvt_offload *m, uint32_t t, uint32_t src, bool clear_mark)
{
    if (t > 0) {
        (void)kvt_pool_free(m->tier[0].pool, &src, 1);
        return;
    }
    if (clear_mark)
        m->gflags[src] &= (uint8_t)~G_STORING;
    kvi_ofl_gpu_unpin(m, src);
}

/* Releases the store pairs of tier t listed from head: those of completed event e (NULL: never
 * issued) first become findable when e succeeded. */
static void release_store_pairs(kvt_offload *m, uint32_t t, uint32_t head,
                                const struct kvi_ofl_event *e)
{
    struct kvi_ofl_tier *T = &m->tier[t];
    for (uint32_t b = head, next; b != OFL_NONE; b = next) {
        next = T->store_next[b];
        uint32_t src = T->store_src[b];
        /* a failed event's bytes may be wrong: its blocks never become findable */
        bool ok = e && !e->abandoned && !e->failed;
        if (ok) {
            if (t == 0) /* what the pool queued before is not this block's */
                kvi_ofl_events_pull(m, 0);
            kvi_ofl_register_keys(m, T->pool, b, T->keys + (size_t)b * m->kpb * m->key_stride,
                                  T->keys_n[b]);
            if (t == 0)
                kvi_ofl_chain_host_stored(m, b); /* findable here: peers may read it */
        }
        if (t == 0)
            kvi_ofl_events_stored(m, b, ok); /* its stored events, with its request context */
        if (ok && t == 0)
            kvi_ofl_tier_writeback(m, b); /* on to the tiers behind, if any */
        if (src != OFL_NONE)              /* OFL_NONE: the engine's block was let go of before */
            release_store_source(m, t, src, !e || !e->abandoned);
        (void)kvt_pool_free(T->pool, &b, 1);
        T->store_src[b] = T->store_next[b] = OFL_NONE;
    }
    if (t == 0)
        kvi_ofl_gpu_flush(m);
}

void kvi_ofl_complete_store(kvt_offload *m, uint32_t t, struct kvi_ofl_event *e)
{
    struct kvi_ofl_tier *T = &m->tier[t];
    release_store_pairs(m, t, e->head, e);
    if (e->abandoned)
        T->st.stores_abandoned += e->n;
    else if (e->failed)
        T->st.stores_failed += e->n;
    else
        T->st.stores_completed += e->n;
    if (t == 0)
        m->st.bytes_stored += (uint64_t)e->n * m->cfg.block_bytes;
    kvi_ofl_evtable_remove(&T->stores, e);
}

void kvi_ofl_release_accumulator(kvt_offload *m, uint32_t t)
{
    struct kvi_ofl_tier *T = &m->tier[t];
    release_store_pairs(m, t, T->acc_head, NULL);
    T->acc_head = T->acc_tail = OFL_NONE;
    T->acc_n = 0;
}
