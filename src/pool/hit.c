/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Longest prefix-cache hit, per group kind and across groups (vLLM's single-type managers and
 * hybrid coordinator, find_longest_cache_hit).
 *
 * Per group of block size bs, with "align" the scheduler block size:
 *   full      scan left to right until the first miss; with EAGLE drop the last block; then
 *             drop blocks until the length is a multiple of align.
 *   sliding   need = max(1, ceil((window - 1) / bs)) consecutive cached blocks (+1 with EAGLE);
 *             scan right to left for the rightmost such run whose right edge is aligned (after
 *             the EAGLE drop); blocks left of the run are null. With no such run, the run of
 *             cached blocks at the very start still counts (the window never filled). Then
 *             the EAGLE drop and alignment as for full attention.
 *   mamba     scan right to left for the rightmost cached block with an aligned right edge;
 *             everything left of it is null. (EAGLE does not apply.)
 *
 * Across groups the coordinator iterates to a fixed point: every group searches with the
 * length the previous groups agreed on, until no group shortens it. Full attention is
 * downward-closed (a hit of L blocks contains every shorter hit), so after its first search
 * it is only truncated. With exactly two groups, full attention first, one pass suffices.
 *
 * With KVT_HIT_PARTIAL on a pool whose groups allow it (full attention and Mamba align, a
 * Mamba align block wider than a hash block; upstream's partial hash hits), lengths are
 * searched in tokens at hash-block granularity: full attention takes its whole blocks and
 * then the longest partly filled next block cached under a key inside it; Mamba align the
 * rightmost state at any hash-block boundary; the same fixed point follows, a full-attention
 * group being truncated to any shorter length (a whole block serves each prefix of itself).
 *
 * Full-attention scans dominate lookup cost (one map probe per block, each a likely cache
 * miss on a large pool), so that loop computes key hashes a few blocks ahead and prefetches
 * their map slots: the probes of consecutive blocks then overlap in the memory system.
 */
#include "base/error.h"
#include "base/util.h"
#include "pool/pool_internal.h"

#define PREFETCH_AHEAD 8u

static inline const uint8_t *hash_at(const struct kvt_pool *p, const uint8_t *hashes, uint32_t step,
                                     uint32_t j)
{
    return hashes + ((size_t)(j + 1) * step - 1) * p->hash_len;
}

/* Block of group g cached under the request's hash at position pos. */
static inline uint32_t lookup_pos(const struct kvt_pool *p, const uint8_t *hashes, uint32_t g,
                                  uint32_t pos)
{
    const uint8_t *h = hashes + (size_t)pos * p->hash_len;
    return kvi_pool_find(p, h, g, kvi_pool_key_hash(p, h, g));
}

/* Block j of group g (step hashes per block), cached under the hash at its end. */
static inline uint32_t lookup_at(const struct kvt_pool *p, const uint8_t *hashes, uint32_t step,
                                 uint32_t g, uint32_t j)
{
    return lookup_pos(p, hashes, g, (j + 1) * step - 1);
}

/* Drops trailing blocks until n * bs is a multiple of align. */
static uint32_t align_down(uint32_t n, uint32_t bs, uint32_t align)
{
    if (bs == align)
        return n;
    return (uint32_t)(((uint64_t)n * bs / align) * align / bs);
}

/* Whole cached blocks from the start (at most n), with map probes prefetched ahead. */
static uint32_t scan_full_raw(const struct kvt_pool *p, const uint8_t *hashes, uint32_t g,
                              uint32_t n, uint32_t *out)
{
    uint32_t step = p->hash_step[g];
    uint64_t kh[PREFETCH_AHEAD];
    uint32_t pre = kvi_min_u32(n, PREFETCH_AHEAD);
    for (uint32_t j = 0; j < pre; j++) {
        kh[j] = kvi_pool_key_hash(p, hash_at(p, hashes, step, j), g);
        kvi_map_prefetch(&p->map, kh[j]);
    }
    uint32_t j = 0;
    for (; j < n; j++) {
        uint64_t h = kh[j % PREFETCH_AHEAD];
        if (j + PREFETCH_AHEAD < n) {
            uint64_t ahead = kvi_pool_key_hash(p, hash_at(p, hashes, step, j + PREFETCH_AHEAD), g);
            kh[(j + PREFETCH_AHEAD) % PREFETCH_AHEAD] = ahead;
            kvi_map_prefetch(&p->map, ahead);
        }
        uint32_t b = kvi_pool_find(p, hash_at(p, hashes, step, j), g, h);
        if (b == KVT_BLOCK_NONE)
            break;
        out[j] = b;
    }
    return j;
}

static uint32_t scan_full(const struct kvt_pool *p, const uint8_t *hashes, uint32_t g, uint32_t n,
                          uint32_t *out)
{
    uint32_t j = scan_full_raw(p, hashes, g, n, out);
    if (p->cfg.eagle && j > 0)
        j--;
    return align_down(j, p->cfg.groups[g].block_size, p->sched_bs);
}

static uint32_t scan_sliding(const struct kvt_pool *p, const uint8_t *hashes, uint32_t g,
                             uint32_t n, uint32_t *out)
{
    const kvt_group_spec *s = &p->cfg.groups[g];
    uint32_t bs = s->block_size, align = p->sched_bs, step = p->hash_step[g];
    uint64_t need = ((uint64_t)s->sliding_window - 1 + bs - 1) / bs;
    if (need < 1)
        need = 1;
    if (p->cfg.eagle)
        need++;
    uint32_t run = 0, len = 0;
    bool found = false;
    for (uint32_t i = n; i-- > 0;) {
        uint32_t b = lookup_at(p, hashes, step, g, i);
        if (b == KVT_BLOCK_NONE) {
            run = 0;
            continue;
        }
        if (run == 0 && bs != align) {
            uint64_t kept = p->cfg.eagle ? i : (uint64_t)i + 1;
            if (kept * bs % align != 0)
                continue;
        }
        out[i] = b;
        if (++run >= need) {
            len = i + run;
            for (uint32_t k = 0; k < i; k++)
                out[k] = KVT_NULL_BLOCK;
            found = true;
            break;
        }
    }
    if (!found)
        len = align_down(run, bs, align); /* the run at the very start: out[0..run) is set */
    if (p->cfg.eagle && len > 0)
        len = align_down(len - 1, bs, align);
    return len;
}

static uint32_t scan_mamba(const struct kvt_pool *p, const uint8_t *hashes, uint32_t g, uint32_t n,
                           uint32_t *out)
{
    uint32_t bs = p->cfg.groups[g].block_size, align = p->sched_bs, step = p->hash_step[g];
    for (uint32_t i = n; i-- > 0;) {
        if (bs != align && (uint64_t)(i + 1) * bs % align != 0)
            continue;
        uint32_t b = lookup_at(p, hashes, step, g, i);
        if (b == KVT_BLOCK_NONE)
            continue;
        for (uint32_t k = 0; k < i; k++)
            out[k] = KVT_NULL_BLOCK;
        out[i] = b;
        return i + 1;
    }
    return 0;
}

/* Blocks of group g that cover at most max_len tokens. */
static uint32_t search_group(const struct kvt_pool *p, const uint8_t *hashes, uint32_t g,
                             uint32_t max_len, uint32_t *out)
{
    uint32_t n = max_len / p->cfg.groups[g].block_size;
    if (n == 0)
        return 0;
    switch (p->cfg.groups[g].kind) {
    case KVT_GROUP_SLIDING:
        return scan_sliding(p, hashes, g, n, out);
    case KVT_GROUP_MAMBA:
    case KVT_GROUP_MAMBA_ALIGN:
        return scan_mamba(p, hashes, g, n, out);
    default:
        return scan_full(p, hashes, g, n, out);
    }
}

/* ---- partial hash hits (KVT_HIT_PARTIAL): lengths in tokens, at hash-block granularity ---- */

/* Full attention: whole cached blocks, then at most one partly valid block after them. n_hashes
 * hashes are known. */
static uint32_t partial_full(const struct kvt_pool *p, const uint8_t *hashes, uint32_t n_hashes,
                             uint32_t g, uint32_t max_len, uint32_t *out)
{
    uint32_t bs = p->cfg.groups[g].block_size, hbs = p->cfg.hash_block_size;
    uint32_t j = max_len / bs ? scan_full_raw(p, hashes, g, max_len / bs, out) : 0;
    uint32_t len = j * bs, room = (max_len - len) / hbs, k = p->hash_step[g];
    if (room > k - 1) /* a miss before max_len: block j is not whole */
        room = k - 1;
    if (room && j == max_len / bs && (j + 1) * k - 1 < n_hashes) {
        /* the cap ends inside block j, not a miss: cached whole, it serves the part before
         * the cap */
        uint32_t b = lookup_pos(p, hashes, g, (j + 1) * k - 1);
        if (b != KVT_BLOCK_NONE) {
            out[j] = b;
            return len + room * hbs;
        }
    }
    for (uint32_t mm = room; mm >= 1; mm--) { /* longest first */
        uint32_t b = lookup_pos(p, hashes, g, j * k + mm - 1);
        if (b != KVT_BLOCK_NONE) {
            out[j] = b;
            return len + mm * hbs;
        }
    }
    return len;
}

/* Mamba align: the rightmost cached state at a hash-block boundary. */
static uint32_t partial_mamba(const struct kvt_pool *p, const uint8_t *hashes, uint32_t g,
                              uint32_t max_len, uint32_t *out)
{
    uint32_t bs = p->cfg.groups[g].block_size, hbs = p->cfg.hash_block_size;
    for (uint32_t pos = max_len / hbs; pos-- > 0;) {
        uint32_t b = lookup_pos(p, hashes, g, pos);
        if (b == KVT_BLOCK_NONE)
            continue;
        uint32_t len = (pos + 1) * hbs, idx = kvi_div_ceil_u32(len, bs) - 1;
        for (uint32_t i = 0; i < idx; i++)
            out[i] = KVT_NULL_BLOCK;
        out[idx] = b;
        return len;
    }
    return 0;
}

/* The coordinator's fixed point with lengths in tokens (only full and Mamba align groups). */
static void partial_hit(const struct kvt_pool *p, const uint8_t *hashes, uint32_t n_hashes,
                        uint32_t hit_len, uint32_t *const *blocks, kvt_hit *hit)
{
    uint32_t len[KVT_MAX_GROUPS] = {0};
    bool searched[KVT_MAX_GROUPS] = {false};
    for (;;) {
        uint32_t curr = hit_len;
        for (uint32_t k = 0; k < p->n_order; k++) {
            uint32_t g = p->order[k];
            if (p->cfg.groups[g].kind == KVT_GROUP_FULL && searched[g]) {
                len[g] = kvi_min_u32(len[g], curr); /* a block serves any prefix of itself */
            } else {
                len[g] = p->cfg.groups[g].kind == KVT_GROUP_FULL
                             ? partial_full(p, hashes, n_hashes, g, curr, blocks[g])
                             : partial_mamba(p, hashes, g, curr, blocks[g]);
                searched[g] = true;
            }
            curr = len[g];
        }
        if (curr >= hit_len)
            break;
        hit_len = curr;
    }
    for (uint32_t k = 0; k < p->n_order; k++) {
        uint32_t g = p->order[k];
        hit->n_blocks[g] = kvi_div_ceil_u32(hit_len, p->cfg.groups[g].block_size);
    }
    hit->length = hit_len;
}

static uint32_t clamp_length(const kvt_pool *p, uint32_t n_hashes, uint32_t max_length)
{
    uint64_t avail = (uint64_t)n_hashes * p->cfg.hash_block_size;
    return avail < max_length ? (uint32_t)avail : max_length;
}

uint32_t kvt_pool_hit_capacity(const kvt_pool *p, uint32_t group, uint32_t n_hashes,
                               uint32_t max_length)
{
    if (group >= p->cfg.n_groups || !kvt_group_kind_cacheable(p->cfg.groups[group].kind))
        return 0;
    uint32_t len = clamp_length(p, n_hashes, max_length), bs = p->cfg.groups[group].block_size;
    return p->partial_ok ? kvi_div_ceil_u32(len, bs) : len / bs;
}

uint32_t kvt_pool_hit_alignment(const kvt_pool *p, uint32_t flags)
{
    return (flags & KVT_HIT_PARTIAL) && p->partial_ok ? p->cfg.hash_block_size : p->sched_bs;
}

int kvt_pool_find_longest_hit(const kvt_pool *p, const uint8_t *hashes, uint32_t n_hashes,
                              uint32_t max_length, uint32_t *const *blocks, kvt_hit *hit)
{
    return kvt_pool_find_longest_hit_flags(p, hashes, n_hashes, max_length, 0, blocks, hit);
}

int kvt_pool_find_longest_hit_flags(const kvt_pool *p, const uint8_t *hashes, uint32_t n_hashes,
                                    uint32_t max_length, uint32_t flags, uint32_t *const *blocks,
                                    kvt_hit *hit)
{
    if (!hit || !blocks || (n_hashes && !hashes))
        return kvt_fail(KVT_EINVAL, "pool: find_longest_hit: NULL argument");
    if (flags & ~KVT_HIT_PARTIAL)
        return kvt_fail(KVT_EINVAL, "pool: find_longest_hit: unknown flags 0x%x",
                        flags & ~KVT_HIT_PARTIAL);
    uint32_t ng = p->cfg.n_groups;
    uint32_t hit_len = clamp_length(p, n_hashes, max_length);
    bool partial = (flags & KVT_HIT_PARTIAL) && p->partial_ok;
    for (uint32_t g = 0; g < ng; g++)
        if (!blocks[g] && kvt_group_kind_cacheable(p->cfg.groups[g].kind) &&
            (partial ? kvi_div_ceil_u32(hit_len, p->cfg.groups[g].block_size)
                     : hit_len / p->cfg.groups[g].block_size))
            return kvt_fail(KVT_EINVAL, "pool: find_longest_hit: output for group %u is NULL", g);
    memset(hit, 0, sizeof(*hit));
    if (partial) {
        partial_hit(p, hashes, n_hashes, hit_len, blocks, hit);
        return 0;
    }

    if (ng == 1) { /* the one group is cacheable (validated) */
        uint32_t n = search_group(p, hashes, 0, hit_len, blocks[0]);
        hit->n_blocks[0] = n;
        hit->length = n * p->cfg.groups[0].block_size;
        return 0;
    }

    bool searched[KVT_MAX_GROUPS] = {false};
    uint32_t *n = hit->n_blocks;
    for (;;) {
        uint32_t curr = hit_len;
        for (uint32_t k = 0; k < p->n_order; k++) { /* cacheable groups only */
            uint32_t g = p->order[k];
            uint32_t bs = p->cfg.groups[g].block_size;
            if (p->cfg.groups[g].kind == KVT_GROUP_FULL && searched[g]) {
                n[g] = kvi_min_u32(n[g], curr / bs);
            } else {
                n[g] = search_group(p, hashes, g, curr, blocks[g]);
                searched[g] = true;
            }
            curr = n[g] * bs;
        }
        if (curr >= hit_len)
            break;
        hit_len = curr;
        if (p->simple_hybrid)
            break;
    }
    for (uint32_t g = 0; g < ng; g++)
        if (p->cfg.groups[g].kind == KVT_GROUP_FULL)
            n[g] = kvi_min_u32(n[g], hit_len / p->cfg.groups[g].block_size);
    hit->length = hit_len;
    return 0;
}
