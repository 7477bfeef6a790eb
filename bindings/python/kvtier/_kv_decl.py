# SPDX-License-Identifier: Apache-2.0
"""ctypes declarations of the offload side (kvtier/pool.h, offload.h, meta.h, copy.h, layout.h,
worker.h, node.h, disk.h, link.h, remote.h): its structs, each checked against the library's
size, and its functions' signatures. Read through kvtier._lib, which re-exports them."""
import ctypes

from ._lib import (c_bool, c_i64, c_int, c_u32, c_u64, check_sizes, configured, cp, described,
                   kvt_bump, kvt_str, MAX_GROUPS, _meta_sigs, P, ROOM, room, _sig, Struct, u8p, vp)


class kvt_group_spec(ctypes.Structure):
    _fields_ = [("kind", c_u32), ("block_size", c_u32), ("sliding_window", c_u32)]


# Configs and stats end in `uint64_t reserved[8]`: room for fields to come (zero).
class kvt_pool_config(Struct):
    _fields_ = [("num_blocks", c_u32), ("hash_len", c_u32), ("keys_per_block", c_u32),
                ("event_capacity", c_u32), ("hash_block_size", c_u32),
                ("scheduler_block_size", c_u32), ("eagle", c_bool), ("n_groups", c_u32),
                ("groups", kvt_group_spec * MAX_GROUPS), ("dcp_world_size", c_u32),
                ("pcp_world_size", c_u32), ("reserved", c_u64 * 7)]


class kvt_pool_key(ctypes.Structure):
    _fields_ = [("hash", ctypes.c_uint8 * 32), ("group", c_u32), ("num_tokens", c_u32)]


class kvt_pool_event(ctypes.Structure):
    _fields_ = [("type", c_u32), ("block", c_u32), ("group", c_u32), ("num_tokens", c_u32),
                ("hash", ctypes.c_uint8 * 32)]


class kvt_offload_event(ctypes.Structure):
    _fields_ = [("type", c_u32), ("medium", c_u32), ("block", c_u32), ("group", c_u32),
                ("num_tokens", c_u32), ("kind", c_u32), ("window", c_u32),
                ("token_start", c_u32), ("ctx", c_u64), ("has_parent", c_u32),
                ("reserved", c_u32), ("hash", ctypes.c_uint8 * 32),
                ("parent_hash", ctypes.c_uint8 * 32)]


# kvt_offload_event_type / kvt_offload_medium
OFFLOAD_EV_STORED, OFFLOAD_EV_REMOVED, OFFLOAD_EV_ALL_CLEARED, OFFLOAD_EV_CONTEXT_DONE = 1, 2, 3, 4
MEDIUM_HOST, MEDIUM_DISK = 0, 1


# kvt_gpu_pool_ops: an engine's own GPU block pool (kvt_offload_create_ext)
GPU_TOUCH = ctypes.CFUNCTYPE(None, ctypes.c_void_p, P(c_u32), c_u32)
GPU_FREE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, P(c_u32), c_u32)
GPU_LRU_SCAN = ctypes.CFUNCTYPE(c_u32, ctypes.c_void_p, c_u32, P(c_u32), P(kvt_pool_key))
GPU_LOOKUP = ctypes.CFUNCTYPE(c_u32, ctypes.c_void_p, P(ctypes.c_uint8), c_u32, P(c_u32))


class kvt_gpu_pool_ops(ctypes.Structure):
    _fields_ = [("touch", GPU_TOUCH), ("free", GPU_FREE), ("lru_scan", GPU_LRU_SCAN),
                ("lookup", GPU_LOOKUP)]


class kvt_hit(ctypes.Structure):
    _fields_ = [("length", c_u32), ("n_blocks", c_u32 * MAX_GROUPS)]


class kvt_block_info(ctypes.Structure):
    _fields_ = [("ref_cnt", c_u32), ("n_keys", c_u32), ("is_null", c_bool),
                ("is_free", c_bool)]


