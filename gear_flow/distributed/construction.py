"""How a handle on a distributed table comes to be: a new table placed on the cluster, or an existing one attached.

:func:`create` registers gear_flow's plugins on the cluster, places the
shards on workers (round-robin over the chosen ones) and registers the table
with the scheduler's coordinator; :func:`queue` and :func:`stack` are tables
configured as a FIFO queue or a LIFO stack; :func:`attach` looks an existing
table up, from a client or from inside a task on a worker.  Each is handed the
handle's class and ends in ``cls(ctx, name, state, ...)``, the handle's
internal constructor; :class:`~gear_flow.distributed.DistributedTable`'s
classmethods of the same names hand themselves over.
"""

from __future__ import annotations

import os
import uuid
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config import check_section
from ..config import get as config_get
from ..dashboard import GearFlowDashboard
from ..errors import SpecError
from ..rate_limiters import RateLimiter
from ..registry_share import share as share_registrations
from ..resources import check_resources, placement_workers
from ..selectors import Selector
from ..spec import TableSpec
from ..table.config import TableConfig, queue_setup
from ..table.validate import seeded_rng
from .coordinator import GearFlowCoordinator
from .plugin import GearFlowWorker
from .transport import Context, CoordinatorClient, build_everywhere

if TYPE_CHECKING:
    from distributed import Client

    from .api import DistributedTable


