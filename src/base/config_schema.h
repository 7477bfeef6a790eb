/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The public configuration structs, one row per field in the header's order (test_describe
 * holds the rows to the struct: every field, in order, nothing else). From these rows come
 * what *_config_init sets, the bounds *_create checks before anything else (config.c), the
 * description bindings read (kvt_describe_config), the vLLM connector's defaults and bounds
 * for the keys that set these fields, and the tables of docs/configuration.md
 * (scripts/gen-config-doc). A new field is a row here, a line in the header and the code that
 * uses it.
 *
 *   X(field, type, default, min, max, help)
 *
 * type: UINT, INT (signed), BOOL, STRING (a borrowed const char *; default NULL, no bounds),
 * BYTES (an array of bytes; zero, no bounds), ROOM (reserved words, zero), REQUIRED (an unsigned
 * field without a usable default: the caller sets it; default 0, which the bounds refuse). Bounds
 * are inclusive. A check that no row can say (a power of two, one field against another) stays in
 * the create function.
 */
#ifndef KVT_BASE_CONFIG_SCHEMA_H
#define KVT_BASE_CONFIG_SCHEMA_H

#include <stdint.h>

#include "kvtier/kvtier.h" /* KVT_CONFIG_*, and the limits the rows name */

#define KVI_CFG_TYPE_UINT      KVT_CONFIG_UINT
#define KVI_CFG_TYPE_INT       KVT_CONFIG_INT
#define KVI_CFG_TYPE_BOOL      KVT_CONFIG_BOOL
#define KVI_CFG_TYPE_STRING    KVT_CONFIG_STRING
#define KVI_CFG_TYPE_ROOM      KVT_CONFIG_ROOM
#define KVI_CFG_TYPE_BYTES     KVT_CONFIG_BYTES
#define KVI_CFG_TYPE_REQUIRED  KVT_CONFIG_UINT
#define KVI_CFG_FLAGS_UINT     0u
#define KVI_CFG_FLAGS_INT      0u
#define KVI_CFG_FLAGS_BOOL     0u
#define KVI_CFG_FLAGS_STRING   0u
#define KVI_CFG_FLAGS_ROOM     0u
#define KVI_CFG_FLAGS_BYTES    0u
#define KVI_CFG_FLAGS_REQUIRED KVT_CONFIG_REQUIRED

#define KVI_U32_MAX UINT32_MAX
#define KVI_U64_MAX UINT64_MAX

