"""An edit's keys on their way to the workers: grouped by worker, checked, sent, the replies booked.

Every path of a priority update shares these functions over the handle: the
event loop's (:mod:`~gear_flow.distributed.edits`), the caller's thread's
(:mod:`~gear_flow.distributed.thread_update`) and the ride-along store's
(:mod:`~gear_flow.distributed.pending`, which checks and groups an update
before it stores it); deletes group and check their keys the same way.  They
sit below all three so that none of those calls another through the handle.
A waiting update is one generator of steps, :func:`update_steps`, answered
on the event loop by :class:`LoopUpdater` or in the caller's thread by
:class:`~gear_flow.distributed.thread_update.ThreadUpdater`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Generator, Iterable
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
from numpy.typing import ArrayLike

from ..errors import ShardLostError, ShardMovedError, SpecError
from ..keys import decode, shard_parts
from ..selectors import MaxHeap, MinHeap
from ..table.results import UpdateResult
from ..table.validate import check_keys, check_priorities
from .transport import Moved, Retry

if TYPE_CHECKING:
    from .api import DistributedTable

#: times an edit's keys are sent again after their shards moved, before it gives up
_MOVES = 8


def heap_ties(table: DistributedTable) -> bool:
    """Whether the table's sampler or remover is a heap, whose ties follow the table-wide clock.

    Parameters
    ----------
    table : DistributedTable
        The handle.

    Returns
    -------
    bool
        True for a ``MaxHeap`` or ``MinHeap`` sampler or remover: an update
        is then stamped by the coordinator and never rides along.
    """
    return any(isinstance(x, (MaxHeap, MinHeap)) for x in (table._cfg.sampler, table._cfg.remover))


class ByWorker(dict):
    """An edit's ``{worker: {shard: seqs}}``, grouped at placement ``version``, which its requests carry.

    A request says the placement it was planned at, so that a worker whose
    shards changed since refuses it and its keys go again where the shards
    are now (:func:`moved_keys`).  The handle's own version is the one it
    knows when it sends; an edit grouped before the handle learnt a move
    (an update whose handle sent its stored updates first, and was refused
    as placed before the move) went out as planned at the new placement, and
    the old worker answered that the shard was not there.

    Parameters
    ----------
    items : mapping
        ``{worker: {shard: seqs}}``.
    version : int
        The placement version it was grouped at.
    """

    def __init__(self, items: dict, version: int) -> None:
        super().__init__(items)
        self.version = version

    def only(self, addrs: Iterable[str]) -> ByWorker:
        """The workers of this grouping that are among ``addrs``, at the same version.

        Parameters
        ----------
        addrs : iterable of str
            Workers to keep.

        Returns
        -------
        ByWorker
            The kept part.
        """
        keep = set(addrs)
        return ByWorker({a: s for a, s in self.items() if a in keep}, self.version)

    def request(self, **args: object) -> dict:
        """A request's arguments, with the placement version this grouping was planned at.

        Parameters
        ----------
        **args : object
            The request's arguments.

        Returns
        -------
        dict
            ``args`` and ``epoch``.
        """
        return {**args, "epoch": self.version}


def group(table: DistributedTable, keys: ArrayLike) -> tuple:
    """Keys checked and grouped by the worker of their shard, as the handle last saw the placement.

    Parameters
    ----------
    table : DistributedTable
        The handle.
    keys : array_like of int
        Item keys, any shape (flattened).

    Returns
    -------
    tuple
        ``(k, by, idx, on_lost)``: the flat int64 keys; ``{worker: {shard:
        seqs}}`` (a :class:`ByWorker`, at the placement read); ``{worker:
        {shard: indices into k}}``; the number of keys on lost shards (left
        out of ``by``).

    Raises
    ------
    InvalidDataError, UnknownKeyError
        Keys that are not integers or name no shard of the table.
    ShardLostError
        A key names a lost shard and the table is not ``degraded``.
    """
    k = check_keys(keys, table.spec.num_shards)
    shard, seq = decode(k)
    now = table._view.now()  # one reading of the placement for the whole grouping
    parts = shard_parts(shard)
    lost = [s for s, _ in parts if s in now.lost]
    if lost and not table.degraded:
        raise ShardLostError(lost[0], "keys name a lost shard")
    by = defaultdict(dict)
    idx = defaultdict(dict)
    for s, m in parts:
        if s in now.lost:
            continue
        by[now.shards[s]][s] = seq[m]
        idx[now.shards[s]][s] = m
    return k, ByWorker(by, now.version), idx, int(np.isin(shard, lost).sum()) if lost else 0


def grouped_update(table: DistributedTable, keys: ArrayLike, priorities: ArrayLike | float) -> tuple:
    """An update's keys checked and grouped by worker (:func:`group`), and its priorities checked.

    Invalid input raises here, before anything is sent or stored.

    Parameters
    ----------
    table : DistributedTable
        The handle.
    keys : array_like of int
        Item keys, any shape (flattened).
    priorities : float or array_like of float
        One value for all keys, or one per key.

    Returns
    -------
    tuple
        ``(k, by, idx, on_lost, pr)``: :func:`group`'s answer and the checked
        priorities (one per key, or one for all).

    Raises
    ------
    InvalidDataError, SpecError, InvalidPriorityError, UnknownKeyError, ShardLostError
        As :meth:`~gear_flow.distributed.DistributedTable.update_priorities`.
    """
    k, by, idx, on_lost = group(table, keys)
    pr = check_priorities(priorities, len(k), "keys")
    if pr is None:
        raise SpecError("priorities must not be None")
    table._cfg.check_priorities(pr)
    return k, by, idx, on_lost, pr


class CheckKeys(NamedTuple):
    """Check an edit's keys on every worker of ``by`` before any applies it (:func:`checked`); answered with
    ``(by, keys on lost shards, the moved workers' refusals)``.

    Parameters
    ----------
    by : dict
        ``{worker: {shard: seqs}}``.
    """

    by: dict


class Stamps(NamedTuple):
    """Take ``n`` table-wide stamps from the coordinator; answered with the first.

    Parameters
    ----------
    n : int
        How many.
    """

    n: int


class Apply(NamedTuple):
    """Send the ``update`` requests ``calls``; answered with ``(replies, errors)`` (``on_workers(partial=True)``'s:
    a worker's failure is an error in the list, not raised).

    Parameters
    ----------
    calls : dict
        ``{worker: ("update", args)}``.
    """

    calls: dict


def update_steps(
    table: DistributedTable, k: np.ndarray, by: dict, idx: dict, pr: np.ndarray, on_lost: int, attempt: int = 0
) -> Generator[object, object, UpdateResult]:
    """A priority update, sans I/O: its keys checked where they must be, stamped when heap ties need it,
    applied, the keys of shards that moved meanwhile sent again where they are now.

    The one place that says what an update's replies mean (lost shards:
    stale keys; moved ones: sent again; any other error raised), whichever
    executor answers its :class:`CheckKeys`, :class:`Stamps` and
    :class:`Apply` (:class:`LoopUpdater` on the event loop,
    :class:`~gear_flow.distributed.thread_update.ThreadUpdater` in the
    caller's thread; run with :func:`gear_flow.table.planner.run_async` or
    :func:`~gear_flow.table.planner.run`).  The caller holds the update's
    shards from ride-alongs.

    Parameters
    ----------
    table : DistributedTable
        The handle.
    k, by, idx
        The update's keys grouped by worker (:func:`group`).
    pr : numpy.ndarray
        Its priorities: one per key, or one for all.
    on_lost : int
        Its keys on lost shards (stale).
    attempt : int, default 0
        Times its keys were sent again after a move.

    Returns
    -------
    generator
        Yields the requests; returns the :class:`~gear_flow.table.results.UpdateResult`
        (``applied`` items updated, ``stale`` keys ignored).
    """
    moved = []
    if len(by) > 1 and not table._issued.covers(k):
        # unknown keys anywhere must stop the whole call before any worker applies it (skipped when
        # every key is one this handle has seen issued: then no worker can find it unknown)
        by, lost, moved = yield CheckKeys(by)
        on_lost += lost
    stamps = None
    if heap_ties(table) and len(k):  # heap ties across shards follow the table-wide insert/update clock
        stamps = (yield Stamps(len(k))) + np.arange(len(k), dtype=np.int64)
    plans = table._masses.plans()
    calls = update_calls(table, by, idx, pr, stamps, plans)
    try:
        res, errors = yield Apply(calls)
        on_lost += lost_keys(by, res, errors)
    except BaseException:
        table._masses.clear()
        raise
    again = moved_keys(table, idx, errors + moved, attempt)
    done = updated_all(table, np.delete(k, again), res, plans, on_lost)
    if not len(again):
        return done
    more = yield from update_steps(table, *regrouped(table, k, pr, again), attempt + 1)
    return UpdateResult(done.applied + more.applied, done.stale + more.stale)


class LoopUpdater:
    """Answers :func:`update_steps` on the event loop: the workers over the comm or their lanes.

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
        req : CheckKeys, Stamps or Apply
            The request.

        Returns
        -------
        object
            Its answer.
        """
        if isinstance(req, Apply):
            return await self.t._link.on_workers(req.calls, partial=True)
        if isinstance(req, CheckKeys):
            return await checked(self.t, req.by)
        if isinstance(req, Stamps):
            return await self.t._link.coordinator.stamps(req.n)
        raise TypeError(f"not an update's request: {req!r}")


def regrouped(table: DistributedTable, k: np.ndarray, pr: np.ndarray, again: np.ndarray) -> tuple:
    """Keys ``k[again]`` and their priorities grouped by worker as placed now (after a move).

    Parameters
    ----------
    table : DistributedTable
        The handle.
    k : numpy.ndarray
        An update's keys.
    pr : numpy.ndarray
        Its priorities: one per key, or one for all.
    again : numpy.ndarray
        Indices into ``k`` of the keys to send again.

    Returns
    -------
    tuple
        ``(k, by, idx, pr, on_lost)``: :func:`update_steps`' arguments.
    """
    k, by, idx, on_lost = group(table, k[again])
    return k, by, idx, pr[again] if np.ndim(pr) else pr, on_lost


def moved_keys(table: DistributedTable, idx: dict, errors: list, attempt: int = 0) -> np.ndarray:
    """Indices of the keys sent to workers that refused them because their shards moved.

    Parameters
    ----------
    table : DistributedTable
        The handle.
    idx : dict
        ``{worker: {shard: indices}}`` of the edit (:func:`group`).
    errors : list
        The workers' errors; a :class:`~.transport.Moved` among them names
        the workers whose shards moved.
    attempt : int, default 0
        Times the edit's keys were sent again after a move.

    Returns
    -------
    numpy.ndarray
        Sorted int64 indices, sent again as placed now.

    Raises
    ------
    ShardMovedError
        Shards moved under the edit more than ``_MOVES`` times.
    """
    addrs = Moved.among(errors)
    if addrs and attempt >= _MOVES:
        raise ShardMovedError(table._view.version, f"table {table.name!r}: shards kept moving under an edit")
    got = [m for a in sorted(addrs) for m in idx.get(a, {}).values()]
    return np.sort(np.concatenate(got)) if got else np.zeros(0, dtype=np.int64)


def update_calls(
    table: DistributedTable, by: ByWorker, idx: dict, pr: np.ndarray, stamps: np.ndarray | None, plans: list
) -> dict:
    """The ``update`` request of each worker of ``by`` (its shards' seqs, their priorities ``pr[idx]``).

    Parameters
    ----------
    table : DistributedTable
        The handle.
    by, idx : dict
        The update's keys grouped by worker (:func:`group`).
    pr : numpy.ndarray
        Priorities, one per key.
    stamps : numpy.ndarray or None
        The coordinator's stamps, one per key (heap ties), or None.
    plans : list
        The kept masses' plans, whose masses the replies bring back.

    Returns
    -------
    dict
        ``{worker: ("update", kwargs)}``.
    """
    return {
        a: (
            "update",
            by.request(
                name=table.name,
                seqs_by_shard=s,
                prios_by_shard={i: pr[idx[a][i]] for i in s},
                stamps_by_shard=None if stamps is None else {i: stamps[idx[a][i]] for i in s},
                # the updated shards' masses come back (when this handle plans with kept masses):
                # the next plan stays one round trip
                masses=plans or None,
            ),
        )
        for a, s in by.items()
    }


def updated_all(table: DistributedTable, k: np.ndarray, res: dict, plans: list, on_lost: int) -> UpdateResult:
    """Book the workers' replies ``res`` to an update of keys ``k``: masses kept; applied and stale.

    Parameters
    ----------
    table : DistributedTable
        The handle.
    k : numpy.ndarray
        The keys sent (less those sent again elsewhere).
    res : dict
        Each answering worker's reply.
    plans : list
        The plans the update asked masses for.
    on_lost : int
        Keys on lost shards (stale).

    Returns
    -------
    UpdateResult
        ``applied`` items updated, ``stale`` keys ignored.
    """
    for r in res.values():
        if isinstance(r, dict):
            table._masses.update_many(plans, r["masses"])
    stale = sum(r["stale"] if isinstance(r, dict) else int(r) for r in res.values()) + on_lost
    return UpdateResult(len(k) - stale, stale)


async def checked(table: DistributedTable, by: dict) -> tuple[dict, int, list]:
    """``check_keys`` on every worker of ``by``: an unknown key anywhere raises before any worker applies
    the edit.

    Parameters
    ----------
    table : DistributedTable
        The handle.
    by : dict
        ``{worker: {shard: seqs}}``.

    Returns
    -------
    tuple of (dict, int, list)
        ``by`` less the workers lost meanwhile (a degraded table) and those whose shards moved; the number
        of keys the lost ones held (stale, as those of shards already lost); and the moved ones'
        :class:`~.transport.Moved` refusals (their keys go where the shards are now, :func:`moved_keys`:
        sent to the old worker with the placement learnt since, they were refused as not its shards).
    """
    res, errors = await table._link.on_workers(
        {a: ("check_keys", by.request(name=table.name, seqs_by_shard=s)) for a, s in by.items()}, partial=True
    )
    lost = lost_keys(by, res, errors)
    return by.only(res), lost, [e for e in errors if isinstance(e, Moved)]


def lost_keys(by: dict, res: dict, errors: list) -> int:
    """Keys of ``by`` sent to workers that did not answer: in a degraded table those were lost.

    Their shards are marked lost (a :class:`Retry` says so) and the keys count
    as stale.  Any other error (a lost worker of a table that is not
    degraded, a worker's refusal) is raised.

    Parameters
    ----------
    by : dict
        ``{worker: {shard: seqs}}`` sent.
    res : dict
        The answering workers' replies.
    errors : list
        The other workers' errors.

    Returns
    -------
    int
        The keys counted stale.
    """
    other = [e for e in errors if not isinstance(e, Retry)]
    if other:
        raise other[0]
    moved = Moved.among(errors)  # sent again: not stale
    return sum(len(v) for a, sh in by.items() if a not in res and a not in moved for v in sh.values())
