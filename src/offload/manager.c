/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Offload manager: life cycle, the request table, the event tables, step assembly
 * (build_meta, apply_output), reset and metrics. Loads live in load.c, stores in store.c; the
 * shared state and its invariants are described in offload_internal.h.
 *
 * Requests are found by their string id through an open-addressing map from the id's XXH3 to
 * a fixed slot. A slot lives while the request holds anything: a pinned hit, a queued or
 * in-flight load, or an eager registration (while running). Finished requests whose load is
 * still in flight sit on a list that is swept after every step.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/prom.h"
#include "base/hash.h"
#include "base/util.h"
#include "offload/offload_internal.h"

#define MAX_WORLD    65536u
#define MAX_EVENTS   65536u
#define MAX_REQUESTS (1u << 22)

/* ---- event tables ---------------------------------------------------------------------- */

static uint64_t event_hash(int64_t id)
{
    uint64_t z = (uint64_t)id + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    return z ^ (z >> 31);
}

int kvi_ofl_evtable_init(struct kvi_ofl_evtable *t, uint32_t cap)
{
    memset(t, 0, sizeof(*t));
    t->e = calloc(cap, sizeof(*t->e));
    if (!t->e)
        return kvt_fail(KVT_ENOMEM, "offload: cannot allocate %u event entries", cap);
    int rc = kvi_map_init(&t->map, cap);
    if (rc)
        return rc;
    t->cap = cap;
    for (uint32_t i = 0; i < cap; i++)
        t->e[i].free_next = i + 1 < cap ? i + 1 : OFL_NONE;
    t->free_head = 0;
    kvi_ilist_init(&t->active);
    return 0;
}

void kvi_ofl_evtable_free(struct kvi_ofl_evtable *t)
{
    free(t->e);
    kvi_map_free(&t->map);
    memset(t, 0, sizeof(*t));
}

struct kvi_ofl_event *kvi_ofl_evtable_find(const struct kvi_ofl_evtable *t, int64_t id)
{
    uint64_t h = event_hash(id), pos = kvi_map_probe_start(&t->map, h);
    uint32_t idx;
    while (kvi_map_probe_next(&t->map, h, &pos, &idx))
        if (t->e[idx].id == id)
            return &t->e[idx];
    return NULL;
}

struct kvi_ofl_event *kvi_ofl_evtable_add(struct kvi_ofl_evtable *t, int64_t id)
{
    if (t->free_head == OFL_NONE)
        return NULL;
    uint32_t idx = t->free_head;
    struct kvi_ofl_event *e = &t->e[idx];
    t->free_head = e->free_next;
    memset(e, 0, sizeof(*e));
    e->id = id;
    e->head = e->tail = OFL_NONE;
    KVI_ILIST_PUSH_BACK(&t->active, t->e, link, idx);
    (void)kvi_map_insert(&t->map, event_hash(id), idx); /* room for every entry */
    t->n++;
    return e;
}

void kvi_ofl_evtable_remove(struct kvi_ofl_evtable *t, struct kvi_ofl_event *e)
{
    uint32_t idx = kvi_ofl_evtable_index(t, e);
    kvi_map_remove(&t->map, event_hash(e->id), idx);
    KVI_ILIST_REMOVE(&t->active, t->e, link, idx);
    kvi_slot_give(t->e, &t->free_head, sizeof(*t->e), offsetof(struct kvi_ofl_event, free_next),
                  idx);
    t->n--;
}

/* ---- request FIFOs --------------------------------------------------------------------- */

static uint32_t *rq_link(kvt_offload *m, uint32_t slot, size_t link)
{
    return (uint32_t *)((char *)&m->reqs[slot] + link);
}

void kvi_ofl_rq_push(kvt_offload *m, uint32_t *head, uint32_t *tail, size_t link, uint32_t slot)
{
    *rq_link(m, slot, link) = OFL_NONE;
    if (*tail == OFL_NONE)
        *head = slot;
    else
        *rq_link(m, *tail, link) = slot;
    *tail = slot;
}

void kvi_ofl_rq_unlink(kvt_offload *m, uint32_t *head, uint32_t *tail, size_t link, uint32_t slot)
{
    uint32_t prev = OFL_NONE;
    for (uint32_t s = *head; s != OFL_NONE; prev = s, s = *rq_link(m, s, link)) {
        if (s != slot)
            continue;
        uint32_t next = *rq_link(m, s, link);
        if (prev == OFL_NONE)
            *head = next;
        else
            *rq_link(m, prev, link) = next;
        if (*tail == slot)
            *tail = prev;
        return;
    }
}

/* ---- requests -------------------------------------------------------------------------- */

