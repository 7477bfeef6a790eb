# SPDX-License-Identifier: Apache-2.0
"""Encoder-cache transfer (vLLM ECMooncakeConnector semantics): the consumer shard, the
consumer scheduler, the producer and its push planning, their metadata, and the network
between instances.

In one process a Producer reaches its consumer's shards directly (EcProducer over EcShard
objects, kvt_ec_local_consumer_ops). Across processes and hosts (kvtier/ec_net.h): each consumer
shard runs an EcServer (ZeroMQ control, UCX receives into its buffer), a producer pushes through
EcProducer.over_network (ZeroMQ + UCX to the consumer's servers), and the consumer scheduler
learns readiness and sends cancels through an EcInbox; those three live in kvtier.ec_net. Times
are seconds; a ManualClock lets tests drive every deadline. See docs/ec.md for the state
machines.
"""
import ctypes

from . import _lib as L
from ._core import _Message, _address, _check

_lib = L.lib


def _b(s):
    return s.encode() if isinstance(s, str) else bytes(s)


def _text(c_chars):
    return bytes(c_chars).split(b"\0", 1)[0].decode()


def _item(mm_hash, shape, dtype, keep):
    """A kvt_ec_item for (mm_hash, shape, dtype); keep holds the encoded strings alive."""
    h, d = _b(mm_hash), _b(dtype)
    keep.extend((h, d))
    it = L.kvt_ec_item()
    it.mm_hash, it.mm_hash_len = h, len(h)
    it.dtype, it.dtype_len = d, len(d)
    it.ndim = len(shape)
    for i, x in enumerate(shape):
        it.shape[i] = x
    size = _lib.kvt_dtype_size(d, len(d))
    for x in shape:
        size *= x
    it.nbytes = size
    return it


class ManualClock:
    """A clock that moves only when told to (tests); give it to the components' clock=."""

    def __init__(self, start_s=0.0):
        self._mc = L.kvt_manual_clock()
        self.c = _lib.kvt_clock_manual(ctypes.byref(self._mc), int(start_s * 1e9))

    def advance(self, seconds):
        _lib.kvt_clock_manual_advance(ctypes.byref(self._mc), int(seconds * 1e9))


def _clock(clock):
    return clock.c if clock is not None else _lib.kvt_clock_monotonic()


def _prometheus(fn, h):
    n = ctypes.c_size_t(0)
    fn(h, None, 0, ctypes.byref(n))
    buf = ctypes.create_string_buffer(n.value + 1)
    _check(fn(h, buf, len(buf), ctypes.byref(n)))
    return buf.value.decode()


def _keys(fn, h):
    out, buf = [], (L.KEYS * 64)()
    while True:
        n = fn(h, buf, 64)
        out.extend(_text(buf[i]) for i in range(n))
        if n < 64:
            return out


_Owned = L.Handle
_getter = L.Handle.getter


# ---- metadata -----------------------------------------------------------------------------------

class EcMeta(_Message):
    """Scheduler -> worker metadata of one step (kvt_ec_meta): loads, pushes, freed."""

    _kind = "kvt_ec_meta"

    @staticmethod
    def _spec(s, push):
        d = {"mm_hash": s.mm_hash.ptr[:s.mm_hash.len].decode(), "nbytes": s.nbytes,
             "shape": tuple(s.shape[i] for i in range(s.ndim)),
             "dtype": s.dtype.ptr[:s.dtype.len].decode(),
             "transfer_id": s.transfer_id.ptr[:s.transfer_id.len].decode()}
        if push:
            d["consumer"] = s.consumer_zmq.ptr[:s.consumer_zmq.len].decode()
            d["request_id"] = s.request_id.ptr[:s.request_id.len].decode() if s.request_id.len \
                else ""
        else:
            d["local"] = bool(s.local)
        return d

    @property
    def loads(self):
        return [self._spec(self._m.loads[i], False) for i in range(self._m.n_loads)]

    @property
    def pushes(self):
        return [self._spec(self._m.pushes[i], True) for i in range(self._m.n_pushes)]

    @property
    def freed(self):
        """The step's freed hashes, or None ("retire every resident no longer in use")."""
        if not self._m.has_freed:
            return None
        return [self._m.freed[i].ptr[:self._m.freed[i].len].decode()
                for i in range(self._m.n_freed)]