class kvt_offload_sched_req(ctypes.Structure):
    _fields_ = [("req_id", ctypes.c_char_p), ("req_id_len", c_u32), ("num_confirmed", c_u32),
                ("num_scheduled", c_u32), ("n_hashes", c_u32), ("hashes", ctypes.c_void_p),
                ("blocks", ctypes.c_void_p), ("n_blocks", ctypes.c_void_p),
                ("resumed", c_bool), ("left", ctypes.c_int32)]


MAX_TIERS = 4  # KVT_MAX_TIERS: the host, and up to three tiers behind it


class kvt_tier_xfers(ctypes.Structure):
    _fields_ = [("load_event", c_i64), ("n_loads", c_u32), ("load_src", P(c_u32)),
                ("load_dst", P(c_u32)), ("store_event", c_i64), ("n_stores", c_u32),
                ("store_src", P(c_u32)), ("store_dst", P(c_u32)), ("cap_loads", c_u32),
                ("cap_stores", c_u32)]


class kvt_remote_owner(ctypes.Structure):
    _fields_ = [("instance", kvt_str), ("endpoint", kvt_str), ("epoch", c_u64)]


class kvt_remote_src(ctypes.Structure):
    _fields_ = [("owner", c_u32), ("slot", c_u32), ("generation", c_u64),
                ("hash", ctypes.c_uint8 * 32)]


class kvt_remote_reads(ctypes.Structure):
    _fields_ = [("tier", c_u32), ("hash_len", c_u32), ("n_owners", c_u32),
                ("owners", P(kvt_remote_owner)), ("n_srcs", c_u32), ("srcs", P(kvt_remote_src)),
                ("parts", c_u32), ("n_pubs", c_u32), ("pub_blocks", P(c_u32)),
                ("pub_hashes", P(ctypes.c_uint8)), ("n_withdraws", c_u32),
                ("withdraw_blocks", P(c_u32)), ("withdraw_all", ctypes.c_bool),
                ("cap_owners", c_u32), ("cap_srcs", c_u32), ("cap_pubs", c_u32),
                ("cap_withdraws", c_u32)]


class kvt_offload_meta(ctypes.Structure):
    _fields_ = [("load_event", c_i64), ("n_loads", c_u32), ("load_gpu_blocks", P(c_u32)),
                ("load_cpu_blocks", P(c_u32)), ("n_load_events", c_u32),
                ("load_events", P(c_i64)), ("load_req_first", P(c_u32)),
                ("n_load_reqs", c_u32), ("load_req_ids", P(kvt_str)), ("store_event", c_i64),
                ("n_stores", c_u32), ("store_gpu_blocks", P(c_u32)),
                ("store_cpu_blocks", P(c_u32)), ("need_flush", c_bool),
                ("n_load_invalid", c_u32), ("load_invalid_blocks", P(c_u32)),
                ("tiers", kvt_tier_xfers * (MAX_TIERS - 1)),
                ("cap_loads", c_u32), ("cap_events", c_u32), ("cap_first", c_u32),
                ("cap_reqs", c_u32), ("cap_stores", c_u32), ("cap_invalid", c_u32),
                ("strings", kvt_bump), ("remote", kvt_remote_reads)]


class kvt_event_report(ctypes.Structure):
    _fields_ = [("n_completed", c_u32), ("events", P(c_i64)), ("counts", P(c_u32)),
                ("n_failed", c_u32), ("failed", P(c_i64)), ("cap", c_u32),
                ("cap_failed", c_u32)]


class kvt_offload_worker_meta(ctypes.Structure):
    _fields_ = [("stores", kvt_event_report),
                ("tier_stores", kvt_event_report * (MAX_TIERS - 1)),
                ("tier_loads", kvt_event_report * (MAX_TIERS - 1)),
                ("n_failed_load_src", c_u32), ("failed_load_src", P(c_u32)),
                ("cap_failed_load_src", c_u32), ("n_failed_promo", c_u32),
                ("failed_promo", P(c_u32)), ("cap_failed_promo", c_u32)]


kvt_offload_config = configured("kvt_offload_config")


