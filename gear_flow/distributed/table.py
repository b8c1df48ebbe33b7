"""A table whose shards live on Dask workers.

The client-side handle talks to the scheduler's coordinator for admission
(global rate limiter, ids, stamps) and directly to the shard workers for data.
Sampling is two-level and exact: shard masses (one message per worker) →
per-shard counts → local selection and gather on each worker in parallel; the
probability returned for an item is ``m_s / sum(m) * w_i / m'_s``, the
probability of the distribution actually used (``m'_s`` is the shard's mass at
the draw, equal to ``m_s`` unless a write landed in between).  Windows come
back as raw frames (NumPy buffers), never pickled row by row.

Inside a task on a worker (a co-located learner, GEAR's idea) the handle from
:meth:`DistributedTable.attach` reads the worker's own shards in-process and
gathers them straight into the learner's buffers, with no copy; only remote
shards' windows cross the network.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections import defaultdict

import numpy as np

from .. import config
from ..errors import EmptyTableError, GearFlowError, ShardLostError, SpecError, nothing_to_sample
from ..keys import decode
from ..keys import encode as encode_keys
from ..ops.gather import window_mask
from ..rate_limiters import MinSize, RateLimiter
from ..rate_limiters import from_config as from_limiter_config
from ..sample import SampleBatch, SampleBuffers
from ..selectors import Fifo, Selector, Uniform
from ..selectors import from_config as selector_from_config
from ..spec import TableSpec
from ..table import two_level
from ..table.local import InsertResult, UpdateResult
from ..table.routing import route
from ..table.validate import (
    as_episode_list,
    check_episode,
    check_keys,
    check_priorities,
    check_sample_args,
    sample_columns,
)
from .coordinator import GearFlowCoordinator
from .host import StaleSelectionError
from .plugin import PLUGIN_NAME, GearFlowWorker

logger = logging.getLogger(__name__)

_COMM_ERRORS = (OSError, asyncio.TimeoutError)


class _WorkerLost(Exception):
    def __init__(self, addr, cause):
        self.addr = addr
        self.cause = cause


class _Context:
    """How this handle reaches the cluster: from a client, or from inside a worker."""

    def __init__(self, client=None, worker=None):
        self.client = client
        self.worker = worker
        if worker is not None:
            self.loop = worker.loop
            self.scheduler = worker.scheduler
            self.rpc = worker.rpc
            self.local_addr = worker.address
            self.local_plugin = worker.plugins.get(PLUGIN_NAME)
        else:
            self.loop = client.loop
            self.scheduler = client.scheduler
            self.rpc = client.rpc
            self.local_addr = None
            self.local_plugin = None

    def sync(self, fn, *args, **kwargs):
        if self.worker is not None:
            from distributed.utils import sync

            return sync(self.loop, fn, *args, **kwargs)
        return self.client.sync(fn, *args, **kwargs)


def _raise(resp):
    if resp.get("status") != "OK":
        err = resp.get("error")
        raise err if isinstance(err, BaseException) else GearFlowError(str(err))
    return resp["result"]


class DistributedTable:
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

    def __init__(self, ctx: _Context, name: str, state: dict, seed=None, timeout=None):
        self._ctx = ctx
        self.name = name
        cfg = state["config"]
        self._config = cfg
        self.spec = TableSpec.from_dict(cfg["spec"])
        self.placement: dict[int, str] = {int(k): v for k, v in state["placement"].items()}
        self.lost: dict[int, dict] = {int(k): v for k, v in state.get("lost", {}).items()}
        self.boundary = cfg["boundary"]
        self.routing = cfg["routing"]
        self.degraded = cfg["degraded"]
        self.timeout = cfg["timeout"] if timeout is None else timeout
        # what kind of selection this is, from the selector classes themselves
        sampler = selector_from_config(cfg["sampler"])
        self._ordered = sampler.deterministic
        self._epochs = getattr(sampler, "without_replacement", False)
        self._beta = getattr(sampler, "beta", 0.0) if getattr(sampler, "importance_weighted", False) else 0.0
        self._remover_ordered = selector_from_config(cfg["remover"]).deterministic
        self.rng = np.random.default_rng(seed)
        self._rr = 0
        self._version = state.get("version", 0)
        self._lease = (0, 0, 0.0)  # (batch size, batches left, granted at)
        self._lease_lock = threading.Lock()
        self._lease_done = 0  # leased samples served, reported with the next admission
        #: bytes of windows gathered in-process (co-located) vs received over the comm
        self.stats = {"local_bytes": 0, "remote_bytes": 0, "batches": 0}
        #: a copy of the limiter's parameters, for rejecting impossible call sizes locally
        self._size_checks = from_limiter_config(cfg["rate_limiter"])

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
        from ..table.local import LocalTable

        sampler = Uniform() if sampler is None else sampler
        remover = Fifo() if remover is None else remover
        rate_limiter = MinSize(1) if rate_limiter is None else rate_limiter
        # the local table validates the whole configuration (same rules, same messages)
        # and describes it (with the config fallbacks for boundary and routing applied)
        probe = LocalTable(
            TableSpec(spec.columns, 1, 1, spec.item_unit, spec.max_size),
            sampler=sampler,
            remover=remover,
            rate_limiter=rate_limiter,
            max_times_sampled=max_times_sampled,
            boundary=boundary,
            routing=routing,
        )
        client.register_plugin(GearFlowCoordinator())
        client.register_plugin(GearFlowWorker())
        if workers is None and resources is not None:
            workers = workers_with_resource(client, resources)
        addrs = list(workers) if workers is not None else sorted(client.scheduler_info()["workers"])
        if not addrs:
            raise SpecError("the cluster has no workers to place shards on")
        placement = {i: addrs[i % len(addrs)] for i in range(spec.num_shards)}
        name = name or f"table-{uuid.uuid4().hex[:8]}"
        cfg = {
            **probe.config(),
            "spec": spec.to_dict(),
            "tier": config.get("table.tier", tier),
            "timeout": config.get("table.timeout", timeout),
            "degraded": bool(degraded),
        }
        ctx = _Context(client=client)

        async def setup():
            by_worker = defaultdict(list)
            for s, a in placement.items():
                by_worker[a].append(s)
            await asyncio.gather(
                *(_call(ctx, a, "create", name=name, config=cfg, shard_ids=ids) for a, ids in by_worker.items())
            )
            _raise(
                await ctx.scheduler.gear_flow_coord(
                    action="register", name=name, config=cfg, placement={str(k): v for k, v in placement.items()}
                )
            )
            return _raise(await ctx.scheduler.gear_flow_coord(action="lookup", name=name))

        state = ctx.sync(setup)
        return cls(ctx, name, state, seed=seed)

    @classmethod
    def attach(cls, name: str, client=None, seed: int | None = None, timeout: float | None = None) -> DistributedTable:
        """A handle on an existing table: from ``client``, or (default) from the worker running this task."""
        if client is None:
            from distributed import get_worker

            ctx = _Context(worker=get_worker())
        else:
            ctx = _Context(client=client)

        async def look():
            return _raise(await ctx.scheduler.gear_flow_coord(action="lookup", name=name))

        return cls(ctx, name, ctx.sync(look), seed=seed, timeout=timeout)

    @property
    def client(self):
        """The ``distributed.Client`` of this handle (None inside a worker task)."""
        return self._ctx.client

    @property
    def returns_fresh_batches(self) -> bool:
        """True when batches arrive in fresh frames from one remote worker (no buffer reuse needed)."""
        return len(self._workers()) == 1 and not self.local_shards

    @property
    def local_shards(self) -> list[int]:
        """Shards hosted by the worker running this handle (co-located mode)."""
        return sorted(s for s, a in self.placement.items() if a == self._ctx.local_addr)

    # -- plumbing ---------------------------------------------------------------------------------
    def _workers(self, shards=None) -> dict[str, list[int]]:
        by = defaultdict(list)
        for s, a in sorted(self.placement.items()):
            if s in self.lost or (shards is not None and s not in shards):
                continue
            by[a].append(s)
        return dict(by)

    async def _coord(self, op, **kw):
        try:
            resp = await self._ctx.scheduler.gear_flow_coord(action=op, name=self.name, **kw)
        except _COMM_ERRORS as e:
            from ..errors import CoordinatorLostError

            raise CoordinatorLostError(
                f"table {self.name!r}: the scheduler at {self._ctx.scheduler.address} cannot be reached ({type(e).__name__}: {e})"
            ) from e
        return _raise(resp)

    async def _refresh(self, version=None):
        """Pick up placement / lost-shard changes made by other handles (restores, losses)."""
        if version is not None and version == self._version:
            return
        st = await self._coord("lookup")
        self.placement = {int(k): v for k, v in st["placement"].items()}
        self.lost = {int(k): v for k, v in st["lost"].items()}
        self._version = st["version"]

    async def _on_workers(self, calls: dict):
        """Run ``{addr: (op, kwargs)}`` in parallel; lost workers → ShardLostError or degraded mode."""
        addrs = list(calls)
        results = await asyncio.gather(
            *(_call(self._ctx, a, calls[a][0], **calls[a][1]) for a in addrs), return_exceptions=True
        )
        out, lost = {}, []
        for a, r in zip(addrs, results):
            if isinstance(r, _WorkerLost):
                lost.append(a)
            elif isinstance(r, BaseException):
                raise r
            else:
                out[a] = r
        if lost:
            await self._handle_lost(lost)
        return out

    async def _handle_lost(self, addrs):
        shards = sorted(s for s, a in self.placement.items() if a in addrs and s not in self.lost)
        for s in shards:
            self.lost[s] = (await self._coord("mark_lost", shard=s, detail=f"worker {self.placement[s]} unreachable"))[
                s
            ]
        if not self.degraded:
            raise ShardLostError(
                shards[0] if shards else -1,
                f"worker(s) {sorted(addrs)} holding shard(s) {shards} of table {self.name!r} are unreachable; "
                "create the table with degraded=True to keep serving from the other shards",
            )
        logger.warning("table %r: shards %s lost (worker(s) %s); serving from the rest", self.name, shards, addrs)
        raise _Retry()

    def _check_not_lost(self):
        if self.lost and not self.degraded:
            s = min(self.lost)
            raise ShardLostError(s, f"table {self.name!r} lost shard(s) {sorted(self.lost)}")

    # -- writing ----------------------------------------------------------------------------------
    def insert(self, episodes, priorities=None, *, timeout=None, shard=None) -> InsertResult:
        """Insert whole episodes; see :meth:`LocalTable.insert`.

        Input is validated before anything is sent.  Episodes are routed to
        shards (never split), preferring the calling worker's own shards when
        called from a task on a worker (writer affinity), and travel as raw
        frames straight to the shard workers.
        """
        return self._ctx.sync(self.insert_async, episodes, priorities, timeout=timeout, shard=shard)

    async def insert_async(self, episodes, priorities=None, *, timeout=None, shard=None) -> InsertResult:
        self._check_not_lost()
        eps = as_episode_list(episodes)
        checked = [check_episode(self.spec, e, i) for i, e in enumerate(eps)]
        lengths = np.array([t for _, t in checked], dtype=np.int64)
        step_items = self.spec.item_unit == "step"
        n_items = int(lengths.sum()) if step_items else len(lengths)
        if isinstance(priorities, (list, tuple)) and priorities and np.ndim(priorities[0]) >= 1:
            priorities = np.concatenate([np.asarray(p, dtype=np.float64).reshape(-1) for p in priorities])
        pr = check_priorities(priorities, n_items)
        alive = [s for s in sorted(self.placement) if s not in self.lost]
        if not alive:
            raise ShardLostError(-1, f"table {self.name!r} has no shard left")
        if shard is None and self.local_shards:
            local = [s for s in self.local_shards if s not in self.lost]
            dest_i = route(lengths, len(local), self.spec.capacity, self.routing, self._rr)
            dest = np.array(local)[dest_i]
        else:
            dest_i = route(
                lengths,
                len(alive),
                self.spec.capacity,
                self.routing,
                self._rr,
                None if shard is None else alive.index(shard),
            )
            dest = np.array(alive)[dest_i]
        self._rr += len(eps)
        self._size_checks.check_insert_size(n_items)
        item_off = np.concatenate(([0], np.cumsum(lengths if step_items else np.ones_like(lengths))))
        items_of = item_off[1:] - item_off[:-1]
        per_shard = {int(s): int(items_of[dest == s].sum()) for s in np.unique(dest)}
        adm = await self._coord(
            "admit_insert",
            n=n_items,
            episodes=len(eps),
            per_shard=per_shard,
            timeout=self.timeout if timeout is None else timeout,
        )
        await self._refresh(adm["version"])  # shards may have moved (restored) since routing
        ids = adm["first_episode_id"] + np.arange(len(eps), dtype=np.int64)
        stamps = adm["first_stamp"] + item_off[:-1]
        calls = defaultdict(list)
        for s in np.unique(dest):
            sel = np.flatnonzero(dest == s)
            p = None if pr is None else np.concatenate([pr[item_off[i] : item_off[i + 1]] for i in sel])
            calls[self.placement[int(s)]].append(
                (
                    int(s),
                    sel,
                    dict(
                        name=self.name,
                        shard_id=int(s),
                        chunks=[checked[i][0] for i in sel],
                        lengths=lengths[sel],
                        episode_ids=ids[sel],
                        stamps=stamps[sel],
                        priorities=p,
                    ),
                )
            )

        async def one_worker(addr, items):
            return [(s, sel, await _call(self._ctx, addr, "insert", **kw)) for s, sel, kw in items]

        results = await asyncio.gather(*(one_worker(a, it) for a, it in calls.items()), return_exceptions=True)
        first_keys = np.empty(len(eps), dtype=np.int64)
        evicted = {}
        failed = []
        for (addr, items), r in zip(calls.items(), results):
            if isinstance(r, BaseException):
                failed.append((addr, items, r))
                continue
            for s, sel, res in r:
                first_keys[sel] = res["first_keys"]
                if res["evicted"]:
                    evicted[s] = res["evicted"]
        if failed:
            failed_shards = {s: per_shard[s] for _, items, _ in failed for s, _, _ in items}
            lost_items = sum(failed_shards.values())
            await self._coord("rollback_insert", n=lost_items, per_shard=failed_shards)
            errs = [r for _, _, r in failed]
            if any(not isinstance(e, _WorkerLost) for e in errs):
                raise next(e for e in errs if not isinstance(e, _WorkerLost))
            try:
                await self._handle_lost([a for a, _, _ in failed])
            except _Retry:
                pass
            raise ShardLostError(
                int(failed[0][1][0][0]),
                f"the episodes routed to worker(s) {[a for a, _, _ in failed]} were not stored "
                f"({lost_items} items); the other shards' part of this insert was stored",
            )
        size = await self._coord("removed", k=sum(evicted.values()), per_shard=evicted) if evicted else None
        if size is None:
            size = (await self._coord("lookup"))["size"]
        if size > self.spec.max_size:
            await self._enforce_max_size(size - self.spec.max_size)
        return InsertResult(ids, first_keys, dest, n_items)

    async def _enforce_max_size(self, excess: int):
        workers = self._workers()
        if self._remover_ordered:
            res = await self._on_workers({a: ("remover_candidates", dict(name=self.name, n=excess)) for a in workers})
            per = [(s, c) for a in res for s, c in res[a].items()]
            chosen = two_level.merge_candidates([c for _, c in per], excess)
            calls = defaultdict(dict)
            for (s, _), sl in zip(per, chosen):
                if len(sl):
                    calls[self.placement[s]][s] = sl
            res = await self._on_workers({a: ("remove", dict(name=self.name, slots=sl)) for a, sl in calls.items()})
        else:
            res = await self._on_workers(
                {a: ("masses", dict(name=self.name, length=1, boundary="pad_tail", kind="remover")) for a in workers}
            )
            masses = {s: m for r in res.values() for s, m in r.items()}
            shards = sorted(masses)
            m = np.array([masses[s] for s in shards])
            counts = two_level.multinomial_counts(m, excess, self.rng) if m.sum() > 0 else np.zeros(len(shards), int)
            calls = defaultdict(dict)
            for s, c in zip(shards, counts):
                if c:
                    calls[self.placement[s]][s] = int(c)
            res = await self._on_workers(
                {
                    a: ("remove", dict(name=self.name, counts=c, seed=int(self.rng.integers(2**63))))
                    for a, c in calls.items()
                }
            )
        per = {s: k for r in res.values() for s, k in r.items() if k}
        if per:
            await self._coord("removed", k=sum(per.values()), per_shard=per)

    def writer(self, max_episode_length: int | None = None, shard: int | None = None, timeout=None):
        """A streaming writer (``append``/``end_episode``) inserting into this table."""
        from ..writer import EpisodeWriter

        return EpisodeWriter(self, max_episode_length=max_episode_length, shard=shard, timeout=timeout)

    # -- sampling ------------------------------------------------------------------------------------
    def sample(
        self, batch_size: int, length: int = 1, *, columns=None, boundary=None, timeout=None, out=None, rng=None
    ) -> SampleBatch:
        """Sample ``batch_size`` windows of ``length`` steps from all shards; see :class:`SampleBatch`."""
        fast = self._colocated_fast_path(batch_size, length, columns, boundary, out, rng)
        if fast is not None:
            return fast
        return self._ctx.sync(
            self.sample_async, batch_size, length, columns=columns, boundary=boundary, timeout=timeout, out=out, rng=rng
        )

    async def sample_async(
        self, batch_size, length=1, *, columns=None, boundary=None, timeout=None, out=None, rng=None
    ):
        boundary = self.boundary if boundary is None else boundary
        check_sample_args(batch_size, length, boundary)
        columns = sample_columns(self.spec, columns)
        if out is not None and not out.matches(columns, batch_size, length):
            raise SpecError(
                f"out buffers are for columns={out.columns}, batch_size={out.batch_size}, length={out.length}"
            )
        self._size_checks.check_sample_size(batch_size)
        self._check_not_lost()
        rng = self.rng if rng is None else rng
        leased = self._take_lease(batch_size)
        if not leased:
            with self._lease_lock:
                done, self._lease_done = self._lease_done, 0
            adm = await self._coord(
                "admit_sample",
                n=batch_size,
                timeout=self.timeout if timeout is None else timeout,
                done=done,
                lease=config.get("distributed.sample-lease"),
            )
            await self._refresh(adm["version"])
            self._lease = (batch_size, adm.get("lease", 0), time.monotonic())
        try:
            for attempt in range(5):
                try:
                    workers = self._workers()
                    if len(workers) == 1:  # every live shard on one worker: one call does it all
                        addr = next(iter(workers))
                        out, expired = await self._sample_one_worker(
                            addr, out, batch_size, length, boundary, columns, rng
                        )
                    else:
                        if out is None:
                            out = SampleBuffers(self.spec, columns, batch_size, length)
                        expired = await self._sample_into(out, batch_size, length, boundary, columns, rng)  # {shard: n}
                    break
                except (_Retry, StaleSelectionError):
                    if attempt == 4:
                        raise
        except BaseException:
            if leased:
                with self._lease_lock:
                    self._lease_done -= batch_size
            else:
                await self._coord("rollback_sample", n=batch_size)
            raise
        size = await self._coord("removed", k=sum(expired.values()), per_shard=expired) if expired else None
        if size is None:
            size = -1
        return out.batch(size)

    def _take_lease(self, n: int) -> bool:
        """Serve this batch from a MinSize admission lease (fresh, same batch size, not used up)."""
        with self._lease_lock:
            size, left, since = self._lease
            if size != n or left <= 0 or time.monotonic() - since > config.get("distributed.sample-lease-seconds"):
                return False
            self._lease = (size, left - 1, since)
            self._lease_done += n
            return True

    def _colocated_fast_path(self, B, L, columns, boundary, out, rng):
        """A co-located learner whose worker holds every live shard, under a lease: sample in
        this thread, straight into the learner's buffers, without touching the event loop."""
        ctx = self._ctx
        if ctx.local_plugin is None or self._lost_any_local():
            return None
        workers = self._workers()
        if list(workers) != [ctx.local_addr]:
            return None
        boundary = self.boundary if boundary is None else boundary
        check_sample_args(B, L, boundary)
        columns = sample_columns(self.spec, columns)
        if out is None:
            out = SampleBuffers(self.spec, columns, B, L)
        elif not out.matches(columns, B, L):
            return None  # the slow path raises the clear error
        if not self._take_lease(B):
            return None
        rng = self.rng if rng is None else rng
        try:
            res = ctx.local_plugin.host.sample_all(
                self.name, B, L, boundary, columns, int(rng.integers(2**63)), out=out
            )
        except BaseException:
            with self._lease_lock:
                self._lease_done -= B
            raise
        self.stats["local_bytes"] += sum(a.nbytes for a in out.bytes.values())
        self.stats["batches"] += 1
        if res["expired"]:
            ctx.sync(self._coord, "removed", k=sum(res["expired"].values()), per_shard=res["expired"])
        return out.batch(-1)

    def flush(self) -> None:
        """Report samples served under a lease to the coordinator now (``info()`` then counts them)."""
        with self._lease_lock:
            done, self._lease_done = self._lease_done, 0
        if done:
            self._ctx.sync(self._coord, "count_samples", n=done)

    def _lost_any_local(self) -> bool:
        return bool(self.lost) and not self.degraded

    async def _sample_one_worker(self, addr, out, B, L, boundary, columns, rng):
        args = dict(name=self.name, n=B, length=L, boundary=boundary, columns=columns, seed=int(rng.integers(2**63)))
        local = addr == self._ctx.local_addr and self._ctx.local_plugin is not None
        if local:
            if out is None:
                out = SampleBuffers(self.spec, columns, B, L)
            args["out"] = out  # co-located: gathered straight into the learner's buffers
        res = (await self._on_workers({addr: ("sample_all", args)}))[addr]
        nbytes = B * L * sum(max(self.spec.column(c).nbytes, 1) for c in columns)
        if local:
            self.stats["local_bytes"] += nbytes
        elif out is None:
            out = SampleBuffers.wrap(self.spec, columns, L, res)  # the received frames are the batch
            self.stats["remote_bytes"] += nbytes
        else:
            for c in columns:
                out.bytes[c][...] = res["data"][c]
            for f in ("keys", "probabilities", "weights", "mask", "episode_ids", "timesteps"):
                getattr(out, f)[...] = res[f]
            self.stats["remote_bytes"] += nbytes
        self.stats["batches"] += 1
        return out, res["expired"]

    async def _sample_into(self, out, B, L, boundary, columns, rng) -> int:
        workers = self._workers()
        if not workers:
            raise EmptyTableError(f"table {self.name!r} has no reachable shard")
        if self._ordered:
            res = await self._on_workers(
                {a: ("candidates", dict(name=self.name, n=B, length=L, boundary=boundary)) for a in workers}
            )
            per = [(s, c) for a in sorted(res) for s, c in sorted(res[a].items())]
            if not any(len(c[0]) for _, c in per):
                await self._raise_empty(L, boundary)
            chosen = two_level.merge_candidates([c for _, c in per], B)
            parts = defaultdict(dict)
            for (s, _), sl in zip(per, chosen):
                if len(sl):
                    parts[self.placement[s]][s] = sl
            return await self._execute(
                out, 0, {a: dict(slots=sl) for a, sl in parts.items()}, {}, L, boundary, columns, rng
            )
        if self._epochs:
            return await self._sample_epoch(out, workers, B, L, boundary, columns, rng)
        res = await self._on_workers(
            {a: ("masses", dict(name=self.name, length=L, boundary=boundary, kind="sampler")) for a in workers}
        )
        masses = {s: m for r in res.values() for s, m in r.items()}
        shards = sorted(masses)
        m = np.array([masses[s] for s in shards])
        if m.sum() <= 0:
            await self._raise_empty(L, boundary)
        counts = two_level.multinomial_counts(m, B, rng)
        parts = defaultdict(dict)
        for s, c in zip(shards, counts):
            if c:
                parts[self.placement[s]][s] = int(c)
        plan = {a: dict(counts=c, masses={s: masses[s] for s in c}) for a, c in parts.items()}
        return await self._execute(out, 0, plan, {s: masses[s] / m.sum() for s in shards}, L, boundary, columns, rng)

    async def _sample_epoch(self, out, workers, B, L, boundary, columns, rng) -> int:
        """WithoutReplacement: a uniform subset of the global epoch; a new epoch starts on every shard when it runs out."""
        done, expired, fresh = 0, {}, False
        while done < B:
            res = await self._on_workers(
                {a: ("masses", dict(name=self.name, length=L, boundary=boundary, kind="unseen")) for a in workers}
            )
            unseen = {s: int(round(m)) for r in res.values() for s, m in r.items()}
            shards = sorted(unseen)
            u = np.array([unseen[s] for s in shards])
            left = int(u.sum())
            if left == 0:
                if fresh:
                    await self._raise_empty(L, boundary)
                await self._on_workers({a: ("new_epoch", dict(name=self.name)) for a in workers})
                fresh = True
                continue
            fresh = False
            take = min(B - done, left)
            parts = defaultdict(dict)
            for s, c in zip(shards, two_level.epoch_counts(u, take, rng)):
                if c:
                    parts[self.placement[s]][s] = int(c)
            scale = {s: 1.0 for s in shards}  # shards report 1 / (their unseen); rescaled below
            for s, k in (
                await self._execute(
                    out, done, {a: dict(counts=c) for a, c in parts.items()}, scale, L, boundary, columns, rng
                )
            ).items():
                expired[s] = expired.get(s, 0) + k
            out.probabilities[done : done + take] = 1.0 / left
            done += take
        return expired

    async def _execute(self, out, base, plan: dict, scale: dict, L, boundary, columns, rng) -> int:
        """Run ``sample_part`` on every worker of ``plan`` and place the parts at ``base`` onwards."""
        offsets, off = {}, base
        for a in sorted(plan):
            part = plan[a].get("counts") or plan[a].get("slots")
            for s in sorted(part):
                offsets[s] = off
                off += part[s] if "counts" in plan[a] else len(part[s])
        calls = {}
        for a, kw in plan.items():
            args = dict(
                name=self.name,
                length=L,
                boundary=boundary,
                columns=columns,
                seed=int(rng.integers(2**63)),
                counts=kw.get("counts"),
                masses=kw.get("masses"),
                slots=kw.get("slots"),
            )
            if a == self._ctx.local_addr and self._ctx.local_plugin is not None:
                args.update(out=out.bytes, offsets=offsets)  # co-located: gather straight into the batch
            calls[a] = ("sample_part", args)
        res = await self._on_workers(calls)
        expired = {}
        for parts_ in res.values():
            for s, r in parts_.items():
                o = offsets[s]
                n = len(r["seqs"])
                nbytes = sum(out.bytes[c][o : o + n].nbytes for c in columns)
                if "data" in r:
                    for c in columns:
                        out.bytes[c][o : o + n] = r["data"][c]
                    self.stats["remote_bytes"] += nbytes
                else:
                    self.stats["local_bytes"] += nbytes
                out.keys[o : o + n] = encode_keys(s, r["seqs"])
                out.probabilities[o : o + n] = np.asarray(r["q"]) * scale.get(s, 1.0)
                out.episode_ids[o : o + n] = r["episode_ids"]
                out.timesteps[o : o + n] = r["timesteps"]
                window_mask(np.asarray(r["dst_offset"]), np.asarray(r["n_valid"]), L, out=out.mask[o : o + n])
                if r["expired"]:
                    expired[s] = r["expired"]
        if off == out.batch_size:
            self.stats["batches"] += 1
            two_level.importance_weights(out.probabilities, self._beta, out.weights)
        return expired

    async def _raise_empty(self, L, boundary):
        res = await self._on_workers({a: ("info", dict(name=self.name)) for a in self._workers()})
        infos = [i for r in res.values() for i in r]
        longest = max((i["longest_episode"] for i in infos), default=0)
        raise nothing_to_sample(f"table {self.name!r}", sum(i["size"] for i in infos), longest, L, boundary)

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

    def update_priorities(self, keys, priorities) -> UpdateResult:
        """Set priorities by key: one message per worker, all or nothing for invalid input."""
        return self._ctx.sync(self.update_priorities_async, keys, priorities)

    async def update_priorities_async(self, keys, priorities) -> UpdateResult:
        k, by, idx, on_lost = self._group(keys)
        pr = check_priorities(priorities, len(k), "keys")
        if pr is None:
            raise SpecError("priorities must not be None")
        if len(by) > 1:  # unknown keys anywhere must stop the whole call before any worker applies it
            await self._on_workers({a: ("check_keys", dict(name=self.name, seqs_by_shard=s)) for a, s in by.items()})
        calls = {
            a: ("update", dict(name=self.name, seqs_by_shard=s, prios_by_shard={i: pr[idx[a][i]] for i in s}))
            for a, s in by.items()
        }
        res = await self._on_workers(calls)
        stale = sum(res.values()) + on_lost
        return UpdateResult(len(k) - stale, stale)

    def delete(self, keys) -> UpdateResult:
        """Remove items by key (stale keys ignored and counted)."""
        return self._ctx.sync(self.delete_async, keys)

    async def delete_async(self, keys) -> UpdateResult:
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

    # -- info ---------------------------------------------------------------------------------
    def info(self) -> dict:
        """Global and per-shard sizes and counters, limiter state, lost shards."""
        return self._ctx.sync(self.info_async)

    async def info_async(self) -> dict:
        state = await self._coord("lookup")
        for s, v in state["lost"].items():
            self.lost[int(s)] = v
        calls = {a: ("info", dict(name=self.name)) for a in self._workers()}
        res = await asyncio.gather(
            *(_call(self._ctx, a, *calls[a][0:1], **calls[a][1]) for a in calls), return_exceptions=True
        )
        shards = []
        unreachable = []
        for a, r in zip(calls, res):
            if isinstance(r, BaseException):
                unreachable.append(a)
            else:
                for i in r:
                    shards.append({**i, "worker": a})
        shards.sort(key=lambda i: i["shard"])
        keys = [
            k
            for k in (shards[0] if shards else {})
            if k not in ("shard", "capacity", "write_pos", "worker", "longest_episode")
        ]
        return {
            "name": self.name,
            "size": sum(i["size"] for i in shards),
            "coordinator_size": state["size"],
            "max_size": self.spec.max_size,
            "num_shards": self.spec.num_shards,
            "sampler": self._config["sampler"],
            "remover": self._config["remover"],
            "rate_limiter": state["rate_limiter"],
            "totals": {k: sum(i[k] for i in shards) for k in keys},
            "shards": shards,
            "lost": {int(k): v for k, v in state["lost"].items()},
            "unreachable_workers": unreachable,
            "placement": self.placement,
        }

    # -- checkpoints -----------------------------------------------------------------------------
    def checkpoint(self, path) -> dict:
        """Atomic, checksummed checkpoint of every live shard into directory ``path``.

        ``path`` must be visible to the workers (a shared filesystem; any local
        path for a LocalCluster).  Each worker snapshots its shards under their
        locks (the only pause: a memory copy) and writes them while sampling and
        inserting continue; the coordinator's counters are recorded after the
        snapshots so that restored tables never reuse episode ids.  Returns
        ``{"path", "pause_s" (longest shard pause), "seconds", "shards"}``.
        """
        return self._ctx.sync(self.checkpoint_async, path)

    async def checkpoint_async(self, path) -> dict:
        import time
        from pathlib import Path

        from .. import checkpoint as ck

        t0 = time.perf_counter()
        final = Path(path).absolute()
        tmp = ck.temp_dir(final)
        try:
            res = await self._on_workers(
                {a: ("checkpoint", dict(name=self.name, directory=str(tmp))) for a in self._workers()}
            )
            files = {str(s): e for r in res.values() for s, e in r.items()}
            st = await self._coord("lookup")
            cfg = {**self._config, "rate_limiter": st["rate_limiter_config"]}
            state = {k: st[k] for k in ("size", "shard_size", "shard_inserted", "next_episode_id", "next_stamp")}
            state["shard_size"] = {str(k): v for k, v in state["shard_size"].items() if int(k) not in self.lost}
            state["shard_inserted"] = {str(k): v for k, v in state["shard_inserted"].items()}
            state["size"] = sum(state["shard_size"].values())
            ck.commit(tmp, final, ck.new_manifest("distributed", cfg, state, files))
        except BaseException:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
            raise
        pause = max((e["pause_s"] for e in files.values()), default=0.0)
        return {
            "path": str(final),
            "pause_s": pause,
            "seconds": time.perf_counter() - t0,
            "shards": sorted(int(k) for k in files),
        }

    @classmethod
    def restore(
        cls, client, path, *, name: str | None = None, workers=None, seed=None, timeout=None
    ) -> DistributedTable:
        """A table rebuilt from a checkpoint onto ``workers`` (default: all; any number, any addresses).

        Every shard file is verified (SHA-256, format version, spec) by the worker
        that loads it before anything is built.
        """
        from pathlib import Path

        from .. import checkpoint as ck

        path = Path(path).absolute()
        m = ck.read_manifest(path)
        if m.get("kind") != "distributed":
            from ..errors import CheckpointError

            raise CheckpointError(f"{path} holds a {m.get('kind')!r} checkpoint; use LocalTable.restore")
        cfg = m["table"]
        client.register_plugin(GearFlowCoordinator())
        client.register_plugin(GearFlowWorker())
        addrs = list(workers) if workers is not None else sorted(client.scheduler_info()["workers"])
        shard_ids = sorted(int(k) for k in m["files"])
        placement = {s: addrs[j % len(addrs)] for j, s in enumerate(shard_ids)}
        name = name or f"table-{uuid.uuid4().hex[:8]}"
        ctx = _Context(client=client)

        async def go():
            by_worker = defaultdict(dict)
            for s, a in placement.items():
                by_worker[a][s] = m["files"][str(s)]
            await asyncio.gather(
                *(
                    _call(ctx, a, "restore", name=name, config=cfg, directory=str(path), files=f)
                    for a, f in by_worker.items()
                )
            )
            _raise(
                await ctx.scheduler.gear_flow_coord(
                    action="register", name=name, config=cfg, placement={str(k): v for k, v in placement.items()}
                )
            )
            _raise(await ctx.scheduler.gear_flow_coord(action="restore_state", name=name, state=m["state"]))
            return _raise(await ctx.scheduler.gear_flow_coord(action="lookup", name=name))

        return cls(ctx, name, ctx.sync(go), seed=seed, timeout=timeout)

    def restore_shard(self, shard: int, path, worker: str | None = None) -> dict:
        """Rebuild a lost shard from checkpoint ``path`` on ``worker`` (default: the least loaded live one).

        Returns what was lost: ``inserted_at_loss`` (items the shard had received
        when it was lost), ``inserted_at_checkpoint``, their difference
        ``lost_items`` (inserted after the checkpoint, gone), and ``items_restored``.
        """
        return self._ctx.sync(self.restore_shard_async, shard, path, worker)

    async def restore_shard_async(self, shard: int, path, worker=None) -> dict:
        from pathlib import Path

        from .. import checkpoint as ck

        path = Path(path).absolute()
        m = ck.read_manifest(path)
        entry = m["files"].get(str(shard))
        if entry is None:
            raise ShardLostError(shard, f"checkpoint {path} has no file for shard {shard}")
        await self._refresh()
        if worker is None:
            alive = self._workers()
            if not alive:
                raise ShardLostError(shard, "no live worker to restore onto")
            worker = min(alive, key=lambda a: (len(alive[a]), a))
        restored = (
            await self._on_workers(
                {
                    worker: (
                        "restore",
                        dict(name=self.name, config=self._config, directory=str(path), files={shard: entry}),
                    )
                }
            )
        )[worker]
        meta = entry["meta"]
        lost = await self._coord(
            "shard_restored", shard=shard, worker=worker, size=restored[shard], inserted=meta["counters"]["inserted"]
        )
        await self._refresh()
        report = {
            "shard": shard,
            "worker": worker,
            "items_restored": restored[shard],
            "inserted_at_checkpoint": meta["counters"]["inserted"],
        }
        if lost:
            report["inserted_at_loss"] = lost["inserted_at_loss"]
            report["lost_items"] = lost["inserted_at_loss"] - meta["counters"]["inserted"]
        return report

    def close(self, drop: bool = True) -> None:
        """Close the table (blocked callers get TableClosedError) and free its shards."""

        async def _close():
            await self._coord("close")
            if drop:
                await asyncio.gather(
                    *(_call(self._ctx, a, "drop", name=self.name) for a in self._workers()), return_exceptions=True
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
    info = client.scheduler_info(n_workers=-1)["workers"]
    addrs = sorted(a for a, w in info.items() if (w.get("resources") or {}).get(resource, 0) > 0)
    if not addrs:
        have = sorted({r for w in info.values() for r in (w.get("resources") or {})})
        raise SpecError(f"no worker advertises resource {resource!r}; resources advertised: {have}")
    return addrs


def _attach_here(name):
    return DistributedTable.attach(name)


class _Retry(Exception):
    """Internal: the shard set changed (degraded mode); redo the operation."""


async def _call(ctx: _Context, addr: str, op: str, **args):
    """One request to a shard worker (in-process when it is this worker)."""
    if addr == ctx.local_addr and ctx.local_plugin is not None:
        return await ctx.local_plugin.run(op, **args)
    from distributed.protocol import to_serialize

    try:
        resp = await asyncio.wait_for(
            ctx.rpc(addr).gear_flow(action=op, args=to_serialize(args)), config.get("distributed.rpc-timeout")
        )
    except _COMM_ERRORS as e:  # includes the timeout: a worker that does not answer is as good as lost
        raise _WorkerLost(addr, e) from e
    return _raise(resp)
