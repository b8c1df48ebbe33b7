"""Max tree and top-k on the device; twin of :mod:`gear_flow.ops.maxtree` (``kernels/topk.cu``).

Layout as in the twin (:mod:`gear_flow.ops.sumtree`), parents hold the max of
their children (the twin's ``a if a >= b else b``), empty leaves hold ``-inf``.

:func:`topk` returns exactly the twin's answer: the ``k`` largest leaves that
are not ``-inf``, descending, ties broken by the lower index first.  The twin
descends the tree keeping the best ``k`` nodes of each level; the device
selects on the leaves alone (a radix select over a unique 96-bit key
``(value, ~index)``, then a bitonic sort of the ``k`` winners), so
:func:`topk_flat` serves a plain priority array as well.

Examples
--------
>>> import numpy as np, cupy                                    # doctest: +SKIP
>>> from gear_flow.gpu.ops import maxtree                       # doctest: +SKIP
>>> tree = maxtree.new_tree(4)                                  # doctest: +SKIP
>>> maxtree.set_leaves(tree, np.array([0, 1, 2]), np.array([3.0, 7.0, 7.0]))  # doctest: +SKIP
>>> idx, val = cupy.empty(2, np.int64), cupy.empty(2, np.float64)  # doctest: +SKIP
>>> maxtree.topk(tree, 2, idx, val), idx.tolist()               # doctest: +SKIP
(2, [1, 2])
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ...errors import InvalidDataError
from ...ops.sumtree import leaf_count
from .. import loader
from ..launch import THREADS, blocks, check_out, check_tree, i64
from ..loader import ctype, expr
from .sumtree import new_scratch, rebuild, update

if TYPE_CHECKING:
    import cupy
    from numpy.typing import ArrayLike

__all__ = ["new_scratch", "new_tree", "rebuild_max", "set_leaves", "topk", "topk_flat"]

_MOD = "topk"
_PASSES = 12  # 8-bit digits of the 96-bit key
_SORT_BLOCK_MAX = 2048  # TOPK_SORT_BLOCK_MAX in topk.cu


def new_tree(n: int) -> cupy.ndarray:
    """An empty device max tree (all ``-inf``) able to hold ``n`` leaves.

    Parameters
    ----------
    n : int
        Items the tree must hold.

    Returns
    -------
    cupy.ndarray
        float64 ``[2 * leaf_count(n)]`` on the current device, all ``-inf``.
    """
    import cupy

    return cupy.full(2 * leaf_count(n), -np.inf, dtype=np.float64)


def set_leaves(
    tree: cupy.ndarray,
    idx: ArrayLike | cupy.ndarray,
    values: ArrayLike | cupy.ndarray,
    *,
    scratch: cupy.ndarray | None = None,
) -> None:
    """``leaf[idx[k]] = values[k]`` (last wins on duplicates), parents repaired.

    Parameters
    ----------
    tree : cupy.ndarray
        float64 ``[2 * P]`` device max tree.
    idx : array_like or cupy.ndarray
        int64 or int32 ``[n]`` leaf indices; outside ``[0, P)`` ignored.
    values : array_like or cupy.ndarray
        float64 or float32 ``[n]`` keys (``-inf``: empty).
    scratch : cupy.ndarray, optional
        From :func:`new_scratch`; saves an allocation.

    Raises
    ------
    InvalidDataError
        As :func:`gear_flow.gpu.ops.sumtree.update`.
    """
    update("MaxOp", tree, idx, values, 0.0, scratch)


def rebuild_max(tree: cupy.ndarray) -> None:
    """Recompute every internal node of a max tree from its leaves.

    Parameters
    ----------
    tree : cupy.ndarray
        float64 ``[2 * P]`` device max tree.
    """
    rebuild(tree, "MaxOp")


def topk(tree: cupy.ndarray, k: int, out_idx: cupy.ndarray, out_val: cupy.ndarray) -> int:
    """The ``k`` largest leaves that are not ``-inf``, descending (ties: lower index first).

    Parameters
    ----------
    tree : cupy.ndarray
        float64 ``[2 * P]`` device max tree (only its leaves are read).
    k : int
        Leaves wanted.
    out_idx : cupy.ndarray
        int64 ``[>= min(k, P)]``: leaf indices, written in place.
    out_val : cupy.ndarray
        float64 ``[>= min(k, P)]``: their values, written in place.

    Returns
    -------
    int
        How many were found (at most ``k``; fewer when fewer leaves are not
        ``-inf``), copied to the host.

    Raises
    ------
    InvalidDataError
        A bad tree or output array.
    """
    P = check_tree(tree)
    return topk_flat(tree[P:], k, out_idx, out_val)


def topk_flat(values: cupy.ndarray, k: int, out_idx: cupy.ndarray, out_val: cupy.ndarray) -> int:
    """:func:`topk` over a flat float32/float64 device array; ``-inf`` entries are empty.

    Parameters
    ----------
    values : cupy.ndarray
        float32 or float64 ``[n]``, ``n < 2**32``.
    k : int
        Entries wanted (negative: none).
    out_idx : cupy.ndarray
        int64 ``[>= min(k, n)]``: indices, written in place.
    out_val : cupy.ndarray
        ``[>= min(k, n)]`` of ``values``' dtype: the values, written in place.

    Returns
    -------
    int
        How many were found, copied to the host.

    Raises
    ------
    InvalidDataError
        ``values`` not a 1-D float CuPy array, ``2**32`` or more entries, or
        output arrays of the wrong dtype or too short.
    """
    import cupy

    if not isinstance(values, cupy.ndarray) or values.ndim != 1 or values.dtype not in (np.float32, np.float64):
        raise InvalidDataError("values must be a 1-D float32 or float64 cupy.ndarray")
    values = cupy.ascontiguousarray(values)
    n = int(values.shape[0])
    k = int(k)
    if n >= 2**32:
        raise InvalidDataError(f"top-k over {n} entries: at most {2**32 - 1} are supported")
    want = min(max(k, 0), n)
    check_out(out_idx, np.int64, "out_idx")
    check_out(out_val, values.dtype, "out_val")
    if out_idx.shape[0] < want or out_val.shape[0] < want:
        raise InvalidDataError(f"out_idx/out_val need {want} entries, have {out_idx.shape[0]}/{out_val.shape[0]}")
    if want == 0:
        return 0
    T = ctype(values.dtype)
    state = cupy.zeros(8, dtype=np.uint64)
    hist = cupy.zeros(256, dtype=np.uint64)
    g = (blocks(n),)
    hist_f = loader.function(_MOD, expr("topk_histogram", T))
    select_f = loader.function(_MOD, "topk_select")
    for p in range(_PASSES):
        hist_f(g, (THREADS,), (values, i64(n), np.int32(p), state, hist))
        select_f((1,), (1,), (np.int32(p), i64(k), state, hist))
    m = 1 << (want - 1).bit_length()
    key_hi = cupy.zeros(m, dtype=np.uint64)
    key_lo = cupy.zeros(m, dtype=np.uint32)
    loader.function(_MOD, expr("topk_collect", T))(g, (THREADS,), (values, i64(n), state, key_hi, key_lo))
    if m <= _SORT_BLOCK_MAX:
        loader.function(_MOD, "topk_sort_block")((1,), (1024,), (key_hi, key_lo, i64(m)))
    else:
        step = loader.function(_MOD, "topk_bitonic_step")
        size = 2
        while size <= m:
            stride = size // 2
            while stride > 0:
                step((blocks(m // 2),), (THREADS,), (key_hi, key_lo, i64(m), i64(size), i64(stride)))
                stride //= 2
            size *= 2
    loader.function(_MOD, expr("topk_emit", T))((blocks(want),), (THREADS,), (values, key_lo, state, out_idx, out_val))
    return int(state[4])
