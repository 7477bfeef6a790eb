# SPDX-License-Identifier: Apache-2.0
"""Tests of the Python bindings (run by ctest as test_python)."""
import os
import sys
import ctypes
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))
import kvtier  # noqa: E402


class Errors(unittest.TestCase):
    def test_bad_config_raises_with_kvtiers_message(self):
        with self.assertRaises(kvtier.KvtierError) as cm:
            kvtier.Pool(1)
        self.assertEqual(cm.exception.name, "KVT_EINVAL")
        self.assertIn("num_blocks", cm.exception.message)
        self.assertLess(cm.exception.code, 0)

    def test_malformed_metadata_is_refused(self):
        with self.assertRaises(kvtier.KvtierError) as cm:
            kvtier.OffloadMeta.decode(b"KVTM" + b"\x00" * 20)
        self.assertIn(cm.exception.name, ("KVT_EPROTO", "KVT_EVERSION"))


class PoolTests(unittest.TestCase):
    def test_alloc_insert_lookup_hit_free(self):
        with kvtier.Pool(32, block_size=16) as pool:
            hashes = kvtier.hash_prompt(1, range(50), 16)
            self.assertEqual(len(hashes), 3)
            self.assertTrue(all(len(h) == 16 for h in hashes))
            ids = pool.alloc(4)
            for b, h in zip(ids, hashes):
                pool.insert(b, h)
            self.assertEqual(pool.lookup(hashes[1]), ids[1])
            pool.free(list(reversed(ids)))
            self.assertEqual(pool.num_free, 31)
            length, hit = pool.find_longest_hit(hashes, 49)
            self.assertEqual(length, 48)
            self.assertEqual(hit, ids[:3])
            with self.assertRaises(kvtier.KvtierError):
                pool.free([ids[0]])  # not referenced any more: a double free

    def test_hash_prompt_is_deterministic_and_seeded(self):
        a = kvtier.hash_prompt(7, range(32), 16)
        self.assertEqual(a, kvtier.hash_prompt(7, range(32), 16))
        self.assertNotEqual(a, kvtier.hash_prompt(8, range(32), 16))


class MetaTests(unittest.TestCase):
    def test_worker_report_round_trip_and_aggregate(self):
        a = kvtier.WorkerMeta()
        a.add(3)
        a.add(5, 2)
        a.add_failed(5)
        b = kvtier.WorkerMeta.decode(a.encode())
        self.assertEqual(b.completed, {3: 1, 5: 2})
        self.assertEqual(b.failed, {5})
        b.aggregate(a)
        self.assertEqual(b.completed, {3: 2, 5: 4})
        with self.assertRaises(kvtier.KvtierError):
            a.add_failed(9)  # not a completed event


