# SPDX-License-Identifier: Apache-2.0
"""The peers of `kvtier bench ec`: the same item sizes pushed between two processes over the
same loopback transport by Mooncake's transfer engine (mooncake-transfer-engine, the transport
vLLM's ECMooncakeConnector uses) and by NIXL (its UCX backend), each through its own documented
Python API.

    python ec_peers.py --transport tcp|shm [--seconds S] [--peer NAME] [--phases 64k,1m,16m]

prints one JSON object on stdout: for each peer either {"ran": true, "version": ..., "gbps_16m",
"gbps_1m", "gbps_64k", "items_per_s_64k"} or {"ran": false, "why": "..."}. Everything else goes
to stderr. Each peer runs as a target process (a registered receive buffer) and an initiator
process (a registered source) that writes batches of items into the target's buffer: 512 items
of 64 KiB, 64 of 1 MiB, 8 of 16 MiB per batch, one batch in flight at a time, as kvtier's
pipelined phases do (bench/bench_ec.c). Only the bytes move: neither peer has a control plane
of reservations and completions here, so these figures are their wire ceilings, not a full
encoder-cache push. --phases keeps only the named phases (the figures of the others are
absent): `kvtier bench ec` pairs its 64 KiB phase with Mooncake's alone, right after it.

The script runs in the environment `make bench-env` makes (.venv-bench): bench/peers/
requirements.txt pins the packages.
"""
import argparse
import base64
import json
import os
import subprocess
import sys
import time

CAP = 256 << 20  # the target's buffer
PHASES = [(64 << 10, 512, 4096), (1 << 20, 64, 512), (16 << 20, 8, 64)]  # size, batch, items


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def buffer(n):
    import numpy as np
    b = np.zeros(n, dtype=np.uint8)
    b[:] = np.arange(n, dtype=np.uint64).astype(np.uint8)  # touched: no first-touch faults
    return b, b.ctypes.data


def scaled(items, seconds):
    return max(items // 8, int(items * seconds / 2.0))


# ---- Mooncake transfer engine -------------------------------------------------------------

def mooncake_engine(transport):
    from mooncake.engine import TransferEngine
    if transport != "tcp":
        raise RuntimeError("mooncake-transfer-engine has no shared-memory transport for host "
                           "memory between processes (its protocols: tcp, rdma and device "
                           "links); only tcp is measured")
    e = TransferEngine()
    rc = e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "")
    if rc != 0:
        raise RuntimeError("TransferEngine.initialize returned %d" % rc)
    return e


def mooncake_target(transport):
    e = mooncake_engine(transport)
    buf, addr = buffer(CAP)
    if e.register_memory(addr, CAP) != 0:
        raise RuntimeError("register_memory failed")
    return {"session": "127.0.0.1:%d" % e.get_rpc_port(), "addr": addr}, (e, buf)


def mooncake_run(transport, info, seconds):
    e = mooncake_engine(transport)
    src, saddr = buffer(16 << 20)
    if e.register_memory(saddr, 16 << 20) != 0:
        raise RuntimeError("register_memory failed")

    def batch(size, m, first):
        dst = [info["addr"] + ((first + i) * size) % CAP for i in range(m)]
        rc = e.batch_transfer_sync_write(info["session"], [saddr] * m, dst, [size] * m)
        if rc != 0:
            raise RuntimeError("batch_transfer_sync_write returned %d" % rc)

    return run_phases(batch, seconds)


# ---- NIXL ---------------------------------------------------------------------------------

def nixl_api():
    try:
        from nixl_cu12._api import nixl_agent, nixl_agent_config
    except ImportError:
        from nixl._api import nixl_agent, nixl_agent_config
    return nixl_agent, nixl_agent_config


def nixl_agent_of(name):
    nixl_agent, nixl_agent_config = nixl_api()
    agent = nixl_agent(name, nixl_agent_config(backends=[]))
    # as kvtier's data plane by default: no UCX peer failure detection, which shared memory
    # lacks (NIXL's default, "peer", cannot create a UCX endpoint over UCX_TLS=shm)
    agent.create_backend("UCX", {"ucx_error_handling_mode": "none"})
    return agent


def nixl_target(transport):
    agent = nixl_agent_of("kvtier-bench-target")
    buf, addr = buffer(CAP)
    agent.register_memory(agent.get_reg_descs([(addr, CAP, 0, "")], "DRAM"))
    meta = agent.get_agent_metadata()
    return {"meta": base64.b64encode(meta).decode(), "addr": addr}, (agent, buf)


def nixl_run(transport, info, seconds):
    agent = nixl_agent_of("kvtier-bench-initiator")
    src, saddr = buffer(16 << 20)
    agent.register_memory(agent.get_reg_descs([(saddr, 16 << 20, 0, "")], "DRAM"))
    remote = agent.add_remote_agent(base64.b64decode(info["meta"]))
    if isinstance(remote, bytes):
        remote = remote.decode()

    def batch(size, m, first):
        local = agent.get_xfer_descs([(saddr, size, 0)] * m, "DRAM")
        dst = agent.get_xfer_descs(
            [(info["addr"] + ((first + i) * size) % CAP, size, 0) for i in range(m)], "DRAM")
        h = agent.initialize_xfer("WRITE", local, dst, remote)
        state = agent.transfer(h)
        while state not in ("DONE", "ERR"):
            state = agent.check_xfer_state(h)
        agent.release_xfer_handle(h)
        if state == "ERR":
            raise RuntimeError("a NIXL transfer ended in ERR")

    return run_phases(batch, seconds)


