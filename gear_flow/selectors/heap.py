"""Top-k selection by priority (Reverb's MaxHeap / MinHeap)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..ops import maxtree
from .base import OrderedSelector


class _Heap(OrderedSelector):
    _sign = 1.0

    def bind(self, shard) -> None:
        super().bind(shard)
        self.tree = maxtree.new_tree(shard.capacity)

    def insert(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        maxtree.set_leaves(self.tree, slots, self._sign * np.asarray(priorities, dtype=np.float64))

    def update(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        self.insert(slots, priorities)

    def remove(self, slots: np.ndarray) -> None:
        maxtree.set_leaves(self.tree, slots, np.full(len(slots), -np.inf))

    def candidates(
        self, n: int, valid: Callable[[np.ndarray], np.ndarray] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        want = max(n, 1)
        while True:
            idx = np.empty(want, dtype=np.int64)
            val = np.empty(want, dtype=np.float64)
            k = maxtree.topk(self.tree, want, idx, val)
            idx, val = idx[:k], val[:k]
            if valid is not None:
                keep = valid(idx)
                idx, val = idx[keep], val[keep]
            if len(idx) >= n or k < want:
                return idx[:n], val[:n]
            want *= 2


class MaxHeap(_Heap):
    """The highest-priority items first (ties: lowest slot first).

    Examples
    --------
    >>> from gear_flow.selectors import MaxHeap
    >>> MaxHeap()
    MaxHeap()
    """

    _sign = 1.0


class MinHeap(_Heap):
    """The lowest-priority items first; as a remover, evicts the lowest priority.

    Examples
    --------
    >>> from gear_flow.selectors import MinHeap
    >>> MinHeap()
    MinHeap()
    """

    _sign = -1.0
