"""Inserts in the caller's thread: no event loop between a writer and the shards it writes.

Two kinds of insert need no event loop (each hop into it and back costs tens
of microseconds on a 2-core host, and the loop writes a large request a
chunk at a time, yielding between chunks):

* an actor's: a task on a worker whose episodes all go to that worker's own
  shards writes them itself;
* a writer's whose episodes go to workers it reaches by their lanes and does
  not map (another host, or shared memory off: their TCP lanes): the
  episodes go out on blocking sockets straight from the caller's arrays, and
  the workers read them straight into reused buffers.  Measured on the 2-core
  host (``pipelines/bench_distributed.py``, 10 episodes of 1.04 MB a call):
  through the event loop 0.75x (2 workers) and 0.91x (1 worker) the speed of
  Dask's own scatter of the same bytes; this way 0.91-1.04x and 1.22-1.32x.

The insert's steps are the event loop's own
(:func:`~gear_flow.distributed.writes.insert_steps`: admission, routing again,
the abort of an insert nothing of which was stored, eviction), answered here by
a :class:`ThreadInserter`: admitted and committed over the coordinator's lane.
Its transaction's steps are the event loop's too
(:func:`~gear_flow.distributed.transactions.transaction_steps`: one worker
``write``; several ``stage`` everywhere, ``apply`` everywhere, commit; an
abort everywhere when a part could not be staged), answered by a
:class:`LaneTransaction`: all requests sent, then the replies read (the
workers receive in parallel); a request whose lane breaks is sent again over
the comm once that lane is dropped (a stage, write, apply or abort sent twice
is applied once, :data:`~gear_flow.distributed.lane.RESENDABLE_OPS`).  Parts
whose placement changed since the insert was routed are stored from the
event loop, as are an abort and an eviction to ``max_size``.
"""

from __future__ import annotations

import concurrent.futures
import logging
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, TypeVar

from numpy.typing import ArrayLike

from ..errors import GearFlowError, InterruptedInFlight
from ..interrupts import HeldInterrupts
from ..table import planner
from ..table.results import InsertResult
from ..table.validate import check_batch, to_host
from .protocol import VERSION
from .transactions import (
    Commit,
    LoopTransaction,
    Send,
    commit_counts,
    revocable,
    transaction_steps,
)
from .transport import reply_timeout
from .wire import array_bytes
from .writes import (
    AdmitInsert,
    Insert,
    Learn,
    LoopInserter,
    Priorities,
    Store,
    Unstored,
    insert_steps,
    prepare,
)

if TYPE_CHECKING:
    from .api import DistributedTable

logger = logging.getLogger(__name__)

T = TypeVar("T")


def _in_thread(table: DistributedTable, ins: Insert) -> bool:
    """Can ``ins`` be inserted from the caller's thread as routed now: written by this thread into its own
    worker's shards, or sent over its workers' lanes (the coordinator's lane found, outside the loop)?"""
    ctx = table._ctx
    if ctx.in_loop() or ctx.found_coord_lane() is None:
        return False
    nbytes: dict[str, int] = defaultdict(int)
    placement = table.placement  # one reading: the event loop replaces it whole, never edits it
    try:
        for i, s in enumerate(ins.dest):
            nbytes[placement[int(s)]] += array_bytes(ins.chunks[i])
    except KeyError:  # a shard placed nowhere
        return False
    return _writes_here(table, list(nbytes)) or _lane_paths(table, nbytes) is not None


def _writes_here(table: DistributedTable, addrs: list[str]) -> bool:
    """Are ``addrs`` only this worker, with its plugin here (a task on a worker: an actor's insert)?"""
    ctx = table._ctx
    return ctx.local_plugin is not None and addrs == [ctx.local_addr]


