"""Priority updates waiting to ride on a handle's next request to their worker.

``update_priorities(wait=False)`` on a weighted table stores the update here
(its keys were all seen issued, its priorities checked), and the handle's next
sample carries it in the same messages: a ``sample_part`` applies it before
the draw, and workers the sample does not draw from get an ``update`` in the
same round trip.  A learner's step (sample, then update the priorities of what
it sampled) is then one phase of requests instead of two.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

import numpy as np


class PendingUpdates:
    """Per shard, the item seqs and priorities of updates not sent yet (later updates of a seq win).

    Thread-safe: a learner thread sampling in-process and the event loop
    may both take from it.

    Examples
    --------
    >>> p = PendingUpdates()
    >>> p.add({0: np.array([3, 4])}, {0: np.array([1.0, 2.0])})
    >>> p.add({0: np.array([3])}, {0: np.array([5.0])})
    >>> u = p.take([0])
    >>> u["seqs_by_shard"][0].tolist(), u["prios_by_shard"][0].tolist()
    ([3, 4], [5.0, 2.0])
    >>> len(p)
    0
    """

    def __init__(self) -> None:
        self.by_shard: dict[int, tuple[list[np.ndarray], list[np.ndarray]]] = {}
        self.count = 0
        self.lock = threading.Lock()

    def __len__(self) -> int:
        """Updates stored (before de-duplication)."""
        return self.count

    def shards(self) -> set[int]:
        """Shards with updates waiting.

        Returns
        -------
        set of int
            Their ids.
        """
        with self.lock:
            return set(self.by_shard)

    def add(self, seqs_by_shard: dict, prios_by_shard: dict) -> None:
        """Store an update (after anything stored before).

        Parameters
        ----------
        seqs_by_shard : dict of int to numpy.ndarray
            int64 item seqs per shard.
        prios_by_shard : dict of int to numpy.ndarray
            float64 priorities, one per seq, same shards.
        """
        with self.lock:
            for s, seqs in seqs_by_shard.items():
                q, p = self.by_shard.setdefault(int(s), ([], []))
                q.append(np.asarray(seqs, np.int64))
                p.append(np.asarray(prios_by_shard[s], np.float64))
                self.count += len(seqs)

    def take(self, shards: Iterable[int]) -> dict | None:
        """Remove and return the updates of ``shards``, one priority per seq (the latest).

        Parameters
        ----------
        shards : iterable of int
            Shard ids (those without updates are skipped).

        Returns
        -------
        dict or None
            ``{"seqs_by_shard", "prios_by_shard"}`` as the ``update``
            operation takes them; None when none of ``shards`` has updates.
        """
        seqs, prios = {}, {}
        with self.lock:
            taken = {s: self.by_shard.pop(s) for s in sorted(set(shards) & set(self.by_shard))}
            self.count -= sum(len(a) for q, _ in taken.values() for a in q)
        for s, (q, p) in taken.items():
            q, p = np.concatenate(q), np.concatenate(p)
            # the last update of each seq: unique over the reversed order
            u, first = np.unique(q[::-1], return_index=True)
            seqs[s], prios[s] = u, p[::-1][first]
        return {"seqs_by_shard": seqs, "prios_by_shard": prios} if seqs else None

    def put_back(self, updates: dict | None) -> None:
        """Store again what :meth:`take` returned, before anything stored since (a request that
        carried it failed; an update applied twice sets the same priorities).

        Parameters
        ----------
        updates : dict or None
            What :meth:`take` returned.
        """
        if not updates:
            return
        with self.lock:
            for s, seqs in updates["seqs_by_shard"].items():
                q, p = self.by_shard.setdefault(int(s), ([], []))
                q.insert(0, np.asarray(seqs, np.int64))
                p.insert(0, np.asarray(updates["prios_by_shard"][s], np.float64))
                self.count += len(seqs)

    def clear(self) -> None:
        """Forget every stored update."""
        with self.lock:
            self.by_shard.clear()
            self.count = 0
