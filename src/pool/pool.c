/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Block pool: reference counts, the LRU free queue, the multi-key prefix-hash index and cache
 * events. The public header states the semantics (vLLM BlockPool); this file keeps three
 * invariants that every function preserves:
 *
 *   1. A non-null block is in the free queue exactly when its ref count is zero; n_free is the
 *      queue's length. The null block is never in the queue and its count never changes. In a
 *      node's shared pool (pool_share.h) this holds for owned blocks; peer blocks are never in
 *      the queue.
 *   2. Every key of a block is one entry on that block's chain and one slot in the map; the
 *      map holds nothing else. n_cached counts blocks whose chain is non-empty.
 *   3. Entries are preallocated for (num_blocks - 1) * keys_per_block keys, and a block never
 *      carries more than keys_per_block, so an insert never runs out of entries or map slots.
 *
 * Every public call validates all of its input first and only then mutates, so an error leaves
 * the pool unchanged. The one two-pass exception, kvt_pool_free, undoes its first pass before
 * failing.
 */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/util.h"
#include "pool/pool_internal.h"
#include "pool/pool_share.h"

#define MAX_KEYS_PER_BLOCK 64u

void kvt_pool_config_init(kvt_pool_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->hash_len = KVT_BLOCK_HASH_LEN;
    cfg->keys_per_block = 1;
    cfg->hash_block_size = 16;
    cfg->n_groups = 1;
    cfg->groups[0].kind = KVT_GROUP_FULL;
    cfg->groups[0].block_size = 16;
}

static uint32_t cp_size(uint32_t n)
{
    return n ? n : 1;
}

/* Context parallelism, upstream's rules: attention blocks are spread over the decode ranks
 * (their effective block size is a multiple of dcp), Mamba states are whole on every rank;
 * decode context parallelism takes full attention and Mamba groups (and groups that are never
 * cached), prefill context parallelism full attention only. */
static int validate_cp(const kvt_pool_config *c)
{
    uint32_t dcp = cp_size(c->dcp_world_size), pcp = cp_size(c->pcp_world_size);
    if (dcp > 1024 || pcp > 1024)
        return kvt_fail(KVT_EINVAL, "pool: context-parallel sizes dcp %u, pcp %u (1..1024)", dcp,
                        pcp);
    if (dcp == 1 && pcp == 1)
        return 0;
    for (uint32_t g = 0; g < c->n_groups; g++) {
        uint32_t kind = c->groups[g].kind, bs = c->groups[g].block_size;
        if (!kvt_group_kind_cacheable(kind))
            continue;
        bool mamba = kind == KVT_GROUP_MAMBA || kind == KVT_GROUP_MAMBA_ALIGN;
        if ((pcp > 1 && kind != KVT_GROUP_FULL) || (dcp > 1 && kind == KVT_GROUP_SLIDING))
            return kvt_fail(KVT_EINVAL,
                            "pool: group %u (kind %u) cannot be used with %s context parallelism "
                            "(%s)",
                            g, kind, pcp > 1 ? "prefill" : "decode",
                            pcp > 1 ? "full attention only" : "full attention and Mamba only");
        if (!mamba && bs % dcp != 0)
            return kvt_fail(KVT_EINVAL,
                            "pool: group %u block_size %u is not a multiple of dcp_world_size %u "
                            "(give the effective block size)",
                            g, bs, dcp);
    }
    return 0;
}

/* Every group's kind and block size; *lcm receives the least common multiple of the
 * prefix-cacheable groups' block sizes (at least one group must be). */
static int validate_groups(const kvt_pool_config *c, uint64_t *lcm)
{
    uint32_t cacheable = 0;
    for (uint32_t g = 0; g < c->n_groups; g++) {
        const kvt_group_spec *s = &c->groups[g];
        if (s->kind > KVT_GROUP_MAMBA_ALIGN)
            return kvt_fail(KVT_EINVAL, "pool: group %u has unknown kind %u", g, s->kind);
        if (!kvt_group_kind_cacheable(s->kind)) { /* any block size: it is never hashed */
            if (s->block_size < 1)
                return kvt_fail(KVT_EINVAL, "pool: group %u block_size must be positive", g);
            continue;
        }
        cacheable++;
        if (s->block_size < 1 || s->block_size % c->hash_block_size != 0)
            return kvt_fail(KVT_EINVAL,
                            "pool: group %u block_size %u must be a positive "
                            "multiple of hash_block_size %u",
                            g, s->block_size, c->hash_block_size);
        if (s->kind == KVT_GROUP_SLIDING && s->sliding_window < 1)
            return kvt_fail(KVT_EINVAL, "pool: sliding-window group %u needs sliding_window >= 1",
                            g);
        *lcm = *lcm / kvi_gcd_u64(*lcm, s->block_size) * s->block_size;
        if (*lcm > UINT32_MAX)
            return kvt_fail(KVT_EINVAL, "pool: LCM of the group block sizes exceeds 2^32");
    }
    if (cacheable == 0)
        return kvt_fail(KVT_EINVAL, "pool: none of the %u groups is prefix-cacheable", c->n_groups);
    return 0;
}