int kvi_ofl_fail_id(const char *id, uint32_t len)
{
    return kvt_fail(KVT_EINVAL, "offload: request id must be 1..%u bytes (got %u%s)",
                    KVT_REQ_ID_MAX, len, id ? "" : ", NULL");
}

struct kvi_ofl_req *kvi_ofl_req_find(const kvt_offload *m, const char *id, uint32_t len)
{
    uint64_t h = kvi_xxh3_64(id, len, 0), pos = kvi_map_probe_start(&m->req_map, h);
    uint32_t slot;
    while (kvi_map_probe_next(&m->req_map, h, &pos, &slot)) {
        struct kvi_ofl_req *r = &m->reqs[slot];
        if (r->id_len == len && memcmp(r->id, id, len) == 0)
            return r;
    }
    return NULL;
}

struct kvi_ofl_req *kvi_ofl_req_get(kvt_offload *m, const char *id, uint32_t len)
{
    struct kvi_ofl_req *r = kvi_ofl_req_find(m, id, len);
    if (r)
        return r;
    if (m->free_req == OFL_NONE) {
        kvt_fail(KVT_ENOSPC, "offload: all %u request slots in use (max_requests)",
                 m->cfg.max_requests);
        return NULL;
    }
    uint32_t slot = m->free_req;
    r = &m->reqs[slot];
    m->free_req = r->free_next;
    memset(r, 0, sizeof(*r));
    memset(kvi_ofl_cursor(m, r), 0, m->ng * sizeof(uint32_t));
    r->used = true;
    r->id_hash = kvi_xxh3_64(id, len, 0);
    r->id_len = len;
    memcpy(r->id, id, len);
    kvi_idlist_init(&r->hit);
    r->load_event = KVT_NO_EVENT;
    r->load_head = r->load_next = r->wait_next = OFL_NONE;
    r->promo_head = r->promo_next = OFL_NONE;
    r->promo_event = KVT_NO_EVENT;
    (void)kvi_map_insert(&m->req_map, r->id_hash, slot); /* room for every slot */
    m->n_reqs++;
    return r;
}

static bool req_busy(const struct kvi_ofl_req *r)
{
    if (r->ctx_refs) /* stores in flight will still name its context */
        return true;
    if (r->flags & (RQ_HIT | RQ_LOAD_QUEUED | RQ_LOAD_SENT | RQ_PROMO_QUEUED | RQ_PROMO_SENT))
        return true;
    return (r->flags & (RQ_EAGER | RQ_FINISHED)) == RQ_EAGER;
}

static void req_free(kvt_offload *m, struct kvi_ofl_req *r)
{
    uint32_t slot = kvi_ofl_req_slot(m, r);
    kvi_ofl_events_req_done(m, r);
    kvi_map_remove(&m->req_map, r->id_hash, slot);
    r->used = false;
    r->free_next = m->free_req;
    m->free_req = slot;
    m->n_reqs--;
}

void kvi_ofl_req_maybe_release(kvt_offload *m, struct kvi_ofl_req *r)
{
    if (req_busy(r)) {
        if ((r->flags & RQ_FINISHED) && !(r->flags & RQ_WAITING)) {
            r->flags |= RQ_WAITING;
            r->wait_next = m->wait_head;
            m->wait_head = kvi_ofl_req_slot(m, r);
        }
        return;
    }
    if (!(r->flags & RQ_WAITING)) /* on the list: the next sweep frees it */
        req_free(m, r);
}

/* Frees the finished requests whose transfers are all done. */
static void sweep_waiting(kvt_offload *m)
{
    uint32_t s = m->wait_head;
    m->wait_head = OFL_NONE;
    while (s != OFL_NONE) {
        struct kvi_ofl_req *r = &m->reqs[s];
        s = r->wait_next;
        r->flags &= ~RQ_WAITING;
        kvi_ofl_req_maybe_release(m, r);
    }
}

int kvi_ofl_check_span(const kvt_offload *m, const uint32_t *const *blocks,
                       const uint32_t *n_blocks, const uint32_t *from, uint32_t end_tokens,
                       const char *what, bool *any)
{
    if (!blocks || !n_blocks)
        return kvt_fail(KVT_EINVAL, "offload: %s: NULL block table", what);
    bool found = false;
    for (uint32_t g = 0; g < m->ng; g++) {
        uint32_t start = from ? from[g] : 0, end = end_tokens / m->gcfg.groups[g].block_size;
        if (end > n_blocks[g])
            end = n_blocks[g];
        if (end <= start)
            continue;
        found = true;
        if (!blocks[g])
            return kvt_fail(KVT_EINVAL, "offload: %s: group %u has %u blocks but no list", what, g,
                            n_blocks[g]);
        for (uint32_t j = start; j < end; j++)
            if (blocks[g][j] >= m->gpu_nb)
                return kvt_fail(KVT_ERANGE,
                                "offload: %s: group %u block %u is GPU block %u, out "
                                "of range (GPU pool has %u blocks)",
                                what, g, j, blocks[g][j], m->gpu_nb);
    }
    if (any)
        *any = found;
    return 0;
}

