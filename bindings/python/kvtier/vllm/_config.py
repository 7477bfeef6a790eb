# SPDX-License-Identifier: Apache-2.0
"""kv_connector_extra_config of KvtierConnector: parsed once, checked strictly.

The keys follow vLLM's SimpleCPUOffloadConnector where it has one (cpu_bytes_to_use,
cpu_bytes_to_use_per_rank, lazy_offload, kv_offload_backend, disk_path, disk_capacity_bytes,
use_page_cache, disk_buffer_slots); kvtier's own keys start with "kvtier_". Unlike vLLM, a bad
value or an unknown key is an error that names the key, the value and what is allowed: an engine
must not start half-configured because of a typo (vLLM's `bool("false")` is True; here it is
refused). Every key is one row of KEYS; docs/vllm.md's table is written from the rows.
"""

DEFAULT_CPU_BYTES = 8 << 30  # vLLM's default: 8 GiB for the whole server
MAX_BYTES = (1 << 63) - 1  # sizes are C uint64_t / off_t: nothing larger is a real size
# SECONDS keys become C uint64_t nanoseconds: held to a millisecond .. a billion seconds (31
# years), so that no value overflows the conversion (1e300 raised OverflowError at engine start)
MIN_SECONDS, MAX_SECONDS = 0.001, 1e9
DEFAULT_DISK_BYTES = 100 << 30
BACKENDS = ("cpu", "disk", "cpu+disk")
_UNSET = object()


class Key:
    """One kv_connector_extra_config (or ec_connector_extra_config) key: its name, what it holds
    (SIZE, INT, BOOL, TEXT, CHOICE or SECONDS, a number of seconds), its default and inclusive
    bounds, and its documentation (docs/vllm.md's tables are written from these rows by
    scripts/gen-config-doc). A key that sets a field of a C
    configuration struct names it (c="kvt_offload_config.max_requests") and takes its default
    and bounds from the library's row of that field (kvt_describe_config), so they are written
    once. `shown` is the default as the docs say it where it is computed (None: the value)."""
    __slots__ = ("name", "kind", "doc", "c", "shown", "choices", "default", "lo", "hi")

    def __init__(self, name, kind, doc, default=None, lo=None, hi=None, c=None, shown=None,
                 choices=None):
        self.name, self.kind, self.doc, self.c, self.shown = name, kind, doc, c, shown
        self.default, self.lo, self.hi, self.choices = default, lo, hi, choices

    def bounds(self):
        """(default, lo, hi), from the library's row where the key sets a C field."""
        if self.c:
            from .._lib import config_rows
            struct, field = self.c.split(".")
            r = config_rows(struct)[field]
            return r.default, r.min, r.max
        return self.default, self.lo, self.hi

    def accepted(self, lo, hi):
        """The bounds a number is held to: lo 0 where unset (SECONDS: MIN_SECONDS), hi where
        unset MAX_BYTES for a size, MAX_SECONDS for seconds, (1 << 31) - 1 for an integer: every
        number is checked before it is converted (a C field would wrap a larger one)."""
        if self.kind == SECONDS:
            return (MIN_SECONDS if lo is None else lo), (MAX_SECONDS if hi is None else hi)
        top = MAX_BYTES if self.kind == SIZE else (1 << 31) - 1
        return 0 if lo is None else lo, top if hi is None else hi

    def read(self, extra, default=_UNSET):
        """The key's value in extra, checked; its default (or the one given) when absent."""
        d, lo, hi = self.bounds()
        if default is not _UNSET:
            d = default
        if self.kind in (SIZE, INT):
            return _int(extra, self.name, d, *self.accepted(lo, hi))
        if self.kind == BOOL:
            return _bool(extra, self.name, d)
        if self.kind == SECONDS:
            return _seconds(extra, self.name, d, *self.accepted(lo, hi))
        v = _text(extra, self.name, d)
        if self.kind == CHOICE and (not isinstance(v, str) or v not in self.choices):
            raise ConfigError("kvtier: %s=%r: expected one of %s"
                              % (self.name, v, ", ".join(self.choices)))
        return v


SIZE, INT, BOOL, TEXT, CHOICE, SECONDS = "size", "int", "bool", "text", "choice", "seconds"

