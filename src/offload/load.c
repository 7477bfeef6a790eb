/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Loads: host tier -> GPU (spec kv-offload §2.5).
 *
 * Phase A (kvt_offload_match) searches the host tier beyond the GPU hit and pins every hit
 * block, so no store can evict it before the engine has allocated GPU blocks (vLLM #39702).
 * Phase B (kvt_offload_after_alloc) keeps only the prefix the engine accepted, pairs host
 * block i of group g with the request's GPU block at (blocks before the hit end) - (accepted
 * blocks) + i — the layout is | GPU hit | loaded from host | computed | — pins both sides for
 * the copy, and releases the phase-A pin. The load waits in a queue until build_meta gives
 * every queued request one shared load event; the workers report the request ids when all
 * ranks are done, and then both pins are released.
 */
#include <inttypes.h>
#include <string.h>

#include "base/error.h"
#include "base/log.h"
#include "base/util.h"
#include "offload/offload_internal.h"

void kvi_ofl_release_hit(kvt_offload *m, struct kvi_ofl_req *r)
{
    if (!(r->flags & RQ_HIT))
        return;
    kvi_ofl_tier_release_hit(m, r);
    for (kvi_iditer it = kvi_idlist_begin(&m->hitpool, &r->hit); kvi_iditer_ok(&it);
         kvi_iditer_next(&m->hitpool, &it)) {
        uint32_t b = kvi_iditer_get(&m->hitpool, &it);
        if (b != KVT_NULL_BLOCK)
            (void)kvt_pool_free(m->tier[0].pool, &b, 1); /* our own pin: cannot fail */
    }
    kvi_idlist_release(&m->hitpool, &r->hit);
    r->flags &= ~RQ_HIT;
}

int kvt_offload_match(kvt_offload *m, const char *id, uint32_t id_len, const uint8_t *hashes,
                      uint32_t n_hashes, uint32_t num_tokens, uint32_t num_computed,
                      uint32_t *hit_tokens)
{
    /* locked once, by the call it is: a nested lock could not be let go for the directory */
    return kvt_offload_match_flags(m, id, id_len, hashes, n_hashes, num_tokens, num_computed, 0,
                                   hit_tokens);
}

/* What the tiers hold past the GPU hit: the host tier's hit on scheduler blocks (its blocks
 * in the host tier's search_out), and the part each tier behind it continues that with (c,
 * their sum `behind`). */
struct local_hit {
    kvt_hit hit;
    struct kvi_ofl_chain_hit c;
    uint32_t behind;
};

/* The host and the tiers behind it before tier `upto`. */
static int search_chain(kvt_offload *m, const uint8_t *hashes, uint32_t n_hashes, uint32_t start,
                        uint32_t max_hit, uint32_t upto, struct local_hit *lh)
{
    /* Partial hash hits with tiers behind the host: the host hit on scheduler blocks first,
     * which they continue (the last part found itself ending anywhere); only where they add
     * nothing, the host's own partial hit (they hold what the host wrote back, so it rarely
     * matters which). */
    bool behind = kvi_ofl_chain_len(m) > 1;
    const uint8_t *from = hashes + (size_t)start * m->hash_len;
    memset(&lh->c, 0, sizeof(lh->c));
    int rc = kvt_pool_find_longest_hit_flags(m->tier[0].pool, from, n_hashes - start, max_hit,
                                             m->partial && !behind ? KVT_HIT_PARTIAL : 0,
                                             m->tier[0].search_out, &lh->hit);
    if (rc)
        return rc;
    lh->behind = behind
                     ? kvi_ofl_tier_search_chain(m, hashes, n_hashes,
                                                 start + lh->hit.length / m->gcfg.hash_block_size,
                                                 max_hit - lh->hit.length, upto, &lh->c)
                     : 0;
    if (behind && m->partial && !lh->behind) /* cannot fail: the same arguments passed above */
        (void)kvt_pool_find_longest_hit_flags(m->tier[0].pool, from, n_hashes - start, max_hit,
                                              KVT_HIT_PARTIAL, m->tier[0].search_out, &lh->hit);
    if (!lh->hit.length)
        memset(lh->hit.n_blocks, 0, sizeof(lh->hit.n_blocks));
    return 0;
}