/* ---- life cycle ------------------------------------------------------------------------ */

void kvt_offload_config_init(kvt_offload_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->world_size = 1;
    cfg->max_requests = 4096;
    cfg->max_batched_tokens = 8192;
    cfg->restore_budget = 256;
    cfg->max_model_len = 1u << 20;
    cfg->remote_miss_ms = 1000;
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

static const char *const g_tier_names[KVI_OFL_TIERS] = {"host", "disk"};

const char *kvi_ofl_tier_name(uint32_t t)
{
    return t < KVI_OFL_TIERS ? g_tier_names[t] : "?";
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
        snprintf(what, sizeof(what), "offload: %s pool", kvi_ofl_tier_name(t));
        return kvi_fail_wrap(rc, what);
    }
    T->nb = nb;
    T->store_src = malloc((size_t)nb * sizeof(uint32_t));
    T->store_next = malloc((size_t)nb * sizeof(uint32_t));
    T->keys = malloc((size_t)nb * m->kpb * m->key_stride);
    T->keys_n = calloc(nb, 1);
    if (!T->store_src || !T->store_next || !T->keys || !T->keys_n)
        return kvt_fail(KVT_ENOMEM, "offload: cannot allocate state for %u %s blocks", nb,
                        kvi_ofl_tier_name(t));
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
    kvi_ofl_evtable_free(&T->stores);
    T->pool = NULL;
    T->store_src = T->store_next = NULL;
    T->keys = T->keys_n = NULL;
    T->nb = 0;
}

/* The host tier (tier 0), and the host-block arrays of promotions and scratch. */
static int host_setup(kvt_offload *m, uint32_t host_nb)
{
    int rc = kvi_ofl_tier_open(m, 0, host_nb, m->cfg.event_capacity, MAX_EVENTS);
    if (rc)
        return rc;
    m->scratch = malloc((size_t)host_nb * 2 * sizeof(uint32_t));
    m->evict_kh = malloc((size_t)host_nb * sizeof(uint64_t));
    m->hpromo_src = malloc((size_t)host_nb * sizeof(uint32_t));
    m->hpromo_next = malloc((size_t)host_nb * sizeof(uint32_t));
    m->hpromo_gpu = malloc((size_t)host_nb * sizeof(uint32_t));
    m->hpromo_idx = calloc(host_nb, sizeof(uint32_t));
    m->hpromo_grp = calloc(host_nb, 1);
    if (!m->scratch || !m->evict_kh || !m->hpromo_src || !m->hpromo_next || !m->hpromo_gpu ||
        !m->hpromo_idx || !m->hpromo_grp)
        return kvt_fail(KVT_ENOMEM, "offload: cannot allocate state for %u host blocks", host_nb);
    for (uint32_t i = 0; i < host_nb; i++)
        m->hpromo_src[i] = m->hpromo_next[i] = m->hpromo_gpu[i] = OFL_NONE;
    return 0;
}