# The stats structs, read from the library (a field added there appears here); their sizes are
# checked against kvt_sizeof below like every other struct's. kvt_node_stats and
# kvt_remote_stats are read the same way where they are used, below.
kvt_offload_stats = described("kvt_offload_stats")
kvt_tier_stats = described("kvt_tier_stats")


kvt_copy_config = configured("kvt_copy_config")


class kvt_mirror_config(Struct):
    _fields_ = [("host_blocks", c_u32), ("arena_flags", ctypes.c_uint), ("pin", c_bool),
                ("pin_chunk", c_u64), ("node_name", ctypes.c_char_p),
                ("node_group", ctypes.c_char_p), ("numa_node", ctypes.c_int32),
                ("node_dir", ctypes.c_char_p)] + room(4)


kvt_node_config = configured("kvt_node_config")


kvt_node_stats = described("kvt_node_stats")


class kvt_remote_config(Struct):
    _fields_ = [("directory", ctypes.c_char_p), ("space", ctypes.c_char_p),
                ("instance", ctypes.c_char_p), ("listen_host", ctypes.c_char_p),
                ("listen_port", ctypes.c_uint16), ("advertise_host", ctypes.c_char_p),
                ("credential", ctypes.c_char_p), ("region", ctypes.c_void_p),
                ("block_bytes", c_u64), ("n_slots", c_u32), ("hash_len", c_u32),
                ("hash_seed", c_u64), ("signature", ctypes.c_uint8 * 32), ("ttl_ms", c_u32),
                ("timeout_ms", c_u32), ("directory_timeout_ms", c_u32), ("retry_ms", c_u32),
                ("owner_checksum", c_u32), ("n_regions", c_u32),
                ("directory_password", ctypes.c_char_p), ("regions", ctypes.c_void_p),
                ("encrypt", c_u32), ("pad0", c_u32), ("ranks", c_u32), ("rank", c_u32)] + room(1)


class kvt_remote_loc(ctypes.Structure):
    _fields_ = [("peer", c_u32), ("slot", c_u32), ("generation", c_u64)]


kvt_remote_stats = described("kvt_remote_stats")


class kvt_worker_config(Struct):
    _fields_ = [("rank", c_u32), ("copy", kvt_copy_config)] + ROOM


class kvt_region(ctypes.Structure):
    _fields_ = [("base", c_u64), ("block_bytes", c_u64)]


class kvt_kv_tensor(ctypes.Structure):
    _fields_ = [("device", ctypes.c_int32), ("storage", c_u64), ("storage_bytes", c_u64),
                ("block_dim_size", c_u64), ("block_stride", c_u64), ("size_bytes", c_u64)]


kvt_disk_config = configured("kvt_disk_config")


class kvt_disk_stats(ctypes.Structure):
    _fields_ = [("events", c_u64 * 2), ("events_done", c_u64 * 2), ("blocks", c_u64 * 2),
                ("bytes", c_u64 * 2), ("io_errors", c_u64 * 2), ("fatal", c_u32)] + ROOM


class kvt_link_result(ctypes.Structure):
    _fields_ = [("finished_loads", P(kvt_str)), ("n_finished", c_u32),
                ("stores", P(kvt_offload_worker_meta)), ("invalid_blocks", P(c_u32)),
                ("n_invalid", c_u32)]


