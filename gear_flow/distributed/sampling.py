"""Sampling a distributed table: one sample's steps, and their answers on the event loop.

A sample's steps are one generator, :func:`sample_steps`, which yields its
requests (admit, learn the placement, draw, give back, finish) and says
what every failure means; the event loop's :class:`LoopSampler` and the
caller's thread's :class:`~gear_flow.distributed.thread_sample.ThreadSampler`
answer them.  A sample is admitted by the coordinator (a :class:`SampleGrant`, given back
exactly once when the batch is not served) or served under the handle's
admission lease (:class:`~gear_flow.distributed.leases.Lease`), then planned
by the same planner as the local table's (:mod:`gear_flow.table.planner`),
whose requests a :class:`RemoteSample` answers with the shard workers in
parallel:

* weighted selectors: shard masses, then each worker draws its count with its
  shard's mass *at the draw*, so the probability reported, ``m_s / M * w / m'_s``,
  is the probability of the draw actually made even while writers insert;
* ordered selectors: candidates (only items stamped before the admission's
  horizon, so inserts still in flight never let a newer item overtake an
  older one), a global merge, the chosen slots taken, rows put in global order;
* epochs: unseen counts, hypergeometric counts, new epochs when they run out.

Windows come back as frames over the comm, are gathered straight into the
batch by a co-located worker, or are copied here from a same-machine
worker's shared rings under its seqlock (torn rows redrawn).  A selection
that went stale (an item removed between the candidates and the take) is
retried up to a few times.  For tables whose samples change the table
(expiry, epochs) and span several workers, the sample holds the table
exclusively at the coordinator and gathers first; it is committed on the
workers only once every part arrived, and undone otherwise, so a retry loses
nothing and an item that may be handed out once is handed out once.  Every
live shard on one worker: one request does the whole sample there,
atomically.  The caller's-thread path over the same executor is
:mod:`~gear_flow.distributed.thread_sample`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Generator, Iterable, Sequence
from concurrent.futures import CancelledError
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from .. import backend, config
from ..dashboard.report import maybe_report
from ..errors import EmptyTableError, GearFlowError, RateLimitTimeout, ShardLostError, SpecError, nothing_to_sample
from ..ops.gather import gather_windows
from ..sample import SampleBatch, SampleBuffers
from ..table import planner, two_level
from ..table.admission import CANCEL_TURN_S, WAIT_CANCELLED
from ..table.config import TableConfig, check_timeout
from ..table.validate import check_rng, check_sample_args, sample_columns
from . import reader_draw
from .host_sampling import ShortBatchError, StaleSelectionError
from .pending import book_reply, pending_calls, ride_along, settle
from .transport import Moved, Retry, Stale, TableLink, copy_pool, through_cancel

if TYPE_CHECKING:
    from .api import DistributedTable

_ATTEMPTS = 8
#: times a sample is redone because shards moved, besides :data:`_ATTEMPTS` (a rebalance moves a table's shards one
#: after the other, and a sample planned across them may be refused once by each move)
_MOVED_ATTEMPTS = 256
#: a sample's steps (:func:`sample_steps`): yields its requests, is sent their answers, returns its result
Steps = Generator[object, object, object]
logger = logging.getLogger(__name__)

#: the coordinator's answers to an admission that was never granted (the limiter counted nothing of it):
#: it did not come in time, its client went away, or it was refused at once
REFUSED = (RateLimitTimeout, SpecError)

#: copies of gathered windows at least this large run off the event loop
OFF_LOOP_BYTES = 1 << 20


class _Sampling:
    """Samples being planned in this process; a hint only (a miscount moves a copy between loop and pool)."""

    n = 0


_SAMPLING = _Sampling()


def leases_ok(cfg: TableConfig) -> bool:
    """Whether a table's samples may be served under an admission lease (not those that change the table,
    nor ordered ones: each of those is admitted at the coordinator).

    Parameters
    ----------
    cfg : TableConfig
        The table's configuration.

    Returns
    -------
    bool
        True for a weighted or uniform table whose samples leave it as it is.
    """
    return not cfg.exclusive and cfg.selection != "ordered"


class SampleGrant:
    """One batch's admission: the coordinator's grant, or (``adm`` None) a batch under the handle's lease.

    A grant is settled exactly once: given back when the batch is not
    served (:meth:`give_back`, :meth:`give_back_here`: the limiter's counts
    as before), or finished when an exclusive sample was committed
    (:meth:`finish`).  Settling it again does nothing, so every failure path
    may give it back without counting twice.

    Parameters
    ----------
    link : TableLink
        The handle's requests to the coordinator.
    n : int
        The batch's rows.
    adm : dict or None
        The coordinator's ``admit_sample`` answer (``txn``, ``horizon``,
        ``arrivals``, ``version``, ``lease``, ``size``); None: under the lease.
    leased_size : int, default -1
        Under the lease: the table's items when the lease was granted.
    """

    def __init__(self, link: TableLink, n: int, adm: dict | None, leased_size: int = -1) -> None:
        self._link = link
        self.n = n
        self.adm = adm
        self._leased_size = int(leased_size)
        self.open = adm is not None

    @property
    def leased(self) -> bool:
        """Whether the batch is served under the lease (nothing to give back)."""
        return self.adm is None

    @property
    def txn(self) -> str | None:
        """The admission's transaction id (None under the lease)."""
        return None if self.adm is None else self.adm["txn"]

    @property
    def horizon(self) -> int | None:
        """The admission's stamp: ordered selectors consider only items stamped before it."""
        return None if self.adm is None else self.adm.get("horizon")

    @property
    def table_size(self) -> int:
        """The table's items when the batch was admitted (under the lease: when the lease was granted)."""
        return self._leased_size if self.adm is None else int(self.adm.get("size", -1))

    @property
    def arrivals(self) -> int | None:
        """Inserts the coordinator had counted at the grant (a batch short of items waits for more)."""
        return None if self.adm is None else self.adm.get("arrivals")

    def _close(self) -> bool:
        was, self.open = self.open, False
        return was

    async def give_back(self) -> None:
        """The batch was not served: its admission goes back to the limiter (once)."""
        if self._close():
            await self._link.coordinator.sample_finished(self.adm["txn"], rollback=self.n)

    def give_back_here(self) -> None:
        """:meth:`give_back` from the caller's thread (over the coordinator's lane when found)."""
        if self._close():
            self._link.coordinator_here.sample_finished(self.adm["txn"], rollback=self.n)

    async def finish(self, expired: dict) -> None:
        """An exclusive sample was committed on the workers: its hold ends with the items that expired.

        Parameters
        ----------
        expired : dict of int to int
            Items expired per shard.
        """
        if self._close():
            await self._link.coordinator.sample_finished(self.adm["txn"], expired=expired)


