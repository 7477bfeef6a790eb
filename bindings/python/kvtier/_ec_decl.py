# SPDX-License-Identifier: Apache-2.0
"""ctypes declarations of the encoder cache (kvtier/ec.h, ec_net.h): its structs, each checked
against the library's size, and its functions' signatures. Read through kvtier._lib, which
re-exports them."""
import ctypes

from ._lib import (c_bool, c_int, c_u32, c_u64, check_sizes, cp, kvt_bump, kvt_str, _meta_sigs, P,
                   ROOM, _sig, Struct, vp)


# ---- encoder cache ---------------------------------------------------------------------------
EC_KEY_MAX, EC_RID_LEN, EC_MAX_DIMS, EC_MAX_SHARDS = 255, 32, 8, 64
vp_ = ctypes.c_void_p


class kvt_clock(ctypes.Structure):
    _fields_ = [("now_ns", vp_), ("ctx", vp_)]


class kvt_manual_clock(ctypes.Structure):
    _fields_ = [("now_ns", c_u64)]


class kvt_ec_item(ctypes.Structure):
    _fields_ = [("mm_hash", ctypes.c_char_p), ("mm_hash_len", c_u32), ("nbytes", c_u64),
                ("ndim", c_u32), ("shape", c_u64 * EC_MAX_DIMS), ("dtype", ctypes.c_char_p),
                ("dtype_len", c_u32)]


class kvt_ec_source_desc(ctypes.Structure):
    _fields_ = [("ndim", c_u32), ("shape", c_u64 * EC_MAX_DIMS), ("dtype", ctypes.c_char_p)]


class kvt_ec_fence(ctypes.Structure):
    _fields_ = [("done", vp_), ("ctx", vp_)]


class kvt_slab_view(ctypes.Structure):
    _fields_ = [("offset", c_u64), ("nbytes", c_u64), ("rounded", c_u64), ("ptr", vp_)]


class kvt_ec_shard_config(Struct):
    _fields_ = [("base", vp_), ("capacity", c_u64), ("ttl_ns", c_u64), ("max_records", c_u32),
                ("max_tombstones", c_u32), ("max_residents", c_u32), ("max_events", c_u32),
                ("clock", kvt_clock)] + ROOM


class kvt_ec_reply(ctypes.Structure):
    _fields_ = [("reservation_id", ctypes.c_char * (EC_RID_LEN + 1)), ("offset", c_u64),
                ("ptr", vp_), ("nbytes", c_u64), ("write", c_bool), ("ready", c_bool),
                ("cached", c_bool), ("cancelled", c_bool)]


class kvt_ec_ready_event(ctypes.Structure):
    _fields_ = [("transfer_id", ctypes.c_char * (EC_KEY_MAX + 1)),
                ("mm_hash", ctypes.c_char * (EC_KEY_MAX + 1)),
                ("reservation_id", ctypes.c_char * (EC_RID_LEN + 1)), ("nbytes", c_u64),
                ("ndim", c_u32), ("shape", c_u64 * EC_MAX_DIMS), ("dtype", ctypes.c_char * 24),
                ("abandoned", c_bool)]


EC_SHARD_COUNTERS = ("reserves", "writes", "follows", "cached_hits", "completes", "cancels",
                     "expiries", "takes", "reclaims", "deferred_frees", "tombstones_dropped",
                     "events_dropped")


class kvt_ec_shard_stats(ctypes.Structure):
    _fields_ = ([(n, c_u64) for n in EC_SHARD_COUNTERS] +
                [(n, c_u32) for n in ("records", "tombstones", "residents", "writers")] +
                [("free_bytes", c_u64), ("capacity", c_u64), ("held_bytes", c_u64)]) + ROOM


class kvt_ec_sched_config(Struct):
    _fields_ = [("shards", c_u32), ("push_wait_ns", c_u64), ("lease_ns", c_u64),
                ("resident_capacity", c_u64), ("max_transfers", c_u32),
                ("max_tombstones", c_u32), ("max_partial", c_u32), ("clock", kvt_clock)] + ROOM


class kvt_ec_ready(ctypes.Structure):
    _fields_ = [("transfer_id", ctypes.c_char_p), ("transfer_id_len", c_u32),
                ("item", kvt_ec_item), ("shard", c_u32)]


