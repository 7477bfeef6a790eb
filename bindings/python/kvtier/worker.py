# SPDX-License-Identifier: Apache-2.0
"""The worker side, per rank: the KV cache's layout (Layout), the host tier's pinned
mirror (Mirror), the worker that moves blocks (Worker), and the scheduler-worker link across
processes (LinkScheduler, LinkWorker)."""
import ctypes

from . import _lib as L
from ._core import _Handle, _address, _check, _getter, _u32_array
from .offload import OffloadMeta, WorkerMeta

_lib = L.lib

class Layout(_Handle):
    """The KV cache of one rank as regions of equally strided blocks (kvt_layout)."""
    _destroy = _lib.kvt_layout_destroy

    def __init__(self, num_blocks, device=L.HOST_DEVICE):
        h = ctypes.c_void_p()
        _check(_lib.kvt_layout_create(device, num_blocks, ctypes.byref(h)))
        self._h = h
        self._buffers = []  # keep the memory alive as long as the layout
        self.num_blocks = num_blocks

    def add_tensor(self, obj, block_dim_size, block_stride, size_bytes=0):
        """A KV tensor whose storage is obj (buffer, numpy array or torch tensor): the block
        dimension has block_dim_size entries block_stride bytes apart (spec §3.1).
        size_bytes: the tensor's configured size when the storage is padded beyond it (the
        padding never becomes a region); 0: the storage's size."""
        addr, nbytes, dev = _address(obj)
        t = L.kvt_kv_tensor(dev, addr, nbytes, block_dim_size, block_stride, size_bytes)
        _check(_lib.kvt_layout_add_tensor(self._h, ctypes.byref(t)))
        self._buffers.append(obj)

    def add_buffer(self, obj, block_bytes):
        """obj holds num_blocks blocks of block_bytes, one after the other: one region."""
        addr, nbytes, _dev = _address(obj)
        if nbytes < self.num_blocks * block_bytes:
            raise ValueError("kvtier: buffer of %d bytes holds fewer than %d blocks of %d" % (
                nbytes, self.num_blocks, block_bytes))
        _check(_lib.kvt_layout_add_region(self._h, addr, block_bytes))
        self._buffers.append(obj)

    num_regions = _getter("kvt_layout_num_regions")

    block_bytes = _getter("kvt_layout_block_bytes")


class Mirror(_Handle):
    """The host tier of one rank: a host array per region of the layout (kvt_mirror)."""
    _destroy = _lib.kvt_mirror_destroy

    def __init__(self, layout, host_blocks, pin=True, node_name=None, node_group=None,
                 numa_node=-1, node_dir=None):
        """node_name: the data region of that node tier (host_blocks: its num_slots);
        node_group: the node tier's sharing group (Node's group); numa_node: the NUMA node
        whose memory holds the mirror (-1: no preference)."""
        cfg = L.kvt_mirror_config()
        _lib.kvt_mirror_config_init(ctypes.byref(cfg))
        cfg.host_blocks = host_blocks
        cfg.pin = pin
        cfg.numa_node = numa_node
        self._node_name = node_name.encode() if node_name else None
        cfg.node_name = self._node_name
        self._node_group = node_group.encode() if node_group else None
        cfg.node_group = self._node_group
        self._node_dir = node_dir.encode() if node_dir else None
        cfg.node_dir = self._node_dir
        h = ctypes.c_void_p()
        _check(_lib.kvt_mirror_create(ctypes.byref(cfg), layout._h, ctypes.byref(h)))
        self._h = h
        self._layout = layout

    def layout(self):
        """A host Layout over the mirror's arrays: what a three-tier Disk is created over."""
        h = ctypes.c_void_p()
        _check(_lib.kvt_mirror_layout(self._h, ctypes.byref(h)))
        lay = Layout.__new__(Layout)
        lay._h = h
        lay._buffers = [self]  # the mirror's memory must outlive the layout
        lay.num_blocks = _lib.kvt_mirror_num_blocks(self._h)
        return lay

    def block(self, region, block):
        """A memoryview of one host block of one region (valid while the mirror lives)."""
        if region >= _lib.kvt_mirror_num_regions(self._h):
            raise IndexError("region %d" % region)
        if block >= _lib.kvt_mirror_num_blocks(self._h):
            raise IndexError("block %d" % block)
        r = _lib.kvt_mirror_regions(self._h)[region]
        return memoryview((ctypes.c_char * r.block_bytes).from_address(
            r.base + block * r.block_bytes)).cast("B")


