/* SPDX-License-Identifier: Apache-2.0 */
/*
 * KV-offload metadata, scheduler -> worker (vLLM SimpleCPUOffloadMetadata): the C object, its
 * builders, validation and wire encoding; the worker's answer is worker_meta.c's.
 *
 * Body of an offload message (after the 12-byte header):
 *   i64 load_event
 *   u32 n; n x u32 load_gpu_blocks      u32 n; n x u32 load_cpu_blocks
 *   u32 n_events; n_events x { i64 event; u32 n; n x str request_id }
 *   i64 store_event
 *   u32 n; n x u32 store_gpu_blocks     u32 n; n x u32 store_cpu_blocks
 *   u8  need_flush
 *   u32 n; n x u32 load_invalid_blocks
 *   u8  n_tiers; n_tiers x, for each tier t with transfers this step (ascending):
 *     u8  t                                 1 .. KVT_MAX_TIERS - 1
 *     i64 load_event
 *     u32 n; n x u32 load_src (tier t)      u32 n; n x u32 load_dst (tier 0)
 *     i64 store_event
 *     u32 n; n x u32 store_src (tier 0)     u32 n; n x u32 store_dst (tier t)
 *   u8  remote tier (0: none; then nothing follows)
 *   u8  hash_len
 *   u8  parts                                                        ranks of a block
 *   u32 n; n x { str instance; str endpoint; u64 epoch }            owners
 *   u32 n; n x { hash_len bytes; parts x { u32 owner; u32 slot; u64 generation } } sources
 *   u8  withdraw_all
 *   u32 n; n x { u32 block; hash_len bytes }                         publications
 *   u32 n; n x u32 block                                             withdrawals
 * The two lists of a pair carry their own lengths, as the Python dataclass does, and the
 * decoder insists that they agree. A tier without transfers is left out, and a decoder refuses
 * an empty section: the encoding stays canonical.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "meta/meta_internal.h"

/* ---- scheduler -> worker --------------------------------------------------------------- */

void kvt_offload_meta_init(kvt_offload_meta *m)
{
    memset(m, 0, sizeof(*m));
    m->load_event = KVT_NO_EVENT;
    m->store_event = KVT_NO_EVENT;
    for (uint32_t t = 0; t < KVT_MAX_TIERS - 1; t++)
        m->tiers[t].load_event = m->tiers[t].store_event = KVT_NO_EVENT;
}

bool kvt_offload_meta_empty(const kvt_offload_meta *m)
{
    if (m->n_loads || m->n_stores || m->n_load_events || m->n_load_invalid || m->remote.n_pubs ||
        m->remote.n_withdraws || m->remote.withdraw_all)
        return false;
    for (uint32_t t = 0; t < KVT_MAX_TIERS - 1; t++)
        if (m->tiers[t].n_loads || m->tiers[t].n_stores)
            return false;
    return true;
}

void kvt_offload_meta_clear(kvt_offload_meta *m)
{
    m->load_event = KVT_NO_EVENT;
    m->store_event = KVT_NO_EVENT;
    m->n_loads = m->n_stores = 0;
    m->n_load_events = m->n_load_reqs = 0;
    m->need_flush = false;
    m->n_load_invalid = 0;
    for (uint32_t t = 0; t < KVT_MAX_TIERS - 1; t++) {
        m->tiers[t].n_loads = m->tiers[t].n_stores = 0;
        m->tiers[t].load_event = m->tiers[t].store_event = KVT_NO_EVENT;
    }
    m->remote.tier = m->remote.hash_len = m->remote.parts = 0;
    m->remote.n_owners = m->remote.n_srcs = 0;
    m->remote.n_pubs = m->remote.n_withdraws = 0;
    m->remote.withdraw_all = false;
    kvt_bump_clear(&m->strings);
}

void kvt_offload_meta_release(kvt_offload_meta *m)
{
    free(m->load_gpu_blocks);
    free(m->load_cpu_blocks);
    free(m->load_events);
    free(m->load_req_first);
    free(m->load_req_ids);
    free(m->store_gpu_blocks);
    free(m->store_cpu_blocks);
    free(m->load_invalid_blocks);
    for (uint32_t t = 0; t < KVT_MAX_TIERS - 1; t++) {
        free(m->tiers[t].load_src);
        free(m->tiers[t].load_dst);
        free(m->tiers[t].store_src);
        free(m->tiers[t].store_dst);
    }
    free(m->remote.owners);
    free(m->remote.srcs);
    free(m->remote.pub_blocks);
    free(m->remote.pub_hashes);
    free(m->remote.withdraw_blocks);
    kvt_bump_release(&m->strings);
    kvt_offload_meta_init(m);
}

/* Grows a pair of parallel block lists. */
static int grow_pair(uint32_t **a, uint32_t **b, uint32_t *cap, uint32_t need)
{
    if (need > KVT_META_MAX_BLOCKS)
        return kvt_fail(KVT_ELIMIT, "meta: more than %u blocks in one list", KVT_META_MAX_BLOCKS);
    uint32_t cap_a = *cap, cap_b = *cap;
    int rc = kvi_meta_grow((void **)a, &cap_a, need, sizeof(uint32_t));
    if (!rc)
        rc = kvi_meta_grow((void **)b, &cap_b, need, sizeof(uint32_t));
    if (rc)
        return rc;
    *cap = cap_a < cap_b ? cap_a : cap_b;
    return 0;
}

