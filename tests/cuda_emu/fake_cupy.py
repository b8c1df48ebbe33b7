"""The part of CuPy's API that gear_flow.gpu uses, over NumPy, for the CPU emulation.

``ndarray`` is a NumPy subclass so that "device" and host arrays stay
distinguishable (a plain NumPy array passed where a device array is required
is refused, as CuPy would refuse it).
"""

from __future__ import annotations

import contextlib
import ctypes
import time
from types import SimpleNamespace

import numpy as np


class ndarray(np.ndarray):  # noqa: N801  (CuPy's name)
    @property
    def data(self):  # CuPy: a MemoryPointer with .ptr
        return SimpleNamespace(ptr=self.ctypes.data)

    def set(self, arr, stream=None):
        arr = np.asarray(arr)
        assert arr.shape == self.shape and arr.dtype == self.dtype and self.flags.c_contiguous
        np.copyto(self.view(np.ndarray), arr)

    def get(self, stream=None, order="C", out=None, blocking=True):
        host = np.array(self.view(np.ndarray), order=order)
        if out is None:
            return host
        out[...] = host
        return out


def _dev(a) -> ndarray:
    return a.view(ndarray)


def asarray(a, dtype=None):
    if isinstance(a, ndarray) and (dtype is None or a.dtype == np.dtype(dtype)):
        return a
    return _dev(np.array(np.asarray(a), dtype=dtype, copy=True))


def ascontiguousarray(a, dtype=None):
    if isinstance(a, ndarray) and a.flags.c_contiguous and (dtype is None or a.dtype == np.dtype(dtype)):
        return a
    return _dev(np.ascontiguousarray(np.asarray(a), dtype=dtype))


def array(a, dtype=None):
    return _dev(np.array(np.asarray(a), dtype=dtype, copy=True))


def asnumpy(a):
    return np.array(np.asarray(a).view(np.ndarray))


def empty(shape, dtype=np.float64):
    # poisoned, so that an unwritten output never passes for zeros
    a = np.empty(shape, dtype=dtype)
    a.view(np.uint8)[...] = 0xA5
    return _dev(a)


def zeros(shape, dtype=np.float64):
    return _dev(np.zeros(shape, dtype=dtype))


def full(shape, value, dtype=None):
    return _dev(np.full(shape, value, dtype=dtype))


def stack(arrays):
    return _dev(np.stack([np.asarray(a) for a in arrays]))


def concatenate(arrays):
    return _dev(np.concatenate([np.asarray(a) for a in arrays]))


# -- cupy.cuda ------------------------------------------------------------------------------------


class _Event:
    def __init__(self, block=False, disable_timing=False, interprocess=False):
        self.t = 0.0

    def record(self, stream=None):
        self.t = time.perf_counter()

    def synchronize(self):
        pass


def _elapsed_ms(a: _Event, b: _Event) -> float:
    return (b.t - a.t) * 1e3


class _Graph:
    def __init__(self, calls):
        self.calls = calls

    def launch(self, stream=None):
        for f, a in self.calls:
            f(*a)


class _Stream:
    ptr = 0

    def __init__(self, *a, **k):
        pass

    def begin_capture(self, mode=None):
        raise RuntimeError("stream capture is not emulated")

    def end_capture(self):
        return _Graph([])

    def wait_event(self, event):
        pass

    def record(self, event=None):
        return event or _Event()

    def synchronize(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _Runtime:
    memoryTypeUnregistered, memoryTypeHost, memoryTypeDevice, memoryTypeManaged = 0, 1, 2, 3
    #: addresses of "pinned" allocations: (start, end)
    pinned: list = []

    memcpyDefault = 4

    @staticmethod
    def getDevice():
        return 0

    @staticmethod
    def memcpyAsync(dst, src, size, kind, stream):
        ctypes.memmove(dst, src, size)

    @staticmethod
    def getDeviceProperties(device):
        return {"name": b"CUDA emulation", "multiProcessorCount": 1, "totalGlobalMem": 1 << 30}

    @staticmethod
    def runtimeGetVersion():
        return 0

    driverGetVersion = runtimeGetVersion

    @classmethod
    def pointerGetAttributes(cls, ptr):
        pinned = any(a <= ptr < b for a, b in cls.pinned)
        return SimpleNamespace(
            type=cls.memoryTypeHost if pinned else cls.memoryTypeUnregistered,
            devicePointer=ptr if pinned else 0,
            hostPointer=ptr,
            device=0,
        )


class _Device:
    compute_capability = "emulated"

    def __init__(self, device=None):
        self.id = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _alloc_pinned_memory(nbytes):
    buf = bytearray(nbytes)
    addr = np.frombuffer(buf, dtype=np.uint8).ctypes.data
    _Runtime.pinned.append((addr, addr + nbytes))
    return buf  # keeps the memory alive through np.frombuffer(...).base


cuda = SimpleNamespace(
    is_available=lambda: True,
    runtime=_Runtime,
    Device=_Device,
    Event=_Event,
    Stream=_Stream,
    ExternalStream=_Stream,
    get_current_stream=lambda: _Stream(),
    get_elapsed_time=_elapsed_ms,
    alloc_pinned_memory=_alloc_pinned_memory,
)

_rng = np.random.default_rng(0)
random = SimpleNamespace(
    random=lambda size=None, dtype=np.float64: _dev(np.asarray(_rng.random(size)).astype(dtype)),
    randint=lambda low, high=None, size=None, dtype=np.int64: _dev(
        np.asarray(_rng.integers(low, high, size)).astype(dtype)
    ),
)
__version__ = "emulated"

nullcontext = contextlib.nullcontext
