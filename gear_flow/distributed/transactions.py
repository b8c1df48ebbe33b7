"""The transaction of a distributed table's insert across its workers: stage, apply, commit, or abort.

Once the coordinator has admitted an insert (and given it a transaction id),
its parts are *staged* on every shard worker (validated, nothing visible),
then *applied*, then *committed* at the coordinator.  If staging fails
anywhere, every worker forgets its staged part and the coordinator gives back
the admission, so nothing of the insert is stored; a worker lost after every
part was staged loses its episodes, and the rest of the insert is stored.  An
insert that touches one worker stages and applies in one request (``write``).

:func:`run_insert`, :func:`apply_staged` and :func:`abort_staged` are
functions over the handle they are given (with the steps they share:
:func:`commit`, :func:`abort_insert`, :func:`insert_error`); the handle's
methods of the same names call them, since they are public on the handle:
besides :meth:`~gear_flow.distributed.DistributedTable.insert`, the Dask
ingestion dataflow (:mod:`gear_flow.ingest.cluster`) stages parts from its
own tasks and then calls ``apply_staged`` or ``abort_staged``.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Iterable
from typing import TYPE_CHECKING

from ..errors import GearFlowError, ShardLostError
from .edits import evict_excess
from .transport import NotAnswered, Retry, WorkerLost, call

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
    table: DistributedTable, n: int, episodes: int, per_shard: dict[int, int], timeout: float | None
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

    Returns
    -------
    dict
        The request's fields.
    """
    return dict(n=n, episodes=episodes, per_shard=per_shard, timeout=timeout, owner=table._ctx.owner)


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
    addrs = sorted(parts)
    if len(addrs) == 1:  # one worker: staged and applied in one request
        try:
            res = {
                addrs[0]: await call(
                    table._ctx, addrs[0], "write", table=table.name, name=table.name, txn=txn, parts=parts[addrs[0]]
                )
            }
        except NotAnswered as e:  # it may still write it: the coordinator settles it (counted or aborted)
            await commit(table, txn, {}, addrs)
            raise _unsettled_error(addrs[0], txn, e, "nothing else was to be stored") from e
        except BaseException as e:
            await abort_insert(table, txn, addrs, e)
            raise insert_error(table, e, addrs) from None
    else:
        done = set(staged)
        got = await asyncio.gather(
            *(
                call(table._ctx, a, "stage", table=table.name, name=table.name, txn=txn, parts=parts[a])
                for a in addrs
                if a not in done
            ),
            return_exceptions=True,
        )
        bad = [e for e in got if isinstance(e, BaseException)]
        if bad:
            await abort_insert(table, txn, addrs, bad[0])
            raise insert_error(table, bad[0], addrs) from None
        return await apply_staged(table, txn, addrs)
    return res, await commit(table, txn, res)


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
    addrs = sorted(addrs)
    got = await asyncio.gather(
        *(call(table._ctx, a, "apply", table=table.name, name=table.name, txn=txn) for a in addrs),
        return_exceptions=True,
    )
    res = {a: r for a, r in zip(addrs, got) if not isinstance(r, BaseException)}
    lost = [a for a, r in zip(addrs, got) if isinstance(r, WorkerLost)]
    failed = [(a, r) for a, r in zip(addrs, got) if isinstance(r, BaseException) and not isinstance(r, WorkerLost)]
    silent = [a for a, e in failed if isinstance(e, NotAnswered)]  # they may still apply: settled later
    refused = [a for a, e in failed if not isinstance(e, NotAnswered)]
    unreached = []
    if refused:  # a part a worker that answered still keeps staged is forgotten (committed without it)
        gone = await asyncio.gather(
            *(call(table._ctx, a, "abort", table=table.name, name=table.name, txn=txn) for a in refused),
            return_exceptions=True,
        )
        unreached = [a for a, r in zip(refused, gone) if isinstance(r, BaseException)]  # the coordinator's
    size = await commit(table, txn, res, silent, unreached)
    stored = "the rest of the insert was stored" if res else "nothing of the insert was stored"
    if failed and not lost:  # a live worker's answer, or its silence: its shards stay (and so do its items)
        if table._cfg.evicts_to_max_size(size):
            await evict_excess(table, size)
        a, e = failed[0]
        if not isinstance(e, Exception):
            raise e
        if isinstance(e, NotAnswered):
            raise _unsettled_error(a, txn, e, stored) from e
        raise GearFlowError(
            f"worker {a} did not apply its part of insert {txn[:8]} ({type(e).__name__}: {e}); {stored}"
        ) from e
    if lost:
        try:
            await table._link.handle_lost(lost)
        except (Retry, ShardLostError):  # marked lost; the error says what was stored
            pass
        if table._cfg.evicts_to_max_size(size):  # stored: evicted to max_size as a returning insert is
            try:
                await evict_excess(table, size)
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
