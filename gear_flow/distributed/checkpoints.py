"""Checkpoints of a distributed table: per-worker snapshots, restores onto any workers, lost-shard restores.

A ``disk`` table is its own checkpoint: :func:`flush` with ``disk=True`` makes
its shards' files durable, and :func:`restore_shard` given the table's
directory reopens a lost shard's files in place on a worker that sees them
(:mod:`~gear_flow.distributed.host_disk`, the workers' side).

Functions over the handle they are given (:func:`checkpoint`, :func:`flush`,
:func:`restore_shard` and their ``*_async`` twins), or over the handle's class
(:func:`restore`, which makes a new handle); the handle's methods of the same
names call them.  They need all of the handle: its name and configuration, the
placement and lost shards as it last saw them (refreshed as they go), and its
requests to the workers and the coordinator.
"""

from __future__ import annotations

import asyncio
import math
import os
import uuid
from collections import defaultdict
from collections.abc import Iterable
from typing import TYPE_CHECKING

from ..config import check_section
from ..dashboard import GearFlowDashboard
from ..errors import ShardLostError, SpecError, TableClosedError
from ..registry_share import share as share_registrations
from ..resources import placement_workers
from ..table.config import TableConfig
from ..table.routing import check_shard
from ..table.validate import seeded_rng
from .coordinator import GearFlowCoordinator
from .pending import send_pending
from .plugin import GearFlowWorker
from .transport import Context, CoordinatorClient, Retry, build_everywhere, ended_before_cancel, through_cancel

#: workers a checkpoint may lose (degraded table) before it gives up
_LOSSES = 8

if TYPE_CHECKING:
    from pathlib import Path

    from distributed import Client

    from .api import DistributedTable


