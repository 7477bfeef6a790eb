# SPDX-License-Identifier: Apache-2.0
"""What every module of the package shares: the error type and its check, the library's
version, the handle base classes, and the codecs between ctypes structs and bytes."""
import ctypes

from . import _lib as L

_lib = L.lib


class KvtierError(Exception):
    """A kvtier call failed: .code (negative KVT_E* value), .name ("KVT_EINVAL"), .message."""

    def __init__(self, code, message):
        self.code = code
        self.name = _lib.kvt_err_name(code).decode()
        self.message = message
        super().__init__("%s: %s" % (self.name, message or _lib.kvt_strerror(code).decode()))


def _check(rc):
    if rc < 0:
        raise KvtierError(rc, _lib.kvt_last_error().decode(errors="replace"))
    return rc


def version():
    """The library's version string."""
    return _lib.kvt_version().decode()


def _u32_array(values):
    values = list(values)
    return (L.c_u32 * max(1, len(values)))(*values), len(values)


_Handle = L.Handle
_getter = L.Handle.getter


def _encode(kind, m):
    """Wire encoding of a message struct through kind_encoded_size / kind_encode."""
    n = getattr(_lib, kind + "_encoded_size")(ctypes.byref(m))
    buf = ctypes.create_string_buffer(n)
    got = ctypes.c_size_t()
    _check(getattr(_lib, kind + "_encode")(ctypes.byref(m), buf, n, ctypes.byref(got)))
    return buf.raw[:got.value]


def _decode(cls, kind, data):
    self = cls()
    _check(getattr(_lib, kind + "_decode")(ctypes.byref(self._m), data, len(data)))
    return self


class _Message(L.Meta):
    """A message between scheduler and workers (its struct named by _kind) with a wire
    encoding."""

    def encode(self):
        """The wire encoding (docs/wire.md)."""
        return _encode(self._kind, self._m)

    @classmethod
    def decode(cls, data):
        """Decodes and validates an encoded message (KvtierError on anything malformed)."""
        return _decode(cls, cls._kind, data)


def _address(obj):
    """(address, bytes, device) of a writable buffer, numpy array or torch tensor."""
    if hasattr(obj, "data_ptr"):  # torch.Tensor
        dev = obj.device.index if obj.device.type == "cuda" else L.HOST_DEVICE
        return obj.data_ptr(), obj.element_size() * obj.numel(), dev
    if hasattr(obj, "__array_interface__"):  # numpy
        return obj.__array_interface__["data"][0], obj.nbytes, L.HOST_DEVICE
    view = memoryview(obj)
    if view.readonly:
        raise ValueError("kvtier: the buffer must be writable")
    raw = (ctypes.c_char * view.nbytes).from_buffer(obj)
    return ctypes.addressof(raw), view.nbytes, L.HOST_DEVICE
