# SPDX-License-Identifier: Apache-2.0
"""kvtier: KV-cache offload for LLM inference engines (Python bindings).

Pure standard library (ctypes) over libkvtier.so: nothing to build or install beyond the C
library. Set KVTIER_LIB to the library's path if it is not found next to the package, in the
source tree's build/ or on the system's library path.

Scheduler side, one engine step (vLLM SimpleCPUOffloadConnector hooks in brackets)::

    hit = mgr.match(req_id, hashes, num_tokens, num_computed)  # get_num_new_matched_tokens
    mgr.after_alloc(req_id, block_ids, num_external)           # update_state_after_alloc
    mgr.schedule(req_id, block_ids, confirmed, scheduled)      # eager stores
    meta = mgr.build_meta(preempted)                           # build_connector_meta
    ... workers run the step ...
    mgr.apply_output(finished_loads, worker_meta)              # update_connector_output

Worker side, per rank::

    worker.bind(meta); worker.handle_preemptions()
    ... forward ...
    finished = worker.get_finished(stream)
    report = worker.build_meta(); invalid = worker.take_invalid_blocks(); worker.clear()

Every failure raises KvtierError carrying kvtier's code and message.
"""
import collections
import ctypes
import weakref

from . import _lib as L

__all__ = ["KvtierError", "version", "hash_prompt", "Pool", "OffloadManager", "OffloadEvent", "Node", "Remote",
           "OffloadMeta", "WorkerMeta", "Layout", "Mirror", "Worker", "Disk", "LinkScheduler", "LinkWorker",
           "EcShard", "EcScheduler", "EcProducer", "EcPlanner", "EcMeta", "EcWorkerMeta",
           "EcServer", "EcNetConsumer", "EcInbox",
           "ManualClock", "STORE", "LOAD", "NO_EVENT"]

STORE, LOAD, NO_EVENT = L.COPY_STORE, L.COPY_LOAD, L.NO_EVENT
_lib = L.lib


class KvtierError(Exception):
    """A kvtier call failed: .code (negative KVT_E* value), .name ("KVT_EINVAL"), .message."""

    def __init__(self, code, message):
        self.code = code
        self.name = _lib.kvt_err_name(code).decode()
        self.message = message
        super().__init__("%s: %s" % (self.name, message or _lib.kvt_strerror(code).decode()))


def _check(rc):
    if rc < 0:
        raise KvtierError(rc, _lib.kvt_last_error().decode(errors="replace"))
    return rc


def version():
    """The library's version string."""
    return _lib.kvt_version().decode()


def _u32_array(values):
    values = list(values)
    return (L.c_u32 * max(1, len(values)))(*values), len(values)


def _bytes_ptr(b):
    return ctypes.cast(ctypes.c_char_p(b), L.u8p)


def hash_prompt(seed, tokens, block_size=16):
    """Chained XXH3-128 block hashes of a prompt's full blocks (vLLM-compatible chaining),
    one 16-byte string per block."""
    toks, n = _u32_array(tokens)
    cap = n // block_size + 1
    out = (ctypes.c_uint8 * (cap * L.HASH_LEN))()
    got = L.c_u32()
    _check(_lib.kvt_hash_prompt(seed, toks, n, block_size, None, 0, out, cap, ctypes.byref(got)))
    raw = bytes(out)
    return [raw[i * L.HASH_LEN:(i + 1) * L.HASH_LEN] for i in range(got.value)]


_Handle = L.Handle
_getter = L.Handle.getter


class Pool(_Handle):
    """A block pool with prefix caching (vLLM BlockPool semantics), one full-attention group.

    Block 0 is the null block; alloc hands out the least recently used free blocks (evicting
    their cached keys); free puts blocks back in the given order (free a request's blocks tail
    first)."""
    _destroy = _lib.kvt_pool_destroy

    def __init__(self, num_blocks, block_size=16, keys_per_block=1, event_capacity=0):
        cfg = L.kvt_pool_config()
        _lib.kvt_pool_config_init(ctypes.byref(cfg))
        cfg.num_blocks = num_blocks
        cfg.hash_block_size = block_size
        cfg.groups[0].block_size = block_size
        cfg.keys_per_block = keys_per_block
        cfg.event_capacity = event_capacity
        h = ctypes.c_void_p()
        _check(_lib.kvt_pool_create(ctypes.byref(cfg), ctypes.byref(h)))
        self._h = h
        self.block_size = block_size

    num_blocks = _getter("kvt_pool_num_blocks")

    num_free = _getter("kvt_pool_num_free")

    def alloc(self, n):
        ids = (L.c_u32 * max(1, n))()
        _check(_lib.kvt_pool_alloc(self._h, n, ids))
        return list(ids[:n])

    def touch(self, ids):
        arr, n = _u32_array(ids)
        _check(_lib.kvt_pool_touch(self._h, arr, n))

    def free(self, ids):
        arr, n = _u32_array(ids)
        _check(_lib.kvt_pool_free(self._h, arr, n))

    def insert(self, block, block_hash, num_tokens=None):
        """Caches block under block_hash (it becomes findable)."""
        _check(_lib.kvt_pool_insert(self._h, block, _bytes_ptr(block_hash), 0,
                                    self.block_size if num_tokens is None else num_tokens))

    def lookup(self, block_hash):
        """A block cached under block_hash, or None."""
        out = L.c_u32()
        found = _check(_lib.kvt_pool_lookup(self._h, _bytes_ptr(block_hash), 0,
                                            ctypes.byref(out)))
        return out.value if found else None

    def find_longest_hit(self, hashes, max_tokens):
        """(tokens, block ids) of the longest cached prefix, at most max_tokens long."""
        joined = b"".join(hashes)
        cap = max(1, _lib.kvt_pool_hit_capacity(self._h, 0, len(hashes), max_tokens))
        out = (L.c_u32 * cap)()
        outs = (L.P(L.c_u32) * L.MAX_GROUPS)()
        outs[0] = out
        hit = L.kvt_hit()
        _check(_lib.kvt_pool_find_longest_hit(self._h, _bytes_ptr(joined), len(hashes),
                                              max_tokens, outs, ctypes.byref(hit)))
        return hit.length, list(out[:hit.n_blocks[0]])

    def reset_prefix_cache(self):
        """Drops every cached key (blocks in use keep their contents)."""
        _check(_lib.kvt_pool_reset_prefix_cache(self._h))

    def ref_count(self, block):
        info = L.kvt_block_info()
        _check(_lib.kvt_pool_block_info(self._h, block, ctypes.byref(info)))
        return info.ref_cnt


