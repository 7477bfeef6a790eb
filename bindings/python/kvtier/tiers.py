# SPDX-License-Identifier: Apache-2.0
"""The tiers an offload manager is lent or a worker writes: the node tier shared by the
replicas of a host (Node), the remote tier across hosts (Remote), the disk tier (Disk)."""
import ctypes

from . import _lib as L
from ._core import _Handle, _address, _check, _getter

_lib = L.lib


def _set_signature(cfg, signature, what):
    """cfg.signature (32 bytes) from up to 32 bytes of a digest, zero-padded."""
    if len(signature) > 32:
        raise ValueError("kvtier: a %s signature has at most 32 bytes" % what)
    for i, b in enumerate(signature):
        cfg.signature[i] = b


class _Lent(_Handle):
    """A handle lent to OffloadManagers (attach_node, attach_remote): closing it closes them
    first, as they must not outlive it."""

    def close(self):
        for ref in getattr(self, "_managers", ()):
            m = ref()
            if m is not None:
                m.close()
        self._managers = []
        super().close()


class Node(_Lent):
    """This replica's scheduler attached to a node tier (kvt_node): one host tier shared by
    the replicas on a node. Lend it to the OffloadManager (attach_node); each replica's
    worker maps the tier's data with Mirror(..., node_name=name)."""
    _destroy = _lib.kvt_node_detach

    def __init__(self, name, rank, ranks, blocks_per_rank, hash_len=16, keys_per_block=1,
                 hash_block_size=16, block_bytes=0, hash_seed=0, signature=b"",
                 reap_interval_ms=1000, group=None, dir=None):
        """group: None (only this user's processes share the tier) or the name of the group
        whose members' replicas share it (every replica, and its workers' Mirror, name it).
        dir: the directory of the tier's rendezvous (kvt_node_config.dir; None: the default;
        required with group)."""
        cfg = L.kvt_node_config()
        _lib.kvt_node_config_init(ctypes.byref(cfg))
        self._name = name.encode()
        cfg.name = self._name
        cfg.rank = rank
        cfg.ranks = ranks
        cfg.blocks_per_rank = blocks_per_rank
        cfg.hash_len = hash_len
        cfg.keys_per_block = keys_per_block
        cfg.hash_block_size = hash_block_size
        cfg.block_bytes = block_bytes
        cfg.hash_seed = hash_seed & 0xFFFFFFFFFFFFFFFF
        _set_signature(cfg, signature, "node")
        cfg.reap_interval_ms = reap_interval_ms
        self._group = group.encode() if group else None
        cfg.group = self._group
        self._dir = dir.encode() if dir else None
        cfg.dir = self._dir
        h = ctypes.c_void_p()
        _check(_lib.kvt_node_attach(ctypes.byref(cfg), ctypes.byref(h)))
        self._h = h
        self._managers = []  # managers it is lent to: destroyed before it is detached


    num_slots = _getter("kvt_node_num_slots",
                        "Slots of the tier: the manager's host_blocks and each worker's mirror "
                        "blocks.")

    def reap(self):
        """Checks the peers' liveness now; returns how many dead ones it reaped."""
        return _check(_lib.kvt_node_reap(self._h))

    def stats(self):
        st = L.kvt_node_stats()
        _check(_lib.kvt_node_get_stats(self._h, ctypes.byref(st)))
        return {n: getattr(st, n) for n, _ in L.kvt_node_stats._fields_ if n != "reserved"}

    @staticmethod
    def unlink(name, dir=None, group=None):
        """Removes the names of node tier `name` (what crashed replicas left behind); dir and
        group as the tier's replicas name them."""
        _check(_lib.kvt_node_unlink_at(name.encode(), dir.encode() if dir else None,
                                       group.encode() if group else None))


