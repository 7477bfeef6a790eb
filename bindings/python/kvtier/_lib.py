# SPDX-License-Identifier: Apache-2.0
"""ctypes declarations of kvtier's C API (the subset the Python package wraps).

Every struct mirrors its C declaration field for field, private fields included, so that
kvtier can be handed memory Python allocated; the stats structs the library describes
(kvt_describe) are built from that description instead. At load time each size is checked
against the library's own (kvt_sizeof), and a mismatch refuses to load rather than corrupting
memory.
"""
import ctypes
import ctypes.util
import functools
import os

c_u32, c_u64, c_i64, c_int, c_bool = (ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int64,
                                      ctypes.c_int, ctypes.c_bool)
P = ctypes.POINTER
MAX_GROUPS = 32
HASH_LEN = 16
HOST_DEVICE = -1
ENOSPC = -3  # KVT_ENOSPC: the size query of a *_prometheus or kvt_metrics_merge call
COPY_STORE, COPY_LOAD = 0, 1
MATCH_SKIP_PREFIX_CACHE = 1  # KVT_MATCH_SKIP_PREFIX_CACHE
GROUP_FULL, GROUP_SLIDING, GROUP_MAMBA, GROUP_SCRATCH, GROUP_RING, GROUP_MAMBA_ALIGN = range(6)
HIT_PARTIAL = 1  # KVT_HIT_PARTIAL
NO_EVENT = -1


def _find_library():
    # The path of libkvtier: KVTIER_LIB overrides; then the copy `pip install` put inside the
    # package; then a source tree's build/ (running from bindings/python) and an installed
    # prefix's lib/. Its siblings libkvtier_disk and libkvtier_net lie beside it.
    env = os.environ.get("KVTIER_LIB")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    for rel in ("libkvtier.so", "libkvtier.so.0", "../../../build/lib/libkvtier.so.0",
                "../../../../lib/libkvtier.so.0"):
        p = os.path.normpath(os.path.join(here, rel))
        if os.path.exists(p):
            return p
    found = ctypes.util.find_library("kvtier")
    if found:
        return found
    raise OSError("kvtier: libkvtier.so.0 not found; set KVTIER_LIB to its path")


class _Libraries:
    """The three shared libraries as one: libkvtier (pool, offload manager, copy engine,
    worker, EC state machines), libkvtier_disk (the disk tier) and libkvtier_net (ZeroMQ and
    UCX). A function is looked up in each, in that order, and kept."""

    def __init__(self, core):
        self.path = os.path.abspath(core) if os.sep in core else core
        d, base = os.path.split(core)
        self._libs = [ctypes.CDLL(core)]
        for name in ("kvtier_disk", "kvtier_net"):
            # the same file name form as libkvtier's (a wheel: libNAME.so; a build: .so.0)
            sib = base.replace("libkvtier", "lib" + name, 1)
            self._libs.append(ctypes.CDLL(os.path.join(d, sib) if d else sib))

    def __getattr__(self, name):
        for one in self._libs:
            try:
                f = getattr(one, name)
            except AttributeError:
                continue
            setattr(self, name, f)
            return f
        raise AttributeError("kvtier: no function %s in libkvtier, libkvtier_disk or "
                             "libkvtier_net" % name)

    def __getitem__(self, name):
        """A function object of its own (as CDLL[name]): callers may set its argtypes apart."""
        for one in self._libs:
            try:
                return one[name]
            except AttributeError:
                continue
        raise KeyError(name)


lib = _Libraries(_find_library())


def load_extension(name):
    """The compiled module kvtier.<name> lying beside libkvtier (inside the package in a wheel,
    build/lib in a build tree), or None where it was not built. It must come from the same
    build as the library: it calls the functions this module loaded."""
    import importlib.machinery
    import importlib.util
    import sys
    full = "kvtier." + name
    if full in sys.modules:
        return sys.modules[full]
    d = os.path.dirname(lib.path)
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        p = os.path.join(d, name + suffix)
        if os.path.exists(p):
            loader = importlib.machinery.ExtensionFileLoader(full, p)
            spec = importlib.util.spec_from_file_location(full, p, loader=loader)
            mod = importlib.util.module_from_spec(spec)
            loader.exec_module(mod)
            sys.modules[full] = mod
            return mod
    return None


def address(fn_name):
    """The address of a library function (for a compiled module that calls it)."""
    return ctypes.cast(lib[fn_name], ctypes.c_void_p).value


