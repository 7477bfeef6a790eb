/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The rows of kvt_disk_config, one per field in the header's order (the row format and what reads
 * the rows: src/base/config.h). The disk tier (disk.c) sets its defaults and checks its bounds
 * from them; kvt_describe_config hands them to bindings; scripts/gen-config-doc writes them into
 * docs/configuration.md. A new field is a row here, a line in the header and the code that
 * uses it.
 */
#ifndef KVI_DISK_CONFIG_H
#define KVI_DISK_CONFIG_H

#include "base/config.h"
#include "kvtier/disk.h"

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

/* a row of kvt_disk_config (KVI_CONFIG_ROW) */
#define KVI_DISK_CONFIG_ROW(...) KVI_CONFIG_ROW(kvt_disk_config, __VA_ARGS__)

#endif
