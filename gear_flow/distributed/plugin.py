"""Worker plugin: hosts shards and serves them over Dask's comm.

``setup(worker)`` creates the worker's :class:`~gear_flow.distributed.host.ShardHost`
and registers one comm handler, ``gear_flow``.  Requests name an operation
from :data:`OPS` (a fixed table, never a free attribute name) and carry NumPy
arrays as serialized frames; the host runs in a small thread pool so that
gathers never block the worker's event loop.  ``__init__`` stores only
picklable configuration (dask-cuda's plugins do the same).

Why a plugin with a comm handler and not one Dask actor per shard: measured on
a 2-core machine (``pipelines/bench_distributed.py``, "transport" rows), a handler round trip costs
~0.3 ms against ~1 ms for an actor method call, and 17 MB of windows arrive
~2.4x faster, because actor calls go through extra task-state machinery.
"""

from __future__ import annotations

import asyncio
import logging
import math
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import TYPE_CHECKING, Any

import dask
from distributed.diagnostics.plugin import WorkerPlugin
from distributed.protocol import to_serialize
from tornado.ioloop import PeriodicCallback

from .. import backend
from ..config import get as config_get
from ..errors import GearFlowError, ProtocolError
from ..storage import staging
from . import host_moves, protocol, wire
from .host import OPS, ShardHost
from .host_sampling import release
from .host_transactions import SampleHolds
from .lane import LaneServer
from .openmp import short_spin
from .operations import ALWAYS, EPOCH_ARGUMENT, WORKER_OPS

if TYPE_CHECKING:
    from distributed import Worker

logger = logging.getLogger(__name__)

PLUGIN_NAME = "gear-flow"

#: how often an operation the event loop holds back (a move seals its table) looks again, in seconds
GATE_POLL_S = 0.005
#: seconds between sweeps of the staging segments a worker keeps mapped (a departed client's are let go of)
STAGING_SWEEP_S = 5.0


#: operations that run on the event loop when small and their shards' locks are free: a hop to the thread
#: pool and back costs ~0.2 ms on a 2-core host, more than the operation (a draw, a few sum-tree updates)
QUICK_ITEMS = 1 << 16
#: most window steps a ``sample_part`` may gather on the event loop (geometry-only parts gather nothing)
QUICK_STEPS = 4096
#: most bytes of episodes a ``write``, ``stage`` or ``apply`` may copy on the event loop (an actor's few
#: steps: the shard's bookkeeping costs more than the copy, and the hop to the pool more than both)
QUICK_BYTES = 1 << 18
#: most items a weighted remover may pick on the event loop (it draws them one at a time)
QUICK_PICKS = 64


def reply_room(worker: Worker) -> float:
    """The bytes a sample's reply may still take in ``worker``'s process: half of what it may grow by before
    its nanny terminates it (``distributed.worker.memory.terminate`` of its memory limit), for the batch and
    its copy on the wire; no bound without a memory limit.

    A batch past that had the nanny kill the worker, and the shards it held were lost; refused before the
    draw (:class:`~gear_flow.distributed.host_sampling.HostSampler`), the table goes on.

    Parameters
    ----------
    worker : distributed.Worker
        The worker.

    Returns
    -------
    float
        Bytes (``inf``: no memory limit).
    """
    limit = worker.memory_manager.memory_limit
    if not limit:
        return math.inf
    terminate = dask.config.get("distributed.worker.memory.terminate") or 1.0
    return max(float(limit) * float(terminate) - worker.monitor.get_process_memory(), 0.0) / 2


def _quick(op: str, args: dict[str, Any], host: ShardHost | None = None) -> bool:
    """Whether ``op`` with ``args`` is small enough to run on the event loop (it never waits for a lock there)."""
    try:
        return _small(op, args, host)
    except (TypeError, ValueError, AttributeError, KeyError):
        return False


def _small(op: str, args: dict[str, Any], host: ShardHost | None) -> bool:
    small = _SMALL.get(op)
    return small is not None and small(args, host)


def _always(args: dict[str, Any], host: ShardHost | None) -> bool:
    return True


def _few_windows(args: dict[str, Any], host: ShardHost | None) -> bool:
    return args.get("out") is None and int(args["n"]) * int(args.get("length") or 1) <= QUICK_STEPS


def _few_draws(args: dict[str, Any], host: ShardHost | None) -> bool:
    return int(args["n"]) <= QUICK_STEPS


