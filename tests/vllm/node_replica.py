# SPDX-License-Identifier: Apache-2.0
"""One replica of a node tier in its own process (test_kv_connector's node-tier tests): a vLLM
engine whose KvtierConnector joins node tier NAME as RANK of RANKS, generates the prompts of
PROMPTS (a JSON file) and prints one JSON line: the token ids, the connector's counters and the
node tier's. With a FIFO path as HOLD it then waits, alive, until a line arrives on it."""
import json
import sys

from conftest import close_llm, generate, make_llm, sched_connector


def main(model_dir, name, rank, ranks, prompts_path, hold=None):
    prompts = json.load(open(prompts_path))
    # 16 MiB per replica (256 blocks of 64 KiB): the tier lives in /dev/shm, which containers
    # often keep small
    llm = make_llm(model_dir, extra={"kvtier_node_tier": name, "kvtier_node_rank": int(rank),
                                     "kvtier_node_ranks": int(ranks),
                                     "cpu_bytes_to_use": 16 << 20})
    try:
        tokens = generate(llm, prompts)
        conn = sched_connector(llm)
        print(json.dumps({"tokens": tokens, "stats": conn.kvtier_stats(),
                          "node": conn.kvtier_node_stats()}), flush=True)
        if hold:
            with open(hold) as f:
                f.readline()
    finally:
        close_llm(llm)


if __name__ == "__main__":
    main(*sys.argv[1:])