_INT_RANGE = {}
for _t in (ctypes.c_uint8, ctypes.c_uint16, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_uint):
    _INT_RANGE[_t] = (0, (1 << (8 * ctypes.sizeof(_t))) - 1)
for _t in (ctypes.c_int8, ctypes.c_int16, ctypes.c_int32, ctypes.c_int64, ctypes.c_int):
    _INT_RANGE[_t] = (-(1 << (8 * ctypes.sizeof(_t) - 1)), (1 << (8 * ctypes.sizeof(_t) - 1)) - 1)


class Struct(ctypes.Structure):
    """A ctypes struct (every *_config here) whose fields are checked before ctypes converts them: ctypes stores an
    integer modulo the field's width (2**64 + 8 GiB becomes 8 GiB) and a C string up to its
    first NUL (a credential with a NUL inside would be cut short). Here an integer out of the
    field's range, a non-integer in an integer field, or bytes holding a NUL raise ValueError
    (TypeError for a wrong type) naming the struct and the field."""

    def __setattr__(self, name, value):
        kinds = type(self).__dict__.get("_kinds_")
        if kinds is None:
            kinds = {n: t for n, t in type(self)._fields_}
            type(self)._kinds_ = kinds
        t = kinds.get(name)
        if t in _INT_RANGE:
            if isinstance(value, bool) and t is not c_bool:
                value = int(value)
            if not isinstance(value, int):
                raise TypeError("kvtier: %s.%s=%r: expected an integer"
                                % (type(self).__name__, name, value))
            lo, hi = _INT_RANGE[t]
            if not lo <= value <= hi:
                raise ValueError("kvtier: %s.%s=%d: out of range %d..%d"
                                 % (type(self).__name__, name, value, lo, hi))
        elif t is ctypes.c_char_p and value is not None:
            if not isinstance(value, bytes):
                raise TypeError("kvtier: %s.%s=%r: expected bytes"
                                % (type(self).__name__, name, value))
            if b"\0" in value:
                raise ValueError("kvtier: %s.%s: a NUL byte inside would cut the string short"
                                 % (type(self).__name__, name))
        super().__setattr__(name, value)


class kvt_str(ctypes.Structure):
    _fields_ = [("ptr", ctypes.c_char_p), ("len", c_u32)]


class kvt_bump(ctypes.Structure):
    _fields_ = [("head", ctypes.c_void_p), ("cur", ctypes.c_void_p)]


class kvt_group_spec(ctypes.Structure):
    _fields_ = [("kind", c_u32), ("block_size", c_u32), ("sliding_window", c_u32)]


# Configs and stats end in `uint64_t reserved[8]`: room for fields to come (zero).
ROOM = [("reserved", c_u64 * 8)]


def room(words):
    """The reserved room of a struct whose later fields took 8 - words of its words."""
    return [("reserved", c_u64 * words)]


def fields(struct):
    """A struct's field names, without its reserved room."""
    return [n for n, _ in struct._fields_ if n != "reserved"]


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


class kvt_field(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("help", ctypes.c_char_p), ("metric", ctypes.c_char_p),
                ("offset", c_u32), ("size", c_u32), ("count", c_u32), ("kind", c_u32)]


FIELD_COUNTER, FIELD_GAUGE, FIELD_STRING, FIELD_ROOM = range(4)  # KVT_FIELD_*


def _rows(fn_name, row_type, type_name):
    """The rows describer fn_name (kvt_describe, kvt_describe_config) gives for type_name, as
    a list of row_type; ImportError naming the struct where the library lacks either."""
    try:
        fn = lib[fn_name]
    except KeyError:
        raise ImportError("kvtier: %s has no %s: the bindings need a newer libkvtier"
                          % (lib.path, fn_name)) from None
    fn.restype = c_int
    fn.argtypes = [ctypes.c_char_p, P(P(row_type)), P(c_u32)]
    rows, n = P(row_type)(), c_u32()
    if fn(type_name.encode(), ctypes.byref(rows), ctypes.byref(n)) != 0:
        raise ImportError("kvtier: %s does not describe %s: the bindings need a newer "
                          "libkvtier" % (lib.path, type_name))
    return [rows[i] for i in range(n.value)]


