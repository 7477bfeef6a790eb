# SPDX-License-Identifier: Apache-2.0
"""ctypes declarations of kvtier's C API (the subset the Python package wraps).

Every struct mirrors its C declaration field for field, private fields included, so that
kvtier can be handed memory Python allocated; the stats structs the library describes
(kvt_describe) are built from that description instead. At load time each size is checked
against the library's own (kvt_sizeof), and a mismatch refuses to load rather than corrupting
memory.
"""
import ctypes
import ctypes.util
import functools
import os

c_u32, c_u64, c_i64, c_int, c_bool = (ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int64,
                                      ctypes.c_int, ctypes.c_bool)
P = ctypes.POINTER
MAX_GROUPS = 32
HASH_LEN = 16
HOST_DEVICE = -1
ENOSPC = -3  # KVT_ENOSPC: the size query of a *_prometheus or kvt_metrics_merge call
COPY_STORE, COPY_LOAD = 0, 1
MATCH_SKIP_PREFIX_CACHE = 1  # KVT_MATCH_SKIP_PREFIX_CACHE
GROUP_FULL, GROUP_SLIDING, GROUP_MAMBA, GROUP_SCRATCH, GROUP_RING, GROUP_MAMBA_ALIGN = range(6)
HIT_PARTIAL = 1  # KVT_HIT_PARTIAL
NO_EVENT = -1


def _find_library():
    # The path of libkvtier: KVTIER_LIB overrides; then the copy `pip install` put inside the
    # package; then a source tree's build/ (running from bindings/python) and an installed
    # prefix's lib/. Its siblings libkvtier_disk and libkvtier_net lie beside it.
    env = os.environ.get("KVTIER_LIB")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    for rel in ("libkvtier.so", "libkvtier.so.0", "../../../build/lib/libkvtier.so.0",
                "../../../../lib/libkvtier.so.0"):
        p = os.path.normpath(os.path.join(here, rel))
        if os.path.exists(p):
            return p
    found = ctypes.util.find_library("kvtier")
    if found:
        return found
    raise OSError("kvtier: libkvtier.so.0 not found; set KVTIER_LIB to its path")


class _Libraries:
    """The three shared libraries as one: libkvtier (pool, offload manager, copy engine,
    worker, EC state machines), libkvtier_disk (the disk tier) and libkvtier_net (ZeroMQ and
    UCX). A function is looked up in each, in that order, and kept."""

    def __init__(self, core):
        self.path = os.path.abspath(core) if os.sep in core else core
        d, base = os.path.split(core)
        self._libs = [ctypes.CDLL(core)]
        for name in ("kvtier_disk", "kvtier_net"):
            # the same file name form as libkvtier's (a wheel: libNAME.so; a build: .so.0)
            sib = base.replace("libkvtier", "lib" + name, 1)
            self._libs.append(ctypes.CDLL(os.path.join(d, sib) if d else sib))

    def __getattr__(self, name):
        for one in self._libs:
            try:
                f = getattr(one, name)
            except AttributeError:
                continue
            setattr(self, name, f)
            return f
        raise AttributeError("kvtier: no function %s in libkvtier, libkvtier_disk or "
                             "libkvtier_net" % name)

    def __getitem__(self, name):
        """A function object of its own (as CDLL[name]): callers may set its argtypes apart."""
        for one in self._libs:
            try:
                return one[name]
            except AttributeError:
                continue
        raise KeyError(name)


lib = _Libraries(_find_library())


def load_extension(name):
    """The compiled module kvtier.<name> lying beside libkvtier (inside the package in a wheel,
    build/lib in a build tree), or None where it was not built. It must come from the same
    build as the library: it calls the functions this module loaded."""
    import importlib.machinery
    import importlib.util
    import sys
    full = "kvtier." + name
    if full in sys.modules:
        return sys.modules[full]
    d = os.path.dirname(lib.path)
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        p = os.path.join(d, name + suffix)
        if os.path.exists(p):
            loader = importlib.machinery.ExtensionFileLoader(full, p)
            spec = importlib.util.spec_from_file_location(full, p, loader=loader)
            mod = importlib.util.module_from_spec(spec)
            loader.exec_module(mod)
            sys.modules[full] = mod
            return mod
    return None


