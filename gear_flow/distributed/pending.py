"""Priority updates waiting to ride on a handle's next request to their worker.

``update_priorities(wait=False)`` on a weighted table stores the update here
(its keys were all seen issued, its priorities checked), and the handle's next
sample carries it in the same messages: a ``sample_part`` applies it before
the draw, and workers the sample does not draw from get an ``update`` in the
same round trip.  A learner's step (sample, then update the priorities of what
it sampled) is then one phase of requests instead of two.

:class:`PendingUpdates` is the store (each handle has one); the functions
after it are the handle's side, handed the handle: storing an update
(:func:`defer`), handing the stored ones to a request (:func:`ride_along`,
:func:`pending_calls`), settling that request (:func:`settle`,
:func:`book_reply`) and sending what is left (:func:`send_pending`).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import ArrayLike

from .edit_keys import grouped_update, heap_ties
from .transport import Moved, Retry

if TYPE_CHECKING:
    from .api import DistributedTable

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


# -- the handle's side: storing an update, handing it to the next sample's requests, sending what is left --------
def defer(table: DistributedTable, keys: ArrayLike, priorities: ArrayLike | float) -> bool:
    """Check an update and store it to ride on the handle's next sample; False when it may not (it must wait).

    It may when the sampler is weighted without heap ties and every key was
    seen issued: then no worker can refuse it.  Invalid input raises here,
    before anything is stored.

    Parameters
    ----------
    table : DistributedTable
        The handle.
    keys : array_like of int
        Item keys, any shape (flattened).
    priorities : float or array_like of float
        One value for all keys, or one per key.

    Returns
    -------
    bool
        True: stored; False: nothing stored.
    """
    k, by, idx, on_lost, pr = grouped_update(table, keys, priorities)
    if table._cfg.selection != "weighted" or heap_ties(table) or not table._issued.covers(k):
        return False
    for a, s in by.items():
        table._pending.add(s, {i: pr[idx[a][i]] for i in s})
    table.stats["deferred_stale"] += on_lost
    return True


def defer_priorities(table: DistributedTable, keys: ArrayLike, priorities: ArrayLike | float) -> bool:
    """Store a priority update to ride on this handle's next sample, if it may; never waits for it.

    What :meth:`update_priorities` does with ``wait=False``, except that
    an update that may not ride along is not sent either: the caller
    decides (a :class:`~gear_flow.Stream` queues it on its background
    writer, so the learner never waits).

    Parameters
    ----------
    table : DistributedTable
        The handle (the handle itself, on its method of this name).
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
    if not defer(table, keys, priorities):
        return False
    if len(table._pending) > PENDING_MAX:
        table._ctx.sync(send_pending, table)
    return True


def pending_calls(table: DistributedTable, exclude: set | frozenset = frozenset()) -> dict:
    """``update`` requests for the stored updates of shards on workers not in ``exclude`` (taken from the store).

    Parameters
    ----------
    table : DistributedTable
        The handle.
    exclude : set of str, optional
        Workers whose updates stay stored (a sample's request carries them).

    Returns
    -------
    dict
        ``{worker: ("update", kwargs)}``; settle each with :func:`settle`.
    """
    calls = {}
    for a in sorted({table.placement[s] for s in table._pending.shards() if s in table.placement} - set(exclude)):
        u = ride_along(table, a)
        if u is not None:
            calls[a] = ("update", dict(name=table.name, **u))
    return calls


def ride_along(table: DistributedTable, addr: str) -> dict | None:
    """The stored updates of ``addr``'s shards, taken from the store, as a sample request's ``updates``.

    Parameters
    ----------
    table : DistributedTable
        The handle.
    addr : str
        The worker's address.

    Returns
    -------
    dict or None
        ``{"seqs_by_shard", "prios_by_shard", "masses"}``, or None when
        nothing is stored for its shards; settle it with :func:`settle`.
    """
    if not len(table._pending):
        return None
    u = table._pending.take(s for s, w in table.placement.items() if w == addr)
    if u is not None:
        u["masses"] = table._masses.plans() or None
    return u


def _live_shards(table: DistributedTable) -> set[int]:
    return {s for s in table.placement if s not in table.lost}


def settle(table: DistributedTable, updates: dict | None, applied: bool) -> None:
    """A request that carried stored ``updates`` has finished: applied, or stored again to retry.

    Parameters
    ----------
    table : DistributedTable
        The handle.
    updates : dict or None
        What :func:`ride_along` (or a call of :func:`pending_calls`) carried.
    applied : bool
        Whether the worker applied them; if not they are stored again, for
        the shards still placed and not lost.
    """
    if applied:
        table._pending.done(updates)
    else:
        table._pending.put_back(updates, _live_shards(table))


def book_reply(table: DistributedTable, plans: list[dict], r: dict | int) -> None:
    """Book an applied ride-along or pending update's reply: masses kept, stale keys counted.

    Parameters
    ----------
    table : DistributedTable
        The handle.
    plans : list of dict
        The plans whose masses the request asked for.
    r : dict or int
        The worker's reply (``masses`` and ``stale``), or its stale count.
    """
    if isinstance(r, dict):
        table._masses.update_many(plans, r.get("masses") or [])
        r = r.get("stale", 0)
    table.stats["deferred_stale"] += int(r)


async def hold_pending(table: DistributedTable, shards: set[int]) -> None:
    """Before an update of ``shards`` is sent directly: send what is stored, wait for what is in flight,
    then hold the shards (:meth:`PendingUpdates.hold`) so that no ride-along of them overtakes it.

    Release with ``table._pending.release(shards)``.

    Parameters
    ----------
    table : DistributedTable
        The handle.
    shards : set of int
        The shards the update is for.
    """
    while True:
        await send_pending(table)  # stored before this call: sent first, keeping call order
        if table._pending.hold(shards):
            return
        await table._pending.settled(shards)  # in a sample in flight: applied, or stored again and sent next


#: rounds of :func:`send_pending` while workers refuse the stored updates as placed before a move
MOVED_SENDS = 8


async def send_pending(table: DistributedTable, exclude: set | frozenset = frozenset()) -> None:
    """Send the stored updates now (those of workers in ``exclude`` stay), one request per worker.

    Parameters
    ----------
    table : DistributedTable
        The handle.
    exclude : set of str, optional
        Workers whose updates stay stored.
    """
    for _ in range(MOVED_SENDS):
        calls = pending_calls(table, exclude)
        if not calls:
            return
        try:
            res, errors = await table._link.on_workers(calls, partial=True)
        except BaseException:
            for _, (_, args) in calls.items():  # nothing is known applied: sent again next time
                settle(table, args, False)
            table._masses.clear()
            raise
        for a, (_, args) in calls.items():
            if a in res:
                book_reply(table, args["masses"] or [], res[a])
            settle(table, args, a in res)  # a lost shard's updates are dropped, the others kept
        moved = Moved.among(errors)
        errors = [e for e in errors if not isinstance(e, Retry)]  # degraded: the lost shards are marked
        if errors:
            table._masses.clear()
            raise errors[0]
        if not moved:
            return
        # refused as placed before their shards moved (the placement learnt since): sent again where they
        # are now, so that a flush, or an update sent after them, finds them applied
    # (shards that kept moving: what is left stays stored for the next send)