# -- admission ---------------------------------------------------------------------------------------------------
def admission_args(table: DistributedTable, n: int, timeout: float | None) -> dict:
    """The ``admit_sample`` request's arguments of a batch of ``n``, reporting the batches served under the
    lease since the last admission.

    Parameters
    ----------
    table : DistributedTable
        The handle.
    n : int
        The batch's rows.
    timeout : float or None
        Seconds to wait (None: the handle's).

    Returns
    -------
    dict
        ``n``, ``timeout``, ``done``, ``lease``, ``exclusive``, ``owner``.
    """
    done = table._lease.report()
    return dict(
        n=n,
        timeout=table.timeout if timeout is None else timeout,
        done=done,
        lease=config.get("distributed.sample-lease") if leases_ok(table._cfg) else 0,
        exclusive=table._cfg.exclusive,
        owner=table._ctx.owner,
    )


def time_left(table: DistributedTable, timeout: float | None, start: float) -> float | None:
    """What is left at ``start + timeout`` (the handle's timeout when None; None: the coordinator's).

    Parameters
    ----------
    table : DistributedTable
        The handle.
    timeout : float or None
        The call's timeout.
    start : float
        ``time.monotonic()`` when the call began.

    Returns
    -------
    float or None
        Seconds left (>= 0), or None: no limit here.
    """
    timeout = table.timeout if timeout is None else timeout
    return None if timeout is None else max(0.0, timeout - (time.monotonic() - start))


def redone_too_often(table: DistributedTable, last: BaseException | None = None) -> GearFlowError:
    """The error of a sample given up after :data:`_ATTEMPTS` attempts.

    Parameters
    ----------
    table : DistributedTable
        The handle.
    last : BaseException, optional
        The last attempt's reason to redo it (a :class:`Retry` or a shard's
        :class:`StaleSelectionError`); None or one without words: shards lost or
        moved since it was placed.

    Returns
    -------
    GearFlowError
        Saying why, in the last attempt's words.
    """
    why = str(last) if last is not None and str(last) else "workers lost or shards moved meanwhile"
    return GearFlowError(
        f"a sample of table {table.name!r} was redone {_ATTEMPTS} times and given up; the last time: {why}"
    )


def served(table: DistributedTable, out: SampleBuffers, table_size: int) -> SampleBatch:
    """Count a batch served and note the keys it issued.

    Parameters
    ----------
    table : DistributedTable
        The handle.
    out : SampleBuffers
        The batch's buffers, filled.
    table_size : int
        The table's items when the batch was admitted.

    Returns
    -------
    SampleBatch
        The batch.
    """
    table.stats["batches"] += 1
    table._issued.note(out.keys)
    maybe_report(table)
    return out.batch(table_size)


def flush(table: DistributedTable) -> None:
    """Send stored priority updates (``update_priorities(wait=False)``) and the samples drawn here from
    published states to their owners, and report samples served under a lease to the coordinator, now
    (``info()`` then counts them).

    Parameters
    ----------
    table : DistributedTable
        The handle.
    """
    table._ctx.sync(reader_draw.flush, table)  # stored updates, and the samples drawn here, to their owners
    done = table._lease.report()
    if done:
        table._link.coordinator_here.count_samples(done)


# -- the driver: what a sample does, whichever executor answers it --------------------------------------------------
class Admit(NamedTuple):
    """Ask the coordinator to admit a batch; answered with its grant (``admit_sample``'s answer).

    Parameters
    ----------
    args : dict
        ``admit_sample``'s arguments (:func:`admission_args`).
    """

    args: dict


class Refresh(NamedTuple):
    """Learn the placement at ``version`` unless it is known already; answered with None.

    Parameters
    ----------
    version : int
        The placement version an admission was granted at.
    """

    version: int


class GiveBack(NamedTuple):
    """Give ``grant`` back (:meth:`SampleGrant.give_back`: once); answered with None.

    Parameters
    ----------
    grant : SampleGrant
        The grant of a batch not served.
    """

    grant: SampleGrant


class Gather(NamedTuple):
    """Gather and gather the batch under ``grant``, into ``out`` (None: buffers of the executor's choosing);
    answered with ``(buffers filled, {shard: items expired})``; what was drawn is undone before an error.

    Parameters
    ----------
    grant : SampleGrant
        The batch's grant.
    out : SampleBuffers or None
        The caller's buffers, or None.
    """

    grant: SampleGrant
    out: SampleBuffers | None


