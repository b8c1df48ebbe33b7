"""Max tree over item keys for top-k selection (MaxHeap / MinHeap selectors).

Layout as in :mod:`gear_flow.ops.sumtree` but parents hold the max of their
children; empty leaves hold ``-inf``.  A MinHeap stores negated priorities.
``topk`` descends level by level keeping a frontier of at most ``k`` nodes: the
children of the frontier, ranked by value (descending) then position, cut to
their best ``k``.  That is exact: a node ranked below ``k`` others of its level
has ``k`` leaves that rank above any leaf under it (each of those nodes holds a
leaf of its value, at a lower index when the values tie).  O(k) per level with
a selection, the reads of a level all independent and prefetched a level
ahead, independent of N beyond the tree's depth.

A heap's ties go to the least recently touched item.  Its tree ranks them by
slot, and the heap collects the leaves tied with its last pick and sorts them by
stamp: cheap while ties are few, O(N) a batch when all priorities are equal
(the common case).  Then, on the host tiers, the tree also keeps stamps
(:func:`new_stamps`): each internal node the least stamp among its leaves of its
value, each leaf its item's stamp (the shard's ``touched``), and
``topk_stamped`` ranks by (value descending, stamp, position), exact by the same
argument; the stamps cost a second array and as much memory traffic again on
each set, so a tree whose ties are few goes without.

Twin of ``kernels/topk.cu``, which has no stamps: a device heap's tree with many
ties keeps a host twin with them (:class:`gear_flow.selectors.trees.MaxTree`).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ._mem import prefetch
from .sumtree import fix_node, leaf_count, repair_levels, stamp_of


def new_tree(n: int) -> np.ndarray:
    """An empty max tree able to hold ``n`` leaves (every node ``-inf``).

    Parameters
    ----------
    n : int
        Items the tree must hold.

    Returns
    -------
    numpy.ndarray
        float64 ``[2 * leaf_count(n)]``, laid out as a sum tree, all ``-inf``.
    """
    return np.full(2 * leaf_count(n), -np.inf, dtype=np.float64)


def new_stamps(tree: np.ndarray) -> np.ndarray:
    """Stamps for the internal nodes of ``tree``, none stamped yet: :func:`restamp` gives them their values.

    Parameters
    ----------
    tree : numpy.ndarray
        A max tree (:func:`new_tree`), ``2 * P`` nodes.

    Returns
    -------
    numpy.ndarray
        int64 ``[P]``: node ``i``'s stamp at ``i`` (node 0 unused), all the largest int64.
    """
    return np.full(tree.shape[0] // 2, np.iinfo(np.int64).max, dtype=np.int64)


@njit(cache=True, nogil=True)
def set_leaves(tree, idx, values):
    """``leaf[idx[k]] = values[k]`` (last wins on duplicates), parents repaired level by level for all the
    leaves at once, as the sum tree's are (:func:`~.sumtree.repair_levels`): a leaf at a time walked its
    path to the root as one chain of dependent misses (1,024 leaves of 10M: 132 -> 45 us)."""
    set_leaves_stamped(tree, None, None, idx, values)


@njit(cache=True, nogil=True)
def set_leaves_stamped(tree, stamps, touched, idx, values):
    """:func:`set_leaves` of a tree with ``stamps`` (None: none), the leaves' own in ``touched`` (already
    written for ``idx``): each repaired node also takes the least stamp among its leaves of its value."""
    P = tree.shape[0] // 2
    for k in range(idx.shape[0]):
        tree[idx[k] + P] = values[k]
    repair_levels(tree, idx, np.empty(idx.shape[0], dtype=np.int64), True, stamps, touched)


@njit(cache=True, nogil=True)
def restamp(tree, stamps, touched):
    """Every internal node's value and stamp recomputed from its children, bottom up, the leaves' stamps
    from ``touched``: a tree whose values came from elsewhere (a checkpoint, a disk shard, a device tree's
    leaves) gets its stamps (a consistent tree keeps its values)."""
    P = tree.shape[0] // 2
    for i in range(P - 1, 0, -1):
        fix_node(tree, i, True, stamps, touched, P)


@njit(cache=True, nogil=True)
def _before(v, sb, r, n, i, j):
    """Entry ``i`` ranks before entry ``j``: a larger value, or the same with a lesser stamp (row ``r`` of
    ``sb``; None: no stamps), or the same stamp at a lower node.  (None is a type of its own to numba:
    a tree without stamps compiles to the comparison without them.)"""
    if sb is None:
        return v[i] > v[j] or (v[i] == v[j] and n[i] < n[j])
    si, sj = sb[r, i], sb[r, j]
    return v[i] > v[j] or (v[i] == v[j] and (si < sj or (si == sj and n[i] < n[j])))


@njit(cache=True, nogil=True)
def _swap(v, sb, r, n, i, j):
    v[i], v[j] = v[j], v[i]
    if sb is not None:
        sb[r, i], sb[r, j] = sb[r, j], sb[r, i]
    n[i], n[j] = n[j], n[i]


@njit(cache=True, nogil=True)
def _keep_best(v, sb, r, n, m, k):
    """Reorder entries ``(v, sb[r], n)[:m]`` so that their ``k`` best (:func:`_before`) come first, in no
    order: a quickselect (nodes are distinct, so no two entries rank alike)."""
    lo, hi = 0, m - 1
    while lo < hi:
        mid = (lo + hi) // 2  # the median of three as the pivot, at hi
        if _before(v, sb, r, n, mid, lo):
            _swap(v, sb, r, n, mid, lo)
        if _before(v, sb, r, n, hi, lo):
            _swap(v, sb, r, n, hi, lo)
        if _before(v, sb, r, n, mid, hi):
            _swap(v, sb, r, n, mid, hi)
        store = lo
        for i in range(lo, hi):
            if _before(v, sb, r, n, i, hi):
                _swap(v, sb, r, n, i, store)
                store += 1
        _swap(v, sb, r, n, store, hi)
        if store == k - 1 or store == k:
            return
        if store < k:
            lo = store + 1
        else:
            hi = store - 1


#: the least finite value: a node at least this holds a leaf that is set (empty leaves hold ``-inf``)
_FINITE = -np.finfo(np.float64).max


@njit(cache=True, nogil=True)
def _children(tree, stamps, touched, nodes, m, least, out, vals, sb, r):
    """One level of a descent by frontier (:func:`topk_stamped`, :func:`leaves_equal`): the children of
    ``nodes[:m]`` whose value is at least ``least``, in order, into ``out``, their values into ``vals`` and,
    with ``stamps``, their stamps into row ``r`` of ``sb``, each one's own children prefetched; returns how
    many, or -1 when more than ``out`` has room for."""
    P = tree.shape[0] // 2
    c = 0
    for j in range(m):
        left = 2 * nodes[j]
        for child in (left, left + 1):
            x = tree[child]
            if x >= least:
                if c == out.shape[0]:
                    return -1
                out[c], vals[c] = child, x
                if sb is not None:
                    sb[r, c] = stamp_of(stamps, touched, child, P)
                c += 1
    if c and 2 * out[0] < P:  # the next level's reads on their way
        for j in range(c):
            prefetch(tree, 2 * out[j])
            if sb is not None and 2 * out[j] < P:
                prefetch(stamps, 2 * out[j])
    return c


@njit(cache=True, nogil=True)
def topk(tree, k, out_idx, out_val):
    """The ``k`` largest finite leaves, in descending order (ties: lower index first).

    Returns how many were found (fewer than ``k`` if fewer leaves are set).
    A frontier of at most ``k`` nodes a level (see the module docstring):
    1,024 of 10M leaves in 0.30 ms, where a best-first search with a heap of
    nodes took 1.43 ms (each pop waited for its children's line, and its
    sift through a heap of ~30k nodes for unpredictable branches).
    """
    return topk_stamped(tree, None, None, k, out_idx, out_val)


@njit(cache=True, nogil=True)
def topk_stamped(tree, stamps, touched, k, out_idx, out_val):
    """:func:`topk` of a tree with ``stamps`` (None: none, as :func:`topk`), the leaves' own in
    ``touched``: tied values come out least stamp first (equal stamps too: lower index first)."""
    if tree[1] == -np.inf or k <= 0:
        return 0
    # the frontier, two rows: the nodes of one level (their values, their stamps) and their children
    nb = np.empty((2, 2 * k + 2), dtype=np.int64)  # (at most 2k children: never past 2k + 2)
    vb = np.empty((2, 2 * k + 2), dtype=np.float64)
    if stamps is None:
        return _descend(tree, None, None, k, nb, vb, None, out_idx, out_val)
    return _descend(tree, stamps, touched, k, nb, vb, np.zeros((2, 2 * k + 2), dtype=np.int64), out_idx, out_val)


@njit(cache=True, nogil=True)
def _descend(tree, stamps, touched, k, nb, vb, sb, out_idx, out_val):
    """:func:`topk_stamped`'s descent, the frontier in rows of ``nb``, ``vb`` and ``sb`` (None: no stamps)."""
    P = tree.shape[0] // 2
    r, m = 0, 1
    nb[0, 0], vb[0, 0] = 1, tree[1]
    while nb[r, 0] < P:
        m = _children(tree, stamps, touched, nb[r], m, _FINITE, nb[1 - r], vb[1 - r], sb, 1 - r)
        r = 1 - r
        if m > k:
            _keep_best(vb[r], sb, r, nb[r], m, k)
            m = k
    # leaves by index, then stably by stamp, then stably by value, descending
    order = np.argsort(nb[r, :m])
    if sb is not None:
        order = order[np.argsort(sb[r, :m][order], kind="mergesort")]
    order = order[np.argsort(-vb[r, :m][order], kind="mergesort")]
    for j in range(m):
        out_idx[j] = nb[r, order[j]] - P
        out_val[j] = vb[r, order[j]]
    return m