class kvt_ec_feature(ctypes.Structure):
    _fields_ = [("mm_hash", ctypes.c_char_p), ("mm_hash_len", c_u32),
                ("transfer_id", ctypes.c_char_p), ("transfer_id_len", c_u32)]


EC_SCHED_COUNTERS = ("ready_events", "ready_ignored", "abandoned", "loads_started",
                     "local_loads", "loaded", "failed_loads", "unavailable", "cancels")
EC_TSTATES = ("none", "waiting", "available", "loading", "ready", "resident", "failed",
              "unavailable", "expired", "cancelled")


class kvt_ec_sched_stats(ctypes.Structure):
    _fields_ = ([(n, c_u64) for n in EC_SCHED_COUNTERS] +
                [("transfers", c_u32 * len(EC_TSTATES)), ("requests", c_u32)]) + ROOM


class kvt_ec_load_spec(ctypes.Structure):
    _fields_ = [("mm_hash", kvt_str), ("nbytes", c_u64), ("ndim", c_u32),
                ("shape", c_u64 * EC_MAX_DIMS), ("dtype", kvt_str), ("transfer_id", kvt_str),
                ("local", c_bool)]


class kvt_ec_push_spec(ctypes.Structure):
    _fields_ = [("mm_hash", kvt_str), ("nbytes", c_u64), ("ndim", c_u32),
                ("shape", c_u64 * EC_MAX_DIMS), ("dtype", kvt_str), ("consumer_zmq", kvt_str),
                ("transfer_id", kvt_str), ("request_id", kvt_str)]


class kvt_ec_meta(ctypes.Structure):
    _fields_ = [("n_loads", c_u32), ("loads", P(kvt_ec_load_spec)), ("n_pushes", c_u32),
                ("pushes", P(kvt_ec_push_spec)), ("has_freed", c_bool), ("n_freed", c_u32),
                ("freed", P(kvt_str)), ("cap_loads", c_u32), ("cap_pushes", c_u32),
                ("cap_freed", c_u32), ("strings", kvt_bump)]


class kvt_strset(ctypes.Structure):
    _fields_ = [("n", c_u32), ("items", P(kvt_str)), ("cap", c_u32)]


class kvt_ec_worker_meta(ctypes.Structure):
    _fields_ = [("loaded", kvt_strset), ("failed_loads", kvt_strset), ("reclaimed", kvt_strset),
                ("pending_saves", c_bool), ("failed_saves", kvt_strset), ("strings", kvt_bump)]


class kvt_ec_consumer_ops(ctypes.Structure):
    _fields_ = [(n, vp_) for n in ("shards", "reserve", "write", "complete", "cancel", "ctx",
                                   "reserve_batch", "write_batch", "complete_batch",
                                   "cancel_batch")]


# ---- encoder cache across processes (kvtier/ec_net.h) ----

class kvt_ec_server_config(Struct):
    _fields_ = [("host", ctypes.c_char_p), ("base_port", c_u32), ("dp_index", c_u32),
                ("tp_size", c_u32), ("tp_rank", c_u32), ("max_events", c_u32),
                ("expire_interval_ns", c_u64), ("poll_ms", c_u32), ("data_plane", c_bool),
                ("complete_wait_ms", c_u32), ("max_receives", c_u32),
                ("curve_secret_key", ctypes.c_char_p),
                ("curve_clients", P(ctypes.c_char_p)),
                ("owner_key", ctypes.c_char_p), ("event_host", ctypes.c_char_p),
                ("spin_us", c_u32)] + ROOM


EC_SERVER_COUNTERS = ("requests", "malformed", "items", "item_errors", "events_sent",
                      "events_dropped", "receives_posted", "receives_done", "receives_cancelled",
                      "receives_failed", "bytes_received", "completes_early", "writers_reaped",
                      "clients_refused", "refused", "completes_pending")


class kvt_ec_server_stats(ctypes.Structure):
    _fields_ = [(n, c_u64) for n in EC_SERVER_COUNTERS] + ROOM