class Finish(NamedTuple):
    """An exclusive sample was committed on the workers: its hold ends (:meth:`SampleGrant.finish`).

    Parameters
    ----------
    grant : SampleGrant
        The batch's grant.
    expired : dict of int to int
        Items expired per shard.
    """

    grant: SampleGrant
    expired: dict


class Removed(NamedTuple):
    """Tell the coordinator the items a sample expired (a non-exclusive one's: its count follows them).

    Parameters
    ----------
    expired : dict of int to int
        Items expired per shard.
    """

    expired: dict


class SampleArgs(NamedTuple):
    """A sample call's arguments, checked (:func:`sample_args`).

    Parameters
    ----------
    batch_size : int
        ``B``: windows in the batch.
    length : int
        ``L``: steps per window.
    boundary : str
        Window boundary mode.
    columns : tuple of str
        Columns gathered.
    rng : numpy.random.Generator
        Draws the workers' seeds.
    timeout : float or None
        The call's timeout (None: the handle's).
    start : float
        ``time.monotonic()`` when the call began.
    cancelled : threading.Event or None
        The caller's :data:`~gear_flow.table.admission.WAIT_CANCELLED`
        event: once set, a wait for admission gives up.
    """

    batch_size: int
    length: int
    boundary: str
    columns: tuple[str, ...]
    rng: np.random.Generator
    timeout: float | None
    start: float
    cancelled: threading.Event | None = None


def sample_args(
    table: DistributedTable,
    batch_size: int,
    length: int,
    columns: str | Sequence[str] | None,
    boundary: str | None,
    timeout: float | None,
    out: SampleBuffers | None,
    rng: np.random.Generator | None,
) -> SampleArgs:
    """A sample call's arguments checked, its defaults taken from the handle.

    Parameters
    ----------
    table : DistributedTable
        The handle.
    batch_size, length : int
        ``B`` and ``L``.
    columns : str or sequence of str or None
        Columns to gather (None: all).
    boundary : str or None
        Window boundary mode (None: the table's).
    timeout : float or None
        Seconds to wait for admission (None: the handle's).
    out : SampleBuffers or None
        Buffers to gather into.
    rng : numpy.random.Generator or None
        Replaces the handle's generator.

    Returns
    -------
    SampleArgs
        The call, checked.

    Raises
    ------
    SpecError
        Invalid ``batch_size``, ``length``, ``boundary``, ``timeout``,
        ``columns`` or ``out``, or a batch larger than the limiter allows.
    ShardLostError
        A shard is lost and the table is not ``degraded``.
    """
    cfg = table._cfg
    boundary = table.boundary if boundary is None else boundary
    check_sample_args(batch_size, length, boundary, table.spec.capacity)
    timeout = check_timeout(timeout)  # (inf: its seconds)
    check_rng(rng)
    columns = sample_columns(table.spec, columns)
    if out is not None:
        out.check(table.spec, columns, batch_size, length, cfg.tier)
    cfg.check_sample_size(batch_size)
    table._view.check_not_lost()
    rng = table.rng if rng is None else rng
    return SampleArgs(batch_size, length, boundary, columns, rng, timeout, time.monotonic(), WAIT_CANCELLED.get())


def _admit(
    table: DistributedTable,
    n: int,
    timeout: float | None,
    after: int | None = None,
    cancelled: threading.Event | None = None,
) -> Steps:
    """The coordinator's admission of a batch of ``n``, with a new lease when the limiter gives one, and
    the placement it was granted at learnt; ``after``: the ``arrivals`` of a grant whose items left could not
    fill the batch (granted once more have arrived).  With ``cancelled`` (the caller may give it up: the
    coordinator's line has no cancel) the wait is asked for in turns of
    :data:`~gear_flow.table.admission.CANCEL_TURN_S`, and ends in ``CancelledError`` once the event is set,
    nothing taken.  Returns the grant, open."""
    start = time.monotonic()
    while True:
        left = time_left(table, timeout, start)
        last = cancelled is None or (left is not None and left <= CANCEL_TURN_S)
        if cancelled is not None and cancelled.is_set():
            raise CancelledError(f"a waiting sample of table {table.name!r} was given up by its caller")
        args = admission_args(table, n, left if last else CANCEL_TURN_S)
        if after is not None:
            args["after"] = after
        try:
            adm = yield Admit(args)
            break
        except (*REFUSED, ShardLostError) as e:  # never granted: the leased samples it reported were not counted
            table._lease.not_reported(args["done"])
            if last or not isinstance(e, RateLimitTimeout):
                raise
    grant = SampleGrant(table._link, n, adm)
    try:
        yield Refresh(adm["version"])
    except BaseException:  # granted, and never served: given back (an exclusive hold would block the table)
        try:
            yield GiveBack(grant)
        except Exception as e:  # noqa: BLE001 - the refresh's error is the caller's
            logger.info("table %r: an admission not given back (%s)", table.name, e)
        raise
    table._lease.granted(n, adm.get("lease", 0), adm.get("size", -1))
    return grant


def _time_up(table: DistributedTable, call: SampleArgs, what: str, why: str) -> RateLimitTimeout:
    """The error of a sample whose caller's time ran out while it was redone: not ``what`` within it, ``why``."""
    timeout = table.timeout if call.timeout is None else call.timeout
    return RateLimitTimeout(
        f"a sample of {call.batch_size} on table {table.name!r} was not {what} within {timeout} s: {why}"
    )