def _encode(kind, m):
    """Wire encoding of a message struct through kind_encoded_size / kind_encode."""
    n = getattr(_lib, kind + "_encoded_size")(ctypes.byref(m))
    buf = ctypes.create_string_buffer(n)
    got = ctypes.c_size_t()
    _check(getattr(_lib, kind + "_encode")(ctypes.byref(m), buf, n, ctypes.byref(got)))
    return buf.raw[:got.value]


def _decode(cls, kind, data):
    self = cls()
    _check(getattr(_lib, kind + "_decode")(ctypes.byref(self._m), data, len(data)))
    return self


class OffloadMeta(L.Meta):
    """Scheduler -> worker metadata of one step (kvt_offload_meta)."""

    _kind = "kvt_offload_meta"

    load_event = L.Meta.field("load_event")
    store_event = L.Meta.field("store_event")
    need_flush = L.Meta.field("need_flush", bool)

    def add_load(self, gpu_block, host_block):
        _check(_lib.kvt_offload_meta_add_load(ctypes.byref(self._m), gpu_block, host_block))

    def add_store(self, gpu_block, host_block):
        _check(_lib.kvt_offload_meta_add_store(ctypes.byref(self._m), gpu_block, host_block))

    def add_load_request(self, event, req_id):
        """Lists req_id under load event `event` (events ascending, one event's requests
        together)."""
        b = req_id.encode()
        _check(_lib.kvt_offload_meta_add_load_req(ctypes.byref(self._m), event, b, len(b)))

    @property
    def loads(self):
        """[(gpu_block, host_block)] of this step's load event."""
        m = self._m
        return [(m.load_gpu_blocks[i], m.load_cpu_blocks[i]) for i in range(m.n_loads)]

    @property
    def stores(self):
        """[(gpu_block, host_block)] of this step's store event."""
        m = self._m
        return [(m.store_gpu_blocks[i], m.store_cpu_blocks[i]) for i in range(m.n_stores)]

    @property
    def load_invalid_blocks(self):
        """GPU blocks of this step's load whose promotion from disk failed."""
        m = self._m
        return [m.load_invalid_blocks[i] for i in range(m.n_load_invalid)]

    def add_load_invalid(self, gpu_block):
        _check(_lib.kvt_offload_meta_add_load_invalid(ctypes.byref(self._m), gpu_block))

    def _tier(self, tier):
        if not 1 <= tier < L.MAX_TIERS:
            raise ValueError("kvtier: tier must be 1 .. %d (tier 0's transfers are the "
                             "load / store fields)" % (L.MAX_TIERS - 1))
        return self._m.tiers[tier - 1]

    def tier_events(self, tier):
        """(load_event, store_event) of tier `tier`'s promotions and write-backs this step."""
        x = self._tier(tier)
        return x.load_event, x.store_event

    def set_tier_events(self, tier, load_event=None, store_event=None):
        x = self._tier(tier)
        if load_event is not None:
            x.load_event = load_event
        if store_event is not None:
            x.store_event = store_event

    def add_tier_load(self, tier, src, dst):
        """A promotion: block src of tier `tier` to block dst of the tier in front of it."""
        self._tier(tier)
        _check(_lib.kvt_offload_meta_add_tier_load(ctypes.byref(self._m), tier, src, dst))

    def add_tier_store(self, tier, src, dst):
        """A write-back: block src of the tier in front of `tier` to its block dst."""
        self._tier(tier)
        _check(_lib.kvt_offload_meta_add_tier_store(ctypes.byref(self._m), tier, src, dst))

    def tier_loads(self, tier):
        """[(src, dst)] of tier `tier`'s promotion event (three tiers: tier 1, the disk)."""
        x = self._tier(tier)
        return [(x.load_src[i], x.load_dst[i]) for i in range(x.n_loads)]

    def tier_stores(self, tier):
        """[(src, dst)] of tier `tier`'s write-back event."""
        x = self._tier(tier)
        return [(x.store_src[i], x.store_dst[i]) for i in range(x.n_stores)]

    @property
    def load_event_to_reqs(self):
        """{event: [request ids]} of every outstanding load event."""
        m = self._m
        out = {}
        for i in range(m.n_load_events):
            ids = range(m.load_req_first[i], m.load_req_first[i + 1])
            out[m.load_events[i]] = [m.load_req_ids[k].ptr[:m.load_req_ids[k].len].decode()
                                     for k in ids]
        return out

    def encode(self):
        """The wire encoding (docs/wire.md)."""
        return _encode("kvt_offload_meta", self._m)

    @classmethod
    def decode(cls, data):
        """Decodes and validates an encoded message (KvtierError on anything malformed)."""
        return _decode(cls, "kvt_offload_meta", data)


_REPORTS = ("stores", "tier_stores", "tier_loads")


