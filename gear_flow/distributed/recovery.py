"""Recovery: settling what departed owners and unanswering workers left of a table's transactions.

A client or worker that goes away may leave behind inserts in flight (staged
or applied on some of the shard workers, never committed or aborted by it)
and an exclusive sample's hold.  :class:`Recovery` finishes them, so that a
killed process leaves nothing behind: an insert applied anywhere is applied
everywhere and committed, any other is aborted everywhere (two-phase-commit
recovery); the hold is aborted on the workers and given back to the limiter.

It also settles the parts of live owners' transactions that a worker did not
answer in time: an insert part whose apply went unanswered is aborted there
and counted by what the worker says became of it, one whose abort did not
reach its worker is aborted again until it is answered.

The scheduler's coordinator (:class:`~.coordinator.GearFlowCoordinator`)
builds it and hands it what it works with: the tables, how to call a worker's
``gear_flow`` handler, how to run a task in the background, and whether a
worker is still in the cluster.  Nothing here reaches the scheduler itself.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .gate import TableGate

logger = logging.getLogger(__name__)

#: calls worker ``addr``'s ``gear_flow`` handler: ``await worker_call(addr, action, **args)`` -> its result
WorkerCall = Callable[..., Awaitable[Any]]


async def until_answered(
    step: Callable[[], Awaitable[object]], live: Callable[[], bool], what: str, delays: Iterable[float]
) -> bool | None:
    """Run ``await step()``, a request to a worker, until the worker answers it: after each attempt it does
    not answer (``step`` raises), wait the next of ``delays`` and ask again; with none left, give up.  What
    recovery and a move's last steps (:mod:`~gear_flow.distributed.moves`) both ask again this way.

    Parameters
    ----------
    step : callable
        ``await step()``: the request (raises when it is not answered).
    live : callable
        ``live()``: whether the worker is still in the cluster (asked before each attempt).
    what : str
        Names the request and the worker in the log line of each attempt not answered.
    delays : iterable of float
        Seconds to wait after each attempt not answered; as many attempts as delays.

    Returns
    -------
    bool or None
        True once answered; None when the worker left first; False when every attempt failed.
    """
    for delay in delays:
        if not live():
            return None
        try:
            await step()
            return True
        except Exception as e:  # noqa: BLE001 - not answered again: asked again, later
            logger.info("%s: %s", what, e)
            await asyncio.sleep(delay)
    return False


class Recovery:
    """Finishes the transactions departed owners left, and the parts workers left unanswered.

    Parameters
    ----------
    tables : Mapping of str to TableGate
        The coordinator's tables, by name (read; what is settled goes through
        each table's gate).
    worker_call : callable
        ``await worker_call(addr, action, **args)``: a request to worker
        ``addr``'s ``gear_flow`` handler, its result; raises when the worker
        does not answer it, or answers with an error.
    spawn : callable
        ``spawn(coro)``: runs a coroutine in the background (the coordinator
        keeps the task until it ends).
    live : callable
        ``live(addr)``: whether worker ``addr`` is still in the cluster.
    """

    def __init__(
        self,
        tables: Mapping[str, TableGate],
        worker_call: WorkerCall,
        spawn: Callable[[Coroutine[Any, Any, None]], None],
        live: Callable[[str], bool],
    ) -> None:
        self.tables = tables
        self.worker_call = worker_call
        self.spawn = spawn
        self.live = live

    # -- departures -----------------------------------------------------------------------------------------
    def worker_left(self, worker: str) -> None:
        """Mark every shard on ``worker`` lost and release what the worker held as an owner.

        Parameters
        ----------
        worker : str
            Address of the removed worker.
        """
        for g in list(self.tables.values()):
            for s in sorted(s for s, a in g.placement.items() if a == worker):
                g.mark_lost(s, f"worker {worker} left the cluster")
        self.release(owner=worker)

    def release(self, owner: str) -> None:
        """Release what a departed owner (a client, or a worker) held: its waiting requests, exclusive sample
        and inserts; what it left in flight is finished in the background.

        Parameters
        ----------
        owner : str
            The client's id, or the worker's address.
        """
        for g in list(self.tables.values()):
            txns, hold = g.release_owner(owner)
            if txns or hold:
                self.spawn(self._recover(g, txns, hold))

    async def _recover(self, g: TableGate, txns, hold) -> None:
        """Finish what a departed owner left: its inserts (2PC recovery) and its exclusive sample."""
        workers = sorted(set(g.placement.values()))
        for t in txns:
            try:
                await self._recover_insert(g, t)
            except Exception:  # never leave the transaction open: it would block the horizon for good
                logger.exception("table %r: recovering insert %s failed; aborting it", g.name, t.txn)
                g.abort_insert(t.txn)
        if hold is not None:
            for a in workers:
                try:
                    await self.worker_call(a, "abort", name=g.name, txn=hold["txn"])
                except Exception:
                    pass
            g.sample_finished(hold["txn"], rollback=hold["n"])

    async def _recover_insert(self, g: TableGate, t) -> None:
        """Two-phase-commit recovery: applied anywhere → apply everywhere and commit; else abort everywhere."""
        addrs = sorted({g.placement[s] for s in t.per_shard if s in g.placement})
        states = {}
        for a in addrs:
            try:
                states[a] = await self._status(g, a, t.txn)
            except Exception:
                states[a] = {"state": "unknown"}
        if any(st["state"] == "applied" for st in states.values()):
            items, evicted = {}, {}
            for a, st in states.items():
                res = st.get("result")
                if st["state"] == "staged":
                    try:
                        res = await self.worker_call(a, "apply", name=g.name, txn=t.txn)
                    except Exception:
                        res = None
                for s, k in ((res or {}).get("items") or {}).items():
                    items[s] = items.get(s, 0) + k
                for s, k in ((res or {}).get("evicted") or {}).items():
                    evicted[s] = evicted.get(s, 0) + k
            g.commit_insert(t.txn, items, evicted)
            logger.info("table %r: committed insert %s of a departed client", g.name, t.txn)
        else:
            for a in addrs:
                try:
                    await self.worker_call(a, "abort", name=g.name, txn=t.txn)
                except Exception:  # noqa: BLE001 - asked again in the background, until answered
                    self.spawn(self._abort_part(g, t.txn, a))
            g.abort_insert(t.txn)
            logger.info("table %r: aborted insert %s of a departed client", g.name, t.txn)

    # -- parts a worker left unanswered ---------------------------------------------------------------------
    def settle_parts(self, g: TableGate, txn: str, addrs: Iterable[str]) -> None:
        """Settle committed insert ``txn``'s parts on workers ``addrs``, which did not answer their apply in
        time, in the background: each is aborted there (an apply delivered later is refused) and counted by
        whether it had been applied before.

        Parameters
        ----------
        g : TableGate
            The table.
        txn : str
            The insert, committed with those parts unsettled.
        addrs : iterable of str
            The workers whose parts are not known.
        """
        for a in sorted(set(addrs)):
            self.spawn(self._settle_unanswered_part(g, txn, a))

    def abort_parts(self, g: TableGate, txn: str, addrs: Iterable[str] | None) -> None:
        """Abort ``txn``'s parts on workers ``addrs`` in the background, until each answers; only on workers
        that hold the table's shards (one that left, or whose shards moved, has no part).

        Parameters
        ----------
        g : TableGate
            The table.
        txn : str
            The insert.
        addrs : iterable of str, optional
            The workers the client's abort did not reach.
        """
        for a in sorted(set(addrs or ()) & set(g.placement.values())):
            self.spawn(self._abort_part(g, txn, a))

    async def _settle_unanswered_part(self, g: TableGate, txn: str, addr: str) -> None:
        """Find out what became of ``txn``'s part on ``addr``, which did not answer its apply in time, and
        count it: abort it there (an apply delivered later is refused), then ask whether it had been
        applied before; a worker gone meanwhile takes its shards' items with it."""
        shards = sorted(s for s in g.unsettled.get(txn, {}) if g.placement.get(s) == addr)

        async def step():
            await self.worker_call(addr, "abort", name=g.name, txn=txn)
            st = await self._status(g, addr, txn)
            res = st.get("result") or {}
            g.settle_late(txn, shards, res.get("items") or {}, res.get("evicted") or {})
            logger.info("table %r: insert %s settled on %s: %s", g.name, txn[:8], addr, st["state"])

        def gone():  # its shards are lost, and what it wrote with them
            g.settle_late(txn, shards, {}, {})

        if not await self._until_answered(g, addr, f"settling insert {txn[:8]}", step, gone):
            logger.warning("table %r: insert %s's part on %s is still not known; its items are not counted",
                           g.name, txn[:8], addr)  # fmt: skip

    async def _abort_part(self, g: TableGate, txn: str, addr: str) -> None:
        """Abort insert ``txn``'s part on ``addr``, which the client's (or a recovery's) abort did not reach:
        a part left staged would keep its episodes in the worker's memory for good."""

        async def step():
            await self.worker_call(addr, "abort", name=g.name, txn=txn)
            logger.info("table %r: insert %s's part on %s aborted", g.name, txn[:8], addr)

        if not await self._until_answered(g, addr, f"aborting insert {txn[:8]}", step, lambda: None):
            logger.warning("table %r: insert %s's part on %s could not be aborted; it stays staged there",
                           g.name, txn[:8], addr)  # fmt: skip

    async def _until_answered(self, g: TableGate, addr: str, what: str, step, gone, attempts: int = 8) -> bool:
        """:func:`until_answered` of ``step`` on ``addr`` (backing off between attempts), or ``gone()`` once
        the scheduler no longer has the worker; False when ``attempts`` all failed."""
        delays = (min(0.2 * 2**attempt, 10.0) for attempt in range(attempts))
        answered = await until_answered(step, lambda: self.live(addr), f"table {g.name!r}: {what} on {addr}", delays)
        if answered is None:
            gone()
        return answered is not False

    async def _status(self, g: TableGate, addr: str, txn: str) -> dict:
        """What became of insert ``txn`` on ``addr`` (its ``status``), once it is no longer being written."""
        st = await self.worker_call(addr, "status", name=g.name, txn=txn)
        while st["state"] == "applying":  # taken from staging and being written: its result comes soon
            await asyncio.sleep(0.01)
            st = await self.worker_call(addr, "status", name=g.name, txn=txn)
        return st