KEYS = (
    Key("cpu_bytes_to_use", SIZE, "host tier for the whole server, split evenly across "
        "`world_size` ranks (as vLLM's)", DEFAULT_CPU_BYTES),
    Key("cpu_bytes_to_use_per_rank", SIZE, "host tier per rank; overrides the above",
        shown="`cpu_bytes_to_use` / ranks"),
    Key("lazy_offload", BOOL, "store only blocks about to be evicted from the GPU (write-back) "
        "instead of every confirmed block (write-through)", False),
    Key("kv_offload_backend", CHOICE, '`"cpu"`: host memory; `"disk"`: a file per rank is the '
        'tier (io_uring, O_DIRECT); `"cpu+disk"`: kvtier\'s three tiers, the disk behind the '
        "host tier", "cpu", choices=BACKENDS),
    Key("disk_path", TEXT, "path prefix of each rank's file (`disk` and `cpu+disk` require "
        "it; rank N adds `.rankN`)"),
    Key("disk_capacity_bytes", SIZE, "disk tier per rank", DEFAULT_DISK_BYTES, 1),
    Key("use_page_cache", BOOL, "disk I/O through the page cache instead of O_DIRECT", False),
    Key("disk_buffer_slots", INT, "accepted for compatibility with vLLM (kvtier's disk path "
        "needs no staging slots)", 2, 1, 1 << 20),
    Key("kvtier_copy_threads", INT, "CPU copy threads per rank (0: one per core)",
        c="kvt_copy_config.threads"),
    Key("kvtier_max_requests", INT, "requests the manager tracks at once",
        c="kvt_offload_config.max_requests"),
    Key("kvtier_restore_budget", INT, "blocks per step re-stored after the host tier evicted "
        "them while the GPU still uses them (0: off; vLLM has no such step)",
        c="kvt_offload_config.restore_budget"),
    Key("kvtier_disk_queue_depth", INT, "io_uring queue depth of the disk tier",
        c="kvt_disk_config.queue_depth"),
    Key("kvtier_numa_node", INT, "the NUMA node whose memory holds each rank's host tier "
        "(`kvt_mirror_config.numa_node`, bound with `mbind` before the pages are touched; a "
        "node the machine lacks is refused); -1: no preference. On a two-socket server choose "
        "the GPU's node (`/sys/bus/pci/devices/<gpu>/numa_node`): a host tier on the far "
        "socket crosses the inter-socket link on every copy. vLLM's offload connectors have "
        "no such key", -1, -1, 1023),
    Key("kvtier_node_tier", TEXT, "name of a host tier shared by the replicas on this node "
        "(1..48 of `[A-Za-z0-9_.-]`; [node.md](node.md)): each replica's prefixes are hits for "
        'the others. Needs `kv_offload_backend` `"cpu"` or `"cpu+disk"` (then each replica has '
        "a disk of its own behind its part), eager stores and one rank per replica; every "
        "replica needs the same hash seed (`PYTHONHASHSEED`, or an unset one with sha256), or "
        "it is refused"),
    Key("kvtier_node_group", TEXT, "the group whose members' replicas share the node tier, "
        "when replicas run as different users: the tier's objects are mode 0660 in that group "
        "([node.md](node.md#who-may-share-it))", shown="— (this user only)"),
    Key("kvtier_node_dir", TEXT, "the directory of the node tier's rendezvous: the file that "
        "keeps its objects' unguessable names; only the sharers may enter it "
        "([node.md](node.md#names-nobody-else-can-take)). Required with `kvtier_node_group` (a "
        "directory of that group, `chmod 2770`)", shown="`$XDG_RUNTIME_DIR/kvtier`, else "
        "`$HOME/.kvtier`"),
    Key("kvtier_node_rank", INT, "this replica's index in the node tier",
        c="kvt_node_config.rank", shown="vLLM's local data-parallel rank"),
    Key("kvtier_node_ranks", INT, "replicas sharing the node tier",
        c="kvt_node_config.ranks", shown="vLLM's local data-parallel size"),
    Key("kvtier_remote_directory", TEXT, "the remote tier's Redis server, `host:port` or a "
        "unix socket path ([remote.md](remote.md)): instances on other hosts find and read "
        'each other\'s prefixes. Needs a host tier (`"cpu"` or `"cpu+disk"`), beside a node '
        "tier or not (each replica serves its own slots of the node); with tensor parallelism "
        "every rank serves and reads its own part of each block "
        "([remote.md](remote.md#engines-of-several-ranks)); every instance of a space needs "
        "the same hash seed and model, or it is refused naming the live one"),
    Key("kvtier_remote_space", TEXT, "the instances that share blocks (1..64 of "
        "`[A-Za-z0-9_.-]`)", "kvtier"),
    Key("kvtier_remote_instance", TEXT, "this instance's name in the space (unique); with "
        "several ranks each rank serves as `<instance>#<rank>`, so at most 62 characters",
        shown="host name and process id (one rank); host name and vLLM's engine id (several: "
        "the scheduler's and the rank processes' name must agree)"),
    Key("kvtier_remote_listen_host", TEXT, "address this instance serves its blocks on",
        "127.0.0.1"),
    Key("kvtier_remote_advertise_host", TEXT, "address peers reach it at",
        shown="the listen host"),
    Key("kvtier_remote_port", INT, "port it serves on, 0: any free port (several ranks: rank "
        "r on `port + r` when a port is set)", 0, 0, 65535),
    Key("kvtier_remote_credential", TEXT, "the space's shared secret, 16–256 bytes (better "
        "from the environment than in the config); the Redis password, if any, comes from "
        "`KVTIER_REMOTE_DIRECTORY_PASSWORD`", shown="`KVTIER_REMOTE_CREDENTIAL`"),
    Key("kvtier_remote_timeout_ms", INT, "bound of one read from a peer", 2000, 1, 600000),
    Key("kvtier_remote_miss_ms", INT, "a span of hashes the remote tier did not have (or "
        "whose owner did not answer) is not looked up again for this long: a waiting request "
        "is matched every step, each lookup a directory round trip; 0: always look up",
        c="kvt_offload_config.remote_miss_ms"),
    Key("kvtier_remote_encrypt", BOOL, "encrypt the KV bytes between instances (AES-256-GCM "
        "under each connection's session key; every instance of the space should set it: an "
        "owner that sets it serves encrypted reads only). Off, the bytes are authenticated, "
        "not secret ([security.md](security.md#the-remote-tier-who-may-read-an-instances-"
        "blocks))", False),
)
KEY = {k.name: k for k in KEYS}