/* The whole chain. A tier whose search let the node tier's lock go (the remote tier's
 * directory round trip: the other replicas' calls wait for no network) is the last; the pool
 * may have changed meanwhile (a peer's slot withdrawn, one published), so once the lock is
 * back the tiers before it are searched again, and its part is kept only if they still end
 * where it was looked up from (else this match offers none of it, counted in the tier's
 * lookups_dropped; the request's next match looks again). */
static int search_all(kvt_offload *m, const uint8_t *hashes, uint32_t n_hashes, uint32_t start,
                      uint32_t max_hit, struct local_hit *lh)
{
    int rc = search_chain(m, hashes, n_hashes, start, max_hit, KVI_OFL_TIERS, lh);
    uint32_t t = lh->c.let_go;
    if (rc || !t)
        return rc;
    uint32_t want = lh->c.want[t], from = lh->c.from[t],
             before = lh->hit.length + lh->behind - want;
    if ((rc = kvi_ofl_lock(m)) || (rc = search_chain(m, hashes, n_hashes, start, max_hit, t, lh)))
        return rc;
    if (lh->hit.length + lh->behind == before) {
        lh->c.want[t] = want, lh->c.from[t] = from;
        lh->behind += want;
    } else if (want) {
        m->tier[t].st.lookups_dropped++;
    }
    return 0;
}

/* A match that makes no lookup is counted: the request skips the prefix cache, or its GPU hit
 * ends inside a scheduler block. Transfers are whole scheduler blocks, so a load cannot start
 * inside one: such a request keeps its GPU hit and gets no host-tier hit (upstream: a warning,
 * not an error that would fail the engine's step). */
static bool no_lookup(kvt_offload *m, uint32_t flags, uint32_t num_computed)
{
    if (flags & KVT_MATCH_SKIP_PREFIX_CACHE) {
        m->st.lookups_skipped++;
        return true;
    }
    if (num_computed % m->sched_bs == 0)
        return false;
    m->st.lookups_misaligned++;
    if (!m->warned_misaligned) {
        KVT_LOG_W("offload: match: GPU hit of %u tokens is not a multiple of the scheduler "
                  "block size %u: no host-tier lookup for such requests (counted in "
                  "lookups_misaligned)",
                  num_computed, m->sched_bs);
        m->warned_misaligned = true;
    }
    return true;
}

/* A match that offers nothing lets the request go if nothing else holds it; returns rc. */
static int let_go(kvt_offload *m, struct kvi_ofl_req *r, int rc)
{
    if (r)
        kvi_ofl_req_maybe_release(m, r);
    return rc;
}

/* The host part of a hit into r: its block ids per group (room checked by the caller), each
 * real block pinned in the host pool. Returns how many it pinned. */
static uint32_t pin_host_hit(kvt_offload *m, struct kvi_ofl_req *r, const kvt_hit *hit)
{
    uint32_t pinned = 0;
    for (uint32_t g = 0; g < m->ng; g++) {
        r->hit_n[g] = hit->n_blocks[g];
        for (uint32_t i = 0; i < hit->n_blocks[g]; i++) {
            uint32_t b = m->tier[0].search_out[g][i];
            (void)kvi_idlist_push(&m->hitpool, &r->hit, b);
            if (b != KVT_NULL_BLOCK) {
                (void)kvt_pool_touch(m->tier[0].pool, &b, 1);
                pinned++;
            }
        }
    }
    return pinned;
}

/* Whether request *r (found, or registered now) can hold a hit of total host blocks. */
static bool room_for_hit(kvt_offload *m, struct kvi_ofl_req **r, const char *id, uint32_t id_len,
                         uint32_t total)
{
    if (!*r)
        *r = kvi_ofl_req_get(m, id, id_len);
    return *r && kvi_idpool_can_hold(&m->hitpool, &(*r)->hit, total);
}

/* The hit offered to request r, length tokens past its GPU hit of num_computed: pinned until
 * after_alloc or its finish. */
static void offer_hit(kvt_offload *m, struct kvi_ofl_req *r, uint32_t length, uint32_t num_computed,
                      uint32_t pinned)
{
    r->flags |= RQ_HIT;
    r->hit_len = length;
    r->hit_computed = num_computed;
    m->st.hit_requests++;
    m->st.partial_hits += length % m->sched_bs != 0;
    m->st.hit_tokens += length;
    m->tier[0].st.hit_blocks += pinned;
}

