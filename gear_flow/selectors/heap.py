"""Top-k selection by priority (Reverb's MaxHeap / MinHeap)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .base import OrderedSelector
from .trees import MaxTree


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
        # ties by the stamps of the items' inserts and updates: in the tree itself once they are many
        self.maxes = MaxTree(self.ops, shard.capacity, touched=lambda: shard.touched)

    @property
    def tree(self):
        """The max tree's array (NumPy on the host tiers, CuPy on ``device``)."""
        return self.maxes.tree

    def tree_state(self) -> np.ndarray:
        """A host copy of the tree (checkpoints)."""
        return self.maxes.state()

    def load_tree(self, tree: np.ndarray) -> None:
        """Restore the tree from :meth:`tree_state` (checkpoints)."""
        self.maxes.load(tree)

    def insert(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        self.maxes.set(slots, self._sign * np.asarray(priorities, dtype=np.float64))

    def update(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        self.insert(slots, priorities)

    def remove(self, slots: np.ndarray) -> None:
        self.maxes.set(slots, np.full(len(slots), -np.inf))

    def _top(self, n: int, valid) -> tuple[np.ndarray, np.ndarray]:
        """Up to ``n`` valid slots of the highest values (ties in the tree's order), and their values."""
        want = max(n, 1)
        while True:
            idx, val = self.maxes.topk(want)
            k = len(idx)
            if valid is not None:
                keep = valid(idx)
                idx, val = idx[keep], val[keep]
            if len(idx) >= n or k < want:
                return idx[:n], val[:n]
            want *= 2

    def candidates(
        self, n: int, valid: Callable[[np.ndarray], np.ndarray] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        if self.maxes.stamped:  # the tree ranks ties by stamp: these are the best n, in order
            idx, val = self._top(n, valid)
            touched = self.shard.item_touched(idx)
        else:
            idx, val, touched = self._by_slot(n, valid)
        return idx, np.column_stack([val, -touched.astype(np.float64)])

    def _by_slot(self, n: int, valid) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`candidates` from a tree that ranks ties by slot: the best ``n`` slots, their values and
        stamps, ordered by (value, stamp)."""
        # one more than asked: whether the cut falls inside a tie (with fewer, every valid item is here)
        idx, val = self._top(n + 1 if n else 0, valid)
        cut_in_tie = n and len(idx) == n + 1 and val[n] == val[n - 1]
        idx, val = idx[:n], val[:n]
        if cut_in_tie:
            # the items tied with the worst one kept compete on their stamps, all of them, found from the
            # root while they are few (a scan of every leaf cost 3 ms a batch at 10M items), by a scan when many
            worst = val[-1]
            limit = 8 * n + 1024
            tied = self.maxes.equal(worst, limit)
            if len(tied) > limit:
                # O(N) a batch (all priorities equal, 1M items: 3.9 ms): from the next batch on, the
                # tree ranks ties by stamp itself (0.11 ms), for a second array and slower sets
                self.maxes.keep_stamps()
            if valid is not None and len(tied):
                tied = tied[valid(tied)]
            better = idx[val > worst]
            need = n - len(better)
            tied = tied[np.argsort(self.shard.item_touched(tied), kind="stable")[:need]]
            idx = np.concatenate([better, tied])
            val = np.concatenate([val[val > worst], np.full(len(tied), worst)])
        touched = self.shard.item_touched(idx)
        order = np.lexsort((touched, -val))
        return idx[order], val[order], touched[order]


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
