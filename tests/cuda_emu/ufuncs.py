"""Arithmetic, comparisons and reductions of the emulation's ``cupy.ndarray``: device work on the current stream.

Operands are device arrays, Python scalars and NumPy scalars; a NumPy array (or
a list) raises ``TypeError("Unsupported type ...")`` as in CuPy, whichever side
of the operator it is on (NumPy hands ``numpy_array + device_array`` to
``ndarray.__array_ufunc__``).  Comparisons also take a 0-d NumPy array and
``None`` (all False), as CuPy's do.
"""

from __future__ import annotations

import numpy as np

from . import streams
from .indexing import DeviceArray, _res
from .ndarray import module_ref, ndarray

SCALARS = (int, float, bool, complex)


def _operand(x):
    if isinstance(x, DeviceArray) or type(x) in SCALARS or isinstance(x, np.generic):
        return x
    raise TypeError(f"Unsupported type {type(x)}")


def ufunc(uf: np.ufunc, *inputs, out=None, dtype=None):
    """Apply a NumPy ufunc as device work: a new fake array (or ``out``), computed when the stream runs."""
    if uf.nout != 1 or len(inputs) != uf.nin:
        raise TypeError(f"{uf.__name__}: the emulation supports ufuncs with one output, called with all inputs")
    ins = [_operand(x) for x in inputs]
    arrays = [x for x in ins if isinstance(x, ndarray)]
    shape = np.broadcast_shapes(*(a.shape for a in arrays))
    with np.errstate(all="ignore"):
        probe = uf(*[np.zeros((), x.dtype) if isinstance(x, ndarray) else x for x in ins], dtype=dtype)
    if out is None:
        out = ndarray(shape, probe.dtype)
    else:
        if not isinstance(out, ndarray):
            raise TypeError(f"out must be a cupy.ndarray, got {type(out)}")
        if np.broadcast_shapes(shape, out.shape) != out.shape:
            raise ValueError(f"non-broadcastable output operand with shape {out.shape} doesn't match {shape}")
        if not np.can_cast(probe.dtype, out.dtype, "same_kind"):
            raise TypeError(f"Cannot cast ufunc '{uf.__name__}' output from {probe.dtype} to {out.dtype}")
    o = out._a

    def run():
        with np.errstate(all="ignore"):
            o[...] = uf(*[_res(x) for x in ins], dtype=dtype)

    streams.get_current_stream()._enqueue(run, uf.__name__)
    return out


def _method(name):
    def reduce(self, *args, **kw):
        return self._reduce(name, *args, **kw)

    reduce.__name__ = name
    return reduce


for _name in ("sum", "prod", "max", "min", "mean", "var", "std", "any", "all", "argmax", "argmin", "cumsum"):
    setattr(ndarray, _name, _method(_name))

COMPARISONS = {"equal": np.equal, "not_equal": np.not_equal, "less": np.less, "less_equal": np.less_equal,
                "greater": np.greater, "greater_equal": np.greater_equal}  # fmt: skip


def _binary(uf):
    return (
        lambda self, o: ufunc(uf, self, o),
        lambda self, o: ufunc(uf, o, self),
        lambda self, o: ufunc(uf, self, o, out=self),
    )


for _name, _uf in {"add": np.add, "sub": np.subtract, "mul": np.multiply, "truediv": np.true_divide,
                   "floordiv": np.floor_divide, "mod": np.remainder, "pow": np.power, "and": np.bitwise_and,
                   "or": np.bitwise_or, "xor": np.bitwise_xor, "lshift": np.left_shift,
                   "rshift": np.right_shift}.items():  # fmt: skip
    _f, _r, _i = _binary(_uf)
    setattr(ndarray, f"__{_name}__", _f)
    setattr(ndarray, f"__r{_name}__", _r)
    setattr(ndarray, f"__i{_name}__", _i)


def _compare(uf):
    def cmp(self, other):
        if other is None or (uf in (np.equal, np.not_equal) and type(other).__eq__ is object.__eq__):
            out = module_ref().zeros(self.shape, dtype=np.bool_)
            return out if uf is np.equal else ~out
        if isinstance(other, np.ndarray) and other.ndim == 0:
            other = other.item()
        return ufunc(uf, self, other)

    return cmp


for _name, _uf in (("eq", np.equal), ("ne", np.not_equal), ("lt", np.less), ("le", np.less_equal),
                   ("gt", np.greater), ("ge", np.greater_equal)):  # fmt: skip
    setattr(ndarray, f"__{_name}__", _compare(_uf))
ndarray.__hash__ = None  # type: ignore[assignment]
ndarray.__neg__ = lambda self: ufunc(np.negative, self)
ndarray.__pos__ = lambda self: ufunc(np.positive, self)
ndarray.__abs__ = lambda self: ufunc(np.absolute, self)
ndarray.__invert__ = lambda self: ufunc(np.invert, self)
