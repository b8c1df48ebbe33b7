"""The emulation's ``cupy.ndarray``: device memory that the host cannot touch implicitly.

Not a NumPy subclass: it owns a host buffer (256-byte aligned, as CuPy's pool
allocates, poisoned with 0xA5 until device work writes it) that the emulated
kernels reach through ``.data.ptr`` / ``__cuda_array_interface__``.  Every
operation that CuPy runs as device work is queued on the current stream (see
:mod:`.streams`) and reads its inputs when it runs; views (basic indexing,
``reshape`` of contiguous data, ``view``, ``T``) are metadata and immediate.

Where CuPy refuses, this raises the same exception type:

* ``numpy.asarray(a)`` / ``a.__array__()``: ``TypeError`` (implicit conversion);
* a NumPy array (or list) as an operand of an arithmetic or comparison
  operator or ufunc: ``TypeError("Unsupported type ...")`` (a 0-d NumPy array
  is accepted by comparisons only, as in CuPy);
* ``a[basic] = numpy_array`` (non-scalar): ``ValueError`` (CuPy goes through
  ``fill``; it accepts host values only with advanced indices, where it
  uploads them);
* ``get``/``set`` with a mismatched ``out``/``arr``: CuPy's checks.

Host reads (``get``, ``float()``, ``int()``, ``bool()``, ``item()``,
``tolist()``, ``repr``, DLPack export) run the current stream first, as the
copies CuPy issues for them do.  Integer array indices wrap around, as CuPy's
do, instead of raising.
"""

from __future__ import annotations

import warnings

import numpy as np

from . import streams
from .indexing import (
    DeviceArray,
    _alloc,
    _check_fits,
    _host_key,
    _index_arrays,
    _is_basic,
    _key,
    _res,
    _view_key,
    _zero_strided,
)

#: set by fake_cupy: where ``__array_function__`` looks functions up
module = None


def _current() -> streams.Stream:
    return streams.get_current_stream()


def module_ref():
    """The fake ``cupy`` module (for functions looked up by name)."""
    return module


class _Flags:
    def __init__(self, a: np.ndarray, own: bool):
        self.c_contiguous = bool(a.flags.c_contiguous)
        self.f_contiguous = bool(a.flags.f_contiguous)
        self.owndata = own

    def __getitem__(self, name: str) -> bool:
        return {"C_CONTIGUOUS": self.c_contiguous, "F_CONTIGUOUS": self.f_contiguous, "OWNDATA": self.owndata}[name]


class MemoryPointer:
    """``cupy.cuda.MemoryPointer``: the device address of an array's first element."""

    def __init__(self, ptr: int):
        self.ptr = ptr
        self.device_id = 0

    def __int__(self) -> int:
        return self.ptr