static void host_teardown(kvt_offload *m)
{
    kvi_ofl_tier_close(m, 0);
    free(m->scratch);
    free(m->evict_kh);
    free(m->hpromo_src);
    free(m->hpromo_next);
    free(m->hpromo_gpu);
    free(m->hpromo_idx);
    free(m->hpromo_grp);
    m->scratch = NULL;
    m->hpromo_src = m->hpromo_next = m->hpromo_gpu = m->hpromo_idx = NULL;
    m->hpromo_grp = NULL;
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

static int validate_config(const kvt_offload_config *c, const kvt_pool_config *g)
{
    if (kvi_check_reserved(c->reserved, sizeof(c->reserved), "offload config"))
        return KVT_EINVAL;
    if (c->host_blocks < 2 || c->host_blocks == UINT32_MAX)
        return kvt_fail(KVT_EINVAL,
                        "offload: host_blocks %u must be at least 2 (see "
                        "kvt_offload_size_host)",
                        c->host_blocks);
    if (c->world_size < 1 || c->world_size > MAX_WORLD)
        return kvt_fail(KVT_EINVAL, "offload: world_size %u must be in 1..%u", c->world_size,
                        MAX_WORLD);
    if (c->max_requests < 1 || c->max_requests > MAX_REQUESTS)
        return kvt_fail(KVT_EINVAL, "offload: max_requests %u must be in 1..%u", c->max_requests,
                        MAX_REQUESTS);
    if (c->max_model_len < 1)
        return kvt_fail(KVT_EINVAL, "offload: max_model_len must be positive");
    if (c->keys_per_block > 64)
        return kvt_fail(KVT_EINVAL, "offload: keys_per_block %u exceeds 64", c->keys_per_block);
    return kvi_ofl_tier_validate(c, g);
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
    m->promoq_head = m->promoq_tail = m->tier[1].acc_head = m->tier[1].acc_tail = OFL_NONE;

    int rc = host_setup(m, cfg->host_blocks);
    if (!rc) { /* partial hash hits: eager mode only (spec §2.14) */
        m->hit_align =
            cfg->lazy ? m->sched_bs : kvt_pool_hit_alignment(m->tier[0].pool, KVT_HIT_PARTIAL);
        m->partial = m->hit_align != m->sched_bs;
    }
    if (!rc)
        rc = kvi_ofl_events_setup(m); /* sized by the host tier, which is only ever lowered */
    if (!rc)
        rc = kvi_ofl_tier_setup(m, cfg->disk_blocks);
    if (!rc)
        rc = kvi_ofl_gpu_setup(m);
    uint32_t search_ids = 0;
    for (uint32_t g = 0; g < m->ng && !rc; g++) {
        uint32_t n = cfg->max_model_len / m->gcfg.groups[g].block_size + 1;
        m->tier[0].search_out[g] = malloc((size_t)n * sizeof(uint32_t));
        if (!m->tier[0].search_out[g])
            rc = kvt_fail(KVT_ENOMEM, "offload: cannot allocate search buffers");
        search_ids += n;
    }
    if (!rc) {
        /* room for several concurrent maximal hits; a hit that does not fit is not offered */
        uint64_t ids = (uint64_t)search_ids * 4 + 1024;
        rc = kvi_idpool_init(&m->hitpool, ids > UINT32_MAX / 2 ? UINT32_MAX / 2 : (uint32_t)ids);
    }
    if (!rc) {
        m->reqs = calloc(cfg->max_requests, sizeof(*m->reqs));
        m->cursors = calloc((size_t)cfg->max_requests * m->ng, sizeof(uint32_t));
        m->gload_src = malloc((size_t)m->gpu_nb * sizeof(uint32_t));
        m->gload_next = malloc((size_t)m->gpu_nb * sizeof(uint32_t));
        m->gflags = calloc(m->gpu_nb, 1);
        uint32_t kmax = kvi_max_u32(m->kpb, m->gcfg.keys_per_block);
        m->keys = malloc((size_t)kmax * sizeof(kvt_pool_key));
        if (!m->reqs || !m->cursors || !m->gload_src || !m->gload_next || !m->gflags || !m->keys)
            rc = kvt_fail(KVT_ENOMEM, "offload: cannot allocate per-block state");
    }
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
    kvi_ofl_remote_withdraw_all(m); /* peers stop reading the host tier before it goes */
    kvi_ofl_remote_teardown(m);
    host_teardown(m);
    kvi_ofl_events_teardown(m);
    kvi_ofl_tier_teardown(m);
    kvi_ofl_gpu_teardown(m);
    for (uint32_t g = 0; g < KVT_MAX_GROUPS; g++)
        free(m->tier[0].search_out[g]);
    kvi_idpool_free(&m->hitpool);
    kvi_map_free(&m->req_map);
    kvi_ofl_evtable_free(&m->tier[0].loads);
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
    struct kvi_ofl_tier *T = &m->tier[t];
    const char *name = kvi_ofl_tier_name(t);
    if (!T->pool)
        return kvt_fail(KVT_ESTATE, "offload: no %s tier (disk_blocks is 0)", name);
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
    kvi_ofl_tier_teardown(m);
    return kvi_ofl_tier_setup(m, worker_blocks);
}

int kvt_offload_lower_host_blocks(kvt_offload *m, uint32_t worker_blocks)
{
    return lower_tier(m, 0, worker_blocks);
}

int kvt_offload_lower_disk_blocks(kvt_offload *m, uint32_t worker_slots)
{
    return lower_tier(m, 1, worker_slots);
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
    if (m->tier[1].pool)
        return kvt_fail(KVT_EUNSUPPORTED,
                        "offload: a node tier with a disk tier behind it is not supported");
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

const kvt_pool *kvt_offload_host_pool(const kvt_offload *m)
{
    return m->tier[0].pool;
}

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
    sweep_waiting(m);
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
    sweep_waiting(m);
    kvi_ofl_gpu_flush(m);
    return 0;
}

int kvt_offload_apply_output(kvt_offload *m, const kvt_str *finished_loads, uint32_t n,
                             const kvt_offload_worker_meta *stores)
{
    KVI_OFL_LOCKED(m, apply_output_unlocked(m, finished_loads, n, stores));
}

static int reset_unlocked(kvt_offload *m)
{
    kvi_ofl_gpu_flush(m); /* pins a deferred schedule left */
    /* 1. In-flight stores are abandoned: their blocks will be freed, never cached. */
    for (uint32_t i = m->tier[0].stores.active.head; i != OFL_NONE;
         i = m->tier[0].stores.e[i].link.next) {
        struct kvi_ofl_event *e = &m->tier[0].stores.e[i];
        if (e->abandoned)
            continue;
        e->abandoned = true;
        for (uint32_t h = e->head; h != OFL_NONE; h = m->tier[0].store_next[h])
            m->gflags[m->tier[0].store_src[h]] &= (uint8_t)~G_STORING;
    }
    kvi_ofl_tier_abandon(m); /* write-backs and promotions in flight, queued write-backs */
    /* 2. Stores queued for the next event and re-stores are dropped. */
    kvi_ofl_release_accumulator(m, 0);
    for (uint32_t i = 0; i < kvi_ring_len(&m->restore); i++) {
        uint32_t gpu;
        memcpy(&gpu, kvi_ring_at(&m->restore, i), sizeof(gpu));
        m->gflags[gpu] &= (uint8_t)~G_RESTORE;
    }
    kvi_ring_clear(&m->restore);
    /* 3. Requests forget their eager registration; loads never sent are cancelled, sent ones
     *    keep their pins until the workers report them and then clean up as usual. */
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
    sweep_waiting(m);
    kvi_ofl_gpu_flush(m);
    uint32_t disk_events = m->tier[1].pool ? m->tier[1].stores.n + m->tier[1].loads.n : 0;
    if (m->tier[0].stores.n || m->tier[0].loads.n || disk_events)
        return kvt_fail(KVT_EBUSY,
                        "offload: reset: %u store, %u load and %u disk events still in flight",
                        m->tier[0].stores.n, m->tier[0].loads.n, disk_events);
    int rc = kvt_pool_reset_prefix_cache(m->tier[0].pool);
    if (!rc && m->tier[1].pool)
        rc = kvt_pool_reset_prefix_cache(m->tier[1].pool);
    if (rc)
        return kvi_fail_wrap(KVT_EBUSY, m->node ? "offload: reset: hits are still pinned, or "
                                                  "peers of the node tier read this replica's "
                                                  "slots"
                                                : "offload: reset: hits are still pinned");
    kvi_ofl_remote_withdraw_all(m);
    m->st.resets++;
    return 0;
}

int kvt_offload_reset(kvt_offload *m)
{
    KVI_OFL_LOCKED(m, reset_unlocked(m));
}

bool kvt_offload_has_pending(const kvt_offload *m)
{
    return m->tier[0].loads.n || m->tier[0].stores.n || m->tier[0].acc_n ||
           m->loadq_head != OFL_NONE || kvi_ofl_tier_pending(m);
}

/* ---- metrics --------------------------------------------------------------------------- */

void kvt_offload_get_stats(const kvt_offload *m, kvt_offload_stats *s)
{
    if (!m || !s) { /* an object that failed to be created reads as all zero */
        if (s)
            memset(s, 0, sizeof(*s));
        return;
    }
    *s = m->st;
    kvt_tier_stats h, d;
    (void)kvt_offload_get_tier_stats(m, 0, &h);
    (void)kvt_offload_get_tier_stats(m, 1, &d); /* all zero with two tiers */
    s->hit_blocks = h.hit_blocks;
    s->load_events = h.load_events;
    s->store_events = h.store_events;
    s->store_blocks = h.store_blocks;
    s->stores_completed = h.stores_completed;
    s->stores_failed = h.stores_failed;
    s->stores_abandoned = h.stores_abandoned;
    s->store_skipped_cached = h.store_skipped_cached;
    s->store_dropped_full = h.store_dropped;
    s->host_evictions = h.evictions;
    s->host_blocks = h.blocks;
    s->host_used_blocks = h.used_blocks;
    s->host_cached_blocks = h.cached_blocks;
    s->load_events_in_flight = h.load_events_in_flight;
    s->store_events_in_flight = h.store_events_in_flight;
    s->disk_hit_blocks = d.hit_blocks;
    s->disk_hit_tokens = d.hit_tokens;
    s->disk_load_events = d.load_events;
    s->disk_store_events = d.store_events;
    s->disk_store_blocks = d.store_blocks;
    s->disk_stores_completed = d.stores_completed;
    s->disk_stores_failed = d.stores_failed;
    s->disk_stores_abandoned = d.stores_abandoned;
    s->disk_store_skipped_cached = d.store_skipped_cached;
    s->disk_store_dropped = d.store_dropped;
    s->disk_evictions = d.evictions;
    s->disk_blocks = d.blocks;
    s->disk_used_blocks = d.used_blocks;
    s->disk_cached_blocks = d.cached_blocks;
    s->disk_load_events_in_flight = d.load_events_in_flight;
    s->disk_store_events_in_flight = d.store_events_in_flight;
    s->requests = m->n_reqs;
    uint32_t pending = m->tier[0].acc_n;
    for (uint32_t i = m->tier[0].stores.active.head; i != OFL_NONE;
         i = m->tier[0].stores.e[i].link.next)
        pending += m->tier[0].stores.e[i].n;
    s->pending_store_blocks = pending;
}

uint32_t kvt_offload_hit_alignment(const kvt_offload *m)
{
    return m ? m->hit_align : 0;
}

uint32_t kvt_offload_lazy_window(const kvt_offload *m)
{
    return m ? m->target_free : 0;
}

uint32_t kvt_offload_num_tiers(const kvt_offload *m)
{
    uint32_t n = 0;
    for (uint32_t t = 0; m && t < KVI_OFL_TIERS; t++)
        if (m->tier[t].pool)
            n = t + 1; /* tiers are consecutive: tier t exists only behind tier t - 1 */
    return n;
}

int kvt_offload_get_tier_stats(const kvt_offload *m, uint32_t tier, kvt_tier_stats *out)
{
    if (!out)
        return kvt_fail(KVT_EINVAL, "offload: get_tier_stats: NULL output");
    memset(out, 0, sizeof(*out));
    if (tier >= KVI_OFL_TIERS || tier >= kvt_offload_num_tiers(m))
        return kvt_fail(KVT_ERANGE, "offload: tier %u of %u", tier, kvt_offload_num_tiers(m));
    const struct kvi_ofl_tier *T = &m->tier[tier];
    out->name = kvi_ofl_tier_name(tier);
    out->hit_blocks = T->st.hit_blocks;
    /* a hit's tokens are counted once, by the tier that serves them: the host's are what the
     * tiers behind it did not serve */
    out->hit_tokens = tier == 0 ? m->st.hit_tokens : T->st.hit_tokens;
    for (uint32_t t = 1; tier == 0 && t < KVI_OFL_TIERS; t++)
        out->hit_tokens -= m->tier[t].st.hit_tokens;
    out->load_events = T->st.load_events;
    out->store_events = T->st.store_events;
    out->store_blocks = T->st.store_blocks;
    out->stores_completed = T->st.stores_completed;
    out->stores_failed = T->st.stores_failed;
    out->stores_abandoned = T->st.stores_abandoned;
    out->store_skipped_cached = T->st.store_skipped_cached;
    out->store_dropped = T->st.store_dropped;
    out->evictions = T->st.evictions;
    out->blocks = T->nb - 1;
    out->used_blocks = T->nb - 1 - kvt_pool_num_free(T->pool);
    out->cached_blocks = kvt_pool_num_cached(T->pool);
    out->load_events_in_flight = T->loads.n;
    out->store_events_in_flight = T->stores.n;
    return 0;
}

int kvt_offload_prometheus(const kvt_offload *m, char *buf, size_t cap, size_t *len)
{
    if (!len || (cap && !buf))
        return kvt_fail(KVT_EINVAL, "offload: prometheus: NULL argument");
    kvt_offload_stats s;
    kvt_offload_get_stats(m, &s);
    kvi_prom p = {buf, cap, 0};
    const struct {
        const char *name, *help;
        uint64_t v;
        bool gauge;
    } metrics[] = {
        {"lookups_total", "Host-tier searches by match.", s.lookups, false},
        {"lookup_tokens_total", "Tokens those searches could have hit.", s.lookup_tokens, false},
        {"hit_tokens_total", "Tokens hit in the host tier.", s.hit_tokens, false},
        {"hit_blocks_total", "Host blocks pinned by hits.", s.hit_blocks, false},
        {"miss_tokens_total", "Searchable tokens the host tier did not have.", s.miss_tokens,
         false},
        {"miss_blocks_total", "Missed scheduler blocks.", s.miss_blocks, false},
        {"hits_dropped_total", "Hits not offered for lack of room.", s.hits_dropped, false},
        {"lookups_misaligned_total",
         "Matches whose GPU hit ended inside a scheduler block (a miss, no lookup).",
         s.lookups_misaligned, false},
        {"lookups_skipped_total", "Matches of requests that reuse no cached prefix (no lookup).",
         s.lookups_skipped, false},
        {"boundary_states_total", "Mamba align: handed-over states selected for a store.",
         s.boundary_states, false},
        {"boundary_dropped_gone_total",
         "Mamba align: handed-over states dropped because their request was gone.",
         s.boundary_dropped_gone, false},
        {"partial_hits_total", "Host-tier hits that end inside a scheduler block.", s.partial_hits,
         false},
        {"remote_hit_blocks_total", "Blocks read from the remote tier into hits.",
         s.remote_hit_blocks, false},
        {"partial_tails_total",
         "Partly filled full-attention blocks stored at request finish (partial hash hits).",
         s.partial_tails, false},
        {"store_recovered_null_total",
         "Nulled table entries found in the GPU pool by their hash and stored.",
         s.store_recovered_null, false},
        {"untracked_requests_total", "Eager requests not registered: request table full.",
         s.untracked_requests, false},
        {"load_events_total", "Load events issued.", s.load_events, false},
        {"load_blocks_total", "Blocks in issued load events.", s.load_blocks, false},
        {"loads_completed_total", "Blocks whose load completed.", s.loads_completed, false},
        {"store_events_total", "Store events issued.", s.store_events, false},
        {"store_blocks_total", "Blocks in issued store events.", s.store_blocks, false},
        {"stores_completed_total", "Blocks made findable in the host tier.", s.stores_completed,
         false},
        {"stores_abandoned_total", "Blocks whose store completed after a reset.",
         s.stores_abandoned, false},
        {"stores_failed_total", "Blocks of store events a worker could not write (not cached).",
         s.stores_failed, false},
        {"restores_total", "Blocks re-stored after a host-tier eviction.", s.restores, false},
        {"restores_dropped_hot_total",
         "Re-stores given up because they would have evicted a block in use on the GPU.",
         s.restores_dropped_hot, false},
        {"host_evictions_total", "Cached host blocks reused for new stores.", s.host_evictions,
         false},
        {"stale_reports_total", "Store reports for completed or abandoned events.", s.stale_reports,
         false},
        {"loaded_bytes_total", "Bytes loaded (blocks x block_bytes).", s.bytes_loaded, false},
        {"stored_bytes_total", "Bytes stored (blocks x block_bytes).", s.bytes_stored, false},
        {"resets_total", "Successful resets.", s.resets, false},
        {"host_blocks", "Usable host-tier blocks.", s.host_blocks, true},
        {"host_used_blocks", "Host blocks pinned by hits or transfers.", s.host_used_blocks, true},
        {"host_cached_blocks", "Host blocks that can be hit.", s.host_cached_blocks, true},
        {"requests", "Requests tracked.", s.requests, true},
        {"load_events_in_flight", "Load events not yet completed.", s.load_events_in_flight, true},
        {"store_events_in_flight", "Store events not yet completed.", s.store_events_in_flight,
         true},
        {"pending_store_blocks", "Blocks queued or in flight to the host tier.",
         s.pending_store_blocks, true},
    };
    const struct {
        const char *name, *help;
        uint64_t v;
        bool gauge;
    } disk_metrics[] = {
        {"disk_hit_tokens_total", "Tokens of hits served from the disk tier.", s.disk_hit_tokens,
         false},
        {"disk_hit_blocks_total", "Disk slots pinned by hits.", s.disk_hit_blocks, false},
        {"promotions_total", "Blocks promoted from disk to host.", s.promotions, false},
        {"promotions_failed_total", "Blocks whose promotion failed (reported invalid).",
         s.promotions_failed, false},
        {"disk_load_events_total", "Promotion events issued.", s.disk_load_events, false},
        {"disk_store_events_total", "Write-back events issued.", s.disk_store_events, false},
        {"disk_store_blocks_total", "Blocks in write-back events.", s.disk_store_blocks, false},
        {"disk_stores_completed_total", "Blocks made findable on disk.", s.disk_stores_completed,
         false},
        {"disk_stores_failed_total", "Write-back blocks a worker could not write.",
         s.disk_stores_failed, false},
        {"disk_stores_abandoned_total", "Write-backs completed after a reset.",
         s.disk_stores_abandoned, false},
        {"disk_store_skipped_cached_total", "Blocks not written back: already on disk.",
         s.disk_store_skipped_cached, false},
        {"disk_store_dropped_total", "Blocks not written back: no free slot or event room.",
         s.disk_store_dropped, false},
        {"disk_evictions_total", "Cached disk slots reused.", s.disk_evictions, false},
        {"disk_blocks", "Usable disk-tier slots (0: two tiers).", s.disk_blocks, true},
        {"disk_used_blocks", "Disk slots pinned by hits or transfers.", s.disk_used_blocks, true},
        {"disk_cached_blocks", "Disk slots that can be hit.", s.disk_cached_blocks, true},
        {"disk_load_events_in_flight", "Promotion events not yet completed.",
         s.disk_load_events_in_flight, true},
        {"disk_store_events_in_flight", "Write-back events not yet completed.",
         s.disk_store_events_in_flight, true},
    };
    for (size_t i = 0; i < KVT_ARRAY_LEN(metrics); i++)
        kvi_prom_metric(&p, "kvtier_offload", metrics[i].name, metrics[i].help, metrics[i].gauge,
                        metrics[i].v);
    for (size_t i = 0; m->tier[1].pool && i < KVT_ARRAY_LEN(disk_metrics);
         i++) /* three tiers only */
        kvi_prom_metric(&p, "kvtier_offload", disk_metrics[i].name, disk_metrics[i].help,
                        disk_metrics[i].gauge, disk_metrics[i].v);
        /* Every tier's figures, with a tier label, for dashboards that sum or compare tiers (the
         * unlabelled families above stay for existing scrapes). */
#define TIER_FIELD(f, name, help, gauge)                                                           \
    {                                                                                              \
        name, help, offsetof(kvt_tier_stats, f), sizeof(((kvt_tier_stats *)0)->f), gauge           \
    }
    static const struct {
        const char *name, *help;
        size_t off, size;
        bool gauge;
    } tf[] = {
        TIER_FIELD(blocks, "tier_blocks", "Usable blocks per tier.", true),
        TIER_FIELD(used_blocks, "tier_used_blocks", "Blocks pinned by hits or transfers per tier.",
                   true),
        TIER_FIELD(cached_blocks, "tier_cached_blocks", "Blocks that can be hit per tier.", true),
        TIER_FIELD(load_events_in_flight, "tier_load_events_in_flight",
                   "Load events out of the tier not yet completed.", true),
        TIER_FIELD(store_events_in_flight, "tier_store_events_in_flight",
                   "Store events into the tier not yet completed.", true),
        TIER_FIELD(hit_blocks, "tier_hit_blocks_total", "Blocks pinned by hits per tier.", false),
        TIER_FIELD(hit_tokens, "tier_hit_tokens_total", "Tokens of hits served by the tier.",
                   false),
        TIER_FIELD(load_events, "tier_load_events_total", "Load events out of the tier issued.",
                   false),
        TIER_FIELD(store_events, "tier_store_events_total", "Store events into the tier issued.",
                   false),
        TIER_FIELD(store_blocks, "tier_store_blocks_total", "Blocks in those store events.", false),
        TIER_FIELD(stores_completed, "tier_stores_completed_total",
                   "Blocks made findable in the tier.", false),
        TIER_FIELD(stores_failed, "tier_stores_failed_total",
                   "Blocks of store events a worker could not write.", false),
        TIER_FIELD(stores_abandoned, "tier_stores_abandoned_total",
                   "Blocks whose store completed after a reset.", false),
        TIER_FIELD(store_skipped_cached, "tier_store_skipped_cached_total",
                   "Blocks not stored: already in the tier.", false),
        TIER_FIELD(store_dropped, "tier_store_dropped_total",
                   "Blocks not stored: no free block or event room.", false),
        TIER_FIELD(evictions, "tier_evictions_total", "Cached blocks reused for new ones per tier.",
                   false),
    };
#undef TIER_FIELD
    kvt_tier_stats ts[KVT_MAX_TIERS];
    uint32_t n_tiers = kvt_offload_num_tiers(m);
    for (uint32_t t = 0; t < n_tiers && t < KVT_MAX_TIERS; t++)
        (void)kvt_offload_get_tier_stats(m, t, &ts[t]);
    for (size_t i = 0; i < KVT_ARRAY_LEN(tf); i++) {
        kvi_prom_family(&p, "kvtier_offload", tf[i].name, tf[i].help, tf[i].gauge);
        for (uint32_t t = 0; t < n_tiers && t < KVT_MAX_TIERS; t++) {
            const char *f = (const char *)&ts[t] + tf[i].off;
            uint64_t v;
            if (tf[i].size == sizeof(uint64_t)) {
                memcpy(&v, f, sizeof(v));
            } else {
                uint32_t v32;
                memcpy(&v32, f, sizeof(v32));
                v = v32;
            }
            kvi_prom_sample(&p, "kvtier_offload", tf[i].name, "tier", ts[t].name, v);
        }
    }
    const struct {
        const char *reason;
        uint64_t v;
    } skipped[] = {
        {"already_cached", s.store_skipped_cached}, {"in_flight", s.store_skipped_in_flight},
        {"not_hashed", s.store_skipped_unhashed},   {"null_block", s.store_skipped_null},
        {"host_full", s.store_dropped_full},
    };
    kvi_prom_family(&p, "kvtier_offload", "store_skipped_blocks_total",
                    "Blocks not stored, by reason.", false);
    for (size_t i = 0; i < KVT_ARRAY_LEN(skipped); i++)
        kvi_prom_sample(&p, "kvtier_offload", "store_skipped_blocks_total", "reason",
                        skipped[i].reason, skipped[i].v);
    return kvi_prom_finish(&p, len, "offload");
}
