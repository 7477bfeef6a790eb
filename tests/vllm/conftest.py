# SPDX-License-Identifier: Apache-2.0
"""Shared setup of the vLLM tests (make test-vllm): a real vLLM engine on the CPU, in this
process (VLLM_ENABLE_V1_MULTIPROCESSING=0), so a test can reach the scheduler-side connector,
the worker-side connector and the KV cache tensors it checks byte for byte."""
import contextlib
import gc
import json
import os
import subprocess
import sys

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout: results only
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "vllm"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "common"))

import pytest  # noqa: E402

from tinyllama import write_model  # noqa: E402

BLOCK = 32  # vLLM's CPU attention backend wants block sizes in multiples of 32


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    root = os.environ.get("KVTIER_VLLM_MODEL_DIR") or str(tmp_path_factory.mktemp("model"))
    return write_model(os.path.join(root, "tinyllama-2l"))


@pytest.fixture(scope="session")
def real_model_dir():
    """SmolLM2-135M-Instruct as vLLM serves it (tools/vllm/smollm2.py; make test-vllm builds it
    first and names it in KVTIER_VLLM_REAL_MODEL; else it is built here, once, under build/)."""
    from smollm2 import write_model as write_real_model
    path = os.environ.get("KVTIER_VLLM_REAL_MODEL") or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "build", "vllm-models",
        "smollm2-135m-instruct")
    return write_real_model(path)


def make_llm(model_dir, connector=True, extra=None, kv_bytes=32 << 20, **kw):
    """A vLLM LLM engine on the CPU over the local model, with KvtierConnector unless
    connector is False (or another connector's name)."""
    from vllm import LLM
    from vllm.config import KVTransferConfig
    ktc = None
    if connector:
        name = connector if isinstance(connector, str) else "KvtierConnector"
        ktc = KVTransferConfig(
            kv_connector=name, kv_role="kv_both",
            kv_connector_module_path="kvtier.vllm" if name == "KvtierConnector" else None,
            kv_connector_extra_config=dict({"cpu_bytes_to_use": 64 << 20}, **(extra or {})))
    args = dict(model=model_dir, load_format="safetensors", skip_tokenizer_init=True,
                dtype="float32", max_model_len=4096, enable_prefix_caching=True,
                block_size=BLOCK, seed=0, enforce_eager=True, kv_cache_memory_bytes=kv_bytes,
                max_num_batched_tokens=1024, max_num_seqs=16, kv_transfer_config=ktc)
    args.update(kw)
    return LLM(**args)


def close_llm(llm):
    try:
        llm.llm_engine.engine_core.shutdown()
    finally:
        del llm
        gc.collect()


def core(llm):
    return llm.llm_engine.engine_core.engine_core


def kv_tensors(llm):
    """The rank's KV cache tensors, one per layer (first dimension: blocks)."""
    return core(llm).model_executor.driver_worker.worker.model_runner.kv_caches


def snapshot_blocks(llm):
    """{block hash: bytes of that block in every layer} of every cached GPU block."""
    pool = core(llm).scheduler.kv_cache_manager.block_pool
    tensors = kv_tensors(llm)
    out = {}
    for blk in pool.blocks:
        if blk.block_hash is not None and not blk.is_null:
            out[bytes(blk.block_hash)] = [t[blk.block_id].clone() for t in tensors]
    return out


def sched_connector(llm):
    return core(llm).scheduler.connector


def worker_connector():
    from vllm.distributed.kv_transfer import get_kv_transfer_group
    return get_kv_transfer_group()


def generate(llm, prompts, max_tokens=12):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, detokenize=False,
                        ignore_eos=True)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sp,
                        use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def reset_prefix_cache(llm):
    """Resets vLLM's GPU-side prefix cache (and kvtier's host tier with it: vLLM resets the
    connector too). Steps the engine with a one-token request until it succeeds."""
    for _ in range(50):
        if llm.reset_prefix_cache():
            return
        generate(llm, [[7, 8, 9]], max_tokens=1)
    raise AssertionError("reset_prefix_cache never succeeded")


def prompts_with_prefixes(n, length, n_prefixes, prefix_len, seed=1):
    """n prompts of `length` tokens; prompt i shares its first prefix_len tokens with every
    prompt of the same i % n_prefixes."""
    import random
    rng = random.Random(seed)
    prefixes = [[rng.randrange(3, 2000) for _ in range(prefix_len)] for _ in range(n_prefixes)]
    return [prefixes[i % n_prefixes] + [rng.randrange(3, 2000) for _ in range(length - prefix_len)]
            for i in range(n)]


INSTANCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "instance.py")


def instance_cmd(model_dir, extra, prompts_path, hold=None):
    """The command of one engine instance in its own process (instance.py)."""
    return [sys.executable, INSTANCE, model_dir, json.dumps(extra), str(prompts_path)] + (
        [str(hold)] if hold else [])


def run_instance(model_dir, extra, prompts_path, env, timeout=900):
    """Runs one engine instance to its end; returns (exit status, its JSON line or None,
    the end of its stderr)."""
    p = subprocess.run(instance_cmd(model_dir, extra, prompts_path), capture_output=True,
                       text=True, env=env, timeout=timeout)
    lines = p.stdout.strip().splitlines()
    return p.returncode, json.loads(lines[-1]) if p.returncode == 0 and lines else None, \
        p.stderr[-4000:]


@contextlib.contextmanager
def held_instance(model_dir, extra, prompts_path, hold, env):
    """An engine instance in its own process that generated its prompts and stays alive (its
    tiers shared or served) until the block ends; yields its JSON line. hold: a FIFO path."""
    if not os.path.exists(hold):
        os.mkfifo(hold)
    p = subprocess.Popen(instance_cmd(model_dir, extra, prompts_path, hold),
                         stdout=subprocess.PIPE, text=True, env=env)
    try:
        line = p.stdout.readline()
        assert line, "the held instance exited (status %s)" % p.wait()
        yield json.loads(line)
    finally:
        try:  # let it finish if it waits on the FIFO; otherwise stop it
            fd = os.open(hold, os.O_WRONLY | os.O_NONBLOCK)
            os.write(fd, b"done\n")
            os.close(fd)
            p.wait(timeout=300)
        except (OSError, subprocess.TimeoutExpired):
            p.kill()
            p.wait()
    assert p.returncode == 0, "the held instance exited with %s" % p.returncode


@pytest.fixture
def redis_sock(tmp_path):
    """A redis-server of the test's own on a unix socket in tmp_path (the remote tier's
    directory): its path, the server stopped after the test. Skipped without redis-server."""
    import shutil
    import redis_server
    if not shutil.which("redis-server"):
        pytest.skip("needs redis-server (scripts/install-deps)")
    sock = str(tmp_path / "redis.sock")
    try:  # ready once it takes a connection, not when its socket file appears
        redis = redis_server.start(sock)
    except RuntimeError as e:
        pytest.fail(str(e))
    try:
        yield sock
    finally:
        redis.kill()
        redis.wait()
