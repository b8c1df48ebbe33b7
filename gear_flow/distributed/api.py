"""The handle on a table whose shards live on Dask workers.

The client-side handle talks to the scheduler's coordinator for admission
(global rate limiter, ids, stamps, insert transactions) and directly to the
shard workers for data.  What each operation does lives in its own module:
:mod:`~gear_flow.distributed.construction` (creating a table, attaching to
one; functions handed the handle's class), :mod:`~gear_flow.distributed.writes` and
:mod:`~gear_flow.distributed.transactions` (transactional inserts),
:mod:`~gear_flow.distributed.edits` (updates, deletes, eviction; functions
handed the handle, as are :mod:`~gear_flow.distributed.pending`'s, the
ride-along updates'),
:mod:`~gear_flow.distributed.sampling` (a sample on the event loop: its
grant, the planner's requests answered by the workers) and
:mod:`~gear_flow.distributed.thread_sample` (the same in the caller's
thread), :mod:`~gear_flow.distributed.checkpoints`
and :mod:`~gear_flow.distributed.info` (what the table reports about itself:
size, counters, bytes; both functions handed the handle, which its methods
of the same names call), :mod:`~gear_flow.distributed.view` (the placement, under one lock, its
changes told to the parts that keep state per placement) and
:mod:`~gear_flow.distributed.transport` (the handle's
:class:`~gear_flow.distributed.transport.TableLink`: its requests, what a lost
or moved worker means; its :class:`~gear_flow.distributed.transport.WorkerRoutes`).

Inside a task on a worker (a co-located learner, GEAR's idea) the handle from
:meth:`DistributedTable.attach` reads the worker's own shards in-process and
gathers them straight into the learner's buffers, with no copy; only remote
shards' windows cross the network.
"""

from __future__ import annotations

import asyncio
import logging
import os
import weakref
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike

from ..config import get as config_get
from ..errors import GearFlowError, SpecError
from ..sample import SampleBatch, SampleBuffers
from ..table.config import TableConfig, check_timeout
from ..table.datasets import DatasetMethods
from ..table.results import InsertResult, UpdateResult
from ..table.routing import check_shard
from ..table.validate import seeded_rng
from . import (
    checkpoints,
    construction,
    edits,
    pending,
    reader_draw,
    sampling,
    thread_insert,
    thread_sample,
    transactions,
    writes,
)
from . import info as reports  # aliased: the handle's own ``info`` method hides the name in the class body
from .construction import workers_with_resource
from .facade import documented_as
from .leases import Lease, report_dropped
from .pending import PendingUpdates
from .transport import Context, Retry, TableLink, WorkerRoutes, call
from .view import TableView

if TYPE_CHECKING:
    from distributed import Client

    from ..rate_limiters import RateLimiter
    from ..selectors import Selector
    from ..spec import TableSpec
    from ..writer import EpisodeWriter

#: ``workers_with_resource`` lived here before construction moved to its own module: still importable from here
__all__ = ["DistributedTable", "workers_with_resource"]

logger = logging.getLogger(__name__)


