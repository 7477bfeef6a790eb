# SPDX-License-Identifier: Apache-2.0
"""KvtierECConnector driven through vLLM's own classes (ec_driver.py says why no multimodal
model runs here): an encoder (producer) instance in its own process pushes items over ZeroMQ +
UCX into this process's prefill (consumer) instance, whose scheduler and worker connectors then
load them into the encoder cache; every byte is compared with the encoder's output."""
import json
import os
import socket
import subprocess
import sys
import time

import pytest
import torch

import ec_driver as D

HERE = os.path.dirname(os.path.abspath(__file__))


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Consumer:
    """The prefill instance: scheduler-side and worker-side connectors, an encoder cache, and
    the step loop vLLM's scheduler and model runner would run."""

    def __init__(self, model_dir, port, extra=None):
        self.vc = D.vllm_config(model_dir, "ec_consumer", port, extra)
        self.sched, self.worker = D.connectors(self.vc)
        self.worker.start_worker_services()
        self.cache = {}
        self.freed = []

    def step(self):
        from vllm.v1.outputs import ECConnectorOutput
        meta = self.sched.build_connector_meta(D.empty_output(free_encoder_mm_hashes=self.freed))
        self.freed = []
        self.worker.bind_connector_metadata(meta)
        self.worker.start_load_caches(self.cache)
        out = ECConnectorOutput(ec_connector_worker_meta=self.worker.build_connector_worker_meta())
        self.worker.clear_connector_metadata()
        self.sched.update_connector_output(out)

    def wait_ready(self, req, timeout=120):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.sched.ensure_cache_available(req, 0):
                return True
            if req.request_id in self.sched.take_unavailable_requests():
                return False
            self.step()
            time.sleep(0.01)
        raise AssertionError("request %s never became ready" % req.request_id)

    def close(self):
        self.worker.shutdown()
        self.sched.shutdown()


def run_producer(model_dir, port, spec):
    env = dict(os.environ)
    return subprocess.Popen([sys.executable, os.path.join(HERE, "ec_driver.py"), "producer",
                             model_dir, str(port), json.dumps(spec)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture
def consumer(model_dir):
    c = Consumer(model_dir, free_port())
    yield c
    c.close()


def test_items_pushed_from_another_process_arrive_intact(model_dir, consumer):
    port = consumer.vc.ec_transfer_config.ec_port
    spec = [{"id": "req-a", "items": [["img-a", 10, 64, "xfer-a0"], ["img-b", 100, 32, "xfer-a1"]]},
            {"id": "req-b", "items": [["img-c", 20, 48, "xfer-b0"]]}]
    prod = run_producer(model_dir, port, spec)
    reqs = [D.make_request(r["id"], [tuple(i) for i in r["items"]], port) for r in spec]
    try:
        for r in reqs:
            assert consumer.wait_ready(r), "%s failed" % r.request_id
        out, err = prod.communicate(timeout=120)
        assert prod.returncode == 0, err[-3000:]
        summary = json.loads(out.strip().splitlines()[-1])
        assert summary["failed"] == []
        # the producer's request_finished hands the proxy each item's transfer id
        assert summary["params"]["req-a"]["ec_items"][0]["transfer_id"] == "xfer-a0"
        assert summary["producer"]["done"] == 3
        for r in reqs:
            for f in r.mm_features:
                got = consumer.cache[f.identifier]
                want = D.encoder_output(f.identifier, f.mm_position.length)
                assert got.shape == want.shape and torch.equal(got, want), f.identifier
                consumer.sched.update_state_after_alloc(r, r.mm_features.index(f))
        st = consumer.worker.kvtier_stats()["server"]
        assert st["bytes_received"] == (64 + 32 + 48) * D.HIDDEN * 4
        for r in reqs:  # gathered, then released; the requests end
            for i in range(len(r.mm_features)):
                consumer.sched.update_state_after_free(r, i)
            assert consumer.sched.request_finished(r) == (False, None)
        consumer.step()
    finally:
        if prod.poll() is None:
            prod.kill()


def test_an_item_in_the_shard_pool_serves_a_later_request_locally(model_dir, consumer):
    port = consumer.vc.ec_transfer_config.ec_port
    spec = [{"id": "req-1", "items": [["img-x", 5, 40, "xfer-1"]]}]
    prod = run_producer(model_dir, port, spec)
    r1 = D.make_request("req-1", [("img-x", 5, 40, "xfer-1")], port)
    try:
        assert consumer.wait_ready(r1)
        assert prod.wait(timeout=120) == 0
        consumer.sched.update_state_after_alloc(r1, 0)
        consumer.sched.update_state_after_free(r1, 0)
        consumer.sched.request_finished(r1)
        # the engine evicts it from its encoder cache: it stays resident in the shard
        del consumer.cache["img-x"]
        consumer.freed = ["img-x"]
        consumer.step()
        assert consumer.sched.has_cache_item("img-x")
        # a second request for the same image, with no producer at all, is served locally
        r2 = D.make_request("req-2", [("img-x", 7, 40, "xfer-2")], port)
        assert consumer.wait_ready(r2)
        assert torch.equal(consumer.cache["img-x"], D.encoder_output("img-x", 40))
    finally:
        if prod.poll() is None:
            prod.kill()


def test_a_push_that_never_comes_fails_the_request(model_dir):
    c = Consumer(model_dir, free_port(), extra={"push_wait_timeout_s": 0.5})
    try:
        r = D.make_request("req-lost", [("img-lost", 5, 16, "xfer-lost")],
                           c.vc.ec_transfer_config.ec_port)
        t0 = time.monotonic()
        assert c.wait_ready(r, timeout=20) is False  # reported unavailable: vLLM fails it
        assert time.monotonic() - t0 < 10
    finally:
        c.close()


BAD = [({"ec_buffer_size": 0}, "ec_buffer_size"),
       ({"ec_buffer_size": 1 << 70}, "ec_buffer_size"),
       ({"ec_port": 70000}, "ec_port=70000: must be 1..65535"),
       # issue 56: 1e300 passed the check, then the engine failed with OverflowError
       ({"ec_connector_extra_config": {"push_wait_timeout_s": 1e300}}, "push_wait_timeout_s"),
       ({"ec_connector_extra_config": {"lease_s": 1e300}}, "lease_s"),
       ({"ec_connector_extra_config": {"complete_wait_ms": 1 << 40}}, "complete_wait_ms"),
       ({"ec_connector_extra_config": {"push_wait": 3}}, "unknown"),
       ({"ec_connector_extra_config": {"push_wait_timeout_s": "soon"}}, "push_wait_timeout_s"),
       ({"ec_connector_extra_config": {"push_wait_timeout_s": float("nan")}},
        "push_wait_timeout_s"),
       ({"ec_buffer_device": "tpu"}, "ec_buffer_device")]


@pytest.mark.parametrize("change,word", BAD,
                         ids=[w.split("=")[0] + "-%d" % i for i, (_, w) in enumerate(BAD)])
def test_bad_configuration_is_refused(model_dir, change, word):
    from vllm.distributed.ec_transfer.ec_connector.base import ECConnectorRole
    from vllm.distributed.ec_transfer.ec_connector.factory import ECConnectorFactory
    vc = D.vllm_config(model_dir, "ec_consumer", free_port())
    for k, v in change.items():
        setattr(vc.ec_transfer_config, k, v)
    with pytest.raises(ValueError) as ei:
        ECConnectorFactory.create_connector(vc, ECConnectorRole.SCHEDULER)
    assert "kvtier" in str(ei.value) and word in str(ei.value), str(ei.value)
