# SPDX-License-Identifier: Apache-2.0
"""The scheduler side of KvtierConnector: per request and step one C call into kvtier's offload
manager, which works on vLLM's own GPU BlockPool in place."""
import array
import ctypes
import logging

from ..._core import KvtierError
from ...offload import OffloadManager, OffloadMeta, WorkerMeta
from .events import _EventSource
from .hooks import _CtypesHooks, _sched_extension
from .metadata import KvtierConnectorMetadata
from .placement import _group_specs, _tokens_per_step, block_bytes_per_rank, host_blocks_for
from .stats import _STAT_COUNTERS
from .tiers import _TierAttach
from ... import _lib as L

logger = logging.getLogger("kvtier.vllm")
_lib = L.lib


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


class _Scheduler(_CtypesHooks, _TierAttach, _EventSource):
    """The scheduler side: kvtier's offload manager over vLLM's BlockPool, one C call per
    request and step (the hooks in kvtier._sched, or the ctypes path of hooks.py); the tiers it
    attaches are in tiers.py, its cache events in events.py."""

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