def address(fn_name):
    """The address of a library function (for a compiled module that calls it)."""
    return ctypes.cast(lib[fn_name], ctypes.c_void_p).value


_INT_RANGE = {}
for _t in (ctypes.c_uint8, ctypes.c_uint16, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_uint):
    _INT_RANGE[_t] = (0, (1 << (8 * ctypes.sizeof(_t))) - 1)
for _t in (ctypes.c_int8, ctypes.c_int16, ctypes.c_int32, ctypes.c_int64, ctypes.c_int):
    _INT_RANGE[_t] = (-(1 << (8 * ctypes.sizeof(_t) - 1)), (1 << (8 * ctypes.sizeof(_t) - 1)) - 1)


class Struct(ctypes.Structure):
    """A ctypes struct (every *_config here) whose fields are checked before ctypes converts them: ctypes stores an
    integer modulo the field's width (2**64 + 8 GiB becomes 8 GiB) and a C string up to its
    first NUL (a credential with a NUL inside would be cut short). Here an integer out of the
    field's range, a non-integer in an integer field, or bytes holding a NUL raise ValueError
    (TypeError for a wrong type) naming the struct and the field."""

    def __setattr__(self, name, value):
        kinds = type(self).__dict__.get("_kinds_")
        if kinds is None:
            kinds = {n: t for n, t in type(self)._fields_}
            type(self)._kinds_ = kinds
        t = kinds.get(name)
        if t in _INT_RANGE:
            if isinstance(value, bool) and t is not c_bool:
                value = int(value)
            if not isinstance(value, int):
                raise TypeError("kvtier: %s.%s=%r: expected an integer"
                                % (type(self).__name__, name, value))
            lo, hi = _INT_RANGE[t]
            if not lo <= value <= hi:
                raise ValueError("kvtier: %s.%s=%d: out of range %d..%d"
                                 % (type(self).__name__, name, value, lo, hi))
        elif t is ctypes.c_char_p and value is not None:
            if not isinstance(value, bytes):
                raise TypeError("kvtier: %s.%s=%r: expected bytes"
                                % (type(self).__name__, name, value))
            if b"\0" in value:
                raise ValueError("kvtier: %s.%s: a NUL byte inside would cut the string short"
                                 % (type(self).__name__, name))
        super().__setattr__(name, value)


class kvt_str(ctypes.Structure):
    _fields_ = [("ptr", ctypes.c_char_p), ("len", c_u32)]


class kvt_bump(ctypes.Structure):
    _fields_ = [("head", ctypes.c_void_p), ("cur", ctypes.c_void_p)]


ROOM = [("reserved", c_u64 * 8)]


def room(words):
    """The reserved room of a struct whose later fields took 8 - words of its words."""
    return [("reserved", c_u64 * words)]


def fields(struct):
    """A struct's field names, without its reserved room."""
    return [n for n, _ in struct._fields_ if n != "reserved"]


class kvt_field(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("help", ctypes.c_char_p), ("metric", ctypes.c_char_p),
                ("offset", c_u32), ("size", c_u32), ("count", c_u32), ("kind", c_u32)]


FIELD_COUNTER, FIELD_GAUGE, FIELD_STRING, FIELD_ROOM = range(4)  # KVT_FIELD_*


def _rows(fn_name, row_type, type_name):
    """The rows describer fn_name (kvt_describe, kvt_describe_config) gives for type_name, as
    a list of row_type; ImportError naming the struct where the library lacks either."""
    try:
        fn = lib[fn_name]
    except KeyError:
        raise ImportError("kvtier: %s has no %s: the bindings need a newer libkvtier"
                          % (lib.path, fn_name)) from None
    fn.restype = c_int
    fn.argtypes = [ctypes.c_char_p, P(P(row_type)), P(c_u32)]
    rows, n = P(row_type)(), c_u32()
    if fn(type_name.encode(), ctypes.byref(rows), ctypes.byref(n)) != 0:
        raise ImportError("kvtier: %s does not describe %s: the bindings need a newer "
                          "libkvtier" % (lib.path, type_name))
    return [rows[i] for i in range(n.value)]


