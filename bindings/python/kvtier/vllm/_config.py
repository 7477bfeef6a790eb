# SPDX-License-Identifier: Apache-2.0
"""kv_connector_extra_config of KvtierConnector: parsed once, checked strictly.

The keys follow vLLM's SimpleCPUOffloadConnector where it has one (cpu_bytes_to_use,
cpu_bytes_to_use_per_rank, lazy_offload, kv_offload_backend, disk_path, disk_capacity_bytes,
use_page_cache, disk_buffer_slots); kvtier's own keys start with "kvtier_". Unlike vLLM, a bad
value or an unknown key is an error that names the key, the value and what is allowed: an engine
must not start half-configured because of a typo (vLLM's `bool("false")` is True; here it is
refused).
"""

DEFAULT_CPU_BYTES = 8 << 30  # vLLM's default: 8 GiB for the whole server
MAX_BYTES = (1 << 63) - 1  # sizes are C uint64_t / off_t: nothing larger is a real size
DEFAULT_DISK_BYTES = 100 << 30
BACKENDS = ("cpu", "disk", "cpu+disk")

_KEYS = {
    "cpu_bytes_to_use": "host tier bytes for the whole server, split evenly across ranks",
    "cpu_bytes_to_use_per_rank": "host tier bytes per rank (overrides cpu_bytes_to_use)",
    "lazy_offload": "store blocks only as they near eviction from the GPU (true/false)",
    "kv_offload_backend": "cpu (host memory), disk (a file per rank), cpu+disk (both, kvtier)",
    "disk_path": "path prefix of each rank's disk file (rank N adds .rankN)",
    "disk_capacity_bytes": "disk tier bytes per rank",
    "use_page_cache": "disk I/O through the page cache instead of O_DIRECT (true/false)",
    "disk_buffer_slots": "accepted for compatibility with vLLM; kvtier needs no staging slots",
    "kvtier_copy_threads": "CPU copy threads per rank (0: one per core)",
    "kvtier_max_requests": "requests the manager tracks at once",
    "kvtier_restore_budget": "blocks re-stored per step after a host eviction (0: off)",
    "kvtier_disk_queue_depth": "io_uring queue depth of the disk tier",
    "kvtier_numa_node": "NUMA node of each rank's host tier memory (-1: no preference; choose "
                        "the GPU's node on a multi-socket server)",
    "kvtier_node_tier": "name of a host tier shared by the replicas on this node (opt-in)",
    "kvtier_node_group": "the group whose members' replicas share the node tier (default: "
                         "only this user's)",
    "kvtier_node_rank": "this replica's index in the node tier (default: vLLM's local "
                        "data-parallel rank)",
    "kvtier_node_ranks": "replicas sharing the node tier (default: vLLM's local "
                         "data-parallel size)",
    "kvtier_remote_directory": "the remote tier's Redis server, host:port or a unix socket "
                               "path (opt-in: instances on other hosts find and read each "
                               "other's blocks)",
    "kvtier_remote_space": "the instances that share blocks (default kvtier)",
    "kvtier_remote_instance": "this instance's name in the space (default: host name and "
                              "process id)",
    "kvtier_remote_listen_host": "address this instance serves its blocks on (default "
                                 "127.0.0.1)",
    "kvtier_remote_advertise_host": "address peers reach it at (default the listen host)",
    "kvtier_remote_port": "port it serves on (default 0: any free port)",
    "kvtier_remote_credential": "the space's shared secret, 16..256 bytes (default: the "
                                "environment's KVTIER_REMOTE_CREDENTIAL)",
    "kvtier_remote_timeout_ms": "bound of one read from a peer (default 2000)",
    "kvtier_remote_encrypt": "encrypt the KV bytes between instances (true/false, default "
                             "false: authenticated, not secret)",
}

REMOTE_NAME_CHARS = "_.-"


class ConfigError(ValueError):
    """A bad kv_connector_extra_config value (a ValueError, as vLLM raises for its own)."""


