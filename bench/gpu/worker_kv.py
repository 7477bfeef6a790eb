# SPDX-License-Identifier: Apache-2.0
"""The worker side on KV tensors as vLLM allocates them (torch, one (2, blocks, block_size,
heads, head_dim) tensor per layer: K and V regions), on CUDA (`--device cuda`, the point: it
had never run on CUDA KV tensors) or on the CPU (`--device cpu`, how this script itself is
tested on machines without a GPU):

  1. stores half the blocks to the host tier (a pinned kvt_mirror) through kvt_worker, as the
     vLLM connector does (OffloadMeta -> bind -> get_finished on the current stream -> flush);
  2. loads them back into the other half of the device blocks, and checks every byte of every
     region (torch.equal against the blocks stored);
  3. measures both directions in GB/s against the same bytes copied as one contiguous tensor
     (device <-> pinned host, torch's copy_), in the same run: the ratio is the figure;
  4. forces a load error: the blocks stored to a disk tier (kvt_disk) whose file is then cut
     short; the load must report those blocks invalid (vLLM's get_block_ids_with_load_errors:
     they are recomputed) and still finish the request, never hang or return stale bytes.

Prints one JSON object (and writes it to --out). Exits 1 when a check fails (--inject corrupt
shows the byte check failing).

    python bench/gpu/worker_kv.py --device cuda --out OUTDIR/worker_kv.json
"""
import argparse
import glob
import importlib.util
import json
import os
import sys
import tempfile
import time

# kvtier as installed (pip install ., as make vllm-env does); where it is not installed, the
# source tree's package, with the library of build/ or KVTIER_LIB (bench/gpu/run.sh puts the
# source tree first on PYTHONPATH and names its own build)
if importlib.util.find_spec("kvtier") is None:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                    "bindings", "python"))
import torch  # noqa: E402

import kvtier  # noqa: E402

DEADLINE_S = 120


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def stream_of(dev):
    return torch.cuda.current_stream(dev).cuda_stream if dev.type == "cuda" else None


def kv_tensors(a, dev):
    """vLLM's layout: per layer one tensor (2, blocks, block_size, heads, head_dim)."""
    gen = torch.Generator(device="cpu").manual_seed(a.seed)
    out = []
    for _ in range(a.layers):
        t = torch.empty((2, a.blocks, a.block_size, a.heads, a.head_dim), dtype=torch.float16,
                        device=dev)
        raw = torch.randint(0, 256, (t.numel() * 2,), dtype=torch.uint8, generator=gen)
        t.view(torch.uint8).view(-1).copy_(raw.to(dev))
        out.append(t)
    return out


def layout_of(tensors, a, dev):
    lay = kvtier.Layout(a.blocks, device=dev.index if dev.type == "cuda" else kvtier.L.HOST_DEVICE)
    block_bytes = a.block_size * a.heads * a.head_dim * 2
    for t in tensors:
        lay.add_buffer(t[0], block_bytes)  # K
        lay.add_buffer(t[1], block_bytes)  # V
    return lay, block_bytes


def run_step(worker, meta, dev, want_req=None, seen=None):
    """bind, launch after the compute point, flush; returns (seconds, finished request ids,
    the worker's report). seen: {event: count} and {"failed": set} gathered across steps (a
    store's completion may be reported with the next step, as in vLLM)."""
    worker.bind(meta)
    sync(dev)
    t0 = time.perf_counter()
    done = set(worker.get_finished(stream_of(dev)))
    worker.flush()
    sync(dev)
    secs = time.perf_counter() - t0
    end = time.monotonic() + DEADLINE_S
    while want_req is not None and want_req not in done:
        if time.monotonic() > end:
            raise SystemExit("worker_kv: request %s never finished" % want_req)
        done |= set(worker.get_finished(stream_of(dev)))
    wm = worker.build_meta()
    worker.clear()
    if seen is not None:
        for e, c in wm.completed.items():
            seen[e] = seen.get(e, 0) + c
        seen.setdefault("failed", set()).update(wm.failed)
    return secs, done, wm


def settle(worker, dev, seen):
    """Empty steps until the reports of every event launched came back."""
    end = time.monotonic() + DEADLINE_S
    while time.monotonic() < end:
        before = dict(seen)
        run_step(worker, kvtier.OffloadMeta(), dev, seen=seen)
        if seen == before:
            return


def blocks_of(tensors, ids, dev):
    idx = torch.tensor(ids, device=dev)
    return [t.index_select(1, idx).clone() for t in tensors]