# pool
_sig("kvt_pool_config_init", None, P(kvt_pool_config))
_sig("kvt_pool_get_config", None, vp, P(kvt_pool_config))
_sig("kvt_pool_create", c_int, P(kvt_pool_config), P(vp))
_sig("kvt_pool_destroy", None, vp)
_sig("kvt_pool_num_blocks", c_u32, vp)
_sig("kvt_pool_num_free", c_u32, vp)
_sig("kvt_pool_hit_alignment", c_u32, vp, c_u32)
_sig("kvt_pool_num_cached", c_u32, vp)
_sig("kvt_pool_alloc", c_int, vp, c_u32, P(c_u32))
_sig("kvt_pool_touch", c_int, vp, P(c_u32), c_u32)
_sig("kvt_pool_free", c_int, vp, P(c_u32), c_u32)
_sig("kvt_pool_insert", c_int, vp, c_u32, u8p, c_u32, c_u32)
_sig("kvt_pool_lookup", c_int, vp, u8p, c_u32, P(c_u32))
_sig("kvt_pool_block_info", c_int, vp, c_u32, P(kvt_block_info))
_sig("kvt_pool_reset_prefix_cache", c_int, vp)
_sig("kvt_pool_hit_capacity", c_u32, vp, c_u32, c_u32, c_u32)
_sig("kvt_pool_find_longest_hit", c_int, vp, u8p, c_u32, c_u32, P(P(c_u32)), P(kvt_hit))


_meta_sigs(kvt_offload_meta)
_meta_sigs(kvt_offload_worker_meta)
_sig("kvt_offload_meta_add_load", c_int, P(kvt_offload_meta), c_u32, c_u32)
_sig("kvt_offload_meta_empty", ctypes.c_bool, P(kvt_offload_meta))
_sig("kvt_offload_meta_add_store", c_int, P(kvt_offload_meta), c_u32, c_u32)
_sig("kvt_offload_meta_add_load_req", c_int, P(kvt_offload_meta), c_i64, cp, c_u32)
_sig("kvt_offload_worker_meta_add", c_int, P(kvt_offload_worker_meta), c_i64, c_u32)
_sig("kvt_offload_worker_meta_add_failed", c_int, P(kvt_offload_worker_meta), c_i64)
_sig("kvt_offload_worker_meta_aggregate", c_int, P(kvt_offload_worker_meta),
     P(kvt_offload_worker_meta))
_sig("kvt_offload_meta_add_load_invalid", c_int, P(kvt_offload_meta), c_u32)
_sig("kvt_offload_meta_add_tier_load", c_int, P(kvt_offload_meta), c_u32, c_u32, c_u32)
_sig("kvt_offload_meta_add_tier_store", c_int, P(kvt_offload_meta), c_u32, c_u32, c_u32)
_sig("kvt_event_report_add", c_int, P(kvt_event_report), c_i64, c_u32)
_sig("kvt_event_report_add_failed", c_int, P(kvt_event_report), c_i64)
# offload manager
_sig("kvt_offload_config_init", None, P(kvt_offload_config))
_sig("kvt_offload_size_host", c_int, c_u64, c_u64, P(c_u32))
_sig("kvt_offload_create", c_int, P(kvt_offload_config), vp, P(vp))
_sig("kvt_offload_create_ext", c_int, P(kvt_offload_config), P(kvt_pool_config),
     P(kvt_gpu_pool_ops), vp, P(vp))
_sig("kvt_offload_schedule_hashed", c_int, vp, cp, c_u32, P(P(c_u32)), P(c_u32), vp, c_u32,
     c_u32, c_u32, c_bool)
_sig("kvt_offload_request_finished_hashed", c_int, vp, cp, c_u32, P(P(c_u32)), P(c_u32), vp,
     c_u32, c_u32)
