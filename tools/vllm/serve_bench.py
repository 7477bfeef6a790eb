#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""make vllm-serve-bench: vLLM's OpenAI-compatible server (`vllm serve`, the real model) under
concurrent clients, without and with kvtier's connector, then killed with SIGKILL and restarted.

Each server is its own process tree (API server, engine core, worker: vLLM's multiprocess
executor, the connector's scheduler side in the engine core and its worker side in the worker),
started here on a free local port. The workload is made here, nothing is downloaded: multi-turn
chats over long documents in plain English (the demo's documents, more of them), shared between
the clients (clients start at different documents and walk all of them, so prefixes repeat
across clients and come back after the GPU-side cache evicted them). Each client is a closed loop
of streamed, greedy chat requests for --duration seconds.

Phases:
  1. without a connector: load, then the probes (the first turn of --probes documents, twice,
     one request at a time);
  2. with kvtier (host tier + disk tier): the same load and probes;
  3. the same kvtier server: load again and SIGKILL the whole server mid-run; start it again on
     the same disk path: it serves, the probes' first round finds nothing in kvtier (the killed
     server's disk file is never read: a fresh tier, nothing stale), the second round loads
     from it; answers identical to phase 1's.

Report (build/vllm-serve-report.json): per phase requests sent, completed, failed; requests/s and
output tokens/s; TTFT p50/p99 (first streamed token, measured by the client); server RSS (all
its processes) at start, sampled during the load and at the end; vLLM's own counters of
connector (external) prefix-cache queries and hits; probe answers identical across phases.
Checks (a failed one exits 1): no request failed, probe answers identical in every phase and
the answers to the turns both loads asked identical,
kvtier served hits, the restarted server served nothing from before the kill and then served
from kvtier, throughput with kvtier at least without, server RSS within 5% over the second half
of each load. tests/vllm/test_serve.py runs a short form (30 s loads) in make test-vllm, without
the throughput check (tests never time things; 30 s on a busy machine say nothing).
"""
import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from smollm2 import QUESTIONS, document, kv_bytes_per_token  # noqa: E402
from smollm2 import write_model  # noqa: E402

BLOCK = 32
RIVERS = ["Elbe", "Rhine", "Danube", "Main", "Neckar", "Mosel", "Weser", "Saale", "Inn", "Lahn",
          "Fulda", "Ems"]
TOWNS = ["Meissen", "Mainz", "Passau", "Wuerzburg", "Tuebingen", "Trier", "Hameln", "Halle",
         "Rosenheim", "Marburg", "Kassel", "Lingen"]
CRAFTS = ["porcelain", "wine", "glass", "organs", "books", "slate", "clocks", "paper", "salt",
          "bells", "linen", "cheese"]


def log(msg):
    print("vllm-serve-bench: " + msg, file=sys.stderr, flush=True)


def topic(i):
    """Document i's river, town, craft and first year."""
    return RIVERS[i % 12], TOWNS[(i * 5) % 12], CRAFTS[(i * 7) % 12], 1400 + 13 * i


def question(doc, turn):
    river, town, craft, first = topic(doc)
    q = QUESTIONS[turn % len(QUESTIONS)].format(craft=craft, town=town)
    return document(river, town, craft, first, salt=doc) + "\n\n" + q if turn == 0 else q


# ---- the server ---------------------------------------------------------------------------------

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One `vllm serve` process tree in its own session (so SIGKILL reaches every process)."""

    def __init__(self, args, label, connector, log_path):
        self.label, self.port = label, free_port()
        kv_bytes = args.gpu_blocks * BLOCK * kv_bytes_per_token(args.model)
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
               "--model", args.model, "--served-model-name", "smollm2", "--dtype", "float32",
               "--max-model-len", str(args.max_model_len), "--block-size", str(BLOCK),
               "--enable-prefix-caching", "--enforce-eager", "--seed", "0",
               "--kv-cache-memory-bytes", str(kv_bytes), "--max-num-seqs", str(args.clients),
               "--max-num-batched-tokens", "1024", "--host", "127.0.0.1",
               "--port", str(self.port)]
        if connector:
            cmd += ["--kv-transfer-config", json.dumps({
                "kv_connector": "KvtierConnector", "kv_role": "kv_both",
                "kv_connector_module_path": "kvtier.vllm",
                "kv_connector_extra_config": {
                    "cpu_bytes_to_use": args.cpu_bytes, "kv_offload_backend": "cpu+disk",
                    "disk_path": args.disk_path, "disk_capacity_bytes": args.disk_bytes}})]
        env = dict(os.environ, VLLM_LOGGING_LEVEL="WARNING", PYTHONUNBUFFERED="1")
        self.log = open(log_path, "ab")
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        self.url = "http://127.0.0.1:%d" % self.port
        self.shm_at_kill = set()

    def wait_ready(self, timeout):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError("%s: the server exited (%s) before it was ready; see its log"
                                   % (self.label, self.proc.returncode))
            try:
                with urllib.request.urlopen(self.url + "/v1/models", timeout=2) as r:
                    if r.status == 200:
                        log("%s: ready in %.0f s" % (self.label, time.monotonic() - self.t0))
                        return
            except OSError:
                pass
            time.sleep(1)
        raise RuntimeError("%s: not ready within %d s" % (self.label, timeout))

    def warm_up(self):
        """One short request outside the documents, so no phase measures the first-request
        cost (lazy initialisation in the engine)."""
        async def one():
            import aiohttp
            async with aiohttp.ClientSession() as session:
                await chat(session, self.url, [{"role": "user", "content": "Hello!"}], 4)
        asyncio.run(one())

    def rss(self):
        """Resident bytes of every process of the server."""
        import psutil
        try:
            root = psutil.Process(self.proc.pid)
            procs = [root] + root.children(recursive=True)
        except psutil.Error:
            return 0
        total = 0
        for p in procs:
            try:
                total += p.memory_info().rss
            except psutil.Error:
                pass
        return total

    def metrics(self):
        """vLLM's prefix-cache counters: {name: value} summed over labels."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as r:
            text = r.read().decode()
        out = {}
        for line in text.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            name = line.split("{")[0].split(" ")[0]
            if name.startswith(("vllm:external_prefix_cache_", "vllm:prefix_cache_")) and \
                    name.endswith("_total"):
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
        return out

    def shm_in_use(self):
        """The /dev/shm objects the server's processes have mapped or open (vLLM's message
        queues: Python's multiprocessing shared memory and semaphores)."""
        import psutil
        try:
            root = psutil.Process(self.proc.pid)
            procs = [root] + root.children(recursive=True)
        except psutil.Error:
            return set()
        out = set()
        for p in procs:
            try:
                paths = [m.path for m in p.memory_maps()] + [f.path for f in p.open_files()]
            except psutil.Error:
                continue
            out.update(os.path.basename(x) for x in paths if x.startswith("/dev/shm/"))
        return out

    def kill(self):
        """SIGKILL to every process of the server, as a crash or the OOM killer would; what it
        held in /dev/shm is noted first (shm_at_kill)."""
        self.shm_at_kill = self.shm_in_use()
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.kill()
        self.log.close()


# ---- the clients --------------------------------------------------------------------------------

async def chat(session, url, messages, max_tokens):
    """One streamed greedy chat request: (answer, ttft_s, output tokens)."""
    body = {"model": "smollm2", "messages": messages, "max_tokens": max_tokens,
            "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.monotonic()
    ttft, parts, usage = None, [], None
    async with session.post(url + "/v1/chat/completions", json=body) as r:
        if r.status != 200:
            raise RuntimeError("HTTP %d: %s" % (r.status, (await r.text())[:200]))
        async for raw in r.content:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            ev = json.loads(line[5:])
            if ev.get("usage"):
                usage = ev["usage"]
            for ch in ev.get("choices", []):
                piece = ch.get("delta", {}).get("content")
                if piece:
                    if ttft is None:
                        ttft = time.monotonic() - t0
                    parts.append(piece)
    return "".join(parts), ttft, (usage or {}).get("completion_tokens", 0)


async def client(idx, args, url, stop_at, rec, answers):
    """A closed loop: conversation after conversation, turn after turn, until stop_at."""
    import aiohttp
    timeout = aiohttp.ClientTimeout(total=args.request_timeout)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        doc = idx * args.documents // args.clients
        while time.monotonic() < stop_at and not rec["killed"]:
            messages = []
            for turn in range(args.turns):
                if time.monotonic() >= stop_at or rec["killed"]:
                    return
                messages.append({"role": "user", "content": question(doc, turn)})
                key = json.dumps(messages)
                rec["sent"] += 1
                try:
                    text, ttft, ntok = await chat(session, url, messages, args.answer_tokens)
                except Exception as e:  # noqa: BLE001 -- every failure is counted and shown
                    if rec["killed"]:
                        rec["cut_by_kill"] += 1  # in flight when the server was killed
                        return
                    rec["failed"] += 1
                    rec["errors"].append("%s: %s" % (type(e).__name__, str(e)[:200]))
                    break  # this conversation's history is lost: start the next one
                rec["completed"] += 1
                rec["output_tokens"] += ntok
                if ttft is not None:
                    rec["ttft_s"].append(ttft)
                answers[key] = text
                messages.append({"role": "assistant", "content": text})
            doc = (doc + 1) % args.documents


def load(args, server, duration, kill_after=None):
    """Runs the clients against server for duration seconds (or SIGKILLs the server after
    kill_after seconds and lets the clients see it); returns the phase's record."""
    rec = {"sent": 0, "completed": 0, "failed": 0, "output_tokens": 0, "ttft_s": [],
           "errors": [], "rss_samples": [], "killed": False, "cut_by_kill": 0}
    answers = {}

    async def sampler(stop_at):
        while time.monotonic() < stop_at and server.proc.poll() is None:
            rec["rss_samples"].append(server.rss())
            await asyncio.sleep(args.rss_interval)

    async def killer():
        await asyncio.sleep(kill_after)
        log("%s: SIGKILL to the server after %.0f s of load" % (server.label, kill_after))
        rec["killed"] = True
        server.kill()

    async def main():
        stop_at = time.monotonic() + duration
        jobs = [client(i, args, server.url, stop_at, rec, answers) for i in range(args.clients)]
        jobs.append(sampler(stop_at))
        if kill_after is not None:
            jobs.append(killer())
        await asyncio.gather(*jobs)

    t0 = time.monotonic()
    asyncio.run(main())
    wall = time.monotonic() - t0
    ttft = sorted(rec.pop("ttft_s"))
    rec.update({"wall_s": round(wall, 1), "clients": args.clients,
                "requests_per_s": round(rec["completed"] / wall, 3),
                "output_tokens_per_s": round(rec["output_tokens"] / wall, 2),
                "ttft_p50_ms": pct(ttft, 50), "ttft_p99_ms": pct(ttft, 99)})
    rec["errors"] = rec["errors"][:5]
    return rec, answers


def probes(args, server):
    """The first turn of --probes documents, one request at a time, twice: the second round
    finds the first documents evicted from the GPU-side cache. Returns answers and the
    external (connector) prefix-cache hit tokens of each round."""
    rounds = []

    async def one_round():
        import aiohttp
        async with aiohttp.ClientSession() as session:
            out = []
            for d in range(args.probes):
                msgs = [{"role": "user", "content": question(d, 0)}]
                out.append((await chat(session, server.url, msgs, args.answer_tokens))[0])
            return out

    for _ in range(2):
        before = server.metrics().get("vllm:external_prefix_cache_hits_total", 0.0)
        answers = asyncio.run(one_round())
        hits = server.metrics().get("vllm:external_prefix_cache_hits_total", 0.0) - before
        rounds.append({"answers": answers, "external_hit_tokens": int(hits)})
    return rounds


def pct(v, q):
    if not v:
        return None
    if len(v) == 1:
        return round(v[0] * 1000, 1)
    return round(statistics.quantiles(v, n=100, method="inclusive")[q - 1] * 1000, 1)


def rss_summary(start, rec, end):
    s = rec.pop("rss_samples")
    half = s[len(s) // 2] if s else end
    return {"rss_mb_start": round(start / 2**20), "rss_mb_mid_load": round(half / 2**20),
            "rss_mb_end": round(end / 2**20), "rss_mb_max": round(max(s + [end]) / 2**20),
            "rss_growth_second_half_pct": round(100.0 * (end - half) / half, 1) if half else None}


def serve_phase(args, label, connector, logs, crash=False):
    """A server's phase: load, probes; with crash, then a load cut by SIGKILL and a restart
    (crash_restart), its record under "crash_restart"."""
    shm_before = set(os.listdir("/dev/shm"))
    srv = Server(args, label, connector, logs)
    try:
        srv.wait_ready(args.start_timeout)
        srv.warm_up()
        start = srv.rss()
        log("%s: %d clients for %d s" % (label, args.clients, args.duration))
        rec, answers = load(args, srv, args.duration)
        for k in ("killed", "cut_by_kill"):
            rec.pop(k)
        end = srv.rss()
        rec.update(rss_summary(start, rec, end))
        rec["counters"] = srv.metrics()
        rec["probes"] = probes(args, srv)
        log("%s: %d/%d completed, %d failed, %.2f req/s, TTFT p50 %s ms p99 %s ms"
            % (label, rec["completed"], rec["sent"], rec["failed"], rec["requests_per_s"],
               rec["ttft_p50_ms"], rec["ttft_p99_ms"]))
        if crash:
            rec["crash_restart"] = crash_restart(args, logs, srv, shm_before)
        return rec, answers
    finally:
        srv.stop()


def crash_restart(args, logs, srv, shm_before):
    """Load on srv, SIGKILL mid-run, restart on the same disk path, probes."""
    disk = args.disk_path + ".rank0"
    rec, _ = load(args, srv, args.duration, kill_after=args.kill_after)
    for k in ("rss_samples", "killed"):
        rec.pop(k)
    stale = os.stat(disk) if os.path.exists(disk) else None
    # what the killed processes left in /dev/shm: vLLM's message queues (Python's
    # multiprocessing shared memory, psm_*, and its semaphores); removed here, as an operator's
    # restart script would have to. Only what the killed server held: another process on the
    # host (another server, a test beside this one) has objects of the same names
    left = sorted(n for n in (set(os.listdir("/dev/shm")) - shm_before) & srv.shm_at_kill
                  if n.startswith(("psm_", "sem.mp-")))
    for n in left:
        os.unlink(os.path.join("/dev/shm", n))
    out = {"load_until_kill": rec, "disk_file_left_by_the_killed_server": stale is not None,
           "shm_left_by_the_killed_server": left}
    again = Server(args, "with kvtier (restarted)", True, logs)
    try:
        again.wait_ready(args.start_timeout)
        now = os.stat(disk)
        out["disk_file_replaced"] = stale is None or (now.st_ino, now.st_ctime_ns) != \
            (stale.st_ino, stale.st_ctime_ns)
        out["probes"] = probes(args, again)
        out["rss_mb_after_restart"] = round(again.rss() / 2**20)
    finally:
        again.stop()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="the real model's directory (built when "
                    "missing: tools/vllm/smollm2.py)")
    ap.add_argument("--out", default="build/vllm-serve-report.json")
    ap.add_argument("--clients", type=int, default=6)
    ap.add_argument("--duration", type=int, default=120, help="seconds of load per phase")
    ap.add_argument("--kill-after", type=int, default=20,
                    help="seconds into the third phase's load at which the server is killed")
    ap.add_argument("--documents", type=int, default=12)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--answer-tokens", type=int, default=24)
    ap.add_argument("--probes", type=int, default=8,
                    help="documents whose first turn is probed (more than the GPU cache holds)")
    ap.add_argument("--gpu-blocks", type=int, default=96,
                    help="vLLM's KV cache in blocks of 32 tokens (default 96: 3,072 tokens)")
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--cpu-bytes", type=int, default=512 << 20)
    ap.add_argument("--disk-bytes", type=int, default=2 << 30)
    ap.add_argument("--disk-path", default=None,
                    help="the disk tier's path prefix (default: beside --out)")
    ap.add_argument("--request-timeout", type=int, default=300)
    ap.add_argument("--start-timeout", type=int, default=300)
    ap.add_argument("--rss-interval", type=float, default=5.0)
    ap.add_argument("--no-check-throughput", dest="check_throughput", action="store_false",
                    help="report the throughput, do not check it (a test: tests never time)")
    args = ap.parse_args()
    for k in ("clients", "duration", "documents", "turns", "answer_tokens", "probes",
              "gpu_blocks"):
        if getattr(args, k) < 1:
            ap.error("--%s must be positive" % k.replace("_", "-"))
    if not 0 < args.kill_after < args.duration:
        ap.error("--kill-after must be inside the load (0 < it < --duration)")
    out_dir = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(out_dir, exist_ok=True)
    args.disk_path = args.disk_path or os.path.join(out_dir, "vllm-serve-disk")
    write_model(args.model)
    logs = os.path.join(out_dir, "vllm-serve.log")
    open(logs, "w").close()
    log("server logs: %s" % logs)
    import vllm
    t0 = time.monotonic()
    base, base_answers = serve_phase(args, "without a connector", False, logs)
    kvt, kvt_answers = serve_phase(args, "with kvtier", True, logs, crash=True)
    crash = kvt.pop("crash_restart")
    common = sorted(set(base_answers) & set(kvt_answers))
    same = sum(base_answers[k] == kvt_answers[k] for k in common)
    ref = base["probes"][0]["answers"]
    checks = {
        "no_request_lost_without": base["failed"] == 0 and base["completed"] > 0,
        "no_request_lost_with_kvtier": kvt["failed"] == 0 and kvt["completed"] > 0,
        "probes_identical": all(r["answers"] == ref for r in base["probes"] + kvt["probes"] +
                                crash["probes"]),
        "kvtier_served_hits": kvt["counters"].get("vllm:external_prefix_cache_hits_total", 0) > 0
        and kvt["probes"][1]["external_hit_tokens"] > 0,
        "restart_serves_nothing_stale": crash["probes"][0]["external_hit_tokens"] == 0
        and crash["disk_file_replaced"],
        "restart_serves_from_kvtier": crash["probes"][1]["external_hit_tokens"] > 0,
        "load_answers_identical": same == len(common),
        "kvtier_throughput_at_least_without": not args.check_throughput
        or kvt["requests_per_s"] >= base["requests_per_s"],
        "rss_flat": all(r["rss_growth_second_half_pct"] is not None and
                        r["rss_growth_second_half_pct"] < 5 for r in (base, kvt)),
    }
    rep = {"vllm_version": vllm.__version__, "model": "SmolLM2-135M-Instruct (float32)",
           "cpu": cpu_name(), "cores": os.cpu_count(), "gpu_blocks": args.gpu_blocks,
           "documents": args.documents, "turns": args.turns, "answer_tokens": args.answer_tokens,
           "without": base, "kvtier": kvt, "crash_restart": crash,
           "load_answers_compared": len(common), "load_answers_identical": same,
           "throughput_ratio": round(kvt["requests_per_s"] / base["requests_per_s"], 2)
           if base["requests_per_s"] else None,
           "ttft_p50_ratio": round(base["ttft_p50_ms"] / kvt["ttft_p50_ms"], 2)
           if kvt["ttft_p50_ms"] else None,
           "checks": checks, "wall_s": round(time.monotonic() - t0)}
    with open(args.out, "w") as f:
        json.dump(rep, f, indent=1)
    log("report: %s" % args.out)
    summary = {k: rep[k] for k in ("throughput_ratio", "ttft_p50_ratio", "load_answers_compared",
                                   "load_answers_identical", "checks")}
    print(json.dumps(summary, indent=1))
    if not all(checks.values()):
        log("FAILED: %s" % ", ".join(k for k, v in checks.items() if not v))
        return 1
    return 0


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


if __name__ == "__main__":
    sys.exit(main())
