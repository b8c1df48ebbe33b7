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

The sample's steps (admission, retries, give-backs, expiries) are the
event loop's own, :func:`~gear_flow.distributed.sampling.sample_steps`,
answered here by a :class:`ThreadSampler`; the plan's requests, their
booking and the shared-memory copy are
:class:`~gear_flow.distributed.sampling.RemoteSample`'s own, so the two
paths answer a plan the same way.  Whatever this path cannot do by itself
(masses not kept, a plan asking for anything but a draw, a lane that cannot
be reached or closes, a worker's error) hands the sample to the event loop:
before anything was sent (:class:`NotHere`), or after undoing what was
drawn.  A reply lost after its request was sent (timed out, unreadable)
fails the sample instead: the worker may have drawn, and drawing again
would count twice.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from ..errors import ProtocolError, ShardMovedError
from ..sample import SampleBatch, SampleBuffers
from ..table import planner, two_level
from . import reader_draw
from .pending import book_reply, pending_calls, ride_along, settle
from .sampling import (
    OFF_LOOP_BYTES,
    Admit,
    Finish,
    Gather,
    GiveBack,
    Refresh,
    RemoteSample,
    Removed,
    SampleArgs,
    SampleGrant,
    leases_ok,
    sample_args,
    sample_steps,
)
from .transport import Retry, exchange, lost_reply

if TYPE_CHECKING:
    from .api import DistributedTable

logger = logging.getLogger(__name__)


class NotHere(Exception):
    """This sample cannot be served in the caller's thread; nothing of it stands (never sent, or undone): the
    event loop serves it."""


class ThreadSample(RemoteSample):
    """A synchronous executor for :func:`gear_flow.table.planner.run` over local shards and lanes.

    Parameters are :class:`RemoteSample`'s.  Only for handles whose workers
    all pass :meth:`~gear_flow.distributed.transport.TableLink.serves_in_thread` (checked by the
    caller before planning).
    """

    #: ``(worker, operation, error)`` of a request sent whose reply was lost (timed out, unreadable): the
    #: worker may have run it, so the sample is not sent again; None
    lost_reply = None

    def __call__(self, req):
        t = self.t
        if isinstance(req, planner.Summaries):
            here = reader_draw.fresh_masses(self, req.kinds)
            if here is not None:  # read from the shards' published states
                return here
            live = t._view.live_shards()
            cached = t._masses.fresh(req.kinds, self.L, self.boundary, live)
            if cached is not None:
                return cached
            if not t._masses.kept(req.kinds, self.L, self.boundary, live):
                raise NotHere  # (none kept: the placement changed, or this handle wrote) the event loop's path
            return self._ask_summaries(req.kinds)  # kept, but older than the maximum age: asked again from here
        if isinstance(req, planner.Draw):
            offs = planner.offsets(req.counts, req.base)
            if not req.by_count:  # the shards whose state is published: drawn here, no request
                here, left = reader_draw.plan(self, offs, req.counts)
                if here:
                    left.update(reader_draw.draw_parts(self, here, offs, req.counts, req.scale))
                    offs = {s: offs[s] for s in offs if s in left}
                    if not offs:
                        return None
            return self._draw_parts_here(offs, req.counts, req.scale, req.by_count)
        raise NotHere

    def _ask_summaries(self, kinds: Sequence[str]) -> dict:
        """Every worker's summaries of its shards, asked over the lanes from this thread (a read: nothing to
        undo), kept for the next plans; :class:`NotHere` when a worker does not answer (the event loop's path
        asks again)."""
        t = self.t
        batch = [(a, "summaries", self.summaries_args(kinds), "summaries") for a in t._view.workers()]
        got, failed = [], []

        def arrived(kind, a, op, r):
            if isinstance(r, BaseException) or not r[0]:
                failed.append(a)
            else:
                got.append(r[1])

        t.requests["summaries"] += len(batch)
        exchange(t._ctx, batch, arrived)
        if failed:
            raise NotHere
        return self.keep_summaries(kinds, got)

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

    def _draw_parts_here(self, offs, counts, scale, by_count):
        t = self.t
        ctx = t._ctx
        mapped = t._routes.every_mapped()
        calls, pending = {}, {}
        results = {"draw": {}, "upd": {}}
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
            pending = pending_calls(t, exclude=set(calls) | self.hosted)
            batch = [
                (a, op, args, kind) for kind, d in (("draw", calls), ("upd", pending)) for a, (op, args) in d.items()
            ]
            for _, op, _, _ in batch:
                t.requests[op] += 1
            self._exchange(batch, arrived)
        except BaseException:  # nothing booked: the updates that were to ride along are stored again
            for _, (_, args) in calls.items():
                if "updates" in args:
                    settle(t, args["updates"], False)
            for _, (_, args) in pending.items():
                settle(t, args, False)
            raise
        self.book_extras(pending, results["upd"])
        repairs = self.book(calls, results["draw"], copied, offs, counts, errors)
        for a, s, o, torn, args in repairs:
            if not errors:
                ctx.sync(self._redraw, a, mapped[a][s], s, o, torn, args)
        if errors:  # undone by the caller; the event loop's path sends again (the kept masses still hold)
            raise errors[0]
        if self.fallback:  # parts a worker could not draw for its host: their owners draw them
            left, self.no_host_draw = self.left_by_hosts(), True
            try:
                self._draw_parts_here({s: offs[s] for s in left}, counts, scale, by_count)
            finally:
                self.no_host_draw = False
        return None


def sample_here(
    table: DistributedTable,
    B: int,
    L: int,
    columns: str | Sequence[str] | None,
    boundary: str | None,
    timeout: float | None,
    out: SampleBuffers | None,
    rng: np.random.Generator | None,
) -> SampleBatch | None:
    """A weighted sample whose shards are all this worker's own or behind lanes, in the caller's thread.

    The sample's steps are the event loop's
    (:func:`~gear_flow.distributed.sampling.sample_steps`), answered by a
    :class:`ThreadSampler`: admitted under the lease or by the coordinator
    (over its lane), drawn and gathered straight into the learner's buffers
    without the event loop.

    Parameters
    ----------
    table : DistributedTable
        The handle.
    B, L : int
        Batch size and window length.
    columns : str or sequence of str or None
        Columns to gather.
    boundary : str or None
        Window boundary mode (None: the table's).
    timeout : float or None
        Seconds to wait for admission.
    out : SampleBuffers or None
        Buffers to gather into.
    rng : numpy.random.Generator or None
        Replaces the handle's generator.

    Returns
    -------
    SampleBatch or None
        The batch; None when the event loop must serve it (its admission
        and draws given back then).
    """
    t, ctx, cfg = table, table._ctx, table._cfg
    if not leases_ok(cfg) or not t._link.serves_in_thread():
        return None
    workers = list(t._view.workers())
    if not workers:
        return None
    call = sample_args(t, B, L, columns, boundary, timeout, out, rng)
    if workers != [ctx.local_addr] and (
        cfg.plan != "weighted" or not t._masses.kept(("sampler",), L, call.boundary, t._view.live_shards())
    ):
        return None  # its plan needs the workers first: the event loop's path asks them
    if out is None:
        out = SampleBuffers(t.spec, call.columns, B, L, tier=cfg.tier)
    try:
        batch = planner.run(sample_steps(t, call, out), ThreadSampler(t, call))
    except NotHere:  # nothing of it stands (never sent, or undone): the event loop serves it
        return None
    t.stats["in_thread"] += 1
    return batch


class ThreadSampler:
    """Answers :func:`~gear_flow.distributed.sampling.sample_steps` in the caller's thread: the coordinator
    over its lane, the draws in-process (every live shard this worker's own: one call) or over the lanes
    (:class:`ThreadSample`).

    What it cannot serve raises :class:`NotHere` once what it drew is undone
    (the steps give the grant back and the event loop serves the sample):
    the placement changed since the sample was checked, masses not kept, a
    lane that closes, a worker's error, shards moved.  A lane reply lost
    after its request was sent fails the sample instead: the worker may have
    drawn, and drawing again would count twice.

    Parameters
    ----------
    table : DistributedTable
        The handle.
    call : SampleArgs
        The call.
    """

    def __init__(self, table: DistributedTable, call: SampleArgs) -> None:
        self.t = table
        self.call = call

    def __call__(self, req: object) -> object:
        """Answer one request of the steps.

        Parameters
        ----------
        req : Admit, Refresh, GiveBack, Gather, Finish or Removed
            The request.

        Returns
        -------
        object
            Its answer.
        """
        t, link = self.t, self.t._link
        if isinstance(req, Gather):
            return self._draw(req.grant, req.out)
        if isinstance(req, Admit):
            return link.coordinator_here.admit_sample(**req.args)
        if isinstance(req, Refresh):
            return link.refresh_here(req.version)
        if isinstance(req, GiveBack):
            return req.grant.give_back_here()
        if isinstance(req, Finish):
            return t._ctx.sync_to_end(req.grant.finish, req.expired)
        if isinstance(req, Removed):
            return link.coordinator_here.removed(sum(req.expired.values()), req.expired)
        raise TypeError(f"not a sample's request: {req!r}")

    def _draw(self, grant: SampleGrant, out: SampleBuffers) -> tuple:
        t, ctx, c = self.t, self.t._ctx, self.call
        workers = list(t._view.workers())
        # an admission may have taught this handle another placement since the sample was checked
        if not grant.leased and (not t._link.serves_in_thread() or not workers):
            raise NotHere
        if workers == [ctx.local_addr]:  # every live shard here: one call does it all
            return out, _sample_all_here(t, c.batch_size, c.length, c.boundary, c.columns, out, c.rng)
        ex = ThreadSample(t, out, c.length, c.boundary, c.columns, c.rng, None, True, None)
        try:
            planner.run(planner.sample(t._cfg.plan, c.batch_size, c.rng), ex)
            t._view.check_not_lost()  # (a loss learnt while the plan ran: as on the event loop's path)
        except NotHere:  # nothing was sent
            raise
        except BaseException as e:  # what was drawn is given back, as on the event loop's path
            try:
                ctx.sync_to_end(ex.undo)
            except Exception as u:  # noqa: BLE001 - e.g. a worker gone: its counts leave with it
                logger.info("table %r: a sample's draws not given back (%s)", t.name, u)
            if isinstance(e, ShardMovedError):  # planned before shards moved: the event loop's path, as placed now
                ctx.sync(t._link.moved, e.epoch)
                raise NotHere from e
            if not isinstance(e, Exception):
                raise
            if ex.lost_reply is not None:  # the worker may have drawn: never drawn again silently
                _raise_lost_reply(t, *ex.lost_reply)
            raise NotHere from e  # the event loop's path retries it, or raises its error
        ex.stands()
        two_level.importance_weights(out.probabilities, t._cfg.beta, out.weights)
        return out, ex.expired


def _raise_lost_reply(table: DistributedTable, addr: str, op: str, err: BaseException) -> None:
    """A lane request was sent and its reply lost: the worker may have run it, so the sample fails
    instead of being drawn again; a worker the scheduler removed makes its shards lost (the next call
    says so, or serves from the rest in a degraded table)."""
    link = table._link
    if isinstance(err, TimeoutError):
        unanswered = link.unanswered_here(addr, op)
        if unanswered is not None:
            raise unanswered from None
        try:
            table._ctx.sync(link.handle_lost, [addr])  # raises ShardLostError ...
        except Retry:  # ... or, in a degraded table, the rest serve it (the event loop's path)
            return
    raise lost_reply(addr, op, err) from err


def _sample_all_here(table: DistributedTable, B, L, boundary, columns, out, rng) -> dict:
    ctx = table._ctx
    upd = ride_along(table, ctx.local_addr)
    try:
        args = dict(name=table.name, n=B, length=L, boundary=boundary, columns=columns,
                    seed=int(rng.integers(2**63)), out=out, updates=upd)  # fmt: skip
        res = ctx.local_plugin.host.call("sample_all", ctx.stamped(args))
    except BaseException:
        settle(table, upd, False)
        raise
    settle(table, upd, True)
    if "updated" in res:
        book_reply(table, upd["masses"] or [], res["updated"])
    table.stats["local_bytes"] += sum(a.nbytes for a in out.bytes.values())
    return res["expired"]