def _int(extra, key, default, minimum=0, maximum=None):
    if key not in extra:
        return default
    v = extra[key]
    if isinstance(v, bool):
        raise ConfigError("kvtier: %s=%r: expected an integer, not a boolean" % (key, v))
    if isinstance(v, float):
        if v != v or v in (float("inf"), float("-inf")) or v != int(v):
            raise ConfigError("kvtier: %s=%r: expected a whole number" % (key, v))
        v = int(v)
    elif isinstance(v, str):
        s = v.strip()
        digits = s[1:] if s.startswith("-") and minimum is not None and minimum < 0 else s
        if not (digits.isascii() and digits.isdigit()):
            raise ConfigError("kvtier: %s=%r: expected %s integer"
                              % (key, v, "an" if digits is not s else "a non-negative"))
        v = int(s)
    elif not isinstance(v, int):
        raise ConfigError("kvtier: %s=%r: expected an integer" % (key, v))
    if v < minimum:
        raise ConfigError("kvtier: %s=%d: must be at least %d" % (key, v, minimum))
    if maximum is not None and v > maximum:
        raise ConfigError("kvtier: %s=%d: must be at most %d" % (key, v, maximum))
    return v


def _size(extra, key, default, minimum=0):
    """A byte count: an integer 0 (or minimum) .. 2**63 - 1, checked before any conversion."""
    return _int(extra, key, default, minimum, MAX_BYTES)


def _text(extra, key, default=None):
    """A string handed to C: no NUL byte inside (C would read it cut short)."""
    v = extra.get(key, default)
    if isinstance(v, str) and "\0" in v:
        raise ConfigError("kvtier: %s: a NUL character inside the value (C would read it "
                          "cut short there)" % key)
    return v


def _bool(extra, key, default):
    if key not in extra:
        return default
    v = extra[key]
    if isinstance(v, bool):
        return v
    if isinstance(v, int) and v in (0, 1):
        return bool(v)
    if isinstance(v, str) and v.strip().lower() in ("true", "false", "1", "0", "yes", "no"):
        return v.strip().lower() in ("true", "1", "yes")
    raise ConfigError("kvtier: %s=%r: expected true or false" % (key, v))