class EcWorkerMeta(_Message):
    """Worker -> scheduler report (kvt_ec_worker_meta)."""

    _kind = "kvt_ec_worker_meta"

    @staticmethod
    def _set(ss):
        return {ss.items[i].ptr[:ss.items[i].len].decode() for i in range(ss.n)}

    loaded = property(lambda self: self._set(self._m.loaded))
    failed_loads = property(lambda self: self._set(self._m.failed_loads))
    reclaimed = property(lambda self: self._set(self._m.reclaimed))
    failed_saves = property(lambda self: self._set(self._m.failed_saves))
    pending_saves = property(lambda self: bool(self._m.pending_saves))

    def add(self, which, value):
        """which: "loaded", "failed_loads", "reclaimed" or "failed_saves"."""
        idx = ("loaded", "failed_loads", "reclaimed", "failed_saves").index(which)
        v = _b(value)
        _check(_lib.kvt_ec_worker_meta_add(ctypes.byref(self._m), idx, v, len(v)))

    def aggregate(self, other):
        """self = aggregate(self, other): loaded intersected, the rest united or or-ed."""
        _check(_lib.kvt_ec_worker_meta_aggregate(ctypes.byref(self._m), ctypes.byref(other._m)))


# ---- consumer shard ------------------------------------------------------------------------------