#define KVI_OFFLOAD_CONFIG(X)                                                                      \
    X(host_blocks, REQUIRED, 0, 2, KVI_U32_MAX - 1,                                                \
      "host-tier blocks, the null block included (kvt_offload_size_host); lowered later to the "   \
      "smallest rank's (kvt_offload_lower_host_blocks)")                                           \
    X(world_size, UINT, 1, 1, 65536, "ranks that must report each store event")                    \
    X(lazy, BOOL, 0, 0, 1,                                                                         \
      "store only blocks nearing eviction from the GPU (vLLM lazy_offload) instead of eager "      \
      "write-through")                                                                             \
    X(max_requests, UINT, 4096, 1, 1u << 22,                                                       \
      "requests tracked at once (running, waiting with a pinned hit, or finished with a load in "  \
      "flight)")                                                                                   \
    X(max_batched_tokens, UINT, 8192, 0, KVI_U32_MAX,                                              \
      "the engine's per-step token budget (lazy watermark)")                                       \
    X(max_model_len, UINT, 1u << 20, 1, KVI_U32_MAX,                                               \
      "longest request in tokens: bounds one host-tier search (a longer prompt is searched up to " \
      "it)")                                                                                       \
    X(keys_per_block, UINT, 0, 0, 64,                                                              \
      "keys a host block keeps (primary + secondary); 0: the GPU pool's")                          \
    X(restore_budget, UINT, 256, 0, KVI_U32_MAX,                                                   \
      "eager: blocks per step re-stored after the host tier evicted them while still in use on "   \
      "the GPU; 0 disables")                                                                       \
    X(event_capacity, UINT, 0, 0, KVI_U32_MAX,                                                     \
      "cache events kept between take_events calls (host and disk tiers); 0: off")                 \
    X(block_bytes, UINT, 0, 0, KVI_U64_MAX,                                                        \
      "bytes one block occupies across all ranks, for the byte counters; 0: unknown")              \
    X(disk_blocks, UINT, 0, 0, KVI_U32_MAX - 1,                                                    \
      "three tiers: disk slots per rank, the null slot included (kvt_disk_num_slots), 0 or at "    \
      "least 2; 0: two tiers")                                                                     \
    X(defer_schedule_pins, BOOL, 0, 0, 1,                                                          \
      "the pins of kvt_offload_schedule(_hashed/_many) reach the GPU pool with the next other "    \
      "call, one batch per step; only for an engine that frees no GPU block in between (vLLM's "   \
      "connector)")                                                                                \
    X(max_num_seqs, UINT, 0, 0, KVI_U32_MAX,                                                       \
      "lazy: the engine's most running requests (vLLM max_num_seqs), a term of a full-attention "  \
      "group's window; 0 leaves it out")                                                           \
    X(remote_miss_ms, UINT, 1000, 0, KVI_U32_MAX,                                                  \
      "remote tier: a lookup that found nothing (or timed out) is not repeated for the same span " \
      "of hashes for this long; 0: always look up")                                                \
    X(reserved, ROOM, 0, 0, 0, "room for fields to come: zero")

#define KVI_COPY_CONFIG(X)                                                                         \
    X(backend, INT, 0, 0, 2,                                                                       \
      "kvt_copy_backend: 0 AUTO (CUDA for a layout on a CUDA device, else CPU), 1 CPU, 2 CUDA")    \
    X(threads, UINT, 0, 0, 256, "CPU: copy threads; 0: one per online core")                       \
    X(max_descriptors, UINT, 0, 0, KVI_U32_MAX,                                                    \
      "CUDA: descriptors per batch call; 0: the backend's default (512); "                         \
      "KVTIER_MAX_BATCH_DESCRIPTORS overrides")                                                    \
    X(max_events, UINT, 1024, 1, 1u << 20,                                                         \
      "events queued or in flight per direction (KVT_EBUSY beyond)")                               \
    X(nt_min_bytes, UINT, 4096, 0, KVI_U64_MAX,                                                    \
      "CPU: runs of at least this many bytes use the kernel calibrated for this machine, "         \
      "shorter ones memcpy; UINT64_MAX: memcpy for all")                                           \
    X(chunk_bytes, UINT, 1u << 20, 4096, KVI_U64_MAX, "CPU: the unit of work a copy thread takes") \
    X(force_fallback, BOOL, 0, 0, 1,                                                               \
      "CUDA: one cuMemcpyAsync per descriptor even where the driver has cuMemcpyBatchAsync")       \
    X(prefer_overlap, BOOL, 0, 0, 1,                                                               \
      "CUDA: ask the driver to overlap batched copies with kernels")                               \
    X(kernel_max_bytes, UINT, 128u << 10, 0, KVI_U64_MAX,                                          \
      "CUDA: a job whose descriptors average at most this many bytes goes to the gather/scatter "  \
      "kernel, else DMA; 0: always DMA; KVTIER_CUDA_KERNEL_MAX_BYTES overrides")                   \
    X(reserved, ROOM, 0, 0, 0, "room for fields to come: zero")

