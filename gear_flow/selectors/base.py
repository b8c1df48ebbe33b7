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
        """Item sequence numbers that may be live (slot = seq % capacity).

        Returns
        -------
        lo, hi : int
            The half-open range ``[lo, hi)``.
        """

    def item_stamps(self, slots: np.ndarray) -> np.ndarray:
        """Table-wide insertion order of the items in ``slots``.

        Parameters
        ----------
        slots : numpy.ndarray
            int64 slots of live items.

        Returns
        -------
        numpy.ndarray
            int64, one stamp per slot (smaller: inserted earlier).
        """

    def item_touched(self, slots: np.ndarray) -> np.ndarray:
        """Table-wide stamp of each item's insert or latest priority update.

        Parameters
        ----------
        slots : numpy.ndarray
            int64 slots of live items.

        Returns
        -------
        numpy.ndarray
            int64, one stamp per slot (heaps break ties by it).
        """

    def stamp_floor(self, seq: int) -> int:
        """A lower bound on the stamps of the live items at ``seq`` and after.

        Parameters
        ----------
        seq : int
            An item sequence number in ``live_seq_range()``.

        Returns
        -------
        int
            No live item at ``seq`` or after is stamped below it.
        """

    def stamp_ceiling(self, seq: int) -> int:
        """The largest first stamp of the episodes holding items at ``seq`` and before.

        Parameters
        ----------
        seq : int
            An item sequence number in ``live_seq_range()``.

        Returns
        -------
        int
            An item stamped above it is newer than every item at ``seq`` and
            before outside its own episode.
        """