class EcShard(_Owned):
    """One consumer shard's receive side: the registered buffer (a bytearray it allocates),
    reservations and the resident pool (kvt_ec_shard)."""
    _destroy = _lib.kvt_ec_shard_destroy

    def __init__(self, capacity, ttl_s=300.0, clock=None, buffer=None):
        """buffer: the registered receive buffer to use (anything with a writable buffer, a
        torch tensor or a numpy array, of at least capacity bytes; kept alive by the shard);
        default: a bytearray of its own."""
        if buffer is None:
            self.buffer = (ctypes.c_char * capacity)()
            base = ctypes.addressof(self.buffer)
        else:
            base, nbytes, _dev = _address(buffer)
            if nbytes < capacity:
                raise ValueError("kvtier: shard buffer of %d bytes is smaller than capacity %d"
                                 % (nbytes, capacity))
            self.buffer = (ctypes.c_char * capacity).from_address(base)
            self._owner = buffer
        cfg = L.kvt_ec_shard_config()
        _lib.kvt_ec_shard_config_init(ctypes.byref(cfg))
        cfg.base = base
        cfg.capacity = capacity
        cfg.ttl_ns = int(ttl_s * 1e9)
        cfg.clock = _clock(clock)
        self._clock = clock
        h = ctypes.c_void_p()
        _check(_lib.kvt_ec_shard_create(ctypes.byref(cfg), ctypes.byref(h)))
        self._h = h

    def close(self):
        if getattr(self, "_h", None):
            _check(_lib.kvt_ec_shard_destroy(self._h))  # KvtierError while a writer is active
            self._h = None

    def reserve(self, transfer_id, mm_hash, shape, dtype):
        """reserve: {reservation_id, offset, nbytes, write, ready, cached, cancelled}."""
        keep = []
        it = _item(mm_hash, shape, dtype, keep)
        t = _b(transfer_id)
        r = L.kvt_ec_reply()
        _check(_lib.kvt_ec_shard_reserve(self._h, t, len(t), ctypes.byref(it), ctypes.byref(r)))
        return {"reservation_id": r.reservation_id.decode(), "offset": r.offset,
                "nbytes": r.nbytes, "write": r.write, "ready": r.ready, "cached": r.cached,
                "cancelled": r.cancelled}

    def write(self, reply, data):
        """What a producer's one-sided write does: data into the reserved region."""
        if len(data) > reply["nbytes"]:
            raise ValueError("kvtier: data larger than the reservation")
        ctypes.memmove(ctypes.addressof(self.buffer) + reply["offset"], bytes(data), len(data))

    def complete(self, transfer_id, reservation_id):
        """(accepted, became_ready)."""
        t, r = _b(transfer_id), _b(reservation_id)
        a, b = ctypes.c_bool(), ctypes.c_bool()
        _check(_lib.kvt_ec_shard_complete(self._h, t, len(t), r, ctypes.byref(a),
                                          ctypes.byref(b)))
        return a.value, b.value

    def cancel(self, transfer_id, reservation_id="", abandon=False, refresh=False):
        t, r = _b(transfer_id), _b(reservation_id)
        done = ctypes.c_bool()
        _check(_lib.kvt_ec_shard_cancel(self._h, t, len(t), r, abandon, refresh,
                                        ctypes.byref(done)))
        return done.value

    def expire(self):
        _lib.kvt_ec_shard_expire(self._h)

    def take(self, transfer_id, mm_hash):
        """take: the pushed bytes (a memoryview into the buffer) of a READY transfer."""
        t, h = _b(transfer_id), _b(mm_hash)
        v = L.kvt_slab_view()
        _check(_lib.kvt_ec_shard_take(self._h, t, len(t), h, len(h), None, ctypes.byref(v)))
        return memoryview(self.buffer)[v.offset:v.offset + v.nbytes].cast("B")

    def take_resident(self, mm_hash, shape, dtype):
        keep = []
        it = _item(mm_hash, shape, dtype, keep)
        v = L.kvt_slab_view()
        _check(_lib.kvt_ec_shard_take_resident(self._h, ctypes.byref(it), ctypes.byref(v)))
        return memoryview(self.buffer)[v.offset:v.offset + v.nbytes].cast("B")

    def retire(self, mm_hash):
        h = _b(mm_hash)
        rc = _lib.kvt_ec_shard_retire(self._h, h, len(h), None)
        _check(rc if rc < 0 else 0)
        return rc == 1

    def state(self, transfer_id):
        t = _b(transfer_id)
        names = ("none", "writing", "ready", "cancel_pending", "expire_pending", "cancelled",
                 "expired")
        return names[_lib.kvt_ec_shard_state(self._h, t, len(t))]

    def events(self):
        """Readiness (and abandoned) events since the last call, as dicts."""
        out, buf = [], (L.kvt_ec_ready_event * 64)()
        while True:
            n = _lib.kvt_ec_shard_take_events(self._h, buf, 64)
            out.extend({"transfer_id": _text(e.transfer_id), "mm_hash": _text(e.mm_hash),
                        "reservation_id": _text(e.reservation_id), "nbytes": e.nbytes,
                        "shape": tuple(e.shape[:e.ndim]), "dtype": _text(e.dtype),
                        "abandoned": e.abandoned} for e in buf[:n])
            if n < 64:
                return out

    def reclaimed(self):
        return _keys(_lib.kvt_ec_shard_take_reclaimed, self._h)

    writers = _getter("kvt_ec_shard_writers")

    def stats(self):
        s = L.kvt_ec_shard_stats()
        _lib.kvt_ec_shard_get_stats(self._h, ctypes.byref(s))
        return {n: getattr(s, n) for n in L.fields(L.kvt_ec_shard_stats)}

    def prometheus(self):
        return _prometheus(_lib.kvt_ec_shard_prometheus, self._h)


# ---- consumer scheduler ----------------------------------------------------------------------------