static int validate_config(const kvt_pool_config *c, uint32_t *sched_bs)
{
    if (kvi_check_reserved(c->reserved, sizeof(c->reserved), "pool config"))
        return KVT_EINVAL;
    if (c->num_blocks < 2 || c->num_blocks == UINT32_MAX)
        return kvt_fail(KVT_EINVAL,
                        "pool: num_blocks %u must be in 2..%u (block 0 is the null "
                        "block)",
                        c->num_blocks, UINT32_MAX - 1);
    if (c->hash_len < 1 || c->hash_len > KVT_HASH_MAX)
        return kvt_fail(KVT_EINVAL, "pool: hash_len %u must be in 1..%u", c->hash_len,
                        KVT_HASH_MAX);
    if (c->keys_per_block < 1 || c->keys_per_block > MAX_KEYS_PER_BLOCK)
        return kvt_fail(KVT_EINVAL, "pool: keys_per_block %u must be in 1..%u", c->keys_per_block,
                        MAX_KEYS_PER_BLOCK);
    uint64_t n_keys = (uint64_t)(c->num_blocks - 1) * c->keys_per_block;
    if (n_keys > (1u << 31))
        return kvt_fail(KVT_EINVAL, "pool: %llu keys (num_blocks x keys_per_block) exceed 2^31",
                        (unsigned long long)n_keys);
    if (c->n_groups < 1 || c->n_groups > KVT_MAX_GROUPS)
        return kvt_fail(KVT_EINVAL, "pool: n_groups %u must be in 1..%u", c->n_groups,
                        KVT_MAX_GROUPS);
    if (c->hash_block_size < 1)
        return kvt_fail(KVT_EINVAL, "pool: hash_block_size must be positive");
    int rc = validate_cp(c);
    if (rc)
        return rc;
    uint64_t lcm = 1;
    if ((rc = validate_groups(c, &lcm)))
        return rc;
    if (c->scheduler_block_size == 0) {
        *sched_bs = (uint32_t)lcm;
    } else {
        for (uint32_t g = 0; g < c->n_groups; g++)
            if (kvt_group_kind_cacheable(c->groups[g].kind) &&
                c->scheduler_block_size % c->groups[g].block_size != 0)
                return kvt_fail(KVT_EINVAL,
                                "pool: scheduler_block_size %u is not a multiple of "
                                "group %u block_size %u",
                                c->scheduler_block_size, g, c->groups[g].block_size);
        *sched_bs = c->scheduler_block_size;
    }
    return 0;
}

int kvt_pool_config_validate(const kvt_pool_config *cfg, uint32_t *scheduler_block_size)
{
    if (!cfg)
        return kvt_fail(KVT_EINVAL, "pool: config is NULL");
    uint32_t sched_bs = 0;
    int rc = validate_config(cfg, &sched_bs);
    if (!rc && scheduler_block_size)
        *scheduler_block_size = sched_bs;
    return rc;
}

/* Every entry and every block free (the null block aside), in order. */
static void init_free_lists(kvt_pool *p, uint32_t n_entries)
{
    for (uint32_t i = 0; i < n_entries; i++)
        kvi_pool_entry(p, i)->next = i + 1 < n_entries ? i + 1 : KVT_ENTRY_NONE;
    p->entry_free = 0;
    kvi_list_init(&p->free_q);
    for (uint32_t i = 0; i < p->nb; i++) {
        struct kvi_block *b = &p->blocks[i];
        kvi_list_init(&b->link);
        b->keys = KVT_ENTRY_NONE;
        if (i == KVT_NULL_BLOCK)
            b->is_null = 1;
        else
            kvi_list_push_back(&p->free_q, &b->link);
    }
    p->n_free = p->nb - 1;
    p->n_own = p->nb - 1;
}

