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
priority updates and deletes.
"""

from __future__ import annotations

import itertools
import logging
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
from numpy.typing import ArrayLike

from ..errors import ShardLostError, ShardMovedError, SpecError
from ..storage.staging import stage_chunks, staged_bytes, staging_area
from ..table.results import InsertResult
from ..table.routing import route
from ..table.validate import as_episode_list, check_batch, check_episode, check_priorities, to_host
from .transactions import abort_insert, admit_insert, insert_error, run_insert
from .wire import array_bytes

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from ..spec import TableSpec
    from ..writer import EpisodeWriter

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


class _Insert(NamedTuple):
    """An insert validated and routed (:func:`prepare_insert`), not yet admitted."""

    chunks: list[dict]
    lengths: np.ndarray
    n_items: int
    item_off: np.ndarray
    priorities: np.ndarray | None
    dest: np.ndarray  # shard of each episode
    per_shard: dict[int, int]  # items per shard
    shard: int | None = None  # the shard the caller put every episode on


def _result(ins: _Insert, ids: np.ndarray, sel_of: dict, applied: dict) -> InsertResult:
    first_keys = np.empty(len(ins.lengths), dtype=np.int64)
    for res in applied.values():
        for s, fk in res["first_keys"].items():
            first_keys[sel_of[int(s)]] = fk
    return InsertResult(ids, first_keys, ins.dest, ins.n_items)


class WritesMixin:
    """Inserts of :class:`~gear_flow.distributed.DistributedTable` (staged, applied and committed by
    :mod:`~gear_flow.distributed.transactions`)."""

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
        remover evicts the excess (not a queue's or stack's: its items over
        ``max_size`` are those of a sample that gave its admission back, still
        waiting); an eviction that fails for another reason
        than a lost worker (one that does not answer in time) is logged and
        the insert returns, stored, the table over ``max_size`` until the next
        insert's eviction.

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
            while the insert was applied (its episodes there are gone), or
            (not ``degraded``) while it evicted to ``max_size`` after its
            commit: the insert is stored, the message says so and
            ``.stored`` is True.  A worker lost before anything was applied
            leaves nothing stored (``.stored`` False); a degraded table then
            routes the insert again over the shards left, and one whose
            eviction loses a worker marks the shard lost and returns.
        GearFlowError
            Staging failed on a worker; nothing of the insert was stored.
        """
        ins = self._prepare(episodes, priorities, shard)
        timeout = self.timeout if timeout is None else timeout
        for attempt in itertools.count():  # _rerouted and _moved_insert bound it
            try:
                return self._insert_once(ins, timeout)
            except ShardLostError as e:
                ins = self._rerouted(ins, e, attempt)
            except ShardMovedError as e:
                self._ctx.sync(self._link.moved, e.epoch)
                ins = self._moved_insert(ins, e, attempt)

    def _insert_once(self, ins: _Insert, timeout: float | None) -> InsertResult:
        if self._inserts_here(ins):  # the caller's thread writes (an actor into its own worker's shards) ...
            return self._insert_here(ins, timeout)
        lanes = self._insert_lanes(ins)
        if lanes is not None:  # ... or sends them over the workers' lanes (see thread_insert)
            return self._insert_over_lanes(ins, timeout, lanes)
        return self._ctx.sync(self._insert_prepared, ins, timeout)

    def _rerouted(self, ins: _Insert, e: ShardLostError, attempt: int) -> _Insert:
        """``ins`` routed again after a worker lost before any of it was stored (its admission given back):
        over the shards left (degraded), or as placed now (the shard moved meanwhile); else ``e`` raised."""
        if e.stored is not False or attempt >= self.spec.num_shards or (not self.degraded and e.shard in self.lost):
            raise e
        self._view.check_not_lost(stored=False)  # (the shard moved, but another one may be lost meanwhile)
        logger.info("table %r: insert routed again (%s)", self.name, e)
        return self._routed(ins)

    def _moved_insert(self, ins: _Insert, e: ShardMovedError, attempt: int) -> _Insert:
        """``ins`` routed again after a worker refused it, planned before shards moved there or away (nothing
        of it was stored, its admission given back; the handle knows the new placement): sent where the
        shards are now, its episodes on the same shards (``e`` raised after :data:`MOVED_ATTEMPTS`)."""
        if attempt >= MOVED_ATTEMPTS:
            raise e
        logger.info("table %r: insert sent again where its shards are now (%s)", self.name, e)
        return ins

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
            raise ShardLostError(-1, f"table {self.name!r} has no shard left", stored=False)
        if shard is not None and shard not in alive:
            if shard in self.lost:
                raise ShardLostError(shard, f"shard {shard} of table {self.name!r} is lost", stored=False)
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
        ins = self._prepare(episodes, priorities, shard)
        timeout = self.timeout if timeout is None else timeout
        for attempt in itertools.count():  # _rerouted and _moved_insert bound it
            try:
                return await self._insert_prepared(ins, timeout)
            except ShardLostError as e:
                ins = self._rerouted(ins, e, attempt)
            except ShardMovedError as e:
                await self._link.moved(e.epoch)
                ins = self._moved_insert(ins, e, attempt)

    def _prepare(self, episodes, priorities, shard) -> _Insert:
        """Validate and route an insert (nothing sent yet)."""
        self._masses.clear()  # this handle's own writes show in its next sample's plan
        self._view.check_not_lost(stored=False)
        chunks, lengths, n_items, item_off, pr = prepare_insert(self.spec, episodes, priorities)
        if pr is not None:
            self._cfg.check_priorities(pr)
        ins = self._routed(_Insert(chunks, lengths, n_items, item_off, pr, None, {}, shard))
        self._rr += len(lengths)
        self._cfg.rate_limiter.check_insert_size(n_items)
        return ins

    def _routed(self, ins: _Insert) -> _Insert:
        """``ins`` with each episode's shard chosen among the shards this handle knows alive."""
        dest = self._route(ins.lengths, ins.shard)
        items_of = ins.item_off[1:] - ins.item_off[:-1]
        return ins._replace(dest=dest, per_shard={int(s): int(items_of[dest == s].sum()) for s in np.unique(dest)})

    async def _insert_prepared(self, ins: _Insert, timeout: float | None) -> InsertResult:
        adm = await admit_insert(self, ins.n_items, len(ins.lengths), ins.per_shard, timeout)
        return await self._insert_admitted(ins, adm, timeout)

    async def _insert_admitted(self, ins: _Insert, adm: dict, timeout: float | None) -> InsertResult:
        """Hand an admitted insert's episodes to its workers (in-process, through staging segments, or over
        the comm), apply, commit, evict to ``max_size``."""
        try:
            await self._link.refresh(adm["version"])
        except BaseException as e:  # admitted, and nothing sent: the admission is given back
            try:
                await abort_insert(self, adm["txn"], [], e)
            except Exception as u:  # noqa: BLE001 - the refresh's error is the caller's
                logger.info("table %r: an insert's admission not given back (%s)", self.name, u)
            raise
        if any(s in self.lost for s in ins.per_shard):
            # routed to a shard the coordinator knew lost and this handle learns it only now: the admission is
            # given back, and the insert routed again over the shards left (or refused, not degraded)
            await abort_insert(self, adm["txn"], [], None)
            self._view.check_not_lost(stored=False)
            ins = self._routed(ins)
            adm = await admit_insert(self, ins.n_items, len(ins.lengths), ins.per_shard, timeout)
            await self._link.refresh(adm["version"])
        parts, sel_of, ids = self._parts(ins, adm)
        local = self._ctx.local_addr if self._ctx.local_plugin is not None else None  # its parts go in-process
        segs = []
        try:
            for a, ps in parts.items():
                n = array_bytes([p["chunks"] for p in ps])
                if a != local and await self._link.route(a) is not None:
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
            await abort_insert(self, adm["txn"], [], e)
            raise insert_error(self, e, sorted(parts)) from None
        try:
            applied, size = await run_insert(self, adm["txn"], dict(parts))
        except BaseException:  # a worker may still read them (a request given up on): never reused
            for seg in segs:
                staging_area().discard(seg)
            raise
        for seg in segs:  # applied everywhere: the segments may be reused
            staging_area().release(seg)
        if self._cfg.evicts_to_max_size(size):
            await self._evict_excess(size)
        return _result(ins, ids, sel_of, applied)

    def _parts(self, ins: _Insert, adm: dict) -> tuple[dict[str, list[dict]], dict[int, np.ndarray], np.ndarray]:
        """``({worker: [part, ...]}, {shard: episodes it gets}, episode ids)`` of an admitted insert."""
        ids = adm["first_episode_id"] + np.arange(len(ins.lengths), dtype=np.int64)
        stamps = adm["first_stamp"] + ins.item_off[:-1]
        parts = defaultdict(list)
        sel_of = {}
        for s in np.unique(ins.dest):
            sel = np.flatnonzero(ins.dest == s)
            sel_of[int(s)] = sel
            pr = ins.priorities
            p = None if pr is None else np.concatenate([pr[ins.item_off[i] : ins.item_off[i + 1]] for i in sel])
            parts[self.placement[int(s)]].append(
                {
                    "shard": int(s),
                    "chunks": [ins.chunks[i] for i in sel],
                    "lengths": ins.lengths[sel],
                    "episode_ids": ids[sel],
                    "stamps": stamps[sel],
                    "priorities": p,
                }
            )
        return dict(parts), sel_of, ids

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