# KvtierECConnector's ec_connector_extra_config (vLLM's own ec_* settings are checked in _ec.py)
EC_KEYS = (
    Key("push_wait_timeout_s", SECONDS, "how long a request waits for its items' pushes before "
        "vLLM fails it", 60),
    Key("control_timeout_ms", INT, "each control exchange's timeout", 30000, 1, 3600000),
    Key("lease_s", SECONDS, "how long an item that arrived stays available without a request",
        300),
    Key("complete_wait_ms", INT, "ignored (a shard never waits on a completion; kept for old "
        "configs)", 2000, 1, 3600000),
    Key("owner_key", TEXT, "consumer: the 32-hex-digit secret the scheduler's cancels show its "
        "shards", shown="made by each shard, read from a private file on this host"),
    Key("event_host", TEXT, "consumer: where the shards serve readiness events (an address "
        "needs CURVE keys)", shown="a unix socket of this user"),
    Key("curve_server_secret_key", TEXT, "consumer: the shards' CURVE secret key (Z85; "
        "[security.md](security.md))"),
    Key("curve_server_public_key", TEXT, "producer / consumer scheduler: the shards' CURVE "
        "public key"),
    Key("curve_public_key", TEXT, "this client's CURVE public key"),
    Key("curve_secret_key", TEXT, "this client's CURVE secret key"),
    Key("curve_clients", TEXT, "consumer: the client public keys admitted (a list)"),
)
EC_KEY = {k.name: k for k in EC_KEYS}

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


def _text(extra, key, default=None):
    """A string handed to C: no NUL byte inside (C would read it cut short)."""
    v = extra.get(key, default)
    if isinstance(v, str) and "\0" in v:
        raise ConfigError("kvtier: %s: a NUL character inside the value (C would read it "
                          "cut short there)" % key)
    return v