/* The search order: full-attention groups first, then the other cacheable ones; groups that
 * are not prefix-cacheable are not searched at all. Partial hash hits (upstream's rule): a
 * Mamba align group whose blocks span several hash blocks — or, under decode context
 * parallelism, which scales the attention blocks instead, at least one —, and only groups
 * whose search can end inside a block (full attention, Mamba align); without EAGLE, whose
 * drop of the last block is defined per block. */
static void plan_search(kvt_pool *p, const kvt_pool_config *cfg)
{
    uint32_t k = 0;
    for (uint32_t g = 0; g < cfg->n_groups; g++) {
        p->hash_step[g] = cfg->groups[g].block_size / cfg->hash_block_size;
        if (cfg->groups[g].kind == KVT_GROUP_FULL)
            p->order[k++] = g;
    }
    for (uint32_t g = 0; g < cfg->n_groups; g++)
        if (cfg->groups[g].kind != KVT_GROUP_FULL && kvt_group_kind_cacheable(cfg->groups[g].kind))
            p->order[k++] = g;
    p->n_order = k;
    p->simple_hybrid = k == 2 && cfg->groups[p->order[0]].kind == KVT_GROUP_FULL;
    bool mamba_wide = false, others_ok = !cfg->eagle, dcp = cp_size(cfg->dcp_world_size) > 1;
    for (uint32_t i = 0; i < k; i++) {
        const kvt_group_spec *s = &cfg->groups[p->order[i]];
        mamba_wide |=
            s->kind == KVT_GROUP_MAMBA_ALIGN &&
            (dcp ? s->block_size >= cfg->hash_block_size : s->block_size > cfg->hash_block_size);
        others_ok &= s->kind == KVT_GROUP_FULL || s->kind == KVT_GROUP_MAMBA_ALIGN;
    }
    p->partial_ok = mamba_wide && others_ok;
}

int kvt_pool_create(const kvt_pool_config *cfg, kvt_pool **out)
{
    *out = NULL;
    if (!cfg)
        return kvt_fail(KVT_EINVAL, "pool: config is NULL");
    uint32_t sched_bs = 0;
    int rc = validate_config(cfg, &sched_bs);
    if (rc)
        return rc;

    kvt_pool *p = calloc(1, sizeof(*p));
    if (!p)
        return kvt_fail(KVT_ENOMEM, "pool: out of memory");
    p->cfg = *cfg;
    p->nb = cfg->num_blocks;
    p->hash_len = cfg->hash_len;
    p->sched_bs = sched_bs;
    uint32_t n_entries = (p->nb - 1) * cfg->keys_per_block;
    p->entry_stride = (sizeof(struct kvi_entry) + p->hash_len + 7) & ~(size_t)7;
    p->blocks = calloc(p->nb, sizeof(*p->blocks));
    p->entries = malloc((size_t)n_entries * p->entry_stride);
    if (!p->blocks || !p->entries) {
        kvt_pool_destroy(p);
        return kvt_fail(KVT_ENOMEM, "pool: cannot allocate %u blocks", cfg->num_blocks);
    }
    rc = kvi_ring_init(&p->ev, sizeof(kvt_pool_event), cfg->event_capacity);
    if (!rc)
        rc = kvi_map_init(&p->map, n_entries);
    if (rc) {
        kvt_pool_destroy(p);
        return kvi_fail_wrap(rc, "pool");
    }

    init_free_lists(p, n_entries);
    plan_search(p, cfg);
    *out = p;
    return 0;
}

void kvt_pool_destroy(kvt_pool *p)
{
    if (!p)
        return;
    kvi_map_free(&p->map);
    free(p->blocks);
    free(p->entries);
    kvi_ring_free(&p->ev);
    free(p);
}

void kvt_pool_get_config(const kvt_pool *p, kvt_pool_config *cfg)
{
    *cfg = p->cfg;
    cfg->scheduler_block_size = p->sched_bs;
}

KVI_GETTER(uint32_t, kvt_pool_num_blocks, kvt_pool, nb)
KVI_GETTER(uint32_t, kvt_pool_num_free, kvt_pool, n_free)
KVI_GETTER(uint32_t, kvt_pool_num_cached, kvt_pool, n_cached)

