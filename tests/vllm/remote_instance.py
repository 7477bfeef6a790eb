# SPDX-License-Identifier: Apache-2.0
"""One engine instance of a remote tier in its own process, as on its own host
(test_kv_connector's remote-tier test): a vLLM engine whose KvtierConnector joins the remote
tier whose directory is DIRECTORY, as INSTANCE of SPACE, generates the prompts of PROMPTS (a
JSON file) and prints one JSON line: the token ids, the connector's counters and the remote
tier's. With a FIFO path as HOLD it then waits, alive (serving its blocks), until a line
arrives on it. The credential comes from KVTIER_REMOTE_CREDENTIAL."""
import json
import sys

from conftest import close_llm, generate, make_llm, sched_connector


def main(model_dir, directory, space, instance, prompts_path, hold=None):
    prompts = json.load(open(prompts_path))
    llm = make_llm(model_dir, extra={"kvtier_remote_directory": directory,
                                     "kvtier_remote_space": space,
                                     "kvtier_remote_instance": instance})
    try:
        tokens = generate(llm, prompts)
        conn = sched_connector(llm)
        print(json.dumps({"tokens": tokens, "stats": conn.kvtier_stats(),
                          "remote": conn.kvtier_remote_stats()}), flush=True)
        if hold:
            with open(hold) as f:
                f.readline()
    finally:
        close_llm(llm)


if __name__ == "__main__":
    main(*sys.argv[1:])
