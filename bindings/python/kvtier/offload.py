# SPDX-License-Identifier: Apache-2.0
"""The scheduler side of KV-cache offload: the block pool (Pool), the offload manager
(OffloadManager), the messages between scheduler and workers (OffloadMeta, WorkerMeta), cache
events and the metrics merge."""
import collections
import ctypes
import weakref

from . import _lib as L
from ._core import _Handle, _Message, _check, _getter, _u32_array

_lib = L.lib


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


class OffloadMeta(_Message):
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


_REPORTS = ("stores", "tier_stores", "tier_loads")


class WorkerMeta(_Message):
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