def _lane_paths(table: DistributedTable, nbytes: dict[str, int]) -> dict[str, tuple[str, int]] | None:
    """``{worker: (lane, bytes of its episodes)}`` when every worker of ``nbytes`` is another process this
    handle reaches by a lane without mapping its rings (a mapped one takes the episodes through a staging
    segment) and each request fits its lane; else None."""
    ctx = table._ctx
    op = "write" if len(nbytes) == 1 else "stage"
    paths = {}
    for a, n in nbytes.items():
        local = a == ctx.local_addr and ctx.local_plugin is not None
        path = ctx.lanes.route(a, op, n)
        if local or path is None or not table._routes.probed(a) or table._routes.mapped(a) is not None:
            return None
        paths[a] = (path, n)
    return paths


class ThreadInserter:
    """Answers :func:`~gear_flow.distributed.writes.insert_steps` from the caller's thread: the coordinator
    over its lane, the episodes written by this thread into its own worker's shards or sent over their
    workers' lanes (see the module docstring); an insert whose parts cannot go either way (the placement
    changed since it was routed) is stored from the event loop
    (:meth:`~gear_flow.distributed.writes.LoopInserter.store`).

    Parameters
    ----------
    table : DistributedTable
        The handle.
    interrupts : HeldInterrupts
        The call's interrupts (:mod:`gear_flow.interrupts`), held in its
        transaction's steps as in the insert's; one held is delivered before
        a request is sent, where the steps act on it.
    """

    def __init__(self, table: DistributedTable, interrupts: HeldInterrupts) -> None:
        self.t = table
        self.interrupts = interrupts

    def __call__(self, req: object) -> object:
        """Answer one request of the steps.

        Parameters
        ----------
        req : AdmitInsert, Learn, LearnMoved, Abort, Store or Evict
            The request.

        Returns
        -------
        object
            Its answer.
        """
        t, ctx = self.t, self.t._ctx
        if isinstance(req, Store):
            return self.store(req.txn, req.parts)
        if isinstance(req, AdmitInsert):
            self.interrupts.check()  # (nothing asked yet)
            return t._link.coordinator_here.admit_insert(**req.args)
        if isinstance(req, Learn):
            self.interrupts.check()  # (the steps give the admission back)
            return t._link.refresh_here(req.version)
        return ctx.sync_to_end(LoopInserter(t).__call__, req)  # an abort, an eviction, a move learnt: the loop's

    def store(self, txn: str, parts: dict) -> tuple[dict, int]:
        """:class:`~gear_flow.distributed.writes.Store`'s answer from the caller's thread: the transaction's
        steps (:func:`~gear_flow.distributed.transactions.transaction_steps`) answered by a
        :class:`LaneTransaction`, or from the event loop when the placement changed since the insert was routed.

        Parameters
        ----------
        txn : str
            The admitted insert.
        parts : dict
            ``{worker: [part, ...]}``.

        Returns
        -------
        tuple
            ``(applied, size)``.
        """
        t, ctx = self.t, self.t._ctx
        paths = {}
        try:
            self.interrupts.check()
            if not _writes_here(t, list(parts)):
                paths = _lane_paths(t, {a: array_bytes([p["chunks"] for p in ps]) for a, ps in parts.items()})
        except BaseException as e:  # nothing sent yet: the steps give the admission back
            raise Unstored(e, sorted(parts)) from None
        if paths is None:  # the placement changed since the insert was routed: the event loop's path
            return _waited(ctx.go_on(LoopInserter(t).store, txn, parts))
        if paths:
            t.stats["insert_remote_bytes"] += sum(n for _, n in paths.values())
        tx = LaneTransaction(t, paths, self.interrupts)
        try:
            applied, size = planner.run(transaction_steps(t, txn, parts), tx, tx.hand_over, self.interrupts)
        except KeyboardInterrupt as e:
            if tx.finishing is None:  # (its steps took it back: nothing stored)
                raise
            raise InterruptedInFlight(tx.finishing) from e
        if tx.in_thread:
            t.stats["insert_in_thread"] += 1
        return applied, size