def _small_part(args: dict[str, Any], host: ShardHost | None) -> bool:
    if args.get("out") is not None:
        return False  # a co-located caller's gather: the pool
    if args.get("geometry"):
        return True
    part = args.get("counts") or args.get("slots") or {}
    rows = sum(int(v) if args.get("counts") else len(v) for v in part.values())
    return rows * int(args.get("length") or 1) <= QUICK_STEPS


def _few_keys(args: dict[str, Any], host: ShardHost | None) -> bool:
    seqs = args.get("seqs_by_shard") or {}
    return sum(len(v) for v in seqs.values()) <= QUICK_ITEMS


def _few_removals(args: dict[str, Any], host: ShardHost | None) -> bool:
    if args.get("slots") is not None:
        return sum(len(v) for v in args["slots"].values()) <= QUICK_ITEMS
    return sum(int(v) for v in (args.get("counts") or {}).values()) <= QUICK_PICKS


def _few_bytes(args: dict[str, Any], host: ShardHost | None) -> bool:
    parts = args["parts"]  # episodes in a staging segment are counted when applied
    return all(p.get("staged") is None for p in parts) and wire.array_bytes(parts) <= QUICK_BYTES


def _few_staged(args: dict[str, Any], host: ShardHost | None) -> bool:
    if host is None:
        return False
    t = host.tables.get(args["name"])
    batches = None if t is None else t.staged.get(args["txn"])
    return batches is not None and sum(wire.array_bytes(b.chunks) for _, b in batches) <= QUICK_BYTES


#: the predicates a :attr:`~gear_flow.distributed.operations.WorkerOp.quick` names
_PREDICATES = {
    ALWAYS: _always,
    "few_windows": _few_windows,
    "few_draws": _few_draws,
    "small_part": _small_part,
    "few_keys": _few_keys,
    "few_removals": _few_removals,
    "few_bytes": _few_bytes,
    "few_staged": _few_staged,
}
#: operation -> whether its arguments are small enough for the event loop (operations absent: never)
_SMALL = {op.name: _PREDICATES[op.quick] for op in WORKER_OPS.values() if op.quick is not None}


