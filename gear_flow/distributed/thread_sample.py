"""A steady weighted sample in the caller's thread: no event loop between a learner and its shards.

When every worker holding a live shard is this process's own (a co-located
learner) or has a lane (on this machine: its rings mapped and a fast lane;
elsewhere, or with shared memory off: a TCP lane), a weighted sample needs
no event loop: the masses are the handle's kept ones, the draws go to the
lanes on blocking sockets (all sent, then all read: the workers draw in
parallel), this worker's own parts are drawn and gathered in this thread
meanwhile, and each part's windows are copied into the batch as its reply
is read (from shared memory, or from the reply).  Each hop between the
learner's thread and an event loop costs tens of microseconds on a 2-core
host and a sample took six of them; here it takes none.

The requests, their booking and the shared-memory copy are
:class:`~gear_flow.distributed.remote_sample.RemoteSample`'s own, so the two
paths answer a plan the same way.  Whatever this path cannot do by itself
(masses not kept, a plan asking for anything but a draw, a lane that cannot
be reached or closes, a worker's error) hands the sample to the event loop:
before anything was sent (:class:`NotHere`), or after undoing what was
drawn.  A reply lost after its request was sent (timed out, unreadable)
fails the sample instead: the worker may have drawn, and drawing again
would count twice.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import wait
from typing import TYPE_CHECKING, Any

from ..errors import ProtocolError
from ..table import planner
from .protocol import VERSION
from .remote_sample import OFF_LOOP_BYTES, RemoteSample, _copy_pool
from .transport import Context, reply_timeout

if TYPE_CHECKING:
    from .api import DistributedTable


class NotHere(Exception):
    """This sample cannot be served in the caller's thread; nothing was sent (the event loop serves it)."""


class ThreadSample(RemoteSample):
    """A synchronous executor for :func:`gear_flow.table.planner.run` over local shards and lanes.

    Parameters are :class:`RemoteSample`'s.  Only for handles whose workers
    all pass :func:`routes` (checked by the caller before planning).
    """

    #: ``(worker, operation, error)`` of a request sent whose reply was lost (timed out, unreadable): the
    #: worker may have run it, so the sample is not sent again; None
    lost_reply = None

    def __call__(self, req):
        t = self.t
        if isinstance(req, planner.Summaries):
            cached, self.stale = t._masses.fresh(req.kinds, self.L, self.boundary, t._view.live_shards())
            if cached is None:
                raise NotHere
            return cached
        if isinstance(req, planner.Draw):
            offs = planner.offsets(req.counts, req.base)
            return self._parts_here(offs, req.counts, req.scale, req.by_count)
        raise NotHere

    def _exchange(self, batch: list, arrived) -> None:
        """Run ``batch``'s requests (:func:`exchange`); windows coming from several workers are read (and
        copied) at once, so that no worker waits for this thread to finish reading another's before its own
        bytes can flow."""
        far = [b for b in batch if b[0] != self.t._ctx.local_addr]
        heavy = [kind == "draw" and not args.get("geometry") for _, _, args, kind in far]
        exchange(self.t._ctx, batch, arrived, sum(heavy) > 1 and self._reply_bytes(far) >= OFF_LOOP_BYTES)

    def _reply_bytes(self, far: list) -> int:
        """Bytes of windows the draws in ``far`` bring back."""
        rows = sum(
            sum(int(c) for c in (args.get("counts") or {}).values()) for _, op, args, _ in far if op == "sample_part"
        )
        return rows * self.L * self.row_bytes

    def _parts_here(self, offs, counts, scale, by_count):
        t = self.t
        ctx = t._ctx
        mapped = t._routes.every_mapped()
        calls, pending = {}, {}
        results = {"draw": {}, "fresh": {}, "upd": {}}
        errors, copied = [], {}

        def arrived(kind, a, op, r):  # a draw's windows are copied while the other workers' replies come
            if isinstance(r, BaseException) or not r[0]:  # the sample is undone and goes to the event loop
                e = r if isinstance(r, BaseException) else r[1]
                if isinstance(r, (TimeoutError, ProtocolError)):  # sent, and the reply lost: it may have run
                    self.lost_reply = (a, op, e)
                errors.append(e)
                return
            if kind == "draw":
                try:
                    for s, part in self._to_copy(r[1]):
                        copied[a, s] = self.copy_part(mapped.get(a), s, part, offs[s])
                except Exception as e:  # noqa: BLE001 - a segment gone (its worker died): as a part that never came
                    errors.append(e)
                    return
            results[kind][a] = r[1]

        try:
            calls = self.part_calls(offs, mapped, counts, scale, None, by_count)
            refresh = self._stale_masses_calls(counts)
            pending = t._pending_calls(exclude=set(calls))
            batch = [(a, op, args, kind) for kind, d in (("draw", calls), ("fresh", refresh), ("upd", pending))
                     for a, (op, args) in d.items()]  # fmt: skip
            for _, op, _, _ in batch:
                t.requests[op] += 1
            self._exchange(batch, arrived)
        except BaseException:  # nothing booked: the updates that were to ride along are stored again
            for _, (_, args) in calls.items():
                if "updates" in args:
                    t._settle(args["updates"], False)
            for _, (_, args) in pending.items():
                t._settle(args, False)
            raise
        self.book_extras(results["fresh"], pending, results["upd"])
        repairs = self.book(calls, results["draw"], copied, offs, counts, errors)
        for a, s, o, torn, args in repairs:
            if not errors:
                ctx.sync(self._redraw, a, mapped[a][s], s, o, torn, args)
        if errors:  # undone by the caller; the event loop's path sends again (the kept masses still hold)
            raise errors[0]
        return None