class kvt_ec_net_config(Struct):
    _fields_ = [("control_timeout_ms", c_u32), ("write_timeout_ms", c_u32), ("write_window", c_u32),
                ("detect_peer_failure", ctypes.c_bool),
                ("curve_server_key", ctypes.c_char_p), ("curve_public_key", ctypes.c_char_p),
                ("curve_secret_key", ctypes.c_char_p)] + ROOM


class kvt_ec_inbox_config(Struct):
    _fields_ = [("consumer", ctypes.c_char_p), ("control_timeout_ms", c_u32),
                ("retry_ms", c_u32), ("max_cancels", c_u32),
                ("curve_server_key", ctypes.c_char_p), ("curve_public_key", ctypes.c_char_p),
                ("curve_secret_key", ctypes.c_char_p),
                ("owner_key", ctypes.c_char_p), ("event_host", ctypes.c_char_p)] + ROOM


EC_INBOX_COUNTERS = ("discoveries", "events", "bad_events", "cancels_sent", "cancels_failed",
                     "cancels_dropped")


class kvt_ec_inbox_stats(ctypes.Structure):
    _fields_ = [(n, c_u64) for n in EC_INBOX_COUNTERS] + [("shards", c_u32)] + ROOM


# kvt_ec_cache_ops: the rank's encoder cache as kvt_ec_shard_apply reaches it. (fence returns a
# struct, which a ctypes callback cannot: Python callers leave it NULL and place synchronously.)
EC_HOLDS = ctypes.CFUNCTYPE(c_bool, ctypes.c_void_p, ctypes.c_void_p, c_u32, ctypes.c_void_p)
EC_PLACE = ctypes.CFUNCTYPE(c_int, ctypes.c_void_p, P(kvt_ec_load_spec), P(kvt_slab_view))


class kvt_ec_cache_ops(ctypes.Structure):
    _fields_ = [("holds", EC_HOLDS), ("place", EC_PLACE), ("fence", ctypes.c_void_p),
                ("ctx", ctypes.c_void_p)]


class kvt_ec_producer_config(Struct):
    _fields_ = [("ops", kvt_ec_consumer_ops), ("refresh_age_ns", c_u64), ("max_records", c_u32),
                ("max_batch", c_u32), ("max_batch_bytes", c_u64), ("clock", kvt_clock)] + ROOM


EC_PRODUCER_COUNTERS = ("pushes", "reused", "conflicts", "reservations", "refreshes", "batches",
                        "writes", "bytes_written", "completes", "rejected", "abandons", "failed",
                        "cancelled", "done", "silent_shards")


class kvt_ec_producer_stats(ctypes.Structure):
    _fields_ = [(n, c_u64) for n in EC_PRODUCER_COUNTERS] + ROOM


class kvt_ec_push_failure(ctypes.Structure):
    _fields_ = [("mm_hash", ctypes.c_char * (EC_KEY_MAX + 1)),
                ("transfer_id", ctypes.c_char * (EC_KEY_MAX + 1)),
                ("error", ctypes.c_char * 256)]


class kvt_ec_local_consumer(ctypes.Structure):
    _fields_ = [("shards", vp_ * EC_MAX_SHARDS), ("n", c_u32)]


class kvt_ec_binding(ctypes.Structure):
    _fields_ = [("mm_hash", ctypes.c_char * (EC_KEY_MAX + 1)),
                ("transfer_id", ctypes.c_char * (EC_KEY_MAX + 1))]


