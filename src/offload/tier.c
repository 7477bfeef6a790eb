/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The tiers behind the host: GPU -> host -> tier 1 -> tier 2 ... (issue 5, then 41; LMCache
 * and Mooncake have them, vLLM's SimpleCPUOffloadConnector does not). A tier behind is a pool
 * with its own events that exchanges blocks with the host only — every tier any engine of
 * this field puts behind host memory (a disk, another host's memory, an object store) reads
 * from and writes into host memory — driven from the host's completions and from hits:
 *
 *   write-back   when a store event into the host completes, each of its blocks that a tier
 *                behind lacks gets a block there (evicting that tier's LRU) and joins the
 *                tier's next store event; the host block stays pinned until the write landed,
 *                and the new one becomes findable only when all world_size workers reported
 *                it. A host eviction therefore drops nothing a tier behind holds, and never
 *                has to wait for a write.
 *   promotion    match continues past the host hit through the tiers behind, in order, each
 *                where the ones before it stopped (each span served by the first tier that
 *                has it), pins the blocks it found and allocates a host block for each (so
 *                after_alloc cannot run out of host space); after_alloc pairs the accepted
 *                ones with GPU blocks and queues them; build_meta issues one load event per
 *                tier that has some (all tiers at once, or none that step); when every tier's
 *                event of a request was reported by all workers, its promoted host blocks
 *                are findable and its single GPU load is queued.
 *   failures     a failed write-back is never findable; a failed promotion is never a hit:
 *                its host blocks get no keys and its GPU destinations go out in the load's
 *                load_invalid_blocks (the engine recomputes them, Dynamo #15079), and its
 *                source blocks' keys are dropped (the next request misses instead of failing
 *                again).
 *
 * Nothing here names a tier by kind or index: what a tier is (a disk, a second disk, ...) is
 * the worker's business (the stage attached at its index).
 *
 * Every group kind: the hit so far ends where each group has what it needs (a window's blocks
 * before the end, the last Mamba state), so each tier's part is searched as a prefix of its
 * own with the same per-group rules, and each group's blocks are promoted to the positions
 * they continue. With one full-attention group a part shortens to the host room there is;
 * with several groups it is promoted whole or not at all.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/util.h"
#include "offload/offload_internal.h"

#define MAX_BEHIND_EVENTS 1024u /* kvt_disk's default max_events per direction */

/* ---- a tier's state (every tier, the host included) ------------------------------------- */

/* Tier names, in metrics and messages: the host's, the name a tier behind was given, or its
 * position (a tier that is not there, in an error message). */
static const char *const g_tier_positions[] = {"host", "tier1", "tier2", "tier3"};
_Static_assert(KVT_ARRAY_LEN(g_tier_positions) == KVI_OFL_TIERS, "name every tier");

const char *kvi_ofl_tier_name(const kvt_offload *m, uint32_t t)
{
    if (t >= KVI_OFL_TIERS)
        return "?";
    return t && m->tier[t].name[0] ? m->tier[t].name : g_tier_positions[t];
}

int kvi_ofl_tier_open(kvt_offload *m, uint32_t t, uint32_t nb, uint32_t event_capacity,
                      uint32_t max_store_events)
{
    struct kvi_ofl_tier *T = &m->tier[t];
    kvt_pool_config pc = m->gcfg;
    pc.num_blocks = nb;
    pc.keys_per_block = m->kpb;
    pc.event_capacity = event_capacity;
    int rc = kvt_pool_create(&pc, &T->pool);
    if (rc) {
        char what[32];
        snprintf(what, sizeof(what), "offload: %s pool", kvi_ofl_tier_name(m, t));
        return kvi_fail_wrap(rc, what);
    }
    T->nb = nb;
    T->store_src = malloc((size_t)nb * sizeof(uint32_t));
    T->store_next = malloc((size_t)nb * sizeof(uint32_t));
    T->keys = malloc((size_t)nb * m->kpb * m->key_stride);
    T->keys_n = calloc(nb, 1);
    if (!T->store_src || !T->store_next || !T->keys || !T->keys_n)
        return kvt_fail(KVT_ENOMEM, "offload: cannot allocate state for %u %s blocks", nb,
                        kvi_ofl_tier_name(m, t));
    for (uint32_t i = 0; i < nb; i++)
        T->store_src[i] = T->store_next[i] = OFL_NONE;
    T->acc_head = T->acc_tail = OFL_NONE;
    T->acc_n = 0;
    return kvi_ofl_evtable_init(&T->stores, kvi_min_u32(nb, max_store_events));
}

void kvi_ofl_tier_close(kvt_offload *m, uint32_t t)
{
    struct kvi_ofl_tier *T = &m->tier[t];
    kvt_pool_destroy(T->pool);
    free(T->store_src);
    free(T->store_next);
    free(T->keys);
    free(T->keys_n);
    kvi_evtable_free(&T->stores);
    T->pool = NULL;
    T->store_src = T->store_next = NULL;
    T->keys = T->keys_n = NULL;
    T->nb = 0;
}

/* ---- the tiers behind the host ------------------------------------------------------------ */

int kvi_ofl_tier_validate(const kvt_offload_config *c, const kvt_pool_config *g)
{
    if (c->disk_blocks == 1) /* the row bounds it to 0..2^32-2 */
        return kvt_fail(KVT_EINVAL, "offload: disk_blocks %u must be at least 2 (or 0: two tiers)",
                        c->disk_blocks);
    (void)g;
    return 0;
}

int kvi_ofl_search_out_alloc(kvt_offload *m, uint32_t t, uint32_t *entries)
{
    uint32_t total = 0;
    for (uint32_t g = 0; g < m->ng; g++) {
        uint32_t n = m->cfg.max_model_len / m->gcfg.groups[g].block_size + 1;
        m->tier[t].search_out[g] = malloc((size_t)n * sizeof(uint32_t));
        if (!m->tier[t].search_out[g])
            return kvt_fail(KVT_ENOMEM, "offload: cannot allocate the %s tier's search buffers",
                            kvi_ofl_tier_name(m, t));
        total += n;
    }
    if (entries)
        *entries = total;
    return 0;
}

int kvi_ofl_tier_setup(kvt_offload *m, uint32_t t, const char *name, uint32_t nb)
{
    struct kvi_ofl_tier *T = &m->tier[t];
    snprintf(T->name, sizeof(T->name), "%s", name);
    int rc = kvi_ofl_tier_open(m, t, nb, m->cfg.event_capacity, MAX_BEHIND_EVENTS);
    if (!rc)
        rc = kvi_ofl_search_out_alloc(m, t, NULL);
    if (!rc)
        rc = kvi_ofl_evtable_init(&T->loads, kvi_min_u32(nb, MAX_BEHIND_EVENTS));
    if (!rc)
        T->src = &kvi_ofl_pool_src;
    return rc;
}

void kvi_ofl_tier_remove(kvt_offload *m, uint32_t t)
{
    kvi_ofl_tier_close(m, t);
    m->tier[t].src = NULL;
    memset(m->tier[t].name, 0, sizeof(m->tier[t].name));
    for (uint32_t g = 0; g < KVT_MAX_GROUPS; g++) {
        free(m->tier[t].search_out[g]);
        m->tier[t].search_out[g] = NULL;
    }
    kvi_evtable_free(&m->tier[t].loads);
}

void kvi_ofl_tier_teardown(kvt_offload *m)
{
    for (uint32_t t = 1; t < KVI_OFL_TIERS; t++)
        kvi_ofl_tier_remove(m, t);
}

int kvi_ofl_tier_resize(kvt_offload *m, uint32_t t, uint32_t nb)
{
    char name[KVI_OFL_TIER_NAME];
    memcpy(name, m->tier[t].name, sizeof(name));
    kvi_ofl_tier_remove(m, t);
    return kvi_ofl_tier_setup(m, t, name, nb);
}

KVI_GETTER(const kvt_pool *, kvt_offload_disk_pool, kvt_offload, tier[1].pool)

const kvt_pool *kvt_offload_tier_pool(const kvt_offload *m, uint32_t t)
{
    return m && t < KVI_OFL_TIERS ? m->tier[t].pool : NULL;
}

/* ---- promotion: match and after_alloc ------------------------------------------------------ */

uint32_t kvi_ofl_tier_search(kvt_offload *m, uint32_t t, const uint8_t *hashes, uint32_t n_hashes,
                             uint32_t from, uint32_t max_len, bool partial)
{
    struct kvi_ofl_tier *T = &m->tier[t];
    memset(T->search_n, 0, sizeof(T->search_n));
    if (!T->pool || from >= n_hashes || max_len < m->hit_align)
        return 0;
    kvt_hit hit;
    if (kvt_pool_find_longest_hit_flags(T->pool, hashes + (size_t)from * m->hash_len,
                                        n_hashes - from, max_len, partial ? KVT_HIT_PARTIAL : 0,
                                        T->search_out, &hit))
        return 0; /* cannot fail on arguments the host search accepted; a miss is safe */
    memcpy(T->search_n, hit.n_blocks, sizeof(T->search_n));
    return hit.length;
}

uint32_t kvi_ofl_tier_search_chain(kvt_offload *m, const uint8_t *hashes, uint32_t n_hashes,
                                   uint32_t from, uint32_t max_len, uint32_t upto,
                                   struct kvi_ofl_chain_hit *c)
{
    uint32_t total = 0, last = 0, last_from = 0, n = kvi_min_u32(upto, kvi_ofl_chain_len(m));
    uint32_t *want = c->want;
    memset(c, 0, sizeof(*c));
    for (uint32_t t = 1; t < n; t++) {
        uint32_t at = from + total / m->gcfg.hash_block_size;
        bool let_go = false;
        c->from[t] = at;
        want[t] = m->tier[t].src->search(m, t, hashes, n_hashes, at, max_len - total, &let_go);
        if (want[t] && m->tier[t].pool) {
            last = t;
            last_from = at;
        }
        total += want[t];
        if (let_go) { /* the last tier: the caller takes the lock again and looks again */
            c->let_go = t;
            return total;
        }
    }
    /* partial hash hits: only the last part may end inside a scheduler block — the last tier
     * that added something, searched again from where its part starts, or else the first
     * tier behind it with a partial hit where the hit so far ends */
    if (!m->partial)
        return total;
    if (last) {
        uint32_t w = kvi_ofl_tier_search(m, last, hashes, n_hashes, last_from,
                                         max_len - (total - want[last]), true);
        if (w > want[last]) {
            total += w - want[last];
            want[last] = w;
            return total;
        }
        /* the same end: search_out holds the same blocks as before */
    }
    for (uint32_t t = last + 1; t < n && m->tier[t].pool; t++) {
        c->from[t] = from + total / m->gcfg.hash_block_size;
        want[t] = kvi_ofl_tier_search(m, t, hashes, n_hashes, c->from[t], max_len - total, true);
        if (want[t]) {
            total += want[t];
            break;
        }
    }
    return total;
}

uint32_t kvi_ofl_promo_tail(const kvt_offload *m, const struct kvi_ofl_req *r)
{
    uint32_t tail = r->promo_head;
    while (tail != OFL_NONE && m->promo.next[tail] != OFL_NONE)
        tail = m->promo.next[tail];
    return tail;
}

void kvi_ofl_promo_link(kvt_offload *m, struct kvi_ofl_req *r, uint32_t *tail, uint32_t h,
                        uint32_t t, uint32_t src, uint32_t g, uint32_t i)
{
    struct kvi_ofl_promos *P = &m->promo;
    P->src[h] = src;
    P->tier[h] = (uint8_t)t;
    P->gpu[h] = P->next[h] = P->evnext[h] = P->req[h] = OFL_NONE;
    P->grp[h] = (uint8_t)g;
    P->bad[h] = 0;
    P->idx[h] = r->hit_n[g] + r->dhit_pos[g] + i; /* its position in the hit */
    if (*tail == OFL_NONE)
        r->promo_head = h;
    else
        P->next[*tail] = h;
    *tail = h;
}

uint32_t kvi_ofl_tier_pin(kvt_offload *m, struct kvi_ofl_req *r, uint32_t t, uint32_t tokens)
{
    struct kvi_ofl_tier *T = &m->tier[t];
    uint32_t free_host = kvt_pool_num_free(m->tier[0].pool), found = 0;
    for (uint32_t g = 0; g < m->ng; g++)
        for (uint32_t i = 0; i < T->search_n[g]; i++)
            found += T->search_out[g][i] != KVT_NULL_BLOCK;
    bool one_full = m->ng == 1 && m->gcfg.groups[0].kind == KVT_GROUP_FULL;
    if (found > free_host) {
        if (!one_full)
            return 0; /* every group must reach the same end: whole or nothing */
        T->search_n[0] = found = free_host; /* a shorter prefix of one full-attention group */
        tokens = found * m->gcfg.groups[0].block_size;
    }
    if (found == 0)
        return 0;
    uint32_t *hosts = m->scratch; /* found <= host_nb */
    kvi_ofl_host_alloc(m, found, hosts);
    uint32_t tail = kvi_ofl_promo_tail(m, r), k = 0;
    for (uint32_t g = 0; g < m->ng; g++) {
        for (uint32_t i = 0; i < T->search_n[g]; i++) {
            uint32_t b = T->search_out[g][i];
            if (b == KVT_NULL_BLOCK)
                continue;
            (void)kvt_pool_touch(T->pool, &b, 1);
            kvi_ofl_promo_link(m, r, &tail, hosts[k++], t, b, g, i);
        }
        r->dhit_pos[g] += T->search_n[g];
    }
    r->dhit_n += found;
    r->dhit_len += tokens;
    T->st.hit_blocks += found;
    T->st.hit_tokens += tokens;
    return tokens;
}

uint32_t kvi_ofl_tier_pin_chain(kvt_offload *m, struct kvi_ofl_req *r, const uint8_t *hashes,
                                const struct kvi_ofl_chain_hit *c)
{
    uint32_t total = 0;
    for (uint32_t t = 1; t < KVI_OFL_TIERS; t++) {
        if (!c->want[t])
            continue;
        uint32_t got = m->tier[t].src->pin(m, r, t, hashes, c->from[t], c->want[t]);
        total += got;
        if (got < c->want[t])
            break; /* shortened: the next tier's part would not continue it */
    }
    return total;
}

/* ---- what happens to host blocks, for the tiers that serve them ---------------------------- */

void kvi_ofl_chain_host_stored(kvt_offload *m, uint32_t h)
{
    for (uint32_t t = 1, n = kvi_ofl_chain_len(m); t < n; t++)
        if (m->tier[t].src->host_stored)
            m->tier[t].src->host_stored(m, t, h);
}

void kvi_ofl_chain_host_reused(kvt_offload *m, const uint32_t *ids, uint32_t n)
{
    for (uint32_t t = 1, nt = kvi_ofl_chain_len(m); t < nt; t++)
        if (m->tier[t].src->host_reused)
            m->tier[t].src->host_reused(m, t, ids, n);
}

void kvi_ofl_chain_host_forgotten(kvt_offload *m)
{
    for (uint32_t t = 1, n = kvi_ofl_chain_len(m); t < n; t++)
        if (m->tier[t].src->host_forgotten)
            m->tier[t].src->host_forgotten(m, t);
}

/* ---- a pool tier as a promotion's source ------------------------------------------------ */

static uint32_t pool_search(kvt_offload *m, uint32_t t, const uint8_t *hashes, uint32_t n_hashes,
                            uint32_t from, uint32_t max_len, bool *let_go)
{
    (void)let_go; /* its pool is here */
    return kvi_ofl_tier_search(m, t, hashes, n_hashes, from, max_len, false);
}

static uint32_t pool_pin(kvt_offload *m, struct kvi_ofl_req *r, uint32_t t, const uint8_t *hashes,
                         uint32_t from, uint32_t tokens)
{
    (void)hashes, (void)from; /* its last search's blocks are in search_out */
    return kvi_ofl_tier_pin(m, r, t, tokens);
}

static void pool_release(kvt_offload *m, uint32_t t, uint32_t h)
{
    uint32_t b = m->promo.src[h];
    (void)kvt_pool_free(m->tier[t].pool, &b, 1);
}

static uint32_t pool_keys(kvt_offload *m, uint32_t t, uint32_t h)
{
    uint32_t nk = 0;
    (void)kvt_pool_block_keys(m->tier[t].pool, m->promo.src[h], m->keys, m->kpb, &nk);
    return nk < m->kpb ? nk : m->kpb;
}

static void pool_failed(kvt_offload *m, uint32_t t, uint32_t h)
{
    kvi_ofl_load_failed(m, t, m->promo.src[h]); /* the source may be bad: forgotten */
}

static int pool_reserve(kvt_offload *m, uint32_t t, kvt_offload_meta *out, uint32_t n)
{
    (void)m, (void)t, (void)out, (void)n;
    return 0; /* a block id says it all */
}

static uint32_t pool_emit(kvt_offload *m, uint32_t t, uint32_t h, kvt_offload_meta *out)
{
    (void)t, (void)out;
    return m->promo.src[h];
}

const struct kvi_ofl_src_ops kvi_ofl_pool_src = {.search = pool_search,
                                                 .pin = pool_pin,
                                                 .release = pool_release,
                                                 .keys = pool_keys,
                                                 .failed = pool_failed,
                                                 .reserve = pool_reserve,
                                                 .emit = pool_emit,
                                                 .own = true};

/* Frees one promotion pair's source pin (the host block is the caller's). */
static void release_pair(kvt_offload *m, uint32_t h)
{
    struct kvi_ofl_promos *P = &m->promo;
    uint32_t t = P->tier[h];
    m->tier[t].src->release(m, t, h);
    P->src[h] = P->next[h] = P->gpu[h] = P->evnext[h] = P->req[h] = OFL_NONE;
    P->bad[h] = 0;
}

void kvi_ofl_tier_release_hit(kvt_offload *m, struct kvi_ofl_req *r)
{
    if (r->dhit_n == 0)
        return; /* none, or already paired by after_alloc (the chain is the load's now) */
    uint32_t h = r->promo_head;
    for (uint32_t k = 0; k < r->dhit_n; k++) {
        uint32_t next = m->promo.next[h];
        release_pair(m, h);
        (void)kvt_pool_free(m->tier[0].pool, &h, 1);
        h = next;
    }
    r->dhit_n = r->dhit_len = 0;
    memset(r->dhit_pos, 0, sizeof(r->dhit_pos));
    r->promo_head = OFL_NONE;
}

/* The GPU block promotion h is accepted into (KVT_NULL_BLOCK: not accepted, or a null
 * position), or OFL_NONE when the table is too short. */
static uint32_t promo_dest(const kvt_offload *m, const struct kvi_ofl_req *r, uint32_t h,
                           const uint32_t *const *blocks, const uint32_t *n_blocks,
                           uint32_t num_external)
{
    uint32_t g = m->promo.grp[h], i = m->promo.idx[h];
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
    for (uint32_t k = 0; k < r->dhit_n; k++, h = m->promo.next[h]) {
        uint32_t g = m->promo.grp[h], gpu = promo_dest(m, r, h, blocks, n_blocks, num_external);
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
    struct kvi_ofl_promos *P = &m->promo;
    uint32_t h = r->promo_head, kept_tail = OFL_NONE, n = r->dhit_n;
    r->promo_head = OFL_NONE;
    r->dhit_n = r->dhit_len = 0;
    memset(r->dhit_pos, 0, sizeof(r->dhit_pos));
    for (uint32_t k = 0; k < n; k++) {
        uint32_t next = P->next[h];
        /* checked by kvi_ofl_tier_check_pairs: never OFL_NONE here */
        uint32_t gpu = promo_dest(m, r, h, blocks, NULL, num_external);
        if (gpu == KVT_NULL_BLOCK) { /* not accepted */
            release_pair(m, h);
            (void)kvt_pool_free(m->tier[0].pool, &h, 1);
            h = next;
            continue;
        }
        /* the allocation's reference on h becomes the load's pin; the source keeps its pin */
        kvi_ofl_add_load_pair(m, r, gpu, h, load_tail);
        P->gpu[h] = gpu;
        P->req[h] = kvi_ofl_req_slot(m, r);
        P->next[h] = OFL_NONE;
        if (kept_tail == OFL_NONE)
            r->promo_head = h;
        else
            P->next[kept_tail] = h;
        kept_tail = h;
        r->n_promo++;
        m->tier[P->tier[h]].promo_queued++;
        h = next;
    }
    if (r->n_promo) {
        r->flags |= RQ_PROMO_QUEUED;
        kvi_ofl_rq_push(m, &m->promoq_head, &m->promoq_tail, OFL_PROMO_LINK,
                        kvi_ofl_req_slot(m, r));
    }
}

void kvi_ofl_tier_cancel_promo(kvt_offload *m, struct kvi_ofl_req *r)
{
    kvi_ofl_rq_unlink(m, &m->promoq_head, &m->promoq_tail, OFL_PROMO_LINK, kvi_ofl_req_slot(m, r));
    for (uint32_t h = r->promo_head, next; h != OFL_NONE; h = next) {
        next = m->promo.next[h];
        m->tier[m->promo.tier[h]].promo_queued--;
        release_pair(m, h); /* the host blocks go with the load pairs */
    }
    r->promo_head = OFL_NONE;
    r->n_promo = 0;
    kvi_ofl_release_load_pairs(m, r);
    r->flags &= ~RQ_PROMO_QUEUED;
}

/* ---- write-back ------------------------------------------------------------------------ */

static void writeback_into(kvt_offload *m, uint32_t t, uint32_t h)
{
    struct kvi_ofl_tier *F = &m->tier[0], *T = &m->tier[t];
    const uint8_t *keys = F->keys + (size_t)h * m->kpb * m->key_stride;
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
           (size_t)F->keys_n[h] * m->key_stride);
    T->keys_n[d] = F->keys_n[h];
    (void)kvt_pool_touch(F->pool, &h, 1); /* pinned until the write landed */
    T->store_src[d] = h;
    T->store_next[d] = OFL_NONE;
    if (T->acc_tail == OFL_NONE)
        T->acc_head = d;
    else
        T->store_next[T->acc_tail] = d;
    T->acc_tail = d;
    T->acc_n++;
}

void kvi_ofl_tier_writeback(kvt_offload *m, uint32_t h)
{
    if (m->tier[0].keys_n[h] == 0)
        return;
    for (uint32_t t = 1; t < KVI_OFL_TIERS && m->tier[t].pool; t++)
        writeback_into(m, t, h);
}

/* ---- step assembly --------------------------------------------------------------------- */

/* Whether this step's promotions go out: every tier with pairs queued has event room (a
 * request's promotions are all sent at once, so it never waits on some and not others). */
static bool promotions_go(const kvt_offload *m)
{
    if (m->promoq_head == OFL_NONE)
        return false;
    for (uint32_t t = 1; t < KVI_OFL_TIERS && m->tier[t].src; t++)
        if (m->tier[t].promo_queued && kvi_evtable_full(&m->tier[t].loads))
            return false;
    return true;
}

int kvi_ofl_tier_reserve(kvt_offload *m, kvt_offload_meta *out, uint32_t invalid)
{
    bool go = promotions_go(m);
    int rc = kvt_offload_meta_reserve_invalid(out, invalid);
    for (uint32_t t = 1; t < KVI_OFL_TIERS && !rc && m->tier[t].src; t++) {
        uint32_t n = go ? m->tier[t].promo_queued : 0;
        rc = kvt_offload_meta_reserve_tier(out, t, n, m->tier[t].acc_n);
        if (!rc && n)
            rc = m->tier[t].src->reserve(m, t, out, n);
    }
    for (uint32_t t = 1; t < KVI_OFL_TIERS && !rc && m->tier[t].src; t++)
        if (m->tier[t].src->step)
            rc = m->tier[t].src->step(m, t, out);
    return rc ? kvi_fail_wrap(rc, "offload: build_meta") : 0;
}

/* Issues the queued promotions: one load event per tier that has some, listing its pairs. */
static void emit_promotions(kvt_offload *m, kvt_offload_meta *out)
{
    struct kvi_ofl_promos *P = &m->promo;
    struct kvi_ofl_event *ev[KVI_OFL_TIERS] = {NULL};
    for (uint32_t t = 1; t < KVI_OFL_TIERS && m->tier[t].src; t++) {
        struct kvi_ofl_tier *T = &m->tier[t];
        if (!T->promo_queued)
            continue;
        ev[t] = kvi_ofl_evtable_add(&T->loads, T->load_counter++); /* room checked */
        out->tiers[t - 1].load_event = ev[t]->id;
        T->st.load_events++;
        T->transferred = true;
        T->promo_queued = 0;
    }
    for (uint32_t s = m->promoq_head; s != OFL_NONE; s = m->reqs[s].promo_next) {
        struct kvi_ofl_req *r = &m->reqs[s];
        r->flags = (r->flags & ~RQ_PROMO_QUEUED) | RQ_PROMO_SENT;
        for (uint32_t h = r->promo_head; h != OFL_NONE; h = P->next[h]) {
            uint32_t t = P->tier[h];
            struct kvi_ofl_event *e = ev[t];
            (void)kvt_offload_meta_add_tier_load(out, t, m->tier[t].src->emit(m, t, h, out), h);
            if (e->tail == OFL_NONE)
                e->head = h;
            else
                P->evnext[e->tail] = h;
            e->tail = h;
            e->n++;
        }
    }
    m->promoq_head = m->promoq_tail = OFL_NONE;
}

void kvi_ofl_tier_emit(kvt_offload *m, kvt_offload_meta *out)
{
    if (promotions_go(m))
        emit_promotions(m, out);
    for (uint32_t t = 1; t < KVI_OFL_TIERS && m->tier[t].pool; t++)
        kvi_ofl_emit_stores(m, t, out);
}

/* ---- completions ----------------------------------------------------------------------- */

/* Refuses reports of tier t's events (loads or stores) that were never issued; the message
 * is formatted only then (this runs every step). */
static int check_issued(const kvt_event_report *rep, int64_t next, const char *name,
                        const char *kind)
{
    for (uint32_t i = 0; i < rep->n_completed; i++)
        if (rep->events[i] >= next)
            return kvt_fail(KVT_ERANGE,
                            "offload: apply_output: %s %s event %" PRId64
                            " was never issued (next is %" PRId64 ")",
                            name, kind, rep->events[i], next);
    return 0;
}

int kvi_ofl_tier_check_output(const kvt_offload *m, const kvt_offload_worker_meta *wm)
{
    int rc = 0;
    for (uint32_t i = 0; i < wm->n_failed_promo && !rc; i++) {
        uint32_t h = wm->failed_promo[i];
        if (h >= m->tier[0].nb || m->promo.req[h] == OFL_NONE)
            rc = kvt_fail(KVT_ERANGE,
                          "offload: apply_output: failed promotion into host block %u, which "
                          "no promotion in flight fills",
                          h);
    }
    for (uint32_t t = 1; t < KVI_OFL_TIERS && !rc; t++) {
        const char *name = kvi_ofl_tier_name(m, t);
        rc = check_issued(&wm->tier_stores[t - 1], m->tier[t].store_counter, name, "store");
        if (!rc)
            rc = check_issued(&wm->tier_loads[t - 1], m->tier[t].load_counter, name, "load");
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

/* Promotion h out of tier t landed (or failed: its event, or h alone) on every worker. */
static void complete_pair(kvt_offload *m, uint32_t t, uint32_t h, const struct kvi_ofl_event *e)
{
    struct kvi_ofl_promos *P = &m->promo;
    const struct kvi_ofl_src_ops *src = m->tier[t].src;
    if (e->failed || P->bad[h]) {
        m->gflags[P->gpu[h]] |= G_INVALID; /* never a hit */
        m->st.promotions_failed++;
        src->failed(m, t, h);
        return;
    }
    m->st.promotions++;
    if (e->abandoned)
        return;
    /* the promoted block is findable in the host tier from now on (and, one of this
     * instance's own, by its peers again: its host copy was withdrawn when it was evicted) */
    uint32_t nk = src->keys(m, t, h), added = 0;
    for (uint32_t k = 0; k < nk; k++) {
        uint32_t other;
        if (kvt_pool_lookup(m->tier[0].pool, m->keys[k].hash, m->keys[k].group, &other) != 1)
            added += kvt_pool_insert(m->tier[0].pool, h, m->keys[k].hash, m->keys[k].group,
                                     m->keys[k].num_tokens) == 0;
    }
    if (added && src->own)
        kvi_ofl_chain_host_stored(m, h);
}

/* Every promotion of r landed: its GPU load goes (or, finished meanwhile, its pins). */
static void promotions_done(kvt_offload *m, struct kvi_ofl_req *r)
{
    r->promo_head = OFL_NONE;
    r->flags &= ~RQ_PROMO_SENT;
    r->promo_next = OFL_NONE;
    if (r->flags & RQ_FINISHED) /* nobody waits for the GPU load any more */
        kvi_ofl_release_load_pairs(m, r);
    else
        kvi_ofl_queue_load(m, r);
    kvi_ofl_req_maybe_release(m, r);
}

static void complete_promotion(kvt_offload *m, uint32_t t, struct kvi_ofl_event *e)
{
    struct kvi_ofl_promos *P = &m->promo;
    for (uint32_t h = e->head, next; h != OFL_NONE; h = next) {
        next = P->evnext[h];
        struct kvi_ofl_req *r = &m->reqs[P->req[h]];
        complete_pair(m, t, h, e);
        release_pair(m, h);
        if (--r->n_promo == 0)
            promotions_done(m, r);
    }
    kvi_ofl_evtable_remove(&m->tier[t].loads, e);
}

void kvi_ofl_tier_apply_output(kvt_offload *m, const kvt_offload_worker_meta *wm)
{
    /* blocks that failed alone (checked: host blocks in promotions in flight), before the
     * events that complete them */
    for (uint32_t i = 0; i < wm->n_failed_promo; i++)
        m->promo.bad[wm->failed_promo[i]] = 1;
    for (uint32_t t = 1; t < KVI_OFL_TIERS && m->tier[t].src; t++) {
        const kvt_event_report *rep = &wm->tier_stores[t - 1];
        for (uint32_t i = 0; i < rep->n_completed; i++) {
            struct kvi_ofl_event *e = count_report(m, &m->tier[t].stores, rep, i);
            if (e)
                kvi_ofl_complete_store(m, t, e);
        }
        rep = &wm->tier_loads[t - 1];
        for (uint32_t i = 0; i < rep->n_completed; i++) {
            struct kvi_ofl_event *e = count_report(m, &m->tier[t].loads, rep, i);
            if (e)
                complete_promotion(m, t, e);
        }
    }
}

/* ---- reset and metrics ----------------------------------------------------------------- */

void kvi_ofl_tier_abandon(kvt_offload *m)
{
    for (uint32_t t = 1; t < KVI_OFL_TIERS && m->tier[t].src; t++) {
        KVI_OFL_FOR_EVENTS (e, &m->tier[t].stores)
            e->abandoned = true;
        KVI_OFL_FOR_EVENTS (e, &m->tier[t].loads)
            e->abandoned = true;
        kvi_ofl_release_accumulator(m, t);
    }
}

bool kvi_ofl_tier_pending(const kvt_offload *m)
{
    for (uint32_t t = 1; t < KVI_OFL_TIERS && m->tier[t].src; t++)
        if (kvi_evtable_len(&m->tier[t].loads) || kvi_evtable_len(&m->tier[t].stores) ||
            m->tier[t].acc_n ||
            (m->tier[t].src->step_pending && m->tier[t].src->step_pending(m, t)))
            return true;
    return m->promoq_head != OFL_NONE;
}
