# SPDX-License-Identifier: Apache-2.0
"""kvtier._sched, the compiled scheduler side of the vLLM connector, without vLLM: a manager
over a stand-in for vLLM's BlockPool, driven with stand-ins for vLLM's requests and
SchedulerOutput (the attributes the module reads, nothing else). The vLLM tests
(tests/vllm/test_sched_compiled.py) compare it with the ctypes path under vLLM's real
scheduler; these check what it promises on its own: stores exactly as blocks are confirmed,
pins through the pool, and clear errors on bad input."""
import ctypes
import os
import sys
import unittest
from types import SimpleNamespace as NS

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
import importlib  # noqa: E402

import kvtier  # noqa: E402

L = importlib.import_module("kvtier._lib")  # the ctypes declarations

EXT = L.load_extension("_sched")
BS = 16        # block size: one hash per block
HLEN = 16      # hash length
COUNTERS = ("lookups", "hit_tokens", "store_blocks", "stores_completed")


class Pool:
    """vLLM's BlockPool as far as kvtier touches it: blocks by id with reference counts."""

    def __init__(self, n):
        self.blocks = [NS(block_id=i, ref_cnt=0, block_hash=None, is_null=i == 0)
                       for i in range(n)]
        self.touched, self.freed = [], []
        self.fail = None

    def touch(self, blocks):
        if self.fail:
            raise self.fail
        for b in blocks:
            b.ref_cnt += 1
        self.touched.extend(b.block_id for b in blocks)

    def free_blocks(self, blocks):
        for b in blocks:
            b.ref_cnt -= 1
        self.freed.extend(b.block_id for b in blocks)


def request(rid, tokens, first_block):
    """A request of `tokens` prompt tokens whose blocks are first_block, first_block + 1, ..."""
    n = tokens // BS
    return NS(request_id=rid, num_tokens=tokens, num_prompt_tokens=tokens, num_computed_tokens=0,
              num_output_placeholders=0,
              block_hashes=[(rid + ":%d" % i).encode().ljust(HLEN, b".")[:HLEN]
                            for i in range(n)],
              ids=list(range(first_block, first_block + n + 1)))


def output(new=(), cached=(), new_blocks=None, scheduled=None, preempted=()):
    cached = list(cached)
    return NS(preempted_req_ids=set(preempted),
              num_scheduled_tokens=scheduled or {},
              scheduled_new_reqs=[NS(req_id=r.request_id, block_ids=(r.ids,)) for r in new],
              scheduled_cached_reqs=NS(req_ids=[r.request_id for r in cached],
                                       new_block_ids=new_blocks or [None] * len(cached),
                                       resumed_req_ids=set(),
                                       num_computed_tokens=[r.num_computed_tokens
                                                            for r in cached]))


