# SPDX-License-Identifier: Apache-2.0
"""KvtierECConnector: vLLM's encoder-cache connector interface over kvtier's encoder-cache
transfer, with the semantics of vLLM's ECMooncakeConnector (encode/prefill disaggregation).

    ec_transfer_config={"ec_connector": "KvtierECConnector",
                        "ec_connector_module_path": "kvtier.vllm",
                        "ec_role": "ec_consumer",          # the prefill instance
                        "ec_ip": "10.0.0.5", "ec_port": 14579,
                        "ec_buffer_size": 1 << 30}

The prefill (consumer) instance: every tensor-parallel rank runs a consumer shard over a receive
buffer of ec_buffer_size bytes in host memory and its control server at ec_ip:ec_port + dp_index
x tp_size + rank (ZeroMQ control, UCX data); its scheduler keeps kvtier's transfer table,
learns readiness from its shards and sends cancels through an inbox thread that never blocks a
step. The encoder (producer) instance: its scheduler plans a push for every multimodal item of a
request that names a consumer (request.ec_transfer_params["consumer_zmq"], transfer ids in
["ec_items"] as vLLM's proxy writes them), its worker reserves on every consumer shard before
the encoder output exists, then writes it there over UCX and completes the transfer as soon as
save_caches has the tensor.

Limits: the receive buffer lives in host memory whatever ec_buffer_device says (an item placed
in a GPU encoder cache is copied there); producers run with one rank, as vLLM's Mooncake
connector requires.
"""
import logging
from typing import Any

from .. import EcInbox, EcMeta, EcNetConsumer, EcPlanner, EcProducer, EcScheduler, EcServer
from .. import EcShard, EcWorkerMeta
from ._config import EC_KEY, MAX_BYTES, ConfigError

try:
    import torch
    from vllm.distributed.ec_transfer.ec_connector.base import (ECConnectorBase,
                                                                ECConnectorMetadata,
                                                                ECConnectorRole,
                                                                ECConnectorWorkerMetadata)
except ImportError as e:  # pragma: no cover
    raise ImportError("kvtier.vllm needs vLLM: %s" % e) from e

logger = logging.getLogger("kvtier.vllm")


_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
           "float64": torch.float64, "int8": torch.int8, "uint8": torch.uint8,
           "int32": torch.int32, "int64": torch.int64}


def _positive(name, v, maximum):
    """vLLM's own ec_* integers (a port, a buffer size): whole, 1..maximum (checked before any
    conversion: a C field would wrap a larger one)."""
    if isinstance(v, bool):
        raise ConfigError("kvtier: %s=%r: expected a positive number" % (name, v))
    try:
        x = int(v)
        whole = float(v) == x
    except (TypeError, ValueError, OverflowError):
        raise ConfigError("kvtier: %s=%r: expected a positive number" % (name, v)) from None
    if not whole:
        raise ConfigError("kvtier: %s=%r: expected a whole number" % (name, v))
    if not 1 <= x <= maximum:
        raise ConfigError("kvtier: %s=%r: must be 1..%d" % (name, v, maximum))
    return x