int kvt_offload_meta_reserve(kvt_offload_meta *m, uint32_t loads, uint32_t stores, uint32_t events,
                             uint32_t reqs, size_t req_bytes)
{
    uint64_t nl = (uint64_t)m->n_loads + loads, ns = (uint64_t)m->n_stores + stores;
    uint64_t ne = (uint64_t)m->n_load_events + events, nr = (uint64_t)m->n_load_reqs + reqs;
    if (nl > KVT_META_MAX_BLOCKS || ns > KVT_META_MAX_BLOCKS || ne > KVT_META_MAX_ITEMS ||
        nr > KVT_META_MAX_ITEMS)
        return kvt_fail(KVT_ELIMIT, "meta: reserve beyond the message limits");
    int rc;
    if ((rc = grow_pair(&m->load_gpu_blocks, &m->load_cpu_blocks, &m->cap_loads, (uint32_t)nl)) ||
        (rc =
             grow_pair(&m->store_gpu_blocks, &m->store_cpu_blocks, &m->cap_stores, (uint32_t)ns)) ||
        (rc = kvi_meta_grow((void **)&m->load_events, &m->cap_events, (uint32_t)ne,
                            sizeof(int64_t))) ||
        (rc = kvi_meta_grow((void **)&m->load_req_first, &m->cap_first, (uint32_t)ne + 1,
                            sizeof(uint32_t))) ||
        (rc =
             kvi_meta_grow((void **)&m->load_req_ids, &m->cap_reqs, (uint32_t)nr, sizeof(kvt_str))))
        return rc;
    /* strdup takes len + 1 and up to 7 bytes of alignment per string */
    return req_bytes || reqs ? kvi_bump_reserve(&m->strings, req_bytes + 8 * (size_t)reqs) : 0;
}

int kvt_offload_meta_reserve_invalid(kvt_offload_meta *m, uint32_t invalid)
{
    uint64_t ni = (uint64_t)m->n_load_invalid + invalid;
    if (ni > KVT_META_MAX_BLOCKS)
        return kvt_fail(KVT_ELIMIT, "meta: reserve beyond the message limits");
    return kvi_meta_grow((void **)&m->load_invalid_blocks, &m->cap_invalid, (uint32_t)ni,
                         sizeof(uint32_t));
}

/* Tier t's transfers (1 <= t < KVT_MAX_TIERS), or NULL with KVT_ERANGE set. */
static kvt_tier_xfers *tier_xfers(kvt_offload_meta *m, uint32_t t)
{
    if (t == 0 || t >= KVT_MAX_TIERS) {
        kvt_fail(KVT_ERANGE, "meta: tier %u has no tier transfers (1 .. %u)", t, KVT_MAX_TIERS - 1);
        return NULL;
    }
    return &m->tiers[t - 1];
}

int kvt_offload_meta_reserve_tier(kvt_offload_meta *m, uint32_t tier, uint32_t loads,
                                  uint32_t stores)
{
    kvt_tier_xfers *x = tier_xfers(m, tier);
    if (!x)
        return KVT_ERANGE;
    uint64_t nl = (uint64_t)x->n_loads + loads, ns = (uint64_t)x->n_stores + stores;
    if (nl > KVT_META_MAX_BLOCKS || ns > KVT_META_MAX_BLOCKS)
        return kvt_fail(KVT_ELIMIT, "meta: reserve beyond the message limits");
    int rc = grow_pair(&x->load_src, &x->load_dst, &x->cap_loads, (uint32_t)nl);
    return rc ? rc : grow_pair(&x->store_src, &x->store_dst, &x->cap_stores, (uint32_t)ns);
}

/* Appends (a, b) to a pair of parallel lists. */
static int add_pair(uint32_t **la, uint32_t **lb, uint32_t *cap, uint32_t *n, uint32_t a,
                    uint32_t b)
{
    int rc = grow_pair(la, lb, cap, *n + 1);
    if (rc)
        return rc;
    (*la)[*n] = a;
    (*lb)[*n] = b;
    (*n)++;
    return 0;
}

int kvt_offload_meta_add_load_invalid(kvt_offload_meta *m, uint32_t gpu_block)
{
    if (m->n_load_invalid >= KVT_META_MAX_BLOCKS)
        return kvt_fail(KVT_ELIMIT, "meta: more than %u blocks in one list", KVT_META_MAX_BLOCKS);
    int rc = kvi_meta_grow((void **)&m->load_invalid_blocks, &m->cap_invalid, m->n_load_invalid + 1,
                           sizeof(uint32_t));
    if (rc)
        return rc;
    m->load_invalid_blocks[m->n_load_invalid++] = gpu_block;
    return 0;
}

int kvt_offload_meta_add_tier_load(kvt_offload_meta *m, uint32_t tier, uint32_t src, uint32_t dst)
{
    kvt_tier_xfers *x = tier_xfers(m, tier);
    return x ? add_pair(&x->load_src, &x->load_dst, &x->cap_loads, &x->n_loads, src, dst)
             : KVT_ERANGE;
}

int kvt_offload_meta_add_tier_store(kvt_offload_meta *m, uint32_t tier, uint32_t src, uint32_t dst)
{
    kvt_tier_xfers *x = tier_xfers(m, tier);
    return x ? add_pair(&x->store_src, &x->store_dst, &x->cap_stores, &x->n_stores, src, dst)
             : KVT_ERANGE;
}

int kvt_offload_meta_add_load(kvt_offload_meta *m, uint32_t gpu_block, uint32_t cpu_block)
{
    return add_pair(&m->load_gpu_blocks, &m->load_cpu_blocks, &m->cap_loads, &m->n_loads, gpu_block,
                    cpu_block);
}

int kvt_offload_meta_add_store(kvt_offload_meta *m, uint32_t gpu_block, uint32_t cpu_block)
{
    return add_pair(&m->store_gpu_blocks, &m->store_cpu_blocks, &m->cap_stores, &m->n_stores,
                    gpu_block, cpu_block);
}

