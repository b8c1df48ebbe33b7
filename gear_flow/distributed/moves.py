"""Moving whole shards between workers: the coordinator's side, for retiring workers, adaptive clusters and
``rebalance``.

:class:`ShardMoves` is handed the scheduler and the coordinator's tables; it
moves shards and decides where to.  A move (:meth:`ShardMoves.move`) is all or
nothing:

1. the destination pulls the shards from the source (``move_in``; the source
   seals its part of the table and snapshots them, the destination builds them
   aside);
2. the destination installs them at the next placement version
   (``move_commit``), the coordinator's placement names it at that version;
3. the source drops its copies (``move_release``): what it held back is refused
   as planned at the old placement, and its handles send it again.

A failure before the placement changed undoes the move: the destination
forgets its copy (``move_abort``), the source goes on (``move_thaw``), and the
shards stay where they were.  The workers' side, and why every request
carries its placement version, is :mod:`gear_flow.distributed.host_moves`.

Where shards go (:meth:`ShardMoves.destinations`): running workers that are
not leaving, that advertise the table's resource, and that have memory room
for them (the shards' rings at capacity, against ``memory_limit`` times
``distributed.worker.memory.pause``), fewest of the table's shards first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable
from typing import TYPE_CHECKING, Any

import dask.config

from .. import config
from ..errors import GearFlowError, SpecError, TableClosedError
from ..resources import has_resources
from .host_moves import seal_lease
from .recovery import WorkerCall, until_answered

if TYPE_CHECKING:
    from distributed import Scheduler
    from distributed.scheduler import WorkerState

    from .gate import TableGate

logger = logging.getLogger(__name__)

#: memory a shard keeps per item besides its columns (state, episode index, selector trees), in bytes; a
#: bound for the room a destination needs, not a measurement
ITEM_OVERHEAD = 64
#: seconds the step requests of a move (all but the copy itself) may take
STEP_S = 30.0
#: seconds a move waits for the table's inserts whose parts are not known yet (unsettled) to be settled
SETTLE_S = 10.0
#: times a retirement plans its moves again after one failed (e.g. its destination began to leave meanwhile)
EVACUATE_ROUNDS = 3


class DestinationLeaving(SpecError):
    """A move refused because its destination began to leave (a retirement of it) before the move installed:
    the shards stay where they were, and a retirement moving them plans again."""


def shard_bytes(g: TableGate) -> int:
    """Memory one shard of ``g`` may take on its worker: its rings full, with their per-item state.

    A ``disk`` shard's rings are files, whose pages the kernel reads in and
    evicts as sampled: only its per-item state counts.

    Parameters
    ----------
    g : TableGate
        The table.

    Returns
    -------
    int
        Bytes.
    """
    step = 0 if g.config.get("tier") == "disk" else int(g.spec.step_nbytes)
    return int(g.spec.capacity) * (step + ITEM_OVERHEAD)


class ShardMoves:
    """Moves whole shards of the coordinator's tables between workers, all or nothing.

    Parameters
    ----------
    scheduler : distributed.Scheduler
        The scheduler (its workers, and connections to them).
    tables : dict of str to TableGate
        The coordinator's tables, by name (read; a move changes a table's
        placement through :meth:`TableGate.moved`).
    spawn : callable
        Runs a coroutine in the background (the coordinator's tasks): a
        move's last step sent again after it failed.
    call : callable
        ``await call(addr, action, timeout, **args)``: a request to worker
        ``addr``'s ``gear_flow`` handler, its result (a worker's error
        raised), within ``timeout`` seconds; the coordinator's, as
        :class:`~gear_flow.distributed.recovery.Recovery` is handed it.
    """

    def __init__(
        self,
        scheduler: Scheduler,
        tables: dict[str, TableGate],
        spawn: Callable[[Coroutine], None],
        call: WorkerCall,
    ) -> None:
        self.scheduler = scheduler
        self.tables = tables
        self._spawn = spawn
        self._call = call
        self._locks: dict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        #: the steps of earlier moves being sent again (:meth:`_again`), by table: ``(worker, ended)``
        self._resending: dict[str, list[tuple[str, asyncio.Future]]] = {}
        #: workers a retirement in progress is taking away (a count per retirement naming them): no move may
        #: bring shards there, and a move in flight to one is undone before it installs (:meth:`leaving`)
        self._leaving: dict[str, int] = defaultdict(int)

    # -- where ------------------------------------------------------------------------------------------
    def held_by(self, addr: str) -> dict[str, list[int]]:
        """The live shards worker ``addr`` holds, by table.

        Parameters
        ----------
        addr : str
            A worker's address.

        Returns
        -------
        dict of str to list of int
            Table name -> its shards there (tables with none left out).
        """
        out = {}
        for name, g in self.tables.items():  # (a table closed but not dropped keeps its shards: they count)
            mine = sorted(s for s, a in g.placement.items() if a == addr and s not in g.lost)
            if mine:
                out[name] = mine
        return out

    def _eligible(self, g: TableGate, ws: WorkerState) -> bool:
        need = g.config.get("resources")
        return need is None or has_resources(ws.resources, need)

    def _running(self, leaving: Iterable[str] = ()) -> list[WorkerState]:
        """The running workers, but those in ``leaving`` and those a retirement is taking away (where shards
        may go)."""
        leaving = set(leaving) | set(self._leaving)  # (a retirement's entry goes when it ends)
        return [
            ws for a, ws in self.scheduler.workers.items()
            if a not in leaving and getattr(ws.status, "name", "") == "running"
        ]  # fmt: skip

    def _room(self, ws: WorkerState, planned: int) -> float:
        """Bytes ``ws`` may still take (inf: no memory limit)."""
        limit = ws.memory_limit or 0
        if not limit:
            return float("inf")
        pause = dask.config.get("distributed.worker.memory.pause", 0.8) or 1.0
        return float(limit) * float(pause) - float(ws.memory.process) - planned

    def destinations(
        self, leaving: Iterable[str], planned: dict[str, int] | None = None
    ) -> tuple[dict[str, list[tuple[str, list[int]]]], dict[str, str]]:
        """Where the shards of the workers ``leaving`` would go.

        Parameters
        ----------
        leaving : iterable of str
            Addresses of the workers whose shards move (none of them is a
            destination).
        planned : dict, optional
            Bytes already promised to each destination (changed in place).

        Returns
        -------
        plan : dict
            ``{source: [(table, [(shard, destination), ...]), ...]}`` for
            the sources whose every shard has somewhere to go.
        refused : dict of str to str
            Per source that cannot leave, a line naming the table and the
            shard that has nowhere to go (that source is not in ``plan``).
        """
        leaving = set(leaving)
        planned = {} if planned is None else planned
        workers = self._running(leaving)
        plan: dict[str, list] = {}
        refused: dict[str, str] = {}
        for src in sorted(leaving):
            mine = []
            trial = dict(planned)
            counts = {name: self._counts(g, leaving) for name, g in self.tables.items()}
            why = None
            for name, shards in sorted(self.held_by(src).items()):
                g = self.tables[name]
                if g.closed:  # its data is kept where it is, and a move would open it at the destination
                    why = (
                        f"table {name!r} is closed but not dropped: its shards {shards} on {src} stay there "
                        "(drop it, attaching and closing a handle, to let the worker go)"
                    )
                    break
                need = shard_bytes(g)
                moves = []
                for s in shards:
                    fit = [
                        ws
                        for ws in workers
                        if self._eligible(g, ws) and self._room(ws, trial.get(ws.address, 0)) >= need
                    ]
                    if not fit:
                        why = self._why(g, s, src, workers, need, trial)
                        break
                    ws = min(fit, key=lambda w: (counts[name].get(w.address, 0), w.address))
                    counts[name][ws.address] = counts[name].get(ws.address, 0) + 1
                    trial[ws.address] = trial.get(ws.address, 0) + need
                    moves.append((s, ws.address))
                if why is not None:
                    break
                mine.append((name, moves))
            if why is not None:
                refused[src] = why
                continue
            planned.update(trial)
            plan[src] = mine
        return plan, refused

    def destination(self, g: TableGate, shards: list[int]) -> str:
        """The worker ``shards`` of ``g`` would go to together: one with the table's resource and room for
        them all, holding the fewest of the table's shards.

        Parameters
        ----------
        g : TableGate
            The table.
        shards : list of int
            Its shards (on one worker).

        Returns
        -------
        str
            The worker's address.

        Raises
        ------
        SpecError
            No worker can take them (the message says why).
        """
        srcs = {g.placement.get(s) for s in shards}
        need = shard_bytes(g) * len(shards)
        workers = self._running(srcs)
        fit = [ws for ws in workers if self._eligible(g, ws) and self._room(ws, 0) >= need]
        if not fit:
            raise SpecError(self._why(g, min(shards), ", ".join(sorted(map(str, srcs))), workers, need, {}))
        counts = self._counts(g, set())
        return min(fit, key=lambda w: (counts.get(w.address, 0), w.address)).address

    @staticmethod
    def _counts(g: TableGate, leaving: set[str]) -> dict[str, int]:
        counts: dict[str, int] = defaultdict(int)
        for s, a in g.placement.items():
            if a not in leaving and s not in g.lost:
                counts[a] += 1
        return counts

    def _why(self, g: TableGate, shard: int, src: str, workers: list, need: int, trial: dict) -> str:
        with_resource = [ws for ws in workers if self._eligible(g, ws)]
        if not workers:
            cause = "no running worker stays"
        elif not with_resource:
            cause = f"no other running worker has the table's resource {g.config.get('resources')!r}"
        else:
            best = max(self._room(ws, trial.get(ws.address, 0)) for ws in with_resource)
            cause = (
                f"no other worker has memory room for it (it needs {need / 2**20:.1f} MiB, the roomiest "
                f"has {max(best, 0) / 2**20:.1f} MiB)"
            )
        return f"table {g.name!r}: shard {shard} on worker {src} cannot move: {cause}"

    # -- moving -----------------------------------------------------------------------------------------
    async def ready(self, addr: str) -> bool:
        """Does worker ``addr`` serve gear_flow requests (its plugin set up)?

        Parameters
        ----------
        addr : str
            The worker's address.

        Returns
        -------
        bool
            True once its ``gear_flow`` handler answers, even with an error.
        """
        try:
            await self._call(addr, "move_thaw", STEP_S, name="-", move="-")  # a no-op: no such table there
            return True
        except GearFlowError:
            return True
        except Exception:  # noqa: BLE001 - no handler yet (or the worker is going): not ready
            return False

    async def move(self, g: TableGate, shards: Iterable[int], dest: str) -> int:
        """Move ``shards`` of table ``g`` (all on one worker) to worker ``dest``, all or nothing.

        Parameters
        ----------
        g : TableGate
            The table.
        shards : iterable of int
            Its shards that move; all on the same live worker.
        dest : str
            The worker they go to.

        Returns
        -------
        int
            The table's placement version with the shards at ``dest``.

        Raises
        ------
        SpecError
            A shard is lost, unknown, or not with the others; ``dest`` is
            not a live worker or is the source; or the move failed (the
            message says why): the shards are where they were.
        TableClosedError
            The table is closed (its shards stay where they are: a table closed
            elsewhere would open again at the destination).
        """
        shards = sorted({int(s) for s in shards})
        async with self._locks[g.name]:
            if g.closed:
                raise TableClosedError(f"table {g.name!r} is closed; not moved")
            for s in shards:
                if s not in g.placement or s in g.lost:
                    raise SpecError(f"table {g.name!r}: shard {s} is not a live shard; not moved")
            sources = {g.placement[s] for s in shards}
            if len(sources) != 1:
                raise SpecError(
                    f"table {g.name!r}: shards {shards} are on {sorted(sources)}; move them one worker at a time"
                )
            (src,) = sources
            if dest == src:
                return g.version
            if dest not in self.scheduler.workers:
                raise SpecError(f"table {g.name!r}: {dest!r} is not a worker of this cluster; not moved")
            if self._leaving.get(dest):
                raise DestinationLeaving(f"table {g.name!r}: {dest} is being retired; not moved")
            await self._resent(g.name, {src, dest})
            await self._settled(g, shards)
            move = uuid.uuid4().hex
            timeout = float(config.get("distributed.move-timeout"))
            lease = seal_lease()  # this scheduler's, sent: the source must not time its seal by its own config
            begun = asyncio.get_running_loop().time()
            try:
                await self._call(
                    dest, "move_in", timeout, name=g.name, config=g.config, move=move, source=src, shards=shards,
                    lease=lease,
                )  # fmt: skip
                if asyncio.get_running_loop().time() - begun > lease - 2 * STEP_S:
                    raise TimeoutError("the source's seal is about to end")  # it would serve on beside the copy
                if self._leaving.get(dest):  # a retirement of the destination began while the copy was made
                    raise DestinationLeaving(f"{dest} is being retired")
                epoch = g.version + 1
                await self._call(dest, "move_commit", STEP_S, name=g.name, move=move, epoch=epoch)
            except BaseException as e:
                await self._undo(g, move, src, dest, begun + lease)
                if isinstance(e, asyncio.CancelledError):
                    raise
                raise (DestinationLeaving if isinstance(e, DestinationLeaving) else SpecError)(
                    f"table {g.name!r}: shard(s) {shards} not moved from {src} to {dest} "
                    f"({type(e).__name__}: {e}); they stay on {src}"
                ) from None
            if dest not in self.scheduler.workers or src not in self.scheduler.workers:
                await self._undo(g, move, src, dest, begun + lease, epoch)  # one left meanwhile: as if it never began
                raise SpecError(f"table {g.name!r}: a worker left while shard(s) {shards} moved; not moved")
            version = g.moved(shards, dest, epoch)
            if version != epoch:  # the placement changed meanwhile too: the destination takes the later version
                await self._best_effort(dest, "move_commit", name=g.name, move=move, epoch=version)
            release = {"name": g.name, "shards": shards, "move": move, "epoch": version}
            if not await self._best_effort(src, "move_release", **release):
                self._again(src, "move_release", begun + lease, release)
            g.arrived()  # a sample waiting for items may find them now
            logger.info("table %r: shard(s) %s moved from %s to %s", g.name, shards, src, dest)
            return version

    async def _settled(self, g: TableGate, shards: list[int]) -> None:
        """Wait until no committed insert with a part on ``shards`` is still being settled (the coordinator
        asks the worker that holds them): a move meanwhile would leave it asking the wrong worker."""
        deadline = asyncio.get_running_loop().time() + SETTLE_S
        while any(s in shards for parts in g.unsettled.values() for s in parts):
            if asyncio.get_running_loop().time() > deadline:
                raise SpecError(f"table {g.name!r}: inserts on shard(s) {shards} are still being settled; not moved")
            await asyncio.sleep(0.05)

    async def _undo(self, g: TableGate, move: str, src: str, dest: str, ends: float, epoch: int | None = None) -> None:
        if not await self._best_effort(dest, "move_abort", name=g.name, move=move):
            self._again(dest, "move_abort", ends, {"name": g.name, "move": move})
        if not await self._best_effort(src, "move_thaw", name=g.name, move=move):
            self._again(src, "move_thaw", ends, {"name": g.name, "move": move})
        if epoch is not None:  # the destination took that version: no handle may stay below it
            g.passed(epoch)

    def _again(self, addr: str, action: str, ends: float, args: dict) -> None:
        """A move's step to ``addr`` that failed (``move_release``, ``move_thaw``, ``move_abort``), sent
        again in the background while ``addr`` is a worker (one that left took what it held with it).

        Until its release or thaw, a source keeps its whole part of the table sealed (every operation
        there waits) and, after a release failed, a copy of shards it no longer owns, until its seal's
        lease ends, ``distributed.move-timeout`` plus two minutes after it began: then that copy would
        serve requests planned at the old placement beside the real one.  So the step is sent again
        until it is answered or until one step's timeout before that lease ends.
        """
        if addr not in self.scheduler.workers:
            return
        deadline = ends - STEP_S  # (``ends``: the move began plus its lease; the source sealed later, so ends later)
        ended = asyncio.get_running_loop().create_future()
        self._resending.setdefault(args["name"], []).append((addr, ended))
        self._spawn(self._until_answered(addr, action, deadline, args, ended))

    async def _until_answered(self, addr: str, action: str, deadline: float, args: dict, ended: asyncio.Future) -> None:
        loop = asyncio.get_running_loop()

        def delays():  # doubling from 0.2 s to 5 s, until the deadline
            delay = 0.2
            while loop.time() < deadline:
                yield delay
                delay = min(2 * delay, 5.0)

        try:
            await asyncio.sleep(0.1)  # (the first attempt, the move's own, has just failed)
            answered = await until_answered(
                lambda: self._call(addr, action, STEP_S, **args),
                lambda: addr in self.scheduler.workers,
                f"table {args['name']!r}: {action} on {addr}",
                delays(),
            )
            if answered:
                logger.info("table %r: %s on %s answered when sent again", args["name"], action, addr)
            elif answered is False:
                logger.warning("table %r: worker %s never answered %s of move %s; its seal's lease ends it",
                               args["name"], addr, action, args["move"])  # fmt: skip
        finally:
            ended.set_result(None)
            pending = self._resending[args["name"]]
            pending.remove((addr, ended))
            if not pending:
                del self._resending[args["name"]]

    async def _resent(self, name: str, addrs: set[str]) -> None:
        """Wait, one step's timeout at most, for the steps of the table's earlier moves still being sent again
        to ``addrs``: until its release or thaw is answered, a source holds its part of the table sealed, and a
        move now (the next one of a ``rebalance``) would be refused as one that began there already."""
        waiting = [ended for a, ended in self._resending.get(name, ()) if a in addrs]
        if waiting:
            await asyncio.wait(waiting, timeout=STEP_S)

    async def _best_effort(self, addr: str, action: str, **args: Any) -> bool:
        if addr not in self.scheduler.workers:
            return False
        try:
            await self._call(addr, action, STEP_S, **args)
            return True
        except Exception as e:  # noqa: BLE001 - the worker is gone or going: what it held goes with it
            logger.info("%s on %s: %s: %s", action, addr, type(e).__name__, e)
            return False

    @contextlib.asynccontextmanager
    async def leaving(self, addrs: Iterable[str]) -> AsyncIterator[None]:
        """Mark the workers ``addrs`` as leaving for the block (a retirement), and enter it once every move
        in flight has ended: no move brings shards to them from the mark on (one in flight to them is undone
        before it installs), and what a move that did install brought them is in the placement, where
        :meth:`held_by` sees it.

        Parameters
        ----------
        addrs : iterable of str
            Addresses of the leaving workers.
        """
        addrs = sorted(set(addrs))
        for a in addrs:
            self._leaving[a] += 1
        try:
            for lock in list(self._locks.values()):  # moves in flight end (and those after refuse these workers)
                async with lock:
                    pass
            yield
        finally:
            for a in addrs:
                self._leaving[a] -= 1
                if self._leaving[a] <= 0:
                    del self._leaving[a]

    async def evacuate(self, addrs: Iterable[str]) -> tuple[set[str], list[str]]:
        """Move every shard off the workers ``addrs`` (they are leaving).

        Parameters
        ----------
        addrs : iterable of str
            Addresses of the leaving workers.

        Returns
        -------
        left : set of str
            Those whose shards all moved (or that held none): they may go.
        refused : list of str
            Why the others may not (a line per worker: the table and shard
            with nowhere to go, or the move that failed).
        """
        addrs = {a for a in addrs if a in self.scheduler.workers}
        why: dict[str, str] = {}
        done: set[str] = set()  # sources given up on (a move of theirs failed, not for a leaving destination)
        for _ in range(EVACUATE_ROUNDS):  # again when a move's destination began to leave meanwhile
            if not any(self.held_by(a) for a in addrs - done):
                break
            plan, refused = self.destinations(addrs - done)
            why.update(refused)
            failed = False
            for src, tables in plan.items():
                try:
                    for name, moves in tables:
                        g = self.tables[name]
                        by_dest = defaultdict(list)
                        for s, d in moves:
                            by_dest[d].append(s)
                        for d, ss in sorted(by_dest.items()):
                            await self.move(g, ss, d)
                except GearFlowError as e:
                    why[src] = f"worker {src} stays: {e}"
                    if isinstance(e, DestinationLeaving):  # planned again, elsewhere
                        failed = True
                    else:  # that worker stays, as one move failing has always meant
                        done.add(src)
            if not failed:
                break
        ok = {a for a in addrs if not self.held_by(a)}
        refused = [
            why.get(a, f"worker {a} stays: its shards {self.held_by(a)} did not all move") for a in sorted(addrs - ok)
        ]
        staying = [a for a, ws in self.scheduler.workers.items() if a not in addrs]
        for line in refused:  # (the whole cluster closing keeps its shards to the end: nothing to warn about)
            logger.log(logging.WARNING if staying else logging.INFO, "not retired: %s", line)
        return ok, refused

    async def rebalance(self, g: TableGate) -> list[dict]:
        """Move whole shards of ``g`` from its most loaded workers to its least loaded ones (workers with
        the table's resource and room, those without shards included) until their counts differ by at most
        one.

        Parameters
        ----------
        g : TableGate
            The table.

        Returns
        -------
        list of dict
            The moves made, in order: ``{"shard", "source", "destination"}``.
        """
        done = []
        for _ in range(len(g.placement)):
            pool = [ws.address for ws in self._running() if self._eligible(g, ws)]
            counts = {a: 0 for a in pool}
            for s, a in g.placement.items():
                if s not in g.lost and a in counts:
                    counts[a] += 1
            if len(counts) < 2:
                break
            src = max(counts, key=lambda a: (counts[a], a))
            room = {a: self._room(self.scheduler.workers[a], 0) for a in counts}
            fit = [a for a in counts if a != src and room[a] >= shard_bytes(g)]
            if not fit:
                break
            dest = min(fit, key=lambda a: (counts[a], a))
            if counts[src] - counts[dest] <= 1:
                break
            shard = max(s for s, a in g.placement.items() if a == src and s not in g.lost)
            await self.move(g, [shard], dest)
            done.append({"shard": shard, "source": src, "destination": dest})
        return done
