"""Sampling a distributed table: the planner's requests answered by the shard workers.

A sample is admitted by the coordinator, then planned by the same planner as
the local table's (:mod:`gear_flow.table.planner`) with the shard workers
answering its requests in parallel:

* weighted selectors: shard masses, then each worker draws its count with its
  shard's mass *at the draw*, so the probability reported, ``m_s / M * w / m'_s``,
  is the probability of the draw actually made even while writers insert;
* ordered selectors: candidates (only items stamped before the admission's
  horizon, so inserts still in flight never let a newer item overtake an
  older one), a global merge, the chosen slots taken, rows put in global order;
* epochs: unseen counts, hypergeometric counts, new epochs when they run out.

A selection that went stale (an item removed between the candidates and the
take) is retried.  For tables whose samples change the table (expiry, epochs)
and span several workers, the sample holds the table exclusively at the
coordinator and gathers first; it is committed on the workers only once every
part arrived, and undone otherwise, so a retry loses nothing and an item that
may be handed out once is handed out once.  Every live shard on one worker:
one request does the whole sample there, atomically.
"""

from __future__ import annotations

import asyncio
import functools
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import numpy as np

from ..sample import SampleBuffers
from ..table import planner
from ..table.executor import fill_rows
from .host_sampling import StaleSelectionError
from .shared_reads import SharedReads
from .transport import Moved, Retry

if TYPE_CHECKING:
    from .api import DistributedTable

#: copies of gathered windows at least this large run off the event loop
OFF_LOOP_BYTES = 1 << 20


class _Sampling:
    """Samples being planned in this process; a hint only (a miscount moves a copy between loop and pool)."""

    n = 0


_SAMPLING = _Sampling()


@functools.cache
def _copy_pool() -> ThreadPoolExecutor:
    """This process's threads for copying windows out of shared memory or received frames (clients)."""
    return ThreadPoolExecutor(2, thread_name_prefix="gear-flow-copy")