int kvt_offload_meta_add_load_req(kvt_offload_meta *m, int64_t event, const char *req_id,
                                  uint32_t len)
{
    kvt_str id = {req_id, len};
    int rc = kvi_meta_check_str(id, 1, "meta: load request id");
    if (rc)
        return rc;
    if (event < 0)
        return kvt_fail(KVT_EINVAL, "meta: load event %lld is negative", (long long)event);
    bool new_event = m->n_load_events == 0 || m->load_events[m->n_load_events - 1] != event;
    if (new_event && m->n_load_events && event < m->load_events[m->n_load_events - 1])
        return kvt_fail(KVT_EINVAL, "meta: load event %lld added after %lld (must ascend)",
                        (long long)event, (long long)m->load_events[m->n_load_events - 1]);
    if (m->n_load_reqs >= KVT_META_MAX_ITEMS || m->n_load_events >= KVT_META_MAX_ITEMS)
        return kvt_fail(KVT_ELIMIT, "meta: more than %u load requests", KVT_META_MAX_ITEMS);
    rc =
        kvi_meta_grow((void **)&m->load_req_ids, &m->cap_reqs, m->n_load_reqs + 1, sizeof(kvt_str));
    if (rc)
        return rc;
    if (new_event) {
        rc = kvi_meta_grow((void **)&m->load_events, &m->cap_events, m->n_load_events + 1,
                           sizeof(int64_t));
        if (!rc)
            rc = kvi_meta_grow((void **)&m->load_req_first, &m->cap_first, m->n_load_events + 2,
                               sizeof(uint32_t));
        if (rc)
            return rc;
    }
    kvt_str copy;
    rc = kvi_meta_copy_str(&m->strings, req_id, len, &copy);
    if (rc)
        return rc;
    if (new_event) {
        m->load_events[m->n_load_events] = event;
        m->load_req_first[m->n_load_events] = m->n_load_reqs;
        m->n_load_events++;
    }
    m->load_req_ids[m->n_load_reqs++] = copy;
    m->load_req_first[m->n_load_events] = m->n_load_reqs;
    return 0;
}

int kvt_offload_meta_reserve_remote(kvt_offload_meta *m, uint32_t owners, uint32_t srcs)
{
    kvt_remote_reads *x = &m->remote;
    uint64_t no = (uint64_t)x->n_owners + owners;
    uint64_t ns = (uint64_t)x->n_srcs * (x->parts ? x->parts : 1) + srcs;
    if (no > KVT_META_MAX_OWNERS || ns > (uint64_t)KVT_META_MAX_BLOCKS * KVT_META_MAX_PARTS)
        return kvt_fail(KVT_ELIMIT, "meta: reserve beyond the message limits");
    int rc = kvi_meta_grow((void **)&x->owners, &x->cap_owners, (uint32_t)no, sizeof(*x->owners));
    if (!rc)
        rc = kvi_meta_grow((void **)&x->srcs, &x->cap_srcs, (uint32_t)ns, sizeof(*x->srcs));
    /* an instance (64 bytes) and an endpoint (80), each NUL-terminated and aligned */
    return rc || !owners ? rc : kvi_bump_reserve(&m->strings, (size_t)owners * (65 + 81 + 16));
}

int kvt_offload_meta_add_remote_owner(kvt_offload_meta *m, const char *instance,
                                      const char *endpoint, uint64_t epoch, uint32_t *index)
{
    if (!m || !instance || !endpoint || !index)
        return kvt_fail(KVT_EINVAL, "meta: add_remote_owner: NULL argument");
    kvt_remote_reads *x = &m->remote;
    if (x->n_owners >= KVT_META_MAX_OWNERS)
        return kvt_fail(KVT_ELIMIT, "meta: more than %u remote owners", KVT_META_MAX_OWNERS);
    kvt_remote_owner o = {.epoch = epoch};
    int rc = kvi_meta_grow((void **)&x->owners, &x->cap_owners, x->n_owners + 1, sizeof(o));
    if (rc ||
        (rc = kvi_meta_copy_str(&m->strings, instance, (uint32_t)strlen(instance), &o.instance)) ||
        (rc = kvi_meta_copy_str(&m->strings, endpoint, (uint32_t)strlen(endpoint), &o.endpoint)))
        return rc;
    *index = x->n_owners;
    x->owners[x->n_owners++] = o;
    return 0;
}

/* Opens the remote section as tier `tier` with hash_len (and parts, once sources come: 0
 * leaves them to later), or checks that it is that tier's. */
static int remote_open(kvt_remote_reads *x, uint32_t tier, uint32_t hash_len, uint32_t parts,
                       const char *what)
{
    if (tier == 0 || tier >= KVT_MAX_TIERS || hash_len == 0 || hash_len > KVT_META_MAX_HASH ||
        parts > KVT_META_MAX_PARTS)
        return kvt_fail(KVT_ERANGE, "meta: %s: tier %u, hash_len %u, %u parts", what, tier,
                        hash_len, parts);
    if (x->tier && (tier != x->tier || hash_len != x->hash_len))
        return kvt_fail(KVT_EINVAL, "meta: %s: tier %u with hash_len %u after tier %u with %u",
                        what, tier, hash_len, x->tier, x->hash_len);
    if (parts && x->n_srcs && parts != x->parts)
        return kvt_fail(KVT_EINVAL, "meta: %s: %u parts after sources of %u", what, parts,
                        x->parts);
    x->tier = tier;
    x->hash_len = hash_len;
    if (parts)
        x->parts = parts;
    else if (!x->parts)
        x->parts = 1;
    return 0;
}

int kvt_offload_meta_add_remote_parts(kvt_offload_meta *m, uint32_t tier, uint32_t parts,
                                      const kvt_remote_src *parts_of, const uint8_t *hash,
                                      uint32_t hash_len, uint32_t *id)
{
    if (!m || !parts_of || !hash || !id)
        return kvt_fail(KVT_EINVAL, "meta: add_remote_src: NULL argument");
    kvt_remote_reads *x = &m->remote;
    if (parts == 0)
        return kvt_fail(KVT_ERANGE, "meta: add_remote_src: 0 parts");
    int rc = remote_open(x, tier, hash_len, parts, "add_remote_src");
    if (rc)
        return rc;
    if (x->n_srcs >= KVT_META_MAX_BLOCKS)
        return kvt_fail(KVT_ELIMIT, "meta: more than %u remote sources", KVT_META_MAX_BLOCKS);
    if ((rc = kvi_meta_grow((void **)&x->srcs, &x->cap_srcs, (x->n_srcs + 1) * parts,
                            sizeof(*x->srcs))))
        return rc;
    kvt_remote_src *r = &x->srcs[(size_t)x->n_srcs++ * parts];
    for (uint32_t k = 0; k < parts; k++) {
        r[k] = (kvt_remote_src){.owner = parts_of[k].owner,
                                .slot = parts_of[k].slot,
                                .generation = parts_of[k].generation};
        memcpy(r[k].hash, hash, hash_len);
    }
    *id = x->n_srcs;
    return 0;
}

