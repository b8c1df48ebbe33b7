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
from numpy.typing import ArrayLike

from ..errors import SpecError
from ..table.validate import check_priorities

#: stored ride-along updates (items) above which ``update_priorities(wait=False)`` sends them at once
PENDING_MAX = 1 << 16


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


class RideAlongMixin:
    """The handle's side of ride-along updates (:class:`~gear_flow.distributed.DistributedTable` methods):
    storing an update, handing it to the next sample's requests, sending what is left."""

    def _defer(self, keys: ArrayLike, priorities: ArrayLike | float) -> bool:
        """Check an update and store it to ride on the next sample; False when it may not (it must wait).

        It may when the sampler is weighted without heap ties and every key
        was seen issued: then no worker can refuse it.  Invalid input raises
        here, before anything is stored.
        """
        k, by, idx, on_lost = self._group(keys)
        pr = check_priorities(priorities, len(k), "keys")
        if pr is None:
            raise SpecError("priorities must not be None")
        self._cfg.check_priorities(pr)
        if self._cfg.selection != "weighted" or self._heap_ties or not self._issued.covers(k):
            return False
        for a, s in by.items():
            self._pending.add(s, {i: pr[idx[a][i]] for i in s})
        self.stats["deferred_stale"] += on_lost
        return True

    def _pending_calls(self, exclude: set | frozenset = frozenset()) -> dict:
        """``update`` requests for the stored updates of shards on workers not in ``exclude`` (taken from the store)."""
        plans = self._masses.plans()
        calls = {}
        for a in sorted({self.placement[s] for s in self._pending.shards() if s in self.placement} - set(exclude)):
            u = self._pending.take(s for s, w in self.placement.items() if w == a)
            if u is not None:
                calls[a] = ("update", dict(name=self.name, **u, masses=plans or None))
        return calls

    def _ride_along(self, addr: str) -> dict | None:
        """The stored updates of ``addr``'s shards, taken from the store, as a sample request's ``updates``."""
        if not len(self._pending):
            return None
        u = self._pending.take(s for s, w in self.placement.items() if w == addr)
        if u is not None:
            u["masses"] = self._masses.plans() or None
        return u

    def _updated(self, plans: list[dict], r: dict) -> None:
        """Book an applied ride-along or pending update's reply: masses kept, stale keys counted."""
        if isinstance(r, dict):
            self._masses.update_many(plans, r.get("masses") or [])
            r = r.get("stale", 0)
        self.stats["deferred_stale"] += int(r)

    async def _send_pending(self, exclude: set | frozenset = frozenset()) -> None:
        """Send the stored updates now (those of workers in ``exclude`` stay), one request per worker."""
        calls = self._pending_calls(exclude)
        if not calls:
            return
        try:
            res = await self._on_workers(calls)
        except BaseException:
            for _, (_, args) in calls.items():  # nothing is known applied: sent again next time (idempotent)
                self._pending.put_back(args)
            self._masses.clear()
            raise
        for a, r in res.items():
            self._updated(calls[a][1]["masses"] or [], r)