_sig("kvt_offload_take_events", c_u32, vp, P(kvt_offload_event), c_u32, P(c_u64))
_sig("kvt_offload_set_request_context", c_int, vp, cp, c_u32, c_u64)
_sig("kvt_pool_config_validate", c_int, P(kvt_pool_config), P(c_u32))
_sig("kvt_offload_schedule_many", c_int, vp, P(P(kvt_offload_sched_req)), c_u32, P(c_u32))
_sig("kvt_offload_destroy", None, vp)
_sig("kvt_offload_lower_host_blocks", c_int, vp, c_u32)
_sig("kvt_offload_attach_remote", c_int, vp, vp)
_sig("kvt_offload_remote_tier", c_u32, vp)
_sig("kvt_offload_attach_node", c_int, vp, vp)
_sig("kvt_node_config_init", None, P(kvt_node_config))
_sig("kvt_node_attach", c_int, P(kvt_node_config), P(vp))
_sig("kvt_node_detach", None, vp)
_sig("kvt_node_num_slots", c_u32, vp)
_sig("kvt_node_reap", c_int, vp)
_sig("kvt_node_get_stats", c_int, vp, P(kvt_node_stats))
_sig("kvt_node_unlink", c_int, cp)
_sig("kvt_node_unlink_at", c_int, cp, cp, cp)
_sig("kvt_offload_lower_disk_blocks", c_int, vp, c_u32)
_sig("kvt_offload_lower_tier_blocks", c_int, vp, c_u32, c_u32)
_sig("kvt_offload_add_tier", c_int, vp, ctypes.c_char_p, c_u32, ctypes.POINTER(c_u32))
_sig("kvt_offload_disk_pool", vp, vp)
_sig("kvt_offload_match", c_int, vp, cp, c_u32, u8p, c_u32, c_u32, c_u32, P(c_u32))
_sig("kvt_offload_match_flags", c_int, vp, cp, c_u32, u8p, c_u32, c_u32, c_u32, c_u32, P(c_u32))
_sig("kvt_offload_lazy_window", c_u32, vp)
_sig("kvt_offload_hit_alignment", c_u32, vp)
_sig("kvt_offload_after_alloc", c_int, vp, cp, c_u32, P(P(c_u32)), P(c_u32), c_u32)
_sig("kvt_offload_schedule", c_int, vp, cp, c_u32, P(P(c_u32)), P(c_u32), c_u32, c_u32, c_bool)
_sig("kvt_offload_build_meta", c_int, vp, c_bool, P(kvt_offload_meta))
_sig("kvt_offload_apply_output", c_int, vp, P(kvt_str), c_u32, P(kvt_offload_worker_meta))
_sig("kvt_offload_request_finished", c_int, vp, cp, c_u32, P(P(c_u32)), P(c_u32), c_u32)
_sig("kvt_offload_reset", c_int, vp)
_sig("kvt_offload_clear", c_int, vp)
_sig("kvt_offload_has_pending", c_bool, vp)
_sig("kvt_offload_release_engine_blocks", c_int, vp, P(c_u32))
_sig("kvt_offload_stats_read", ctypes.c_size_t, vp, P(kvt_offload_stats), ctypes.c_size_t)
_sig("kvt_offload_prometheus", c_int, vp, cp, ctypes.c_size_t, P(ctypes.c_size_t))
_sig("kvt_offload_num_tiers", c_u32, vp)
_sig("kvt_offload_get_tier_stats", c_int, vp, c_u32, P(kvt_tier_stats))


