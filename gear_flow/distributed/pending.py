"""Priority updates waiting to ride on a handle's next request to their worker.

``update_priorities(wait=False)`` on a weighted table stores the update here
(its keys were all seen issued, its priorities checked), and the handle's next
sample carries it in the same messages: a ``sample_part`` applies it before
the draw, and workers the sample does not draw from get an ``update`` in the
same round trip.  A learner's step (sample, then update the priorities of what
it sampled) is then one phase of requests instead of two.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable

import numpy as np
from numpy.typing import ArrayLike

from .transport import Retry

#: stored ride-along updates (items) above which ``update_priorities(wait=False)`` sends them at once
PENDING_MAX = 1 << 16


class PendingUpdates:
    """Per shard, the item seqs and priorities of updates not sent yet (later updates of a seq win).

    Thread-safe: a learner thread sampling in-process and the event loop
    may both take from it.  A shard whose updates are in a request in flight
    is not taken again until that request is settled (:meth:`done` or
    :meth:`put_back`), so two requests never carry updates of one shard at
    once and a worker applies them in the order they were made.  An update
    sent directly (``wait=True``) holds its shards the same way
    (:meth:`hold`, after :meth:`settled`), so it never overtakes nor is
    overtaken by a ride-along of the same shard.  What a failed request
    carried is stored again, minus the seqs stored since, so an older
    priority never overrides a newer one.

    Examples
    --------
    >>> p = PendingUpdates()
    >>> p.add({0: np.array([3, 4])}, {0: np.array([1.0, 2.0])})
    >>> p.add({0: np.array([3])}, {0: np.array([5.0])})
    >>> u = p.take([0])
    >>> u["seqs_by_shard"][0].tolist(), u["prios_by_shard"][0].tolist()
    ([3, 4], [5.0, 2.0])
    >>> p.add({0: np.array([4])}, {0: np.array([9.0])})
    >>> p.take([0]) is None  # shard 0's updates are in flight
    True
    >>> p.put_back(u, live={0})  # that request failed: seq 4 was updated since, seq 3 was not
    >>> v = p.take([0])
    >>> v["seqs_by_shard"][0].tolist(), v["prios_by_shard"][0].tolist()
    ([3, 4], [5.0, 9.0])
    """

    def __init__(self) -> None:
        self.by_shard: dict[int, tuple[list[np.ndarray], list[np.ndarray]]] = {}
        self.count = 0
        self.lock = threading.Lock()
        self.gen = 0  # bumped by every update stored or sent
        self.inflight: dict[int, int] = {}  # shard -> gen when its updates were taken
        self.log: list[tuple[int, int, np.ndarray]] = []  # (gen, shard, seqs) updated while shards were in flight
        self.waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = []  # settled() calls waiting

    def __len__(self) -> int:
        """Updates stored (before de-duplication)."""
        return self.count

    def shards(self) -> set[int]:
        """Shards with updates waiting (and none in flight).

        Returns
        -------
        set of int
            Their ids.
        """
        with self.lock:
            return set(self.by_shard) - set(self.inflight)

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
            self.gen += 1
            for s, seqs in seqs_by_shard.items():
                q, p = self.by_shard.setdefault(int(s), ([], []))
                q.append(np.asarray(seqs, np.int64))
                p.append(np.asarray(prios_by_shard[s], np.float64))
                self.count += len(seqs)
            self._log(seqs_by_shard)

    def hold(self, shards: Iterable[int]) -> bool:
        """Mark ``shards`` in flight for an update sent directly, if none of them is in flight now.

        Stored updates of held shards are not taken (:meth:`take`) until
        :meth:`release`.

        Parameters
        ----------
        shards : iterable of int
            Shard ids.

        Returns
        -------
        bool
            True: all held; False: one is in flight (nothing held; wait with
            :meth:`settled` and try again).
        """
        shards = {int(s) for s in shards}
        with self.lock:
            if shards & set(self.inflight):
                return False
            for s in shards:
                self.inflight[s] = self.gen
            return True

    def release(self, shards: Iterable[int]) -> None:
        """End a :meth:`hold` (the direct update was answered, or failed).

        Parameters
        ----------
        shards : iterable of int
            The shards held.
        """
        with self.lock:
            for s in shards:
                self.inflight.pop(int(s), None)
            self._trim()

    async def settled(self, shards: Iterable[int]) -> None:
        """Return once none of ``shards`` is in flight (its requests applied or failed).

        Parameters
        ----------
        shards : iterable of int
            Shard ids.
        """
        shards = {int(s) for s in shards}
        loop = asyncio.get_running_loop()
        while True:
            with self.lock:
                if not shards & set(self.inflight):
                    return
                fut = loop.create_future()
                self.waiters.append((loop, fut))
            await fut

    def _log(self, seqs_by_shard: dict) -> None:
        for s, seqs in seqs_by_shard.items():
            if int(s) in self.inflight:
                self.log.append((self.gen, int(s), np.asarray(seqs, np.int64)))

    def take(self, shards: Iterable[int]) -> dict | None:
        """Remove and return the updates of ``shards`` (those not in flight), one priority per seq (the latest).

        Settle what is returned with :meth:`done` or :meth:`put_back`.

        Parameters
        ----------
        shards : iterable of int
            Shard ids (those without updates, or in flight, are skipped).

        Returns
        -------
        dict or None
            ``{"seqs_by_shard", "prios_by_shard"}`` as the ``update``
            operation takes them; None when none of ``shards`` has updates.
        """
        seqs, prios = {}, {}
        with self.lock:
            ids = sorted((set(shards) & set(self.by_shard)) - set(self.inflight))
            taken = {s: self.by_shard.pop(s) for s in ids}
            self.count -= sum(len(a) for q, _ in taken.values() for a in q)
            for s in ids:
                self.inflight[s] = self.gen
        for s, (q, p) in taken.items():
            q, p = np.concatenate(q), np.concatenate(p)
            # the last update of each seq: unique over the reversed order
            u, first = np.unique(q[::-1], return_index=True)
            seqs[s], prios[s] = u, p[::-1][first]
        return {"seqs_by_shard": seqs, "prios_by_shard": prios} if seqs else None

    def done(self, updates: dict | None) -> None:
        """The request carrying ``updates`` (from :meth:`take`) was applied.

        Parameters
        ----------
        updates : dict or None
            What :meth:`take` returned.
        """
        if updates:
            self.release(updates["seqs_by_shard"])

    def put_back(self, updates: dict | None, live: set[int]) -> None:
        """Store again what :meth:`take` returned, before anything stored since (the request that carried
        it failed): only for ``live`` shards, and without the seqs updated since it was taken.

        Parameters
        ----------
        updates : dict or None
            What :meth:`take` returned.
        live : set of int
            Shards still placed and not lost (the others' updates are dropped).
        """
        if not updates:
            return
        with self.lock:
            for s, seqs in updates["seqs_by_shard"].items():
                s = int(s)
                since = self.inflight.pop(s, self.gen)
                if s not in live:
                    continue
                seqs = np.asarray(seqs, np.int64)
                keep = np.ones(len(seqs), dtype=bool)
                for g, ls, later in self.log:
                    if g > since and ls == s:
                        keep &= ~np.isin(seqs, later)
                if not keep.any():
                    continue
                q, p = self.by_shard.setdefault(s, ([], []))
                q.insert(0, seqs[keep])
                p.insert(0, np.asarray(updates["prios_by_shard"][s], np.float64)[keep])
                self.count += int(keep.sum())
            self._trim()

    def _trim(self) -> None:
        """After shards left flight (lock held): forget the log no request in flight needs, wake :meth:`settled`."""
        oldest = min(self.inflight.values(), default=None)
        self.log = [] if oldest is None else [e for e in self.log if e[0] > oldest]
        waiters, self.waiters = self.waiters, []
        for loop, fut in waiters:
            loop.call_soon_threadsafe(_wake, fut)

    def stored(self) -> set[int]:
        """Shards with stored updates (in flight or not).

        Returns
        -------
        set of int
            Their ids.
        """
        with self.lock:
            return set(self.by_shard)

    def drop(self, shards: Iterable[int]) -> None:
        """Forget the stored updates of ``shards`` (lost, or restored elsewhere).

        Parameters
        ----------
        shards : iterable of int
            Shard ids.
        """
        with self.lock:
            for s in set(shards):
                q, _ = self.by_shard.pop(int(s), ([], []))
                self.count -= sum(len(a) for a in q)

    def clear(self) -> None:
        """Forget every stored update."""
        with self.lock:
            self.by_shard.clear()
            self.count = 0


def _wake(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)


class RideAlongMixin:
    """The handle's side of ride-along updates (:class:`~gear_flow.distributed.DistributedTable` methods):
    storing an update, handing it to the next sample's requests, sending what is left."""

    def _defer(self, keys: ArrayLike, priorities: ArrayLike | float) -> bool:
        """Check an update and store it to ride on the next sample; False when it may not (it must wait).

        It may when the sampler is weighted without heap ties and every key
        was seen issued: then no worker can refuse it.  Invalid input raises
        here, before anything is stored.
        """
        k, by, idx, on_lost, pr = self._grouped_update(keys, priorities)
        if self._cfg.selection != "weighted" or self._heap_ties or not self._issued.covers(k):
            return False
        for a, s in by.items():
            self._pending.add(s, {i: pr[idx[a][i]] for i in s})
        self.stats["deferred_stale"] += on_lost
        return True

    def defer_priorities(self, keys: ArrayLike, priorities: ArrayLike | float) -> bool:
        """Store a priority update to ride on this handle's next sample, if it may; never waits for it.

        What :meth:`update_priorities` does with ``wait=False``, except that
        an update that may not ride along is not sent either: the caller
        decides (a :class:`~gear_flow.Stream` queues it on its background
        writer, so the learner never waits).

        Parameters
        ----------
        keys : array_like of int
            Item keys, any shape (flattened).
        priorities : float or array_like of float
            One value for all keys, or one per key; finite and >= 0.

        Returns
        -------
        bool
            True: stored (sent with the next sample, :meth:`flush`,
            :meth:`checkpoint` or :meth:`close`); False: nothing stored, the
            update must be sent (the sampler is not weighted, has heap ties,
            or a key was never seen issued by this handle).

        Raises
        ------
        InvalidDataError, SpecError, InvalidPriorityError
            Invalid keys or priorities, as :meth:`update_priorities`; nothing
            stored.
        """
        if not self._defer(keys, priorities):
            return False
        if len(self._pending) > PENDING_MAX:
            self._ctx.sync(self._send_pending)
        return True

    def _pending_calls(self, exclude: set | frozenset = frozenset()) -> dict:
        """``update`` requests for the stored updates of shards on workers not in ``exclude`` (taken from the store)."""
        calls = {}
        for a in sorted({self.placement[s] for s in self._pending.shards() if s in self.placement} - set(exclude)):
            u = self._ride_along(a)
            if u is not None:
                calls[a] = ("update", dict(name=self.name, **u))
        return calls

    def _ride_along(self, addr: str) -> dict | None:
        """The stored updates of ``addr``'s shards, taken from the store, as a sample request's ``updates``."""
        if not len(self._pending):
            return None
        u = self._pending.take(s for s, w in self.placement.items() if w == addr)
        if u is not None:
            u["masses"] = self._masses.plans() or None
        return u

    def _live_shards_set(self) -> set[int]:
        return {s for s in self.placement if s not in self.lost}

    def _settle(self, updates: dict | None, applied: bool) -> None:
        """A request that carried stored ``updates`` has finished: applied, or stored again to retry."""
        if applied:
            self._pending.done(updates)
        else:
            self._pending.put_back(updates, self._live_shards_set())

    def _updated(self, plans: list[dict], r: dict) -> None:
        """Book an applied ride-along or pending update's reply: masses kept, stale keys counted."""
        if isinstance(r, dict):
            self._masses.update_many(plans, r.get("masses") or [])
            r = r.get("stale", 0)
        self.stats["deferred_stale"] += int(r)

    async def _hold_pending(self, shards: set[int]) -> None:
        """Before an update of ``shards`` is sent directly: send what is stored, wait for what is in flight,
        then hold the shards (:meth:`PendingUpdates.hold`) so that no ride-along of them overtakes it.
        Release with ``self._pending.release(shards)``."""
        while True:
            await self._send_pending()  # stored before this call: sent first, keeping call order
            if self._pending.hold(shards):
                return
            await self._pending.settled(shards)  # in a sample in flight: applied, or stored again and sent next

    async def _send_pending(self, exclude: set | frozenset = frozenset()) -> None:
        """Send the stored updates now (those of workers in ``exclude`` stay), one request per worker."""
        calls = self._pending_calls(exclude)
        if not calls:
            return
        try:
            res, errors = await self._on_workers(calls, partial=True)
        except BaseException:
            for _, (_, args) in calls.items():  # nothing is known applied: sent again next time
                self._settle(args, False)
            self._masses.clear()
            raise
        for a, (_, args) in calls.items():
            if a in res:
                self._updated(args["masses"] or [], res[a])
            self._settle(args, a in res)  # a lost shard's updates are dropped, the others kept
        errors = [e for e in errors if not isinstance(e, Retry)]  # degraded: the lost shards are marked
        if errors:
            self._masses.clear()
            raise errors[0]