class EngineStep(unittest.TestCase):
    def test_second_turn_loads_the_prompt_from_the_host_tier(self):
        import engine_step
        first, second, stats = engine_step.main()
        self.assertEqual(first["recomputed"], 83)
        self.assertEqual(second["host_hit"], 80)
        self.assertEqual(second["recomputed"], 3)
        self.assertEqual(second["loaded_blocks"], 5)
        self.assertEqual(stats["stores_completed"], 5)
        self.assertEqual(stats["host_used_blocks"], 0)

    def test_prometheus_text(self):
        import engine_step
        e = engine_step.Engine()
        e.turn("r", list(range(40)))
        text = e.mgr.prometheus()
        self.assertIn("kvtier_offload_", text)
        # two managers' texts in one exposition: one HELP per family, labels added
        both = kvtier.merge_metrics([(text, 'rank="0"'), (text, 'rank="1"')])
        self.assertEqual(both.count("# HELP kvtier_offload_lookups_total "), 1)
        self.assertIn('kvtier_offload_lookups_total{rank="1"} ', both)
        with self.assertRaises(kvtier.KvtierError):
            kvtier.merge_metrics([(text, None), (text, None)])  # the same series twice

    def test_misaligned_and_skipping_matches_are_misses(self):
        import engine_step
        e = engine_step.Engine()
        prompt = list(range(40))
        e.turn("r", prompt)
        hashes = kvtier.hash_prompt(7, prompt, engine_step.BS)  # as Engine.turn hashes
        self.assertEqual(e.mgr.match("q", hashes, 40, 5), 0)  # inside a block: a miss
        self.assertEqual(e.mgr.match("q", hashes, 40, 0, skip_prefix_cache=True), 0)
        st = e.mgr.stats()
        self.assertEqual(st["lookups_misaligned"], 1)
        self.assertEqual(st["lookups_skipped"], 1)
        self.assertGreater(e.mgr.match("q", hashes, 40, 0), 0)  # the same, plainly: a hit
        self.assertEqual(e.mgr.stats()["hit_requests"], st["hit_requests"] + 1)

    def test_stats_mirrors_come_from_the_library(self):
        L = sys.modules["kvtier._lib"]
        for name in ("kvt_offload_stats", "kvt_tier_stats", "kvt_node_stats", "kvt_remote_stats"):
            cls = getattr(L, name)
            self.assertEqual(ctypes.sizeof(cls), L.lib.kvt_sizeof(name.encode()))
        names = L.fields(L.kvt_offload_stats)
        self.assertIn("hit_requests", names)  # appended after the frozen 448 bytes
        self.assertEqual(names[0], "lookups")
        self.assertEqual(L.kvt_offload_stats.hit_requests.offset, 448)
        with self.assertRaises(ImportError):
            L.described("kvt_no_such_struct")

    def test_config_mirrors_and_defaults_come_from_the_library(self):
        L = sys.modules["kvtier._lib"]
        for name in ("kvt_offload_config", "kvt_copy_config", "kvt_disk_config",
                     "kvt_node_config"):
            cls = getattr(L, name)
            self.assertEqual(ctypes.sizeof(cls), L.lib.kvt_sizeof(name.encode()), name)
            c = cls()
            getattr(L.lib, name + "_init")(ctypes.byref(c))
            for row in L.config_rows(name).values():
                if row.type in (L.CONFIG_STRING, L.CONFIG_ROOM, L.CONFIG_BYTES):
                    continue
                self.assertEqual(int(getattr(c, row.name)), row.default, (name, row.name))
                self.assertLessEqual(row.min, row.max)
        rows = L.config_rows("kvt_offload_config")
        self.assertTrue(rows["host_blocks"].required)
        self.assertEqual((rows["max_requests"].min, rows["max_requests"].max), (1, 1 << 22))
        self.assertEqual(L.config_rows("kvt_copy_config")["backend"].type, L.CONFIG_INT)
        with self.assertRaises(ImportError):
            L.config_rows("kvt_offload_stats")

    def test_lazy_window(self):
        gpu = kvtier.Pool(64)
        self.assertEqual(kvtier.OffloadManager(gpu, host_blocks=8).lazy_window, 0)
        # one full-attention group: hits on its blocks (partial hits need a Mamba align group)
        self.assertEqual(kvtier.OffloadManager(gpu, host_blocks=8).hit_alignment, 16)
        lazy = kvtier.OffloadManager(gpu, host_blocks=8, lazy=True, max_batched_tokens=64,
                                     max_num_seqs=3)
        self.assertEqual(lazy.lazy_window, 2 * (64 // 16 + 3))

    def test_events_name_the_request_context(self):
        gpu = kvtier.Pool(64)
        mgr = kvtier.OffloadManager(gpu, host_blocks=16, event_capacity=64)
        tokens = list(range(3 * 16 + 1))
        hashes = kvtier.hash_prompt(7, tokens, 16)
        self.assertEqual(mgr.match("r", hashes, len(tokens), 0), 0)
        blocks = gpu.alloc(4)
        mgr.after_alloc("r", blocks, 0)
        self.assertTrue(mgr.set_request_context("r", 41))
        for b in range(3):
            gpu.insert(blocks[b], hashes[b])
        mgr.schedule("r", blocks, len(tokens), 1)
        meta = mgr.build_meta()
        self.assertEqual(len(meta.stores), 3)
        report = kvtier.WorkerMeta()
        report.add(meta.store_event, 1)
        mgr.request_finished("r", blocks, len(tokens))
        mgr.apply_output((), report)
        events, dropped = mgr.take_events()
        self.assertEqual(dropped, 0)
        self.assertEqual([e.type for e in events], ["stored"] * 3 + ["context_done"])
        for i, e in enumerate(events[:3]):
            self.assertEqual((e.medium, e.ctx, e.token_start, e.num_tokens), ("host", 41, 16 * i, 16))
            self.assertEqual(e.hash, hashes[i])
            self.assertEqual(e.parent_hash, hashes[i - 1] if i else None)
        self.assertEqual(events[3].ctx, 41)
        lazy = kvtier.OffloadManager(gpu, host_blocks=8, lazy=True, event_capacity=8)
        self.assertFalse(lazy.set_request_context("r", 41))  # lazy stores carry no context

    def test_layout_from_numpy(self):
        try:
            import numpy as np
        except ImportError:
            self.skipTest("numpy not installed")
        kv = np.zeros((2, 8, 256), dtype=np.uint8)  # (K/V, blocks, bytes per block)
        layout = kvtier.Layout(8)
        layout.add_tensor(kv, block_dim_size=8, block_stride=256)
        self.assertEqual(layout.num_regions, 2)
        self.assertEqual(layout.block_bytes, 512)
        padded = np.zeros((3, 8, 256), dtype=np.uint8)  # a whole region of padding
        layout = kvtier.Layout(8)
        layout.add_tensor(padded, block_dim_size=8, block_stride=256, size_bytes=2 * 8 * 256)
        self.assertEqual(layout.num_regions, 2)


class NodeTier(unittest.TestCase):
    def test_a_replica_loads_what_its_peer_stored(self):
        import engine_step
        name = "py%d" % os.getpid()
        kvtier.Node.unlink(name)
        nodes = [kvtier.Node(name, r, 2, engine_step.HOST_BLOCKS, block_bytes=4096, hash_seed=7)
                 for r in range(2)]
        try:
            a, b = (engine_step.Engine(n, name) for n in nodes)
            tokens = list(range(5 * engine_step.BS + 3))
            self.assertEqual(a.turn("a", tokens)["recomputed"], 83)
            self.assertEqual(nodes[0].stats()["published"], 5)
            second = b.turn("b", tokens)  # checks every loaded byte
            self.assertEqual(second["host_hit"], 80)
            self.assertEqual(second["loaded_blocks"], 5)
            self.assertEqual(nodes[1].stats()["published"], 0)  # nothing stored twice
            self.assertEqual(nodes[0].stats()["peer_pinned"], 0)
            with self.assertRaises(kvtier.KvtierError) as ei:
                kvtier.Node(name, 1, 2, engine_step.HOST_BLOCKS, block_bytes=4096, hash_seed=7)
            self.assertIn("attached by a live process", str(ei.exception))
            with self.assertRaises(kvtier.KvtierError) as ei:
                kvtier.Node(name, 0, 2, engine_step.HOST_BLOCKS, block_bytes=4096, hash_seed=8)
            self.assertIn("hash seed", str(ei.exception))
            for e in (a, b):
                e.worker.close()
        finally:  # closing a node closes the manager it was lent to first
            for n in nodes:
                n.close()
            kvtier.Node.unlink(name)


    def test_finalizers_in_any_order_never_crash(self):
        """Issue 36: a node tier and the manager it is lent to, in a reference cycle that the
        garbage collector (or the interpreter's exit) finalizes in no particular order: the
        process exits cleanly (it died of SIGSEGV in kvt_offload_destroy before)."""
        import subprocess
        import textwrap
        code = textwrap.dedent("""
            import gc, os, sys
            sys.path[:0] = [%r, %r]
            import kvtier, engine_step
            name = "pyexit%%d" %% os.getpid()
            node = kvtier.Node(name, 0, 1, engine_step.HOST_BLOCKS, block_bytes=4096,
                               hash_seed=7)
            e = engine_step.Engine(node, name)
            e.turn("a", list(range(5 * engine_step.BS + 3)))
            class Cycle: pass
            c = Cycle(); c.node, c.engine, c.self = node, e, c; e.cyc = c
            if sys.argv[1] == "collect":
                del node, e, c
                gc.collect()
            """ % (os.path.join(HERE, ".."), os.path.join(HERE, "..", "examples")))
        for how in ("collect", "exit"):
            r = subprocess.run([sys.executable, "-c", code, how], capture_output=True,
                               text=True, timeout=120)
            self.assertEqual(r.returncode, 0, how + ": " + r.stderr[-2000:])

    def test_config_values_are_range_checked_before_ctypes_converts_them(self):
        """ctypes stores an integer modulo its width and a string up to its first NUL: the
        binding's config structs refuse both, naming the field."""
        L = kvtier.L  # the ctypes declarations (kvtier._lib)
        cfg = L.kvt_node_config()
        with self.assertRaises(ValueError) as cm:
            cfg.blocks_per_rank = (1 << 32) + 8
        self.assertIn("blocks_per_rank", str(cm.exception))
        with self.assertRaises(ValueError):
            cfg.hash_seed = -1
        with self.assertRaises(ValueError) as cm:
            cfg.name = b"tier\0other"
        self.assertIn("NUL", str(cm.exception))
        rc = L.kvt_remote_config()
        with self.assertRaises(ValueError) as cm:
            rc.credential = b"x" * 16 + b"\0" + b"y" * 16
        self.assertIn("credential", str(cm.exception))
        with self.assertRaises(TypeError):
            rc.timeout_ms = "1000"
        cfg.blocks_per_rank = (1 << 32) - 1  # the largest value fits
        self.assertEqual(cfg.blocks_per_rank, (1 << 32) - 1)


def host_rig():
    """16 device blocks of 4 KiB in a bytearray, their layout, an 8-block host mirror and a
    worker of one copy thread."""
    dev = bytearray(16 * 4096)
    layout = kvtier.Layout(16)
    layout.add_buffer(dev, 4096)
    mirror = kvtier.Mirror(layout, 8, pin=False)
    return dev, layout, mirror, kvtier.Worker(layout, mirror=mirror, threads=1)


class DiskAndLink(unittest.TestCase):
    def test_worker_on_a_disk_tier_round_trip(self):
        import tempfile
        with tempfile.TemporaryDirectory(dir=".") as d:  # the build tree: not tmpfs
            dev = bytearray(16 * 4096)
            layout = kvtier.Layout(16)
            layout.add_buffer(dev, 4096)
            try:
                disk = kvtier.Disk(layout, os.path.join(d, "kv"), 8 * 4096)
            except kvtier.KvtierError as e:  # a file system without O_DIRECT
                self.assertIn("O_DIRECT", e.message)
                disk = kvtier.Disk(layout, os.path.join(d, "kv"), 8 * 4096, page_cache=True)
            self.assertEqual(disk.num_slots, 8)
            worker = kvtier.Worker(layout, disk=disk)
            dev[4096:8192] = bytes(range(256)) * 16          # block 1
            wm = kvtier.WorkerMeta()
            wm.add(0)
            mgr_meta = kvtier.OffloadMeta.decode(self._store_meta())
            worker.bind(mgr_meta)
            worker.get_finished()
            worker.flush()
            worker.get_finished()
            report = worker.build_meta()
            worker.clear()
            self.assertEqual(report.completed, {0: 1})
            self.assertEqual(disk.stats()["blocks"], [1, 0])
            worker.close()
            disk.close()

    def test_three_tiers_there_and_back(self):
        def m_tiers_of(rep):
            return {(k, t): {r.events[i]: r.counts[i] for i in range(r.n_completed)}
                    for k, t, r in rep.reports()}

        import tempfile
        with tempfile.TemporaryDirectory(dir=".") as d:
            dev, layout, mirror, worker = host_rig()
            disk = kvtier.Disk(mirror.layout(), os.path.join(d, "kv3"), 8 * 4096,
                               page_cache=True)
            worker.attach_disk(disk)
            dev[4096:8192] = bytes(range(256)) * 16  # GPU block 1

            def step(**kw):
                m = kvtier.OffloadMeta()
                for name, pairs in kw.items():
                    if name.startswith("tier_"):  # the disk: tier 1
                        m.set_tier_events(1, **{name[5:] + "_event": 0})
                        for a, b in pairs:
                            getattr(m, "add_" + name)(1, a, b)
                        continue
                    setattr(m, name + "_event", 0)
                    for a, b in pairs:
                        getattr(m, "add_" + name)(a, b)
                if "load" in kw:
                    m.add_load_request(0, "r")
                worker.bind(m)
                fin = worker.get_finished()
                worker.flush()
                fin += worker.get_finished()
                report = worker.build_meta()
                worker.clear()
                return fin, report

            step(store=[(1, 2)])                   # GPU 1 -> host 2
            _, rep = step(tier_store=[(2, 5)])     # host 2 -> slot 5
            self.assertEqual(rep.completed_of("tier_stores", 1), {0: 1})
            tiers = m_tiers_of(rep)
            self.assertEqual(len(tiers), 1 + 2 * (kvtier.L.MAX_TIERS - 1))
            self.assertEqual({k: v for k, v in tiers.items() if v}, {("tier_stores", 1): {0: 1}})
            with self.assertRaises(ValueError):
                rep.completed_of("tier_stores")    # which tier?
            mirror.block(0, 2)[:] = b"\0" * 4096    # the host tier forgets it
            _, rep = step(tier_load=[(5, 3)])      # slot 5 -> host 3
            self.assertEqual(rep.completed_of("tier_loads", 1), {0: 1})
            self.assertEqual(rep.failed_of("tier_loads", 1), set())
            fin, _ = step(load=[(9, 3)])           # host 3 -> GPU 9
            self.assertEqual(fin, ["r"])
            self.assertEqual(dev[9 * 4096:10 * 4096], dev[4096:8192])
            worker.close()
            disk.close()

    def test_manager_with_a_disk_tier(self):
        gpu = kvtier.Pool(32)
        mgr = kvtier.OffloadManager(gpu, host_blocks=8, disk_blocks=16)
        self.assertEqual(mgr.stats()["disk_blocks"], 15)
        mgr.lower_disk_blocks(12)
        self.assertEqual(mgr.stats()["disk_blocks"], 11)
        self.assertIn("kvtier_offload_disk_blocks 11", mgr.prometheus())
        tiers = mgr.tier_stats()  # the same figures by tier index
        self.assertEqual([t["name"] for t in tiers], ["host", "disk"])
        self.assertEqual(tiers[1]["blocks"], 11)
        self.assertEqual(tiers[0]["blocks"], mgr.stats()["host_blocks"])
        self.assertIn('kvtier_offload_tier_blocks{tier="disk"} 11', mgr.prometheus())

    def test_manager_and_worker_with_two_disks(self):
        gpu = kvtier.Pool(32)
        mgr = kvtier.OffloadManager(gpu, host_blocks=8, disk_blocks=16)
        self.assertEqual(mgr.add_tier("archive", 24), 2)
        with self.assertRaises(kvtier.KvtierError) as cm:
            mgr.add_tier("archive", 24)
        self.assertIn("already named", cm.exception.message)
        mgr.lower_tier_blocks(2, 20)
        self.assertEqual([t["name"] for t in mgr.tier_stats()], ["host", "disk", "archive"])
        self.assertEqual(mgr.tier_stats()[2]["blocks"], 19)
        self.assertIn('kvtier_offload_tier_blocks{tier="archive"} 19', mgr.prometheus())
        import tempfile
        with tempfile.TemporaryDirectory(dir=".") as d:
            dev, layout, mirror, worker = host_rig()
            disks = [kvtier.Disk(mirror.layout(), os.path.join(d, "kv%d" % t), 8 * 4096,
                                 page_cache=True) for t in (1, 2)]
            with self.assertRaises(kvtier.KvtierError):
                worker.attach_disk(disks[1], tier=4)
            worker.attach_disk(disks[1], tier=2)
            worker.attach_disk(disks[0])
            mirror.block(0, 2)[:] = bytes(range(256)) * 16
            m = kvtier.OffloadMeta()          # host 2 -> the second disk's slot 5
            m.set_tier_events(2, store_event=0)
            m.add_tier_store(2, 2, 5)
            worker.bind(m)
            worker.get_finished()
            worker.flush()
            worker.get_finished()
            rep = worker.build_meta()
            worker.clear()
            self.assertEqual(rep.completed_of("tier_stores", 2), {0: 1})
            worker.close()
            for disk in disks:
                disk.close()

    @staticmethod
    def _store_meta():
        m = kvtier.OffloadMeta()  # store event 0: GPU block 1 -> slot / host block 3
        m.store_event = 0
        m.add_store(1, 3)
        return m.encode()

    def test_link_between_a_scheduler_and_a_worker_thread(self):
        import threading
        ep = "ipc://kvt-py-link-%d.sock" % os.getpid()
        sched = kvtier.LinkScheduler(ep, 1)
        seen = []

        def rank():
            w = kvtier.LinkWorker(ep, 0, 1, host_blocks=50)
            while True:
                step = w.recv(timeout_ms=10000)
                if step is None:
                    break
                meta, payload = step
                seen.append(payload)
                report = kvtier.WorkerMeta()
                if meta.store_event >= 0:
                    report.add(meta.store_event)
                w.reply(finished=["req-1"], worker_meta=report, invalid=[9])
            w.close()

        t = threading.Thread(target=rank)
        t.start()
        self.assertEqual(sched.accept(), 50)
        meta = kvtier.OffloadMeta.decode(self._store_meta())
        finished, stores, invalid = sched.step(meta, b"engine payload")
        self.assertEqual(finished, ["req-1"])
        self.assertEqual(stores.completed, {0: 1})
        self.assertEqual(invalid, [9])
        sched.stop()
        t.join()
        sched.close()
        self.assertEqual(seen, [b"engine payload"])



class NumaPlacement(unittest.TestCase):
    def test_a_mirror_takes_a_numa_node_and_refuses_a_missing_one(self):
        layout = kvtier.Layout(8)
        dev = bytearray(8 * 4096)
        layout.add_buffer(dev, 4096)
        m = kvtier.Mirror(layout, 16, pin=False, numa_node=0)  # node 0: every Linux has it
        m.close()
        with self.assertRaises(kvtier.KvtierError) as ei:
            kvtier.Mirror(layout, 16, pin=False, numa_node=1000)
        self.assertIn("NUMA node 1000", str(ei.exception))
        with self.assertRaises(kvtier.KvtierError) as ei:
            kvtier.Mirror(layout, 16, pin=False, numa_node=-2)
        self.assertIn("numa_node -2", str(ei.exception))
        with self.assertRaises(ValueError):
            kvtier.Mirror(layout, 16, pin=False, numa_node=1 << 40)  # past int32: refused


class EncoderCache(unittest.TestCase):
    """An encoder pushes an embedding into a one-shard consumer; the consumer scheduler sees
    it ready, loads it, and the worker reads exactly the encoder's bytes."""

    def test_a_source_of_another_shape_is_refused(self):
        clock = kvtier.ManualClock()
        shard = kvtier.EcShard(1 << 20, clock=clock)
        prod = kvtier.EcProducer([shard], clock=clock)
        plan = kvtier.EcPlanner()
        emb = bytes(16 * 256 * 2)
        for t, h in (("x1", "img-a"), ("x2", "img-b")):
            plan.prepare({"mm_hash": h, "shape": (16, 256), "dtype": "bfloat16",
                          "consumer": "local://prefill", "transfer_id": t, "request_id": "r" + t})
        for p in plan.build_meta().pushes:
            prod.push(p)
        with self.assertRaises(ValueError):
            prod.bind_source("img-a", emb, shape=(16, 256))  # dtype missing
        self.assertEqual(prod.bind_source("img-a", emb, shape=(8, 512), dtype="bfloat16"), 0)
        self.assertEqual(prod.state("x1"), "failed")
        self.assertEqual(prod.bind_source("img-b", emb, shape=(16, 256), dtype="bfloat16"), 1)
        self.assertEqual(prod.dispatch(), 1)
        self.assertEqual(prod.state("x2"), "done")
        prod.close()
        shard.close()

    def test_push_ready_load_and_reload_locally(self):
        clock = kvtier.ManualClock()
        shard = kvtier.EcShard(1 << 20, clock=clock)
        sched = kvtier.EcScheduler(shards=1, clock=clock)
        prod = kvtier.EcProducer([shard], clock=clock)
        plan = kvtier.EcPlanner()
        emb = bytes((i * 7) % 251 for i in range(16 * 256 * 2))  # (16, 256) bfloat16
        spec = {"mm_hash": "sha256:img", "shape": (16, 256), "dtype": "bfloat16",
                "consumer": "local://prefill", "transfer_id": "x1", "request_id": "r1"}
        self.assertTrue(plan.prepare(spec))
        self.assertFalse(plan.prepare(spec))  # once per transfer id
        pushes = plan.build_meta().pushes
        self.assertEqual(len(pushes), 1)
        self.assertEqual(pushes[0]["nbytes"], len(emb))
        prod.push(pushes[0])
        self.assertEqual(shard.state("x1"), "writing")  # reserved before the output exists
        self.assertEqual(prod.bind_source("sha256:img", emb), 1)
        self.assertEqual(prod.dispatch(), 1)
        self.assertEqual(prod.state("x1"), "done")
        for ev in shard.events():
            sched.observe_ready(ev["transfer_id"], ev["mm_hash"], (16, 256), "bfloat16", 0)
        self.assertTrue(sched.has_cache_item("sha256:img"))
        self.assertFalse(sched.ensure("r1", [("sha256:img", "x1")]))  # starts the load
        meta = sched.build_meta()
        self.assertEqual(meta.loads[0]["transfer_id"], "x1")
        data = shard.take("x1", "sha256:img")
        self.assertEqual(bytes(data), emb)
        report = kvtier.EcWorkerMeta()
        report.add("loaded", "sha256:img")
        sched.apply_output(report)
        self.assertTrue(sched.ensure("r1", [("sha256:img", "x1")]))
        sched.cache_added("sha256:img")  # update_state_after_alloc: the engine holds it now
        sched.consumed("r1", "sha256:img", "x1")
        self.assertEqual(sched.take_cancels(), ["x1"])
        sched.request_finished("r1")
        # evicted from the encoder cache: the next request loads it from the shard's pool
        sched.cache_freed("sha256:img")
        self.assertEqual(sched.build_meta().freed, ["sha256:img"])
        shard.retire("sha256:img")
        self.assertFalse(sched.ensure("r2", [("sha256:img", None)]))
        load = sched.build_meta().loads[0]
        self.assertTrue(load["local"])
        self.assertEqual(bytes(shard.take_resident("sha256:img", (16, 256), "bfloat16")), emb)
        sched.apply_output(report)  # the rank loaded it: r2 may run
        self.assertTrue(sched.ensure("r2", [("sha256:img", None)]))
        sched.request_finished("r2")
        self.assertIn("kvtier_ec_sched_local_loads_total 1", sched.prometheus())
        self.assertEqual(prod.stats()["writes"], 1)
        self.assertEqual(shard.writers, 0)
        # a stalled wait fails the request, retryably, once
        self.assertFalse(sched.ensure("r3", [("sha256:other", "x9")]))
        clock.advance(61)
        sched.expire()
        self.assertEqual(sched.take_unavailable(), ["r3"])
        prod.close()
        sched.close()
        shard.close()

    def test_errors_are_exceptions_with_kvtiers_message(self):
        shard = kvtier.EcShard(4096)
        with self.assertRaises(kvtier.KvtierError) as cm:
            shard.reserve("x", "h", (4096,), "float32")  # 16 KiB into 4 KiB
        self.assertIn("EC consumer buffer pool is full", cm.exception.message)
        r = shard.reserve("x", "h", (16,), "float32")
        self.assertTrue(r["write"])
        with self.assertRaises(kvtier.KvtierError):
            shard.close()  # a writer may still write into the buffer
        self.assertTrue(shard.cancel("x", r["reservation_id"], abandon=True))
        shard.close()


if __name__ == "__main__":
    unittest.main()
