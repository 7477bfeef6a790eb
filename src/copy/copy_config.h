/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The rows of kvt_copy_config, one per field in the header's order (the row format and what reads
 * the rows: src/base/config.h). The copy engine (engine.c) sets its defaults and checks its bounds
 * from them; kvt_describe_config hands them to bindings; scripts/gen-config-doc writes them into
 * docs/configuration.md. A new field is a row here, a line in the header and the code that
 * uses it.
 */
#ifndef KVI_COPY_CONFIG_H
#define KVI_COPY_CONFIG_H

#include "base/config.h"
#include "kvtier/copy.h"

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

/* a row of kvt_copy_config (KVI_CONFIG_ROW) */
#define KVI_COPY_CONFIG_ROW(...) KVI_CONFIG_ROW(kvt_copy_config, __VA_ARGS__)

/* the table of these rows (copy) */
extern const kvi_config_table kvi_copy_config_table;

#endif
