# SPDX-License-Identifier: Apache-2.0
"""kvtier's vLLM connectors (needs vLLM; the rest of the kvtier package does not).

- ``KvtierConnector``: KV-cache offload to a host tier (and disk), the semantics of vLLM's
  SimpleCPUOffloadConnector, over kvtier's C offload manager and workers::

      LLM(..., kv_transfer_config={"kv_connector": "KvtierConnector",
                                   "kv_connector_module_path": "kvtier.vllm",
                                   "kv_role": "kv_both",
                                   "kv_connector_extra_config": {"cpu_bytes_to_use": 8 << 30}})

- ``KvtierECConnector``: encoder-cache transfer between an encoder instance and prefill
  instances, the semantics of vLLM's ECMooncakeConnector, over kvtier's encoder-cache
  scheduler, shards and producer (ZeroMQ control plane, UCX data plane).

Settings, errors and limits: docs/vllm.md.
"""
from ._config import ConfigError, KvtierConfig
from ._ec import (KvtierECConfig, KvtierECConnector, KvtierECConnectorMetadata,
                  KvtierECWorkerMetadata)
from .kv import (KvtierConnector, KvtierConnectorMetadata, KvtierStats, KvtierWorkerMetadata,
                  block_bytes_per_rank, kv_regions)

__all__ = ["KvtierConnector", "KvtierConnectorMetadata", "KvtierWorkerMetadata", "KvtierStats",
           "KvtierConfig", "ConfigError", "kv_regions", "block_bytes_per_rank",
           "KvtierECConnector", "KvtierECConnectorMetadata", "KvtierECWorkerMetadata",
           "KvtierECConfig"]