#define KVI_DISK_CONFIG(X)                                                                         \
    X(path, STRING, 0, 0, 0,                                                                       \
      "base path (required): the rank's file is path.rankN; not on tmpfs unless page_cache")       \
    X(rank, UINT, 0, 0, KVI_U32_MAX, "the rank, which names the file")                             \
    X(capacity_bytes, REQUIRED, 0, 1, KVI_U64_MAX,                                                 \
      "bytes of the file: slots = capacity / slot bytes, at least 1")                              \
    X(alignment, UINT, 4096, 512, 1u << 30, "direct-I/O alignment, a power of two")                \
    X(page_cache, BOOL, 0, 0, 1, "buffered I/O instead of O_DIRECT; slots are not padded")         \
    X(queue_depth, UINT, 16, 1, 4096, "I/Os in flight per pipeline (= staging buffers)")           \
    X(max_events, UINT, 1024, 1, 1u << 20, "events outstanding per direction")                     \
    X(reserved, ROOM, 0, 0, 0, "room for fields to come: zero")

#define KVI_NODE_CONFIG(X)                                                                         \
    X(name, STRING, 0, 0, 0,                                                                       \
      "the node tier's name (required): 1..KVT_NODE_NAME_MAX bytes of [A-Za-z0-9_.-]; its "        \
      "objects are /kvtier.NAME.<32 random hex>.meta and .data in /dev/shm, the random part "      \
      "kept in DIR/NAME.rendezvous (dir)")                                                         \
    X(rank, UINT, 0, 0, KVT_NODE_MAX_RANKS - 1, "this replica, 0 .. ranks - 1")                    \
    X(ranks, UINT, 1, 1, KVT_NODE_MAX_RANKS, "replicas sharing the tier")                          \
    X(blocks_per_rank, REQUIRED, 0, 2, KVI_U32_MAX - 1,                                            \
      "slots each replica owns, its unused first slot included (ranks x blocks_per_rank below "    \
      "2^32 - 1)")                                                                                 \
    X(hash_len, UINT, 16, 1, KVT_HASH_MAX, "bytes per block hash, as the pools'")                  \
    X(keys_per_block, UINT, 1, 1, 64, "keys a host block carries, as the host pool's")             \
    X(hash_block_size, UINT, 16, 1, KVI_U32_MAX, "tokens per hash block, as the pools'")           \
    X(block_bytes, UINT, 0, 0, KVI_U64_MAX,                                                        \
      "bytes of one block in the workers' layout; 0: not compared")                                \
    X(hash_seed, UINT, 0, 0, KVI_U64_MAX,                                                          \
      "fingerprint of the hash function and its seed (vLLM: the first 8 bytes of the root "        \
      "hash); every replica must agree")                                                           \
    X(signature, BYTES, 0, 0, 0,                                                                   \
      "digest of whatever else must agree (model, dtype, cache groups), compared byte for byte")   \
    X(reap_interval_ms, UINT, 1000, 0, KVI_U32_MAX,                                                \
      "how often a locked call checks the peers' liveness; 0: only at attach, after a dead "       \
      "holder, and on kvt_node_reap")                                                              \
    X(lock_timeout_ms, UINT, 10000, 1, KVI_U32_MAX,                                                \
      "longest wait for the metadata lock: a call that waits longer fails with KVT_EBUSY naming "  \
      "the holder (a live but stopped replica) instead of hanging")                                \
    X(group, STRING, 0, 0, 0,                                                                      \
      "NULL: only this user's processes share the tier (objects 0600). A group name (1..63 "       \
      "bytes): replicas running as different users of that group share it (objects 0660 in that "  \
      "group; an existing object is used only if it has that group and gives nobody outside it "   \
      "access; every replica and the workers' mirrors name it)")                                   \
    X(dir, STRING, 0, 0, 0,                                                                        \
      "the directory of the tier's rendezvous, only the sharers may enter it (the objects' names " \
      "are unguessable to everyone else). NULL: $XDG_RUNTIME_DIR/kvtier if that is this user's "   \
      "and closed to others, else $HOME/.kvtier; with group it must be given (the group's, "       \
      "chmod 2770); every replica and the workers' mirrors name the same")                         \
    X(reserved, ROOM, 0, 0, 0, "room for fields to come: zero")

#endif