def _mirror(type_name, base, fields, offsets):
    """The ctypes class of fields [(name, ctype)], each offset checked against the library's:
    ImportError naming the field where ctypes lays it out elsewhere."""
    cls = type(type_name, (base,), {"_fields_": fields})
    for (name, _), off in zip(fields, offsets):
        if getattr(cls, name).offset != off:
            raise ImportError("kvtier: %s.%s lies at %d in the library, %d in ctypes' layout"
                              % (type_name, name, off, getattr(cls, name).offset))
    return cls


def described(type_name):
    """A ctypes mirror of public struct type_name laid out as the loaded library describes it
    (kvt_describe): a field the library gained reaches Python without a change here. Every
    field's offset is checked against the library's; a library that does not describe the
    struct, or a layout ctypes cannot reproduce, is an ImportError naming the struct."""
    fields, offsets = [], []
    for r in _rows("kvt_describe", kvt_field, type_name):
        if r.kind == FIELD_STRING:
            t = ctypes.c_char_p
        elif r.size in (4, 8):
            t = c_u32 if r.size == 4 else c_u64
        else:
            raise ImportError("kvtier: %s.%s is %d bytes wide, not a number this binding reads"
                              % (type_name, r.name.decode(), r.size))
        if r.kind == FIELD_ROOM:
            t = t * r.count
        fields.append((r.name.decode(), t))
        offsets.append(r.offset)
    return _mirror(type_name, ctypes.Structure, fields, offsets)


class kvt_config_field(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("help", ctypes.c_char_p), ("offset", c_u32),
                ("size", c_u32), ("type", c_u32), ("flags", c_u32), ("default", c_u64),
                ("min", c_u64), ("max", c_u64)]


CONFIG_UINT, CONFIG_INT, CONFIG_BOOL, CONFIG_STRING, CONFIG_ROOM, CONFIG_BYTES = range(6)
CONFIG_REQUIRED = 1


class ConfigRow:
    """One field of a configuration struct as the library describes it (kvt_describe_config):
    name, help, type (CONFIG_*), required, and for a number its default and inclusive bounds
    (Python ints, a signed field's as negative numbers where negative)."""
    __slots__ = ("name", "help", "type", "size", "offset", "required", "default", "min", "max")

    def __init__(self, r):
        self.name, self.help = r.name.decode(), r.help.decode()
        self.type, self.size, self.offset = r.type, r.size, r.offset
        self.required = bool(r.flags & CONFIG_REQUIRED)

        def signed(v):
            return v - (1 << 64) if r.type == CONFIG_INT and v >= 1 << 63 else v
        self.default, self.min, self.max = signed(r.default), signed(r.min), signed(r.max)


@functools.lru_cache(maxsize=None)
def config_rows(type_name):
    """The rows of configuration struct type_name, from the loaded library: {name: ConfigRow}
    in the header's order, read once per struct (callers must not change them). ImportError
    naming the struct where the library does not describe it."""
    rows = _rows("kvt_describe_config", kvt_config_field, type_name)
    return {r.name: r for r in map(ConfigRow, rows)}


