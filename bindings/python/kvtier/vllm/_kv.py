# SPDX-License-Identifier: Apache-2.0
"""KvtierConnector: vLLM's KV connector interface over kvtier's offload manager and worker.

Load it as an out-of-tree connector::

    kv_transfer_config={"kv_connector": "KvtierConnector",
                        "kv_connector_module_path": "kvtier.vllm",
                        "kv_role": "kv_both",
                        "kv_connector_extra_config": {"cpu_bytes_to_use": 8 << 30}}

Scheduler side (one per engine): kvtier's C offload manager works on vLLM's own GPU BlockPool
in place. It never copies the pool: it pins and unpins blocks through two batched callbacks
(BlockPool.touch / free_blocks, one call per transfer), takes the keys of the blocks it stores
from the request's block_hashes (vLLM's key: the hash at the block's last hash-block boundary
plus the group id), walks the free queue through a third callback in lazy mode and looks keys up
through a fourth for re-stores. Python does only what vLLM's scheduler hands over: per request
and step one C call, and none at all for a request with no newly confirmed block.

Worker side (one per rank): the rank's KV cache tensors become kvtier regions (the placement in
KVCacheConfig.kv_cache_tensors, as vLLM's own CPU offload worker reads it), a host mirror of
them is the host tier, and kvtier's worker moves blocks: CPU copy threads when vLLM runs on the
CPU, CUDA (cuMemcpyBatchAsync on low-priority streams, after a compute-done event) on a GPU.
Copies are launched after the forward (get_finished) and reported by event index.

Metadata crosses from scheduler to workers in kvtier's versioned wire encoding (validated on
decode), and back as encoded worker reports that vLLM aggregates across ranks (stores complete
only when all world_size ranks reported them).
"""
import array
import ctypes
import importlib
import logging
import os
import weakref
from typing import Any

from .. import (Disk, KvtierError, Layout, Mirror, Node, OffloadManager, OffloadMeta, Remote,
                 Worker, WorkerMeta)
from ._config import ConfigError, KvtierConfig

try:  # vLLM is not a dependency of the kvtier package: only this module needs it
    import torch
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (KVConnectorBase_V1,
                                                                   KVConnectorMetadata,
                                                                   KVConnectorRole,
                                                                   KVConnectorWorkerMetadata,
                                                                   SupportsHMA)
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats
    from vllm.v1.kv_cache_interface import (FullAttentionSpec, MambaSpec, SlidingWindowSpec)
except ImportError as e:  # pragma: no cover - exercised only without vLLM
    raise ImportError("kvtier.vllm needs vLLM (pip install vllm); kvtier itself does not: %s"
                      % e) from e
try:  # what cache events are built with; older vLLM: bytes hashes, no extra keys
    from vllm.v1.core.kv_cache_utils import (generate_block_hash_extra_keys,
                                             maybe_convert_block_hash, to_event_extra_keys)
except ImportError:  # pragma: no cover - older vLLM
    generate_block_hash_extra_keys = to_event_extra_keys = None

    def maybe_convert_block_hash(h):
        return h

logger = logging.getLogger("kvtier.vllm")
L = importlib.import_module("kvtier._lib")  # the module (the package's `_lib` is the CDLL)
_lib = L.lib
_u32p = ctypes.POINTER(ctypes.c_uint32)


# ---- metadata crossing vLLM's process boundaries ------------------------------------------

class KvtierConnectorMetadata(KVConnectorMetadata):
    """Scheduler -> worker: one step's kvt_offload_meta in kvtier's wire encoding (b"" when the
    step has nothing for the workers), and need_flush (preemption) outside it, because vLLM
    calls handle_preemptions before it binds the metadata."""

    __slots__ = ("data", "need_flush")

    def __init__(self, data=b"", need_flush=False):
        self.data = data
        self.need_flush = need_flush


class KvtierWorkerMetadata(KVConnectorWorkerMetadata):
    """Worker -> scheduler: the rank's store reports (kvt_offload_worker_meta, encoded).
    vLLM merges the ranks' objects with aggregate(): counts add up per event, failures unite."""

    __slots__ = ("data",)

    def __init__(self, data=b""):
        self.data = data

    def aggregate(self, other):
        if other is None or not other.data:
            return self
        if not self.data:
            return other
        mine = WorkerMeta.decode(self.data)
        mine.aggregate(WorkerMeta.decode(other.data))
        return KvtierWorkerMetadata(mine.encode())


def _tokens_per_step(vllm_config):
    """The most tokens a decoding request computes in one step: one, plus the speculative
    tokens checked with it."""
    spec = getattr(vllm_config, "speculative_config", None)
    return 1 + int(getattr(spec, "num_speculative_tokens", 0) or 0)


def _sched_extension():
    """kvtier._sched, the compiled scheduler side, or None: not built (no Python headers when
    kvtier was installed), or KVTIER_VLLM_SCHED=ctypes asks for the ctypes path."""
    how = os.environ.get("KVTIER_VLLM_SCHED", "auto")
    if how not in ("auto", "compiled", "ctypes"):
        raise ConfigError("kvtier: KVTIER_VLLM_SCHED=%r: auto, compiled or ctypes" % how)
    if how == "ctypes":
        return None
    ext = L.load_extension("_sched")
    if ext is None and how == "compiled":
        raise ConfigError("kvtier: KVTIER_VLLM_SCHED=compiled but kvtier._sched was not built "
                          "(install Python's headers, e.g. Debian's python3-dev, and reinstall)")
    if ext is None:
        logger.warning("kvtier: kvtier._sched was not built (no Python headers when kvtier was "
                       "installed): the scheduler side runs its slower ctypes path")
    return ext


_STAT_COUNTERS = ("lookups", "hit_tokens", "miss_tokens", "load_blocks", "loads_completed",
                  "store_blocks", "stores_completed", "stores_failed", "host_evictions",
                  "restores", "bytes_loaded", "bytes_stored")


class KvtierStats(KVConnectorStats):
    """Scheduler-side counters drained once per step (vLLM logs their sums per interval)."""

    def reset(self):
        self.data = {}

    def aggregate(self, other):
        for k, v in (other.data or {}).items():
            self.data[k] = self.data.get(k, 0) + v
        return self

    def reduce(self):
        return dict(self.data)

    def is_empty(self):
        return not any(self.data.values())


# ---- the KV cache placement vLLM chose -------------------------------------------------------

