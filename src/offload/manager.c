/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Offload manager: life cycle (config, create, destroy, the tiers' pools and tables, lowering
 * a tier to what the workers have, attaching a node tier). The request table lives in
 * requests.c, the step (build_meta, apply_output, reset) in step.c, metrics in metrics.c,
 * loads in load.c, stores in store.c; the shared state and its invariants are described in
 * offload_internal.h.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "base/config.h"
#include "base/error.h"
#include "base/util.h"
#include "offload/offload_config.h"
#include "offload/offload_internal.h"

#define MAX_EVENTS 65536u

/* ---- life cycle ------------------------------------------------------------------------ */

const kvi_config_table kvi_offload_config_table =
    KVI_CONFIG_TABLE(kvt_offload_config, "offload", KVI_OFFLOAD_CONFIG(KVI_OFFLOAD_CONFIG_ROW));

void kvt_offload_config_init(kvt_offload_config *cfg)
{
    kvi_config_init(&kvi_offload_config_table, cfg);
}

int kvt_offload_size_host(uint64_t capacity_bytes, uint64_t block_bytes, uint32_t *blocks)
{
    if (!blocks || block_bytes == 0)
        return kvt_fail(KVT_EINVAL, "offload: size_host: block_bytes must be positive");
    uint64_t n = capacity_bytes / block_bytes;
    if (n < 2)
        return kvt_fail(KVT_EINVAL,
                        "offload: %" PRIu64 " bytes hold %" PRIu64 " blocks of %" PRIu64
                        " bytes; the host tier needs at least 2 (one is the null block)",
                        capacity_bytes, n, block_bytes);
    *blocks = n > UINT32_MAX - 1 ? UINT32_MAX - 1 : (uint32_t)n;
    return 0;
}

/* The host tier (tier 0), and the host-block arrays of promotions and scratch. */
static int host_setup(kvt_offload *m, uint32_t host_nb)
{
    int rc = kvi_ofl_tier_open(m, 0, host_nb, m->cfg.event_capacity, MAX_EVENTS);
    if (rc)
        return rc;
    m->scratch = malloc((size_t)host_nb * 2 * sizeof(uint32_t));
    m->evict_kh = malloc((size_t)host_nb * sizeof(uint64_t));
    struct kvi_ofl_promos *P = &m->promo;
    uint32_t **arrays[] = {&P->src, &P->next, &P->gpu, &P->idx, &P->evnext, &P->req};
    bool ok = m->scratch && m->evict_kh;
    for (size_t i = 0; i < KVT_ARRAY_LEN(arrays); i++)
        ok &= (*arrays[i] = malloc((size_t)host_nb * sizeof(uint32_t))) != NULL;
    P->grp = calloc(host_nb, 1);
    P->tier = calloc(host_nb, 1);
    P->bad = calloc(host_nb, 1);
    if (!ok || !P->grp || !P->tier || !P->bad)
        return kvt_fail(KVT_ENOMEM, "offload: cannot allocate state for %u host blocks", host_nb);
    for (size_t i = 0; i < KVT_ARRAY_LEN(arrays); i++)
        for (uint32_t h = 0; h < host_nb; h++)
            (*arrays[i])[h] = OFL_NONE;
    return 0;
}

static void host_teardown(kvt_offload *m)
{
    kvi_ofl_tier_close(m, 0);
    free(m->scratch);
    free(m->evict_kh);
    struct kvi_ofl_promos *P = &m->promo;
    uint32_t **arrays[] = {&P->src, &P->next, &P->gpu, &P->idx, &P->evnext, &P->req};
    for (size_t i = 0; i < KVT_ARRAY_LEN(arrays); i++) {
        free(*arrays[i]);
        *arrays[i] = NULL;
    }
    free(P->grp);
    free(P->tier);
    free(P->bad);
    P->grp = P->tier = P->bad = NULL;
    m->scratch = NULL;
}

/* Lazy watermark (vLLM target_free, with the per-sequence term of spec §2.14): GPU blocks at
 * the LRU head that should be safe to evict. */
