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

import numpy as np

from ..config import get as config_get
from ..dashboard import GearFlowDashboard
from ..errors import ShardLostError, SpecError
from ..rate_limiters import RateLimiter
from ..registry_share import share as share_registrations
from ..resources import advertised, check_resources
from ..selectors import Selector
from ..spec import TableSpec
from ..table.config import TableConfig, queue_setup
from ..table.datasets import DatasetMethods
from .checkpoints import CheckpointMixin
from .coordinator import GearFlowCoordinator
from .plugin import GearFlowWorker
from .sampling import SamplingMixin
from .sizes import SizesMixin
from .transport import Context, Retry, WorkerLost, call, coord
from .writes import WritesMixin

logger = logging.getLogger(__name__)


class DistributedTable(WritesMixin, SamplingMixin, CheckpointMixin, SizesMixin, DatasetMethods):
    """Replay table sharded over Dask workers.

    Create with :meth:`create` (from a client) or get a handle with
    :meth:`attach` (from another client, or inside a task on a worker).
    The API mirrors :class:`~gear_flow.LocalTable`: ``insert``, ``writer``,
    ``sample``, ``update_priorities``, ``delete``, ``info``, ``close``.

    Examples
    --------
    >>> from distributed import Client, LocalCluster            # doctest: +SKIP
    >>> client = Client(LocalCluster(n_workers=2))                # doctest: +SKIP
    >>> table = DistributedTable.create(client, spec, sampler=gf.Prioritized())  # doctest: +SKIP
    >>> table.insert(episodes)                                    # doctest: +SKIP
    >>> batch = table.sample(256, 64)                             # doctest: +SKIP
    """

    def __init__(self, ctx: Context, name: str, state: dict, seed=None, timeout=None):
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
        #: bytes of windows gathered in-process (co-located), from shared memory, or received over the comm
        self.stats = {"local_bytes": 0, "shared_bytes": 0, "remote_bytes": 0, "batches": 0, "shared_conflicts": 0}
        #: requests this handle sent to shard workers, by operation (the control plane's cost)
        self.requests: dict[str, int] = defaultdict(int)
        self._shared: dict = {}  # worker -> {shard: Attached} (or None: not readable from here)
        from .masses import IssuedKeys, MassCache

        self._masses = MassCache()
        self._issued = IssuedKeys()

    # -- construction -----------------------------------------------------------------------
    @classmethod
    def create(
        cls,
        client,
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
        workers=None,
        degraded: bool = False,
        resources: str | None = None,
    ) -> DistributedTable:
        """Create the table's shards on workers and register it with the scheduler.

        ``workers``: addresses to place shards on (default: all), shards spread
        over them round-robin; ``spec.num_shards`` may exceed the number of
        workers (several shards per worker).  ``degraded=True``: when a shard's
        worker is lost, the table keeps serving from the other shards and
        reports the loss in ``info()["lost"]``; otherwise every operation that
        needs the lost shard raises :class:`ShardLostError`.  ``resources``:
        place shards only on the workers that advertise this Dask resource
        (``dask worker --resources "replay=1"``, see ``cluster/``); ignored
        when ``workers`` is given.
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
    def queue(cls, client, spec: TableSpec, size: int, **kw) -> DistributedTable:
        """A FIFO queue of ``size`` items over the workers: each handed out once, in insertion order."""
        spec, args = queue_setup(spec, size)
        return cls.create(client, spec, **args, **kw)

    @classmethod
    def stack(cls, client, spec: TableSpec, size: int, **kw) -> DistributedTable:
        """A LIFO stack of ``size`` items over the workers."""
        spec, args = queue_setup(spec, size, lifo=True)
        return cls.create(client, spec, **args, **kw)

    @classmethod
    def attach(cls, name: str, client=None, seed: int | None = None, timeout: float | None = None) -> DistributedTable:
        """A handle on an existing table: from ``client``, or (default) from the worker running this task."""
        if client is None:
            from distributed import get_worker

            ctx = Context(worker=get_worker())
        else:
            ctx = Context(client=client)

        async def look():
            return await coord(ctx, "lookup", name)

        return cls(ctx, name, ctx.sync(look), seed=seed, timeout=timeout)

    @property
    def client(self):
        """The ``distributed.Client`` of this handle (None inside a worker task)."""
        return self._ctx.client

    @property
    def config(self) -> TableConfig:
        """The table's validated configuration."""
        return self._cfg

    @property
    def returns_fresh_batches(self) -> bool:
        """True when batches arrive in fresh frames from one remote worker (no buffer reuse needed)."""
        return len(self._workers()) == 1 and not self.local_shards

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
        self.placement = {int(k): v for k, v in st["placement"].items()}
        self.lost = {int(k): v for k, v in st["lost"].items()}
        self._version = st["version"]
        self._shared.clear()  # shards may have moved: map again
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

            lay = await call(self._ctx, addr, "shared_layout", table=self.name, name=self.name)
            if lay["machine"] == machine_id() and all(v is not None for v in lay["shards"].values()):
                try:
                    got = {int(i): Attached(v, int(i)) for i, v in lay["shards"].items()}
                except (ShardLostError, OSError, ValueError) as e:  # not this machine's /dev/shm after all
                    logger.info("table %r: shards of %s not mapped (%s); using the comm", self.name, addr, e)
        self._shared[addr] = got
        return got

    async def _on_workers(self, calls: dict, partial: bool = False):
        """Run ``{addr: (op, kwargs)}`` in parallel.

        Lost workers → ShardLostError, or in degraded mode a :class:`Retry` once
        their shards are marked lost.  ``partial=True``: return ``(results,
        errors)`` instead of raising, so a caller can undo what succeeded.
        """
        addrs = list(calls)
        for a in addrs:
            self.requests[calls[a][0]] += 1
        results = await asyncio.gather(
            *(call(self._ctx, a, calls[a][0], table=self.name, **calls[a][1]) for a in addrs), return_exceptions=True
        )
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
        return self.size

    def info(self) -> dict:
        """Global and per-shard sizes and counters, limiter state, lost shards (leased samples reported first)."""
        self.flush()
        return self._ctx.sync(self.info_async)

    async def info_async(self) -> dict:
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
        """Close the table (blocked callers get TableClosedError) and free its shards."""

        async def _close():
            await self._coord("close")
            if drop:
                await asyncio.gather(
                    *(call(self._ctx, a, "drop", name=self.name) for a in self._workers()), return_exceptions=True
                )
                await self._coord("drop")

        self._ctx.sync(_close)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __reduce__(self):
        # a handle travels by name; the receiver attaches to the table from its own context
        return (_attach_here, (self.name,))


def workers_with_resource(client, resource: str) -> list[str]:
    """Sorted addresses of the workers advertising ``resource`` (``dask worker --resources "replay=1"``)."""
    return sorted(check_resources(client, resource))


def _attach_here(name):
    return DistributedTable.attach(name)