class WorkerMeta(L.Meta):
    """Worker -> scheduler report: {event: count} and the failed events, per kind: "stores"
    (GPU -> host), and per tier t >= 1 (three tiers: t = 1, the disk) "tier_stores"
    (write-backs into tier t) and "tier_loads" (promotions out of it)."""

    _kind = "kvt_offload_worker_meta"

    def _report(self, kind, tier=None):
        if kind not in _REPORTS:
            raise ValueError("kvtier: report kind must be one of %s" % (_REPORTS,))
        if kind == "stores":
            if tier not in (None, 0):
                raise ValueError("kvtier: \"stores\" are tier 0's")
            return self._m.stores
        if tier is None or not 1 <= tier < L.MAX_TIERS:
            raise ValueError("kvtier: %s needs a tier 1 .. %d" % (kind, L.MAX_TIERS - 1))
        return getattr(self._m, kind)[tier - 1]

    def completed_of(self, kind, tier=None):
        r = self._report(kind, tier)
        return {r.events[i]: r.counts[i] for i in range(r.n_completed)}

    def failed_of(self, kind, tier=None):
        r = self._report(kind, tier)
        return {r.failed[i] for i in range(r.n_failed)}

    @property
    def completed(self):
        return self.completed_of("stores")

    @property
    def failed(self):
        return self.failed_of("stores")

    def add(self, event, count=1, kind="stores", tier=None):
        _check(_lib.kvt_event_report_add(ctypes.byref(self._report(kind, tier)), event, count))

    def add_failed(self, event, kind="stores", tier=None):
        _check(_lib.kvt_event_report_add_failed(ctypes.byref(self._report(kind, tier)), event))

    def reports(self):
        """Every report with its kind and tier: [("stores", 0, r), ("tier_stores", 1, r), ...]."""
        out = [("stores", 0, self._m.stores)]
        for t in range(1, L.MAX_TIERS):
            out += [("tier_stores", t, self._m.tier_stores[t - 1]),
                    ("tier_loads", t, self._m.tier_loads[t - 1])]
        return out

    def aggregate(self, other):
        """self += other (counts summed, failed united), as vLLM's aggregate."""
        _check(_lib.kvt_offload_worker_meta_aggregate(ctypes.byref(self._m),
                                                      ctypes.byref(other._m)))

    def encode(self):
        return _encode("kvt_offload_worker_meta", self._m)

    @classmethod
    def decode(cls, data):
        return _decode(cls, "kvt_offload_worker_meta", data)


def _tables(block_ids):
    """One group's block table (a list) or several (a list of lists) -> ctypes arguments."""
    groups = block_ids if block_ids and isinstance(block_ids[0], (list, tuple)) else [block_ids]
    arrays = [_u32_array(g) for g in groups]
    ptrs = (L.P(L.c_u32) * len(arrays))(*[ctypes.cast(a, L.P(L.c_u32)) for a, _ in arrays])
    counts = (L.c_u32 * len(arrays))(*[n for _, n in arrays])
    return ptrs, counts, arrays


