/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The remote tier, last in the chain behind the host tier (kvt_offload_attach_remote;
 * kvtier/remote.h, issues 23 and 41).
 *
 *   hits       match looks the hashes past what the host and the tiers behind it hold up in the
 *              directory (one round trip) and makes each block found a promotion out of the
 *              remote tier into a host block it allocates (withdrawn first: it may be one of
 *              this instance's published slots), as the other tiers' promotions are: after_alloc
 *              pairs them with GPU blocks, build_meta issues them (the metadata's remote section
 *              says where each block is: owner, slot, generation, hash), the workers read them
 *              (kvt_worker_attach_remote), and the GPU load goes when every one landed. A block
 *              read whole and checked gets its key in the host pool; one that failed (stale,
 *              owner gone, wrong bytes: the worker's failed_promo) is an invalid block, which
 *              the engine recomputes. The scheduler's thread never waits for bytes.
 *   publish    a host block whose store completed on every worker (its keys registered) goes
 *              in the next step's metadata, and each worker publishes it (its part) on its
 *              remote, on the remote stage's thread: the tags over the bytes and the directory
 *              round trips never run on the scheduler's thread.
 *   withdraw   every host block the manager allocates and had told the workers to publish is
 *              withdrawn by them before the step's transfers; kvt_offload_reset withdraws all,
 *              and so does the first step (what the remote served before is not this
 *              manager's).
 *
 * The bytes never pass through the manager: the remote serves the host tier's own arrays and
 * the worker reads into them — one worker in this process, whose remote the manager also looks
 * up with, or, behind a lookup-only client (an engine of several ranks, or a scheduler in a
 * process of its own), every rank with a remote of its own: then a block has a part per rank
 * (its sources name each part's owner).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/hash.h"
#include "base/log.h"
#include "port/remote_port.h"
#include "base/util.h"
#include "offload/offload_internal.h"

/* Whether this manager can take remote p: one full-attention group, as many ranks as its
 * workers (a lookup-only client) or one (a remote that serves this process's host tier, its
 * slots the host blocks), the pool's hash length. */
static int check_fit(const kvt_offload *m, const kvi_remote_port *p)
{
    const kvt_group_spec *g = &m->gcfg.groups[0];
    if (m->ng != 1 || g->kind != KVT_GROUP_FULL || m->gcfg.hash_block_size != g->block_size ||
        m->partial)
        return kvt_fail(KVT_EINVAL,
                        "offload: the remote tier supports one full-attention group whose hash "
                        "block is its block (this manager has %u groups, hash block %u, block %u)",
                        m->ng, m->gcfg.hash_block_size, g->block_size);
    if (p->lookup_only ? p->parts != m->cfg.world_size : m->cfg.world_size != 1)
        return kvt_fail(KVT_EINVAL,
                        "offload: a remote tier %s, but this manager's world_size is %u (an "
                        "engine of several ranks attaches a lookup-only client of that many "
                        "ranks, and each rank's worker a remote of its own)",
                        p->lookup_only ? "client for engines of several ranks must have them all"
                                       : "that serves this process's host tier needs one rank",
                        m->cfg.world_size);
    if (!p->lookup_only && p->n_slots != m->tier[0].nb)
        return kvt_fail(KVT_EINVAL,
                        "offload: the remote tier serves %u slots; the host tier has %u blocks "
                        "(its slots must be the host blocks: regions of the host mirror)",
                        p->n_slots, m->tier[0].nb);
    if (p->hash_len != m->hash_len)
        return kvt_fail(KVT_EINVAL, "offload: the remote tier's hash_len %u is not the pool's %u",
                        p->hash_len, m->hash_len);
    return 0;
}

/* The manager's tables for a remote of P parts (lookups, owners per host block,
 * publications, withdrawals); KVT_ENOMEM (what was allocated stays for the teardown). */
static int alloc_tables(kvt_offload *m, uint32_t P)
{
    uint32_t nb = m->tier[0].nb;
    m->rloc = malloc((size_t)KVT_REMOTE_MAX_READ * P * sizeof(*m->rloc));
    m->rpeers = calloc(KVT_REMOTE_MAX_PEERS, sizeof(*m->rpeers));
    m->rs_peer = malloc((size_t)nb * P * sizeof(*m->rs_peer));
    m->rs_slot = malloc((size_t)nb * P * sizeof(*m->rs_slot));
    m->rs_gen = malloc((size_t)nb * P * sizeof(*m->rs_gen));
    m->rs_hash = malloc((size_t)nb * m->hash_len);
    m->pub_slots = malloc(nb * sizeof(*m->pub_slots));
    m->pub_hashes = malloc((size_t)nb * m->hash_len);
    m->rmiss = calloc(KVI_OFL_RMISS, sizeof(*m->rmiss));
    m->rpub = calloc(nb, 1);
    m->wd_slots = malloc(nb * sizeof(*m->wd_slots));
    return !m->rloc || !m->rpeers || !m->rs_peer || !m->rs_slot || !m->rs_gen || !m->rs_hash ||
                   !m->pub_slots || !m->pub_hashes || !m->rmiss || !m->rpub || !m->wd_slots
               ? kvt_fail(KVT_ENOMEM, "offload: attach_remote: out of memory")
               : 0;
}

static int attach_unlocked(kvt_offload *m, kvt_remote *remote)
{
    if (!m || !remote)
        return kvt_fail(KVT_EINVAL, "offload: attach_remote: NULL argument");
    if (m->remote)
        return kvt_fail(KVT_ESTATE, "offload: a remote tier is attached already");
    kvi_remote_port *p = kvi_remote_port_of(remote);
    if (p->lent)
        return kvt_fail(KVT_ESTATE, "offload: this remote tier is lent to another manager");
    int rc = check_fit(m, p);
    if (rc)
        return rc;
    uint32_t t = kvi_ofl_ntiers(m), nb = m->tier[0].nb;
    if (t >= KVI_OFL_TIERS)
        return kvt_fail(KVT_ENOSPC,
                        "offload: attach_remote: %u tiers already (KVT_MAX_TIERS); the remote "
                        "tier would be tier %u",
                        t, t);
    struct kvi_ofl_tier *T = &m->tier[t];
    rc = alloc_tables(m, p->parts);
    /* its place in the chain: events of its own (its stores: none, ever) */
    if (!rc && !(rc = kvi_ofl_evtable_init(&T->loads, kvi_min_u32(nb, 1024))))
        rc = kvi_ofl_evtable_init(&T->stores, 1);
    if (rc) {
        kvi_ofl_remote_teardown(m);
        kvi_evtable_free(&T->loads);
        kvi_evtable_free(&T->stores);
        return rc;
    }
    snprintf(T->name, sizeof(T->name), "remote");
    T->acc_head = T->acc_tail = OFL_NONE;
    T->src = &kvi_ofl_remote_src;
    m->rtier = t;
    m->pub_n = m->wd_n = 0;
    /* what the remote served before this manager is not this manager's: the workers withdraw
     * every slot with the first step (nothing to do on a fresh remote) */
    m->wd_all = true;
    m->rparts = p->parts;
    m->remote = remote;
    m->rport = p;
    p->lent = true;
    return 0;
}

int kvt_offload_attach_remote(kvt_offload *m, kvt_remote *remote)
{
    if (!m)
        return kvt_fail(KVT_EINVAL, "offload: attach_remote: NULL argument");
    KVI_OFL_LOCKED(m, attach_unlocked(m, remote));
}

uint32_t kvt_offload_remote_tier(const kvt_offload *m)
{
    return m ? m->rtier : 0;
}

void kvi_ofl_remote_teardown(kvt_offload *m)
{
    free(m->rloc), free(m->rpeers), free(m->pub_slots), free(m->pub_hashes), free(m->rmiss);
    free(m->rs_peer), free(m->rs_slot), free(m->rs_gen), free(m->rs_hash);
    free(m->rpub), free(m->wd_slots);
    m->rloc = NULL, m->rpeers = NULL, m->pub_slots = NULL, m->pub_hashes = NULL;
    m->rmiss = NULL, m->rpub = NULL, m->wd_slots = NULL;
    m->rs_peer = m->rs_slot = NULL, m->rs_gen = NULL, m->rs_hash = NULL;
    kvt_remote *r = m->remote;
    const kvi_remote_port *p = m->rport;
    m->remote = NULL;
    m->rport = NULL;
    if (r)
        p->unlend(r); /* may destroy r, if its owner asked for that meanwhile */
}

/* ---- hits ---------------------------------------------------------------------------------- */

/* Looks up past the hit: hashes from index `from`, at most max_len tokens (and as many blocks
 * as the host tier can allocate); returns their tokens (the blocks' places in m->rloc). With a
 * node tier the directory's round trip runs with the node's lock let go (*let_go): the other
 * replicas' calls wait for no network. */
static uint32_t remote_search(kvt_offload *m, uint32_t t, const uint8_t *hashes, uint32_t n_hashes,
                              uint32_t from, uint32_t max_len, bool *let_go)
{
    (void)t;
    if (!m->remote || from >= n_hashes)
        return 0;
    uint32_t n = kvi_min_u32(n_hashes - from, max_len / m->sched_bs);
    n = kvi_min_u32(n, kvt_pool_num_free(m->tier[0].pool));
    n = kvi_min_u32(n, KVT_REMOTE_MAX_READ / m->rparts);
    if (n == 0)
        return 0;
    /* a span that just missed (a waiting request matched again) is not looked up again yet */
    const uint8_t *h0 = hashes + (size_t)from * m->hash_len;
    struct kvi_ofl_rmiss *x = NULL;
    uint64_t now = 0, key = 0;
    if (m->cfg.remote_miss_ms) {
        key = kvi_xxh3_64(h0, (size_t)n * m->hash_len, n);
        x = &m->rmiss[key & (KVI_OFL_RMISS - 1)];
        now = kvt_monotonic_ns();
        if (x->key == key && now < x->until_ns) {
            m->st.remote_lookups_spared++;
            return 0;
        }
    }
    uint32_t hit = 0;
    /* the round trip holds no other replica of a node tier up */
    *let_go = m->node && kvi_node_let_go(m->node);
    if (m->rport->lookup(m->remote, h0, n, m->rloc, &hit))
        hit = 0; /* arguments checked above; a failed lookup is a miss */
    if (x && hit == 0)
        *x = (struct kvi_ofl_rmiss){key, now + (uint64_t)m->cfg.remote_miss_ms * 1000000u};
    return hit * m->sched_bs;
}

/* The manager's entry for peer lp of the last lookup: the same owner (instance, endpoint,
 * epoch) shares one; else an entry no promotion reads from is taken (the one whose failure
 * is oldest). UINT32_MAX: every entry is in use (the hit ends before that owner's blocks). */
static uint32_t owner_entry(kvt_offload *m, uint32_t lp)
{
    kvt_remote_peer id;
    if (m->rport->lookup_peer(m->remote, lp, &id))
        return UINT32_MAX;
    uint32_t unused = UINT32_MAX;
    for (uint32_t i = 0; i < KVT_REMOTE_MAX_PEERS; i++) {
        struct kvi_ofl_rpeer *p = &m->rpeers[i];
        if (p->id.epoch == id.epoch && strcmp(p->id.instance, id.instance) == 0 &&
            strcmp(p->id.endpoint, id.endpoint) == 0)
            return i;
        if (p->refs == 0 && (unused == UINT32_MAX || p->down_ns < m->rpeers[unused].down_ns))
            unused = i;
    }
    if (unused != UINT32_MAX)
        m->rpeers[unused] = (struct kvi_ofl_rpeer){.id = id, .wire = UINT32_MAX};
    return unused;
}

/* Takes the owners of every part of looked-up block k (map: the lookup's peers to the
 * manager's entries); false, nothing taken, when one has no entry or failed a moment ago. */
static bool take_owners(kvt_offload *m, uint32_t k, uint32_t *map, uint64_t now)
{
    const uint32_t P = m->rparts;
    uint32_t j = 0;
    for (; j < P; j++) {
        uint32_t lp = m->rloc[(size_t)k * P + j].peer;
        if (lp >= KVT_REMOTE_MAX_PEERS ||
            (map[lp] == UINT32_MAX && (map[lp] = owner_entry(m, lp)) == UINT32_MAX))
            break;
        if (m->rpeers[map[lp]].down_ns > now)
            break; /* its reads failed a moment ago: the hit ends before its blocks */
        m->rpeers[map[lp]].refs++; /* taken now: a later owner cannot take this entry */
    }
    if (j == P)
        return true;
    while (j--)
        m->rpeers[map[m->rloc[(size_t)k * P + j].peer]].refs--;
    return false;
}

/* The blocks the last lookup found (`tokens` of them, hashes from index `from`) become
 * promotions of r out of the remote tier into new host blocks (as many as the host has room
 * for and the owner table can name), after its promotions out of the tiers before it: the
 * workers read them. Returns their tokens. */
static uint32_t remote_pin(kvt_offload *m, struct kvi_ofl_req *r, uint32_t t, const uint8_t *hashes,
                           uint32_t from, uint32_t tokens)
{
    uint32_t map[KVT_REMOTE_MAX_PEERS], k = 0, n = tokens / m->sched_bs;
    const uint32_t P = m->rparts;
    uint64_t now = m->cfg.remote_miss_ms ? kvt_monotonic_ns() : 0;
    n = kvi_min_u32(n, kvt_pool_num_free(m->tier[0].pool)); /* the hit's host blocks are pinned */
    memset(map, 0xff, sizeof(map));
    while (k < n && take_owners(m, k, map, now))
        k++;
    n = k;
    if (n == 0)
        return 0;
    const uint8_t *h0 = hashes + (size_t)from * m->hash_len;
    uint32_t *hosts = m->scratch;
    kvi_ofl_host_alloc(m, n, hosts); /* withdraws them: they may be published slots */
    uint32_t tail = kvi_ofl_promo_tail(m, r);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t h = hosts[i];
        for (uint32_t j = 0; j < P; j++) {
            const kvt_remote_loc *l = &m->rloc[(size_t)i * P + j];
            size_t at = (size_t)h * P + j;
            m->rs_peer[at] = map[l->peer];
            m->rs_slot[at] = l->slot;
            m->rs_gen[at] = l->generation;
        }
        memcpy(m->rs_hash + (size_t)h * m->hash_len, h0 + (size_t)i * m->hash_len, m->hash_len);
        kvi_ofl_promo_link(m, r, &tail, h, t, h, 0, i);
    }
    r->dhit_pos[0] += n;
    r->dhit_n += n;
    r->dhit_len += n * m->sched_bs;
    m->tier[t].st.hit_blocks += n;
    m->tier[t].st.hit_tokens += (uint64_t)n * m->sched_bs;
    m->st.remote_hit_blocks += n;
    return n * m->sched_bs;
}

/* ---- the remote tier as a promotion's source ----------------------------------------------- */

static void remote_release(kvt_offload *m, uint32_t t, uint32_t h)
{
    (void)t;
    for (uint32_t j = 0; j < m->rparts; j++)
        m->rpeers[m->rs_peer[(size_t)h * m->rparts + j]].refs--;
}

static uint32_t remote_keys(kvt_offload *m, uint32_t t, uint32_t h)
{
    (void)t;
    kvi_ofl_key_set(m, m->rs_hash + (size_t)h * m->hash_len, 0, m->sched_bs, &m->keys[0]);
    return 1;
}

static void remote_failed(kvt_offload *m, uint32_t t, uint32_t h)
{
    m->tier[t].st.loads_failed++; /* the owner's block: nothing of ours to forget */
    /* an owner that failed a read (dead, stopped, too slow, or its block gone) is not read
     * from again for remote_miss_ms: each try would cost the workers up to timeout_ms */
    if (!m->cfg.remote_miss_ms)
        return;
    uint64_t until = kvt_monotonic_ns() + (uint64_t)m->cfg.remote_miss_ms * 1000000u;
    for (uint32_t j = 0; j < m->rparts; j++) /* which part failed, the workers know */
        m->rpeers[m->rs_peer[(size_t)h * m->rparts + j]].down_ns = until;
}

static int remote_reserve(kvt_offload *m, uint32_t t, kvt_offload_meta *out, uint32_t n)
{
    (void)t;
    for (uint32_t i = 0; i < KVT_REMOTE_MAX_PEERS; i++)
        m->rpeers[i].wire = UINT32_MAX; /* named again in this step's metadata */
    return kvt_offload_meta_reserve_remote(out, KVT_REMOTE_MAX_PEERS, n * m->rparts);
}

static uint32_t remote_emit(kvt_offload *m, uint32_t t, uint32_t h, kvt_offload_meta *out)
{
    kvt_remote_src parts[KVT_REMOTE_MAX_RANKS];
    const uint32_t P = m->rparts;
    for (uint32_t j = 0; j < P; j++) {
        size_t at = (size_t)h * P + j;
        struct kvi_ofl_rpeer *p = &m->rpeers[m->rs_peer[at]];
        if (p->wire == UINT32_MAX) /* room reserved: cannot fail */
            (void)kvt_offload_meta_add_remote_owner(out, p->id.instance, p->id.endpoint,
                                                    p->id.epoch, &p->wire);
        parts[j] =
            (kvt_remote_src){.owner = p->wire, .slot = m->rs_slot[at], .generation = m->rs_gen[at]};
    }
    uint32_t id = 0;
    (void)kvt_offload_meta_add_remote_parts(out, t, P, parts, m->rs_hash + (size_t)h * m->hash_len,
                                            m->hash_len, &id);
    return id;
}

/* The publications and withdrawals since the last step, for the workers to make on their
 * remotes (kvtier/meta.h). Kept until they are in a step's metadata. */
static int remote_step(kvt_offload *m, uint32_t t, kvt_offload_meta *out)
{
    int rc = 0;
    if (!m->pub_n && !m->wd_n && !m->wd_all)
        return 0;
    if (m->wd_all)
        rc = kvt_offload_meta_remote_withdraw_all(out, t, m->hash_len);
    for (uint32_t i = 0; i < m->pub_n && !rc; i++)
        rc = kvt_offload_meta_add_remote_pub(out, t, m->pub_slots[i],
                                             m->pub_hashes + (size_t)i * m->hash_len, m->hash_len);
    for (uint32_t i = 0; i < m->wd_n && !rc; i++)
        rc = kvt_offload_meta_add_remote_withdraw(out, t, m->wd_slots[i], m->hash_len);
    if (!rc)
        m->pub_n = m->wd_n = 0, m->wd_all = false;
    return rc;
}

static bool remote_step_pending(const kvt_offload *m, uint32_t t)
{
    (void)t;
    return m->pub_n || m->wd_n || m->wd_all;
}

/* ---- publish / withdraw -------------------------------------------------------------------- */

static void remote_host_stored(kvt_offload *m, uint32_t t, uint32_t h)
{
    (void)t;
    kvt_pool_key k;
    uint32_t nk = 0;
    if (kvt_pool_block_keys(m->tier[0].pool, h, &k, 1, &nk) || nk == 0)
        return; /* its key is another block's: nothing of its own to publish */
    if (m->rpub[h] || m->pub_n == m->tier[0].nb)
        return;
    m->rpub[h] = 1; /* the workers publish, told by the next step */
    m->pub_slots[m->pub_n] = h;
    memcpy(m->pub_hashes + (size_t)m->pub_n++ * m->hash_len, k.hash, m->hash_len);
}

static void remote_host_reused(kvt_offload *m, uint32_t t, const uint32_t *ids, uint32_t n)
{
    (void)t;
    for (uint32_t i = 0; i < n; i++) /* only what the workers were told to publish */
        if (m->rpub[ids[i]] && m->wd_n < m->tier[0].nb) {
            m->rpub[ids[i]] = 0;
            m->wd_slots[m->wd_n++] = ids[i];
        }
}

static void remote_host_forgotten(kvt_offload *m, uint32_t t)
{
    (void)t;
    memset(m->rpub, 0, m->tier[0].nb);
    m->pub_n = m->wd_n = 0;
    m->wd_all = true;
}

const struct kvi_ofl_src_ops kvi_ofl_remote_src = {.search = remote_search,
                                                   .pin = remote_pin,
                                                   .release = remote_release,
                                                   .keys = remote_keys,
                                                   .failed = remote_failed,
                                                   .reserve = remote_reserve,
                                                   .emit = remote_emit,
                                                   .step = remote_step,
                                                   .step_pending = remote_step_pending,
                                                   .host_stored = remote_host_stored,
                                                   .host_reused = remote_host_reused,
                                                   .host_forgotten = remote_host_forgotten};