def exchange(ctx: Context, batch: list, arrived: Callable[[str, str, str, Any], None], parallel: bool = False) -> None:
    """Run ``batch``'s requests from the caller's thread: those to other workers sent first over their lanes
    (they run them while this thread runs its own worker's), then read.

    Parameters
    ----------
    ctx : Context
        The handle's context (its lanes, this process's worker).
    batch : list of tuple
        ``(worker, operation, arguments, kind)``; a worker with no lane
        fails its request (:class:`~gear_flow.distributed.lane.NotSent`).
    arrived : callable
        ``arrived(kind, worker, operation, reply)`` as each reply is here, a
        reply being ``(ok, value)`` or the exception that broke its lane.
    parallel : bool, default False
        Read the other workers' replies in threads at once (large replies).
    """
    far = [b for b in batch if b[0] != ctx.local_addr]
    sent = ctx.lanes.send_all(
        [(ctx.lanes.paths.get(a), op, ctx.stamped(args)) for a, op, args, _ in far], VERSION, reply_timeout()
    )
    try:
        for a, op, args, kind in batch:
            if a == ctx.local_addr:
                try:
                    r = (True, ctx.local_plugin.host.call(op, ctx.stamped(args)))
                except Exception as e:  # noqa: BLE001 - answered as the worker would
                    r = (False, e)
                arrived(kind, a, op, r)
    except BaseException:
        ctx.lanes.abandon(sent)
        raise
    if parallel:

        def one(i):
            a, op, _, kind = far[i]
            arrived(kind, a, op, ctx.lanes.read_one(sent[i]))

        futures = [_copy_pool().submit(one, i) for i in range(len(far))]
        try:
            for f in futures:
                f.result()
        finally:  # nothing is read or copied into the batch once this returns
            wait(futures)
        return
    for (a, op, _, kind), r in zip(far, ctx.lanes.read_all(sent)):
        arrived(kind, a, op, r)


def routes(table: DistributedTable) -> bool:
    """Can ``table``'s handle sample in the caller's thread?

    Parameters
    ----------
    table : DistributedTable
        The handle.

    Returns
    -------
    bool
        Every worker holding a live shard is this process's own, or has a
        lane learnt: a fast lane (on this machine, its rings mapped) or a
        TCP lane (its windows come with the replies).
    """
    ctx = table._ctx
    for a in table._view.workers():  # a consistent reading, however the event loop changes the view
        if a == ctx.local_addr and ctx.local_plugin is not None:
            continue
        if not table._routes.probed(a) or a not in ctx.lanes.paths:
            return False
    return True
