# SPDX-License-Identifier: Apache-2.0
"""One engine instance in its own process (test_kv_connector's node-tier and remote-tier tests:
replicas on a node, instances on "hosts"): a vLLM engine whose KvtierConnector gets the extra
config EXTRA (JSON), generates the prompts of PROMPTS (a JSON file) and prints one JSON line:
the token ids, the connector's counters, the node tier's and the remote tier's (null where
there is none), and `kv`: for every cached GPU block, its hash and a digest of its KV bytes on
each rank (so that two instances' blocks can be compared byte for byte). KVTIER_TEST_TP in the
environment: its tensor parallelism (vLLM's multiprocess executor). With a FIFO path as HOLD it
then waits, alive (its host tier shared or served), until a line arrives on it."""
import json
import os
import sys

from conftest import close_llm, core, generate, make_llm, sched_connector


def _kv_digests(self, block_ids):
    """On each rank (vLLM's collective_rpc: self is the rank's worker): a SHA-256 of every
    layer's bytes of each block, in order."""
    import hashlib
    out = {}
    for b in block_ids:
        h = hashlib.sha256()
        for t in self.model_runner.kv_caches:
            t = t[0] if isinstance(t, (list, tuple)) else t
            h.update(t[b].contiguous().cpu().numpy().tobytes())
        out[b] = h.hexdigest()
    return out


def kv_digests(llm):
    """{block hash (hex): [digest on rank 0, rank 1, ...]} of every cached GPU block."""
    pool = core(llm).scheduler.kv_cache_manager.block_pool
    ids = {blk.block_id: bytes(blk.block_hash).hex() for blk in pool.blocks
           if blk.block_hash is not None and not blk.is_null}
    per_rank = llm.collective_rpc(_kv_digests, args=(sorted(ids),))
    return {h: [r[b] for r in per_rank] for b, h in ids.items()}


def main(model_dir, extra, prompts_path, hold=None):
    prompts = json.load(open(prompts_path))
    tp = int(os.environ.get("KVTIER_TEST_TP", "1"))  # tensor parallelism (multiprocess)
    llm = make_llm(model_dir, extra=json.loads(extra), tensor_parallel_size=tp,
                   **({"distributed_executor_backend": "mp"} if tp > 1 else {}))
    try:
        tokens = generate(llm, prompts)
        conn = sched_connector(llm)
        print(json.dumps({"tokens": tokens, "stats": conn.kvtier_stats(),
                          "node": conn.kvtier_node_stats(),
                          "remote": conn.kvtier_remote_stats(), "kv": kv_digests(llm)}),
              flush=True)
        if hold:
            with open(hold) as f:
                f.readline()
    finally:
        close_llm(llm)


if __name__ == "__main__":
    main(*sys.argv[1:])
