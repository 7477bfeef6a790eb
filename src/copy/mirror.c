/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Host mirror: the host tier of one rank. One arena backs every region's host array (region
 * r block b at regions[r].base + b * block_bytes), sized exactly: host_blocks x the layout's
 * bytes per block plus alignment, rounded to the page size and never to a power of two
 * (a framework's pinned allocator would turn 100 GB into 128 GB, spec §3.1).
 *
 * Pinning uses cuMemHostRegister on the arena in chunks of pin_chunk bytes (one registration
 * of >= 512 GiB fails on some systems, spec §6); without a driver the mirror stays unpinned.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/cuda.h"
#include "base/error.h"
#include "base/guard.h"
#include "base/shm.h"
#include "base/log.h"
#include "base/util.h"
#include "copy/copy_internal.h"
#include "kvtier/node.h"

#define REGION_ALIGN 4096u

void kvt_mirror_config_init(kvt_mirror_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    kvt_arena_config ac;
    kvt_arena_config_init(&ac);
    cfg->arena_flags = ac.flags;
    cfg->pin = true;
    cfg->pin_chunk = 64ull << 30;
    cfg->numa_node = ac.numa_node;
}

uint32_t kvt_mirror_blocks_for(const kvt_layout *layout, uint64_t capacity_bytes)
{
    uint64_t bpb = kvt_layout_block_bytes(layout);
    if (bpb == 0)
        return 1;
    uint64_t n = capacity_bytes / bpb;
    if (n < 1)
        n = 1;
    return n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
}

static void unpin(kvt_mirror *m)
{
    for (uint32_t i = 0; i < m->n_pins; i++)
        kvi_cuda_host_unregister(m->pins[i]);
    m->n_pins = 0;
    m->pinned = false;
}

static void pin(kvt_mirror *m, uint64_t chunk)
{
    char *base = kvt_arena_base(m->arena);
    size_t size = kvt_arena_size(m->arena), page = kvt_arena_page_size(m->arena);
    if (chunk < page)
        chunk = page;
    chunk -= chunk % page;
    uint32_t n = (uint32_t)((size + chunk - 1) / chunk);
    m->pins = calloc(n, sizeof(*m->pins));
    if (!m->pins) {
        KVT_LOG_W("mirror: out of memory for the pin list; host tier stays unpinned");
        return;
    }
    for (size_t off = 0; off < size; off += chunk) {
        size_t len = size - off < chunk ? size - off : chunk;
        if (kvi_cuda_host_register(base + off, len) != 0) {
            KVT_LOG_W("mirror: cannot pin %zu bytes (%s); host tier stays unpinned, copies are "
                      "slower",
                      len, kvt_last_error());
            unpin(m);
            return;
        }
        m->pins[m->n_pins++] = base + off;
    }
    m->pinned = true;
}

/* The name of the node tier's data object (kvtier/node.h), from its rendezvous. */
static int node_data_name(const kvt_mirror_config *cfg, char *shm, size_t cap)
{
    size_t len = strlen(cfg->node_name);
    kvi_shm_share share;
    char dir[1024], stem[KVT_NODE_NAME_MAX + 40];
    int rc = len == 0 || len > KVT_NODE_NAME_MAX || strchr(cfg->node_name, '/')
                 ? kvt_fail(KVT_EINVAL, "node_name '%s' is not a node tier name", cfg->node_name)
                 : kvi_shm_share_of(cfg->node_group, &share);
    if (!rc && !(rc = kvi_shm_dir(cfg->node_dir, &share, dir, sizeof(dir))))
        rc = kvi_shm_stem(dir, cfg->node_name, &share, true, stem, sizeof(stem));
    if (!rc)
        snprintf(shm, cap, KVI_NODE_SHM_NAME, stem, "data");
    return rc;
}

int kvt_mirror_create(const kvt_mirror_config *cfg, const kvt_layout *layout, kvt_mirror **out)
{
    *out = NULL;
    if (kvi_check_reserved(cfg->reserved, sizeof(cfg->reserved), "mirror config"))
        return KVT_EINVAL;
    if (cfg->host_blocks == 0)
        return kvt_fail(KVT_EINVAL, "mirror: host_blocks must be > 0");
    if (layout->n_regions == 0)
        return kvt_fail(KVT_EINVAL, "mirror: the layout has no regions");
    uint64_t total = 0;
    for (uint32_t r = 0; r < layout->n_regions; r++) {
        uint64_t bytes;
        if (__builtin_mul_overflow(layout->regions[r].block_bytes, (uint64_t)cfg->host_blocks,
                                   &bytes) ||
            __builtin_add_overflow(total, bytes + REGION_ALIGN, &total))
            return kvt_fail(KVT_ERANGE, "mirror: %u host blocks overflow the address space",
                            cfg->host_blocks);
    }
    kvt_mirror *m = calloc(1, sizeof(*m));
    if (m)
        m->regions = calloc(layout->n_regions, sizeof(*m->regions));
    if (!m || !m->regions) {
        free(m);
        return kvt_fail(KVT_ENOMEM, "mirror: out of memory");
    }
    kvt_arena_config ac;
    kvt_arena_config_init(&ac);
    ac.size = total;
    ac.flags = cfg->arena_flags;
    ac.numa_node = cfg->numa_node;
    char shm[KVT_NODE_NAME_MAX + 64];
    int rc = cfg->node_name ? node_data_name(cfg, shm, sizeof(shm)) : 0;
    if (cfg->node_name && !rc) {
        ac.shm_name = shm;
        ac.shm_group = cfg->node_group;
    }
    if (!rc)
        rc = kvt_arena_create(&ac, &m->arena);
    if (rc) {
        free(m->regions);
        free(m);
        return kvi_fail_wrap(rc, "mirror");
    }
    m->num_blocks = cfg->host_blocks;
    m->n_regions = layout->n_regions;
    for (uint32_t r = 0; r < layout->n_regions; r++) {
        void *p;
        uint64_t bpb = layout->regions[r].block_bytes;
        /* cannot fail: the arena was sized for exactly these allocations */
        kvt_arena_alloc(m->arena, bpb * cfg->host_blocks, REGION_ALIGN, &p);
        m->regions[r] = (kvt_region){(uint64_t)(uintptr_t)p, bpb};
    }
    if (cfg->pin && kvt_cuda_available())
        pin(m, cfg->pin_chunk);
    *out = m;
    return 0;
}

void kvt_mirror_destroy(kvt_mirror *m)
{
    if (!m)
        return;
    unpin(m);
    free(m->pins);
    kvt_arena_destroy(m->arena);
    free(m->regions);
    free(m);
}

bool kvi_mirror_poisoned(const kvt_mirror *m)
{
    return m && kvi_guard_poisoned(kvi_arena_guard(m->arena));
}

KVI_GETTER(uint32_t, kvt_mirror_num_blocks, kvt_mirror, num_blocks)
KVI_GETTER(const kvt_region *, kvt_mirror_regions, kvt_mirror, regions)
KVI_GETTER(uint32_t, kvt_mirror_num_regions, kvt_mirror, n_regions)
KVI_GETTER(bool, kvt_mirror_pinned, kvt_mirror, pinned)

int kvt_mirror_layout(const kvt_mirror *m, kvt_layout **out)
{
    if (!m || !out)
        return kvt_fail(KVT_EINVAL, "mirror: layout: NULL argument");
    int rc = kvt_layout_create(KVT_HOST_DEVICE, m->num_blocks, out);
    for (uint32_t i = 0; !rc && i < m->n_regions; i++)
        rc = kvt_layout_add_region(*out, m->regions[i].base, m->regions[i].block_bytes);
    if (rc) {
        kvt_layout_destroy(*out);
        *out = NULL;
    }
    return rc;
}