class LaneTransaction:
    """Answers :func:`~gear_flow.distributed.transactions.transaction_steps` from the caller's thread: this
    worker's own part in this thread, the others' over their lanes on blocking sockets (all sent, then all
    read: the workers receive in parallel); a request whose lane broke (or whose reply did not come in
    time) is sent again over the comm once that lane is dropped (a stage, write, apply or abort sent twice
    is applied once, :data:`~gear_flow.distributed.lane.RESENDABLE_OPS`).

    Parameters
    ----------
    table : DistributedTable
        The handle.
    paths : dict
        ``{worker: (lane, bytes)}`` of the workers reached by a lane (:func:`_lane_paths`).
    interrupts : HeldInterrupts
        The call's interrupts (:mod:`gear_flow.interrupts`): one held while the steps ran is delivered as a
        request is about to go (:meth:`hand_over` then says what becomes of it).
    """

    def __init__(self, table: DistributedTable, paths: dict[str, tuple[str, int]], interrupts: HeldInterrupts) -> None:
        self.t = table
        self.paths = paths
        self.interrupts = interrupts
        #: every request went, and was answered, from this thread
        self.in_thread = True
        #: the steps' end once handed to the event loop (:meth:`hand_over`), ``(applied, size)``
        self.finishing: concurrent.futures.Future | None = None

    def __call__(self, req: object) -> object:
        """Answer one request of the steps.

        Parameters
        ----------
        req : Send, Commit, AbortAt, LostWorkers or EvictTo
            The request.

        Returns
        -------
        object
            Its answer.
        """
        t, ctx = self.t, self.t._ctx
        if isinstance(req, (Send, Commit)):
            self.interrupts.check()
        if isinstance(req, Send):
            return self.send(req.calls)
        if isinstance(req, Commit):
            return t._link.coordinator_here.commit_insert(
                req.txn, unsettled=sorted(req.unsettled) or None, unreached=sorted(req.unreached) or None,
                **commit_counts(req.res),
            )  # fmt: skip
        self.in_thread = False
        return ctx.sync_to_end(LoopTransaction(t).__call__, req)

    def hand_over(self, steps: planner.Plan, req: object, error: BaseException) -> bool:
        """Hand the transaction's ``steps`` to the event loop when an interrupt came while this thread carried
        a step the workers cannot take back (:func:`~gear_flow.distributed.transactions.revocable`).

        The interrupt is a KeyboardInterrupt (Ctrl-C, a notebook's stop), or a SystemExit a signal's handler
        raised: not an error of the step.  Stopped there, some workers would hold their part written (or
        applied) and the coordinator not know it, for good: the table's size, the limiter's counts and the
        transactions in flight drifting.  The event loop asks ``req`` again (a write, an apply or an abort
        sent twice is applied once, a commit repeated is ignored) and finishes the steps in the background,
        through any cancel (:class:`~gear_flow.distributed.transactions.LoopTransaction`), as it finishes an
        ``insert_async`` cancelled there; the caller gets the interrupt at once, and :attr:`finishing` holds
        the steps' end.  Requests the event loop answers already (an abort everywhere, a lost worker, an
        eviction) go to their end there.

        Parameters
        ----------
        steps : generator
            The transaction's steps, left waiting for ``req``'s answer.
        req : object
            The request the interrupt came in.
        error : BaseException
            What ``req``'s answer raised.

        Returns
        -------
        bool
            True when the event loop has taken ``steps`` (``error`` is then raised to the caller).
        """
        if isinstance(error, Exception) or not isinstance(req, (Send, Commit)) or revocable(req):
            return False
        t = self.t
        try:
            self.finishing = t._ctx.go_on(_finish, t, steps, req)
        except RuntimeError:  # the loop is closed (and the client with it): nothing can finish it
            return False
        self.in_thread = False
        return True

    def send(self, calls: dict) -> dict:
        """:class:`~gear_flow.distributed.transactions.Send`'s answer from this thread.

        Parameters
        ----------
        calls : dict
            ``{worker: (operation, arguments)}``.

        Returns
        -------
        dict
            ``{worker: reply or error}``.
        """
        t, ctx = self.t, self.t._ctx
        here = ctx.local_addr if ctx.local_plugin is not None else None
        far = [a for a in calls if a != here]
        got = _over_lanes(t, [(self.paths[a][0], *calls[a]) for a in far]) if far else []
        out, broken = {}, {}
        for a, r in zip(far, got):
            if isinstance(r, BaseException):  # its lane broke, or no reply came in time: sent again below
                broken[a] = calls[a]
            else:
                out[a] = r[1] if r[0] else (r[1] if isinstance(r[1], BaseException) else GearFlowError(str(r[1])))
        if here in calls:  # this worker's own part, written by this thread
            op, args = calls[here]
            t.stats["insert_local_bytes"] += array_bytes([p["chunks"] for p in args.get("parts", ())])
            try:
                out[here] = ctx.local_plugin.host.call(op, ctx.stamped(args))
            except Exception as e:  # noqa: BLE001 - the steps say what it means
                out[here] = e
        if broken:  # over the comm, from the event loop (a worker removed meanwhile is found lost there)
            self.in_thread = False
            out.update(ctx.sync_to_end(t._link.again, list(broken), LoopTransaction(t).send, broken))
        return out


