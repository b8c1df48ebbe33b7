"""Scheduler plugin: the one place that holds a distributed table's global state.

Every client and every worker can reach the scheduler, so the coordinator
lives there: per table a :class:`~gear_flow.distributed.gate.TableGate`
(configuration, placement, the global rate limiter with first-come
first-served waiters, insert transactions, ids and stamps, lost shards).  Data
never passes through it: callers ask it for admission, then talk to the shard
workers directly.

It also watches the cluster: a worker the scheduler removes has its shards
marked lost at once (handles learn it from the version in their next reply);
a client or worker that goes away has its waiting requests dropped, its
exclusive sample released and its unfinished inserts recovered (committed if
any worker applied them, aborted everywhere otherwise), so a killed process
leaves nothing behind (:mod:`.recovery`, a part the coordinator builds).
"""

from __future__ import annotations

import asyncio
import logging
from functools import partial
from typing import TYPE_CHECKING, Any

from distributed.diagnostics.plugin import SchedulerPlugin
from distributed.protocol import to_serialize

from .. import config
from ..errors import GearFlowError, ProtocolError, RateLimitTimeout, SpecError
from ..storage.shared import machine_id
from . import gate_checks, protocol, wire
from .gate import OwnerGone, TableGate, Withdrawn
from .lane import LaneServer
from .moves import ShardMoves
from .operations import COORDINATOR_OPS
from .recovery import Recovery

if TYPE_CHECKING:
    from distributed import Scheduler

logger = logging.getLogger(__name__)

COORDINATOR_NAME = "gear-flow-coordinator"
#: operations that need no table (their ``name`` is ignored): the ``table`` claims of :mod:`.operations`
NO_TABLE = frozenset(op.name for op in COORDINATOR_OPS.values() if not op.table)
#: operations a handle sends over the coordinator's lane once it has one: all but ``lane`` (how it finds it),
#: ``move`` and ``rebalance`` (the ``lane`` claims of :mod:`.operations`)
COORD_LANE_OPS = frozenset(op.name for op in COORDINATOR_OPS.values() if op.lane)
#: times the coordinator looks whether a joining worker serves gear_flow requests yet (backing off to 1 s)
JOIN_ATTEMPTS = 40
#: seconds the recovery's requests to a worker (an insert's settle or abort) may take
RECOVERY_CALL_S = 30.0


def admission_wait(timeout: float | None) -> float | None:
    """Seconds an admission asked for with ``timeout`` waits: the request's own, else
    ``distributed.admission-timeout`` (no waiter without an end: a client that never comes back must not pin
    it), None only when that is null (for ever).

    Parameters
    ----------
    timeout : float or None
        The request's timeout.

    Returns
    -------
    float or None
        Seconds.
    """
    return config.get("distributed.admission-timeout") if timeout is None else timeout


