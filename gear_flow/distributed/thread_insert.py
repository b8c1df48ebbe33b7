"""Inserts in the caller's thread: no event loop between a writer and the shards it writes.

Two kinds of insert need no event loop (each hop into it and back costs tens
of microseconds on a 2-core host, and the loop writes a large request a
chunk at a time, yielding between chunks):

* an actor's: a task on a worker whose episodes all go to that worker's own
  shards writes them itself (:meth:`ThreadInsertsMixin._insert_here`);
* a writer's whose episodes go to workers it reaches by their lanes and does
  not map (another host, or shared memory off: their TCP lanes): the
  episodes go out on blocking sockets straight from the caller's arrays, and
  the workers read them straight into reused buffers
  (:meth:`ThreadInsertsMixin._insert_over_lanes`).  Measured on the 2-core
  host (``pipelines/bench_distributed.py``, 10 episodes of 1.04 MB a call):
  through the event loop 0.75x (2 workers) and 0.91x (1 worker) the speed of
  Dask's own scatter of the same bytes; this way 0.91-1.04x and 1.22-1.32x.

Both are admitted and committed over the coordinator's lane.  Their steps are
the transaction's (:mod:`~gear_flow.distributed.transactions`): one worker
``write``; several ``stage`` everywhere (all sent, then the replies read: the
workers receive in parallel), ``apply`` everywhere, commit.  What this path
cannot finish itself goes to the event loop's path: a placement that changed
since the admission (the whole insert), a worker refusing its part (the
insert aborted everywhere, as there), a lane that breaks (the transaction
handed to :func:`~.transactions.run_insert` or :func:`~.transactions.apply_staged`, which send its steps
again: a stage, write or apply sent twice is applied once,
:data:`~gear_flow.distributed.lane.RESENDABLE_OPS`), an eviction to
``max_size``.
"""

from __future__ import annotations

import logging
from collections import defaultdict

from ..table.results import InsertResult
from .coordinator import admission_wait
from .protocol import VERSION
from .transactions import abort_insert, admission_args, apply_staged, commit_counts, insert_error, run_insert
from .transport import reply_timeout
from .wire import array_bytes
from .writes import _Insert, _result

logger = logging.getLogger(__name__)