# ---- driver ------------------------------------------------------------------------------------

KEYS = {64 << 10: "64k", 1 << 20: "1m", 16 << 20: "16m"}
WANT = set(KEYS.values())  # the phases to run (--phases)


def run_phases(batch, seconds):
    out = {}
    batch(1 << 20, 16, 0)  # connection set-up and warm-up, not measured
    for size, per, items in PHASES:
        if KEYS[size] not in WANT:
            continue
        items = scaled(items, seconds)
        done = 0
        t0 = time.perf_counter()
        while done < items:
            m = min(per, items - done)
            batch(size, m, done)
            done += m
        dt = time.perf_counter() - t0
        key = KEYS[size]
        out["gbps_" + key] = size * done / dt / 1e9
        out["items_per_s_" + key] = done / dt
    return out


PEERS = {"mooncake": (mooncake_target, mooncake_run, "mooncake-transfer-engine-non-cuda"),
         "nixl": (nixl_target, nixl_run, "nixl-cu12")}


def version(dist):
    try:
        from importlib.metadata import version as v
        return v(dist)
    except Exception:  # noqa: BLE001 - only a label
        return "unknown"


OUT = sys.stdout


def role_target(peer, transport):
    info, keep = PEERS[peer][0](transport)
    print(json.dumps(info), file=OUT, flush=True)
    sys.stdin.read()  # serve until the driver closes our stdin
    del keep


def role_initiator(peer, transport, info, seconds):
    r = PEERS[peer][1](transport, json.loads(info), seconds)
    print(json.dumps(r), file=OUT, flush=True)


def tail(text, n=300):
    text = (text or "").strip().replace("\n", " | ")
    return text[-n:]


def one_peer(peer, transport, seconds, timeout):
    me = [sys.executable, os.path.abspath(__file__), "--transport", transport,
          "--phases", ",".join(sorted(WANT))]
    try:
        __import__({"mooncake": "mooncake.engine", "nixl": "numpy"}[peer])
        if peer == "nixl":
            nixl_api()
    except Exception as e:  # noqa: BLE001 - reported, not raised
        return {"ran": False, "why": "cannot import %s: %s" % (PEERS[peer][2], e)}
    if peer == "mooncake" and transport != "tcp":
        try:
            mooncake_engine(transport)
        except RuntimeError as e:
            return {"ran": False, "why": str(e)}
    tgt = subprocess.Popen(me + ["--role", "target", "--peer", peer], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = tgt.stdout.readline()
        if not line:
            tgt.kill()
            return {"ran": False, "why": "target did not start: " + tail(tgt.stderr.read())}
        try:
            ini = subprocess.run(me + ["--role", "initiator", "--peer", peer, "--info",
                                       line.strip(), "--seconds", str(seconds)],
                                 capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"ran": False, "why": "no result within %d s" % timeout}
        if ini.returncode != 0 or not ini.stdout.strip():
            return {"ran": False, "why": "initiator failed (exit %d): %s" %
                    (ini.returncode, tail(ini.stderr))}
        r = json.loads(ini.stdout.strip().splitlines()[-1])
        r.update({"ran": True, "version": version(PEERS[peer][2])})
        return r
    finally:
        if tgt.poll() is None:
            try:
                tgt.stdin.close()
                tgt.wait(timeout=10)
            except Exception:  # noqa: BLE001
                tgt.kill()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--transport", choices=("tcp", "shm"), required=True)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--timeout", type=int, default=180)
    ap.add_argument("--peer", choices=sorted(PEERS))
    ap.add_argument("--role", choices=("target", "initiator"))
    ap.add_argument("--info")
    ap.add_argument("--phases", default="64k,1m,16m",
                    help="the phases to run, of 64k, 1m, 16m (comma-separated)")
    a = ap.parse_args()
    global WANT
    WANT = set(x for x in a.phases.split(",") if x)
    if not WANT or not WANT <= set(KEYS.values()):
        ap.error("--phases: a comma-separated list of 64k, 1m, 16m, not %r" % a.phases)
    os.environ["UCX_TLS"] = a.transport  # NIXL's UCX, as kvtier's and ucx_perftest's
    if a.role:
        # the libraries log on stdout: our one line goes to the real stdout, theirs to stderr
        global OUT
        OUT = os.fdopen(os.dup(1), "w")
        os.dup2(2, 1)
    if a.role == "target":
        role_target(a.peer, a.transport)
    elif a.role == "initiator":
        role_initiator(a.peer, a.transport, a.info, a.seconds)
    if a.role:
        OUT.flush()
        os._exit(0)  # NIXL's bundled libnl crashes in its exit handlers (SIGSEGV at exit)
    peers = [a.peer] if a.peer else sorted(PEERS)
    out = json.dumps({p: one_peer(p, a.transport, a.seconds, a.timeout) for p in peers})
    sys.stdout.write(out + "\n")  # one write: the reader may close once the object is whole
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
