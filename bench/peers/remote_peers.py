# SPDX-License-Identifier: Apache-2.0
"""The peer of `kvtier bench remote`: Mooncake's store (mooncake-transfer-engine's
MooncakeDistributedStore, the KV store behind LMCache's and vLLM's Mooncake connectors) doing
what the remote tier does — one instance holds blocks, another reads them — through its own
documented Python API.

    python remote_peers.py --blocks N --block-bytes B [--seconds S]
                           [--owner-prefix "ip netns exec NS" --host-ip H --peer-ip P]

The script starts Mooncake's master (with its HTTP metadata server, so no etcd is needed) in
this network namespace, an owner process (under --owner-prefix: in the owner's namespace, as
kvtier's owner runs) that mounts a segment and puts N blocks of B bytes, and reads them here
with batch_get_into into a registered buffer, the reader mounting no segment of its own (so
every byte crosses the link, never a local copy), repeatedly for S seconds after a first read
whose bytes are checked. Prints one JSON object on stdout: {"mooncake_store": {"ran": true,
"version", "gbps", "reads", "link"}} or {"mooncake_store": {"ran": false, "why"}}. Everything
else goes to stderr. It runs in the environment `make bench-env` makes (.venv-bench).
"""
import argparse
import json
import os
import shlex
import socket
import subprocess
import sys
import time


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def free_port(host):
    s = socket.socket()
    s.bind((host, 0))
    p = s.getsockname()[1]
    s.close()
    return p


def pattern(i, n):
    import numpy as np
    return ((np.arange(n, dtype=np.uint64) * 2654435761 + i * 40503) >> 7).astype(np.uint8)


def store(host, meta, master, segment, local):
    from mooncake.store import MooncakeDistributedStore
    s = MooncakeDistributedStore()
    rc = s.setup(host, meta, segment, local, "tcp", "", master)
    if rc != 0:
        raise RuntimeError("MooncakeDistributedStore.setup returned %d" % rc)
    return s


def owner(a):
    """Puts the blocks, says so on stdout, serves until stdin closes."""
    import numpy as np
    s = store(a.peer_ip, a.meta, a.master, 2 * a.blocks * a.block_bytes + (64 << 20),
              a.block_bytes * a.blocks + (16 << 20))
    buf = np.concatenate([pattern(i, a.block_bytes) for i in range(a.blocks)])
    s.register_buffer(buf.ctypes.data, buf.nbytes)
    keys = ["kvt-bench-%d" % i for i in range(a.blocks)]
    rc = s.batch_put_from(keys, [buf.ctypes.data + i * a.block_bytes for i in range(a.blocks)],
                          [a.block_bytes] * a.blocks)
    if any(r != 0 for r in rc):
        raise RuntimeError("batch_put_from: %s" % rc)
    print("ready", flush=True)
    sys.stdin.read()
    s.close()


def reader(a):
    import numpy as np
    from importlib.metadata import version
    ver = version("mooncake-transfer-engine-non-cuda")
    host = a.host_ip or "127.0.0.1"
    hp, rp = free_port(host), free_port(host)
    meta, master = "http://%s:%d/metadata" % (host, hp), "%s:%d" % (host, rp)
    bindir = os.path.dirname(sys.executable)
    m = subprocess.Popen([os.path.join(bindir, "mooncake_master"),
                          "--enable_http_metadata_server=true",
                          "--http_metadata_server_host=%s" % host,
                          "--http_metadata_server_port=%d" % hp, "--rpc_port=%d" % rp],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    o = None
    try:
        for _ in range(200):
            try:
                socket.create_connection((host, rp), timeout=0.1).close()
                break
            except OSError:
                time.sleep(0.05)
        cmd = shlex.split(a.owner_prefix or "") + [
            sys.executable, os.path.abspath(__file__), "--owner", "--blocks", str(a.blocks),
            "--block-bytes", str(a.block_bytes), "--peer-ip", a.peer_ip or "127.0.0.1",
            "--meta", meta, "--master", master]
        o = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True)
        if o.stdout.readline().strip() != "ready":
            raise RuntimeError("the owner process did not start (exit %s)" % o.wait())
        s = store(host, meta, master, 0, a.blocks * a.block_bytes + (16 << 20))
        dst = np.zeros(a.blocks * a.block_bytes, dtype=np.uint8)
        s.register_buffer(dst.ctypes.data, dst.nbytes)
        keys = ["kvt-bench-%d" % i for i in range(a.blocks)]
        ptrs = [dst.ctypes.data + i * a.block_bytes for i in range(a.blocks)]
        sizes = [a.block_bytes] * a.blocks

        def read():
            rc = s.batch_get_into(keys, ptrs, sizes)
            if any(r != a.block_bytes for r in rc):
                raise RuntimeError("batch_get_into: %s" % rc[:4])

        read()
        for i in range(a.blocks):
            if not np.array_equal(dst[i * a.block_bytes:(i + 1) * a.block_bytes],
                                  pattern(i, a.block_bytes)):
                raise RuntimeError("block %d read back wrong" % i)
        n, t0 = 0, time.monotonic()
        while n < 3 or time.monotonic() - t0 < a.seconds:
            read()
            n += 1
        dt = time.monotonic() - t0
        s.close()
        return {"ran": True, "version": ver, "reads": n,
                "gbps": n * a.blocks * a.block_bytes / dt / 1e9,
                "link": "veth between two network namespaces" if a.owner_prefix else
                "loopback"}
    finally:
        if o is not None:
            try:
                o.stdin.close()
                o.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                o.kill()
                o.wait()
        m.kill()
        m.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=64)
    ap.add_argument("--block-bytes", type=int, default=1 << 20)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--owner-prefix", default="")
    ap.add_argument("--host-ip", default="")
    ap.add_argument("--peer-ip", default="")
    ap.add_argument("--owner", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--meta", help=argparse.SUPPRESS)
    ap.add_argument("--master", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.owner:
        return owner(a)
    try:
        r = reader(a)
    except Exception as e:  # reported, not raised: the benchmark prints why
        r = {"ran": False, "why": "%s: %s" % (type(e).__name__, str(e).splitlines()[0][:300]
                                             if str(e) else "")}
    sys.stdout.write(json.dumps({"mooncake_store": r}) + "\n")  # one write (ec_peers.py)
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
