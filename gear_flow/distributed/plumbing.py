"""Plumbing of a distributed table's handle: reaching its workers and coordinator, and reacting to a lost worker.

``_workers`` groups the live shards by worker, ``_coord`` asks the scheduler's
coordinator about this table, ``_on_workers`` sends requests to several
workers at once and turns an unreachable one into a lost shard
(``_handle_lost``: :class:`~gear_flow.errors.ShardLostError`, or in a
``degraded`` table a retry without it), ``_refresh`` picks up placement
changes made by other handles, and ``_shared_for`` maps a same-machine
worker's shared-memory rings (and its fast lane) on first use.

:class:`PlumbingMixin` is a mixin of
:class:`~gear_flow.distributed.DistributedTable` rather than a class of its
own because every other part of the handle (inserts, edits, sampling,
checkpoints, ride-along updates) calls these as ``self._on_workers``,
``self._coord``, ``self._shared_for`` ... over the handle's own state
(placement, lost shards, kept masses, stored updates).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict

from ..config import get as config_get
from ..errors import GearFlowError, ShardLostError, ShardMovedError
from .coordinator import admission_wait
from .transport import Moved, Retry, WorkerLost, call, coord, coord_here

logger = logging.getLogger(__name__)


class PlumbingMixin:
    """Requests to the workers and the coordinator, and loss handling, for
    :class:`~gear_flow.distributed.DistributedTable`."""

    # -- plumbing ---------------------------------------------------------------------------------
    def _live_shards(self) -> list[int]:
        return sorted(s for s in self.placement if s not in self.lost)

    def _workers(self, shards=None) -> dict[str, list[int]]:
        by = defaultdict(list)
        for s, a in sorted(self.placement.items()):
            if s in self.lost or (shards is not None and s not in shards):
                continue
            by[a].append(s)
        return dict(by)

    async def _coord(self, op, **kw):
        return await coord(self._ctx, op, self.name, **kw)

    def _coord_here(self, op, wait=0.0, **kw):
        """:meth:`_coord` from the caller's thread (:func:`~gear_flow.distributed.transport.coord_here`);
        ``wait``: seconds the coordinator may hold the request (None: for ever)."""
        return coord_here(self._ctx, op, self.name, wait, **kw)

    def _admission_wait(self, timeout):
        """Seconds an admission asked for with ``timeout`` may wait (None: for ever), as the coordinator would
        count them; a caller's thread sends this as the request's timeout, so that its socket and the
        coordinator give up together."""
        return admission_wait(timeout)

    async def _refresh(self, version=None):
        """Pick up placement / lost-shard changes made by other handles (restores, losses)."""
        if version is not None and version == self._version:
            return
        st = await self._coord("lookup")
        placement = {int(k): v for k, v in st["placement"].items()}
        lost = {int(k) for k in st["lost"]}
        built = {int(k): v for k, v in st["incarnation"].items()}
        replaced = {s for s in self._pending.stored() if built.get(s) != self._incarnation.get(s, 0) or s in lost}
        if replaced:  # lost, or restored from a checkpoint: the stored seqs belong to what was there (a shard
            # moved whole to another worker keeps its keys: its updates go there)
            self._pending.drop(replaced)
            logger.info("table %r: priority updates for shards %s dropped (shard lost or restored)", self.name,
                        replaced)  # fmt: skip
        self.placement = placement
        self.lost = {int(k): v for k, v in st["lost"].items()}
        self._incarnation = built
        self._version = self._ctx.epoch = st["version"]
        self._shared.clear()  # shards may have moved: map again
        self._ctx.lanes.clear()
        self._masses.clear()
        self._issued.clear()

    async def _shared_for(self, addr: str) -> dict | None:
        """``{shard: Attached}`` when ``addr``'s shards can be read from shared memory here, else None."""
        if addr in self._shared:
            return self._shared[addr]
        got = None
        local = addr == self._ctx.local_addr and self._ctx.local_plugin is not None
        if self._config.get("shared_memory") and config_get("distributed.shared-memory") and not local:
            from ..storage.shared import Attached, machine_id

            try:
                lay = await call(self._ctx, addr, "shared_layout", table=self.name, name=self.name)
            except WorkerLost:  # only a probe: the request that follows finds (and reports) the loss
                return None
            if lay["machine"] == machine_id() and all(v is not None for v in lay["shards"].values()):
                try:
                    got = {int(i): Attached(v, int(i)) for i, v in lay["shards"].items()}
                except (ShardLostError, OSError, ValueError) as e:  # not this machine's /dev/shm after all
                    logger.info("table %r: shards of %s not mapped (%s); using the comm", self.name, addr, e)
                if got is not None and isinstance(lay.get("lane"), str) and config_get("distributed.fast-lane"):
                    self._ctx.lanes.paths[addr] = lay["lane"]  # its control requests: over a Unix socket
        tcp = (
            self._config.get("tcp_lane") and config_get("distributed.tcp-lane") and config_get("distributed.fast-lane")
        )
        if got is None and not local and tcp:
            try:  # not mapped here: its draws (windows included) and control requests over its TCP lane
                lane = await call(self._ctx, addr, "lane", table=self.name, name=self.name)
            except WorkerLost:
                return None
            except GearFlowError as e:  # e.g. a worker of an older gear_flow: the comm
                logger.info("table %r: no TCP lane to %s (%s); using the comm", self.name, addr, e)
                lane = {}
            tcp_lane = lane.get("tcp")
            if isinstance(tcp_lane, str) and await self._ctx.lanes.probe(tcp_lane):
                self._ctx.lanes.paths[addr] = tcp_lane
            elif isinstance(tcp_lane, str):
                logger.info("table %r: TCP lane %s of %s not reachable; using the comm", self.name, tcp_lane, addr)
        self._shared[addr] = got
        return got

    async def _on_workers(self, calls: dict, partial: bool = False, arrived=None):
        """Run ``{addr: (op, kwargs)}`` in parallel.

        Lost workers → ShardLostError, or in degraded mode a :class:`Retry` once
        their shards are marked lost; workers that refused a request planned
        before shards moved → a :class:`~.transport.Moved` (a Retry) once the
        new placement is known.  ``partial=True``: return ``(results,
        errors)`` instead of raising, so a caller can undo what succeeded.
        ``arrived``: a coroutine function awaited with ``(addr, result)`` as
        each reply arrives (a batch's parts are copied while others are still
        on their way).
        """
        addrs = list(calls)
        for a in addrs:
            self.requests[calls[a][0]] += 1

        async def one(a):
            r = await call(self._ctx, a, calls[a][0], table=self.name, **calls[a][1])
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
            await self._moved(max(moved.values()))
            if not partial:
                raise Moved(moved)
            errors.append(Moved(moved))
        if lost:
            try:
                await self._handle_lost(lost)
            except (Retry, ShardLostError) as e:
                if not partial:
                    raise
                errors.append(e)
        if partial:
            return out, errors
        if errors:
            raise errors[0]
        return out

    async def _moved(self, epoch: int) -> None:
        """Learn the placement at version ``epoch`` or later: a worker refused a request planned before shards
        moved there or away (:class:`~gear_flow.errors.ShardMovedError`).  The coordinator moves its placement
        just after the destination takes the shards, so the lookup may trail for a moment: asked again until
        it has caught up (bounded: a worker's epoch never runs ahead of the coordinator's for long)."""
        deadline = time.monotonic() + float(config_get("distributed.rpc-timeout"))
        await self._refresh()
        while self._version < epoch:
            if time.monotonic() > deadline:
                raise ShardMovedError(epoch, f"table {self.name!r}: the coordinator's placement stayed at "
                                      f"version {self._version}")  # fmt: skip
            await asyncio.sleep(0.005)
            await self._refresh()

    async def _handle_lost(self, addrs):
        # the placement as the coordinator has it now: a shard restored elsewhere since this handle learnt
        # it (by another handle, or this one's restore_shard) is not the lost worker's any more
        await self._refresh()
        shards = sorted(s for s, a in self.placement.items() if a in addrs)  # lost, or marked lost already
        for s in shards:
            if s not in self.lost:
                detail = f"worker {self.placement[s]} unreachable"
                self.lost[s] = (await self._coord("mark_lost", shard=s, detail=detail))[s]
        await self._refresh()
        if not shards:  # those workers hold none of the table's shards any more (moved): redone as placed now
            raise Retry()
        if not self.degraded:
            raise ShardLostError(
                shards[0],
                f"worker(s) {sorted(addrs)} holding shard(s) {shards} of table {self.name!r} are unreachable; "
                "create the table with degraded=True to keep serving from the other shards",
            )
        logger.warning("table %r: shards %s lost (worker(s) %s); serving from the rest", self.name, shards, addrs)
        raise Retry()

    def _check_not_lost(self, stored: bool | None = None):
        """ShardLostError if a shard is lost and the table is not degraded (``stored``: of an insert, False)."""
        if self.lost and not self.degraded:
            s = min(self.lost)
            raise ShardLostError(s, f"table {self.name!r} lost shard(s) {sorted(self.lost)}", stored=stored)