class DistributedTable(DatasetMethods):
    """Replay table sharded over Dask workers.

    Create with :meth:`create` (from a client) or get a handle with
    :meth:`attach` (from another client, or inside a task on a worker).
    The API mirrors :class:`~gear_flow.LocalTable`: ``insert``,
    ``insert_batch``, ``writer``, ``sample``, ``update_priorities``,
    ``delete``, ``info``, ``checkpoint``/``restore``, ``close``.  A handle
    pickles by name and creation: sent to a task, it attaches there to the
    same table (on its first use, where it was unpickled before the task
    ran), and refuses a table made since under that name.
    Each blocking method has an ``*_async`` twin for use inside a running
    event loop.

    The constructor is internal: it wraps a table the coordinator already
    knows.  Use :meth:`create`, :meth:`attach`, :meth:`queue`, :meth:`stack`
    or :meth:`restore`.

    Parameters
    ----------
    ctx : Context
        How this handle reaches the scheduler and workers (a client, or the
        worker running the current task).
    name : str
        The table's name, unique on the cluster.
    state : dict
        The coordinator's ``lookup`` answer: ``config`` (a
        :meth:`TableConfig.to_dict`), ``placement`` (``{shard: worker
        address}``), and optionally ``lost`` and ``version``.
    seed : int, optional
        Seeds this handle's random generator (shard draws of ``sample``);
        None: fresh entropy.
    timeout : float, optional
        Default seconds a blocking call of this handle waits; None: the
        table's configured ``timeout`` (None there: until admitted, for at
        most config ``distributed.admission-timeout``, an hour by default).

    Attributes
    ----------
    name : str
        The table's name on the cluster.
    spec : TableSpec
        Columns, per-shard capacity, number of shards, item unit, max_size.
    placement : dict of int to str
        Worker address of each shard, as this handle last saw it.
    lost : dict of int to dict
        Shards whose worker was lost, with the coordinator's record of the
        loss (``size_at_loss``, ``inserted_at_loss``, ``detail``); empty while
        the table is whole.
    boundary : {"strict", "pad_tail", "pad_head"}
        Default window boundary mode of :meth:`sample`.
    routing : {"balanced", "round_robin"}
        How inserted episodes are spread over shards.
    degraded : bool
        Whether the table keeps serving from the remaining shards after a
        shard's worker is lost.
    timeout : float or None
        Default seconds a blocking call waits (None: until admitted, for at
        most config ``distributed.admission-timeout``).
    rng : numpy.random.Generator
        This handle's random generator.
    stats : dict of str to int
        Bytes of sampled windows this handle gathered in-process
        (``local_bytes``), from shared memory (``shared_bytes``) or over the
        comm (``remote_bytes``), the number of ``batches``, of those served
        in the caller's thread without the event loop (``in_thread``: every
        shard this worker's own or on this machine, see
        :mod:`~gear_flow.distributed.thread_sample`), and
        ``shared_conflicts`` (shared-memory reads retried over the comm
        because a writer overwrote the window meanwhile); bytes of inserted
        episodes handed to this process's own worker in-process
        (``insert_local_bytes``), through a staging segment to a worker on
        this machine (``insert_shared_bytes``) or sent over the comm
        (``insert_remote_bytes``); ``deferred_stale``: keys of ride-along
        priority updates found gone when applied; ``reader_draws``: rows this
        handle drew itself from its host's published selection state (no
        owner request, :mod:`~gear_flow.distributed.reader_draw`),
        ``reader_redraws`` the draws made again because the owner wrote
        meanwhile, ``reader_fallbacks`` the shard parts left to their owner.
    requests : dict of str to int
        Requests this handle sent to shard workers, by operation name.
    reader_draw : bool
        Whether this handle draws batches itself from the selection state
        that shard owners on its host publish (config
        ``distributed.reader-draw`` when it was made;
        :mod:`~gear_flow.distributed.reader_draw`); settable.

    Examples
    --------
    >>> import numpy as np
    >>> import gear_flow as gf
    >>> from distributed import Client, LocalCluster                          # doctest: +SKIP
    >>> client = Client(LocalCluster(n_workers=2))                              # doctest: +SKIP
    >>> spec = gf.TableSpec((gf.ColumnSpec("obs", (3,), np.float32),), capacity=10_000, num_shards=2)
    >>> table = gf.DistributedTable.create(client, spec, sampler=gf.Prioritized(), name="replay")  # doctest: +SKIP
    >>> _ = table.insert({"obs": np.zeros((100, 3), np.float32)})             # doctest: +SKIP
    >>> batch = table.sample(batch_size=32, length=8)                         # doctest: +SKIP
    >>> tuple(batch["obs"].shape), tuple(batch.mask.shape)                    # doctest: +SKIP
    ((32, 8, 3), (32, 8))
    >>> _ = table.update_priorities(batch.keys, np.ones(32))                  # doctest: +SKIP
    >>> same = gf.DistributedTable.attach("replay", client=client)            # doctest: +SKIP
    >>> table.close()                                                         # doctest: +SKIP
    """

    def __init__(
        self, ctx: Context, name: str, state: dict, seed: int | None = None, timeout: float | None = None
    ) -> None:
        self._ctx = ctx
        self.name = name
        self._config = state["config"]
        #: the creation of the table this handle is on (a name dropped and used again names another)
        self._created = state.get("created")
        self._cfg = TableConfig.from_dict(self._config)
        self.spec = self._cfg.spec
        self.boundary = self._cfg.boundary
        self.routing = self._cfg.routing
        self.degraded = bool(self._config.get("degraded", False))
        self.timeout = self._cfg.timeout if timeout is None else check_timeout(timeout)
        self.rng = seeded_rng(seed)
        self._rr = 0
        #: where each shard is, which are lost, at which version: read by callers' threads, changed by the loop
        self._view = TableView(name, state, self.degraded)
        ctx.epoch = self._view.version  # every request to a worker says which placement it was planned at
        #: how each worker is reached beside the comm (rings mapped here, its lane), learnt on first use
        self._routes = WorkerRoutes()
        #: requests this handle sent to shard workers, by operation (the control plane's cost)
        self.requests: dict[str, int] = defaultdict(int)
        self._link = TableLink(ctx, name, self._view, self._routes, self._config, self.requests)
        #: the admission lease; its unreported samples outlive the handle, reported if it is dropped first
        self._lease = Lease()
        #: this handle closed the table and dropped it: closing again does nothing (as a file's close)
        self._dropped = False
        weakref.finalize(self, report_dropped, ctx, name, self._lease.unreported).atexit = False
        #: bytes of windows gathered in-process (co-located), from shared memory, or received over the comm;
        #: bytes of inserted episodes written in-process, sent over the comm, or handed over in shared memory;
        #: samples, inserts and waiting priority updates served in the caller's thread
        self.stats = {
            "local_bytes": 0,
            "shared_bytes": 0,
            "remote_bytes": 0,
            "batches": 0,
            "in_thread": 0,
            "shared_conflicts": 0,
            "insert_local_bytes": 0,
            "insert_remote_bytes": 0,
            "insert_shared_bytes": 0,
            "insert_in_thread": 0,
            "updates_in_thread": 0,
            "deferred_stale": 0,
            "reader_draws": 0,
            "reader_fallbacks": 0,
            "reader_redraws": 0,
        }
        from .masses import IssuedKeys, MassCache

        self._masses = MassCache()
        self._issued = IssuedKeys()
        #: priority updates riding on this handle's next sample (``update_priorities(wait=False)``)
        self._pending = PendingUpdates()
        #: samples this handle drew itself from published states, not yet counted by their owners
        self._drawn = reader_draw.DrawnCounts()
        #: whether this handle draws from its host's published selection states (config at construction)
        self.reader_draw = bool(config_get("distributed.reader-draw"))
        # what was kept for a placement goes with it (shards may have moved, been lost or restored); the
        # parts themselves subscribe, not the handle, which a subscription would keep alive
        self._view.subscribe(_forgets_placement(name, self._pending, self._routes, ctx, self._masses, self._issued))

    # -- construction: gear_flow.distributed.construction and checkpoints.restore, handed this class ------------
    @classmethod
    @documented_as(construction.create)
    def create(
        cls,
        client: Client,
        spec: TableSpec,
        *,
        name: str | None = None,
        sampler: Selector | None = None,
        remover: Selector | None = None,
        rate_limiter: RateLimiter | None = None,
        max_times_sampled: int = 0,
        boundary: str | None = None,
        tier: str | None = None,
        path: str | os.PathLike[str] | None = None,
        routing: str | None = None,
        timeout: float | None = None,
        seed: int | None = None,
        workers: Iterable[str] | None = None,
        degraded: bool = False,
        resources: str | None = None,
        rebalance_on_join: bool = False,
    ) -> DistributedTable:
        return construction.create(
            cls,
            client,
            spec,
            name=name,
            sampler=sampler,
            remover=remover,
            rate_limiter=rate_limiter,
            max_times_sampled=max_times_sampled,
            boundary=boundary,
            tier=tier,
            path=path,
            routing=routing,
            timeout=timeout,
            seed=seed,
            workers=workers,
            degraded=degraded,
            resources=resources,
            rebalance_on_join=rebalance_on_join,
        )

    @classmethod
    @documented_as(construction.queue)
    def queue(cls, client: Client, spec: TableSpec, size: int, **kw: Any) -> DistributedTable:
        return construction.queue(cls, client, spec, size, **kw)

    @classmethod
    @documented_as(construction.stack)
    def stack(cls, client: Client, spec: TableSpec, size: int, **kw: Any) -> DistributedTable:
        return construction.stack(cls, client, spec, size, **kw)

    @classmethod
    @documented_as(construction.attach)
    def attach(
        cls, name: str, client: Client | None = None, seed: int | None = None, timeout: float | None = None
    ) -> DistributedTable:
        return construction.attach(cls, name, client, seed, timeout)

    @classmethod
    @documented_as(checkpoints.restore)
    def restore(
        cls,
        client: Client,
        path: str | os.PathLike[str],
        *,
        name: str | None = None,
        workers: Iterable[str] | None = None,
        seed: int | None = None,
        timeout: float | None = None,
    ) -> DistributedTable:
        return checkpoints.restore(cls, client, path, name=name, workers=workers, seed=seed, timeout=timeout)

    # -- checkpoints: gear_flow.distributed.checkpoints ------------------------------------------------------------
    @documented_as(checkpoints.checkpoint)
    def checkpoint(self, path: str | os.PathLike[str]) -> dict:
        return checkpoints.checkpoint(self, path)

    @documented_as(checkpoints.checkpoint_async)
    async def checkpoint_async(self, path: str | os.PathLike[str]) -> dict:
        return await checkpoints.checkpoint_async(self, path)

    @documented_as(checkpoints.restore_shard)
    def restore_shard(
        self, shard: int, path: str | os.PathLike[str], worker: str | None = None, replace: bool = False
    ) -> dict:
        return checkpoints.restore_shard(self, shard, path, worker, replace)

    @documented_as(checkpoints.restore_shard_async)
    async def restore_shard_async(
        self, shard: int, path: str | os.PathLike[str], worker: str | None = None, replace: bool = False
    ) -> dict:
        return await checkpoints.restore_shard_async(self, shard, path, worker, replace)

    # -- what the table reports about itself: gear_flow.distributed.info -------------------------------------------
    @property
    def size(self) -> int:
        """Items in the table, as the coordinator counts them (committed inserts)."""
        return reports.size(self)

    def __len__(self) -> int:
        """Items in the table (:attr:`size`)."""
        return self.size

    @documented_as(reports.info)
    def info(self) -> dict:
        return reports.info(self)

    @documented_as(reports.info_async)
    async def info_async(self) -> dict:
        return await reports.info_async(self)

    @documented_as(reports.nbytes)
    def nbytes(self) -> dict:
        return reports.nbytes(self)

    @documented_as(reports.nbytes_async)
    async def nbytes_async(self) -> dict:
        return await reports.nbytes_async(self)

    # -- item edits: gear_flow.distributed.edits -------------------------------------------------------------------
    @documented_as(edits.update_priorities)
    def update_priorities(
        self, keys: ArrayLike, priorities: ArrayLike | float, *, wait: bool = True
    ) -> UpdateResult | None:
        return edits.update_priorities(self, keys, priorities, wait=wait)

    @documented_as(edits.update_priorities_async)
    async def update_priorities_async(
        self, keys: ArrayLike, priorities: ArrayLike | float, *, wait: bool = True
    ) -> UpdateResult | None:
        return await edits.update_priorities_async(self, keys, priorities, wait=wait)

    @documented_as(edits.delete)
    def delete(self, keys: ArrayLike) -> UpdateResult:
        return edits.delete(self, keys)

    @documented_as(edits.delete_async)
    async def delete_async(self, keys: ArrayLike) -> UpdateResult:
        return await edits.delete_async(self, keys)

    # -- sampling: gear_flow.distributed.thread_sample (the caller's thread) and sampling (the event loop) ------
    @documented_as(sampling.sample_async)
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
        fast = thread_sample.sample_here(self, batch_size, length, columns, boundary, timeout, out, rng)
        if fast is not None:
            return fast
        return self._ctx.sync_in_flight(  # (interrupted: its end says where a Queue's items went)
            sampling.sample_async,
            self,
            batch_size,
            length,
            columns=columns,
            boundary=boundary,
            timeout=timeout,
            out=out,
            rng=rng,
        )

    @documented_as(sampling.sample_async)
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
        return await sampling.sample_async(
            self, batch_size, length, columns=columns, boundary=boundary, timeout=timeout, out=out, rng=rng
        )

    @documented_as(checkpoints.flush)
    def flush(self, disk: bool = False) -> dict | None:
        return checkpoints.flush(self, disk)

    # -- ride-along priority updates: gear_flow.distributed.pending ------------------------------------------------
    @documented_as(pending.defer_priorities)
    def defer_priorities(self, keys: ArrayLike, priorities: ArrayLike | float) -> bool:
        return pending.defer_priorities(self, keys, priorities)

    # -- an admitted insert's transaction: gear_flow.distributed.transactions -----------------------------------------
    @documented_as(transactions.run_insert)
    async def run_insert(self, txn: str, parts: dict[str, list[dict]], staged: Iterable[str] = ()) -> tuple[dict, int]:
        return await transactions.run_insert(self, txn, parts, staged)

    @documented_as(transactions.apply_staged)
    async def apply_staged(self, txn: str, addrs: Iterable[str]) -> tuple[dict, int]:
        return await transactions.apply_staged(self, txn, addrs)

    @documented_as(transactions.abort_staged)
    async def abort_staged(self, txn: str, addrs: Iterable[str], cause: BaseException | None = None) -> None:
        await transactions.abort_staged(self, txn, addrs, cause)

    # -- inserts: gear_flow.distributed.thread_insert (the caller's thread) and writes (the event loop) ----------
    @documented_as(thread_insert.insert)
    def insert(
        self,
        episodes: Mapping | Sequence[Mapping],
        priorities: writes.Priorities = None,
        *,
        timeout: float | None = None,
        shard: int | None = None,
    ) -> InsertResult:
        return thread_insert.insert(self, episodes, priorities, timeout=timeout, shard=shard)

    @documented_as(writes.insert_async)
    async def insert_async(
        self,
        episodes: Mapping | Sequence[Mapping],
        priorities: writes.Priorities = None,
        *,
        timeout: float | None = None,
        shard: int | None = None,
    ) -> InsertResult:
        return await writes.insert_async(self, episodes, priorities, timeout=timeout, shard=shard)

    @documented_as(thread_insert.insert_batch)
    def insert_batch(
        self,
        columns: Mapping[str, ArrayLike],
        priorities: ArrayLike | float | None = None,
        *,
        timeout: float | None = None,
        shard: int | None = None,
    ) -> InsertResult:
        return thread_insert.insert_batch(self, columns, priorities, timeout=timeout, shard=shard)

    @documented_as(writes.writer)
    def writer(
        self, max_episode_length: int | None = None, shard: int | None = None, timeout: float | None = None
    ) -> EpisodeWriter:
        return writes.writer(self, max_episode_length, shard, timeout)

    # -- the handle -------------------------------------------------------------------------------------------------
    @property
    def placement(self) -> dict[int, str]:
        """Worker address of each shard, as this handle last saw it."""
        return self._view.placement

    @property
    def lost(self) -> dict[int, dict]:
        """Shards whose worker was lost, with the coordinator's record of each loss; empty while whole."""
        return self._view.lost

    @property
    def client(self) -> Client | None:
        """The ``distributed.Client`` of this handle (None inside a worker task)."""
        return self._ctx.client

    @property
    def config(self) -> TableConfig:
        """The table's validated configuration."""
        return self._cfg

    @property
    def returns_fresh_batches(self) -> bool:
        """True when batches arrive in fresh frames from one remote worker read over the comm (no buffer
        reuse needed); False where windows are copied into buffers (shared memory, several workers,
        co-located), so that streams reuse theirs instead of faulting in new pages every batch."""
        workers = self._view.workers()
        if len(workers) != 1 or self.local_shards:
            return False
        shared = self._config.get("shared_memory") and config_get("distributed.shared-memory")
        one = next(iter(workers))
        return not shared or (self._routes.probed(one) and self._routes.mapped(one) is None)

    @property
    def local_shards(self) -> list[int]:
        """Shards hosted by the worker running this handle (co-located mode)."""
        return sorted(s for s, a in self.placement.items() if a == self._ctx.local_addr)

    def rebalance(self) -> list[dict]:
        """Move whole shards from the workers holding the most of this table's shards to those holding the
        fewest (workers with the table's resource and memory room, new ones included), until the counts
        differ by at most one.

        Each move is all or nothing and keeps the shard whole (keys,
        priorities, counters), so probabilities stay exact; the table stays
        usable meanwhile, its moving shard's requests waiting a moment.

        Returns
        -------
        list of dict
            The moves made: ``{"shard", "source", "destination"}``.

        Raises
        ------
        SpecError
            A move failed (the shard stays where it was; the moves before
            it are kept).
        """
        return self._ctx.sync(self._rebalance_async)

    async def _rebalance_async(self) -> list[dict]:
        done = await self._link.coordinator.rebalance()
        await self._link.refresh()
        return done

    def move_shards(self, shards: Iterable[int], worker: str | None = None) -> int:
        """Move whole shards (all on one worker) to ``worker``, all or nothing.

        Parameters
        ----------
        shards : iterable of int
            The shards.
        worker : str, optional
            The destination's address; default where a retirement would put
            them (fewest of the table's shards, with room and the table's
            resource).

        Returns
        -------
        int
            The table's placement version after the move.

        Raises
        ------
        SpecError
            A shard is lost or unknown, the shards are on several workers,
            there is nowhere to move them, or the move failed: they stay
            where they were.
        """
        if isinstance(shards, (str, bytes)) or not isinstance(shards, Iterable):
            raise SpecError(f"shards ({shards!r}) must be an iterable of shard ids")
        shards = sorted(check_shard(s, self.spec.num_shards) for s in shards)
        if worker is not None and not isinstance(worker, str):
            raise SpecError(f"worker ({worker!r}) must be a worker's address or None")

        async def run():
            version = await self._link.coordinator.move(shards, worker)
            await self._link.refresh()
            return version

        return self._ctx.sync(run)

    def close(self, drop: bool = True) -> None:
        """Close the table (blocked callers get TableClosedError) and free its shards.

        Parameters
        ----------
        drop : bool, default True
            Also drop the shards from their workers and forget the table on
            the coordinator (a ``disk`` table's files are removed, as other
            tiers' memory is freed; a lost shard's files stay where its
            worker left them); False only closes it (handles see
            :class:`~gear_flow.errors.TableClosedError`), leaving the data in
            place (a ``disk`` table's files flushed first, :meth:`flush`).
            Once this handle has dropped the table, closing it again does
            nothing.
        """
        if self._dropped:
            return

        async def _close():
            if not await self._still_there():  # dropped by another handle, maybe created again under its name:
                self._routes.clear()  # nothing of the cluster is this handle's to flush, close or drop
                self._ctx.lanes.clear()
                self._dropped = True
                return
            try:  # the stored updates, and the samples drawn here that the owners have not counted yet
                await reader_draw.flush(self)
            except (GearFlowError, Retry) as e:  # closing anyway
                logger.warning("table %r: priority updates or draws not sent before closing: %s", self.name, e)
            # the shards' mappings go now, not when the handle is collected: a closed table holds no segment
            self._routes.clear()
            self._ctx.lanes.clear()  # its connections (here on the loop: asyncio transports are not thread-safe)
            try:
                await self._link.coordinator.close(self._created)
            except SpecError:  # another handle dropped it meanwhile (closing at once): nothing left to do
                if await self._still_there():
                    raise
                self._dropped = True
                return
            workers = set(self._view.workers()) | set(await self._link.coordinator.workers())
            if not drop:  # every handle's reads and changes refused where the shards are (their data kept)
                await asyncio.gather(
                    *(call(self._ctx, a, "close_table", name=self.name) for a in sorted(workers)),
                    return_exceptions=True,
                )
            if not drop and self._config.get("tier") == "disk":  # kept: durable, as a local disk table closed
                try:
                    await checkpoints.flush_disk_async(self)
                except (GearFlowError, Retry) as e:  # closing anyway: what was committed is in the page cache
                    logger.warning("table %r: disk shards not flushed before closing: %s", self.name, e)
            if drop:  # every worker: one its shards moved off keeps the table's (empty) gate until then
                await asyncio.gather(
                    *(call(self._ctx, a, "drop", name=self.name) for a in sorted(workers)), return_exceptions=True
                )
                await self._link.coordinator.drop(self._created)
                self._dropped = True

        self._ctx.sync(_close)

    async def _still_there(self) -> bool:
        """Whether the coordinator still has this handle's creation of the table."""
        try:
            state = await self._link.coordinator.lookup()
        except SpecError:  # no table of that name any more
            return False
        return state.get("created") == self._created

    def __enter__(self) -> DistributedTable:
        """The handle itself; the table is closed and dropped on exit."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Close the table and drop its shards (:meth:`close`)."""
        self.close()

    def __reduce__(self):
        # a handle travels by name and creation; the receiver attaches to the table from its own context
        return (_attach_here, (self.name, self._created))