static uint32_t lazy_target(const kvt_offload *m)
{
    uint64_t t = 0;
    for (uint32_t g = 0; g < m->ng; g++) {
        const kvt_group_spec *s = &m->gcfg.groups[g];
        uint64_t bs = s->block_size;
        if (!kvt_group_kind_cacheable(s->kind))
            continue; /* never stored: no part of the window */
        if (s->kind == KVT_GROUP_MAMBA)
            t += 2;
        else if (s->kind == KVT_GROUP_MAMBA_ALIGN) /* one prefill step can fill this many */
            t += (m->cfg.max_batched_tokens + bs - 1) / bs;
        else if (s->kind == KVT_GROUP_SLIDING)
            t += (s->sliding_window + bs - 1) / bs + 1;
        else /* every running sequence may cross into a new block on top of the budget */
            t += (m->cfg.max_batched_tokens + bs - 1) / bs + m->cfg.max_num_seqs;
    }
    t *= 2; /* 1 + WATERMARK_RATIO (1.0) */
    return t > UINT32_MAX ? UINT32_MAX : (uint32_t)t;
}

/* The rows' bounds (offload/offload_config.h), then what no row can say. */
static int validate_config(const kvt_offload_config *c, const kvt_pool_config *g)
{
    if (kvi_config_check(&kvi_offload_config_table, c))
        return KVT_EINVAL;
    return kvi_ofl_tier_validate(c, g);
}

/* The host-tier search's output per group (a hit of max_model_len tokens at most) and the
 * pool of hit ids: room for several concurrent maximal hits (a hit that does not fit is not
 * offered). */
static int search_setup(kvt_offload *m)
{
    uint32_t search_ids;
    int rc = kvi_ofl_search_out_alloc(m, 0, &search_ids);
    if (rc)
        return rc;
    uint64_t ids = (uint64_t)search_ids * 4 + 1024;
    return kvi_idpool_init(&m->hitpool, ids > UINT32_MAX / 2 ? UINT32_MAX / 2 : (uint32_t)ids);
}

/* The request table and the per-GPU-block state (a load's source and chain, flags). */
static int per_block_setup(kvt_offload *m)
{
    m->reqs = calloc(m->cfg.max_requests, sizeof(*m->reqs));
    m->cursors = calloc((size_t)m->cfg.max_requests * m->ng, sizeof(uint32_t));
    m->gload_src = malloc((size_t)m->gpu_nb * sizeof(uint32_t));
    m->gload_next = malloc((size_t)m->gpu_nb * sizeof(uint32_t));
    m->gflags = calloc(m->gpu_nb, 1);
    uint32_t kmax = kvi_max_u32(m->kpb, m->gcfg.keys_per_block);
    m->keys = malloc((size_t)kmax * sizeof(kvt_pool_key));
    if (!m->reqs || !m->cursors || !m->gload_src || !m->gload_next || !m->gflags || !m->keys)
        return kvt_fail(KVT_ENOMEM, "offload: cannot allocate per-block state");
    return 0;
}