class EcScheduler(_Owned):
    """The consumer scheduler's transfer table (kvt_ec_sched)."""
    _destroy = _lib.kvt_ec_sched_destroy

    def __init__(self, shards=1, push_wait_s=60.0, lease_s=300.0, resident_capacity=10**9,
                 clock=None):
        cfg = L.kvt_ec_sched_config()
        _lib.kvt_ec_sched_config_init(ctypes.byref(cfg))
        cfg.shards = shards
        cfg.push_wait_ns = int(push_wait_s * 1e9)
        cfg.lease_ns = int(lease_s * 1e9)
        cfg.resident_capacity = resident_capacity
        cfg.clock = _clock(clock)
        self._clock = clock
        h = ctypes.c_void_p()
        _check(_lib.kvt_ec_sched_create(ctypes.byref(cfg), ctypes.byref(h)))
        self._h = h

    def observe_ready(self, transfer_id, mm_hash, shape, dtype, shard):
        keep = []
        t = _b(transfer_id)
        ev = L.kvt_ec_ready(t, len(t), _item(mm_hash, shape, dtype, keep), shard)
        _check(_lib.kvt_ec_sched_observe_ready(self._h, ctypes.byref(ev)))

    def observe_abandoned(self, transfer_id):
        t = _b(transfer_id)
        _check(_lib.kvt_ec_sched_observe_abandoned(self._h, t, len(t)))

    def has_cache_item(self, mm_hash):
        h = _b(mm_hash)
        return bool(_lib.kvt_ec_sched_has_cache_item(self._h, h, len(h)))

    @staticmethod
    def _features(features, keep):
        arr = (L.kvt_ec_feature * max(1, len(features)))()
        for i, (h, t) in enumerate(features):
            hb = _b(h)
            tb = _b(t) if t else None
            keep.extend((hb, tb))
            arr[i] = L.kvt_ec_feature(hb, len(hb), tb, len(tb) if tb else 0)
        return arr

    def ensure(self, req_id, features):
        """ensure_cache_available: features = [(mm_hash, transfer_id or None)]; True when every
        feature is available this step."""
        keep = []
        r = _b(req_id)
        arr = self._features(features, keep)
        ok = ctypes.c_bool()
        _check(_lib.kvt_ec_sched_ensure(self._h, r, len(r), arr, len(features),
                                        ctypes.byref(ok)))
        return ok.value

    def cache_added(self, mm_hash):
        h = _b(mm_hash)
        _check(_lib.kvt_ec_sched_cache_added(self._h, h, len(h)))

    def cache_freed(self, mm_hash):
        h = _b(mm_hash)
        _check(_lib.kvt_ec_sched_cache_freed(self._h, h, len(h)))

    def consumed(self, req_id, mm_hash, transfer_id=None):
        keep = []
        r = _b(req_id)
        arr = self._features([(mm_hash, transfer_id)], keep)
        _check(_lib.kvt_ec_sched_consumed(self._h, r, len(r), arr))

    def request_finished(self, req_id, bindings=None):
        """bindings: the request's [(mm_hash, transfer_id)] (its ec_items): transfers named
        there that the table never saw are cancelled on the shards too."""
        r = _b(req_id)
        if not bindings:
            _check(_lib.kvt_ec_sched_request_finished(self._h, r, len(r)))
            return
        keep = []
        arr = self._features(bindings, keep)
        _check(_lib.kvt_ec_sched_request_finished_bound(self._h, r, len(r), arr, len(bindings)))

    def build_meta(self):
        m = EcMeta()
        _check(_lib.kvt_ec_sched_build_meta(self._h, ctypes.byref(m._m)))
        return m

    def apply_output(self, worker_meta):
        _check(_lib.kvt_ec_sched_apply_output(self._h, ctypes.byref(worker_meta._m)))

    def expire(self):
        _lib.kvt_ec_sched_expire(self._h)

    def take_unavailable(self):
        return _keys(_lib.kvt_ec_sched_take_unavailable, self._h)

    def take_cancels(self):
        return _keys(_lib.kvt_ec_sched_take_cancels, self._h)

    def state(self, transfer_id):
        t = _b(transfer_id)
        return L.EC_TSTATES[_lib.kvt_ec_sched_state(self._h, t, len(t))]

    def stats(self):
        s = L.kvt_ec_sched_stats()
        _lib.kvt_ec_sched_get_stats(self._h, ctypes.byref(s))
        out = {n: getattr(s, n) for n in L.EC_SCHED_COUNTERS}
        out["transfers"] = {L.EC_TSTATES[i]: s.transfers[i] for i in range(1, len(L.EC_TSTATES))}
        out["requests"] = s.requests
        return out

    def prometheus(self):
        return _prometheus(_lib.kvt_ec_sched_prometheus, self._h)


# ---- producer -------------------------------------------------------------------------------------

