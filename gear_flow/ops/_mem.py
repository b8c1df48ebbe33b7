"""``memcpy``/``memset`` on array bytes from numba code.

Numba compiles slice assignments of uint8 arrays to byte loops that run at a
quarter of memcpy speed when not parallelised; these intrinsics emit LLVM's
``memcpy``/``memset`` instead (and, unlike calling libc through ctypes, they
keep functions cacheable on disk).
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
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