class Remote(_Lent):
    """This instance in a remote tier (kvt_remote): its blocks found by instances on other
    hosts through a Redis directory and read peer to peer over UCX, every block checked
    (docs/remote.md). region: a buffer (bytearray, numpy array, ...) of n_slots x block_bytes
    this instance serves, or None to read only; or mirror: a host Mirror whose blocks (every
    region's piece of each) it serves, block_bytes then 0 or their sum — the remote tier an
    OffloadManager over that mirror attaches (attach_remote). ranks, rank: an engine of
    tensor parallelism: this object is rank `rank` of `ranks`, serving and reading that
    rank's part of each block; rank=None makes the scheduler's lookup-only client (no region,
    listen host or credential; lookups return every rank's part of a block)."""
    _destroy = _lib.kvt_remote_destroy
    NO_RANK = 0xFFFFFFFF

    def __init__(self, directory, space, instance, listen_host, credential, block_bytes,
                 region=None, hash_len=16, hash_seed=0, signature=b"", listen_port=0,
                 advertise_host=None, ttl_ms=3000, timeout_ms=2000, directory_timeout_ms=250,
                 retry_ms=1000, owner_checksum=True, directory_password=None, mirror=None,
                 encrypt=False, ranks=1, rank=0):
        cfg = L.kvt_remote_config()
        _lib.kvt_remote_config_init(ctypes.byref(cfg))
        self._strs = [x.encode() if isinstance(x, str) else x for x in (
            directory, space, instance, listen_host, credential, advertise_host,
            directory_password)]
        (cfg.directory, cfg.space, cfg.instance, cfg.listen_host, cfg.credential,
         cfg.advertise_host, cfg.directory_password) = self._strs
        cfg.listen_port = listen_port
        cfg.block_bytes = block_bytes
        cfg.hash_len = hash_len
        cfg.hash_seed = hash_seed & 0xFFFFFFFFFFFFFFFF
        _set_signature(cfg, signature, "remote")
        cfg.ttl_ms, cfg.timeout_ms = ttl_ms, timeout_ms
        cfg.directory_timeout_ms, cfg.retry_ms = directory_timeout_ms, retry_ms
        cfg.owner_checksum = 1 if owner_checksum else 0
        cfg.encrypt = 1 if encrypt else 0
        cfg.ranks = ranks
        cfg.rank = self.NO_RANK if rank is None else rank
        self.ranks = max(ranks, 1)
        self._region = region
        if region is not None and mirror is not None:
            raise ValueError("kvtier: a Remote serves a region or a mirror, not both")
        if region is not None:
            addr, nbytes, _dev = _address(region)
            cfg.region = addr
            cfg.n_slots = nbytes // block_bytes
        if mirror is not None:
            cfg.regions = ctypes.cast(_lib.kvt_mirror_regions(mirror._h), ctypes.c_void_p)
            cfg.n_regions = _lib.kvt_mirror_num_regions(mirror._h)
            cfg.n_slots = _lib.kvt_mirror_num_blocks(mirror._h)
            block_bytes = sum(_lib.kvt_mirror_regions(mirror._h)[i].block_bytes
                              for i in range(cfg.n_regions))
            cfg.block_bytes = block_bytes
        self._mirror = mirror  # served: it must outlive this object
        self._managers = []  # managers it is lent to: closed before it is destroyed
        self.block_bytes = block_bytes
        self.hash_len = hash_len
        h = ctypes.c_void_p()
        _check(_lib.kvt_remote_create(ctypes.byref(cfg), ctypes.byref(h)))
        self._h = h


    port = _getter("kvt_remote_port")

    def _hashes(self, hashes):
        b = bytes(hashes)
        if len(b) % self.hash_len:
            raise ValueError("kvtier: hashes are %d bytes each" % self.hash_len)
        return (ctypes.c_uint8 * max(len(b), 1)).from_buffer_copy(b or b"\0"), len(b) // self.hash_len

    def publish(self, slots, hashes):
        """Slots now hold the blocks with these hashes (concatenated), their stores complete."""
        hb, n = self._hashes(hashes)
        if n != len(slots):
            raise ValueError("kvtier: %d slots but %d hashes" % (len(slots), n))
        sl = (ctypes.c_uint32 * max(n, 1))(*slots)
        _check(_lib.kvt_remote_publish(self._h, sl, hb, n))

    def withdraw(self, slots):
        """Slots are about to be reused."""
        sl = (ctypes.c_uint32 * max(len(slots), 1))(*slots)
        _check(_lib.kvt_remote_withdraw(self._h, sl, len(slots)))

    def lookup(self, hashes):
        """The longest prefix of these chained hashes held by live peers: a list of
        (peer, slot, generation), one per block found (with ranks > 1, one per part: block i's
        rank k at i * ranks + k)."""
        hb, n = self._hashes(hashes)
        locs = (L.kvt_remote_loc * max(n * self.ranks, 1))()
        hit = ctypes.c_uint32()
        _check(_lib.kvt_remote_lookup(self._h, hb, n, locs, ctypes.byref(hit)))
        return [(locs[i].peer, locs[i].slot, locs[i].generation)
                for i in range(hit.value * self.ranks)]

    def read(self, locs, hashes, dsts):
        """Reads looked-up blocks into dsts (buffers of block_bytes each); a status per block:
        0, or a negative KVT_E* code (kvtier.strerror) — a failed block is a miss."""
        hb, n = self._hashes(hashes)
        if not (n == len(locs) == len(dsts)):
            raise ValueError("kvtier: read: %d locations, %d hashes, %d destinations" % (
                len(locs), n, len(dsts)))
        lv = (L.kvt_remote_loc * max(n, 1))()
        for i, (peer, slot, gen) in enumerate(locs):
            lv[i].peer, lv[i].slot, lv[i].generation = peer, slot, gen
        pv = (ctypes.c_void_p * max(n, 1))()
        for i, d in enumerate(dsts):
            addr, nbytes, _dev = _address(d)
            if nbytes < self.block_bytes:
                raise ValueError("kvtier: destination %d holds %d bytes, a block %d" % (
                    i, nbytes, self.block_bytes))
            pv[i] = addr
        st = (ctypes.c_int * max(n, 1))()
        _lib.kvt_remote_read(self._h, lv, hb, n, pv, st)
        return [st[i] for i in range(n)]

    def peer_name(self, peer):
        name = _lib.kvt_remote_peer_name(self._h, peer)
        return name.decode() if name else None

    def stats(self):
        st = L.kvt_remote_stats()
        _lib.kvt_remote_get_stats(self._h, ctypes.byref(st))
        return {n: getattr(st, n) for n, _ in L.kvt_remote_stats._fields_ if n != "reserved"}


