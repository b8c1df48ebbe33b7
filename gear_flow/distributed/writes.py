"""Writes of a distributed table: transactional inserts, eviction, priority updates, deletes.

An insert is all or nothing across workers: admission at the coordinator
(ids, stamps, a transaction id; waiters served in arrival order), then the
episodes are *staged* on every shard worker (validated, nothing visible), then
*applied*, then *committed* at the coordinator.  If staging fails anywhere,
every worker forgets the staged part and the coordinator gives back the
admission: nothing of the insert is sampleable anywhere and the limiter's
counts are as before.  An insert that touches one worker stages and applies in
one request.  Eviction to ``max_size`` runs the planner's eviction plan, the
same rule as the local table's.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import ArrayLike

from ..errors import GearFlowError, ShardLostError, SpecError
from ..keys import decode
from ..storage.staging import stage_chunks, staged_bytes, staging_area
from ..table import planner
from ..table.results import InsertResult, UpdateResult
from ..table.routing import route
from ..table.validate import as_episode_list, check_batch, check_episode, check_keys, check_priorities, to_host
from .pending import PENDING_MAX
from .transport import Retry, WorkerLost, call

if TYPE_CHECKING:
    from ..spec import TableSpec
    from ..writer import EpisodeWriter

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
    eps = as_episode_list(episodes)
    checked = [check_episode(spec, e, i) for i, e in enumerate(eps)]
    lengths = np.array([t for _, t in checked], dtype=np.int64)
    step_items = spec.item_unit == "step"
    n_items = int(lengths.sum()) if step_items else len(lengths)
    if isinstance(priorities, (list, tuple)) and priorities and np.ndim(priorities[0]) >= 1:
        priorities = np.concatenate([np.asarray(p, dtype=np.float64).reshape(-1) for p in priorities])
    pr = check_priorities(priorities, n_items)
    item_off = np.concatenate(([0], np.cumsum(lengths if step_items else np.ones_like(lengths))))
    return [c for c, _ in checked], lengths, n_items, item_off, pr


class WritesMixin:
    """Inserts, eviction, updates and deletes of :class:`~gear_flow.distributed.DistributedTable`."""

    @property
    def _heap_ties(self) -> bool:
        from ..selectors import MaxHeap, MinHeap

        return any(isinstance(x, (MaxHeap, MinHeap)) for x in (self._cfg.sampler, self._cfg.remover))

    # -- inserts ------------------------------------------------------------------------------------
    def insert(
        self,
        episodes: Mapping | Sequence[Mapping],
        priorities: Priorities = None,
        *,
        timeout: float | None = None,
        shard: int | None = None,
    ) -> InsertResult:
        """Insert whole episodes, all or nothing across workers.

        Input is validated before anything is sent.  Episodes are routed to
        shards (never split), preferring the calling worker's own shards when
        called from a task on a worker (writer affinity), and travel as raw
        frames straight to the shard workers.  Blocks until the rate limiter
        admits every item.  When the table then exceeds ``max_size``, the
        remover evicts the excess.

        Parameters
        ----------
        episodes : mapping or sequence of mappings
            Each maps every column to an array ``[T, *shape]`` (T >= 1).
        priorities : None, float, array or list of arrays
            Per item: None (the shard's running max priority, as in PER), one
            value for all, a flat array over all items of all episodes, or one
            array per episode.
        timeout : float, optional
            Seconds to wait for the rate limiter; default the handle's.
        shard : int, optional
            Put every episode on this shard.

        Returns
        -------
        InsertResult
            Episode ids, the key of each episode's first item, each episode's
            shard and the number of items created.

        Raises
        ------
        InvalidDataError
            Episodes that do not match the spec, or not one priority per
            item.
        InvalidPriorityError
            A priority that is NaN, infinite or negative, or one the sampler
            or remover cannot represent.
        CapacityError
            An episode longer than a shard's capacity.
        SpecError
            ``shard`` out of range, or more items than the limiter admits at once.
        RateLimitTimeout
            Not admitted within ``timeout``.
        ShardLostError
            A shard's worker is lost (not ``degraded``), or a worker was lost
            while the insert was applied (its episodes there are gone).
        GearFlowError
            Staging failed on a worker; nothing of the insert was stored.
        """
        return self._ctx.sync(self.insert_async, episodes, priorities, timeout=timeout, shard=shard)

    def insert_batch(
        self,
        columns: Mapping[str, ArrayLike],
        priorities: ArrayLike | float | None = None,
        *,
        timeout: float | None = None,
        shard: int | None = None,
    ) -> InsertResult:
        """Insert ``B`` trajectories of ``T`` steps given as ``[B, T, *shape]`` arrays, all or nothing.

        Validated whole first; each row then travels as one episode, from
        host memory (device arrays are copied to the host), as :meth:`insert`.

        Parameters
        ----------
        columns : mapping of str to array
            Every column, ``[B, T, *shape]`` (NumPy or CuPy), ``B, T >= 1``.
        priorities : None, float or array
            None, one value, or one per item (``B * T`` for step items, ``B``
            for episode items), in row order.
        timeout : float, optional
            Seconds to wait for the rate limiter; default the handle's.
        shard : int, optional
            Put every trajectory on this shard.

        Returns
        -------
        InsertResult
            As :meth:`insert`, one episode per row.

        Raises
        ------
        InvalidDataError, InvalidPriorityError, CapacityError, SpecError, RateLimitTimeout, ShardLostError
            As :meth:`insert`.
        """
        arrays, B, _ = check_batch(self.spec, columns)
        host = {c: to_host(a) for c, a in arrays.items()}  # one copy per column: they cross the comm from host memory
        rows = [{c: a[b] for c, a in host.items()} for b in range(B)]
        return self.insert(rows, priorities, timeout=timeout, shard=shard)

    def _route(self, lengths, shard):
        alive = [s for s in sorted(self.placement) if s not in self.lost]
        if not alive:
            raise ShardLostError(-1, f"table {self.name!r} has no shard left")
        if shard is not None and shard not in alive:
            if shard in self.lost:
                raise ShardLostError(shard, f"shard {shard} of table {self.name!r} is lost")
            raise SpecError(f"shard {shard} must be in [0, {self.spec.num_shards})")
        local = [s for s in self.local_shards if s not in self.lost]
        pool = local if shard is None and local else alive
        idx = route(
            lengths, len(pool), self.spec.capacity, self.routing, self._rr, None if shard is None else pool.index(shard)
        )
        return np.array(pool, dtype=np.int64)[idx]

    async def insert_async(
        self,
        episodes: Mapping | Sequence[Mapping],
        priorities: Priorities = None,
        *,
        timeout: float | None = None,
        shard: int | None = None,
    ) -> InsertResult:
        """:meth:`insert` for a caller inside the event loop.

        Parameters
        ----------
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
        self._masses.clear()  # this handle's own writes show in its next sample's plan
        self._check_not_lost()
        chunks, lengths, n_items, item_off, pr = prepare_insert(self.spec, episodes, priorities)
        if pr is not None:
            self._cfg.check_priorities(pr)
        dest = self._route(lengths, shard)
        self._rr += len(lengths)
        self._cfg.rate_limiter.check_insert_size(n_items)
        items_of = item_off[1:] - item_off[:-1]
        per_shard = {int(s): int(items_of[dest == s].sum()) for s in np.unique(dest)}
        adm = await self._coord(
            "admit_insert",
            n=n_items,
            episodes=len(lengths),
            per_shard=per_shard,
            timeout=self.timeout if timeout is None else timeout,
            owner=self._ctx.owner,
        )
        await self._refresh(adm["version"])
        ids = adm["first_episode_id"] + np.arange(len(lengths), dtype=np.int64)
        stamps = adm["first_stamp"] + item_off[:-1]
        parts = defaultdict(list)
        sel_of = {}
        for s in np.unique(dest):
            sel = np.flatnonzero(dest == s)
            sel_of[int(s)] = sel
            p = None if pr is None else np.concatenate([pr[item_off[i] : item_off[i + 1]] for i in sel])
            parts[self.placement[int(s)]].append(
                {
                    "shard": int(s),
                    "chunks": [chunks[i] for i in sel],
                    "lengths": lengths[sel],
                    "episode_ids": ids[sel],
                    "stamps": stamps[sel],
                    "priorities": p,
                }
            )
        local = self._ctx.local_addr if self._ctx.local_plugin is not None else None  # its parts go in-process
        segs = []
        try:
            for a, ps in parts.items():
                n = sum(v.nbytes for p in ps for c in p["chunks"] for v in c.values())
                if a != local and await self._shared_for(a) is not None:
                    # a worker on this machine: the episodes go through a staging segment, not the socket
                    seg = staging_area().acquire(staged_bytes(ps))
                    segs.append(seg)
                    stage_chunks(seg, ps)
                    self.stats["insert_shared_bytes"] += n
                else:
                    self.stats["insert_local_bytes" if a == local else "insert_remote_bytes"] += n
        except BaseException as e:  # nothing sent yet: give the admission back
            for seg in segs:
                staging_area().discard(seg)
            await self._abort_insert(adm["txn"], [], e)
            raise self._insert_error(e, sorted(parts)) from None
        try:
            applied, size = await self.run_insert(adm["txn"], dict(parts))
        except BaseException:  # a worker may still read them (a request given up on): never reused
            for seg in segs:
                staging_area().discard(seg)
            raise
        for seg in segs:  # applied everywhere: the segments may be reused
            staging_area().release(seg)
        first_keys = np.empty(len(lengths), dtype=np.int64)
        for res in applied.values():
            for s, fk in res["first_keys"].items():
                first_keys[sel_of[int(s)]] = fk
        if size > self.spec.max_size:
            await self._evict_excess(size)
        return InsertResult(ids, first_keys, dest, n_items)

    async def run_insert(self, txn: str, parts: dict[str, list[dict]]) -> tuple[dict, int]:
        """Stage ``parts`` of admitted insert ``txn`` everywhere, apply, commit.

        All or nothing: a failure before every worker has staged aborts the
        insert everywhere (and at the coordinator) and raises.

        Parameters
        ----------
        txn : str
            Transaction id the coordinator gave the insert at admission.
        parts : dict of str to list of dict
            ``{worker address: [part, ...]}``; a part has ``shard``,
            ``chunks``, ``lengths``, ``episode_ids``, ``stamps`` and
            ``priorities`` (None or float64 per item).

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
                        self._ctx, addrs[0], "write", table=self.name, name=self.name, txn=txn, parts=parts[addrs[0]]
                    )
                }
            except BaseException as e:
                await self._abort_insert(txn, addrs, e)
                raise self._insert_error(e, addrs) from None
        else:
            staged = await asyncio.gather(
                *(call(self._ctx, a, "stage", table=self.name, name=self.name, txn=txn, parts=parts[a]) for a in addrs),
                return_exceptions=True,
            )
            bad = [e for e in staged if isinstance(e, BaseException)]
            if bad:
                await self._abort_insert(txn, addrs, bad[0])
                raise self._insert_error(bad[0], addrs) from None
            return await self.apply_staged(txn, addrs)
        return res, await self._commit(txn, res)

    async def apply_staged(self, txn: str, addrs: Iterable[str]) -> tuple[dict, int]:
        """Every part of ``txn`` is staged on ``addrs``: the insert is decided; apply it everywhere, commit.

        Parameters
        ----------
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
            rest of the insert was stored and committed.
        """
        addrs = sorted(addrs)
        got = await asyncio.gather(
            *(call(self._ctx, a, "apply", table=self.name, name=self.name, txn=txn) for a in addrs),
            return_exceptions=True,
        )
        res = {a: r for a, r in zip(addrs, got) if not isinstance(r, BaseException)}
        lost = [a for a, r in zip(addrs, got) if isinstance(r, BaseException)]
        size = await self._commit(txn, res)
        if lost:
            try:
                await self._handle_lost(lost)
            except Retry:
                pass
            raise ShardLostError(
                -1,
                f"worker(s) {lost} were lost while insert {txn[:8]} was applied; its episodes there are gone, "
                "the rest of the insert was stored",
            )
        return res, size

    async def abort_staged(self, txn: str, addrs: Iterable[str], cause: BaseException | None = None) -> None:
        """Forget ``txn`` on ``addrs`` and give back its admission (nothing of it is stored anywhere).

        Parameters
        ----------
        txn : str
            Transaction id of the admitted insert.
        addrs : iterable of str
            Addresses of the workers that may hold a staged part.
        cause : BaseException, optional
            Why the insert is aborted; a lost worker (``WorkerLost``) gets its
            shards marked lost.
        """
        await self._abort_insert(txn, sorted(addrs), cause)

    async def _commit(self, txn, res: dict) -> int:
        items, evicted = defaultdict(int), defaultdict(int)
        for r in res.values():
            for s, k in r["items"].items():
                items[int(s)] += int(k)
            for s, k in r["evicted"].items():
                evicted[int(s)] += int(k)
        return await self._coord("commit_insert", txn=txn, items=dict(items), evicted=dict(evicted))

    async def _abort_insert(self, txn, addrs, cause) -> None:
        await asyncio.gather(
            *(call(self._ctx, a, "abort", table=self.name, name=self.name, txn=txn) for a in addrs),
            return_exceptions=True,
        )
        await self._coord("abort_insert", txn=txn)
        lost = [a for a in addrs if isinstance(cause, WorkerLost) and cause.addr == a]
        if lost:
            try:
                await self._handle_lost(lost)
            except (Retry, ShardLostError):
                pass

    def _insert_error(self, e, addrs):
        if isinstance(e, WorkerLost):
            return ShardLostError(
                -1, f"worker {e.addr} could not be reached during an insert; nothing of the insert was stored"
            )
        if isinstance(e, GearFlowError):
            return e
        return GearFlowError(f"insert failed on {addrs} ({type(e).__name__}: {e}); nothing of the insert was stored")

    async def _evict_excess(self, size: int) -> None:
        """Back to ``max_size``.  Tables whose samples expire items evict under the table's hold,
        after any sample in progress has expired what it hands out."""
        if not self._cfg.exclusive:
            await self._evict(size - self.spec.max_size)
            return
        hold = await self._coord("admit_hold", owner=self._ctx.owner, timeout=self.timeout)
        try:
            if hold["size"] > self.spec.max_size:
                await self._evict(hold["size"] - self.spec.max_size)
        finally:
            await self._coord("sample_finished", txn=hold["txn"])

    async def _evict(self, excess: int) -> int:
        """Remove ``excess`` items as the remover says (the planner's eviction plan)."""
        removed = await planner.run_async(
            planner.evict(excess, self._cfg.remover.deterministic, self.rng), self._answer_evict
        )
        return removed

    async def _answer_evict(self, req):
        workers = self._workers()
        if isinstance(req, planner.Summaries):
            res = await self._on_workers({a: ("summaries", dict(name=self.name, kinds=req.kinds)) for a in workers})
            return {k: {s: v for r in res.values() for s, v in r[k].items()} for k in req.kinds}
        if isinstance(req, planner.Candidates):
            res = await self._on_workers(
                {a: ("candidates", dict(name=self.name, n=req.n, role=req.role)) for a in workers}
            )
            return {s: c for r in res.values() for s, c in r.items()}
        assert isinstance(req, planner.Evict)
        part = req.slots if req.slots is not None else req.counts
        by = defaultdict(dict)
        for s, v in part.items():
            by[self.placement[s]][s] = v
        key = "slots" if req.slots is not None else "counts"
        res = await self._on_workers(
            {a: ("remove", {"name": self.name, key: v, "seed": int(self.rng.integers(2**63))}) for a, v in by.items()}
        )
        per = {s: k for r in res.values() for s, k in r.items() if k}
        if per:
            await self._coord("removed", k=sum(per.values()), per_shard=per)
        return sum(per.values())

    def writer(
        self, max_episode_length: int | None = None, shard: int | None = None, timeout: float | None = None
    ) -> EpisodeWriter:
        """A streaming writer (``append``/``end_episode``) inserting into this table.

        Parameters
        ----------
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

        return EpisodeWriter(self, max_episode_length=max_episode_length, shard=shard, timeout=timeout)

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
        k, by, idx, on_lost = self._group(keys)
        pr = check_priorities(priorities, len(k), "keys")
        if pr is None:
            raise SpecError("priorities must not be None")
        self._cfg.check_priorities(pr)
        held = {i for s in by.values() for i in s}
        await self._hold_pending(held)  # keep this handle's updates in call order
        try:
            return await self._update_now(k, by, idx, pr, on_lost)
        finally:
            self._pending.release(held)

    async def _update_now(self, k, by, idx, pr, on_lost) -> UpdateResult:
        """Send an update to the workers of its shards (held from ride-alongs by the caller)."""
        if len(by) > 1 and not self._issued.covers(k):
            # unknown keys anywhere must stop the whole call before any worker applies it (skipped when
            # every key is one this handle has seen issued: then no worker can find it unknown)
            await self._on_workers({a: ("check_keys", dict(name=self.name, seqs_by_shard=s)) for a, s in by.items()})
        stamps = None
        if self._heap_ties and len(k):  # heap ties across shards follow the table-wide insert/update clock
            stamps = (await self._coord("stamps", n=len(k))) + np.arange(len(k), dtype=np.int64)
        plans = self._masses.plans()
        calls = {
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
        try:
            res = await self._on_workers(calls)
        except BaseException:
            self._masses.clear()
            raise
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
        k, by, idx, on_lost = self._group(keys)
        if len(by) > 1:
            await self._on_workers({a: ("check_keys", dict(name=self.name, seqs_by_shard=s)) for a, s in by.items()})
        res = await self._on_workers({a: ("delete", dict(name=self.name, seqs_by_shard=s)) for a, s in by.items()})
        per = {s: k for r in res.values() for s, k in r[0].items() if k}
        d = sum(per.values())
        st = sum(r[1] for r in res.values()) + on_lost
        if d:
            await self._coord("removed", k=d, per_shard=per)
        return UpdateResult(d, st)
