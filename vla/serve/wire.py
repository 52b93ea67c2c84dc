"""The wire format both ends of `vla-serve` speak: msgpack, with numpy arrays as raw bytes + dtype + shape.

It is openpi's (`openpi_client.msgpack_numpy`), so the unmodified `openpi-client` package talks to our
server: an array travels as the map {b"__ndarray__": True, b"data": bytes, b"dtype": "<f4", b"shape": [..]},
a numpy scalar as {b"__npgeneric__": True, b"data": value, b"dtype": "<f4"}. Never pickle: decoding builds
arrays of plain numeric dtypes from their bytes and nothing else, and checks that the bytes match the
shape, so a malformed or hostile message is a `WireError`, never code run or memory claimed on its behalf.

numpy and msgpack only: the robot-side client (`vla.policy.remote`) imports this.
"""

from __future__ import annotations

import math

import msgpack
import numpy as np

# numpy dtype kinds a message may carry: bool, signed and unsigned integers, floats. Object, void, complex,
# string and time dtypes are refused (openpi's encoder refuses object, void and complex as well).
ARRAY_KINDS = frozenset("biuf")
MAX_NDIM = 8  # an observation is at most (cameras, H, W, C); anything deeper is not one of ours


class WireError(ValueError):
    """A message that is not well-formed msgpack with numpy arrays in openpi's layout."""


def _encode(obj):
    """msgpack's hook for what it cannot pack itself: numpy arrays and scalars (openpi's layout)."""
    if isinstance(obj, np.ndarray | np.generic) and obj.dtype.kind not in ARRAY_KINDS:
        raise WireError(f"cannot send a numpy array of dtype {obj.dtype} (only bool, integer and float)")
    if isinstance(obj, np.ndarray):
        array = np.ascontiguousarray(obj)
        return {b"__ndarray__": True, b"data": array.tobytes(), b"dtype": array.dtype.str, b"shape": array.shape}
    if isinstance(obj, np.generic):
        return {b"__npgeneric__": True, b"data": obj.item(), b"dtype": obj.dtype.str}
    raise WireError(f"cannot send a {type(obj).__name__} (send numbers, strings, lists, dicts and numpy arrays)")


def _dtype(text) -> np.dtype:
    try:
        dtype = np.dtype(text if isinstance(text, str) else bytes(text).decode())
    except (TypeError, ValueError, UnicodeDecodeError):
        raise WireError(f"array dtype {text!r} is not a numpy dtype") from None
    if dtype.kind not in ARRAY_KINDS or dtype.hasobject:
        raise WireError(f"array dtype {dtype} is refused (only bool, integer and float)")
    return dtype


def _decode(obj: dict):
    """msgpack's hook for every map: an array or scalar in openpi's layout, checked, else the map itself."""
    if b"__ndarray__" in obj:
        dtype, shape, data = _dtype(obj.get(b"dtype")), obj.get(b"shape"), obj.get(b"data")
        if not isinstance(data, bytes):
            raise WireError("array data must be bytes")
        ok = isinstance(shape, list | tuple) and len(shape) <= MAX_NDIM
        if not ok or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
            raise WireError(f"array shape {shape!r} must be a list of at most {MAX_NDIM} non-negative integers")
        if math.prod(shape) * dtype.itemsize != len(data):
            need = math.prod(shape) * dtype.itemsize
            raise WireError(f"array of {dtype} {tuple(shape)} needs {need} bytes, got {len(data)}")
        return np.frombuffer(data, dtype=dtype).reshape(shape)  # read-only: a view of the message
    if b"__npgeneric__" in obj:
        value = obj.get(b"data")
        if not isinstance(value, bool | int | float):
            raise WireError("a numpy scalar's data must be a number")
        return _dtype(obj.get(b"dtype")).type(value)
    return obj


def pack(obj) -> bytes:
    """A message (dicts, lists, str, numbers, numpy arrays) as msgpack bytes in openpi's layout."""
    return msgpack.packb(obj, default=_encode)


def unpack(data: bytes):
    """msgpack bytes -> the message, numpy arrays rebuilt (read-only); anything malformed is a WireError."""
    try:
        return msgpack.unpackb(data, object_hook=_decode)
    except WireError:
        raise
    except Exception as e:  # msgpack's many errors (truncated, extra data, bad types, too deep): one kind to us
        raise WireError(f"not a msgpack message ({type(e).__name__}: {e})") from None