class OffloadManager(_Handle):
    """The scheduler side of KV offload (kvt_offload). gpu_pool is the engine's Pool."""
    _destroy = _lib.kvt_offload_destroy

    def __init__(self, gpu_pool, host_blocks, world_size=1, lazy=False, block_bytes=0,
                 max_requests=4096, max_batched_tokens=8192, disk_blocks=0, max_num_seqs=0,
                 event_capacity=0):
        """disk_blocks > 0: three tiers (GPU -> host -> disk), one full-attention group.
        max_num_seqs: lazy mode's per-sequence window term (the engine's max_num_seqs).
        event_capacity > 0: cache events kept between take_events calls."""
        cfg = L.kvt_offload_config()
        _lib.kvt_offload_config_init(ctypes.byref(cfg))
        cfg.host_blocks = host_blocks
        cfg.disk_blocks = disk_blocks
        cfg.world_size = world_size
        cfg.lazy = lazy
        cfg.block_bytes = block_bytes
        cfg.max_requests = max_requests
        cfg.max_batched_tokens = max_batched_tokens
        cfg.max_num_seqs = max_num_seqs
        cfg.event_capacity = event_capacity
        h = ctypes.c_void_p()
        _check(_lib.kvt_offload_create(ctypes.byref(cfg), gpu_pool._h, ctypes.byref(h)))
        self._h = h
        self._gpu = gpu_pool  # the manager uses it: keep it alive

    @staticmethod
    def size_host(capacity_bytes, block_bytes):
        """Host blocks that capacity_bytes holds (null block included)."""
        out = L.c_u32()
        _check(_lib.kvt_offload_size_host(capacity_bytes, block_bytes, ctypes.byref(out)))
        return out.value

    def lower_host_blocks(self, blocks):
        _check(_lib.kvt_offload_lower_host_blocks(self._h, blocks))

    def attach_remote(self, remote):
        """Puts the remote tier `remote` (a Remote serving this host tier's mirror) last in
        the chain: match makes what other instances hold promotions that the worker reads
        (Worker.attach_remote(remote, tier=OffloadManager.remote_tier)); completed stores are
        published."""
        _check(_lib.kvt_offload_attach_remote(self._h, remote._h))
        self._remote = remote  # borrowed: keep it alive
        remote._managers.append(weakref.ref(self))

    remote_tier = _getter("kvt_offload_remote_tier",
                          "The remote tier's index in the chain (0 without one).")

    def attach_node(self, node):
        """Makes the host tier this replica's part of node tier `node` (a Node) before the
        first step: host_blocks must be node.num_slots."""
        _check(_lib.kvt_offload_attach_node(self._h, node._h))
        self._node = node  # the manager borrows it: keep it alive
        node._managers.append(weakref.ref(self))

    def lower_disk_blocks(self, slots):
        _check(_lib.kvt_offload_lower_disk_blocks(self._h, slots))

    def add_tier(self, name, blocks):
        """Adds a tier of `blocks` blocks (null block included) named `name` behind the last
        one, before the first step; returns its index (the workers attach its disk there:
        Worker.attach_disk(disk, tier=index))."""
        idx = L.c_u32()
        _check(_lib.kvt_offload_add_tier(self._h, name.encode(), blocks, ctypes.byref(idx)))
        return idx.value

    def lower_tier_blocks(self, tier, blocks):
        """The size handshake of tier `tier` (as lower_host_blocks)."""
        _check(_lib.kvt_offload_lower_tier_blocks(self._h, tier, blocks))

    def match(self, req_id, hashes, num_tokens, num_computed, skip_prefix_cache=False):
        """Host-tier hit in tokens beyond the GPU hit (pinned until after_alloc). A GPU hit
        that ends inside a scheduler block is a miss (0); skip_prefix_cache: the request must
        not reuse cached prefixes (no lookup, 0; its blocks are still stored)."""
        rid = req_id.encode()
        joined = b"".join(hashes)
        hit = L.c_u32()
        flags = L.MATCH_SKIP_PREFIX_CACHE if skip_prefix_cache else 0
        _check(_lib.kvt_offload_match_flags(self._h, rid, len(rid), _bytes_ptr(joined),
                                            len(hashes), num_tokens, num_computed, flags,
                                            ctypes.byref(hit)))
        return hit.value

    hit_alignment = _getter("kvt_offload_hit_alignment",
                            "Tokens every host-tier hit is a multiple of: the scheduler block "
                            "size, or the hash block size where the manager offers partial hash "
                            "hits.")

    lazy_window = _getter("kvt_offload_lazy_window",
                          "Lazy mode: GPU blocks the store scan looks at each step (0 in eager "
                          "mode).")

    def after_alloc(self, req_id, block_ids, num_external):
        rid = req_id.encode()
        ptrs, counts, _keep = _tables(block_ids)
        _check(_lib.kvt_offload_after_alloc(self._h, rid, len(rid), ptrs, counts, num_external))

    def schedule(self, req_id, block_ids, num_confirmed, num_scheduled, resumed=False):
        rid = req_id.encode()
        ptrs, counts, _keep = _tables(block_ids)
        _check(_lib.kvt_offload_schedule(self._h, rid, len(rid), ptrs, counts, num_confirmed,
                                         num_scheduled, resumed))

    def build_meta(self, preempted=False):
        meta = OffloadMeta()
        _check(_lib.kvt_offload_build_meta(self._h, preempted, ctypes.byref(meta._m)))
        return meta

    def apply_output(self, finished_loads=(), worker_meta=None):
        ids = [r.encode() for r in finished_loads]
        arr = (L.kvt_str * max(1, len(ids)))(*[L.kvt_str(b, len(b)) for b in ids])
        wm = ctypes.byref(worker_meta._m) if worker_meta is not None else None
        _check(_lib.kvt_offload_apply_output(self._h, arr, len(ids), wm))

    def request_finished(self, req_id, block_ids, num_confirmed):
        rid = req_id.encode()
        ptrs, counts, _keep = _tables(block_ids)
        _check(_lib.kvt_offload_request_finished(self._h, rid, len(rid), ptrs, counts,
                                                 num_confirmed))

    def reset(self):
        """Prefix-cache reset. False means "not yet": transfers are still in flight."""
        rc = _lib.kvt_offload_reset(self._h)
        if rc == -7:  # KVT_EBUSY
            return False
        _check(rc)
        return True

    @property
    def has_pending(self):
        return bool(_lib.kvt_offload_has_pending(self._h))

    def set_request_context(self, req_id, ctx):
        """Ties a registered request to the engine's context ctx (a nonzero int): stored
        events of its blocks name it, and a "context_done" event ends it. False when the
        manager has no use for it (events off, lazy mode, request not registered)."""
        rid = req_id.encode()
        rc = _lib.kvt_offload_set_request_context(self._h, rid, len(rid), ctx)
        _check(rc)
        return rc == 1

    def take_events(self):
        """The cache events queued since the last call, oldest first, and how many were lost
        to a full buffer: (list of OffloadEvent, dropped)."""
        cfg = L.kvt_pool_config()
        _lib.kvt_pool_get_config(self._gpu._h, ctypes.byref(cfg))
        return take_offload_events(self._h, cfg.hash_len)

    def stats(self):
        """Counters and gauges as a dict (kvt_offload_stats)."""
        s = L.kvt_offload_stats()
        _lib.kvt_offload_stats_read(self._h, ctypes.byref(s), ctypes.sizeof(s))
        return {name: getattr(s, name) for name in L.fields(L.kvt_offload_stats)}

    def tier_stats(self):
        """Every tier's figures, by index (0 the host, 1 the disk): a list of dicts with the
        tier's "name" and the fields of kvt_tier_stats."""
        out = []
        for t in range(_lib.kvt_offload_num_tiers(self._h)):
            s = L.kvt_tier_stats()
            _check(_lib.kvt_offload_get_tier_stats(self._h, t, ctypes.byref(s)))
            d = {name: getattr(s, name) for name in L.fields(L.kvt_tier_stats)}
            d["name"] = s.name.decode()
            out.append(d)
        return out

    def prometheus(self):
        """The stats in Prometheus text exposition format."""
        n = ctypes.c_size_t(0)
        _lib.kvt_offload_prometheus(self._h, None, 0, ctypes.byref(n))  # sizes only
        buf = ctypes.create_string_buffer(n.value + 1)
        _check(_lib.kvt_offload_prometheus(self._h, buf, len(buf), ctypes.byref(n)))
        return buf.value.decode()


class OffloadEvent(collections.namedtuple("OffloadEvent", [
        "type", "medium", "block", "group", "num_tokens", "kind", "window", "token_start",
        "ctx", "hash", "parent_hash"])):
    """One cache event (kvt_offload_event). type: "stored", "removed", "all_cleared" or
    "context_done"; medium: "host" or "disk"; kind: a GROUP_* constant; ctx: the request's
    context or 0; token_start: the first token the key covers (with ctx); parent_hash: bytes,
    or None without a parent."""
    __slots__ = ()


_EV_TYPES = {L.OFFLOAD_EV_STORED: "stored", L.OFFLOAD_EV_REMOVED: "removed",
             L.OFFLOAD_EV_ALL_CLEARED: "all_cleared", L.OFFLOAD_EV_CONTEXT_DONE: "context_done"}
_MEDIA = {L.MEDIUM_HOST: "host", L.MEDIUM_DISK: "disk"}


def take_offload_events(handle, hash_len, batch=256):
    """Drains kvt_offload_take_events on a manager handle whose hashes are hash_len bytes:
    (list of OffloadEvent, dropped)."""
    buf = (L.kvt_offload_event * batch)()
    dropped = L.c_u64()
    out, lost = [], 0
    while True:
        n = _lib.kvt_offload_take_events(handle, buf, batch, ctypes.byref(dropped))
        lost += dropped.value
        for i in range(n):
            e = buf[i]
            out.append(OffloadEvent(
                _EV_TYPES.get(e.type, str(e.type)), _MEDIA.get(e.medium, str(e.medium)),
                e.block, e.group, e.num_tokens, e.kind, e.window, e.token_start, e.ctx,
                bytes(e.hash[:hash_len]),
                bytes(e.parent_hash[:hash_len]) if e.has_parent else None))
        if n < batch:
            return out, lost


