# SPDX-License-Identifier: Apache-2.0
"""The scheduler side's compiled hooks (kvtier._sched) against its ctypes path, under vLLM's
real v1 Scheduler, KV cache manager and BlockPool (the replay of make bench-vllm, smaller): the
same workload through both must ask the workers for the same transfers, step by step."""
import argparse
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench", "vllm"))

import bench_sched  # noqa: E402

WORKER = bench_sched.fake_worker


def _args(**kw):
    a = dict(running=24, requests=72, prompt=256, gen=40, prefixes=3, block_size=16, layers=2,
             gpu_blocks=360, cpu_blocks=2048, batched_tokens=1024, seed=7, repeat=1,
             json=False)
    a.update(kw)
    return argparse.Namespace(**a)


@pytest.fixture(scope="module")
def bench_model(tmp_path_factory):
    from tinyllama import write_model
    return write_model(str(tmp_path_factory.mktemp("m") / "m"), layers=1, hidden=64, heads=1,
                       kv_heads=1, ffn=64, vocab=2048)


def _replay(model, how, args, monkeypatch):
    """Replays the recorded workload with KVTIER_VLLM_SCHED=how; returns, per step, the GPU
    blocks the step's metadata loads and stores (sorted: the host blocks they pair with may
    come in another order), and the scheduler side."""
    monkeypatch.setenv("KVTIER_VLLM_SCHED", how)
    from kvtier import OffloadMeta
    steps = []
    real = WORKER

    def worker(meta, world, tally):
        m = OffloadMeta.decode(meta.data) if getattr(meta, "data", b"") else None
        steps.append((sorted(g for g, _ in m.loads), sorted(g for g, _ in m.stores),
                      meta.need_flush) if m else ([], [], False))
        return real(meta, world, tally)

    monkeypatch.setattr(bench_sched, "fake_worker", worker)
    sched, hasher, _ = bench_sched.build_scheduler(model, "KvtierConnector", args)
    side = sched.connector._sched
    _, _, _, tally = bench_sched.replay(sched, hasher, bench_sched.record_workload(args), args, 1)
    return steps, tally, side, sched


@pytest.mark.parametrize("gpu_blocks", [360, 120], ids=["evicting", "preempting"])
def test_compiled_and_ctypes_hooks_ask_for_the_same_transfers(bench_model, monkeypatch,
                                                              gpu_blocks):
    args = _args(gpu_blocks=gpu_blocks)
    want, want_tally, ref, _ = _replay(bench_model, "ctypes", args, monkeypatch)
    got, got_tally, side, sched = _replay(bench_model, "compiled", args, monkeypatch)
    assert not ref.compiled and side.compiled
    assert got_tally == want_tally
    assert want_tally["stored_blocks"] > 0 and want_tally["loaded_blocks"] > 0
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g == w, "step %d: compiled %r, ctypes %r" % (i, g, w)
    if gpu_blocks == 120:  # the cache is too small for the batch: requests were preempted
        assert any(flush for _, _, flush in want)
    # every request finished: the compiled side holds no record and no pinned block
    assert side._fast.requests() == 0
    assert sched.connector._sched.stats()["requests"] == 0


def test_compiled_hooks_are_what_the_package_runs(bench_model, monkeypatch):
    monkeypatch.setenv("KVTIER_VLLM_SCHED", "auto")
    sched, _, _ = bench_sched.build_scheduler(bench_model, "KvtierConnector", _args())
    assert sched.connector._sched.compiled, "kvtier._sched was not built into the package"


def test_a_pool_callback_error_surfaces_from_the_hook_that_ran_it(bench_model, monkeypatch):
    """An exception in vLLM's BlockPool, raised inside the compiled side's C callback (a
    store's pin), comes out of build_connector_meta, the hook whose manager call ran it."""
    args = _args(requests=24)
    monkeypatch.setenv("KVTIER_VLLM_SCHED", "compiled")
    sched, hasher, _ = bench_sched.build_scheduler(bench_model, "KvtierConnector", args)
    pool = sched.kv_cache_manager.block_pool
    real_touch = pool.touch
    seen = []

    def touch(blocks):
        caller = sys._getframe(1).f_code.co_name
        if caller == "build_meta":  # called from C inside _Scheduler.build_meta
            seen.append(len(blocks))
            raise RuntimeError("injected BlockPool failure")
        return real_touch(blocks)

    pool.touch = touch
    sched.connector._sched.bind_gpu(pool)  # the compiled side takes the pool's methods here
    with pytest.raises(RuntimeError, match="injected BlockPool failure"):
        bench_sched.replay(sched, hasher, bench_sched.record_workload(args), args, 1)
    assert seen and seen[0] > 0
    assert sched.connector._sched._fast.raise_kept() is None  # raised once, not kept
