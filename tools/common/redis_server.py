# SPDX-License-Identifier: Apache-2.0
"""A redis-server of the caller's own on a unix socket, for the Python tests and the vLLM demo
(the C twin: redis_server.h): no TCP port, no persistence. start() returns the process once the
socket accepts a connection. The socket's file existing is not enough: Redis binds, then changes
its mode, then listens, and a client that connects in between is refused (seen beside two busy
cores)."""
import socket
import subprocess
import time


def listens(sock):
    """Whether the unix socket sock takes a connection now."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(sock)
            return True
        except OSError:
            return False


def start(sock, workdir=None, timeout=60):
    """redis-server listening on sock (its files in workdir, if given), once it takes a
    connection: the Popen. Raises RuntimeError when it exits first or does not listen within
    timeout seconds (a loaded machine starts it slowly); it is killed then."""
    cmd = ["redis-server", "--port", "0", "--unixsocket", sock, "--save", "", "--appendonly",
           "no"] + (["--dir", workdir] if workdir else [])
    redis = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout
    while not listens(sock):
        if redis.poll() is not None:
            raise RuntimeError("redis-server exited with status %d" % redis.returncode)
        if time.monotonic() >= deadline:
            redis.kill()
            redis.wait()
            raise RuntimeError("redis-server did not take connections in %d s" % timeout)
        time.sleep(0.01)
    return redis
