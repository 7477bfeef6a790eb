/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The engine's GPU pool as the offload manager sees it. Either a kvt_pool that kvtier keeps for
 * the engine, or the engine's own allocator (vLLM's BlockPool) reached through
 * kvt_gpu_pool_ops: the manager needs very little of it — pin and unpin the blocks a transfer
 * reads or writes, the keys of blocks it stores, and for the optional policies a walk of the
 * free queue (lazy stores) and a key lookup (re-stores).
 *
 * Pins and unpins are batched: an engine's callbacks may be written in a slow language, and one
 * call for the 500 blocks of a store event costs what one call costs. A batch holds one
 * direction; switching direction, filling the buffer or reaching the end of an operation
 * hands it over, so the engine sees exactly the order of references the manager made. With
 * defer_schedule_pins the pins of the eager selections of a whole step make one batch: they
 * wait in the buffer from kvt_offload_schedule_hashed to the next other call.
 *
 * With an engine's own pool the keys of a block come from the request's chained hashes, as
 * vLLM keys its prefix cache: block j of a group whose blocks span k hash blocks is known by
 * hash (j + 1) * k - 1 and the group id.
 */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "offload/offload_internal.h"
#include "pool/pool_internal.h"

int kvi_ofl_gpu_setup(kvt_offload *m)
{
    m->gbuf = malloc((size_t)m->gpu_nb * sizeof(uint32_t));
    if (!m->gbuf)
        return kvt_fail(KVT_ENOMEM, "offload: cannot allocate the GPU pin buffer");
    if (!m->ext)
        return 0;
    m->selkeys = malloc((size_t)m->tier[0].nb * m->key_stride);
    if (!m->selkeys)
        return kvt_fail(KVT_ENOMEM, "offload: cannot allocate key buffers");
    if (m->target_free) {
        m->scan_ids = malloc((size_t)m->target_free * sizeof(uint32_t));
        m->scan_keys = malloc((size_t)m->target_free * sizeof(kvt_pool_key));
        if (!m->scan_ids || !m->scan_keys)
            return kvt_fail(KVT_ENOMEM, "offload: cannot allocate the lazy scan window");
    }
    return 0;
}

void kvi_ofl_gpu_teardown(kvt_offload *m)
{
    free(m->gbuf);
    free(m->selkeys);
    free(m->scan_ids);
    free(m->scan_keys);
    m->gbuf = m->scan_ids = NULL;
    m->selkeys = NULL;
    m->scan_keys = NULL;
}

void kvi_ofl_gpu_flush(kvt_offload *m)
{
    uint32_t n = m->gbuf_n;
    if (!n)
        return;
    m->gbuf_n = 0;
    if (m->ext) {
        if (m->gbuf_pin)
            m->gops.touch(m->gctx, m->gbuf, n);
        else
            m->gops.free(m->gctx, m->gbuf, n);
    } else if (m->gbuf_pin) {
        (void)kvt_pool_touch(m->gpu, m->gbuf, n); /* ids were checked: cannot fail */
    } else {
        (void)kvt_pool_free(m->gpu, m->gbuf, n); /* every unpin matches a pin */
    }
}

void kvi_ofl_gpu_flush_unless_deferred(kvt_offload *m)
{
    if (!m->in_schedule)
        kvi_ofl_gpu_flush(m);
}

static void gbuf_add(kvt_offload *m, uint32_t id, bool pin)
{
    if (m->gbuf_n && (m->gbuf_pin != pin || m->gbuf_n == m->gpu_nb))
        kvi_ofl_gpu_flush(m);
    m->gbuf_pin = pin;
    m->gbuf[m->gbuf_n++] = id;
}

void kvi_ofl_gpu_pin(kvt_offload *m, uint32_t id)
{
    gbuf_add(m, id, true);
}

void kvi_ofl_gpu_unpin(kvt_offload *m, uint32_t id)
{
    gbuf_add(m, id, false);
}

bool kvi_ofl_gpu_primary(const kvt_offload *m, uint32_t gpu, kvt_pool_key *k)
{
    uint32_t n = 0;
    if (m->ext)
        return false;
    (void)kvt_pool_block_keys(m->gpu, gpu, k, 1, &n);
    return n > 0;
}

bool kvi_ofl_gpu_can_lookup(const kvt_offload *m)
{
    return !m->ext || m->gops.lookup;
}

uint32_t kvi_ofl_gpu_lookup(const kvt_offload *m, const kvt_pool_key *k, uint32_t *ref)
{
    *ref = 0;
    if (m->ext) {
        if (!m->gops.lookup)
            return KVT_BLOCK_NONE;
        uint32_t b = m->gops.lookup(m->gctx, k->hash, k->group, ref);
        /* an engine's answer is checked like any input: a wrong id must not index our arrays */
        return (b == KVT_NULL_BLOCK || b >= m->gpu_nb) ? KVT_BLOCK_NONE : b;
    }
    return kvi_ofl_gpu_lookup_kh(m, k, kvi_pool_key_hash(m->gpu, k->hash, k->group), ref);
}

uint32_t kvi_ofl_gpu_lookup_kh(const kvt_offload *m, const kvt_pool_key *k, uint64_t kh,
                               uint32_t *ref)
{
    *ref = 0;
    uint32_t b = k->group < m->ng ? kvi_pool_find(m->gpu, k->hash, k->group, kh) : KVT_BLOCK_NONE;
    if (b == KVT_BLOCK_NONE)
        return KVT_BLOCK_NONE;
    *ref = m->gpu->blocks[b].ref;
    return b;
}

bool kvi_ofl_key_from_hashes(const kvt_offload *m, const uint8_t *hashes, uint32_t n_hashes,
                             uint32_t g, uint32_t j, kvt_pool_key *k)
{
    uint32_t bs = m->gcfg.groups[g].block_size, step = bs / m->gcfg.hash_block_size;
    uint64_t idx = ((uint64_t)j + 1) * step - 1;
    if (!hashes || idx >= n_hashes)
        return false;
    kvi_ofl_key_set(m, hashes + idx * m->hash_len, g, bs, k);
    return true;
}

void kvi_ofl_key_set(const kvt_offload *m, const uint8_t *hash, uint32_t group, uint32_t num_tokens,
                     kvt_pool_key *k)
{
    memset(k->hash, 0, sizeof(k->hash));
    memcpy(k->hash, hash, m->hash_len);
    k->group = group;
    k->num_tokens = num_tokens;
}

void kvi_ofl_key_pack(const kvt_offload *m, uint8_t *dst, const kvt_pool_key *k)
{
    memcpy(dst, k->hash, m->hash_len);
    memcpy(dst + m->hash_len, &k->group, sizeof(uint32_t));
    memcpy(dst + m->hash_len + sizeof(uint32_t), &k->num_tokens, sizeof(uint32_t));
}

void kvi_ofl_key_unpack(const kvt_offload *m, const uint8_t *src, kvt_pool_key *k)
{
    memset(k->hash, 0, sizeof(k->hash));
    memcpy(k->hash, src, m->hash_len);
    memcpy(&k->group, src + m->hash_len, sizeof(uint32_t));
    memcpy(&k->num_tokens, src + m->hash_len + sizeof(uint32_t), sizeof(uint32_t));
}
