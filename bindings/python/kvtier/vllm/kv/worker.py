# SPDX-License-Identifier: Apache-2.0
"""The worker side of KvtierConnector (one per rank): the rank's KV cache tensors as kvtier
regions, the host mirror, and kvtier's worker moving blocks."""
import logging
import weakref

import torch

from ..._core import KvtierError
from ...offload import OffloadMeta
from ...tiers import Disk, Remote
from ...worker import Layout, Mirror, Worker
from .._config import ConfigError
from .metadata import KvtierWorkerMetadata
from .placement import (_group_specs, _hash_seed, _signature, block_bytes_per_rank,
                        host_blocks_for, kv_regions)
from .tiers import _HOSTS, _HostShare, _remote_instance
from ... import _lib as L

logger = logging.getLogger("kvtier.vllm")
_lib = L.lib


_DRAINING = weakref.WeakSet()  # worker sides whose copies a device synchronization waits for


def _drain_at_device_sync(worker_side):
    """vLLM's pause with clear_cache and its sleep call synchronize_device on every worker
    before the block pool is reset or the KV cache freed; kvtier's copies run on its own
    threads (and CUDA streams a device synchronization may not cover when not yet issued), so
    they are waited for there: no copy reads a block after the scheduler side let go of it."""
    _DRAINING.add(worker_side)
    try:
        from vllm.v1.worker.worker_base import WorkerBase
    except ImportError:  # an older vLLM: nothing to hook (docs/vllm.md)
        return
    inner = WorkerBase.synchronize_device
    if getattr(inner, "_kvtier_drain", False):
        return

    def synchronize_device(self):
        for w in list(_DRAINING):
            w.drain()
        return inner(self)

    synchronize_device._kvtier_drain = True
    WorkerBase.synchronize_device = synchronize_device