def _mirror(type_name, base, fields, offsets):
    """The ctypes class of fields [(name, ctype)], each offset checked against the library's:
    ImportError naming the field where ctypes lays it out elsewhere."""
    cls = type(type_name, (base,), {"_fields_": fields})
    for (name, _), off in zip(fields, offsets):
        if getattr(cls, name).offset != off:
            raise ImportError("kvtier: %s.%s lies at %d in the library, %d in ctypes' layout"
                              % (type_name, name, off, getattr(cls, name).offset))
    return cls


def described(type_name):
    """A ctypes mirror of public struct type_name laid out as the loaded library describes it
    (kvt_describe): a field the library gained reaches Python without a change here. Every
    field's offset is checked against the library's; a library that does not describe the
    struct, or a layout ctypes cannot reproduce, is an ImportError naming the struct."""
    fields, offsets = [], []
    for r in _rows("kvt_describe", kvt_field, type_name):
        if r.kind == FIELD_STRING:
            t = ctypes.c_char_p
        elif r.size in (4, 8):
            t = c_u32 if r.size == 4 else c_u64
        else:
            raise ImportError("kvtier: %s.%s is %d bytes wide, not a number this binding reads"
                              % (type_name, r.name.decode(), r.size))
        if r.kind == FIELD_ROOM:
            t = t * r.count
        fields.append((r.name.decode(), t))
        offsets.append(r.offset)
    return _mirror(type_name, ctypes.Structure, fields, offsets)


class kvt_config_field(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("help", ctypes.c_char_p), ("offset", c_u32),
                ("size", c_u32), ("type", c_u32), ("flags", c_u32), ("default", c_u64),
                ("min", c_u64), ("max", c_u64)]


CONFIG_UINT, CONFIG_INT, CONFIG_BOOL, CONFIG_STRING, CONFIG_ROOM, CONFIG_BYTES = range(6)
CONFIG_REQUIRED = 1


class ConfigRow:
    """One field of a configuration struct as the library describes it (kvt_describe_config):
    name, help, type (CONFIG_*), required, and for a number its default and inclusive bounds
    (Python ints, a signed field's as negative numbers where negative)."""
    __slots__ = ("name", "help", "type", "size", "offset", "required", "default", "min", "max")

    def __init__(self, r):
        self.name, self.help = r.name.decode(), r.help.decode()
        self.type, self.size, self.offset = r.type, r.size, r.offset
        self.required = bool(r.flags & CONFIG_REQUIRED)

        def signed(v):
            return v - (1 << 64) if r.type == CONFIG_INT and v >= 1 << 63 else v
        self.default, self.min, self.max = signed(r.default), signed(r.min), signed(r.max)


@functools.lru_cache(maxsize=None)
def config_rows(type_name):
    """The rows of configuration struct type_name, from the loaded library: {name: ConfigRow}
    in the header's order, read once per struct (callers must not change them). ImportError
    naming the struct where the library does not describe it."""
    rows = _rows("kvt_describe_config", kvt_config_field, type_name)
    return {r.name: r for r in map(ConfigRow, rows)}