static int match_flags_unlocked(kvt_offload *m, const char *id, uint32_t id_len,
                                const uint8_t *hashes, uint32_t n_hashes, uint32_t num_tokens,
                                uint32_t num_computed, uint32_t flags, uint32_t *hit_tokens)
{
    kvi_ofl_gpu_flush(m); /* pins a deferred schedule left */
    int rc = kvi_ofl_check_id(id, id_len);
    if (rc)
        return rc;
    if (!hit_tokens || (n_hashes && !hashes))
        return kvt_fail(KVT_EINVAL, "offload: match: NULL argument");
    if (flags & ~KVT_MATCH_SKIP_PREFIX_CACHE)
        return kvt_fail(KVT_EINVAL, "offload: match: unknown flags 0x%x",
                        flags & ~KVT_MATCH_SKIP_PREFIX_CACHE);
    *hit_tokens = 0;
    struct kvi_ofl_req *r = kvi_ofl_req_find(m, id, id_len);
    if (r)
        kvi_ofl_release_hit(m, r); /* a retry after a failed allocation: the old pin goes */
    uint32_t start = num_computed / m->gcfg.hash_block_size;
    if (no_lookup(m, flags, num_computed) || start >= n_hashes || num_tokens <= num_computed + 1)
        return let_go(m, r, 0);
    uint32_t max_hit = num_tokens - 1 - num_computed;
    if (max_hit > m->max_search_tokens)
        max_hit = m->max_search_tokens;
    struct local_hit lh;
    rc = search_all(m, hashes, n_hashes, start, max_hit, &lh);
    if (rc)
        return let_go(m, r, kvi_fail_wrap(rc, "offload: match"));
    uint64_t searchable = (uint64_t)(n_hashes - start) * m->gcfg.hash_block_size;
    if (searchable > max_hit)
        searchable = max_hit;
    m->st.lookups++;
    m->st.lookup_tokens += searchable;
    kvt_hit hit = lh.hit;
    uint32_t want_behind = lh.behind;
    uint32_t total = 0;
    for (uint32_t g = 0; g < m->ng; g++)
        total += hit.n_blocks[g];
    if ((hit.length || want_behind) && !room_for_hit(m, &r, id, id_len, total)) {
        m->st.hits_dropped++;
        hit.length = 0; /* not offering a hit is always safe */
        want_behind = 0;
    }
    if (!hit.length)
        memset(hit.n_blocks, 0, sizeof(hit.n_blocks));
    uint32_t pinned = r ? pin_host_hit(m, r, &hit) : 0;
    /* after the host pins, so that allocating host blocks for them cannot evict them; each
     * part only if the ones before it were not shortened (it would not continue them) */
    uint32_t length =
        hit.length + (r && want_behind ? kvi_ofl_tier_pin_chain(m, r, hashes, &lh.c) : 0);
    m->st.miss_tokens += searchable - length;
    m->st.miss_blocks += (searchable - length) / m->sched_bs;
    if (length == 0)
        return let_go(m, r, 0);
    offer_hit(m, r, length, num_computed, pinned);
    *hit_tokens = length;
    return 0;
}

int kvt_offload_match_flags(kvt_offload *m, const char *id, uint32_t id_len, const uint8_t *hashes,
                            uint32_t n_hashes, uint32_t num_tokens, uint32_t num_computed,
                            uint32_t flags, uint32_t *hit_tokens)
{
    KVI_OFL_LOCKED(m, match_flags_unlocked(m, id, id_len, hashes, n_hashes, num_tokens,
                                           num_computed, flags, hit_tokens));
}

/* Position of the first loaded block of group g in the request's block table. */
uint32_t kvi_ofl_load_start(const kvt_offload *m, const struct kvi_ofl_req *r, uint32_t g,
                            uint32_t num_external)
{
    return kvi_div_ceil_u32(r->hit_computed + num_external, m->gcfg.groups[g].block_size) -
           kvi_ofl_ext_blocks(m, g, num_external);
}

