"""The handle on a table whose shards live on Dask workers.

The client-side handle talks to the scheduler's coordinator for admission
(global rate limiter, ids, stamps, insert transactions) and directly to the
shard workers for data.  What each operation does lives in its own module:
:mod:`~gear_flow.distributed.writes` (transactional inserts, eviction,
updates, deletes), :mod:`~gear_flow.distributed.sampling` (the planner's
requests answered over the comm), :mod:`~gear_flow.distributed.checkpoints`,
and :mod:`~gear_flow.distributed.transport` (requests, loss detection).

Inside a task on a worker (a co-located learner, GEAR's idea) the handle from
:meth:`DistributedTable.attach` reads the worker's own shards in-process and
gathers them straight into the learner's buffers, with no copy; only remote
shards' windows cross the network.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from collections import defaultdict
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np

from ..config import get as config_get
from ..dashboard import GearFlowDashboard
from ..errors import GearFlowError, ShardLostError, SpecError
from ..rate_limiters import RateLimiter
from ..registry_share import share as share_registrations
from ..resources import advertised, check_resources
from ..selectors import Selector
from ..spec import TableSpec
from ..table.config import TableConfig, queue_setup
from ..table.datasets import DatasetMethods
from .checkpoints import CheckpointMixin
from .coordinator import GearFlowCoordinator
from .pending import RideAlongMixin
from .plugin import GearFlowWorker
from .sampling import SamplingMixin
from .sizes import SizesMixin
from .transport import Context, Retry, WorkerLost, call, coord
from .writes import WritesMixin

if TYPE_CHECKING:
    from distributed import Client

logger = logging.getLogger(__name__)


class DistributedTable(WritesMixin, RideAlongMixin, SamplingMixin, CheckpointMixin, SizesMixin, DatasetMethods):
    """Replay table sharded over Dask workers.

    Create with :meth:`create` (from a client) or get a handle with
    :meth:`attach` (from another client, or inside a task on a worker).
    The API mirrors :class:`~gear_flow.LocalTable`: ``insert``,
    ``insert_batch``, ``writer``, ``sample``, ``update_priorities``,
    ``delete``, ``info``, ``checkpoint``/``restore``, ``close``.  A handle
    pickles by name: sent to a task, it attaches there to the same table.
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
        table's configured ``timeout`` (None there: forever).

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
        Default seconds a blocking call waits (None: forever).
    rng : numpy.random.Generator
        This handle's random generator.
    stats : dict of str to int
        Bytes of sampled windows this handle gathered in-process
        (``local_bytes``), from shared memory (``shared_bytes``) or over the
        comm (``remote_bytes``), the number of ``batches``, and
        ``shared_conflicts`` (shared-memory reads retried over the comm
        because a writer overwrote the window meanwhile); bytes of inserted
        episodes handed to this process's own worker in-process
        (``insert_local_bytes``), through a staging segment to a worker on
        this machine (``insert_shared_bytes``) or sent over the comm
        (``insert_remote_bytes``); ``deferred_stale``: keys of ride-along
        priority updates found gone when applied.
    requests : dict of str to int
        Requests this handle sent to shard workers, by operation name.

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
        self._cfg = TableConfig.from_dict(self._config)
        self.spec = self._cfg.spec
        self.placement: dict[int, str] = {int(k): v for k, v in state["placement"].items()}
        self.lost: dict[int, dict] = {int(k): v for k, v in state.get("lost", {}).items()}
        self.boundary = self._cfg.boundary
        self.routing = self._cfg.routing
        self.degraded = bool(self._config.get("degraded", False))
        self.timeout = self._cfg.timeout if timeout is None else timeout
        self.rng = np.random.default_rng(seed)
        self._rr = 0
        self._version = state.get("version", 0)
        self._lease = (0, 0, 0.0)  # (batch size, batches left, granted at)
        self._lease_lock = threading.Lock()
        self._lease_done = 0  # leased samples served, reported with the next admission
        #: bytes of windows gathered in-process (co-located), from shared memory, or received over the comm;
        #: bytes of inserted episodes written in-process, sent over the comm, or handed over in shared memory
        self.stats = {
            "local_bytes": 0,
            "shared_bytes": 0,
            "remote_bytes": 0,
            "batches": 0,
            "shared_conflicts": 0,
            "insert_local_bytes": 0,
            "insert_remote_bytes": 0,
            "insert_shared_bytes": 0,
            "deferred_stale": 0,
        }
        #: requests this handle sent to shard workers, by operation (the control plane's cost)
        self.requests: dict[str, int] = defaultdict(int)
        self._shared: dict = {}  # worker -> {shard: Attached} (or None: not readable from here)
        from .masses import IssuedKeys, MassCache
        from .pending import PendingUpdates

        self._masses = MassCache()
        self._issued = IssuedKeys()
        #: priority updates riding on this handle's next sample (``update_priorities(wait=False)``)
        self._pending = PendingUpdates()

    # -- construction -----------------------------------------------------------------------
    @classmethod
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
        routing: str | None = None,
        timeout: float | None = None,
        seed: int | None = None,
        workers: Iterable[str] | None = None,
        degraded: bool = False,
        resources: str | None = None,
    ) -> DistributedTable:
        """Create the table's shards on workers and register it with the scheduler.

        Registers gear_flow's scheduler, worker and dashboard plugins on the
        cluster (idempotent) and shares custom selector/limiter registrations
        with it before the shards are built.

        Parameters
        ----------
        client : distributed.Client
            Client of the cluster that will hold the table.
        spec : TableSpec
            Columns, capacity per shard (steps), number of shards, item unit,
            max_size.
        name : str, optional
            Name of the table on the cluster (what :meth:`attach` takes);
            default a fresh ``"table-<8 hex digits>"``.
        sampler : Selector, default Uniform()
            How items are sampled; each shard gets a ``clone()``.
        remover : Selector, default Fifo()
            Which items are evicted when the table exceeds ``max_size``; only
            ``Fifo`` (or a queue/stack) can be honoured by the ring storage.
        rate_limiter : RateLimiter, default MinSize(1)
            Global limiter, held by the scheduler's coordinator.
        max_times_sampled : int, default 0
            Remove an item after this many samples (0: never).
        boundary : {"strict", "pad_tail", "pad_head"}, optional
            Default window boundary mode for :meth:`sample` (config
            ``table.boundary``).
        tier : {"host", "shared", "pinned", "device"}, optional
            Storage tier of the shards (config ``table.tier``).  Host and
            pinned rings go to shared memory when config
            ``distributed.shared-memory`` is set, so handles on the same
            machine read them without the comm.
        routing : {"balanced", "round_robin"}, optional
            How episodes are spread over shards (config ``table.routing``).
        timeout : float, optional
            Default seconds a blocking call waits (config ``table.timeout``;
            None: forever).
        seed : int, optional
            Seeds the returned handle's random generator.
        workers : iterable of str, optional
            Worker addresses to place shards on (default: every worker),
            shards spread over them round-robin; ``spec.num_shards`` may
            exceed the number of workers (several shards per worker).
        degraded : bool, default False
            When a shard's worker is lost, keep serving from the other shards
            and report the loss in ``info()["lost"]``; otherwise every
            operation that needs the lost shard raises
            :class:`~gear_flow.errors.ShardLostError`.
        resources : str, optional
            Place shards only on the workers advertising this Dask resource
            (``dask worker --resources "replay=1"``, see ``cluster/``);
            ignored when ``workers`` is given.

        Returns
        -------
        DistributedTable
            A handle on the new table, from ``client``.

        Raises
        ------
        SpecError
            An invalid argument (named in the message), or a cluster with no
            worker to place shards on.
        """
        cfg = TableConfig.build(
            spec,
            sampler=sampler,
            remover=remover,
            rate_limiter=rate_limiter,
            max_times_sampled=max_times_sampled,
            boundary=boundary,
            routing=routing,
            tier=tier,
            timeout=timeout,
        )
        share_registrations(client)  # custom selectors/limiters, before the scheduler and workers rebuild them
        client.register_plugin(GearFlowCoordinator())
        client.register_plugin(GearFlowWorker())
        client.register_plugin(GearFlowDashboard())  # the /gear-flow dashboard page (where there is a dashboard)
        if workers is None and resources is not None:
            workers = workers_with_resource(client, resources)
        addrs = list(workers) if workers is not None else sorted(advertised(client))
        if not addrs:
            raise SpecError("the cluster has no workers to place shards on")
        placement = {i: addrs[i % len(addrs)] for i in range(spec.num_shards)}
        name = name or f"table-{uuid.uuid4().hex[:8]}"
        # host and pinned rings go to shared memory (pinned: page-locked there, read by the host's GPUs)
        shared = bool(config_get("distributed.shared-memory")) and getattr(cfg.tier, "name", cfg.tier) in (
            "host",
            "pinned",
        )
        config = {**cfg.to_dict(), "degraded": bool(degraded), "resources": resources, "shared_memory": shared}
        ctx = Context(client=client)

        async def setup():
            by_worker = defaultdict(list)
            for s, a in placement.items():
                by_worker[a].append(s)
            await asyncio.gather(
                *(call(ctx, a, "create", name=name, config=config, shard_ids=ids) for a, ids in by_worker.items())
            )
            await coord(ctx, "register", name, config=config, placement={str(k): v for k, v in placement.items()})
            return await coord(ctx, "lookup", name)

        state = ctx.sync(setup)
        return cls(ctx, name, state, seed=seed)

    @classmethod
    def queue(cls, client: Client, spec: TableSpec, size: int, **kw: Any) -> DistributedTable:
        """A FIFO queue of ``size`` items over the workers: each handed out once, in insertion order.

        Sets ``sampler`` and ``remover`` to ``Fifo()``, ``max_times_sampled``
        to 1 and the rate limiter to ``Queue(size)``: samples block while the
        queue is empty, inserts while it is full.

        Parameters
        ----------
        client : distributed.Client
            Client of the cluster that will hold the queue.
        spec : TableSpec
            Columns and shards; its ``max_size`` is set to ``size``.
        size : int
            Items the queue holds at most.
        **kw
            Other keyword arguments of :meth:`create` (``name``, ``timeout``,
            ``workers`` ...); not ``sampler``, ``remover``,
            ``rate_limiter`` or ``max_times_sampled``.

        Returns
        -------
        DistributedTable
            A handle on the new queue.

        Raises
        ------
        SpecError
            ``size`` or another argument is invalid.
        """
        spec, args = queue_setup(spec, size)
        return cls.create(client, spec, **args, **kw)

    @classmethod
    def stack(cls, client: Client, spec: TableSpec, size: int, **kw: Any) -> DistributedTable:
        """A LIFO stack of ``size`` items over the workers: each handed out once, newest first.

        As :meth:`queue`, with ``Lifo()`` selectors and a ``Stack(size)``
        limiter.

        Parameters
        ----------
        client : distributed.Client
            Client of the cluster that will hold the stack.
        spec : TableSpec
            Columns and shards; its ``max_size`` is set to ``size``.
        size : int
            Items the stack holds at most.
        **kw
            Other keyword arguments of :meth:`create`.

        Returns
        -------
        DistributedTable
            A handle on the new stack.

        Raises
        ------
        SpecError
            ``size`` or another argument is invalid.
        """
        spec, args = queue_setup(spec, size, lifo=True)
        return cls.create(client, spec, **args, **kw)

    @classmethod
    def attach(
        cls, name: str, client: Client | None = None, seed: int | None = None, timeout: float | None = None
    ) -> DistributedTable:
        """A handle on an existing table: from ``client``, or (default) from the worker running this task.

        Inside a task, the handle reads the shards of its own worker
        in-process (no copy) and only remote shards' windows cross the comm.

        Parameters
        ----------
        name : str
            The table's name, as given to (or chosen by) :meth:`create`.
        client : distributed.Client, optional
            Client to reach the cluster through; None: the worker running the
            current task (``distributed.get_worker()``).
        seed : int, optional
            Seeds the handle's random generator; None: fresh entropy.
        timeout : float, optional
            Default seconds a blocking call waits; None: the table's own.

        Returns
        -------
        DistributedTable
            A new handle; other handles on the table are unaffected.

        Raises
        ------
        ValueError
            ``client`` is None outside a worker task (from
            ``distributed.get_worker``).
        SpecError
            No table of that name is registered with the coordinator.
        """
        if client is None:
            from distributed import get_worker

            ctx = Context(worker=get_worker())
        else:
            ctx = Context(client=client)

        async def look():
            return await coord(ctx, "lookup", name)

        return cls(ctx, name, ctx.sync(look), seed=seed, timeout=timeout)

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
        workers = self._workers()
        if len(workers) != 1 or self.local_shards:
            return False
        shared = self._config.get("shared_memory") and config_get("distributed.shared-memory")
        return not shared or self._shared.get(next(iter(workers)), "unknown") is None

    @property
    def local_shards(self) -> list[int]:
        """Shards hosted by the worker running this handle (co-located mode)."""
        return sorted(s for s, a in self.placement.items() if a == self._ctx.local_addr)

    # -- plumbing ---------------------------------------------------------------------------------
    def _live_shards(self) -> list[int]:
        return sorted(s for s in self.placement if s not in self.lost)

    def _workers(self, shards=None) -> dict[str, list[int]]:
        by = defaultdict(list)
        for s, a in sorted(self.placement.items()):
            if s in self.lost or (shards is not None and s not in shards):
                continue
            by[a].append(s)
        return dict(by)

    async def _coord(self, op, **kw):
        return await coord(self._ctx, op, self.name, **kw)

    async def _refresh(self, version=None):
        """Pick up placement / lost-shard changes made by other handles (restores, losses)."""
        if version is not None and version == self._version:
            return
        st = await self._coord("lookup")
        placement = {int(k): v for k, v in st["placement"].items()}
        lost = {int(k) for k in st["lost"]}
        moved = {s for s in self._pending.stored() if placement.get(s) != self.placement.get(s) or s in lost}
        if moved:  # lost, or restored from a checkpoint elsewhere: the stored seqs belong to what was there
            self._pending.drop(moved)
            logger.info("table %r: priority updates for shards %s dropped (shard lost or restored)", self.name, moved)
        self.placement = placement
        self.lost = {int(k): v for k, v in st["lost"].items()}
        self._version = st["version"]
        self._shared.clear()  # shards may have moved: map again
        self._ctx.lanes.clear()
        self._masses.clear()
        self._issued.clear()

    async def _shared_for(self, addr: str) -> dict | None:
        """``{shard: Attached}`` when ``addr``'s shards can be read from shared memory here, else None."""
        if addr in self._shared:
            return self._shared[addr]
        got = None
        local = addr == self._ctx.local_addr and self._ctx.local_plugin is not None
        if self._config.get("shared_memory") and config_get("distributed.shared-memory") and not local:
            from ..storage.shared import Attached, machine_id

            try:
                lay = await call(self._ctx, addr, "shared_layout", table=self.name, name=self.name)
            except WorkerLost:  # only a probe: the request that follows finds (and reports) the loss
                return None
            if lay["machine"] == machine_id() and all(v is not None for v in lay["shards"].values()):
                try:
                    got = {int(i): Attached(v, int(i)) for i, v in lay["shards"].items()}
                except (ShardLostError, OSError, ValueError) as e:  # not this machine's /dev/shm after all
                    logger.info("table %r: shards of %s not mapped (%s); using the comm", self.name, addr, e)
                if got is not None and isinstance(lay.get("lane"), str) and config_get("distributed.fast-lane"):
                    self._ctx.lanes.paths[addr] = lay["lane"]  # its control requests: over a Unix socket
        self._shared[addr] = got
        return got

    async def _on_workers(self, calls: dict, partial: bool = False, arrived=None):
        """Run ``{addr: (op, kwargs)}`` in parallel.

        Lost workers → ShardLostError, or in degraded mode a :class:`Retry` once
        their shards are marked lost.  ``partial=True``: return ``(results,
        errors)`` instead of raising, so a caller can undo what succeeded.
        ``arrived``: a coroutine function awaited with ``(addr, result)`` as
        each reply arrives (a batch's parts are copied while others are still
        on their way).
        """
        addrs = list(calls)
        for a in addrs:
            self.requests[calls[a][0]] += 1

        async def one(a):
            r = await call(self._ctx, a, calls[a][0], table=self.name, **calls[a][1])
            if arrived is not None:
                await arrived(a, r)
            return r

        results = await asyncio.gather(*(one(a) for a in addrs), return_exceptions=True)
        out, errors, lost = {}, [], []
        for a, r in zip(addrs, results):
            if isinstance(r, WorkerLost):
                lost.append(a)
            elif isinstance(r, BaseException):
                errors.append(r)
            else:
                out[a] = r
        if lost:
            try:
                await self._handle_lost(lost)
            except (Retry, ShardLostError) as e:
                if not partial:
                    raise
                errors.append(e)
        if partial:
            return out, errors
        if errors:
            raise errors[0]
        return out

    async def _handle_lost(self, addrs):
        shards = sorted(s for s, a in self.placement.items() if a in addrs and s not in self.lost)
        for s in shards:
            self.lost[s] = (await self._coord("mark_lost", shard=s, detail=f"worker {self.placement[s]} unreachable"))[
                s
            ]
        await self._refresh()
        if not self.degraded:
            raise ShardLostError(
                shards[0] if shards else -1,
                f"worker(s) {sorted(addrs)} holding shard(s) {shards} of table {self.name!r} are unreachable; "
                "create the table with degraded=True to keep serving from the other shards",
            )
        logger.warning("table %r: shards %s lost (worker(s) %s); serving from the rest", self.name, shards, addrs)
        raise Retry()

    def _check_not_lost(self):
        if self.lost and not self.degraded:
            s = min(self.lost)
            raise ShardLostError(s, f"table {self.name!r} lost shard(s) {sorted(self.lost)}")

    # -- info ---------------------------------------------------------------------------------
    @property
    def size(self) -> int:
        """Items in the table, as the coordinator counts them (committed inserts)."""
        return int(self._ctx.sync(self._coord, "lookup")["size"])

    def __len__(self) -> int:
        """Items in the table (:attr:`size`)."""
        return self.size

    def info(self) -> dict:
        """Global and per-shard sizes and counters, limiter state, lost shards.

        Samples served from this handle's lease are reported to the
        coordinator first, so the limiter state is current.

        Returns
        -------
        dict
            ``name``; ``size`` (items, summed over the reachable shards);
            ``coordinator_size`` (items of committed inserts, as the
            coordinator counts them); ``max_size``, ``num_shards``,
            ``item_unit`` (from the spec); ``sampler``, ``remover``
            (their configs); ``rate_limiter`` (the limiter's state);
            ``totals`` (each per-shard counter summed over shards);
            ``shards`` (one dict per reachable shard, by shard id, with its
            ``worker``); ``lost`` (``{shard: record}``);
            ``unreachable_workers`` (addresses that did not answer);
            ``placement`` (``{shard: address}``); ``inserts_in_flight``
            (count) and ``waiting`` (``{"inserts": n, "samples": n}``
            blocked by the limiter).
        """
        self.flush()
        return self._ctx.sync(self.info_async)

    async def info_async(self) -> dict:
        """:meth:`info` for a caller inside the event loop (leased samples are not reported first).

        Returns
        -------
        dict
            As :meth:`info`.
        """
        state = await self._coord("lookup")
        for s, v in state["lost"].items():
            self.lost[int(s)] = v
        calls = {a: ("info", dict(name=self.name)) for a in self._workers()}
        res = await asyncio.gather(
            *(call(self._ctx, a, "info", table=self.name, **calls[a][1]) for a in calls), return_exceptions=True
        )
        shards, unreachable = [], []
        for a, r in zip(calls, res):
            if isinstance(r, BaseException):
                unreachable.append(a)
            else:
                shards.extend({**i, "worker": a} for i in r)
        shards.sort(key=lambda i: i["shard"])
        skip = ("shard", "capacity", "write_pos", "worker", "longest_episode")
        keys = [k for k in (shards[0] if shards else {}) if k not in skip]
        return {
            "name": self.name,
            "size": sum(i["size"] for i in shards),
            "coordinator_size": state["size"],
            "max_size": self.spec.max_size,
            "num_shards": self.spec.num_shards,
            "item_unit": self.spec.item_unit,
            "sampler": self._config["sampler"],
            "remover": self._config["remover"],
            "rate_limiter": state["rate_limiter"],
            "totals": {k: sum(i[k] for i in shards) for k in keys},
            "shards": shards,
            "lost": {int(k): v for k, v in state["lost"].items()},
            "unreachable_workers": unreachable,
            "placement": self.placement,
            "inserts_in_flight": state["inserts_in_flight"],
            "waiting": state["waiting"],
        }

    def close(self, drop: bool = True) -> None:
        """Close the table (blocked callers get TableClosedError) and free its shards.

        Parameters
        ----------
        drop : bool, default True
            Also drop the shards from their workers and forget the table on
            the coordinator; False only closes it (handles see
            :class:`~gear_flow.errors.TableClosedError`), leaving the data in
            place.
        """

        async def _close():
            try:
                await self._send_pending()
            except (GearFlowError, Retry) as e:  # closing anyway
                logger.warning("table %r: priority updates not sent before closing: %s", self.name, e)
            self._ctx.lanes.clear()  # its connections (here on the loop: asyncio transports are not thread-safe)
            await self._coord("close")
            if drop:
                await asyncio.gather(
                    *(call(self._ctx, a, "drop", name=self.name) for a in self._workers()), return_exceptions=True
                )
                await self._coord("drop")

        self._ctx.sync(_close)

    def __enter__(self) -> DistributedTable:
        """The handle itself; the table is closed and dropped on exit."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Close the table and drop its shards (:meth:`close`)."""
        self.close()

    def __reduce__(self):
        # a handle travels by name; the receiver attaches to the table from its own context
        return (_attach_here, (self.name,))


def workers_with_resource(client: Client, resource: str) -> list[str]:
    """Sorted addresses of the workers advertising ``resource`` (``dask worker --resources "replay=1"``).

    Parameters
    ----------
    client : distributed.Client
        Client of the cluster to look at.
    resource : str
        Name of a Dask worker resource, e.g. ``"replay"``.

    Returns
    -------
    list of str
        Worker addresses, sorted.

    Raises
    ------
    SpecError
        No worker advertises ``resource``.
    """
    return sorted(check_resources(client, resource))


def _attach_here(name):
    return DistributedTable.attach(name)
