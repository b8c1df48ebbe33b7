"""Sum tree on the device; twin of :mod:`gear_flow.ops.sumtree` (``kernels/sumtree.cu``).

Layout as in the twin: ``tree`` is float64 ``[2 * P]``, ``tree[1]`` the root,
leaf ``i`` at ``tree[P + i]``.  Every result equals the twin's bit for bit:
parents are recomputed from their children, never updated by deltas, and the
descent and range sums do the same floating-point operations in the same order.

Duplicate indices in one update: the last value wins, as in the twin's
sequential loop.  On the device this is made deterministic by first marking,
for each index, the last position holding it (``atomicMax``), then letting only
that position write the leaf, then repairing the parents level by level (or
rebuilding every level when the batch touches most of the tree).

Examples
--------
>>> import cupy, numpy as np                                    # doctest: +SKIP
>>> from gear_flow.gpu.ops import sumtree                       # doctest: +SKIP
>>> tree = sumtree.new_tree(5)                                  # doctest: +SKIP
>>> sumtree.set_leaves(tree, np.array([0, 3, 3]), np.array([1.0, 2.0, 5.0]))  # doctest: +SKIP
>>> sumtree.mass(tree)                                          # doctest: +SKIP
6.0
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ...errors import InvalidDataError
from ...ops.sumtree import leaf_count
from .. import loader
from ..launch import THREADS, blocks, check_out, check_tree, device_array, i64, tree_leaves
from ..loader import ctype, expr
from .gather import device_pointer

if TYPE_CHECKING:
    import cupy
    from numpy.typing import ArrayLike

__all__ = [
    "find",
    "find_pinned",
    "leaf_count",
    "mass",
    "new_scratch",
    "new_tree",
    "range_sum",
    "range_sums",
    "rebuild",
    "ring_tail_mass",
    "sample",
    "set_leaves",
    "set_leaves_const",
]

#: batches up to this many indices are applied by one block in one launch
BLOCK_UPDATE_MAX = 4096
_BLOCK_THREADS = 1024
_IDX = (np.int64, np.int32)
_VAL = (np.float64, np.float32)
_MOD = "sumtree"


def new_tree(n: int) -> cupy.ndarray:
    """An all-zero device tree able to hold ``n`` leaves.

    Parameters
    ----------
    n : int
        Items the tree must hold.

    Returns
    -------
    cupy.ndarray
        float64 ``[2 * leaf_count(n)]`` on the current device, zeros.
    """
    import cupy

    return cupy.zeros(2 * leaf_count(n), dtype=np.float64)


def new_scratch(tree: cupy.ndarray) -> cupy.ndarray:
    """Reusable scratch for :func:`set_leaves`: int32 ``[P]``, all ``-1`` (kept so by every update).

    Without it each update allocates and fills one (``4 * P`` bytes).

    Parameters
    ----------
    tree : cupy.ndarray
        float64 ``[2 * P]`` device tree.

    Returns
    -------
    cupy.ndarray
        int32 ``[P]``, all ``-1``.
    """
    import cupy

    return cupy.full(tree.shape[0] // 2, -1, dtype=np.int32)


def update(
    op: str,
    tree: cupy.ndarray,
    idx: ArrayLike | cupy.ndarray,
    values: ArrayLike | cupy.ndarray | None,
    cval: float = 0.0,
    scratch: cupy.ndarray | None = None,
) -> None:
    """Set leaves and repair the parents with ``op`` (``"SumOp"`` or ``"MaxOp"``).

    Duplicates: the last value wins.  Indices outside ``[0, P)`` are ignored.
    Up to :data:`BLOCK_UPDATE_MAX` indices run in one single-block launch;
    larger batches mark, set and repair level by level (or rebuild every
    level when they touch most of the tree).

    Parameters
    ----------
    op : {"SumOp", "MaxOp"}
        How a parent combines its children.
    tree : cupy.ndarray
        float64 ``[2 * P]`` device tree.
    idx : array_like or cupy.ndarray
        int64 or int32 ``[n]`` leaf indices (host arrays are uploaded).
    values : array_like or cupy.ndarray or None
        float64 or float32 ``[n]``; None: every leaf in ``idx`` gets
        ``cval``.
    cval : float, default 0.0
        The value when ``values`` is None.
    scratch : cupy.ndarray, optional
        From :func:`new_scratch`; saves an allocation per call.

    Raises
    ------
    InvalidDataError
        A bad tree, ``idx`` or ``values`` not 1-D or of different lengths,
        ``2**31`` or more indices, or a scratch of the wrong dtype or shape.
    """
    P = check_tree(tree)
    idx = device_array(idx, _IDX, "idx")
    n = int(idx.shape[0])
    if n == 0:
        return
    if n >= 2**31:
        raise InvalidDataError(f"an update of {n} leaves is too large; at most {2**31 - 1} per call")
    if values is None:
        vals, use = tree, 0  # never read
    else:
        vals, use = device_array(values, _VAL, "values"), 1
        if vals.shape[0] != n:
            raise InvalidDataError(f"values has {vals.shape[0]} entries for {n} indices")
    if scratch is None:
        scratch = new_scratch(tree)
    elif scratch.dtype != np.int32 or scratch.shape != (P,):
        raise InvalidDataError(f"scratch must be int32 [{P}] (see new_scratch), got {scratch.dtype} {scratch.shape}")
    I, T = ctype(idx.dtype), ctype(vals.dtype)
    depth = P.bit_length() - 1
    cv = np.float64(cval)
    if n <= BLOCK_UPDATE_MAX:
        f = loader.function(_MOD, expr("tree_update_block", op, I, T))
        f((1,), (_BLOCK_THREADS,), (tree, i64(P), np.int32(depth), idx, vals, np.int32(use), cv, i64(n), scratch))
        return
    g = (blocks(n),)
    loader.function(_MOD, expr("tree_mark_last", I))(g, (THREADS,), (idx, i64(n), i64(P), scratch))
    loader.function(_MOD, expr("tree_set_marked", I, T))(
        g, (THREADS,), (tree, i64(P), idx, vals, np.int32(use), cv, i64(n), scratch)
    )
    loader.function(_MOD, expr("tree_reset_owner", I))(g, (THREADS,), (idx, i64(n), i64(P), scratch))
    if n * depth > 2 * P:  # touching most nodes anyway: rebuild whole levels, without write contention
        rebuild(tree, op)
        return
    f = loader.function(_MOD, expr("tree_repair_level", op, I))
    for level in range(1, depth + 1):
        f(g, (THREADS,), (tree, i64(P), idx, i64(n), np.int32(level)))


def rebuild(tree: cupy.ndarray, op: str = "SumOp") -> None:
    """Recompute every internal node from the leaves (bulk load, or after editing leaves directly).

    Parameters
    ----------
    tree : cupy.ndarray
        float64 ``[2 * P]`` device tree.
    op : {"SumOp", "MaxOp"}, default "SumOp"
        How a parent combines its children.
    """
    P = check_tree(tree)
    f = loader.function(_MOD, expr("tree_rebuild_level", op))
    hi = P
    while hi > 1:
        lo = hi // 2
        f((blocks(hi - lo),), (THREADS,), (tree, i64(lo), i64(hi)))
        hi = lo


def set_leaves(
    tree: cupy.ndarray,
    idx: ArrayLike | cupy.ndarray,
    values: ArrayLike | cupy.ndarray,
    *,
    scratch: cupy.ndarray | None = None,
) -> None:
    """Set ``leaf[idx[k]] = values[k]`` for every k and repair the parents.

    Duplicate indices: the last value wins (as the twin's sequential loop).

    Parameters
    ----------
    tree : cupy.ndarray
        float64 ``[2 * P]`` device tree.
    idx : array_like or cupy.ndarray
        int64 or int32 ``[n]`` leaf indices.
    values : array_like or cupy.ndarray
        float64 or float32 ``[n]`` weights, >= 0.
    scratch : cupy.ndarray, optional
        From :func:`new_scratch`; saves an allocation.

    Raises
    ------
    InvalidDataError
        As :func:`update`.
    """
    update("SumOp", tree, idx, values, 0.0, scratch)


def set_leaves_const(
    tree: cupy.ndarray, idx: ArrayLike | cupy.ndarray, value: float, *, scratch: cupy.ndarray | None = None
) -> None:
    """Set every ``leaf[idx[k]] = value`` (insert with one weight, removal with 0).

    Parameters
    ----------
    tree : cupy.ndarray
        float64 ``[2 * P]`` device tree.
    idx : array_like or cupy.ndarray
        int64 or int32 ``[n]`` leaf indices.
    value : float
        The weight, >= 0.
    scratch : cupy.ndarray, optional
        From :func:`new_scratch`.

    Raises
    ------
    InvalidDataError
        As :func:`update`.
    """
    update("SumOp", tree, idx, None, float(value), scratch)


def find(tree: cupy.ndarray, targets: ArrayLike | cupy.ndarray, out: cupy.ndarray) -> None:
    """Inverse CDF: ``out[k]`` is the leaf whose cumulative range holds ``targets[k]``.

    A zero-weight leaf is never returned while the root is positive.

    Parameters
    ----------
    tree : cupy.ndarray
        float64 ``[2 * P]`` device tree.
    targets : array_like or cupy.ndarray
        float64 or float32 ``[n]`` in ``[0, tree[1])``.
    out : cupy.ndarray
        int64 ``[>= n]`` device array, written in place.

    Raises
    ------
    InvalidDataError
        A bad tree, ``targets`` or ``out``.
    """
    P = check_tree(tree)
    t = device_array(targets, _VAL, "targets")
    n = int(t.shape[0])
    check_out(out, np.int64, "out", at_least=n, of="targets")
    _launch_find(tree, P, t, n, out)


def _launch_find(tree: cupy.ndarray | np.uint64, P: int, t: cupy.ndarray, n: int, out: cupy.ndarray) -> None:
    """Launch ``tree_find`` over a device tree or the device address of a page-locked host one."""
    if n:
        f = loader.function(_MOD, expr("tree_find", ctype(t.dtype)))
        f((blocks(n),), (THREADS,), (tree, i64(P), t, i64(n), out))


def find_pinned(tree: np.ndarray, targets: np.ndarray, out: np.ndarray) -> None:
    """:func:`find` over a tree in page-locked host memory, read by the kernel over UVA; host in, host out.

    The twin's signature (:func:`gear_flow.ops.sumtree.find`), so a caller
    holding a host tree takes either: the targets are uploaded, the kernel
    descends the host tree in place (no copy of the tree: a reader's mapped
    selection state, :func:`gear_flow.gpu.shared.state_find`) and the leaves
    are copied back, which waits for the kernel.  The same targets give the
    twin's leaves, bit for bit.

    Parameters
    ----------
    tree : numpy.ndarray
        float64 ``[2 * P]``, C-contiguous, in page-locked (registered or
        ``cudaHostAlloc``) host memory.
    targets : numpy.ndarray
        float64 ``[n]`` in ``[0, tree[1])``.
    out : numpy.ndarray
        int64 ``[>= n]`` host array, written in place.

    Raises
    ------
    InvalidDataError
        A bad tree (or one in pageable memory), ``targets`` or ``out``.
    """
    import cupy

    if not isinstance(tree, np.ndarray) or tree.dtype != np.float64 or tree.ndim != 1 or not tree.flags.c_contiguous:
        raise InvalidDataError("tree must be a C-contiguous 1-D float64 NumPy array in page-locked host memory")
    P = tree_leaves(tree.shape[0])
    if not isinstance(out, np.ndarray) or out.dtype != np.int64 or out.ndim != 1:
        raise InvalidDataError(f"out must be a 1-D int64 NumPy array, got {type(out).__name__}")
    t = device_array(targets, (np.float64,), "targets")
    n = int(t.shape[0])
    if out.shape[0] < n:
        raise InvalidDataError(f"out has {out.shape[0]} entries for {n} targets")
    if not n:
        return
    got = cupy.empty(n, dtype=np.int64)
    _launch_find(np.uint64(device_pointer(tree)), P, t, n, got)
    out[:n] = cupy.asnumpy(got)  # waits for the kernel: the caller's seqlock check follows it


def sample(
    tree: cupy.ndarray,
    uniforms: ArrayLike | cupy.ndarray,
    out: cupy.ndarray,
    weights: cupy.ndarray | None = None,
) -> None:
    """Draw ``len(uniforms)`` leaves with probability ``weight / total``.

    Leaf ``k`` is ``find(tree, uniforms * tree[1])``, so the CPU twin
    reproduces the draw exactly from the same uniforms.  The caller checks
    the mass is positive.

    Parameters
    ----------
    tree : cupy.ndarray
        float64 ``[2 * P]`` device tree.
    uniforms : array_like or cupy.ndarray
        float64 or float32 ``[n]`` in ``[0, 1)`` (e.g.
        ``cupy.random.random(B)``).
    out : cupy.ndarray
        int64 ``[>= n]``: the drawn leaves, written in place.
    weights : cupy.ndarray, optional
        float64 ``[>= n]``: receives each drawn leaf's weight.

    Raises
    ------
    InvalidDataError
        A bad tree, ``uniforms``, ``out`` or ``weights``.
    """
    P = check_tree(tree)
    u = device_array(uniforms, _VAL, "uniforms")
    n = int(u.shape[0])
    check_out(out, np.int64, "out", at_least=n, of="uniforms")
    want = weights is not None
    if want:
        check_out(weights, np.float64, "weights", at_least=n, of="uniforms")
    if n:
        f = loader.function(_MOD, expr("tree_sample", ctype(u.dtype)))
        f((blocks(n),), (THREADS,), (tree, i64(P), u, i64(n), out, np.int32(want), weights if want else tree))


def mass(tree: cupy.ndarray) -> float:
    """Total weight (the root), copied to the host (synchronises the stream).

    Parameters
    ----------
    tree : cupy.ndarray
        float64 ``[2 * P]`` device tree.

    Returns
    -------
    float
        ``tree[1]``.
    """
    check_tree(tree)
    return float(tree[1])


def range_sums(
    tree: cupy.ndarray, lo: ArrayLike | cupy.ndarray, hi: ArrayLike | cupy.ndarray, out: cupy.ndarray
) -> None:
    """``out[k]`` = sum of leaves ``lo[k] <= i < hi[k]`` (the twin's ``range_sum``, batched).

    Parameters
    ----------
    tree : cupy.ndarray
        float64 ``[2 * P]`` device tree.
    lo, hi : array_like or cupy.ndarray
        int64 ``[n]`` half-open leaf ranges, clamped to the leaves ``[0, P)``.
    out : cupy.ndarray
        float64 ``[>= n]``, written in place.

    Raises
    ------
    InvalidDataError
        A bad tree, an ``out`` shorter than ``n``, or ``lo`` and ``hi`` of
        different lengths.
    """
    P = check_tree(tree)
    lo = device_array(lo, (np.int64,), "lo")
    hi = device_array(hi, (np.int64,), "hi")
    n = int(lo.shape[0])
    if hi.shape[0] != n:
        raise InvalidDataError(f"lo has {n} entries, hi {hi.shape[0]}")
    check_out(out, np.float64, "out", at_least=n, of="ranges")
    if n:
        loader.function(_MOD, "tree_range_sums")((blocks(n),), (THREADS,), (tree, i64(P), lo, hi, i64(n), out))


def range_sum(tree: cupy.ndarray, lo: int, hi: int) -> float:
    """Sum of leaves ``lo <= i < hi``, copied to the host.

    Parameters
    ----------
    tree : cupy.ndarray
        float64 ``[2 * P]`` device tree.
    lo, hi : int
        The half-open leaf range.

    Returns
    -------
    float
        The sum (0 for an empty range), as the twin computes it.
    """
    import cupy

    out = cupy.empty(1, dtype=np.float64)
    range_sums(tree, np.array([lo], dtype=np.int64), np.array([hi], dtype=np.int64), out)
    return float(out[0])


def ring_tail_mass(
    tree: cupy.ndarray,
    capacity: int,
    starts: ArrayLike | cupy.ndarray,
    lengths: ArrayLike | cupy.ndarray,
    k: int,
) -> float:
    """Mass of the last ``min(k, length)`` leaves of each ring segment, summed in order.

    Same semantics and same summation order as the twin: one thread per
    segment computes its term, one thread adds the terms in order.

    Parameters
    ----------
    tree : cupy.ndarray
        float64 ``[2 * P]`` device tree.
    capacity : int
        Leaves of the ring (positions wrap modulo it).
    starts : array_like or cupy.ndarray
        int64 ``[E]``, first ring position of each segment (episode).
    lengths : array_like or cupy.ndarray
        int64 ``[E]``, leaves of each segment.
    k : int
        Tail length (``L - 1`` for strict windows of ``L`` steps).

    Returns
    -------
    float
        The summed tail mass (0 for no segments).

    Raises
    ------
    InvalidDataError
        A bad tree, or ``starts`` and ``lengths`` of different lengths.
    """
    import cupy

    P = check_tree(tree)
    s = device_array(starts, (np.int64,), "starts")
    ln = device_array(lengths, (np.int64,), "lengths")
    n = int(s.shape[0])
    if ln.shape[0] != n:
        raise InvalidDataError(f"starts has {n} entries, lengths {ln.shape[0]}")
    if n == 0:
        return 0.0
    parts = cupy.empty(n, dtype=np.float64)
    out = cupy.empty(1, dtype=np.float64)
    loader.function(_MOD, "tree_ring_tail_parts")(
        (blocks(n),), (THREADS,), (tree, i64(P), i64(capacity), s, ln, i64(n), i64(k), parts)
    )
    loader.function(_MOD, "sum_in_order")((1,), (1,), (parts, i64(n), out))
    return float(out[0])
