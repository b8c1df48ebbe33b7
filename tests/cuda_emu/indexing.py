"""Indexing and memory helpers of the emulation's ``cupy.ndarray`` (see :mod:`.ndarray`)."""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided

from . import streams


class DeviceArray:
    """Base of the fake ``cupy.ndarray``: ``_a`` is its NumPy view of (emulated) device memory."""

    _a: np.ndarray


def _res(x):
    """What queued work reads: a device array's memory as it is when the work runs, anything else as is."""
    return x._a if isinstance(x, DeviceArray) else x


def _alloc(shape, dtype, poison: bool = True) -> np.ndarray:
    dtype = np.dtype(dtype)
    shape = (int(shape),) if np.ndim(shape) == 0 else tuple(int(s) for s in shape)
    if any(s < 0 for s in shape):
        raise ValueError(f"negative dimensions are not allowed: {shape}")
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + 256, np.uint8)
    off = (-raw.ctypes.data) % 256
    buf = raw[off : off + nbytes]
    if poison:
        buf[...] = 0xA5
    streams.DEVICE.add(raw, int(buf.ctypes.data), nbytes)
    return buf.view(dtype).reshape(shape)


def _zero_strided(shape, dtype) -> np.ndarray:
    return as_strided(np.zeros(1, dtype), shape=shape, strides=(0,) * len(shape), writeable=False)


def _is_basic(e) -> bool:
    if e is None or e is Ellipsis or isinstance(e, slice):
        return True
    return isinstance(e, (int, np.integer)) and not isinstance(e, (bool, np.bool_))


def _key(key) -> tuple:
    return key if isinstance(key, tuple) else (key,)


def _view_key(k: tuple) -> tuple:
    return k if any(e is Ellipsis for e in k) else (*k, Ellipsis)  # a 0-d view, never a NumPy scalar


def _index_arrays(self, k: tuple):
    """Advanced key: host arrays uploaded (snapshot), the axis each index applies to, any bool mask."""
    consumed = sum(_consumes(e) for e in k)
    out, axes, axis, mask = [], [], 0, False
    for e in k:
        if e is Ellipsis:
            out.append(e)
            axes.append(None)
            axis += self.ndim - consumed
            continue
        if e is None or _is_basic(e):
            out.append(e)
            axes.append(None)
            axis += 0 if e is None else 1
            continue
        a = e if isinstance(e, DeviceArray) else np.array(e)
        if a.dtype == np.bool_:
            mask = True
            out.append(a)
            axes.append(None)
            axis += a.ndim
            continue
        if a.dtype.kind not in "iu":
            raise IndexError("arrays used as indices must be of integer (or boolean) type")
        out.append(a)
        axes.append(axis)
        axis += 1
    return out, axes, mask


def _consumes(e) -> int:
    """How many axes of the indexed array an element of a key consumes."""
    if e is None or e is Ellipsis or isinstance(e, (bool, np.bool_)):
        return 0
    if _is_basic(e):
        return 1
    a = e if isinstance(e, DeviceArray) else np.asarray(e)
    return a.ndim if a.dtype == np.bool_ else 1


def _host_key(self, k, axes) -> tuple:
    """The key with device indices read now and integer indices wrapped (CuPy wraps, NumPy raises)."""
    out = []
    for e, ax in zip(k, axes):
        v = _res(e)
        if ax is not None and self.shape[ax]:
            v = np.mod(v, self.shape[ax])
        out.append(v)
    return tuple(out)


def _check_fits(vshape: tuple, dshape: tuple) -> None:
    vshape = tuple(vshape)
    while len(vshape) > len(dshape) and vshape[0] == 1:  # CuPy squeezes leading unit dims
        vshape = vshape[1:]
    try:
        ok = np.broadcast_shapes(vshape, dshape) == tuple(dshape)
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"could not broadcast input array from shape {vshape} into shape {dshape}")