def merge_metrics(sources):
    """One valid Prometheus exposition from several objects' texts: sources is a list of
    (text, labels) pairs, labels like 'rank="0"' or None (kvt_metrics_merge). Each family's
    HELP and TYPE appear once; raises KvtierError when two sources would write one series."""
    arr = (L.kvt_metrics_source * max(len(sources), 1))()
    keep = []
    for i, (text, labels) in enumerate(sources):
        t = text.encode() if isinstance(text, str) else bytes(text)
        lab = None if labels is None else labels.encode()
        keep.append((t, lab))
        arr[i].text, arr[i].len, arr[i].labels = t, len(t), lab
    n = ctypes.c_size_t(0)
    rc = _lib.kvt_metrics_merge(arr, len(sources), None, 0, ctypes.byref(n))  # sizes only
    if rc != L.ENOSPC:
        _check(rc)
    buf = ctypes.create_string_buffer(n.value + 1)
    _check(_lib.kvt_metrics_merge(arr, len(sources), buf, len(buf), ctypes.byref(n)))
    return buf.value.decode()


def _address(obj):
    """(address, bytes, device) of a writable buffer, numpy array or torch tensor."""
    if hasattr(obj, "data_ptr"):  # torch.Tensor
        dev = obj.device.index if obj.device.type == "cuda" else L.HOST_DEVICE
        return obj.data_ptr(), obj.element_size() * obj.numel(), dev
    if hasattr(obj, "__array_interface__"):  # numpy
        return obj.__array_interface__["data"][0], obj.nbytes, L.HOST_DEVICE
    view = memoryview(obj)
    if view.readonly:
        raise ValueError("kvtier: the buffer must be writable")
    raw = (ctypes.c_char * view.nbytes).from_buffer(obj)
    return ctypes.addressof(raw), view.nbytes, L.HOST_DEVICE


class Layout(_Handle):
    """The KV cache of one rank as regions of equally strided blocks (kvt_layout)."""
    _destroy = _lib.kvt_layout_destroy

    def __init__(self, num_blocks, device=L.HOST_DEVICE):
        h = ctypes.c_void_p()
        _check(_lib.kvt_layout_create(device, num_blocks, ctypes.byref(h)))
        self._h = h
        self._buffers = []  # keep the memory alive as long as the layout
        self.num_blocks = num_blocks

    def add_tensor(self, obj, block_dim_size, block_stride, size_bytes=0):
        """A KV tensor whose storage is obj (buffer, numpy array or torch tensor): the block
        dimension has block_dim_size entries block_stride bytes apart (spec §3.1).
        size_bytes: the tensor's configured size when the storage is padded beyond it (the
        padding never becomes a region); 0: the storage's size."""
        addr, nbytes, dev = _address(obj)
        t = L.kvt_kv_tensor(dev, addr, nbytes, block_dim_size, block_stride, size_bytes)
        _check(_lib.kvt_layout_add_tensor(self._h, ctypes.byref(t)))
        self._buffers.append(obj)

    def add_buffer(self, obj, block_bytes):
        """obj holds num_blocks blocks of block_bytes, one after the other: one region."""
        addr, nbytes, _dev = _address(obj)
        if nbytes < self.num_blocks * block_bytes:
            raise ValueError("kvtier: buffer of %d bytes holds fewer than %d blocks of %d" % (
                nbytes, self.num_blocks, block_bytes))
        _check(_lib.kvt_layout_add_region(self._h, addr, block_bytes))
        self._buffers.append(obj)

    num_regions = _getter("kvt_layout_num_regions")

    block_bytes = _getter("kvt_layout_block_bytes")


def _set_signature(cfg, signature, what):
    """cfg.signature (32 bytes) from up to 32 bytes of a digest, zero-padded."""
    if len(signature) > 32:
        raise ValueError("kvtier: a %s signature has at most 32 bytes" % what)
    for i, b in enumerate(signature):
        cfg.signature[i] = b


class _Lent(_Handle):
    """A handle lent to OffloadManagers (attach_node, attach_remote): closing it closes them
    first, as they must not outlive it."""

    def close(self):
        for ref in getattr(self, "_managers", ()):
            m = ref()
            if m is not None:
                m.close()
        self._managers = []
        super().close()


class Node(_Lent):
    """This replica's scheduler attached to a node tier (kvt_node): one host tier shared by
    the replicas on a node. Lend it to the OffloadManager (attach_node); each replica's
    worker maps the tier's data with Mirror(..., node_name=name)."""
    _destroy = _lib.kvt_node_detach

    def __init__(self, name, rank, ranks, blocks_per_rank, hash_len=16, keys_per_block=1,
                 hash_block_size=16, block_bytes=0, hash_seed=0, signature=b"",
                 reap_interval_ms=1000, group=None, dir=None):
        """group: None (only this user's processes share the tier) or the name of the group
        whose members' replicas share it (every replica, and its workers' Mirror, name it).
        dir: the directory of the tier's rendezvous (kvt_node_config.dir; None: the default;
        required with group)."""
        cfg = L.kvt_node_config()
        _lib.kvt_node_config_init(ctypes.byref(cfg))
        self._name = name.encode()
        cfg.name = self._name
        cfg.rank = rank
        cfg.ranks = ranks
        cfg.blocks_per_rank = blocks_per_rank
        cfg.hash_len = hash_len
        cfg.keys_per_block = keys_per_block
        cfg.hash_block_size = hash_block_size
        cfg.block_bytes = block_bytes
        cfg.hash_seed = hash_seed & 0xFFFFFFFFFFFFFFFF
        _set_signature(cfg, signature, "node")
        cfg.reap_interval_ms = reap_interval_ms
        self._group = group.encode() if group else None
        cfg.group = self._group
        self._dir = dir.encode() if dir else None
        cfg.dir = self._dir
        h = ctypes.c_void_p()
        _check(_lib.kvt_node_attach(ctypes.byref(cfg), ctypes.byref(h)))
        self._h = h
        self._managers = []  # managers it is lent to: destroyed before it is detached


    num_slots = _getter("kvt_node_num_slots",
                        "Slots of the tier: the manager's host_blocks and each worker's mirror "
                        "blocks.")

    def reap(self):
        """Checks the peers' liveness now; returns how many dead ones it reaped."""
        return _check(_lib.kvt_node_reap(self._h))

    def stats(self):
        st = L.kvt_node_stats()
        _check(_lib.kvt_node_get_stats(self._h, ctypes.byref(st)))
        return {n: getattr(st, n) for n, _ in L.kvt_node_stats._fields_ if n != "reserved"}

    @staticmethod
    def unlink(name, dir=None, group=None):
        """Removes the names of node tier `name` (what crashed replicas left behind); dir and
        group as the tier's replicas name them."""
        _check(_lib.kvt_node_unlink_at(name.encode(), dir.encode() if dir else None,
                                       group.encode() if group else None))