def contiguous_gbps(nbytes, dev, reps=3):
    """The baseline: the same bytes as one tensor, device -> pinned host and back."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=dev.type == "cuda")
    best = [0.0, 0.0]
    for _ in range(reps):
        for d, (dst, s) in enumerate(((host, src), (src, host))):
            sync(dev)
            t0 = time.perf_counter()
            dst.copy_(s, non_blocking=True)
            sync(dev)
            best[d] = max(best[d], nbytes / (time.perf_counter() - t0) / 1e9)
    return best  # [store direction, load direction]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--blocks", type=int, default=1024)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3, help="timed store/load rounds")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", help="also write the JSON here")
    ap.add_argument("--inject", choices=("corrupt",),
                    help="corrupt: flip one loaded byte before the check (it must fail)")
    a = ap.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("worker_kv: --device cuda, but torch sees no GPU (torch %s)"
                         % torch.__version__)
    dev = torch.device("cuda:0" if a.device == "cuda" else "cpu")
    report = {"device": torch.cuda.get_device_name(0) if a.device == "cuda" else "cpu",
              "torch": torch.__version__, "kvtier": kvtier.version(), "checks": {}}
    tensors = kv_tensors(a, dev)
    lay, bb = layout_of(tensors, a, dev)
    half = (a.blocks - 1) // 2  # block 0 is vLLM's null block: never moved
    src_ids, dst_ids = list(range(1, half + 1)), list(range(half + 1, 2 * half + 1))
    moved = half * bb * 2 * a.layers
    mirror = kvtier.Mirror(lay, a.blocks, pin=a.device == "cuda")
    worker = kvtier.Worker(lay, mirror)
    expected = blocks_of(tensors, src_ids, dev)
    store_s, load_s, ok, seen, stores = [], [], True, {}, []
    event = 0
    for rep in range(a.reps):
        event += 1
        m = kvtier.OffloadMeta()
        m.store_event = event
        for i, b in enumerate(src_ids):
            m.add_store(b, 1 + i)  # host block 0 is null too
        secs, _, _ = run_step(worker, m, dev, seen=seen)
        stores.append(event)
        store_s.append(secs)
        for t in tensors:  # the destinations hold something else before every load
            t[:, half + 1:2 * half + 1].zero_()
        event += 1
        m = kvtier.OffloadMeta()
        m.load_event = event
        for i, b in enumerate(dst_ids):
            m.add_load(b, 1 + i)
        req = "load-%d" % rep
        m.add_load_request(event, req)
        secs, done, _ = run_step(worker, m, dev, want_req=req, seen=seen)
        load_s.append(secs)
        if a.inject == "corrupt" and rep == 0:
            tensors[0][1, dst_ids[-1]].view(torch.uint8).view(-1)[5] ^= 0x40
        got = blocks_of(tensors, dst_ids, dev)
        same = all(torch.equal(x.view(torch.uint8), y.view(torch.uint8))
                   for x, y in zip(got, expected))
        ok &= same and not worker.take_invalid_blocks()
        report["checks"]["round_%d_bytes_equal" % rep] = bool(same)
    settle(worker, dev, seen)
    ok &= all(seen.get(e) == 1 for e in stores) and not seen.get("failed")
    worker.close()
    mirror.close()
    base = contiguous_gbps(moved, dev)
    report["bytes_per_direction"] = moved
    report["store_gbps"] = moved / min(store_s) / 1e9
    report["load_gbps"] = moved / min(load_s) / 1e9
    report["contiguous_store_gbps"], report["contiguous_load_gbps"] = base
    report["store_ratio"] = report["store_gbps"] / base[0]
    report["load_ratio"] = report["load_gbps"] / base[1]
    report["checks"]["stores_completed_loads_verified"] = bool(ok)

    # a forced load error: the disk tier's file cut short after the store
    with tempfile.TemporaryDirectory(dir=os.environ.get("KVT_DISK_DIR", ".")) as d:
        n = min(16, half)
        disk = kvtier.Disk(lay, os.path.join(d, "kv"), (n + 1) * bb * 2 * a.layers * 2,
                           page_cache=True)
        dw = kvtier.Worker(lay, disk=disk)
        m = kvtier.OffloadMeta()
        m.store_event = 1
        for i in range(n):
            m.add_store(1 + i, 1 + i)
        dseen = {}
        run_step(dw, m, dev, seen=dseen)
        settle(dw, dev, dseen)
        stored = dseen.get(1) == 1 and not dseen["failed"]
        for f in glob.glob(os.path.join(d, "kv*")):
            os.truncate(f, 0)
        m = kvtier.OffloadMeta()
        m.load_event = 2
        for i in range(n):
            m.add_load(half + 1 + i, 1 + i)
        m.add_load_request(2, "broken")
        _, done, _ = run_step(dw, m, dev, want_req="broken")
        invalid = sorted(dw.take_invalid_blocks())
        dw.close()
        disk.close()
    err_ok = stored and "broken" in done and invalid == [half + 1 + i for i in range(n)]
    report["checks"]["forced_load_error_reported"] = bool(err_ok)
    report["forced_load_error_invalid_blocks"] = len(invalid)
    lay.close()
    report["ok"] = all(report["checks"].values())
    text = json.dumps(report, indent=1, sort_keys=True)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