int kvt_offload_meta_add_remote_src(kvt_offload_meta *m, uint32_t tier, uint32_t owner,
                                    uint32_t slot, uint64_t generation, const uint8_t *hash,
                                    uint32_t hash_len, uint32_t *id)
{
    kvt_remote_src one = {.owner = owner, .slot = slot, .generation = generation};
    return kvt_offload_meta_add_remote_parts(m, tier, 1, &one, hash, hash_len, id);
}

int kvt_offload_meta_add_remote_pub(kvt_offload_meta *m, uint32_t tier, uint32_t block,
                                    const uint8_t *hash, uint32_t hash_len)
{
    if (!m || !hash)
        return kvt_fail(KVT_EINVAL, "meta: add_remote_pub: NULL argument");
    kvt_remote_reads *x = &m->remote;
    int rc = remote_open(x, tier, hash_len, 0, "add_remote_pub");
    if (rc)
        return rc;
    if (x->n_pubs >= KVT_META_MAX_BLOCKS)
        return kvt_fail(KVT_ELIMIT, "meta: more than %u publications", KVT_META_MAX_BLOCKS);
    uint32_t ca = x->cap_pubs, ch = x->cap_pubs;
    if ((rc = kvi_meta_grow((void **)&x->pub_blocks, &ca, x->n_pubs + 1, sizeof(uint32_t))) ||
        (rc = kvi_meta_grow((void **)&x->pub_hashes, &ch, x->n_pubs + 1, KVT_META_MAX_HASH)))
        return rc;
    x->cap_pubs = ca < ch ? ca : ch;
    x->pub_blocks[x->n_pubs] = block;
    memcpy(x->pub_hashes + (size_t)x->n_pubs * hash_len, hash, hash_len);
    x->n_pubs++;
    return 0;
}

int kvt_offload_meta_add_remote_withdraw(kvt_offload_meta *m, uint32_t tier, uint32_t block,
                                         uint32_t hash_len)
{
    if (!m)
        return kvt_fail(KVT_EINVAL, "meta: add_remote_withdraw: NULL argument");
    kvt_remote_reads *x = &m->remote;
    int rc = remote_open(x, tier, hash_len, 0, "add_remote_withdraw");
    if (rc)
        return rc;
    if (x->n_withdraws >= KVT_META_MAX_BLOCKS)
        return kvt_fail(KVT_ELIMIT, "meta: more than %u withdrawals", KVT_META_MAX_BLOCKS);
    if ((rc = kvi_meta_grow((void **)&x->withdraw_blocks, &x->cap_withdraws, x->n_withdraws + 1,
                            sizeof(uint32_t))))
        return rc;
    x->withdraw_blocks[x->n_withdraws++] = block;
    return 0;
}

int kvt_offload_meta_remote_withdraw_all(kvt_offload_meta *m, uint32_t tier, uint32_t hash_len)
{
    if (!m)
        return kvt_fail(KVT_EINVAL, "meta: remote_withdraw_all: NULL argument");
    int rc = remote_open(&m->remote, tier, hash_len, 0, "remote_withdraw_all");
    if (!rc)
        m->remote.withdraw_all = true;
    return rc;
}

static int check_blocks(const uint32_t *ids, uint32_t n, const char *what)
{
    if (n > KVT_META_MAX_BLOCKS)
        return kvt_fail(KVT_ELIMIT, "%s: %u blocks exceed the limit of %u", what, n,
                        KVT_META_MAX_BLOCKS);
    if (n && !ids)
        return kvt_fail(KVT_EINVAL, "%s: list is NULL", what);
    for (uint32_t i = 0; i < n; i++)
        if (ids[i] == 0)
            return kvt_fail(KVT_EINVAL, "%s[%u] is the null block 0", what, i);
    return 0;
}

static int check_event(int64_t event, uint32_t n, const char *what)
{
    if (event < KVT_NO_EVENT)
        return kvt_fail(KVT_EINVAL, "%s %lld is invalid", what, (long long)event);
    if ((event == KVT_NO_EVENT) != (n == 0))
        return kvt_fail(KVT_EINVAL, "%s is %lld with %u blocks (no event exactly when empty)", what,
                        (long long)event, n);
    return 0;
}

/* The remote reads: a tier that writes nothing back, whose loads name sources in range, each
 * of a listed owner (instance and endpoint within a kvt_remote_peer's lengths). */
static int check_remote(const kvt_offload_meta *m)
{
    const kvt_remote_reads *x = &m->remote;
    if (x->tier == 0) {
        if (x->n_owners || x->n_srcs || x->n_pubs || x->n_withdraws || x->withdraw_all)
            return kvt_fail(KVT_EINVAL,
                            "remote reads: %u owners, %u sources, %u publications and %u "
                            "withdrawals without a tier",
                            x->n_owners, x->n_srcs, x->n_pubs, x->n_withdraws);
        return 0;
    }
    if (x->tier >= KVT_MAX_TIERS || x->hash_len == 0 || x->hash_len > KVT_META_MAX_HASH ||
        x->parts == 0 || x->parts > KVT_META_MAX_PARTS)
        return kvt_fail(KVT_EINVAL, "remote reads: tier %u, hash_len %u, %u parts", x->tier,
                        x->hash_len, x->parts);
    if (x->n_owners > KVT_META_MAX_OWNERS || x->n_srcs > KVT_META_MAX_BLOCKS)
        return kvt_fail(KVT_ELIMIT, "remote reads: %u owners, %u sources", x->n_owners, x->n_srcs);
    if ((x->n_owners && !x->owners) || (x->n_srcs && !x->srcs) ||
        (x->n_pubs && (!x->pub_blocks || !x->pub_hashes)))
        return kvt_fail(KVT_EINVAL, "remote reads: NULL list");
    int rc = check_blocks(x->pub_blocks, x->n_pubs, "remote publications");
    if (!rc)
        rc = check_blocks(x->withdraw_blocks, x->n_withdraws, "remote withdrawals");
    if (rc)
        return rc;
    const kvt_tier_xfers *t = &m->tiers[x->tier - 1];
    if (t->n_stores)
        return kvt_fail(KVT_EINVAL, "remote reads: remote tier %u has %u write-backs", x->tier,
                        t->n_stores);
    if ((t->n_loads == 0) != (x->n_srcs == 0))
        return kvt_fail(KVT_EINVAL, "remote reads: tier %u with %u loads and %u sources", x->tier,
                        t->n_loads, x->n_srcs);
    for (uint32_t i = 0; i < t->n_loads; i++)
        if (t->load_src[i] > x->n_srcs)
            return kvt_fail(KVT_EINVAL, "remote reads: load %u names source %u of %u", i,
                            t->load_src[i], x->n_srcs);
    for (uint32_t i = 0; i < x->n_srcs * x->parts; i++) {
        if (x->srcs[i].owner >= x->n_owners)
            return kvt_fail(KVT_EINVAL, "remote reads: source %u names owner %u of %u",
                            i / x->parts, x->srcs[i].owner, x->n_owners);
        if (i % x->parts && memcmp(x->srcs[i].hash, x->srcs[i - 1].hash, x->hash_len) != 0)
            return kvt_fail(KVT_EINVAL, "remote reads: source %u: parts of other hashes",
                            i / x->parts);
    }
    for (uint32_t i = 0; i < x->n_owners; i++) {
        const kvt_remote_owner *o = &x->owners[i];
        rc = kvi_meta_check_str(o->instance, 1, "remote owner instance");
        if (!rc)
            rc = kvi_meta_check_str(o->endpoint, 1, "remote owner endpoint");
        if (!rc && (o->instance.len > 64 || o->endpoint.len > 80))
            rc = kvt_fail(KVT_EINVAL,
                          "remote owner %u: instance of %u bytes (at most 64), endpoint of %u "
                          "(at most 80)",
                          i, o->instance.len, o->endpoint.len);
        if (rc)
            return rc;
    }
    return 0;
}

