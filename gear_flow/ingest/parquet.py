"""Parquet step tables: one row per step, an ``episode_id`` column, several files.

Schema (column names as written by ``pipelines/make_dataset.py``):

=====================  ==========================================================
``episode_id``         integer; every row of an episode carries it
``step``               optional integer ``0 .. T-1``; rows are ordered by it
``obs_0 .. obs_{d-1}`` the observation, one float column per dimension (or a
                       single fixed-size-list column ``obs``)
``action``             integer (discrete) or float; or ``action_0 ..`` / a list
                       column for continuous actions
``reward``             float
``terminal``           bool: the episode terminated at this step
``truncated``          bool: the episode was cut at this step
=====================  ==========================================================

Other tools' layouts (LeRobot's ``episode_index``, ``frame_index``,
``observation.state``, ``next.reward``, ``next.done``; one or many episodes
per file) are read through a :class:`~gear_flow.ingest.columns.ColumnMap`
(``columns=``), which names the column of each role, the episode and step
columns, and whether there is a truncation column at all.  Without one the
layout is detected from the first file's columns
(:func:`~gear_flow.ingest.columns.detect_layout`: LeRobot's is unambiguous)
and the report names it; a plain dict of file column -> role then replaces
the detected layout's mappings of the same roles.

An episode lies in exactly one file (checked at planning); a partition is up
to ``chunk_episodes`` episodes of one file, read with a row filter on the
episode column (the whole file when it fits in one partition).  The frame
library is chosen by ``frame_backend``: ``"pandas"`` (default, CPU; the table
read by pyarrow, its columns as stored, without the pandas index its metadata
describes) or ``"cudf"`` (GPU workers, :func:`dask.dataframe.read_parquet`
through Dask's ``dataframe.backend`` option; needs the ``cudf`` extra and is
checked through :mod:`gear_flow.backend`).  Either way the columns come
back as NumPy arrays: the table's tiers decide where rows live, not the reader.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import DatasetError, SpecError
from .columns import ColumnMap, detect_layout, with_columns
from .common import Format, Partition, Plan, iter_episodes, make_episode
from .episode import guard

DEFAULT = ColumnMap()


def files_of(paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> list[str]:
    """The Parquet files named by a file, a directory (searched recursively), a glob, or a list of those.

    Parameters
    ----------
    paths : str, os.PathLike, or sequence of them
        Files, directories (every ``*.parquet`` below) or globs (``**`` recursive).

    Returns
    -------
    list of str
        The files, each item's sorted, in the order of the items.

    Raises
    ------
    DatasetError
        An item names no Parquet file.
    """
    items = [paths] if isinstance(paths, (str, Path)) else list(paths)
    out: list[str] = []
    for it in items:
        p = Path(it)
        if p.is_dir():
            found = sorted(str(f) for f in p.rglob("*.parquet"))
        elif any(ch in str(it) for ch in "*?["):
            found = sorted(glob.glob(str(it), recursive=True))
        else:
            found = [str(p)] if p.is_file() else []
        if not found:
            raise DatasetError(it, None, "no Parquet files found (give a file, a directory of *.parquet or a glob)")
        out.extend(found)
    return out


# Two frame libraries read the same files; the rest of the reader only sees NumPy arrays.
def _read_pandas(path: str, filters=None):
    import pyarrow.parquet as pq

    # the columns as stored, without rebuilding a pandas index from the file's metadata: pandas writes an index
    # named like one of its columns (set_index("step", drop=False)) next to that column, and rebuilding it fails
    # with "cannot insert step, already exists" (an extra __index_level_0__ column is ignored by the roles)
    return pq.read_table(path, filters=filters).to_pandas(ignore_metadata=True)


def _read_cudf(path: str, filters=None):
    import dask
    import dask.dataframe as dd

    from .. import backend

    backend.frame_module("device")  # BackendUnavailableError, clearly worded, without cuDF or a device
    with dask.config.set({"dataframe.backend": "cudf"}):
        return dd.read_parquet(path, filters=filters).compute(scheduler="sync")


FRAME_READERS = {"pandas": _read_pandas, "cudf": _read_cudf}


def _column(frame, name: str) -> np.ndarray:
    col = frame[name]
    if hasattr(col, "to_numpy"):
        return col.to_numpy()
    return np.asarray(col)


def plan(
    source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    chunk_episodes: int,
    *,
    columns: ColumnMap | None = None,
    **_: object,
) -> Plan:
    """Chunks of ``chunk_episodes`` episodes per file.

    Reads only the episode column (to count, and to check that no episode
    spans two files).

    Parameters
    ----------
    source : str, os.PathLike, or sequence of them
        As for :func:`files_of`.
    chunk_episodes : int
        Most episodes per partition.
    columns : ColumnMap, optional
        The layout (for the name of the episode column; default ``episode_id``).
    **_
        Other formats' options, ignored.

    Returns
    -------
    Plan
        Partitions whose ``selector`` holds the episode ids to read (empty:
        the whole file, when it fits in one partition).

    Raises
    ------
    DatasetError
        A file is not Parquet, lacks an integer episode column, or shares an
        episode with another file.
    """
    import pyarrow.parquet as pq

    epc = (columns or DEFAULT).episode
    parts, seen, total_eps, total_steps = [], {}, 0, 0
    for path in files_of(source):
        try:
            pf = pq.ParquetFile(path)
        except Exception as e:  # pyarrow raises ArrowInvalid / OSError for non-Parquet files
            raise DatasetError(path, None, f"cannot be read as Parquet ({e})") from None
        names = pf.schema_arrow.names
        if epc not in names:
            hint = "; pass columns= (a ColumnMap) naming the episode column" if epc == "episode_id" else ""
            raise DatasetError(path, None, f"column {epc!r} is missing (columns: {names}){hint}")
        with guard(path, None):
            ids = pf.read(columns=[epc]).column(epc).to_numpy()
        if ids.dtype.kind not in "iu":
            raise DatasetError(path, None, f"{epc!r} has dtype {ids.dtype}; expected integers")
        uniq, first, counts = np.unique(ids, return_index=True, return_counts=True)
        # in the file's order (first appearance, as a whole-file read gives them): chunked by sorted id, a file of
        # more episodes than a chunk was read, and inserted, in another order than a smaller one
        order = np.argsort(first, kind="stable")
        uniq, counts = uniq[order], counts[order]
        for e in uniq.tolist():
            if e in seen:
                raise DatasetError(path, e, f"the episode also has rows in {seen[e]}; an episode must lie in one file")
            seen[e] = path
        for a in range(0, max(len(uniq), 1), chunk_episodes):
            sel = () if len(uniq) <= chunk_episodes else tuple(int(x) for x in uniq[a : a + chunk_episodes])
            n = len(uniq[a : a + chunk_episodes])
            parts.append(
                Partition("parquet", path, len(parts), sel, n, int(counts[a : a + chunk_episodes].sum()), total_eps + a)
            )
        total_eps += len(uniq)
        total_steps += len(ids)
    return Plan("parquet", str(source), parts, total_eps, total_steps)


def _block(frame, names, name: str, path) -> np.ndarray:
    """The values of every row: one column, a list column, or ``name_0 .. name_{k-1}``."""
    if name in names:
        a = _column(frame, name)
        if a.dtype == object and len(a) and isinstance(a[0], (np.ndarray, list)):
            try:
                return np.stack([np.asarray(v) for v in a])
            except ValueError as e:
                raise DatasetError(path, None, f"list column {name!r} has rows of different lengths ({e})") from None
        return a
    pat = re.compile(re.escape(name) + r"_(\d+)$")
    dims = sorted((int(m.group(1)), n) for n in names if (m := pat.match(n)))
    if not dims:
        raise DatasetError(
            path, None, f"no {name!r} column (expected {name!r} or {name}_0, {name}_1, ...; columns: {names})"
        )
    if [d for d, _ in dims] != list(range(len(dims))):
        raise DatasetError(
            path, None, f"{name} columns must be {name}_0 .. {name}_{len(dims) - 1}; got {[n for _, n in dims]}"
        )
    cols = [_column(frame, n) for _, n in dims]
    for (_, n), c in zip(dims, cols):
        if c.dtype.kind not in "biuf":
            raise DatasetError(path, None, f"column {n!r} has dtype {c.dtype}; expected a numeric dtype")
    return np.stack(cols, axis=1)


def _pick(x, rows):
    """Rows of an observation block, or of each leaf of a dict of them."""
    if x is None:
        return None
    return {k: v[rows] for k, v in x.items()} if isinstance(x, dict) else x[rows]


def _observation(frame, names, cmap: ColumnMap, role: str, path, required: bool = True):
    """An observation block, or a dict of them (``role.<key>`` mappings); None if optional and absent."""
    leaves = cmap.leaves(role)
    col = cmap.source(role)
    if (
        not leaves
        and col == role
        and role not in names
        and not any(re.match(re.escape(role) + r"_\d+$", n) for n in names)
    ):
        # our own export of a Dict observation: obs__<key> or obs__<key>_<j> columns
        pat = re.compile(re.escape(role) + r"__(.+?)(?:_\d+)?$")
        leaves = {m.group(1): role + "__" + m.group(1) for n in names if (m := pat.match(n))}
    if leaves:
        return {k: _block(frame, names, c, path) for k, c in leaves.items()}
    if not required and col not in names and not any(n.startswith(col + "_") for n in names):
        return None
    return _block(frame, names, col, path)


def read(
    part: Partition,
    strict: bool,
    *,
    frame_backend: str | None = None,
    columns: ColumnMap | None = None,
    next_obs: bool = False,
    **_: object,
) -> list[tuple[int, dict[str, np.ndarray]]]:
    """The episodes of one partition, in order of first appearance, as ``(episode id, episode)``.

    Parameters
    ----------
    part : Partition
        A partition from :func:`plan`.
    strict : bool
        Reject non-finite values and early end flags.
    frame_backend : {"pandas", "cudf"}, optional
        Frame library that reads the file (default pandas).
    columns : ColumnMap, optional
        The layout (default: this module's own, :data:`DEFAULT`).
    next_obs : bool, default False
        Keep next observations.
    **_
        Other formats' options, ignored.

    Returns
    -------
    list of (int, dict of str to numpy.ndarray)
        As :func:`frame_episodes` returns them.

    Raises
    ------
    SpecError
        ``frame_backend`` is unknown.
    """
    backend_name = frame_backend or "pandas"
    if backend_name not in FRAME_READERS:
        raise SpecError(f"frame_backend {backend_name!r} must be one of {sorted(FRAME_READERS)}")
    cmap = columns or DEFAULT
    epc = cmap.episode
    with guard(part.path, None if not part.selector else f"{part.selector[0]}..{part.selector[-1]}"):
        filters = [(epc, "in", _ids_as_stored(part.path, epc, part.selector))] if part.selector else None
        frame = FRAME_READERS[backend_name](part.path, filters)
    if part.selector:  # filters may only prune row groups with some engines: keep exactly this chunk's rows
        frame = frame[frame[epc].isin(list(part.selector))]
    return frame_episodes(frame, part.path, strict, cmap, next_obs)


def _ids_as_stored(path: str, column: str, ids: Sequence[int]) -> np.ndarray:
    """Episode ids in the file's own integer type: a row filter compares in the type of its values, so ids of
    a uint64 column at or above 2**63 (or any id of a narrower column) must not be taken as int64."""
    import pyarrow.parquet as pq

    return np.asarray(ids, dtype=pq.read_schema(path).field(column).type.to_pandas_dtype())


def frame_episodes(
    frame: Any,
    path: str | os.PathLike[str],
    strict: bool,
    cmap: ColumnMap | None = None,
    next_obs: bool = False,
) -> list[tuple[int, dict[str, np.ndarray]]]:
    """The episodes of a step-table frame (pandas or cuDF), as ``(episode id, episode)`` in order of first row.

    Also what inserting a ``dask.dataframe`` of steps runs on each partition
    (:func:`gear_flow.ingest.collection.insert_collection`).

    Parameters
    ----------
    frame : pandas.DataFrame or cudf.DataFrame
        One row per step; every episode complete.
    path : str or os.PathLike
        Where the frame came from (for messages).
    strict : bool
        Reject non-finite values and early end flags.
    cmap : ColumnMap, optional
        The layout (default :data:`DEFAULT`).
    next_obs : bool, default False
        Keep next observations (a mapped ``next_obs`` column, else the next row).

    Returns
    -------
    list of (int, dict of str to numpy.ndarray)
        Episodes at native precision, rows ordered by the step column where
        there is one; without a truncation column, an episode whose last step
        is not terminal is marked truncated.

    Raises
    ------
    DatasetError
        Naming the episode: missing columns, steps with gaps or repeats, or
        what :func:`~gear_flow.ingest.episode.make_episode` rejects.
    """
    cmap = cmap or DEFAULT
    epc = cmap.episode
    names = list(frame.columns)
    roles = {"reward": cmap.source("reward"), "terminal": cmap.source("terminal"), "truncated": cmap.truncated}
    missing = [c for c in (epc, *roles.values()) if c is not None and c not in names]
    if missing:
        raise DatasetError(path, None, f"column(s) {missing} are missing (columns: {names})")
    ids = _column(frame, epc)
    obs = _observation(frame, names, cmap, "obs", path)
    nxt = _observation(frame, names, cmap, "next_obs", path, required=False) if next_obs else None
    act = _block(frame, names, cmap.source("action"), path)
    cols = {r: _column(frame, c) for r, c in roles.items() if c is not None}
    step_col = cmap.step if cmap.step in names else None
    step = _column(frame, step_col) if step_col else None
    uniq, first = np.unique(ids, return_index=True)
    order = np.argsort(ids, kind="stable")  # rows of each episode together, file order kept within
    bounds = np.searchsorted(ids[order], uniq)
    bounds = np.append(bounds, len(ids))
    out = []
    for j in np.argsort(first, kind="stable"):
        eid = int(uniq[j])
        rows = order[bounds[j] : bounds[j + 1]]
        if step is not None:
            if step.dtype.kind not in "iu":
                raise DatasetError(path, eid, f"{step_col!r} has dtype {step.dtype}; expected integers")
            rows = rows[np.argsort(step[rows], kind="stable")]
            s = step[rows]
            if not np.array_equal(s, np.arange(len(rows))):
                bad = int(np.flatnonzero(s != np.arange(len(rows)))[0])
                raise DatasetError(
                    path,
                    eid,
                    f"steps must be 0..{len(rows) - 1} without gaps or repeats; "
                    f"sorted position {bad} holds step {s[bad]}",
                )
        term = cols["terminal"][rows]
        if "truncated" in cols:
            trunc = cols["truncated"][rows]
        else:  # no truncation column: an episode that ends without terminating was cut
            trunc = np.zeros(len(rows), bool)
            trunc[-1] = not bool(np.asarray(term)[-1])
        raw = {
            "obs": _pick(obs, rows),
            "action": act[rows],
            "reward": cols["reward"][rows],
            "terminal": term,
            "truncated": trunc,
            "next_obs": _pick(nxt, rows),
        }
        labels = {r: c for r, c in {**roles, "obs": cmap.source("obs"), "action": cmap.source("action")}.items() if c}
        out.append((eid, make_episode(path, eid, **raw, labels=labels, want_next=next_obs, strict=strict)))
    return out


FORMAT = Format("parquet", plan, read)


def read_parquet(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    gamma: float | None = None,
    strict: bool | None = None,
    chunk_episodes: int | None = None,
    frame_backend: str | None = None,
    columns: ColumnMap | None = None,
    next_obs: bool = False,
) -> Iterator[dict[str, np.ndarray]]:
    """Yield the canonical episodes of Parquet step tables, file by file.

    Parameters
    ----------
    paths : str, Path or list of them
        Files, directories (every ``*.parquet`` below, sorted) or globs.
    gamma, strict, chunk_episodes
        As for :func:`~gear_flow.ingest.read_minari`.
    frame_backend : {"pandas", "cudf"}, optional
        Frame library the files are read into (default pandas).
    columns : ColumnMap or dict, optional
        Column names of another tool's layout (e.g. :data:`~gear_flow.ingest.columns.LEROBOT`); default:
        detected from the first file (ours, or LeRobot's), a dict of file column -> role replacing its
        mappings of the same roles.
    next_obs : bool, default False
        Add ``next_obs`` (a mapped ``next_obs`` column, else the next row).

    Yields
    ------
    dict of str to numpy.ndarray
        The canonical episode.

    Examples
    --------
    >>> n = sum(1 for _ in read_parquet("data/cartpole/parquet/cartpole-mixed-v0"))  # doctest: +SKIP
    """
    return iter_episodes(
        FORMAT,
        paths,
        gamma=gamma,
        strict=strict,
        chunk_episodes=chunk_episodes,
        frame_backend=frame_backend,
        columns=layout_of(paths, columns)[0],
        next_obs=next_obs,
    )


def layout_of(
    source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], columns: object = None
) -> tuple[ColumnMap, str | None]:
    """The layout to read ``source`` with: a ColumnMap as given; else the layout detected from its first
    file's columns (:func:`~gear_flow.ingest.columns.detect_layout`), with a dict's file column -> role
    mappings replacing the detected layout's mappings of the same roles.

    Parameters
    ----------
    source : str, os.PathLike, or sequence of them
        As for :func:`files_of`.
    columns : ColumnMap, dict or None
        As the caller gave it.

    Returns
    -------
    layout : ColumnMap
        What to read with.
    detected : str or None
        The detected layout's name (:data:`~gear_flow.ingest.columns.LAYOUTS`); None for a ColumnMap.

    Raises
    ------
    SpecError
        ``columns`` is neither a ColumnMap nor a dict, or a mapping ColumnMap rejects.
    DatasetError
        No Parquet file in ``source``, or the first cannot be read.
    """
    import pyarrow.parquet as pq

    if isinstance(columns, ColumnMap):
        return columns, None
    if columns is not None and not isinstance(columns, dict):
        raise SpecError(f"columns= must be a ColumnMap or a dict of file column -> role, got {type(columns).__name__}")
    if columns is not None:
        ColumnMap(dict(columns))  # its own checks first, naming what is wrong in it
    first = files_of(source)[0]
    try:
        names = pq.read_schema(first).names
    except Exception as e:  # pyarrow raises ArrowInvalid / OSError for non-Parquet files
        raise DatasetError(first, None, f"cannot be read as Parquet ({e})") from None
    layout, name = detect_layout(names)
    return (layout, name) if columns is None else (with_columns(layout, dict(columns)), name)
