"""Sampling methods of a distributed table: admission, attempts, the co-located fast path.

A sample is admitted by the coordinator (or served under an admission lease),
then planned by the planner shared with the local table, whose requests a
:class:`~gear_flow.distributed.remote_sample.RemoteSample` answers with the
shard workers (see that module for the per-selector rules); a stale selection
is retried up to a few times.  A co-located learner whose worker holds every
live shard, or a learner whose shards are all behind lanes (fast lanes on its
machine, TCP lanes elsewhere), samples in its own thread, without the event loop
(:mod:`~gear_flow.distributed.thread_sample`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import numpy as np

from .. import backend, config
from ..dashboard.report import maybe_report
from ..errors import EmptyTableError, GearFlowError, RateLimitTimeout, ShardMovedError, SpecError, nothing_to_sample
from ..sample import SampleBatch, SampleBuffers
from ..table import planner, two_level
from ..table.validate import check_sample_args, sample_columns
from .coordinator import admission_wait
from .host_sampling import ShortBatchError, StaleSelectionError
from .pending import book_reply, ride_along, send_pending, settle
from .remote_sample import _SAMPLING, RemoteSample
from .thread_sample import NotHere, ThreadSample, routes
from .transport import Retry, lost_reply, not_answered, reply_timeout, worker_alive

_ATTEMPTS = 8
logger = logging.getLogger(__name__)

#: the coordinator's answers to an admission that was never granted (the limiter counted nothing of it):
#: it did not come in time, its client went away, or it was refused at once
REFUSED = (RateLimitTimeout, SpecError)


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
            The limiter did not admit the batch within ``timeout``; or, with
            ``max_times_sampled``, the items left could not fill it by then
            (a batch waits for inserts, and takes nothing meanwhile).
        ShardLostError
            A shard's worker is lost and the table is not ``degraded``.
        TableClosedError
            The table was closed.
        """
        fast = self._sample_here(batch_size, length, columns, boundary, timeout, out, rng)
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
        self._view.check_not_lost()
        rng = self.rng if rng is None else rng
        # samples that change the table run one at a time (also on one worker: the next sample may only
        # be admitted once this one's expiries are counted); they never take leases
        exclusive = self._cfg.exclusive
        leased = self._leases_ok() and self._take_lease(batch_size)
        adm = {"txn": None, "horizon": None}
        start = time.monotonic()
        if not leased:
            adm = await self._admit(batch_size, timeout)
        lost_at = self._lost_at_grant(adm)
        expired = {}
        try:
            attempt = -1
            while True:
                attempt += 1
                if attempt == _ATTEMPTS:
                    raise self._redone_too_often()
                if exclusive and set(self.lost) != lost_at:
                    # admitted counting items of a shard lost since (each item goes out once): given back and
                    # waited for again, or the shards left would make up the batch with an item twice
                    txn, adm = adm["txn"], None  # (None: given back, not admitted again)
                    await self._link.coord("sample_finished", txn=txn, rollback=batch_size)
                    adm = await self._admit(batch_size, self._time_left(timeout, start))
                    lost_at = self._lost_at_grant(adm)
                    if set(self.lost) != lost_at:  # the placement moved again meanwhile
                        continue
                workers = self._view.workers()
                if not workers:
                    raise EmptyTableError(f"table {self.name!r} has no reachable shard")
                try:
                    one = next(iter(workers)) if len(workers) == 1 else None
                    if (  # one call does it all (with a lane, planned: the next samples go in the caller's thread)
                        one is not None and await self._link.route(one) is None and one not in self._ctx.lanes.paths
                    ):
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
                except (planner.ShortOfItems, ShortBatchError):
                    # the items left may go fewer times than the batch has rows (max_times_sampled; a queue's
                    # item deleted since the grant): nothing was taken; the admission is given back and the
                    # batch waits for items to arrive, as Reverb's sample waits for inserts (not an attempt)
                    attempt -= 1
                    txn, after, adm = adm["txn"], adm["arrivals"], None  # (None: given back, not admitted again)
                    await self._link.coord("sample_finished", txn=txn, rollback=batch_size)
                    left = self._time_left(timeout, start)
                    if left == 0.0:  # inserts keep coming, never enough: the caller's time is up
                        raise RateLimitTimeout(
                            f"a sample of {batch_size} on table {self.name!r} was not admitted within "
                            f"{self.timeout if timeout is None else timeout} s: too few items left for it"
                        ) from None
                    adm = await self._admit(batch_size, left, after=after)
                    lost_at = self._lost_at_grant(adm)
                except (Retry, StaleSelectionError) as e:
                    if attempt == _ATTEMPTS - 1:
                        if isinstance(e, Retry):  # internal: never the caller's
                            raise self._redone_too_often() from None
                        raise
        except BaseException:
            if not leased and adm is not None:  # (None: given back, not admitted again)
                await self._link.coord("sample_finished", txn=adm["txn"], rollback=batch_size)
            raise
        if leased:
            self._count_leased(batch_size)
        if exclusive:
            await self._link.coord("sample_finished", txn=adm["txn"], expired=expired)
        elif expired:
            await self._link.coord("removed", k=sum(expired.values()), per_shard=expired)
        return self._served(out)

    def _lost_at_grant(self, adm: dict) -> set | None:
        """The shards lost when ``adm`` was granted (None: unknown, this handle has a later placement)."""
        return set(self.lost) if adm.get("version", self._view.version) == self._view.version else None

    def _time_left(self, timeout: float | None, start: float) -> float | None:
        """What is left at ``start + timeout`` (the handle's timeout when None; None: the coordinator's)."""
        timeout = self.timeout if timeout is None else timeout
        return None if timeout is None else max(0.0, timeout - (time.monotonic() - start))

    def _redone_too_often(self) -> GearFlowError:
        return GearFlowError(
            f"a sample of table {self.name!r} was redone {_ATTEMPTS} times (workers lost or shards moved "
            "meanwhile each time) and given up"
        )

    async def _admit(self, n: int, timeout: float | None, after: int | None = None) -> dict:
        """The coordinator's admission of a batch of ``n`` (reporting the batches served under the lease
        since), with a new lease when the limiter gives one; placement changes picked up.  ``after``: the
        ``arrivals`` of a grant whose items left could not fill the batch (granted once more arrived)."""
        args = self._admission_args(n, timeout)
        if after is not None:
            args["after"] = after
        try:
            adm = await self._link.coord("admit_sample", **args)
        except REFUSED:  # never granted, so the leased samples it reported were not counted: kept for the next
            self._leased.add(args["done"])
            raise
        try:
            await self._link.refresh(adm["version"])
        except BaseException:  # granted, and never served: given back (an exclusive hold would block the table)
            try:
                await self._link.coord("sample_finished", txn=adm["txn"], rollback=n)
            except Exception as e:  # noqa: BLE001 - the refresh's error is the caller's
                logger.info("table %r: an admission not given back (%s)", self.name, e)
            raise
        return self._admitted(n, adm)

    def _admit_here(self, n: int, timeout: float | None) -> dict:
        """:meth:`_admit` from the caller's thread (over the coordinator's lane when found)."""
        args = self._admission_args(n, timeout)
        args["timeout"] = admission_wait(args["timeout"])  # the request's own: both ends give up together
        try:
            adm = self._link.coord_here("admit_sample", wait=args["timeout"], **args)
        except REFUSED:  # as in _admit
            self._leased.add(args["done"])
            raise
        if adm["version"] != self._view.version:
            try:
                self._ctx.sync(self._link.refresh, adm["version"])
            except BaseException:  # granted, and never served: given back, as in _admit
                try:
                    self._give_back(n, adm)
                except Exception as e:  # noqa: BLE001 - the refresh's error is the caller's
                    logger.info("table %r: an admission not given back (%s)", self.name, e)
                raise
        return self._admitted(n, adm)

    def _admission_args(self, n: int, timeout: float | None) -> dict:
        done = self._leased.take()
        return dict(
            n=n,
            timeout=self.timeout if timeout is None else timeout,
            done=done,
            lease=config.get("distributed.sample-lease") if self._leases_ok() else 0,
            exclusive=self._cfg.exclusive,
            owner=self._ctx.owner,
        )

    def _admitted(self, n: int, adm: dict) -> dict:
        self._lease = (n, adm.get("lease", 0), time.monotonic())
        return adm

    async def _sample_plan(self, out, B, L, boundary, columns, rng, adm, exclusive) -> dict:
        ex = RemoteSample(self, out, L, boundary, columns, rng, adm["txn"], not exclusive, adm["horizon"])
        _SAMPLING.n += 1
        try:
            layout = await planner.run_async(planner.sample(self._cfg.plan, B, rng), ex)
        except planner.NothingToSample:
            await ex.undo()
            await self._raise_empty(L, boundary)
        except BaseException:
            await ex.undo()
            raise
        finally:
            _SAMPLING.n -= 1
        if exclusive:  # every part arrived: commit the sample on the workers (count, expire)
            res, errors = await self._link.on_workers(
                {a: ("finish_sample", dict(name=self.name, txn=adm["txn"], commit=True)) for a in ex.sent},
                partial=True,
            )
            for r in res.values():
                for s, k in r.items():
                    ex.expired[s] = ex.expired.get(s, 0) + k
            errors = [e for e in errors if not isinstance(e, Retry)]
            if errors:
                if ex.expired:  # committed there: the coordinator's size follows before the error goes up
                    await self._link.coord("removed", k=sum(ex.expired.values()), per_shard=ex.expired)
                raise errors[0]
            # a worker lost while finishing (degraded: a Retry; its shards are marked lost) does not undo the
            # batch: every part is in it, and the other workers have expired what they handed out; its own
            # rows are handed out too, expired with their shard (the coordinator forgot them as unsampled)
            for a in set(ex.sent) - set(res):
                for s, k in ex.counted.get(a, {}).items():
                    if s in self.lost:
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
            return True

    def _count_leased(self, n: int) -> None:
        """A batch of ``n`` served under the lease: reported with the next admission (or :meth:`flush`).
        Counted once served, not when the lease is taken: a report sent meanwhile (another thread's
        admission) must not carry a batch that then fails and is not served."""
        self._leased.add(n)

    def _sample_here(self, B, L, columns, boundary, timeout, out, rng):
        """A weighted sample whose shards are all this worker's own or behind lanes (:func:`routes`):
        admitted (under a lease, or by the coordinator) and served in this thread, without the event loop,
        straight into the learner's buffers; None when the event loop must serve it (its admission and
        draws given back then)."""
        ctx = self._ctx
        if (self.lost and not self.degraded) or not self._leases_ok() or not routes(self):
            return None
        workers = list(self._view.workers())
        if not workers:
            return None
        boundary = self.boundary if boundary is None else boundary
        check_sample_args(B, L, boundary)
        if workers != [ctx.local_addr] and (
            self._cfg.plan != "weighted"
            or self._masses.fresh(("sampler",), L, boundary, self._view.live_shards())[0] is None
        ):
            return None  # its plan needs the workers first: the event loop's path asks them
        columns = sample_columns(self.spec, columns)
        if out is None:
            out = SampleBuffers(self.spec, columns, B, L, tier=self._cfg.tier)
        elif not out.matches(columns, B, L, self._cfg.tier):
            return None  # the event loop's path raises the clear error
        self._cfg.rate_limiter.check_sample_size(B)
        adm = None
        if not self._take_lease(B):
            adm = self._admit_here(B, timeout)
            workers = list(self._view.workers())
            if not routes(self) or not workers:  # the placement changed meanwhile
                self._give_back(B, adm)
                return None
        rng = self.rng if rng is None else rng
        ex = None
        try:
            if workers == [ctx.local_addr]:  # every live shard here: one call does it all
                expired = self._sample_all_here(B, L, boundary, columns, out, rng)
            else:
                ex = ThreadSample(self, out, L, boundary, columns, rng, None, True, None)
                planner.run(planner.sample(self._cfg.plan, B, rng), ex)
                two_level.importance_weights(out.probabilities, self._cfg.beta, out.weights)
                expired = ex.expired
        except NotHere:  # nothing was sent
            self._give_back(B, adm)
            return None
        except BaseException as e:  # what was drawn is given back, as on the event loop's path
            if ex is not None:
                try:
                    ctx.sync(ex.undo)
                except Exception as u:  # noqa: BLE001 - e.g. a worker gone: its counts leave with it
                    logger.info("table %r: a sample's draws not given back (%s)", self.name, u)
            self._give_back(B, adm)
            if isinstance(e, ShardMovedError):  # planned before shards moved: the event loop's path, as placed now
                ctx.sync(self._link.moved, e.epoch)
                return None
            if not isinstance(e, Exception) or ex is None:
                raise
            if ex.lost_reply is not None:  # the worker may have drawn: never drawn again silently
                self._raise_lost_reply(*ex.lost_reply)
            return None  # the event loop's path retries it, or raises its error
        self.stats["in_thread"] += 1
        if adm is None:
            self._count_leased(B)
        if expired:
            self._link.coord_here("removed", k=sum(expired.values()), per_shard=expired)
        return self._served(out)

    def _raise_lost_reply(self, addr: str, op: str, err: BaseException) -> None:
        """A lane request was sent and its reply lost: the worker may have run it, so the sample fails
        instead of being drawn again; a worker the scheduler removed makes its shards lost (the next call
        says so, or serves from the rest in a degraded table)."""
        ctx = self._ctx
        if isinstance(err, TimeoutError):
            limit = reply_timeout()
            alive = ctx.sync(worker_alive, ctx, self.name, addr, float(config.get("distributed.rpc-timeout")))
            if alive is False:
                try:
                    ctx.sync(self._link.handle_lost, [addr])  # raises ShardLostError ...
                except Retry:  # ... or, in a degraded table, the rest serve it (the event loop's path)
                    return
            raise not_answered(addr, op, limit, known=alive is not None) from None
        raise lost_reply(addr, op, err) from err

    def _give_back(self, n: int, adm: dict | None) -> None:
        """A batch of ``n`` admitted under the lease (``adm`` None: nothing counted yet) or by the
        coordinator was not served."""
        if adm is not None:
            self._link.coord_here("sample_finished", txn=adm["txn"], rollback=n)

    def _sample_all_here(self, B, L, boundary, columns, out, rng) -> dict:
        ctx = self._ctx
        upd = ride_along(self, ctx.local_addr)
        try:
            args = dict(name=self.name, n=B, length=L, boundary=boundary, columns=columns,
                        seed=int(rng.integers(2**63)), out=out, updates=upd)  # fmt: skip
            res = ctx.local_plugin.host.call("sample_all", ctx.stamped(args))
        except BaseException:
            settle(self, upd, False)
            raise
        settle(self, upd, True)
        if "updated" in res:
            book_reply(self, upd["masses"] or [], res["updated"])
        self.stats["local_bytes"] += sum(a.nbytes for a in out.bytes.values())
        return res["expired"]

    def _served(self, out: SampleBuffers) -> SampleBatch:
        """Count a batch served, note the keys it issued; the batch."""
        self.stats["batches"] += 1
        self._issued.note(out.keys)
        maybe_report(self)
        return out.batch(-1)

    def flush(self) -> None:
        """Send stored priority updates (``update_priorities(wait=False)``) and report samples served
        under a lease to the coordinator now (``info()`` then counts them)."""
        self._ctx.sync(send_pending, self)
        done = self._leased.take()
        if done:
            self._link.coord_here("count_samples", n=done)

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
        upd = ride_along(self, addr)
        if upd is not None:
            args["updates"] = upd
        local = addr == self._ctx.local_addr and self._ctx.local_plugin is not None
        if local:
            if out is None:
                out = SampleBuffers(self.spec, columns, B, L, tier=self._cfg.tier)
            args["out"] = out  # co-located: gathered straight into the learner's buffers
        try:
            res = (await self._link.on_workers({addr: ("sample_all", args)}))[addr]
        except BaseException:
            settle(self, upd, False)
            raise
        settle(self, upd, True)
        if "updated" in res:
            book_reply(self, upd["masses"] or [], res["updated"])
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
        res = await self._link.on_workers({a: ("info", dict(name=self.name)) for a in self._view.workers()})
        infos = [i for r in res.values() for i in r]
        longest = max((i["longest_episode"] for i in infos), default=0)
        raise nothing_to_sample(f"table {self.name!r}", sum(i["size"] for i in infos), longest, L, boundary)
