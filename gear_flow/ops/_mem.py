"""``memcpy``/``memset`` on array bytes from numba code.

Numba compiles slice assignments of uint8 arrays to byte loops that run at a
quarter of memcpy speed when not parallelised; these intrinsics emit LLVM's
``memcpy``/``memset`` instead (and, unlike calling libc through ctypes, they
keep functions cacheable on disk); :func:`prefetch` emits LLVM's ``prefetch``.
:func:`array_headers` reads what many arrays say of themselves (address, shape,
dtype, flags) in one compiled pass, for checks and copies of many small arrays.
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


#: The layout of a NumPy array object: the interpreter's object header (its type pointer last), then NumPy's
#: ``PyArrayObject_fields`` (its public C struct, ABI-stable across NumPy 1 and 2): ``data``, ``int nd``,
#: ``dimensions``, ``strides``, ``base``, ``descr``, ``int flags``, a word each.  ``[header size]`` once
#: checked against arrays on this interpreter, ``[None]`` where it does not hold.
_LAYOUT: list = []
#: the columns of :func:`array_headers`
DATA, NDIM, DIMS, DESCR, FLAGS = range(5)
#: NumPy's ``NPY_ARRAY_C_CONTIGUOUS`` flag
C_CONTIGUOUS = 0x1


def _layout() -> int | None:
    if not _LAYOUT:
        head = object.__basicsize__
        probes = [np.arange(6.0).reshape(3, 2)[::2], np.zeros((2, 3, 4), np.int8), np.ones(5, np.float32)]
        ok = True
        for p in probes:
            h = np.empty((1, 5), dtype=np.int64)
            if not _headers(np.array([id(p)], dtype=np.int64), head, id(np.ndarray), h):
                ok = False
                break
            dims = [word_at_py(int(h[0, DIMS]) + 8 * k) for k in range(p.ndim)]
            ok = ok and (int(h[0, DATA]), int(h[0, NDIM]), dims, int(h[0, DESCR]), int(h[0, FLAGS])) == (
                p.ctypes.data,
                p.ndim,
                list(p.shape),
                id(p.dtype),
                p.flags.num,
            )
        _LAYOUT.append(head if ok else None)
    return _LAYOUT[0]


def array_headers(arrays: list) -> np.ndarray | None:
    """What each array's object says of it, read off the objects in one compiled pass: a few nanoseconds an
    array, where asking each for an attribute costs tens of nanoseconds to most of a microsecond (an insert
    of a thousand short episodes would spend as long on its checks and the copy's addresses as on the copy).

    Returns None when some object is not exactly a ``numpy.ndarray``, or when the layout is not the one
    expected on this interpreter (checked once against arrays' own attributes), so that the caller asks
    the arrays instead.  The caller keeps the arrays alive while it uses the addresses.

    Parameters
    ----------
    arrays : list
        The objects.

    Returns
    -------
    numpy.ndarray or None
        int64 ``[n, 5]``, columns :data:`DATA` (the first byte's address), :data:`NDIM`, :data:`DIMS` (the
        address of the shape's ``ndim`` words: :func:`word_at` reads them), :data:`DESCR` (the dtype
        object's ``id``) and :data:`FLAGS` (``flags.num``: :data:`C_CONTIGUOUS` is a bit of it).
    """
    head = _layout()
    if head is None:
        return None
    out = np.empty((len(arrays), 5), dtype=np.int64)
    ids = np.fromiter(map(id, arrays), dtype=np.int64, count=len(arrays))
    return out if _headers(ids, head, id(np.ndarray), out) else None


@njit(cache=True)
def _headers(ids, head, ndarray, out):
    """:func:`array_headers` of the objects at ``ids`` into ``out``; False, ``out`` partly written, at the
    first whose type is not ``ndarray`` (the caller holds the GIL and the objects)."""
    for i in range(ids.shape[0]):
        if word_at(ids[i] + head - 8) != ndarray:  # the header's last word: the type (read before any field)
            return False
        at = ids[i] + head
        out[i, 0] = word_at(at)  # data
        out[i, 1] = word_at(at + 8) & 0xFFFFFFFF  # nd, an int: the low half of its word
        out[i, 2] = word_at(at + 16)  # dimensions
        out[i, 3] = word_at(at + 40)  # descr
        out[i, 4] = word_at(at + 48) & 0xFFFFFFFF  # flags, an int
    return True


@njit(cache=True)
def rows_of(head, descr, row_shape, rows):
    """Whether every array (:func:`array_headers`) is C-contiguous, of the dtype object ``descr`` and of
    shape ``[n, *row_shape]``: True, each one's ``n`` in ``rows``; False at the first that is not.

    Parameters
    ----------
    head : numpy.ndarray
        :func:`array_headers` of the arrays.
    descr : int
        ``id`` of the dtype (an array of an equal dtype held by another object is not accepted).
    row_shape : numpy.ndarray
        int64, the shape of a row.
    rows : numpy.ndarray
        int64, one an array, written.

    Returns
    -------
    bool
        Every array such.
    """
    for i in range(head.shape[0]):
        if head[i, FLAGS] & C_CONTIGUOUS == 0 or head[i, DESCR] != descr or head[i, NDIM] != 1 + row_shape.shape[0]:
            return False
        for d in range(row_shape.shape[0]):
            if word_at(head[i, DIMS] + 8 * (d + 1)) != row_shape[d]:
                return False
        rows[i] = word_at(head[i, DIMS])
    return True


@njit(cache=True)
def _word(addr):
    return word_at(addr)


def word_at_py(addr: int) -> int:
    """:func:`word_at` from Python (checks)."""
    return int(_word(addr))
