# SPDX-License-Identifier: Apache-2.0
"""kvtier.Remote against a redis-server the test starts (a unix socket in a temporary
directory): two instances in one process, every byte read checked, a withdrawn block a miss,
another hash seed refused, Redis gone = misses."""
import os
import shutil
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "tools", "common"))
import kvtier  # noqa: E402
import redis_server  # noqa: E402

BB = 4096
HL = 16
CRED = "python-remote-test-credential"


def chain(seq, n):
    return b"".join(bytes((seq * 31 + i * 7 + j) & 0xFF for j in range(HL)) for i in range(n))


def block(seq, i):
    return bytes(((seq * 131 + i * 17 + k) * 2654435761 >> 13) & 0xFF for k in range(BB))


@unittest.skipUnless(shutil.which("redis-server"), "needs redis-server (scripts/install-deps)")
class Remote(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="kvt-pyremote-")
        self.sock = os.path.join(self.dir, "redis.sock")
        try:  # ready once it takes a connection, not when its socket file appears
            self.redis = redis_server.start(self.sock)
        except RuntimeError as e:
            self.fail(str(e))
        self.objs = []

    def tearDown(self):
        for o in reversed(self.objs):
            o.close()
        self.redis.kill()
        self.redis.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

    def make(self, name, region=None, seed=5):
        r = kvtier.Remote(self.sock, "py", name, "127.0.0.1", CRED, BB, region=region,
                          hash_len=HL, hash_seed=seed, ttl_ms=300, timeout_ms=1000, retry_ms=50)
        self.objs.append(r)
        return r

    def test_blocks_read_across_instances_are_intact(self):
        region = bytearray(16 * BB)
        a = self.make("a", region)
        b = self.make("b")
        for i in range(8):
            region[(i + 1) * BB:(i + 2) * BB] = block(3, i)
        a.publish(list(range(1, 9)), chain(3, 8))
        locs = b.lookup(chain(3, 12))
        self.assertEqual(len(locs), 8)  # the chain ends where a's blocks end
        dsts = [bytearray(BB) for _ in locs]
        self.assertEqual(b.read(locs, chain(3, 8), dsts), [0] * 8)
        for i, d in enumerate(dsts):
            self.assertEqual(bytes(d), block(3, i), "block %d" % i)
        self.assertIn("a@127.0.0.1:", b.peer_name(locs[0][0]))
        # a withdrawn block ends the prefix; a read of its old location is stale
        a.withdraw([4])
        self.assertEqual(len(b.lookup(chain(3, 8))), 3)
        st = b.read(locs[3:4], chain(3, 8)[3 * HL:4 * HL], dsts[3:4])
        self.assertEqual(st, [-4])  # KVT_ENOENT
        self.assertEqual(a.stats()["served_blocks"], 8)
        self.assertEqual(b.stats()["read_ok"], 8)

    def test_another_seed_is_refused_and_redis_gone_means_misses(self):
        region = bytearray(4 * BB)
        a = self.make("a", region)
        with self.assertRaises(kvtier.KvtierError) as cm:
            self.make("c", seed=6)
        self.assertIn("hash seed", str(cm.exception))
        b = self.make("b")
        a.publish([1], chain(4, 1))
        self.assertEqual(len(b.lookup(chain(4, 1))), 1)
        self.redis.kill()
        self.redis.wait()
        self.assertEqual(b.lookup(chain(4, 1)), [])  # a miss, not an error
        self.assertGreater(b.stats()["directory_errors"], 0)

    def test_ranks_publish_their_parts_and_the_scheduler_finds_whole_blocks(self):
        def rank(name, k, region=None):
            r = kvtier.Remote(self.sock, "pyr", name, "127.0.0.1", CRED, BB, region=region,
                              hash_len=HL, hash_seed=5, ttl_ms=300, retry_ms=50, ranks=2,
                              rank=k)
            self.objs.append(r)
            return r
        regions = [bytearray(4 * BB), bytearray(4 * BB)]
        a = [rank("a", k, regions[k]) for k in range(2)]
        sched = kvtier.Remote(self.sock, "pyr", "b", None, None, 0, hash_len=HL, hash_seed=5,
                              ranks=2, rank=None)
        self.objs.append(sched)
        a[0].publish([1, 2], chain(6, 2))
        a[1].publish([1], chain(6, 1))
        locs = sched.lookup(chain(6, 2))
        self.assertEqual(len(locs), 2)  # block 0's two parts; block 1 lacks rank 1's
        self.assertEqual(sched.peer_name(locs[0][0]).split("@")[0], "a#0")
        self.assertEqual(sched.peer_name(locs[1][0]).split("@")[0], "a#1")
        with self.assertRaises(kvtier.KvtierError):
            sched.publish([1], chain(6, 1))  # it serves nothing

    def test_an_engine_loads_what_another_engine_stored(self):
        sys.path.insert(0, os.path.join(HERE, "..", "examples"))
        import engine_step
        args = dict(directory=self.sock, space="pyeng", listen_host="127.0.0.1",
                    credential=CRED, hash_seed=7, ttl_ms=300, retry_ms=50)
        a = engine_step.Engine(remote=dict(args, instance="a"))
        b = engine_step.Engine(remote=dict(args, instance="b"))
        self.objs += [a.mgr, b.mgr, a.remote, b.remote]
        tokens = list(range(5 * engine_step.BS + 3))
        self.assertEqual(a.turn("a", tokens)["recomputed"], 83)
        self.assertEqual(a.remote.stats()["published"], 5)
        second = b.turn("b", tokens)  # checks every loaded byte
        self.assertEqual(second["host_hit"], 80)
        self.assertEqual(second["loaded_blocks"], 5)
        self.assertEqual(b.mgr.stats()["remote_hit_blocks"], 5)
        self.assertEqual(b.remote.stats()["read_ok"], 5)
        # a Remote whose slots are not the host tier's blocks is refused, saying why
        other = kvtier.Remote(self.sock, "pyeng", "c", "127.0.0.1", CRED, BB, hash_seed=7,
                              region=bytearray(3 * BB))
        self.objs.append(other)
        mgr = kvtier.OffloadManager(kvtier.Pool(8, block_size=engine_step.BS), 8)
        self.objs.insert(0, mgr)
        with self.assertRaises(kvtier.KvtierError) as cm:
            mgr.attach_remote(other)
        self.assertIn("slots", str(cm.exception))


if __name__ == "__main__":
    unittest.main()