/* Whether every prefix-cacheable group is full attention. */
static bool full_attention_only(const kvt_offload *m)
{
    for (uint32_t g = 0; g < m->ng; g++)
        if (kvt_group_kind_cacheable(m->gcfg.groups[g].kind) &&
            m->gcfg.groups[g].kind != KVT_GROUP_FULL)
            return false;
    return true;
}

/* A shorter acceptance than offered ends where a window group may need blocks the offered hit
 * left out (null: before the window of its own end): how many blocks before the end it needs;
 * a state group has states only where the host part and the whole hit end (with partial hits,
 * a state block inside the acceptance may hold a later state than its end): *no_state. */
static uint32_t end_needs(const kvt_group_spec *gs, const struct kvi_ofl_req *r,
                          uint32_t num_external, bool *no_state)
{
    bool state = gs->kind == KVT_GROUP_MAMBA || gs->kind == KVT_GROUP_MAMBA_ALIGN;
    *no_state = state && num_external != r->hit_len && num_external != r->hit_len - r->dhit_len;
    if (num_external < r->hit_len && gs->kind == KVT_GROUP_SLIDING)
        return kvi_max_u32(1, (gs->sliding_window - 1 + gs->block_size - 1) / gs->block_size);
    return num_external < r->hit_len && state ? 1 : 0;
}

/* The marks check_pairs set on the load's GPU blocks, cleared. */
static void clear_marks(kvt_offload *m, const struct kvi_ofl_req *r, const uint32_t *const *blocks,
                        const uint32_t *n_blocks, uint32_t num_external)
{
    for (uint32_t g = 0; g < m->ng; g++) {
        uint32_t n_ext = kvi_ofl_ext_blocks(m, g, num_external);
        uint32_t start = kvi_ofl_load_start(m, r, g, num_external);
        for (uint32_t i = 0; i < n_ext && (uint64_t)start + i < n_blocks[g]; i++)
            m->gflags[blocks[g][start + i]] &= (uint8_t)~G_MARK;
    }
}

/* Checks every pair before anything changes; marks destinations to catch repeats. */
static int check_pairs(kvt_offload *m, const struct kvi_ofl_req *r, const uint32_t *const *blocks,
                       const uint32_t *n_blocks, uint32_t num_external)
{
    int rc = 0;
    kvi_iditer it = kvi_idlist_begin(&m->hitpool, &r->hit);
    for (uint32_t g = 0; g < m->ng && !rc; g++) {
        const kvt_group_spec *gs = &m->gcfg.groups[g];
        uint32_t n_ext = kvi_ofl_ext_blocks(m, g, num_external);
        uint32_t start = kvi_ofl_load_start(m, r, g, num_external);
        bool no_state;
        uint32_t need = end_needs(gs, r, num_external, &no_state);
        for (uint32_t i = 0; i < r->hit_n[g]; i++, kvi_iditer_next(&m->hitpool, &it)) {
            uint32_t cpu = kvi_iditer_get(&m->hitpool, &it);
            if (!rc && i < n_ext && i + need >= n_ext && (cpu == KVT_NULL_BLOCK || no_state))
                rc = kvt_fail(KVT_EINVAL,
                              "offload: after_alloc: %u of the %u tokens offered end where group "
                              "%u (%s) needs blocks the hit does not hold; take the whole hit "
                              "or none",
                              num_external, r->hit_len, g,
                              gs->kind == KVT_GROUP_SLIDING ? "sliding window" : "Mamba");
            if (rc || i >= n_ext || cpu == KVT_NULL_BLOCK)
                continue;
            if ((uint64_t)start + i >= n_blocks[g]) {
                rc = kvt_fail(KVT_EINVAL,
                              "offload: after_alloc: group %u has %u GPU blocks; the "
                              "load needs block %u",
                              g, n_blocks[g], start + i);
                continue;
            }
            uint32_t gpu = blocks[g][start + i];
            if (gpu == KVT_NULL_BLOCK)
                continue;
            if (m->gload_src[gpu] != OFL_NONE || (m->gflags[gpu] & G_MARK)) {
                rc = kvt_fail(KVT_ESTATE,
                              "offload: after_alloc: GPU block %u is already the "
                              "destination of a load",
                              gpu);
                continue;
            }
            m->gflags[gpu] |= G_MARK;
        }
    }
    /* a shorter end inside the part behind the host has a window or state group's blocks
     * only if that group is full attention (that part was promoted for its own end) */
    if (!rc && r->dhit_n && num_external < r->hit_len && num_external > r->hit_len - r->dhit_len &&
        !full_attention_only(m))
        rc = kvt_fail(KVT_EINVAL,
                      "offload: after_alloc: %u of the %u tokens offered end inside the part "
                      "promoted from the tiers behind the host, where a window or Mamba group "
                      "has no blocks; take the whole hit or at most its %u host-tier tokens",
                      num_external, r->hit_len, r->hit_len - r->dhit_len);
    if (!rc && r->dhit_n) /* the part behind the host follows the host part */
        rc = kvi_ofl_tier_check_pairs(m, r, blocks, n_blocks, num_external);
    clear_marks(m, r, blocks, n_blocks, num_external);
    return rc;
}