def create(
    cls: type[DistributedTable],
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
    """Create the table's shards on workers and register it with the scheduler.

    Registers gear_flow's plugins on the cluster (idempotent) and shares
    custom selector/limiter registrations with it, registers the table's
    name with the coordinator (a live table's is refused before any worker
    builds anything), then builds the shards.  All or nothing: when a worker
    cannot build its shards, every worker drops what it built (a disk
    table's files included) and the coordinator forgets the name.

    Parameters
    ----------
    cls : type of DistributedTable
        The class of the handle made (on the classmethod of
        :class:`~gear_flow.distributed.DistributedTable`: the class it is
        called on).
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
        Remove an item after this many samples (0: never; at most 2**31 - 1).
    boundary : {"strict", "pad_tail", "pad_head"}, optional
        Default window boundary mode for :meth:`sample` (config
        ``table.boundary``).
    tier : {"host", "shared", "pinned", "device", "disk"}, optional
        Storage tier of the shards (config ``table.tier``).  Host and
        pinned rings go to shared memory when config
        ``distributed.shared-memory`` is set, so handles on the same
        machine read them without the comm; with config
        ``distributed.tcp-lane`` set when the table is made, handles that
        do not map a worker's rings draw over its TCP lane.  ``disk``: each
        shard's arrays are memory-mapped files in
        ``<root>/<name>/shard-<id>`` on its worker's local disk, its own
        checkpoint (:mod:`~gear_flow.distributed.host_disk`): ``flush(disk=True)``
        makes them durable, ``restore_shard(shard, "<root>/<name>")``
        reopens a lost shard's files in place, ``close()`` removes them,
        ``close(drop=False)`` flushes and keeps them.
    path : str or os.PathLike, optional
        The ``root`` of a ``disk`` table, the same directory on every worker
        (absolute; a relative one is taken from this process's working
        directory); default each worker's own config ``gear-flow.disk.path``,
        read on the worker.  A worker with neither cannot host a disk
        shard: the table is not created.
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
    rebalance_on_join : bool, default False
        When a worker (with ``resources``, if given) joins the cluster,
        move whole shards onto it until every worker holds as many as the
        others, give or take one (:meth:`rebalance`): a table with more
        shards than workers grows onto the workers added later.

    Returns
    -------
    DistributedTable
        A handle on the new table, from ``client``.

    Raises
    ------
    SpecError
        An invalid argument (named in the message), a live table with that
        name, a cluster with no worker to place shards on, or a worker that
        cannot build its shards (named in the message; a disk table's
        worker with no directory for it, or one holding that table's files
        already).
    ShardLostError
        A worker was lost while it built its shards.  Either way nothing is
        left on any worker, nor on the coordinator.
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
    if path is not None and getattr(cfg.tier, "name", cfg.tier) != "disk":
        raise SpecError(f"path= is for disk tables; this one is on the {getattr(cfg.tier, 'name', cfg.tier)!r} tier")
    check_section("distributed")  # (before anything is built: a bad value was first read by a later request)
    seeded_rng(seed)
    share_registrations(client)  # custom selectors/limiters, before the scheduler and workers rebuild them
    client.register_plugin(GearFlowCoordinator())
    client.register_plugin(GearFlowWorker())
    client.register_plugin(GearFlowDashboard())  # the /gear-flow dashboard page (where there is a dashboard)
    if workers is None and resources is not None:
        workers = workers_with_resource(client, resources)
    addrs = placement_workers(client, workers)
    placement = {i: addrs[i % len(addrs)] for i in range(spec.num_shards)}
    name = name or f"table-{uuid.uuid4().hex[:8]}"
    # host and pinned rings go to shared memory (pinned: page-locked there, read by the host's GPUs)
    shared = bool(config_get("distributed.shared-memory")) and getattr(cfg.tier, "name", cfg.tier) in (
        "host",
        "pinned",
    )
    config = {
        **cfg.to_dict(),
        "degraded": bool(degraded),
        "resources": resources,
        "rebalance_on_join": bool(rebalance_on_join),
        "shared_memory": shared,
        "tcp_lane": bool(config_get("distributed.tcp-lane")),
    }
    if path is not None:  # one root for every worker; without it each worker reads its own gear-flow.disk.path
        config["disk_path"] = str(Path(path).absolute())
    ctx = Context(client=client)

    async def setup():
        by_worker = defaultdict(list)
        for s, a in placement.items():
            by_worker[a].append(s)
        coordinator = CoordinatorClient(ctx, name)
        # the name first: a live table's is refused before any worker builds (a disk table's worker would find
        # the files of the table it names); from then on a failure takes back everything, everywhere
        args = {a: {"config": config, "shard_ids": ids} for a, ids in by_worker.items()}
        return await build_everywhere(
            ctx, name, lambda: coordinator.register(config, placement), "create", args, f"table {name!r} was created",
            coordinator.lookup,
        )  # fmt: skip

    state = ctx.sync(setup)
    return cls(ctx, name, state, seed=seed)


def queue(cls: type[DistributedTable], client: Client, spec: TableSpec, size: int, **kw: Any) -> DistributedTable:
    """A FIFO queue of ``size`` items over the workers: each handed out once, in insertion order.

    Sets ``sampler`` and ``remover`` to ``Fifo()``, ``max_times_sampled``
    to 1 and the rate limiter to ``Queue(size)``: samples block while the
    queue is empty, inserts while it is full.

    Parameters
    ----------
    cls : type of DistributedTable
        The class of the handle made (on the classmethod of
        :class:`~gear_flow.distributed.DistributedTable`: the class it is
        called on).
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
    return create(cls, client, spec, **args, **kw)


def stack(cls: type[DistributedTable], client: Client, spec: TableSpec, size: int, **kw: Any) -> DistributedTable:
    """A LIFO stack of ``size`` items over the workers: each handed out once, newest first.

    As :meth:`queue`, with ``Lifo()`` selectors and a ``Stack(size)``
    limiter.

    Parameters
    ----------
    cls : type of DistributedTable
        The class of the handle made (on the classmethod of
        :class:`~gear_flow.distributed.DistributedTable`: the class it is
        called on).
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
    return create(cls, client, spec, **args, **kw)


def attach(
    cls: type[DistributedTable],
    name: str,
    client: Client | None = None,
    seed: int | None = None,
    timeout: float | None = None,
) -> DistributedTable:
    """A handle on an existing table: from ``client``, or (default) from the worker running this task.

    Inside a task, the handle reads the shards of its own worker
    in-process (no copy) and only remote shards' windows cross the comm.

    Parameters
    ----------
    cls : type of DistributedTable
        The class of the handle made (on the classmethod of
        :class:`~gear_flow.distributed.DistributedTable`: the class it is
        called on).
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
    check_section("distributed")
    seeded_rng(seed)
    if client is None:
        from distributed import get_worker

        ctx = Context(worker=get_worker())
    else:
        ctx = Context(client=client)

    async def look():
        return await CoordinatorClient(ctx, name).lookup()

    return cls(ctx, name, ctx.sync(look), seed=seed, timeout=timeout)


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
