# SPDX-License-Identifier: Apache-2.0
"""The connector's metadata crossing vLLM's process boundaries: scheduler to workers
(KvtierConnectorMetadata) and each worker's report back (KvtierWorkerMetadata)."""
from vllm.distributed.kv_transfer.kv_connector.v1.base import (KVConnectorMetadata,
                                                               KVConnectorWorkerMetadata)

from ...offload import WorkerMeta


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