def configured(type_name):
    """A checked ctypes mirror (Struct) of configuration struct type_name laid out as the
    library describes it (kvt_describe_config), each offset checked: ImportError naming the
    struct, never a wrong layout."""
    fields, offsets = [], []
    for r in config_rows(type_name).values():
        if r.type == CONFIG_BOOL:
            t = c_bool
        elif r.type == CONFIG_STRING:
            t = ctypes.c_char_p
        elif r.type == CONFIG_ROOM:
            t = c_u64 * (r.size // 8)
        elif r.type == CONFIG_BYTES:
            t = ctypes.c_uint8 * r.size
        elif r.size in (4, 8):
            t = {(4, False): c_u32, (8, False): c_u64, (4, True): ctypes.c_int32,
                 (8, True): c_i64}[(r.size, r.type == CONFIG_INT)]
        else:
            raise ImportError("kvtier: %s.%s is %d bytes wide, not a number this binding reads"
                              % (type_name, r.name, r.size))
        fields.append((r.name, t))
        offsets.append(r.offset)
    return _mirror(type_name, Struct, fields, offsets)


def _sig(name, res, *args):
    f = getattr(lib, name)
    f.restype = res
    f.argtypes = list(args)
    return f


vp = ctypes.c_void_p
cp = ctypes.c_char_p
u8p = P(ctypes.c_uint8)
_sig("kvt_sizeof", ctypes.c_size_t, cp)
_sig("kvt_strerror", cp, c_int)
_sig("kvt_err_name", cp, c_int)
_sig("kvt_last_error", cp)
_sig("kvt_version", cp)
_sig("kvt_hash_prompt", c_int, c_u64, P(c_u32), c_u32, c_u32, u8p, ctypes.c_size_t, u8p, c_u32,
     P(c_u32))
def _meta_sigs(t):
    """The functions every metadata struct t has: init, clear, release, validate, the codec."""
    kind = t.__name__
    _sig(kind + "_init", None, P(t))
    _sig(kind + "_clear", None, P(t))
    _sig(kind + "_release", None, P(t))
    _sig(kind + "_validate", c_int, P(t))
    _sig(kind + "_encoded_size", ctypes.c_size_t, P(t))
    _sig(kind + "_encode", c_int, P(t), vp, ctypes.c_size_t, P(ctypes.c_size_t))
    _sig(kind + "_decode", c_int, P(t), vp, ctypes.c_size_t)


class kvt_metrics_source(ctypes.Structure):
    _fields_ = [("text", cp), ("len", ctypes.c_size_t), ("labels", cp)]


_sig("kvt_metrics_merge", c_int, P(kvt_metrics_source), ctypes.c_size_t, cp, ctypes.c_size_t,
     P(ctypes.c_size_t))


def check_sizes(*types):
    """Holds each struct declared here to the library's own (kvt_sizeof): a mismatch refuses to
    load rather than corrupting memory."""
    for t in types:
        c = lib.kvt_sizeof(t.__name__.encode())
        if c != ctypes.sizeof(t):
            raise ImportError("kvtier: %s is %d bytes in the library but %d in the bindings; "
                              "the bindings do not match this libkvtier" % (
                                  t.__name__, c, ctypes.sizeof(t)))


check_sizes(kvt_str, kvt_bump, kvt_field)


class Handle:
    """An object of the library owned through a handle _h, freed by the class's _destroy:
    by close(), by leaving a with block, or at garbage collection."""
    _destroy = None

    def close(self):
        """Frees the object now (otherwise at garbage collection)."""
        h, self._h = getattr(self, "_h", None), None
        if h:
            type(self)._destroy(h)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    @staticmethod
    def getter(fn, doc=None, text=False):
        """A read-only property: library function fn of the handle (a C string decoded when
        text)."""
        def get(self):
            v = getattr(lib, fn)(self._h)
            return v.decode() if text else v
        return property(get, doc=doc)


class Meta:
    """A metadata struct held by value in _m: _kind names it (kvt_offload_meta, ...); its
    _init runs at construction and its _release at garbage collection."""
    _kind = None

    def __init__(self):
        self._m = globals()[self._kind]()
        getattr(lib, self._kind + "_init")(ctypes.byref(self._m))

    def __del__(self):
        getattr(lib, self._kind + "_release")(ctypes.byref(self._m))

    @staticmethod
    def field(name, conv=None):
        """A property reading and writing field `name` of _m (written through conv)."""
        return property(lambda self: getattr(self._m, name),
                        lambda self, v: setattr(self._m, name, conv(v) if conv else v))


# the declarations of the offload side and of the encoder cache, in this one namespace
from ._kv_decl import *  # noqa: E402,F401,F403
from ._ec_decl import *  # noqa: E402,F401,F403
