/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Sizes of the public structs by name, so bindings that declare them (bindings/python's
 * ctypes mirror) can check at load time that their declarations match this build.
 */
#include <string.h>

#include "kvtier/kvtier.h"

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
};

size_t kvt_sizeof(const char *type_name)
{
    for (size_t i = 0; type_name && i < sizeof(sizes) / sizeof(sizes[0]); i++)
        if (strcmp(sizes[i].name, type_name) == 0)
            return sizes[i].size;
    return 0;
}
