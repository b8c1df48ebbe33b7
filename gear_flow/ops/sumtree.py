"""Sum tree over item weights: O(log N) update, inverse-CDF lookup and range sums.

Layout: ``tree`` has ``2 * P`` float64 entries, ``P`` a power of two >= the
number of items; ``tree[1]`` is the root, leaf ``i`` is ``tree[P + i]``,
``tree[0]`` is unused.  Parents are recomputed as the sum of their two
children (never updated by deltas), so the root is always exactly the sum of
its subtrees and there is no floating-point drift over millions of updates.

Twin of ``kernels/sumtree.cu``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ._mem import prefetch, prefetch_write


def leaf_count(n: int) -> int:
    """Smallest power of two >= n (and >= 1): the leaves of a tree over ``n`` items.

    Parameters
    ----------
    n : int
        Items the tree must hold.

    Returns
    -------
    int
        A power of two, at least 1.

    Examples
    --------
    >>> leaf_count(5), leaf_count(8), leaf_count(0)
    (8, 8, 1)
    """
    p = 1
    while p < n:
        p *= 2
    return p


def new_tree(n: int) -> np.ndarray:
    """An all-zero tree able to hold ``n`` leaves.

    Parameters
    ----------
    n : int
        Items the tree must hold.

    Returns
    -------
    numpy.ndarray
        float64 ``[2 * P]`` with ``P = leaf_count(n)``: node 1 is the root,
        node ``i`` has children ``2i`` and ``2i + 1``, leaf ``j`` is node
        ``P + j``; node 0 is unused.
    """
    return np.zeros(2 * leaf_count(n), dtype=np.float64)


@njit(cache=True, nogil=True)
def _repair(tree, idx):
    """Recompute the ancestors of leaves ``idx``, one level at a time for all of them.

    Level-synchronous (like the CUDA kernel): the loads of different leaves'
    parents are independent, so the CPU overlaps their cache misses, which is
    what keeps a 10M-leaf tree as fast per update as a cache-resident one.
    Recomputing a shared ancestor twice is harmless, and so is recomputing a
    node none of ``idx`` is under: every other node is the sum of its children
    already (every leaf written since the last repair is among ``idx``), so
    levels no longer than the list are recomputed whole.
    """
    repair_levels(tree, idx, np.empty(idx.shape[0], dtype=np.int64), False, None, None)


@njit(cache=True, nogil=True)
def repair_levels(tree, idx, node, largest, stamps, touched):
    """Recompute the ancestors of leaves ``idx`` level by level, each node the sum of its two children or,
    with ``largest``, the larger (a max tree, :mod:`gear_flow.ops.maxtree`, laid out as this one); a max
    tree with ``stamps`` also keeps, per node, the least stamp among its leaves of the largest value.

    See :func:`_repair`: what holds for a sum holds for a maximum, and for the stamp that breaks its ties.

    Parameters
    ----------
    tree : numpy.ndarray
        float64 ``[2 * P]``, written in place.
    idx : numpy.ndarray
        int64 leaves written since the last repair (repeats allowed).
    node : numpy.ndarray
        int64 scratch, at least ``len(idx)``.
    largest : bool
        Each node the larger of its children instead of their sum.
    stamps : numpy.ndarray or None
        int64 ``[P]``, the internal nodes' stamps (:func:`gear_flow.ops.maxtree.new_stamps`), written in
        place; None for a tree without them (a type of its own to numba: that tree's repair compiles
        without them).
    touched : numpy.ndarray or None
        int64, the leaves' own stamps (leaf ``j``'s is ``touched[j]``; past its end, none); read only
        with ``stamps``.
    """
    P = tree.shape[0] // 2
    m = 0  # ancestors at the current level; neighbours that share one (sorted idx: inserts) kept once
    for k in range(idx.shape[0]):
        i = (idx[k] + P) // 2
        if m == 0 or node[m - 1] != i:
            node[m] = i
            prefetch_write(tree, i)
            if stamps is not None:
                prefetch_write(stamps, i)
            m += 1
    level = P // 2
    while level >= 1:
        if level <= m:
            # no more nodes in the level than in the list (whose unsorted leaves left it long): every node of
            # it and of each level above, in order, costs less than the list's scattered ones, and a node
            # whose children did not change gets its value again (1,024 leaves of 10M: 56 -> 45 us a set)
            while level >= 1:
                for i in range(level, 2 * level):
                    fix_node(tree, i, largest, stamps, touched, P)
                level //= 2
            return
        j = 0
        for k in range(m):  # node[j] with j <= k: written only once read
            i = node[k]
            fix_node(tree, i, largest, stamps, touched, P)
            if j == 0 or node[j - 1] != i // 2:
                node[j] = i // 2
                prefetch_write(tree, i // 2)  # the next level's write, on its way a level ahead (as find's)
                if stamps is not None:
                    prefetch_write(stamps, i // 2)
                j += 1
        m = j  # sorted idx: the work halves level by level (2n nodes in all, not n per level)
        level //= 2


@njit(cache=True, nogil=True)
def fix_node(tree, i, largest, stamps, touched, P):
    """Node ``i`` from its children: their sum, or the larger; with ``stamps``, the child of the larger value
    or, the values equal, of the lesser stamp (equal again: the left one) gives its value and its stamp."""
    a, b = tree[2 * i], tree[2 * i + 1]
    if not largest:
        tree[i] = a + b
    elif stamps is None:
        tree[i] = a if a >= b else b
    else:
        sa, sb = stamp_of(stamps, touched, 2 * i, P), stamp_of(stamps, touched, 2 * i + 1, P)
        if a > b or (a == b and sa <= sb):
            tree[i], stamps[i] = a, sa
        else:
            tree[i], stamps[i] = b, sb


@njit(cache=True, nogil=True, inline="always")
def stamp_of(stamps, touched, i, P):
    """The stamp of node ``i`` of a stamped max tree: an internal node's own, a leaf's from ``touched``
    (none, the largest int64, for a leaf past it)."""
    if i < P:
        return stamps[i]
    j = i - P
    return touched[j] if j < touched.shape[0] else _NONE


#: the stamp of no item (a leaf past the shard's slots): it loses every tie
_NONE = np.iinfo(np.int64).max


@njit(cache=True, nogil=True)
def set_leaves(tree, idx, values):
    """Set ``leaf[idx[k]] = values[k]`` for every k and repair the parents.

    Duplicate indices: applied in order, so the last value wins.
    """
    write_leaves(tree, idx, values)
    _repair(tree, idx)


@njit(cache=True, nogil=True)
def set_leaves_const(tree, idx, value):
    """Set every ``leaf[idx[k]] = value`` (insert with one weight, removal with 0)."""
    write_leaves_const(tree, idx, value)
    _repair(tree, idx)


@njit(cache=True, nogil=True)
def write_leaves(tree, idx, values):
    """:func:`set_leaves` without the repair: the parents are stale until :func:`repair` of ``idx``."""
    P = tree.shape[0] // 2
    for k in range(idx.shape[0]):
        tree[idx[k] + P] = values[k]


@njit(cache=True, nogil=True)
def write_leaves_const(tree, idx, value):
    """:func:`set_leaves_const` without the repair: the parents are stale until :func:`repair` of ``idx``."""
    P = tree.shape[0] // 2
    for k in range(idx.shape[0]):
        tree[idx[k] + P] = value


@njit(cache=True, nogil=True)
def repair(tree, idx, scratch):
    """Recompute the ancestors of leaves ``idx`` (written by :func:`write_leaves`): one pass for leaves
    written by several calls (an insert's evicted and inserted slots).  ``scratch``: int64, at least
    ``len(idx)`` (a caller's reused buffer: a large insert's repair then allocates nothing).

    Leaves that form a few runs of consecutive slots (an insert's: the evicted episodes' slots and the
    written ones, each one run or two across the ring's end, and mostly the same slots) are repaired
    as the union of their ranges, each ancestor once, where the general repair recomputes the
    ancestors of every run (for an overwriting insert, each node twice).
    """
    if idx.shape[0] < 4 * _MAX_RUNS or not _repair_runs(tree, idx, scratch):
        repair_levels(tree, idx, scratch, False, None, None)


_MAX_RUNS = 16


@njit(cache=True, nogil=True)
def _repair_runs(tree, idx, runs):
    """:func:`repair` of ``idx`` as at most ``_MAX_RUNS`` runs of consecutive leaves, their bounds kept in
    ``runs`` (at least ``2 * _MAX_RUNS`` long); False, and nothing changed, for more runs."""
    r, lo, prev = 0, idx[0], idx[0]
    for k in range(1, idx.shape[0] + 1):
        if k < idx.shape[0] and idx[k] == prev + 1:
            prev = idx[k]
            continue
        if r == _MAX_RUNS:
            return False
        runs[2 * r], runs[2 * r + 1] = lo, prev
        r += 1
        if k < idx.shape[0]:
            lo = prev = idx[k]
    P = tree.shape[0] // 2
    if P < 2:
        return True  # the one leaf is the root
    for j in range(2 * r):
        runs[j] = (runs[j] + P) // 2  # the nodes of the leaves' parents
    while True:
        for j in range(1, r):  # ranges by their first node (insertion sort: a few of them)
            a, b = runs[2 * j], runs[2 * j + 1]
            i = j
            while i > 0 and runs[2 * i - 2] > a:
                runs[2 * i], runs[2 * i + 1] = runs[2 * i - 2], runs[2 * i - 1]
                i -= 1
            runs[2 * i], runs[2 * i + 1] = a, b
        m = 0  # overlapping or adjacent ranges merged: each node once
        for j in range(r):
            if m and runs[2 * j] <= runs[2 * m - 1] + 1:
                runs[2 * m - 1] = max(runs[2 * m - 1], runs[2 * j + 1])
            else:
                runs[2 * m], runs[2 * m + 1] = runs[2 * j], runs[2 * j + 1]
                m += 1
        r = m
        for j in range(r):
            for i in range(runs[2 * j], runs[2 * j + 1] + 1):
                tree[i] = tree[2 * i] + tree[2 * i + 1]
        if runs[0] == 1:  # the root: every range is at one depth, so this is [1, 1]
            return True
        for j in range(2 * r):
            runs[j] //= 2


@njit(cache=True, nogil=True)
def find(tree, targets, out):
    """Inverse CDF: ``out[k]`` is the leaf whose cumulative range holds ``targets[k]``.

    ``targets`` must lie in ``[0, tree[1])``.  A zero-weight leaf is never
    returned while the root is positive (the descent only enters positive
    subtrees), which also absorbs rounding at the right edge.  All targets
    descend one level at a time so their cache misses overlap.

    The step takes no branch (non-short-circuit ``&``/``|`` and a select): left
    or right is a coin toss per level, and each mispredicted branch threw away
    the loads in flight behind it, so fewer misses overlapped.  And each step
    prefetches the node the target reads at the next level: a load holds its
    place in the CPU's reorder window until its line arrives, so a level's
    loads overlap only a window's worth at a time, where prefetches issued a
    whole level ahead are all on their way when that level starts.  1,024
    draws from 10M leaves on this project's CPU: 165 us with the branch, 101
    us without, 52 us with the prefetches too (256 draws: 30 -> 13 us); the
    same leaves.
    """
    P = tree.shape[0] // 2
    node = np.ones(targets.shape[0], dtype=np.int64)
    _descend(tree, targets.copy(), node)
    for k in range(node.shape[0]):
        out[k] = node[k] - P


@njit(cache=True, nogil=True)
def draw_probs(tree, uniforms, mass, denom, out, probs):
    """:func:`find` of ``uniforms * mass`` into ``out``, and each drawn leaf's weight over ``denom`` into
    ``probs``: a weighted sample's slots and probabilities in one call, each weight read where the descent
    found it (a leaf just read), where a second pass read every drawn leaf again and two arrays were made
    for the products and the quotients."""
    P = tree.shape[0] // 2
    node = np.ones(uniforms.shape[0], dtype=np.int64)
    _descend(tree, uniforms * mass, node)
    for k in range(node.shape[0]):
        out[k] = node[k] - P
        probs[k] = tree[node[k]] / denom


@njit(cache=True, nogil=True, inline="always")
def _descend(tree, u, node):
    """:func:`find`'s descent of every target ``u[k]`` (changed in place) from the root ``node[k] = 1``
    down to its leaf's node."""
    P = tree.shape[0] // 2
    n = u.shape[0]
    width = 1
    while width < P:
        ahead = 2 * width < P  # the children are not leaves yet: their children are read next
        for k in range(n):
            i = node[k]
            left = tree[2 * i]
            right = tree[2 * i + 1]
            uk = u[k]
            go_left = ((uk < left) & (left > 0.0)) | (right <= 0.0)
            child = 2 * i + 1 - np.int64(go_left)
            node[k] = child
            u[k] = uk if go_left else uk - left
            if ahead:
                prefetch(tree, 2 * child)
        width *= 2


@njit(cache=True, nogil=True)
def range_sum(tree, lo, hi):
    """Sum of leaves ``lo <= i < hi``, the range clamped to the leaves ``[0, P)`` (a bound past them read
    outside the tree)."""
    P = tree.shape[0] // 2
    s = 0.0
    lo, hi = max(lo, 0), min(hi, P)
    a = lo + P
    b = hi + P
    while a < b:
        if a & 1:
            s += tree[a]
            a += 1
        if b & 1:
            b -= 1
            s += tree[b]
        a //= 2
        b //= 2
    return s


@njit(cache=True, nogil=True)
def ring_tail_mass(tree, capacity, starts, lengths, k):
    """Mass of the last ``min(k, length)`` leaves of each ring segment, summed.

    Segment ``e`` occupies ring positions ``starts[e] .. starts[e] + lengths[e] - 1``
    modulo ``capacity``.  Used by strict windows: a window of ``L`` steps cannot
    start in the last ``L - 1`` steps of its episode.
    """
    total = 0.0
    for e in range(starts.shape[0]):
        n = lengths[e]
        m = k if k < n else n
        if m <= 0:
            continue
        a = (starts[e] + n - m) % capacity
        b = a + m
        if b <= capacity:
            total += range_sum(tree, a, b)
        else:
            total += range_sum(tree, a, capacity) + range_sum(tree, 0, b - capacity)
    return total
