"""Checkpoints of a distributed table: per-worker snapshots, restores onto any workers, lost-shard restores.

Functions over the handle they are given (:func:`checkpoint`,
:func:`restore_shard` and their ``*_async`` twins), or over the handle's class
(:func:`restore`, which makes a new handle); the handle's methods of the same
names call them.  They need all of the handle: its name and configuration, the
placement and lost shards as it last saw them (refreshed as they go), and its
requests to the workers and the coordinator.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import uuid
from collections import defaultdict
from collections.abc import Iterable
from typing import TYPE_CHECKING

from ..dashboard import GearFlowDashboard
from ..errors import ShardLostError, SpecError
from ..registry_share import share as share_registrations
from ..resources import advertised
from .coordinator import GearFlowCoordinator
from .pending import send_pending
from .plugin import GearFlowWorker
from .transport import Context, CoordinatorClient, Retry, WorkerLost, call

#: workers a checkpoint may lose (degraded table) before it gives up
_LOSSES = 8

if TYPE_CHECKING:
    from distributed import Client

    from .api import DistributedTable


def checkpoint(table: DistributedTable, path: str | os.PathLike[str]) -> dict:
    """Atomic, checksummed checkpoint of every live shard into directory ``path``.

    Each worker snapshots its shards under their locks (the only pause: a
    memory copy) and writes them while sampling and inserting continue;
    the coordinator's counters are recorded after the snapshots so that
    restored tables never reuse episode ids.  The directory appears only
    once complete (written to a temporary sibling, then renamed); on
    failure nothing is left behind.  Lost shards are not in it.

    Parameters
    ----------
    table : DistributedTable
        The handle on the table (the handle itself, on its method of this
        name).
    path : str or os.PathLike
        Directory to create; must be visible to the workers (a shared
        filesystem; any local path for a ``LocalCluster``).

    Returns
    -------
    dict
        ``path`` (str, absolute), ``pause_s`` (float, the longest time
        one shard was held for its snapshot, seconds), ``seconds`` (float,
        wall time of the whole checkpoint) and ``shards`` (sorted list of
        the shard ids written).

    Raises
    ------
    CheckpointError
        ``path`` cannot be written.
    ShardLostError
        A worker was lost while writing and the table is not ``degraded``
        (a degraded table marks its shards lost and writes the checkpoint
        again, of the shards left).
    """
    return table._ctx.sync(checkpoint_async, table, path)


async def checkpoint_async(table: DistributedTable, path: str | os.PathLike[str]) -> dict:
    """:meth:`checkpoint` for a caller inside the event loop.

    Parameters
    ----------
    table : DistributedTable
        The handle on the table (the handle itself, on its method of this
        name).
    path : str or os.PathLike
        Directory to create, visible to the workers.

    Returns
    -------
    dict
        As :meth:`checkpoint`.

    Raises
    ------
    CheckpointError, ShardLostError
        As :meth:`checkpoint`.
    """
    import time
    from pathlib import Path

    from .. import checkpoint as ck

    t0 = time.perf_counter()
    await send_pending(table)  # this handle's stored priority updates belong in the checkpoint
    final = Path(path).absolute()
    tmp = ck.temp_dir(final)
    try:
        for _ in range(_LOSSES):
            try:
                res = await table._link.on_workers(
                    {a: ("checkpoint", dict(name=table.name, directory=str(tmp))) for a in table._view.workers()}
                )
                break
            except Retry:  # degraded: a worker was lost while writing (its shards now marked lost): the
                # checkpoint is written again, of the shards left, into a new directory
                shutil.rmtree(tmp, ignore_errors=True)
                tmp = ck.temp_dir(final)
        else:
            raise ShardLostError(-1, f"{_LOSSES} workers of table {table.name!r} were lost during its checkpoint")
        files = {str(s): e for r in res.values() for s, e in r.items()}
        st = await table._link.coordinator.lookup()
        cfg = {**table._config, "rate_limiter": st["rate_limiter_config"]}
        state = {k: st[k] for k in ("size", "shard_size", "shard_inserted", "next_episode_id", "next_stamp")}
        state["shard_size"] = {str(k): v for k, v in state["shard_size"].items() if int(k) not in table.lost}
        state["shard_inserted"] = {str(k): v for k, v in state["shard_inserted"].items()}
        state["size"] = sum(state["shard_size"].values())
        ck.commit(tmp, final, ck.new_manifest("distributed", cfg, state, files))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    pause = max((e["pause_s"] for e in files.values()), default=0.0)
    return {
        "path": str(final),
        "pause_s": pause,
        "seconds": time.perf_counter() - t0,
        "shards": sorted(int(k) for k in files),
    }


def restore(
    cls: type[DistributedTable],
    client: Client,
    path: str | os.PathLike[str],
    *,
    name: str | None = None,
    workers: Iterable[str] | None = None,
    seed: int | None = None,
    timeout: float | None = None,
) -> DistributedTable:
    """A table rebuilt from a checkpoint onto ``workers`` (default: all; any number, any addresses).

    Every shard file is verified (SHA-256, format version, spec) by the worker
    that loads it before anything is built.  The configuration, limiter
    state and counters are those of the checkpoint, so episode ids and
    keys are never reused.

    Parameters
    ----------
    cls : type of DistributedTable
        The class of the handle made (on the classmethod of
        :class:`~gear_flow.distributed.DistributedTable`: the class it is
        called on).
    client : distributed.Client
        Client of the cluster to restore onto.
    path : str or os.PathLike
        A directory written by :meth:`checkpoint`, visible to the workers.
    name : str, optional
        Name of the restored table; default a fresh ``"table-<hex>"``.
    workers : iterable of str, optional
        Worker addresses to place the shards on, round-robin; default
        every worker.
    seed : int, optional
        Seeds the returned handle's random generator.
    timeout : float, optional
        Default seconds a blocking call of the handle waits; None: the
        checkpointed table's.

    Returns
    -------
    DistributedTable
        A handle on the restored table.

    Raises
    ------
    CheckpointError
        ``path`` holds no checkpoint, a local table's checkpoint, or a
        file that fails verification.
    ShardLostError
        A worker was lost while it loaded its shards.  Either way nothing
        of the restore is left on any worker.
    SpecError
        A live table has that name (refused before any worker loads).
    """
    from pathlib import Path

    from .. import checkpoint as ck

    path = Path(path).absolute()
    m = ck.read_manifest(path)
    if m.get("kind") != "distributed":
        from ..errors import CheckpointError

        raise CheckpointError(f"{path} holds a {m.get('kind')!r} checkpoint; use LocalTable.restore")
    cfg = m["table"]
    share_registrations(client)
    client.register_plugin(GearFlowCoordinator())
    client.register_plugin(GearFlowWorker())
    client.register_plugin(GearFlowDashboard())
    addrs = list(workers) if workers is not None else sorted(advertised(client))
    shard_ids = sorted(int(k) for k in m["files"])
    # shards lost when a degraded table was checkpointed: restored lost too (restore_shard rebuilds them)
    missing = sorted(set(range(int(cfg["spec"]["num_shards"]))) - set(shard_ids))
    if missing and not cfg.get("degraded"):
        from ..errors import CheckpointError

        raise CheckpointError(f"{path} has no file for shard(s) {missing} and its table is not degraded")
    placement = {s: addrs[j % len(addrs)] for j, s in enumerate(shard_ids + missing)}
    name = name or f"table-{uuid.uuid4().hex[:8]}"
    ctx = Context(client=client)
    coordinator = CoordinatorClient(ctx, name)

    async def go():
        # the name first: the coordinator refuses a live table's before any worker loads (and replaces) its
        # shards; from then on a failure takes back everything, from the workers and the coordinator
        await coordinator.register(cfg, placement)
        by_worker = defaultdict(dict)
        for s in shard_ids:
            by_worker[placement[s]][s] = m["files"][str(s)]
        try:
            got = await asyncio.gather(
                *(
                    call(ctx, a, "restore", name=name, config=cfg, directory=str(path), files=f)
                    for a, f in by_worker.items()
                ),
                return_exceptions=True,
            )
            for r in got:
                if isinstance(r, WorkerLost):
                    raise ShardLostError(
                        -1, f"worker {r.addr} was lost while the checkpoint was restored; nothing of it was built"
                    ) from None
                if isinstance(r, BaseException):
                    raise r
            await coordinator.restore_state(m["state"])
            for s in missing:
                await coordinator.mark_lost(s, "lost before the checkpoint was taken")
        except BaseException:
            await asyncio.gather(*(call(ctx, a, "drop", name=name) for a in by_worker), return_exceptions=True)
            await asyncio.gather(coordinator.drop(), return_exceptions=True)
            raise
        return await coordinator.lookup()

    return cls(ctx, name, ctx.sync(go), seed=seed, timeout=timeout)


def restore_shard(
    table: DistributedTable, shard: int, path: str | os.PathLike[str], worker: str | None = None, replace: bool = False
) -> dict:
    """Rebuild shard ``shard`` from checkpoint ``path`` on ``worker``.

    A lost shard is restored; a live one is refused unless ``replace=True``
    (its items since the checkpoint would be dropped), and then replaced
    without leaving its old copy behind.  The shard comes back as it was
    at the checkpoint: items it expired, removed or evicted since then are
    back too (a queue hands out again what that shard handed out since
    the checkpoint: at least once, not exactly once, across a restore).

    Parameters
    ----------
    table : DistributedTable
        The handle on the table (the handle itself, on its method of this
        name).
    shard : int
        Id of the shard to rebuild.
    path : str or os.PathLike
        A checkpoint of this table (from :meth:`checkpoint`), visible to
        the workers.
    worker : str, optional
        Address of the worker to rebuild it on; default the least loaded
        live worker that may hold the table (its resource, if it was
        created with one), empty workers included.
    replace : bool, default False
        Allow replacing a shard that is alive.

    Returns
    -------
    dict
        ``shard``, ``worker`` (where it now lives), ``items_restored``,
        ``inserted_at_checkpoint``; for a lost shard also
        ``inserted_at_loss`` and ``lost_items`` (inserted after the
        checkpoint, gone); for a replaced one ``dropped_items`` (what it
        held) and ``inserted_since_checkpoint``.

    Raises
    ------
    CheckpointError
        ``path`` holds no checkpoint or its file fails verification.
    ShardLostError
        The checkpoint has no file for ``shard``, or no live worker can
        take it.
    SpecError
        The table has no shard ``shard``, or it is alive and ``replace``
        is False.
    """
    return table._ctx.sync(restore_shard_async, table, shard, path, worker, replace)


async def _restore_target(table: DistributedTable) -> str:
    workers = await table._link.coordinator.workers()
    resource = table._config.get("resources")
    if resource:
        workers = {a: r for a, r in workers.items() if (r or {}).get(resource, 0) > 0}
    if not workers:
        what = f" advertising resource {resource!r}" if resource else ""
        raise ShardLostError(-1, f"table {table.name!r}: no live worker{what} to restore onto")
    load = {a: 0 for a in workers}
    for s, a in table.placement.items():
        if s not in table.lost and a in load:
            load[a] += 1
    return min(load, key=lambda a: (load[a], a))


async def restore_shard_async(
    table: DistributedTable, shard: int, path: str | os.PathLike[str], worker: str | None = None, replace: bool = False
) -> dict:
    """:meth:`restore_shard` for a caller inside the event loop.

    Parameters
    ----------
    table : DistributedTable
        The handle on the table (the handle itself, on its method of this
        name).
    shard : int
        Id of the shard to rebuild.
    path : str or os.PathLike
        A checkpoint of this table.
    worker : str, optional
        Where to rebuild it; default the least loaded eligible worker.
    replace : bool, default False
        Allow replacing a live shard.

    Returns
    -------
    dict
        As :meth:`restore_shard`.

    Raises
    ------
    CheckpointError, ShardLostError, SpecError
        As :meth:`restore_shard`.
    """
    from pathlib import Path

    from .. import checkpoint as ck

    path = Path(path).absolute()
    m = ck.read_manifest(path)
    entry = m["files"].get(str(shard))
    if entry is None:
        raise ShardLostError(shard, f"checkpoint {path} has no file for shard {shard}")
    await table._link.refresh()
    if shard not in table.placement:
        raise SpecError(f"table {table.name!r} has no shard {shard} (shards 0..{table.spec.num_shards - 1})")
    live = shard not in table.lost
    old = table.placement[shard]
    before = None
    if live:
        try:
            before = next(
                i
                for i in (await table._link.on_workers({old: ("info", dict(name=table.name))}))[old]
                if i["shard"] == shard
            )
        except (Retry, ShardLostError):  # its worker was lost just now (the shard is marked lost): restored
            live, before = False, None  # as a lost one
    if live:
        if not replace:
            raise SpecError(
                f"shard {shard} of table {table.name!r} is alive on {old} with {before['size']} items; restoring it "
                "would drop what was inserted since the checkpoint; pass replace=True (CLI: --replace) to replace it"
            )
    if worker is None:
        worker = await _restore_target(table)
    args = dict(name=table.name, config=table._config, directory=str(path), files={shard: entry})
    try:
        restored = (await table._link.on_workers({worker: ("restore", args)}))[worker]
    except (Retry, ShardLostError):  # the target was lost before it could report the shard rebuilt
        raise ShardLostError(
            shard, f"worker {worker} was lost while it restored shard {shard}; nothing was restored"
        ) from None
    meta = entry["meta"]
    lost = await table._link.coordinator.shard_restored(shard, worker, restored[shard], meta["counters"]["inserted"])
    await table._link.refresh()  # the shard is the new worker's now, whatever happens to the old one
    if live and worker != old:  # the replaced copy must not stay behind on its old worker ...
        _, errors = await table._link.on_workers(
            {old: ("drop_shard", dict(name=table.name, shard=shard))}, partial=True
        )
        errors = [e for e in errors if not isinstance(e, (Retry, ShardLostError))]  # ... unless gone with it
        if errors:
            raise errors[0]
    report = {
        "shard": shard,
        "worker": worker,
        "items_restored": restored[shard],
        "inserted_at_checkpoint": meta["counters"]["inserted"],
    }
    if lost:
        report["inserted_at_loss"] = lost["inserted_at_loss"]
        report["lost_items"] = lost["inserted_at_loss"] - meta["counters"]["inserted"]
    if before is not None:
        report["dropped_items"] = before["size"]
        report["inserted_since_checkpoint"] = before["inserted"] - meta["counters"]["inserted"]
    return report
