"""The transaction of a distributed table's insert across its workers: stage, apply, commit, or abort.

Once the coordinator has admitted an insert (and given it a transaction id),
its parts are *staged* on every shard worker (validated, nothing visible),
then *applied*, then *committed* at the coordinator.  If staging fails
anywhere, every worker forgets its staged part and the coordinator gives back
the admission, so nothing of the insert is stored; a worker lost after every
part was staged loses its episodes, and the rest of the insert is stored.  An
insert that touches one worker stages and applies in one request (``write``).

The transaction is one generator of steps, sans I/O
(:func:`transaction_steps`, :func:`apply_steps`), answered over the comm by
:class:`LoopTransaction` or over the workers' lanes by
:class:`~gear_flow.distributed.thread_insert.LaneTransaction`.
:func:`run_insert`, :func:`apply_staged` and :func:`abort_staged` are
functions over the handle they are given (with the steps they share:
:func:`commit`, :func:`abort_insert`, :func:`insert_error`); the handle's
methods of the same names call them, since they are public on the handle.
Besides :meth:`~gear_flow.distributed.DistributedTable.insert`, the Dask
ingestion dataflow (:mod:`gear_flow.ingest.cluster`) stages parts from its
own tasks: its insert's steps are
:func:`~gear_flow.distributed.writes.held_insert_steps`, which apply it as
``apply_staged`` does or abort it as ``abort_staged`` does.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Generator, Iterable
from typing import TYPE_CHECKING, Any, NamedTuple

from ..errors import GearFlowError, ShardLostError
from ..table import planner
from .edits import evict_excess
from .transport import NotAnswered, Retry, WorkerLost, call, through_cancel

if TYPE_CHECKING:
    from .api import DistributedTable


def _unsettled_error(addr: str, txn: str, e: BaseException, stored: str) -> GearFlowError:
    """The error of an insert whose part on ``addr`` was not answered in time: what is known, what is not."""
    return GearFlowError(
        f"worker {addr} did not answer for its part of insert {txn[:8]} ({e}): whether it was written there is "
        f"not known yet; the coordinator settles it (counted if it was written, else aborted there, and never "
        f"written later); {stored}"
    )


def commit_counts(applied: dict) -> dict:
    """``commit_insert``'s ``items`` and ``evicted`` (per shard) from the workers' apply results.

    Parameters
    ----------
    applied : dict
        ``{worker: apply result}``.

    Returns
    -------
    dict
        ``{"items": {shard: n}, "evicted": {shard: n}}``.
    """
    items, evicted = defaultdict(int), defaultdict(int)
    for r in applied.values():
        for s, k in r["items"].items():
            items[int(s)] += int(k)
        for s, k in r["evicted"].items():
            evicted[int(s)] += int(k)
    return {"items": dict(items), "evicted": dict(evicted)}


def admission_args(
    table: DistributedTable,
    n: int,
    episodes: int,
    per_shard: dict[int, int],
    timeout: float | None,
    grouped: bool = False,
) -> dict:
    """The coordinator's ``admit_insert`` arguments for an insert of ``n`` items in ``episodes`` episodes.

    Parameters
    ----------
    table : DistributedTable
        The handle inserting (its owner id is the admission's).
    n : int
        Items of the insert.
    episodes : int
        Episodes of the insert.
    per_shard : dict of int to int
        Items routed to each shard.
    timeout : float or None
        Seconds the admission may wait (None: the coordinator's default).
    grouped : bool, default False
        An ingestion's insert, staged in groups of at most a shard's capacity
        (it may hold more items than the table: the newest are kept).

    Returns
    -------
    dict
        The request's fields.
    """
    return dict(n=n, episodes=episodes, per_shard=per_shard, timeout=timeout, owner=table._ctx.owner, grouped=grouped)


async def admit_insert(
    table: DistributedTable, n: int, episodes: int, per_shard: dict[int, int], timeout: float | None
) -> dict:
    """Wait for the coordinator to admit an insert (:func:`admission_args`); its grant.

    Parameters
    ----------
    table : DistributedTable
        The handle inserting.
    n : int
        Items of the insert.
    episodes : int
        Episodes of the insert.
    per_shard : dict of int to int
        Items routed to each shard.
    timeout : float or None
        Seconds the admission may wait.

    Returns
    -------
    dict
        ``txn``, ``first_episode_id``, ``first_stamp``, ``version`` …

    Raises
    ------
    RateLimitTimeout
        Not admitted in time.
    """
    return await table._link.coordinator.admit_insert(**admission_args(table, n, episodes, per_shard, timeout))


async def run_insert(
    table: DistributedTable, txn: str, parts: dict[str, list[dict]], staged: Iterable[str] = ()
) -> tuple[dict, int]:
    """Stage ``parts`` of admitted insert ``txn`` everywhere, apply, commit.

    All or nothing: a failure before every worker has staged aborts the
    insert everywhere (and at the coordinator) and raises.

    Parameters
    ----------
    table : DistributedTable
        The handle (the handle itself, on its method of this name).
    txn : str
        Transaction id the coordinator gave the insert at admission.
    parts : dict of str to list of dict
        ``{worker address: [part, ...]}``; a part has ``shard``,
        ``chunks``, ``lengths``, ``episode_ids``, ``stamps`` and
        ``priorities`` (None or float64 per item).
    staged : iterable of str, optional
        Workers (of several) that hold their part staged already (a
        caller's thread staged it): only the others are sent theirs.

    Returns
    -------
    applied : dict
        ``{worker address: apply result}`` (its ``first_keys``, ``items``
        and ``evicted`` by shard).
    size : int
        The table's size, in items, after the commit.

    Raises
    ------
    ShardLostError
        A worker could not be reached (nothing stored), or was lost while
        the decided insert was applied (the rest stored).
    GearFlowError
        Staging failed on a worker; nothing of the insert was stored.
    """
    return await planner.run_async(transaction_steps(table, txn, parts, staged), LoopTransaction(table))


async def apply_staged(table: DistributedTable, txn: str, addrs: Iterable[str]) -> tuple[dict, int]:
    """Every part of ``txn`` is staged on ``addrs``: the insert is decided; apply it everywhere, commit.

    Parameters
    ----------
    table : DistributedTable
        The handle (the handle itself, on its method of this name).
    txn : str
        Transaction id of the admitted insert.
    addrs : iterable of str
        Addresses of every worker holding a staged part.

    Returns
    -------
    applied : dict
        ``{worker address: apply result}`` of the workers that applied.
    size : int
        The table's size, in items, after the commit.

    Raises
    ------
    ShardLostError
        A worker was lost before applying: its episodes are gone, the
        rest of the insert was stored and committed (and the table
        evicted to ``max_size``); ``.stored`` is True.
    GearFlowError
        A live worker refused its part or did not answer in time: its
        shards are not taken as lost; the rest of the insert was stored
        and committed, as the message says.
    """
    return await planner.run_async(apply_steps(table, txn, addrs), LoopTransaction(table))


async def abort_staged(
    table: DistributedTable, txn: str, addrs: Iterable[str], cause: BaseException | None = None
) -> None:
    """Forget ``txn`` on ``addrs`` and give back its admission (nothing of it is stored anywhere).

    Parameters
    ----------
    table : DistributedTable
        The handle (the handle itself, on its method of this name).
    txn : str
        Transaction id of the admitted insert.
    addrs : iterable of str
        Addresses of the workers that may hold a staged part.
    cause : BaseException, optional
        Why the insert is aborted; a lost worker (``WorkerLost``) gets its
        shards marked lost.
    """
    await abort_insert(table, txn, sorted(addrs), cause)


async def commit(
    table: DistributedTable, txn: str, res: dict, unsettled: Iterable[str] = (), unreached: Iterable[str] = ()
) -> int:
    """Commit what ``res`` says was written at the coordinator.

    Parameters
    ----------
    table : DistributedTable
        The handle.
    txn : str
        Transaction id of the admitted insert.
    res : dict
        ``{worker address: apply result}`` of the workers that wrote.
    unsettled : iterable of str, optional
        Workers that did not answer: the coordinator settles their parts.
    unreached : iterable of str, optional
        Workers that refused and whose abort was not answered either: the
        coordinator aborts their parts.

    Returns
    -------
    int
        The table's size, in items, after the commit.
    """
    return await table._link.coordinator.commit_insert(
        txn, unsettled=sorted(unsettled) or None, unreached=sorted(unreached) or None, **commit_counts(res)
    )


async def abort_insert(table: DistributedTable, txn: str, addrs: Iterable[str], cause: BaseException | None) -> None:
    """Abort insert ``txn`` on workers ``addrs``, then at the coordinator.

    The parts of workers this abort did not reach are the coordinator's to
    abort (it asks them until they answer, or leave).

    Parameters
    ----------
    table : DistributedTable
        The handle.
    txn : str
        Transaction id of the admitted insert.
    addrs : iterable of str
        Workers that may hold a part.
    cause : BaseException or None
        Why; a lost worker (``WorkerLost``) gets its shards marked lost.
    """
    addrs = sorted(addrs)
    got = await asyncio.gather(
        *(call(table._ctx, a, "abort", table=table.name, name=table.name, txn=txn) for a in addrs),
        return_exceptions=True,
    )
    unreached = [a for a, r in zip(addrs, got) if isinstance(r, BaseException)]
    await table._link.coordinator.abort_insert(txn, unreached or None)
    lost = [a for a in addrs if isinstance(cause, WorkerLost) and cause.addr == a]
    if lost:
        try:
            await table._link.handle_lost(lost)
        except (Retry, ShardLostError):
            pass


# -- the transaction's steps, sans I/O ----------------------------------------------------------------------------
class Send(NamedTuple):
    """Send ``calls`` to their workers; answered with ``{worker: its reply, or the error it met}`` (every
    call's outcome, none raised).

    Parameters
    ----------
    calls : dict
        ``{worker: (operation, arguments)}``.
    """

    calls: dict


class Commit(NamedTuple):
    """Commit at the coordinator what ``res`` says was written (:func:`commit`); answered with the table's size.

    Parameters
    ----------
    txn : str
        The admitted insert.
    res : dict
        ``{worker: apply result}``.
    unsettled : list of str
        Workers that did not answer: the coordinator settles their parts.
    unreached : list of str
        Workers whose abort was not answered: the coordinator aborts their parts.
    """

    txn: str
    res: dict
    unsettled: list
    unreached: list


class AbortAt(NamedTuple):
    """Abort ``txn`` on ``addrs``, then at the coordinator (:func:`abort_insert`); answered with None.

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


class LostWorkers(NamedTuple):
    """Mark the shards of ``addrs`` lost (the handle learns it; a degraded table goes on without them);
    answered with None.

    Parameters
    ----------
    addrs : list of str
        Workers lost.
    """

    addrs: list


class EvictTo(NamedTuple):
    """Evict from ``size`` items to ``max_size`` (:func:`~.edits.evict_excess`); answered with None.

    Parameters
    ----------
    size : int
        The table's size after the commit.
    """

    size: int


def _request(table: DistributedTable, op: str, txn: str, **more: Any) -> tuple[str, dict]:
    return op, dict(name=table.name, txn=txn, **more)


def transaction_steps(
    table: DistributedTable, txn: str, parts: dict[str, list[dict]], staged: Iterable[str] = ()
) -> Generator[object, object, tuple[dict, int]]:
    """An admitted insert's transaction, sans I/O: staged everywhere, applied, committed; aborted everywhere
    when a part could not be staged.

    The one place that says what the workers' answers mean, whichever
    executor carries the requests (:class:`LoopTransaction` over the comm,
    :class:`~gear_flow.distributed.thread_insert.LaneTransaction` over the
    workers' lanes from the caller's thread).  One worker: staged and
    applied in one request (``write``).

    Parameters
    ----------
    table : DistributedTable
        The handle.
    txn : str
        Transaction id the coordinator gave the insert at admission.
    parts : dict of str to list of dict
        ``{worker address: [part, ...]}`` (:func:`~.writes.insert_parts`).
    staged : iterable of str, optional
        Workers (of several) that hold their part staged already: only the
        others are sent theirs.

    Returns
    -------
    generator
        Yields the requests; returns ``(applied, size)`` as :func:`run_insert`.
    """
    addrs = sorted(parts)
    if len(addrs) == 1:  # one worker: staged and applied in one request
        a = addrs[0]
        try:
            got = (yield Send({a: _request(table, "write", txn, parts=parts[a])}))[a]
            if isinstance(got, BaseException):
                raise got
        except NotAnswered as e:  # it may still write it: the coordinator settles it (counted or aborted)
            yield Commit(txn, {}, addrs, [])
            raise _unsettled_error(a, txn, e, "nothing else was to be stored") from e
        except BaseException as e:
            yield AbortAt(txn, addrs, e)
            raise insert_error(table, e, addrs) from None
        res = {a: got}
        return res, (yield Commit(txn, res, [], []))
    done = set(staged)
    try:
        got = yield Send({a: _request(table, "stage", txn, parts=parts[a]) for a in addrs if a not in done})
    except BaseException as e:  # interrupted before every part was taken: nothing is applied anywhere
        yield AbortAt(txn, addrs, e)
        raise
    bad = [e for e in got.values() if isinstance(e, BaseException)]
    if bad:
        yield AbortAt(txn, addrs, bad[0])
        raise insert_error(table, bad[0], addrs) from None
    return (yield from apply_steps(table, txn, addrs))


def apply_steps(table: DistributedTable, txn: str, addrs: Iterable[str]) -> Generator[object, object, tuple[dict, int]]:
    """Every part of ``txn`` is staged on ``addrs``: the insert is decided; its steps to apply it everywhere
    and commit (:func:`apply_staged`'s, sans I/O).

    Parameters
    ----------
    table : DistributedTable
        The handle.
    txn : str
        Transaction id of the admitted insert.
    addrs : iterable of str
        Every worker holding a staged part.

    Returns
    -------
    generator
        Yields the requests; returns ``(applied, size)`` as :func:`apply_staged`.
    """
    addrs = sorted(addrs)
    got = yield Send({a: _request(table, "apply", txn) for a in addrs})
    res = {a: r for a, r in got.items() if not isinstance(r, BaseException)}
    lost = [a for a in addrs if isinstance(got[a], WorkerLost)]
    failed = [(a, got[a]) for a in addrs if isinstance(got[a], BaseException) and not isinstance(got[a], WorkerLost)]
    silent = [a for a, e in failed if isinstance(e, NotAnswered)]  # they may still apply: settled later
    refused = [a for a, e in failed if not isinstance(e, NotAnswered)]
    unreached = []
    if refused:  # a part a worker that answered still keeps staged is forgotten (committed without it)
        gone = yield Send({a: _request(table, "abort", txn) for a in refused})
        unreached = [a for a in refused if isinstance(gone[a], BaseException)]  # the coordinator's
    size = yield Commit(txn, res, silent, unreached)
    stored = "the rest of the insert was stored" if res else "nothing of the insert was stored"
    if failed and not lost:  # a live worker's answer, or its silence: its shards stay (and so do its items)
        if table._cfg.evicts_to_max_size(size):
            yield EvictTo(size)
        a, e = failed[0]
        if not isinstance(e, Exception):
            raise e
        if isinstance(e, NotAnswered):
            raise _unsettled_error(a, txn, e, stored) from e
        raise GearFlowError(
            f"worker {a} did not apply its part of insert {txn[:8]} ({type(e).__name__}: {e}); {stored}"
        ) from e
    if lost:
        yield LostWorkers(lost)
        if table._cfg.evicts_to_max_size(size):  # stored: evicted to max_size as a returning insert is
            try:
                yield EvictTo(size)
            except ShardLostError:  # not degraded: the lost shard's victims stay (the error says stored)
                pass
        besides = "".join(f"; worker {a} did not apply its part ({type(e).__name__}: {e})" for a, e in failed)
        raise ShardLostError(
            shard_on(table, lost),
            f"worker(s) {lost} were lost while insert {txn[:8]} was applied; its episodes there are gone, "
            f"{stored}{besides}",
            stored=bool(res),
        )
    return res, size


def revocable(req: object) -> bool:
    """Whether a cancel or an interrupt may stop request ``req`` of :func:`transaction_steps` midway: only
    staging, which the steps then abort everywhere.  A write, an apply, a commit or an abort begun is carried
    to its end (:class:`LoopTransaction`, and
    :class:`~gear_flow.distributed.thread_insert.LaneTransaction` by handing it to the event loop): stopped
    midway, some workers would hold the step done and the coordinator would not know it.

    Parameters
    ----------
    req : object
        A request of the steps.

    Returns
    -------
    bool
        True for a :class:`Send` of stages only.
    """
    return isinstance(req, Send) and all(op == "stage" for op, _ in req.calls.values())


class LoopTransaction:
    """Answers :func:`transaction_steps` on the event loop: each worker's request over the comm (in-process
    when it is this worker).

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
        req : Send, Commit, AbortAt, LostWorkers or EvictTo
            The request.

        Returns
        -------
        object
            Its answer.
        """
        if revocable(req):
            return await self.send(req.calls)  # (cancelled while staging: the steps abort everywhere)
        # a write, an apply, a commit or an abort begun goes to its end through a cancel (through_cancel)
        return await through_cancel(self._answer(req))

    async def _answer(self, req: object) -> object:
        t = self.t
        if isinstance(req, Send):
            return await self.send(req.calls)
        if isinstance(req, Commit):
            return await commit(t, req.txn, req.res, req.unsettled, req.unreached)
        if isinstance(req, AbortAt):
            return await abort_insert(t, req.txn, req.addrs, req.cause)
        if isinstance(req, LostWorkers):
            try:
                await t._link.handle_lost(req.addrs)
            except (Retry, ShardLostError):  # marked lost; the steps' error says what was stored
                pass
            return None
        if isinstance(req, EvictTo):
            return await evict_excess(t, req.size)
        raise TypeError(f"not a transaction's request: {req!r}")

    async def send(self, calls: dict) -> dict:
        """:class:`Send`'s answer: every request at once over the comm.

        Parameters
        ----------
        calls : dict
            ``{worker: (operation, arguments)}``.

        Returns
        -------
        dict
            ``{worker: reply or error}``.
        """
        t = self.t
        addrs = list(calls)
        got = await asyncio.gather(
            *(call(t._ctx, a, calls[a][0], table=t.name, **calls[a][1]) for a in addrs), return_exceptions=True
        )
        return dict(zip(addrs, got))


def shard_on(table: DistributedTable, addrs: Iterable[str]) -> int:
    """The first shard placed on one of ``addrs``.

    Parameters
    ----------
    table : DistributedTable
        The handle.
    addrs : iterable of str
        Worker addresses.

    Returns
    -------
    int
        The shard, or -1 when none is placed there (it moved).
    """
    return min((s for s, a in table.placement.items() if a in addrs), default=-1)


def insert_error(table: DistributedTable, e: BaseException, addrs: Iterable[str]) -> GearFlowError:
    """The error an insert that failed before anything of it was stored raises.

    Parameters
    ----------
    table : DistributedTable
        The handle.
    e : BaseException
        What failed.
    addrs : iterable of str
        The insert's workers.

    Returns
    -------
    GearFlowError
        A ``ShardLostError`` (``stored=False``) for a lost worker, ``e``
        itself if it is a ``GearFlowError``, else one that names it.
    """
    if isinstance(e, WorkerLost):
        return ShardLostError(
            shard_on(table, [e.addr]),
            f"worker {e.addr} could not be reached during an insert; nothing of the insert was stored",
            stored=False,
        )
    if isinstance(e, GearFlowError):
        return e
    return GearFlowError(f"insert failed on {addrs} ({type(e).__name__}: {e}); nothing of the insert was stored")