class KvtierConfig:
    """The connector's settings, from kv_connector_extra_config and the world size."""

    def __init__(self, extra, world_size):
        extra = dict(extra or {})
        unknown = sorted(k for k in extra if k not in _KEYS)
        if unknown:
            raise ConfigError("kvtier: unknown kv_connector_extra_config key%s %s; known keys: %s"
                              % ("s" if len(unknown) > 1 else "", ", ".join(map(repr, unknown)),
                                 ", ".join(sorted(_KEYS))))
        if world_size < 1:
            raise ConfigError("kvtier: world_size %d must be positive" % world_size)
        self.world_size = world_size
        total = _size(extra, "cpu_bytes_to_use", DEFAULT_CPU_BYTES)
        self.cpu_bytes_per_rank = _size(extra, "cpu_bytes_to_use_per_rank", total // world_size)
        self.lazy = _bool(extra, "lazy_offload", False)
        backend = extra.get("kv_offload_backend", "cpu")
        if not isinstance(backend, str) or backend not in BACKENDS:
            raise ConfigError("kvtier: kv_offload_backend=%r: expected one of %s"
                              % (backend, ", ".join(BACKENDS)))
        self.backend = backend
        self.disk_path = _text(extra, "disk_path")
        self.disk_bytes_per_rank = _size(extra, "disk_capacity_bytes", DEFAULT_DISK_BYTES, 1)
        self.page_cache = _bool(extra, "use_page_cache", False)
        _int(extra, "disk_buffer_slots", 2, 1)  # checked, then unused
        self.copy_threads = _int(extra, "kvtier_copy_threads", 0, 0, 256)
        self.max_requests = _int(extra, "kvtier_max_requests", 4096, 1, 1 << 22)
        self.restore_budget = _int(extra, "kvtier_restore_budget", 256, 0, 1 << 20)
        self.disk_queue_depth = _int(extra, "kvtier_disk_queue_depth", 16, 1, 4096)
        self.numa_node = _int(extra, "kvtier_numa_node", -1, -1, 1023)
        if backend in ("disk", "cpu+disk"):
            if not isinstance(self.disk_path, str) or not self.disk_path:
                raise ConfigError('kvtier: kv_offload_backend="%s" needs disk_path (a path '
                                  "prefix for each rank's file)" % backend)
        elif any(k in extra for k in ("disk_path", "disk_capacity_bytes", "use_page_cache")):
            raise ConfigError('kvtier: disk settings given but kv_offload_backend is "%s"; set '
                              'kv_offload_backend to "disk" or "cpu+disk"' % backend)
        self._node(extra, backend, world_size)
        self._remote(extra, backend, world_size)
        if backend != "disk" and self.cpu_bytes_per_rank <= 0:
            raise ConfigError("kvtier: cpu_bytes_to_use%s is 0: the host tier needs memory"
                              % ("_per_rank" if "cpu_bytes_to_use_per_rank" in extra else ""))

    def _node(self, extra, backend, world_size):
        name = _text(extra, "kvtier_node_tier")
        self.node_tier = name
        group = _text(extra, "kvtier_node_group")
        if group is not None and (not isinstance(group, str) or not 1 <= len(group) <= 63):
            raise ConfigError("kvtier: kvtier_node_group=%r: expected a group name of 1..63 "
                              "characters" % (group,))
        self.node_group = group
        self.node_rank = _int(extra, "kvtier_node_rank", None, 0, 63)
        self.node_ranks = _int(extra, "kvtier_node_ranks", None, 1, 64)
        if name is None:
            if self.node_rank is not None or self.node_ranks is not None or group is not None:
                raise ConfigError("kvtier: kvtier_node_rank/kvtier_node_ranks/"
                                  "kvtier_node_group given without kvtier_node_tier (the "
                                  "shared tier's name)")
            return
        if (not isinstance(name, str) or not name or len(name) > 48 or
                any(not (c.isascii() and (c.isalnum() or c in "_.-")) for c in name)):
            raise ConfigError("kvtier: kvtier_node_tier=%r: expected 1..48 characters of "
                              "[A-Za-z0-9_.-]" % (name,))
        if backend not in ("cpu", "cpu+disk"):
            raise ConfigError('kvtier: kvtier_node_tier needs kv_offload_backend "cpu" or '
                              '"cpu+disk" (the node tier is a host tier), not "%s"' % backend)
        if self.lazy:
            raise ConfigError("kvtier: kvtier_node_tier needs eager stores (lazy_offload "
                              "false): a replica publishes its blocks as it stores them")
        if world_size != 1:
            raise ConfigError("kvtier: kvtier_node_tier supports replicas of one rank "
                              "(tensor and pipeline parallel size 1); this one has %d"
                              % world_size)

    def _remote(self, extra, backend, world_size):
        import os
        import socket
        d = _text(extra, "kvtier_remote_directory")
        self.remote_directory = d
        given = sorted(k for k in extra if k.startswith("kvtier_remote_") and
                       k != "kvtier_remote_directory")
        if d is None:
            if given:
                raise ConfigError("kvtier: %s given without kvtier_remote_directory (the "
                                  "remote tier's Redis server)" % ", ".join(given))
            return
        if not isinstance(d, str) or not d.strip():
            raise ConfigError("kvtier: kvtier_remote_directory=%r: expected host:port or a "
                              "unix socket path" % (d,))

        def name(key, default):
            v = extra.get(key, default)
            if (not isinstance(v, str) or not 1 <= len(v) <= 64 or
                    any(not (c.isascii() and (c.isalnum() or c in REMOTE_NAME_CHARS))
                        for c in v)):
                raise ConfigError("kvtier: %s=%r: expected 1..64 characters of [A-Za-z0-9_.-]"
                                  % (key, v))
            return v

        def host(key, default):
            v = _text(extra, key, default)
            if v is not None and (not isinstance(v, str) or not 1 <= len(v) <= 64):
                raise ConfigError("kvtier: %s=%r: expected an address of 1..64 characters"
                                  % (key, v))
            return v

        self.remote_space = name("kvtier_remote_space", "kvtier")
        default_inst = "".join(c if c.isascii() and (c.isalnum() or c in REMOTE_NAME_CHARS)
                               else "-" for c in socket.gethostname())[:48]
        self.remote_instance = name("kvtier_remote_instance",
                                    "%s-%d" % (default_inst or "host", os.getpid()))
        self.remote_listen_host = host("kvtier_remote_listen_host", "127.0.0.1")
        self.remote_advertise_host = host("kvtier_remote_advertise_host", None)
        self.remote_port = _int(extra, "kvtier_remote_port", 0, 0, 65535)
        self.remote_timeout_ms = _int(extra, "kvtier_remote_timeout_ms", 2000, 1, 600000)
        self.remote_encrypt = _bool(extra, "kvtier_remote_encrypt", False)
        cred = extra.get("kvtier_remote_credential",
                         os.environ.get("KVTIER_REMOTE_CREDENTIAL"))
        if isinstance(cred, str) and "\0" in cred:
            raise ConfigError("kvtier: the remote credential (kvtier_remote_credential or "
                              "KVTIER_REMOTE_CREDENTIAL) holds a NUL character: C would read "
                              "it cut short there, and the space's secret would be weaker than "
                              "the one given")
        if not isinstance(cred, str) or not 16 <= len(cred.encode()) <= 256:
            raise ConfigError("kvtier: the remote tier needs a credential of 16..256 bytes "
                              "(kvtier_remote_credential, or KVTIER_REMOTE_CREDENTIAL in the "
                              "environment): every instance of the space shares it")
        self.remote_credential = cred
        self.remote_directory_password = os.environ.get("KVTIER_REMOTE_DIRECTORY_PASSWORD")
        if self.remote_directory_password is not None and "\0" in self.remote_directory_password:
            raise ConfigError("kvtier: KVTIER_REMOTE_DIRECTORY_PASSWORD holds a NUL character")
        if backend not in ("cpu", "cpu+disk"):
            raise ConfigError('kvtier: kvtier_remote_directory needs a host tier '
                              '(kv_offload_backend "cpu" or "cpu+disk"), not "%s"' % backend)
        # an engine of several ranks: each rank serves its part of every block under
        # "<instance>#<rank>" (at most 64 characters)
        self.remote_instance_given = "kvtier_remote_instance" in extra
        if world_size > 1 and len(self.remote_instance) > 64 - 1 - len(str(world_size - 1)):
            raise ConfigError("kvtier: kvtier_remote_instance=%r: an engine of %d ranks serves "
                              "as <instance>#<rank>, at most 64 characters"
                              % (self.remote_instance, world_size))

    def resolve_node(self, parallel_config):
        """The node tier's rank and size, defaulting to vLLM's local data-parallel ones."""
        if not self.node_tier:
            return
        if self.node_rank is None:
            self.node_rank = getattr(parallel_config, "data_parallel_rank_local", None) or 0
        if self.node_ranks is None:
            self.node_ranks = getattr(parallel_config, "data_parallel_size_local", None) or 1
        if self.node_rank >= self.node_ranks:
            raise ConfigError("kvtier: kvtier_node_rank %d is not below kvtier_node_ranks %d"
                              % (self.node_rank, self.node_ranks))

    @property
    def tier_bytes_per_rank(self):
        """Bytes of the tier the GPU stores into (host, or the disk when it is the only one)."""
        return self.disk_bytes_per_rank if self.backend == "disk" else self.cpu_bytes_per_rank
