"""Selector base classes.

A selector decides which items are taken, either to *sample* them or, used as a
table's *remover*, to evict them when the table is over ``max_size`` (Reverb's
vocabulary; TorchRL calls the former a sampler).  Selectors keep per-item state
indexed by *slot* (``0 <= slot < capacity`` of the shard) and are told about
every insert, removal and priority update of the shard that owns them.  They do
no I/O, no locking and no communication: the shard serialises calls.

Two families:

* :class:`WeightedSelector` (Uniform, Prioritized, WithoutReplacement) keeps a
  sum tree of sampling weights.  The shard draws by inverse CDF over it and
  reports the exact probability ``weight / valid_mass``; two-level sampling
  over shards uses the masses.
* :class:`OrderedSelector` (Fifo, Lifo, MaxHeap, MinHeap) is deterministic: it
  yields the best ``n`` candidates with an order key (larger is better), and
  the table merges candidates of all shards exactly.

Every selector samples; as a table's remover only Fifo is accepted
(:class:`~gear_flow.table.config.TableConfig` explains why: ring storage
overwrites a shard's oldest steps whatever another remover would keep).  The
others' eviction rules stay implemented and tested on bare shards.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import ClassVar, Protocol

import numpy as np

from .. import backend
from .trees import SumTree


class ShardState(Protocol):
    """What a shard exposes to its selectors (read-only for them)."""

    capacity: int
    active: np.ndarray  # uint8[capacity], 1 where the slot holds a live item
    tier: object  # the StorageTier (or its name): where the trees live, see backend.selection_ops

    def live_seq_range(self) -> tuple[int, int]:
        """``[lo, hi)``: item sequence numbers that may be live (slot = seq % capacity)."""

    def item_stamps(self, slots: np.ndarray) -> np.ndarray:
        """Table-wide insertion order of the items in ``slots`` (int64)."""

    def item_touched(self, slots: np.ndarray) -> np.ndarray:
        """Table-wide stamp of each item's insert or latest priority update (int64)."""


class Selector(ABC):
    """Common interface of every selector; see the module docstring."""

    #: deterministic selectors return candidates, stochastic ones draw
    deterministic: ClassVar[bool] = False
    #: whether the selector may be used as a table's remover
    can_remove: ClassVar[bool] = True

    def bind(self, shard: ShardState) -> None:
        """Allocate per-slot state for ``shard``.  Called once by the shard.

        Trees are allocated with the operations of the shard's storage tier
        (:func:`gear_flow.backend.selection_ops`: on the GPU for ``device``).
        """
        self.shard = shard
        self.capacity = shard.capacity
        self.ops = backend.selection_ops(getattr(shard, "tier", "host"))

    def clone(self) -> Selector:
        """A fresh, unbound selector with the same parameters (one per shard)."""
        return type(self)(**self.params())

    def params(self) -> dict:
        """Constructor arguments (JSON-able)."""
        return {}

    @abstractmethod
    def insert(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        """New live items at ``slots``."""

    @abstractmethod
    def remove(self, slots: np.ndarray) -> None:
        """Items at ``slots`` are gone."""

    @abstractmethod
    def update(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        """Priorities of live items changed (duplicates: last wins)."""

    def check_priorities(self, priorities: np.ndarray, role: str = "sampler") -> None:  # noqa: B027
        """Raise :class:`~gear_flow.errors.SpecError` for priorities this selector cannot represent.

        Called by the tables before an insert or update is applied anywhere
        (``priorities`` are already finite and ``>= 0``).  Default: all fine.
        """

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params().items())
        return f"{type(self).__name__}({args})"


class WeightedSelector(Selector):
    """Stochastic selection by inverse CDF over a sum tree of weights."""

    #: whether importance-sampling weights are meaningful for this selector
    importance_weighted: ClassVar[bool] = False
    #: whether drawn items are drawn without replacement (within an epoch)
    without_replacement: ClassVar[bool] = False

    def bind(self, shard: ShardState) -> None:
        super().bind(shard)
        self.sums = SumTree(self.ops, shard.capacity)

    @property
    def tree(self):
        """The sum tree's array (NumPy on the host tiers, CuPy on ``device``; see :mod:`.trees`).

        Subclasses set weights with :meth:`set_weights` / :meth:`set_weight`, which
        work on every tier; calling :mod:`gear_flow.ops.sumtree` on this array
        works on the host tiers only.
        """
        return self.sums.tree

    @property
    def mass(self) -> float:
        """Total sampling weight of all items."""
        return self.sums.mass

    def leaf_weights(self, slots: np.ndarray) -> np.ndarray:
        """Sampling weights of ``slots`` (host float64; a device tree answers from its host mirror)."""
        return self.sums.leaves[slots]

    def set_weights(self, slots: np.ndarray, weights: np.ndarray) -> None:
        """Sampling weight of ``slots[k]`` becomes ``weights[k]`` (duplicates: the last wins)."""
        self.sums.set(slots, weights)

    def set_weight(self, slots: np.ndarray, weight: float) -> None:
        """Sampling weight of every slot in ``slots`` becomes ``weight``."""
        self.sums.set_const(slots, weight)

    def draw(self, uniforms: np.ndarray) -> np.ndarray:
        """Slots drawn by inverse CDF at ``uniforms * mass`` (``uniforms`` in ``[0, 1)``; mass > 0)."""
        return self.sums.draw(uniforms)

    def remove(self, slots: np.ndarray) -> None:
        self.set_weight(slots, 0.0)

    def tree_state(self) -> np.ndarray:
        """A host copy of the tree (checkpoints)."""
        return self.sums.state()

    def load_tree(self, tree: np.ndarray) -> None:
        """Restore the tree from :meth:`tree_state` (checkpoints)."""
        self.sums.load(tree)

    def consume(self, slots: np.ndarray) -> None:
        """Called with the slots just sampled (before any removal)."""


class OrderedSelector(Selector):
    """Deterministic selection: the ``n`` best candidates by an order key."""

    deterministic = True

    @abstractmethod
    def candidates(
        self, n: int, valid: Callable[[np.ndarray], np.ndarray] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Up to ``n`` best live slots (best first) and their order keys (float64, larger is better:
        ``[n]``, or ``[n, c]`` compared column by column).

        ``valid`` filters slots (strict windows); only valid slots are returned.
        """

    def insert(self, slots: np.ndarray, priorities: np.ndarray) -> None:  # noqa: B027
        pass

    def remove(self, slots: np.ndarray) -> None:  # noqa: B027
        pass

    def update(self, slots: np.ndarray, priorities: np.ndarray) -> None:  # noqa: B027
        pass