class RemoteSample(SharedReads):
    """Answers one sample's plan requests with the shard workers (see the module docstring).

    An executor for :func:`gear_flow.table.planner.run_async`: called with each
    plan request, it answers it from the workers and writes gathered rows into
    ``out``.  One instance serves one attempt of one sample.

    Parameters
    ----------
    table : DistributedTable
        The handle sampling.
    out : SampleBuffers
        Buffers of the batch, ``batch_size`` rows of ``L`` steps.
    L : int
        Window length, in steps.
    boundary : {"strict", "pad_tail", "pad_head"}
        Window boundary mode.
    columns : tuple of str
        Columns gathered.
    rng : numpy.random.Generator
        Draws the per-worker seeds.
    txn : str or None
        The admission's transaction id (exclusive samples: parts are pending
        on the workers until committed with it); None under a lease.
    record : bool
        Whether workers count the samples as they draw (False for exclusive
        samples, committed only once every part arrived).
    horizon : int or None
        Stamp of the admission: ordered selectors only consider items stamped
        before it; None: no horizon.
    """

    def __init__(
        self,
        table: DistributedTable,
        out: SampleBuffers,
        L: int,
        boundary: str,
        columns: tuple[str, ...],
        rng: np.random.Generator,
        txn: str | None,
        record: bool,
        horizon: int | None,
    ) -> None:
        self.t = table
        self.out = out
        self.L = L
        self.boundary = boundary
        self.columns = columns
        self.rng = rng
        self.txn = txn
        self.record = record
        self.horizon = horizon
        self.counted = defaultdict(dict)  # worker -> {shard: rows} gathered (to undo on a retry)
        self.sent = set()  # workers asked for parts (pending parts to undo, record=False)
        self.expired = {}
        self.stale = []  # shards planned with a mass older than the maximum age: refreshed with the draw
        self.one_part = False  # the parts in flight come from one worker
        self.row_bytes = sum(out.bytes[c].shape[-1] for c in columns)  # one window step, all columns

    async def __call__(self, req):
        t = self.t
        workers = t._view.workers()
        if isinstance(req, planner.Summaries):
            cached, self.stale = t._masses.fresh(req.kinds, self.L, self.boundary, t._view.live_shards())
            if cached is not None:
                return cached
            res = await t._link.on_workers(
                {
                    a: ("summaries", dict(name=t.name, kinds=req.kinds, length=self.L, boundary=self.boundary))
                    for a in workers
                }
            )
            got = {k: {s: v for r in res.values() for s, v in r[k].items()} for k in req.kinds}
            t._masses.store(req.kinds, self.L, self.boundary, got)
            return got
        if isinstance(req, planner.Candidates):
            args = dict(
                name=t.name, n=req.n, role=req.role, length=self.L, boundary=self.boundary, horizon=self.horizon
            )
            res = await t._link.on_workers({a: ("candidates", args) for a in workers})
            return {s: c for r in res.values() for s, c in r.items()}
        if isinstance(req, planner.NewEpoch):
            await t._link.on_workers({a: ("new_epoch", dict(name=t.name)) for a in workers})
            return None
        if isinstance(req, planner.Draw):
            return await self._parts(
                req.counts, planner.offsets(req.counts, req.base), counts=req.counts, scale=req.scale,
                by_count=req.by_count,
            )  # fmt: skip
        if isinstance(req, planner.Sequences):
            args = dict(name=t.name, n=req.n, length=self.L, boundary=self.boundary, by_count=req.by_count)
            res = await t._link.on_workers(
                {a: ("sequences", {**args, "seed": int(self.rng.integers(2**63))}) for a in workers}
            )
            return {s: tuple(r) for got in res.values() for s, r in got.items()}
        if isinstance(req, planner.Take):
            offs = planner.offsets(req.slots)
            await self._parts(req.slots, offs, slots=req.slots, seqs=req.seqs)
            for s, p in (req.probs or {}).items():  # a sequential draw's: the workers report 1 for a take
                self.out.probabilities[offs[s] : offs[s] + len(p)] = p
            return None
        raise TypeError(f"unknown plan request {req!r}")

    async def _parts(self, part, offs, counts=None, scale=None, slots=None, by_count=False, seqs=None):
        t = self.t
        mapped = {}
        for a in {t.placement[s] for s in offs}:
            sh = await t._link.route(a)
            if sh is not None:
                mapped[a] = sh
        calls = self.part_calls(offs, mapped, counts, scale, slots, by_count, seqs)
        copied = {}  # (worker, shard) -> rows torn while copying from shared memory (None: received frames)

        async def arrived(a, parts):  # each part is copied as soon as its reply is here
            for s, r in self._to_copy(parts):
                copied[a, s] = await self._off_loop(self.copy_part, len(r["seqs"]), mapped.get(a), s, r, offs[s])

        refresh = self._stale_masses_calls(counts)
        pending = t._pending_calls(exclude=set(calls))  # stored updates of workers not drawn from: same round trip
        if refresh or pending:  # in the same round trip as the draw: the next plan has current masses again
            (res, errors), (fresh, _), (upd, upd_errors) = await asyncio.gather(
                t._link.on_workers(calls, partial=True, arrived=arrived),
                t._link.on_workers(refresh, partial=True),
                t._link.on_workers(pending, partial=True),
            )
            self.book_extras(fresh, pending, upd)
            errors += upd_errors
        else:
            res, errors = await t._link.on_workers(calls, partial=True, arrived=arrived)
        repairs = self.book(calls, res, copied, offs, counts, errors)
        for a, s, o, torn, args in repairs:
            if not errors:
                await self._redraw(a, mapped[a][s], s, o, torn, args)
        self.raise_errors(errors)
        return None

    def part_calls(
        self,
        offs: dict,
        mapped: dict,
        counts: dict | None = None,
        scale: dict | None = None,
        slots: dict | None = None,
        by_count: bool = False,
        seqs: dict | None = None,
    ) -> dict:
        """Each worker's ``sample_part`` request for the shards in ``offs``.

        A co-located worker gathers straight into the batch; one whose rings
        are ``mapped`` here only selects (``geometry``) and the windows are
        copied from its shared memory; the others send the windows as frames.
        Stored priority updates of a worker's shards ride along.

        Parameters
        ----------
        offs : dict of int to int
            First row of each shard's part in the batch.
        mapped : dict
            ``{worker: {shard: Attached}}`` of the workers whose rings this
            process maps.
        counts, scale : dict, optional
            A draw: items per shard and each shard's first-level probability.
        slots : dict, optional
            A take: exact slots per shard.
        by_count : bool, default False
            Shards were chosen by their numbers of valid items (no mass
            anywhere): each draws uniformly.
        seqs : dict, optional
            A take's: the sequence number each slot must still hold.

        Returns
        -------
        dict
            ``{worker: ("sample_part", arguments)}``.
        """
        t, out = self.t, self.out
        by = defaultdict(list)
        for s in offs:
            by[t.placement[s]].append(s)
        calls = {}
        for a, shards in by.items():
            args = dict(
                name=t.name,
                length=self.L,
                boundary=self.boundary,
                columns=self.columns,
                seed=int(self.rng.integers(2**63)),
                counts=None if counts is None else {s: counts[s] for s in shards},
                scale=None if scale is None else {s: scale[s] for s in shards},
                slots=None if slots is None else {s: slots[s] for s in shards},
                txn=self.txn,
                record=self.record,
            )
            if by_count:
                args["by_count"] = True
            if seqs is not None:  # a sequential draw's take: the worker checks each slot still holds its item
                args["seqs"] = {s: seqs[s] for s in shards}
            elif slots is not None and self.horizon is not None:  # ... an ordered one's: its candidate
                args["horizon"] = int(self.horizon)
            upd = t._ride_along(a)  # this handle's stored priority updates for a's shards: applied before the draw
            if upd is not None:
                args["updates"] = upd
            if a == t._ctx.local_addr and t._ctx.local_plugin is not None:
                args.update(out=out.bytes, offsets={s: offs[s] for s in shards})  # co-located: straight into the batch
            elif a in mapped:
                args["geometry"] = True  # same machine: the owner selects, we copy from its shared rings
            calls[a] = ("sample_part", args)
        self.sent.update(calls)
        self.one_part = len(calls) == 1
        return calls

    @staticmethod
    def _to_copy(parts: dict) -> list:
        """``(shard, part)`` of a worker's reply whose windows this process copies (from its frames or from
        shared memory; a co-located part is in the batch already)."""
        return [(s, r) for s, r in parts.items() if s != "updated" and ("data" in r or "src_abs" in r)]

    def copy_part(self, sh: dict | None, s: int, r: dict, o: int) -> np.ndarray | None:
        """Copy one part's windows into the batch.

        Parameters
        ----------
        sh : dict or None
            The part's worker's mapped rings, ``{shard: Attached}`` (None:
            not mapped here; the windows came as frames).
        s : int
            The part's shard.
        r : dict
            The part, as ``sample_part`` returned it (``data`` frames, or
            ``src_abs`` positions in the shared rings).
        o : int
            First row of the part in the batch.

        Returns
        -------
        numpy.ndarray or None
            Rows (relative to ``o``) torn while copying from shared memory;
            None for received frames.
        """
        if "data" in r:
            return self._copy_received(r["data"], o, len(r["seqs"]))
        return self._copy_shared(sh[s], r, o)

    def book_extras(self, fresh: dict, pending: dict, upd: dict) -> None:
        """Book the replies of the requests riding with a draw: masses refreshed, stored updates sent (an
        update not known applied is stored again, not an error of the draw).

        Parameters
        ----------
        fresh : dict
            ``{worker: summaries reply}`` of the masses refreshed.
        pending : dict
            ``{worker: ("update", arguments)}`` sent with the draw.
        upd : dict
            ``{worker: update reply}`` of those applied.
        """
        t = self.t
        for r in fresh.values():
            for s, m in r["sampler"].items():
                t._masses.update(self.L, self.boundary, int(s), m)
        for a, (_, args) in pending.items():
            if a in upd:
                t._updated(args["masses"] or [], upd[a])
            t._settle(args, a in upd)  # not known applied: stored again, minus what was updated since

    def book(self, calls: dict, res: dict, copied: dict, offs: dict, counts: dict | None, errors: list) -> list:
        """Book the parts that arrived: rows filled, draws counted (to undo on a retry), bytes, expiries and
        masses noted, ride-along updates settled.

        Parameters
        ----------
        calls : dict
            What :meth:`part_calls` returned.
        res : dict
            ``{worker: reply}`` of the parts that arrived.
        copied : dict
            ``{(worker, shard): torn rows}`` of the parts copied from shared
            memory.
        offs : dict
            First row of each shard's part.
        counts : dict or None
            The draw's counts (None: a take).
        errors : list
            The parts' errors; a torn part of a take appends a :class:`Retry`.

        Returns
        -------
        list
            Torn rows to redraw, ``(worker, shard, first row, rows, request)``.
        """
        t, out = self.t, self.out
        for a, (_, args) in calls.items():
            if "updates" in args:
                t._settle(args["updates"], a in res)
        repairs = []
        for a, parts in res.items():
            if "updated" in parts:
                t._updated(calls[a][1]["updates"]["masses"] or [], parts.pop("updated"))
            for s, r in parts.items():
                o, n = offs[s], len(r["seqs"])
                self.counted[a][s] = self.counted[a].get(s, 0) + n
                if "data" in r:
                    t.stats["remote_bytes"] += n * self.L * self.row_bytes
                elif "src_abs" in r:
                    torn = copied[a, s]
                    if len(torn):
                        t.stats["shared_conflicts"] += len(torn)
                        if self.record and counts is not None:  # a weighted draw: redraw just those rows
                            repairs.append((a, s, o, torn, calls[a][1]))
                        else:
                            errors.append(Retry())
                    t.stats["shared_bytes"] += n * self.L * self.row_bytes
                else:
                    t.stats["local_bytes"] += n * self.L * self.row_bytes
                fill_rows(
                    out,
                    o,
                    s,
                    r["seqs"],
                    r["p"],
                    r["episode_ids"],
                    r["timesteps"],
                    r["dst_offset"],
                    r["n_valid"],
                    self.L,
                    r.get("priorities"),
                    r.get("times_sampled"),
                )
                if r["expired"]:
                    self.expired[s] = self.expired.get(s, 0) + r["expired"]
                if "mass" in r:
                    t._masses.update(self.L, self.boundary, s, r["mass"])
        return repairs

    def raise_errors(self, errors: list) -> None:
        """Raise the first error of a part as this sample's; the masses kept are forgotten (the next plan asks).

        Parameters
        ----------
        errors : list
            The parts' errors (none: nothing raised).

        Raises
        ------
        Retry
            A stale selection or a retry.
        Exception
            Any other error, as it came.
        """
        if errors:  # the parts that arrived are recorded in book(), so undo() can give them back
            self.t._masses.clear()
            e = errors[0]
            raise Retry() if isinstance(e, (StaleSelectionError, Retry)) else e

    def _copy_received(self, data: dict, o: int, n: int) -> None:
        for c in self.columns:
            self.out.bytes[c][o : o + n] = data[c]

    async def _off_loop(self, fn, rows: int, *args):
        """Run a copy of ``rows`` windows off the event loop when it is large: inside a worker in the
        plugin's threads (the worker's loop serves every other caller's requests), in a client in a small
        pool of its own while other copies may run (a Stream's requests in flight, the other parts of this
        batch): they overlap there; a client's only sample, from one worker, copies right here, sparing two
        thread hops (1 worker, 256 x 64 windows: 4.3-4.6 -> 5.1-5.2 GB/s)."""
        if rows * self.L * self.row_bytes < OFF_LOOP_BYTES:
            return fn(*args)  # a hop to a thread costs more than this copy
        plugin = self.t._ctx.local_plugin
        if plugin is None and _SAMPLING.n == 1 and self.one_part:
            return fn(*args)
        pool = plugin.executor if plugin is not None else _copy_pool()
        return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)

    def _stale_masses_calls(self, counts) -> dict:
        """``summaries`` requests for the stale shards this draw does not refresh (no count drawn there)."""
        if counts is None or not self.stale:
            return {}
        t = self.t
        left = [s for s in self.stale if int(counts.get(s, 0)) <= 0 and s in t.placement and s not in t.lost]
        self.stale = []
        args = dict(name=t.name, kinds=("sampler",), length=self.L, boundary=self.boundary)
        return {a: ("summaries", args) for a in sorted({t.placement[s] for s in left})}

    async def undo(self) -> None:
        """Forget what this attempt gathered (a retry or a failure follows)."""
        t = self.t
        if self.record:
            calls = {a: ("uncount", dict(name=t.name, counts=c)) for a, c in self.counted.items()}
        else:
            calls = {a: ("finish_sample", dict(name=t.name, txn=self.txn, commit=False)) for a in self.sent}
        if calls:
            _, errors = await t._link.on_workers(calls, partial=True)
            moved = Moved.among(errors)
            if self.record and moved:  # the counted shards moved with their counts: given back where they are now
                again = defaultdict(dict)
                for a in moved:
                    for sh, c in self.counted.get(a, {}).items():
                        if sh in t.placement and sh not in t.lost:
                            again[t.placement[sh]][sh] = c
                await t._link.on_workers(
                    {a: ("uncount", dict(name=t.name, counts=c)) for a, c in again.items()}, partial=True
                )
        self.counted.clear()
        self.sent.clear()
