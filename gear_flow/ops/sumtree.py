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


def leaf_count(n: int) -> int:
    """Smallest power of two >= n (and >= 1)."""
    p = 1
    while p < n:
        p *= 2
    return p


def new_tree(n: int) -> np.ndarray:
    """An all-zero tree able to hold ``n`` leaves."""
    return np.zeros(2 * leaf_count(n), dtype=np.float64)


@njit(cache=True, nogil=True)
def set_leaves(tree, idx, values):
    """Set ``leaf[idx[k]] = values[k]`` for every k and repair the parents.

    Duplicate indices: applied in order, so the last value wins.
    """
    P = tree.shape[0] // 2
    for k in range(idx.shape[0]):
        i = idx[k] + P
        tree[i] = values[k]
        i //= 2
        while i >= 1:
            tree[i] = tree[2 * i] + tree[2 * i + 1]
            i //= 2


@njit(cache=True, nogil=True)
def set_leaves_const(tree, idx, value):
    """Set every ``leaf[idx[k]] = value`` (insert with one weight, removal with 0)."""
    P = tree.shape[0] // 2
    for k in range(idx.shape[0]):
        i = idx[k] + P
        tree[i] = value
        i //= 2
        while i >= 1:
            tree[i] = tree[2 * i] + tree[2 * i + 1]
            i //= 2


@njit(cache=True, nogil=True)
def find(tree, targets, out):
    """Inverse CDF: ``out[k]`` is the leaf whose cumulative range holds ``targets[k]``.

    ``targets`` must lie in ``[0, tree[1])``.  A zero-weight leaf is never
    returned while the root is positive (the descent only enters positive
    subtrees), which also absorbs rounding at the right edge.
    """
    P = tree.shape[0] // 2
    for k in range(targets.shape[0]):
        u = targets[k]
        i = 1
        while i < P:
            left = tree[2 * i]
            if (u < left and left > 0.0) or tree[2 * i + 1] <= 0.0:
                i = 2 * i
            else:
                u -= left
                i = 2 * i + 1
        out[k] = i - P


@njit(cache=True, nogil=True)
def range_sum(tree, lo, hi):
    """Sum of leaves ``lo <= i < hi``."""
    P = tree.shape[0] // 2
    s = 0.0
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