@unittest.skipIf(EXT is None, "kvtier._sched was not built (no Python headers): skipped")
class CompiledScheduler(unittest.TestCase):
    def setUp(self):
        self.pool = Pool(64)
        self.side = EXT.Scheduler([L.address(n) for n in EXT.API_NAMES], [BS], BS, HLEN, True,
                                  kvtier.KvtierError,
                                  [(k, getattr(L.kvt_offload_stats, k).offset)
                                   for k in COUNTERS], 1)
        touch, free, scan, lookup, ctx = self.side.ops()
        self.ops = L.kvt_gpu_pool_ops(ctypes.cast(touch, L.GPU_TOUCH),
                                      ctypes.cast(free, L.GPU_FREE),
                                      ctypes.cast(scan, L.GPU_LRU_SCAN),
                                      ctypes.cast(lookup, L.GPU_LOOKUP))
        oc = L.kvt_offload_config()
        L.lib.kvt_offload_config_init(ctypes.byref(oc))
        oc.host_blocks = 32
        oc.world_size = 1
        oc.block_bytes = 4096
        oc.max_batched_tokens = 4096
        oc.max_num_seqs = 16
        oc.max_model_len = 1024
        oc.defer_schedule_pins = True
        gc = L.kvt_pool_config()
        L.lib.kvt_pool_config_init(ctypes.byref(gc))
        gc.num_blocks = 64
        gc.hash_len = HLEN
        gc.hash_block_size = BS
        gc.scheduler_block_size = BS
        gc.n_groups = 1
        gc.groups[0].block_size = BS
        gc.groups[0].kind = L.GROUP_FULL
        h = ctypes.c_void_p()
        rc = L.lib.kvt_offload_create_ext(ctypes.byref(oc), ctypes.byref(gc),
                                          ctypes.byref(self.ops), ctypes.c_void_p(ctx),
                                          ctypes.byref(h))
        self.assertEqual(rc, 0, L.lib.kvt_last_error())
        self.h = h
        self.meta, self.wm = kvtier.OffloadMeta(), kvtier.WorkerMeta()
        self.side.bind(h.value, ctypes.addressof(self.meta._m), ctypes.addressof(self.wm._m))
        self.side.set_gpu(self.pool)

    def tearDown(self):
        self.side.unbind()
        L.lib.kvt_offload_destroy(self.h)

    def step(self, so):
        data = self.side.build_meta(so)
        return kvtier.OffloadMeta.decode(data) if data is not None else None

    def prefilled(self, blocks):
        """Request "a" of `blocks` blocks from GPU block 1 on, its prompt run: it decodes."""
        r = request("a", blocks * BS, 1)
        self.side.match(r, 0, 0)
        self.side.after_alloc(r, (r.ids,), 0)
        self.step(output(new=[r], scheduled={"a": blocks * BS}))
        r.num_computed_tokens = blocks * BS
        r.num_tokens += 1
        return r

    def test_blocks_are_stored_as_they_are_confirmed_and_pinned_until_reported(self):
        r = request("a", 4 * BS, 1)
        self.assertEqual(self.side.match(r, 0, 0), 0)  # nothing cached yet
        self.side.after_alloc(r, (r.ids,), 0)
        self.assertIsNone(self.step(output(new=[r], scheduled={"a": 4 * BS})))
        r.num_computed_tokens = 4 * BS  # the prompt ran: its 4 blocks are confirmed
        r.num_tokens += 1
        m = self.step(output(cached=[r], scheduled={"a": 1}))
        self.assertEqual([g for g, _ in m.stores], [1, 2, 3, 4])
        self.assertEqual(sorted(self.pool.touched), [1, 2, 3, 4])  # pinned by the store
        # decoding: no store until the fifth block is confirmed
        for i in range(1, BS):
            r.num_computed_tokens += 1
            r.num_tokens += 1
            if i == 1:  # the workers report the store
                w = kvtier.WorkerMeta()
                w.add(m.store_event, 1)
                self.side.apply_output(None, w.encode())
                self.assertEqual(sorted(self.pool.freed), [1, 2, 3, 4])
            got = self.step(output(cached=[r], scheduled={"a": 1}))
            self.assertIsNone(got, "step %d stored %r" % (i, got and got.stores))
        r.num_computed_tokens += 1
        r.num_tokens += 1
        r.block_hashes.append(b"a:4".ljust(HLEN, b"."))
        m = self.step(output(cached=[r], scheduled={"a": 1}))
        self.assertEqual([g for g, _ in m.stores], [5])
        stats = self.side.interval_stats()
        self.assertEqual(stats["store_blocks"], 5)
        self.assertEqual(stats["stores_completed"], 4)
        self.assertIsNone(self.side.interval_stats())  # nothing moved since
        self.side.finished(r, (r.ids,))
        self.assertEqual(self.side.requests(), 0)

    def test_a_prefix_stored_is_found_by_the_next_request(self):
        r = self.prefilled(4)
        m = self.step(output(cached=[r], scheduled={"a": 1}))
        w = kvtier.WorkerMeta()
        w.add(m.store_event, 1)
        self.side.apply_output(None, w.encode())
        self.side.finished(r, (r.ids,))
        twin = request("a", 4 * BS + 5, 20)
        twin.request_id = "twin"
        hit = self.side.match(twin, 0, 0)
        self.assertEqual(hit, 4 * BS)

    def test_callbacks_run_from_a_ctypes_call_take_the_gil(self):
        """ctypes releases the GIL around a call: the engine-block release the package makes
        through ctypes runs the C free callback, which must take it back (it crashed)."""
        r = self.prefilled(2)
        m = self.step(output(cached=[r], scheduled={"a": 1}))
        self.assertEqual([g for g, _ in m.stores], [1, 2])
        held = ctypes.c_uint32(0)
        self.assertEqual(L.lib.kvt_offload_release_engine_blocks(self.h, ctypes.byref(held)), 0)
        self.assertEqual(sorted(self.pool.freed), [1, 2])
        self.assertEqual(held.value, 0)

    def test_a_hash_of_the_wrong_length_is_refused(self):
        r = request("a", 2 * BS, 1)
        r.block_hashes[1] = b"short"
        with self.assertRaisesRegex(ValueError, "5 bytes, not 16"):
            self.side.match(r, 0, 0)

    def test_a_block_id_out_of_range_is_refused(self):
        r = request("a", 2 * BS, 1)
        with self.assertRaisesRegex(ValueError, "block id"):
            self.side.after_alloc(r, ([1, -3],), 0)
        with self.assertRaises(kvtier.KvtierError):  # a block the pool does not have
            self.side.after_alloc(r, ([1, 9999],), 0)

    def test_more_tables_than_groups_are_refused(self):
        r = request("a", BS, 1)
        with self.assertRaisesRegex(ValueError, "2 block tables for 1 KV cache groups"):
            self.side.after_alloc(r, ([1], [2]), 0)

    def test_the_pools_exception_comes_out_of_the_hook(self):
        r = self.prefilled(2)
        self.pool.fail = MemoryError("pool refused")
        with self.assertRaisesRegex(MemoryError, "pool refused"):
            self.step(output(cached=[r], scheduled={"a": 1}))
        self.pool.fail = None
        self.assertIsNone(self.side.raise_kept())  # raised once, not again

    def test_a_bad_worker_report_is_refused_with_kvtiers_message(self):
        with self.assertRaises(kvtier.KvtierError) as cm:
            self.side.apply_output(None, b"KVTW" + b"\xff" * 12)
        self.assertIn("worker report", str(cm.exception))

    def test_an_unbound_side_refuses(self):
        self.side.unbind()
        with self.assertRaisesRegex(RuntimeError, "closed"):
            self.side.match(request("a", BS, 1), 0, 0)
        self.side.bind(self.h.value, ctypes.addressof(self.meta._m),
                       ctypes.addressof(self.wm._m))


