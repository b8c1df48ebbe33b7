"""Top-k selection by priority (Reverb's MaxHeap / MinHeap)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..ops import maxtree
from .base import OrderedSelector


class _Heap(OrderedSelector):
    """Top-k by priority; equal priorities: the least recently inserted or updated first.

    Order keys are two columns, ``(sign * priority, -touched)`` (larger is
    better), so the merge of several shards' candidates breaks ties by the
    table-wide stamp of each item's insert or latest update, as Reverb's heaps
    do within one table.
    """

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

    def _top(self, n: int, valid) -> tuple[np.ndarray, np.ndarray]:
        """Up to ``n`` valid slots of the highest values (ties in any order), and their values."""
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

    def candidates(
        self, n: int, valid: Callable[[np.ndarray], np.ndarray] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        idx, val = self._top(n, valid)
        if len(idx) == n and n:
            # items tied with the worst one kept compete on their stamps: take them all
            # (a vectorised scan of the leaves, only the ties' cost is a sort)
            worst = val[-1]
            P = self.tree.shape[0] // 2
            tied = np.flatnonzero(self.tree[P : P + self.capacity] == worst)
            if valid is not None and len(tied):
                tied = tied[valid(tied)]
            better = idx[val > worst]
            need = n - len(better)
            tied = tied[np.argsort(self.shard.item_touched(tied), kind="stable")[:need]]
            idx = np.concatenate([better, tied])
            val = np.concatenate([val[val > worst], np.full(len(tied), worst)])
        touched = self.shard.item_touched(idx)
        order = np.lexsort((touched, -val))
        idx, val, touched = idx[order], val[order], touched[order]
        return idx, np.column_stack([val, -touched.astype(np.float64)])


class MaxHeap(_Heap):
    """The highest-priority items first; equal priorities: least recently inserted or updated first.

    Examples
    --------
    >>> from gear_flow.selectors import MaxHeap
    >>> MaxHeap()
    MaxHeap()
    """

    _sign = 1.0


class MinHeap(_Heap):
    """The lowest-priority items first; equal priorities: least recently inserted or updated first.

    As a remover it is refused by the tables (see ``TableConfig``): ring
    storage cannot keep an item longer than one lap of its shard.

    Examples
    --------
    >>> from gear_flow.selectors import MinHeap
    >>> MinHeap()
    MinHeap()
    """

    _sign = -1.0