static int after_alloc_unlocked(kvt_offload *m, const char *id, uint32_t id_len,
                                const uint32_t *const *blocks, const uint32_t *n_blocks,
                                uint32_t num_external)
{
    kvi_ofl_gpu_flush(m); /* pins a deferred schedule left */
    int rc = kvi_ofl_check_id(id, id_len);
    if (rc || (rc = kvi_ofl_check_span(m, blocks, n_blocks, NULL, UINT32_MAX, "after_alloc", NULL)))
        return rc;
    struct kvi_ofl_req *r = kvi_ofl_req_find(m, id, id_len);
    if (num_external) {
        if (!r || !(r->flags & RQ_HIT))
            return kvt_fail(KVT_ESTATE,
                            "offload: after_alloc: request %.*s accepted %u external "
                            "tokens but has no pending host hit",
                            (int)id_len, id, num_external);
        if (num_external > r->hit_len || num_external % m->hit_align)
            return kvt_fail(KVT_EINVAL,
                            "offload: after_alloc: %u external tokens: must be a "
                            "multiple of %u and at most the %u offered",
                            num_external, m->hit_align, r->hit_len);
        if (r->flags & (RQ_LOAD_QUEUED | RQ_LOAD_SENT | RQ_PROMO_QUEUED | RQ_PROMO_SENT))
            return kvt_fail(KVT_ESTATE, "offload: after_alloc: request %.*s already has a load",
                            (int)id_len, id);
        if ((rc = check_pairs(m, r, blocks, n_blocks, num_external)))
            return rc;
    }
    if (!m->cfg.lazy && !r && !(r = kvi_ofl_req_get(m, id, id_len)))
        m->st.untracked_requests++; /* table full: this request's blocks are not stored */
    if (!r)
        return 0;
    if (!m->cfg.lazy && !(r->flags & RQ_FINISHED))
        r->flags |= RQ_EAGER; /* idempotent: cursors survive a second call */

    if (num_external && (r->flags & RQ_HIT)) {
        uint32_t tail = OFL_NONE;
        kvi_iditer it = kvi_idlist_begin(&m->hitpool, &r->hit);
        for (uint32_t g = 0; g < m->ng; g++) {
            uint32_t n_ext = kvi_ofl_ext_blocks(m, g, num_external);
            uint32_t start = kvi_ofl_load_start(m, r, g, num_external);
            for (uint32_t i = 0; i < r->hit_n[g]; i++, kvi_iditer_next(&m->hitpool, &it)) {
                uint32_t cpu = kvi_iditer_get(&m->hitpool, &it);
                if (i >= n_ext || cpu == KVT_NULL_BLOCK)
                    continue;
                uint32_t gpu = blocks[g][start + i];
                if (gpu == KVT_NULL_BLOCK)
                    continue;
                /* the load's pin on cpu, before the hit pin goes */
                (void)kvt_pool_touch(m->tier[0].pool, &cpu, 1);
                kvi_ofl_add_load_pair(m, r, gpu, cpu, &tail);
            }
        }
        if (r->dhit_n) /* the load waits for the promotion of the part behind the host */
            kvi_ofl_tier_pair(m, r, blocks, num_external, &tail);
        if (r->n_load && !r->n_promo)
            kvi_ofl_queue_load(m, r);
    }
    kvi_ofl_gpu_flush(m);
    kvi_ofl_release_hit(m, r);
    kvi_ofl_req_maybe_release(m, r);
    return 0;
}

