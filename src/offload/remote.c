/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The remote tier behind the host tier (kvt_offload_attach_remote; kvtier/remote.h, issue 23).
 *
 *   hits       match looks the hashes past the host hit up in the directory (one round trip,
 *              only where a disk tier adds nothing) and reads what other instances hold into
 *              host blocks it allocates (withdrawn first: they may be this instance's published
 *              slots); each block read whole and checked gets its key in the host pool (it is a
 *              cached host block from then on), and the prefix read whole joins the request's
 *              host hit, pinned by its allocation, so after_alloc and the GPU load treat it as
 *              any host block. A block that failed is freed without a key: a miss.
 *   publish    a host block whose store completed on every worker (its keys registered) is
 *              published, in one directory round trip per batch of completions.
 *   withdraw   every host block the manager allocates is withdrawn first (nothing to do for
 *              those not published); kvt_offload_reset withdraws all.
 *
 * The bytes never pass through the manager: the remote reads and serves the host tier's own
 * arrays, which is why its worker must live in this process.
 */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/hash.h"
#include "base/log.h"
#include "base/remote_port.h"
#include "base/util.h"
#include "offload/offload_internal.h"

static int attach_unlocked(kvt_offload *m, kvt_remote *remote)
{
    if (!m || !remote)
        return kvt_fail(KVT_EINVAL, "offload: attach_remote: NULL argument");
    if (m->remote)
        return kvt_fail(KVT_ESTATE, "offload: a remote tier is attached already");
    if (m->node)
        return kvt_fail(KVT_EINVAL, "offload: a remote tier beside a node tier is not supported");
    kvi_remote_port *p = kvi_remote_port_of(remote);
    if (p->lent)
        return kvt_fail(KVT_ESTATE, "offload: this remote tier is lent to another manager");
    const kvt_group_spec *g = &m->gcfg.groups[0];
    if (m->ng != 1 || g->kind != KVT_GROUP_FULL || m->gcfg.hash_block_size != g->block_size ||
        m->partial)
        return kvt_fail(KVT_EINVAL,
                        "offload: the remote tier supports one full-attention group whose hash "
                        "block is its block (this manager has %u groups, hash block %u, block %u)",
                        m->ng, m->gcfg.hash_block_size, g->block_size);
    if (p->n_slots != m->tier[0].nb)
        return kvt_fail(KVT_EINVAL,
                        "offload: the remote tier serves %u slots; the host tier has %u blocks "
                        "(its slots must be the host blocks: regions of the host mirror)",
                        p->n_slots, m->tier[0].nb);
    if (p->hash_len != m->hash_len)
        return kvt_fail(KVT_EINVAL, "offload: the remote tier's hash_len %u is not the pool's %u",
                        p->hash_len, m->hash_len);
    m->rloc = malloc(KVT_REMOTE_MAX_READ * sizeof(*m->rloc));
    m->rids = malloc(KVT_REMOTE_MAX_READ * sizeof(*m->rids));
    m->rst = malloc(KVT_REMOTE_MAX_READ * sizeof(*m->rst));
    m->pub_slots = malloc(KVT_REMOTE_MAX_READ * sizeof(*m->pub_slots));
    m->pub_hashes = malloc((size_t)KVT_REMOTE_MAX_READ * m->hash_len);
    m->rmiss = calloc(KVI_OFL_RMISS, sizeof(*m->rmiss));
    if (!m->rloc || !m->rids || !m->rst || !m->pub_slots || !m->pub_hashes || !m->rmiss) {
        kvi_ofl_remote_teardown(m);
        return kvt_fail(KVT_ENOMEM, "offload: attach_remote: out of memory");
    }
    m->pub_n = 0;
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

void kvi_ofl_remote_teardown(kvt_offload *m)
{
    free(m->rloc), free(m->rids), free(m->rst), free(m->pub_slots), free(m->pub_hashes);
    free(m->rmiss);
    m->rloc = NULL, m->rids = NULL, m->rst = NULL, m->pub_slots = NULL, m->pub_hashes = NULL;
    m->rmiss = NULL;
    kvt_remote *r = m->remote;
    const kvi_remote_port *p = m->rport;
    m->remote = NULL;
    m->rport = NULL;
    if (r)
        p->unlend(r); /* may destroy r, if its owner asked for that meanwhile */
}

/* ---- hits ---------------------------------------------------------------------------------- */

uint32_t kvi_ofl_remote_lookup(kvt_offload *m, const uint8_t *hashes, uint32_t n_hashes,
                               uint32_t from, uint32_t max_len)
{
    if (!m->remote || from >= n_hashes)
        return 0;
    uint32_t n = kvi_min_u32(n_hashes - from, max_len / m->sched_bs);
    n = kvi_min_u32(n, kvt_pool_num_free(m->tier[0].pool));
    n = kvi_min_u32(n, KVT_REMOTE_MAX_READ);
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
        if (x->key == key && now < x->until_ns)
            return 0;
    }
    uint32_t hit = 0;
    if (m->rport->lookup(m->remote, h0, n, m->rloc, &hit))
        hit = 0; /* arguments checked above; a failed lookup is a miss */
    if (x && hit == 0)
        *x = (struct kvi_ofl_rmiss){key, now + (uint64_t)m->cfg.remote_miss_ms * 1000000u};
    m->rmiss_last = x, m->rmiss_last_key = key;
    return hit;
}

