/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvtier layout: the vocabulary every transfer between tiers speaks — where a block's bytes
 * are on one rank, and where its copy goes.
 *
 *   kvt_kv_tensor  one KV tensor as the engine allocated it.
 *   kvt_region     an array of num_blocks equally sized, equally strided pages: block b of
 *                  region r lives at regions[r].base + b * regions[r].block_bytes.
 *   kvt_layout     the engine's KV tensors on one device, reduced to regions.
 *   kvt_mirror     the host tier of one rank: for every region of a layout, a host array of
 *                  host_blocks slots of the same size, all in one arena (optionally HugeTLB),
 *                  pinned for DMA when CUDA is present. Slot s of the tier is page s of every
 *                  region's array.
 *   kvt_copy_dir   a transfer's direction: a store goes device -> tier, a load tier -> device.
 *
 * The copy engine (kvtier/copy.h), the disk tier (kvtier/disk.h) and the remote tier
 * (kvtier/remote.h) all move blocks between these.
 *
 * Thread rules: a layout and a mirror are built by one thread and then only read.
 */
#ifndef KVTIER_LAYOUT_H
#define KVTIER_LAYOUT_H

#include "kvtier/base.h"

#ifdef __cplusplus
extern "C" {
#endif

enum kvt_copy_dir {
    KVT_COPY_STORE = 0, /* device -> host */
    KVT_COPY_LOAD = 1   /* host -> device */
};

#define KVT_HOST_DEVICE (-1) /* kvt_kv_tensor.device for tensors in host memory */
#define KVT_MAX_REGIONS 4096u
#define KVT_MAX_TENSORS 4096u

/* ---- layouts ----------------------------------------------------------------------------- */

/* One KV tensor as the engine allocated it. The block dimension has block_dim_size entries
 * (num_blocks times the physical pages per block, which must divide exactly) at block_stride
 * bytes; the storage is viewed as (-1, num_blocks, block_bytes), one region per leading
 * index (FlashAttention's K/V, head groups hoisted outside the block dimension). Regions
 * cover the tensor's configured size (size_bytes) when the engine gives it: an allocator's
 * trailing padding, however large, never becomes a region (spec §2.14). Without it, bytes
 * past the last whole region of the storage are padding and are never copied. Tensors
 * sharing a storage (the same device and storage address) are registered once. */
typedef struct kvt_kv_tensor {
    int32_t device;          /* CUDA ordinal, or KVT_HOST_DEVICE */
    uint64_t storage;        /* address of the storage (not of a view into it) */
    uint64_t storage_bytes;  /* bytes of the storage, padding included */
    uint64_t block_dim_size; /* entries of the block dimension */
    uint64_t block_stride;   /* bytes between consecutive entries of the block dimension */
    uint64_t size_bytes;     /* the tensor's configured size (vLLM's KVCacheTensor.size), at
                                most storage_bytes; 0: unknown, the storage's size is used */
} kvt_kv_tensor;

typedef struct kvt_region {
    uint64_t base;        /* address of block 0 */
    uint64_t block_bytes; /* bytes of one block (= the stride between blocks) */
} kvt_region;

typedef struct kvt_layout kvt_layout;

/* An empty layout for num_blocks blocks (the engine's GPU pool size, null block included) on
 * one device. */
KVT_API int kvt_layout_create(int32_t device, uint32_t num_blocks, kvt_layout **out);
KVT_API void kvt_layout_destroy(kvt_layout *l);
/* Adds a tensor's regions. A tensor whose storage is already registered adds nothing if it
 * derives the same block size (packed HMA: one backing tensor, one view per group) and fails
 * with KVT_EINVAL if not. Fails with KVT_EINVAL on a device mismatch, a block dimension that
 * is not a multiple of num_blocks, a size_bytes beyond the storage, or a size (size_bytes,
 * else storage_bytes) smaller than one region. */
KVT_API int kvt_layout_add_tensor(kvt_layout *l, const kvt_kv_tensor *t);
/* A cross-layer tensor (single KV-cache group): all layers of a block side by side, storage
 * (num_blocks, num_layers, page_per_layer). storage_bytes must be a non-zero multiple of
 * page_per_layer * num_layers * num_blocks; one region of storage_bytes / num_blocks. */
KVT_API int kvt_layout_add_cross_layer(kvt_layout *l, uint64_t storage, uint64_t storage_bytes,
                                       uint64_t page_per_layer, uint32_t num_layers);
/* Adds one region directly (tests, engines with their own layout logic). */
KVT_API int kvt_layout_add_region(kvt_layout *l, uint64_t base, uint64_t block_bytes);
KVT_API uint32_t kvt_layout_num_regions(const kvt_layout *l);
KVT_API uint32_t kvt_layout_num_blocks(const kvt_layout *l);
KVT_API int32_t kvt_layout_device(const kvt_layout *l);
KVT_API const kvt_region *kvt_layout_regions(const kvt_layout *l);
/* Sum of the regions' block sizes: the bytes one block occupies on this rank. */
KVT_API uint64_t kvt_layout_block_bytes(const kvt_layout *l);

/* ---- host mirror ------------------------------------------------------------------------- */

typedef struct kvt_mirror_config {
    uint32_t host_blocks;   /* pages per region, null block included (the manager's handshake) */
    unsigned arena_flags;   /* kvt_arena_flags; default POPULATE | DONTFORK | THP */
    bool pin;               /* register with CUDA for DMA when a driver is present; default true.
                               Without a driver, or if registration fails, the mirror stays
                               unpinned (a warning is logged; copies still work, slower) */
    uint64_t pin_chunk;     /* bytes per cuMemHostRegister call; default 64 GiB (one call
                               >= 512 GiB fails on some systems) */
    const char *node_name;  /* NULL: the rank's own host tier (default). Else the data region
                               of node tier node_name (kvtier/node.h), shared by the replicas on
                               the node: host_blocks must be its kvt_node_num_slots, and every
                               replica's layout must have the same block bytes */
    const char *node_group; /* with node_name: the node tier's group (kvt_node_config.group);
                               NULL: this user only */
    int32_t numa_node;      /* the NUMA node of the mirror's memory (kvt_arena_config's);
                               -1 (config_init): no preference. Choose the GPU's node: a host
                               tier on the far socket halves what the link can carry */
    const char *node_dir;   /* with node_name: the node tier's rendezvous directory
                               (kvt_node_config.dir); NULL: the default */
    /* room for fields to come, so the struct keeps its size: zero (as *_config_init
     * leaves it); a create refuses a config whose room is not zero */
    uint64_t reserved[4];
} kvt_mirror_config;

typedef struct kvt_mirror kvt_mirror;

KVT_API void kvt_mirror_config_init(kvt_mirror_config *cfg);
/* Allocates one arena holding a host array per region of layout (region-major: all pages of
 * region 0, then region 1, ...), each array 4 KiB aligned, zero-filled by the kernel. The
 * arena is sized exactly (rounded to the page size, never to a power of two). */
KVT_API int kvt_mirror_create(const kvt_mirror_config *cfg, const kvt_layout *layout,
                              kvt_mirror **out);
/* Unpins and unmaps. The caller guarantees no copy still reads or writes it. */
KVT_API void kvt_mirror_destroy(kvt_mirror *m);
KVT_API uint32_t kvt_mirror_num_blocks(const kvt_mirror *m);
KVT_API const kvt_region *kvt_mirror_regions(const kvt_mirror *m);
KVT_API uint32_t kvt_mirror_num_regions(const kvt_mirror *m);
KVT_API bool kvt_mirror_pinned(const kvt_mirror *m);
/* A host layout over the mirror's arrays (same regions, mirror->num_blocks blocks): the layout
 * a three-tier disk is created over (kvt_disk_create, kvt_worker_attach_disk). The mirror
 * must outlive it. */
KVT_API int kvt_mirror_layout(const kvt_mirror *m, kvt_layout **out);
/* Host blocks that fit in capacity_bytes for this layout: max(1, capacity / block bytes). */
KVT_API uint32_t kvt_mirror_blocks_for(const kvt_layout *layout, uint64_t capacity_bytes);

#ifdef __cplusplus
}
#endif

#endif