int kvt_offload_after_alloc(kvt_offload *m, const char *id, uint32_t id_len,
                            const uint32_t *const *blocks, const uint32_t *n_blocks,
                            uint32_t num_external)
{
    KVI_OFL_LOCKED(m, after_alloc_unlocked(m, id, id_len, blocks, n_blocks, num_external));
}

void kvi_ofl_add_load_pair(kvt_offload *m, struct kvi_ofl_req *r, uint32_t gpu, uint32_t host,
                           uint32_t *tail)
{
    kvi_ofl_gpu_pin(m, gpu);
    m->gload_src[gpu] = host;
    m->gload_next[gpu] = OFL_NONE;
    if (*tail == OFL_NONE)
        r->load_head = gpu;
    else
        m->gload_next[*tail] = gpu;
    *tail = gpu;
    r->n_load++;
}

void kvi_ofl_queue_load(kvt_offload *m, struct kvi_ofl_req *r)
{
    r->flags |= RQ_LOAD_QUEUED;
    kvi_ofl_rq_push(m, &m->loadq_head, &m->loadq_tail, OFL_LOAD_LINK, kvi_ofl_req_slot(m, r));
}

/* Releases the pins of a request's load pairs. */
void kvi_ofl_release_load_pairs(kvt_offload *m, struct kvi_ofl_req *r)
{
    uint32_t gpu = r->load_head;
    while (gpu != OFL_NONE) {
        uint32_t next = m->gload_next[gpu];
        uint32_t cpu = m->gload_src[gpu];
        (void)kvt_pool_free(m->tier[0].pool, &cpu, 1);
        kvi_ofl_gpu_unpin(m, gpu);
        m->gflags[gpu] &= (uint8_t)~G_INVALID;
        m->gload_src[gpu] = m->gload_next[gpu] = OFL_NONE;
        gpu = next;
    }
    kvi_ofl_gpu_flush(m);
    r->load_head = OFL_NONE;
    r->n_load = 0;
}

void kvi_ofl_cancel_queued_load(kvt_offload *m, struct kvi_ofl_req *r)
{
    kvi_ofl_rq_unlink(m, &m->loadq_head, &m->loadq_tail, OFL_LOAD_LINK, kvi_ofl_req_slot(m, r));
    kvi_ofl_release_load_pairs(m, r);
    r->flags &= ~RQ_LOAD_QUEUED;
}

/* Reserves room in out for everything build_meta will write (loads, load_event_to_reqs and
 * the queued stores), so that once an event is created nothing can fail. */
int kvi_ofl_reserve_step(kvt_offload *m, kvt_offload_meta *out)
{
    uint32_t pairs = 0, reqs = 0, events = kvi_evtable_len(&m->tier[0].loads);
    size_t bytes = 0;
    if (m->loadq_head != OFL_NONE && !kvi_evtable_full(&m->tier[0].loads)) {
        events++;
        for (uint32_t s = m->loadq_head; s != OFL_NONE; s = m->reqs[s].load_next) {
            pairs += m->reqs[s].n_load;
            reqs++;
            bytes += m->reqs[s].id_len + 1;
        }
    }
    KVI_OFL_FOR_EVENTS (e, &m->tier[0].loads)
        for (uint32_t s = e->head; s != OFL_NONE; s = m->reqs[s].load_next) {
            reqs++;
            bytes += m->reqs[s].id_len + 1;
        }
    int rc = kvt_offload_meta_reserve(out, pairs, m->tier[0].acc_n, events, reqs, bytes);
    if (rc)
        return kvi_fail_wrap(rc, "offload: build_meta");
    return kvi_ofl_tier_reserve(m, out, kvi_ofl_chain_len(m) > 1 ? pairs : 0);
}

