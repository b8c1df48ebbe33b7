"""How a table handle reaches the cluster: the scheduler's coordinator and the shard workers.

Requests to a shard worker go to its ``gear_flow`` comm handler (in-process
when the handle runs on that worker) with NumPy arrays as serialized frames.
A worker counts as lost when the connection fails or the scheduler no longer
knows it; a slow reply is waited for again (``distributed.rpc-retries``
times ``distributed.rpc-timeout``) as long as the scheduler still has the
worker, then reported as a timeout, never silently as a loss.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from distributed.core import Status

from .. import config
from ..errors import CoordinatorLostError, GearFlowError
from . import protocol, wire
from .coordinator import COORD_LANE_OPS
from .lane import LANE_ERRORS, RESENDABLE_OPS, Lanes, NotSent
from .plugin import PLUGIN_NAME
from .wire import unwrap

if TYPE_CHECKING:
    from distributed import Client, Worker

logger = logging.getLogger(__name__)
COMM_ERRORS = (OSError, asyncio.TimeoutError)


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
        """Run coroutine function ``fn`` on this context's event loop and wait for its result.

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
        """
        if self.worker is not None:
            from distributed.utils import sync

            return sync(self.loop, fn, *args, **kwargs)
        return self.client.sync(fn, *args, **kwargs)


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
    return ctx.sync(coord, ctx, op, name, **kw)


#: :func:`_coord_reply`'s answer for a request that never left: the comm serves it
_BY_COMM = object()


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
        return bool(await asyncio.wait_for(coord(ctx, "worker_alive", table, address=addr), timeout))
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
    worker.

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

    watch["timer"] = loop.call_later(timeout, slow)
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
        if watch["checker"] is not None and not watch["checker"].done():
            watch["checker"].cancel()
    # the reply is decoded outside the comm's errors: an operation's own error that is an OSError (a
    # RateLimitTimeout is a TimeoutError, a CoordinatorLostError a ConnectionError) is never a lost worker
    if reply is not None:
        return _result(*reply)
    if not isinstance(resp, dict):  # no reply: the handler was removed (the worker is closing)
        raise WorkerLost(addr, _CLOSING)
    return unwrap(resp)
