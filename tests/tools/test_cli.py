# SPDX-License-Identifier: Apache-2.0
"""The kvtier command line as an adopter meets it (run by ctest as test_cli).

Every command and subcommand answers --help with exit 0; options take `--name value` and
`--name=value`; numbers are parsed strictly (exit 2 with a message naming the option); every
--json output parses as JSON even when UCX logs at info level; --out may hold any character.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

CLI = os.environ["KVTIER_CLI"]


def run(*args, env=None, timeout=600):
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=timeout, env=e)


def benches():
    p = run("bench", "--list")
    assert p.returncode == 0, p.stderr
    return [line.split()[0] for line in p.stdout.splitlines() if line.strip()]


class Help(unittest.TestCase):
    def test_every_command_answers_help(self):
        cmds = [["--help"], ["bench", "--help"], ["demo", "--help"],
                ["demo", "--components", "--help"], ["demo", "--soak", "1", "--help"],
                ["ec-consumer", "--help"], ["ec-producer", "--help"], ["ec-encoder", "--help"],
                ["remote-peer", "--help"]]
        names = benches()
        self.assertEqual(sorted(names), ["copy", "disk", "ec", "pool", "remote", "sched"])
        cmds += [["bench", b, "--help"] for b in names]
        for c in cmds:
            with self.subTest(cmd=" ".join(c)):
                p = run(*c)
                self.assertEqual(p.returncode, 0, p.stderr)
                self.assertTrue(p.stdout.startswith("usage: ") or c == ["--help"], p.stdout)
                self.assertIn("--help", p.stdout)
                self.assertEqual(p.stderr, "")

    def test_a_bench_lists_only_its_own_options(self):
        p = run("bench", "copy", "--help")
        self.assertIn("--threads", p.stdout)
        self.assertNotIn("--dir", p.stdout)
        q = run("bench", "copy", "--dir", "/tmp")
        self.assertEqual(q.returncode, 2)
        self.assertIn("unknown option '--dir'", q.stderr)


class Values(unittest.TestCase):
    def test_name_equals_value_and_name_space_value(self):
        for form in (["--seconds=0.05", "--seed=7"], ["--seconds", "0.05", "--seed", "7"]):
            with self.subTest(form=form):
                p = run("bench", "sched", "--json", *form)
                self.assertEqual(p.returncode, 0, p.stderr)
                d = json.loads(p.stdout)
                self.assertEqual(d["bench"], "sched")

    def test_contention_runs_during_the_bench_and_ends_with_it(self):
        """Issue 38: --contend N spins N processes during every phase, says so in the report,
        and leaves none behind."""
        # this run's processes carry a mark in their environment (the spinners inherit it):
        # other tests that run the CLI meanwhile (ctest -j) are not counted
        mark = "KVT_TEST_CONTEND_MARK=%d.%d" % (os.getpid(), id(self))

        def spinners():  # processes running the CLI's binary, whatever their name (it
            # re-executes itself through /proc/self/exe), with this run's mark; from /proc
            exe, n = os.path.realpath(CLI), 0
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    if os.path.realpath("/proc/%s/exe" % pid) != exe:
                        continue
                    with open("/proc/%s/environ" % pid, "rb") as f:
                        n += mark.encode() in f.read().split(b"\0")
                except OSError:
                    pass
            return n
        self.assertEqual(spinners(), 0)
        key, val = mark.split("=")
        p = run("bench", "ec", "--json", "--seconds", "0.02", "--transport", "tcp", "--peers",
                "none", "--contend", "2", "--contend-pin", "--thp", env={key: val})
        self.assertEqual(p.returncode, 0, p.stderr)
        d = json.loads(p.stdout)
        self.assertEqual((d["contend_processes"], d["contend_pinned"]), (2, True))
        self.assertIs(d["thp"], True)
        self.assertEqual(spinners(), 0)
        q = run("bench", "ec", "--contend", "65")
        self.assertEqual(q.returncode, 2)
        self.assertIn("--contend", q.stderr)

    def test_bad_values_are_usage_errors_naming_the_option(self):
        cases = [
            (["bench", "pool", "--seed", "-1"], "--seed '-1'"),
            (["bench", "pool", "--seed", "18446744073709551616"], "--seed"),
            (["bench", "pool", "--seconds", "nan"], "--seconds 'nan'"),
            (["bench", "pool", "--seconds=inf"], "--seconds 'inf'"),
            (["bench", "pool", "--seconds", "0"], "--seconds '0'"),
            (["bench", "pool", "--blocks", "12x"], "--blocks '12x'"),
            (["bench", "pool", "--seed", "--json"], "--seed wants a value"),
            (["bench", "pool", "--seed"], "--seed wants a value"),
            (["bench", "copy", "--backend", "tpu"], "one of cpu|cuda"),
            (["bench", "nope"], "no benchmark named 'nope'"),
            (["bench"], "which benchmark"),
            (["demo", "--requests=0"], "--requests '0'"),
            (["demo", "--cpu-bytes", "99999999999G"], "--cpu-bytes"),
            (["demo", "--tp", "3"], "must divide the 4 KV heads"),
            (["demo", "stray"], "unexpected argument 'stray'"),
            (["demo", "--soak", "-5"], "--soak '-5'"),
            (["demo", "--components", "--metrics-port", "70000"], "--metrics-port '70000'"),
            (["ec-consumer", "--host", "127.0.0.1", "--port", "65535", "--dp", "65535"],
             "out of 1..65535"),
            (["ec-consumer", "--host", "127.0.0.1", "--port", "65535", "--shards", "2"],
             "out of 1..65535"),
            (["ec-consumer", "--port", "5000"], "--host and --port are required"),
            (["ec-producer", "--items", "1e3", "--consumer", "tcp://127.0.0.1:1"], "--items"),
            (["ec-encoder", "--images", "0", "--consumer", "tcp://127.0.0.1:1"], "--images '0'"),
            (["nosuch"], "unknown command"),
        ]
        for args, msg in cases:
            with self.subTest(args=" ".join(args)):
                p = run(*args)
                self.assertEqual(p.returncode, 2, p.stdout + p.stderr)
                self.assertIn(msg, p.stderr)


class Limits(unittest.TestCase):
    def test_few_file_descriptors_give_a_clean_error(self):
        """libzmq aborts when it runs out of descriptors; kvtier looks first (ulimit -n)."""
        import resource

        def low():
            resource.setrlimit(resource.RLIMIT_NOFILE, (24, 24))
        p = subprocess.run([CLI, "ec-consumer", "--host", "127.0.0.1", "--port", "23999",
                            "--exit-after", "1"], capture_output=True, text=True, timeout=60,
                           preexec_fn=low)
        self.assertEqual(p.returncode, 1, p.stderr[-2000:])  # an error, not a signal
        self.assertTrue("raise ulimit -n" in p.stderr or "Too many open files" in p.stderr or
                        "error" in p.stderr.lower(), p.stderr[-2000:])


class Json(unittest.TestCase):
    UCX_INFO = {"UCX_LOG_LEVEL": "info"}

    # A stand-in for bench/peers/ec_peers.py: its object, then (a moment later, as an
    # unbuffered print writes it) the newline; a reader that stopped at the object's end
    # broke that second write.
    STAND_IN_PEERS = '''import os, sys, time
sys.stdout.write('{"mooncake": {"ran": false, "why": "stand-in"}, "nixl": {"ran": true, '
                 '"gbps_16m": 1.0, "gbps_1m": 1.0, "items_per_s_64k": 1000.0, '
                 '"version": "0"}}')
sys.stdout.flush()
time.sleep(0.5)
try:
    sys.stdout.write("\\n")
    sys.stdout.flush()
except BrokenPipeError:
    open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "broken"), "w").close()
'''

    def test_bench_ec_json_parses_while_ucx_logs(self):
        with tempfile.TemporaryDirectory() as peers:
            with open(os.path.join(peers, "ec_peers.py"), "w") as f:
                f.write(self.STAND_IN_PEERS)
            p = run("bench", "ec", "--json", "--seconds", "0.2", "--peers", sys.executable,
                    env=dict(self.UCX_INFO, KVTIER_PEERS_DIR=peers))
            self.assertEqual(p.returncode, 0, p.stderr[-2000:])
            # the peers' figures arrived, and the script was read to its end
            self.assertFalse(os.path.exists(os.path.join(peers, "broken")))
        d = json.loads(p.stdout)
        self.assertEqual((d["mooncake_why"], d["nixl_gbps"]), ("stand-in", 1.0))
        self.assertGreater(d["gbps"], 0)
        # the headline is the paired round with the median ratio, and says which
        self.assertEqual(len(d["rounds_ratio"]), 3)
        self.assertEqual(d["ratio_vs_ucx_perftest"], sorted(d["rounds_ratio"])[1])
        i = d["rounds_ratio"].index(d["ratio_vs_ucx_perftest"])
        self.assertEqual((d["gbps"], d["ucx_perftest_gbps"]),
                         (d["rounds_gbps"][i], d["rounds_ucx_perftest_gbps"][i]))
        self.assertAlmostEqual(d["ratio_vs_ucx_perftest"], d["gbps"] / d["ucx_perftest_gbps"])
        try:
            with open("/proc/sys/net/ipv4/tcp_congestion_control") as f:
                cc = f.read().strip()
        except OSError:
            cc = "unknown"
        self.assertEqual(d["host_tcp_congestion_control"], cc)
        # UCX did log, on stderr only
        self.assertIn("[ucx ", p.stderr)

    # A stand-in whose Mooncake runs: the full run first, then 64 KiB phases alone, each call
    # with its own figure (from MC below), its arguments logged.
    STAND_IN_MOONCAKE = '''import json, os, sys
here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "calls"), "a") as f:
    f.write(" ".join(sys.argv[1:]) + "\\n")
with open(os.path.join(here, "calls")) as f:
    n = len(f.readlines())
MC = [1000.0, 2e6, 1.0, 3e4]
out = {"mooncake": {"ran": True, "items_per_s_64k": MC[n - 1], "version": "0"}}
if n == 1:
    out["mooncake"].update({"gbps_16m": 1.0, "gbps_1m": 1.0})
    out["nixl"] = {"ran": False, "why": "stand-in"}
sys.stdout.write(json.dumps(out) + "\\n")
'''

    def test_bench_ec_pairs_its_64k_phase_with_mooncakes(self):
        with tempfile.TemporaryDirectory() as peers:
            with open(os.path.join(peers, "ec_peers.py"), "w") as f:
                f.write(self.STAND_IN_MOONCAKE)
            p = run("bench", "ec", "--json", "--seconds", "0.2", "--peers", sys.executable,
                    env=dict(KVTIER_PEERS_DIR=peers))
            self.assertEqual(p.returncode, 0, p.stderr[-2000:])
            with open(os.path.join(peers, "calls")) as f:
                calls = f.read().splitlines()
        # the full run, then three rounds of Mooncake's 64 KiB phase alone
        self.assertEqual(len(calls), 4, calls)
        self.assertNotIn("--phases", calls[0])
        for c in calls[1:]:
            self.assertIn("--peer mooncake --phases 64k", c)
        d = json.loads(p.stdout)
        self.assertEqual(d["rounds_mooncake_items_per_s_64k"], [2e6, 1.0, 3e4])
        # the headline is the round with the median ratio: here the third
        r = d["rounds_ratio_vs_mooncake_64k"]
        self.assertEqual(d["ratio_vs_mooncake_64k"], sorted(r)[1])
        self.assertEqual(d["ratio_vs_mooncake_64k"], r[2])
        self.assertEqual((d["items_per_s_64k"], d["mooncake_items_per_s_64k"]),
                         (d["rounds_items_per_s_64k"][2], 3e4))
        self.assertAlmostEqual(r[2], d["items_per_s_64k"] / 3e4)
        self.assertEqual(d["nixl_why"], "stand-in")

    def test_every_other_bench_json_parses(self):
        args = {"pool": ["--seconds", "0.1"], "sched": ["--seconds", "0.1"],
                "copy": ["--gib", "0.02"], "disk": ["--gib", "0.02"]}
        with tempfile.TemporaryDirectory() as d:
            for b, extra in args.items():
                if b == "disk":
                    extra = extra + ["--dir", d]
                with self.subTest(bench=b):
                    p = run("bench", b, "--json", *extra, env=self.UCX_INFO)
                    self.assertEqual(p.returncode, 0, p.stderr[-2000:])
                    self.assertEqual(json.loads(p.stdout)["bench"], b)

    def test_demo_json_parses_and_plots_into_an_awkward_directory(self):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "it's a \"dir\" $HOME")
            os.mkdir(out)
            p = run("demo", "--requests", "3", "--turns", "2", "--doc-tokens=400", "--images=2",
                    "--tp=1", "--gpu-blocks=96", "--json", "--out", out, env=self.UCX_INFO)
            self.assertEqual(p.returncode, 0, p.stderr[-3000:])
            d = json.loads(p.stdout)
            self.assertTrue(d["identical"])
            self.assertEqual(d["config"]["tp"], 1)
            h = d["hybrid"]  # runs 4 and 5: the hybrid model
            self.assertTrue(h["identical"] and h["offload_worked"] and h["kv_equal"])
            self.assertEqual(h["window"], 256)
            self.assertGreater(h["host_tier_hit_rate"], 0)
            with open(os.path.join(out, "report.json")) as f:
                self.assertEqual(json.load(f), d)
            if shutil.which("gnuplot"):
                self.assertGreater(os.path.getsize(os.path.join(out, "ttft.svg")), 1000)
            else:
                print("skipped: the plot check (no gnuplot)")
            # progress goes to stderr as lines when stderr is not a terminal
            self.assertIn("demo: run 5/5:", p.stderr)


if __name__ == "__main__":
    unittest.main()