def sample_steps(table: DistributedTable, call: SampleArgs, out: SampleBuffers | None) -> Steps:
    """One sample, sans I/O: the requests it makes (:class:`Admit`, :class:`Refresh`, :class:`Gather`,
    :class:`GiveBack`, :class:`Finish`, :class:`Removed`), yielded to an executor that answers each, or
    throws its error in.

    The one place that says what a sample does: served under the lease
    or admitted; an exclusive sample admitted counting a shard lost since
    admitted again; a batch the items left cannot fill given back and
    waited for again once items arrive (as Reverb's sample waits for
    inserts); a draw that met a moved shard, a lost worker or a stale
    selection drawn again (up to :data:`_ATTEMPTS` times; an exclusive
    sample's stale selection, an item a delete took, as often as that
    happens while the caller's time lasts); the grant given back on every
    failure; the expired items counted.  The event loop
    (:class:`LoopSampler`) and the caller's thread
    (:class:`~gear_flow.distributed.thread_sample.ThreadSampler`) answer it
    (:func:`gear_flow.table.planner.run_async`, :func:`~gear_flow.table.planner.run`).

    Parameters
    ----------
    table : DistributedTable
        The handle.
    call : SampleArgs
        The call, checked.
    out : SampleBuffers or None
        The caller's buffers.

    Returns
    -------
    generator
        Yields the requests; returns the :class:`~gear_flow.sample.SampleBatch`.
    """
    t, view, B = table, table._view, call.batch_size
    # samples that change the table run one at a time (also on one worker: the next sample may only
    # be admitted once this one's expiries are counted); they never take leases
    exclusive = t._cfg.exclusive
    if leases_ok(t._cfg) and t._lease.take(B):
        grant = SampleGrant(t._link, B, None, t._lease.table_size)
    else:
        grant = yield from _admit(t, B, call.timeout, cancelled=call.cancelled)
    lost_at = _lost_at_grant(t, grant) if exclusive else None
    expired = {}
    try:
        attempt, moved = -1, 0
        while True:
            attempt += 1
            if attempt == _ATTEMPTS:
                raise redone_too_often(t, Retry("the shards' placement moved again while the batch was admitted"))
            # the grant's placement (or a draw's Retry) may show a shard lost since the call was checked: a
            # table that is not degraded refuses then too, where the plan would have drawn from the others
            view.check_not_lost()
            if exclusive and set(view.lost) != lost_at:
                # admitted counting items of a shard lost since (each item goes out once): given back and
                # waited for again, or the shards left would make up the batch with an item twice
                yield GiveBack(grant)
                grant = yield from _admit(t, B, time_left(t, call.timeout, call.start), cancelled=call.cancelled)
                lost_at = _lost_at_grant(t, grant)
                if set(view.lost) != lost_at:  # the placement moved again meanwhile
                    continue
            try:
                out, expired = yield Gather(grant, out)
                break
            except (planner.ShortOfItems, ShortBatchError):
                # the items left may go fewer times than the batch has rows (max_times_sampled; a queue's
                # item deleted since the grant): nothing was taken; the admission is given back and the
                # batch waits for items to arrive, as Reverb's sample waits for inserts (not an attempt)
                attempt -= 1
                after = grant.arrivals
                yield GiveBack(grant)
                left = time_left(t, call.timeout, call.start)
                if left == 0.0:  # inserts keep coming, never enough: the caller's time is up
                    raise _time_up(t, call, "admitted", "too few items left for it") from None
                grant = yield from _admit(t, B, left, after=after, cancelled=call.cancelled)
                lost_at = _lost_at_grant(t, grant) if exclusive else None
            except (Retry, StaleSelectionError) as e:
                if exclusive and isinstance(e, (StaleSelectionError, Stale)):
                    # a delete (or an eviction) took an item it chose: nothing was taken, and the table
                    # changed, so it is planned again as often as that happens while the caller's time lasts
                    # (an attempt counts shards moving, which each redo must get past)
                    if time_left(t, call.timeout, call.start) == 0.0:
                        raise _time_up(t, call, "served", f"the items it chose were removed each time ({e})") from None
                    attempt -= 1
                elif (
                    isinstance(e, Moved)
                    and moved < _MOVED_ATTEMPTS
                    and time_left(t, call.timeout, call.start) != 0.0  # (None: no limit)
                ):
                    # a move ended (its source refused what was planned before it; the placement is known now):
                    # redone where the shards are now, however many moves a rebalance or a retirement makes one
                    # after the other (each move of such a run may refuse it once)
                    moved += 1
                    attempt -= 1
                elif attempt == _ATTEMPTS - 1:
                    raise redone_too_often(t, e) from None
    except BaseException:
        yield GiveBack(grant)
        raise
    if grant.leased:
        t._lease.served(B)
    if exclusive:
        yield Finish(grant, expired)
    elif expired:
        yield Removed(expired)
    return served(t, out, grant.table_size)


