# SPDX-License-Identifier: Apache-2.0
"""Drives KvtierECConnector with vLLM's own classes, the way vLLM's scheduler and model runner
call it: VllmConfig from EngineArgs with an ECTransferConfig, connectors made by vLLM's
ECConnectorFactory from kv_connector_module_path, vLLM Request objects carrying
MultiModalFeatureSpec items and ec_transfer_params, SchedulerOutput, ECConnectorOutput.

No multimodal model runs here: every multimodal model vLLM supports needs its processor and
tokenizer files, which cannot be downloaded on these machines. What the model would do is
stood in for by a seeded "encoder output" tensor per item (the producer's encoder cache) and a
plain dict (the consumer's encoder cache).

Run as a program it is the encoder (producer) instance: python ec_driver.py producer <model>
<consumer port> <spec json>; the test process is the prefill (consumer) instance.
"""
import json
import os
import sys
import time

os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout: results only
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

HIDDEN = 256  # the tiny model's hidden size: the encoder output width the producer measures


def vllm_config(model_dir, role, port, extra=None, buffer_size=64 << 20):
    from vllm.config import ECTransferConfig
    from vllm.engine.arg_utils import EngineArgs
    # vLLM refuses a producer-only config for a model without an encoder (this one): the
    # config is built as a consumer's and given the producer role afterwards, which is what a
    # multimodal encoder instance's config looks like
    ec = ECTransferConfig(ec_connector="KvtierECConnector", ec_role="ec_consumer",
                          ec_connector_module_path="kvtier.vllm", ec_ip="127.0.0.1",
                          ec_port=port, ec_buffer_size=buffer_size, ec_buffer_device="cpu",
                          ec_connector_extra_config=extra or {})
    vc = EngineArgs(model=model_dir, load_format="dummy", skip_tokenizer_init=True,
                    dtype="float32", enforce_eager=True, ec_transfer_config=ec,
                    max_model_len=4096).create_engine_config()
    vc.ec_transfer_config.ec_role = role
    # what vLLM measures at producer startup with a dummy encode (record_encoder_output_widths)
    vc.ec_transfer_config.mm_encoder_output_widths = {"image": HIDDEN}
    return vc


def connectors(vc):
    from vllm.distributed.ec_transfer.ec_connector.base import ECConnectorRole
    from vllm.distributed.ec_transfer.ec_connector.factory import ECConnectorFactory
    return (ECConnectorFactory.create_connector(vc, ECConnectorRole.SCHEDULER),
            ECConnectorFactory.create_connector(vc, ECConnectorRole.WORKER))


def make_request(req_id, items, consumer_port, n_tokens=200):
    """A vLLM Request whose prompt holds one image placeholder per item (mm_hash, offset,
    length, transfer_id) and whose ec_transfer_params name the consumer."""
    from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request
    feats = [MultiModalFeatureSpec(data=None, modality="image", identifier=h,
                                   mm_position=PlaceholderRange(offset=off, length=n))
             for h, off, n, _ in items]
    r = Request(req_id, list(range(3, 3 + n_tokens)), SamplingParams(max_tokens=4), None,
                mm_features=feats)
    r.ec_transfer_params = {"consumer_zmq": "tcp://127.0.0.1:%d" % consumer_port,
                            "ec_items": [{"mm_hash": h, "transfer_id": t} for h, _, _, t in items]}
    return r


def encoder_output(mm_hash, n):
    """The stand-in encoder: a seeded float32 tensor of (n, HIDDEN) per item."""
    import torch
    g = torch.Generator().manual_seed(sum(mm_hash.encode()) * 7919 + n)
    return torch.randn(n, HIDDEN, generator=g)


def empty_output(**kw):
    from vllm.v1.core.sched.output import SchedulerOutput
    so = SchedulerOutput.make_empty()
    for k, v in kw.items():
        setattr(so, k, v)
    return so


def producer_main(model_dir, port, spec):
    """The encoder instance: schedules each request's items, encodes them (a step later) and
    saves them, stepping until nothing is pending; prints a JSON summary."""
    from vllm.v1.outputs import ECConnectorOutput
    vc = vllm_config(model_dir, "ec_producer", port + 100)
    sched, worker = connectors(vc)
    reqs = [make_request(r["id"], [tuple(i) for i in r["items"]], port) for r in spec]
    cache = {}
    for r in reqs:  # the scheduler admits them: pushes are planned before any encoding
        assert sched.ensure_cache_available(r, 0)
    deadline = time.monotonic() + 120  # a condition (nothing pending), under a deadline
    step = -1
    while time.monotonic() < deadline:
        step += 1
        meta = sched.build_connector_meta(empty_output())
        worker.bind_connector_metadata(meta)
        worker.start_save_caches(encoder_cache=cache)
        if step == 1:  # the encoder runs
            for r in reqs:
                for f in r.mm_features:
                    cache[f.identifier] = encoder_output(f.identifier, f.mm_position.length)
                    worker.save_caches(encoder_cache=cache, mm_hash=f.identifier)
        out = ECConnectorOutput(ec_connector_worker_meta=worker.build_connector_worker_meta())
        worker.clear_connector_metadata()
        sched.update_connector_output(out)
        if step > 1 and not sched.has_pending_push_work():
            break
        time.sleep(0.01)
    failed = sorted(sched.take_unavailable_requests())
    params = {r.request_id: sched.request_finished(r)[1] for r in reqs}
    stats = worker.kvtier_stats()
    worker.shutdown()
    sched.shutdown()
    print(json.dumps({"failed": failed, "params": params, "producer": stats.get("producer")}))


if __name__ == "__main__":
    if len(sys.argv) != 5 or sys.argv[1] != "producer":
        sys.exit("usage: ec_driver.py producer MODEL_DIR CONSUMER_PORT SPEC_JSON")
    producer_main(sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4]))
