# SPDX-License-Identifier: Apache-2.0
"""One engine instance in its own process (test_kv_connector's node-tier and remote-tier tests:
replicas on a node, instances on "hosts"): a vLLM engine whose KvtierConnector gets the extra
config EXTRA (JSON), generates the prompts of PROMPTS (a JSON file) and prints one JSON line:
the token ids, the connector's counters, the node tier's and the remote tier's (null where
there is none). KVTIER_TEST_TP in the environment: its tensor parallelism (vLLM's
multiprocess executor). With a FIFO path as HOLD it then waits, alive (its host tier shared or served),
until a line arrives on it."""
import json
import os
import sys

from conftest import close_llm, generate, make_llm, sched_connector


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
                          "remote": conn.kvtier_remote_stats()}), flush=True)
        if hold:
            with open(hold) as f:
                f.readline()
    finally:
        close_llm(llm)


if __name__ == "__main__":
    main(*sys.argv[1:])