class Remote(_Lent):
    """This instance in a remote tier (kvt_remote): its blocks found by instances on other
    hosts through a Redis directory and read peer to peer over UCX, every block checked
    (docs/remote.md). region: a buffer (bytearray, numpy array, ...) of n_slots x block_bytes
    this instance serves, or None to read only; or mirror: a host Mirror whose blocks (every
    region's piece of each) it serves, block_bytes then 0 or their sum — the remote tier an
    OffloadManager over that mirror attaches (attach_remote). ranks, rank: an engine of
    tensor parallelism: this object is rank `rank` of `ranks`, serving and reading that
    rank's part of each block; rank=None makes the scheduler's lookup-only client (no region,
    listen host or credential; lookups return every rank's part of a block)."""
    _destroy = _lib.kvt_remote_destroy
    NO_RANK = 0xFFFFFFFF

    def __init__(self, directory, space, instance, listen_host, credential, block_bytes,
                 region=None, hash_len=16, hash_seed=0, signature=b"", listen_port=0,
                 advertise_host=None, ttl_ms=3000, timeout_ms=2000, directory_timeout_ms=250,
                 retry_ms=1000, owner_checksum=True, directory_password=None, mirror=None,
                 encrypt=False, ranks=1, rank=0):
        cfg = L.kvt_remote_config()
        _lib.kvt_remote_config_init(ctypes.byref(cfg))
        self._strs = [x.encode() if isinstance(x, str) else x for x in (
            directory, space, instance, listen_host, credential, advertise_host,
            directory_password)]
        (cfg.directory, cfg.space, cfg.instance, cfg.listen_host, cfg.credential,
         cfg.advertise_host, cfg.directory_password) = self._strs
        cfg.listen_port = listen_port
        cfg.block_bytes = block_bytes
        cfg.hash_len = hash_len
        cfg.hash_seed = hash_seed & 0xFFFFFFFFFFFFFFFF
        _set_signature(cfg, signature, "remote")
        cfg.ttl_ms, cfg.timeout_ms = ttl_ms, timeout_ms
        cfg.directory_timeout_ms, cfg.retry_ms = directory_timeout_ms, retry_ms
        cfg.owner_checksum = 1 if owner_checksum else 0
        cfg.encrypt = 1 if encrypt else 0
        cfg.ranks = ranks
        cfg.rank = self.NO_RANK if rank is None else rank
        self.ranks = max(ranks, 1)
        self._region = region
        if region is not None and mirror is not None:
            raise ValueError("kvtier: a Remote serves a region or a mirror, not both")
        if region is not None:
            addr, nbytes, _dev = _address(region)
            cfg.region = addr
            cfg.n_slots = nbytes // block_bytes
        if mirror is not None:
            cfg.regions = ctypes.cast(_lib.kvt_mirror_regions(mirror._h), ctypes.c_void_p)
            cfg.n_regions = _lib.kvt_mirror_num_regions(mirror._h)
            cfg.n_slots = _lib.kvt_mirror_num_blocks(mirror._h)
            block_bytes = sum(_lib.kvt_mirror_regions(mirror._h)[i].block_bytes
                              for i in range(cfg.n_regions))
            cfg.block_bytes = block_bytes
        self._mirror = mirror  # served: it must outlive this object
        self._managers = []  # managers it is lent to: closed before it is destroyed
        self.block_bytes = block_bytes
        self.hash_len = hash_len
        h = ctypes.c_void_p()
        _check(_lib.kvt_remote_create(ctypes.byref(cfg), ctypes.byref(h)))
        self._h = h


    port = _getter("kvt_remote_port")

    def _hashes(self, hashes):
        b = bytes(hashes)
        if len(b) % self.hash_len:
            raise ValueError("kvtier: hashes are %d bytes each" % self.hash_len)
        return (ctypes.c_uint8 * max(len(b), 1)).from_buffer_copy(b or b"\0"), len(b) // self.hash_len

    def publish(self, slots, hashes):
        """Slots now hold the blocks with these hashes (concatenated), their stores complete."""
        hb, n = self._hashes(hashes)
        if n != len(slots):
            raise ValueError("kvtier: %d slots but %d hashes" % (len(slots), n))
        sl = (ctypes.c_uint32 * max(n, 1))(*slots)
        _check(_lib.kvt_remote_publish(self._h, sl, hb, n))

    def withdraw(self, slots):
        """Slots are about to be reused."""
        sl = (ctypes.c_uint32 * max(len(slots), 1))(*slots)
        _check(_lib.kvt_remote_withdraw(self._h, sl, len(slots)))

    def lookup(self, hashes):
        """The longest prefix of these chained hashes held by live peers: a list of
        (peer, slot, generation), one per block found (with ranks > 1, one per part: block i's
        rank k at i * ranks + k)."""
        hb, n = self._hashes(hashes)
        locs = (L.kvt_remote_loc * max(n * self.ranks, 1))()
        hit = ctypes.c_uint32()
        _check(_lib.kvt_remote_lookup(self._h, hb, n, locs, ctypes.byref(hit)))
        return [(locs[i].peer, locs[i].slot, locs[i].generation)
                for i in range(hit.value * self.ranks)]

    def read(self, locs, hashes, dsts):
        """Reads looked-up blocks into dsts (buffers of block_bytes each); a status per block:
        0, or a negative KVT_E* code (kvtier.strerror) — a failed block is a miss."""
        hb, n = self._hashes(hashes)
        if not (n == len(locs) == len(dsts)):
            raise ValueError("kvtier: read: %d locations, %d hashes, %d destinations" % (
                len(locs), n, len(dsts)))
        lv = (L.kvt_remote_loc * max(n, 1))()
        for i, (peer, slot, gen) in enumerate(locs):
            lv[i].peer, lv[i].slot, lv[i].generation = peer, slot, gen
        pv = (ctypes.c_void_p * max(n, 1))()
        for i, d in enumerate(dsts):
            addr, nbytes, _dev = _address(d)
            if nbytes < self.block_bytes:
                raise ValueError("kvtier: destination %d holds %d bytes, a block %d" % (
                    i, nbytes, self.block_bytes))
            pv[i] = addr
        st = (ctypes.c_int * max(n, 1))()
        _lib.kvt_remote_read(self._h, lv, hb, n, pv, st)
        return [st[i] for i in range(n)]

    def peer_name(self, peer):
        name = _lib.kvt_remote_peer_name(self._h, peer)
        return name.decode() if name else None

    def stats(self):
        st = L.kvt_remote_stats()
        _lib.kvt_remote_get_stats(self._h, ctypes.byref(st))
        return {n: getattr(st, n) for n, _ in L.kvt_remote_stats._fields_ if n != "reserved"}