def _push_spec(spec, keep):
    """A kvt_ec_push_spec from a dict {mm_hash, shape, dtype, consumer, transfer_id,
    request_id}; nbytes is derived from shape and dtype unless given."""
    s = L.kvt_ec_push_spec()
    fields = (("mm_hash", "mm_hash"), ("dtype", "dtype"), ("consumer_zmq", "consumer"),
              ("transfer_id", "transfer_id"), ("request_id", "request_id"))
    for cf, pf in fields:
        v = _b(spec.get(pf, ""))
        keep.append(v)
        setattr(s, cf, L.kvt_str(v, len(v)))
    s.ndim = len(spec["shape"])
    size = _lib.kvt_dtype_size(_b(spec["dtype"]), len(_b(spec["dtype"])))
    for i, x in enumerate(spec["shape"]):
        s.shape[i] = x
        size *= x
    s.nbytes = spec.get("nbytes", size)
    return s


class EcProducer(_Owned):
    """The producer worker's push records (kvt_ec_producer), pushing into consumer shards in
    this process (EcShard objects)."""
    _destroy = _lib.kvt_ec_producer_destroy

    def __init__(self, shards, refresh_age_s=150.0, clock=None):
        self._shards = list(shards)
        self._lc = L.kvt_ec_local_consumer()
        for i, sh in enumerate(self._shards):
            self._lc.shards[i] = sh._h
        self._lc.n = len(self._shards)
        self._create(_lib.kvt_ec_local_consumer_ops(ctypes.byref(self._lc)), refresh_age_s, clock)

    @classmethod
    def over_network(cls, net, refresh_age_s=150.0):
        """An EcProducer whose pushes go to remote consumers through net (an EcNetConsumer,
        kvtier.ec_net): the push specs name each consumer by its control address."""
        self = cls.__new__(cls)
        self._shards = []
        self._net = net
        self._create(net.ops(), refresh_age_s, None)
        return self

    def _create(self, ops, refresh_age_s, clock):
        cfg = L.kvt_ec_producer_config()
        _lib.kvt_ec_producer_config_init(ctypes.byref(cfg))
        cfg.ops = ops
        cfg.refresh_age_ns = int(refresh_age_s * 1e9)
        cfg.clock = _clock(clock)
        self._clock = clock
        self._sources = {}
        h = ctypes.c_void_p()
        _check(_lib.kvt_ec_producer_create(ctypes.byref(cfg), ctypes.byref(h)))
        self._h = h

    def push(self, spec):
        keep = []
        s = _push_spec(spec, keep)
        _check(_lib.kvt_ec_producer_push(self._h, ctypes.byref(s)))

    def push_many(self, specs):
        """push for a whole step: the new records' reserves go in one message per shard."""
        specs = list(specs)
        if not specs:
            return
        keep = []
        arr = (L.kvt_ec_push_spec * len(specs))()
        for i, spec in enumerate(specs):
            arr[i] = _push_spec(spec, keep)
        _check(_lib.kvt_ec_producer_push_many(self._h, arr, len(specs)))

    def bind_source(self, mm_hash, data, shape=None, dtype=None):
        """save_caches: the encoder output of mm_hash (bytes-like); kept alive here until the
        pushes that read it are done. With shape and dtype (e.g. (576, 4096), "float16") each
        push of mm_hash that says otherwise fails instead of being bound. Returns how many
        pushes it was bound to."""
        buf = ctypes.create_string_buffer(bytes(data), len(data))
        return self._bind(mm_hash, ctypes.addressof(buf), len(data), buf, shape, dtype)

    def bind_source_at(self, mm_hash, address, nbytes, owner, shape=None, dtype=None):
        """bind_source without a copy: the encoder output at address (nbytes), kept valid by
        holding owner (a tensor) until the pushes that read it are done; shape and dtype as for
        bind_source."""
        return self._bind(mm_hash, address, nbytes, owner, shape, dtype)

    def _bind(self, mm_hash, address, nbytes, owner, shape, dtype):
        """Binds nbytes at address as mm_hash's output, owner kept alive meanwhile; typed when
        shape and dtype are given (both or neither)."""
        if (shape is None) != (dtype is None):
            raise ValueError("kvtier: bind_source: give shape and dtype together")
        h = _b(mm_hash)
        desc = None
        if shape is not None:
            shape = tuple(int(d) for d in shape)
            if len(shape) > L.EC_MAX_DIMS:
                raise ValueError("kvtier: bind_source: %d dimensions, at most %d"
                                 % (len(shape), L.EC_MAX_DIMS))
            desc = L.kvt_ec_source_desc(len(shape), (L.c_u64 * L.EC_MAX_DIMS)(*shape),
                                           _b(dtype))
        self._sources.setdefault(mm_hash, []).append(owner)
        if desc is None:
            rc = _lib.kvt_ec_producer_bind_source(self._h, h, len(h), address, nbytes, None)
        else:
            rc = _lib.kvt_ec_producer_bind_source_typed(self._h, h, len(h), address, nbytes,
                                                        ctypes.byref(desc), None)
        _check(rc if rc < 0 else 0)
        return rc

    def dispatch(self):
        rc = _lib.kvt_ec_producer_dispatch(self._h)
        _check(rc if rc < 0 else 0)
        if not self.pending:
            self._sources.clear()
        return rc

    def request_finished(self, req_id):
        r = _b(req_id)
        _check(_lib.kvt_ec_producer_request_finished(self._h, r, len(r)))

    @property
    def pending(self):
        return bool(_lib.kvt_ec_producer_pending(self._h))

    def report(self):
        wm = EcWorkerMeta()
        _check(_lib.kvt_ec_producer_report(self._h, ctypes.byref(wm._m)))
        return wm

    def take_failures(self):
        out, buf = [], (L.kvt_ec_push_failure * 16)()
        while True:
            n = _lib.kvt_ec_producer_take_failures(self._h, buf, 16)
            out.extend({"mm_hash": _text(f.mm_hash), "transfer_id": _text(f.transfer_id),
                        "error": _text(f.error)} for f in buf[:n])
            if n < 16:
                return out

    def state(self, transfer_id):
        t = _b(transfer_id)
        names = ("none", "waiting_inputs", "writing", "notifying", "done", "cancel_pending",
                 "cancelled", "failed")
        return names[_lib.kvt_ec_producer_state(self._h, t, len(t))]

    def stats(self):
        s = L.kvt_ec_producer_stats()
        _lib.kvt_ec_producer_get_stats(self._h, ctypes.byref(s))
        return {n: getattr(s, n) for n in L.EC_PRODUCER_COUNTERS}

    def prometheus(self):
        return _prometheus(_lib.kvt_ec_producer_prometheus, self._h)