def configured(type_name):
    """A checked ctypes mirror (Struct) of configuration struct type_name laid out as the
    library describes it (kvt_describe_config), each offset checked: ImportError naming the
    struct, never a wrong layout."""
    fields, offsets = [], []
    for r in config_rows(type_name).values():
        if r.type == CONFIG_BOOL:
            t = c_bool
        elif r.type == CONFIG_STRING:
            t = ctypes.c_char_p
        elif r.type == CONFIG_ROOM:
            t = c_u64 * (r.size // 8)
        elif r.type == CONFIG_BYTES:
            t = ctypes.c_uint8 * r.size
        elif r.size in (4, 8):
            t = {(4, False): c_u32, (8, False): c_u64, (4, True): ctypes.c_int32,
                 (8, True): c_i64}[(r.size, r.type == CONFIG_INT)]
        else:
            raise ImportError("kvtier: %s.%s is %d bytes wide, not a number this binding reads"
                              % (type_name, r.name, r.size))
        fields.append((r.name, t))
        offsets.append(r.offset)
    return _mirror(type_name, Struct, fields, offsets)


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


def _sig(name, res, *args):
    f = getattr(lib, name)
    f.restype = res
    f.argtypes = list(args)
    return f


vp = ctypes.c_void_p
cp = ctypes.c_char_p
u8p = P(ctypes.c_uint8)
_sig("kvt_sizeof", ctypes.c_size_t, cp)
_sig("kvt_strerror", cp, c_int)
_sig("kvt_err_name", cp, c_int)
_sig("kvt_last_error", cp)
_sig("kvt_version", cp)
_sig("kvt_hash_prompt", c_int, c_u64, P(c_u32), c_u32, c_u32, u8p, ctypes.c_size_t, u8p, c_u32,
     P(c_u32))
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


def _meta_sigs(t):
    """The functions every metadata struct t has: init, clear, release, validate, the codec."""
    kind = t.__name__
    _sig(kind + "_init", None, P(t))
    _sig(kind + "_clear", None, P(t))
    _sig(kind + "_release", None, P(t))
    _sig(kind + "_validate", c_int, P(t))
    _sig(kind + "_encoded_size", ctypes.c_size_t, P(t))
    _sig(kind + "_encode", c_int, P(t), vp, ctypes.c_size_t, P(ctypes.c_size_t))
    _sig(kind + "_decode", c_int, P(t), vp, ctypes.c_size_t)


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


class kvt_metrics_source(ctypes.Structure):
    _fields_ = [("text", cp), ("len", ctypes.c_size_t), ("labels", cp)]


_sig("kvt_metrics_merge", c_int, P(kvt_metrics_source), ctypes.c_size_t, cp, ctypes.c_size_t,
     P(ctypes.c_size_t))
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

for _t in (kvt_str, kvt_bump, kvt_group_spec, kvt_pool_config, kvt_hit, kvt_block_info,
           kvt_pool_key, kvt_pool_event, kvt_offload_event, kvt_gpu_pool_ops, kvt_offload_sched_req,
           kvt_offload_config, kvt_offload_meta, kvt_event_report, kvt_offload_worker_meta,
           kvt_offload_stats,
           kvt_copy_config, kvt_mirror_config, kvt_worker_config, kvt_region, kvt_kv_tensor,
           kvt_node_config, kvt_node_stats, kvt_disk_config, kvt_disk_stats, kvt_link_result, kvt_clock, kvt_ec_item,
           kvt_ec_fence, kvt_slab_view, kvt_ec_shard_config, kvt_ec_reply, kvt_ec_ready_event,
           kvt_ec_shard_stats, kvt_ec_sched_config, kvt_ec_ready, kvt_ec_feature,
           kvt_ec_sched_stats, kvt_ec_load_spec, kvt_ec_push_spec, kvt_ec_meta, kvt_strset,
           kvt_ec_worker_meta, kvt_ec_consumer_ops, kvt_ec_producer_config,
           kvt_ec_producer_stats, kvt_ec_push_failure, kvt_ec_local_consumer, kvt_ec_binding,
           kvt_ec_server_config, kvt_ec_server_stats, kvt_ec_net_config, kvt_ec_inbox_config,
           kvt_ec_inbox_stats, kvt_ec_cache_ops, kvt_remote_config, kvt_remote_loc,
           kvt_remote_stats, kvt_field):
    _c = lib.kvt_sizeof(_t.__name__.encode())
    if _c != ctypes.sizeof(_t):
        raise ImportError("kvtier: %s is %d bytes in the library but %d in the bindings; "
                          "the bindings do not match this libkvtier" % (
                              _t.__name__, _c, ctypes.sizeof(_t)))


class Handle:
    """An object of the library owned through a handle _h, freed by the class's _destroy:
    by close(), by leaving a with block, or at garbage collection."""
    _destroy = None

    def close(self):
        """Frees the object now (otherwise at garbage collection)."""
        h, self._h = getattr(self, "_h", None), None
        if h:
            type(self)._destroy(h)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    @staticmethod
    def getter(fn, doc=None, text=False):
        """A read-only property: library function fn of the handle (a C string decoded when
        text)."""
        def get(self):
            v = getattr(lib, fn)(self._h)
            return v.decode() if text else v
        return property(get, doc=doc)


class Meta:
    """A metadata struct held by value in _m: _kind names it (kvt_offload_meta, ...); its
    _init runs at construction and its _release at garbage collection."""
    _kind = None

    def __init__(self):
        self._m = globals()[self._kind]()
        getattr(lib, self._kind + "_init")(ctypes.byref(self._m))

    def __del__(self):
        getattr(lib, self._kind + "_release")(ctypes.byref(self._m))

    @staticmethod
    def field(name, conv=None):
        """A property reading and writing field `name` of _m (written through conv)."""
        return property(lambda self: getattr(self._m, name),
                        lambda self, v: setattr(self._m, name, conv(v) if conv else v))