static bool has_load_event(const kvt_offload_meta *m, int64_t event)
{
    uint32_t lo = 0, hi = m->n_load_events;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (m->load_events[mid] < event)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < m->n_load_events && m->load_events[lo] == event;
}

int kvt_offload_meta_validate(const kvt_offload_meta *m)
{
    int rc;
    if (!m)
        return kvt_fail(KVT_EINVAL, "meta: NULL offload metadata");
    if ((rc = check_event(m->load_event, m->n_loads, "load_event")) ||
        (rc = check_blocks(m->load_gpu_blocks, m->n_loads, "load_gpu_blocks")) ||
        (rc = check_blocks(m->load_cpu_blocks, m->n_loads, "load_cpu_blocks")) ||
        (rc = check_event(m->store_event, m->n_stores, "store_event")) ||
        (rc = check_blocks(m->store_gpu_blocks, m->n_stores, "store_gpu_blocks")) ||
        (rc = check_blocks(m->store_cpu_blocks, m->n_stores, "store_cpu_blocks")) ||
        (rc = check_blocks(m->load_invalid_blocks, m->n_load_invalid, "load_invalid_blocks")))
        return rc;
    for (uint32_t t = 0; t < KVT_MAX_TIERS - 1; t++) {
        const kvt_tier_xfers *x = &m->tiers[t];
        if ((rc = check_event(x->load_event, x->n_loads, "tier load_event")) ||
            (rc = check_blocks(x->load_src, x->n_loads, "tier load_src")) ||
            (rc = check_blocks(x->load_dst, x->n_loads, "tier load_dst")) ||
            (rc = check_event(x->store_event, x->n_stores, "tier store_event")) ||
            (rc = check_blocks(x->store_src, x->n_stores, "tier store_src")) ||
            (rc = check_blocks(x->store_dst, x->n_stores, "tier store_dst"))) {
            char what[16];
            snprintf(what, sizeof(what), "tier %u", t + 1);
            return kvi_fail_wrap(rc, what);
        }
    }
    if (m->n_load_invalid > m->n_loads)
        return kvt_fail(KVT_EINVAL, "load_invalid_blocks: %u entries but the load event has %u",
                        m->n_load_invalid, m->n_loads);
    if ((rc = check_remote(m)))
        return rc;
    if (m->n_load_events > KVT_META_MAX_ITEMS || m->n_load_reqs > KVT_META_MAX_ITEMS)
        return kvt_fail(KVT_ELIMIT, "load_event_to_reqs: more than %u entries", KVT_META_MAX_ITEMS);
    if (m->n_load_events && (!m->load_events || !m->load_req_first || !m->load_req_ids))
        return kvt_fail(KVT_EINVAL, "load_event_to_reqs: NULL list");
    if (m->n_load_events == 0 && m->n_load_reqs != 0)
        return kvt_fail(KVT_EINVAL, "load_event_to_reqs: %u request ids without events",
                        m->n_load_reqs);
    for (uint32_t i = 0; i < m->n_load_events; i++) {
        if (m->load_events[i] < 0 || (i && m->load_events[i] <= m->load_events[i - 1]))
            return kvt_fail(KVT_EINVAL,
                            "load_event_to_reqs: event %lld at index %u is negative "
                            "or not ascending",
                            (long long)m->load_events[i], i);
        uint32_t first = m->load_req_first[i], end = m->load_req_first[i + 1];
        if ((i == 0 && first != 0) || end <= first || end > m->n_load_reqs)
            return kvt_fail(KVT_EINVAL,
                            "load_event_to_reqs: event %lld has a bad request range "
                            "[%u, %u)",
                            (long long)m->load_events[i], first, end);
    }
    if (m->n_load_events && m->load_req_first[m->n_load_events] != m->n_load_reqs)
        return kvt_fail(KVT_EINVAL, "load_event_to_reqs: ranges cover %u of %u request ids",
                        m->load_req_first[m->n_load_events], m->n_load_reqs);
    for (uint32_t i = 0; i < m->n_load_reqs; i++)
        if ((rc = kvi_meta_check_str(m->load_req_ids[i], 1, "load_event_to_reqs request id")))
            return rc;
    if (m->load_event != KVT_NO_EVENT && !has_load_event(m, m->load_event))
        return kvt_fail(KVT_EINVAL, "load_event %lld is missing from load_event_to_reqs",
                        (long long)m->load_event);
    return 0;
}

