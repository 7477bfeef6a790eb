#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""make bench-vllm: the scheduler-side cost of a KV offload connector inside vLLM, per engine
step: kvtier's KvtierConnector against vLLM's own SimpleCPUOffloadConnector.

Both run under vLLM's real v1 Scheduler (and its KV cache manager and BlockPool), which needs no
GPU: the benchmark drives the scheduler the way EngineCore does (schedule, then the model's
output, then update_from_output), with a model stand-in that samples a fixed token per request
and position, and a worker stand-in that completes every load and store the step's connector
metadata asks for, reported to the scheduler one step later. The workload is recorded once —
which requests arrive at which step, with which prompt tokens and which sampled tokens — and
replayed identically for both connectors: same arrivals, same prompts, same outputs. Only the
time spent inside the connector's scheduler-side methods is counted (every call vLLM makes to
it: get_num_new_matched_tokens, update_state_after_alloc, build_connector_meta,
update_connector_output, request_finished, has_pending_push_work, ...).

The workload: R requests running at once (default 256, as kvtier bench sched), prompts of
P tokens from a few shared system prompts, each generating G tokens; every finished request is
replaced by a new one, and a second wave repeats the first wave's prompts after the GPU cache
evicted them, so both connectors load from their host tier as well as store.

Output: one JSON object (--json) with per-step connector time (mean, p50, p90) for both, their
ratio, the steps replayed, and the blocks each connector stored and loaded (they must agree:
the same decisions, or the comparison would be unfair); which of kvtier's scheduler-side hooks
ran (kvtier_hooks: the compiled module kvtier._sched or the ctypes path, --hooks); and the C
manager's own p50 per step from `kvtier bench sched` at the same request count, measured in the
same run, with the connector's ratio to it (connector_vs_c_p50).
"""
import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time

os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout: results only
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "tools", "vllm"))


def build_scheduler(model_dir, connector, args):
    import torch
    from vllm.config import KVTransferConfig
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import (get_kv_cache_configs, get_request_block_hasher,
                                             init_none_hash, resolve_kv_cache_block_sizes)
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec
    from vllm.v1.structured_output import StructuredOutputManager
    specs = {"model.layers.%d.self_attn.attn" % i:
             FullAttentionSpec(block_size=args.block_size, num_kv_heads=8, head_size=128,
                               dtype=torch.bfloat16) for i in range(args.layers)}
    page = next(iter(specs.values())).page_size_bytes
    extra = {"cpu_bytes_to_use": args.cpu_blocks * page * args.layers}
    if connector == "KvtierConnector":
        extra["kvtier_restore_budget"] = 0  # vLLM has no re-stores: same work on both sides
    ktc = KVTransferConfig(kv_connector=connector, kv_role="kv_both",
                           kv_connector_module_path="kvtier.vllm"
                           if connector == "KvtierConnector" else None,
                           kv_connector_extra_config=extra)
    ea = EngineArgs(model=model_dir, load_format="dummy", skip_tokenizer_init=True,
                    dtype="float32", block_size=args.block_size, enable_prefix_caching=True,
                    max_model_len=args.prompt + args.gen + args.block_size,
                    max_num_seqs=args.running, max_num_batched_tokens=args.batched_tokens,
                    kv_transfer_config=ktc, enforce_eager=True)
    vc = ea.create_engine_config()
    vc.cache_config.kv_cache_layout = "LBHNC"  # what the engine core resolves on its own
    kvc = get_kv_cache_configs(vc, [specs], [args.gpu_blocks * page * args.layers])[0]
    vc.cache_config.num_gpu_blocks = kvc.num_blocks
    sbs, hbs = resolve_kv_cache_block_sizes(kvc, vc)
    sched = Scheduler(vllm_config=vc, kv_cache_config=kvc,
                      structured_output_manager=StructuredOutputManager(vc), block_size=sbs,
                      hash_block_size=hbs, log_stats=False)
    fn = get_hash_fn_by_name(vc.cache_config.prefix_caching_hash_algo)
    init_none_hash(fn)
    return sched, get_request_block_hasher(hbs, fn), kvc


class Timed:
    """Wraps every public method of the connector instance to add up its time."""

    def __init__(self, conn):
        self.t = 0.0
        self.calls = {}
        side = getattr(conn, "_sched", None)  # kvtier's: which hooks ran
        self.hooks = None if side is None or not hasattr(side, "compiled") else (
            "compiled" if side.compiled else "ctypes")
        for name in dir(type(conn)):
            if name.startswith("_") or name in ("role",):
                continue
            attr = getattr(type(conn), name, None)
            if not callable(attr) or isinstance(attr, (classmethod, staticmethod)):
                continue
            setattr(conn, name, self._wrap(name, getattr(conn, name)))

    def _wrap(self, name, f):
        clock = time.perf_counter

        def w(*a, **k):
            t0 = clock()
            try:
                return f(*a, **k)
            finally:
                dt = clock() - t0
                self.t += dt
                c = self.calls.setdefault(name, [0, 0.0])
                c[0] += 1
                c[1] += dt
        return w


def fake_worker(meta, world_size, tally):
    """What the workers report one step later: every load and store of meta completed. tally
    counts the blocks each connector asked to load and store."""
    from vllm.v1.outputs import KVConnectorOutput
    done_loads, wm = set(), None
    if type(meta).__name__ == "KvtierConnectorMetadata":
        from kvtier import OffloadMeta, WorkerMeta
        from kvtier.vllm import KvtierWorkerMetadata
        if meta.data:
            m = OffloadMeta.decode(meta.data)
            tally["loaded_blocks"] += len(m.loads)
            tally["stored_blocks"] += len(m.stores)
            if m.load_event >= 0:
                done_loads |= set(m.load_event_to_reqs.get(m.load_event, []))
            if m.store_event >= 0:
                w = WorkerMeta()
                w.add(m.store_event, world_size)
                wm = KvtierWorkerMetadata(w.encode())
    else:
        from vllm.v1.simple_kv_offload.metadata import SimpleCPUOffloadWorkerMetadata
        tally["loaded_blocks"] += len(meta.load_gpu_blocks)
        tally["stored_blocks"] += len(meta.store_gpu_blocks)
        if meta.load_event >= 0:
            done_loads |= set(meta.load_event_to_reqs.get(meta.load_event, []))
        if meta.store_event >= 0:
            wm = SimpleCPUOffloadWorkerMetadata(
                completed_store_events={meta.store_event: world_size})
    return KVConnectorOutput(finished_recving=done_loads or None, kv_connector_worker_meta=wm)


def record_workload(args):
    """The recorded sequence: per request, its arrival wave and prompt; sampled tokens are a
    fixed function of (request, position)."""
    rng = random.Random(args.seed)
    systems = [[rng.randrange(3, 2000) for _ in range(args.prompt // 2)]
               for _ in range(args.prefixes)]
    wave = [systems[i % args.prefixes] +
            [rng.randrange(3, 2000) for _ in range(args.prompt - args.prompt // 2)]
            for i in range(args.requests)]
    return wave + wave  # the second wave repeats the first after it was evicted


def replay(sched, hasher, prompts, args, world):
    from vllm.sampling_params import SamplingParams
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request
    conn = sched.connector
    timer = Timed(conn)
    sp = SamplingParams(max_tokens=args.gen, temperature=0.0, ignore_eos=True)
    pending = list(enumerate(prompts))
    pending.reverse()
    out_kv = None
    tally = {"loaded_blocks": 0, "stored_blocks": 0}
    per_step, running_at = [], []
    finished = 0
    steps = 0
    while finished < len(prompts):
        # keep `running` requests in the system; the second wave starts after the first
        while pending and len(sched.requests) < args.running and \
                (pending[-1][0] < args.requests or finished >= args.requests):
            i, p = pending.pop()
            sched.add_request(Request("req-%d" % i, list(p), sp, None, block_hasher=hasher))
        t_before = timer.t
        so = sched.schedule()
        n_running = len(so.num_scheduled_tokens)
        ids = list(so.num_scheduled_tokens)
        sampled = []
        for rid in ids:
            r = sched.requests[rid]
            done = r.num_computed_tokens + so.num_scheduled_tokens[rid] >= r.num_prompt_tokens
            sampled.append([(hash((rid, r.num_tokens)) % 1997) + 3] if done else [])
        mro = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: k for k, r in enumerate(ids)},
                                sampled_token_ids=sampled, kv_connector_output=out_kv)
        outs = sched.update_from_output(so, mro)
        out_kv = fake_worker(so.kv_connector_metadata, world, tally)
        for eco in outs.values():
            finished += sum(o.finish_reason is not None for o in eco.outputs)
        per_step.append(timer.t - t_before)
        running_at.append(n_running)
        steps += 1
        if steps > 200000:
            raise RuntimeError("the replay does not finish")
    # drain the connector's last completions
    for _ in range(4):
        so = sched.schedule()
        sched.update_from_output(so, ModelRunnerOutput(req_ids=[], req_id_to_index={},
                                                       kv_connector_output=out_kv))
        out_kv = fake_worker(so.kv_connector_metadata, world, tally)
    return per_step, running_at, timer, tally


def c_manager_p50(running, seconds):
    """kvtier bench sched's eager p50 per step at `running` requests (the C manager alone, on
    its own workload), measured now: (microseconds, None), or (None, why not)."""
    import subprocess
    cli = os.environ.get("KVTIER_CLI") or os.path.join(os.path.dirname(os.path.abspath(
        __file__)), "..", "..", "build", "bin", "kvtier")
    if not os.path.exists(cli):
        return None, "no kvtier CLI at %s (make build)" % cli
    out = subprocess.run([cli, "bench", "sched", "--json", "--seconds", str(seconds)],
                         capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        return None, "kvtier bench sched failed: %s" % out.stderr.strip()[-300:]
    by = json.loads(out.stdout).get("step_us_p50_by_requests", {})
    if str(running) not in by:
        return None, "kvtier bench sched measures %s requests, not %d" % (
            "/".join(sorted(by, key=int)), running)
    return by[str(running)], None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--running", type=int, default=256, help="requests running at once")
    ap.add_argument("--requests", type=int, default=1024, help="requests per wave (2 waves)")
    ap.add_argument("--prompt", type=int, default=1024, help="prompt tokens")
    ap.add_argument("--gen", type=int, default=64, help="generated tokens per request")
    ap.add_argument("--prefixes", type=int, default=8, help="shared system prompts")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--gpu-blocks", type=int, default=20480,
                    help="GPU blocks: room for the running requests, not for a whole wave")
    ap.add_argument("--cpu-blocks", type=int, default=65536)
    ap.add_argument("--batched-tokens", type=int, default=8192)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3,
                    help="replays per connector, alternating; the fastest is reported")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--hooks", choices=("auto", "compiled", "ctypes"), default="auto",
                    help="kvtier's scheduler-side hooks (KVTIER_VLLM_SCHED): the compiled "
                         "module or the ctypes path")
    ap.add_argument("--c-seconds", type=float, default=1.0,
                    help="time budget of each phase of kvtier bench sched (the C figure)")
    args = ap.parse_args()
    os.environ["KVTIER_VLLM_SCHED"] = args.hooks
    for k in ("running", "requests", "prompt", "gen", "prefixes", "gpu_blocks", "cpu_blocks",
              "repeat"):
        if getattr(args, k) < 1:
            ap.error("--%s must be positive" % k.replace("_", "-"))
    import vllm
    from tinyllama import write_model
    tmp = tempfile.mkdtemp(prefix="kvtier-bench-")
    model_dir = write_model(os.path.join(tmp, "m"), layers=1, hidden=64, heads=1, kv_heads=1,
                            ffn=64, vocab=2048)
    prompts = record_workload(args)
    res = {"bench": "vllm_sched", "vllm_version": vllm.__version__, "repeat": args.repeat,
           "running": args.running,
           "requests": 2 * args.requests, "prompt_tokens": args.prompt, "gen_tokens": args.gen}
    best = {}
    for rep in range(args.repeat):  # alternating, so both see the same noise; best run kept
        for name, key in (("KvtierConnector", "kvtier"), ("SimpleCPUOffloadConnector", "vllm")):
            sched, hasher, _ = build_scheduler(model_dir, name, args)
            t0 = time.perf_counter()
            per_step, running, timer, tally = replay(sched, hasher, prompts, args, 1)
            wall = time.perf_counter() - t0
            if key not in best or timer.t < best[key][2].t:
                best[key] = (per_step, running, timer, wall, tally)
    for name, key in (("KvtierConnector", "kvtier"), ("SimpleCPUOffloadConnector", "vllm")):
        per_step, running, timer, wall, cnt = best[key]
        full = [t for t, n in zip(per_step, running) if n >= args.running * 0.9]
        res[key] = {
            "steps": len(per_step), "steps_at_full_batch": len(full),
            "step_us_mean": 1e6 * statistics.fmean(per_step),
            "step_us_p50": 1e6 * statistics.median(full or per_step),
            "step_us_p90": 1e6 * statistics.quantiles(full or per_step, n=10)[-1],
            "connector_s": timer.t, "replay_s": wall,
            "calls": {k: {"n": v[0], "us_per_call": 1e6 * v[1] / v[0]}
                      for k, v in sorted(timer.calls.items()) if v[0]},
            **cnt}
        print("bench-vllm: %s: %d steps, connector %.1f us per step (p50 at full batch %.1f)"
              % (name, len(per_step), res[key]["step_us_mean"], res[key]["step_us_p50"]),
              file=sys.stderr)
    res["ratio_p50"] = res["vllm"]["step_us_p50"] / res["kvtier"]["step_us_p50"]
    res["ratio_mean"] = res["vllm"]["step_us_mean"] / res["kvtier"]["step_us_mean"]
    # the connector against the C manager it drives: kvtier bench sched at the same request
    # count (its own workload: every running request scheduled every step)
    c_p50, why = c_manager_p50(args.running, args.c_seconds)
    res["c_step_us_p50"] = c_p50
    res["connector_vs_c_p50"] = res["kvtier"]["step_us_p50"] / c_p50 if c_p50 else None
    if why:
        res["c_step_us_p50_skipped"] = why
        print("bench-vllm: the C figure is skipped: %s" % why, file=sys.stderr)
    res["kvtier_hooks"] = best["kvtier"][2].hooks
    res["same_steps"] = res["vllm"]["steps"] == res["kvtier"]["steps"]
    res["same_transfers"] = all(res["vllm"][k] == res["kvtier"][k]
                                for k in ("loaded_blocks", "stored_blocks"))
    print(json.dumps(res, indent=1 if not args.json else None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