uint32_t kvi_ofl_remote_fetch(kvt_offload *m, struct kvi_ofl_req *r, const uint8_t *hashes,
                              uint32_t from, uint32_t n)
{
    kvt_pool *hp = m->tier[0].pool;
    const uint8_t *h0 = hashes + (size_t)from * m->hash_len;
    n = kvi_min_u32(n, kvt_pool_num_free(hp)); /* the hit's host blocks are pinned now */
    if (n == 0)
        return 0;
    kvi_ofl_host_alloc(m, n, m->rids); /* withdraws them */
    for (uint32_t i = 0; i < n; i++)
        m->rst[i] = KVT_EIO; /* only what the read says it checked is a hit */
    (void)m->rport->read_slots(m->remote, m->rloc, h0, n, m->rids, m->rst);
    uint32_t prefix = 0;
    bool whole = true;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t h = m->rids[i], b;
        const uint8_t *hash = h0 + (size_t)i * m->hash_len;
        bool ok = m->rst[i] == 0;
        /* a block read whole is a cached host block from now on (unless another block holds
         * its key already) */
        if (ok && kvt_pool_lookup(hp, hash, 0, &b) != 1)
            (void)kvt_pool_insert(hp, h, hash, 0, m->sched_bs);
        whole = whole && ok;
        if (whole) { /* the allocation's reference is the hit's pin */
            (void)kvi_idlist_push(&m->hitpool, &r->hit, h); /* room checked by match */
            prefix++;
        } else {
            (void)kvt_pool_free(hp, &h, 1);
        }
    }
    r->hit_n[0] += prefix;
    m->st.remote_hit_blocks += prefix;
    /* an owner that did not answer in time is not asked for this span again at once: the
     * request is matched again next step, and each try would stall the step timeout_ms */
    for (uint32_t i = 0; i < n && m->rmiss_last; i++)
        if (m->rst[i] == KVT_EIO) {
            *m->rmiss_last = (struct kvi_ofl_rmiss){
                m->rmiss_last_key, kvt_monotonic_ns() + (uint64_t)m->cfg.remote_miss_ms * 1000000u};
            break;
        }
    if (prefix < n)
        KVT_LOG_D("offload: remote tier: %u of %u blocks read whole", prefix, n);
    return prefix * m->sched_bs;
}

/* ---- publish / withdraw -------------------------------------------------------------------- */

void kvi_ofl_remote_publish_flush(kvt_offload *m)
{
    if (!m->remote || !m->pub_n)
        return;
    /* slots in range and hashes present: a failure is counted by the remote, not returned */
    (void)m->rport->publish(m->remote, m->pub_slots, m->pub_hashes, m->pub_n);
    m->pub_n = 0;
}

void kvi_ofl_remote_stored(kvt_offload *m, uint32_t h)
{
    if (!m->remote)
        return;
    kvt_pool_key k;
    uint32_t nk = 0;
    if (kvt_pool_block_keys(m->tier[0].pool, h, &k, 1, &nk) || nk == 0)
        return; /* its key is another block's: nothing of its own to publish */
    m->pub_slots[m->pub_n] = h;
    memcpy(m->pub_hashes + (size_t)m->pub_n * m->hash_len, k.hash, m->hash_len);
    if (++m->pub_n == KVT_REMOTE_MAX_READ)
        kvi_ofl_remote_publish_flush(m);
}

void kvi_ofl_remote_withdraw(kvt_offload *m, const uint32_t *ids, uint32_t n)
{
    if (!m->remote)
        return;
    kvi_ofl_remote_publish_flush(m); /* never publish a block after its withdrawal */
    for (uint32_t i = 0; i < n; i += KVT_REMOTE_MAX_READ)
        (void)m->rport->withdraw(m->remote, ids + i, kvi_min_u32(n - i, KVT_REMOTE_MAX_READ));
}

void kvi_ofl_remote_withdraw_all(kvt_offload *m)
{
    if (!m->remote)
        return;
    kvi_ofl_remote_publish_flush(m);
    for (uint32_t b = 1; b < m->tier[0].nb;) {
        uint32_t n = 0;
        for (; b < m->tier[0].nb && n < KVT_REMOTE_MAX_READ; b++)
            m->rids[n++] = b;
        kvi_ofl_remote_withdraw(m, m->rids, n);
    }
}