def kv_regions(kv_cache_config):
    """[(layer_name, byte offset into its backing storage, block_bytes)] of every distinct
    region of equally strided blocks, from KVCacheConfig.kv_cache_tensors (vLLM places all of a
    rank's tensors in one backing allocation; layer-outermost tensors give a region per layer,
    block-outermost ones a single region whose block spans all layers)."""
    nb = kv_cache_config.num_blocks
    seen, out = set(), []
    # a tensor that only layers of groups that are not prefix-cacheable use (scratch, ring)
    # never moves: the host tier's bytes per block exclude it
    skip = _uncacheable_layers(kv_cache_config)
    for t in kv_cache_config.kv_cache_tensors:
        if not t.layers or all(name in skip for name in t.layers):
            continue
        bb = t.block_stride
        span_blocks = nb * bb
        if bb <= 0:
            raise ConfigError("kvtier: KV cache tensor of %s has block_stride %d" % (t.layers, bb))
        if t.layer_stride >= span_blocks:
            start, span = t.offset, len(t.layers) * t.layer_stride
        else:
            start, span = 0, span_blocks
        n = span // span_blocks
        per_layer = max(1, n // len(t.layers)) if t.layer_stride >= span_blocks else n
        for i in range(n):
            off = start + i * span_blocks
            if off in seen:
                continue
            seen.add(off)
            layer = t.layers[min(i // per_layer, len(t.layers) - 1)]
            out.append((layer, off, bb))
    return out


def _cacheable_group_ids(kv_cache_config):
    groups = kv_cache_config.kv_cache_groups
    return set(getattr(kv_cache_config, "prefix_cacheable_group_ids", range(len(groups))))


def _uncacheable_layers(kv_cache_config):
    ids = _cacheable_group_ids(kv_cache_config)
    return {name for g, grp in enumerate(kv_cache_config.kv_cache_groups) if g not in ids
            for name in grp.layer_names}


def block_bytes_per_rank(kv_cache_config):
    """Bytes one block occupies on a rank, over all its regions."""
    return sum(bb for _, _, bb in kv_regions(kv_cache_config))


def _hash_len(vllm_config):
    algo = getattr(vllm_config.cache_config, "prefix_caching_hash_algo", "sha256")
    if algo.startswith("sha256"):
        return 32
    if algo.startswith("xxhash"):
        return 16
    raise ConfigError("kvtier: prefix_caching_hash_algo %r is not supported" % algo)


def _group_kind(g, spec, cacheable):
    """(kvt_group_kind, sliding window) of vLLM KV cache group g with spec `spec`."""
    if not cacheable:  # never stored, loaded or searched (spec §2.14)
        ring = type(spec).__name__ == "CircularBufferSpec"
        return (L.GROUP_RING if ring else L.GROUP_SCRATCH), 0
    if isinstance(spec, SlidingWindowSpec):
        return L.GROUP_SLIDING, spec.sliding_window
    if isinstance(spec, MambaSpec):
        # "all": a state in every block, stored by position. "align" (vLLM's default with
        # prefix caching): states only at boundaries, in blocks whose table position is not
        # stable, so never stored by position (kvt_offload_boundary_states hands them over;
        # vLLM has no hook for that yet, so such a group is not offloaded: no wrong state)
        all_mode = getattr(spec, "mamba_cache_mode", "all") == "all"
        return (L.GROUP_MAMBA if all_mode else L.GROUP_MAMBA_ALIGN), 0
    if isinstance(spec, FullAttentionSpec):
        return L.GROUP_FULL, 0
    raise ConfigError("kvtier: KV cache group %d has spec %s, which is not supported"
                      % (g, type(spec).__name__))


def _group_specs(kv_cache_config, vllm_config):
    """kvt_pool_config for vLLM's GPU pool: groups, block sizes, hash block size."""
    from vllm.v1.core.kv_cache_utils import (resolve_dcp_kv_block_size,
                                             resolve_kv_cache_block_sizes)
    sched_bs, hash_bs = resolve_kv_cache_block_sizes(kv_cache_config, vllm_config)
    par = vllm_config.parallel_config
    dcp = par.decode_context_parallel_size
    cfg = L.kvt_pool_config()
    _lib.kvt_pool_config_init(ctypes.byref(cfg))
    groups = kv_cache_config.kv_cache_groups
    if not groups or len(groups) > L.MAX_GROUPS:
        raise ConfigError("kvtier: %d KV cache groups (1..%d supported)"
                          % (len(groups), L.MAX_GROUPS))
    cacheable = _cacheable_group_ids(kv_cache_config)
    for g, grp in enumerate(groups):
        spec = grp.kv_cache_spec
        gs = cfg.groups[g]
        # as the scheduler sees it: attention blocks spread over the decode context-parallel
        # ranks are dcp times larger, Mamba states are whole on every rank
        gs.block_size = resolve_dcp_kv_block_size(spec, dcp)
        gs.kind, gs.sliding_window = _group_kind(g, spec, g in cacheable)
    cfg.n_groups = len(groups)
    cfg.dcp_world_size = dcp
    cfg.pcp_world_size = getattr(par, "prefill_context_parallel_size", 1)
    cfg.num_blocks = kv_cache_config.num_blocks
    cfg.hash_len = _hash_len(vllm_config)
    cfg.hash_block_size = hash_bs
    cfg.scheduler_block_size = sched_bs
    got = L.c_u32()
    rc = _lib.kvt_pool_config_validate(ctypes.byref(cfg), ctypes.byref(got))
    if rc < 0:
        raise ConfigError("kvtier: vLLM's KV cache layout: %s"
                          % _lib.kvt_last_error().decode(errors="replace"))
    return cfg


def host_blocks_for(cfg, kv_cache_config):
    """Host-tier (or disk-only) blocks per rank: the same number on the scheduler and every
    worker, from the configured bytes and the bytes one block occupies on a rank."""
    bpr = block_bytes_per_rank(kv_cache_config)
    n = cfg.tier_bytes_per_rank // bpr if bpr else 0
    if n < 2:
        key = "disk_capacity_bytes" if cfg.backend == "disk" else "cpu_bytes_to_use(_per_rank)"
        raise ConfigError("kvtier: %s gives %d bytes per rank, %d host_blocks of %d bytes; at "
                          "least 2 are needed (block 0 is the null block)"
                          % (key, cfg.tier_bytes_per_rank, n, bpr))
    return OffloadManager.size_host(cfg.tier_bytes_per_rank, bpr)


# ---- scheduler side -----------------------------------------------------------------------

class _Req:
    """What the scheduler side keeps per request: the request, its block table per group (as
    uint32 arrays whose buffers C reads in place), its chained hashes joined, and its slot in
    the scheduler's per-request arrays."""

    __slots__ = ("request", "rid", "tables", "hashes", "n_hashes", "pending", "restart",
                 "slot", "item", "item_addr", "ptrs", "counts")

    def __init__(self, request, n_groups, slot):
        self.request = request
        self.rid = request.request_id.encode()
        self.tables = [array.array("I") for _ in range(n_groups)]
        self.hashes = array.array("B")
        self.n_hashes = 0
        self.pending = 0  # blocks the last call left unselected (no room, no hash yet)
        self.restart = False  # preempted: its stores restart from its first block
        self.slot = slot  # index into _Scheduler.ready; -1 when the table was full
        # its entry of kvt_offload_schedule_many, kept across steps: only what changed is set
        self.ptrs = (ctypes.c_void_p * n_groups)()
        self.counts = (ctypes.c_uint32 * n_groups)()
        it = self.item = L.kvt_offload_sched_req()
        it.req_id = self.rid
        it.req_id_len = len(self.rid)
        it.blocks = ctypes.addressof(self.ptrs)
        it.n_blocks = ctypes.addressof(self.counts)
        self.item_addr = ctypes.addressof(it)

    def sync_hashes(self):
        bh = self.request.block_hashes
        n = len(bh)
        if n > self.n_hashes:
            self.hashes.frombytes(b"".join(bh[self.n_hashes:n]))
            self.n_hashes = n
        return self.hashes.buffer_info()[0], n


class _HostShare:
    """A worker's host mirror that the scheduler's remote tier serves too (same process): the
    last of the two to close frees it, so no peer's read ever lands in freed memory. The
    worker reads the remote tier's hits into it (Worker.attach_remote)."""

    def __init__(self, mirror, worker):
        self.mirror, self.worker, self.users = mirror, worker, 1

    def release(self):
        self.users -= 1
        if self.users == 0:
            self.mirror.close()


# engine id -> the _HostShare of that engine's worker in this process (remote tier only)
_HOSTS = {}


def _signature(vllm_config, gcfg):
    """Digest of what instances sharing KV blocks must agree on besides the hash seed."""
    import hashlib
    v = vllm_config
    groups = tuple((gcfg.groups[g].kind, gcfg.groups[g].block_size)
                   for g in range(gcfg.n_groups))
    return hashlib.sha256(repr((str(v.model_config.model), str(v.model_config.dtype),
                                str(v.cache_config.prefix_caching_hash_algo), groups,
                                gcfg.hash_block_size)).encode()).digest()


def _hash_seed(vllm_config=None):
    """vLLM's hash seed as a fingerprint: the first 8 bytes of its root hash (NONE_HASH). In a
    worker process, where vLLM does not set NONE_HASH, it is derived as the engine core derives
    it (the same value whenever it is reproducible across processes: PYTHONHASHSEED set, or a
    cryptographic hash)."""
    from vllm.v1.core import kv_cache_utils
    h = getattr(kv_cache_utils, "NONE_HASH", None)
    if h is None and vllm_config is not None:
        from vllm.utils.hashing import get_hash_fn_by_name
        fn = get_hash_fn_by_name(vllm_config.cache_config.prefix_caching_hash_algo)
        h = fn(kv_cache_utils.resolve_none_hash_seed(fn))
    return int.from_bytes(bytes(h)[:8], "little")


def _remote_instance(cfg, vllm_config):
    """This engine's name in the remote space. An engine of several ranks has processes of
    its own for its scheduler and each rank: unless given, the name comes from the engine id
    they share (the host name's and pid's default would differ between them)."""
    if cfg.remote_instance_given or cfg.world_size == 1:
        return cfg.remote_instance
    eid = "".join(c if c.isascii() and (c.isalnum() or c in "_.-") else "-"
                  for c in str(vllm_config.kv_transfer_config.engine_id))
    return (cfg.remote_instance.rsplit("-", 1)[0][:20] + "-" + eid)[:60]


class _Scheduler:
    def __init__(self, vllm_config, kv_cache_config, cfg):
        self.cfg = cfg
        self.gcfg = _group_specs(kv_cache_config, vllm_config)
        self.ng = self.gcfg.n_groups
        self.sched_bs = self.gcfg.scheduler_block_size
        self.hash_len = self.gcfg.hash_len
        self.bpr = block_bytes_per_rank(kv_cache_config)
        self.host_blocks = host_blocks_for(cfg, kv_cache_config)
        # a node tier: every replica's slots (this one's per-rank share times the replicas),
        # attached at the first call, once vLLM fixed its hash seed (NONE_HASH)
        self.node = None
        self._node_pending = bool(cfg.node_tier)
        self._vllm_config = vllm_config
        if cfg.node_tier:
            self.node_bpr = self.host_blocks
            self.host_blocks = self.node_bpr * cfg.node_ranks
        # a remote tier: attached at the first call too, over the worker's mirror
        self.remote = None
        self._host_share = None
        self._remote_pending = bool(cfg.remote_directory)
        self.gpu = None  # vLLM's BlockPool, bound by the scheduler
        self.engine_block_releases = 0  # times its reset was refused and kvtier let go
        self.reqs = {}
        self._cb_error = None
        self._stats_last = {}
        self._events = bool(getattr(vllm_config, "kv_events_config", None) and
                            vllm_config.kv_events_config.enable_kv_cache_events)
        self._medium = "STORAGE" if cfg.backend == "disk" else "CPU"
        # request contexts of the events (kvt_offload_set_request_context): the library names
        # a request by a number in each stored event; the request stays here until its
        # context_done event, so a finished request's last stores still get its token ids
        self._ctx = {}         # ctx -> vLLM Request
        self._ctx_of = {}      # request id -> ctx
        self._ctx_next = 1
        self._ctx_finished = set()  # ctxs of finished requests (dropped if events are lost)
        # scratch and ring groups never reach an event
        self._kinds = [{0: "full_attention", 1: "sliding_window", 2: "mamba", 5: "mamba"}.get(
            self.gcfg.groups[g].kind) for g in range(self.ng)]

        oc = L.kvt_offload_config()
        _lib.kvt_offload_config_init(ctypes.byref(oc))
        two_tier_disk = cfg.backend == "cpu+disk"
        oc.host_blocks = self.host_blocks
        oc.world_size = cfg.world_size
        oc.lazy = cfg.lazy
        oc.max_requests = cfg.max_requests
        oc.max_batched_tokens = vllm_config.scheduler_config.max_num_batched_tokens
        oc.max_num_seqs = vllm_config.scheduler_config.max_num_seqs  # the lazy window's term
        oc.max_model_len = vllm_config.model_config.max_model_len
        oc.restore_budget = cfg.restore_budget
        if cfg.remote_directory:
            oc.remote_miss_ms = cfg.remote_miss_ms
        oc.block_bytes = self.bpr * cfg.world_size
        oc.event_capacity = 65536 if self._events else 0
        # the schedule calls are made inside build_connector_meta, after vLLM scheduled the
        # step: no GPU block is freed before kvt_offload_build_meta, so the step's store pins
        # reach vLLM's BlockPool in one touch instead of one per request
        oc.defer_schedule_pins = True
        if two_tier_disk:
            oc.disk_blocks = OffloadManager.size_host(cfg.disk_bytes_per_rank, self.bpr)
        ext = _sched_extension()
        self._fast = None
        if ext is not None:
            # the compiled hooks (kvtier._sched): its pool callbacks are C functions with the
            # extension object as their context
            self._fast = ext.Scheduler(
                [L.address(n) for n in ext.API_NAMES],
                [self.gcfg.groups[g].block_size for g in range(self.ng)], self.sched_bs,
                self.hash_len, not cfg.lazy, KvtierError,
                [(k, getattr(L.kvt_offload_stats, k).offset) for k in _STAT_COUNTERS],
                _tokens_per_step(vllm_config))
            touch, free, scan, lookup, ctx = self._fast.ops()
            self._ops = L.kvt_gpu_pool_ops(ctypes.cast(touch, L.GPU_TOUCH),
                                           ctypes.cast(free, L.GPU_FREE),
                                           ctypes.cast(scan, L.GPU_LRU_SCAN),
                                           ctypes.cast(lookup, L.GPU_LOOKUP))
            ctx = ctypes.c_void_p(ctx)
        else:
            # the callbacks keep references to these ctypes function objects for as long as C
            # may call them: they live on self
            self._ops = L.kvt_gpu_pool_ops(L.GPU_TOUCH(self._touch), L.GPU_FREE(self._free),
                                           L.GPU_LRU_SCAN(self._lru_scan),
                                           L.GPU_LOOKUP(self._lookup))
            ctx = None
        h = ctypes.c_void_p()
        self._call(_lib.kvt_offload_create_ext(ctypes.byref(oc), ctypes.byref(self.gcfg),
                                               ctypes.byref(self._ops), ctx, ctypes.byref(h)))
        self.h = h
        self.meta = OffloadMeta()
        self._meta_ref = ctypes.byref(self.meta._m)
        self._wm = WorkerMeta()  # reused: decoded into every step
        self._wm_ref = ctypes.byref(self._wm._m)
        if self._fast is not None:
            self._fast.bind(h.value, ctypes.addressof(self.meta._m),
                            ctypes.addressof(self._wm._m))
        self._st = L.kvt_offload_stats()
        self._st_ref = ctypes.byref(self._st)
        self._empty = KvtierConnectorMetadata()
        if self._fast is None:
            self._init_ctypes_hooks(cfg)
        logger.info("kvtier: scheduler side: %d host blocks of %d bytes per rank (%s), %d "
                    "ranks, %s stores, %d GPU blocks, %s hooks", self.host_blocks, self.bpr,
                    cfg.backend, cfg.world_size, "lazy" if cfg.lazy else "eager",
                    kv_cache_config.num_blocks,
                    "compiled" if self._fast is not None else "ctypes")

    def _init_ctypes_hooks(self, cfg):
        """What the ctypes path of the hooks keeps (the compiled module keeps its own)."""
        # per-request state the hot path reads without touching Python objects: the confirmed
        # scheduler blocks each request's last schedule call covered (-1: none yet)
        import numpy as np
        self._np = np
        self.ready = np.full(cfg.max_requests, -1, dtype=np.int64)
        self._free_slots = list(range(cfg.max_requests - 1, -1, -1))
        self._slot_of = {}  # request id -> slot
        self._retry = set()  # requests whose last call left blocks, or that restart
        # the step's schedule call with reusable argument arrays (private function objects,
        # so the shared declarations in kvtier._lib are not changed)
        fm = _lib["kvt_offload_schedule_many"]
        fm.restype = ctypes.c_int
        fm.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint32,
                       ctypes.c_void_p]
        self._many_fn = fm
        self._items = (ctypes.c_void_p * 256)()
        self._batch = []
        self._ptrs = (ctypes.c_void_p * self.ng)()
        self._counts = (ctypes.c_uint32 * self.ng)()
        # after_alloc and request_finished with the same reusable arrays
        fa = _lib["kvt_offload_after_alloc"]
        fa.restype = ctypes.c_int
        fa.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint32,
                       ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_uint32),
                       ctypes.c_uint32]
        self._alloc_fn = fa
        ff = _lib["kvt_offload_request_finished_hashed"]
        ff.restype = ctypes.c_int
        ff.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint32,
                       ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_uint32),
                       ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint32]
        self._fin_fn = ff

    @property
    def compiled(self):
        """True when the hooks run in kvtier._sched."""
        return self._fast is not None

    def bind_gpu(self, pool):
        self.gpu = pool
        if self._fast is not None:
            self._fast.set_gpu(pool)

    def close(self):
        h, self.h = getattr(self, "h", None), None
        fast = getattr(self, "_fast", None)
        if fast is not None:
            fast.unbind()
        if h:
            _lib.kvt_offload_destroy(h)
        node, self.node = getattr(self, "node", None), None
        if node is not None:
            node.close()  # after the manager: it withdraws this replica's slots first
        remote, self.remote = getattr(self, "remote", None), None
        if remote is not None:
            remote.close()  # after the manager (it withdraws), before the mirror goes
        share, self._host_share = getattr(self, "_host_share", None), None
        if share is not None:
            share.release()

    def _attach_remote(self):
        """Joins the remote tier. One rank: serving the host tier of this engine's worker,
        which is in this process (vLLM's uniprocess executor). Several ranks (the multiprocess
        executor): a lookup-only client of the directory; each rank serves, publishes and reads
        its own part of every block through a remote of its own (_Worker)."""
        c, v = self.cfg, self._vllm_config
        if c.world_size > 1:
            return self._attach_remote_client()
        share = _HOSTS.get(v.kv_transfer_config.engine_id)
        if share is None or share.mirror._h is None:
            raise ConfigError("kvtier: kvtier_remote_directory: this engine's worker is not in "
                              "the scheduler's process, so the remote tier cannot serve its "
                              "host tier (it needs one rank and vLLM's uniprocess executor)")
        remote = Remote(c.remote_directory, c.remote_space, c.remote_instance,
                        c.remote_listen_host, c.remote_credential, 0, mirror=share.mirror,
                        hash_len=self.hash_len, hash_seed=_hash_seed(),
                        signature=_signature(v, self.gcfg), listen_port=c.remote_port,
                        advertise_host=c.remote_advertise_host,
                        timeout_ms=c.remote_timeout_ms,
                        directory_password=c.remote_directory_password,
                        encrypt=c.remote_encrypt)
        try:
            self._call(_lib.kvt_offload_attach_remote(self.h, remote._h))
            # the worker reads the remote hits' blocks, on a thread of its own
            share.worker.attach_remote(remote, _lib.kvt_offload_remote_tier(self.h))
        except Exception:
            remote.close()
            raise
        share.users += 1
        self._host_share = share
        self.remote = remote
        self._remote_pending = False
        logger.info("kvtier: remote tier: instance %s of space %s, directory %s, serving on "
                    "port %d", c.remote_instance, c.remote_space, c.remote_directory,
                    remote.port)

    def _lend(self, attach, tier):
        """Lends the manager a node or remote tier (attach: its kvt_offload_attach_*); a tier
        the manager refused is closed."""
        try:
            self._call(attach(self.h, tier._h))
        except Exception:
            tier.close()
            raise

    def _attach_remote_client(self):
        c, v = self.cfg, self._vllm_config
        remote = Remote(c.remote_directory, c.remote_space, _remote_instance(c, v), None, None, 0,
                        hash_len=self.hash_len, hash_seed=_hash_seed(),
                        timeout_ms=c.remote_timeout_ms,
                        directory_password=c.remote_directory_password, ranks=c.world_size,
                        rank=None)
        self._lend(_lib.kvt_offload_attach_remote, remote)
        self.remote = remote
        self._remote_pending = False
        logger.info("kvtier: remote tier: instance %s of space %s, directory %s, %d ranks "
                    "(each serves its part)", _remote_instance(c, v), c.remote_space,
                    c.remote_directory, c.world_size)

    def remote_stats(self):
        """The remote tier's counters (kvt_remote_stats), or None without one."""
        return self.remote.stats() if self.remote is not None else None

    def _attach_node(self):
        """Joins the node tier: its configuration carries everything the replicas must share
        (a replica with another hash seed is refused, not left to miss forever)."""
        c = self.cfg
        seed, sig = _hash_seed(), _signature(self._vllm_config, self.gcfg)
        node = Node(c.node_tier, c.node_rank, c.node_ranks, self.node_bpr,
                    hash_len=self.hash_len, keys_per_block=self.gcfg.keys_per_block,
                    hash_block_size=self.gcfg.hash_block_size, block_bytes=self.bpr,
                    hash_seed=seed, signature=sig, group=c.node_group, dir=c.node_dir)
        self._lend(_lib.kvt_offload_attach_node, node)
        self.node = node
        self._node_pending = False  # only now: a replica that could not join keeps failing
        logger.info("kvtier: node tier %s: replica %d of %d, %d of its %d slots are this "
                    "replica's", c.node_tier, c.node_rank, c.node_ranks, self.node_bpr - 1,
                    self.host_blocks)

    def node_stats(self):
        """The node tier's counters (kvt_node_stats), or None without one."""
        return self.node.stats() if self.node is not None else None

    # -- C calls and the callbacks they make --------------------------------------------

    def _call(self, rc):
        err, self._cb_error = self._cb_error, None
        if err is not None:
            raise err
        if self._fast is not None:
            self._fast.raise_kept()  # a compiled pool callback's exception
        if rc < 0:
            raise KvtierError(rc, _lib.kvt_last_error().decode(errors="replace"))
        return rc

    def _touch(self, _ctx, ids, n):
        try:
            self.gpu.touch(list(map(self.gpu.blocks.__getitem__, ids[:n])))
        except BaseException as e:  # an exception must not cross C: re-raised after the call
            self._cb_error = self._cb_error or e

    def _free(self, _ctx, ids, n):
        try:
            self.gpu.free_blocks(list(map(self.gpu.blocks.__getitem__, ids[:n])))
        except BaseException as e:
            self._cb_error = self._cb_error or e

    def _lru_scan(self, _ctx, cap, ids, keys):
        try:
            n = 0
            hl = self.hash_len
            for blk in self.gpu.free_block_queue.iter_blocks_after(None):
                if n >= cap:
                    break
                ids[n] = blk.block_id
                key = blk.block_hash
                k = keys[n]
                if key is None or blk.is_null:
                    k.num_tokens = 0
                else:
                    ctypes.memmove(k.hash, key, hl)
                    k.group = int.from_bytes(key[-4:], "big")
                    k.num_tokens = self.gcfg.groups[k.group].block_size
                n += 1
            return n
        except BaseException as e:
            self._cb_error = self._cb_error or e
            return 0

    def _lookup(self, _ctx, hash_ptr, group, ref):
        try:
            key = ctypes.string_at(hash_ptr, self.hash_len) + group.to_bytes(4, "big")
            blk = self.gpu.cached_block_hash_to_block.get_one_block(key)
            if blk is None:
                return 0xFFFFFFFF
            ref[0] = blk.ref_cnt
            return blk.block_id
        except BaseException as e:
            self._cb_error = self._cb_error or e
            return 0xFFFFFFFF

    # -- hooks ----------------------------------------------------------------------------

    def _state(self, request):
        rid = request.request_id
        st = self.reqs.get(rid)
        if st is None:
            slot = self._free_slots.pop() if self._free_slots else -1
            st = self.reqs[rid] = _Req(request, self.ng, slot)
            if slot >= 0:
                self.ready[slot] = -1
                self._slot_of[rid] = slot
        return st

    def _drop(self, rid):
        st = self.reqs.pop(rid, None)
        if st is not None:
            self._retry.discard(rid)
            if st.slot >= 0:
                del self._slot_of[rid]
                self._free_slots.append(st.slot)
        return st

    def match(self, request, num_computed):
        if self._node_pending:
            self._attach_node()
        if self._remote_pending:
            self._attach_remote()
        # A request that wants no cached prefix (prompt logprobs) and a local hit that ends
        # inside a scheduler block both get hit 0 from the library, counted there
        # (lookups_skipped, lookups_misaligned; the latter logged once).
        skip = bool(getattr(request, "skip_reading_prefix_cache", False))
        if self._fast is not None:
            hit = self._fast.match(request, num_computed,
                                   L.MATCH_SKIP_PREFIX_CACHE if skip else 0)
            return hit, hit > 0
        st = self._state(request)
        addr, n = st.sync_hashes()
        if n == 0:
            return 0, False
        hit = L.c_u32()
        flags = L.MATCH_SKIP_PREFIX_CACHE if skip else 0
        self._call(_lib.kvt_offload_match_flags(self.h, st.rid, len(st.rid),
                                                ctypes.cast(addr, L.u8p), n, request.num_tokens,
                                                num_computed, flags, ctypes.byref(hit)))
        return hit.value, hit.value > 0

    def _table_args(self, block_ids):
        """block_ids (lists per group) as the reusable C arguments; returns the arrays, which
        must live until the call returned."""
        keep = [array.array("I", b) for b in block_ids]
        ptrs, counts = self._ptrs, self._counts
        for g in range(self.ng):
            if g < len(keep):
                ptrs[g], counts[g] = keep[g].buffer_info()
            else:
                ptrs[g], counts[g] = None, 0
        return keep

    def after_alloc(self, request, blocks, num_external):
        if self._fast is not None:
            self._fast.after_alloc(request, blocks.get_block_ids(), num_external)
            if self._events and not self.cfg.lazy:
                self._bind_context(request, request.request_id.encode())
            return
        st = self._state(request)
        keep = self._table_args(blocks.get_block_ids())
        rc = self._alloc_fn(self.h, st.rid, len(st.rid), self._ptrs, self._counts,
                            num_external)
        del keep
        if rc < 0 or self._cb_error is not None:
            self._call(rc)
        if self._events and not self.cfg.lazy:
            self._bind_context(request, st.rid)

    def _bind_context(self, request, rid):
        ctx = self._ctx_of.get(request.request_id)
        if ctx is None:
            ctx = self._ctx_next
            self._ctx_next += 1
        rc = _lib.kvt_offload_set_request_context(self.h, rid, len(rid), ctx)
        self._call(rc)
        if rc == 1:
            self._ctx[ctx] = request
            self._ctx_of[request.request_id] = ctx

    def build_meta(self, so):
        if self._node_pending:
            self._attach_node()
        if self._remote_pending:
            self._attach_remote()
        if self._fast is not None:  # all of it in C, the metadata encoded
            data = self._fast.build_meta(so)
            if data is None:
                return self._empty
            return KvtierConnectorMetadata(data, bool(so.preempted_req_ids))
        # The ctypes path of the step. It must not touch every running request in Python: the requests that may have a newly confirmed block are found with array
        # operations over CachedRequestData (num_computed_tokens // block_size against the
        # last call's count), and only those, plus those whose last call left blocks over (no
        # room, no hash yet), get a C call.
        reqs = self.reqs
        preempted = so.preempted_req_ids
        if preempted:
            for rid in preempted:
                st = reqs.get(rid)
                if st is not None:  # its blocks were freed: stores restart from block 0
                    for t in st.tables:
                        del t[:]
                    self._restart(st, rid)
        eager = not self.cfg.lazy
        nsched = so.num_scheduled_tokens
        one = self._schedule_one
        self._select_stores(so, reqs, eager, nsched, one)
        self._run_batch()
        m = self.meta
        self._call(_lib.kvt_offload_build_meta(self.h, bool(preempted), self._meta_ref))
        if not preempted and _lib.kvt_offload_meta_empty(self._meta_ref):
            return self._empty
        return KvtierConnectorMetadata(m.encode(), bool(preempted))

    def _select_stores(self, so, reqs, eager, nsched, one):
        for nr in so.scheduled_new_reqs:
            st = reqs.get(nr.req_id)
            if st is None:
                continue
            for t, ids in zip(st.tables, nr.block_ids):  # a (re)started request: whole table
                del t[:]
                t.extend(ids)
            if eager:
                one(st, nr.req_id, nsched.get(nr.req_id, 0))
        cached = so.scheduled_cached_reqs
        ids = cached.req_ids
        n = len(ids)
        if n and eager:
            nbi = cached.new_block_ids
            if nbi.count(None) != n:
                resumed = cached.resumed_req_ids
                for i, new in enumerate(nbi):
                    if new is None:
                        continue
                    rid = ids[i]
                    st = reqs.get(rid)
                    if st is None:
                        continue
                    if resumed and rid in resumed:  # the new ids replace the table
                        for t in st.tables:
                            del t[:]
                        self._restart(st, rid)
                    for t, b in zip(st.tables, new):
                        if b:
                            t.extend(b)
            np = self._np
            slots = np.fromiter(map(self._slot_of.get, ids, [-1] * n), np.int64, n)
            nc = np.fromiter(cached.num_computed_tokens, np.int64, n)
            ok = slots >= 0
            cand = np.flatnonzero(ok & (nc // self.sched_bs > self.ready[slots]))
            for i in cand.tolist():
                rid = ids[i]
                one(reqs[rid], rid, nsched.get(rid, 0))
            for rid in list(self._retry):
                st = reqs.get(rid)
                if st is not None and rid in nsched:
                    one(st, rid, nsched[rid])

    def _restart(self, st, rid):
        st.restart = True
        st.pending = 0
        if st.slot >= 0:
            self.ready[st.slot] = -1
        self._retry.add(rid)

    def _schedule_one(self, st, rid, scheduled):
        """Queues st for this step's kvt_offload_schedule_many if a block of it may be newly
        confirmed (or some were left over)."""
        if not scheduled:
            return
        req = st.request
        confirmed = req.num_computed_tokens - req.num_output_placeholders
        ready = confirmed // self.sched_bs
        slot = st.slot
        if slot >= 0 and ready <= self.ready[slot] and not st.pending and not st.restart:
            return
        if slot >= 0:
            self.ready[slot] = ready
        it = st.item
        it.hashes, it.n_hashes = st.sync_hashes()
        ptrs, counts = st.ptrs, st.counts
        for g, t in enumerate(st.tables):
            ptrs[g], counts[g] = t.buffer_info()
        it.num_confirmed = confirmed
        it.num_scheduled = scheduled
        it.resumed = st.restart
        st.restart = False
        self._batch.append(st)

    def _run_batch(self):
        batch = self._batch
        if not batch:
            return
        self._batch = []
        n = len(batch)
        if n > len(self._items):
            self._items = (ctypes.c_void_p * (2 * n))()
        items = self._items
        for i, st in enumerate(batch):
            items[i] = st.item_addr
        rc = self._many_fn(self.h, items, n, None)
        if rc < 0 or self._cb_error is not None:
            self._call(rc)
        retry = self._retry
        for st in batch:
            left = st.item.left
            st.pending = left
            if left:
                retry.add(st.request.request_id)
            elif retry:
                retry.discard(st.request.request_id)

    def apply_output(self, out):
        fin = out.finished_recving
        wm = out.kv_connector_worker_meta
        data = wm.data if wm is not None else b""
        if not fin and not data:
            return
        if self._fast is not None:
            self._fast.apply_output(fin, data)
            return
        if fin:
            ids = [r.encode() for r in fin]
            arr = (L.kvt_str * len(ids))(*[L.kvt_str(b, len(b)) for b in ids])
        else:
            ids, arr = (), None
        w = None
        if data:
            rc = _lib.kvt_offload_worker_meta_decode(self._wm_ref, data, len(data))
            if rc < 0:
                raise KvtierError(rc, "worker report: " +
                                  _lib.kvt_last_error().decode(errors="replace"))
            w = self._wm_ref
        self._call(_lib.kvt_offload_apply_output(self.h, arr, len(ids), w))

    def finished(self, request, block_ids):
        ctx = self._ctx_of.get(request.request_id)
        if ctx is not None:
            self._ctx_finished.add(ctx)
        if self._fast is not None:
            self._fast.finished(request, block_ids)
            return
        st = self._drop(request.request_id)
        if st is None:
            return
        addr, n = st.sync_hashes()
        keep = self._table_args(block_ids)
        confirmed = request.num_computed_tokens - request.num_output_placeholders
        rc = self._fin_fn(self.h, st.rid, len(st.rid), self._ptrs, self._counts, addr, n,
                          max(0, confirmed))
        del keep
        if rc < 0 or self._cb_error is not None:
            self._call(rc)

    def reset(self):
        # clear, not reset: vLLM's pause with clear_cache asks once, with no step between, and
        # fails on "not yet"; abandoned transfers finish on their own (docs/vllm.md)
        rc = _lib.kvt_offload_clear(self.h)
        if rc == -7:  # KVT_EBUSY: an unfinished request holds a hit or a load: "not yet"
            return False
        self._call(rc)
        return True

    def has_pending(self):
        return bool(_lib.kvt_offload_has_pending(self.h))

    def release_engine_blocks(self):
        """Abandons every store and gives back the GPU blocks in-flight stores read now (the
        host blocks they write stay allocated until the workers report them); returns how many
        GPU blocks loads (queued or sent) still hold."""
        held = ctypes.c_uint32(0)
        self._call(_lib.kvt_offload_release_engine_blocks(self.h, ctypes.byref(held)))
        return held.value

    def guard_pool_reset(self, pool):
        """vLLM's pause with clear_cache (LLM.sleep, pause_generation(clear_cache=True),
        release_kv_cache_memory) resets the block pool before any connector hook, and the pool
        refuses while a block is referenced: the GPU blocks of stores in flight are. When the
        pool refuses, this lets go of them (their stores are abandoned: the cache is being
        cleared) and asks again."""
        inner = pool.reset_prefix_cache

        def reset_prefix_cache():
            if inner():
                return True
            if getattr(self, "h", None) is None:
                return False
            held = self.release_engine_blocks()
            self.engine_block_releases += 1
            if held:
                logger.warning("kvtier: %d GPU blocks are still held by loads: the prefix "
                               "cache cannot be reset until the workers report them", held)
            else:
                logger.info("kvtier: abandoned the stores in flight to let vLLM reset its "
                            "prefix cache")
            return inner()

        pool.reset_prefix_cache = reset_prefix_cache

    def stats(self):
        s = L.kvt_offload_stats()
        _lib.kvt_offload_stats_read(self.h, ctypes.byref(s), ctypes.sizeof(s))
        return {name: getattr(s, name) for name in L.fields(L.kvt_offload_stats)}

    def interval_stats(self):
        """Counter deltas since the last call (vLLM drains them every step); the compiled hooks
        give None when none moved."""
        if self._fast is not None:
            return self._fast.interval_stats()
        _lib.kvt_offload_stats_read(self.h, self._st_ref, ctypes.sizeof(self._st))
        st, last = self._st, self._stats_last
        out = {}
        for k in _STAT_COUNTERS:
            v = getattr(st, k)
            out[k] = v - last.get(k, 0)
            last[k] = v
        return out

    def take_events(self):
        if not self._events:
            return []
        from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
        conv = maybe_convert_block_hash
        out = []
        buf = (L.kvt_offload_event * 256)()
        dropped = L.c_u64()
        hl = self.hash_len
        while True:
            n = _lib.kvt_offload_take_events(self.h, buf, 256, ctypes.byref(dropped))
            for i in range(n):
                e = buf[i]
                if e.type == L.OFFLOAD_EV_CONTEXT_DONE:
                    self._drop_context(e.ctx)
                    self._ctx_finished.discard(e.ctx)
                    continue
                if e.type == L.OFFLOAD_EV_ALL_CLEARED:
                    out.append(AllBlocksCleared())
                    continue
                medium = "STORAGE" if e.medium == L.MEDIUM_DISK else self._medium
                h = conv(bytes(e.hash[:hl]))
                if e.type == L.OFFLOAD_EV_REMOVED:
                    out.append(BlockRemoved(block_hashes=[h], medium=medium, group_idx=e.group,
                                            locality="LOCAL"))
                elif e.type == L.OFFLOAD_EV_STORED:
                    out.append(self._stored_event(BlockStored, e, h, medium, conv))
            if n < 256:
                break
        if dropped.value:
            logger.warning("kvtier: %d host-tier cache events were dropped", dropped.value)
            for ctx in self._ctx_finished:  # their context_done may be among the lost
                self._drop_context(ctx)
            self._ctx_finished.clear()
        return out

    def _drop_context(self, ctx):
        req = self._ctx.pop(ctx, None)
        if req is not None and self._ctx_of.get(req.request_id) == ctx:
            del self._ctx_of[req.request_id]

    def _stored_event(self, BlockStored, e, h, medium, conv):
        """One BlockStored with the request's context when the store had one (eager); lazy
        stores, re-stores and disk write-backs carry none, as in vLLM's lazy mode."""
        req = self._ctx.get(e.ctx) if e.ctx else None
        kind = self._kinds[e.group]
        kw = dict(block_hashes=[h], parent_block_hash=None, token_ids=[],
                  block_size=e.num_tokens, lora_id=None, medium=medium, lora_name=None,
                  group_idx=e.group, kv_cache_spec_kind=kind,
                  kv_cache_spec_sliding_window=e.window or None, locality="LOCAL")
        if req is None:
            return BlockStored(**kw)
        start, end = e.token_start, e.token_start + e.num_tokens
        lora = getattr(req, "lora_request", None)
        kw.update(token_ids=list(req.all_token_ids[start:end]),
                  parent_block_hash=conv(bytes(e.parent_hash[:self.hash_len]))
                  if e.has_parent else None,
                  lora_id=getattr(lora, "adapter_id", None) if lora else None,
                  lora_name=getattr(lora, "name", None) if lora else None,
                  extra_keys=_event_extra_keys(req, start, end))
        if "session_id" in getattr(BlockStored, "__struct_fields__", ()):
            kw["session_id"] = getattr(req, "session_id", None)
        return BlockStored(**kw)


def _event_extra_keys(request, start, end):
    """vLLM's per-block extra keys (LoRA name, multimodal identifiers, cache salt, prompt
    embeddings) of tokens [start, end) of request, in the untagged shape events publish."""
    if generate_block_hash_extra_keys is None:
        return None
    keys, _ = generate_block_hash_extra_keys(request, start, end, 0)
    return to_event_extra_keys([keys])


# ---- worker side --------------------------------------------------------------------------

_DRAINING = weakref.WeakSet()  # worker sides whose copies a device synchronization waits for


def _drain_at_device_sync(worker_side):
    """vLLM's pause with clear_cache and its sleep call synchronize_device on every worker
    before the block pool is reset or the KV cache freed; kvtier's copies run on its own
    threads (and CUDA streams a device synchronization may not cover when not yet issued), so
    they are waited for there: no copy reads a block after the scheduler side let go of it."""
    _DRAINING.add(worker_side)
    try:
        from vllm.v1.worker.worker_base import WorkerBase
    except ImportError:  # an older vLLM: nothing to hook (docs/vllm.md)
        return
    inner = WorkerBase.synchronize_device
    if getattr(inner, "_kvtier_drain", False):
        return

    def synchronize_device(self):
        for w in list(_DRAINING):
            w.drain()
        return inner(self)

    synchronize_device._kvtier_drain = True
    WorkerBase.synchronize_device = synchronize_device


class _Worker:
    def __init__(self, vllm_config, kv_cache_config, cfg):
        self.cfg = cfg
        self.kv_cache_config = kv_cache_config
        self._engine_id = vllm_config.kv_transfer_config.engine_id
        self._vllm_config = vllm_config
        self._host_share = None
        self.remote = None
        self.host_blocks = host_blocks_for(cfg, kv_cache_config)
        self.worker = self.mirror = self.layout = self.disk = None
        self.cuda = False
        self._bound = None
        self._empty_meta = OffloadMeta()
        self.flushes = 0  # preemptions that made this rank wait for its copies
        self.drains = 0  # device synchronizations that waited for this rank's copies
        self._regions = []  # (layer, tensor, offset, base address) of every region registered
        self.asleep = False

    def register(self, kv_caches):
        cfg = self.kv_cache_config
        first = next(iter(kv_caches.values()))
        if isinstance(first, (list, tuple)):
            first = first[0]
        dev = first.device
        self.cuda = dev.type == "cuda"
        if dev.type not in ("cuda", "cpu"):
            raise ConfigError("kvtier: KV caches on %s are not supported (cpu or cuda)" % dev)
        device = dev.index if self.cuda else L.HOST_DEVICE
        layout = Layout(cfg.num_blocks, device=device)
        seen = set()
        for layer, off, bb in kv_regions(cfg):
            t = kv_caches.get(layer)
            if t is None:
                raise ConfigError("kvtier: no KV cache tensor for layer %s" % layer)
            if isinstance(t, (list, tuple)):
                t = t[0]
            storage = t.untyped_storage()
            base = storage.data_ptr() + off
            if base in seen:
                continue
            seen.add(base)
            if off + cfg.num_blocks * bb > storage.nbytes():
                raise ConfigError("kvtier: layer %s: %d blocks of %d bytes at offset %d exceed "
                                  "its storage of %d bytes" % (layer, cfg.num_blocks, bb, off,
                                                               storage.nbytes()))
            layout._buffers.append(t)
            self._regions.append((layer, t, off, base))
            rc = _lib.kvt_layout_add_region(layout._h, base, bb)
            if rc < 0:
                raise KvtierError(rc, _lib.kvt_last_error().decode(errors="replace"))
        if layout.block_bytes != block_bytes_per_rank(cfg):
            raise ConfigError("kvtier: this rank's KV cache has %d bytes per block, the "
                              "scheduler planned %d" % (layout.block_bytes,
                                                        block_bytes_per_rank(cfg)))
        self.layout = layout
        rank = 0
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            rank = torch.distributed.get_rank()
        c = self.cfg
        if c.backend == "disk":
            self.disk = Disk(layout, c.disk_path, c.disk_bytes_per_rank, rank=rank,
                             page_cache=c.page_cache, queue_depth=c.disk_queue_depth)
            self.worker = Worker(layout, disk=self.disk, rank=rank, threads=c.copy_threads)
        else:
            node = c.node_tier
            self.mirror = Mirror(layout, self.host_blocks * (c.node_ranks if node else 1),
                                 pin=self.cuda, node_name=node,
                                 node_group=c.node_group if node else None,
                                 node_dir=c.node_dir if node else None,
                                 numa_node=c.numa_node)
            self.worker = Worker(layout, self.mirror, rank=rank, threads=c.copy_threads)
            if c.remote_directory and c.world_size == 1:  # the scheduler's remote serves it
                self._host_share = _HostShare(self.mirror, self.worker)
                _HOSTS[self._engine_id] = self._host_share
            if c.backend == "cpu+disk":
                self.disk = Disk(self.mirror.layout(), c.disk_path, c.disk_bytes_per_rank,
                                 rank=rank, page_cache=c.page_cache,
                                 queue_depth=c.disk_queue_depth)
                self.worker.attach_disk(self.disk)
            if c.remote_directory and c.world_size > 1:
                self._attach_rank_remote(rank)
        logger.info("kvtier: rank %d: %d regions, %d bytes per block, %d host blocks, %s "
                    "copies", rank, layout.num_regions, layout.block_bytes, self.host_blocks,
                    "CUDA" if self.cuda else "CPU")
        _drain_at_device_sync(self)

    def _attach_rank_remote(self, rank):
        """This rank's part of the remote tier (an engine of several ranks): it serves its
        part of every block from its mirror, publishes and withdraws it as the scheduler's
        metadata says, and reads its part of the remote hits."""
        c, v = self.cfg, self._vllm_config
        gcfg = _group_specs(self.kv_cache_config, v)
        self.remote = Remote(c.remote_directory, c.remote_space, _remote_instance(c, v),
                             c.remote_listen_host, c.remote_credential, 0, mirror=self.mirror,
                             hash_len=gcfg.hash_len, hash_seed=_hash_seed(v),
                             signature=_signature(v, gcfg),
                             listen_port=c.remote_port + rank if c.remote_port else 0,
                             advertise_host=c.remote_advertise_host,
                             timeout_ms=c.remote_timeout_ms,
                             directory_password=c.remote_directory_password,
                             encrypt=c.remote_encrypt, ranks=c.world_size, rank=rank)
        # the tier after the host and its disk, as in the scheduler's chain
        self.worker.attach_remote(self.remote, 2 if self.disk is not None else 1)
        logger.info("kvtier: rank %d serves its part of the remote tier on port %d", rank,
                    self.remote.port)

    def drain(self):
        """Waits until every copy this rank submitted has finished (their reports still go out
        with the next steps): vLLM synchronizes the device before it resets its prefix cache
        or frees the KV cache (pause with clear_cache, sleep), and the scheduler side then lets
        go of the blocks the copies used."""
        if self.worker is not None:
            self.drains += 1
            self.worker.flush()

    def unregister(self):
        """vLLM >= 0.33's unregister_kv_caches, before sleep frees the KV cache's memory: every
        copy this rank submitted has finished when it returns (0.33 synchronizes the device
        itself there, not through synchronize_device, so the drain hook would miss it)."""
        self.drain()
        self.asleep = True

    def restore(self):
        """restore_kv_caches, after wake-up: the copies address the KV cache by its virtual
        addresses, which sleep mode's allocator maps again at the same place; a region that
        moved would be written where the cache no longer is, so it is refused, naming it."""
        for layer, t, off, base in self._regions:
            now = t.untyped_storage().data_ptr() + off
            if now != base:
                raise ConfigError("kvtier: layer %s's KV cache moved across sleep (0x%x, was "
                                  "0x%x); kvtier's copies address it where it was registered"
                                  % (layer, now, base))
        self.asleep = False

    def bind(self, meta):
        if self.worker is None:
            return
        m = OffloadMeta.decode(meta.data) if meta.data else self._empty_meta
        self.worker.bind(m)
        self._bound = m

    def flush(self, meta):
        if self.worker is not None and meta.need_flush:
            self.flushes += 1
            self.worker.flush()

    def get_finished(self):
        if self.worker is None or self._bound is None:
            return None
        stream = torch.cuda.current_stream().cuda_stream if self.cuda else None
        done = self.worker.get_finished(stream)
        return set(done) if done else None

    def worker_meta(self):
        if self.worker is None:
            return None
        wm = self.worker.build_meta()
        if not any(r.n_completed or r.n_failed for _, _, r in wm.reports()):
            return None
        return KvtierWorkerMetadata(wm.encode())

    def invalid_blocks(self):
        return set(self.worker.take_invalid_blocks()) if self.worker is not None else set()

    def clear(self):
        if self.worker is not None and self._bound is not None:
            self.worker.clear()
        self._bound = None

    def close(self):
        share, self._host_share = self._host_share, None
        if share is not None and _HOSTS.get(self._engine_id) is share:
            del _HOSTS[self._engine_id]
        # the rank's remote after the worker (its reads end with it), before the mirror it serves
        for o in (self.worker, self.remote, self.disk, self.mirror, self.layout):
            if o is None:
                continue
            if o is self.mirror and share is not None:
                share.release()  # the remote tier may still serve it
            else:
                o.close()
        self.worker = self.remote = self.disk = self.mirror = self.layout = None


# ---- the connector ------------------------------------------------------------------------

class KvtierConnector(KVConnectorBase_V1, SupportsHMA):
    """vLLM KV connector over kvtier (see the module documentation)."""

    @property
    def requires_kv_delivery(self) -> bool:
        return False  # a best-effort cache: a dropped store is a later miss

    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        extra = self._kv_transfer_config.kv_connector_extra_config or {}
        self.kvtier_config = KvtierConfig(extra, vllm_config.parallel_config.world_size)
        self.kvtier_config.resolve_node(vllm_config.parallel_config)
        self._sched = None
        self._worker = None
        if not vllm_config.cache_config.enable_prefix_caching:
            logger.warning("kvtier: prefix caching is disabled: the KV connector does nothing")
            return
        if kv_cache_config is None:
            raise ConfigError("kvtier: KvtierConnector needs vLLM's kv_cache_config")
        if role == KVConnectorRole.SCHEDULER:
            self._sched = _Scheduler(vllm_config, kv_cache_config, self.kvtier_config)
        else:
            self._worker = _Worker(vllm_config, kv_cache_config, self.kvtier_config)

    # -- worker side --
    def register_kv_caches(self, kv_caches):
        if self._worker is not None:
            self._worker.register(kv_caches)

    def unregister_kv_caches(self):
        """vLLM >= 0.33, before sleep: this rank's copies finish first."""
        if self._worker is not None:
            self._worker.unregister()

    def restore_kv_caches(self):
        """vLLM >= 0.33, after wake-up: the KV cache is where it was registered."""
        if self._worker is not None:
            self._worker.restore()

    def bind_connector_metadata(self, connector_metadata):
        super().bind_connector_metadata(connector_metadata)
        if self._worker is not None:
            self._worker.bind(connector_metadata)

    def clear_connector_metadata(self):
        super().clear_connector_metadata()
        if self._worker is not None:
            self._worker.clear()

    def handle_preemptions(self, kv_connector_metadata):
        if self._worker is not None:
            self._worker.flush(kv_connector_metadata)

    def start_load_kv(self, forward_context, **kwargs: Any) -> None:
        pass  # loads and stores are launched together in get_finished, after the forward

    def wait_for_layer_load(self, layer_name: str) -> None:
        pass

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs: Any) -> None:
        pass

    def wait_for_save(self):
        pass

    def get_finished(self, finished_req_ids):
        if self._worker is None:
            return None, None
        return None, self._worker.get_finished()

    def get_block_ids_with_load_errors(self):
        return self._worker.invalid_blocks() if self._worker is not None else set()

    def build_connector_worker_meta(self):
        return self._worker.worker_meta() if self._worker is not None else None

    def shutdown(self):
        if self._worker is not None:
            self._worker.close()
        if self._sched is not None:
            self._sched.close()

    # -- scheduler side --
    def bind_gpu_block_pool(self, gpu_block_pool):
        if self._sched is not None:
            self._sched.bind_gpu(gpu_block_pool)
            self._sched.guard_pool_reset(gpu_block_pool)

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        if self._sched is None:
            return 0, False
        return self._sched.match(request, num_computed_tokens)

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        if self._sched is not None:
            self._sched.after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output):
        if self._sched is None:
            return KvtierConnectorMetadata()
        return self._sched.build_meta(scheduler_output)

    def update_connector_output(self, connector_output):
        if self._sched is not None:
            self._sched.apply_output(connector_output)

    def request_finished(self, request, block_ids):
        if self._sched is not None:
            self._sched.finished(request, [block_ids])
        return False, None

    def request_finished_all_groups(self, request, block_ids):
        if self._sched is not None:
            self._sched.finished(request, block_ids)
        return False, None

    def has_pending_push_work(self):
        return self._sched is not None and self._sched.has_pending()

    def take_events(self):
        return self._sched.take_events() if self._sched is not None else []

    def reset_cache(self):
        return self._sched.reset() if self._sched is not None else None

    def get_kv_connector_stats(self):
        sched = getattr(self, "_sched", None)
        if sched is None:
            return None
        data = sched.interval_stats()
        return KvtierStats(data=data) if data else None

    @classmethod
    def build_kv_connector_stats(cls, data=None):
        return KvtierStats(data=data) if data is not None else KvtierStats()

    def kvtier_engine_block_releases(self):
        """Scheduler side: how many times vLLM's block pool refused a reset and kvtier let go
        of the GPU blocks its stores held (a pause with clear_cache mid-batch)."""
        return self._sched.engine_block_releases if self._sched is not None else 0

    def kvtier_drains(self):
        """Worker side: how many device synchronizations (vLLM's pause, sleep) waited for this
        rank's copies."""
        return self._worker.drains if self._worker is not None else 0

    def kvtier_flushes(self):
        """Worker side: how many steps made this rank wait for all its copies (preemption)."""
        return self._worker.flushes if self._worker is not None else 0

    def kvtier_stats(self):
        """Cumulative scheduler-side counters and gauges (kvt_offload_stats as a dict)."""
        return self._sched.stats() if self._sched is not None else {}

    def kvtier_remote_stats(self):
        """The remote tier's counters (kvt_remote_stats as a dict); None without a remote
        tier or on a worker."""
        return self._sched.remote_stats() if self._sched is not None else None

    def kvtier_node_stats(self):
        """The node tier's counters (kvt_node_stats as a dict); None without a node tier or
        before the replica joined it (its first scheduler call)."""
        return self._sched.node_stats() if self._sched is not None else None

    def kvtier_lazy_window(self):
        """Lazy mode: the GPU blocks the store scan looks at each step from the head of the
        free queue (kvt_offload_lazy_window; 0 in eager mode or on a worker)."""
        return _lib.kvt_offload_lazy_window(self._sched.h) if self._sched is not None else 0