class LoopSampler:
    """Answers :func:`sample_steps` on the event loop: the coordinator over its lane or the comm, the draws
    with the workers (one request when every live shard is on one worker without a lane, else the plan's
    requests, :class:`RemoteSample`).

    Parameters
    ----------
    table : DistributedTable
        The handle.
    call : SampleArgs
        The call.
    """

    def __init__(self, table: DistributedTable, call: SampleArgs) -> None:
        self.t = table
        self.call = call

    async def __call__(self, req: object) -> object:
        """Answer one request of the steps.

        Parameters
        ----------
        req : Admit, Refresh, GiveBack, Gather, Finish or Removed
            The request.

        Returns
        -------
        object
            Its answer.
        """
        link = self.t._link
        if isinstance(req, Gather):
            return await self._draw(req.grant, req.out)
        if isinstance(req, Admit):
            return await link.coordinator.admit_sample(**req.args)
        if isinstance(req, Refresh):
            return await link.refresh(req.version)
        if isinstance(req, GiveBack):
            return await through_cancel(req.grant.give_back())
        if isinstance(req, Finish):  # (the items a batch took: counted, and its hold released, to their ends)
            return await through_cancel(req.grant.finish(req.expired))
        if isinstance(req, Removed):
            return await through_cancel(link.coordinator.removed(sum(req.expired.values()), req.expired))
        raise TypeError(f"not a sample's request: {req!r}")

    async def _draw(self, grant: SampleGrant, out: SampleBuffers | None) -> tuple:
        t, c = self.t, self.call
        workers = t._view.workers()
        if not workers:
            raise EmptyTableError(f"table {t.name!r} has no reachable shard")
        one = next(iter(workers)) if len(workers) == 1 else None
        # one call does it all (with a lane, planned: the next samples go in the caller's thread)
        if one is not None and await t._link.route(one) is None and one not in t._ctx.lanes.paths:
            return await _sample_one_worker(
                t, one, out, c.batch_size, c.length, c.boundary, c.columns, c.rng, grant.horizon
            )
        if out is None:
            out = SampleBuffers(t.spec, c.columns, c.batch_size, c.length, tier=t._cfg.tier)
        expired = await _sample_plan(
            t, out, c.batch_size, c.length, c.boundary, c.columns, c.rng, grant, t._cfg.exclusive
        )
        return out, expired


