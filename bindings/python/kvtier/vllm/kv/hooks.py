# SPDX-License-Identifier: Apache-2.0
"""The scheduler's hooks, compiled (kvtier._sched) or ctypes: which one runs is chosen once, at
construction; the ctypes path's state and the pool callbacks are here."""
import ctypes
import logging
import os

from .._config import ConfigError
from ... import _lib as L

logger = logging.getLogger("kvtier.vllm")
_lib = L.lib


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


class _CtypesHooks:
    """The ctypes path of the scheduler's hooks (a mixin of _Scheduler): the state it keeps and
    the pool callbacks C makes into vLLM's BlockPool (the compiled module keeps its own)."""

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