static bool remote_equal(const kvt_remote_reads *a, const kvt_remote_reads *b)
{
    if (a->tier != b->tier || a->n_owners != b->n_owners || a->n_srcs != b->n_srcs ||
        (a->tier && (a->hash_len != b->hash_len || a->parts != b->parts)) ||
        a->n_pubs != b->n_pubs || a->n_withdraws != b->n_withdraws ||
        a->withdraw_all != b->withdraw_all ||
        !kvi_meta_blocks_equal(a->pub_blocks, b->pub_blocks, a->n_pubs) ||
        !kvi_meta_blocks_equal(a->withdraw_blocks, b->withdraw_blocks, a->n_withdraws) ||
        (a->n_pubs && memcmp(a->pub_hashes, b->pub_hashes, (size_t)a->n_pubs * a->hash_len) != 0))
        return false;
    for (uint32_t i = 0; i < a->n_owners; i++)
        if (!kvi_str_equal(a->owners[i].instance, b->owners[i].instance) ||
            !kvi_str_equal(a->owners[i].endpoint, b->owners[i].endpoint) ||
            a->owners[i].epoch != b->owners[i].epoch)
            return false;
    for (uint32_t i = 0; i < a->n_srcs * (a->tier ? a->parts : 0); i++) {
        const kvt_remote_src *x = &a->srcs[i], *y = &b->srcs[i];
        if (x->owner != y->owner || x->slot != y->slot || x->generation != y->generation ||
            memcmp(x->hash, y->hash, a->hash_len) != 0)
            return false;
    }
    return true;
}

bool kvt_offload_meta_equal(const kvt_offload_meta *a, const kvt_offload_meta *b)
{
    if (a->load_event != b->load_event || a->store_event != b->store_event ||
        a->need_flush != b->need_flush || a->n_loads != b->n_loads || a->n_stores != b->n_stores ||
        a->n_load_events != b->n_load_events || a->n_load_reqs != b->n_load_reqs ||
        a->n_load_invalid != b->n_load_invalid ||
        !kvi_meta_blocks_equal(a->load_invalid_blocks, b->load_invalid_blocks, a->n_load_invalid))
        return false;
    for (uint32_t t = 0; t < KVT_MAX_TIERS - 1; t++) {
        const kvt_tier_xfers *x = &a->tiers[t], *y = &b->tiers[t];
        if (x->load_event != y->load_event || x->store_event != y->store_event ||
            x->n_loads != y->n_loads || x->n_stores != y->n_stores ||
            !kvi_meta_blocks_equal(x->load_src, y->load_src, x->n_loads) ||
            !kvi_meta_blocks_equal(x->load_dst, y->load_dst, x->n_loads) ||
            !kvi_meta_blocks_equal(x->store_src, y->store_src, x->n_stores) ||
            !kvi_meta_blocks_equal(x->store_dst, y->store_dst, x->n_stores))
            return false;
    }
    if (!kvi_meta_blocks_equal(a->load_gpu_blocks, b->load_gpu_blocks, a->n_loads) ||
        !kvi_meta_blocks_equal(a->load_cpu_blocks, b->load_cpu_blocks, a->n_loads) ||
        !kvi_meta_blocks_equal(a->store_gpu_blocks, b->store_gpu_blocks, a->n_stores) ||
        !kvi_meta_blocks_equal(a->store_cpu_blocks, b->store_cpu_blocks, a->n_stores))
        return false;
    for (uint32_t i = 0; i < a->n_load_events; i++)
        if (a->load_events[i] != b->load_events[i] ||
            a->load_req_first[i + 1] != b->load_req_first[i + 1])
            return false;
    for (uint32_t i = 0; i < a->n_load_reqs; i++)
        if (!kvi_str_equal(a->load_req_ids[i], b->load_req_ids[i]))
            return false;
    return remote_equal(&a->remote, &b->remote);
}

/* A tier section is written only when the tier moves something this step (validated: an
 * event is KVT_NO_EVENT exactly when its lists are empty). */
static bool xfers_empty(const kvt_tier_xfers *x)
{
    return x->load_event == KVT_NO_EVENT && x->store_event == KVT_NO_EVENT;
}

static uint32_t xfers_sections(const kvt_offload_meta *m)
{
    uint32_t n = 0;
    for (uint32_t t = 0; t < KVT_MAX_TIERS - 1; t++)
        n += !xfers_empty(&m->tiers[t]);
    return n;
}

size_t kvt_offload_meta_encoded_size(const kvt_offload_meta *m)
{
    size_t n = KVT_META_HEADER_LEN;
    n += 8 + 4 + 4 * (size_t)m->n_loads + 4 + 4 * (size_t)m->n_loads;
    n += 4 + 12 * (size_t)m->n_load_events;
    for (uint32_t i = 0; i < m->n_load_reqs; i++)
        n += 4 + m->load_req_ids[i].len;
    n += 8 + 4 + 4 * (size_t)m->n_stores + 4 + 4 * (size_t)m->n_stores;
    n += 1;
    n += 4 + 4 * (size_t)m->n_load_invalid;
    n += 1;
    for (uint32_t t = 0; t < KVT_MAX_TIERS - 1; t++)
        if (!xfers_empty(&m->tiers[t]))
            n += 1 + 8 + 8 + 8 * (size_t)m->tiers[t].n_loads + 8 + 8 +
                 8 * (size_t)m->tiers[t].n_stores;
    n += 1;
    const kvt_remote_reads *x = &m->remote;
    if (x->tier) {
        n += 1 + 1 + 4 + 4 + (x->hash_len + 16 * (size_t)x->parts) * x->n_srcs;
        for (uint32_t i = 0; i < x->n_owners; i++)
            n += 4 + x->owners[i].instance.len + 4 + x->owners[i].endpoint.len + 8;
        n += 1 + 4 + (4 + (size_t)x->hash_len) * x->n_pubs + 4 + 4 * (size_t)x->n_withdraws;
    }
    return n;
}

