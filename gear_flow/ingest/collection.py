"""Tables as Dask collections: ``episodes(table)`` as a dask.dataframe, ``select`` back into a table, collections in.

- :func:`episodes` — one partition per shard, computed on the worker that
  holds the shard (a pandas frame on CPU workers, cuDF on GPU-tier shards,
  through :func:`gear_flow.backend.frame_module`), of per-episode metadata
  (:data:`gear_flow.ingest.shards.META`).  Filter it with ordinary Dask code.
- :func:`select` — the episodes of such a frame (only its ``episode_id``
  column is computed) copied into a new table of the same kind; for a
  distributed table each worker copies its own shards' episodes into the new
  table's shards, so no trajectory passes through the client.  To write them
  to a file instead, :func:`gear_flow.ingest.export.export` takes the same frame.
- :func:`insert_collection` — a ``dask.bag`` of episode dicts, or a
  ``dask.dataframe`` step table (the Parquet layout, or a
  :class:`~gear_flow.ingest.columns.ColumnMap`), validated and inserted
  like an ingested file: every partition is parsed and checked first, on a
  worker hosting shards, and only then inserted there.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import DatasetError
from .common import fit_to_table, resolve, wants_next
from .episode import make_episode
from .shards import META, episode_table, is_local, live_shards_by_worker, read_episodes

if TYPE_CHECKING:
    import dask.bag
    import dask.dataframe

    from ..distributed.api import DistributedTable
    from ..table.local import LocalTable
    from .columns import ColumnMap
    from .report import IngestReport


def _meta():
    import pandas as pd

    return pd.DataFrame({k: np.zeros(0, dtype=v) for k, v in META.items()})


def _frame(shard, shard_id: int, sources):
    from .. import backend

    cols = episode_table(shard, shard_id, sources)
    return backend.frame_module(shard.tier).DataFrame(cols)


def _frame_task(name: str, shard_id: int, sources):
    from distributed import get_worker

    from ..distributed.plugin import PLUGIN_NAME

    return _frame(get_worker().plugins[PLUGIN_NAME].host.shard(name, shard_id), shard_id, sources)


def episodes(
    table: LocalTable | DistributedTable, sources: Mapping[int, Any] | IngestReport | None = None
) -> dask.dataframe.DataFrame:
    """The table's episodes as a :class:`dask.dataframe.DataFrame`, one partition per live shard.

    Parameters
    ----------
    table : LocalTable or DistributedTable
        The table to describe (an item-unit ``"episode"`` or ``"step"`` table).
    sources : dict or IngestReport, optional
        ``{table episode id: source episode id}`` for the ``source_id``
        column (an :class:`~gear_flow.ingest.IngestReport` gives its
        :meth:`~gear_flow.ingest.IngestReport.source_map`); -1 otherwise.

    Returns
    -------
    dask.dataframe.DataFrame
        Columns ``episode_id``, ``source_id``, ``shard``, ``length``,
        ``return`` (sum of ``reward``), ``first_key`` (key of the episode's
        first item), ``stamp`` (insertion order), ``times_sampled`` (-1 unless
        the table counts samples) and ``mean_priority`` (over its active
        items).  A snapshot: partitions are computed now, where the shards are.

    Examples
    --------
    >>> eps = episodes(table)                                                   # doctest: +SKIP
    >>> top = eps[eps["return"] >= eps["return"].quantile(0.9).compute()]       # doctest: +SKIP
    >>> bc_table = select(table, top)                                           # doctest: +SKIP
    """
    import dask
    import dask.dataframe as dd

    if hasattr(sources, "source_map"):
        sources = sources.source_map()
    if is_local(table):
        parts = [dask.delayed(_frame(sh, s, sources)) for s, sh in enumerate(table.shards)]
        return dd.from_delayed(parts, meta=_meta(), verify_meta=False)
    token = uuid.uuid4().hex[:8]
    futs = []
    for a, shard_ids in live_shards_by_worker(table).items():
        for s in shard_ids:
            futs.append(
                table.client.submit(
                    _frame_task,
                    table.name,
                    s,
                    sources,
                    workers=[a],
                    allow_other_workers=False,
                    pure=False,
                    key=f"gear-flow-episodes-{token}-{s}",
                )
            )
    meta = table.client.submit(lambda df: df.iloc[:0], futs[0], pure=False).result()  # pandas or cuDF, empty
    return dd.from_delayed(futs, meta=meta, verify_meta=False)


def _ids(frame) -> np.ndarray:
    from .export import _ids_of

    return _ids_of(frame)


def _read_selected(shards: dict, ids):
    """This worker's chosen episodes, in insertion order (they stay on the worker as the task's result)."""
    eps = []
    for sh in shards.values():
        with sh.lock:
            stamp = dict(zip(sh.index.get("episode_id", sh.index.live()), sh.index.get("stamp", sh.index.live())))
        eps.extend((stamp[e], ep) for e, ep in read_episodes(sh, ids))
    return [ep for _, ep in sorted(eps, key=lambda x: x[0])]


def _counts(eps: list, step: bool) -> tuple[int, int]:
    return len(eps), int(sum(len(next(iter(e.values()))) for e in eps)) if step else len(eps)


def _insert_held(client, table, futs: list, where: list, timeout, token) -> int:
    """Insert lists of episodes held on workers (futures) as one transaction; returns episodes inserted."""
    from .cluster import insert_partitions

    step = table.spec.item_unit == "step"
    counts = client.gather([client.submit(_counts, f, step, workers=[a], pure=False) for f, a in zip(futs, where)])
    if not sum(c[0] for c in counts):
        return 0
    insert_partitions(client, table, futs, where, counts, timeout, token)
    return sum(c[0] for c in counts)


def select(
    table: LocalTable | DistributedTable,
    episodes_frame: Any,
    *,
    timeout: float | None = None,
    **table_kwargs: Any,
) -> LocalTable | DistributedTable:
    """A new table of the same kind and spec holding the chosen episodes (in insertion order).

    Parameters
    ----------
    table : LocalTable or DistributedTable
        The table to copy from; it is not changed.
    episodes_frame : dask or pandas DataFrame, or array of episode ids
        Typically :func:`episodes` filtered; only ``episode_id`` is computed.
    timeout : float, optional
        Seconds each insert may wait for the new table's rate limiter.
    **table_kwargs
        Passed to ``LocalTable(spec, ...)`` / ``DistributedTable.create(client, spec, ...)``
        (sampler, remover, rate_limiter, ...).  A distributed table's new
        shards go on the same workers.

    Returns
    -------
    LocalTable or DistributedTable
        The new table, of ``table``'s kind; the caller owns (and closes) it.

    Raises
    ------
    SpecError
        Some chosen episodes are no longer in a distributed ``table`` (the new
        table is closed).
    """
    from ..errors import SpecError

    ids = _ids(episodes_frame)
    if is_local(table):
        from ..table.local import LocalTable

        eps = []
        for sh in table.shards:
            with sh.lock:
                live = sh.index.live()
                stamp = dict(zip(sh.index.get("episode_id", live), sh.index.get("stamp", live)))
            eps.extend((stamp[e], ep) for e, ep in read_episodes(sh, ids))
        new = LocalTable(table.spec, **table_kwargs)
        if eps:
            new.insert([ep for _, ep in sorted(eps, key=lambda x: x[0])], timeout=timeout)
        return new
    from ..distributed.api import DistributedTable

    by = live_shards_by_worker(table)
    new = DistributedTable.create(table.client, table.spec, workers=sorted(by), **table_kwargs)
    try:
        from .shards import submit_per_worker

        futs = submit_per_worker(table, _read_selected, lambda a, s: (ids,), tag="select")
        n = _insert_held(table.client, new, list(futs.values()), list(futs), timeout, uuid.uuid4().hex[:8])
        table.client.cancel(list(futs.values()))
    except BaseException:
        new.close()
        raise
    if n != len(np.unique(ids)):
        new.close()
        raise SpecError(f"{len(np.unique(ids)) - n} of the chosen episodes are no longer in table {table.name!r}")
    return new


# -- collections in --------------------------------------------------------------------------------------


def _parse(part, spec, gamma: float, strict: bool, kind: str, cmap, label: str) -> list:
    """One bag/dataframe partition → episodes fitted to the table (DatasetError naming the partition)."""
    from .parquet import frame_episodes

    nxt = wants_next(spec)
    if kind == "frame":
        pairs = frame_episodes(part, label, strict, cmap, nxt)
    else:
        pairs = []
        for j, e in enumerate(part):
            if not isinstance(e, Mapping) or "reward" not in e:
                raise DatasetError(
                    label,
                    j,
                    f"a {type(e).__name__} without 'reward': each element must be a dict of an episode's "
                    "obs (or obs__<key>), action, reward and done",
                )
            raw = {r: e.get(k) for r, k in (("obs", "obs"), ("action", "action"), ("reward", "reward"))}
            raw["terminal"] = e.get("done", e.get("terminal"))
            raw["truncated"] = e.get("truncated", np.zeros(len(np.asarray(e["reward"])), bool))
            obs = {k[5:]: v for k, v in e.items() if k.startswith("obs__")} or raw["obs"]
            raw["obs"] = obs
            raw["next_obs"] = e.get("next_obs")
            pairs.append((j, make_episode(label, j, **raw, want_next=nxt, strict=strict)))
    return [fit_to_table(spec, label, sid, ep, gamma) for sid, ep in pairs]


def _one_partition_each(frame, cmap, client) -> None:
    """Refuse a step table with an episode in two partitions (each partition is parsed alone, so such an
    episode went in as two or more, none of them ended): its episode column read once more, nothing else.
    ``client``: the Dask client to compute with, or True for in-process."""
    from .parquet import DEFAULT

    epc = (cmap or DEFAULT).episode
    if epc not in frame.columns:
        return  # (the parse names the missing column)
    col = frame[epc].to_delayed()
    if client is True:
        import dask

        per = dask.compute(*col, scheduler="sync")
    else:
        per = client.gather(client.compute(list(col)))
    seen: dict = {}
    for i, ids in enumerate(per):
        for e in np.unique(np.asarray(ids)).tolist():
            if seen.setdefault(e, i) != i:
                raise DatasetError(
                    f"partition {i}",
                    e,
                    f"the episode is in partitions {seen[e]} and {i} (each episode's rows must "
                    "be in one partition: repartition by episode); nothing was inserted",
                )


def insert_collection(
    table: LocalTable | DistributedTable,
    collection: dask.bag.Bag | dask.dataframe.DataFrame,
    *,
    columns: ColumnMap | None = None,
    gamma: float | None = None,
    strict: bool | None = None,
    timeout: float | None = None,
) -> int:
    """Insert a ``dask.bag`` of episodes or a ``dask.dataframe`` step table, validated like ingestion.

    Every partition is parsed and checked before anything is inserted, on a
    worker hosting shards, and the inserts are one transaction.

    Parameters
    ----------
    table : LocalTable or DistributedTable
        The table to insert into.
    collection : dask.bag.Bag or dask.dataframe.DataFrame
        Bag elements are dicts with ``obs`` (or ``obs__<key>``), ``action``,
        ``reward``, ``done``, optional ``truncated``/``next_obs``; a dataframe
        has the Parquet step-table layout and no episode spans two partitions.
    columns : ColumnMap, optional
        The dataframe's layout, when it is not the Parquet reader's default.
    gamma : float, optional
        Discount of the derived ``rtg`` column (config ``ingest.gamma``).
    strict : bool, optional
        Reject non-finite values and early end flags (config ``ingest.strict``).
    timeout : float, optional
        Seconds each insert may wait for the table's rate limiter (None: no limit).

    Returns
    -------
    int
        The number of episodes inserted.

    Raises
    ------
    DatasetError
        Naming the partition and episode; nothing was inserted.
    """
    gamma, strict, _ = resolve(gamma, strict, None)
    kind = "frame" if hasattr(collection, "columns") else "bag"
    parts = collection.to_delayed()
    if hasattr(parts, "ravel"):
        parts = list(parts.ravel())
    if kind == "frame":
        _one_partition_each(collection, columns, is_local(table) or table.client)
    if is_local(table):
        import dask

        datas = dask.compute(*parts, scheduler="sync")
        try:
            eps = [
                e
                for i, d in enumerate(datas)
                for e in _parse(d, table.spec, gamma, strict, kind, columns, f"partition {i}")
            ]
        except DatasetError as e:
            raise DatasetError(e.path, e.episode, f"{e.problem}; nothing was inserted") from None
        if eps:
            table.insert(eps, timeout=timeout)
        return len(eps)
    client = table.client
    addrs = sorted(live_shards_by_worker(table))
    token = uuid.uuid4().hex[:8]
    futs = client.compute(parts)
    parsed = [
        client.submit(
            _parse,
            f,
            table.spec,
            gamma,
            strict,
            kind,
            columns,
            f"partition {i}",
            workers=[addrs[i % len(addrs)]],
            allow_other_workers=False,
            pure=False,
            key=f"gear-flow-parse-{token}-{i}",
        )  # fmt: skip
        for i, f in enumerate(futs)
    ]
    from distributed import wait

    wait(parsed)
    for f in parsed:
        if f.status == "error":
            e = f.exception()
            if isinstance(e, DatasetError):
                raise DatasetError(e.path, e.episode, f"{e.problem}; nothing was inserted") from None
            raise e
    try:  # one transaction: every partition or none
        return _insert_held(client, table, parsed, [addrs[i % len(addrs)] for i in range(len(parsed))], timeout, token)
    finally:
        client.cancel(futs + parsed)