@unittest.skipIf(EXT is None, "kvtier._sched was not built (no Python headers): skipped")
class Construction(unittest.TestCase):
    def make(self, **kw):
        a = dict(functions=[L.address(n) for n in EXT.API_NAMES], group_tokens=[BS],
                 sched_block_size=BS, hash_len=HLEN, eager=True, error_type=kvtier.KvtierError,
                 stats=[], tokens_per_step=1)
        a.update(kw)
        return EXT.Scheduler(**a)

    def test_missing_functions_are_refused(self):
        with self.assertRaisesRegex(ValueError, "function addresses expected"):
            self.make(functions=[1, 2])

    def test_bad_shapes_are_refused(self):
        with self.assertRaisesRegex(ValueError, "hash length 99"):
            self.make(hash_len=99)
        with self.assertRaisesRegex(ValueError, "tokens_per_step 0"):
            self.make(tokens_per_step=0)
        with self.assertRaisesRegex(ValueError, "offset"):
            self.make(stats=[("lookups", 1 << 20)])

    def test_a_library_of_another_layout_is_refused(self):
        """A module built against other headers than the library it is handed: kvt_sizeof
        disagrees, and construction fails naming the struct instead of corrupting memory."""
        fake = ctypes.CFUNCTYPE(ctypes.c_size_t, ctypes.c_char_p)(lambda name: 8)
        fns = [L.address(n) for n in EXT.API_NAMES]
        fns[list(EXT.API_NAMES).index("kvt_sizeof")] = ctypes.cast(fake, ctypes.c_void_p).value
        with self.assertRaisesRegex(ImportError, "kvt_offload_sched_req is 8 bytes"):
            self.make(functions=fns)


if __name__ == "__main__":
    unittest.main()