static void wr_remote(kvi_wr *w, const kvt_remote_reads *x)
{
    wr_u8(w, (uint8_t)x->tier);
    if (!x->tier)
        return;
    wr_u8(w, (uint8_t)x->hash_len);
    wr_u8(w, (uint8_t)x->parts);
    wr_u32(w, x->n_owners);
    for (uint32_t i = 0; i < x->n_owners; i++) {
        wr_str(w, x->owners[i].instance);
        wr_str(w, x->owners[i].endpoint);
        wr_u64(w, x->owners[i].epoch);
    }
    wr_u32(w, x->n_srcs);
    for (uint32_t i = 0; i < x->n_srcs; i++) {
        const kvt_remote_src *s = &x->srcs[(size_t)i * x->parts];
        memcpy(w->p, s->hash, x->hash_len);
        w->p += x->hash_len;
        for (uint32_t k = 0; k < x->parts; k++) {
            wr_u32(w, s[k].owner);
            wr_u32(w, s[k].slot);
            wr_u64(w, s[k].generation);
        }
    }
    wr_u8(w, x->withdraw_all ? 1 : 0);
    wr_u32(w, x->n_pubs);
    for (uint32_t i = 0; i < x->n_pubs; i++) {
        wr_u32(w, x->pub_blocks[i]);
        memcpy(w->p, x->pub_hashes + (size_t)i * x->hash_len, x->hash_len);
        w->p += x->hash_len;
    }
    kvi_meta_wr_blocks(w, x->withdraw_blocks, x->n_withdraws);
}

int kvt_offload_meta_encode(const kvt_offload_meta *m, void *buf, size_t cap, size_t *len)
{
    int rc = kvt_offload_meta_validate(m);
    if (rc)
        return kvi_fail_wrap(rc, "meta: encode offload metadata");
    size_t need = kvt_offload_meta_encoded_size(m);
    if ((rc = kvi_wire_check_out(buf, cap, need, len)))
        return rc;
    kvi_wr w = {buf};
    kvi_wire_header(&w, KVT_META_OFFLOAD, need - KVT_META_HEADER_LEN);
    wr_u64(&w, (uint64_t)m->load_event);
    kvi_meta_wr_blocks(&w, m->load_gpu_blocks, m->n_loads);
    kvi_meta_wr_blocks(&w, m->load_cpu_blocks, m->n_loads);
    wr_u32(&w, m->n_load_events);
    for (uint32_t i = 0; i < m->n_load_events; i++) {
        wr_u64(&w, (uint64_t)m->load_events[i]);
        uint32_t first = m->load_req_first[i], end = m->load_req_first[i + 1];
        wr_u32(&w, end - first);
        for (uint32_t k = first; k < end; k++)
            wr_str(&w, m->load_req_ids[k]);
    }
    wr_u64(&w, (uint64_t)m->store_event);
    kvi_meta_wr_blocks(&w, m->store_gpu_blocks, m->n_stores);
    kvi_meta_wr_blocks(&w, m->store_cpu_blocks, m->n_stores);
    wr_u8(&w, m->need_flush ? 1 : 0);
    kvi_meta_wr_blocks(&w, m->load_invalid_blocks, m->n_load_invalid);
    wr_u8(&w, (uint8_t)xfers_sections(m));
    for (uint32_t t = 0; t < KVT_MAX_TIERS - 1; t++) {
        const kvt_tier_xfers *x = &m->tiers[t];
        if (xfers_empty(x))
            continue;
        wr_u8(&w, (uint8_t)(t + 1));
        wr_u64(&w, (uint64_t)x->load_event);
        kvi_meta_wr_blocks(&w, x->load_src, x->n_loads);
        kvi_meta_wr_blocks(&w, x->load_dst, x->n_loads);
        wr_u64(&w, (uint64_t)x->store_event);
        kvi_meta_wr_blocks(&w, x->store_src, x->n_stores);
        kvi_meta_wr_blocks(&w, x->store_dst, x->n_stores);
    }
    wr_remote(&w, &m->remote);
    return 0;
}

/* The tier sections of both messages: a count, then sections each opening with its tier,
 * strictly ascending in 1 .. KVT_MAX_TIERS - 1. */
/* Reads a pair of block lists of equal length (names what_a / what_b) into *a / *b. */
static int rd_block_pair(kvi_rd *r, uint32_t **a, uint32_t **b, uint32_t *cap, uint32_t *n,
                         const char *what_a, const char *what_b)
{
    uint32_t n_a, n_b;
    int rc = rd_count(r, &n_a, KVT_META_MAX_BLOCKS, 4, what_a);
    if (rc)
        return rc;
    const uint8_t *pa = r->p;
    r->p += (size_t)n_a * 4;
    if ((rc = rd_count(r, &n_b, KVT_META_MAX_BLOCKS, 4, what_b)))
        return rc;
    if (n_b != n_a)
        return kvt_fail(KVT_EPROTO, "%s has %u entries but %s has %u", what_a, n_a, what_b, n_b);
    const uint8_t *pb = r->p;
    r->p += (size_t)n_b * 4;
    if ((rc = grow_pair(a, b, cap, n_a)))
        return rc;
    for (uint32_t i = 0; i < n_a; i++) {
        (*a)[i] = ld_le32(pa + 4 * (size_t)i);
        (*b)[i] = ld_le32(pb + 4 * (size_t)i);
    }
    *n = n_a;
    return 0;
}

