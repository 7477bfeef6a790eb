# SPDX-License-Identifier: Apache-2.0
"""The connectors against the vLLM releases users run, including those with no CPU build to
run them on (tests/vllm/api-wheels.txt: their wheels read in place, nothing imported): every
vLLM name the connectors import exists, every hook they override has vLLM's parameters, no
abstract hook is missing, and every hook they leave to vLLM's default was looked at (REVIEWED:
a hook a release adds fails this test until someone decides)."""
import importlib.util
import os

import pytest

import vllm_api

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
WHEELS = os.environ.get("KVTIER_VLLM_API_WHEELS",
                        os.path.join(ROOT, ".venv-vllm", "api-wheels"))

# The base-class hooks the connectors leave to vLLM's default, and why that default is right.
REVIEWED = {
    "KvtierConnector": {
        "bind_kv_cache_manager": "kvtier binds vLLM's BlockPool itself (bind_gpu_block_pool)",
        "build_prom_metrics": "kvtier's metrics go through KVConnectorStats and /metrics",
        "finish_forward": "nothing to do at the end of a forward: copies run on their own",
        "get_external_cache_hit_sources": "no per-source accounting",
        "get_finished_count": "every rank reports its own loads (the default: world size)",
        "get_handshake_metadata": "no P/D handshake (yet)",
        "get_kv_connector_kv_cache_events": "events go through take_events",
        "get_loaded_kv_cache_group_ids": "loads cover every group a hit names",
        "get_mem_pool_context": "the KV cache in vLLM's own pool",
        "get_required_kvcache_layout": "any layout: the worker reads the tensors' strides",
        "get_transfer_results": "no P/D transfers (yet)",
        "has_connector_metadata": "the base's bookkeeping",
        "has_pending_block_frees": "blocks are freed as vLLM frees them",
        "kv_cache_access": "IN_PROCESS (0.34): copies from this process, nothing registered "
                           "with an RDMA engine",
        "may_load_async": "0.34: only P/D requests use the in-flight load slots; a host hit "
                          "loads while the batch runs anyway",
        "on_new_request": "requests are noted at their first match",
        "register_finished_partial_tail": "the partial tail is recomputed (no P/D yet)",
        "requires_piecewise_for_cudagraph": "no per-layer hooks in the graph",
        "reset_capture_state": "no capture state",
        "role": "the base's",
        "set_host_xfer_buffer_ops": "kvtier's own host mirror",
        "set_xfer_handshake_metadata": "no P/D handshake (yet)",
        "set_xfer_handshake_metadata_pp_aware": "no P/D handshake (yet)",
        "supports_divergent_local_hybrid_hits": "hybrid hits are aligned across groups",
        "supports_lookahead_block_hashes": "0.34: lookahead hashes not used (False)",
        "supports_sleep_mode": "0.33: yes (the default): copies address the KV cache by "
                               "virtual address, which sleep maps again in place; "
                               "unregister_kv_caches drains, restore_kv_caches checks",
    },
    "KvtierECConnector": {
        "bind_connector_metadata": "the base keeps the metadata",
        "build_ec_connector_stats": "no EC stats object",
        "build_prom_metrics": "metrics through kvtier_stats",
        "clear_connector_metadata": "the base's",
        "get_ec_connector_stats": "no EC stats object",
        "is_consumer": "the base's", "is_producer": "the base's",
        "register_caches": "the receive buffer is kvtier's own",
        "role": "the base's",
    },
    "KvtierStats": {"to_dict": "the base's"},
}


def wheels():
    out = []
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "api-wheels.txt")) as f:
        for line in f:
            line = line.split("#")[0].strip()
            if line:
                out.append(line.split("==")[1])
    return out


def check(src):
    problems, optional_missing, defaults = vllm_api.check(src)
    assert problems == [], "\n".join(problems)
    unreviewed = ["%s.%s" % (c, n) for c, names in defaults.items() for n in names
                  if n not in REVIEWED.get(c, {})]
    assert unreviewed == [], ("vLLM %s has hooks the connectors leave to its defaults that "
                              "nobody reviewed: %s" % (src.version(), ", ".join(unreviewed)))
    return optional_missing


def test_the_installed_vllm():
    spec = importlib.util.find_spec("vllm")
    src = vllm_api.Source(os.path.dirname(spec.submodule_search_locations[0]))
    assert check(src) == []


@pytest.mark.parametrize("version", wheels())
def test_a_release_without_a_cpu_build(version):
    names = [f for f in (os.listdir(WHEELS) if os.path.isdir(WHEELS) else [])
             if f.startswith("vllm-%s-" % version) and f.endswith(".whl")]
    assert names, ("no vllm %s wheel in %s: make vllm-env fetches it (pip download --no-deps)"
                   % (version, WHEELS))
    src = vllm_api.Source(os.path.join(WHEELS, names[0]))
    assert src.version() == version
    check(src)


def test_the_check_finds_a_changed_hook_a_missing_name_and_an_abstract_hook(tmp_path):
    """The check can fail: a vLLM whose base hook changed its parameters, that lacks a module
    and a name the connectors import, and that added an abstract hook."""
    spec = importlib.util.find_spec("vllm")
    real = vllm_api.Source(os.path.dirname(spec.submodule_search_locations[0]))
    base = "vllm/distributed/kv_transfer/kv_connector/v1/base.py"
    text = real._read(base)
    assert "def get_num_new_matched_tokens(" in text
    text = text.replace("def get_num_new_matched_tokens(", "def get_num_new_matched_tokens_(")
    text = text.replace("    def build_connector_meta(", "    @abstractmethod\n"
                        "    def must_be_defined(self, x):\n        pass\n\n"
                        "    def get_num_new_matched_tokens(self, request):\n        pass\n\n"
                        "    def build_connector_meta(", 1)
    fake = tmp_path / "fake"
    for rel in (base, "vllm/distributed/kv_transfer/kv_connector/v1/metrics.py",
                "vllm/v1/kv_cache_interface.py", "vllm/distributed/kv_events.py"):
        os.makedirs(fake / os.path.dirname(rel), exist_ok=True)
        (fake / rel).write_text(text if rel == base else real._read(rel))
    problems, _, _ = vllm_api.check(vllm_api.Source(str(fake)))
    joined = "\n".join(problems)
    assert "KvtierConnector.get_num_new_matched_tokens requires 2 arguments, vLLM's base 1" \
        in joined, joined
    assert "does not define must_be_defined" in joined, joined
    assert "vllm.distributed.ec_transfer.ec_connector.base is not in vLLM" in joined, joined
