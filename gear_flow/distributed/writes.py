"""Inserts of a distributed table: validated, routed to shards, admitted, stored all or nothing.

An insert is all or nothing across workers: admission at the coordinator
(ids, stamps, a transaction id; waiters served in arrival order), then the
episodes are *staged* on every shard worker (validated, nothing visible), then
*applied*, then *committed* at the coordinator.  If staging fails anywhere,
every worker forgets the staged part and the coordinator gives back the
admission: nothing of the insert is sampleable anywhere and the limiter's
counts are as before.  An insert that touches one worker stages and applies in
one request.  A worker lost before anything was applied leaves nothing stored:
a degraded table routes the insert again over the shards left (a new
admission).  Eviction to ``max_size`` runs the planner's eviction plan, the
same rule as the local table's; a queue or stack never evicts
(:meth:`~gear_flow.table.config.TableConfig.evicts_to_max_size`).

This module validates, routes and admits an insert and hands its episodes to
the workers (in-process, through a staging segment, or over the comm); the
transaction's steps (stage, apply, commit, abort) are in
:mod:`~gear_flow.distributed.transactions`, and
eviction is :func:`~gear_flow.distributed.edits.evict_excess`, beside
priority updates and deletes.  An insert's steps are one generator,
:func:`insert_steps`, answered on the event loop by :class:`LoopInserter`
(:func:`insert_async`) or in the caller's thread by
:class:`~gear_flow.distributed.thread_insert.ThreadInserter` (a blocking
``insert``, :func:`~gear_flow.distributed.thread_insert.insert`, when it can).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
from collections import defaultdict
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
from numpy.typing import ArrayLike

from ..errors import InterruptedInFlight, ShardLostError, ShardMovedError, SpecError
from ..keys import shards_present
from ..storage.staging import stage_chunks, staged_bytes, staging_area
from ..table import planner, routing
from ..table.config import check_timeout
from ..table.results import InsertResult
from ..table.validate import as_episode_list, check_episodes, insert_priorities
from .edits import evict_excess
from .transactions import abort_insert, admission_args, apply_staged, insert_error, run_insert
from .transport import settled, then, through_cancel
from .wire import array_bytes

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from ..spec import TableSpec
    from ..writer import EpisodeWriter
    from .api import DistributedTable

#: times an insert is sent again after a worker refused it because shards moved, before it gives up
MOVED_ATTEMPTS = 8
#: what ``priorities`` of an insert may be: None, one value, a flat array over all items, or one array per episode
Priorities = ArrayLike | Sequence[ArrayLike] | float | None


def prepare_insert(
    spec: TableSpec, episodes: Mapping | Sequence[Mapping], priorities: Priorities
) -> tuple[list[dict], np.ndarray, int, np.ndarray, np.ndarray | None]:
    """Validate an insert before anything is sent.

    Parameters
    ----------
    spec : TableSpec
        The table's spec; every episode must carry each of its columns.
    episodes : mapping or sequence of mappings
        Each maps every column to an array ``[T, *shape]`` (T >= 1).
    priorities : None, float, array or list of arrays
        Per item: None (each shard's running max), one value for all, a flat
        array over all items of all episodes, or one array per episode.

    Returns
    -------
    chunks : list of dict
        Per episode, its columns cast to the spec's dtypes.
    lengths : numpy.ndarray
        int64 ``[E]``, steps of each episode.
    n_items : int
        Items the insert creates (total steps for step items, ``E`` for
        episode items).
    item_offsets : numpy.ndarray
        int64 ``[E + 1]``, first item of each episode (and the total).
    priorities : numpy.ndarray or None
        float64 ``[n_items]`` (or a scalar array), validated finite and >= 0;
        None when none were given.

    Raises
    ------
    InvalidDataError
        A missing or extra column, a wrong shape or dtype, an empty episode,
        or not one priority per item.
    InvalidPriorityError
        A priority that is NaN, infinite or negative.
    """
    checked, lengths = check_episodes(spec, as_episode_list(episodes))
    step_items = spec.item_unit == "step"
    n_items = int(lengths.sum()) if step_items else len(lengths)
    pr = insert_priorities(priorities, lengths, step_items)
    item_off = np.concatenate(([0], np.cumsum(lengths if step_items else np.ones_like(lengths))))
    return checked, lengths, n_items, item_off, pr


class Insert(NamedTuple):
    """An insert validated and routed (:func:`prepare_insert`), not yet admitted.

    Attributes
    ----------
    chunks : list of dict
        Per episode, its columns cast to the spec's dtypes.
    lengths : numpy.ndarray
        Steps of each episode.
    n_items : int
        Items the insert creates.
    item_off : numpy.ndarray
        First item of each episode (and the total).
    priorities : numpy.ndarray or None
        Per item, or None (each shard's running max).
    dest : numpy.ndarray
        The shard of each episode.
    per_shard : dict of int to int
        Items per shard.
    shard : int or None
        The shard the caller put every episode on.
    """

    chunks: list[dict]
    lengths: np.ndarray
    n_items: int
    item_off: np.ndarray
    priorities: np.ndarray | None
    dest: np.ndarray  # shard of each episode
    per_shard: dict[int, int]  # items per shard
    shard: int | None = None  # the shard the caller put every episode on


def insert_result(ins: Insert, ids: np.ndarray, sel_of: dict, applied: dict) -> InsertResult:
    """What an insert applied on its workers returns to the caller.

    Parameters
    ----------
    ins : Insert
        The insert.
    ids : numpy.ndarray
        Its episodes' ids.
    sel_of : dict of int to numpy.ndarray
        Per shard, the episodes it got.
    applied : dict
        Per worker, its ``write``/``apply`` reply (``first_keys`` per shard).

    Returns
    -------
    InsertResult
        Ids, first keys, shards and the number of items.
    """
    first_keys = np.empty(len(ins.lengths), dtype=np.int64)
    for res in applied.values():
        for s, fk in res["first_keys"].items():
            first_keys[sel_of[int(s)]] = fk
    return InsertResult(ids, first_keys, ins.dest, ins.n_items)


# -- inserts ------------------------------------------------------------------------------------
def rerouted(table: DistributedTable, ins: Insert, e: ShardLostError, attempt: int) -> Insert:
    """``ins`` routed again after a worker lost before any of it was stored (its admission given back):
    over the shards left (degraded), or as placed now (the shard moved meanwhile); else ``e`` raised.

    Parameters
    ----------
    table : DistributedTable
        The handle.
    ins : Insert
        The insert.
    e : ShardLostError
        What the attempt raised.
    attempt : int
        Attempts made so far.

    Returns
    -------
    Insert
        Routed again.

    Raises
    ------
    ShardLostError
        ``e``, when something was stored, attempts ran out, or the table is
        not degraded and the shard is lost.
    """
    if e.stored is not False or attempt >= table.spec.num_shards or (not table.degraded and e.shard in table.lost):
        raise e
    table._view.check_not_lost(stored=False)  # (the shard moved, but another one may be lost meanwhile)
    logger.info("table %r: insert routed again (%s)", table.name, e)
    return routed(table, ins)


def moved_insert(table: DistributedTable, ins: Insert, e: ShardMovedError, attempt: int) -> Insert:
    """``ins`` routed again after a worker refused it, planned before shards moved there or away (nothing
    of it was stored, its admission given back; the handle knows the new placement): sent where the
    shards are now, its episodes on the same shards (``e`` raised after :data:`MOVED_ATTEMPTS`).

    Parameters
    ----------
    table : DistributedTable
        The handle.
    ins : Insert
        The insert.
    e : ShardMovedError
        What the attempt raised.
    attempt : int
        Attempts made so far.

    Returns
    -------
    Insert
        ``ins``, sent again as placed now.

    Raises
    ------
    ShardMovedError
        ``e``, after :data:`MOVED_ATTEMPTS` attempts.
    """
    if attempt >= MOVED_ATTEMPTS:
        raise e
    logger.info("table %r: insert sent again where its shards are now (%s)", table.name, e)
    return ins


def route(table: DistributedTable, lengths: np.ndarray, shard: int | None) -> np.ndarray:
    """The shard of each episode: the caller's own shards first (writer affinity), among those alive.

    Parameters
    ----------
    table : DistributedTable
        The handle.
    lengths : numpy.ndarray
        Steps of each episode.
    shard : int or None
        The shard the caller put every episode on.

    Returns
    -------
    numpy.ndarray
        int64, one shard per episode.

    Raises
    ------
    ShardLostError
        No shard is left, or ``shard`` is lost.
    SpecError
        ``shard`` out of range.
    """
    if shard is not None:  # (True or 1.0 would pass the membership test below as shard 1)
        shard = routing.check_shard(shard, table.spec.num_shards)
    alive = [s for s in sorted(table.placement) if s not in table.lost]
    if not alive:
        raise ShardLostError(-1, f"table {table.name!r} has no shard left", stored=False)
    if shard is not None and shard not in alive:
        if shard in table.lost:
            raise ShardLostError(shard, f"shard {shard} of table {table.name!r} is lost", stored=False)
        raise SpecError(f"shard {shard} must be in [0, {table.spec.num_shards})")
    local = [s for s in table.local_shards if s not in table.lost]
    pool = local if shard is None and local else alive
    idx = routing.route(
        lengths, len(pool), table.spec.capacity, table.routing, table._rr, None if shard is None else pool.index(shard)
    )
    return np.array(pool, dtype=np.int64)[idx]


async def insert_async(
    table: DistributedTable,
    episodes: Mapping | Sequence[Mapping],
    priorities: Priorities = None,
    *,
    timeout: float | None = None,
    shard: int | None = None,
) -> InsertResult:
    """:meth:`insert` for a caller inside the event loop.

    Parameters
    ----------
    table : DistributedTable
        The handle.
    episodes : mapping or sequence of mappings
        Each maps every column to an array ``[T, *shape]``.
    priorities : None, float, array or list of arrays
        As :meth:`insert`.
    timeout : float, optional
        Seconds to wait for the rate limiter; default the handle's.
    shard : int, optional
        Put every episode on this shard.

    Returns
    -------
    InsertResult
        As :meth:`insert`.

    Raises
    ------
    InvalidDataError, InvalidPriorityError, CapacityError, SpecError, RateLimitTimeout, ShardLostError
        As :meth:`insert`.
    """
    ins = prepare(table, episodes, priorities, shard, timeout)
    return await planner.run_async(insert_steps(table, ins, timeout), LoopInserter(table))


# -- the driver: what an insert does, whichever executor answers it ---------------------------------------------------
class AdmitInsert(NamedTuple):
    """Ask the coordinator to admit an insert; answered with its grant (``admit_insert``'s answer).

    Parameters
    ----------
    args : dict
        ``admit_insert``'s arguments (:func:`~.transactions.admission_args`).
    """

    args: dict


class Learn(NamedTuple):
    """Learn the placement at ``version`` unless it is known already; answered with None.

    Parameters
    ----------
    version : int or None
        The placement version an admission was granted at; None: whatever version this handle knows (a
        refusal names none).
    """

    version: int | None


class LearnMoved(NamedTuple):
    """Learn the placement at version ``epoch`` or later (a worker refused a request planned before shards
    moved); answered with None.

    Parameters
    ----------
    epoch : int
        The refusing worker's version.
    """

    epoch: int


class Abort(NamedTuple):
    """Abort insert ``txn`` on workers ``addrs``, then at the coordinator (:func:`~.transactions.abort_insert`);
    answered with None.

    Parameters
    ----------
    txn : str
        The admitted insert.
    addrs : list of str
        Workers that may hold a part.
    cause : BaseException or None
        Why.
    """

    txn: str
    addrs: list
    cause: BaseException | None


class Store(NamedTuple):
    """Hand an admitted insert's ``parts`` to their workers, apply, commit; answered with ``(applied, size)``
    (:func:`~.transactions.run_insert`'s).  An executor that stored nothing raises :class:`Unstored`.

    Parameters
    ----------
    txn : str
        The admitted insert.
    parts : dict
        ``{worker: [part, ...]}`` (:func:`insert_parts`).
    """

    txn: str
    parts: dict


class Evict(NamedTuple):
    """Evict the table from ``size`` items to ``max_size`` (:func:`~.edits.evict_excess`); answered with None.

    Parameters
    ----------
    size : int
        The table's size after the commit.
    """

    size: int


class StoreHeld(NamedTuple):
    """The workers that hold an admitted insert's parts (the ingestion's partitions) stage them, given the
    grant's first episode id and stamp; then apply and commit.  Answered with ``(applied, size)``
    (:func:`~.transactions.apply_staged`'s).  An executor whose staging failed anywhere raises
    :class:`Unstored`, naming the workers that may hold a staged part.

    Parameters
    ----------
    adm : dict
        The coordinator's ``admit_insert`` answer.
    """

    adm: dict


class Unstored(Exception):
    """Internal: an executor could not stage an insert's parts everywhere (nothing was applied): the steps
    give its admission back, aborting it on ``held``, and raise.

    Parameters
    ----------
    cause : BaseException
        What failed.
    workers : list of str
        The insert's workers (the error names them).
    held : list of str, optional
        Workers that may hold a staged part (none when nothing was sent).
    """

    def __init__(self, cause: BaseException, workers: list, held: Sequence[str] = ()) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.workers = workers
        self.held = list(held)


class InsertGrant:
    """An insert's admission at the coordinator, settled exactly once: committed by its transaction
    (:class:`Store`) or given back (:class:`Abort`); the steps settle it through :meth:`settle`, so no
    failure path gives it back twice, nor one its transaction settled.

    Parameters
    ----------
    adm : dict
        The coordinator's ``admit_insert`` answer (``txn``, ``first_episode_id``, ``first_stamp``,
        ``version``).
    """

    def __init__(self, adm: dict) -> None:
        self.adm = adm
        self.open = True

    @property
    def txn(self) -> str:
        """The insert's transaction id."""
        return self.adm["txn"]

    def settle(self) -> bool:
        """Mark the grant settled.

        Returns
        -------
        bool
            Whether it was open: the caller settles it then.
        """
        was, self.open = self.open, False
        return was


def insert_steps(
    table: DistributedTable, ins: Insert, timeout: float | None
) -> Generator[object, object, InsertResult]:
    """One insert, sans I/O: the requests it makes (:class:`AdmitInsert`, :class:`Learn`, :class:`Store`,
    :class:`Abort`, :class:`Evict`, :class:`LearnMoved`), yielded to an executor that answers each, or throws
    its error in.

    The one place that says what an insert does: admitted, the placement
    of its grant learnt (the admission given back when that fails); routed
    again when the grant names a shard this handle learns lost only now;
    stored, aborted everywhere when nothing of it could be handed over;
    evicted to ``max_size`` (not a queue's or stack's); routed again over
    the shards left after a worker lost before anything was stored
    (:func:`rerouted`), or sent where its shards are now after a worker
    refused it because they moved (:func:`moved_insert`).  The event loop
    (:class:`LoopInserter`) and the caller's thread
    (:class:`~gear_flow.distributed.thread_insert.ThreadInserter`) answer it.

    Parameters
    ----------
    table : DistributedTable
        The handle.
    ins : Insert
        The insert, prepared (:func:`prepare`).
    timeout : float or None
        Seconds to wait for the rate limiter (None: the handle's).

    Returns
    -------
    generator
        Yields the requests; returns the :class:`~gear_flow.table.results.InsertResult`.
    """
    timeout = table.timeout if timeout is None else check_timeout(timeout)  # (inf: its seconds)
    for attempt in itertools.count():  # rerouted and moved_insert bound it
        try:
            return (yield from _insert_once(table, ins, timeout))
        except ShardLostError as e:
            ins = rerouted(table, ins, e, attempt)
        except ShardMovedError as e:
            yield LearnMoved(e.epoch)
            ins = moved_insert(table, ins, e, attempt)


def _admitted(table: DistributedTable, args: dict) -> Generator[object, object, InsertGrant]:
    """An admission (``admit_insert``'s ``args``), the placement it was granted at learnt (given back when
    that fails)."""
    try:
        grant = InsertGrant((yield AdmitInsert(args)))
    except ShardLostError:
        # refused while it waited (a shard was lost and the table is not degraded): the placement is
        # learnt first, or the insert would be routed again over the shard this handle still takes for live
        yield Learn(None)
        raise
    try:
        yield Learn(grant.adm["version"])
    except BaseException as e:  # admitted, and nothing sent: the admission is given back
        try:
            if grant.settle():
                yield Abort(grant.txn, [], e)
        except Exception as u:  # noqa: BLE001 - the refresh's error is the caller's
            logger.info("table %r: an insert's admission not given back (%s)", table.name, u)
        raise
    return grant


def _stored(table: DistributedTable, grant: InsertGrant, req: object) -> Generator[object, object, tuple[dict, int]]:
    """An admitted insert stored by ``req`` (:class:`Store` or :class:`StoreHeld`), then the table evicted to
    ``max_size`` (not a queue's or stack's); when nothing was applied (:class:`Unstored`, re-raised) the
    admission is given back."""
    try:
        applied, size = yield req
    except Unstored as e:
        if grant.settle():
            yield Abort(grant.txn, e.held, e.cause)
        raise
    except InterruptedInFlight as e:  # (the caller's thread) its store goes on in the background, and so must
        # the eviction after it: otherwise the table stays over max_size until another insert evicts
        raise InterruptedInFlight(_then_evicted(table, e.outcome)) from e
    finally:
        grant.settle()  # committed or aborted by its transaction (or above)
    if table._cfg.evicts_to_max_size(size):  # the inserts' one rule (a queue never evicts)
        try:
            yield Evict(size)
        except KeyboardInterrupt as e:  # (the caller's thread) stored: the eviction goes on in the background,
            # started there again: the interrupt may have come before it was asked (an eviction takes the excess
            # its hold finds, so one after the other's end removes nothing more)
            raise InterruptedInFlight(_then_evicted(table, settled((applied, size)))) from e
    return applied, size


def _then_evicted(table: DistributedTable, stored: concurrent.futures.Future) -> concurrent.futures.Future:
    """The end of :func:`_evicted_after` of ``stored``, begun on the event loop; ``stored`` itself when the loop
    is closed (nothing goes on there)."""
    try:
        return table._ctx.go_on(_evicted_after, table, stored)
    except RuntimeError:
        return stored


async def _evicted_after(table: DistributedTable, stored: concurrent.futures.Future) -> tuple[dict, int]:
    """A store that went on in the background (``stored``: its ``(applied, size)``), then the table evicted to
    ``max_size`` as :func:`_stored` evicts; a failed eviction leaves the table over it, as the caller's would
    (logged: the items are stored whatever the eviction does, and whoever waits must know that)."""
    applied, size = await asyncio.wrap_future(stored)
    if table._cfg.evicts_to_max_size(size):
        try:
            await through_cancel(evict_excess(table, size))
        except Exception as e:  # noqa: BLE001 - see above
            logger.info("table %r: an interrupted insert's eviction to max_size failed: %s", table.name, e)
    return applied, size


def _insert_once(
    table: DistributedTable, ins: Insert, timeout: float | None
) -> Generator[object, object, InsertResult]:
    args = admission_args(table, ins.n_items, len(ins.lengths), ins.per_shard, timeout)
    grant = yield from _admitted(table, args)
    if any(s in table.lost for s in ins.per_shard):
        # routed to a shard the coordinator knew lost and this handle learns it only now: the admission is
        # given back, and the insert routed again over the shards left (or refused, not degraded)
        if grant.settle():
            yield Abort(grant.txn, [], None)
        table._view.check_not_lost(stored=False)
        ins = routed(table, ins)
        args = admission_args(table, ins.n_items, len(ins.lengths), ins.per_shard, timeout)
        grant = yield from _admitted(table, args)
    parts, sel_of, ids = insert_parts(table, ins, grant.adm)
    try:
        applied, _ = yield from _stored(table, grant, Store(grant.txn, parts))
    except Unstored as e:
        if not isinstance(e.cause, Exception):  # a cancel or an interrupt before anything was sent: the caller's
            raise e.cause from None
        raise insert_error(table, e.cause, e.workers) from None
    except InterruptedInFlight as e:  # (the caller's thread) stored, or on its way there in the background
        raise InterruptedInFlight(then(e.outcome, lambda got: insert_result(ins, ids, sel_of, got[0]))) from e
    return insert_result(ins, ids, sel_of, applied)


def held_insert_steps(
    table: DistributedTable, n_items: int, episodes: int, per_shard: dict[int, int], timeout: float | None
) -> Generator[object, object, tuple[dict, int]]:
    """An insert whose parts the workers already hold (the ingestion's partitions), sans I/O: admitted, the
    placement of its grant learnt, staged where the parts are (:class:`StoreHeld`), applied and committed, or
    given back and aborted on every worker that may hold a staged part; then evicted to ``max_size``.  The
    same steps as :func:`insert_steps`'s, but for routing (the parts stay where they are).

    Parameters
    ----------
    table : DistributedTable
        The handle.
    n_items : int
        Items of the insert.
    episodes : int
        Episodes of the insert.
    per_shard : dict of int to int
        The shards the insert may touch (the admission's).
    timeout : float or None
        Seconds to wait for the rate limiter (None: the handle's).

    Returns
    -------
    generator
        Yields the requests; returns ``(applied, size)``, as :func:`~.transactions.apply_staged`.

    Raises
    ------
    Unstored
        Staging failed on a worker: nothing was stored, the admission was given back.
    """
    timeout = table.timeout if timeout is None else check_timeout(timeout)  # (inf: its seconds)
    # its parts are staged in groups of at most a shard's capacity: it may hold more than the table
    grant = yield from _admitted(table, admission_args(table, n_items, episodes, per_shard, timeout, grouped=True))
    return (yield from _stored(table, grant, StoreHeld(grant.adm)))


class HeldInserter:
    """Answers :func:`held_insert_steps` from the caller's thread: :class:`StoreHeld` by ``stage(adm)``
    (which stages the parts where they are and returns the workers that staged, or raises
    :class:`Unstored`) and then the transaction's apply on the event loop; every other request on the
    event loop, as :class:`LoopInserter` answers it.

    Parameters
    ----------
    table : DistributedTable
        The handle.
    stage : callable
        ``stage(adm) -> list of worker addresses``.
    """

    def __init__(self, table: DistributedTable, stage: Callable[[dict], Sequence[str]]) -> None:
        self.t = table
        self.stage = stage

    def __call__(self, req: object) -> object:
        """Answer one request of the steps.

        Parameters
        ----------
        req : AdmitInsert, Learn, Abort, StoreHeld or Evict
            The request.

        Returns
        -------
        object
            Its answer.
        """
        t = self.t
        if isinstance(req, StoreHeld):
            addrs = list(self.stage(req.adm))
            return t._ctx.sync_to_end(apply_staged, t, req.adm["txn"], addrs)
        return t._ctx.sync_to_end(LoopInserter(t).__call__, req)


def insert_held(
    table: DistributedTable,
    n_items: int,
    episodes: int,
    per_shard: dict[int, int],
    timeout: float | None,
    stage: Callable[[dict], Sequence[str]],
) -> tuple[dict, int]:
    """Insert parts the workers hold, from the caller's thread (:func:`held_insert_steps`, answered by a
    :class:`HeldInserter`).

    Parameters
    ----------
    table : DistributedTable
        The handle.
    n_items : int
        Items of the insert.
    episodes : int
        Episodes of the insert.
    per_shard : dict of int to int
        The shards the insert may touch.
    timeout : float or None
        Seconds to wait for the rate limiter (None: the handle's).
    stage : callable
        ``stage(adm) -> list of worker addresses``: stages the parts where they are, given the grant
        (``txn``, ``first_episode_id``, ``first_stamp``); raises :class:`Unstored` when any failed.

    Returns
    -------
    tuple
        ``(applied, size)``, as :func:`~.transactions.apply_staged`.

    Raises
    ------
    SpecError
        The rate limiter could never admit an insert this large (nothing asked).
    Unstored
        Staging failed: nothing was stored, the admission was given back.
    """
    table._cfg.rate_limiter.check_insert_size(n_items)
    return planner.run(held_insert_steps(table, n_items, episodes, per_shard, timeout), HeldInserter(table, stage))


class LoopInserter:
    """Answers :func:`insert_steps` on the event loop: the coordinator over its lane or the comm, each
    worker's episodes in-process (this worker's own), through a staging segment (a worker on this machine
    whose rings this handle maps) or over the comm.

    Parameters
    ----------
    table : DistributedTable
        The handle.
    """

    def __init__(self, table: DistributedTable) -> None:
        self.t = table

    async def __call__(self, req: object) -> object:
        """Answer one request of the steps.

        Parameters
        ----------
        req : AdmitInsert, Learn, LearnMoved, Abort, Store or Evict
            The request.

        Returns
        -------
        object
            Its answer.
        """
        t = self.t
        if isinstance(req, Store):
            return await self.store(req.txn, req.parts)
        if isinstance(req, AdmitInsert):
            return await t._link.coordinator.admit_insert(**req.args)
        if isinstance(req, Learn):
            return await t._link.refresh(req.version)
        if isinstance(req, Abort):  # (begun, they go to their ends through a cancel)
            return await through_cancel(abort_insert(t, req.txn, req.addrs, req.cause))
        if isinstance(req, Evict):
            return await through_cancel(evict_excess(t, req.size))
        if isinstance(req, LearnMoved):
            return await t._link.moved(req.epoch)
        raise TypeError(f"not an insert's request: {req!r}")

    async def store(self, txn: str, parts: dict) -> tuple[dict, int]:
        """:class:`Store`'s answer on the event loop.

        Parameters
        ----------
        txn : str
            The admitted insert.
        parts : dict
            ``{worker: [part, ...]}``.

        Returns
        -------
        tuple
            ``(applied, size)``.
        """
        table = self.t
        local = table._ctx.local_addr if table._ctx.local_plugin is not None else None  # its parts go in-process
        segs = []
        try:
            for a, ps in parts.items():
                n = array_bytes([p["chunks"] for p in ps])
                if a != local and await table._link.route(a) is not None:
                    # a worker on this machine: the episodes go through a staging segment, not the socket
                    seg = staging_area().acquire(staged_bytes(ps))
                    segs.append(seg)
                    stage_chunks(seg, ps)
                    table.stats["insert_shared_bytes"] += n
                else:
                    table.stats["insert_local_bytes" if a == local else "insert_remote_bytes"] += n
        except BaseException as e:  # nothing sent yet: the admission goes back
            for seg in segs:
                staging_area().discard(seg)
            raise Unstored(e, sorted(parts)) from None
        try:
            applied, size = await run_insert(table, txn, dict(parts))
        except BaseException:  # a worker may still read them (a request given up on): never reused
            for seg in segs:
                staging_area().discard(seg)
            raise
        for seg in segs:  # applied everywhere: the segments may be reused
            staging_area().release(seg)
        return applied, size


def prepare(
    table: DistributedTable,
    episodes: Mapping | Sequence[Mapping],
    priorities: Priorities,
    shard: int | None,
    timeout: float | None = None,
) -> Insert:
    """Validate and route an insert (nothing sent yet).

    Parameters
    ----------
    table : DistributedTable
        The handle.
    episodes : mapping or sequence of mappings
        As ``insert``'s.
    priorities : None, float, array or list of arrays
        As ``insert``'s.
    shard : int or None
        Put every episode on this shard.
    timeout : float or None
        The call's timeout (checked as a LocalTable checks it).

    Returns
    -------
    Insert
        Validated and routed.
    """
    check_timeout(timeout)  # (before anything of the handle changes)
    table._masses.clear()  # this handle's own writes show in its next sample's plan
    table._view.check_not_lost(stored=False)
    chunks, lengths, n_items, item_off, pr = prepare_insert(table.spec, episodes, priorities)
    if pr is not None:
        table._cfg.check_priorities(pr)
    ins = routed(table, Insert(chunks, lengths, n_items, item_off, pr, None, {}, shard))
    table._rr += len(lengths)
    table._cfg.rate_limiter.check_insert_size(n_items)
    return ins


def routed(table: DistributedTable, ins: Insert) -> Insert:
    """``ins`` with each episode's shard chosen among the shards this handle knows alive.

    Parameters
    ----------
    table : DistributedTable
        The handle.
    ins : Insert
        The insert.

    Returns
    -------
    Insert
        With ``dest`` and ``per_shard``.
    """
    dest = route(table, ins.lengths, ins.shard)
    items_of = ins.item_off[1:] - ins.item_off[:-1]
    return ins._replace(dest=dest, per_shard={int(s): int(items_of[dest == s].sum()) for s in shards_present(dest)})


def insert_parts(
    table: DistributedTable, ins: Insert, adm: dict
) -> tuple[dict[str, list[dict]], dict[int, np.ndarray], np.ndarray]:
    """The parts each worker gets of an admitted insert.

    Parameters
    ----------
    table : DistributedTable
        The handle.
    ins : Insert
        The insert.
    adm : dict
        The coordinator's ``admit_insert`` answer (``first_episode_id``,
        ``first_stamp``).

    Returns
    -------
    tuple
        ``({worker: [part, ...]}, {shard: episodes it gets}, episode ids)``.
    """
    ids = adm["first_episode_id"] + np.arange(len(ins.lengths), dtype=np.int64)
    stamps = adm["first_stamp"] + ins.item_off[:-1]
    parts = defaultdict(list)
    sel_of = {}
    for s in shards_present(ins.dest):
        sel = np.flatnonzero(ins.dest == s)
        sel_of[int(s)] = sel
        p = routing.item_rows(ins.priorities, ins.item_off, sel)
        parts[table.placement[int(s)]].append(
            {
                "shard": int(s),
                "chunks": routing.pick(ins.chunks, sel),
                "lengths": ins.lengths[sel],
                "episode_ids": ids[sel],
                "stamps": stamps[sel],
                "priorities": p,
            }
        )
    return dict(parts), sel_of, ids


def writer(
    table: DistributedTable,
    max_episode_length: int | None = None,
    shard: int | None = None,
    timeout: float | None = None,
) -> EpisodeWriter:
    """A streaming writer (``append``/``end_episode``) inserting into this table.

    Parameters
    ----------
    table : DistributedTable
        The handle.
    max_episode_length : int, optional
        End an episode automatically (``truncated``) when it reaches this
        many steps; None: episodes end only at ``end_episode``.
    shard : int, optional
        Insert every episode on this shard.
    timeout : float, optional
        Seconds each insert waits for the rate limiter; default the
        handle's.

    Returns
    -------
    EpisodeWriter
        Buffers steps and inserts each episode whole when it ends.

    Raises
    ------
    SpecError
        ``max_episode_length`` is not a positive integer or None.
    """
    from ..writer import EpisodeWriter

    return EpisodeWriter(table, max_episode_length=max_episode_length, shard=shard, timeout=timeout)