class EcPlanner(_Owned):
    """The producer scheduler's push planning (kvt_ec_planner)."""
    _destroy = _lib.kvt_ec_planner_destroy

    def __init__(self, max_prepared=0):
        h = ctypes.c_void_p()
        _check(_lib.kvt_ec_planner_create(max_prepared, ctypes.byref(h)))
        self._h = h

    def prepare(self, spec):
        """True if newly prepared (see EcProducer.push for the spec dict)."""
        keep = []
        s = _push_spec(spec, keep)
        rc = _lib.kvt_ec_planner_prepare(self._h, ctypes.byref(s))
        _check(rc if rc < 0 else 0)
        return rc == 1

    def build_meta(self):
        m = EcMeta()
        _check(_lib.kvt_ec_planner_build_meta(self._h, ctypes.byref(m._m)))
        return m

    def bindings(self, req_id):
        r = _b(req_id)
        buf = (L.kvt_ec_binding * 64)()
        n = _lib.kvt_ec_planner_bindings(self._h, r, len(r), buf, 64)
        return [{"mm_hash": _text(b.mm_hash), "transfer_id": _text(b.transfer_id)}
                for b in buf[:n]]

    def request_finished(self, req_id):
        r = _b(req_id)
        _check(_lib.kvt_ec_planner_request_finished(self._h, r, len(r)))

    def apply_output(self, worker_meta):
        _check(_lib.kvt_ec_planner_apply_output(self._h, ctypes.byref(worker_meta._m)))

    @property
    def has_pending_push_work(self):
        return bool(_lib.kvt_ec_planner_has_pending_push_work(self._h))

    def take_failed(self):
        return _keys(_lib.kvt_ec_planner_take_failed, self._h)