double kvt_pool_usage(const kvt_pool *p)
{
    return 1.0 - (double)p->n_free / (double)p->n_own;
}

/* ---- events ---------------------------------------------------------------------------- */

static void emit(kvt_pool *p, uint32_t type, uint32_t block, const struct kvi_entry *e)
{
    if (p->ev.cap == 0 || p->blocks[block].peer)
        return;
    kvt_pool_event *ev = kvi_ring_push(&p->ev);
    if (!ev) {
        p->ev_dropped++;
        return;
    }
    memset(ev, 0, sizeof(*ev));
    ev->type = type;
    ev->block = block;
    if (e) {
        ev->group = e->group;
        ev->num_tokens = e->num_tokens;
        memcpy(ev->hash, e->hash, p->hash_len);
    }
}

uint32_t kvt_pool_take_events(kvt_pool *p, kvt_pool_event *out, uint32_t cap, uint64_t *dropped)
{
    uint32_t n = kvi_ring_take(&p->ev, out, cap);
    if (dropped) {
        *dropped = p->ev_dropped;
        p->ev_dropped = 0;
    }
    return n;
}

/* ---- keys ------------------------------------------------------------------------------ */

/* Returns every key entry of block id to the free chain. With `unindex` each key also leaves
 * the map and emits a removed event; reset_prefix_cache passes false because it clears the
 * whole map and emits a single all-cleared event instead. */
static void release_keys(kvt_pool *p, uint32_t id, bool unindex)
{
    struct kvi_block *b = &p->blocks[id];
    uint32_t idx = b->keys;
    if (idx == KVT_ENTRY_NONE)
        return;
    if (p->share && !b->peer)
        p->share->unpublish(p->share_ctx, id);
    while (idx != KVT_ENTRY_NONE) {
        struct kvi_entry *e = kvi_pool_entry(p, idx);
        uint32_t next = e->next;
        if (unindex) {
            kvi_map_remove(&p->map, e->kh, idx);
            emit(p, KVT_POOL_EV_REMOVED, id, e);
        }
        e->next = p->entry_free;
        p->entry_free = idx;
        idx = next;
    }
    b->keys = KVT_ENTRY_NONE;
    b->n_keys = 0;
    p->n_cached--;
}

static void drop_keys(kvt_pool *p, uint32_t id)
{
    release_keys(p, id, true);
}

static int check_ids(const kvt_pool *p, const char *op, const uint32_t *ids, uint32_t n)
{
    if (n && !ids)
        return kvt_fail(KVT_EINVAL, "pool: %s: ids is NULL", op);
    for (uint32_t i = 0; i < n; i++)
        if (ids[i] >= p->nb)
            return kvt_fail(KVT_ERANGE, "pool: %s: block %u out of range (pool has %u blocks)", op,
                            ids[i], p->nb);
    return 0;
}

static int insert_key(kvt_pool *p, uint32_t id, const uint8_t *hash, uint32_t group,
                      uint32_t num_tokens, bool unique);

int kvt_pool_insert(kvt_pool *p, uint32_t id, const uint8_t *hash, uint32_t group,
                    uint32_t num_tokens)
{
    return insert_key(p, id, hash, group, num_tokens, false);
}

int kvi_pool_insert_unique(kvt_pool *p, uint32_t id, const uint8_t *hash, uint32_t group,
                           uint32_t num_tokens)
{
    return insert_key(p, id, hash, group, num_tokens, true);
}

/* kvt_pool_insert; with unique, nothing happens (0) when any block already carries the key,
 * found with the same key hash the insertion uses (one hash, one probe sequence). */
