/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Layouts: the engine's KV tensors reduced to regions of equally strided pages (spec
 * kv-offload §3.1, the newer rule). For a tensor whose block dimension has block_dim_size
 * entries at block_stride bytes, physical_per_block = block_dim_size / num_blocks must be
 * whole, block_bytes = block_stride * physical_per_block, and the raw storage is viewed as
 * (-1, num_blocks, block_bytes): one region per leading index. FlashAttention's (2, N, ...)
 * gives two regions (K and V), FlashInfer/MLA's (N, ...) one, layouts with head groups
 * hoisted outside the block dimension one per group; bytes past the last whole region are
 * padding. Tensors that share storage (many layers in a hybrid or cross-layer allocation)
 * contribute their regions once.
 */
#include <stdlib.h>
#include <string.h>

#include "base/array.h"
#include "base/util.h"
#include "base/error.h"
#include "copy/copy_internal.h"

int kvt_layout_create(int32_t device, uint32_t num_blocks, kvt_layout **out)
{
    *out = NULL;
    if (device < KVT_HOST_DEVICE)
        return kvt_fail(KVT_EINVAL, "layout: device %d invalid", device);
    if (num_blocks == 0)
        return kvt_fail(KVT_EINVAL, "layout: num_blocks must be > 0");
    kvt_layout *l = calloc(1, sizeof(*l));
    if (!l)
        return kvt_fail(KVT_ENOMEM, "layout: out of memory");
    l->device = device;
    l->num_blocks = num_blocks;
    *out = l;
    return 0;
}

void kvt_layout_destroy(kvt_layout *l)
{
    if (!l)
        return;
    free(l->regions);
    free(l->storages);
    free(l);
}

static int grow(kvt_region **arr, uint32_t *cap, uint32_t need)
{
    int rc = kvi_array_grow((void **)arr, cap, need, sizeof(**arr));
    return rc ? kvi_fail_wrap(rc, "layout") : 0;
}

int kvt_layout_add_region(kvt_layout *l, uint64_t base, uint64_t block_bytes)
{
    if (block_bytes == 0)
        return kvt_fail(KVT_EINVAL, "layout: region block size must be > 0");
    uint64_t span;
    if (__builtin_mul_overflow(block_bytes, (uint64_t)l->num_blocks, &span) || base + span < base)
        return kvt_fail(KVT_ERANGE, "layout: region at 0x%llx of %u x %llu bytes overflows",
                        (unsigned long long)base, l->num_blocks, (unsigned long long)block_bytes);
    if (l->n_regions >= KVT_MAX_REGIONS)
        return kvt_fail(KVT_ELIMIT, "layout: more than %u regions", KVT_MAX_REGIONS);
    int rc = grow(&l->regions, &l->cap_regions, l->n_regions + 1);
    if (rc)
        return rc;
    l->regions[l->n_regions++] = (kvt_region){base, block_bytes};
    return 0;
}

/* Registers storage (dedup). Returns 1 if it was already known with the same block size. */
static int add_storage(kvt_layout *l, uint64_t storage, uint64_t block_bytes)
{
    for (uint32_t i = 0; i < l->n_storages; i++) {
        if (l->storages[i].base != storage)
            continue;
        if (l->storages[i].block_bytes != block_bytes)
            return kvt_fail(
                KVT_EINVAL, "layout: storage 0x%llx registered with %llu-byte blocks, now %llu",
                (unsigned long long)storage, (unsigned long long)l->storages[i].block_bytes,
                (unsigned long long)block_bytes);
        return 1;
    }
    if (l->n_storages >= KVT_MAX_TENSORS)
        return kvt_fail(KVT_ELIMIT, "layout: more than %u storages", KVT_MAX_TENSORS);
    int rc = grow(&l->storages, &l->cap_storages, l->n_storages + 1);
    if (rc)
        return rc;
    l->storages[l->n_storages++] = (kvt_region){storage, block_bytes};
    return 0;
}

