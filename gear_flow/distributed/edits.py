"""Item edits of a distributed table: priority updates, deletes and eviction to ``max_size``.

``update_priorities`` sets priorities by key and ``delete`` removes items by
key, one request per worker, all or nothing for keys the table never issued;
an update with ``wait=False`` may ride on the handle's next sample instead
(:mod:`~gear_flow.distributed.pending`).  Eviction removes what the table's
remover chooses once an insert has taken the table past ``max_size``, by the
planner's eviction plan (the same rule as the local table's).

:class:`EditsMixin` is a mixin of
:class:`~gear_flow.distributed.DistributedTable` rather than a class of its
own because these methods work on the handle's state (placement, lost shards,
kept masses, issued keys, stored ride-along updates) and reach the workers
through its plumbing; the ride-along path
(:class:`~gear_flow.distributed.pending.RideAlongMixin`) groups keys with the
same ``_group`` and asks the same ``_heap_ties``, and inserts call
``_evict_excess``.  Keeping them here keeps the insert path readable on its
own, as :mod:`~gear_flow.distributed.host_edits` does on the worker side.
"""

from __future__ import annotations

import logging
from collections import defaultdict

import numpy as np
from numpy.typing import ArrayLike

from ..errors import GearFlowError, ShardLostError, ShardMovedError, SpecError
from ..keys import decode
from ..table import planner
from ..table.results import UpdateResult
from ..table.validate import check_keys, check_priorities
from .pending import PENDING_MAX
from .thread_update import update_here
from .transport import Moved, Retry

#: workers an eviction may lose (degraded table) before it leaves the rest to the next insert's eviction
_LOSSES = 4
#: times an edit's keys are sent again after their shards moved, before it gives up
_MOVES = 8
logger = logging.getLogger(__name__)


