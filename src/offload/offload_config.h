/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The rows of kvt_offload_config, one per field in the header's order (the row format and what
 * reads the rows: src/base/config.h). The offload manager (manager.c) sets its defaults and checks
 * its bounds from them; kvt_describe_config hands them to bindings; scripts/gen-config-doc writes
 * them into docs/configuration.md. A new field is a row here, a line in the header and the code
 * that uses it.
 */
#ifndef KVI_OFFLOAD_CONFIG_H
#define KVI_OFFLOAD_CONFIG_H

#include "base/config.h"
#include "kvtier/offload.h"

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

/* a row of kvt_offload_config (KVI_CONFIG_ROW) */
#define KVI_OFFLOAD_CONFIG_ROW(...) KVI_CONFIG_ROW(kvt_offload_config, __VA_ARGS__)

/* the table of these rows (offload) */
extern const kvi_config_table kvi_offload_config_table;

#endif