async def sample_async(
    table: DistributedTable,
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

    (``sample_async``: for a caller inside the event loop; it never takes
    the caller's-thread path of ``sample``.)  Blocks until the table's rate limiter admits the whole batch (or
    ``timeout``).  Items are drawn two-level (shard, then item) and each
    row reports the true probability of its draw.  Windows of shards on
    this worker (co-located learner) are gathered in-process, those on the
    same machine from shared memory when available, the rest over the
    comm.

    Parameters
    ----------
    table : DistributedTable
        The handle.
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
    InterruptedInFlight
        (The blocking ``sample`` carried by the event loop.) Interrupted
        while it waited: ``.outcome`` ends with the batch (a Queue's
        items taken, the commit begun) or ``CancelledError`` (nothing
        taken).
    """
    call = sample_args(table, batch_size, length, columns, boundary, timeout, out, rng)
    return await planner.run_async(sample_steps(table, call, out), LoopSampler(table, call))


def _lost_at_grant(table: DistributedTable, grant: SampleGrant) -> set | None:
    """The shards lost when ``grant`` was given (None: unknown, this handle has a later placement)."""
    view = table._view
    adm = grant.adm or {}
    return set(view.lost) if adm.get("version", view.version) == view.version else None


async def _sample_plan(table, out, B, L, boundary, columns, rng, grant: SampleGrant, exclusive) -> dict:
    t = table
    ex = RemoteSample(t, out, L, boundary, columns, rng, grant.txn, not exclusive, grant.horizon)
    _SAMPLING.n += 1
    try:
        layout = await planner.run_async(planner.sample(t._cfg.plan, B, rng), ex)
        # the plan read the live shards as it ran: a loss learnt meanwhile (a refresh, a report that met the
        # dead worker) refuses the batch a table not degraded would have refused before, drawn from the rest
        t._view.check_not_lost()
    except planner.NothingToSample:
        await through_cancel(ex.undo())
        await _raise_empty(t, B, L, boundary)
    except BaseException:  # (a cancel too: what was drawn is given back, to its end)
        await through_cancel(ex.undo())
        raise
    finally:
        _SAMPLING.n -= 1
    if exclusive:  # every part arrived: commit the sample on the workers (count, expire)
        # begun, the commit goes to its end through a cancel, and the batch is returned: some workers may have
        # handed their items out already, which cannot be taken back (through_cancel)
        res, errors = await through_cancel(
            t._link.on_workers(
                {a: ("finish_sample", dict(name=t.name, txn=grant.txn, commit=True)) for a in ex.sent},
                partial=True,
            )
        )
        for r in res.values():
            for s, k in r.items():
                ex.expired[s] = ex.expired.get(s, 0) + k
        errors = [e for e in errors if not isinstance(e, Retry)]
        if errors:
            if ex.expired:  # committed there: the coordinator's size follows before the error goes up
                await t._link.coordinator.removed(sum(ex.expired.values()), ex.expired)
            raise errors[0]
        # a worker lost while finishing (degraded: a Retry; its shards are marked lost) does not undo the
        # batch: every part is in it, and the other workers have expired what they handed out; its own
        # rows are handed out too, expired with their shard (the coordinator forgot them as unsampled),
        # also when the shard was restored meanwhile: they are the lost incarnation's, which the
        # coordinator tells apart by the grant
        now = t._view.now().incarnation
        for a in set(ex.sent) - set(res):
            for s, k in ex.counted.get(a, {}).items():
                if s in t.lost or now.get(s, 0) != ex.incarnation.get(s, 0):
                    ex.expired[s] = ex.expired.get(s, 0) + k
    ex.stands()
    if layout.rows_at is not None:
        out.permute(planner.sources(layout.rows_at))
    two_level.importance_weights(out.probabilities, t._cfg.beta, out.weights)
    return ex.expired


async def _sample_one_worker(table, addr, out, B, L, boundary, columns, rng, horizon):
    t = table
    args = dict(
        name=t.name,
        n=B,
        length=L,
        boundary=boundary,
        columns=columns,
        seed=int(rng.integers(2**63)),
        horizon=horizon,
    )
    upd = ride_along(t, addr)
    if upd is not None:
        args["updates"] = upd
    local = addr == t._ctx.local_addr and t._ctx.local_plugin is not None
    if local:
        if out is None:
            out = SampleBuffers(t.spec, columns, B, L, tier=t._cfg.tier)
        args["out"] = out  # co-located: gathered straight into the learner's buffers
    sent = t._link.on_workers({addr: ("sample_all", args)})
    try:
        # a sample that changes the table (its items leave, or are counted) is committed by the worker as it
        # draws: sent, it goes to its end through a cancel, and the batch is returned (through_cancel)
        res = (await (through_cancel(sent) if t._cfg.exclusive else sent))[addr]
    except BaseException:
        settle(t, upd, False)
        raise
    settle(t, upd, True)
    if "updated" in res:
        book_reply(t, upd["masses"] or [], res["updated"])
    nbytes = B * L * t.spec.batch_step_nbytes(columns)
    if local:
        t.stats["local_bytes"] += nbytes
    elif out is None:
        out = SampleBuffers.wrap(t.spec, columns, L, res)  # the received frames are the batch
        t.stats["remote_bytes"] += nbytes
    else:
        for c in columns:
            out.bytes[c][...] = res["data"][c]
        for f in ("keys", "probabilities", "weights", "mask", "episode_ids", "timesteps", "priorities",
                  "times_sampled"):  # fmt: skip
            if f in res:
                getattr(out, f)[...] = res[f]
        t.stats["remote_bytes"] += nbytes
    return out, res["expired"]


async def _raise_empty(table, B, L, boundary):
    t = table
    res = await t._link.on_workers({a: ("info", dict(name=t.name)) for a in t._view.workers()})
    infos = [i for r in res.values() for i in r]
    longest = max((i["longest_episode"] for i in infos), default=0)
    size = sum(i["size"] for i in infos)
    if planner.short_not_empty(size, L, boundary):  # (admitted: the limiter saw items)
        raise planner.ShortOfItems(0, B)
    raise nothing_to_sample(f"table {t.name!r}", size, longest, L, boundary)


# -- the executor ------------------------------------------------------------------------------------------------
class RemoteSample:
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
        #: shard -> rows drawn from published states (here, or by a worker for its host), for their owners'
        #: counts once the sample stands (:meth:`stands`); booked at once, an attempt undone or interrupted
        #: after them left the owners counting samples never served
        self.drawn_by_readers: dict[int, int] = {}
        self.sent = set()  # workers asked for parts (pending parts to undo, record=False)
        self.expired = {}
        self.one_part = False  # the parts in flight come from one worker
        #: the shards' incarnations this attempt was planned at (a shard rebuilt since holds other items)
        self.incarnation = table._view.now().incarnation
        self.row_bytes = sum(out.bytes[c].shape[-1] for c in columns)  # one window step, all columns
        self._published: dict | None = None  # reader_draw.published, once per attempt
        #: shards a worker drawing for its host left to their owners (drawn by them next, ``no_host_draw``)
        self.fallback: list[int] = []
        self.no_host_draw = False
        self.hosted: set[str] = set()  # workers of the last part_calls whose host drew for them
        #: seeds drawn for workers whose part this process meant to draw itself and left to them
        #: (:func:`~gear_flow.distributed.reader_draw.plan`): their owner draws with them
        self.seeds: dict[str, int] = {}
        #: the seeds of the workers whose part another worker of their host was asked to draw
        self.host_seeds: dict[str, int] = {}

    def published_here(self) -> dict:
        """The shards this attempt may draw itself (:func:`~gear_flow.distributed.reader_draw.published`),
        looked at once per attempt (a dead owner's found by the next).

        Returns
        -------
        dict of int to Attached
            ``{shard: mapping}``.
        """
        if self._published is None:
            self._published = reader_draw.published(self.t)
        return self._published

    def summaries_args(self, kinds: Sequence[str]) -> dict:
        """The arguments of this sample's ``summaries`` request to a worker.

        Parameters
        ----------
        kinds : sequence of str
            The summaries asked for (:class:`~gear_flow.table.planner.Summaries`).

        Returns
        -------
        dict
            ``name``, ``kinds``, ``length`` and ``boundary``.
        """
        return dict(name=self.t.name, kinds=tuple(kinds), length=self.L, boundary=self.boundary)

    def keep_summaries(self, kinds: Sequence[str], replies: Iterable[dict]) -> dict:
        """The workers' ``summaries`` replies as one, kept for the next plans (:class:`~.masses.MassCache`).

        Parameters
        ----------
        kinds : sequence of str
            The summaries asked for.
        replies : iterable of dict
            Each worker's reply, ``{kind: {shard: value}}`` of its shards.

        Returns
        -------
        dict
            ``{kind: {shard: value}}`` over every worker's shards.
        """
        got = {k: {s: v for r in replies for s, v in r[k].items()} for k in kinds}
        self.t._masses.store(kinds, self.L, self.boundary, got)
        return got

    async def __call__(self, req):
        t = self.t
        workers = t._view.workers()
        if isinstance(req, planner.Summaries):
            here = reader_draw.fresh_masses(self, req.kinds)
            if here is not None:  # read from the shards' published states: no request
                return here
            cached = t._masses.fresh(req.kinds, self.L, self.boundary, t._view.live_shards())
            if cached is not None:
                return cached
            res = await t._link.on_workers({a: ("summaries", self.summaries_args(req.kinds)) for a in workers})
            return self.keep_summaries(req.kinds, res.values())
        if isinstance(req, planner.Candidates):
            args = dict(
                name=t.name, n=req.n, role=req.role, length=self.L, boundary=self.boundary, horizon=self.horizon
            )
            res = await t._link.on_workers({a: ("candidates", args) for a in workers})
            return {s: c for r in res.values() for s, c in r.items()}
        if isinstance(req, planner.NewEpoch):
            # a batch gathered first goes on in the new epoch: its items drawn as often as they may still go stay out
            args = dict(name=t.name) if self.record else dict(name=t.name, txn=self.txn)
            await t._link.on_workers({a: ("new_epoch", args) for a in workers})
            return None
        if isinstance(req, planner.Draw):
            return await self._draw_parts(
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
            await self._draw_parts(req.slots, offs, slots=req.slots, seqs=req.seqs)
            for s, p in (req.probs or {}).items():  # a sequential draw's: the workers report 1 for a take
                self.out.probabilities[offs[s] : offs[s] + len(p)] = p
            return None
        raise TypeError(f"unknown plan request {req!r}")

    async def _draw_parts(self, part, offs, counts=None, scale=None, slots=None, by_count=False, seqs=None):
        t = self.t
        if counts is not None and not by_count and self.record:  # the shards whose state is published: drawn here
            here, left = reader_draw.plan(self, offs, counts)
            if here:
                rows = sum(int(counts[s]) for _, shards, _ in here for s in shards)
                left.update(await self._off_loop(reader_draw.draw_parts, rows, self, here, offs, counts, scale))
                offs = {s: offs[s] for s in offs if s in left}
                if not offs:
                    return None
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

        # stored updates of workers not drawn from: same round trip (those another worker drew for: soon, batched)
        pending = pending_calls(t, exclude=set(calls) | self.hosted)
        if pending:
            (res, errors), (upd, upd_errors) = await asyncio.gather(
                t._link.on_workers(calls, partial=True, arrived=arrived),
                t._link.on_workers(pending, partial=True),
            )
            self.book_extras(pending, upd)
            errors += upd_errors
        else:
            res, errors = await t._link.on_workers(calls, partial=True, arrived=arrived)
        repairs = self.book(calls, res, copied, offs, counts, errors)
        for a, s, o, torn, args in repairs:
            if not errors:
                await self._redraw(a, mapped[a][s], s, o, torn, args)
        self.raise_errors(errors)
        if self.fallback:  # parts a worker could not draw for its host: their owners draw them
            left, self.no_host_draw = self.left_by_hosts(), True
            try:
                await self._draw_parts(part, {s: offs[s] for s in left}, counts=counts, scale=scale)
            finally:
                self.no_host_draw = False
        return None

    def left_by_hosts(self) -> list[int]:
        """The shards of the parts that workers drawing for their host left to the owners (``fallback``), taken;
        each of those workers' seeds is kept for its owner's request, which draws the part with it, as it
        would have drawn it without a host's worker.

        Returns
        -------
        list of int
            The shards.
        """
        left, self.fallback = self.fallback, []
        for a in {self.t.placement[s] for s in left}:
            if a in self.host_seeds:
                self.seeds[a] = self.host_seeds[a]
        return left

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
            ``{worker: ("sample_part", arguments)}``; the workers of another
            host whose shards publish their state get one ``("draw_host",
            arguments)`` to one of them (:func:`~.reader_draw.host_groups`).
        """
        t, out = self.t, self.out
        by = defaultdict(list)
        for s in offs:
            by[t.placement[s]].append(s)
        calls = {}
        drawable = counts is not None and slots is None and not by_count and self.record and not self.no_host_draw
        hosts = reader_draw.host_groups(self, by, mapped) if drawable else {}
        self.hosted = set(hosts)
        host_parts: dict[str, dict] = defaultdict(dict)
        for a, shards in by.items():
            seed = self.seeds.pop(a) if a in self.seeds else int(self.rng.integers(2**63))
            if a in hosts:  # another host's worker: one worker there draws for all of them
                self.host_seeds[a] = seed  # its owner's, should that worker leave the part to it
                host_parts[hosts[a]][a] = {"layout": t._routes.far(a), "counts": {s: counts[s] for s in shards},
                                           "scale": {s: scale[s] for s in shards}, "seed": seed}  # fmt: skip
                continue
            args = dict(
                name=t.name,
                length=self.L,
                boundary=self.boundary,
                columns=self.columns,
                seed=seed,
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
            upd = ride_along(t, a)  # this handle's stored priority updates for a's shards: applied before the draw
            if upd is not None:
                args["updates"] = upd
            if a == t._ctx.local_addr and t._ctx.local_plugin is not None:
                args.update(out=out.bytes, offsets={s: offs[s] for s in shards})  # co-located: straight into the batch
            elif a in mapped:
                args["geometry"] = True  # same machine: the owner selects, we copy from its shared rings
            calls[a] = ("sample_part", args)
        for server, parts in host_parts.items():
            calls[server] = ("draw_host", dict(name=t.name, length=self.L, boundary=self.boundary,
                                               columns=self.columns, parts=parts))  # fmt: skip
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

    def book_extras(self, pending: dict, upd: dict) -> None:
        """Book the replies of the stored updates sent with a draw (an update not known applied is stored
        again, not an error of the draw).

        Parameters
        ----------
        pending : dict
            ``{worker: ("update", arguments)}`` sent with the draw.
        upd : dict
            ``{worker: update reply}`` of those applied.
        """
        t = self.t
        for a, (_, args) in pending.items():
            if a in upd:
                book_reply(t, args["masses"] or [], upd[a])
            settle(t, args, a in upd)  # not known applied: stored again, minus what was updated since

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
                settle(t, args["updates"], a in res)
        repairs = []
        for a, parts in res.items():
            if "updated" in parts:
                book_reply(t, calls[a][1]["updates"]["masses"] or [], parts.pop("updated"))
            self.fallback.extend(parts.pop("fallback", ()))
            for s, r in parts.items():
                o, n = offs[s], len(r["seqs"])
                if r.get("drawn_here"):  # drawn for its host by another of its workers: its owner counts it later
                    self.drawn_by_readers[s] = self.drawn_by_readers.get(s, 0) + n
                else:
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
                            errors.append(
                                Retry(f"shard {s}: windows read from shared memory were written over meanwhile")
                            )
                    t.stats["shared_bytes"] += n * self.L * self.row_bytes
                else:
                    t.stats["local_bytes"] += n * self.L * self.row_bytes
                out.fill_rows(
                    o,
                    s,
                    r["seqs"],
                    r["p"],
                    r["episode_ids"],
                    r["timesteps"],
                    r["dst_offset"],
                    r["n_valid"],
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
        Stale
            A stale selection (the table changed since the plan).
        Retry
            A retry (shards moved, a worker lost).
        Exception
            Any other error, as it came.
        """
        if errors:  # the parts that arrived are recorded in book(), so undo() can give them back
            self.t._masses.clear()
            e = errors[0]
            if isinstance(e, StaleSelectionError):  # its words kept: a sample given up names them
                raise Stale(str(e))
            if isinstance(e, Moved):  # (a move's refusal: the sample's redo does not count it an attempt)
                raise Moved(e.addrs)
            if isinstance(e, Retry):
                raise Retry(str(e))
            raise e

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
        pool = plugin.executor if plugin is not None else copy_pool()
        return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)

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
        self.drawn_by_readers.clear()

    def stands(self) -> None:
        """The sample is whole and goes to its caller: the rows readers drew for it are counted for their
        owners (the handle reports them soon, :func:`~gear_flow.distributed.reader_draw.flush_soon`)."""
        if self.drawn_by_readers:
            self.t._drawn.add(self.drawn_by_readers)
            self.drawn_by_readers.clear()
            reader_draw.flush_soon(self.t)

    # -- windows read from a same-machine worker's shared rings (its seqlock says which rows were torn) ------
    def _copy_shared(self, sh, r, o: int) -> np.ndarray:
        """Copy a part's windows from a mapped shared ring into rows ``o:``; returns the torn rows (seqlock)."""
        n = len(r["seqs"])
        src = np.asarray(r["src_abs"], dtype=np.int64)
        if self.out.on_device:  # a pinned table: this process's GPU reads the page-locked segments
            from ..gpu.shared import gather_shared

            gather_shared(
                sh, self.columns, src, np.asarray(r["dst_offset"]), np.asarray(r["n_valid"]), self.out.bytes, o
            )
            return np.flatnonzero(~sh.intact(src))
        for c in self.columns:
            gather_windows(sh.bytes[c], src % sh.capacity, np.asarray(r["dst_offset"]), np.asarray(r["n_valid"]),
                           self.out.bytes[c][o : o + n])  # fmt: skip
        return np.flatnonzero(~sh.intact(src))  # read after the copy

    async def _redraw(self, a, sh, s: int, o: int, torn: np.ndarray, args: dict) -> None:
        """Rows whose windows were overwritten while being copied: draw them again from shard ``s``.

        Each redrawn row reports the probability of its own draw (the shard's
        first-level share, its mass at the redraw); the abandoned draws are
        uncounted at the owner.  A writer that overtakes the reader every time
        makes the whole sample retry.
        """
        t, out = self.t, self.out
        given = 0
        for _ in range(16):
            k = len(torn)
            args = {**args, "counts": {s: k}, "scale": {s: args["scale"][s]}, "seed": int(self.rng.integers(2**63)),
                    "updates": None}  # fmt: skip
            r = (await t._link.on_workers({a: ("sample_part", args)}))[a][s]
            self.counted[a][s] = self.counted[a].get(s, 0) + k
            given += k
            tmp = SampleBuffers(t.spec, self.columns, k, self.L, tier=out.tier)
            sub = type(self)(t, tmp, self.L, self.boundary, self.columns, self.rng, self.txn, True, None)
            again = sub._copy_shared(sh, r, 0)
            tmp.fill_rows(
                0, s, r["seqs"], r["p"], r["episode_ids"], r["timesteps"], r["dst_offset"], r["n_valid"],
                r.get("priorities"), r.get("times_sampled"),
            )  # fmt: skip
            ok = np.setdiff1d(np.arange(k), again)
            rows = o + torn[ok]
            xp = backend.output_module(out.tier)  # indices go where the data is
            for c in self.columns:
                out.bytes[c][xp.asarray(rows)] = tmp.bytes[c][xp.asarray(ok)]
            for f in ("keys", "probabilities", "episode_ids", "timesteps", "mask", "priorities", "times_sampled"):
                getattr(out, f)[rows] = getattr(tmp, f)[ok]
            torn = torn[again]
            if not len(torn):
                self.counted[a][s] -= given  # before: a failed uncount must not be undone again
                await t._link.on_workers({a: ("uncount", dict(name=t.name, counts={s: given}))})  # the torn draws
                return
            t.stats["shared_conflicts"] += len(torn)
        raise Retry(f"shard {s}: windows read from shared memory were written over again as they were redrawn")