async def _finish(table: DistributedTable, steps: planner.Plan, req: object) -> tuple[dict, int]:
    """The rest of a transaction a caller's thread handed over (:meth:`LaneTransaction.hand_over`): ``req``
    asked again, then the steps answered on the event loop; its ``(applied, size)``, for whoever holds the
    interrupt's future (:class:`~gear_flow.errors.InterruptedInFlight`)."""
    try:
        return await planner.run_async(planner.resumed(steps, req), LoopTransaction(table))
    except Exception as e:  # its caller was interrupted, and may never ask: the error says what was stored
        logger.info("table %r: an interrupted insert finished in the background: %s", table.name, e)
        raise


def _waited(step: concurrent.futures.Future[T]) -> T:
    """``step``'s answer (begun on the event loop, nothing stops it midway); an interrupt while it is awaited
    comes as an :class:`~gear_flow.errors.InterruptedInFlight` holding it."""
    try:
        return step.result()
    except KeyboardInterrupt as e:
        raise InterruptedInFlight(step) from e


def _over_lanes(table: DistributedTable, requests: list[tuple[str, str, dict]]) -> list:
    """Send ``(lane, op, args)`` requests from this thread, all before reading a reply; each reply as
    ``(ok, value)`` or the error that kept it from being sent or broke its connection."""
    lanes = table._ctx.lanes
    for _, op, _ in requests:
        table.requests[op] += 1
    requests = [(lane, op, table._ctx.stamped(args)) for lane, op, args in requests]
    return list(lanes.read_all(lanes.send_all(requests, VERSION, reply_timeout())))