@njit(cache=True, nogil=True)
def leaves_equal(tree, value, capacity, out):
    """The leaves below ``capacity`` that equal ``value``, ascending, into ``out``; returns how many.

    Descends level by level through the nodes whose maximum is at least
    ``value`` (the ancestors of the leaves at or above it), each level's reads
    prefetched a level ahead, where a scan reads every leaf.  Returns -1, with
    ``out`` undefined, when a level holds more such nodes than ``out`` has
    room for (many ties: the caller scans the leaves), or for ``value`` of
    ``-inf``.
    """
    P = tree.shape[0] // 2
    limit = out.shape[0]
    if value == -np.inf or limit == 0:
        return -1
    if not tree[1] >= value:
        return 0
    cur = np.empty(limit, dtype=np.int64)
    nxt = np.empty(limit, dtype=np.int64)
    vals = np.empty(limit, dtype=np.float64)
    cur[0], m = 1, 1
    while cur[0] < P:
        c = _children(tree, None, None, cur, m, value, nxt, vals, None, 0)  # in order: the frontier stays ascending
        if c <= 0:
            return c  # none left (0), or more than ``out`` has room for (-1)
        cur, nxt, m = nxt, cur, c
    k = 0
    for j in range(m):
        if tree[cur[j]] == value and cur[j] - P < capacity:
            out[k] = cur[j] - P
            k += 1
    return k
