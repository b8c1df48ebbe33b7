"""Exact sampling mass of strict windows, without an O(episodes) pass per batch.

In ``strict`` mode an item is sampleable for window length ``L`` only if its
*reach* (steps from the item to the end of its episode, inclusive; for episode
items the episode's length) is at least ``L``.  The valid mass is the
sampler's total weight minus the *tail mass* ``sum(w_i for reach_i < L)``.

Computing the tail mass walks every live episode (O(E log N)); at 10M items
that would dominate sampling.  :class:`TailMass` caches it for the few window
lengths in use and keeps each cached value current by adding the weight
deltas of the slots that change (inserts, removals, priority updates, draws
without replacement).  To bound floating-point drift an entry is recomputed
from the tree after ``refresh_every`` slot changes, and before it is used
whenever the rounding its updates may have made is not small against the mass
it leaves (``total - tail``): a tail of 1e20 lowered to 1 keeps an error of
~1e4, which the 8 of weight left to the fitting items would otherwise read as
their mass.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import numpy as np

#: the rounding of a float64 sum, per unit of the magnitudes it adds (a bound: twice the unit roundoff)
_EPS = 2 * np.finfo(np.float64).eps

#: a cached tail mass whose rounding bound exceeds this share of what it leaves of the total is recomputed
DRIFT = 1e-9


class TailMass:
    """Cache of ``tail_mass(L)`` for one shard.

    Parameters
    ----------
    compute : callable
        ``compute(L) -> float``: the exact tail mass from scratch.
    reach : callable
        ``reach(slots) -> int64 array`` for live items.
    max_entries : int
        Window lengths cached at once (least recently used dropped).
    refresh_every : int
        Slot changes after which an entry is recomputed exactly.
    """

    def __init__(
        self,
        compute: Callable[[int], float],
        reach: Callable[[np.ndarray], np.ndarray],
        max_entries: int = 4,
        refresh_every: int = 1_000_000,
    ):
        self.compute = compute
        self.reach = reach
        self.max_entries = max_entries
        self.refresh_every = refresh_every
        self.entries: OrderedDict[int, list] = OrderedDict()  # L -> [mass, changes, rounding bound]
        #: L -> the valid mass summed from the fitting items themselves (:meth:`valid_listed`), until a slot changes
        self.listed: dict[int, float] = {}

    def get(self, length: int, total: float | None = None) -> float:
        """The tail mass for window length ``length``, cached (computed on a miss or when due).

        Parameters
        ----------
        length : int
            Window length ``L``, in steps.
        total : float, optional
            The sampler's total weight: the entry is recomputed unless its
            rounding is within :data:`DRIFT` of what it leaves (``total -
            tail``).

        Returns
        -------
        float
            ``sum(w_i for reach_i < L)`` over live items, exact up to the
            drift of at most ``refresh_every`` incremental updates (and, given
            ``total``, to ``DRIFT`` of the mass left).
        """
        e = self.entries.get(length)
        if e is None or not self._usable(e, total):
            e = [self.compute(length), 0, 0.0]
            self.entries[length] = e
            self.listed.pop(length, None)
            if len(self.entries) > self.max_entries:
                self.listed.pop(self.entries.popitem(last=False)[0], None)
        self.entries.move_to_end(length)
        return e[0]

    def _usable(self, e: list, total: float | None) -> bool:
        """Whether an entry may be used as it is: not due for its periodic recompute, and (given the sampler's
        ``total``) its rounding bound within :data:`DRIFT` of the mass it leaves."""
        return e[1] < self.refresh_every and (total is None or e[2] <= DRIFT * max(total - e[0], 0.0))

    def exact_entries(self, total: float) -> list[tuple[int, float]]:
        """``(L, tail mass)`` of the cached entries that :meth:`get` with this ``total`` would return as they
        are (what a shard publishes to the readers of its selection state; they leave the others to it).

        Parameters
        ----------
        total : float
            The sampler's total weight.

        Returns
        -------
        list of tuple
            In the cache's order, least recently used first.
        """
        return [(L, e[0]) for L, e in self.entries.items() if self._usable(e, total)]

    def change(self, slots: np.ndarray, old: np.ndarray, new: np.ndarray) -> None:
        """Weights at ``slots`` went from ``old`` to ``new``: update every cached entry.

        Parameters
        ----------
        slots : numpy.ndarray
            Item slots whose weight changed; they must still be resolvable by
            ``reach`` (call before an item's episode is dropped).
        old : numpy.ndarray
            Their weights before, aligned with ``slots`` (0 for new items).
        new : numpy.ndarray
            Their weights after (0 for removed items).
        """
        if not self.entries or len(slots) == 0:
            return
        self.listed.clear()
        delta = np.asarray(new, dtype=np.float64) - np.asarray(old, dtype=np.float64)
        r = self.reach(slots)
        for L, e in self.entries.items():
            m = r < L
            if m.any():
                d = delta[m]
                mass = e[0] + float(d.sum())
                # the sum's rounding (pairwise: log2 of its terms' count, times their magnitudes) and the add's
                e[2] += _EPS * (len(d).bit_length() * float(np.abs(d).sum()) + abs(e[0]) + abs(mass))
                e[0] = mass
            e[1] += len(slots)

    def clear(self) -> None:
        """Forget every cached entry (after a restore or any change not reported to :meth:`change`)."""
        self.entries.clear()
        self.listed.clear()

    def valid_listed(self, length: int, compute: Callable[[], float]) -> float:
        """The valid mass of windows of ``length`` summed from the fitting items themselves, kept until a slot
        changes: asked when the total minus the cached tail mass is within the cache's drift of zero, where
        the cache cannot tell a tiny remainder (fitting items of 1e-6 among 1e4) from nothing.

        Parameters
        ----------
        length : int
            Window length ``L``, in steps (cached by :meth:`get`).
        compute : callable
            ``compute() -> float``: the fitting items' weights summed (O(capacity)).

        Returns
        -------
        float
            That sum.
        """
        m = self.listed.get(length)
        if m is None:
            m = self.listed[length] = float(compute())
        return m


#: the share of a sampler's total weight below which a strict draw with replacement lists the items whose
#: windows fit and draws among them, where rejection against the whole tree would keep fewer than one draw in
#: a hundred (its rounds, each drawing only what is still missing, would not end); owners and readers alike
LISTED_BELOW = 0.01


def valid_mass(total: float, tail: float) -> float:
    """The mass of the items whose strict window fits: ``total - tail``, 0.0 when within rounding of zero.

    Parameters
    ----------
    total : float
        The sampler's total weight.
    tail : float
        The tail mass (:meth:`TailMass.get`).

    Returns
    -------
    float
        The valid mass; a remainder below ``total * 1e-9`` means nothing valid is left.
    """
    return total - tail if total - tail > total * 1e-9 else 0.0
