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

    def test_push_many_reserves_a_step_at_once(self):
        shard = kvtier.EcShard(1 << 20)
        srv = kvtier.EcServer(shard, "127.0.0.1", free_port())
        net = kvtier.EcNetConsumer(control_timeout_ms=5000)
        prod = kvtier.EcProducer.over_network(net)
        to = "tcp://127.0.0.1:%d" % srv.port
        specs = [{"mm_hash": "img%d" % i, "shape": (16, 16), "dtype": "float32", "consumer": to,
                  "transfer_id": "t%d" % i, "request_id": "r"} for i in range(5)]
        prod.push_many(specs)
        self.assertEqual(prod.stats()["reservations"], 5)
        data = [bytes((i + j) % 251 for j in range(16 * 16 * 4)) for i in range(5)]
        for i in range(5):
            self.assertEqual(prod.bind_source("img%d" % i, data[i]), 1)
        prod.dispatch()
        self.assertEqual(prod.take_failures(), [])
        st = prod.stats()
        self.assertEqual((st["done"], st["batches"], st["writes"]), (5, 1, 5))
        # a completion may be answered "pending" while the last bytes are still landing (the
        # server then completes it itself): its byte count can trail the producer's by a moment
        deadline = time.monotonic() + 10
        while srv.stats()["bytes_received"] < 5 * 16 * 16 * 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        self.assertEqual(srv.stats()["bytes_received"], 5 * 16 * 16 * 4)
        prod.push_many([])  # nothing to do
        with self.assertRaises(kvtier.KvtierError):
            prod.push_many([dict(specs[0], transfer_id="")])  # a bad spec is an error
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
