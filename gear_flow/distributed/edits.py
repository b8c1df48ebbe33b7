"""Item edits of a distributed table: priority updates, deletes and eviction to ``max_size``.

``update_priorities`` sets priorities by key and ``delete`` removes items by
key, one request per worker, all or nothing for keys the table never issued;
an update with ``wait=False`` may ride on the handle's next sample instead
(:mod:`~gear_flow.distributed.pending`), and one that waits is sent from the
caller's thread when it can be (:mod:`~gear_flow.distributed.thread_update`).
Eviction removes what the table's remover chooses once an insert has taken
the table past ``max_size``, by the planner's eviction plan (the same rule as
the local table's).

Functions over the handle they are given; the handle's methods of the same
names call them (and its ``_evict_excess``, which the inserts call, calls
:func:`evict_excess`).  How an edit's keys are grouped by worker, checked,
sent and booked is :mod:`~gear_flow.distributed.edit_keys`, shared with the
two other paths of an update.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import ArrayLike

from ..errors import GearFlowError, ShardLostError
from ..table import planner
from ..table.results import UpdateResult
from . import pending
from .edit_keys import LoopUpdater, checked, group, grouped_update, lost_keys, moved_keys, update_steps
from .pending import PENDING_MAX
from .thread_update import update_here
from .transport import Retry, through_cancel

if TYPE_CHECKING:
    from .api import DistributedTable
    from .transport import TableLink

#: workers an eviction may lose (degraded table) before it leaves the rest to the next insert's eviction
_LOSSES = 4
logger = logging.getLogger(__name__)


def update_priorities(
    table: DistributedTable, keys: ArrayLike, priorities: ArrayLike | float, *, wait: bool = True
) -> UpdateResult | None:
    """Set priorities by key: one message per worker, all or nothing for invalid input.

    Keys of items removed meanwhile (evicted, expired, deleted, or on a
    lost shard in a degraded table) are skipped and counted as stale.

    With ``wait=False`` the update rides on this handle's next sample
    instead (a learner's step is then one phase of requests, not two):
    it is checked here, stored, and applied on each worker before that
    sample's draw; workers the sample does not draw from get it in the
    same round trip.  That sample draws items with the new priorities
    within each shard, but splits its rows over the shards by the masses
    planned before it (each row reports the probability of the draw
    made); its replies carry the new masses, so the sample after it is
    planned with them.  Other handles see the update once that sample (or
    :meth:`flush`, :meth:`checkpoint`, :meth:`close`) has sent it.  Only for weighted samplers without heap
    ties (``Prioritized``, ``Uniform``) and keys this handle has seen
    issued; otherwise the call waits as with ``wait=True``.  A handle that
    draws its batches itself from the shards' published state (on the
    workers' machine, ``distributed.reader-draw``, the default) sends no
    request per sample: its stored updates go to the owners in the
    background, at most ``distributed.reader-flush`` seconds later (sooner
    once many are stored), and a batch drawn before they arrive is drawn
    with the priorities as they were (:mod:`~gear_flow.distributed.reader_draw`).

    A handle's updates reach each worker in the order they were made,
    whichever thread makes them: an update with ``wait=True`` first sends
    the updates stored before it and waits for those riding on a sample
    in flight (another thread's), and no later ride-along of its shards
    leaves before it is answered.

    Parameters
    ----------
    table : DistributedTable
        The handle (the handle itself, on its method of this name).
    keys : array_like of int
        Keys from :attr:`SampleBatch.keys` or :class:`InsertResult`,
        any shape (flattened).
    priorities : float or array_like of float
        One value for all keys, or one per key; finite and >= 0.
    wait : bool, default True
        False: let the update ride on the next sample (see above).

    Returns
    -------
    UpdateResult or None
        ``applied`` items updated, ``stale`` keys ignored; None when the
        update was stored to ride on the next sample (its stale keys are
        counted in ``stats["deferred_stale"]``).

    Raises
    ------
    InvalidDataError
        Non-integer keys, or not one priority per key.
    SpecError
        ``priorities`` is None.
    InvalidPriorityError
        A priority that is NaN, infinite or negative, or one the sampler
        or remover cannot represent.
    UnknownKeyError
        A key naming no shard of the table, or never issued by it;
        nothing was applied.
    ShardLostError
        A key names a lost shard and the table is not ``degraded``.
    """
    if not wait and pending.defer_priorities(
        table, keys, priorities
    ):  # stored in this thread: no trip to the event loop
        return None
    done = update_here(table, keys, priorities)  # sent from this thread when it can be
    if done is not None:
        return done
    return table._ctx.sync(update_priorities_async, table, keys, priorities, wait=wait)


async def update_priorities_async(
    table: DistributedTable, keys: ArrayLike, priorities: ArrayLike | float, *, wait: bool = True
) -> UpdateResult | None:
    """:meth:`update_priorities` for a caller inside the event loop.

    Parameters
    ----------
    table : DistributedTable
        The handle (the handle itself, on its method of this name).
    keys : array_like of int
        Item keys.
    priorities : float or array_like of float
        One value, or one per key.
    wait : bool, default True
        False: ride on the next sample when allowed.

    Returns
    -------
    UpdateResult or None
        ``applied`` items updated, ``stale`` keys ignored; None when
        stored to ride on the next sample.

    Raises
    ------
    InvalidDataError, SpecError, InvalidPriorityError, UnknownKeyError, ShardLostError
        As :meth:`update_priorities`.
    """
    if not wait and pending.defer(table, keys, priorities):
        if len(table._pending) > PENDING_MAX:
            await pending.send_pending(table)
        return None
    k, by, idx, on_lost, pr = grouped_update(table, keys, priorities)
    held = {i for s in by.values() for i in s}
    await pending.hold_pending(table, held)  # keep this handle's updates in call order
    try:
        return await planner.run_async(update_steps(table, k, by, idx, pr, on_lost), LoopUpdater(table))
    finally:
        table._pending.release(held)


def delete(table: DistributedTable, keys: ArrayLike) -> UpdateResult:
    """Remove items by key (stale keys ignored and counted).

    Parameters
    ----------
    table : DistributedTable
        The handle (the handle itself, on its method of this name).
    keys : array_like of int
        Keys of the items to remove, any shape (flattened).

    Returns
    -------
    UpdateResult
        ``applied`` items removed, ``stale`` keys already gone.

    Raises
    ------
    InvalidDataError
        Non-integer keys.
    UnknownKeyError
        A key naming no shard of the table, or never issued by it;
        nothing was removed.
    ShardLostError
        A key names a lost shard and the table is not ``degraded``.
    """
    return table._ctx.sync(delete_async, table, keys)


async def delete_async(table: DistributedTable, keys: ArrayLike) -> UpdateResult:
    """:meth:`delete` for a caller inside the event loop.

    Parameters
    ----------
    table : DistributedTable
        The handle (the handle itself, on its method of this name).
    keys : array_like of int
        Keys of the items to remove.

    Returns
    -------
    UpdateResult
        ``applied`` items removed, ``stale`` keys already gone.

    Raises
    ------
    InvalidDataError, UnknownKeyError, ShardLostError
        As :meth:`delete`.
    """
    table._masses.clear()  # this handle's own writes show in its next sample's plan
    # and its next sample is admitted by the coordinator: a lease (MinSize) was granted for the size before
    # the delete, which may leave the table below its min_size_to_sample (another handle's delete reaches
    # its leases when they end, distributed.sample-lease-seconds)
    table._lease.revoke()
    return await _delete_grouped(table, *group(table, keys))


async def _delete_grouped(
    table: DistributedTable, k: np.ndarray, by: dict, idx: dict, on_lost: int, attempt: int = 0
) -> UpdateResult:
    moved = []
    if len(by) > 1:
        by, lost, moved = await checked(table, by)
        on_lost += lost
    # the workers' delete and the coordinator's count of it: one step, begun on the workers, so to its end through
    # a cancel (a blocking delete interrupted there left the coordinator counting items the workers had removed)
    res, errors, d = await through_cancel(_removed_everywhere(table, by))
    st = sum(r[1] for r in res.values()) + on_lost + lost_keys(by, res, errors)
    again = moved_keys(table, idx, errors + moved, attempt)
    if not len(again):
        return UpdateResult(d, st)
    more = await _delete_grouped(table, *group(table, k[again]), attempt + 1)  # where those shards are now
    return UpdateResult(d + more.applied, st + more.stale)


async def _removed_everywhere(table: DistributedTable, by: dict) -> tuple[dict, list, int]:
    """The workers delete ``by``'s items, then the coordinator counts what they removed: ``(replies, errors,
    items removed)``."""
    res, errors = await table._link.on_workers(
        {a: ("delete", by.request(name=table.name, seqs_by_shard=s)) for a, s in by.items()}, partial=True
    )
    per = {s: k for r in res.values() for s, k in r[0].items() if k}
    d = sum(per.values())
    if d:  # what the workers that answered removed, even when another was lost: the sizes stay agreed
        await table._link.coordinator.removed(d, per)
    return res, errors, d


class Hold:
    """The table's eviction hold at the coordinator (no other eviction, nor an exclusive sample, meanwhile),
    released exactly once: an async context manager.

    The coordinator ends a hold with the operation that ends an exclusive
    sample, ``sample_finished`` (one operation for both; another name would
    be a protocol change).

    Parameters
    ----------
    link : TableLink
        The handle's requests to the coordinator.
    owner : str
        Who holds it (released by the coordinator if it leaves).
    """

    def __init__(self, link: TableLink, owner: str) -> None:
        self._link = link
        self._owner = owner
        self._grant: dict | None = None

    @property
    def size(self) -> int:
        """The table's size when the hold was granted."""
        return int(self._grant["size"])

    async def __aenter__(self) -> Hold:
        # not the table's timeout (the rate limiter's wait): the insert is committed, and an eviction or
        # exclusive sample in progress ends soon (or with its owner); failing here would report it lost
        self._grant = await self._link.coordinator.admit_hold(owner=self._owner)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.release()

    async def release(self) -> None:
        """End the hold (once: again does nothing)."""
        grant, self._grant = self._grant, None
        if grant is not None:
            await self._link.coordinator.sample_finished(grant["txn"])


async def evict_excess(table: DistributedTable, size: int) -> None:
    """Back to ``max_size``, under the table's eviction hold and by the size the hold was granted at.

    Tables whose samples expire items evict after any sample in progress has
    expired what it hands out.

    Parameters
    ----------
    table : DistributedTable
        The handle.
    size : int
        The table's size at this insert's commit; it may count items another
        insert's eviction removes meanwhile, so the hold's size is used.

    Raises
    ------
    ShardLostError
        A shard was lost (``stored=True``: the insert was committed).
    """
    async with Hold(table._link, table._ctx.owner) as hold:
        try:
            excess = hold.size - table.spec.max_size
            for _ in range(_LOSSES):
                if excess <= 0:
                    return
                try:
                    await _evict(table, excess)
                    return
                except Retry:  # degraded: a worker was lost meanwhile (its shards are marked lost, their items
                    # out of the size): what is still over max_size is evicted from the shards left
                    excess = (await table._link.coordinator.lookup())["size"] - table.spec.max_size
            logger.warning("table %r: eviction to max_size given up after %d lost workers", table.name, _LOSSES)
        except ShardLostError as e:  # the insert is stored: a caller must not take it as lost and send it again
            raise ShardLostError(
                e.shard,
                f"{e.detail}; the insert was stored (committed) before the eviction to max_size failed",
                stored=True,
            ) from None
        except GearFlowError as e:  # e.g. a live worker that did not answer: the insert is stored, so it returns
            logger.warning(
                "table %r: an insert was stored, but its eviction to max_size failed (%s: %s); the table is over "
                "max_size until the next insert's eviction",
                table.name,
                type(e).__name__,
                e,
            )


async def _evict(table: DistributedTable, excess: int) -> int:
    """Remove ``excess`` items as the remover says (the planner's eviction plan)."""
    seqs: dict = {}  # shard -> {slot: seq} of the last candidates, to remove only those very items

    async def answer(req):
        return await answer_evict(table, req, seqs)

    return await planner.run_async(planner.evict(excess, table._cfg.remover.deterministic, table.rng), answer)


async def answer_evict(
    table: DistributedTable, req: planner.Summaries | planner.Candidates | planner.Evict, seqs: dict
) -> object:
    """Answer one request of the planner's eviction plan from the workers.

    Parameters
    ----------
    table : DistributedTable
        The handle.
    req : planner.Summaries, planner.Candidates or planner.Evict
        The plan's request.
    seqs : dict
        ``{shard: {slot: seq}}`` of the last candidates (written by a
        ``Candidates`` answer, read by the ``Evict`` that follows), so that
        only those very items are removed.

    Returns
    -------
    object
        What the plan asked for: the summaries, the candidates, or the
        number of items removed.
    """
    workers = table._view.workers()
    if isinstance(req, planner.Summaries):
        res = await table._link.on_workers({a: ("summaries", dict(name=table.name, kinds=req.kinds)) for a in workers})
        return {k: {s: v for r in res.values() for s, v in r[k].items()} for k in req.kinds}
    if isinstance(req, planner.Candidates):
        res = await table._link.on_workers(
            {a: ("candidates", dict(name=table.name, n=req.n, role=req.role)) for a in workers}
        )
        cands = {s: c for r in res.values() for s, c in r.items()}
        # an ordered remover's victims come with the seq of each one: an insert may write its ring over
        # a victim's slot before the removal, which must then spare the newer item there
        seqs.clear()
        seqs.update({s: dict(zip(c[0].tolist(), c[2].tolist())) for s, c in cands.items()})
        return {s: (c[0], c[1]) for s, c in cands.items()}
    assert isinstance(req, planner.Evict)
    by = defaultdict(dict)
    if req.slots is not None:
        for s, sl in req.slots.items():
            by[table.placement[s]][s] = sl
        msgs = {
            a: {
                "slots": v,
                "seqs": {s: np.array([seqs[s][x] for x in sl.tolist()], np.int64) for s, sl in v.items()},
            }
            for a, v in by.items()
        }
    else:
        for s, k in req.counts.items():
            by[table.placement[s]][s] = k
        msgs = {a: {"counts": v} for a, v in by.items()}
    res, errors = await table._link.on_workers(
        {a: ("remove", {"name": table.name, **m, "seed": int(table.rng.integers(2**63))}) for a, m in msgs.items()},
        partial=True,
    )
    per = {s: k for r in res.values() for s, k in r.items() if k}
    if per:  # what the workers that answered removed, even when another was lost: the sizes stay agreed
        await table._link.coordinator.removed(sum(per.values()), per)
    if errors:
        raise errors[0]
    return sum(per.values())
