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
import logging
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (KVConnectorBase_V1,
                                                               KVConnectorRole, SupportsHMA)

from .._config import ConfigError, KvtierConfig
from .metadata import KvtierConnectorMetadata
from .scheduler import _Scheduler
from .stats import KvtierStats
from .worker import _Worker
from ... import _lib as L

logger = logging.getLogger("kvtier.vllm")
_lib = L.lib


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