def _forgets_placement(name, pending, routes, ctx, masses, issued):
    """What drops a handle's kept state when its placement changes (a :meth:`TableView.subscribe` callback)."""

    def forget(before, after):
        # a shard lost, or restored from a checkpoint, dropped the seqs its stored updates name (a shard moved
        # whole to another worker keeps its keys: its updates go there)
        replaced = {
            s for s in pending.stored() if after.incarnation.get(s) != before.incarnation.get(s, 0) or s in after.lost
        }
        if replaced:
            pending.drop(replaced)
            logger.info("table %r: priority updates for shards %s dropped (shard lost or restored)", name, replaced)
        routes.clear()  # shards may have moved: map again
        ctx.lanes.clear()
        masses.clear()
        issued.clear()

    return forget


def _attach_here(name, created=None):
    """A handle sent to a task, unpickled: attached to the table from this worker's task; unpickled elsewhere
    (the scheduler reading a task's graph on its way, a worker before the task runs), a stand-in that attaches
    on its first use in the task."""
    return _attach_checked(name, created) if _in_task() else _Sent(name, created)


def _in_task() -> bool:
    """Whether this thread runs a worker's task (where a handle can attach from its worker)."""
    from distributed import get_worker

    try:
        get_worker()
    except ValueError:
        return False
    return True