class ndarray(DeviceArray):  # noqa: N801  (CuPy's name)
    """``cupy.ndarray`` of the emulation (see the module docstring)."""

    __array_priority__ = 100

    def __init__(self, shape, dtype=float, memptr=None, strides=None, order="C"):
        if memptr is not None or strides is not None or order not in ("C", None):
            raise NotImplementedError("the emulation allocates C-ordered arrays only")
        self._a = _alloc(shape, dtype)
        self.base = None

    @classmethod
    def _wrap(cls, a: np.ndarray, base=None) -> ndarray:
        self = cls.__new__(cls)
        self._a = a
        self.base = base
        return self

    # -- attributes -------------------------------------------------------------------------------
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    strides = property(lambda self: self._a.strides)
    size = property(lambda self: self._a.size)
    nbytes = property(lambda self: self._a.nbytes)
    ndim = property(lambda self: self._a.ndim)
    itemsize = property(lambda self: self._a.itemsize)
    flags = property(lambda self: _Flags(self._a, self.base is None))
    data = property(lambda self: MemoryPointer(int(self._a.ctypes.data)))
    T = property(lambda self: self.transpose())

    @property
    def device(self):
        return module.cuda.Device(0)

    @property
    def __cuda_array_interface__(self) -> dict:
        return {
            "shape": self.shape,
            "typestr": self.dtype.str,
            "descr": self._a.__array_interface__["descr"],
            "strides": None if self._a.flags.c_contiguous else self.strides,
            "data": (int(self._a.ctypes.data) if self.size else 0, False),
            "version": 3,
            "stream": _current().ptr or 1,
        }

    # -- refused implicit conversions ------------------------------------------------------------
    def __array__(self, dtype=None, copy=None):
        raise TypeError(
            "Implicit conversion to a NumPy array is not allowed. Please use `.get()` to construct a NumPy array "
            "explicitly."
        )

    def __array_ufunc__(self, uf, method, *inputs, **kwargs):
        if method != "__call__" or uf.nout != 1:
            return NotImplemented
        out = kwargs.pop("out", None)
        if isinstance(out, tuple):
            (out,) = out
        if uf.__name__ in ufuncs.COMPARISONS:  # CuPy takes a 0-d NumPy array here (numpy/numpy#12142)
            inputs = tuple(x.item() if isinstance(x, np.ndarray) and x.ndim == 0 else x for x in inputs)
        return ufuncs.ufunc(uf, *inputs, out=out, dtype=kwargs.pop("dtype", None))

    def __array_function__(self, func, types, args, kwargs):
        f = getattr(module, func.__name__, None)
        if f is None or f is func or not all(issubclass(t, (ndarray, np.ndarray)) for t in types):
            return NotImplemented
        return f(*args, **kwargs)

    # -- host transfers ---------------------------------------------------------------------------
    def get(self, stream=None, order="C", out=None, blocking=True) -> np.ndarray:
        """Copy to the host on ``stream`` (default: the current one); ``blocking`` waits for it."""
        s = _current() if stream is None else stream
        if out is not None:
            if not isinstance(out, np.ndarray):
                raise TypeError("Only numpy.ndarray can be obtained from cupy.ndarray")
            if out.dtype != self.dtype:
                raise TypeError(f"{out.dtype} array cannot be obtained from {self.dtype} array")
            if out.shape != self.shape:
                raise ValueError(f"Shape mismatch. Expected shape: {self.shape}, actual shape: {out.shape}")
            host = out
        else:
            host = np.empty(self.shape, self.dtype, order="F" if order == "F" else "C")
        src = self._a
        s._enqueue(lambda: np.copyto(host, src), "copy to host")
        if blocking:
            s.synchronize()
        return host

    def set(self, arr, stream=None) -> None:
        """Copy host ``arr`` in on ``stream``: pageable memory is read now, pinned memory when the copy runs."""
        if not isinstance(arr, np.ndarray):
            raise TypeError("Only numpy.ndarray can be set to cupy.ndarray")
        if self.dtype != arr.dtype:
            raise TypeError(f"{arr.dtype} array cannot be set to {self.dtype} array")
        if self.shape != arr.shape:
            raise ValueError(f"Shape mismatch. Old shape: {self.shape}, new shape: {arr.shape}")
        if not self._a.flags.c_contiguous:
            raise RuntimeError("Cannot set to non-contiguous array")
        src = np.ascontiguousarray(arr)
        if not (src.size and streams.is_pinned(int(src.ctypes.data))):
            src = src.copy()
        dst = self._a
        (_current() if stream is None else stream)._enqueue(lambda: np.copyto(dst, src), "copy from host")

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)  # kDLCPU: torch here is CPU-only; the memory is host memory

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """Export to a consumer on the host (``__dlpack_device__`` says CPU: torch is CPU-only here).

        The handshake as CuPy does it: the consumer's ``stream`` is made to wait for CuPy's
        current stream (``-1``: no ordering).  The consumer here is the host, so ``None`` (and
        torch's stream, a :class:`~cuda_emu.streams.HostStream`) means: run the current stream now.
        """
        cur = _current()
        if stream is None:
            cur.synchronize()
        elif stream != -1:
            streams.external_stream(stream).wait_event(cur.record())
        kw = {"max_version": max_version, "dl_device": dl_device, "copy": copy}
        return self._a.__dlpack__(**{k: v for k, v in kw.items() if v is not None})

    def __float__(self) -> float:
        return float(self.get())

    def __int__(self) -> int:
        return int(self.get())

    def __complex__(self) -> complex:
        return complex(self.get())

    def __bool__(self) -> bool:
        if self.size == 0:
            warnings.warn("The truth value of an empty array is ambiguous.", DeprecationWarning, stacklevel=2)
            return False
        if self.size == 1:
            return bool(self.get())
        raise ValueError("The truth value of an array with more than one element is ambiguous. Use a.any() or a.all()")

    def item(self):
        if self.size != 1:
            raise ValueError("can only convert an array of size 1 to a Python scalar")
        return self.get().item()

    def tolist(self):
        return self.get().tolist()

    def __repr__(self) -> str:
        return repr(self.get())

    def __str__(self) -> str:
        return str(self.get())

    def __format__(self, spec: str) -> str:
        return format(self.get(), spec)

    def __reduce__(self):
        return module.array, (self.get(),)

    def __copy__(self):
        return self.copy()

    def __deepcopy__(self, memo):
        return self.copy()

    # -- container --------------------------------------------------------------------------------
    def __len__(self) -> int:
        if self.ndim == 0:
            raise TypeError("len() of unsized object")
        return self.shape[0]

    def __iter__(self):
        if self.ndim == 0:
            raise TypeError("iteration over a 0-d array")
        return (self[i] for i in range(self.shape[0]))

    def __getitem__(self, key):
        k = _key(key)
        if all(_is_basic(e) for e in k):
            return ndarray._wrap(self._a[_view_key(k)], self)
        k, axes, mask = _index_arrays(self, k)
        if mask:  # the result's size depends on the mask: CuPy synchronises here
            _current().synchronize()
            res = self._a[_host_key(self, k, axes)]
            out = ndarray(res.shape, res.dtype)
            out._a[...] = res
            return out
        probe = _zero_strided(self.shape, self.dtype)[tuple(np.zeros(e.shape, np.intp) if ax is not None else e
                                                            for e, ax in zip(k, axes))]  # fmt: skip
        out = ndarray(probe.shape, self.dtype)
        o, src = out._a, self._a
        _current()._enqueue(lambda: o.__setitem__(Ellipsis, src[_host_key(self, k, axes)]), "take")
        return out

    def __setitem__(self, key, value):
        k = _key(key)
        if all(_is_basic(e) for e in k):
            dst = self._a[_view_key(k)]
            if isinstance(value, ndarray):
                _check_fits(value.shape, dst.shape)
            elif not (type(value) in ufuncs.SCALARS or isinstance(value, np.generic)):
                host = np.asarray(value, dtype=self.dtype)  # CuPy: ndarray.fill, which takes scalars only
                if host.shape != ():
                    raise ValueError("non-scalar numpy.ndarray cannot be used for fill")
                value = host[()]
            _current()._enqueue(lambda: dst.__setitem__(Ellipsis, _res(value)), "setitem")
            return
        k, axes, _ = _index_arrays(self, k)
        if not isinstance(value, ndarray):
            value = np.array(value, dtype=self.dtype)  # CuPy uploads host values here (core.array)
        dst = self._a
        _current()._enqueue(lambda: dst.__setitem__(_host_key(self, k, axes), _res(value)), "scatter")

    # -- shape and type ---------------------------------------------------------------------------
    def view(self, dtype=None) -> ndarray:
        return ndarray._wrap(self._a.view() if dtype is None else self._a.view(np.dtype(dtype)), self)

    def reshape(self, *shape, order="C") -> ndarray:
        shape = shape[0] if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)) else shape
        try:
            return ndarray._wrap(np.reshape(self._a, shape, order=order, copy=False), self)
        except ValueError:
            if _zero_strided(self.shape, np.uint8).reshape(shape).size != self.size:
                raise
        return self.copy().reshape(shape)

    def ravel(self, order="C") -> ndarray:
        return self.reshape(-1)

    def flatten(self) -> ndarray:
        return self.copy().reshape(-1)

    def transpose(self, *axes) -> ndarray:
        return ndarray._wrap(self._a.transpose(*axes), self)

    def squeeze(self, axis=None) -> ndarray:
        return ndarray._wrap(self._a.squeeze(axis), self)

    def copy(self, order="C") -> ndarray:
        out = ndarray(self.shape, self.dtype)
        o, src = out._a, self._a
        _current()._enqueue(lambda: np.copyto(o, src), "copy")
        return out

    def astype(self, dtype, order="K", casting=None, subok=None, copy=True) -> ndarray:
        dtype = np.dtype(dtype)
        if dtype == self.dtype and not copy:
            return self
        out = ndarray(self.shape, dtype)
        o, src = out._a, self._a
        _current()._enqueue(lambda: np.copyto(o, src, casting="unsafe"), "astype")
        return out

    def fill(self, value) -> None:
        if isinstance(value, ndarray):
            if value.shape != ():
                raise ValueError("non-scalar cupy.ndarray cannot be used for fill")
        else:
            value = np.asarray(value, dtype=self.dtype)
            if value.shape != ():
                raise ValueError("non-scalar numpy.ndarray cannot be used for fill")
            value = value[()]
        dst = self._a
        _current()._enqueue(lambda: dst.fill(_res(value)), "fill")

    # -- reductions: 0-d (or reduced) device arrays -----------------------------------------------
    def _reduce(self, name: str, *args, **kw) -> ndarray:
        fn = getattr(np, name)
        probe = np.asarray(fn(_zero_strided(self.shape, self.dtype), *args, **kw))  # shape, dtype and errors
        out = ndarray(probe.shape, probe.dtype)
        o, src = out._a, self._a
        _current()._enqueue(lambda: o.__setitem__(Ellipsis, fn(src, *args, **kw)), name)
        return out

    def nonzero(self):
        _current().synchronize()  # the result's size depends on the data: CuPy synchronises here
        return tuple(module.asarray(i) for i in np.nonzero(self._a))


from . import ufuncs  # noqa: E402  installs the operators and reductions on ndarray