class _Worker:
    def __init__(self, vllm_config, kv_cache_config, cfg):
        self.cfg = cfg
        self.kv_cache_config = kv_cache_config
        self._engine_id = vllm_config.kv_transfer_config.engine_id
        self._vllm_config = vllm_config
        self._host_share = None
        self.remote = None
        self.host_blocks = host_blocks_for(cfg, kv_cache_config)
        self.worker = self.mirror = self.layout = self.disk = None
        self.cuda = False
        self._bound = None
        self._empty_meta = OffloadMeta()
        self.flushes = 0  # preemptions that made this rank wait for its copies
        self.drains = 0  # device synchronizations that waited for this rank's copies
        self._regions = []  # (layer, tensor, offset, base address) of every region registered
        self.asleep = False

    def register(self, kv_caches):
        cfg = self.kv_cache_config
        first = next(iter(kv_caches.values()))
        if isinstance(first, (list, tuple)):
            first = first[0]
        dev = first.device
        self.cuda = dev.type == "cuda"
        if dev.type not in ("cuda", "cpu"):
            raise ConfigError("kvtier: KV caches on %s are not supported (cpu or cuda)" % dev)
        device = dev.index if self.cuda else L.HOST_DEVICE
        layout = Layout(cfg.num_blocks, device=device)
        seen = set()
        for layer, off, bb in kv_regions(cfg):
            t = kv_caches.get(layer)
            if t is None:
                raise ConfigError("kvtier: no KV cache tensor for layer %s" % layer)
            if isinstance(t, (list, tuple)):
                t = t[0]
            storage = t.untyped_storage()
            base = storage.data_ptr() + off
            if base in seen:
                continue
            seen.add(base)
            if off + cfg.num_blocks * bb > storage.nbytes():
                raise ConfigError("kvtier: layer %s: %d blocks of %d bytes at offset %d exceed "
                                  "its storage of %d bytes" % (layer, cfg.num_blocks, bb, off,
                                                               storage.nbytes()))
            layout._buffers.append(t)
            self._regions.append((layer, t, off, base))
            rc = _lib.kvt_layout_add_region(layout._h, base, bb)
            if rc < 0:
                raise KvtierError(rc, _lib.kvt_last_error().decode(errors="replace"))
        if layout.block_bytes != block_bytes_per_rank(cfg):
            raise ConfigError("kvtier: this rank's KV cache has %d bytes per block, the "
                              "scheduler planned %d" % (layout.block_bytes,
                                                        block_bytes_per_rank(cfg)))
        self.layout = layout
        rank = 0
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            rank = torch.distributed.get_rank()
        c = self.cfg
        if c.backend == "disk":
            self.disk = Disk(layout, c.disk_path, c.disk_bytes_per_rank, rank=rank,
                             page_cache=c.page_cache, queue_depth=c.disk_queue_depth)
            self.worker = Worker(layout, disk=self.disk, rank=rank, threads=c.copy_threads)
        else:
            node = c.node_tier
            self.mirror = Mirror(layout, self.host_blocks * (c.node_ranks if node else 1),
                                 pin=self.cuda, node_name=node,
                                 node_group=c.node_group if node else None,
                                 node_dir=c.node_dir if node else None,
                                 numa_node=c.numa_node)
            self.worker = Worker(layout, self.mirror, rank=rank, threads=c.copy_threads)
            if c.remote_directory and c.world_size == 1:  # the scheduler's remote serves it
                self._host_share = _HostShare(self.mirror, self.worker)
                _HOSTS[self._engine_id] = self._host_share
            if c.backend == "cpu+disk":
                self.disk = Disk(self.mirror.layout(), c.disk_path, c.disk_bytes_per_rank,
                                 rank=rank, page_cache=c.page_cache,
                                 queue_depth=c.disk_queue_depth)
                self.worker.attach_disk(self.disk)
            if c.remote_directory and c.world_size > 1:
                self._attach_rank_remote(rank)
        logger.info("kvtier: rank %d: %d regions, %d bytes per block, %d host blocks, %s "
                    "copies", rank, layout.num_regions, layout.block_bytes, self.host_blocks,
                    "CUDA" if self.cuda else "CPU")
        _drain_at_device_sync(self)

    def _attach_rank_remote(self, rank):
        """This rank's part of the remote tier (an engine of several ranks): it serves its
        part of every block from its mirror, publishes and withdraws it as the scheduler's
        metadata says, and reads its part of the remote hits."""
        c, v = self.cfg, self._vllm_config
        gcfg = _group_specs(self.kv_cache_config, v)
        self.remote = Remote(c.remote_directory, c.remote_space, _remote_instance(c, v),
                             c.remote_listen_host, c.remote_credential, 0, mirror=self.mirror,
                             hash_len=gcfg.hash_len, hash_seed=_hash_seed(v),
                             signature=_signature(v, gcfg),
                             listen_port=c.remote_port + rank if c.remote_port else 0,
                             advertise_host=c.remote_advertise_host,
                             timeout_ms=c.remote_timeout_ms,
                             directory_password=c.remote_directory_password,
                             encrypt=c.remote_encrypt, ranks=c.world_size, rank=rank)
        # the tier after the host and its disk, as in the scheduler's chain
        self.worker.attach_remote(self.remote, 2 if self.disk is not None else 1)
        logger.info("kvtier: rank %d serves its part of the remote tier on port %d", rank,
                    self.remote.port)

    def drain(self):
        """Waits until every copy this rank submitted has finished (their reports still go out
        with the next steps): vLLM synchronizes the device before it resets its prefix cache
        or frees the KV cache (pause with clear_cache, sleep), and the scheduler side then lets
        go of the blocks the copies used."""
        if self.worker is not None:
            self.drains += 1
            self.worker.flush()

    def unregister(self):
        """vLLM >= 0.33's unregister_kv_caches, before sleep frees the KV cache's memory: every
        copy this rank submitted has finished when it returns (0.33 synchronizes the device
        itself there, not through synchronize_device, so the drain hook would miss it)."""
        self.drain()
        self.asleep = True

    def restore(self):
        """restore_kv_caches, after wake-up: the copies address the KV cache by its virtual
        addresses, which sleep mode's allocator maps again at the same place; a region that
        moved would be written where the cache no longer is, so it is refused, naming it."""
        for layer, t, off, base in self._regions:
            now = t.untyped_storage().data_ptr() + off
            if now != base:
                raise ConfigError("kvtier: layer %s's KV cache moved across sleep (0x%x, was "
                                  "0x%x); kvtier's copies address it where it was registered"
                                  % (layer, now, base))
        self.asleep = False

    def bind(self, meta):
        if self.worker is None:
            return
        m = OffloadMeta.decode(meta.data) if meta.data else self._empty_meta
        self.worker.bind(m)
        self._bound = m

    def flush(self, meta):
        if self.worker is not None and meta.need_flush:
            self.flushes += 1
            self.worker.flush()

    def get_finished(self):
        if self.worker is None or self._bound is None:
            return None
        stream = torch.cuda.current_stream().cuda_stream if self.cuda else None
        done = self.worker.get_finished(stream)
        return set(done) if done else None

    def worker_meta(self):
        if self.worker is None:
            return None
        wm = self.worker.build_meta()
        if not any(r.n_completed or r.n_failed for _, _, r in wm.reports()):
            return None
        return KvtierWorkerMetadata(wm.encode())

    def invalid_blocks(self):
        return set(self.worker.take_invalid_blocks()) if self.worker is not None else set()

    def clear(self):
        if self.worker is not None and self._bound is not None:
            self.worker.clear()
        self._bound = None

    def close(self):
        share, self._host_share = self._host_share, None
        if share is not None and _HOSTS.get(self._engine_id) is share:
            del _HOSTS[self._engine_id]
        # the rank's remote after the worker (its reads end with it), before the mirror it serves
        for o in (self.worker, self.remote, self.disk, self.mirror, self.layout):
            if o is None:
                continue
            if o is self.mirror and share is not None:
                share.release()  # the remote tier may still serve it
            else:
                o.close()
        self.worker = self.remote = self.disk = self.mirror = self.layout = None