class KvtierECConfig:
    """The EC connector's settings from vLLM's ec_transfer_config, checked strictly."""

    def __init__(self, vllm_config):
        ec = vllm_config.ec_transfer_config
        pc = vllm_config.parallel_config
        self.producer = bool(ec.is_ec_producer)
        self.consumer = bool(ec.is_ec_consumer)
        extra = dict(ec.ec_connector_extra_config or {})
        unknown = sorted(k for k in extra if k not in EC_KEY)
        if unknown:
            raise ConfigError("kvtier: unknown ec_connector_extra_config key%s %s; known keys: "
                              "%s" % ("s" if len(unknown) > 1 else "",
                                      ", ".join(map(repr, unknown)), ", ".join(sorted(EC_KEY))))
        if self.producer and (pc.tensor_parallel_size > 1 or pc.pipeline_parallel_size > 1):
            raise ConfigError("kvtier: an encoder-cache producer runs with one rank "
                              "(tensor_parallel_size=1, pipeline_parallel_size=1)")
        self.tp_size = pc.tensor_parallel_size
        self.dp_index = getattr(pc, "data_parallel_index", 0) or 0
        self.host = str(ec.ec_ip)
        port = _positive("ec_port", ec.ec_port, 65535)
        self.base_port = port
        first = port + self.dp_index * self.tp_size
        top = 65535 - self.dp_index * self.tp_size - (self.tp_size - 1)  # the last port fits
        if top < 1 or port > top:
            raise ConfigError("kvtier: ec_port=%d: rank r of data-parallel index %d serves on "
                              "ec_port + %d x %d + r, so with tensor_parallel_size %d ec_port "
                              "must be 1..%d" % (port, self.dp_index, self.dp_index,
                                                 self.tp_size, self.tp_size, top)
                              if top >= 1 else
                              "kvtier: ec_port=%d: data-parallel index %d x tensor_parallel_size "
                              "%d leaves no port below 65536" % (port, self.dp_index,
                                                                  self.tp_size))
        self.control_addr = "tcp://%s:%d" % (self.host, first)
        self.buffer_size = (_positive("ec_buffer_size", ec.ec_buffer_size, MAX_BYTES)
                            if self.consumer else 0)
        device = str(ec.ec_buffer_device or "cpu").lower()
        if device not in ("cpu", "cuda"):
            raise ConfigError("kvtier: ec_buffer_device=%r: expected cpu or cuda (kvtier's "
                              "receive buffer is host memory either way)" % ec.ec_buffer_device)
        self.push_wait_s = EC_KEY["push_wait_timeout_s"].read(extra)
        self.lease_s = EC_KEY["lease_s"].read(extra)
        self.control_timeout_ms = EC_KEY["control_timeout_ms"].read(extra)
        self.complete_wait_ms = EC_KEY["complete_wait_ms"].read(extra)
        self.owner_key = EC_KEY["owner_key"].read(extra)
        if self.owner_key is not None and not (
                isinstance(self.owner_key, str) and len(self.owner_key) == 32 and
                all(c in "0123456789abcdef" for c in self.owner_key)):
            raise ConfigError("kvtier: owner_key must be 32 lowercase hex digits")
        self.event_host = EC_KEY["event_host"].read(extra)
        self.curve = {k: EC_KEY[k].read(extra) for k in EC_KEY if k.startswith("curve_")}


# ---- metadata ----------------------------------------------------------------------------

class KvtierECConnectorMetadata(ECConnectorMetadata):
    """Scheduler -> workers: the consumer's loads and freed hashes and the producer's pushes,
    each a kvt_ec_meta in kvtier's wire encoding (b"" when empty)."""

    __slots__ = ("consumer", "producer")

    def __init__(self, consumer=b"", producer=b""):
        self.consumer = consumer
        self.producer = producer


class KvtierECWorkerMetadata(ECConnectorWorkerMetadata):
    """Workers -> scheduler: a kvt_ec_worker_meta, encoded. aggregate: loaded intersected (an
    item is loaded only when every rank placed it), the rest united."""

    __slots__ = ("data",)

    def __init__(self, data=b""):
        self.data = data

    def aggregate(self, other):
        if other is None:
            return self
        a = EcWorkerMeta.decode(self.data)
        a.aggregate(EcWorkerMeta.decode(other.data))
        return KvtierECWorkerMetadata(a.encode())


def _features(request):
    """[(index, mm_hash, transfer id)] of a request's multimodal items; the transfer id comes
    from ec_transfer_params["ec_items"] (by position when its mm_hash is absent or equal, else
    by mm_hash), or is "<request_id>:<index>" as in vLLM's connector."""
    params = getattr(request, "ec_transfer_params", None) or {}
    items = params.get("ec_items") or []
    out = []
    for i, f in enumerate(request.mm_features or ()):
        h = f.identifier
        tid = None
        if i < len(items) and items[i].get("mm_hash") in (None, h) and items[i].get("transfer_id"):
            tid = str(items[i]["transfer_id"])
        else:
            for it in items:
                if it.get("mm_hash") == h and it.get("transfer_id"):
                    tid = str(it["transfer_id"])
                    break
        out.append((i, h, tid or "%s:%d" % (request.request_id, i)))
    return out


