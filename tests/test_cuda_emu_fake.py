"""The emulation's ``cupy.ndarray`` refuses what CuPy refuses and does what gear_flow relies on.

Expected behaviour is CuPy's (cupy/_core/core.pyx, _routines_indexing.pyx,
_kernel.pyx, cuda/function.pyx), checked from its source: implicit host
conversion raises ``TypeError``; a NumPy array operand of a ufunc raises
``TypeError("Unsupported type ...")``; ``a[basic] = numpy_array`` raises
``ValueError`` (CuPy's ``fill``), while ``a[int_array] = numpy_array`` uploads
it; ``asarray``/``array`` upload host data; integer indices wrap around.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from cuda_emu import fixtures

emulated = fixtures.emulated  # the fixture: cupy is the emulation's in these tests


def test_not_a_numpy_array_and_no_implicit_host_conversion(emulated):
    cp = emulated
    a = cp.arange(4)
    assert not isinstance(a, np.ndarray)
    for convert in (np.asarray, np.array, np.ascontiguousarray, lambda x: x.__array__(), memoryview):
        with pytest.raises(TypeError, match="Implicit conversion to a NumPy array is not allowed|bytes-like"):
            convert(a)
    assert isinstance(np.concatenate([a, a]), type(a))  # __array_function__: CuPy's own concatenate runs
    with pytest.raises(TypeError, match="Only cupy arrays"):
        np.concatenate([a, np.arange(4)])
    assert isinstance(a.get(), np.ndarray) and cp.asnumpy(a).tolist() == [0, 1, 2, 3]


def test_numpy_operands_are_refused_scalars_are_not(emulated):
    cp = emulated
    a = cp.arange(3, dtype=np.float32)
    h = np.ones(3, np.float32)
    for op in (lambda: a + h, lambda: h + a, lambda: a * [1, 2, 3], lambda: np.add(h, a), lambda: a < h):
        with pytest.raises(TypeError, match="Unsupported type"):
            op()
    b = a * 2 + np.float32(1) - 0.5
    assert isinstance(b, type(a)) and b.dtype == np.float32 and b.get().tolist() == [0.5, 2.5, 4.5]
    assert (a == np.array(1.0)).get().tolist() == [False, True, False]  # 0-d NumPy: accepted by comparisons
    assert (a == None).get().tolist() == [False] * 3  # noqa: E711  (CuPy: all False)
    assert cp.maximum(a, 1.5).get().tolist() == [1.5, 1.5, 2.0]
    assert np.sqrt(a * a).get().tolist() == [0.0, 1.0, 2.0]  # a NumPy ufunc on a device array stays on it


def test_setitem_takes_host_values_only_with_advanced_indices(emulated):
    cp = emulated
    a = cp.zeros(5, dtype=np.int64)
    with pytest.raises(ValueError, match="non-scalar numpy.ndarray cannot be used for fill"):
        a[1:3] = np.array([7, 8])
    with pytest.raises(ValueError, match="non-scalar"):
        a[...] = [1, 2, 3, 4, 5]
    a[1:3] = 4  # scalars are fine
    a[np.array([0, 4])] = np.array([9, 6])  # uploaded, as CuPy does
    a[cp.asarray([2])] = cp.asarray([5])
    assert a.tolist() == [9, 4, 5, 0, 6]
    a[np.array([True, False, False, False, True])] = 1
    assert a.tolist() == [1, 4, 5, 0, 1]


def test_indexing_views_and_copies(emulated):
    cp = emulated
    a = cp.arange(12, dtype=np.int32).reshape(3, 4)
    v = a[1]  # basic: a view
    v[...] = -1
    assert a.tolist()[1] == [-1] * 4
    assert a[:, 1:3].flags.c_contiguous is False and a.T.shape == (4, 3)
    assert a[cp.asarray([2, 0])].tolist() == [[8, 9, 10, 11], [0, 1, 2, 3]]
    assert a[np.array([5, -1])].tolist() == [[8, 9, 10, 11], [8, 9, 10, 11]]  # wraps around, as CuPy does
    assert a[a > 8].tolist() == [9, 10, 11]  # a mask: the size depends on the data (CuPy synchronises)
    b = a.view(np.uint8)
    assert b.shape == (3, 16) and b.data.ptr == a.data.ptr
    assert a[:, 1:3].reshape(-1).tolist() == [1, 2, -1, -1, 9, 10]  # non-contiguous: a copy
    c = a.copy()
    c[...] = 0
    assert int(a.sum()) != 0
    with pytest.raises(IndexError, match="integer"):
        a[cp.asarray([0.5])]


def test_reductions_are_0d_device_arrays_read_by_conversions(emulated):
    cp = emulated
    a = cp.asarray([[1.0, 5.0], [3.0, 2.0]])
    s = a.sum()
    assert isinstance(s, type(a)) and s.shape == () and float(s) == 11.0
    assert a.max(axis=0).tolist() == [3.0, 5.0] and int(a.argmax()) == 1 and a.mean().item() == 2.75
    assert bool(a.any()) and bool(a[0, 0] == 1.0)
    with pytest.raises(ValueError, match="ambiguous"):
        bool(a)
    with pytest.raises(ValueError, match="size 1"):
        a.item()
    with pytest.raises(ValueError):
        cp.zeros(0).max()


def test_transfers_check_like_cupy(emulated):
    cp = emulated
    a = cp.zeros((2, 3), dtype=np.float32)
    with pytest.raises(TypeError, match="Only numpy.ndarray"):
        a.set([1, 2, 3])
    with pytest.raises(TypeError, match="cannot be set"):
        a.set(np.zeros((2, 3), np.float64))
    with pytest.raises(ValueError, match="Shape mismatch"):
        a.set(np.zeros((3, 2), np.float32))
    with pytest.raises(RuntimeError, match="non-contiguous"):
        a[:, :2].set(np.zeros((2, 2), np.float32))
    with pytest.raises(TypeError, match="cannot be obtained"):
        a.get(out=np.empty((2, 3), np.float64))
    out = np.empty((2, 3), np.float32)
    a.set(np.full((2, 3), 2.5, np.float32))
    assert a.get(out=out) is out and (out == 2.5).all()
    assert pickle.loads(pickle.dumps(a)).tolist() == a.tolist()


def test_memory_is_aligned_and_poisoned(emulated):
    cp = emulated
    for n in (1, 3, 1000):
        a = cp.empty(n, dtype=np.uint8)
        assert a.data.ptr % 256 == 0 and (a.get() == 0xA5).all()
    assert cp.cuda.runtime.pointerGetAttributes(a.data.ptr).type == cp.cuda.runtime.memoryTypeDevice
    assert cp.cuda.runtime.pointerGetAttributes(np.zeros(4).ctypes.data).type == 0
    cai = a.__cuda_array_interface__
    assert cai["data"][0] == a.data.ptr and cai["shape"] == (1000,) and cai["typestr"] == "|u1"


def test_constructors_take_device_or_host_data_as_cupy_does(emulated):
    cp = emulated
    a = cp.asarray(np.arange(3))
    assert cp.asarray(a) is a and cp.asarray(a, dtype=np.float32).dtype == np.float32
    assert cp.stack([a, a]).shape == (2, 3) and cp.concatenate([a, a]).tolist() == [0, 1, 2] * 2
    for f in (cp.stack, cp.concatenate):
        with pytest.raises(TypeError, match="Only cupy arrays"):
            f([a, np.arange(3)])
    assert cp.full(2, 7, dtype=np.int8).tolist() == [7, 7] and cp.zeros_like(a).tolist() == [0, 0, 0]


def test_kernel_arguments_are_packed_like_cupy(emulated):
    """A host array where a device pointer belongs is refused (CuPy: only size-1 NumPy arrays pass by value)."""
    from gear_flow.gpu import loader

    f = loader.function("sumtree", "sum_in_order")
    parts, out = emulated.asarray([1.0, 2.0]), emulated.empty(1, dtype=np.float64)
    with pytest.raises(TypeError, match="numpy.ndarray of shape"):
        f((1,), (1,), (np.array([1.0, 2.0]), np.int64(2), out))
    with pytest.raises(TypeError, match="NumPy scalars"):
        f((1,), (1,), (parts, 2, out))  # a Python int: its C type would be a guess
    f((1,), (1,), (parts, np.array([2]), out))
    assert float(out[0]) == 3.0
