"""The part of CuPy's API that gear_flow.gpu, pipelines/gpu_check.py and the parity cases use, for the emulation.

Arrays are :class:`.ndarray.ndarray` (not NumPy arrays: implicit host
conversion raises, as with CuPy); streams and events are
:mod:`.streams` (device work is queued and runs when the host waits for it).
Module-level constructors follow CuPy: host data given to ``asarray``/``array``
is uploaded on the current stream (pageable memory is read at the call, pinned
memory when the copy runs), ``zeros``/``full``/``cupy.random`` fill on the
current stream: the new array holds the allocation's poison for any other
stream until that one has waited for it.  ``stack``/``concatenate`` take
device arrays only.
Any NumPy ufunc is available by name (``cupy.maximum``...), as device work.
"""

from __future__ import annotations

import ctypes
import functools
from types import SimpleNamespace

import numpy as np

from . import ndarray as _nd
from . import streams
from .ndarray import MemoryPointer, ndarray
from .ufuncs import ufunc

__version__ = "emulated"
bool_, int32, int64, uint8, uint32, uint64, float32, float64 = (
    np.bool_, np.int32, np.int64, np.uint8, np.uint32, np.uint64, np.float32, np.float64,
)  # fmt: skip


def _upload(host: np.ndarray) -> ndarray:
    """A new device array holding ``host``, copied on the current stream (poison until the copy runs).

    Pinned host memory is read when the copy runs; any other host data is read
    now (CuPy stages pageable memory through a buffer of its own).
    """
    out = ndarray(host.shape, host.dtype)
    pinned = host.size and streams.is_pinned(int(host.ctypes.data)) and host.flags.c_contiguous
    src, dst = (host if pinned else host.copy()), out._a
    streams.get_current_stream()._enqueue(lambda: np.copyto(dst, src), "copy from host")
    return out


def array(obj, dtype=None, copy=True, order="K", subok=False, ndmin=0, *, blocking=False) -> ndarray:
    if isinstance(obj, ndarray):
        a = obj.astype(obj.dtype if dtype is None else dtype, copy=copy)
        return a.reshape((1,) * (ndmin - a.ndim) + a.shape) if a.ndim < ndmin else a
    if isinstance(obj, (list, tuple)) and any(isinstance(x, ndarray) for x in obj):
        return stack([asarray(x, dtype) for x in obj])
    return _upload(np.array(obj, dtype=dtype, copy=None, ndmin=ndmin))  # a pinned source stays pinned


def asarray(a, dtype=None, order=None, *, blocking=False) -> ndarray:
    if isinstance(a, ndarray):
        return a.astype(a.dtype if dtype is None else dtype, copy=False)
    return array(a, dtype=dtype, copy=False, blocking=blocking)


def ascontiguousarray(a, dtype=None) -> ndarray:
    a = asarray(a, dtype)
    return a if a.flags.c_contiguous else a.copy()


def asnumpy(a, stream=None, order="C", out=None, *, blocking=True) -> np.ndarray:
    if isinstance(a, ndarray):
        return a.get(stream=stream, order=order, out=out, blocking=blocking)
    temp = np.asarray(a, order=order)
    if out is not None:
        out[...] = temp
        return out
    return temp


def empty(shape, dtype=float, order="C") -> ndarray:
    return ndarray(shape, dtype)  # poisoned (0xA5), so that an unwritten output never passes for zeros


def _filled(shape, value, dtype) -> ndarray:
    """A new array set to ``value`` by a memset/fill on the current stream (poison until it runs)."""
    out = ndarray(shape, dtype)
    out.fill(value)
    return out


def zeros(shape, dtype=float, order="C") -> ndarray:
    return _filled(shape, 0, dtype)


def ones(shape, dtype=float, order="C") -> ndarray:
    return _filled(shape, 1, dtype)


def full(shape, fill_value, dtype=None, order="C") -> ndarray:
    if isinstance(fill_value, ndarray):
        out = empty(shape, fill_value.dtype if dtype is None else dtype)
        out.fill(fill_value)
        return out
    return _filled(shape, fill_value, np.asarray(fill_value).dtype if dtype is None else dtype)


def empty_like(a, dtype=None) -> ndarray:
    return empty(a.shape, a.dtype if dtype is None else dtype)


def zeros_like(a, dtype=None) -> ndarray:
    return zeros(a.shape, a.dtype if dtype is None else dtype)


def arange(start, stop=None, step=1, dtype=None) -> ndarray:
    return _upload(np.arange(start, stop, step, dtype=dtype) if stop is not None else np.arange(start, dtype=dtype))


def _device_only(arrays, what: str) -> list:
    arrays = list(arrays)
    for a in arrays:
        if not isinstance(a, ndarray):
            raise TypeError(f"Only cupy arrays can be {what}, got {type(a)}")
    return arrays


def concatenate(arrays, axis=0, out=None, dtype=None) -> ndarray:
    arrays = _device_only(arrays, "concatenated")
    probe = np.concatenate([np.empty(a.shape, a.dtype) for a in arrays], axis=axis, dtype=dtype)
    res = ndarray(probe.shape, probe.dtype)
    o, srcs = res._a, [a._a for a in arrays]
    streams.get_current_stream()._enqueue(lambda: np.concatenate(srcs, axis=axis, out=o), "concatenate")
    return res