/* Everything but the GPU pool's identity: m->cfg, m->gcfg, m->gpu / m->ext are set. */
static int create_common(kvt_offload *m)
{
    const kvt_offload_config *cfg = &m->cfg;
    m->gpu_nb = m->gcfg.num_blocks;
    m->ng = m->gcfg.n_groups;
    m->hash_len = m->gcfg.hash_len;
    m->sched_bs = m->gcfg.scheduler_block_size;
    m->kpb = cfg->keys_per_block ? cfg->keys_per_block : m->gcfg.keys_per_block;
    m->key_stride = m->hash_len + 2 * sizeof(uint32_t);
    m->target_free = cfg->lazy ? lazy_target(m) : 0;
    m->max_search_tokens = cfg->max_model_len;
    m->loadq_head = m->loadq_tail = m->tier[0].acc_head = m->tier[0].acc_tail = OFL_NONE;
    m->wait_head = OFL_NONE;
    m->promoq_head = m->promoq_tail = OFL_NONE;

    int rc = host_setup(m, cfg->host_blocks);
    if (!rc) { /* partial hash hits: eager mode only (spec §2.14) */
        m->hit_align =
            cfg->lazy ? m->sched_bs : kvt_pool_hit_alignment(m->tier[0].pool, KVT_HIT_PARTIAL);
        m->partial = m->hit_align != m->sched_bs;
    }
    if (!rc)
        rc = kvi_ofl_events_setup(m); /* sized by the host tier, which is only ever lowered */
    if (!rc)
        rc = cfg->disk_blocks ? kvi_ofl_tier_setup(m, 1, "disk", cfg->disk_blocks) : 0;
    if (!rc)
        rc = kvi_ofl_gpu_setup(m);
    if (!rc)
        rc = search_setup(m);
    if (!rc)
        rc = per_block_setup(m);
    if (!rc) { /* re-store queue entries: a GPU block, then (engine pools) its packed key */
        size_t e = sizeof(uint32_t) + (m->ext ? m->key_stride : 0);
        rc = kvi_ring_init(&m->restore, (uint32_t)((e + 3) & ~(size_t)3), m->gpu_nb);
    }
    if (!rc)
        rc = kvi_map_init(&m->req_map, cfg->max_requests);
    if (!rc)
        rc = kvi_ofl_evtable_init(&m->tier[0].loads, kvi_min_u32(m->gpu_nb, MAX_EVENTS));
    if (rc)
        return rc;
    for (uint32_t i = 0; i < m->gpu_nb; i++)
        m->gload_src[i] = m->gload_next[i] = OFL_NONE;
    m->free_req = 0;
    for (uint32_t i = 0; i < cfg->max_requests; i++)
        m->reqs[i].free_next = i + 1 < cfg->max_requests ? i + 1 : OFL_NONE;
    return 0;
}

static int create_finish(kvt_offload *m, kvt_offload **out)
{
    int rc = create_common(m);
    if (rc) {
        kvt_offload_destroy(m);
        return rc;
    }
    *out = m;
    return 0;
}

int kvt_offload_create(const kvt_offload_config *cfg, kvt_pool *gpu, kvt_offload **out)
{
    if (!out)
        return kvt_fail(KVT_EINVAL, "offload: out is NULL");
    *out = NULL;
    if (!cfg)
        return kvt_fail(KVT_EINVAL, "offload: config is NULL");
    if (!gpu)
        return kvt_fail(KVT_EINVAL, "offload: the GPU pool is NULL");
    kvt_pool_config g;
    kvt_pool_get_config(gpu, &g);
    int rc = validate_config(cfg, &g);
    if (rc)
        return rc;
    kvt_offload *m = calloc(1, sizeof(*m));
    if (!m)
        return kvt_fail(KVT_ENOMEM, "offload: out of memory");
    m->cfg = *cfg;
    m->gpu = gpu;
    m->gcfg = g;
    return create_finish(m, out);
}

int kvt_offload_create_ext(const kvt_offload_config *cfg, const kvt_pool_config *gpu_cfg,
                           const kvt_gpu_pool_ops *ops, void *ctx, kvt_offload **out)
{
    if (!out)
        return kvt_fail(KVT_EINVAL, "offload: out is NULL");
    *out = NULL;
    if (!cfg || !gpu_cfg || !ops)
        return kvt_fail(KVT_EINVAL, "offload: config, GPU pool config and ops must not be NULL");
    if (!ops->touch || !ops->free)
        return kvt_fail(KVT_EINVAL, "offload: the GPU pool's touch and free callbacks are "
                                    "required");
    if (cfg->lazy && !ops->lru_scan)
        return kvt_fail(KVT_EINVAL, "offload: lazy mode needs the GPU pool's lru_scan callback");
    kvt_pool_config g = *gpu_cfg;
    int rc = kvt_pool_config_validate(&g, &g.scheduler_block_size);
    if (rc)
        return kvi_fail_wrap(rc, "offload: GPU pool config");
    if ((rc = validate_config(cfg, &g)))
        return rc;
    kvt_offload *m = calloc(1, sizeof(*m));
    if (!m)
        return kvt_fail(KVT_ENOMEM, "offload: out of memory");
    m->cfg = *cfg;
    m->ext = true;
    m->gops = *ops;
    m->gctx = ctx;
    m->gcfg = g;
    return create_finish(m, out);
}

