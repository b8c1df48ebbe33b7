"""``memcpy``/``memset`` on array bytes from numba code.

Numba compiles slice assignments of uint8 arrays to byte loops that run at a
quarter of memcpy speed when not parallelised; these intrinsics emit LLVM's
``memcpy``/``memset`` instead (and, unlike calling libc through ctypes, they
keep functions cacheable on disk); :func:`prefetch` emits LLVM's ``prefetch``.
:func:`data_addresses` gives compiled copies the addresses of many arrays at
once.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic


def _ptr(context, builder, arrtype, arr, off):
    a = context.make_array(arrtype)(context, builder, arr)
    return builder.gep(builder.bitcast(a.data, ir.IntType(8).as_pointer()), [off])


@intrinsic
def copy_bytes(typingctx, dst, dst_off, src, src_off, n):
    """Copy ``n`` bytes from ``src`` (byte offset ``src_off``) to ``dst`` (``dst_off``); no bounds checks."""

    def codegen(context, builder, sig, args):
        d, doff, s, soff, cnt = args
        cgutils.raw_memcpy(
            builder,
            _ptr(context, builder, sig.args[0], d, doff),
            _ptr(context, builder, sig.args[2], s, soff),
            cnt,
            1,
        )

    return types.void(dst, dst_off, src, src_off, n), codegen


@intrinsic
def zero_bytes(typingctx, dst, dst_off, n):
    """Set ``n`` bytes of ``dst`` from byte offset ``dst_off`` to zero; no bounds checks."""

    def codegen(context, builder, sig, args):
        d, doff, cnt = args
        cgutils.memset(builder, _ptr(context, builder, sig.args[0], d, doff), cnt, 0)

    return types.void(dst, dst_off, n), codegen


@intrinsic
def copy_from_address(typingctx, dst, dst_off, addr, n):
    """Copy ``n`` bytes from address ``addr`` (an int: a live buffer's first byte plus an offset) to ``dst``
    (byte offset ``dst_off``); no bounds checks, and the caller keeps the buffer alive."""

    def codegen(context, builder, sig, args):
        d, doff, a, cnt = args
        src = builder.inttoptr(a, ir.IntType(8).as_pointer())
        cgutils.raw_memcpy(builder, _ptr(context, builder, sig.args[0], d, doff), src, cnt, 1)

    return types.void(dst, dst_off, addr, n), codegen


@intrinsic
def word_at(typingctx, addr):
    """The int64 stored at address ``addr`` (an int); the caller keeps what holds it alive."""

    def codegen(context, builder, sig, args):
        return builder.load(builder.inttoptr(args[0], ir.IntType(64).as_pointer()))

    return types.int64(addr), codegen


def _prefetch(builder, context, arrtype, arr, index, write: int) -> None:
    # llvm.prefetch(address, rw, locality 3: keep in every cache level, data cache); it never faults
    a = context.make_array(arrtype)(context, builder, arr)
    i8p = ir.IntType(8).as_pointer()
    addr = builder.bitcast(builder.gep(a.data, [index]), i8p)
    i32 = ir.IntType(32)
    fn = builder.module.declare_intrinsic("llvm.prefetch", [i8p], ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]))
    builder.call(fn, [addr, ir.Constant(i32, write), ir.Constant(i32, 3), ir.Constant(i32, 1)])


@intrinsic
def prefetch(typingctx, arr, index):
    """Start loading the cache line of element ``index`` of ``arr`` (counted from its first: a C-contiguous
    array's flat index) without waiting for it: a later load finds it on its way or there.  No bounds check,
    and none needed: a prefetch never faults."""

    def codegen(context, builder, sig, args):
        _prefetch(builder, context, sig.args[0], args[0], args[1], 0)
        return context.get_dummy_value()

    return types.void(arr, index), codegen


@intrinsic
def prefetch_write(typingctx, arr, index):
    """:func:`prefetch` of a line about to be written."""

    def codegen(context, builder, sig, args):
        _prefetch(builder, context, sig.args[0], args[0], args[1], 1)
        return context.get_dummy_value()

    return types.void(arr, index), codegen


#: Byte offset of a NumPy array's data pointer in the array object: NumPy's ``PyArrayObject_fields`` (its
#: public C struct, ABI-stable across NumPy 1 and 2) is the interpreter's object header, then ``data``.
#: None where that does not hold on this interpreter (checked once, against ``ndarray.ctypes.data``).
_DATA_FIELD: list = []


def data_addresses(arrays: list) -> np.ndarray | None:
    """The address of each array's first byte, for arrays that are exactly ``numpy.ndarray``: a few
    nanoseconds an array, where ``ndarray.ctypes.data`` costs most of a microsecond (a copy of a thousand
    short episodes would spend as long asking for their addresses as copying them).

    Returns None when the layout is not the one expected on this interpreter, so that the caller copies
    another way.  The caller keeps the arrays alive while it uses the addresses.
    """
    if not _DATA_FIELD:
        probe = np.arange(3)
        field = object.__basicsize__
        seen = _read_words(np.array([id(probe)], dtype=np.int64), field)[0]
        _DATA_FIELD.append(field if seen == probe.ctypes.data else None)
    field = _DATA_FIELD[0]
    if field is None or set(map(type, arrays)) != {np.ndarray}:
        return None
    return _read_words(np.fromiter(map(id, arrays), dtype=np.int64, count=len(arrays)), field)


@njit(cache=True)
def _read_words(ids, field):
    """The word at ``field`` bytes into each object (the caller holds the GIL and the objects)."""
    out = np.empty(ids.shape[0], dtype=np.int64)
    for i in range(ids.shape[0]):
        out[i] = word_at(ids[i] + field)
    return out