def stack(arrays, axis=0, out=None, dtype=None) -> ndarray:
    arrays = _device_only(arrays, "stacked")
    return concatenate([a.reshape(np.expand_dims(np.empty(a.shape, np.uint8), axis).shape) for a in arrays],
                       axis=axis, dtype=dtype)  # fmt: skip


def __getattr__(name: str):
    uf = getattr(np, name, None)
    if isinstance(uf, np.ufunc) and uf.nout == 1:  # cupy.maximum(a, b), cupy.sqrt(a), ...
        return functools.wraps(uf)(functools.partial(ufunc, uf))
    raise AttributeError(f"the CUDA emulation's cupy has no attribute {name!r}")


# -- cupy.cuda ------------------------------------------------------------------------------------------


class CUDARuntimeError(RuntimeError):
    """``cupy.cuda.runtime.CUDARuntimeError``: a failed CUDA runtime call, with its status."""

    def __init__(self, status: int, name: str):
        self.status = status
        super().__init__(f"{name}: see the CUDA runtime API")


class _Runtime:
    CUDARuntimeError = CUDARuntimeError
    memoryTypeUnregistered, memoryTypeHost, memoryTypeDevice, memoryTypeManaged = 0, 1, 2, 3
    memcpyHostToHost, memcpyHostToDevice, memcpyDeviceToHost, memcpyDeviceToDevice, memcpyDefault = 0, 1, 2, 3, 4
    streamLegacy, streamPerThread = 1, 2

    @staticmethod
    def getDevice() -> int:
        return 0

    @staticmethod
    def getDeviceCount() -> int:
        return 1

    @staticmethod
    def deviceSynchronize() -> None:
        streams.synchronize_device()

    @staticmethod
    def memcpyAsync(dst: int, src: int, size: int, kind: int, stream: int) -> None:
        """Queued on the stream with handle ``stream``; pageable sources are read now (CUDA stages them)."""
        if streams.is_pinned(src) or src in streams.DEVICE:
            streams.external_stream(stream)._enqueue(lambda: ctypes.memmove(dst, src, size), "memcpyAsync")
            return
        staged = ctypes.create_string_buffer(ctypes.string_at(src, size), size)
        streams.external_stream(stream)._enqueue(lambda: ctypes.memmove(dst, staged, size), "memcpyAsync")

    @staticmethod
    def memcpy(dst: int, src: int, size: int, kind: int) -> None:
        streams.synchronize_device()
        ctypes.memmove(dst, src, size)

    @staticmethod
    def hostRegister(ptr: int, size: int, flags: int) -> None:
        """Page-lock host memory in place: it counts as pinned (kernels may read it) until unregistered."""
        if streams.PINNED.overlaps(ptr, size):
            raise CUDARuntimeError(712, "cudaErrorHostMemoryAlreadyRegistered")
        streams.PINNED.add(None, ptr, size)

    @staticmethod
    def hostUnregister(ptr: int) -> None:
        if not streams.PINNED.remove(ptr):
            raise CUDARuntimeError(713, "cudaErrorHostMemoryNotRegistered")

    @staticmethod
    def getDeviceProperties(device):
        return {"name": b"CUDA emulation", "multiProcessorCount": 1, "totalGlobalMem": 1 << 30}

    @staticmethod
    def runtimeGetVersion() -> int:
        return 0

    driverGetVersion = runtimeGetVersion

    @classmethod
    def pointerGetAttributes(cls, ptr: int):
        kind = (
            cls.memoryTypeHost if streams.is_pinned(ptr)
            else cls.memoryTypeDevice if ptr in streams.DEVICE else cls.memoryTypeUnregistered
        )  # fmt: skip
        return SimpleNamespace(type=kind, devicePointer=ptr if kind else 0, hostPointer=ptr, device=0)


class _Device:
    compute_capability = "emulated"

    def __init__(self, device=None):
        self.id = 0

    def synchronize(self) -> None:
        streams.synchronize_device()

    def use(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _alloc_pinned_memory(nbytes: int):
    """Page-locked host memory (a NumPy buffer: ``np.frombuffer`` works on it as on CuPy's)."""
    mem = np.empty(max(int(nbytes), 1), np.uint8)
    streams.PINNED.add(mem, int(mem.ctypes.data), mem.nbytes)
    return mem


def _stream_factory(null=False, non_blocking=False, ptr=0, priority=0):
    return streams.Stream(null=null, non_blocking=non_blocking, ptr=ptr, priority=priority)


_stream_factory.null = streams.Stream.null  # type: ignore[attr-defined]

cuda = SimpleNamespace(
    is_available=lambda: True,
    runtime=_Runtime,
    Device=_Device,
    Event=streams.Event,
    Stream=_stream_factory,
    ExternalStream=streams.external_stream,
    MemoryPointer=MemoryPointer,
    get_current_stream=streams.get_current_stream,
    get_elapsed_time=streams.get_elapsed_time,
    alloc_pinned_memory=_alloc_pinned_memory,
)

# -- cupy.random: host draws (one seeded generator), uploaded --------------------------------------------

_rng = np.random.default_rng(0)
random = SimpleNamespace(
    random=lambda size=None, dtype=np.float64: _upload(np.asarray(_rng.random(size)).astype(dtype)),
    randint=lambda low, high=None, size=None, dtype=np.int64: _upload(
        np.asarray(_rng.integers(low, high, size)).astype(dtype)
    ),
)

_nd.module = __import__(__name__, fromlist=["_"])
