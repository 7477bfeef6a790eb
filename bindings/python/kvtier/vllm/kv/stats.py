# SPDX-License-Identifier: Apache-2.0
"""The scheduler side's counters as vLLM's KVConnectorStats."""
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats


_STAT_COUNTERS = ("lookups", "hit_tokens", "miss_tokens", "load_blocks", "loads_completed",
                  "store_blocks", "stores_completed", "stores_failed", "host_evictions",
                  "restores", "bytes_loaded", "bytes_stored")


class KvtierStats(KVConnectorStats):
    """Scheduler-side counters drained once per step (vLLM logs their sums per interval)."""

    def reset(self):
        self.data = {}

    def aggregate(self, other):
        for k, v in (other.data or {}).items():
            self.data[k] = self.data.get(k, 0) + v
        return self

    def reduce(self):
        return dict(self.data)

    def is_empty(self):
        return not any(self.data.values())