void kvi_ofl_emit_loads(kvt_offload *m, kvt_offload_meta *out)
{
    if (m->loadq_head != OFL_NONE && !kvi_evtable_full(&m->tier[0].loads)) {
        struct kvi_ofl_event *e = kvi_ofl_evtable_add(&m->tier[0].loads, m->tier[0].load_counter++);
        uint32_t pairs = 0;
        e->head = m->loadq_head;
        e->tail = m->loadq_tail;
        for (uint32_t s = m->loadq_head; s != OFL_NONE; s = m->reqs[s].load_next) {
            struct kvi_ofl_req *r = &m->reqs[s];
            r->flags = (r->flags & ~RQ_LOAD_QUEUED) | RQ_LOAD_SENT;
            r->load_event = e->id;
            e->n++;
            pairs += r->n_load;
            for (uint32_t g = r->load_head; g != OFL_NONE; g = m->gload_next[g]) {
                (void)kvt_offload_meta_add_load(out, g, m->gload_src[g]);
                if (m->gflags[g] & G_INVALID) { /* its promotion failed: never a hit */
                    (void)kvt_offload_meta_add_load_invalid(out, g);
                    m->gflags[g] &= (uint8_t)~G_INVALID;
                }
            }
        }
        m->loadq_head = m->loadq_tail = OFL_NONE;
        out->load_event = e->id;
        m->tier[0].st.load_events++;
        m->st.load_blocks += pairs;
        m->tier[0].transferred = true;
    }
    KVI_OFL_FOR_EVENTS (e, &m->tier[0].loads)
        for (uint32_t s = e->head; s != OFL_NONE; s = m->reqs[s].load_next)
            (void)kvt_offload_meta_add_load_req(out, e->id, m->reqs[s].id, m->reqs[s].id_len);
}

int kvi_ofl_check_load_done(const kvt_offload *m, const kvt_str *ids, uint32_t n)
{
    if (n && !ids)
        return kvt_fail(KVT_EINVAL, "offload: apply_output: finished_loads is NULL");
    int rc = 0;
    uint32_t i = 0;
    for (; i < n && !rc; i++) {
        if ((rc = kvi_ofl_check_id(ids[i].ptr, ids[i].len)))
            break;
        struct kvi_ofl_req *r = kvi_ofl_req_find(m, ids[i].ptr, ids[i].len);
        if (!r)
            rc = kvt_fail(KVT_ENOENT, "offload: apply_output: unknown request %.*s",
                          (int)ids[i].len, ids[i].ptr);
        else if (!(r->flags & RQ_LOAD_SENT) || (r->flags & RQ_LISTED))
            rc = kvt_fail(KVT_ESTATE,
                          "offload: apply_output: request %.*s has no load in "
                          "flight (or is listed twice)",
                          (int)ids[i].len, ids[i].ptr);
        else
            r->flags |= RQ_LISTED;
    }
    for (uint32_t k = 0; k < i; k++) {
        struct kvi_ofl_req *r = kvi_ofl_req_find(m, ids[k].ptr, ids[k].len);
        if (r)
            r->flags &= ~(RQ_LISTED);
    }
    return rc;
}

void kvi_ofl_apply_load_done(kvt_offload *m, struct kvi_ofl_req *r)
{
    struct kvi_ofl_event *e = kvi_ofl_evtable_find(&m->tier[0].loads, r->load_event);
    if (e) {
        kvi_ofl_rq_unlink(m, &e->head, &e->tail, OFL_LOAD_LINK, kvi_ofl_req_slot(m, r));
        if (--e->n == 0)
            kvi_ofl_evtable_remove(&m->tier[0].loads, e);
    }
    m->st.loads_completed += r->n_load;
    m->st.bytes_loaded += (uint64_t)r->n_load * m->cfg.block_bytes;
    kvi_ofl_release_load_pairs(m, r);
    r->flags &= ~RQ_LOAD_SENT;
    r->load_event = KVT_NO_EVENT;
    r->load_next = OFL_NONE;
    kvi_ofl_req_maybe_release(m, r);
}

void kvi_ofl_load_failed(kvt_offload *m, uint32_t t, uint32_t b)
{
    kvt_block_info bi;
    if (kvt_pool_block_info(m->tier[t].pool, b, &bi) || bi.is_null || bi.n_keys == 0)
        return; /* already forgotten (reported by several ranks or pairs, or evicted meanwhile) */
    if (t == 0)
        kvi_ofl_chain_host_reused(m, &b, 1); /* a tier serving host blocks: peers stop */
    (void)kvt_pool_evict(m->tier[t].pool, &b, 1);
    m->tier[t].st.loads_failed++;
}