class Mirror(_Handle):
    """The host tier of one rank: a host array per region of the layout (kvt_mirror)."""
    _destroy = _lib.kvt_mirror_destroy

    def __init__(self, layout, host_blocks, pin=True, node_name=None, node_group=None,
                 numa_node=-1, node_dir=None):
        """node_name: the data region of that node tier (host_blocks: its num_slots);
        node_group: the node tier's sharing group (Node's group); numa_node: the NUMA node
        whose memory holds the mirror (-1: no preference)."""
        cfg = L.kvt_mirror_config()
        _lib.kvt_mirror_config_init(ctypes.byref(cfg))
        cfg.host_blocks = host_blocks
        cfg.pin = pin
        cfg.numa_node = numa_node
        self._node_name = node_name.encode() if node_name else None
        cfg.node_name = self._node_name
        self._node_group = node_group.encode() if node_group else None
        cfg.node_group = self._node_group
        self._node_dir = node_dir.encode() if node_dir else None
        cfg.node_dir = self._node_dir
        h = ctypes.c_void_p()
        _check(_lib.kvt_mirror_create(ctypes.byref(cfg), layout._h, ctypes.byref(h)))
        self._h = h
        self._layout = layout

    def layout(self):
        """A host Layout over the mirror's arrays: what a three-tier Disk is created over."""
        h = ctypes.c_void_p()
        _check(_lib.kvt_mirror_layout(self._h, ctypes.byref(h)))
        lay = Layout.__new__(Layout)
        lay._h = h
        lay._buffers = [self]  # the mirror's memory must outlive the layout
        lay.num_blocks = _lib.kvt_mirror_num_blocks(self._h)
        return lay

    def block(self, region, block):
        """A memoryview of one host block of one region (valid while the mirror lives)."""
        if region >= _lib.kvt_mirror_num_regions(self._h):
            raise IndexError("region %d" % region)
        if block >= _lib.kvt_mirror_num_blocks(self._h):
            raise IndexError("block %d" % block)
        r = _lib.kvt_mirror_regions(self._h)[region]
        return memoryview((ctypes.c_char * r.block_bytes).from_address(
            r.base + block * r.block_bytes)).cast("B")


class Worker(_Handle):
    """The worker side of one rank (kvt_worker) over a layout and its mirror."""
    _destroy = _lib.kvt_worker_destroy

    def __init__(self, layout, mirror=None, rank=0, threads=0, disk=None):
        """A worker over layout whose tier is mirror (host memory) or disk (a Disk)."""
        cfg = L.kvt_worker_config()
        _lib.kvt_worker_config_init(ctypes.byref(cfg))
        cfg.rank = rank
        cfg.copy.threads = threads
        h = ctypes.c_void_p()
        if (mirror is None) == (disk is None):
            raise ValueError("kvtier: give a Worker either a mirror or a disk")
        if disk is not None:
            _check(_lib.kvt_worker_create_disk(ctypes.byref(cfg), layout._h, disk._h,
                                               ctypes.byref(h)))
        else:
            _check(_lib.kvt_worker_create(ctypes.byref(cfg), layout._h, mirror._h,
                                          ctypes.byref(h)))
        self._h = h
        self._keep = (layout, mirror, disk)
        self._meta = None

    def attach_disk(self, disk, tier=1):
        """disk (a Disk over mirror.layout()) as tier `tier` behind this worker's mirror: 1 the
        disk of the manager's disk_blocks, 2 and 3 those of OffloadManager.add_tier."""
        _check(_lib.kvt_worker_attach_disk_tier(self._h, tier, disk._h))
        self._keep = self._keep + (disk,)

    def attach_remote(self, remote, tier):
        """remote (a Remote serving this worker's mirror) as tier `tier` (the manager's
        remote_tier): the worker reads the remote hits' blocks into the mirror, on a thread of
        its own."""
        _check(_lib.kvt_worker_attach_remote(self._h, tier, remote._h))
        self._keep = self._keep + (remote,)

    def bind(self, meta):
        """bind_connector_metadata (meta: OffloadMeta, kept until clear)."""
        _check(_lib.kvt_worker_bind(self._h, ctypes.byref(meta._m)))
        self._meta = meta

    def handle_preemptions(self):
        _check(_lib.kvt_worker_handle_preemptions(self._h))

    def get_finished(self, stream=None):
        """Launches this step's copies (after a compute point on stream, a CUstream handle as
        an int, e.g. torch.cuda.current_stream().cuda_stream) and returns the request ids
        whose loads finished."""
        reqs = L.P(L.kvt_str)()
        n = L.c_u32()
        _check(_lib.kvt_worker_get_finished(self._h, stream, ctypes.byref(reqs),
                                            ctypes.byref(n)))
        return [reqs[i].ptr[:reqs[i].len].decode() for i in range(n.value)]

    def build_meta(self):
        wm = WorkerMeta()
        _check(_lib.kvt_worker_build_meta(self._h, ctypes.byref(wm._m)))
        return wm

    def take_invalid_blocks(self):
        out = []
        buf = (L.c_u32 * 256)()
        while True:
            n = _lib.kvt_worker_take_invalid_blocks(self._h, buf, 256)
            out.extend(buf[:n])
            if n < 256:
                return out

    def clear(self):
        _lib.kvt_worker_clear(self._h)
        self._meta = None

    def flush(self):
        _check(_lib.kvt_worker_flush(self._h))

