"""How a table handle reaches the cluster: the scheduler's coordinator and the shard workers.

A handle's :class:`TableLink` makes every request of the handle and is the
one place that says what a failure means (a lost worker, a moved shard, a
live worker that does not answer); its :class:`WorkerRoutes` say how each
worker is reached beside the comm (rings mapped here, a lane).

Requests to a shard worker go to its ``gear_flow`` comm handler (in-process
when the handle runs on that worker) with NumPy arrays as serialized frames.
A worker counts as lost when the connection fails or the scheduler no longer
knows it; a slow reply is waited for again (``distributed.rpc-retries``
times ``distributed.rpc-timeout``) as long as the scheduler still has the
worker, then reported as a timeout, never silently as a loss.  A table's
shards are built on its workers all or nothing (:func:`build_everywhere`:
what ``create`` and ``restore`` send).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, Any, TypeVar

from distributed.core import Status

from .. import config
from ..errors import (
    CoordinatorLostError,
    GearFlowError,
    InterruptedInFlight,
    ShardLostError,
    ShardMovedError,
    SpecError,
)
from ..interrupts import deliver_held, holds_interrupts, lets_in, waited
from . import protocol, wire
from .coordinator import COORD_LANE_OPS, admission_wait
from .lane import LANE_ERRORS, RESENDABLE_OPS, Lanes, NotSent
from .plugin import PLUGIN_NAME
from .wire import unwrap

if TYPE_CHECKING:
    from distributed import Client, Worker

    from .view import TableView

logger = logging.getLogger(__name__)
COMM_ERRORS = (OSError, asyncio.TimeoutError)
#: seconds into a worker request at which the coordinator is asked once whether the worker is still there (a
#: killed one's connection is otherwise retried until Dask's connect timeout); later, every rpc-timeout
EARLY_PROBE_S = 2.0


def pool_closed(e: BaseException, rpc: Any) -> bool:
    """Is ``e`` Dask's ``RuntimeError`` for a connection pool already closed (the client gave up on the
    scheduler and closed its connections)?

    Parameters
    ----------
    e : BaseException
        What a request over the comm raised.
    rpc : object
        What the request was made with (a ``PooledRPCCall``: its ``pool`` tells).

    Returns
    -------
    bool
        True when ``e`` is a ``RuntimeError`` and the pool is no longer running.
    """
    pool = getattr(rpc, "pool", None)
    return isinstance(e, RuntimeError) and pool is not None and getattr(pool, "status", None) != Status.running


T = TypeVar("T")


class NotAnswered(GearFlowError):
    """A live worker did not answer a request in time (:func:`not_answered`): whether it acted is unknown."""


class WorkerLost(Exception):
    """Internal: a shard worker cannot be reached (or the scheduler removed it).

    Parameters
    ----------
    addr : str
        Address of the worker.
    cause : BaseException or str
        The comm error, or why the worker counts as lost.
    """

    def __init__(self, addr: str, cause: BaseException | str) -> None:
        super().__init__(f"{addr}: {cause}")
        self.addr = addr
        self.cause = cause


class Retry(Exception):
    """Internal: the shard set changed (degraded mode) or a selection went stale; redo the operation."""


class Stale(Retry):
    """Internal: a selection went stale (the table changed since its plan: an item chosen was removed or
    written over); redone as placed, as often as that happens where the operation allows."""


class Moved(Retry):
    """Internal: workers refused requests planned before shards moved (the handle knows the new placement
    now); what was asked of them is redone as placed now, nothing of it counts as lost.

    Parameters
    ----------
    addrs : iterable of str
        The workers that refused.
    """

    def __init__(self, addrs: Iterable[str]) -> None:
        self.addrs = set(addrs)
        super().__init__(f"shards moved off {sorted(self.addrs)}")

    @staticmethod
    def among(errors: Iterable[BaseException]) -> set[str]:
        """The workers the :class:`Moved` errors in ``errors`` name (refused as planned before a move).

        Parameters
        ----------
        errors : iterable of BaseException
            A partial call's errors.

        Returns
        -------
        set of str
            Their addresses.
        """
        return set().union(*(e.addrs for e in errors if isinstance(e, Moved)))


class _Caller:
    """A blocking caller's hold on its call's task on the loop (:meth:`Context.sync`), so that an interrupt
    cancels the call wherever it lands: before the loop started it (it never starts), or once started, even
    before the caller holds the call's future (an interrupt landing as the call is handed to the loop left it
    running to its end for a caller gone: a create's name registered and its table built for nobody).

    It also holds the call's end (``end``) from before the call is handed to the loop, so that an interrupt
    landing while it is handed over still says how the call ended (:meth:`Context.sync_in_flight`): the loop
    could start it, and take it past what it can take back, before the caller got the future back."""

    __slots__ = ("coro", "created", "end", "gone", "task")

    def __init__(self) -> None:
        self.gone = False
        self.task: asyncio.Task | None = None
        self.coro: Coroutine | None = None  # the call, until the loop made its task
        self.created = False  # (the loop's thread) its task was made
        self.end: concurrent.futures.Future | None = None

    def leave(self, loop: asyncio.AbstractEventLoop) -> None:
        """The caller stopped waiting (from its own thread): the call is cancelled on ``loop``."""
        self.gone = True  # (read by the call's first step, which runs on the loop's thread)
        try:
            loop.call_soon_threadsafe(self._cancel)
        except RuntimeError:  # the loop is closed: nothing runs there any more
            pass

    def _cancel(self) -> None:
        if self.task is not None:
            self.task.cancel()
        elif not self.created and self.coro is not None:
            # never handed to the loop (the interrupt came first; else its task would be made by now, the
            # loop's callbacks running in order): it never runs, and its end says so
            self.coro.close()
            self.coro = None
            if self.end is not None:
                self.end.cancel()


@holds_interrupts
def _leave(caller: _Caller, loop: asyncio.AbstractEventLoop) -> None:
    """``caller.leave(loop)`` as a section: a second interrupt landing in it (a double Ctrl-C) waits for the
    cancel to be scheduled, where it left the call running for a caller whose plain KeyboardInterrupt, not the
    :class:`~gear_flow.errors.InterruptedInFlight` holding the call's end, said "nothing stored"."""
    caller.leave(loop)


def _create(coro: Coroutine[Any, Any, T], end: concurrent.futures.Future[T], caller: _Caller | None) -> None:
    """(On the loop) ``coro``'s task, whose end ``end`` takes (what ``asyncio.run_coroutine_threadsafe`` does,
    with a future its caller held before handing the call over)."""
    if caller is not None:
        caller.created, caller.coro = True, None
    if end.cancelled():  # (nothing cancels it before its task is made: never, but then it must not run)
        coro.close()
        return
    task = asyncio.ensure_future(coro)
    task.add_done_callback(functools.partial(_ended_into, end))


def _ended_into(end: concurrent.futures.Future, task: asyncio.Future) -> None:
    """A call's task ended: its end set alike (cancelled, its error, or its result)."""
    if end.cancelled():
        return
    if task.cancelled():
        end.cancel()
    elif task.exception() is not None:
        end.set_exception(task.exception())
    else:
        end.set_result(task.result())


async def _awaited(
    ctx: Context, fn: Callable[..., Awaitable[T]], args: tuple, kwargs: dict, caller: _Caller | None
) -> T:
    """``fn(*args, **kwargs)`` awaited (:meth:`Context.sync`'s task: ``fn`` may return any awaitable), unless
    its ``caller`` is gone by the time the loop starts it (else the task is the caller's to cancel); the task
    kept until it ends (:meth:`Context.keep_running`)."""
    if caller is not None:
        if caller.gone:
            raise asyncio.CancelledError
        caller.task = asyncio.current_task()
    ctx.keep_running()
    return await fn(*args, **kwargs)


def _ended(running: set, task: asyncio.Task) -> None:
    """A kept task's end: let go of it, and take its error, which nobody may be waiting for any more (a caller
    interrupted: its future cancelled, the error would be reported as never retrieved)."""
    running.discard(task)
    if not task.cancelled() and task.exception() is not None:
        logger.debug("a step on the event loop ended with %r", task.exception())


def settled(value: T) -> concurrent.futures.Future[T]:
    """A future already ended with ``value`` (a step that went to its end before the interrupt came).

    Parameters
    ----------
    value : object
        Its result.

    Returns
    -------
    concurrent.futures.Future
        Done.
    """
    fut: concurrent.futures.Future[T] = concurrent.futures.Future()
    fut.set_result(value)
    return fut


