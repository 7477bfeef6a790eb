# SPDX-License-Identifier: Apache-2.0
"""vLLM's KV cache events (BlockStored, BlockRemoved, AllBlocksCleared) from kvtier's."""
import ctypes
import logging

try:  # what cache events are built with; older vLLM: bytes hashes, no extra keys
    from vllm.v1.core.kv_cache_utils import (generate_block_hash_extra_keys,
                                             maybe_convert_block_hash, to_event_extra_keys)
except ImportError:  # pragma: no cover - older vLLM
    generate_block_hash_extra_keys = to_event_extra_keys = None

    def maybe_convert_block_hash(h):
        return h

from ... import _lib as L

logger = logging.getLogger("kvtier.vllm")
_lib = L.lib


class _EventSource:
    """vLLM's KV cache events from kvtier's (a mixin of _Scheduler)."""

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
