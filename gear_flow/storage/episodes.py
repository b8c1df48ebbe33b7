"""Episode index: where each live episode's steps are in the ring.

Episodes get consecutive sequence numbers per shard; the live ones always form
one range ``[first, next)`` because storage evicts the oldest episodes first.
Entries are kept in arrays indexed by ``seq % size`` that double when full, so
the index costs a few dozen bytes per *episode*, not per step.

Sequence order is not always stamp order: a distributed table stamps an insert
when the coordinator admits it and the worker writes it later, so two inserts
racing onto one shard may land in the other order.  Each record therefore also
keeps two bounds, derived at :meth:`EpisodeIndex.append`, that tell an ordered
selector scanning by sequence number when nothing unscanned can come first:
``stamp_floor`` (the smallest stamp of this episode and every later one) and
``stamp_ceiling`` (the largest stamp of this episode and every earlier one).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numpy.typing import ArrayLike

FIELDS = ("start", "length", "stamp", "episode_id")
#: derived from ``stamp`` at append (so never checkpointed): see the module docstring
BOUNDS = ("stamp_floor", "stamp_ceiling")


class EpisodeIndex:
    """Per-shard ring of episode records.

    Fields (int64 each): ``start`` (absolute step position of the first step),
    ``length`` (steps), ``stamp`` (table-wide insertion order of its first
    item), ``episode_id`` (the table-wide episode id returned to users).

    Parameters
    ----------
    initial : int, default 64
        Records allocated at first (at least 1); the arrays double when full.

    Examples
    --------
    >>> idx = EpisodeIndex()
    >>> idx.append(np.array([0]), np.array([5]), np.array([0]), np.array([7]))
    array([0])
    >>> idx.lengths().tolist()
    [5]
    """

    def __init__(self, initial: int = 64):
        self.size = max(1, int(initial))
        self.arrays = {f: np.zeros(self.size, dtype=np.int64) for f in FIELDS + BOUNDS}
        self.first = 0
        self.next = 0
        #: times the arrays were replaced by larger ones (a reader mapping them maps the new ones)
        self.generation = 0
        self._alloc: Callable[[int, int], np.ndarray] | None = None  # see share()
        self._shared: tuple[str, ...] = ()
        self._ceiling = np.iinfo(np.int64).min  # largest stamp appended so far

    def share(self, fields: tuple[str, ...], alloc: Callable[[int, int], np.ndarray]) -> np.ndarray:
        """Keep ``fields`` in one block from ``alloc`` from now on (a shard whose readers map its index).

        Parameters
        ----------
        fields : tuple of str
            Fields of :data:`FIELDS` moved; row ``k`` of the block is ``fields[k]``.
        alloc : callable
            ``alloc(k, n)``: a zeroed int64 ``[k, n]`` array; called again
            each time the index grows.

        Returns
        -------
        numpy.ndarray
            The block now holding them.
        """
        self._alloc, self._shared = alloc, tuple(fields)
        block = alloc(len(fields), self.size)
        for k, f in enumerate(fields):
            block[k] = self.arrays[f]
            self.arrays[f] = block[k]
        self.generation += 1
        self.block = block
        return block

    def adopt(self, fields: tuple[str, ...], block: np.ndarray, first: int, next: int,
              alloc: Callable[[int, int], np.ndarray]) -> None:  # fmt: skip
        """Take the records a disk shard left in ``block`` (its mapped index file) as this index's, in place.

        Like :meth:`share` (later growth goes to ``alloc``), except that the
        block's contents are kept: the live episodes are ``[first, next)``.
        The stamp bounds are derived again from the live records, as a
        checkpoint restore derives them.

        Parameters
        ----------
        fields : tuple of str
            The fields the block holds, row ``k`` being ``fields[k]``; every one of :data:`FIELDS`.
        block : numpy.ndarray
            int64 ``[len(fields), size]``.
        first, next : int
            The live sequence numbers' range.
        alloc : callable
            ``alloc(k, n)``: a zeroed int64 ``[k, n]`` array, when the index grows.
        """
        self._alloc, self._shared = alloc, tuple(fields)
        self.size = int(block.shape[1])
        for k, f in enumerate(fields):
            self.arrays[f] = block[k]
        for f in BOUNDS:
            self.arrays[f] = np.zeros(self.size, dtype=np.int64)
        self.block = block
        self.first = self.next = int(first)
        self._ceiling = np.iinfo(np.int64).min
        live = np.arange(first, next)
        self._bound(live % self.size, self.arrays["stamp"][live % self.size])
        self.next = int(next)
        self.generation += 1

    def __len__(self) -> int:
        return self.next - self.first

    def _grow(self, need: int) -> None:
        size = self.size
        while size < need:
            size *= 2
        if size == self.size:
            return
        seqs = np.arange(self.first, self.next)
        block = None if self._alloc is None else self._alloc(len(self._shared), size)
        for f, a in self.arrays.items():
            b = block[self._shared.index(f)] if f in self._shared else np.zeros(size, dtype=np.int64)
            b[seqs % size] = a[seqs % self.size]
            self.arrays[f] = b
        self.size = size
        if block is not None:
            self.block = block
        self.generation += 1

    def append(self, start: ArrayLike, length: ArrayLike, stamp: ArrayLike, episode_id: ArrayLike) -> np.ndarray:
        """Add episodes after the newest.

        Parameters
        ----------
        start : array_like of int
            ``[n]`` absolute step position of each episode's first step.
        length : array_like of int
            ``[n]`` steps of each.
        stamp : array_like of int
            ``[n]`` table-wide insertion order of each one's first item.
        episode_id : array_like of int
            ``[n]`` table-wide episode ids.

        Returns
        -------
        numpy.ndarray
            int64 ``[n]``: their sequence numbers, ``next .. next + n - 1``.
        """
        n = len(start)
        self._grow(len(self) + n)
        seqs = np.arange(self.next, self.next + n)
        pos = seqs % self.size
        for f, v in zip(FIELDS, (start, length, stamp, episode_id)):
            self.arrays[f][pos] = v
        self._bound(pos, stamp)
        self.next += n
        return seqs

    def _bound(self, pos: np.ndarray, stamp: ArrayLike) -> None:
        """Derive the stamp bounds of the records at ``pos`` (those after :attr:`next`), appended with ``stamp``."""
        n = len(pos)
        if n:
            st = np.asarray(stamp, dtype=np.int64).reshape(n)
            floor = np.minimum.accumulate(st[::-1])[::-1]
            # earlier records whose floor is above the new episodes' smallest stamp: lowered to it.  Floors
            # never decrease with seq, so they are a suffix of the live records, found by bisection; it is
            # empty unless episodes arrive out of stamp order, and then as long as the disorder
            lo, hi = self.first, self.next
            while lo < hi:
                mid = (lo + hi) // 2
                if self.arrays["stamp_floor"][mid % self.size] > floor[0]:
                    hi = mid
                else:
                    lo = mid + 1
            self.arrays["stamp_floor"][np.arange(lo, self.next) % self.size] = floor[0]
            self.arrays["stamp_floor"][pos] = floor
            ceiling = np.maximum.accumulate(np.concatenate(([self._ceiling], st)))[1:]
            self.arrays["stamp_ceiling"][pos] = ceiling
            self._ceiling = int(ceiling[-1])

    def pop_front(self, n: int) -> np.ndarray:
        """Drop the ``n`` oldest episodes.

        Parameters
        ----------
        n : int
            How many, ``n <= len(self)``.

        Returns
        -------
        numpy.ndarray
            int64 ``[n]``: their sequence numbers (their records stay readable
            with :meth:`get` until overwritten).
        """
        seqs = np.arange(self.first, self.first + n)
        self.first += n
        return seqs

    def get(self, field: str, seqs: ArrayLike) -> np.ndarray:
        """One field of the given episodes.

        Parameters
        ----------
        field : str
            One of :data:`FIELDS` or :data:`BOUNDS`.
        seqs : array_like of int
            Sequence numbers of live episodes (others read whatever reuses their slot).

        Returns
        -------
        numpy.ndarray
            int64 values, shaped as ``seqs``.
        """
        return self.arrays[field][np.asarray(seqs) % self.size]

    def live(self) -> np.ndarray:
        """Sequence numbers of the live episodes, oldest first.

        Returns
        -------
        numpy.ndarray
            ``arange(first, next)``.
        """
        return np.arange(self.first, self.next)

    def lengths(self) -> np.ndarray:
        """Steps of every live episode, oldest first.

        Returns
        -------
        numpy.ndarray
            int64 ``[len(self)]``.
        """
        return self.get("length", self.live())

    def starts(self) -> np.ndarray:
        """Absolute step position of every live episode's first step, oldest first.

        Returns
        -------
        numpy.ndarray
            int64 ``[len(self)]``.
        """
        return self.get("start", self.live())

    @property
    def nbytes(self) -> int:
        """Bytes held by the record arrays (allocated, not just live)."""
        return sum(int(a.nbytes) for a in self.arrays.values())