def _seconds(extra, key, default, minimum, maximum):
    """A number of seconds in minimum..maximum."""
    if key not in extra:
        return default
    v = extra[key]
    try:
        x = float(v) if not isinstance(v, bool) else None
    except (TypeError, ValueError, OverflowError):
        x = None
    if x is None or x != x or not minimum <= x <= maximum:
        raise ConfigError("kvtier: %s=%r: expected a number of seconds from %g to %g"
                          % (key, v, minimum, maximum))
    return x


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
        unknown = sorted(k for k in extra if k not in KEY)
        if unknown:
            raise ConfigError("kvtier: unknown kv_connector_extra_config key%s %s; known keys: %s"
                              % ("s" if len(unknown) > 1 else "", ", ".join(map(repr, unknown)),
                                 ", ".join(sorted(KEY))))
        if world_size < 1:
            raise ConfigError("kvtier: world_size %d must be positive" % world_size)
        self.world_size = world_size
        total = KEY["cpu_bytes_to_use"].read(extra)
        self.cpu_bytes_per_rank = KEY["cpu_bytes_to_use_per_rank"].read(extra,
                                                                       total // world_size)
        self.lazy = KEY["lazy_offload"].read(extra)
        self.backend = backend = KEY["kv_offload_backend"].read(extra)
        self.disk_path = KEY["disk_path"].read(extra)
        self.disk_bytes_per_rank = KEY["disk_capacity_bytes"].read(extra)
        self.page_cache = KEY["use_page_cache"].read(extra)
        KEY["disk_buffer_slots"].read(extra)  # checked, then unused
        self.copy_threads = KEY["kvtier_copy_threads"].read(extra)
        self.max_requests = KEY["kvtier_max_requests"].read(extra)
        self.restore_budget = KEY["kvtier_restore_budget"].read(extra)
        self.disk_queue_depth = KEY["kvtier_disk_queue_depth"].read(extra)
        self.numa_node = KEY["kvtier_numa_node"].read(extra)
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
        name = KEY["kvtier_node_tier"].read(extra)
        self.node_tier = name
        group = KEY["kvtier_node_group"].read(extra)
        if group is not None and (not isinstance(group, str) or not 1 <= len(group) <= 63):
            raise ConfigError("kvtier: kvtier_node_group=%r: expected a group name of 1..63 "
                              "characters" % (group,))
        self.node_group = group
        ndir = KEY["kvtier_node_dir"].read(extra)
        if ndir is not None and (not isinstance(ndir, str) or not ndir or "\0" in ndir):
            raise ConfigError("kvtier: kvtier_node_dir=%r: expected a directory path" % (ndir,))
        self.node_dir = ndir
        self.node_rank = KEY["kvtier_node_rank"].read(extra, None)  # None: vLLM's
        self.node_ranks = KEY["kvtier_node_ranks"].read(extra, None)
        if name is None:
            if (self.node_rank is not None or self.node_ranks is not None or group is not None
                    or ndir is not None):
                raise ConfigError("kvtier: kvtier_node_rank/kvtier_node_ranks/"
                                  "kvtier_node_group/kvtier_node_dir given without "
                                  "kvtier_node_tier (the shared tier's name)")
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
        d = KEY["kvtier_remote_directory"].read(extra)
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

        def name(key, default=_UNSET):
            v = KEY[key].read(extra, default)
            if (not isinstance(v, str) or not 1 <= len(v) <= 64 or
                    any(not (c.isascii() and (c.isalnum() or c in REMOTE_NAME_CHARS))
                        for c in v)):
                raise ConfigError("kvtier: %s=%r: expected 1..64 characters of [A-Za-z0-9_.-]"
                                  % (key, v))
            return v

        def host(key):
            v = KEY[key].read(extra)
            if v is not None and (not isinstance(v, str) or not 1 <= len(v) <= 64):
                raise ConfigError("kvtier: %s=%r: expected an address of 1..64 characters"
                                  % (key, v))
            return v

        self.remote_space = name("kvtier_remote_space")
        default_inst = "".join(c if c.isascii() and (c.isalnum() or c in REMOTE_NAME_CHARS)
                               else "-" for c in socket.gethostname())[:48]
        self.remote_instance = name("kvtier_remote_instance",
                                    "%s-%d" % (default_inst or "host", os.getpid()))
        self.remote_listen_host = host("kvtier_remote_listen_host")
        self.remote_advertise_host = host("kvtier_remote_advertise_host")
        self.remote_port = KEY["kvtier_remote_port"].read(extra)
        self.remote_timeout_ms = KEY["kvtier_remote_timeout_ms"].read(extra)
        self.remote_encrypt = KEY["kvtier_remote_encrypt"].read(extra)
        self.remote_miss_ms = KEY["kvtier_remote_miss_ms"].read(extra)
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