# layouts, mirror, worker
_sig("kvt_layout_create", c_int, ctypes.c_int32, c_u32, P(vp))
_sig("kvt_layout_destroy", None, vp)
_sig("kvt_layout_add_tensor", c_int, vp, P(kvt_kv_tensor))
_sig("kvt_layout_add_region", c_int, vp, c_u64, c_u64)
_sig("kvt_layout_num_regions", c_u32, vp)
_sig("kvt_layout_block_bytes", c_u64, vp)
_sig("kvt_mirror_config_init", None, P(kvt_mirror_config))
_sig("kvt_mirror_create", c_int, P(kvt_mirror_config), vp, P(vp))
_sig("kvt_mirror_destroy", None, vp)
_sig("kvt_mirror_num_blocks", c_u32, vp)
_sig("kvt_mirror_regions", P(kvt_region), vp)
_sig("kvt_mirror_num_regions", c_u32, vp)
_sig("kvt_worker_config_init", None, P(kvt_worker_config))
_sig("kvt_worker_create", c_int, P(kvt_worker_config), vp, vp, P(vp))
_sig("kvt_worker_destroy", None, vp)
_sig("kvt_worker_bind", c_int, vp, P(kvt_offload_meta))
_sig("kvt_worker_handle_preemptions", c_int, vp)
_sig("kvt_worker_get_finished", c_int, vp, vp, P(P(kvt_str)), P(c_u32))
_sig("kvt_worker_build_meta", c_int, vp, P(kvt_offload_worker_meta))
_sig("kvt_worker_take_invalid_blocks", c_u32, vp, P(c_u32), c_u32)
_sig("kvt_worker_clear", None, vp)
_sig("kvt_worker_flush", c_int, vp)
_sig("kvt_worker_create_disk", c_int, P(kvt_worker_config), vp, vp, P(vp))
_sig("kvt_worker_attach_disk", c_int, vp, vp)
_sig("kvt_worker_attach_disk_tier", c_int, vp, c_u32, vp)
_sig("kvt_worker_attach_remote", c_int, vp, c_u32, vp)
_sig("kvt_mirror_layout", c_int, vp, P(vp))
# disk
_sig("kvt_disk_config_init", None, P(kvt_disk_config))
_sig("kvt_disk_create", c_int, P(kvt_disk_config), vp, P(vp))
_sig("kvt_disk_destroy", None, vp)
_sig("kvt_disk_num_slots", c_u32, vp)
_sig("kvt_disk_slot_bytes", c_u64, vp)
_sig("kvt_disk_path", cp, vp)
_sig("kvt_disk_get_stats", None, vp, P(kvt_disk_stats))
# link
_sig("kvt_link_sched_create", c_int, cp, c_u32, P(vp))
_sig("kvt_link_sched_destroy", None, vp)
_sig("kvt_link_sched_accept", c_int, vp, c_int, P(c_u32))
_sig("kvt_link_sched_step", c_int, vp, P(kvt_offload_meta), cp, ctypes.c_size_t, c_int,
     P(kvt_link_result))
_sig("kvt_link_sched_stop", c_int, vp)
_sig("kvt_link_worker_create", c_int, cp, c_u32, c_u32, c_u32, P(vp))
_sig("kvt_link_worker_destroy", None, vp)
_sig("kvt_link_worker_recv", c_int, vp, c_int, P(kvt_offload_meta), P(vp),
     P(ctypes.c_size_t), P(c_bool))
_sig("kvt_link_worker_reply", c_int, vp, c_int, P(kvt_str), c_u32, P(kvt_offload_worker_meta),
     P(c_u32), c_u32)

# the remote tier (kvtier/remote.h)
_sig("kvt_remote_config_init", None, P(kvt_remote_config))
_sig("kvt_remote_create", c_int, P(kvt_remote_config), P(vp))
_sig("kvt_remote_destroy", None, vp)
_sig("kvt_remote_port", ctypes.c_uint16, vp)
_sig("kvt_remote_publish", c_int, vp, P(c_u32), u8p, c_u32)
_sig("kvt_remote_withdraw", c_int, vp, P(c_u32), c_u32)
_sig("kvt_remote_lookup", c_int, vp, u8p, c_u32, P(kvt_remote_loc), P(c_u32))
_sig("kvt_remote_read", c_int, vp, P(kvt_remote_loc), u8p, c_u32, P(vp), P(ctypes.c_int))
_sig("kvt_remote_read_slots", c_int, vp, P(kvt_remote_loc), u8p, c_u32, P(c_u32),
     P(ctypes.c_int))
_sig("kvt_remote_peer_name", ctypes.c_char_p, vp, c_u32)
_sig("kvt_remote_get_stats", None, vp, P(kvt_remote_stats))


check_sizes(kvt_group_spec, kvt_pool_config, kvt_hit, kvt_block_info, kvt_pool_key, kvt_pool_event,
            kvt_offload_event, kvt_gpu_pool_ops, kvt_offload_sched_req, kvt_offload_config,
            kvt_offload_meta, kvt_event_report, kvt_offload_worker_meta, kvt_offload_stats,
            kvt_copy_config, kvt_mirror_config, kvt_worker_config, kvt_region, kvt_kv_tensor,
            kvt_node_config, kvt_node_stats, kvt_disk_config, kvt_disk_stats, kvt_link_result,
            kvt_remote_config, kvt_remote_loc, kvt_remote_stats)