class Disk(_Handle):
    """The disk tier of one rank (kvt_disk): a private file path.rank<N> of slots. Close the
    workers that use it first."""
    _destroy = _lib.kvt_disk_destroy

    def __init__(self, layout, path, capacity_bytes, rank=0, page_cache=False, queue_depth=16,
                 alignment=4096):
        cfg = L.kvt_disk_config()
        _lib.kvt_disk_config_init(ctypes.byref(cfg))
        path_b = path.encode()
        cfg.path = path_b
        cfg.rank = rank
        cfg.capacity_bytes = capacity_bytes
        cfg.page_cache = page_cache
        cfg.queue_depth = queue_depth
        cfg.alignment = alignment
        h = ctypes.c_void_p()
        _check(_lib.kvt_disk_create(ctypes.byref(cfg), layout._h, ctypes.byref(h)))
        self._h = h
        self._layout = layout

    num_slots = _getter("kvt_disk_num_slots")

    slot_bytes = _getter("kvt_disk_slot_bytes")

    path = _getter("kvt_disk_path", text=True)

    def stats(self):
        """Per-direction counters ([write, read]) and whether a fatal error stopped the tier."""
        s = L.kvt_disk_stats()
        _lib.kvt_disk_get_stats(self._h, ctypes.byref(s))
        out = {name: list(getattr(s, name)) for name in L.fields(L.kvt_disk_stats)[:-1]}
        out["fatal"] = bool(s.fatal)
        return out


class LinkScheduler(_Handle):
    """The scheduler end of the scheduler <-> worker link over ZeroMQ (kvt_link_sched)."""
    _destroy = _lib.kvt_link_sched_destroy

    def __init__(self, endpoint, world_size):
        h = ctypes.c_void_p()
        _check(_lib.kvt_link_sched_create(endpoint.encode(), world_size, ctypes.byref(h)))
        self._h = h

    def accept(self, timeout_ms=30000):
        """Waits for every rank's hello; returns the smallest host tier any rank allocated."""
        blocks = L.c_u32()
        _check(_lib.kvt_link_sched_accept(self._h, timeout_ms, ctypes.byref(blocks)))
        return blocks.value

    def step(self, meta, payload=b"", timeout_ms=30000):
        """Sends meta (and an opaque payload) to every rank and aggregates their replies:
        (finished load request ids, WorkerMeta of the summed store reports, invalid GPU
        blocks)."""
        res = L.kvt_link_result()
        _check(_lib.kvt_link_sched_step(self._h, ctypes.byref(meta._m), payload, len(payload),
                                        timeout_ms, ctypes.byref(res)))
        finished = [res.finished_loads[i].ptr[:res.finished_loads[i].len].decode()
                    for i in range(res.n_finished)]
        stores = WorkerMeta()
        _check(_lib.kvt_offload_worker_meta_aggregate(ctypes.byref(stores._m), res.stores))
        return finished, stores, [res.invalid_blocks[i] for i in range(res.n_invalid)]

    def stop(self):
        _check(_lib.kvt_link_sched_stop(self._h))


class LinkWorker(_Handle):
    """A rank's end of the link (kvt_link_worker); says hello with its host tier size."""
    _destroy = _lib.kvt_link_worker_destroy

    def __init__(self, endpoint, rank, world_size, host_blocks):
        h = ctypes.c_void_p()
        _check(_lib.kvt_link_worker_create(endpoint.encode(), rank, world_size, host_blocks,
                                           ctypes.byref(h)))
        self._h = h

    def recv(self, timeout_ms=-1):
        """The next step as (OffloadMeta, payload bytes), or None once the scheduler stopped."""
        meta = OffloadMeta()
        payload = ctypes.c_void_p()
        n = ctypes.c_size_t()
        stop = L.c_bool()
        _check(_lib.kvt_link_worker_recv(self._h, timeout_ms, ctypes.byref(meta._m),
                                         ctypes.byref(payload), ctypes.byref(n),
                                         ctypes.byref(stop)))
        if stop.value:
            return None
        return meta, (ctypes.string_at(payload.value, n.value) if n.value else b"")

    def reply(self, finished=(), worker_meta=None, invalid=(), status=0):
        ids = [r.encode() for r in finished]
        arr = (L.kvt_str * max(1, len(ids)))(*[L.kvt_str(b, len(b)) for b in ids])
        inv, n_inv = _u32_array(invalid)
        wm = ctypes.byref(worker_meta._m) if worker_meta is not None else None
        _check(_lib.kvt_link_worker_reply(self._h, status, arr, len(ids), wm, inv, n_inv))


# the encoder-cache side (its own module; imported last, it uses this module's errors)
from .ec import (EcInbox, EcMeta, EcNetConsumer, EcPlanner, EcProducer,  # noqa: E402,F401
                 EcScheduler, EcServer, EcShard, EcWorkerMeta, ManualClock)