class ThreadInsertsMixin:
    """Inserts served in the caller's thread, for :class:`~gear_flow.distributed.DistributedTable`."""

    def _inserts_here(self, ins: _Insert) -> bool:
        """Can ``ins`` be inserted in the caller's thread: from a task on a worker, every episode for its
        own shards, the coordinator's lane found?"""
        ctx = self._ctx
        if ctx.local_plugin is None or ctx.in_loop() or ctx.found_coord_lane() is None:
            return False
        placement = self.placement
        return all(placement.get(int(s)) == ctx.local_addr for s in ins.per_shard)

    def _insert_here(self, ins: _Insert, timeout: float | None) -> InsertResult:
        """An insert into this worker's own shards, in the caller's thread: admitted and committed over the
        coordinator's lane, written by this thread (no hop into the event loop, none into the plugin's
        threads).  What needs the event loop (a placement that changed, an abort, an eviction) goes there."""
        ctx = self._ctx
        here = ctx.local_addr
        adm, parts, sel_of, ids = self._admitted_here(ins, timeout)
        if parts is None or list(parts) != [here]:  # the placement changed since: the event loop's path
            return ctx.sync(self._insert_admitted, ins, adm, timeout)
        self.stats["insert_local_bytes"] += array_bytes([p["chunks"] for p in parts[here]])
        try:
            res = ctx.local_plugin.host.call(
                "write", ctx.stamped(dict(name=self.name, txn=adm["txn"], parts=parts[here]))
            )
        except BaseException as e:
            ctx.sync(abort_insert, self, adm["txn"], [here], e)
            raise insert_error(self, e, [here]) from None
        return self._committed_here(ins, adm, sel_of, ids, {here: res})

    def _insert_lanes(self, ins: _Insert) -> dict[str, tuple[str, int]] | None:
        """``{worker: (lane, bytes of its episodes)}`` when ``ins`` can go over its workers' lanes from the caller's thread: every
        worker it goes to is another process this handle reaches by a lane without mapping its rings (a
        mapped one takes the episodes through a staging segment), the request fits the lane, and the
        coordinator's lane is found; else None."""
        ctx = self._ctx
        if ctx.in_loop() or ctx.found_coord_lane() is None:
            return None
        nbytes: dict[str, int] = defaultdict(int)
        placement = self.placement  # one reading: the event loop replaces it whole, never edits it
        try:
            for i, s in enumerate(ins.dest):
                nbytes[placement[int(s)]] += array_bytes(ins.chunks[i])
        except KeyError:  # a shard placed nowhere
            return None
        op = "write" if len(nbytes) == 1 else "stage"
        paths = {}
        for a, n in nbytes.items():
            local = a == ctx.local_addr and ctx.local_plugin is not None
            path = ctx.lanes.route(a, op, n)
            if local or path is None or not self._routes.probed(a) or self._routes.mapped(a) is not None:
                return None
            paths[a] = (path, n)
        return paths

    def _insert_over_lanes(
        self, ins: _Insert, timeout: float | None, paths: dict[str, tuple[str, int]]
    ) -> InsertResult:
        """An insert sent over its workers' lanes from the caller's thread (see the module docstring)."""
        ctx = self._ctx
        adm, parts, sel_of, ids = self._admitted_here(ins, timeout)
        if parts is None or set(parts) != set(paths):  # the placement changed since: the event loop's path
            return ctx.sync(self._insert_admitted, ins, adm, timeout)
        txn, addrs = adm["txn"], sorted(parts)
        op = "write" if len(addrs) == 1 else "stage"
        try:
            self.stats["insert_remote_bytes"] += sum(n for _, n in paths.values())  # as routed: the same episodes
            got = self._over_lanes([(paths[a][0], op, dict(name=self.name, txn=txn, parts=parts[a])) for a in addrs])
        except BaseException as e:  # interrupted before every part was taken: nothing is applied anywhere
            ctx.sync(abort_insert, self, txn, addrs, e)
            raise
        refused = [r[1] for r in got if not isinstance(r, BaseException) and not r[0]]
        if refused:  # a worker refused its part: aborted everywhere, as the event loop's path does
            ctx.sync(abort_insert, self, txn, addrs, refused[0])
            raise insert_error(self, refused[0], addrs) from None
        broken = [a for a, r in zip(addrs, got) if isinstance(r, BaseException)]
        if broken:  # the event loop's path sends their parts again (over the comm), the others' are staged
            ok = [a for a in addrs if a not in broken]
            applied, size = ctx.sync(self._again, broken, run_insert, self, txn, parts, ok)
            return self._finished_here(ins, sel_of, ids, applied, size)
        if op == "stage":
            got = self._over_lanes([(paths[a][0], "apply", dict(name=self.name, txn=txn)) for a in addrs])
            broken = [a for a, r in zip(addrs, got) if isinstance(r, BaseException)]
            if broken or not all(r[0] for r in got):  # the event loop's path applies (again) and reports
                applied, size = ctx.sync(self._again, broken, apply_staged, self, txn, addrs)
                return self._finished_here(ins, sel_of, ids, applied, size)
        return self._committed_here(ins, adm, sel_of, ids, {a: r[1] for a, r in zip(addrs, got)})

    async def _again(self, broken: list[str], step, *args):
        """``await step(*args)`` on the event loop once the lanes of ``broken`` are dropped: a lane that failed
        is not used again, its requests go over the comm (as when it fails on the event loop's path); for an
        insert's steps and a waiting priority update (:mod:`.thread_update`)."""
        for a in broken:
            logger.info("table %r: the lane to %s failed; using the comm", self.name, a)
            self._ctx.lanes.drop(a)
        return await step(*args)

    def _over_lanes(self, requests: list[tuple[str, str, dict]]) -> list:
        """Send ``(lane, op, args)`` requests from this thread, all before reading a reply; each reply as
        ``(ok, value)`` or the error that kept it from being sent or broke its connection."""
        lanes = self._ctx.lanes
        for _, op, _ in requests:
            self.requests[op] += 1
        requests = [(lane, op, self._ctx.stamped(args)) for lane, op, args in requests]
        return list(lanes.read_all(lanes.send_all(requests, VERSION, reply_timeout())))

    def _admitted_here(self, ins: _Insert, timeout: float | None) -> tuple:
        """The coordinator's admission of ``ins`` from the caller's thread (over its lane when found):
        ``(admission, parts, sel_of, ids)`` as :meth:`_parts` gives them, the last three None when the
        placement changed since this handle learnt it."""
        wait = admission_wait(timeout)  # sent as the request's own: both ends give up at the same time
        adm = self._link.coord_here(
            "admit_insert", wait=wait, **admission_args(self, ins.n_items, len(ins.lengths), ins.per_shard, wait)
        )
        if adm["version"] != self._view.version:
            return adm, None, None, None
        return (adm, *self._parts(ins, adm))

    def _committed_here(self, ins: _Insert, adm: dict, sel_of: dict, ids, applied: dict) -> InsertResult:
        """Commit an insert applied on every worker from the caller's thread, then what follows it."""
        size = self._link.coord_here("commit_insert", txn=adm["txn"], **commit_counts(applied))
        self.stats["insert_in_thread"] += 1
        return self._finished_here(ins, sel_of, ids, applied, size)

    def _finished_here(self, ins: _Insert, sel_of: dict, ids, applied: dict, size: int) -> InsertResult:
        """The result of an insert committed with the table at ``size`` items, evicted to ``max_size``."""
        if self._cfg.evicts_to_max_size(size):
            self._ctx.sync(self._evict_excess, size)
        return _result(ins, ids, sel_of, applied)