/* The remote reads' section (validated with the rest by the caller). */
static int rd_remote(kvi_rd *r, kvt_offload_meta *m)
{
    uint8_t tier, hl, parts;
    uint32_t n;
    kvt_remote_reads *x = &m->remote;
    int rc = rd_u8(r, &tier, "remote tier");
    if (rc || tier == 0)
        return rc;
    if ((rc = rd_u8(r, &hl, "remote hash_len")) || (rc = rd_u8(r, &parts, "remote parts")))
        return rc;
    if (tier >= KVT_MAX_TIERS || hl == 0 || hl > KVT_META_MAX_HASH || parts == 0 ||
        parts > KVT_META_MAX_PARTS)
        return kvt_fail(KVT_EPROTO, "remote reads: tier %u, hash_len %u, %u parts", tier, hl,
                        parts);
    if ((rc = rd_count(r, &n, KVT_META_MAX_OWNERS, 16, "remote owners")) ||
        (rc = kvi_meta_grow((void **)&m->remote.owners, &m->remote.cap_owners, n,
                            sizeof(*m->remote.owners))))
        return rc;
    for (uint32_t i = 0; i < n; i++) {
        kvt_remote_owner *o = &m->remote.owners[i];
        if ((rc = kvi_meta_rd_str_copy(r, &m->strings, &o->instance, "remote owner instance")) ||
            (rc = kvi_meta_rd_str_copy(r, &m->strings, &o->endpoint, "remote owner endpoint")) ||
            (rc = rd_u64(r, &o->epoch, "remote owner epoch")))
            return rc;
        m->remote.n_owners = i + 1;
    }
    if ((rc = rd_count(r, &n, KVT_META_MAX_BLOCKS, hl + 16 * (size_t)parts, "remote sources")) ||
        (rc = kvi_meta_grow((void **)&x->srcs, &x->cap_srcs, n * parts, sizeof(*x->srcs))))
        return rc;
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *hash = r->p;
        r->p += hl;
        for (uint32_t k = 0; k < parts; k++) {
            kvt_remote_src *s = &x->srcs[(size_t)i * parts + k];
            memset(s, 0, sizeof(*s));
            s->owner = ld_le32(r->p);
            s->slot = ld_le32(r->p + 4);
            s->generation = ld_le64(r->p + 8);
            memcpy(s->hash, hash, hl);
            r->p += 16;
        }
    }
    x->n_srcs = n;
    x->tier = tier;
    x->hash_len = hl;
    x->parts = parts;
    uint8_t all;
    if ((rc = rd_u8(r, &all, "remote withdraw_all")))
        return rc;
    if (all > 1)
        return kvt_fail(KVT_EPROTO, "remote withdraw_all: %u", all);
    x->withdraw_all = all;
    uint32_t ca, ch;
    if ((rc = rd_count(r, &n, KVT_META_MAX_BLOCKS, 4 + (size_t)hl, "remote publications")) ||
        (ca = ch = x->cap_pubs,
         (rc = kvi_meta_grow((void **)&x->pub_blocks, &ca, n, sizeof(uint32_t)))) ||
        (rc = kvi_meta_grow((void **)&x->pub_hashes, &ch, n, KVT_META_MAX_HASH)))
        return rc;
    x->cap_pubs = ca < ch ? ca : ch;
    for (uint32_t i = 0; i < n; i++) {
        x->pub_blocks[i] = ld_le32(r->p);
        memcpy(x->pub_hashes + (size_t)i * hl, r->p + 4, hl);
        r->p += 4 + (size_t)hl;
    }
    x->n_pubs = n;
    return kvi_meta_rd_blocks(r, &x->withdraw_blocks, &x->cap_withdraws, &x->n_withdraws,
                              "remote withdrawals");
}

static int decode_offload(void *obj, kvi_rd *r)
{
    kvt_offload_meta *m = obj;
    int rc;
    if ((rc = rd_i64(r, &m->load_event, "load_event")) ||
        (rc = rd_block_pair(r, &m->load_gpu_blocks, &m->load_cpu_blocks, &m->cap_loads, &m->n_loads,
                            "load_gpu_blocks", "load_cpu_blocks")))
        return rc;
    uint32_t n_events;
    if ((rc = rd_count(r, &n_events, KVT_META_MAX_ITEMS, 12, "load_event_to_reqs")))
        return rc;
    for (uint32_t i = 0; i < n_events; i++) {
        int64_t ev;
        uint32_t n_reqs;
        if ((rc = rd_i64(r, &ev, "load_event_to_reqs event")) ||
            (rc = rd_count(r, &n_reqs, KVT_META_MAX_ITEMS, 4, "load_event_to_reqs requests")))
            return rc;
        if (ev < 0 || (i && ev <= m->load_events[i - 1]))
            return kvt_fail(KVT_EPROTO,
                            "load_event_to_reqs: event %lld is negative or not "
                            "ascending",
                            (long long)ev);
        if (n_reqs == 0)
            return kvt_fail(KVT_EPROTO, "load_event_to_reqs: event %lld has no requests",
                            (long long)ev);
        for (uint32_t k = 0; k < n_reqs; k++) {
            const char *s = NULL;
            uint32_t len;
            if ((rc = rd_str(r, &s, &len, "load request id")) ||
                (rc = kvt_offload_meta_add_load_req(m, ev, s, len)))
                return rc;
        }
    }
    if ((rc = rd_i64(r, &m->store_event, "store_event")) ||
        (rc = rd_block_pair(r, &m->store_gpu_blocks, &m->store_cpu_blocks, &m->cap_stores,
                            &m->n_stores, "store_gpu_blocks", "store_cpu_blocks")) ||
        (rc = rd_bool(r, &m->need_flush, "need_flush")) ||
        (rc = kvi_meta_rd_blocks(r, &m->load_invalid_blocks, &m->cap_invalid, &m->n_load_invalid,
                                 "load_invalid_blocks")))
        return rc;
    uint8_t n_tiers, tier = 0;
    if ((rc = kvi_meta_rd_tier_count(r, &n_tiers)))
        return rc;
    for (uint32_t i = 0; i < n_tiers; i++) {
        if ((rc = kvi_meta_rd_tier(r, i, &tier)))
            return rc;
        kvt_tier_xfers *x = &m->tiers[tier - 1];
        if ((rc = rd_i64(r, &x->load_event, "tier load_event")) ||
            (rc = rd_block_pair(r, &x->load_src, &x->load_dst, &x->cap_loads, &x->n_loads,
                                "tier load_src", "tier load_dst")) ||
            (rc = rd_i64(r, &x->store_event, "tier store_event")) ||
            (rc = rd_block_pair(r, &x->store_src, &x->store_dst, &x->cap_stores, &x->n_stores,
                                "tier store_src", "tier store_dst")))
            return rc;
        if (xfers_empty(x))
            return kvt_fail(KVT_EPROTO, "tier %u: an empty section", tier);
    }
    if ((rc = rd_remote(r, m)))
        return rc;
    return kvt_offload_meta_validate(m);
}

int kvt_offload_meta_decode(kvt_offload_meta *m, const void *buf, size_t len)
{
    kvt_offload_meta_clear(m);
    int rc = kvi_wire_decode(buf, len, KVT_META_OFFLOAD, decode_offload, m,
                             "meta: decode offload metadata");
    if (rc)
        kvt_offload_meta_clear(m);
    return rc;
}