class Disk(_Handle):
    """The disk tier of one rank (kvt_disk): a private file path.rank<N> of slots. Close the
    workers that use it first."""
    _destroy = _lib.kvt_disk_destroy

    def __init__(self, layout, path, capacity_bytes, rank=0, page_cache=False, queue_depth=16,
                 alignment=4096):
        cfg = L.kvt_disk_config()
        _lib.kvt_disk_config_init(ctypes.byref(cfg))
        path_b = path.encode()
        cfg.path = path_b
        cfg.rank = rank
        cfg.capacity_bytes = capacity_bytes
        cfg.page_cache = page_cache
        cfg.queue_depth = queue_depth
        cfg.alignment = alignment
        h = ctypes.c_void_p()
        _check(_lib.kvt_disk_create(ctypes.byref(cfg), layout._h, ctypes.byref(h)))
        self._h = h
        self._layout = layout

    num_slots = _getter("kvt_disk_num_slots")

    slot_bytes = _getter("kvt_disk_slot_bytes")

    path = _getter("kvt_disk_path", text=True)

    def stats(self):
        """Per-direction counters ([write, read]) and whether a fatal error stopped the tier."""
        s = L.kvt_disk_stats()
        _lib.kvt_disk_get_stats(self._h, ctypes.byref(s))
        out = {name: list(getattr(s, name)) for name in L.fields(L.kvt_disk_stats)[:-1]}
        out["fatal"] = bool(s.fatal)
        return out
