# SPDX-License-Identifier: Apache-2.0
"""The tiers below the host tier that the scheduler side attaches: the remote tier (serving
the host mirror of this engine's worker, shared with it in this process) and the node tier."""
import logging

from ...tiers import Node, Remote
from .._config import ConfigError
from .placement import _hash_seed, _signature
from ... import _lib as L

logger = logging.getLogger("kvtier.vllm")
_lib = L.lib


class _HostShare:
    """A worker's host mirror that the scheduler's remote tier serves too (same process): the
    last of the two to close frees it, so no peer's read ever lands in freed memory. The
    worker reads the remote tier's hits into it (Worker.attach_remote)."""

    def __init__(self, mirror, worker):
        self.mirror, self.worker, self.users = mirror, worker, 1

    def release(self):
        self.users -= 1
        if self.users == 0:
            self.mirror.close()


# engine id -> the _HostShare of that engine's worker in this process (remote tier only)
_HOSTS = {}


def _remote_instance(cfg, vllm_config):
    """This engine's name in the remote space. An engine of several ranks has processes of
    its own for its scheduler and each rank: unless given, the name comes from the engine id
    they share (the host name's and pid's default would differ between them)."""
    if cfg.remote_instance_given or cfg.world_size == 1:
        return cfg.remote_instance
    eid = "".join(c if c.isascii() and (c.isalnum() or c in "_.-") else "-"
                  for c in str(vllm_config.kv_transfer_config.engine_id))
    return (cfg.remote_instance.rsplit("-", 1)[0][:20] + "-" + eid)[:60]


class _TierAttach:
    """The tiers the scheduler side attaches at its first call (a mixin of _Scheduler): the
    remote tier (serving this engine's worker's host mirror) and the node tier."""

    def _attach_remote(self):
        """Joins the remote tier. One rank: serving the host tier of this engine's worker,
        which is in this process (vLLM's uniprocess executor). Several ranks (the multiprocess
        executor): a lookup-only client of the directory; each rank serves, publishes and reads
        its own part of every block through a remote of its own (_Worker)."""
        c, v = self.cfg, self._vllm_config
        if c.world_size > 1:
            return self._attach_remote_client()
        share = _HOSTS.get(v.kv_transfer_config.engine_id)
        if share is None or share.mirror._h is None:
            raise ConfigError("kvtier: kvtier_remote_directory: this engine's worker is not in "
                              "the scheduler's process, so the remote tier cannot serve its "
                              "host tier (it needs one rank and vLLM's uniprocess executor)")
        remote = Remote(c.remote_directory, c.remote_space, c.remote_instance,
                        c.remote_listen_host, c.remote_credential, 0, mirror=share.mirror,
                        hash_len=self.hash_len, hash_seed=_hash_seed(),
                        signature=_signature(v, self.gcfg), listen_port=c.remote_port,
                        advertise_host=c.remote_advertise_host,
                        timeout_ms=c.remote_timeout_ms,
                        directory_password=c.remote_directory_password,
                        encrypt=c.remote_encrypt)
        try:
            self._call(_lib.kvt_offload_attach_remote(self.h, remote._h))
            # the worker reads the remote hits' blocks, on a thread of its own
            share.worker.attach_remote(remote, _lib.kvt_offload_remote_tier(self.h))
        except Exception:
            remote.close()
            raise
        share.users += 1
        self._host_share = share
        self.remote = remote
        self._remote_pending = False
        logger.info("kvtier: remote tier: instance %s of space %s, directory %s, serving on "
                    "port %d", c.remote_instance, c.remote_space, c.remote_directory,
                    remote.port)

    def _lend(self, attach, tier):
        """Lends the manager a node or remote tier (attach: its kvt_offload_attach_*); a tier
        the manager refused is closed."""
        try:
            self._call(attach(self.h, tier._h))
        except Exception:
            tier.close()
            raise

    def _attach_remote_client(self):
        c, v = self.cfg, self._vllm_config
        remote = Remote(c.remote_directory, c.remote_space, _remote_instance(c, v), None, None, 0,
                        hash_len=self.hash_len, hash_seed=_hash_seed(),
                        timeout_ms=c.remote_timeout_ms,
                        directory_password=c.remote_directory_password, ranks=c.world_size,
                        rank=None)
        self._lend(_lib.kvt_offload_attach_remote, remote)
        self.remote = remote
        self._remote_pending = False
        logger.info("kvtier: remote tier: instance %s of space %s, directory %s, %d ranks "
                    "(each serves its part)", _remote_instance(c, v), c.remote_space,
                    c.remote_directory, c.world_size)

    def remote_stats(self):
        """The remote tier's counters (kvt_remote_stats), or None without one."""
        return self.remote.stats() if self.remote is not None else None

    def _attach_node(self):
        """Joins the node tier: its configuration carries everything the replicas must share
        (a replica with another hash seed is refused, not left to miss forever)."""
        c = self.cfg
        seed, sig = _hash_seed(), _signature(self._vllm_config, self.gcfg)
        node = Node(c.node_tier, c.node_rank, c.node_ranks, self.node_bpr,
                    hash_len=self.hash_len, keys_per_block=self.gcfg.keys_per_block,
                    hash_block_size=self.gcfg.hash_block_size, block_bytes=self.bpr,
                    hash_seed=seed, signature=sig, group=c.node_group, dir=c.node_dir)
        self._lend(_lib.kvt_offload_attach_node, node)
        self.node = node
        self._node_pending = False  # only now: a replica that could not join keeps failing
        logger.info("kvtier: node tier %s: replica %d of %d, %d of its %d slots are this "
                    "replica's", c.node_tier, c.node_rank, c.node_ranks, self.node_bpr - 1,
                    self.host_blocks)

    def node_stats(self):
        """The node tier's counters (kvt_node_stats), or None without one."""
        return self.node.stats() if self.node is not None else None