KEYS = ctypes.c_char * (EC_KEY_MAX + 1)
# encoder cache
_sig("kvt_dtype_size", c_u32, cp, c_u32)
_sig("kvt_clock_manual", kvt_clock, P(kvt_manual_clock), c_u64)
_sig("kvt_clock_manual_advance", None, P(kvt_manual_clock), c_u64)
_sig("kvt_clock_monotonic", kvt_clock)
_sig("kvt_ec_shard_config_init", None, P(kvt_ec_shard_config))
_sig("kvt_ec_shard_create", c_int, P(kvt_ec_shard_config), P(vp))
_sig("kvt_ec_shard_destroy", c_int, vp)
_sig("kvt_ec_shard_reserve", c_int, vp, cp, c_u32, P(kvt_ec_item), P(kvt_ec_reply))
_sig("kvt_ec_shard_complete", c_int, vp, cp, c_u32, cp, P(c_bool), P(c_bool))
_sig("kvt_ec_shard_cancel", c_int, vp, cp, c_u32, cp, c_bool, c_bool, P(c_bool))
_sig("kvt_ec_shard_expire", None, vp)
_sig("kvt_ec_shard_take", c_int, vp, cp, c_u32, cp, c_u32, P(kvt_ec_fence), P(kvt_slab_view))
_sig("kvt_ec_shard_take_resident", c_int, vp, P(kvt_ec_item), P(kvt_slab_view))
_sig("kvt_ec_shard_retire", c_int, vp, cp, c_u32, P(kvt_ec_fence))
_sig("kvt_ec_shard_begin_shutdown", None, vp)
_sig("kvt_ec_shard_writers", c_u32, vp)
_sig("kvt_ec_shard_state", c_int, vp, cp, c_u32)
_sig("kvt_ec_shard_take_events", c_u32, vp, P(kvt_ec_ready_event), c_u32)
_sig("kvt_ec_shard_take_reclaimed", c_u32, vp, P(KEYS), c_u32)
_sig("kvt_ec_shard_get_stats", None, vp, P(kvt_ec_shard_stats))
_sig("kvt_ec_shard_prometheus", c_int, vp, cp, ctypes.c_size_t, P(ctypes.c_size_t))
_sig("kvt_ec_sched_config_init", None, P(kvt_ec_sched_config))
_sig("kvt_ec_sched_create", c_int, P(kvt_ec_sched_config), P(vp))
_sig("kvt_ec_sched_destroy", None, vp)
_sig("kvt_ec_sched_observe_ready", c_int, vp, P(kvt_ec_ready))
_sig("kvt_ec_sched_observe_abandoned", c_int, vp, cp, c_u32)
_sig("kvt_ec_sched_has_cache_item", c_bool, vp, cp, c_u32)
_sig("kvt_ec_sched_ensure", c_int, vp, cp, c_u32, P(kvt_ec_feature), c_u32, P(c_bool))
_sig("kvt_ec_sched_cache_added", c_int, vp, cp, c_u32)
_sig("kvt_ec_sched_cache_freed", c_int, vp, cp, c_u32)
_sig("kvt_ec_sched_consumed", c_int, vp, cp, c_u32, P(kvt_ec_feature))
_sig("kvt_ec_sched_request_finished", c_int, vp, cp, c_u32)
_sig("kvt_ec_sched_request_finished_bound", c_int, vp, cp, c_u32, P(kvt_ec_feature), c_u32)
_sig("kvt_ec_sched_build_meta", c_int, vp, P(kvt_ec_meta))
_sig("kvt_ec_sched_apply_output", c_int, vp, P(kvt_ec_worker_meta))
_sig("kvt_ec_sched_expire", None, vp)
_sig("kvt_ec_sched_take_unavailable", c_u32, vp, P(KEYS), c_u32)
_sig("kvt_ec_sched_take_cancels", c_u32, vp, P(KEYS), c_u32)
_sig("kvt_ec_sched_state", c_int, vp, cp, c_u32)
_sig("kvt_ec_sched_get_stats", None, vp, P(kvt_ec_sched_stats))
_sig("kvt_ec_sched_prometheus", c_int, vp, cp, ctypes.c_size_t, P(ctypes.c_size_t))
_sig("kvt_ec_local_consumer_ops", kvt_ec_consumer_ops, P(kvt_ec_local_consumer))
_sig("kvt_ec_producer_config_init", None, P(kvt_ec_producer_config))
_sig("kvt_ec_producer_create", c_int, P(kvt_ec_producer_config), P(vp))
_sig("kvt_ec_producer_destroy", None, vp)
_sig("kvt_ec_producer_push", c_int, vp, P(kvt_ec_push_spec))
_sig("kvt_ec_producer_push_many", c_int, vp, P(kvt_ec_push_spec), c_u32)
_sig("kvt_ec_producer_bind_source", c_int, vp, cp, c_u32, vp, c_u64, P(kvt_ec_fence))
_sig("kvt_ec_producer_bind_source_typed", c_int, vp, cp, c_u32, vp, c_u64,
     P(kvt_ec_source_desc), P(kvt_ec_fence))
