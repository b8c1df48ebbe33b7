"""Sampling a distributed table: the planner's requests answered over the comm.

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
import time
from collections import defaultdict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import numpy as np

from .. import backend, config
from ..dashboard.report import maybe_report
from ..errors import EmptyTableError, SpecError, nothing_to_sample
from ..sample import SampleBatch, SampleBuffers
from ..table import planner, two_level
from ..table.executor import fill_rows
from ..table.validate import check_sample_args, sample_columns
from .host_sampling import StaleSelectionError
from .shared_reads import SharedReads
from .transport import Retry

if TYPE_CHECKING:
    from .api import DistributedTable

_ATTEMPTS = 8
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

    async def __call__(self, req):
        t = self.t
        workers = t._workers()
        if isinstance(req, planner.Summaries):
            cached, self.stale = t._masses.fresh(req.kinds, self.L, self.boundary, t._live_shards())
            if cached is not None:
                return cached
            res = await t._on_workers(
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
            res = await t._on_workers({a: ("candidates", args) for a in workers})
            return {s: c for r in res.values() for s, c in r.items()}
        if isinstance(req, planner.NewEpoch):
            await t._on_workers({a: ("new_epoch", dict(name=t.name)) for a in workers})
            return None
        if isinstance(req, planner.Draw):
            return await self._parts(
                req.counts, planner.offsets(req.counts, req.base), counts=req.counts, scale=req.scale,
                by_count=req.by_count,
            )  # fmt: skip
        if isinstance(req, planner.Take):
            return await self._parts(req.slots, planner.offsets(req.slots), slots=req.slots)
        raise TypeError(f"unknown plan request {req!r}")

    async def _parts(self, part, offs, counts=None, scale=None, slots=None, by_count=False):
        t, out = self.t, self.out
        by = defaultdict(list)
        for s in offs:
            by[t.placement[s]].append(s)
        calls, mapped = {}, {}
        for a, shards in by.items():
            sh = await t._shared_for(a)
            if sh is not None:
                mapped[a] = sh
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
        copied = {}  # (worker, shard) -> rows torn while copying from shared memory (None: received frames)

        async def arrived(a, parts):  # each part is copied as soon as its reply is here
            for s, r in parts.items():
                if s == "updated":
                    continue
                n = len(r["seqs"])
                if "data" in r:
                    copied[a, s] = await self._off_loop(self._copy_received, n, r["data"], offs[s], n)
                elif "src_abs" in r:
                    copied[a, s] = await self._off_loop(self._copy_shared, n, mapped[a][s], r, offs[s])

        refresh = self._stale_masses_calls(counts)
        pending = t._pending_calls(exclude=set(calls))  # stored updates of workers not drawn from: same round trip
        if refresh or pending:  # in the same round trip as the draw: the next plan has current masses again
            (res, errors), (fresh, _), (upd, upd_errors) = await asyncio.gather(
                t._on_workers(calls, partial=True, arrived=arrived),
                t._on_workers(refresh, partial=True),
                t._on_workers(pending, partial=True),
            )
            for r in fresh.values():
                for s, m in r["sampler"].items():
                    t._masses.update(self.L, self.boundary, int(s), m)
            for a, (_, args) in pending.items():
                if a in upd:
                    t._updated(args["masses"] or [], upd[a])
                t._settle(args, a in upd)  # not known applied: stored again, minus what was updated since
            errors += upd_errors
        else:
            res, errors = await t._on_workers(calls, partial=True, arrived=arrived)
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
                    t.stats["remote_bytes"] += sum(out.bytes[c][o : o + n].nbytes for c in self.columns)
                elif "src_abs" in r:
                    torn = copied[a, s]
                    if len(torn):
                        t.stats["shared_conflicts"] += len(torn)
                        if self.record and counts is not None:  # a weighted draw: redraw just those rows
                            repairs.append((a, s, o, torn, calls[a][1]))
                        else:
                            errors.append(Retry())
                    t.stats["shared_bytes"] += sum(out.bytes[c][o : o + n].nbytes for c in self.columns)
                else:
                    t.stats["local_bytes"] += sum(out.bytes[c][o : o + n].nbytes for c in self.columns)
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
        for a, s, o, torn, args in repairs:
            if not errors:
                await self._redraw(a, mapped[a][s], s, o, torn, args)
        if errors:  # the parts that arrived are recorded above, so undo() can give them back
            t._masses.clear()
            e = errors[0]
            raise Retry() if isinstance(e, (StaleSelectionError, Retry)) else e
        return None

    def _copy_received(self, data: dict, o: int, n: int) -> None:
        for c in self.columns:
            self.out.bytes[c][o : o + n] = data[c]

    async def _off_loop(self, fn, rows: int, *args):
        """Run a copy of ``rows`` windows off the event loop when it is large: inside a worker in the
        plugin's threads (the worker's loop serves every other caller's requests), in a client in a small
        pool of its own while other copies may run (a Stream's requests in flight, the other parts of this
        batch): they overlap there; a client's only sample, from one worker, copies right here, sparing two
        thread hops (1 worker, 256 x 64 windows: 4.3-4.6 -> 5.1-5.2 GB/s)."""
        if rows * self.L * sum(self.out.bytes[c].shape[-1] for c in self.columns) < OFF_LOOP_BYTES:
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
            await t._on_workers(calls, partial=True)
        self.counted.clear()
        self.sent.clear()


class SamplingMixin:
    """Sampling methods of :class:`~gear_flow.distributed.DistributedTable`."""

    def sample(
        self,
        batch_size: int,
        length: int = 1,
        *,
        columns: str | Sequence[str] | None = None,
        boundary: str | None = None,
        timeout: float | None = None,
        out: SampleBuffers | None = None,
        rng: np.random.Generator | None = None,
    ) -> SampleBatch:
        """Sample ``batch_size`` windows of ``length`` steps from all shards.

        Blocks until the table's rate limiter admits the whole batch (or
        ``timeout``).  Items are drawn two-level (shard, then item) and each
        row reports the true probability of its draw.  Windows of shards on
        this worker (co-located learner) are gathered in-process, those on the
        same machine from shared memory when available, the rest over the
        comm.

        Parameters
        ----------
        batch_size : int
            ``B``, windows in the batch (>= 1).
        length : int, default 1
            ``L``, steps per window (>= 1).
        columns : str or sequence of str, optional
            Columns to gather (default: all of the spec).
        boundary : {"strict", "pad_tail", "pad_head"}, optional
            Windows crossing an episode's end: excluded (``strict``) or
            zero-padded with ``mask`` False; default the table's ``boundary``.
        timeout : float, optional
            Seconds to wait for admission; default the handle's ``timeout``
            (None: wait; the coordinator still ends a wait after config
            ``distributed.admission-timeout``).
        out : SampleBuffers, optional
            Buffers to gather into (reused between calls); must match
            ``columns``, ``batch_size``, ``length`` and the table's tier.
        rng : numpy.random.Generator, optional
            Replaces the handle's generator for this call (streams give each
            rank its own).

        Returns
        -------
        SampleBatch
            ``data`` ``[B, L, *column.shape]`` per column, ``keys``,
            ``probabilities``, importance ``weights``, ``mask`` ``[B, L]``,
            ``episode_ids``, ``timesteps``, ``priorities``,
            ``times_sampled``; see :class:`~gear_flow.sample.SampleBatch`.

        Raises
        ------
        SpecError
            Invalid ``batch_size``, ``length``, ``boundary``, ``columns`` or
            ``out``, or a batch larger than the limiter allows.
        EmptyTableError
            Nothing can be sampled: the table is empty, or no stored episode
            fits a ``strict`` window of ``length`` steps
            (:class:`~gear_flow.errors.WindowTooLongError`).
        RateLimitTimeout
            The limiter did not admit the batch within ``timeout``.
        ShardLostError
            A shard's worker is lost and the table is not ``degraded``.
        TableClosedError
            The table was closed.
        """
        fast = self._colocated_fast_path(batch_size, length, columns, boundary, out, rng)
        if fast is not None:
            return fast
        return self._ctx.sync(
            self.sample_async, batch_size, length, columns=columns, boundary=boundary, timeout=timeout, out=out, rng=rng
        )

    def _leases_ok(self) -> bool:
        return not self._cfg.exclusive and self._cfg.selection != "ordered"

    async def sample_async(
        self,
        batch_size: int,
        length: int = 1,
        *,
        columns: str | Sequence[str] | None = None,
        boundary: str | None = None,
        timeout: float | None = None,
        out: SampleBuffers | None = None,
        rng: np.random.Generator | None = None,
    ) -> SampleBatch:
        """:meth:`sample` for a caller inside the event loop (no co-located fast path).

        Parameters
        ----------
        batch_size : int
            ``B``, windows in the batch (>= 1).
        length : int, default 1
            ``L``, steps per window (>= 1).
        columns : str or sequence of str, optional
            Columns to gather (default: all).
        boundary : {"strict", "pad_tail", "pad_head"}, optional
            Window boundary mode; default the table's.
        timeout : float, optional
            Seconds to wait for admission; default the handle's.
        out : SampleBuffers, optional
            Buffers to gather into.
        rng : numpy.random.Generator, optional
            Replaces the handle's generator for this call.

        Returns
        -------
        SampleBatch
            As :meth:`sample`.

        Raises
        ------
        SpecError, EmptyTableError, RateLimitTimeout, ShardLostError, TableClosedError
            As :meth:`sample`.
        """
        boundary = self.boundary if boundary is None else boundary
        check_sample_args(batch_size, length, boundary)
        columns = sample_columns(self.spec, columns)
        if out is not None and not out.matches(columns, batch_size, length, self._cfg.tier):
            raise SpecError(
                f"out buffers are for columns={out.columns}, batch_size={out.batch_size}, length={out.length}, "
                f"tier={out.tier!r}; this call asks for columns={columns}, batch_size={batch_size}, length={length} "
                f"from a {backend.tier_name(self._cfg.tier)!r} table"
            )
        self._cfg.rate_limiter.check_sample_size(batch_size)
        self._check_not_lost()
        rng = self.rng if rng is None else rng
        # samples that change the table run one at a time (also on one worker: the next sample may only
        # be admitted once this one's expiries are counted); they never take leases
        exclusive = self._cfg.exclusive
        leased = self._leases_ok() and self._take_lease(batch_size)
        adm = {"txn": None, "horizon": None}
        if not leased:
            with self._lease_lock:
                done, self._lease_done = self._lease_done, 0
            adm = await self._coord(
                "admit_sample",
                n=batch_size,
                timeout=self.timeout if timeout is None else timeout,
                done=done,
                lease=config.get("distributed.sample-lease") if self._leases_ok() else 0,
                exclusive=exclusive,
                owner=self._ctx.owner,
            )
            await self._refresh(adm["version"])
            self._lease = (batch_size, adm.get("lease", 0), time.monotonic())
        expired = {}
        try:
            for attempt in range(_ATTEMPTS):
                workers = self._workers()
                if not workers:
                    raise EmptyTableError(f"table {self.name!r} has no reachable shard")
                try:
                    one = next(iter(workers)) if len(workers) == 1 else None
                    if one is not None and await self._shared_for(one) is None:  # one call does it all
                        out, expired = await self._sample_one_worker(
                            one, out, batch_size, length, boundary, columns, rng, adm["horizon"]
                        )
                    else:
                        if out is None:
                            out = SampleBuffers(self.spec, columns, batch_size, length, tier=self._cfg.tier)
                        expired = await self._sample_plan(
                            out, batch_size, length, boundary, columns, rng, adm, exclusive
                        )
                    break
                except (Retry, StaleSelectionError):
                    if attempt == _ATTEMPTS - 1:
                        raise
        except BaseException:
            if leased:
                with self._lease_lock:
                    self._lease_done -= batch_size
            else:
                await self._coord("sample_finished", txn=adm["txn"], rollback=batch_size)
            raise
        if exclusive:
            await self._coord("sample_finished", txn=adm["txn"], expired=expired)
        elif expired:
            await self._coord("removed", k=sum(expired.values()), per_shard=expired)
        self.stats["batches"] += 1
        self._issued.note(out.keys)
        maybe_report(self)
        return out.batch(-1)

    async def _sample_plan(self, out, B, L, boundary, columns, rng, adm, exclusive) -> dict:
        ex = RemoteSample(self, out, L, boundary, columns, rng, adm["txn"], not exclusive, adm["horizon"])
        _SAMPLING.n += 1
        try:
            layout = await planner.run_async(planner.sample(self._cfg.selection, B, rng), ex)
        except planner.NothingToSample:
            await ex.undo()
            await self._raise_empty(L, boundary)
        except BaseException:
            await ex.undo()
            raise
        finally:
            _SAMPLING.n -= 1
        if exclusive:  # every part arrived: commit the sample on the workers (count, expire)
            res = await self._on_workers(
                {a: ("finish_sample", dict(name=self.name, txn=adm["txn"], commit=True)) for a in ex.sent}
            )
            for r in res.values():
                for s, k in r.items():
                    ex.expired[s] = ex.expired.get(s, 0) + k
        if layout.rows_at is not None:
            out.permute(planner.sources(layout.rows_at))
        two_level.importance_weights(out.probabilities, self._cfg.beta, out.weights)
        return ex.expired

    def _take_lease(self, n: int) -> bool:
        """Serve this batch from a MinSize admission lease (fresh, same batch size, not used up)."""
        with self._lease_lock:
            size, left, since = self._lease
            if size != n or left <= 0 or time.monotonic() - since > config.get("distributed.sample-lease-seconds"):
                return False
            self._lease = (size, left - 1, since)
            self._lease_done += n
            return True

    def _colocated_fast_path(self, B, L, columns, boundary, out, rng):
        """A co-located learner whose worker holds every live shard, under a lease: sample in
        this thread, straight into the learner's buffers, without touching the event loop."""
        ctx = self._ctx
        if ctx.local_plugin is None or (self.lost and not self.degraded) or not self._leases_ok():
            return None
        if list(self._workers()) != [ctx.local_addr]:
            return None
        boundary = self.boundary if boundary is None else boundary
        check_sample_args(B, L, boundary)
        columns = sample_columns(self.spec, columns)
        if out is None:
            out = SampleBuffers(self.spec, columns, B, L, tier=self._cfg.tier)
        elif not out.matches(columns, B, L, self._cfg.tier):
            return None  # the slow path raises the clear error
        if not self._take_lease(B):
            return None
        rng = self.rng if rng is None else rng
        upd = self._ride_along(ctx.local_addr)
        try:
            res = ctx.local_plugin.host.sample_all(
                self.name, B, L, boundary, columns, int(rng.integers(2**63)), out=out, updates=upd
            )
        except BaseException:
            self._settle(upd, False)
            with self._lease_lock:
                self._lease_done -= B
            raise
        self._settle(upd, True)
        if "updated" in res:
            self._updated(upd["masses"] or [], res["updated"])
        self.stats["local_bytes"] += sum(a.nbytes for a in out.bytes.values())
        self.stats["batches"] += 1
        self._issued.note(out.keys)
        maybe_report(self)
        if res["expired"]:
            ctx.sync(self._coord, "removed", k=sum(res["expired"].values()), per_shard=res["expired"])
        return out.batch(-1)

    def flush(self) -> None:
        """Send stored priority updates (``update_priorities(wait=False)``) and report samples served
        under a lease to the coordinator now (``info()`` then counts them)."""
        self._ctx.sync(self._send_pending)
        with self._lease_lock:
            done, self._lease_done = self._lease_done, 0
        if done:
            self._ctx.sync(self._coord, "count_samples", n=done)

    async def _sample_one_worker(self, addr, out, B, L, boundary, columns, rng, horizon):
        args = dict(
            name=self.name,
            n=B,
            length=L,
            boundary=boundary,
            columns=columns,
            seed=int(rng.integers(2**63)),
            horizon=horizon,
        )
        upd = self._ride_along(addr)
        if upd is not None:
            args["updates"] = upd
        local = addr == self._ctx.local_addr and self._ctx.local_plugin is not None
        if local:
            if out is None:
                out = SampleBuffers(self.spec, columns, B, L, tier=self._cfg.tier)
            args["out"] = out  # co-located: gathered straight into the learner's buffers
        try:
            res = (await self._on_workers({addr: ("sample_all", args)}))[addr]
        except BaseException:
            self._settle(upd, False)
            raise
        self._settle(upd, True)
        if "updated" in res:
            self._updated(upd["masses"] or [], res["updated"])
        nbytes = B * L * sum(max(self.spec.column(c).nbytes, 1) for c in columns)
        if local:
            self.stats["local_bytes"] += nbytes
        elif out is None:
            out = SampleBuffers.wrap(self.spec, columns, L, res)  # the received frames are the batch
            self.stats["remote_bytes"] += nbytes
        else:
            for c in columns:
                out.bytes[c][...] = res["data"][c]
            for f in (
                "keys",
                "probabilities",
                "weights",
                "mask",
                "episode_ids",
                "timesteps",
                "priorities",
                "times_sampled",
            ):
                if f in res:
                    getattr(out, f)[...] = res[f]
            self.stats["remote_bytes"] += nbytes
        return out, res["expired"]

    async def _raise_empty(self, L, boundary):
        res = await self._on_workers({a: ("info", dict(name=self.name)) for a in self._workers()})
        infos = [i for r in res.values() for i in r]
        longest = max((i["longest_episode"] for i in infos), default=0)
        raise nothing_to_sample(f"table {self.name!r}", sum(i["size"] for i in infos), longest, L, boundary)