static int insert_key(kvt_pool *p, uint32_t id, const uint8_t *hash, uint32_t group,
                      uint32_t num_tokens, bool unique)
{
    if (!hash)
        return kvt_fail(KVT_EINVAL, "pool: insert: hash is NULL");
    if (id == KVT_NULL_BLOCK || id >= p->nb)
        return kvt_fail(KVT_ERANGE, "pool: insert: block %u is %s", id,
                        id == KVT_NULL_BLOCK ? "the null block" : "out of range");
    if (group >= p->cfg.n_groups)
        return kvt_fail(KVT_ERANGE, "pool: insert: group %u out of range (%u groups)", group,
                        p->cfg.n_groups);
    if (!kvt_group_kind_cacheable(p->cfg.groups[group].kind))
        return kvt_fail(KVT_EINVAL, "pool: insert: group %u is not prefix-cacheable", group);
    if (num_tokens < 1 || num_tokens > p->cfg.groups[group].block_size)
        return kvt_fail(KVT_ERANGE, "pool: insert: num_tokens %u must be in 1..%u", num_tokens,
                        p->cfg.groups[group].block_size);
    struct kvi_block *b = &p->blocks[id];
    if (b->peer)
        return kvt_fail(KVT_ESTATE,
                        "pool: insert: block %u belongs to another replica of the node; only "
                        "its owner caches it",
                        id);
    if (b->ref == 0)
        return kvt_fail(KVT_ESTATE,
                        "pool: insert: block %u is free; only referenced blocks "
                        "can be cached",
                        id);
    uint64_t kh = kvi_pool_key_hash(p, hash, group);
    if (unique && kvi_pool_find(p, hash, group, kh) != KVT_BLOCK_NONE)
        return 0;
    uint32_t last = KVT_ENTRY_NONE;
    for (uint32_t idx = b->keys; idx != KVT_ENTRY_NONE; idx = kvi_pool_entry(p, idx)->next) {
        const struct kvi_entry *e = kvi_pool_entry(p, idx);
        if (e->group == group && memcmp(e->hash, hash, p->hash_len) == 0)
            return 0;
        last = idx;
    }
    if (b->n_keys >= p->cfg.keys_per_block)
        return kvt_fail(KVT_ELIMIT,
                        "pool: insert: block %u already carries %u keys (the "
                        "keys_per_block limit)",
                        id, b->n_keys);

    uint32_t idx = p->entry_free;
    struct kvi_entry *e = kvi_pool_entry(p, idx);
    p->entry_free = e->next;
    e->block = id;
    e->group = group;
    e->num_tokens = num_tokens;
    e->next = KVT_ENTRY_NONE;
    e->kh = kh;
    memcpy(e->hash, hash, p->hash_len);
    /* Cannot fail: the map has a slot for every entry (invariant 3). */
    (void)kvi_map_insert(&p->map, e->kh, idx);
    if (last == KVT_ENTRY_NONE) {
        b->keys = idx;
        p->n_cached++;
    } else {
        kvi_pool_entry(p, last)->next = idx;
    }
    b->n_keys++;
    emit(p, KVT_POOL_EV_STORED, id, e);
    if (p->share && !b->peer)
        p->share->publish(p->share_ctx, id, hash, group, num_tokens);
    return 0;
}

int kvt_pool_lookup(const kvt_pool *p, const uint8_t *hash, uint32_t group, uint32_t *block)
{
    if (!hash || !block)
        return kvt_fail(KVT_EINVAL, "pool: lookup: NULL argument");
    if (group >= p->cfg.n_groups)
        return kvt_fail(KVT_ERANGE, "pool: lookup: group %u out of range (%u groups)", group,
                        p->cfg.n_groups);
    uint32_t b = kvi_pool_find(p, hash, group, kvi_pool_key_hash(p, hash, group));
    *block = b;
    return b != KVT_BLOCK_NONE;
}

int kvt_pool_evict(kvt_pool *p, const uint32_t *ids, uint32_t n)
{
    int rc = check_ids(p, "evict", ids, n);
    if (rc)
        return rc;
    for (uint32_t i = 0; i < n; i++)
        drop_keys(p, ids[i]);
    return 0;
}

void kvi_pool_forget_keys(kvt_pool *p)
{
    if (p->share) {
        /* a shared pool forgets only its own blocks: the peers' stay as their owners
         * published them */
        for (uint32_t id = 1; id < p->nb; id++)
            if (!p->blocks[id].peer)
                release_keys(p, id, true);
    } else {
        for (uint32_t id = 1; id < p->nb && p->n_cached; id++)
            release_keys(p, id, false);
        kvi_map_clear(&p->map);
    }
    emit(p, KVT_POOL_EV_ALL_CLEARED, KVT_NULL_BLOCK, NULL);
}

int kvt_pool_reset_prefix_cache(kvt_pool *p)
{
    uint32_t used = p->n_own - p->n_free;
    if (used)
        return kvt_fail(KVT_EBUSY, "pool: reset_prefix_cache: %u blocks are still referenced",
                        used);
    kvi_pool_forget_keys(p);
    return 0;
}

/* ---- references ------------------------------------------------------------------------ */

