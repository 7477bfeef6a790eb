# SPDX-License-Identifier: Apache-2.0
"""Encoder-cache transfer across processes and hosts (kvtier/ec_net.h): a consumer shard's
server (EcServer: ZeroMQ control, UCX receives into its buffer), the producer's way to remote
consumers (EcNetConsumer, for EcProducer.over_network) and the consumer scheduler's link to its
shards (EcInbox: readiness events in, cancels out). See docs/ec.md."""
import ctypes

from . import _lib as L
from ._core import _check
from .ec import EcWorkerMeta, _getter, _Owned

_lib = L.lib


def _s(v):
    return v.encode() if isinstance(v, str) else v


class EcServer:
    """A consumer shard's control server (kvt_ec_server): ZeroMQ control socket at
    tcp://host:base_port + dp_index * tp_size + tp_rank, an event socket, and a UCX receive posted
    on every writer's region of the shard's buffer. From start on the shard belongs to the
    server's thread: the worker reaches it through apply()."""

    def __init__(self, shard, host, base_port, tp_size=1, tp_rank=0, dp_index=0,
                 complete_wait_ms=2000, curve_secret_key=None, curve_clients=None,
                 owner_key=None, event_host=None):
        """owner_key: the consumer's 32-hex-digit secret its scheduler's cancels must show
        (None: a random one, left in a private file for the inbox of this host and user);
        event_host: where readiness events are served (None: a unix socket only this user's
        processes on this host can reach; an address needs CURVE). complete_wait_ms is
        accepted and ignored: completions never wait."""
        cfg = L.kvt_ec_server_config()
        _lib.kvt_ec_server_config_init(ctypes.byref(cfg))
        self._keep = [_s(host), _s(curve_secret_key), _s(owner_key), _s(event_host)]
        cfg.owner_key, cfg.event_host = self._keep[2], self._keep[3]
        cfg.host = self._keep[0]
        cfg.base_port = base_port
        cfg.tp_size = tp_size
        cfg.tp_rank = tp_rank
        cfg.dp_index = dp_index
        cfg.complete_wait_ms = complete_wait_ms
        if curve_secret_key:
            cfg.curve_secret_key = self._keep[1]
        if curve_clients:
            arr = (ctypes.c_char_p * (len(curve_clients) + 1))(*[_s(k) for k in curve_clients],
                                                               None)
            self._keep.append(arr)
            cfg.curve_clients = arr
        h = ctypes.c_void_p()
        _check(_lib.kvt_ec_server_start(ctypes.byref(cfg), shard._h, ctypes.byref(h)))
        self._h = h
        self.shard = shard  # must outlive the server
        self._holds_cb = self._place_cb = None

    def close(self):
        h, self._h = getattr(self, "_h", None), None
        if h:
            _lib.kvt_ec_server_stop(h)

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    port = _getter("kvt_ec_server_port")

    event_port = _getter("kvt_ec_server_event_port",
                         "The event socket's TCP port; 0 when it is a unix socket (no "
                         "event_host).")

    event_endpoint = _getter("kvt_ec_server_event_endpoint",
                             "What a ZeroMQ PULL connects to for this shard's readiness events.",
                             text=True)

    def apply(self, meta, holds, place):
        """The consumer worker's step on this shard (kvt_ec_server_apply): holds(mm_hash) says
        whether the engine's encoder cache has the item, place(spec, offset, nbytes) puts a
        loaded item (bytes at offset of the shard's buffer, a dict spec with mm_hash, shape,
        dtype) into it. Returns the step's EcWorkerMeta. An exception in a callback fails that
        load (reported in failed_loads) and is raised after the step."""
        errors = []

        def _holds(_ctx, h, n, _view):
            try:
                return bool(holds(ctypes.string_at(h, n).decode()))
            except BaseException as e:  # never across C
                errors.append(e)
                return False

        def _place(_ctx, spec, view):
            try:
                sp = spec.contents
                place({"mm_hash": sp.mm_hash.ptr[:sp.mm_hash.len].decode(),
                       "shape": tuple(sp.shape[i] for i in range(sp.ndim)),
                       "dtype": sp.dtype.ptr[:sp.dtype.len].decode(),
                       "transfer_id": sp.transfer_id.ptr[:sp.transfer_id.len].decode()},
                      view.contents.offset, view.contents.nbytes)
                return 0
            except BaseException as e:
                errors.append(e)
                return -22  # KVT_EINVAL: this load failed
        ops = L.kvt_ec_cache_ops(L.EC_HOLDS(_holds), L.EC_PLACE(_place), None, None)
        wm = EcWorkerMeta()
        rc = _lib.kvt_ec_server_apply(self._h, ctypes.byref(meta._m), ctypes.byref(ops),
                                      ctypes.byref(wm._m))
        if errors:
            raise errors[0]
        _check(rc)
        return wm

    def stats(self):
        st = L.kvt_ec_server_stats()
        _lib.kvt_ec_server_get_stats(self._h, ctypes.byref(st))
        return {n: getattr(st, n) for n in L.EC_SERVER_COUNTERS}


