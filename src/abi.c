/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Sizes of the public structs by name, so bindings that declare them (bindings/python's
 * ctypes mirror) can check at load time that their declarations match this build.
 */
#include <stddef.h>
#include <string.h>

#include "base/config.h"
#include "base/error.h"
#include "copy/copy_config.h"
#include "disk/disk_config.h"
#include "kvtier/kvtier.h"
#include "node/node_config.h"
#include "offload/offload_config.h"
#include "offload/stats_schema.h"

#define SIZE(t)                                                                                    \
    {                                                                                              \
#t, sizeof(t)                                                                              \
    }

static const struct {
    const char *name;
    size_t size;
} sizes[] = {
    SIZE(kvt_pool_config),
    SIZE(kvt_group_spec),
    SIZE(kvt_hit),
    SIZE(kvt_block_info),
    SIZE(kvt_pool_key),
    SIZE(kvt_pool_event),
    SIZE(kvt_offload_event),
    SIZE(kvt_gpu_pool_ops),
    SIZE(kvt_str),
    SIZE(kvt_offload_config),
    SIZE(kvt_offload_sched_req),
    SIZE(kvt_tier_xfers),
    SIZE(kvt_offload_meta),
    SIZE(kvt_offload_worker_meta),
    SIZE(kvt_offload_stats),
    SIZE(kvt_tier_stats),
    SIZE(kvt_bump),
    SIZE(kvt_copy_config),
    SIZE(kvt_mirror_config),
    SIZE(kvt_node_config),
    SIZE(kvt_node_stats),
    SIZE(kvt_worker_config),
    SIZE(kvt_region),
    SIZE(kvt_kv_tensor),
    SIZE(kvt_disk_config),
    SIZE(kvt_link_result),
    SIZE(kvt_slab_view),
    SIZE(kvt_copy_stats),
    SIZE(kvt_disk_stats),
    SIZE(kvt_event_report),
    SIZE(kvt_clock),
    SIZE(kvt_ec_item),
    SIZE(kvt_ec_reply),
    SIZE(kvt_ec_ready_event),
    SIZE(kvt_ec_shard_config),
    SIZE(kvt_ec_shard_stats),
    SIZE(kvt_ec_sched_config),
    SIZE(kvt_ec_ready),
    SIZE(kvt_ec_feature),
    SIZE(kvt_ec_sched_stats),
    SIZE(kvt_ec_load_spec),
    SIZE(kvt_ec_push_spec),
    SIZE(kvt_ec_meta),
    SIZE(kvt_ec_worker_meta),
    SIZE(kvt_strset),
    SIZE(kvt_ec_consumer_ops),
    SIZE(kvt_ec_producer_config),
    SIZE(kvt_ec_producer_stats),
    SIZE(kvt_ec_push_failure),
    SIZE(kvt_ec_local_consumer),
    SIZE(kvt_ec_binding),
    SIZE(kvt_ec_fence),
    SIZE(kvt_ec_status),
    SIZE(kvt_ec_server_config),
    SIZE(kvt_ec_server_stats),
    SIZE(kvt_ec_net_config),
    SIZE(kvt_remote_config),
    SIZE(kvt_remote_stats),
    SIZE(kvt_remote_loc),
    SIZE(kvt_ec_inbox_config),
    SIZE(kvt_ec_inbox_stats),
    SIZE(kvt_ec_cache_ops),
    SIZE(kvt_field),
    SIZE(kvt_config_field),
};

size_t kvt_sizeof(const char *type_name)
{
    for (size_t i = 0; type_name && i < sizeof(sizes) / sizeof(sizes[0]); i++)
        if (strcmp(sizes[i].name, type_name) == 0)
            return sizes[i].size;
    return 0;
}

/* ---- descriptions, from the schema tables (src/offload/stats_schema.h) ---------------------- */

/* elements of a field: reserved room counts its words, everything else is one */
#define KVI_COUNT(kind, bytes) (KVI_STAT_KIND_##kind == KVT_FIELD_ROOM ? (bytes) / 8 : 1)

#define DESCRIBE(T, prefix, f, kind, family, help)                                                 \
    {#f,                                                                                           \
     help,                                                                                         \
     sizeof(family) > 1 ? prefix family : "",                                                      \
     (uint32_t)offsetof(T, f),                                                                     \
     (uint32_t)(sizeof(((T *)0)->f) / KVI_COUNT(kind, sizeof(((T *)0)->f))),                       \
     (uint32_t)KVI_COUNT(kind, sizeof(((T *)0)->f)),                                               \
     KVI_STAT_KIND_##kind},
#define OFFLOAD_ROW(f, kind, family, help)                                                         \
    DESCRIBE(kvt_offload_stats, "kvtier_offload_", f, kind, family, help)
#define TIER_ROW(f, kind, family, help)                                                            \
    DESCRIBE(kvt_tier_stats, "kvtier_offload_tier_", f, kind, family, help)

#define NODE_ROW(f, kind, family, help)                                                            \
    DESCRIBE(kvt_node_stats, "kvtier_node_", f, kind, family, help)
#define REMOTE_ROW(f, kind, family, help)                                                          \
    DESCRIBE(kvt_remote_stats, "kvtier_remote_", f, kind, family, help)

/* the public rows carry each field's type first */
#define OFFLOAD_TYPED_ROW(type, ...) OFFLOAD_ROW(__VA_ARGS__)

static const kvt_field offload_fields[] = {KVT_OFFLOAD_STATS_ROWS(OFFLOAD_TYPED_ROW)};
static const kvt_field tier_fields[] = {KVI_TIER_STATS(TIER_ROW)};
static const kvt_field node_fields[] = {KVI_NODE_STATS(NODE_ROW)};
static const kvt_field remote_fields[] = {KVI_REMOTE_STATS(REMOTE_ROW)};

static const kvi_described described[] = {
    {"kvt_offload_stats", offload_fields, sizeof(offload_fields) / sizeof(offload_fields[0])},
    {"kvt_tier_stats", tier_fields, sizeof(tier_fields) / sizeof(tier_fields[0])},
    {"kvt_node_stats", node_fields, sizeof(node_fields) / sizeof(node_fields[0])},
    {"kvt_remote_stats", remote_fields, sizeof(remote_fields) / sizeof(remote_fields[0])},
};

KVI_DESCRIBER(kvt_describe, kvt_field, described, "describe")

/* ---- the configuration structs' tables, from the rows beside each component ---------------- */

/* the disk tier's functions live in libkvtier_disk: this library makes its own table of them */
static const kvi_config_table disk_config_table =
    KVI_CONFIG_TABLE(kvt_disk_config, "disk", KVI_DISK_CONFIG(KVI_DISK_CONFIG_ROW));

static const kvi_config_table *const config_tables[] = {
    &kvi_offload_config_table,
    &kvi_copy_config_table,
    &disk_config_table,
    &kvi_node_config_table,
};

int kvt_describe_config(const char *type_name, const kvt_config_field **fields, uint32_t *n)
{
    enum { N = sizeof(config_tables) / sizeof(config_tables[0]) };
    kvi_described d[N];
    for (size_t i = 0; i < N; i++)
        d[i] = (kvi_described){config_tables[i]->name, config_tables[i]->rows, config_tables[i]->n};
    const void *rows = NULL;
    int rc = kvi_describe_find(d, N, "describe_config", type_name, fields ? &rows : NULL, n);
    if (fields)
        *fields = rows;
    return rc;
}
