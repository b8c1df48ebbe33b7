"""Episode index: where each live episode's steps are in the ring.

Episodes get consecutive sequence numbers per shard; the live ones always form
one range ``[first, next)`` because storage evicts the oldest episodes first.
Entries are kept in arrays indexed by ``seq % size`` that double when full, so
the index costs a few dozen bytes per *episode*, not per step.
"""

from __future__ import annotations

import numpy as np

FIELDS = ("start", "length", "stamp", "episode_id")


class EpisodeIndex:
    """Per-shard ring of episode records.

    Fields (int64 each): ``start`` (absolute step position of the first step),
    ``length`` (steps), ``stamp`` (table-wide insertion order of its first
    item), ``episode_id`` (the table-wide episode id returned to users).

    Examples
    --------
    >>> idx = EpisodeIndex()
    >>> idx.append(np.array([0]), np.array([5]), np.array([0]), np.array([7]))
    >>> idx.lengths().tolist()
    [5]
    """

    def __init__(self, initial: int = 64):
        self.size = max(1, int(initial))
        self.arrays = {f: np.zeros(self.size, dtype=np.int64) for f in FIELDS}
        self.first = 0
        self.next = 0

    def __len__(self) -> int:
        return self.next - self.first

    def _grow(self, need: int) -> None:
        size = self.size
        while size < need:
            size *= 2
        if size == self.size:
            return
        seqs = np.arange(self.first, self.next)
        for f, a in self.arrays.items():
            b = np.zeros(size, dtype=np.int64)
            b[seqs % size] = a[seqs % self.size]
            self.arrays[f] = b
        self.size = size

    def append(self, start, length, stamp, episode_id) -> np.ndarray:
        """Add episodes; returns their sequence numbers."""
        n = len(start)
        self._grow(len(self) + n)
        seqs = np.arange(self.next, self.next + n)
        pos = seqs % self.size
        for f, v in zip(FIELDS, (start, length, stamp, episode_id)):
            self.arrays[f][pos] = v
        self.next += n
        return seqs

    def pop_front(self, n: int) -> np.ndarray:
        """Drop the ``n`` oldest episodes; returns their sequence numbers."""
        seqs = np.arange(self.first, self.first + n)
        self.first += n
        return seqs

    def get(self, field: str, seqs: np.ndarray) -> np.ndarray:
        return self.arrays[field][np.asarray(seqs) % self.size]

    def live(self) -> np.ndarray:
        return np.arange(self.first, self.next)

    def lengths(self) -> np.ndarray:
        return self.get("length", self.live())

    def starts(self) -> np.ndarray:
        return self.get("start", self.live())

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self.arrays.values())
