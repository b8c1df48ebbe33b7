"""Ingestion, all or nothing: plan → read and validate every partition → insert → read back.

:func:`ingest` is the entry point.  A file is split into partitions (Minari
episode chunks, D4RL row ranges, episode chunks of Parquet files, see :mod:`.common`); every
partition is read and checked (format, derived columns, the table's spec)
before anything is inserted, so a malformed file raises a
:class:`~gear_flow.errors.DatasetError` naming the file, the episode and the
problem, with nothing inserted.  A :class:`~gear_flow.LocalTable` does this
in-process and inserts everything in one atomic ``insert``; a
:class:`~gear_flow.distributed.DistributedTable` does it as a Dask dataflow
that reads each partition on a worker owning target shards
(:mod:`.cluster`).  Either way the result is an
:class:`~gear_flow.ingest.IngestReport` comparing what was read with what the
table holds.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import DatasetError, SpecError
from . import parquet
from .common import Format, Plan, capacity_groups, check_table_columns, parse_partition, resolve
from .formats import FORMATS, detect_format
from .report import IngestReport, build_report, stored_summary

if TYPE_CHECKING:
    from distributed import Client

    from ..distributed import DistributedTable
    from ..table import LocalTable
    from .columns import ColumnMap


def ingest(
    table: LocalTable | DistributedTable,
    source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    fmt: str | None = None,
    *,
    gamma: float | None = None,
    strict: bool | None = None,
    chunk_episodes: int | None = None,
    frame_backend: str | None = None,
    columns: ColumnMap | None = None,
    max_episode_steps: int | None = None,
    timeout: float | None = None,
    client: Client | None = None,
) -> IngestReport:
    """Read an offline dataset into a table, all or nothing.

    Parameters
    ----------
    table : LocalTable or DistributedTable
        Its columns must be among those the readers produce (create it with
        :func:`~gear_flow.ingest.episode_columns`); each episode must fit a
        shard's capacity.  Values are cast to its dtypes (float64 columns keep
        float64 files exact); a ``next_obs`` column keeps next observations.
    source : str, Path or list
        Minari dataset directory, D4RL HDF5 file, or Parquet file(s)/directory/glob.
        For a distributed table the paths are opened *by the workers*.
    fmt : {"minari", "d4rl", "parquet"}, optional
        Default: guessed from ``source`` (:func:`detect_format`).
    gamma : float, optional
        Discount of the derived ``rtg`` column (config ``ingest.gamma``, 1.0).
    strict : bool, optional
        Reject non-finite rewards/observations, early end flags and totals that
        disagree with the dataset's metadata (config ``ingest.strict``, True).
    chunk_episodes : int, optional
        Episodes per partition (config ``ingest.chunk_episodes``); a
        distributed ingestion uses smaller chunks when there would be fewer than
        ``cluster.PARTITIONS_PER_WORKER`` partitions per worker.
    frame_backend : {"pandas", "cudf"}, optional
        Parquet only: the frame library the files are read into.
    columns : ColumnMap or dict, optional
        Parquet only: the column of each role, the episode/step columns and
        whether there is a truncation column (e.g.
        :data:`gear_flow.ingest.columns.LEROBOT`).  Default: detected from
        the first file (ours, or LeRobot's ``episode_index``/``frame_index``
        layout) and named in the report's ``layout``; a dict of file column ->
        role replaces the detected layout's mappings of the same roles.
    max_episode_steps : int, optional
        D4RL files without ``timeouts`` only: also end an episode after this many steps.
    timeout : float, optional
        Seconds each insert may wait for the table's rate limiter.
    client : distributed.Client, optional
        Default: the client the table was created or attached with.

    Returns
    -------
    IngestReport
        What was read and what the table holds afterwards (counts, checksums,
        per-partition placement); ``report.ok`` when they agree exactly.

    Raises
    ------
    gear_flow.errors.DatasetError
        A file is malformed (names the file, the episode and the problem);
        nothing was inserted.
    gear_flow.errors.SpecError
        The table has a column no reader produces, or ``fmt`` is unknown.

    Examples
    --------
    >>> spec = gf.TableSpec(episode_columns(4), capacity=100_000, num_shards=2)  # doctest: +SKIP
    >>> table = DistributedTable.create(client, spec)                            # doctest: +SKIP
    >>> report = ingest(table, "data/cartpole/minari/cartpole-mixed-v0")         # doctest: +SKIP
    >>> assert report.ok, report.mismatches()                                    # doctest: +SKIP
    """
    t0 = time.perf_counter()
    source = _absolute(source)  # workers may run elsewhere (another cwd): paths are the client's
    name = detect_format(source) if fmt is None else fmt
    if name not in FORMATS:
        raise SpecError(f"fmt {name!r} must be one of {sorted(FORMATS)}")
    if isinstance(source, list) and name != "parquet":  # (one path in a list, as the CLI gives it: that path)
        if len(source) != 1:
            raise SpecError(
                f"a {name} dataset is one {'directory' if name == 'minari' else 'file'}; got {len(source)} paths: "
                "ingest them one at a time (several files in one call are for Parquet)"
            )
        source = source[0]
    gamma, strict, chunk = resolve(gamma, strict, chunk_episodes)
    check_table_columns(table.spec)
    if frame_backend is not None and (name != "parquet" or frame_backend not in parquet.FRAME_READERS):
        raise SpecError(
            f"frame_backend ({frame_backend!r}) applies to Parquet only: one of {sorted(parquet.FRAME_READERS)}"
        )
    if columns is not None and name != "parquet":
        raise SpecError(f"columns= (a column mapping) applies to Parquet step tables, not {name!r}")
    if max_episode_steps is not None and name != "d4rl":
        raise SpecError(f"max_episode_steps applies to D4RL files, not {name!r}")
    detected = None
    if name == "parquet":  # a dict is a ColumnMap's columns; none given: the layout the first file has
        columns, detected = parquet.layout_of(source, columns)
    given = {"frame_backend": frame_backend, "columns": columns, "max_episode_steps": max_episode_steps}
    options = {k: v for k, v in given.items() if v is not None}
    report = _ingest(table, name, source, gamma, strict, chunk, options, timeout, client, t0)
    report.layout = detected
    return report


def _ingest(table, name, source, gamma, strict, chunk, options, timeout, client, t0) -> IngestReport:
    from ..table.local import LocalTable

    if isinstance(table, LocalTable):
        return _ingest_local(table, FORMATS[name], source, gamma, strict, chunk, options, timeout, t0)
    from ..distributed.api import DistributedTable

    if isinstance(table, DistributedTable):
        from .cluster import ingest_distributed

        return ingest_distributed(table, name, source, gamma, strict, chunk, options, timeout, client, t0)
    raise SpecError(f"table must be a LocalTable or a DistributedTable, got {type(table).__name__}")


def _absolute(source):
    if isinstance(source, (list, tuple)):
        return [os.path.abspath(os.fspath(s)) for s in source]
    return os.path.abspath(os.fspath(source))


def check_totals(plan: Plan, summaries: Sequence[Mapping[str, Any]], strict: bool) -> None:
    """Cross-partition checks: unique source episode ids; totals agreeing with the metadata (strict).

    Parameters
    ----------
    plan : Plan
        The dataset's plan (its expected totals).
    summaries : sequence of mapping
        :meth:`~gear_flow.ingest.common.ParsedPartition.summary` of every partition.
    strict : bool
        Also require the step and episode counts to match the metadata's.

    Raises
    ------
    DatasetError
        An episode id in two partitions, or (``strict``) totals that disagree.
    """
    seen = {}
    for s in summaries:
        for eid in s["ids"]:
            if eid in seen and seen[eid] != s["index"]:
                raise DatasetError(s["path"], eid, "the episode id appears in two partitions")
            seen[eid] = s["index"]
    steps = sum(s["steps"] for s in summaries)
    eps = sum(s["episodes"] for s in summaries)
    if strict and plan.expected_steps is not None and steps != plan.expected_steps:
        raise DatasetError(
            plan.source, None, f"the metadata promises {plan.expected_steps} steps, the episodes hold {steps}"
        )
    if strict and plan.expected_episodes is not None and eps != plan.expected_episodes:
        raise DatasetError(
            plan.source, None, f"the metadata promises {plan.expected_episodes} episodes, the file holds {eps}"
        )


def nothing_inserted(err: BaseException, table_name: str | None) -> BaseException:
    """``err`` with "nothing was inserted" added, for DatasetErrors (others unchanged).

    Parameters
    ----------
    err : BaseException
        The failure that stopped an ingestion.
    table_name : str or None
        The distributed table's name for the message (None: a local table).

    Returns
    -------
    BaseException
        A new :class:`DatasetError` (no cause chained) or ``err`` itself.
    """
    if isinstance(err, DatasetError):
        into = "" if table_name is None else f" into table {table_name!r}"
        new = DatasetError(err.path, err.episode, f"{err.problem}; nothing was inserted{into}")
        new.__cause__ = None
        return new
    return err


# -- local ---------------------------------------------------------------------------------------


def streams(table: LocalTable | DistributedTable) -> bool:
    """Whether an ingestion into ``table`` streams: a ``disk`` table (a dataset larger than memory).

    Such an ingestion reads every partition twice: once to validate the
    whole dataset (nothing is inserted unless every partition is valid, as
    always), keeping only each partition's summary, and once more to insert
    it, one partition at a time (on each worker, for a distributed table), so
    that no more than a partition per reader is ever in memory.  A file that
    changed between the two reads stops the ingestion with a
    :class:`~gear_flow.errors.DatasetError` naming it, before that
    partition is inserted (the partitions inserted before it stay).

    Parameters
    ----------
    table : LocalTable or DistributedTable
        The table.

    Returns
    -------
    bool
        Its tier is ``disk``.
    """
    return getattr(getattr(table, "cfg", None) or getattr(table, "config", None), "tier", None) == "disk"


def check_reread(before: Mapping[str, Any], after: Mapping[str, Any]) -> None:
    """Refuse a partition whose second read differs from its first (its file changed in between).

    Parameters
    ----------
    before, after : mapping
        :meth:`~gear_flow.ingest.common.ParsedPartition.summary` of the two reads.

    Raises
    ------
    DatasetError
        Its counts, ids or checksums differ.
    """
    same = [before[k] == after[k] for k in ("episodes", "steps", "lengths", "ids")]
    same.append(np.array_equal(np.asarray(before["sums"], float), np.asarray(after["sums"], float), equal_nan=True))
    if not all(same):
        raise DatasetError(
            before["path"], None, "the file changed while it was ingested (its second read differs from its first)"
        )


def insert_fitting(table: LocalTable, episodes: list, timeout: float | None) -> list:
    """``table.insert`` of validated ``episodes``: one call, all or none; or, when that call would put more
    than a shard's capacity on a shard (a dataset larger than the table), consecutive calls of at most one
    shard's capacity each, so that the oldest episodes are evicted as the report says
    (``episodes_stored``), whatever the partitions, rather than the insert refused after earlier
    partitions went in.  A Queue or Stack, which never drops a waiting item, is not split.

    Parameters
    ----------
    table : LocalTable
        The table.
    episodes : list of dict
        Episodes cast to its columns, each at most a shard's capacity (checked: the call raises otherwise).
    timeout : float or None
        Each call's.

    Returns
    -------
    list of InsertResult
        One per call, in order.
    """
    from ..errors import CapacityError

    try:
        return [table.insert(episodes, timeout=timeout)]
    except CapacityError:
        lengths = [len(next(iter(e.values()))) for e in episodes]
        if table.cfg.lossless or max(lengths) > table.spec.capacity:
            raise
    groups = capacity_groups(lengths, table.spec.capacity)
    return [table.insert([episodes[i] for i in g], timeout=timeout) for g in groups]


def _ingest_local(table, fmt: Format, source, gamma, strict, chunk, options, timeout, t0) -> IngestReport:
    spec = table.spec
    stream = streams(table)
    try:
        plan = fmt.plan(source, chunk, **options)
        parsed = summaries = []
        if stream:  # validate everything, holding summaries only (see streams())
            summaries = [parse_partition(fmt, p, spec, gamma, strict, options).summary() for p in plan.partitions]
        else:
            parsed = [parse_partition(fmt, p, spec, gamma, strict, options) for p in plan.partitions]
            summaries = [p.summary() for p in parsed]
        check_totals(plan, summaries, strict)
    except DatasetError as e:
        raise nothing_inserted(e, None) from None
    ids = np.zeros(0, np.int64)
    dest = np.zeros(0, np.int64)
    if stream:
        got = []
        for p, before in zip(plan.partitions, summaries):
            part = parse_partition(fmt, p, spec, gamma, strict, options)
            check_reread(before, part.summary())
            if part.episodes:
                got += [(r.episode_ids, r.shards) for r in insert_fitting(table, part.episodes, timeout)]
            del part
        if got:
            ids, dest = (np.concatenate(x) for x in zip(*got))
    else:
        eps = [e for p in parsed for e in p.episodes]
        if eps:
            got = [(r.episode_ids, r.shards) for r in insert_fitting(table, eps, timeout)]
            ids, dest = (np.concatenate(x) for x in zip(*got))
    by_shard = {int(s): ids[dest == s] for s in np.unique(dest)}
    stored = stored_summary(dict(enumerate(table.shards)), by_shard, spec.names)
    parts_info, off = [], 0
    for s in summaries:
        n = s["episodes"]
        parts_info.append(
            {**part_info(s), "read_on": None, "worker": None, "shards": sorted(set(dest[off : off + n].tolist()))}
        )
        off += n
    return build_report(plan.fmt, source, spec.names, summaries, parts_info, stored, ids, time.perf_counter() - t0)


def part_info(s: Mapping[str, Any]) -> dict[str, Any]:
    """The report's row for a partition, from its summary.

    Parameters
    ----------
    s : mapping
        :meth:`~gear_flow.ingest.common.ParsedPartition.summary` of the partition.

    Returns
    -------
    dict
        ``index``, ``path``, ``episodes`` and ``steps``; callers add
        ``read_on``, ``worker`` and ``shards``.
    """
    return {"index": s["index"], "path": s["path"], "episodes": s["episodes"], "steps": s["steps"]}