def then(step: concurrent.futures.Future, fn: Callable[[Any], T]) -> concurrent.futures.Future[T]:
    """The future of ``fn(step's result)`` once ``step`` ends (its error or cancel passed on as it is): a
    call's end made of its last step's (an insert's result of its store's ``(applied, size)``).

    Parameters
    ----------
    step : concurrent.futures.Future
        The step.
    fn : callable
        Its result to the call's.

    Returns
    -------
    concurrent.futures.Future
        Ends when ``step`` does.
    """
    out: concurrent.futures.Future[T] = concurrent.futures.Future()

    def ended(f: concurrent.futures.Future) -> None:
        try:
            out.set_result(fn(f.result()))
        except BaseException as e:  # noqa: BLE001 - the step's error (or cancel) is the call's
            out.set_exception(e)

    step.add_done_callback(ended)
    return out


class Context:
    """How this handle reaches the cluster: from a client, or from inside a worker.

    Give exactly one of ``client`` and ``worker``.

    Parameters
    ----------
    client : distributed.Client, optional
        Reach the scheduler and workers through this client.
    worker : distributed.Worker, optional
        The worker running the current task: requests to its own shards run
        in-process through its :class:`GearFlowWorker` plugin.

    Attributes
    ----------
    loop : tornado.ioloop.IOLoop
        The event loop requests run on.
    scheduler : distributed.core.rpc
        The scheduler's RPC (the coordinator's ``gear_flow_coord`` handler).
    rpc : distributed.core.ConnectionPool
        Connections to workers.
    local_addr : str or None
        Address of the worker running this handle (None from a client).
    local_plugin : GearFlowWorker or None
        That worker's plugin, when it has one.
    owner : str
        Who holds admissions (the client id or the worker address): the
        coordinator releases them when the owner goes away.
    """

    def __init__(self, client: Client | None = None, worker: Worker | None = None) -> None:
        self.client = client
        self.worker = worker
        if worker is not None:
            self.loop = worker.loop
            self.scheduler = worker.scheduler
            self.rpc = worker.rpc
            self.local_addr = worker.address
            self.local_plugin = worker.plugins.get(PLUGIN_NAME)
            self.owner = worker.address
        else:
            self.loop = client.loop
            self.scheduler = client.scheduler
            self.rpc = client.rpc
            self.local_addr = None
            self.local_plugin = None
            self.owner = client.id
        #: fast lanes to workers on this machine (:mod:`gear_flow.distributed.lane`), learnt with their shared rings
        self.lanes = Lanes()
        #: the placement version of the handle's table that its requests to workers are planned at (``epoch``;
        #: None: sent without, as a checkpoint's restore does)
        self.epoch: int | None = None
        self._coord_lane: asyncio.Future | None = None  # the coordinator's lane, once looked for
        self._coord_lane_dropped = False  # it failed: the comm from then on
        self._running: set[asyncio.Task] = set()  # tasks kept until they end (keep_running)

    async def coord_lane(self) -> str | None:
        """The coordinator's lane this context uses (looked for on first use), or None: the comm.

        Returns
        -------
        str or None
            Its Unix socket's path (scheduler on this machine) or
            ``tcp://host:port``; None when the lanes are off, the scheduler
            has none, or none can be connected to.
        """
        if self._coord_lane_dropped:
            return None
        if self._coord_lane is None:
            self._coord_lane = asyncio.ensure_future(self._find_coord_lane())
        try:
            return await asyncio.shield(self._coord_lane)
        except COMM_ERRORS:  # the scheduler is not reachable now: the request finds out over the comm
            self._coord_lane = None
            return None

    async def _find_coord_lane(self) -> str | None:
        from ..storage.shared import machine_id

        if not config.get("distributed.fast-lane"):
            return None
        try:
            info = unwrap(await self.scheduler.gear_flow_coord(action="lane", name=None, v=protocol.VERSION))
        except GearFlowError as e:  # e.g. a scheduler of an older gear_flow: the comm
            logger.info("no lane to the coordinator (%s); using the comm", e)
            return None
        if not isinstance(info, dict):
            return None
        paths = []
        same = info.get("machine") == machine_id() and config.get("distributed.shared-memory")
        if isinstance(info.get("unix"), str) and same:  # with shared memory off, as if on another machine
            paths.append(info["unix"])
        if isinstance(info.get("tcp"), str) and config.get("distributed.tcp-lane"):
            paths.append(info["tcp"])
        for path in paths:
            if await self.lanes.probe(path):
                self.lanes.kept.add(path)
                return path
            logger.info("the coordinator's lane %s is not reachable", path)
        return None

    def stamped(self, args: dict) -> dict:
        """``args`` of a request to a worker, with the placement version it is planned at (:attr:`epoch`).

        Parameters
        ----------
        args : dict
            The request's arguments (not changed).

        Returns
        -------
        dict
            ``args`` with ``epoch``, or ``args`` itself when there is none
            to add.
        """
        if self.epoch is None or "epoch" in args:
            return args
        return {**args, "epoch": self.epoch}

    def in_loop(self) -> bool:
        """Is the caller this context's event loop (where nothing may block)?

        Returns
        -------
        bool
            True in the event loop's own thread.
        """
        try:
            return asyncio.get_running_loop() is self.loop.asyncio_loop
        except RuntimeError:  # no loop running in this thread
            return False

    def found_coord_lane(self) -> str | None:
        """The coordinator's lane if :meth:`coord_lane` has found it, else None; for a caller's thread,
        which does not wait for the event loop to look.

        Returns
        -------
        str or None
            As :meth:`coord_lane`; None too while it is still being looked
            for, or was never looked for.
        """
        f = self._coord_lane
        if self._coord_lane_dropped or f is None or not f.done() or f.cancelled() or f.exception() is not None:
            return None
        return f.result()

    def drop_coord_lane(self, path: str) -> None:
        """Stop using the coordinator's lane at ``path`` (it failed): requests go over the comm.

        Callable from the event loop or a caller's thread.

        Parameters
        ----------
        path : str
            The lane (:meth:`coord_lane`'s answer); its idle connections are closed.
        """
        self._coord_lane_dropped = True
        self.lanes.kept.discard(path)
        self.loop.add_callback(self.lanes.close_path, path)  # its asyncio connections belong to the loop

    def sync(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        """Run coroutine function ``fn`` on this context's event loop and wait for its result; interrupted while
        it waits (Ctrl-C), the call is cancelled there.

        Parameters
        ----------
        fn : callable
            A coroutine function.
        *args, **kwargs
            Passed to ``fn``.

        Returns
        -------
        object
            What ``fn`` returned; its exception is raised here.

        Raises
        ------
        RuntimeError
            Called from the event loop itself (it would wait for ever), or the loop is closed.

        Notes
        -----
        Not ``distributed.utils.sync`` (what ``Client.sync`` calls): it starts the coroutine one turn of the
        loop after its callback, and an interrupt that comes before then fails its cancel with a
        ``NameError`` logged by tornado, the coroutine then running to its end for a caller gone (a Queue's
        sample taking its items for nobody).  Here an interrupt cancels the call whenever it comes, as the call
        is handed to the loop or while the caller waits: one the loop has not started yet never starts (a step
        begun on the workers still goes to its end, :func:`through_cancel`); and a hop takes one turn of the
        loop less.  A step of a call that nothing may stop midway goes by :meth:`sync_to_end`.
        """
        return self._sync(fn, args, kwargs, False)

    def sync_in_flight(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        """As :meth:`sync`, for a call whose caller must learn how it ended when an interrupt stops the wait (an
        insert, whose steps a writer then lets go of or keeps): the interrupt comes as an
        :class:`~gear_flow.errors.InterruptedInFlight` holding the call's future, the call cancelled on the
        loop and ending there as its steps allow.

        Parameters
        ----------
        fn : callable
            A coroutine function.
        *args, **kwargs
            Passed to ``fn``.

        Returns
        -------
        object
            What ``fn`` returned; its exception is raised here.

        Raises
        ------
        InterruptedInFlight
            Interrupted while it waits.
        """
        return self._sync(fn, args, kwargs, True)

    @lets_in  # (inside a section, a writer's insert and its letting go of the rows: the wait stays interruptible)
    def _sync(self, fn: Callable[..., Awaitable[T]], args: tuple, kwargs: dict, in_flight: bool) -> T:
        deliver_held()  # (one that section held meanwhile: the call never starts)
        caller = _Caller()
        try:
            return self._start(_awaited(self, fn, args, kwargs, caller), caller).result()
        except BaseException as e:  # interrupted: the call is cancelled on the loop (done: nothing)
            try:
                _leave(caller, self.loop.asyncio_loop)
            except KeyboardInterrupt:  # a second one, held to the cancel's end: the first says how the call ends
                pass
            if in_flight and caller.end is not None and isinstance(e, KeyboardInterrupt):
                raise InterruptedInFlight(caller.end) from e
            raise

    def keep_running(self) -> None:
        """Keep the calling task (on this context's loop) until it ends.

        asyncio keeps tasks weakly: a step whose caller stopped waiting
        (interrupted, or a hand-over nobody waits for) and whose lane
        connection holds it only weakly was collected midway ("Task was
        destroyed but it is pending"), a sample's finish or give-back among
        them.  Its error at the end is taken here, so none is reported as
        never retrieved.
        """
        task = asyncio.current_task()
        if task is not None and task not in self._running:
            self._running.add(task)
            task.add_done_callback(functools.partial(_ended, self._running))

    def sync_to_end(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        """As :meth:`sync`, for a step a call has begun and nothing may stop midway (an abort, an eviction, a
        sample's finish, a request sent again): interrupted while it waits, the caller gets the interrupt at
        once and the step goes on to its end on the loop, started there if it was not yet.

        Parameters
        ----------
        fn : callable
            The step: a coroutine function, called with ``*args`` and ``**kwargs``.
        *args, **kwargs
            Its arguments.

        Returns
        -------
        object
            The step's answer (its error raised here; a RuntimeError as :meth:`sync` raises one).
        """
        return waited(self.go_on(fn, *args, **kwargs))

    def go_on(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> concurrent.futures.Future[T]:
        """Start a step that nothing may stop midway on the loop (:meth:`sync_to_end` without the wait): a caller
        interrupted while it waits for the future still holds it, and can say how the step ended.

        Parameters
        ----------
        fn : callable
            The step: a coroutine function, called with ``*args`` and ``**kwargs``.
        *args, **kwargs
            Its arguments.

        Returns
        -------
        concurrent.futures.Future
            The step's end.

        Raises
        ------
        RuntimeError
            Called from the event loop itself, or the loop is closed.
        """
        return self._start(_awaited(self, fn, args, kwargs, None))

    def _start(self, coro: Coroutine[Any, Any, T], caller: _Caller | None = None) -> concurrent.futures.Future[T]:
        """``coro`` handed to the loop; its end, held by ``caller`` (when given) before it is handed over."""
        if self.in_loop():
            coro.close()
            raise RuntimeError("sync() called from thread of running loop")
        end: concurrent.futures.Future[T] = concurrent.futures.Future()
        if caller is not None:
            caller.coro, caller.end = coro, end
        try:
            self.loop.asyncio_loop.call_soon_threadsafe(_create, coro, end, caller)
        except RuntimeError:  # the loop is closed
            coro.close()
            raise
        return end


async def _to_its_end(aw: Awaitable[T]) -> tuple[asyncio.Future[T], asyncio.CancelledError | None]:
    """``aw`` awaited to its end through any cancel of the awaiting task: its ended future, and the cancel that
    came meanwhile (None: none); what :func:`through_cancel` and :func:`ended_before_cancel` each do with that
    cancel is their whole difference."""
    fut = asyncio.ensure_future(aw)
    cancel = None
    while not fut.done():
        try:
            await asyncio.shield(fut)
        except asyncio.CancelledError as e:
            if fut.cancelled():  # the step itself was cancelled (its loop closing): nothing to wait for
                raise
            cancel = e
        except BaseException:  # the step's error: its future holds it
            pass
    return fut, cancel


async def through_cancel(aw: Awaitable[T]) -> T:
    """``aw``'s answer, awaited to its end even when the awaiting task is cancelled meanwhile: the cancel came
    too late, and the task goes on as if it had not come.

    For a step a call has begun on the workers and cannot take back (an insert's apply, an exclusive sample's
    commit, an abort): a cancel there would leave some workers with the step done and the coordinator not
    told, where finishing it keeps them agreeing (and the caller gets what was done: the insert stored, the
    batch its items left the queue for).

    Parameters
    ----------
    aw : awaitable
        The step.

    Returns
    -------
    object
        Its answer.
    """
    fut, _ = await _to_its_end(aw)
    return fut.result()


async def ended_before_cancel(aw: Awaitable[T]) -> T:
    """``aw``'s answer; a cancel of the awaiting task meanwhile is raised only once ``aw`` has ended.

    For a step whose work on the workers the caller must not clean up after while it goes on (a checkpoint's
    files, written into a directory the cancelled call removes): the cancel still stops the call, after the
    step, and what the step did is the caller's to discard.

    Parameters
    ----------
    aw : awaitable
        The step, awaited to its end whatever comes meanwhile.

    Returns
    -------
    object
        The step's answer, when no cancel came meanwhile.

    Raises
    ------
    asyncio.CancelledError
        The task was cancelled while the step went on (the step's own error, if any, is dropped for it).
    """
    fut, cancel = await _to_its_end(aw)
    if cancel is not None:
        fut.exception()  # (taken: the cancel is what the caller gets)
        raise cancel
    return fut.result()


async def coord(ctx: Context, op: str, name: str | None, **kw: Any) -> Any:
    """One request to the coordinator on the scheduler.

    Parameters
    ----------
    ctx : Context
        How to reach the scheduler.
    op : str
        The coordinator operation (``"lookup"``, ``"admit_insert"`` ...; see
        :class:`GearFlowCoordinator`).
    name : str or None
        The table's name (None for operations on no table).
    **kw
        The operation's arguments, checked against its schema on the
        scheduler.

    Returns
    -------
    object
        The operation's result.

    Raises
    ------
    CoordinatorLostError
        The scheduler cannot be reached.
    GearFlowError
        The operation failed on the coordinator (its own error type).
    """
    lane = await ctx.coord_lane() if op in COORD_LANE_OPS else None
    if lane is not None:
        try:
            reply = await ctx.lanes.call(lane, op, {"name": name, **kw}, protocol.VERSION)
        except LANE_ERRORS as e:
            reply = e
        got = _coord_reply(ctx, lane, op, name, reply)
        if got is not _BY_COMM:
            return got
    try:
        resp = await ctx.scheduler.gear_flow_coord(action=op, name=name, v=protocol.VERSION, **kw)
    except (*COMM_ERRORS, RuntimeError) as e:
        if isinstance(e, RuntimeError) and not pool_closed(e, ctx.scheduler):
            raise
        raise CoordinatorLostError(
            f"table {name!r}: the scheduler at {ctx.scheduler.address} cannot be reached ({type(e).__name__}: {e})"
        ) from e
    return unwrap(resp)


def coord_here(ctx: Context, op: str, name: str | None, wait: float | None = 0.0, **kw: Any) -> Any:
    """:func:`coord` from a caller's thread: over the coordinator's lane on a blocking socket when the context
    has found it (no hop into the event loop and back), else :func:`coord` on the event loop.

    Parameters
    ----------
    ctx : Context
        How to reach the scheduler.
    op : str
        The coordinator operation.
    name : str or None
        The table's name.
    wait : float or None
        Seconds the coordinator may hold the request before it answers (an
        admission waiting for the rate limiter), on top of
        :func:`reply_timeout`; None: for ever.
    **kw
        The operation's arguments.

    Returns
    -------
    object
        The operation's result.

    Raises
    ------
    CoordinatorLostError
        The scheduler cannot be reached, or a reply was lost after the
        request was sent (never sent twice: the coordinator may have acted).
    GearFlowError
        The operation failed on the coordinator (its own error type).
    """
    lane = ctx.found_coord_lane() if op in COORD_LANE_OPS and not ctx.in_loop() else None
    if lane is not None:
        timeout = None if wait is None else wait + reply_timeout()
        [sent] = ctx.lanes.send_all([(lane, op, {"name": name, **kw})], protocol.VERSION, timeout)
        got = _coord_reply(ctx, lane, op, name, ctx.lanes.read_one(sent))
        if got is not _BY_COMM:
            return got
    # once asked, to its end (an admission its caller gave up is withdrawn: CoordinatorClient._admit)
    return ctx.sync_to_end(coord, ctx, op, name, **kw)


class CoordinatorClient:
    """The coordinator's operations about one table, each a typed method: on the event loop, or from a
    caller's thread.

    One method per operation of the registry
    (:data:`~gear_flow.distributed.operations.COORDINATOR_OPS`), whose
    parameters are that operation's fields (``tests/test_operations.py``
    holds them equal).  An argument left None is not sent: the coordinator
    takes its default.  An event loop's client (``blocking=False``) returns
    an awaitable of each answer (:func:`coord`); a caller's thread's client
    returns the answer (:func:`coord_here`: over the coordinator's lane when
    found), and an admission it sends carries the wait the coordinator gives
    it (:func:`~.coordinator.admission_wait`) and may be held there that
    long: both ends give up together.

    Parameters
    ----------
    ctx : Context
        How to reach the scheduler.
    name : str or None
        The table's name (None: only the operations on no table, ``list``).
    blocking : bool, default False
        Answer in the caller's thread instead of returning awaitables.

    Examples
    --------
    >>> CoordinatorClient.__name__
    'CoordinatorClient'
    """

    def __init__(self, ctx: Context, name: str | None, blocking: bool = False) -> None:
        self.ctx = ctx
        self.name = name
        self.blocking = blocking

    @classmethod
    def of(cls, client: Client, name: str | None = None) -> CoordinatorClient:
        """A caller's-thread client reaching the coordinator through a Dask client (the CLI's, a test's).

        Parameters
        ----------
        client : distributed.Client
            Connected to the cluster.
        name : str, optional
            The table's name.

        Returns
        -------
        CoordinatorClient
            Blocking.
        """
        return cls(Context(client=client), name, blocking=True)

    def _waits(self, timeout: float | None) -> float | None:
        """An admission's ``timeout`` as sent: from a caller's thread the wait the coordinator gives it."""
        return admission_wait(timeout) if self.blocking else timeout

    def _send(self, op: str, wait: float | None = 0.0, **kw: Any) -> Any:
        kw = {k: v for k, v in kw.items() if v is not None}
        if self.blocking:
            return coord_here(self.ctx, op, self.name, wait, **kw)
        return coord(self.ctx, op, self.name, **kw)

    def _admit(self, op: str, wait: float | None, **kw: Any) -> Any:
        """An admission sent with a ticket (the caller's, or a new one), withdrawn at the coordinator when its
        answer never reaches the caller: the call cancelled or interrupted while it waited there, or its reply
        lost.  Else a waiting request would stay in its line, and the grant it gets go to nobody (a Queue's
        item counted as handed out, an insert's room taken, for good)."""
        if kw.get("ticket") is None:
            kw["ticket"] = uuid.uuid4().hex
        if self.blocking:
            try:
                return self._send(op, wait, **kw)
            except BaseException as e:
                self._withdraw_unanswered(e, kw["ticket"])
                raise
        return self._admit_async(op, kw)

    async def _admit_async(self, op: str, kw: dict) -> Any:
        try:
            return await self._send(op, **kw)
        except BaseException as e:
            self._withdraw_unanswered(e, kw["ticket"])
            raise

    def _withdraw_unanswered(self, e: BaseException, ticket: str) -> None:
        # the coordinator's own answers are GearFlowErrors (the request is out of its line then); a lost
        # connection, a cancel or an interrupt leave it there
        if isinstance(e, GearFlowError) and not isinstance(e, CoordinatorLostError):
            return
        try:  # from the event loop or a caller's thread; never waited for
            self.ctx.loop.add_callback(_withdraw, self.ctx, self.name, ticket)
        except RuntimeError:  # the loop is closed: so is the client, which the coordinator releases
            pass

    # -- a table's life ------------------------------------------------------------------------------------------
    def register(self, config: dict, placement: dict[int, str]) -> Any:
        """Register the table with its configuration and placement (shard ids may be ints).

        Parameters
        ----------
        config : dict
            The table's configuration.
        placement : dict of int to str
            Shard -> worker.

        Returns
        -------
        object
            True (awaitable of it on the event loop).
        """
        return self._send("register", config=config, placement={str(k): v for k, v in placement.items()})

    def lookup(self) -> Any:
        """The table's state at the coordinator: placement, lost shards, version, size, waiting requests ….

        Returns
        -------
        object
            A dict (awaitable of it on the event loop).
        """
        return self._send("lookup")

    def list(self) -> Any:
        """The tables the coordinator knows.

        Returns
        -------
        object
            Their names (awaitable of them on the event loop).
        """
        return self._send("list")

    def workers(self) -> Any:
        """The cluster's live workers and the resources each advertises.

        Returns
        -------
        object
            ``{address: resources}`` (awaitable of it on the event loop).
        """
        return self._send("workers")

    def worker_alive(self, address: str) -> Any:
        """Does the scheduler still have worker ``address``?

        Parameters
        ----------
        address : str
            The worker.

        Returns
        -------
        object
            A bool (awaitable of it on the event loop).
        """
        return self._send("worker_alive", address=address)

    def restore_state(self, state: dict) -> Any:
        """Set the admission state of a table restored from a checkpoint.

        Parameters
        ----------
        state : dict
            The checkpoint's coordinator state.

        Returns
        -------
        object
            True (awaitable of it on the event loop).
        """
        return self._send("restore_state", state=state)

    def shard_restored(self, shard: int, worker: str, size: int, inserted: int) -> Any:
        """Tell that ``shard`` was restored on ``worker`` with ``size`` items, ``inserted`` ever.

        Parameters
        ----------
        shard : int
            The shard.
        worker : str
            Its new worker.
        size : int
            Items it holds.
        inserted : int
            Items ever inserted into it (its checkpoint's counter).

        Returns
        -------
        object
            What the gate answers (:meth:`~.gate.TableGate.shard_restored`; awaitable of it on the
            event loop).
        """
        return self._send("shard_restored", shard=shard, worker=worker, size=size, inserted=inserted)

    def mark_lost(self, shard: int, detail: str | None = None) -> Any:
        """Mark ``shard`` lost.

        Parameters
        ----------
        shard : int
            The shard.
        detail : str, optional
            Why.

        Returns
        -------
        object
            The table's lost shards, ``{shard: detail}`` (awaitable of it on the event loop).
        """
        return self._send("mark_lost", shard=shard, detail=detail)

    def move(self, shards: Sequence[int], worker: str | None = None) -> Any:
        """Move ``shards`` whole to ``worker`` (None: the coordinator chooses).

        Parameters
        ----------
        shards : sequence of int
            The shards.
        worker : str, optional
            The destination.

        Returns
        -------
        object
            The new placement version (awaitable of it on the event loop).
        """
        return self._send("move", shards=list(shards), worker=worker)

    def rebalance(self) -> Any:
        """Move whole shards until the workers' counts differ by at most one.

        Returns
        -------
        object
            The moves made (awaitable of them on the event loop).
        """
        return self._send("rebalance")

    def close(self, created: str | None = None) -> Any:
        """Close the table: waiting and later requests are refused.

        Parameters
        ----------
        created : str, optional
            The creation of the table the caller means (``created`` of its
            state): another one of the same name is refused.

        Returns
        -------
        object
            True (awaitable of it on the event loop).
        """
        return self._send("close", created=created)

    def drop(self, created: str | None = None) -> Any:
        """Forget the table.

        Parameters
        ----------
        created : str, optional
            The creation of the table the caller means: another one of the
            same name is left as it is.

        Returns
        -------
        object
            True (awaitable of it on the event loop).
        """
        return self._send("drop", created=created)

    def lane(self) -> Any:
        """The coordinator's lane: how a handle reaches it without the comm.

        Returns
        -------
        object
            ``machine``, ``unix`` and ``tcp`` addresses (None: not listening; awaitable of it on the
            event loop).
        """
        return self._send("lane")

    # -- inserts -------------------------------------------------------------------------------------------------
    def admit_insert(
        self,
        n: int,
        episodes: int,
        per_shard: dict[int, int] | None = None,
        timeout: float | None = None,
        owner: str | None = None,
        grouped: bool | None = None,
        ticket: str | None = None,
    ) -> Any:
        """Wait for the rate limiter to admit an insert of ``n`` items in ``episodes`` episodes.

        Parameters
        ----------
        n : int
            Items.
        episodes : int
            Episodes.
        per_shard : dict of int to int, optional
            Items routed to each shard.
        timeout : float, optional
            Seconds the admission may wait (from a caller's thread: also how
            long the request may be held).
        owner : str, optional
            Who holds the admission (released if it leaves).
        grouped : bool, optional
            An ingestion's insert, staged in groups of at most a shard's
            capacity (it may hold more items than the table).
        ticket : str, optional
            What it is withdrawn by when its answer never reaches the caller
            (a new one when None).

        Returns
        -------
        object
            The grant: ``txn``, ``first_episode_id``, ``first_stamp``,
            ``version`` … (awaitable of it on the event loop).
        """
        timeout = self._waits(timeout)
        extra = {"grouped": True} if grouped else {}  # (sent only when set)
        return self._admit(
            "admit_insert", timeout, n=n, episodes=episodes, per_shard=per_shard, timeout=timeout, owner=owner,
            ticket=ticket, **extra,
        )  # fmt: skip

    def commit_insert(
        self,
        txn: str,
        items: dict[int, int] | None = None,
        evicted: dict[int, int] | None = None,
        unsettled: Sequence[str] | None = None,
        unreached: Sequence[str] | None = None,
    ) -> Any:
        """Commit insert ``txn``: ``items`` written and ``evicted`` per shard.

        Parameters
        ----------
        txn : str
            The admitted insert.
        items, evicted : dict of int to int, optional
            Items written and evicted per shard.
        unsettled : sequence of str, optional
            Workers that did not answer: the coordinator settles their parts.
        unreached : sequence of str, optional
            Workers whose abort was not answered: the coordinator aborts
            their parts.

        Returns
        -------
        object
            The table's size after it (awaitable of it on the event loop).
        """
        return self._send(
            "commit_insert", txn=txn, items=items, evicted=evicted, unsettled=unsettled, unreached=unreached
        )

    def abort_insert(self, txn: str, unreached: Sequence[str] | None = None) -> Any:
        """Abort insert ``txn``.

        Parameters
        ----------
        txn : str
            The admitted insert.
        unreached : sequence of str, optional
            Workers whose abort was not answered: the coordinator aborts
            their parts.

        Returns
        -------
        object
            The coordinator's answer (awaitable of it on the event loop).
        """
        return self._send("abort_insert", txn=txn, unreached=unreached)

    def stamps(self, n: int) -> Any:
        """``n`` consecutive priority stamps (an update's order among all handles').

        Parameters
        ----------
        n : int
            How many.

        Returns
        -------
        object
            The first (awaitable of it on the event loop).
        """
        return self._send("stamps", n=n)

    # -- samples and removals ------------------------------------------------------------------------------------
    def admit_sample(
        self,
        n: int,
        timeout: float | None = None,
        done: int | None = None,
        lease: int | None = None,
        exclusive: bool | None = None,
        owner: str | None = None,
        after: int | None = None,
        ticket: str | None = None,
    ) -> Any:
        """Wait for the rate limiter to admit a sample of ``n``.

        Parameters
        ----------
        n : int
            The batch's rows.
        timeout : float, optional
            Seconds the admission may wait (from a caller's thread: also how
            long the request may be held).
        done : int, optional
            Samples served under the lease since the last admission.
        lease : int, optional
            Samples asked for ahead, to serve without asking.
        exclusive : bool, optional
            The sample changes the table (one at a time).
        owner : str, optional
            Who holds the admission (released if it leaves).
        after : int, optional
            Admit once more items arrived than this count of arrivals.
        ticket : str, optional
            What it is withdrawn by when its answer never reaches the caller
            (a new one when None).

        Returns
        -------
        object
            The grant: ``version``, ``txn``, ``lease``, ``horizon``,
            ``arrivals`` … (awaitable of it on the event loop).
        """
        timeout = self._waits(timeout)
        return self._admit(
            "admit_sample", timeout, n=n, timeout=timeout, done=done, lease=lease, exclusive=exclusive, owner=owner,
            after=after, ticket=ticket,
        )  # fmt: skip

    def admit_hold(self, timeout: float | None = None, owner: str | None = None, ticket: str | None = None) -> Any:
        """Wait for the table's exclusive hold (an eviction: no sample or insert meanwhile).

        Parameters
        ----------
        timeout : float, optional
            Seconds the admission may wait.
        owner : str, optional
            Who holds it (released if it leaves).
        ticket : str, optional
            What it is withdrawn by when its answer never reaches the caller
            (a new one when None).

        Returns
        -------
        object
            The hold: ``txn`` and the table's ``size`` (awaitable of it on the event loop).
        """
        timeout = self._waits(timeout)
        return self._admit("admit_hold", timeout, timeout=timeout, owner=owner, ticket=ticket)

    def withdraw(self, ticket: str) -> Any:
        """Withdraw the admission sent with ``ticket``, whose answer never reached its caller: taken out of its
        line, or its grant given back.

        Parameters
        ----------
        ticket : str
            The admission's ticket.

        Returns
        -------
        object
            ``"waiting"``, ``"granted"`` or ``"unknown"`` (awaitable of it on the event loop).
        """
        return self._send("withdraw", ticket=ticket)

    def sample_finished(
        self, txn: str | None = None, rollback: int | None = None, expired: dict[int, int] | None = None
    ) -> Any:
        """Give back a sample's admission, or an eviction's hold.

        Parameters
        ----------
        txn : str, optional
            The admission (an exclusive sample's, a hold's).
        rollback : int, optional
            Rows admitted and never served.
        expired : dict of int to int, optional
            Items the sample expired per shard.

        Returns
        -------
        object
            True (awaitable of it on the event loop).
        """
        return self._send("sample_finished", txn=txn, rollback=rollback, expired=expired)

    def count_samples(self, n: int) -> Any:
        """Count ``n`` samples served under a lease.

        Parameters
        ----------
        n : int
            Samples.

        Returns
        -------
        object
            True (awaitable of it on the event loop).
        """
        return self._send("count_samples", n=n)

    def removed(self, k: int, per_shard: dict[int, int] | None = None) -> Any:
        """Count ``k`` items removed (deleted, evicted, expired), ``per_shard``.

        Parameters
        ----------
        k : int
            Items.
        per_shard : dict of int to int, optional
            Items per shard.

        Returns
        -------
        object
            The table's size after it (awaitable of it on the event loop).
        """
        return self._send("removed", k=k, per_shard=per_shard)


#: :func:`_coord_reply`'s answer for a request that never left: the comm serves it
_BY_COMM = object()


async def _withdraw(ctx: Context, name: str | None, ticket: str) -> None:
    """Withdraw the admission sent with ``ticket`` (:meth:`CoordinatorClient.withdraw`), in the background."""
    ctx.keep_running()
    try:
        await CoordinatorClient(ctx, name).withdraw(ticket)
    except Exception as e:  # noqa: BLE001 - nobody waits for it; a coordinator gone has released the client
        logger.info("table %r: an admission not withdrawn (%s)", name, e)


def _coord_reply(ctx: Context, lane: str, op: str, name: str | None, reply: Any) -> Any:
    """What a request over the coordinator's lane came back with (a reply pair, or the error that kept it
    from being sent or broke its connection): its result, its error raised, or :data:`_BY_COMM`."""
    if isinstance(reply, NotSent):  # nothing left: this request and later ones go over the comm
        logger.info("the coordinator's lane %s failed (%s); using the comm", lane, reply)
        ctx.drop_coord_lane(lane)
        return _BY_COMM
    if isinstance(reply, BaseException):  # sent, reply lost: the coordinator may have acted on it
        ctx.drop_coord_lane(lane)
        raise CoordinatorLostError(
            f"table {name!r}: the connection to the coordinator on the scheduler broke during {op!r} "
            f"({type(reply).__name__}: {reply}); the scheduler may have gone away"
        ) from reply
    return _result(*reply)


def _result(ok: bool, value: Any) -> Any:
    """A lane reply's ``value`` when ``ok``; else its error raised with its own type (a message: GearFlowError)."""
    if ok:
        return value
    raise value if isinstance(value, BaseException) else GearFlowError(str(value))


def reply_timeout() -> float:
    """Seconds a live worker's or the coordinator's reply is waited for by a caller's thread.

    Returns
    -------
    float
        As long as the event loop's path waits for a live worker
        (``distributed.rpc-timeout`` times ``rpc-retries + 1``).
    """
    return float(config.get("distributed.rpc-timeout")) * (int(config.get("distributed.rpc-retries") or 0) + 1)


async def worker_alive(ctx: Context, table: str, addr: str, timeout: float) -> bool | None:
    """Does the scheduler still have worker ``addr``?  Asked about a slow worker, bounded in time.

    Parameters
    ----------
    ctx : Context
        How to reach the scheduler.
    table : str
        The table asking.
    addr : str
        The worker.
    timeout : float
        Seconds the answer is waited for: a scheduler that does not answer
        must not stop a wait from ending.

    Returns
    -------
    bool or None
        The scheduler's answer; None when it did not give one.
    """
    try:
        return bool(await asyncio.wait_for(CoordinatorClient(ctx, table).worker_alive(addr), timeout))
    except (TimeoutError, GearFlowError):
        return None


def not_answered(addr: str, op: str, seconds: float, known: bool) -> GearFlowError:
    """The error of a request a live worker did not answer in time.

    Parameters
    ----------
    addr : str
        The worker.
    op : str
        The operation.
    seconds : float
        How long it was waited for.
    known : bool
        Whether the scheduler said it still has the worker (False: it did
        not answer that question either).

    Returns
    -------
    NotAnswered
        To raise (a :class:`~gear_flow.errors.GearFlowError`).
    """
    phrase = "still has it" if known else "did not say whether it still has it"
    return NotAnswered(
        f"worker {addr} did not answer {op!r} within {seconds:g} s although the scheduler {phrase} "
        "(raise distributed.rpc-timeout for slow operations)"
    )


def lost_reply(addr: str, op: str, err: BaseException) -> GearFlowError:
    """The error of a request sent over a worker's lane whose reply was lost, and that the worker may have
    acted on (so it is not sent again).

    Parameters
    ----------
    addr : str
        The worker.
    op : str
        The operation.
    err : BaseException
        What broke the lane.

    Returns
    -------
    GearFlowError
        To raise.
    """
    return GearFlowError(
        f"worker {addr}: the reply to {op!r} over its lane was lost ({type(err).__name__}: {err}); "
        "not sent again, as the worker may have acted on it"
    )


#: why a worker whose ``gear_flow`` handler no longer answers counts as lost
_CLOSING = "its gear_flow handler is gone (the worker is closing)"


async def _lost_reply(ctx: Context, addr: str, op: str, name: str | None, err: BaseException) -> None:
    """Raise for a request sent over a lane whose reply was lost: :class:`WorkerLost` when the worker's own
    handler does not answer over the comm either (it died, or is closing: its lane closes first, then its
    handler), else :func:`lost_reply`."""
    try:
        resp = await ctx.rpc(addr).gear_flow(
            action="status", v=protocol.VERSION, **wire.encode({"name": name or "", "txn": ""})
        )
    except COMM_ERRORS as e:
        raise WorkerLost(addr, e) from err
    if not isinstance(resp, dict):
        raise WorkerLost(addr, _CLOSING) from err
    raise lost_reply(addr, op, err) from err


async def call(ctx: Context, addr: str, op: str, *, table: str | None = None, **args: Any) -> Any:
    """One request to a shard worker (in-process when it is this worker).

    A slow reply is awaited ``distributed.rpc-retries + 1`` times
    ``distributed.rpc-timeout`` seconds as long as the scheduler still has the
    worker; with ``table``, the coordinator is also asked once after
    :data:`EARLY_PROBE_S`, so that a request to a worker killed meanwhile
    fails once the scheduler has removed it, not at Dask's connect timeout.

    Parameters
    ----------
    ctx : Context
        How to reach the worker.
    addr : str
        The worker's address.
    op : str
        The worker operation (see :data:`GearFlowWorker.OPS`).
    table : str, optional
        Name of the table, to ask the coordinator whether ``addr`` is still
        alive when it is slow; None: a slow worker is always waited for.
    **args
        The operation's arguments (NumPy arrays travel as frames).

    Returns
    -------
    object
        The operation's result.

    Raises
    ------
    WorkerLost
        The connection failed, the scheduler removed the worker, or it is
        closing (its handler gone).
    GearFlowError
        The worker did not answer in time although alive, the reply to a
        request sent over its lane was lost and the request is not one to
        send twice (:data:`~gear_flow.distributed.lane.RESENDABLE_OPS`), or
        the operation failed there (its own error type).
    """
    args = ctx.stamped(args)
    if addr == ctx.local_addr and ctx.local_plugin is not None:
        return await ctx.local_plugin.run(op, **args)
    timeout = config.get("distributed.rpc-timeout")
    retries = int(config.get("distributed.rpc-retries") or 0)
    # the request is awaited directly (no task or shield per call: they cost ~0.2 ms a round trip);
    # a timer checks a slow worker's liveness and cancels the wait only when it is lost or out of time
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    watch = {"why": None, "attempt": 0, "checker": None, "unknown": False}

    def slow() -> None:
        watch["checker"] = asyncio.ensure_future(check())

    async def check() -> None:
        alive = True
        if table is not None:
            alive = await worker_alive(ctx, table, addr, timeout)
            if alive is None:
                watch["unknown"] = True  # counted as alive: the wait goes on, up to its limit
                alive = True
        watch["attempt"] += 1
        if not alive or watch["attempt"] > retries:
            watch["why"] = "lost" if not alive else "timeout"
            task.cancel()
        else:
            watch["timer"] = loop.call_later(timeout, slow)

    def early() -> None:
        watch["probe"] = asyncio.ensure_future(probe())

    async def probe() -> None:
        # a worker killed mid-request is removed by the scheduler within about a second, while a connection to
        # it is retried until Dask's connect timeout (30 s): asked about once early, a lost one fails it then
        if await worker_alive(ctx, table, addr, timeout) is False and watch["why"] is None:
            watch["why"] = "lost"
            task.cancel()

    watch["timer"] = loop.call_later(timeout, slow)
    watch["early"] = loop.call_later(EARLY_PROBE_S, early) if table is not None and EARLY_PROBE_S < timeout else None
    reply = resp = None
    try:
        lane = ctx.lanes.route(addr, op, wire.array_bytes(args) if op in ("stage", "write") else 0)
        if lane is not None:
            try:
                reply = await ctx.lanes.call(lane, op, args, protocol.VERSION)
            except LANE_ERRORS as e:  # the request goes over the comm, and later ones to this worker too
                logger.info("fast lane to %s failed (%s: %s); using the comm", addr, type(e).__name__, e)
                ctx.lanes.drop(addr)
                if not isinstance(e, NotSent) and op not in RESENDABLE_OPS:
                    await _lost_reply(ctx, addr, op, args.get("name"), e)
        if reply is None:
            resp = await ctx.rpc(addr).gear_flow(action=op, v=protocol.VERSION, **wire.encode(args))
    except asyncio.CancelledError:
        if watch["why"] is not None:
            task.uncancel()  # our own cancellation: the task goes on (its cancel count back to zero)
        if watch["why"] == "lost":
            raise WorkerLost(addr, "the scheduler removed it") from None
        if watch["why"] == "timeout":
            raise not_answered(addr, op, (retries + 1) * timeout, known=not watch["unknown"]) from None
        raise
    except COMM_ERRORS as e:
        raise WorkerLost(addr, e) from e
    except RuntimeError as e:
        if not pool_closed(e, ctx.rpc(addr)):
            raise
        raise CoordinatorLostError(f"worker {addr}: this client has closed its connections ({e})") from e
    finally:
        watch["timer"].cancel()
        if watch["early"] is not None:
            watch["early"].cancel()
        for job in (watch["checker"], watch.get("probe")):
            if job is not None and not job.done():
                job.cancel()
    # the reply is decoded outside the comm's errors: an operation's own error that is an OSError (a
    # RateLimitTimeout is a TimeoutError, a CoordinatorLostError a ConnectionError) is never a lost worker
    if reply is not None:
        return _result(*reply)
    if not isinstance(resp, dict):  # no reply: the handler was removed (the worker is closing)
        raise WorkerLost(addr, _CLOSING)
    return unwrap(resp)


@functools.cache
def copy_pool() -> ThreadPoolExecutor:
    """This process's threads for copying windows out of shared memory or received frames (clients), and
    for reading several lanes' large replies at once from a caller's thread.

    Returns
    -------
    concurrent.futures.ThreadPoolExecutor
        Two threads, made on first use.
    """
    return ThreadPoolExecutor(2, thread_name_prefix="gear-flow-copy")


async def build_everywhere(
    ctx: Context,
    name: str,
    register: Callable[[], Awaitable[Any]],
    op: str,
    args: dict[str, dict],
    what: str,
    then: Callable[[], Awaitable[T]] | None = None,
) -> T | None:
    """Register table ``name`` with the coordinator, run worker operation ``op`` on every worker of ``args`` at
    once, then ``then()``: all or nothing.

    Once the name is registered, any failure, or a cancel (an ``*_async`` call cancelled, a blocking one
    interrupted), has every one of those workers drop the table (a disk table's files included) and the
    coordinator forget it.  A cancel first lets the step under way end, so that nothing is dropped before it
    is built: a worker still building when its drop came kept its part, and a registration whose answer the
    cancel cut off left the name taken at the coordinator, for good, with no worker holding it.

    Parameters
    ----------
    ctx : Context
        How to reach the workers and the scheduler.
    name : str
        The table's name.
    register : callable
        Registers the name with the coordinator (refused for a live table's, before any worker builds).
    op : str
        The worker operation that builds its shards (``create``, ``restore``).
    args : dict of str to dict
        Per worker address, the operation's arguments besides ``name``.
    what : str
        What is being done, for the messages (``"table 't' was created"``).
    then : callable, optional
        What completes it once every worker built its part (the
        coordinator's state of a restored table, the table's lookup), taken
        back as well when it fails.

    Returns
    -------
    object
        ``then()``'s answer (None without ``then``).

    Raises
    ------
    ShardLostError
        A worker was lost meanwhile.
    SpecError
        The name is taken, or a worker refused (named in the message).
    GearFlowError
        Another error of a worker's, or of ``then``.
    asyncio.CancelledError
        Cancelled: nothing of it is left.
    """
    registered = False

    async def claim() -> None:
        nonlocal registered
        await register()
        registered = True

    try:
        await ended_before_cancel(claim())
        got = await ended_before_cancel(
            asyncio.gather(*(call(ctx, a, op, name=name, **kw) for a, kw in args.items()), return_exceptions=True)
        )
        for a, r in zip(args, got):
            if isinstance(r, WorkerLost):
                raise ShardLostError(-1, f"worker {a} was lost while {what}; nothing of it was built") from None
            if type(r) is SpecError:  # which worker refused (a typed subclass says enough itself)
                raise SpecError(f"worker {a}: {r}") from None
            if isinstance(r, BaseException):
                raise r
        return None if then is None else await ended_before_cancel(then())
    except BaseException:
        if registered:
            await asyncio.gather(*(call(ctx, a, "drop", name=name) for a in args), return_exceptions=True)
            await asyncio.gather(CoordinatorClient(ctx, name).drop(), return_exceptions=True)
        raise


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
        [(ctx.lanes.paths.get(a), op, ctx.stamped(args)) for a, op, args, _ in far], protocol.VERSION, reply_timeout()
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

        futures = [copy_pool().submit(one, i) for i in range(len(far))]
        try:
            for f in futures:
                f.result()
        finally:  # nothing is read or copied into the batch once this returns
            wait(futures)
        return
    for (a, op, _, kind), r in zip(far, ctx.lanes.read_all(sent)):
        arrived(kind, a, op, r)


class WorkerRoutes:
    """How this handle reaches each of its table's workers beside the comm, learnt on first use.

    Per worker, one of: not probed yet; its rings mapped here from shared
    memory (``{shard: Attached}``, with its fast lane when it has one); or
    not mapped (the comm, or its TCP lane when it has one; the lane itself
    is in the context's :class:`~gear_flow.distributed.lane.Lanes`).  A
    change of placement forgets them all (:meth:`clear`): shards may have
    moved.
    """

    def __init__(self) -> None:
        # replaced whole, never edited in place: callers' threads read it while the event loop learns
        self._mapped: dict[str, dict | None] = {}
        #: workers on another host whose every shard publishes its selection state: their layouts (a worker
        #: of that host draws for all of them, :mod:`~gear_flow.distributed.host_reader`)
        self._far: dict[str, dict] = {}

    def far(self, addr: str) -> dict | None:
        """The ``shared_layout`` of ``addr`` when it is on another host and its shards publish their state.

        Parameters
        ----------
        addr : str
            The worker.

        Returns
        -------
        dict or None
            ``{"machine": str, "shards": {shard: layout}}``.
        """
        return self._far.get(addr)

    def learnt_far(self, addr: str, layout: dict) -> None:
        """Record the layout of ``addr``, a worker on another host whose shards publish their state.

        Parameters
        ----------
        addr : str
            The worker.
        layout : dict
            Its ``shared_layout`` answer.
        """
        self._far = {**self._far, addr: layout}

    def probed(self, addr: str) -> bool:
        """Whether ``addr`` was probed since the last placement change.

        Parameters
        ----------
        addr : str
            The worker.

        Returns
        -------
        bool
            True once :meth:`TableLink.route` learnt its route.
        """
        return addr in self._mapped

    def mapped(self, addr: str) -> dict | None:
        """``{shard: Attached}`` of ``addr``'s rings mapped here; None when not mapped (or not probed).

        Parameters
        ----------
        addr : str
            The worker.

        Returns
        -------
        dict of int to Attached or None
            Its mapped shards.
        """
        return self._mapped.get(addr)

    def every_mapped(self) -> dict[str, dict]:
        """Every worker whose rings are mapped here, with its mapped shards.

        Returns
        -------
        dict of str to dict
            ``{worker: {shard: Attached}}``.
        """
        return {a: sh for a, sh in self._mapped.items() if sh is not None}

    def learnt(self, addr: str, mapped: dict | None) -> None:
        """Record ``addr``'s route (``mapped``: its rings, or None: not mapped).

        Parameters
        ----------
        addr : str
            The worker.
        mapped : dict or None
            ``{shard: Attached}``, or None.
        """
        self._mapped = {**self._mapped, addr: mapped}

    def forget(self, addr: str) -> None:
        """Forget ``addr``'s route: it is probed again on its next use (its segments were replaced).

        Parameters
        ----------
        addr : str
            The worker.
        """
        self._mapped = {a: sh for a, sh in self._mapped.items() if a != addr}
        self._far = {a: lay for a, lay in self._far.items() if a != addr}

    def clear(self) -> None:
        """Forget every route (the placement changed)."""
        self._mapped = {}
        self._far = {}


class TableLink:
    """A table handle's requests to its workers and coordinator, and what a lost or moved worker means.

    Every request a handle makes goes through it: :attr:`coordinator` (and
    :attr:`coordinator_here` from a caller's thread), :meth:`on_workers`
    (several workers at once).  It is the one place that classifies their failures:
    a worker that cannot be reached, or that the scheduler removed, makes its
    shards lost (:class:`~gear_flow.errors.ShardLostError`, or in a degraded
    table a :class:`Retry` without them); one that refused a request planned
    before shards moved a :class:`Moved` once the new placement is learnt;
    a live worker that does not answer in time fails the call (``call``
    raises :func:`not_answered`).

    Parameters
    ----------
    ctx : Context
        How the handle reaches the cluster.
    name : str
        The table's name.
    view : TableView
        The handle's placement; :meth:`refresh` and loss handling change it.
    routes : WorkerRoutes
        The handle's routes to its workers; :meth:`route` learns them.
    config : dict
        The table's configuration (``shared_memory``, ``tcp_lane``).
    requests : dict of str to int
        Requests sent to shard workers, by operation (counted here).
    """

    def __init__(
        self, ctx: Context, name: str, view: TableView, routes: WorkerRoutes, config: dict, requests: dict[str, int]
    ) -> None:
        self.ctx = ctx
        self.name = name
        self.view = view
        self.routes = routes
        self._config = config
        self.requests = requests
        #: the coordinator's operations about this table on the event loop, and from a caller's thread
        self.coordinator = CoordinatorClient(ctx, name)
        self.coordinator_here = CoordinatorClient(ctx, name, blocking=True)

    async def refresh(self, version: int | None = None) -> None:
        """Learn the placement and lost shards from the coordinator (changes other handles made: restores,
        losses, moves), unless the view is at ``version`` already.

        Parameters
        ----------
        version : int, optional
            The version an answer said the placement is at.
        """
        if version is not None and version == self.view.version:
            return
        st = await self.coordinator.lookup()
        self.view.learn(st)
        self.ctx.epoch = self.view.version  # every request to a worker says which placement it was planned at

    def refresh_here(self, version: int | None) -> None:
        """:meth:`refresh` from a caller's thread: the event loop is asked only when the view is not at
        ``version`` already.

        Parameters
        ----------
        version : int or None
            The version an answer said the placement is at; None: asked whatever version the view is at.
        """
        if version != self.view.version:
            self.ctx.sync(self.refresh, version)

    async def moved(self, epoch: int) -> None:
        """Learn the placement at version ``epoch`` or later: a worker refused a request planned before shards
        moved there or away (:class:`~gear_flow.errors.ShardMovedError`).

        The coordinator moves its placement just after the destination
        takes the shards, so the lookup may trail for a moment: asked again
        until it has caught up (bounded: a worker's epoch never runs ahead
        of the coordinator's for long).

        Parameters
        ----------
        epoch : int
            The version the refusing worker is at.

        Raises
        ------
        ShardMovedError
            The coordinator's placement stayed older for ``distributed.rpc-timeout``.
        """
        deadline = time.monotonic() + float(config.get("distributed.rpc-timeout"))
        await self.refresh()
        while self.view.version < epoch:
            if time.monotonic() > deadline:
                raise ShardMovedError(epoch, f"table {self.name!r}: the coordinator's placement stayed at "
                                      f"version {self.view.version}")  # fmt: skip
            await asyncio.sleep(0.005)
            await self.refresh()

    # -- the workers ---------------------------------------------------------------------------------------------
    def serves_in_thread(self) -> bool:
        """Whether a request to every worker holding a live shard can go from the caller's thread.

        Returns
        -------
        bool
            Every such worker is this process's own, or has a lane learnt:
            a fast lane (on this machine, its rings mapped) or a TCP lane
            (its windows come with the replies).
        """
        ctx = self.ctx
        for a in self.view.workers():  # a consistent reading, however the event loop changes the view
            if a == ctx.local_addr and ctx.local_plugin is not None:
                continue
            if not self.routes.probed(a) or a not in ctx.lanes.paths:
                return False
        return True

    async def again(self, broken: Iterable[str], step: Callable[..., Awaitable[T]], *args: Any) -> T:
        """``await step(*args)`` once the lanes of ``broken`` are dropped: a lane that failed under a caller's
        thread is not used again, its requests go over the comm (as when it fails on the event loop's path).

        Parameters
        ----------
        broken : iterable of str
            Workers whose lanes failed.
        step : coroutine function
            What the event loop does instead (an insert's steps, a waiting
            priority update).
        *args
            Its arguments.

        Returns
        -------
        object
            What ``step`` returned.
        """
        for a in broken:
            logger.info("table %r: the lane to %s failed; using the comm", self.name, a)
            self.ctx.lanes.drop(a)
        return await step(*args)

    def unanswered_here(self, addr: str, op: str) -> GearFlowError | None:
        """What a request sent from the caller's thread means when no reply came in time (:func:`reply_timeout`).

        The same rule as :func:`call`'s on the event loop: a live worker
        that does not answer fails the call (it may have acted, so nothing
        is sent again); one the scheduler removed is lost.

        Parameters
        ----------
        addr : str
            The worker.
        op : str
            The operation sent.

        Returns
        -------
        GearFlowError or None
            The error to raise (the worker is alive, or the scheduler could
            not say); None: the scheduler removed it (its shards are lost:
            :meth:`handle_lost`).
        """
        ctx = self.ctx
        alive = ctx.sync(worker_alive, ctx, self.name, addr, float(config.get("distributed.rpc-timeout")))
        if alive is False:
            return None
        return not_answered(addr, op, reply_timeout(), known=alive is not None)

    async def route(self, addr: str) -> dict | None:
        """``{shard: Attached}`` when ``addr``'s shards can be read from shared memory here, else None;
        probed on first use (its fast lane, or its TCP lane, found then).

        Parameters
        ----------
        addr : str
            The worker.

        Returns
        -------
        dict of int to Attached or None
            Its rings mapped here.
        """
        routes, ctx = self.routes, self.ctx
        if routes.probed(addr):
            return routes.mapped(addr)
        got = None
        local = addr == ctx.local_addr and ctx.local_plugin is not None
        if self._config.get("shared_memory") and config.get("distributed.shared-memory") and not local:
            from ..storage.shared import Attached, machine_id

            try:
                lay = await call(ctx, addr, "shared_layout", table=self.name, name=self.name)
            # only a probe, asked again next time: the request that follows finds (and reports) the loss, or is
            # refused as planned before a move and redone as placed now
            except (WorkerLost, ShardMovedError):
                return None
            if (
                lay["machine"] != machine_id()
                and lay["shards"]
                and all(v is not None and v.get("selection") is not None for v in lay["shards"].values())
            ):
                routes.learnt_far(addr, lay)  # another host: one of its workers may draw for all of them
            if lay["machine"] == machine_id() and all(v is not None for v in lay["shards"].values()):
                try:
                    got = {int(i): Attached(v, int(i)) for i, v in lay["shards"].items()}
                except (ShardLostError, OSError, ValueError) as e:  # not this machine's /dev/shm after all
                    logger.info("table %r: shards of %s not mapped (%s); using the comm", self.name, addr, e)
                if got is not None and isinstance(lay.get("lane"), str) and config.get("distributed.fast-lane"):
                    ctx.lanes.paths[addr] = lay["lane"]  # its control requests: over a Unix socket
        tcp = (
            self._config.get("tcp_lane") and config.get("distributed.tcp-lane") and config.get("distributed.fast-lane")
        )
        if got is None and not local and tcp:
            try:  # not mapped here: its draws (windows included) and control requests over its TCP lane
                lane = await call(ctx, addr, "lane", table=self.name, name=self.name)
            except (WorkerLost, ShardMovedError):
                return None
            except GearFlowError as e:  # e.g. a worker of an older gear_flow: the comm
                logger.info("table %r: no TCP lane to %s (%s); using the comm", self.name, addr, e)
                lane = {}
            tcp_lane = lane.get("tcp")
            if isinstance(tcp_lane, str) and await ctx.lanes.probe(tcp_lane):
                ctx.lanes.paths[addr] = tcp_lane
            elif isinstance(tcp_lane, str):
                logger.info("table %r: TCP lane %s of %s not reachable; using the comm", self.name, tcp_lane, addr)
        routes.learnt(addr, got)
        return got

    async def on_workers(
        self,
        calls: dict[str, tuple[str, dict]],
        partial: bool = False,
        arrived: Callable[[str, Any], Awaitable[None]] | None = None,
    ) -> Any:
        """Run ``{addr: (op, kwargs)}`` in parallel.

        Parameters
        ----------
        calls : dict of str to (str, dict)
            Per worker, the operation and its arguments.
        partial : bool, default False
            Return ``(results, errors)`` instead of raising, so that a
            caller can undo what succeeded.
        arrived : coroutine function, optional
            Awaited with ``(addr, result)`` as each reply arrives (a batch's
            parts are copied while others are still on their way).

        Returns
        -------
        dict of str to object, or (dict, list of BaseException)
            Each worker's answer (with ``partial``, and the errors).

        Raises
        ------
        ShardLostError
            A worker is lost and the table is not degraded.
        Retry
            Degraded: a worker is lost (its shards are marked lost); or
            shards moved (:class:`Moved`, the new placement learnt).
        """
        addrs = list(calls)
        for a in addrs:
            self.requests[calls[a][0]] += 1

        async def one(a):
            r = await call(self.ctx, a, calls[a][0], table=self.name, **calls[a][1])
            if arrived is not None:
                await arrived(a, r)
            return r

        results = await asyncio.gather(*(one(a) for a in addrs), return_exceptions=True)
        out, errors, lost, moved = {}, [], [], {}
        for a, r in zip(addrs, results):
            if isinstance(r, WorkerLost):
                lost.append(a)
            elif isinstance(r, ShardMovedError):
                moved[a] = r.epoch
            elif isinstance(r, BaseException):
                errors.append(r)
            else:
                out[a] = r
        if moved:  # planned at a placement shards have left since: redone as placed now
            await self.moved(max(moved.values()))
            if not partial:
                raise Moved(moved)
            errors.append(Moved(moved))
        if lost:
            try:
                await self.handle_lost(lost)
            except (Retry, ShardLostError) as e:
                if not partial:
                    raise
                errors.append(e)
        if partial:
            return out, errors
        if errors:
            raise errors[0]
        return out

    async def handle_lost(self, addrs: Iterable[str]) -> None:
        """Mark the shards of ``addrs`` lost at the coordinator, learn the placement, and raise what it means.

        Parameters
        ----------
        addrs : iterable of str
            Workers that could not be reached.

        Raises
        ------
        ShardLostError
            Their shards are lost and the table is not degraded.
        Retry
            Degraded (the rest serve), or they hold none of the table's
            shards any more (moved: redone as placed now).
        """
        addrs = set(addrs)
        # the placement as the coordinator has it now: a shard restored elsewhere since this handle learnt
        # it (by another handle, or this one's restore_shard) is not the lost worker's any more
        await self.refresh()
        now = self.view.now()
        shards = sorted(s for s, a in now.shards.items() if a in addrs)  # lost, or marked lost already
        for s in shards:
            if s not in self.view.lost:
                detail = f"worker {now.shards[s]} unreachable"
                self.view.mark_lost(s, (await self.coordinator.mark_lost(s, detail))[s])
        await self.refresh()
        # those workers hold none of the table's shards any more: moved, redone as placed now and nothing of it
        # lost (an edit's keys are sent again, not counted stale)
        if not shards:
            raise Moved(addrs)
        if not self.view.degraded:
            raise ShardLostError(
                shards[0],
                f"worker(s) {sorted(addrs)} holding shard(s) {shards} of table {self.name!r} are unreachable; "
                "create the table with degraded=True to keep serving from the other shards",
            )
        logger.warning("table %r: shards %s lost (worker(s) %s); serving from the rest", self.name, shards, addrs)
        raise Retry(f"shard(s) {shards} lost with worker(s) {sorted(addrs)}; served from the rest")