int kvt_pool_alloc(kvt_pool *p, uint32_t n, uint32_t *ids)
{
    if (n && !ids)
        return kvt_fail(KVT_EINVAL, "pool: alloc: ids is NULL");
    if (n > p->n_free)
        return kvt_fail(KVT_ENOSPC, "pool: alloc: %u blocks requested, %u free", n, p->n_free);
    for (uint32_t i = 0; i < n; i++) {
        kvi_list *node = p->free_q.next;
        kvi_list_remove(node);
        struct kvi_block *b = kvi_list_entry(node, struct kvi_block, link);
        uint32_t id = (uint32_t)(b - p->blocks);
        drop_keys(p, id);
        b->ref = 1;
        ids[i] = id;
    }
    p->n_free -= n;
    return 0;
}

int kvt_pool_touch(kvt_pool *p, const uint32_t *ids, uint32_t n)
{
    int rc = check_ids(p, "touch", ids, n);
    if (rc)
        return rc;
    for (uint32_t i = 0; i < n; i++)
        if (p->blocks[ids[i]].ref > UINT32_MAX - n)
            return kvt_fail(KVT_ELIMIT, "pool: touch: block %u reference count would overflow",
                            ids[i]);
    for (uint32_t i = 0; i < n; i++) {
        struct kvi_block *b = &p->blocks[ids[i]];
        if (b->is_null)
            continue;
        if (b->ref == 0) {
            if (b->peer) {
                p->share->pin(p->share_ctx, ids[i], true);
            } else {
                kvi_list_remove(&b->link);
                p->n_free--;
            }
        }
        b->ref++;
    }
    return 0;
}

int kvt_pool_free(kvt_pool *p, const uint32_t *ids, uint32_t n)
{
    int rc = check_ids(p, "free", ids, n);
    if (rc)
        return rc;
    for (uint32_t i = 0; i < n; i++) {
        struct kvi_block *b = &p->blocks[ids[i]];
        if (b->is_null)
            continue;
        if (b->ref == 0) {
            for (uint32_t j = 0; j < i; j++)
                if (!p->blocks[ids[j]].is_null)
                    p->blocks[ids[j]].ref++;
            return kvt_fail(KVT_ESTATE,
                            "pool: free: block %u has no reference left (double "
                            "free?)",
                            ids[i]);
        }
        b->ref--;
    }
    for (uint32_t i = 0; i < n; i++) {
        struct kvi_block *b = &p->blocks[ids[i]];
        if (b->is_null || b->ref != 0)
            continue;
        if (b->peer) {
            /* idempotent: a block named twice is reported twice */
            p->share->pin(p->share_ctx, ids[i], false);
        } else if (!kvi_list_linked(&b->link)) {
            kvi_list_push_back(&p->free_q, &b->link);
            p->n_free++;
        }
    }
    return 0;
}

/* ---- a node's shared pool (pool_share.h) ----------------------------------------------- */

int kvi_pool_share(kvt_pool *p, uint32_t own_lo, uint32_t own_hi,
                   const struct kvi_pool_share_ops *ops, void *ctx)
{
    if (!ops || !ops->pin || !ops->publish || !ops->unpublish)
        return kvt_fail(KVT_EINVAL, "pool: share: incomplete ops");
    if (p->share)
        return kvt_fail(KVT_ESTATE, "pool: share: the pool is already shared");
    if (own_lo == KVT_NULL_BLOCK || own_lo >= own_hi || own_hi > p->nb)
        return kvt_fail(KVT_ERANGE, "pool: share: owned range [%u, %u) is not inside 1..%u", own_lo,
                        own_hi, p->nb);
    if (p->n_free != p->nb - 1 || p->n_cached)
        return kvt_fail(KVT_ESTATE, "pool: share: the pool has been used already");
    for (uint32_t id = 1; id < p->nb; id++) {
        struct kvi_block *b = &p->blocks[id];
        if (id >= own_lo && id < own_hi)
            continue;
        kvi_list_remove(&b->link);
        b->peer = 1;
    }
    p->n_own = own_hi - own_lo;
    p->n_free = p->n_own;
    p->share = ops;
    p->share_ctx = ctx;
    return 0;
}

