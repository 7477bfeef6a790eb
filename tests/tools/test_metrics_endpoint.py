# SPDX-License-Identifier: Apache-2.0
"""`kvtier demo --metrics-port 0` serves the run's Prometheus text at /metrics (run by ctest)."""
import os
import re
import shutil
import subprocess
import unittest
import urllib.error
import urllib.request


class MetricsEndpoint(unittest.TestCase):
    def test_demo_serves_offload_and_copy_metrics(self):
        cli = os.environ["KVTIER_CLI"]
        p = subprocess.Popen([cli, "demo", "--metrics-port", "0", "--metrics-seconds", "20"],
                             stdout=subprocess.PIPE, text=True)
        try:
            port = None
            for line in p.stdout:
                m = re.search(r"serving metrics on http://127\.0\.0\.1:(\d+)/metrics", line)
                if m:
                    port = int(m.group(1))
                    break
            self.assertIsNotNone(port, "the demo never said where it serves")
            with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10) as r:
                self.assertEqual(r.status, 200)
                self.assertIn("text/plain", r.headers["Content-Type"])
                text = r.read().decode()
            self.assertRegex(text, r"(?m)^kvtier_offload_stores_completed_total [1-9]\d*$")
            self.assertRegex(text,
                             r'(?m)^kvtier_copy_events_total\{rank="0",direction="load"\} [1-9]')
            self.assertIn("# TYPE kvtier_offload_host_blocks gauge", text)
            # the encoder-cache part's components too
            self.assertRegex(text, r'(?m)^kvtier_ec_sched_loaded_total [1-9]')
            # both shards, told apart by a label
            self.assertRegex(text, r'(?m)^kvtier_ec_shard_takes_total\{shard="0"\} [1-9]')
            self.assertRegex(text, r'(?m)^kvtier_ec_shard_reserves_total\{shard="1"\} [1-9]')
            # latency histograms and per-tier figures
            self.assertRegex(text, r'(?m)^kvtier_copy_transfer_seconds_count'
                                   r'\{rank="0",direction="store"\} [1-9]')
            self.assertRegex(text, r'(?m)^kvtier_ec_producer_push_seconds_count [1-9]')
            self.assertRegex(text, r'(?m)^kvtier_offload_tier_blocks\{tier="host"\} [1-9]')
            # one HELP per family: a valid exposition
            helps = re.findall(r"(?m)^# HELP (\S+)", text)
            self.assertEqual(len(helps), len(set(helps)))
            if shutil.which("promtool"):
                chk = subprocess.run(["promtool", "check", "metrics"], input=text, text=True,
                                     capture_output=True)
                self.assertEqual(chk.returncode, 0, chk.stdout + chk.stderr)
            else:
                print("skipped: promtool check (promtool not installed)")
            self.assertRegex(text, r'(?m)^kvtier_ec_producer_writes_total [1-9]')
            with self.assertRaises(urllib.error.HTTPError) as cm:
                urllib.request.urlopen("http://127.0.0.1:%d/other" % port, timeout=10)
            self.assertEqual(cm.exception.code, 404)
        finally:
            p.terminate()
            p.wait(timeout=10)
            p.stdout.close()
        self.assertEqual(p.returncode, 0)


if __name__ == "__main__":
    unittest.main()
