"""Reading a table's episodes where they are: per-shard functions and one executor over local or remote shards.

Everything here that touches a shard runs in the shard's own process: in the
caller's for a :class:`~gear_flow.LocalTable`, in a task pinned to the worker
hosting the shard for a :class:`~gear_flow.distributed.DistributedTable`
(``workers=[addr], allow_other_workers=False``; the shard is found through the
worker's ``gear-flow`` plugin, as ingestion's read-back does).  Only what the
per-shard function returns travels: a frame of per-episode metadata, a small
write report; never the steps themselves.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike

from .. import keys as keymod
from ..errors import ShardLostError

if TYPE_CHECKING:
    from distributed import Future

    from ..distributed.api import DistributedTable
    from ..shard import Shard
    from ..table.local import LocalTable

#: what :func:`submit_per_worker` and :func:`run_on_shards` run: ``fn({shard id: Shard}, *args)``
ShardFn = Callable[..., Any]
#: ``args_of(worker address or None, shard ids) -> args`` for one call of a :data:`ShardFn`
ArgsOf = Callable[[str | None, list[int]], Sequence[Any]]

#: per-episode metadata columns of :func:`episode_table` (and of ``episodes(table)``)
META = {
    "episode_id": np.int64,
    "source_id": np.int64,
    "shard": np.int64,
    "length": np.int64,
    "return": np.float64,
    "first_key": np.int64,
    "stamp": np.int64,
    "times_sampled": np.int64,
    "mean_priority": np.float64,
}


def read_episodes(
    shard: Shard, ids: ArrayLike | None = None, names: Sequence[str] | None = None
) -> list[tuple[int, dict[str, np.ndarray]]]:
    """A shard's live episodes, copied out under its lock, oldest first.

    Parameters
    ----------
    shard : Shard
        An in-process shard.
    ids : array_like of int, optional
        Table episode ids to read (those not in the shard are skipped); None: all.
    names : sequence of str, optional
        Columns to read (default: every column of the table).

    Returns
    -------
    list of (int, dict of str to numpy.ndarray)
        ``(episode_id, {column: array copy})``.
    """
    names = shard.spec.names if names is None else names
    with shard.lock:
        seqs = shard.index.live()
        eids = shard.index.get("episode_id", seqs)
        if ids is not None:
            keep = np.isin(eids, np.asarray(ids, dtype=np.int64))
            seqs, eids = seqs[keep], eids[keep]
        starts = shard.index.get("start", seqs)
        lengths = shard.index.get("length", seqs)
        out = [
            (int(e), {n: np.array(shard.ring.read(n, int(a), int(t))) for n in names})
            for e, a, t in zip(eids, starts, lengths)
        ]
    return out


def episode_table(shard: Shard, shard_id: int, sources: Mapping[int, Any] | None = None) -> dict[str, np.ndarray]:
    """Per-episode metadata of one shard, as NumPy columns (see :data:`META`).

    Parameters
    ----------
    shard : Shard
        An in-process shard.
    shard_id : int
        Its id in the table (for ``shard`` and ``first_key``).
    sources : mapping of int to int, optional
        ``{episode_id: source id}`` (e.g. ``IngestReport.source_map()``) for
        the ``source_id`` column; -1 for episodes not in it.

    Returns
    -------
    dict of str to numpy.ndarray
        The :data:`META` columns, one row per live episode: ``return`` is the
        float64 sum of the ``reward`` column (NaN without one);
        ``times_sampled`` is -1 unless the table counts samples
        (``max_times_sampled``); ``mean_priority`` averages the episode's
        active items (NaN when none is active any more).
    """
    with shard.lock:
        seqs = shard.index.live()
        eids = shard.index.get("episode_id", seqs)
        starts = shard.index.get("start", seqs)
        lengths = shard.index.get("length", seqs)
        stamps = shard.index.get("stamp", seqs)
        cap = shard.capacity
        rets = np.full(len(seqs), np.nan)
        prio = np.full(len(seqs), np.nan)
        times = np.full(len(seqs), -1, dtype=np.int64)
        for j, (a, t) in enumerate(zip(starts, lengths)):
            if "reward" in shard.spec.names:
                rets[j] = float(np.sum(shard.ring.read("reward", int(a), int(t)), dtype=np.float64))
            slots = (int(a) + np.arange(int(t))) % cap if shard.step_items else np.array([seqs[j] % cap])
            act = shard.active[slots] == 1
            if act.any():
                prio[j] = float(shard.priority[slots][act].mean())
            if shard.times_sampled is not None:
                times[j] = int(shard.times_sampled[slots].sum())
        first = keymod.encode(shard_id, starts if shard.step_items else seqs)
    src = sources or {}
    return {
        "episode_id": eids.astype(np.int64),
        "source_id": np.array([int(src.get(int(e), -1)) for e in eids], dtype=np.int64),
        "shard": np.full(len(seqs), shard_id, dtype=np.int64),
        "length": lengths.astype(np.int64),
        "return": rets,
        "first_key": first.astype(np.int64),
        "stamp": stamps.astype(np.int64),
        "times_sampled": times,
        "mean_priority": prio,
    }


# -- one executor: a function over {shard id: Shard}, in-process or on each shard's worker -------------


def is_local(table: LocalTable | DistributedTable) -> bool:
    """Is ``table`` an in-process :class:`~gear_flow.LocalTable` (rather than a distributed one)?

    Parameters
    ----------
    table : LocalTable or DistributedTable
        The table.

    Returns
    -------
    bool
        True for a local table.
    """
    from ..table.local import LocalTable

    return isinstance(table, LocalTable)


def live_shards_by_worker(table: DistributedTable) -> dict[str, list[int]]:
    """Where a distributed table's live shards are.

    Parameters
    ----------
    table : DistributedTable
        The table (its ``placement`` and ``lost`` as this handle knows them).

    Returns
    -------
    dict of str to list of int
        ``{worker address: [shard ids]}``, lost shards left out.

    Raises
    ------
    ShardLostError
        Every shard is lost.
    """
    by = defaultdict(list)
    for s, a in sorted(table.placement.items()):
        if s not in table.lost:
            by[a].append(int(s))
    if not by:
        raise ShardLostError(-1, f"table {table.name!r} has no live shard")
    return dict(by)


def _on_worker(name: str, shard_ids: list, fn, args: tuple):
    from distributed import get_worker

    from ..distributed.plugin import PLUGIN_NAME

    host = get_worker().plugins[PLUGIN_NAME].host
    return fn({int(s): host.shard(name, s) for s in shard_ids}, *args)


def submit_per_worker(
    table: DistributedTable, fn: ShardFn, args_of: ArgsOf | None = None, tag: str = "task"
) -> dict[str, Future]:
    """Run ``fn`` once on each worker hosting live shards, over that worker's shards.

    Parameters
    ----------
    table : DistributedTable
        The table.
    fn : callable
        ``fn({shard id: Shard}, *args)``, run in a task pinned to the worker
        (it must be picklable; its result stays there as the future's).
    args_of : callable, optional
        ``args_of(address, shard ids) -> args`` for each worker (default: no args).
    tag : str, default "task"
        Part of the task keys (``gear-flow-<tag>-<token>-<address>``), for the dashboard.

    Returns
    -------
    dict of str to distributed.Future
        ``{worker address: future of fn's result}``.
    """
    token = uuid.uuid4().hex[:8]
    out = {}
    for a, shard_ids in live_shards_by_worker(table).items():
        args = () if args_of is None else tuple(args_of(a, shard_ids))
        out[a] = table.client.submit(
            _on_worker,
            table.name,
            shard_ids,
            fn,
            args,
            workers=[a],
            allow_other_workers=False,
            pure=False,
            key=f"gear-flow-{tag}-{token}-{a}",
        )
    return out


def run_on_shards(
    table: LocalTable | DistributedTable, fn: ShardFn, args_of: ArgsOf | None = None, tag: str = "task"
) -> dict[str | None, Any]:
    """Run ``fn`` where the shards are and gather the results.

    Parameters
    ----------
    table : LocalTable or DistributedTable
        The table: a local one's shards are passed to one in-process call.
    fn : callable
        ``fn({shard id: Shard}, *args)``.
    args_of : callable, optional
        ``args_of(address, shard ids) -> args`` (address None for a local table).
    tag : str, default "task"
        As for :func:`submit_per_worker`.

    Returns
    -------
    dict of (str or None) to object
        ``{worker address: fn's result}``, or ``{None: result}`` for a local table.
    """
    if is_local(table):
        shards = dict(enumerate(table.shards))
        args = () if args_of is None else tuple(args_of(None, list(shards)))
        return {None: fn(shards, *args)}
    futs = submit_per_worker(table, fn, args_of, tag)
    return dict(zip(futs, table.client.gather(list(futs.values()))))