def checkpoint(table: DistributedTable, path: str | os.PathLike[str]) -> dict:
    """Atomic, checksummed checkpoint of every live shard into directory ``path``.

    Each worker snapshots its shards under their locks (the only pause: a
    memory copy) and writes them while sampling and inserting continue;
    the coordinator's episode id and stamp counters are recorded after the
    snapshots so that restored tables never reuse them, and the sizes are
    the snapshots' own (inserts go on meanwhile).  The directory appears only
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
        wall time of the whole checkpoint), ``bytes`` (int, array bytes
        written, summed over the shards' files, as
        :meth:`LocalTable.checkpoint <gear_flow.LocalTable.checkpoint>`
        counts them) and ``shards`` (sorted list of the shard ids written).

    Raises
    ------
    CheckpointError
        ``path`` cannot be written.
    ShardLostError
        The table is not ``degraded`` and has lost shards (a checkpoint of
        it without them could never be restored), or a worker was lost
        while writing (a degraded table marks its shards lost and writes the
        checkpoint again, of the shards left).
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
                # a cancel waits for the workers' writes: the directory is removed below, not under them
                res = await ended_before_cancel(
                    table._link.on_workers(
                        {a: ("checkpoint", dict(name=table.name, directory=str(tmp))) for a in table._view.workers()}
                    )
                )
                break
            except Retry:  # degraded: a worker was lost while writing (its shards now marked lost): the
                # checkpoint is written again, of the shards left, into a new directory
                ck.discard(tmp)
                tmp = ck.temp_dir(final)
        else:
            raise ShardLostError(-1, f"{_LOSSES} workers of table {table.name!r} were lost during its checkpoint")
        files = {str(s): e for r in res.values() for s, e in r.items()}
        st = await table._link.coordinator.lookup()
        if st["lost"] and not table.degraded:
            # restore() refuses a checkpoint without every shard of a table that is not degraded: writing one
            # here would report success for a directory that can never be restored
            lost = sorted(int(s) for s in st["lost"])
            raise ShardLostError(
                lost[0], f"table {table.name!r} lost shard(s) {lost}; its checkpoint needs every shard"
            )
        cfg = {**table._config, "rate_limiter": st["rate_limiter_config"]}
        state = {k: st[k] for k in ("next_episode_id", "next_stamp")}  # past every id and stamp snapshotted
        # what each snapshot holds and had received, not the coordinator's counts now (inserts went on meanwhile:
        # a restored coordinator counting them held more than its shards, and evicted to max_size too early)
        state["shard_size"] = {s: int(e["meta"]["size"]) for s, e in files.items()}
        state["shard_inserted"] = {str(k): v for k, v in st["shard_inserted"].items()}
        state["shard_inserted"].update((s, int(e["meta"]["counters"]["inserted"])) for s, e in files.items())
        state["size"] = sum(state["shard_size"].values())
        nbytes = sum(_array_bytes(tmp / e["file"]) for e in files.values())
        ck.commit(tmp, final, ck.new_manifest("distributed", cfg, state, files))
    except BaseException:
        ck.discard(tmp)
        raise
    pause = max((e["pause_s"] for e in files.values()), default=0.0)
    return {
        "path": str(final),
        "pause_s": pause,
        "seconds": time.perf_counter() - t0,
        "bytes": nbytes,
        "shards": sorted(int(k) for k in files),
    }


def _array_bytes(path: Path) -> int:
    """The bytes of the arrays in one shard file, read from their ``.npy`` headers alone.

    The workers wrote the files and report no size; the client sees them (it commits the
    directory), and the headers give what a local checkpoint counts (array bytes, not the
    file's) without reading the data back.
    """
    import zipfile

    import numpy as np

    fmt = np.lib.format
    total = 0
    with zipfile.ZipFile(path) as z:
        for member in z.namelist():
            with z.open(member) as f:
                version = fmt.read_magic(f)
                # 3.0 differs from 2.0 only in its header's text encoding (UTF-8 field names)
                read = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
                shape, _, dtype = read(f)
                total += math.prod(shape) * dtype.itemsize
    return total


def flush(table: DistributedTable, disk: bool = False) -> dict | None:
    """Send what this handle keeps for the shards now; with ``disk``, then make a disk table's files durable.

    Sends stored priority updates (``update_priorities(wait=False)``) and
    the samples drawn here from published states to their owners, and
    reports samples served under a lease to the coordinator (``info()``
    then counts them).

    ``disk=True`` is a ``disk`` table's checkpoint: every shard's worker
    writes its dirty pages, records the checksums of what changed since its
    last flush and commits its header, fsync'ed (one shard at a time under
    its lock; the others serve on), as :meth:`LocalTable.flush
    <gear_flow.LocalTable.flush>` does.  Without it what a shard committed
    survives its worker's process (the page cache keeps it), not its
    machine.  Lost shards are not flushed.

    Parameters
    ----------
    table : DistributedTable
        The handle on the table (the handle itself, on its method of this
        name).
    disk : bool, default False
        Also make the shards' files durable (a ``disk`` table only).

    Returns
    -------
    dict or None
        None without ``disk``; with it ``seconds`` (float, wall time),
        ``bytes_checksummed`` (int) and ``shards`` (sorted ids flushed).

    Raises
    ------
    SpecError
        ``disk`` and the table is not on the ``disk`` tier.
    ShardLostError
        ``disk``, and a worker was lost meanwhile (a degraded table flushes
        the shards left).
    """
    from .sampling import flush as send

    if disk and table._config.get("tier") != "disk":
        raise SpecError(
            f"flush(disk=True) is for disk tables; table {table.name!r} is on the {table._config.get('tier')!r} tier "
            "(see checkpoint())"
        )
    send(table)
    return table._ctx.sync(flush_disk_async, table) if disk else None


async def flush_disk_async(table: DistributedTable) -> dict:
    """Make every live shard of a ``disk`` table durable (:meth:`flush` with ``disk=True``, the files only).

    Parameters
    ----------
    table : DistributedTable
        The handle on the table.

    Returns
    -------
    dict
        As :meth:`flush` with ``disk``.

    Raises
    ------
    SpecError
        The table is not on the ``disk`` tier.
    ShardLostError
        A worker was lost and the table is not degraded.
    """
    import time

    t0 = time.perf_counter()
    for _ in range(_LOSSES):
        try:
            res = await table._link.on_workers(
                {a: ("flush_disk", dict(name=table.name)) for a in table._view.workers()}
            )
            break
        except Retry:  # degraded, a worker lost (its shards marked lost), or shards moved: the shards as now
            continue
    else:
        raise ShardLostError(-1, f"{_LOSSES} workers of table {table.name!r} were lost during its flush")
    per = {int(s): n for r in res.values() for s, n in r.items()}
    return {"seconds": time.perf_counter() - t0, "bytes_checksummed": sum(per.values()), "shards": sorted(per)}


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
    check_section("distributed")
    seeded_rng(seed)
    try:  # the handle is built from it here: a configuration this process cannot build (a selector whose kind
        TableConfig.from_dict(cfg)  # it has not registered) is refused before the cluster builds the table
    except SpecError:  # (naming the unknown kind)
        raise
    except (KeyError, TypeError, ValueError) as e:
        from ..errors import CheckpointError

        raise CheckpointError(f"{path}: the manifest does not describe a table ({e})") from None
    share_registrations(client)
    client.register_plugin(GearFlowCoordinator())
    client.register_plugin(GearFlowWorker())
    client.register_plugin(GearFlowDashboard())
    addrs = placement_workers(client, workers)
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
        by_worker = defaultdict(dict)
        for s in shard_ids:
            by_worker[placement[s]][s] = m["files"][str(s)]

        async def counters():
            await coordinator.restore_state(m["state"])
            for s in missing:
                await coordinator.mark_lost(s, "lost before the checkpoint was taken")
            return await coordinator.lookup()

        # the name first: the coordinator refuses a live table's before any worker loads (and replaces) its
        # shards; from then on a failure takes back everything, from the workers and the coordinator
        args = {a: {"config": cfg, "directory": str(path), "files": f} for a, f in by_worker.items()}
        return await build_everywhere(
            ctx, name, lambda: coordinator.register(cfg, placement), "restore", args, "the checkpoint was restored",
            counters,
        )  # fmt: skip

    return cls(ctx, name, ctx.sync(go), seed=seed, timeout=timeout)


def restore_shard(
    table: DistributedTable, shard: int, path: str | os.PathLike[str], worker: str | None = None, replace: bool = False
) -> dict:
    """Rebuild shard ``shard`` from checkpoint ``path`` on ``worker``, or reopen a lost disk shard's files in place.

    A lost shard is restored; a live one is refused unless ``replace=True``
    (its items since the checkpoint would be dropped), and then replaced
    without leaving its old copy behind.  The shard comes back as it was
    at the checkpoint: items it expired, removed or evicted since then are
    back too (a queue hands out again what that shard handed out since
    the checkpoint: at least once, not exactly once, across a restore).

    A ``disk`` table is its own checkpoint: given the directory of its
    files (``<root>/<name>``, or the shard's own ``<root>/<name>/shard-<id>``,
    as ``worker`` sees it; a path with no checkpoint ``manifest.json`` as
    this process sees it), ``worker`` reopens the lost shard's files in
    place, copying nothing, with every insert the shard committed before its
    worker was lost (an insert cut short is dropped, with the episodes it
    was overwriting).  The files are checked first (layout, header,
    sizes; that they are this shard of this table); nothing is hosted and
    the shard stays lost when a check fails.  A live disk shard is never
    reopened (its worker maps those files): restore a checkpoint to replace
    it.

    Parameters
    ----------
    table : DistributedTable
        The handle on the table (the handle itself, on its method of this
        name).
    shard : int
        Id of the shard to rebuild.
    path : str or os.PathLike
        A checkpoint of this table (from :meth:`checkpoint`), visible to
        the workers, or a disk table's directory (see above).
    worker : str, optional
        Address of the worker to rebuild it on; default the least loaded
        live worker that may hold the table (its resource, if it was
        created with one), empty workers included.  An in-place reopen
        needs a worker that sees the files: on their machine.
    replace : bool, default False
        Allow replacing a shard that is alive.

    Returns
    -------
    dict
        ``shard``, ``worker`` (where it now lives), ``items_restored``,
        ``inserted_at_checkpoint`` (of a reopened shard: its inserts in
        its files); for a lost shard also ``inserted_at_loss`` and
        ``lost_items`` (inserted after the checkpoint, gone; 0 for a
        reopened shard unless an insert was cut short by the loss); for a
        replaced one ``dropped_items`` (what it held) and
        ``inserted_since_checkpoint``; for a reopened one ``reopened_s``
        (seconds the worker took to check and reopen the files),
        ``recovered`` (what reopening repaired, as
        :attr:`DiskStore.recovered <gear_flow.storage.disk_state.DiskStore.recovered>`)
        and ``directory`` (the shard's, as the worker sees it).

    Raises
    ------
    CheckpointError
        ``path`` holds no checkpoint or its file fails verification; for
        a disk table, no files of the shard where the worker looked, or
        files that fail a check.
    ShardLostError
        The checkpoint has no file for ``shard``, or no live worker can
        take it.
    SpecError
        The table has no shard ``shard``, or it is alive and ``replace``
        is False (a live disk shard: whatever ``replace``, for its files).
    TableClosedError
        The table is closed (``close(drop=False)``).
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


async def _shard_now(table: DistributedTable, shard: int) -> tuple[str, dict | None]:
    """Where ``shard`` is placed, and its worker's info on it while it is alive (None: lost)."""
    await table._link.refresh()
    if shard not in table.placement:
        raise SpecError(f"table {table.name!r} has no shard {shard} (shards 0..{table.spec.num_shards - 1})")
    old = table.placement[shard]
    if shard in table.lost:
        return old, None
    try:
        infos = (await table._link.on_workers({old: ("info", dict(name=table.name))}))[old]
    except (Retry, ShardLostError):  # its worker was lost just now (the shard is marked lost): restored as a lost one
        return old, None
    return old, next(i for i in infos if i["shard"] == shard)


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
        A checkpoint of this table, or a disk table's directory.
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
    shard = check_shard(shard, table.spec.num_shards)  # (not True for 1, nor 7 of 2 reported as a missing file)
    # one restore of a shard at a time in this process: a restore interrupted once begun goes on to its end in
    # the background, and the next one (the caller trying again) planned against the placement before it, so
    # that each dropped the other's copy or counted it beside its own
    lock = _RESTORING.setdefault((id(asyncio.get_running_loop()), table._ctx.scheduler.address, table.name, shard),
                                 asyncio.Lock())  # fmt: skip
    await lock.acquire()
    try:
        step = await _restore_shard_step(table, shard, path, worker, replace)
    except BaseException:
        lock.release()
        raise
    step.add_done_callback(lambda _: lock.release())  # (held to the restore's end, through a cancel of its caller)
    return await through_cancel(step)


#: (loop, scheduler, table, shard) -> the lock a restore of that shard holds to its end
_RESTORING: dict[tuple, asyncio.Lock] = {}


async def _restore_shard_step(
    table: DistributedTable, shard: int, path: str | os.PathLike[str], worker: str | None, replace: bool
) -> asyncio.Future:
    """:func:`restore_shard_async`'s checks and plan, then its step on the workers begun: the future of its
    report."""
    from pathlib import Path

    from .. import checkpoint as ck

    if (await table._link.coordinator.lookup()).get("closed"):  # the new copy would serve the data path open
        raise TableClosedError(f"table {table.name!r} is closed; restore_shard is refused (restore it as a new table)")
    if worker is not None and not isinstance(worker, str):
        raise SpecError(f"worker ({worker!r}) must be a worker's address or None")
    path = Path(path).absolute()
    # a disk table's own files: no manifest (a disk table's directory on a worker need not be visible here)
    in_place = table._config.get("tier") == "disk" and not (path / "manifest.json").exists()
    if not in_place:
        entry = ck.read_manifest(path)["files"].get(str(shard))
        if entry is None:
            raise ShardLostError(shard, f"checkpoint {path} has no file for shard {shard}")
    old, before = await _shard_now(table, shard)
    live = before is not None
    if live and in_place:
        raise SpecError(
            f"shard {shard} of table {table.name!r} is alive on {old}, which maps its files; reopening them is for "
            "a lost shard (restore a checkpoint with replace=True to replace a live one)"
        )
    if live and not replace:
        raise SpecError(
            f"shard {shard} of table {table.name!r} is alive on {old} with {before['size']} items; restoring it "
            "would drop what was inserted since the checkpoint; pass replace=True (CLI: --replace) to replace it"
        )
    if worker is None:
        worker = await _restore_target(table)
    if in_place:
        op, args = "reopen", dict(name=table.name, config=table._config, directory=str(path), shard=shard)
    else:
        op, args = "restore", dict(name=table.name, config=table._config, directory=str(path), files={shard: entry})

    async def rebuilt() -> dict:
        """The shard rebuilt on ``worker``, the coordinator told, the replaced copy dropped, and the report: begun
        on the worker, it goes to its end through a cancel (a cancel between its steps left the coordinator
        counting what the shard held before, or the replaced copy on its old worker counted beside the new one)."""
        try:
            done = (await table._link.on_workers({worker: (op, args)}))[worker]
        except (Retry, ShardLostError):  # the target was lost before it could report the shard rebuilt
            raise ShardLostError(
                shard, f"worker {worker} was lost while it restored shard {shard}; nothing was restored"
            ) from None
        if in_place:  # nothing committed is lost: the shard's own counters are what it holds
            items, inserted = int(done["size"]), int(done["inserted"])
        else:
            items, inserted = done[shard], entry["meta"]["counters"]["inserted"]
        lost = await table._link.coordinator.shard_restored(shard, worker, items, inserted)
        await table._link.refresh()  # the shard is the new worker's now, whatever happens to the old one
        if live and worker != old:  # the replaced copy must not stay behind on its old worker ...
            _, errors = await table._link.on_workers(
                {old: ("drop_shard", dict(name=table.name, shard=shard, epoch=table._view.version))}, partial=True
            )
            errors = [e for e in errors if not isinstance(e, (Retry, ShardLostError))]  # ... unless gone with it
            if errors:
                raise errors[0]
        report = {"shard": shard, "worker": worker, "items_restored": items, "inserted_at_checkpoint": inserted}
        if in_place:
            report.update(reopened_s=done["seconds"], recovered=done["recovered"], directory=done["directory"])
        if lost:
            report["inserted_at_loss"] = lost["inserted_at_loss"]
            report["lost_items"] = lost["inserted_at_loss"] - inserted
        if before is not None:
            report["dropped_items"] = before["size"]
            report["inserted_since_checkpoint"] = before["inserted"] - inserted
        return report

    return asyncio.ensure_future(rebuilt())