class EditsMixin:
    """Priority updates, deletes and eviction of :class:`~gear_flow.distributed.DistributedTable`."""

    @property
    def _heap_ties(self) -> bool:
        from ..selectors import MaxHeap, MinHeap

        return any(isinstance(x, (MaxHeap, MinHeap)) for x in (self._cfg.sampler, self._cfg.remover))

    # -- priorities, deletes ----------------------------------------------------------------------
    def _group(self, keys):
        k = check_keys(keys, self.spec.num_shards)
        shard, seq = decode(k)
        lost = sorted(set(np.unique(shard).tolist()) & set(self.lost))
        if lost and not self.degraded:
            raise ShardLostError(lost[0], "keys name a lost shard")
        by = defaultdict(dict)
        idx = defaultdict(dict)
        for s in np.unique(shard):
            if int(s) in self.lost:
                continue
            m = np.flatnonzero(shard == s)
            by[self.placement[int(s)]][int(s)] = seq[m]
            idx[self.placement[int(s)]][int(s)] = m
        return k, by, idx, int(np.isin(shard, list(self.lost)).sum())

    def _grouped_update(self, keys: ArrayLike, priorities: ArrayLike | float) -> tuple:
        """An update's keys checked and grouped by worker (:meth:`_group`), and its priorities checked
        (one per key, or one for all); invalid input raises here, before anything is sent or stored."""
        k, by, idx, on_lost = self._group(keys)
        pr = check_priorities(priorities, len(k), "keys")
        if pr is None:
            raise SpecError("priorities must not be None")
        self._cfg.check_priorities(pr)
        return k, by, idx, on_lost, pr

    def update_priorities(
        self, keys: ArrayLike, priorities: ArrayLike | float, *, wait: bool = True
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
        issued; otherwise the call waits as with ``wait=True``.

        A handle's updates reach each worker in the order they were made,
        whichever thread makes them: an update with ``wait=True`` first sends
        the updates stored before it and waits for those riding on a sample
        in flight (another thread's), and no later ride-along of its shards
        leaves before it is answered.

        Parameters
        ----------
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
        if not wait and self.defer_priorities(keys, priorities):  # stored in this thread: no trip to the event loop
            return None
        done = update_here(self, keys, priorities)  # sent from this thread when it can be
        if done is not None:
            return done
        return self._ctx.sync(self.update_priorities_async, keys, priorities, wait=wait)

    async def update_priorities_async(
        self, keys: ArrayLike, priorities: ArrayLike | float, *, wait: bool = True
    ) -> UpdateResult | None:
        """:meth:`update_priorities` for a caller inside the event loop.

        Parameters
        ----------
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
        if not wait and self._defer(keys, priorities):
            if len(self._pending) > PENDING_MAX:
                await self._send_pending()
            return None
        k, by, idx, on_lost, pr = self._grouped_update(keys, priorities)
        held = {i for s in by.values() for i in s}
        await self._hold_pending(held)  # keep this handle's updates in call order
        try:
            return await self._update_now(k, by, idx, pr, on_lost)
        finally:
            self._pending.release(held)

    async def _update_now(self, k, by, idx, pr, on_lost, attempt: int = 0) -> UpdateResult:
        """Send an update to the workers of its shards (held from ride-alongs by the caller); the keys of
        shards that moved meanwhile are sent again where they are now."""
        if len(by) > 1 and not self._issued.covers(k):
            # unknown keys anywhere must stop the whole call before any worker applies it (skipped when
            # every key is one this handle has seen issued: then no worker can find it unknown)
            by, lost = await self._checked(by)
            on_lost += lost
        stamps = None
        if self._heap_ties and len(k):  # heap ties across shards follow the table-wide insert/update clock
            stamps = (await self._coord("stamps", n=len(k))) + np.arange(len(k), dtype=np.int64)
        plans = self._masses.plans()
        calls = self._update_calls(by, idx, pr, stamps, plans)
        try:
            res, errors = await self._on_workers(calls, partial=True)
            on_lost += self._lost_keys(by, res, errors)
        except BaseException:
            self._masses.clear()
            raise
        again = self._moved_keys(idx, errors, attempt)
        done = self._updated_all(np.delete(k, again), res, plans, on_lost)
        if not len(again):
            return done
        more = await self._update_now(*self._regrouped(k, pr, again), attempt + 1)
        return UpdateResult(done.applied + more.applied, done.stale + more.stale)

    def _regrouped(self, k: np.ndarray, pr: np.ndarray, again: np.ndarray) -> tuple:
        """Keys ``k[again]`` and their priorities (``pr``: one per key, or one for all) grouped by worker as
        placed now (after a move): :meth:`_update_now`'s arguments."""
        k, by, idx, on_lost = self._group(k[again])
        return k, by, idx, pr[again] if np.ndim(pr) else pr, on_lost

    def _moved_keys(self, idx: dict, errors: list, attempt: int = 0) -> np.ndarray:
        """Indices of the keys sent to workers that refused them because their shards moved (a
        :class:`~.transport.Moved` in ``errors``): sent again as placed now."""
        addrs = Moved.among(errors)
        if addrs and attempt >= _MOVES:
            raise ShardMovedError(self._version, f"table {self.name!r}: shards kept moving under an edit")
        got = [m for a in sorted(addrs) for m in idx.get(a, {}).values()]
        return np.sort(np.concatenate(got)) if got else np.zeros(0, dtype=np.int64)

    def _update_calls(self, by: dict, idx: dict, pr: np.ndarray, stamps: np.ndarray | None, plans: list) -> dict:
        """The ``update`` request of each worker of ``by`` (its shards' seqs, their priorities ``pr[idx]``)."""
        return {
            a: (
                "update",
                dict(
                    name=self.name,
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

    def _updated_all(self, k: np.ndarray, res: dict, plans: list, on_lost: int) -> UpdateResult:
        """Book the workers' replies ``res`` to an update of keys ``k``: masses kept; applied and stale."""
        for r in res.values():
            if isinstance(r, dict):
                self._masses.update_many(plans, r["masses"])
        stale = sum(r["stale"] if isinstance(r, dict) else int(r) for r in res.values()) + on_lost
        return UpdateResult(len(k) - stale, stale)

    def delete(self, keys: ArrayLike) -> UpdateResult:
        """Remove items by key (stale keys ignored and counted).

        Parameters
        ----------
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
        return self._ctx.sync(self.delete_async, keys)

    async def delete_async(self, keys: ArrayLike) -> UpdateResult:
        """:meth:`delete` for a caller inside the event loop.

        Parameters
        ----------
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
        self._masses.clear()  # this handle's own writes show in its next sample's plan
        return await self._delete_grouped(*self._group(keys))

    async def _delete_grouped(self, k, by, idx, on_lost, attempt: int = 0) -> UpdateResult:
        if len(by) > 1:
            by, lost = await self._checked(by)
            on_lost += lost
        res, errors = await self._on_workers(
            {a: ("delete", dict(name=self.name, seqs_by_shard=s)) for a, s in by.items()}, partial=True
        )
        per = {s: k for r in res.values() for s, k in r[0].items() if k}
        d = sum(per.values())
        if d:  # what the workers that answered removed, even when another was lost: the sizes stay agreed
            await self._coord("removed", k=d, per_shard=per)
        st = sum(r[1] for r in res.values()) + on_lost + self._lost_keys(by, res, errors)
        again = self._moved_keys(idx, errors, attempt)
        if not len(again):
            return UpdateResult(d, st)
        more = await self._delete_grouped(*self._group(k[again]), attempt + 1)  # where those shards are now
        return UpdateResult(d + more.applied, st + more.stale)

    async def _checked(self, by: dict) -> tuple[dict, int]:
        """``check_keys`` on every worker of ``by`` (``{worker: {shard: seqs}}``): an unknown key anywhere
        raises before any worker applies the call.  Returns ``by`` less the workers lost meanwhile (a
        degraded table), and the number of keys they held (stale, as those of shards already lost)."""
        res, errors = await self._on_workers(
            {a: ("check_keys", dict(name=self.name, seqs_by_shard=s)) for a, s in by.items()}, partial=True
        )
        lost = self._lost_keys(by, res, errors)
        moved = Moved.among(errors)  # the call itself finds them moved
        return {a: s for a, s in by.items() if a in res or a in moved}, lost

    @staticmethod
    def _lost_keys(by: dict, res: dict, errors: list) -> int:
        """Keys of ``by`` sent to workers that did not answer: in a degraded table those were lost (their
        shards are marked lost, a :class:`Retry` says so) and the keys count as stale.  Any other error
        (a lost worker of a table that is not degraded, a worker's refusal) is raised."""
        other = [e for e in errors if not isinstance(e, Retry)]
        if other:
            raise other[0]
        moved = Moved.among(errors)  # sent again: not stale
        return sum(len(v) for a, sh in by.items() if a not in res and a not in moved for v in sh.values())

    # -- eviction ---------------------------------------------------------------------------------
    async def _evict_excess(self, size: int) -> None:
        """Back to ``max_size``, under the table's eviction hold and by the size the hold was granted at
        (``size``, the table's at this insert's commit, may count items another insert's eviction removes
        meanwhile).  Tables whose samples expire items evict after any sample in progress has expired what
        it hands out."""
        # not the table's timeout (the rate limiter's wait): the insert is committed, and an eviction or
        # exclusive sample in progress ends soon (or with its owner); failing here would report it lost
        hold = await self._coord("admit_hold", owner=self._ctx.owner)
        try:
            excess = hold["size"] - self.spec.max_size
            for _ in range(_LOSSES):
                if excess <= 0:
                    return
                try:
                    await self._evict(excess)
                    return
                except Retry:  # degraded: a worker was lost meanwhile (its shards are marked lost, their items
                    # out of the size): what is still over max_size is evicted from the shards left
                    excess = (await self._coord("lookup"))["size"] - self.spec.max_size
            logger.warning("table %r: eviction to max_size given up after %d lost workers", self.name, _LOSSES)
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
                self.name,
                type(e).__name__,
                e,
            )
        finally:
            await self._coord("sample_finished", txn=hold["txn"])

    async def _evict(self, excess: int) -> int:
        """Remove ``excess`` items as the remover says (the planner's eviction plan)."""
        seqs: dict = {}  # shard -> {slot: seq} of the last candidates, to remove only those very items

        async def answer(req):
            return await self._answer_evict(req, seqs)

        return await planner.run_async(planner.evict(excess, self._cfg.remover.deterministic, self.rng), answer)

    async def _answer_evict(self, req, seqs: dict):
        workers = self._workers()
        if isinstance(req, planner.Summaries):
            res = await self._on_workers({a: ("summaries", dict(name=self.name, kinds=req.kinds)) for a in workers})
            return {k: {s: v for r in res.values() for s, v in r[k].items()} for k in req.kinds}
        if isinstance(req, planner.Candidates):
            res = await self._on_workers(
                {a: ("candidates", dict(name=self.name, n=req.n, role=req.role)) for a in workers}
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
                by[self.placement[s]][s] = sl
            msgs = {
                a: {
                    "slots": v,
                    "seqs": {s: np.array([seqs[s][x] for x in sl.tolist()], np.int64) for s, sl in v.items()},
                }
                for a, v in by.items()
            }
        else:
            for s, k in req.counts.items():
                by[self.placement[s]][s] = k
            msgs = {a: {"counts": v} for a, v in by.items()}
        res, errors = await self._on_workers(
            {a: ("remove", {"name": self.name, **m, "seed": int(self.rng.integers(2**63))}) for a, m in msgs.items()},
            partial=True,
        )
        per = {s: k for r in res.values() for s, k in r.items() if k}
        if per:  # what the workers that answered removed, even when another was lost: the sizes stay agreed
            await self._coord("removed", k=sum(per.values()), per_shard=per)
        if errors:
            raise errors[0]
        return sum(per.values())
