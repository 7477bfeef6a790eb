# SPDX-License-Identifier: Apache-2.0
"""KvtierConnector, laid out as vLLM's own kv_connector/v1/offloading/: the connector (vLLM's
hooks, delegating to one side), metadata (what crosses vLLM's process boundaries), scheduler
(the scheduler side, with its hooks, tiers and events mixins), worker (the worker side),
placement (what vLLM chose that kvtier follows) and stats."""
try:  # vLLM is not a dependency of the kvtier package: only this subpackage needs it
    import torch  # noqa: F401
    import vllm  # noqa: F401
except ImportError as e:  # pragma: no cover - exercised only without vLLM
    raise ImportError("kvtier.vllm needs vLLM (pip install vllm); kvtier itself does not: %s"
                      % e) from e

from .connector import KvtierConnector
from .metadata import KvtierConnectorMetadata, KvtierWorkerMetadata
from .placement import block_bytes_per_rank, kv_regions
from .stats import KvtierStats

__all__ = ["KvtierConnector", "KvtierConnectorMetadata", "KvtierWorkerMetadata", "KvtierStats",
           "block_bytes_per_rank", "kv_regions"]