def insert(
    table: DistributedTable,
    episodes: Mapping | Sequence[Mapping],
    priorities: Priorities = None,
    *,
    timeout: float | None = None,
    shard: int | None = None,
) -> InsertResult:
    """Insert whole episodes, all or nothing across workers.

    Input is validated before anything is sent.  Episodes are routed to
    shards (never split), preferring the calling worker's own shards when
    called from a task on a worker (writer affinity), and travel as raw
    frames straight to the shard workers.  Blocks until the rate limiter
    admits every item.  When the table then exceeds ``max_size``, the
    remover evicts the excess (not a queue's or stack's: its items over
    ``max_size`` are those of a sample that gave its admission back, still
    waiting); an eviction that fails for another reason
    than a lost worker (one that does not answer in time) is logged and
    the insert returns, stored, the table over ``max_size`` until the next
    insert's eviction.

    Parameters
    ----------
    table : DistributedTable
        The handle.
    episodes : mapping or sequence of mappings
        Each maps every column to an array ``[T, *shape]`` (T >= 1).
    priorities : None, float, array or list of arrays
        Per item: None (the shard's running max priority, as in PER), one
        value for all, a flat array over all items of all episodes, or one
        array per episode.
    timeout : float, optional
        Seconds to wait for the rate limiter; default the handle's.
    shard : int, optional
        Put every episode on this shard.

    Returns
    -------
    InsertResult
        Episode ids, the key of each episode's first item, each episode's
        shard and the number of items created.

    Raises
    ------
    InvalidDataError
        Episodes that do not match the spec, or not one priority per
        item.
    InvalidPriorityError
        A priority that is NaN, infinite or negative, or one the sampler
        or remover cannot represent.
    CapacityError
        An episode longer than a shard's capacity, or more steps on one
        shard in one call than its capacity (insert fewer per call).
    SpecError
        ``shard`` out of range, or more items than the limiter admits at once.
    RateLimitTimeout
        Not admitted within ``timeout``.
    ShardLostError
        A shard's worker is lost (not ``degraded``), or a worker was lost
        while the insert was applied (its episodes there are gone), or
        (not ``degraded``) while it evicted to ``max_size`` after its
        commit: the insert is stored, the message says so and
        ``.stored`` is True.  A worker lost before anything was applied
        leaves nothing stored (``.stored`` False); a degraded table then
        routes the insert again over the shards left, and one whose
        eviction loses a worker marks the shard lost and returns.
    GearFlowError
        Staging failed on a worker; nothing of the insert was stored.
    InterruptedInFlight
        A KeyboardInterrupt that came once the workers might hold the
        insert's items (or while the event loop carried it): the insert
        goes on to its end in the background, and ``.outcome`` ends with
        its result (stored) or error.  A plain KeyboardInterrupt: nothing
        was stored.
    HeldInterrupt
        A KeyboardInterrupt held to the end of the insert's own steps: it
        is stored, and ``.result`` is this call's answer.
    """
    ins = prepare(table, episodes, priorities, shard, timeout)
    if _in_thread(table, ins):  # the caller's thread writes (an actor into its own worker's shards), or sends them
        with HeldInterrupts() as interrupts:  # over the workers' lanes; an interrupt comes where the steps act on it
            steps = insert_steps(table, ins, timeout)
            return interrupts.returned(planner.run(steps, ThreadInserter(table, interrupts), None, interrupts))
    return table._ctx.sync_in_flight(planner.run_async, insert_steps(table, ins, timeout), LoopInserter(table))


def insert_batch(
    table: DistributedTable,
    columns: Mapping[str, ArrayLike],
    priorities: ArrayLike | float | None = None,
    *,
    timeout: float | None = None,
    shard: int | None = None,
) -> InsertResult:
    """Insert ``B`` trajectories of ``T`` steps given as ``[B, T, *shape]`` arrays, all or nothing.

    Validated whole first; each row then travels as one episode, from
    host memory (device arrays are copied to the host), as :meth:`insert`.

    Parameters
    ----------
    table : DistributedTable
        The handle.
    columns : mapping of str to array
        Every column, ``[B, T, *shape]`` (NumPy or CuPy), ``B, T >= 1``.
    priorities : None, float or array
        None, one value, or one per item (``B * T`` for step items, ``B``
        for episode items), in row order.
    timeout : float, optional
        Seconds to wait for the rate limiter; default the handle's.
    shard : int, optional
        Put every trajectory on this shard.

    Returns
    -------
    InsertResult
        As :meth:`insert`, one episode per row.

    Raises
    ------
    InvalidDataError, InvalidPriorityError, CapacityError, SpecError, RateLimitTimeout, ShardLostError
        As :meth:`insert`.
    """
    arrays, B, _ = check_batch(table.spec, columns)
    host = {c: to_host(a) for c, a in arrays.items()}  # one copy per column: they cross the comm from host memory
    rows = [{c: a[b] for c, a in host.items()} for b in range(B)]
    return table.insert(rows, priorities, timeout=timeout, shard=shard)