void kvt_offload_destroy(kvt_offload *m)
{
    if (!m)
        return;
    if (m->node)
        kvi_node_unbind(m->node);
    kvi_ofl_chain_host_forgotten(m); /* peers stop reading the host tier before it goes */
    kvi_ofl_remote_teardown(m);
    host_teardown(m);
    kvi_ofl_events_teardown(m);
    kvi_ofl_tier_teardown(m);
    kvi_ofl_gpu_teardown(m);
    for (uint32_t g = 0; g < KVT_MAX_GROUPS; g++)
        free(m->tier[0].search_out[g]);
    kvi_idpool_free(&m->hitpool);
    kvi_map_free(&m->req_map);
    kvi_evtable_free(&m->tier[0].loads);
    free(m->reqs);
    free(m->cursors);
    free(m->gload_src);
    free(m->gload_next);
    free(m->gflags);
    kvi_ring_free(&m->restore);
    free(m->keys);
    free(m);
}

/* The size handshake's second step for tier t: lowered to what every worker has, only before
 * the tier's first transfer and hit. */
static int lower_tier(kvt_offload *m, uint32_t t, uint32_t worker_blocks)
{
    if (t >= KVI_OFL_TIERS)
        return kvt_fail(KVT_ERANGE, "offload: tier %u: at most %u tiers", t, KVI_OFL_TIERS);
    struct kvi_ofl_tier *T = &m->tier[t];
    const char *name = kvi_ofl_tier_name(m, t);
    if (!T->pool)
        return kvt_fail(KVT_ESTATE, "offload: no tier %u (%s)", t,
                        t == 1 ? "disk_blocks is 0" : "kvt_offload_add_tier adds one");
    if (worker_blocks > T->nb)
        return kvt_fail(KVT_EINVAL,
                        "offload: a worker reported %u %s blocks, more than the %u planned; the "
                        "tier is only ever lowered",
                        worker_blocks, name, T->nb);
    if (worker_blocks < 2)
        return kvt_fail(KVT_EINVAL, "offload: a worker has only %u %s blocks (at least 2 needed)",
                        worker_blocks, name);
    if (worker_blocks == T->nb)
        return 0;
    if (t == 0 && m->node)
        return kvt_fail(KVT_EINVAL,
                        "offload: a worker reported %u host blocks; the node tier has %u slots "
                        "(map its data region: kvt_mirror_config.node_name)",
                        worker_blocks, T->nb);
    if (T->transferred || kvt_pool_num_free(T->pool) != T->nb - 1 || T->acc_n)
        return kvt_fail(KVT_ESTATE,
                        "offload: the %s tier can only be resized before its first transfer "
                        "and hit",
                        name);
    if (t == 0) {
        host_teardown(m);
        return host_setup(m, worker_blocks);
    }
    return kvi_ofl_tier_resize(m, t, worker_blocks);
}

int kvt_offload_lower_host_blocks(kvt_offload *m, uint32_t worker_blocks)
{
    return lower_tier(m, 0, worker_blocks);
}

int kvt_offload_lower_disk_blocks(kvt_offload *m, uint32_t worker_slots)
{
    return lower_tier(m, 1, worker_slots);
}

int kvt_offload_lower_tier_blocks(kvt_offload *m, uint32_t tier, uint32_t worker_blocks)
{
    if (!m)
        return kvt_fail(KVT_EINVAL, "offload: lower_tier_blocks: NULL manager");
    return lower_tier(m, tier, worker_blocks);
}