class EcNetConsumer(_Owned):
    """A producer's view of remote consumers (kvt_ec_net_consumer): reserve, complete and cancel
    over ZeroMQ to their control servers, the bytes over UCX. One per producer thread."""
    _destroy = _lib.kvt_ec_net_consumer_destroy

    def __init__(self, control_timeout_ms=30000, write_timeout_ms=30000, curve_server_key=None,
                 curve_public_key=None, curve_secret_key=None):
        cfg = L.kvt_ec_net_config()
        _lib.kvt_ec_net_config_init(ctypes.byref(cfg))
        cfg.control_timeout_ms = control_timeout_ms
        cfg.write_timeout_ms = write_timeout_ms
        self._keep = [_s(curve_server_key), _s(curve_public_key), _s(curve_secret_key)]
        cfg.curve_server_key, cfg.curve_public_key, cfg.curve_secret_key = self._keep
        h = ctypes.c_void_p()
        _check(_lib.kvt_ec_net_consumer_create(ctypes.byref(cfg), ctypes.byref(h)))
        self._h = h

    def ops(self):
        return _lib.kvt_ec_net_consumer_ops(self._h)


class EcInbox(_Owned):
    """The consumer scheduler's link to its own shards (kvt_ec_inbox): a background thread
    discovers them (consumer = shard 0's tcp://host:port), receives their readiness events and
    sends the scheduler's cancels; step(sched) never waits on the network."""
    _destroy = _lib.kvt_ec_inbox_destroy

    def __init__(self, consumer, control_timeout_ms=30000, retry_ms=1000,
                 curve_server_key=None, curve_public_key=None, curve_secret_key=None,
                 owner_key=None, event_host=None):
        cfg = L.kvt_ec_inbox_config()
        _lib.kvt_ec_inbox_config_init(ctypes.byref(cfg))
        self._keep = [_s(consumer), _s(curve_server_key), _s(curve_public_key),
                      _s(curve_secret_key), _s(owner_key), _s(event_host)]
        cfg.consumer = self._keep[0]
        cfg.control_timeout_ms = control_timeout_ms
        cfg.retry_ms = retry_ms
        cfg.curve_server_key, cfg.curve_public_key, cfg.curve_secret_key = self._keep[1:4]
        cfg.owner_key, cfg.event_host = self._keep[4:6]
        h = ctypes.c_void_p()
        _check(_lib.kvt_ec_inbox_create(ctypes.byref(cfg), ctypes.byref(h)))
        self._h = h

    def step(self, sched):
        """Events received so far into sched (an EcScheduler), its queued cancels out; returns
        how many events were delivered."""
        return _check(_lib.kvt_ec_inbox_step(self._h, sched._h))

    def stats(self):
        st = L.kvt_ec_inbox_stats()
        _lib.kvt_ec_inbox_get_stats(self._h, ctypes.byref(st))
        out = {n: getattr(st, n) for n in L.EC_INBOX_COUNTERS}
        out["shards"] = st.shards
        return out