int kvi_pool_share_set_keys(kvt_pool *p, uint32_t id, uint32_t n, const uint8_t *hashes,
                            const uint32_t *groups, const uint32_t *num_tokens)
{
    if (id >= p->nb || !p->blocks[id].peer)
        return kvt_fail(KVT_ERANGE, "pool: share: block %u is not a peer's", id);
    if (n > p->cfg.keys_per_block)
        return kvt_fail(KVT_ELIMIT, "pool: share: %u keys on block %u, at most %u", n, id,
                        p->cfg.keys_per_block);
    for (uint32_t i = 0; i < n; i++)
        if (groups[i] >= p->cfg.n_groups ||
            !kvt_group_kind_cacheable(p->cfg.groups[groups[i]].kind) || num_tokens[i] < 1 ||
            num_tokens[i] > p->cfg.groups[groups[i]].block_size)
            return kvt_fail(KVT_ERANGE,
                            "pool: share: key %u of block %u: group %u / %u tokens "
                            "do not fit this pool",
                            i, id, groups[i], num_tokens[i]);
    struct kvi_block *b = &p->blocks[id];
    release_keys(p, id, true);
    uint32_t last = KVT_ENTRY_NONE;
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *hash = hashes + (size_t)i * p->hash_len;
        uint32_t idx = p->entry_free;
        struct kvi_entry *e = kvi_pool_entry(p, idx);
        p->entry_free = e->next;
        e->block = id;
        e->group = groups[i];
        e->num_tokens = num_tokens[i];
        e->next = KVT_ENTRY_NONE;
        e->kh = kvi_pool_key_hash(p, hash, groups[i]);
        memcpy(e->hash, hash, p->hash_len);
        (void)kvi_map_insert(&p->map, e->kh, idx); /* room for every entry (invariant 3) */
        if (last == KVT_ENTRY_NONE) {
            b->keys = idx;
            p->n_cached++;
        } else {
            kvi_pool_entry(p, last)->next = idx;
        }
        last = idx;
        b->n_keys++;
    }
    return 0;
}

bool kvi_pool_is_peer(const kvt_pool *p, uint32_t id)
{
    return id < p->nb && p->blocks[id].peer;
}

/* ---- inspection ------------------------------------------------------------------------ */

int kvt_pool_block_info(const kvt_pool *p, uint32_t id, kvt_block_info *info)
{
    if (!info)
        return kvt_fail(KVT_EINVAL, "pool: block_info: info is NULL");
    if (id >= p->nb)
        return kvt_fail(KVT_ERANGE, "pool: block_info: block %u out of range (%u blocks)", id,
                        p->nb);
    const struct kvi_block *b = &p->blocks[id];
    info->ref_cnt = b->ref;
    info->n_keys = b->n_keys;
    info->is_null = b->is_null;
    info->is_free = kvi_list_linked(&b->link);
    return 0;
}

int kvt_pool_block_keys(const kvt_pool *p, uint32_t id, kvt_pool_key *keys, uint32_t cap,
                        uint32_t *n)
{
    if (!n || (cap && !keys))
        return kvt_fail(KVT_EINVAL, "pool: block_keys: NULL argument");
    if (id >= p->nb)
        return kvt_fail(KVT_ERANGE, "pool: block_keys: block %u out of range (%u blocks)", id,
                        p->nb);
    uint32_t i = 0;
    for (uint32_t idx = p->blocks[id].keys; idx != KVT_ENTRY_NONE;
         idx = kvi_pool_entry(p, idx)->next, i++) {
        if (i >= cap)
            continue;
        const struct kvi_entry *e = kvi_pool_entry(p, idx);
        memset(&keys[i], 0, sizeof(keys[i]));
        memcpy(keys[i].hash, e->hash, p->hash_len);
        keys[i].group = e->group;
        keys[i].num_tokens = e->num_tokens;
    }
    *n = i;
    return 0;
}

uint32_t kvt_pool_lru_first(const kvt_pool *p)
{
    const kvi_list *n = kvi_list_first(&p->free_q);
    return n ? (uint32_t)(kvi_list_entry(n, struct kvi_block, link) - p->blocks) : KVT_BLOCK_NONE;
}

uint32_t kvt_pool_lru_next(const kvt_pool *p, uint32_t id)
{
    if (id >= p->nb || !kvi_list_linked(&p->blocks[id].link))
        return KVT_BLOCK_NONE;
    const kvi_list *n = kvi_list_next(&p->free_q, &p->blocks[id].link);
    return n ? (uint32_t)(kvi_list_entry(n, struct kvi_block, link) - p->blocks) : KVT_BLOCK_NONE;
}