def _attach_checked(name, created):
    """A handle on table ``name`` from this worker's task, refused if the table was dropped since the handle
    was sent (its name maybe used again): the handle was on that one, and must not act on another."""
    t = DistributedTable.attach(name)
    if created is not None and t._created != created:
        raise SpecError(f"table {name!r} was dropped since this handle was sent (a table of that name now is another)")
    return t


class _Sent:
    """A handle on its way to a task (see :func:`_attach_here`): it attaches on first use, where a worker's
    task runs it, and stands for the handle from then on."""

    def __init__(self, name: str, created: str | None) -> None:
        self.name, self.created, self._table = name, created, None

    def __reduce__(self):
        return (_attach_here, (self.name, self.created))

    def _attached(self) -> DistributedTable:
        if self._table is None:
            if not _in_task():
                raise GearFlowError(
                    f"a handle on table {self.name!r} unpickled outside a worker task attaches nowhere: "
                    f"use DistributedTable.attach({self.name!r}, client=...)"
                )
            self._table = _attach_checked(self.name, self.created)
        return self._table

    def __getattr__(self, attr: str):
        if attr.startswith("__"):  # (pickle, copy and the like look for these: not the handle's)
            raise AttributeError(attr)
        return getattr(self._attached(), attr)

    def __len__(self) -> int:
        return len(self._attached())

    def __enter__(self) -> DistributedTable:
        return self._attached().__enter__()

    def __exit__(self, *exc: object) -> None:
        self._attached().__exit__(*exc)