/* Adds the regions of storage viewed as (-1, num_blocks, block_bytes). */
static int add_storage_regions(kvt_layout *l, uint64_t storage, uint64_t storage_bytes,
                               uint64_t block_bytes)
{
    uint64_t span;
    if (__builtin_mul_overflow(block_bytes, (uint64_t)l->num_blocks, &span))
        return kvt_fail(KVT_ERANGE, "layout: block size %llu x %u blocks overflows",
                        (unsigned long long)block_bytes, l->num_blocks);
    if (storage_bytes < span)
        return kvt_fail(KVT_EINVAL,
                        "layout: storage of %llu bytes holds less than one region (%u blocks of "
                        "%llu bytes)",
                        (unsigned long long)storage_bytes, l->num_blocks,
                        (unsigned long long)block_bytes);
    uint64_t n = storage_bytes / span;
    if (l->n_regions + n > KVT_MAX_REGIONS)
        return kvt_fail(KVT_ELIMIT, "layout: more than %u regions", KVT_MAX_REGIONS);
    int rc = add_storage(l, storage, block_bytes);
    if (rc)
        return rc < 0 ? rc : 0;
    uint32_t before = l->n_regions;
    for (uint64_t i = 0; i < n; i++) {
        rc = kvt_layout_add_region(l, storage + i * span, block_bytes);
        if (rc) {
            l->n_regions = before;
            l->n_storages--;
            return rc;
        }
    }
    return 0;
}

int kvt_layout_add_tensor(kvt_layout *l, const kvt_kv_tensor *t)
{
    if (t->device != l->device)
        return kvt_fail(KVT_EINVAL, "layout: tensor on device %d, layout on device %d", t->device,
                        l->device);
    if (t->block_dim_size == 0 || t->block_dim_size % l->num_blocks)
        return kvt_fail(KVT_EINVAL,
                        "layout: block dimension of %llu entries is not a multiple of %u blocks",
                        (unsigned long long)t->block_dim_size, l->num_blocks);
    if (t->block_stride == 0)
        return kvt_fail(KVT_EINVAL, "layout: block stride must be > 0");
    uint64_t per = t->block_dim_size / l->num_blocks, block_bytes;
    if (__builtin_mul_overflow(t->block_stride, per, &block_bytes))
        return kvt_fail(KVT_ERANGE, "layout: block size overflows");
    if (t->size_bytes > t->storage_bytes)
        return kvt_fail(KVT_EINVAL,
                        "layout: tensor size of %llu bytes exceeds its storage of %llu bytes",
                        (unsigned long long)t->size_bytes, (unsigned long long)t->storage_bytes);
    /* the configured size, not the allocation's: padding never becomes a region */
    uint64_t bytes = t->size_bytes ? t->size_bytes : t->storage_bytes;
    return add_storage_regions(l, t->storage, bytes, block_bytes);
}

int kvt_layout_add_cross_layer(kvt_layout *l, uint64_t storage, uint64_t storage_bytes,
                               uint64_t page_per_layer, uint32_t num_layers)
{
    uint64_t unit;
    if (page_per_layer == 0 || num_layers == 0 ||
        __builtin_mul_overflow(page_per_layer, (uint64_t)num_layers, &unit) ||
        __builtin_mul_overflow(unit, (uint64_t)l->num_blocks, &unit))
        return kvt_fail(KVT_EINVAL, "layout: cross-layer page %llu x %u layers invalid",
                        (unsigned long long)page_per_layer, num_layers);
    if (storage_bytes == 0 || storage_bytes % unit)
        return kvt_fail(KVT_EINVAL,
                        "layout: cross-layer storage of %llu bytes is not a multiple of %llu "
                        "(page %llu x %u layers x %u blocks)",
                        (unsigned long long)storage_bytes, (unsigned long long)unit,
                        (unsigned long long)page_per_layer, num_layers, l->num_blocks);
    uint64_t block_bytes = storage_bytes / l->num_blocks;
    return add_storage_regions(l, storage, block_bytes * l->num_blocks, block_bytes);
}

KVI_GETTER(uint32_t, kvt_layout_num_regions, kvt_layout, n_regions)
KVI_GETTER(uint32_t, kvt_layout_num_blocks, kvt_layout, num_blocks)
KVI_GETTER(int32_t, kvt_layout_device, kvt_layout, device)
KVI_GETTER(const kvt_region *, kvt_layout_regions, kvt_layout, regions)

uint64_t kvt_layout_block_bytes(const kvt_layout *l)
{
    uint64_t s = 0;
    for (uint32_t i = 0; i < l->n_regions; i++)
        s += l->regions[i].block_bytes;
    return s;
}
