# SPDX-License-Identifier: Apache-2.0
"""The encoder-cache network bindings (EcServer, EcNetConsumer, EcInbox, EcProducer over the
network) on loopback: an item pushed over ZeroMQ + UCX arrives intact, is loaded through the
server's worker step, and the metadata round-trips its wire encoding. Standard library only."""
import os
import socket
import sys
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import kvtier  # noqa: E402


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Network(unittest.TestCase):
    def test_push_over_the_network_then_load(self):
        shard = kvtier.EcShard(1 << 20)
        srv = kvtier.EcServer(shard, "127.0.0.1", free_port())
        sched = kvtier.EcScheduler(shards=1)
        inbox = kvtier.EcInbox("tcp://127.0.0.1:%d" % srv.port)
        net = kvtier.EcNetConsumer(control_timeout_ms=5000)
        prod = kvtier.EcProducer.over_network(net)
        data = bytes((i * 7) % 251 for i in range(64 * 64 * 4))
        prod.push({"mm_hash": "img", "shape": (64, 64), "dtype": "float32",
                   "consumer": "tcp://127.0.0.1:%d" % srv.port, "transfer_id": "t1",
                   "request_id": "r1"})
        self.assertEqual(prod.bind_source("img", data), 1)
        prod.dispatch()
        self.assertEqual(prod.take_failures(), [])
        self.assertEqual(prod.stats()["done"], 1)
        cache = {}
        deadline = time.monotonic() + 30
        while not sched.ensure("r1", [("img", "t1")]):
            self.assertLess(time.monotonic(), deadline, "never ready")
            inbox.step(sched)
            meta = kvtier.EcMeta.decode(sched.build_meta().encode())  # the wire, as vLLM ships it
            wm = srv.apply(meta, lambda h: h in cache,
                           lambda spec, off, n: cache.__setitem__(spec["mm_hash"],
                                                                  bytes(shard.buffer[off:off + n])))
            sched.apply_output(kvtier.EcWorkerMeta.decode(wm.encode()))
            time.sleep(0.01)
        self.assertEqual(cache["img"], data)
        self.assertEqual(srv.stats()["bytes_received"], len(data))
        self.assertEqual(inbox.stats()["shards"], 1)
        inbox.close()
        prod.close()
        net.close()
        srv.close()
        shard.close()

    def test_a_bad_place_fails_the_load_and_raises(self):
        shard = kvtier.EcShard(1 << 16)
        srv = kvtier.EcServer(shard, "127.0.0.1", free_port())
        meta = kvtier.EcMeta()  # nothing to load: callbacks never run, an empty report
        wm = srv.apply(meta, lambda h: False, lambda *a: None)
        self.assertEqual(wm.loaded, set())
        with self.assertRaises(kvtier.KvtierError):
            kvtier.EcServer(shard, "127.0.0.1", srv.port)  # the port is taken: a clear error
        srv.close()
        shard.close()


if __name__ == "__main__":
    unittest.main()