_sig("kvt_ec_producer_dispatch", c_int, vp)
_sig("kvt_ec_producer_request_finished", c_int, vp, cp, c_u32)
_sig("kvt_ec_producer_pending", c_bool, vp)
_sig("kvt_ec_producer_report", c_int, vp, P(kvt_ec_worker_meta))
_sig("kvt_ec_producer_take_failures", c_u32, vp, P(kvt_ec_push_failure), c_u32)
_sig("kvt_ec_producer_state", c_int, vp, cp, c_u32)
_sig("kvt_ec_producer_get_stats", None, vp, P(kvt_ec_producer_stats))
_sig("kvt_ec_producer_prometheus", c_int, vp, cp, ctypes.c_size_t, P(ctypes.c_size_t))
_sig("kvt_ec_planner_create", c_int, c_u32, P(vp))
_sig("kvt_ec_planner_destroy", None, vp)
_sig("kvt_ec_planner_prepare", c_int, vp, P(kvt_ec_push_spec))
_sig("kvt_ec_planner_build_meta", c_int, vp, P(kvt_ec_meta))
_sig("kvt_ec_planner_bindings", c_u32, vp, cp, c_u32, P(kvt_ec_binding), c_u32)
_sig("kvt_ec_planner_request_finished", c_int, vp, cp, c_u32)
_sig("kvt_ec_planner_apply_output", c_int, vp, P(kvt_ec_worker_meta))
_sig("kvt_ec_planner_has_pending_push_work", c_bool, vp)
_sig("kvt_ec_planner_take_failed", c_u32, vp, P(KEYS), c_u32)
_sig("kvt_ec_server_config_init", None, P(kvt_ec_server_config))
_sig("kvt_ec_server_start", c_int, P(kvt_ec_server_config), vp, P(vp))
_sig("kvt_ec_server_stop", None, vp)
_sig("kvt_ec_server_port", c_u32, vp)
_sig("kvt_ec_server_event_port", c_u32, vp)
_sig("kvt_ec_server_event_endpoint", ctypes.c_char_p, vp)
_sig("kvt_ec_server_apply", c_int, vp, P(kvt_ec_meta), P(kvt_ec_cache_ops), P(kvt_ec_worker_meta))
_sig("kvt_ec_server_get_stats", None, vp, P(kvt_ec_server_stats))
_sig("kvt_ec_net_config_init", None, P(kvt_ec_net_config))
_sig("kvt_ec_net_consumer_create", c_int, P(kvt_ec_net_config), P(vp))
_sig("kvt_ec_net_consumer_destroy", None, vp)
_sig("kvt_ec_net_consumer_ops", kvt_ec_consumer_ops, vp)
_sig("kvt_ec_inbox_config_init", None, P(kvt_ec_inbox_config))
_sig("kvt_ec_inbox_create", c_int, P(kvt_ec_inbox_config), P(vp))
_sig("kvt_ec_inbox_destroy", None, vp)
_sig("kvt_ec_inbox_step", c_int, vp, vp)
_sig("kvt_ec_inbox_get_stats", None, vp, P(kvt_ec_inbox_stats))
_meta_sigs(kvt_ec_meta)
_meta_sigs(kvt_ec_worker_meta)
_sig("kvt_ec_worker_meta_add", c_int, P(kvt_ec_worker_meta), c_int, cp, c_u32)
_sig("kvt_ec_worker_meta_aggregate", c_int, P(kvt_ec_worker_meta), P(kvt_ec_worker_meta))


check_sizes(kvt_clock, kvt_ec_item, kvt_ec_fence, kvt_slab_view, kvt_ec_shard_config, kvt_ec_reply,
            kvt_ec_ready_event, kvt_ec_shard_stats, kvt_ec_sched_config, kvt_ec_ready,
            kvt_ec_feature, kvt_ec_sched_stats, kvt_ec_load_spec, kvt_ec_push_spec, kvt_ec_meta,
            kvt_strset, kvt_ec_worker_meta, kvt_ec_consumer_ops, kvt_ec_producer_config,
            kvt_ec_producer_stats, kvt_ec_push_failure, kvt_ec_local_consumer, kvt_ec_binding,
            kvt_ec_server_config, kvt_ec_server_stats, kvt_ec_net_config, kvt_ec_inbox_config,
            kvt_ec_inbox_stats, kvt_ec_cache_ops)