class GearFlowCoordinator(SchedulerPlugin):
    """Registers the ``gear_flow_coord`` handler on the scheduler.

    Holds one :class:`~gear_flow.distributed.gate.TableGate` per table, by
    name, and releases what departed clients and workers held.  Requests are
    checked against :data:`gear_flow.distributed.protocol.COORDINATOR`;
    errors are answered, never raised into the scheduler.

    Attributes
    ----------
    tables : dict of str to TableGate
        The registered tables, by name (set up in :meth:`start`).
    recovery : Recovery
        Releases departed owners and settles what they left in flight (set
        up in :meth:`start`).

    Examples
    --------
    >>> client.register_plugin(GearFlowCoordinator())  # doctest: +SKIP
    """

    name = COORDINATOR_NAME
    idempotent = True

    async def start(self, scheduler: Scheduler) -> None:
        """Start with an empty table registry and add the ``gear_flow_coord`` handler.

        Parameters
        ----------
        scheduler : distributed.Scheduler
            The scheduler this plugin runs on.
        """
        self.scheduler = scheduler
        self.tables: dict[str, TableGate] = {}
        self._tasks: set = set()
        #: the coordinator's own lane (listens once a handle asks, ``lane``)
        self.lane = LaneServer(self.serve, COORD_LANE_OPS)
        #: moves shards off retiring workers, onto joining ones, and between workers on request
        self.moves = ShardMoves(scheduler, self.tables, self._spawn, self._worker_call)
        #: finishes what departed owners left in flight, and the parts workers left unanswered; handed what it
        #: works with (the tables, the scheduler's calls to workers, background tasks, liveness), not this plugin
        self.recovery = Recovery(
            self.tables,
            partial(self._worker_call, timeout=RECOVERY_CALL_S),
            self._spawn,
            lambda addr: addr in scheduler.workers,
        )
        self._refusals_logged: set[str] = set()
        scheduler.handlers["gear_flow_coord"] = self.handle
        # every graceful departure (Client.retire_workers, Adaptive, SpecCluster.scale, Worker.close_gracefully)
        # reaches the scheduler's retire_workers handler: shards move off the workers before they go
        retire = self._retire_workers
        scheduler.handlers["retire_workers"] = retire
        scheduler.retire_workers = retire  # (in-process callers of the method)

    async def _retire_workers(
        self, workers: list | None = None, *, names: list | None = None, **kw: Any
    ) -> dict[str, Any]:
        """:meth:`distributed.Scheduler.retire_workers`, after moving the shards off the workers it retires;
        a worker whose shards cannot all move is not retired (the log and the ``gear-flow`` event say which
        table's shard, and why).

        Parameters
        ----------
        workers : list of str, optional
            Addresses to retire (a worker's name is taken too, as
            :class:`~distributed.SpecCluster` passes them).
        names : list, optional
            Names of workers to retire.
        **kw
            ``close_workers``, ``remove``, ``stimulus_id``, and with neither
            ``workers`` nor ``names``, the arguments of
            :meth:`~distributed.Scheduler.workers_to_close`.

        Returns
        -------
        dict
            What the scheduler's ``retire_workers`` returns for the workers
            it retired.
        """
        sched = self.scheduler
        original = type(sched).retire_workers.__get__(sched)
        choose = {k: kw.pop(k) for k in list(kw) if k not in ("close_workers", "remove", "stimulus_id")}
        if names is not None and workers is not None:
            raise TypeError("names and workers are mutually exclusive")
        if names is not None:
            wanted = {str(n) for n in names}
            addrs = [a for a, ws in sched.workers.items() if str(ws.name) in wanted]
        elif workers is not None:
            by_name = {str(ws.name): a for a, ws in sched.workers.items()}
            addrs = [w if w in sched.workers else by_name.get(str(w)) for w in workers]
            addrs = [a for a in addrs if a is not None]
        else:
            choose.pop("attribute", None)
            addrs = list(sched.workers_to_close(**choose))
        # from here until the scheduler has retired them, no move brings shards to these workers, and a move
        # in flight to one ends first: its shard is then in the placement and moves off with the others
        async with self.moves.leaving(addrs):
            holders = [a for a in addrs if self.moves.held_by(a)]
            if holders:  # every worker of this retirement leaves: none of them may take a leaving holder's shards
                left, refused = await self.moves.evacuate(addrs)
                for line in refused:
                    sched.log_event("gear-flow", {"action": "retirement-refused", "detail": line})
                addrs = [a for a in addrs if a not in holders or a in left]
            if not addrs:
                return {}
            return await original(workers=addrs, **kw)

    def valid_workers_downscaling(self, scheduler: Scheduler, workers: list) -> list:
        """The workers an adaptive policy may retire: with ``distributed.scale-down: keep`` (the default),
        none that holds a live shard; with ``move``, those whose shards have somewhere to go.

        Parameters
        ----------
        scheduler : distributed.Scheduler
            The scheduler.
        workers : list of distributed.scheduler.WorkerState
            The candidates.

        Returns
        -------
        list of distributed.scheduler.WorkerState
            Those that may go.
        """
        policy = config.get("distributed.scale-down")
        if policy not in ("keep", "move"):
            logger.warning("gear-flow.distributed.scale-down is %r (keep | move); keeping shard holders", policy)
            policy = "keep"
        out = []
        for ws in workers:
            if not self.moves.held_by(ws.address):
                out.append(ws)
                continue
            if policy == "keep":
                continue
            _, refused = self.moves.destinations([ws.address])
            if not refused:
                out.append(ws)
            for line in refused.values():
                if line not in self._refusals_logged:  # (asked every adaptive interval)
                    self._refusals_logged.add(line)
                    logger.warning("not retired: %s", line)
                    scheduler.log_event("gear-flow", {"action": "retirement-refused", "detail": line})
        return out

    def add_worker(self, scheduler: Scheduler, worker: str) -> None:
        """A worker joined: tables created with ``rebalance_on_join`` spread their shards onto it.

        Parameters
        ----------
        scheduler : distributed.Scheduler
            The scheduler.
        worker : str
            The new worker's address.
        """
        for g in list(self.tables.values()):
            if g.config.get("rebalance_on_join") and not g.closed:
                self._spawn(self._rebalance_on_join(g, worker))

    async def _rebalance_on_join(self, g: TableGate, worker: str) -> None:
        """Rebalance ``g`` once ``worker`` serves gear_flow requests (its plugin is set up after it joined)."""
        for attempt in range(JOIN_ATTEMPTS):
            if worker not in self.scheduler.workers or g.closed:
                return
            if await self.moves.ready(worker):
                try:
                    await self.moves.rebalance(g)
                except Exception as e:  # noqa: BLE001 - the shards stay where they are; the next join tries again
                    logger.warning("table %r: rebalance after %s joined failed: %s", g.name, worker, e)
                return
            await asyncio.sleep(min(0.05 * 2**attempt, 1.0))
        logger.warning("table %r: %s never served gear_flow requests; not rebalanced onto it", g.name, worker)

    async def close(self) -> None:
        """Stop the coordinator's lane (its socket and directory are removed)."""
        lane = getattr(self, "lane", None)
        if lane is not None:
            lane.close()

    async def handle(
        self,
        comm: object | None = None,
        action: str | None = None,
        name: str | None = None,
        v: int | None = None,
        **kw: Any,
    ) -> dict[str, Any]:
        """The ``gear_flow_coord`` comm handler: version, schema, then the operation.

        Parameters
        ----------
        comm : distributed.comm.Comm, optional
            The connection (passed by Dask; unused).
        action : str, optional
            The operation: ``register``, ``lookup``, ``admit_insert``,
            ``commit_insert``, ``abort_insert``, ``admit_sample``,
            ``admit_hold``, ``withdraw``, ``sample_finished``, ``count_samples``,
            ``stamps``, ``removed``, ``mark_lost``, ``worker_alive``,
            ``workers``, ``restore_state``, ``shard_restored``, ``move``,
            ``rebalance``, ``close``,
            ``drop``, ``list`` or ``lane``.
        name : str, optional
            The table (1 to 512 characters); ignored by ``list`` and ``lane``.
        v : int, optional
            The caller's protocol version; must equal
            :data:`gear_flow.distributed.protocol.VERSION`.
        **kw
            The operation's arguments, checked against its schema.

        Returns
        -------
        dict
            ``{"status": "OK", "result": ...}`` or ``{"status": "error",
            "error": GearFlowError}`` (a malformed request becomes a
            SpecError), serialized for the comm.
        """
        ok, value = await self._answer(action, name, v, kw)
        return wire.ok(value) if ok else {"status": "error", "error": to_serialize(value)}

    async def serve(self, action: Any, args: Any, v: Any) -> tuple[bool, Any]:
        """Answer one request from the coordinator's lane (the same checks and operations as :meth:`handle`).

        Parameters
        ----------
        action : str
            The operation (one of :data:`COORD_LANE_OPS`).
        args : dict
            ``name`` and the operation's arguments.
        v : int
            The caller's protocol version.

        Returns
        -------
        tuple
            ``(True, result)`` or ``(False, GearFlowError)``.
        """
        if not isinstance(args, dict):
            return False, ProtocolError(
                f"coordinator {action!r}: the arguments must be a dict, got {type(args).__name__}"
            )
        kw = dict(args)
        return await self._answer(action, kw.pop("name", None), v, kw)

    async def _answer(self, action: Any, name: Any, v: Any, kw: dict) -> tuple[bool, Any]:
        ops = {op.name: getattr(self, op.handler) for op in COORDINATOR_OPS.values()}
        try:
            protocol.check_version(v, "the scheduler's coordinator")
            protocol.check(protocol.COORDINATOR, action, kw, "coordinator")
            if action not in NO_TABLE and not (isinstance(name, str) and 0 < len(name) <= 512):
                raise ProtocolError(f"coordinator {action!r}: field 'name' must be a non-empty string, got {name!r}")
            return True, await ops[action](name, **kw)
        except GearFlowError as e:
            return False, e
        except Exception as e:  # a malformed request: answered, never raised into the scheduler
            return False, SpecError(f"coordinator {action!r}: {type(e).__name__}: {e}")

    def _table(self, name) -> TableGate:
        try:
            return self.tables[name]
        except (KeyError, TypeError):
            raise SpecError(f"no distributed table {name!r}; tables: {sorted(self.tables)}") from None

    # -- registry ---------------------------------------------------------------------------------
    async def _register(self, name, config, placement):
        if name in self.tables:  # a closed one's data stays on its workers until a close() drops it
            kept = (
                ", closed but not dropped (its data is kept on the workers: attach to it and close() it to drop it)"
                if self.tables[name].closed
                else ""
            )
            raise SpecError(f"a distributed table named {name!r} already exists{kept}")
        g = TableGate(name, config, placement)  # validates the configuration
        if sorted(g.placement) != list(range(g.spec.num_shards)):
            raise ProtocolError(
                f"coordinator 'register': placement names shards {sorted(g.placement)}, "
                f"the spec has shards 0..{g.spec.num_shards - 1}"
            )
        self.tables[name] = g
        return True

    async def _lookup(self, name):
        return self._table(name).public()

    async def _list(self, name=None):
        return sorted(self.tables)

    # -- admission ------------------------------------------------------------------------------------
    async def _wait(self, g: TableGate, w, timeout, what):
        timeout = admission_wait(timeout)
        try:
            if w.fut.done():  # admitted at once (the usual case): no timer, no task
                return w.fut.result()
            return await asyncio.wait_for(asyncio.shield(w.fut), timeout)
        except TimeoutError:
            if w.fut.done() and not w.fut.cancelled():  # granted as the time ran out: keep the grant
                return w.fut.result()
            g.withdraw(w)
            raise RateLimitTimeout(
                f"{what} on table {g.name!r} was not admitted by {g.limiter!r} within {round(timeout, 3):g} s "
                f"(size {g.size}, inserts {g.limiter.state.inserts}, samples {g.limiter.state.samples})"
            ) from None
        except OwnerGone:
            raise RateLimitTimeout(f"{what} on table {g.name!r}: its client went away") from None
        except Withdrawn:  # (the answer goes to nobody: its caller gave the call up)
            raise GearFlowError(f"{what} on table {g.name!r} was withdrawn by its caller") from None

    async def _admit_insert(
        self, name, n, episodes, per_shard=None, timeout=None, owner="", grouped=False, ticket=None
    ):
        g = self._table(name)
        # never admissible: refused at once, nothing queued
        gate_checks.check_insert(g, n, episodes, per_shard or {}, bool(grouped))
        w = g.request("insert", n, owner or "", ticket, episodes=episodes, per_shard=per_shard or {})
        return await self._wait(g, w, timeout, f"an insert of {n} items")

    async def _commit_insert(self, name, txn, items, evicted, unsettled=None, unreached=None):
        """Commit what was written; the parts of ``unsettled`` workers (they did not answer their apply in
        time) are settled here, in the background (:meth:`.Recovery.settle_parts`), and those of
        ``unreached`` ones (they refused to apply them, and did not answer their abort) aborted
        (:meth:`.Recovery.abort_parts`)."""
        g = self._table(name)
        gate_checks.check_commit(g, txn, items or {}, evicted or {}, unsettled or [])
        if g.commit_insert(txn, items or {}, evicted or {}, tuple(unsettled or ())):  # (a repeat: nothing sent)
            if txn in g.unsettled:
                self.recovery.settle_parts(g, txn, unsettled or ())
            self.recovery.abort_parts(g, txn, unreached)
        return g.size

    def _spawn(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _worker_call(self, addr, action, timeout, **args):
        # the scheduler's connection to a worker's gear_flow handler: what the recovery and the moves are handed
        resp = await asyncio.wait_for(
            self.scheduler.rpc(addr).gear_flow(action=action, v=protocol.VERSION, **wire.encode(args)), timeout
        )
        return wire.unwrap(resp)  # (its error with its own type and reason; the frames decoded here)

    async def _abort_insert(self, name, txn, unreached=None):
        """Give back an insert's admission; the parts on ``unreached`` workers (the client's abort did not
        reach them) are aborted here, in the background (:meth:`.Recovery.abort_parts`)."""
        g = self._table(name)
        aborted = g.abort_insert(txn)
        if aborted:  # only an insert in flight: nobody makes the coordinator send aborts of made-up txns
            self.recovery.abort_parts(g, txn, unreached)
        return aborted

    async def _admit_sample(
        self, name, n, timeout=None, done=0, lease=0, exclusive=False, owner="", after=None, ticket=None
    ):
        """Admit a sample of ``n``; ``done`` counts leased samples already served.

        With a MinSize limiter (no sample/insert ratio to keep) the caller may be
        granted a *lease* of up to ``lease`` further batches of ``n``, served
        without asking again while the lease lasts; their counts come back in
        ``done`` with the next request.  ``after``: the grant's ``arrivals`` of
        an attempt whose items left could not fill the batch; granted once
        something arrived since.
        """
        g = self._table(name)
        gate_checks.check_sample(g, n)
        w = g.request(
            "sample", n, owner or "", ticket, done=done or 0, lease=lease or 0, exclusive=bool(exclusive), after=after
        )
        what = f"a sample of {n}" if after is None else f"a sample of {n} (too few items left for it, and none since)"
        return await self._wait(g, w, timeout, what)

    async def _admit_hold(self, name, timeout=None, owner="", ticket=None):
        """Hold the table for an eviction (no other eviction, nor an exclusive sample, in progress); returns
        the size then."""
        g = self._table(name)
        return await self._wait(g, g.request("hold", 0, owner or "", ticket), timeout, "an eviction")

    async def _withdraw(self, name, ticket):
        """The caller of the admission with ``ticket`` gave it up before its answer reached it: taken out of
        its line, or its grant given back (:meth:`.TableGate.withdraw_ticket`)."""
        return self._table(name).withdraw_ticket(ticket)  # (an insert's caller never had the txn: no parts)

    async def _sample_finished(self, name, txn, rollback=0, expired=None):
        g = self._table(name)
        gate_checks.check_removal(g, sum(int(k) for k in (expired or {}).values()), expired or {})
        if rollback and rollback > g.limiter.state.samples:
            raise ProtocolError(f"coordinator 'sample_finished': rollback {rollback} exceeds the samples counted")
        if expired:  # before the hold is released: the next sample must not count expired items
            g.sample_expired(txn, expired)
        g.sample_finished(txn, rollback or 0)
        return True

    async def _count_samples(self, name, n):
        self._table(name).count_samples(n)  # the schema admits integers >= 0 only
        return True

    async def _stamps(self, name, n):
        """``n`` table-wide stamps (the insert clock) for priority updates: heap ties follow them across shards."""
        return self._table(name).take_stamps(n)

    async def _removed(self, name, k, per_shard=None):
        g = self._table(name)
        gate_checks.check_removal(g, k, per_shard or {})
        # deletes, evictions, or a queue's expiries whose sample then failed (its samples rolled back):
        # items that left unsampled (a finished sample's expiries come with sample_finished)
        g.removed(k, per_shard or {}, unsampled=True)
        return g.size

    # -- losses -------------------------------------------------------------------------------------------
    async def _mark_lost(self, name, shard, detail=""):
        g = self._table(name)
        if int(shard) not in g.placement:
            raise SpecError(f"table {name!r} has no shard {shard!r}")
        g.mark_lost(int(shard), detail)
        return g.lost

    async def _lane(self, name=None):
        """Where handles reach this coordinator without the comm: its Unix socket (for handles on this
        machine, ``machine``) and, on a plain TCP scheduler, a TCP socket on the host its comm listens on."""
        out = {"machine": machine_id(), "unix": None, "tcp": None}
        if not config.get("distributed.fast-lane"):
            return out
        try:
            out["unix"] = await self.lane.start()
        except OSError as e:
            logger.info("no Unix lane for the coordinator (%s); handles use the comm", e)
        out["tcp"] = await self.lane.start_tcp_beside(self.scheduler)
        return out

    async def _worker_alive(self, name, address):
        return address in self.scheduler.workers

    async def _workers(self, name=None):
        """Live workers and the resources they advertise."""
        return {a: dict(ws.resources or {}) for a, ws in self.scheduler.workers.items()}

    def remove_worker(
        self, scheduler: Scheduler, worker: str, *, stimulus_id: str | None = None, **kwargs: Any
    ) -> None:
        """Mark every shard on ``worker`` lost and release what the worker held as an owner.

        Parameters
        ----------
        scheduler : distributed.Scheduler
            The scheduler.
        worker : str
            Address of the removed worker.
        stimulus_id : str, optional
            Dask's id of the event that removed it (unused).
        **kwargs
            Other arguments Dask passes (unused).
        """
        self.recovery.worker_left(worker)

    def remove_client(self, scheduler: Scheduler, client: str) -> None:
        """Release what a departed client held: its waiting requests, exclusive sample and inserts.

        Parameters
        ----------
        scheduler : distributed.Scheduler
            The scheduler.
        client : str
            Id of the client that left.
        """
        self.recovery.release(client)

    # -- checkpoints, restores -------------------------------------------------------------------------------
    async def _restore_state(self, name, state):
        """Counters of a restored table (from its checkpoint)."""
        g = self._table(name)
        protocol.check(protocol.RESTORED_STATE, "state", state, "coordinator 'restore_state'")
        g.restore(state)
        return True

    async def _shard_restored(self, name, shard, worker, size, inserted):
        """A lost shard was rebuilt on ``worker`` from a checkpoint holding ``size`` items."""
        g = self._table(name)
        if int(shard) not in g.placement:
            raise ProtocolError(f"coordinator 'shard_restored': table {name!r} has no shard {shard}")
        if worker not in self.scheduler.workers:
            raise ProtocolError(f"coordinator 'shard_restored': {worker!r} is not a live worker")
        return g.shard_restored(int(shard), worker, int(size), int(inserted))

    # -- moves ----------------------------------------------------------------------------------------------
    async def _move(self, name, shards, worker=None):
        """Move ``shards`` (all on one worker) to ``worker``, or where a retirement of their worker would put
        them (:meth:`ShardMoves.destination`); the table's placement version after."""
        g = self._table(name)
        shards = sorted({int(s) for s in shards})
        if worker is None:
            worker = self.moves.destination(g, shards)
        return await self.moves.move(g, shards, worker)

    async def _rebalance(self, name):
        return await self.moves.rebalance(self._table(name))

    async def _close(self, name, created=None):
        g = self._table(name)
        if created is not None and created != g.created:
            raise SpecError(f"table {name!r} was dropped and created again since; this handle's table is gone")
        g.close()
        return True

    async def _drop(self, name, created=None):
        g = self.tables.get(name)
        if g is not None and (created is None or created == g.created):  # (another creation: left as it is)
            del self.tables[name]
            g.close()
        return True

    def state(self, name: str) -> dict:
        """The coordinator's public state of table ``name`` (what ``lookup`` answers).

        Parameters
        ----------
        name : str
            The table's name.

        Returns
        -------
        dict
            See :meth:`TableGate.public`.

        Raises
        ------
        SpecError
            No table of that name.
        """
        return self._table(name).public()