def _uncovered(request, num_computed_tokens):
    return [i for i, f in enumerate(request.mm_features or ())
            if f.mm_position.offset + f.mm_position.length > num_computed_tokens]


class KvtierECConnector(ECConnectorBase):
    """vLLM EC connector over kvtier (see the module documentation)."""

    def __init__(self, vllm_config, role):
        super().__init__(vllm_config=vllm_config, role=role)
        self.kvtier_config = cfg = KvtierECConfig(vllm_config)
        self._vllm_config = vllm_config
        self._sched = self._inbox = self._planner = None
        self._shard = self._server = self._producer = self._net = None
        self._report = None
        self._bound = {}  # producer: mm_hash -> the tensor a pending push reads
        self._push_specs = {}  # producer worker: transfer id -> spec of this step's pushes
        if role == ECConnectorRole.SCHEDULER:
            if cfg.consumer:
                self._sched = EcScheduler(shards=cfg.tp_size, push_wait_s=cfg.push_wait_s,
                                          lease_s=cfg.lease_s)
                self._inbox = EcInbox(cfg.control_addr, control_timeout_ms=cfg.control_timeout_ms,
                                      curve_server_key=cfg.curve["curve_server_public_key"],
                                      curve_public_key=cfg.curve["curve_public_key"],
                                      curve_secret_key=cfg.curve["curve_secret_key"],
                                      owner_key=cfg.owner_key, event_host=cfg.event_host)
            if cfg.producer:
                self._planner = EcPlanner()
        elif role == ECConnectorRole.WORKER:
            if cfg.producer:
                self._net = EcNetConsumer(control_timeout_ms=cfg.control_timeout_ms,
                                          curve_server_key=cfg.curve["curve_server_public_key"],
                                          curve_public_key=cfg.curve["curve_public_key"],
                                          curve_secret_key=cfg.curve["curve_secret_key"])
                self._producer = EcProducer.over_network(self._net)
        else:
            raise ConfigError("kvtier: unknown EC connector role %r" % (role,))

    # -- worker side ------------------------------------------------------------------------

    def _rank(self):
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            from vllm.distributed import get_tensor_model_parallel_rank
            try:
                return get_tensor_model_parallel_rank()
            except Exception:
                return torch.distributed.get_rank()
        return 0

    def start_worker_services(self):
        """Consumer: the rank's shard (its receive buffer) and control server."""
        cfg = self.kvtier_config
        if not cfg.consumer or self._server is not None:
            return
        rank = self._rank()
        buf = torch.zeros(cfg.buffer_size, dtype=torch.uint8)  # host memory, page-aligned
        self._shard = EcShard(cfg.buffer_size, ttl_s=cfg.lease_s, buffer=buf)
        self._server = EcServer(self._shard, cfg.host, cfg.base_port, tp_size=cfg.tp_size,
                                tp_rank=rank, dp_index=cfg.dp_index,
                                complete_wait_ms=cfg.complete_wait_ms,
                                curve_secret_key=cfg.curve["curve_server_secret_key"],
                                curve_clients=cfg.curve["curve_clients"],
                                owner_key=cfg.owner_key, event_host=cfg.event_host)
        logger.info("kvtier: encoder-cache shard %d: %d bytes, control port %d", rank,
                    cfg.buffer_size, self._server.port)

    def start_load_caches(self, encoder_cache, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        if self.kvtier_config.consumer:
            self.start_worker_services()
            m = EcMeta.decode(meta.consumer) if meta.consumer else EcMeta()
            buf = self._shard.buffer
            device = kwargs.get("device")

            def place(spec, offset, nbytes):
                dtype = _DTYPES.get(spec["dtype"])
                if dtype is None:
                    raise ValueError("kvtier: dtype %r of %s" % (spec["dtype"], spec["mm_hash"]))
                t = torch.frombuffer(buf, dtype=torch.uint8, count=nbytes, offset=offset)
                t = t.view(dtype).view(spec["shape"])
                if device is not None and torch.device(device).type != "cpu":
                    t = t.to(device, non_blocking=False)  # copied: no fence needed
                encoder_cache[spec["mm_hash"]] = t

            wm = self._server.apply(m, lambda h: h in encoder_cache, place)
            self._merge_report(wm)

    def start_save_caches(self, **kwargs: Any) -> None:
        """Producer: reserve on every consumer shard for this step's pushes (before the
        encoder output exists); items already in the encoder cache are bound at once."""
        if self._producer is None:
            return
        meta = self._get_connector_metadata()
        if not meta.producer:
            return
        encoder_cache = kwargs.get("encoder_cache") or {}
        pushes = EcMeta.decode(meta.producer).pushes
        self._producer.push_many(pushes)  # one reserve message per consumer shard for the step
        for p in pushes:
            t = encoder_cache.get(p["mm_hash"])
            if t is not None:
                self._bind(p["mm_hash"], t)
        self._producer.dispatch()

    def _bind(self, mm_hash, tensor):
        t = tensor.detach()
        if t.device.type != "cpu":
            t = t.to("cpu")  # synchronous: the bytes are final when bound
        t = t.contiguous()
        # typed: a push whose spec says another shape or dtype fails instead of landing as
        # bytes the consumer would read wrongly
        self._producer.bind_source_at(mm_hash, t.data_ptr(), t.numel() * t.element_size(), t,
                                      shape=tuple(t.shape),
                                      dtype=str(t.dtype).removeprefix("torch."))

    def save_caches(self, encoder_cache, mm_hash, **kwargs: Any) -> None:
        if self._producer is None or mm_hash not in encoder_cache:
            return
        self._bind(mm_hash, encoder_cache[mm_hash])
        self._producer.dispatch()  # writes and completes every push now ready

    def get_finished(self, finished_req_ids):
        return None, None

    def _merge_report(self, wm):
        if self._report is None:
            self._report = wm
        else:
            for which in ("loaded", "failed_loads", "reclaimed", "failed_saves"):
                for v in getattr(wm, which):
                    self._report.add(which, v)

    def build_connector_worker_meta(self):
        if self._producer is not None:
            if self._producer.pending:
                self._producer.dispatch()
            rep = self._producer.report()
            for f in self._producer.take_failures():
                logger.warning("kvtier: push of %s (transfer %s) failed: %s", f["mm_hash"],
                               f["transfer_id"], f["error"])
            self._merge_report(rep)
            if rep.pending_saves and self._report is not rep:
                self._report._m.pending_saves = True
            if not self._producer.pending:
                self._producer._sources.clear()
        wm, self._report = self._report, None
        if wm is None:
            return None
        return KvtierECWorkerMetadata(wm.encode())

    def shutdown(self):
        for o in (self._server, self._inbox, self._producer, self._net, self._sched,
                  self._planner):
            if o is not None:
                o.close()
        if self._shard is not None:
            try:
                self._shard.close()
            except Exception as e:  # a writer still owns memory: leave the buffer registered
                logger.warning("kvtier: encoder-cache shard not freed: %s", e)
        self._server = self._inbox = self._producer = self._net = self._sched = None
        self._planner = self._shard = None

    # -- scheduler side -----------------------------------------------------------------------

    def has_cache_item(self, identifier):
        if self._sched is None:
            return False
        self._inbox.step(self._sched)
        return self._sched.has_cache_item(identifier)

    def _push_spec(self, request, index, tid):
        from vllm.distributed.ec_transfer.ec_connector.encoder_output_width import (
            get_encoder_output_width)
        params = getattr(request, "ec_transfer_params", None) or {}
        consumer = params.get("consumer_zmq")
        if not consumer:
            return None
        mc = self._vllm_config.model_config
        dtype = str(mc.dtype).removeprefix("torch.")
        width = get_encoder_output_width(self._vllm_config, request.mm_features[index].modality)
        return {"mm_hash": request.mm_features[index].identifier,
                "shape": (request.get_num_encoder_embeds(index), width), "dtype": dtype,
                "consumer": str(consumer), "transfer_id": tid,
                "request_id": request.request_id}

    def _prepare(self, request, indices):
        for i, h, tid in _features(request):
            if i in indices:
                spec = self._push_spec(request, i, tid)
                if spec is not None:
                    self._planner.prepare(spec)

    def ensure_cache_available(self, request, num_computed_tokens):
        todo = set(_uncovered(request, num_computed_tokens))
        if self._planner is not None and todo:
            self._prepare(request, todo)
        if self._sched is None or not todo:
            return True
        self._inbox.step(self._sched)
        feats = [(h, tid) for i, h, tid in _features(request) if i in todo]
        return self._sched.ensure(request.request_id, feats)

    def update_state_after_alloc(self, request, index):
        if self._sched is not None:
            self._sched.cache_added(request.mm_features[index].identifier)
        if self._planner is not None:
            self._prepare(request, {index})

    def update_state_after_free(self, request, index):
        if self._sched is None:
            return
        for i, h, tid in _features(request):
            if i == index:
                self._sched.consumed(request.request_id, h, tid)

    def build_connector_meta(self, scheduler_output):
        cons = prod = b""
        if self._sched is not None:
            for h in scheduler_output.free_encoder_mm_hashes or ():
                self._sched.cache_freed(h)
            self._sched.expire()
            self._inbox.step(self._sched)  # readiness in, cancels out
            m = self._sched.build_meta()
            if m.loads or m.freed:
                cons = m.encode()
        if self._planner is not None:
            m = self._planner.build_meta()
            if m.pushes:
                prod = m.encode()
        return KvtierECConnectorMetadata(cons, prod)

    def update_connector_output(self, connector_output):
        meta = connector_output.ec_connector_worker_meta
        if not isinstance(meta, KvtierECWorkerMetadata) or not meta.data:
            return
        wm = EcWorkerMeta.decode(meta.data)
        if self._sched is not None:
            self._sched.apply_output(wm)
        if self._planner is not None:
            self._planner.apply_output(wm)

    def take_unavailable_requests(self):
        out = set()
        if self._sched is not None:
            out.update(self._sched.take_unavailable())
        if self._planner is not None:
            out.update(self._planner.take_failed())
        return out

    def has_pending_push_work(self):
        return self._planner is not None and self._planner.has_pending_push_work

    def request_finished(self, request):
        params = None
        if self._planner is not None:
            b = self._planner.bindings(request.request_id)
            if b:  # what vLLM's proxy hands the prefill instance: item -> transfer id
                params = {"ec_items": [{"mm_hash": x["mm_hash"], "transfer_id": x["transfer_id"]}
                                       for x in b]}
            self._planner.request_finished(request.request_id)
        if self._sched is not None:  # with the request's bindings: even unseen ones are cancelled
            params_in = getattr(request, "ec_transfer_params", None) or {}
            named = {str(it["transfer_id"]) for it in params_in.get("ec_items") or ()
                     if isinstance(it, dict) and it.get("transfer_id")}
            self._sched.request_finished(
                request.request_id, [(h, t) for _, h, t in _features(request) if t in named])
        return False, params

    def kvtier_stats(self):
        out = {}
        if self._sched is not None:
            out["scheduler"] = self._sched.stats()
            out["inbox"] = self._inbox.stats()
        if self._server is not None:
            out["server"] = self._server.stats()
        if self._producer is not None:
            out["producer"] = self._producer.stats()
        return out
