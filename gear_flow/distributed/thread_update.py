"""A waiting priority update in the caller's thread: no event loop between a learner and its shards.

A learner's step is a sample and then an update of the priorities it drew.
The sample already goes from the learner's thread straight to the lanes
(:mod:`.thread_sample`); an ``update_priorities`` that waits went through
the event loop, two thread hops and an asyncio connection per worker: on a
2-core host half the step.  Here it takes the same road as the sample: the
``update`` requests go over the workers' lanes on blocking sockets (all
sent, then all read), this process's own worker applies its part in this
thread meanwhile.

Only what the event loop's path would send in one phase is done here
(:func:`update_here` returns None otherwise, before anything is sent): no
heap ties to stamp from the table-wide clock, no updates stored to ride
along first, every key seen issued unless one worker holds them all (that
worker then refuses unknown keys on its own, all or nothing), every worker
reachable from this thread.  An ``update`` is safe to send twice (it sets
priorities), so a request whose lane broke is sent again through the event
loop, which reaches the worker over the comm; a worker's refusal is raised
as on the event loop's path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from numpy.typing import ArrayLike

from ..table.results import UpdateResult
from .thread_sample import exchange, routes

if TYPE_CHECKING:
    from .api import DistributedTable


def update_here(t: DistributedTable, keys: ArrayLike, priorities: ArrayLike | float) -> UpdateResult | None:
    """Apply a waiting priority update from the caller's thread, or None (nothing sent: the event loop's
    path does it).

    Parameters
    ----------
    t : DistributedTable
        The handle.
    keys : array_like of int
        Item keys, any shape (flattened).
    priorities : float or array_like of float
        One value for all keys, or one per key.

    Returns
    -------
    UpdateResult or None
        As :meth:`~gear_flow.distributed.DistributedTable.update_priorities`.

    Raises
    ------
    InvalidDataError, SpecError, InvalidPriorityError, UnknownKeyError, ShardLostError
        As :meth:`~gear_flow.distributed.DistributedTable.update_priorities`.
    """
    ctx = t._ctx
    if ctx.in_loop() or t._heap_ties or len(t._pending) or not routes(t):
        return None
    k, by, idx, on_lost, pr = t._grouped_update(keys, priorities)
    if len(by) > 1 and not t._issued.covers(k):
        return None  # the event loop's path checks the keys on every worker before any applies them
    held = {i for s in by.values() for i in s}
    if not t._pending.hold(held):  # a ride-along of these shards in flight: the event loop's path waits for it
        return None
    try:
        plans = t._masses.plans()
        calls = t._update_calls(by, idx, pr, None, plans)
        res, errors, broken = {}, [], {}

        def arrived(kind, a, op, r):
            if isinstance(r, BaseException):  # its lane broke: sent again below
                broken[a] = calls[a]
            elif r[0]:
                res[a] = r[1]
            else:
                errors.append(r[1])

        for op, _ in calls.values():
            t.requests[op] += 1
        try:
            exchange(ctx, [(a, op, args, "upd") for a, (op, args) in calls.items()], arrived)
            if broken:
                more, errs = ctx.sync(t._on_workers, broken, True)
                res.update(more)
                errors += errs
            on_lost += t._lost_keys(by, res, errors)
        except BaseException:
            t._masses.clear()
            raise
        if not broken:
            t.stats["updates_in_thread"] += 1
        return t._updated_all(k, res, plans, on_lost)
    finally:
        t._pending.release(held)