/* A tier's name: 1 to 15 characters of [a-z0-9_], not taken (it labels metrics). */
static int check_tier_name(const kvt_offload *m, const char *name)
{
    size_t n = name ? strlen(name) : 0;
    bool ok = n > 0 && n < KVI_OFL_TIER_NAME;
    for (size_t i = 0; ok && i < n; i++)
        ok = (name[i] >= 'a' && name[i] <= 'z') || (name[i] >= '0' && name[i] <= '9') ||
             name[i] == '_';
    if (!ok)
        return kvt_fail(KVT_EINVAL,
                        "offload: add_tier: name \"%s\" must be 1 to %d characters of a-z, 0-9 "
                        "and _",
                        name ? name : "(null)", KVI_OFL_TIER_NAME - 1);
    for (uint32_t t = 0; t < KVI_OFL_TIERS; t++)
        if ((t == 0 || m->tier[t].pool) && strcmp(kvi_ofl_tier_name(m, t), name) == 0)
            return kvt_fail(KVT_EINVAL, "offload: add_tier: tier %u is already named \"%s\"", t,
                            name);
    return 0;
}

static int add_tier_unlocked(kvt_offload *m, const char *name, uint32_t blocks, uint32_t *index)
{
    uint32_t t = kvi_ofl_ntiers(m);
    int rc = check_tier_name(m, name);
    if (rc)
        return rc;
    if (m->remote)
        return kvt_fail(KVT_ESTATE, "offload: add_tier: the remote tier is last in the chain: "
                                    "add tiers before attaching it");
    if (t >= KVI_OFL_TIERS)
        return kvt_fail(KVT_ENOSPC, "offload: add_tier: %u tiers already (KVT_MAX_TIERS)", t);
    if (blocks < 2 || blocks == UINT32_MAX)
        return kvt_fail(KVT_EINVAL,
                        "offload: add_tier: %u blocks (at least 2, the null block "
                        "included)",
                        blocks);
    for (uint32_t u = 0; u < t; u++)
        if (m->tier[u].transferred || kvt_pool_num_cached(m->tier[u].pool))
            return kvt_fail(KVT_ESTATE,
                            "offload: add_tier: add tiers before the first step (the "
                            "%s tier has been used)",
                            kvi_ofl_tier_name(m, u));
    if ((rc = kvi_ofl_tier_setup(m, t, name, blocks))) {
        kvi_ofl_tier_remove(m, t); /* what it opened */
        return rc;
    }
    if (index)
        *index = t;
    return 0;
}

int kvt_offload_add_tier(kvt_offload *m, const char *name, uint32_t blocks, uint32_t *index)
{
    if (!m)
        return kvt_fail(KVT_EINVAL, "offload: add_tier: NULL manager");
    KVI_OFL_LOCKED(m, add_tier_unlocked(m, name, blocks, index));
}

int kvt_offload_attach_node(kvt_offload *m, kvt_node *node)
{
    if (!m || !node)
        return kvt_fail(KVT_EINVAL, "offload: attach_node: NULL argument");
    if (m->node)
        return kvt_fail(KVT_ESTATE, "offload: a node tier is attached already");
    if (m->cfg.lazy)
        return kvt_fail(KVT_EINVAL, "offload: a node tier needs eager stores (lazy is set): "
                                    "a replica publishes what it stored as it stores it");
    struct kvi_ofl_tier *T = &m->tier[0];
    if (T->transferred || kvt_pool_num_free(T->pool) != T->nb - 1 || T->acc_n ||
        kvt_pool_num_cached(T->pool))
        return kvt_fail(KVT_ESTATE,
                        "offload: attach the node tier before the first step (the host tier "
                        "has been used)");
    int rc = kvi_node_bind(node, T->pool);
    if (rc)
        return kvi_fail_wrap(rc, "offload");
    m->node = node;
    return 0;
}

KVI_GETTER(const kvt_pool *, kvt_offload_host_pool, kvt_offload, tier[0].pool)
