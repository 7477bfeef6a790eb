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

The package's face only: the classes live in offload (the scheduler side), worker (the worker
side and the link between them), tiers (node, remote, disk), ec and ec_net (the encoder cache) and
_core (the error type, handles and codecs), over the ctypes declarations of _lib.
"""
from ._core import KvtierError, version
from .offload import (OffloadEvent, OffloadManager, OffloadMeta, Pool, WorkerMeta, hash_prompt,
                      merge_metrics, take_offload_events)
from .tiers import Disk, Node, Remote
from .worker import Layout, LinkScheduler, LinkWorker, Mirror, Worker
from .ec import EcMeta, EcPlanner, EcProducer, EcScheduler, EcShard, EcWorkerMeta, ManualClock
from .ec_net import EcInbox, EcNetConsumer, EcServer
from . import _lib as L

__all__ = ["KvtierError", "version", "hash_prompt", "Pool", "OffloadManager", "OffloadEvent",
           "Node", "Remote", "OffloadMeta", "WorkerMeta", "Layout", "Mirror", "Worker", "Disk",
           "LinkScheduler", "LinkWorker", "EcShard", "EcScheduler", "EcProducer", "EcPlanner",
           "EcMeta", "EcWorkerMeta", "EcServer", "EcNetConsumer", "EcInbox", "ManualClock",
           "STORE", "LOAD", "NO_EVENT"]

STORE, LOAD, NO_EVENT = L.COPY_STORE, L.COPY_LOAD, L.NO_EVENT
