"""``memcpy``/``memset`` on array bytes from numba code.

Numba compiles slice assignments of uint8 arrays to byte loops that run at a
quarter of memcpy speed when not parallelised; these intrinsics emit LLVM's
``memcpy``/``memset`` instead (and, unlike calling libc through ctypes, they
keep functions cacheable on disk).
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
def stream_from_address(typingctx, dst, dst_off, addr, n):
    """Copy ``n`` bytes from address ``addr`` to ``dst`` (byte offset ``dst_off``) with non-temporal stores;
    no bounds checks, and the caller keeps the buffer alive and ends its copies with :func:`store_fence`.

    A plain store first reads the destination's cache line (read for ownership), so a copy into memory not
    in cache moves each byte three times; a non-temporal store writes the line whole, and moves it twice.
    This is what ``memcpy`` itself does above a size near the last-level cache, which a copy of many short
    parts (the episodes of an insert) never reaches one part at a time.  The bytes before the destination's
    first 16-byte boundary and after its last are copied plainly.
    """

    def codegen(context, builder, sig, args):
        d, doff, a, cnt = args
        i64 = ir.IntType(64)
        dp = _ptr(context, builder, sig.args[0], d, doff)
        sp = builder.inttoptr(a, ir.IntType(8).as_pointer())
        head = builder.and_(builder.neg(builder.ptrtoint(dp, i64)), ir.Constant(i64, 15))
        head = builder.select(builder.icmp_unsigned("<", head, cnt), head, cnt)
        cgutils.raw_memcpy(builder, dp, sp, head, 1)
        rest = builder.sub(cnt, head)
        vec = ir.VectorType(i64, 2)
        dv = builder.bitcast(builder.gep(dp, [head]), vec.as_pointer())
        sv = builder.bitcast(builder.gep(sp, [head]), vec.as_pointer())
        nontemporal = builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)])
        with cgutils.for_range(builder, builder.lshr(rest, ir.Constant(i64, 4))) as loop:
            v = builder.load(builder.gep(sv, [loop.index]), align=1)
            builder.store(v, builder.gep(dv, [loop.index]), align=16).set_metadata("nontemporal", nontemporal)
        done = builder.add(head, builder.and_(rest, ir.Constant(i64, ~15)))
        tail = builder.and_(rest, ir.Constant(i64, 15))
        cgutils.raw_memcpy(builder, builder.gep(dp, [done]), builder.gep(sp, [done]), tail, 1)

    return types.void(dst, dst_off, addr, n), codegen


@intrinsic
def store_fence(typingctx):
    """Order every store before it, non-temporal ones included, before any after it (they are weakly
    ordered: another thread must not be told a copy is done before its bytes are visible)."""

    def codegen(context, builder, sig, args):
        builder.fence("seq_cst")

    return types.void(), codegen


@intrinsic
def word_at(typingctx, addr):
    """The int64 stored at address ``addr`` (an int); the caller keeps what holds it alive."""

    def codegen(context, builder, sig, args):
        return builder.load(builder.inttoptr(args[0], ir.IntType(64).as_pointer()))

    return types.int64(addr), codegen


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