class Worker(_Handle):
    """The worker side of one rank (kvt_worker) over a layout and its mirror."""
    _destroy = _lib.kvt_worker_destroy

    def __init__(self, layout, mirror=None, rank=0, threads=0, disk=None):
        """A worker over layout whose tier is mirror (host memory) or disk (a Disk)."""
        cfg = L.kvt_worker_config()
        _lib.kvt_worker_config_init(ctypes.byref(cfg))
        cfg.rank = rank
        cfg.copy.threads = threads
        h = ctypes.c_void_p()
        if (mirror is None) == (disk is None):
            raise ValueError("kvtier: give a Worker either a mirror or a disk")
        if disk is not None:
            _check(_lib.kvt_worker_create_disk(ctypes.byref(cfg), layout._h, disk._h,
                                               ctypes.byref(h)))
        else:
            _check(_lib.kvt_worker_create(ctypes.byref(cfg), layout._h, mirror._h,
                                          ctypes.byref(h)))
        self._h = h
        self._keep = (layout, mirror, disk)
        self._meta = None

    def attach_disk(self, disk, tier=1):
        """disk (a Disk over mirror.layout()) as tier `tier` behind this worker's mirror: 1 the
        disk of the manager's disk_blocks, 2 and 3 those of OffloadManager.add_tier."""
        _check(_lib.kvt_worker_attach_disk_tier(self._h, tier, disk._h))
        self._keep = self._keep + (disk,)

    def attach_remote(self, remote, tier):
        """remote (a Remote serving this worker's mirror) as tier `tier` (the manager's
        remote_tier): the worker reads the remote hits' blocks into the mirror, on a thread of
        its own."""
        _check(_lib.kvt_worker_attach_remote(self._h, tier, remote._h))
        self._keep = self._keep + (remote,)

    def bind(self, meta):
        """bind_connector_metadata (meta: OffloadMeta, kept until clear)."""
        _check(_lib.kvt_worker_bind(self._h, ctypes.byref(meta._m)))
        self._meta = meta

    def handle_preemptions(self):
        _check(_lib.kvt_worker_handle_preemptions(self._h))

    def get_finished(self, stream=None):
        """Launches this step's copies (after a compute point on stream, a CUstream handle as
        an int, e.g. torch.cuda.current_stream().cuda_stream) and returns the request ids
        whose loads finished."""
        reqs = L.P(L.kvt_str)()
        n = L.c_u32()
        _check(_lib.kvt_worker_get_finished(self._h, stream, ctypes.byref(reqs),
                                            ctypes.byref(n)))
        return [reqs[i].ptr[:reqs[i].len].decode() for i in range(n.value)]

    def build_meta(self):
        wm = WorkerMeta()
        _check(_lib.kvt_worker_build_meta(self._h, ctypes.byref(wm._m)))
        return wm

    def take_invalid_blocks(self):
        out = []
        buf = (L.c_u32 * 256)()
        while True:
            n = _lib.kvt_worker_take_invalid_blocks(self._h, buf, 256)
            out.extend(buf[:n])
            if n < 256:
                return out

    def clear(self):
        _lib.kvt_worker_clear(self._h)
        self._meta = None

    def flush(self):
        _check(_lib.kvt_worker_flush(self._h))

class LinkScheduler(_Handle):
    """The scheduler end of the scheduler <-> worker link over ZeroMQ (kvt_link_sched)."""
    _destroy = _lib.kvt_link_sched_destroy

    def __init__(self, endpoint, world_size):
        h = ctypes.c_void_p()
        _check(_lib.kvt_link_sched_create(endpoint.encode(), world_size, ctypes.byref(h)))
        self._h = h

    def accept(self, timeout_ms=30000):
        """Waits for every rank's hello; returns the smallest host tier any rank allocated."""
        blocks = L.c_u32()
        _check(_lib.kvt_link_sched_accept(self._h, timeout_ms, ctypes.byref(blocks)))
        return blocks.value

    def step(self, meta, payload=b"", timeout_ms=30000):
        """Sends meta (and an opaque payload) to every rank and aggregates their replies:
        (finished load request ids, WorkerMeta of the summed store reports, invalid GPU
        blocks)."""
        res = L.kvt_link_result()
        _check(_lib.kvt_link_sched_step(self._h, ctypes.byref(meta._m), payload, len(payload),
                                        timeout_ms, ctypes.byref(res)))
        finished = [res.finished_loads[i].ptr[:res.finished_loads[i].len].decode()
                    for i in range(res.n_finished)]
        stores = WorkerMeta()
        _check(_lib.kvt_offload_worker_meta_aggregate(ctypes.byref(stores._m), res.stores))
        return finished, stores, [res.invalid_blocks[i] for i in range(res.n_invalid)]

    def stop(self):
        _check(_lib.kvt_link_sched_stop(self._h))


class LinkWorker(_Handle):
    """A rank's end of the link (kvt_link_worker); says hello with its host tier size."""
    _destroy = _lib.kvt_link_worker_destroy

    def __init__(self, endpoint, rank, world_size, host_blocks):
        h = ctypes.c_void_p()
        _check(_lib.kvt_link_worker_create(endpoint.encode(), rank, world_size, host_blocks,
                                           ctypes.byref(h)))
        self._h = h

    def recv(self, timeout_ms=-1):
        """The next step as (OffloadMeta, payload bytes), or None once the scheduler stopped."""
        meta = OffloadMeta()
        payload = ctypes.c_void_p()
        n = ctypes.c_size_t()
        stop = L.c_bool()
        _check(_lib.kvt_link_worker_recv(self._h, timeout_ms, ctypes.byref(meta._m),
                                         ctypes.byref(payload), ctypes.byref(n),
                                         ctypes.byref(stop)))
        if stop.value:
            return None
        return meta, (ctypes.string_at(payload.value, n.value) if n.value else b"")

    def reply(self, finished=(), worker_meta=None, invalid=(), status=0):
        ids = [r.encode() for r in finished]
        arr = (L.kvt_str * max(1, len(ids)))(*[L.kvt_str(b, len(b)) for b in ids])
        inv, n_inv = _u32_array(invalid)
        wm = ctypes.byref(worker_meta._m) if worker_meta is not None else None
        _check(_lib.kvt_link_worker_reply(self._h, status, arr, len(ids), wm, inv, n_inv))