class Selector(ABC):
    """Common interface of every selector; see the module docstring.

    Subclass :class:`WeightedSelector` or :class:`OrderedSelector` and register
    the class (:func:`gear_flow.registry.register_selector`) so that distributed tables
    and checkpoints can rebuild it from :meth:`params`.

    Attributes
    ----------
    deterministic : bool
        Class attribute: True for ordered selectors (candidates), False for
        stochastic ones (draws).
    can_remove : bool
        Class attribute: whether the selector may be a table's remover.
    shard : ShardState
        The bound shard (after :meth:`bind`).
    capacity : int
        Slots of the bound shard.

    Examples
    --------
    >>> from gear_flow.selectors import Fifo, Prioritized
    >>> Prioritized(alpha=0.6).clone()
    Prioritized(alpha=0.6, beta=0.4)
    >>> Fifo().deterministic
    True
    """

    #: deterministic selectors return candidates, stochastic ones draw
    deterministic: ClassVar[bool] = False
    #: whether the selector may be used as a table's remover
    can_remove: ClassVar[bool] = True

    def bind(self, shard: ShardState) -> None:
        """Allocate per-slot state for ``shard``.  Called once by the shard.

        Trees are allocated with the operations of the shard's storage tier
        (:func:`gear_flow.backend.selection_ops`: on the GPU for ``device``).

        Parameters
        ----------
        shard : ShardState
            The shard that owns this selector.
        """
        self.shard = shard
        self.capacity = shard.capacity
        self.ops = backend.selection_ops(getattr(shard, "tier", "host"))

    def clone(self) -> Selector:
        """A fresh, unbound selector with the same parameters (one per shard).

        Returns
        -------
        Selector
            ``type(self)(**self.params())``.
        """
        return type(self)(**self.params())

    def params(self) -> dict:
        """Constructor arguments (JSON-able).

        Returns
        -------
        dict
            Keyword arguments that rebuild an equal selector; empty by
            default.
        """
        return {}

    @abstractmethod
    def insert(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        """New live items at ``slots``.

        Parameters
        ----------
        slots : numpy.ndarray
            int64 slots of the new items, distinct.
        priorities : numpy.ndarray
            float64 priority of each, validated finite and >= 0.
        """

    @abstractmethod
    def remove(self, slots: np.ndarray) -> None:
        """Items at ``slots`` are gone.

        Parameters
        ----------
        slots : numpy.ndarray
            int64 slots of the removed items.
        """

    @abstractmethod
    def update(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        """Priorities of live items changed (duplicates: last wins).

        Parameters
        ----------
        slots : numpy.ndarray
            int64 slots of live items; may repeat.
        priorities : numpy.ndarray
            float64 new priority of each, validated finite and >= 0.
        """

    def check_priorities(self, priorities: np.ndarray, role: str = "sampler") -> None:  # noqa: B027
        """Raise for priorities this selector cannot represent.

        Called by the tables before an insert or update is applied anywhere
        (``priorities`` are already finite and ``>= 0``).  Default: all fine.

        Parameters
        ----------
        priorities : numpy.ndarray
            float64 priorities of one insert or update.
        role : {"sampler", "remover"}, default "sampler"
            The selector's role in the table, for the message.

        Raises
        ------
        InvalidPriorityError
            A priority it cannot represent (e.g. Prioritized: one whose
            weight ``p ** alpha`` would overflow the table's total).
        """

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params().items())
        return f"{type(self).__name__}({args})"


class WeightedSelector(Selector):
    """Stochastic selection by inverse CDF over a sum tree of weights.

    Subclasses implement :meth:`insert` and :meth:`update` by setting weights
    (:meth:`set_weights`, :meth:`set_weight`); the shard draws with
    :meth:`draw` and reports ``weight / mass`` as the probability.

    Attributes
    ----------
    importance_weighted : bool
        Class attribute: whether importance-sampling weights apply
        (Prioritized).
    without_replacement : bool
        Class attribute: whether drawn items leave the epoch
        (WithoutReplacement).
    sums : SumTree
        The weights (after :meth:`bind`), on the shard's tier.
    """

    #: whether importance-sampling weights are meaningful for this selector
    importance_weighted: ClassVar[bool] = False
    #: whether drawn items are drawn without replacement (within an epoch)
    without_replacement: ClassVar[bool] = False

    def bind(self, shard: ShardState) -> None:
        """Allocate a zeroed sum tree of ``shard.capacity`` leaves on the shard's tier.

        Parameters
        ----------
        shard : ShardState
            The shard that owns this selector.
        """
        super().bind(shard)
        self.sums = SumTree(self.ops, shard.capacity)

    @property
    def tree(self) -> np.ndarray:
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
        """Sampling weights of ``slots`` (host float64; a device tree answers from its host mirror).

        Parameters
        ----------
        slots : numpy.ndarray
            int64 slots.

        Returns
        -------
        numpy.ndarray
            float64, one weight per slot.
        """
        return self.sums.leaves[slots]

    def set_weights(self, slots: np.ndarray, weights: np.ndarray) -> None:
        """Sampling weight of ``slots[k]`` becomes ``weights[k]`` (duplicates: the last wins).

        Parameters
        ----------
        slots : numpy.ndarray
            int64 slots; may repeat.
        weights : numpy.ndarray
            float64 weights >= 0, one per slot.
        """
        self.sums.set(slots, weights)

    def set_weight(self, slots: np.ndarray, weight: float) -> None:
        """Sampling weight of every slot in ``slots`` becomes ``weight``.

        Parameters
        ----------
        slots : numpy.ndarray
            int64 slots.
        weight : float
            The weight, >= 0.
        """
        self.sums.set_const(slots, weight)

    def draw(self, uniforms: np.ndarray) -> np.ndarray:
        """Slots drawn by inverse CDF at ``uniforms * mass``.

        Parameters
        ----------
        uniforms : numpy.ndarray
            float64 ``[n]`` in ``[0, 1)``; the tree's mass must be > 0.

        Returns
        -------
        numpy.ndarray
            int64 ``[n]`` slots, each drawn with probability ``weight /
            mass`` (zero-weight slots never).
        """
        return self.sums.draw(uniforms)

    def draw_probs(self, uniforms: np.ndarray, denom: float) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`draw`, and each drawn slot's weight (:meth:`drawn_weights`) over ``denom``: its probability
        when ``denom`` is the mass it was drawn among.

        Parameters
        ----------
        uniforms : numpy.ndarray
            float64 ``[n]`` in ``[0, 1)``; the tree's mass must be > 0.
        denom : float
            What each weight is divided by.

        Returns
        -------
        slots : numpy.ndarray
            int64 ``[n]``, as :meth:`draw` returns them.
        probs : numpy.ndarray
            float64 ``[n]``.
        """
        cls = type(self)
        if cls.draw is WeightedSelector.draw and cls.drawn_weights is WeightedSelector.drawn_weights:
            return self.sums.draw_probs(uniforms, denom)  # the tree's own draw and weights, in one call
        slots = self.draw(uniforms)  # a selector's own (Uniform's arithmetic, a custom one's)
        return slots, self.drawn_weights(slots) / denom

    def drawn_weights(self, slots: np.ndarray) -> np.ndarray:
        """The weights of slots :meth:`draw` just returned (a drawn slot's probability is its weight over the
        mass); :meth:`leaf_weights` unless a selector knows them without reading its tree.

        Parameters
        ----------
        slots : numpy.ndarray
            int64 ``[n]`` slots from :meth:`draw`.

        Returns
        -------
        numpy.ndarray
            float64 ``[n]``.
        """
        return self.leaf_weights(slots)

    def remove(self, slots: np.ndarray) -> None:
        """Items at ``slots`` are gone: their weight becomes 0.

        Parameters
        ----------
        slots : numpy.ndarray
            int64 slots of the removed items.
        """
        self.set_weight(slots, 0.0)

    def tree_state(self) -> np.ndarray:
        """A host copy of the tree (checkpoints).

        Returns
        -------
        numpy.ndarray
            float64, the tree's array (internal nodes and leaves).
        """
        return self.sums.state()

    def load_tree(self, tree: np.ndarray) -> None:
        """Restore the tree from :meth:`tree_state` (checkpoints).

        Parameters
        ----------
        tree : numpy.ndarray
            What :meth:`tree_state` returned for a shard of the same capacity.
        """
        self.sums.load(tree)

    def consume(self, slots: np.ndarray) -> None:
        """Called with the slots just sampled (before any removal); nothing by default.

        Parameters
        ----------
        slots : numpy.ndarray
            int64 slots of the sampled items.
        """


class OrderedSelector(Selector):
    """Deterministic selection: the ``n`` best candidates by an order key.

    The table merges every shard's candidates into the exact global best
    (:func:`gear_flow.table.two_level.merge_candidates`).  Priorities are
    ignored unless a subclass (the heaps) keeps them.

    A batch of ``B`` is the best ``B`` in order, cycling once every item is
    in (a Fifo over 3 items, ``B=5``: ``[0, 1, 2, 0, 1]``).  Reverb samples a
    batch item by item from an unchanged table and so hands out the best item
    ``B`` times; here a batch is one selection, on purpose.  With
    ``max_times_sampled`` the best item goes again until it expires, as in
    Reverb.
    """

    deterministic = True

    @abstractmethod
    def candidates(
        self, n: int, valid: Callable[[np.ndarray], np.ndarray] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Up to ``n`` best live slots, best first, with their order keys.

        Parameters
        ----------
        n : int
            Candidates wanted.
        valid : callable, optional
            ``valid(slots) -> bool array``: filters slots (strict windows,
            a horizon); only valid slots are returned.

        Returns
        -------
        slots : numpy.ndarray
            int64 ``[m]``, ``m <= n``, best first.
        keys : numpy.ndarray
            float64 order keys, larger is better: ``[m]``, or ``[m, c]``
            compared column by column.
        """

    def insert(self, slots: np.ndarray, priorities: np.ndarray) -> None:  # noqa: B027
        """Nothing to do: the order comes from the shard's stamps.

        Parameters
        ----------
        slots : numpy.ndarray
            int64 slots of the new items.
        priorities : numpy.ndarray
            float64 priorities (ignored).
        """

    def remove(self, slots: np.ndarray) -> None:  # noqa: B027
        """Nothing to do: removed slots are no longer active in the shard.

        Parameters
        ----------
        slots : numpy.ndarray
            int64 slots of the removed items.
        """

    def update(self, slots: np.ndarray, priorities: np.ndarray) -> None:  # noqa: B027
        """Nothing to do: priorities do not order these selectors.

        Parameters
        ----------
        slots : numpy.ndarray
            int64 slots.
        priorities : numpy.ndarray
            float64 priorities (ignored).
        """
