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
priorities), so a request whose lane broke is sent again over the comm,
from the event loop, once that lane is dropped; one whose reply did not come
in time (as long as the event loop's path waits) fails the update if the
worker is still there, as it would on that path; a worker's refusal is
raised as on that path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from numpy.typing import ArrayLike

from ..errors import ShardMovedError
from ..table import planner
from ..table.results import UpdateResult
from .edit_keys import Apply, CheckKeys, Stamps, checked, grouped_update, heap_ties, update_steps
from .transport import Moved, exchange

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
    if ctx.in_loop() or heap_ties(t) or len(t._pending) or not t._link.serves_in_thread():
        return None
    k, by, idx, on_lost, pr = grouped_update(t, keys, priorities)
    if len(by) > 1 and not t._issued.covers(k):
        return None  # the event loop's path checks the keys on every worker before any applies them
    held = {i for s in by.values() for i in s}
    if not t._pending.hold(held):  # a ride-along of these shards in flight: the event loop's path waits for it
        return None
    ex = ThreadUpdater(t, held)
    try:
        done = planner.run(update_steps(t, k, by, idx, pr, on_lost), ex)
    finally:
        if not ex.handed:
            t._pending.release(held)
    if ex.in_thread:
        t.stats["updates_in_thread"] += 1
    return done


class ThreadUpdater:
    """Answers :func:`~gear_flow.distributed.edit_keys.update_steps` from the caller's thread: the ``update``
    requests over the workers' lanes on blocking sockets (all sent, then all read; this worker's own part
    applied in this thread meanwhile).

    A request whose lane broke is sent again over the comm, from the event
    loop, once that lane is dropped (an ``update`` sets priorities: sending
    it twice changes nothing); that resend ends the hold of the update's
    shards there, however the caller's wait ends.  One whose reply did not
    come in time fails the update if its worker is still there
    (:meth:`~gear_flow.distributed.transport.TableLink.unanswered_here`).  A
    worker that refused it because its shards moved makes the handle learn
    the new placement, and those keys are sent again.  Whatever needs the
    event loop (keys checked on every worker, stamps, a worker not
    reachable from this thread) is sent from it.

    Parameters
    ----------
    table : DistributedTable
        The handle.
    held : set of int
        The update's shards, held from ride-alongs by the caller.
    """

    def __init__(self, table: DistributedTable, held: set[int]) -> None:
        self.t = table
        self.held = held
        #: a resend took over the hold (released on the event loop)
        self.handed = False
        #: every request went, and was answered, over the lanes in this thread
        self.in_thread = True

    def __call__(self, req: object) -> object:
        """Answer one request of the steps.

        Parameters
        ----------
        req : CheckKeys, Stamps or Apply
            The request.

        Returns
        -------
        object
            Its answer.
        """
        t, ctx = self.t, self.t._ctx
        if isinstance(req, Apply):
            if t._link.serves_in_thread():
                return self._apply(req.calls)
            self.in_thread = False
            return ctx.sync(t._link.on_workers, req.calls, True)
        self.in_thread = False
        if isinstance(req, CheckKeys):
            return ctx.sync(checked, t, req.by)
        if isinstance(req, Stamps):
            return t._link.coordinator_here.stamps(req.n)
        raise TypeError(f"not an update's request: {req!r}")

    def _apply(self, calls: dict) -> tuple[dict, list]:
        t, ctx = self.t, self.t._ctx
        res, errors, broken, timed_out, moved = {}, [], {}, [], {}

        def arrived(kind, a, op, r):
            if isinstance(r, BaseException):  # its lane broke, or no reply came in time: see below
                broken[a] = calls[a]
                if isinstance(r, TimeoutError):
                    timed_out.append(a)
            elif r[0]:
                res[a] = r[1]
            elif isinstance(r[1], ShardMovedError):  # its shards moved: their keys go again, as placed now
                moved[a] = r[1].epoch
            else:
                errors.append(r[1])

        for op, _ in calls.values():
            t.requests[op] += 1
        exchange(ctx, [(a, op, args, "upd") for a, (op, args) in calls.items()], arrived)
        hung = []
        for a in timed_out:  # waited as long as the event loop's path waits: a live worker fails the update
            unanswered = t._link.unanswered_here(a, "update")
            if unanswered is not None:
                hung.append(unanswered)
                del broken[a]
        if broken:  # sent again over the comm (a worker removed meanwhile is found lost there)
            self.in_thread = False
            held, self.handed = (set() if self.handed else self.held), True
            more, errs = ctx.sync(_resend, t, held, broken)
            res.update(more)
            errors += errs
        if moved:
            self.in_thread = False
            ctx.sync(t._link.moved, max(moved.values()))
            errors.append(Moved(moved))
        return res, errors + hung


async def _resend(t: DistributedTable, held: set[int], calls: dict) -> tuple[dict, list]:
    """The ``update`` requests ``calls`` whose lanes failed, sent again over the comm once those lanes are
    dropped; then the hold of ``held`` ends, here on the event loop, however the caller's wait ends."""
    try:
        return await t._link.again(sorted(calls), t._link.on_workers, calls, True)
    finally:
        t._pending.release(held)