class GearFlowWorker(WorkerPlugin):
    """Hosts gear_flow shards on a worker.

    Parameters
    ----------
    threads : int
        Threads that run shard operations (gathers release the GIL).
    tier : str, optional
        Default storage tier of shards created on this worker (``host``,
        ``pinned`` or ``device``); a table's own setting wins.

    Examples
    --------
    >>> client.register_plugin(GearFlowWorker())  # doctest: +SKIP
    """

    name = PLUGIN_NAME
    idempotent = True

    def __init__(self, threads: int = 2, tier: str | None = None):
        self.threads = threads
        self.tier = tier

    def setup(self, worker: Worker) -> None:
        """Create the worker's shard host and thread pool; register the ``gear_flow`` comm handler.

        Also removes shared-memory segments left on this machine by workers
        that died, and gives this process's OpenMP threads a short spin
        (:func:`~gear_flow.distributed.openmp.short_spin`).

        Parameters
        ----------
        worker : distributed.Worker
            The worker this plugin is set up on.

        Raises
        ------
        ValueError
            ``gear-flow.distributed.omp-spin-count`` is not an integer >= 0
            or null.
        """
        from ..storage.shared import sweep

        short_spin()  # before numba's first parallel gather loads OpenMP here
        self.worker = worker
        #: torn down (:meth:`teardown`): a request still running then fails for that, not for a bug
        self.closing = False
        self.host = ShardHost(room=partial(reply_room, worker))
        sweep()  # segments of workers that died on this machine (e.g. the one this worker replaces)
        self.executor = ThreadPoolExecutor(self.threads, thread_name_prefix="gear-flow")
        #: operations run on the event loop and in the thread pool
        self.ran = {"loop": 0, "pool": 0}
        self.lane = LaneServer(self.serve)  # listens once a same-machine handle asks (shared_layout)
        worker.handlers["gear_flow"] = self.handle
        # the staging segments of clients that left (closed, exited) are let go of, whoever inserts next
        pc = PeriodicCallback(staging.forget_unlinked, STAGING_SWEEP_S * 1000)
        worker.periodic_callbacks["gear-flow-staging"] = pc
        pc.start()

    def teardown(self, worker: Worker) -> None:
        """Stop the thread pool, unregister the handler, free every shard (shared segments included).

        Parameters
        ----------
        worker : distributed.Worker
            The worker this plugin was set up on.
        """
        self.closing = True
        pc = worker.periodic_callbacks.pop("gear-flow-staging", None)
        if pc is not None:
            pc.stop()
        self.lane.close()  # first: no lane request may reach the thread pool once it is shut down
        self.executor.shutdown(wait=False)
        worker.handlers.pop("gear_flow", None)
        self.host.close()  # shared-memory segments leave with the worker

    async def run(self, op: str, **kwargs: Any) -> Any:
        """Run a host operation (in-process callers use this too).

        Small operations (:func:`_quick`: draws, masses, small updates) on
        CPU tiers run right here on the event loop when every shard lock of
        their table can be taken without waiting; everything else, and those
        when a lock is held (a write or gather in progress), runs in the
        plugin's threads.  A delete of an item that a sample gathered here
        and has not finished waits for that finish (as a move's gate is
        waited for: it never fails for it).  No version or schema check:
        in-process callers are trusted.

        Parameters
        ----------
        op : str
            A key of :data:`OPS`.
        **kwargs
            The :class:`ShardHost` method's keyword arguments.

        Returns
        -------
        object
            What the method returned.

        Raises
        ------
        KeyError
            ``op`` is not an operation.
        GearFlowError
            The operation's own errors.
        """
        epoch = None if op in EPOCH_ARGUMENT else kwargs.pop("epoch", None)
        while True:
            try:
                return await self._gated(op, epoch, kwargs)
            except SampleHolds:  # a delete of an item a sample here hands out: after that sample's finish
                await asyncio.sleep(GATE_POLL_S)

    async def _gated(self, op: str, epoch: Any, kwargs: dict) -> Any:
        gated = self.host.gate_of(op, kwargs.get("name"), kwargs.get("txn"))
        if gated is None:
            return await self._run(op, kwargs)
        gate, joins = gated
        while not gate.enter(op, epoch, wait=False, joins=joins):  # a move holds the table: it waits, never fails
            await asyncio.sleep(GATE_POLL_S)
        try:
            return await self._run(op, kwargs)
        finally:
            gate.leave()

    async def _run(self, op: str, kwargs: dict) -> Any:
        if op == "move_in":
            return await self._move_in(**kwargs)
        fn = OPS[op]
        if _quick(op, kwargs, self.host):
            locks = self._try_locks(kwargs.get("name"))
            if locks is not None:
                self.ran["loop"] += 1
                try:
                    return fn(self.host, **kwargs)
                finally:
                    release(locks)
        self.ran["pool"] += 1
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, partial(fn, self.host, **kwargs))

    async def _lane(self) -> dict:
        """Where this worker's TCP lane listens (started on first ask), for a handle on another machine."""
        return {"tcp": await self.lane.start_tcp_beside(self.worker)}

    async def _move_in(self, name: str, config: dict, move: str, source: str, shards: list, lease: float) -> dict:
        """Pull ``shards`` of table ``name`` from worker ``source`` (which seals and snapshots them, for
        ``lease`` seconds unless a later step comes) and build them here aside
        (:func:`~gear_flow.distributed.host_moves.move_in`); worker to worker, never through the coordinator."""
        if source == self.worker.address:
            raise ProtocolError(f"worker {source}: 'move_in': the source is this worker")
        from ..storage.shared import machine_id

        host_moves.check_absent(self.host, name, shards, move)  # before the source is sealed for nothing
        resp = await self.worker.rpc(source).gear_flow(
            action="move_out",
            v=protocol.VERSION,
            # this machine's id: a disk shard moving on one machine is handed over in place, not copied
            **wire.encode(
                {"name": name, "shards": list(shards), "move": move, "lease": lease, "machine": machine_id()}
            ),
        )
        snapshot = wire.unwrap(resp)
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(
                self.executor, partial(host_moves.move_in, self.host, name, config, move, snapshot)
            )
        except BaseException:  # not built here: the source serves on (the coordinator thaws it too)
            try:
                await self.worker.rpc(source).gear_flow(
                    action="move_thaw", v=protocol.VERSION, **wire.encode({"name": name, "move": move})
                )
            except Exception as e:  # noqa: BLE001 - the coordinator's undo thaws it
                logger.info("move %s: source %s not thawed from here (%s)", move[:8], source, e)
            raise

    def _try_locks(self, name: Any) -> list | None:
        """Every shard lock of table ``name`` on this worker, taken without waiting; None if one is held
        (or the table is not here, or its shards are on a GPU tier): the operation then runs in the pool."""
        t = self.host.tables.get(name) if isinstance(name, str) else None
        if t is None or backend.tier_name(t.tier) not in ("host", "shared"):
            return None
        return t.try_locked()

    async def handle(
        self,
        comm: object | None = None,
        action: str | None = None,
        args: dict[str, Any] | None = None,
        v: int | None = None,
        packed: bytes | None = None,
        frames: Any = None,
    ) -> dict[str, Any]:
        """The comm handler: version, then schema, then the operation (errors are returned, never raised).

        Parameters
        ----------
        comm : distributed.comm.Comm, optional
            The connection (passed by Dask; unused).
        action : str, optional
            The operation, a key of :data:`OPS`.
        args : dict, optional
            Its keyword arguments, checked against
            :data:`gear_flow.distributed.protocol.WORKER`.
        v : int, optional
            The caller's protocol version; must equal
            :data:`gear_flow.distributed.protocol.VERSION`.
        packed : bytes, optional
            The arguments packed by :func:`gear_flow.distributed.wire.encode`
            (instead of ``args``).
        frames : list, optional
            The packed arguments' large arrays.

        Returns
        -------
        dict
            ``{"status": "OK", "packed": ..., "frames": ...}`` (see
            :func:`gear_flow.distributed.wire.ok`), or ``{"status": "error",
            "error": GearFlowError}`` (a version or schema mismatch, the
            operation's own error, or an unexpected exception wrapped in a
            GearFlowError), both serialized for the comm.
        """
        ok, value = await self.serve(action, args, v, packed, frames)
        return wire.ok(value) if ok else {"status": "error", "error": to_serialize(value)}

    async def serve(
        self, action: Any, args: Any, v: Any, packed: bytes | None = None, frames: Any = None
    ) -> tuple[bool, Any]:
        """Check and run one request, from the comm (:meth:`handle`) or the fast lane (:mod:`.lane`).

        Parameters
        ----------
        action : str
            The operation, a key of :data:`OPS`.
        args : dict or None
            Its keyword arguments (checked against
            :data:`gear_flow.distributed.protocol.WORKER`).
        v : int
            The caller's protocol version.
        packed : bytes, optional
            The arguments packed by :func:`gear_flow.distributed.wire.encode`
            (instead of ``args``).
        frames : list, optional
            The packed arguments' large arrays.

        Returns
        -------
        tuple
            ``(True, result)``, or ``(False, GearFlowError)`` for a version or
            schema mismatch, the operation's own error, or an unexpected
            exception (logged, wrapped).
        """
        try:
            protocol.check_version(v, f"worker {self.worker.address}")
            if packed is not None:
                if args is not None:
                    raise ProtocolError(f"worker {self.worker.address}: {action!r}: give 'args' or 'packed', not both")
                try:
                    args = wire.decode(packed, frames)
                except Exception as e:
                    raise ProtocolError(
                        f"worker {self.worker.address}: {action!r}: unreadable packed arguments "
                        f"({type(e).__name__}: {e})"
                    ) from None
            protocol.check(protocol.WORKER, action, args if args is not None else {}, f"worker {self.worker.address}")
            if action == "lane":  # where handles on other machines (or without shared memory) ask
                return True, await self._lane()
            result = await self.run(action, **(args or {}))
            if action == "shared_layout" and config_get("distributed.fast-lane"):  # where same-machine handles ask
                result = {**result, "lane": await self.lane.start()}
        except GearFlowError as e:  # returned, re-raised with its own type by the caller
            return False, e
        except Exception as e:  # a bug or a message the schema let through: answered, the worker survives
            if self.closing:  # torn down under the request (its thread pool shut down): not a bug, no traceback
                logger.info("gear_flow %r not served: the worker is closing (%s: %s)", action, type(e).__name__, e)
                return False, GearFlowError(f"worker operation {action!r}: the worker is closing ({e})")
            logger.exception("gear_flow %r failed", action)
            return False, GearFlowError(f"worker operation {action!r}: {type(e).__name__}: {e}")
        return True, result
