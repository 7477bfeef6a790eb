# SPDX-License-Identifier: Apache-2.0
"""vLLM's OpenAI-compatible server with kvtier, as an operator runs it: its own processes (API
server, engine core with the connector's scheduler side, a worker process with its worker
side), concurrent streaming clients, then SIGKILL and a restart on the same disk path. The short
form of make vllm-serve-bench (tools/vllm/serve_bench.py, which holds the checks): 4 clients on
6 documents for 30 s, a GPU cache of 40 blocks (1,280 tokens: under two conversations, so turns
find their prefix evicted within the short load), 4 probed documents."""
import json
import os
import subprocess
import sys

TOOL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "vllm",
                    "serve_bench.py")


def test_a_server_under_load_then_killed_and_restarted(real_model_dir, tmp_path):
    out = tmp_path / "vllm-serve-report.json"
    env = dict(os.environ)
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the server runs its own processes
    r = subprocess.run([sys.executable, TOOL, "--model", real_model_dir, "--out", str(out),
                        "--clients", "4", "--documents", "6", "--duration", "30",
                        "--kill-after", "8", "--probes", "4", "--gpu-blocks", "40",
                        "--max-model-len", "1024",
                        "--no-check-throughput"],  # a test never times: the bench does
                       env=env, capture_output=True, text=True, timeout=1200)
    log = (tmp_path / "vllm-serve.log").read_text(errors="replace")[-4000:] \
        if (tmp_path / "vllm-serve.log").exists() else ""
    assert r.returncode == 0, "%s\n--- server log (end) ---\n%s" % (r.stderr[-4000:], log)
    rep = json.loads(out.read_text())
    assert all(rep["checks"].values()), rep["checks"]
    for phase in ("without", "kvtier"):
        assert rep[phase]["completed"] > 0 and rep[phase]["failed"] == 0, rep[phase]
    assert rep["kvtier"]["counters"]["vllm:external_prefix_cache_hits_total"] > 0
    assert rep["crash_restart"]["probes"][0]["external_hit_tokens"] == 0
    print("vllm serve: %.2f -> %.2f requests/s, TTFT p50 %s -> %s ms, %d answers compared"
          % (rep["without"]["requests_per_s"], rep["kvtier"]["requests_per_s"],
             rep["without"]["ttft_p50_ms"], rep["kvtier"]["ttft_p50_ms"],
             rep["load_answers_compared"]))
