# SPDX-License-Identifier: Apache-2.0
"""bench/gpu/worker_kv.py (the worker side on KV tensors as vLLM allocates them, run on a GPU by
bench/gpu/run.sh) on the CPU: the script itself works where no GPU is lent (stores, loads,
every byte compared, the forced load error reported), and its byte check fails when a loaded
byte is flipped (--inject corrupt)."""
import json
import os
import subprocess
import sys

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "gpu",
                      "worker_kv.py")


def run(tmp_path, *extra):
    out = tmp_path / "worker_kv.json"
    p = subprocess.run([sys.executable, SCRIPT, "--device", "cpu", "--layers", "2", "--blocks",
                        "64", "--reps", "2", "--out", str(out)] + list(extra),
                       capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, KVT_DISK_DIR=str(tmp_path)))
    return p, (json.loads(out.read_text()) if out.exists() else None)


def test_the_gpu_script_passes_on_the_cpu(tmp_path):
    p, r = run(tmp_path)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert r["ok"] and all(r["checks"].values()), r
    assert r["forced_load_error_invalid_blocks"] == 16
    assert r["store_gbps"] > 0 and r["contiguous_load_gbps"] > 0


def test_its_byte_check_can_fail(tmp_path):
    p, r = run(tmp_path, "--inject", "corrupt")
    assert p.returncode == 1, p.stdout[-3000:] + p.stderr[-3000:]
    assert r["checks"]["round_0_bytes_equal"] is False
    assert r["checks"]["round_1_bytes_equal"] is True
