# SPDX-License-Identifier: Apache-2.0
"""The vLLM connectors' keys against hostile values, without vLLM: every number key (the KV
connector's kv_connector_extra_config and the encoder-cache connector's
ec_connector_extra_config) refuses what it cannot hold with a ValueError that names it, before
any conversion, and every value it accepts converts to its C field without overflowing (issue
56: push_wait_timeout_s = 1e300 passed the check, then the engine failed at start with
OverflowError). Standard library only."""
import importlib
import math
import os
import sys
import types
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import kvtier  # noqa: E402


def config_module():
    """kvtier/vllm/_config.py without kvtier/vllm/__init__.py (which imports vLLM and torch)."""
    if "kvtier.vllm" not in sys.modules:
        pkg = types.ModuleType("kvtier.vllm")
        pkg.__path__ = [os.path.join(os.path.dirname(kvtier.__file__), "vllm")]
        sys.modules["kvtier.vllm"] = pkg
    return importlib.import_module("kvtier.vllm._config")


C = config_module()
HOSTILE = [1e300, -1e300, float("inf"), float("-inf"), float("nan"), 1 << 64, 1 << 200,
           -(1 << 64), "1e999", "-1", "", "12abc", True, None, [], 1e-300]
U64 = (1 << 64) - 1


class Keys(unittest.TestCase):
    def number_keys(self):
        keys = [k for k in C.KEYS + C.EC_KEYS if k.kind in (C.SIZE, C.INT, C.SECONDS)]
        self.assertGreater(len(keys), 15)
        return keys

    def test_bounds_fit_the_c_fields(self):
        for k in self.number_keys():
            _, lo, hi = k.bounds()
            lo, hi = k.accepted(lo, hi)
            self.assertIsNotNone(hi, k.name)  # every number has an upper bound
            if k.kind == C.SECONDS:  # nanoseconds in a uint64_t
                self.assertLessEqual(int(hi * 1e9), U64, k.name)
                self.assertGreaterEqual(int(lo * 1e9), 1, k.name)
            else:
                self.assertLessEqual(hi, (1 << 63) - 1, k.name)

    def test_hostile_values_are_refused_naming_the_key(self):
        for k in self.number_keys():
            _, lo, hi = k.bounds()
            lo, hi = k.accepted(lo, hi)
            for v in HOSTILE:
                with self.subTest(key=k.name, value=v):
                    try:
                        got = k.read({k.name: v})
                    except C.ConfigError as e:
                        self.assertIsInstance(e, ValueError)
                        self.assertIn(k.name, str(e))
                        continue
                    # accepted: then it is a number within the bounds, which converts
                    self.assertIsInstance(got, (int, float), (k.name, v, got))
                    self.assertTrue(lo <= got <= hi, (k.name, v, got, lo, hi))
                    self.assertFalse(isinstance(got, float) and math.isnan(got))
                    if k.kind == C.SECONDS:
                        self.assertLessEqual(int(got * 1e9), U64)

    def test_the_bounds_themselves_are_accepted(self):
        for k in self.number_keys():
            _, lo, hi = k.bounds()
            lo, hi = k.accepted(lo, hi)
            for v in (lo, hi):
                self.assertEqual(k.read({k.name: v}), v, k.name)
            below = lo - (0.0005 if k.kind == C.SECONDS else 1)
            with self.assertRaises(C.ConfigError, msg=k.name):
                k.read({k.name: below})
            above = hi * 2 if k.kind == C.SECONDS else hi + 1
            with self.assertRaises(C.ConfigError, msg=k.name):
                k.read({k.name: above})

    def test_seconds_reach_the_scheduler_intact(self):
        """The largest lease and wait the keys accept make a scheduler (C uint64_t ns)."""
        top = C.EC_KEY["lease_s"].read({"lease_s": C.MAX_SECONDS})
        wait = C.EC_KEY["push_wait_timeout_s"].read({"push_wait_timeout_s": C.MAX_SECONDS})
        s = kvtier.EcScheduler(shards=1, push_wait_s=wait, lease_s=top)
        s.close()


if __name__ == "__main__":
    unittest.main()
