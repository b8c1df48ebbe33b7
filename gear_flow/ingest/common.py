"""What every dataset reader shares: the canonical episode, its columns, partitions, checksums.

A reader turns the arrays of one episode in a file into the *canonical
episode*: a dict of NumPy arrays, one row per step,

=================  ==================  ================================================
column             dtype, shape        meaning
=================  ==================  ================================================
``obs``            float32 ``[T, d]``  observation at step ``t``; a Dict/Tuple space
                                       gives one column per leaf, ``obs__<key>``
                                       (``obs__goal__0``: Tuple member 0 of key goal)
``next_obs``       float32 ``[T, d]``  optional (a table with this column asks for it):
                                       the observation after step ``t``, so that a
                                       truncated episode keeps the one its last
                                       Q-target bootstraps from (``next_obs__<key>``)
``action``         int64 ``[T]``       action at step ``t`` (float32 ``[T, a]`` for
                                       continuous actions)
``reward``         float32 ``[T]``     reward after step ``t``
``done``           bool ``[T]``        the episode *terminated* at step ``t`` (only the
                                       last step can be True)
``truncated``      bool ``[T]``        the episode was cut (time limit, end of file)
                                       at step ``t`` (only the last step can be True)
``rtg``            float32 ``[T]``     derived: return-to-go ``sum_{k>=t} gamma^(k-t) r_k``
``timestep``       int64 ``[T]``       derived: ``0 .. T-1``
=================  ==================  ================================================

The public readers yield float32 floats; :func:`~gear_flow.ingest.ingest`
casts the file's own values to the *table's* dtypes instead (a float64 column
keeps float64 values exactly, float actions holding integers go into an integer
column) and derives ``rtg`` from the reward as stored.  :func:`episode_columns`
gives the matching :class:`~gear_flow.ColumnSpec` tuple.  A file is read in
*partitions* (:class:`Partition`: a chunk of Minari episodes, a range of D4RL
rows, episodes of one Parquet file); every episode lies in exactly one partition.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import DTypeLike

from .. import config
from ..errors import DatasetError, InvalidDataError, SpecError
from ..spec import ColumnSpec, TableSpec
from .episode import SEP, canonical, derive, is_obs_column, make_episode, return_to_go  # noqa: F401 (re-exported)

#: canonical columns, in the order :func:`episode_columns` returns them
COLUMNS: tuple[str, ...] = ("obs", "action", "reward", "done", "truncated", "rtg", "timestep")
#: the columns computed at ingestion rather than read
DERIVED: tuple[str, ...] = ("rtg", "timestep")


def episode_columns(
    obs_dim: int | tuple[int, ...] | Mapping[str, int | tuple[int, ...]],
    action_dtype: DTypeLike = np.int64,
    action_shape: tuple[int, ...] = (),
    *,
    derived: bool = True,
    next_obs: bool = False,
    float_dtype: DTypeLike = np.float32,
) -> tuple[ColumnSpec, ...]:
    """The columns of the canonical episode, for a :class:`~gear_flow.TableSpec`.

    Parameters
    ----------
    obs_dim : int, tuple of int, or dict of str to either
        Observation size (or per-step shape); a dict gives one ``obs__<key>``
        column per key (a Dict space, flattened).
    action_dtype : numpy dtype-like, default int64
        ``int64`` for discrete actions, ``float32`` for continuous ones.
    action_shape : tuple of int, default ()
        Per-step action shape (``(a,)`` for continuous actions).
    derived : bool, default True
        Include the derived ``rtg`` and ``timestep`` columns.
    next_obs : bool, default False
        Add ``next_obs`` column(s): ingestion then keeps each step's next
        observation (for DQN/SAC-style bootstrapping).
    float_dtype : numpy dtype-like, default float32
        dtype of the observation, reward and ``rtg`` columns (float64 keeps a
        float64 file's values exactly).

    Returns
    -------
    tuple of ColumnSpec
        ``obs`` column(s), then ``next_obs`` column(s) if asked for, ``action``,
        ``reward``, ``done``, ``truncated``, and ``rtg``, ``timestep`` if
        ``derived``.

    Examples
    --------
    >>> [c.name for c in episode_columns(4)]
    ['obs', 'action', 'reward', 'done', 'truncated', 'rtg', 'timestep']
    >>> [c.name for c in episode_columns({"position": 2, "goal": 2}, derived=False, next_obs=True)][:3]
    ['obs__position', 'obs__goal', 'next_obs__position']
    """
    fdt = np.dtype(float_dtype)
    dims = obs_dim if isinstance(obs_dim, dict) else {"": obs_dim}
    obs = []
    for key, d in dims.items():
        shape = (int(d),) if np.ndim(d) == 0 else tuple(int(s) for s in d)
        obs.append((key, shape))
    name = lambda role, key: role + (SEP + key if key else "")  # noqa: E731
    cols = tuple(ColumnSpec(name("obs", k), s, fdt) for k, s in obs)
    if next_obs:
        cols += tuple(ColumnSpec(name("next_obs", k), s, fdt) for k, s in obs)
    cols += (
        ColumnSpec("action", tuple(action_shape), np.dtype(action_dtype)),
        ColumnSpec("reward", (), fdt),
        ColumnSpec("done", (), np.bool_),
        ColumnSpec("truncated", (), np.bool_),
    )
    if derived:
        cols += (ColumnSpec("rtg", (), fdt), ColumnSpec("timestep", (), np.int64))
    return cols


# -- partitions -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Partition:
    """One unit of reading: whole episodes, read by one task.

    Attributes
    ----------
    fmt : str
        The format (``minari``, ``d4rl``, ``parquet``).
    path : str
        The file it reads.
    index : int
        Its position in the plan.
    selector : tuple
        Format-specific: Minari episode indices, a D4RL ``(start, stop)`` row
        range, Parquet ``episode_id`` values (empty: the whole file).
    episodes : int
        Episodes in it (as far as planning can tell).
    steps : int
        Steps in it (as far as planning can tell; used to balance workers).
    first_episode : int
        Dataset-wide index of its first episode (for messages).
    """

    fmt: str
    path: str
    index: int
    selector: tuple = ()
    episodes: int = 0
    steps: int = 0
    first_episode: int = 0


@dataclass
class Plan:
    """The partitions of a dataset and the totals its metadata promises (if any).

    Attributes
    ----------
    fmt : str
        The format's name (``minari``, ``d4rl``, ``parquet``).
    source : str
        The dataset as given (a file, directory, glob or dataset id).
    partitions : list of Partition
        Every episode of the dataset lies in exactly one of them.
    expected_episodes : int or None
        Episodes the dataset's metadata says it holds (None: it does not say);
        ingestion checks the count it read against it.
    expected_steps : int or None
        Steps the metadata says it holds, likewise.
    """

    fmt: str
    source: str
    partitions: list[Partition]
    expected_episodes: int | None = None
    expected_steps: int | None = None


@dataclass(frozen=True)
class Format:
    """A dataset format: how to find its partitions and how to read one.

    Attributes
    ----------
    name : str
        The name ``ingest(fmt=...)`` takes.
    plan : callable
        ``plan(source, chunk_episodes, **options) -> Plan``: the dataset's
        partitions, at most ``chunk_episodes`` episodes each where the format
        can split a file.
    read : callable
        ``read(partition, strict, **options) -> list of (source id, episode)``,
        the episodes at native precision
        (:func:`~gear_flow.ingest.episode.make_episode`).
    """

    name: str
    plan: Callable[..., Plan]
    read: Callable[..., list]


def resolve(
    gamma: float | None = None, strict: bool | None = None, chunk_episodes: int | None = None
) -> tuple[float, bool, int]:
    """Keyword arguments, falling back to the ``gear-flow.ingest`` configuration.

    Parameters
    ----------
    gamma : float, optional
        Discount of the derived ``rtg`` column, in ``[0, 1]``
        (default: ``gear-flow.ingest.gamma``).
    strict : bool, optional
        Reject non-finite rewards/observations and end flags before an
        episode's last step; False stores them as the file has them (the
        episode is the file's, its ends where the file's episode ends)
        (default: ``gear-flow.ingest.strict``).
    chunk_episodes : int, optional
        Most episodes per partition (read by one task), a positive integer
        (default: ``gear-flow.ingest.chunk_episodes``).

    Returns
    -------
    tuple of (float, bool, int)
        ``(gamma, strict, chunk_episodes)``, validated.

    Raises
    ------
    InvalidDataError
        ``gamma`` is outside ``[0, 1]`` or ``chunk_episodes`` is not a positive integer.
    """
    gamma = float(config.get("ingest.gamma", gamma))
    strict = bool(config.get("ingest.strict", strict))
    chunk = config.get("ingest.chunk_episodes", chunk_episodes)
    if not 0.0 <= gamma <= 1.0:
        raise InvalidDataError(f"gamma ({gamma}) must be in [0, 1]")
    if isinstance(chunk, bool) or not isinstance(chunk, (int, np.integer)) or chunk < 1:
        raise InvalidDataError(f"chunk_episodes ({chunk!r}) must be a positive integer")
    return gamma, strict, int(chunk)


def iter_episodes(
    fmt: Format,
    source: str | os.PathLike[str],
    *,
    gamma: float | None = None,
    strict: bool | None = None,
    chunk_episodes: int | None = None,
    **options: Any,
) -> Iterator[dict[str, np.ndarray]]:
    """Read a whole dataset in this process, partition by partition (the public readers).

    Parameters
    ----------
    fmt : Format
        The dataset's format.
    source : str or os.PathLike
        The dataset (file, directory or glob, as the format takes it).
    gamma, strict, chunk_episodes : optional
        As in :func:`resolve`; None falls back to the configuration.
    **options
        Format-specific options, passed to its ``plan`` and ``read``.

    Yields
    ------
    dict of str to numpy.ndarray
        Canonical episodes (float32 floats, derived ``rtg``/``timestep``), in
        the dataset's order.
    """
    gamma, strict, chunk = resolve(gamma, strict, chunk_episodes)
    for part in fmt.plan(source, chunk, **options).partitions:
        for _, ep in fmt.read(part, strict, **options):
            yield canonical(ep, gamma)


# -- parsed partitions, table checks, checksums ------------------------------------------------------


@dataclass
class ParsedPartition:
    """A read, validated partition: episodes cast to the table's columns, plus what the client needs.

    Kept where it was read (as a Dask future's result) until it is inserted.

    Attributes
    ----------
    partition : Partition
        What was read.
    episodes : list of dict of str to numpy.ndarray
        Its episodes, cast to the table's columns and dtypes.
    ids : list of int or str
        Each episode's id in the source (Minari episode index, Parquet
        ``episode_id``, D4RL episode number).
    sums : numpy.ndarray or None
        float64 ``[episodes, columns]``: per-episode column sums (checksums).
    worker : str or None
        Address of the worker that read it (None: read in-process).
    """

    partition: Partition
    episodes: list[dict] = field(default_factory=list)
    ids: list = field(default_factory=list)
    sums: np.ndarray | None = None
    worker: str | None = None

    def summary(self) -> dict[str, Any]:
        """Small enough to send to the client: counts, lengths, source ids, per-episode sums.

        Returns
        -------
        dict
            ``index`` and ``path`` of the partition, ``episodes`` and ``steps``
            (counts), ``lengths`` (steps per episode), ``ids`` (source ids),
            ``sums`` (as the attribute) and ``worker``.
        """
        lengths = [len(next(iter(e.values()))) for e in self.episodes]
        return {
            "index": self.partition.index,
            "path": self.partition.path,
            "episodes": len(self.episodes),
            "steps": int(sum(lengths)),
            "lengths": lengths,
            "ids": list(self.ids),
            "sums": self.sums,
            "worker": self.worker,
        }


def episode_sums(ep: Mapping[str, np.ndarray], names: Sequence[str]) -> np.ndarray:
    """float64 sum of every column of one episode (bool columns: count of True).

    Parameters
    ----------
    ep : mapping of str to numpy.ndarray
        One episode, a column per name.
    names : sequence of str
        The columns to sum, in order.

    Returns
    -------
    numpy.ndarray
        float64 ``[len(names)]``.
    """
    return np.array([np.sum(ep[n], dtype=np.float64) for n in names], dtype=np.float64)


def combine_sums(per_episode: Sequence[np.ndarray | None], names: Sequence[str]) -> dict[str, float]:
    """Per-column checksums: ``math.fsum`` over per-episode sums.

    ``fsum`` is exactly rounded, so the result does not depend on the order
    (or the shard) in which episodes are combined: the same episodes give
    bit-identical checksums whether summed at reading or read back from a table.

    Parameters
    ----------
    per_episode : sequence of numpy.ndarray or None
        Per-episode sums as :func:`episode_sums` returns them, or stacks of
        them ``[episodes, columns]``; None and empty arrays are skipped.
    names : sequence of str
        The columns, in the order of the sums.

    Returns
    -------
    dict of str to float
        Column name to its checksum (0.0 for every column when there is nothing).
    """
    rows = [np.atleast_2d(s) for s in per_episode if s is not None and np.size(s)]
    if not rows:
        return {n: 0.0 for n in names}
    m = np.concatenate(rows, axis=0)
    return {n: math.fsum(m[:, j].tolist()) for j, n in enumerate(names)}


def same_checksum(a: float | None, b: float | None) -> bool:
    """Whether two checksums of :func:`combine_sums` agree: equal, or both NaN (a column holding a NaN, or
    both infinities, sums to NaN on either side, though its values are the same bit for bit).

    Parameters
    ----------
    a, b : float or None
        The checksums (None: the column is missing on that side).

    Returns
    -------
    bool
        They agree.
    """
    if a is None or b is None:
        return a is b
    return a == b or (math.isnan(a) and math.isnan(b))


def capacity_groups(lengths: Sequence[int], capacity: int) -> list[np.ndarray]:
    """Episodes of ``lengths`` as consecutive groups of at most ``capacity`` steps each (an episode longer
    than that in a group of its own): the inserts a dataset larger than the table goes in as, so that
    none puts more than a shard's capacity on a shard, whatever the routing, and the oldest episodes are
    evicted as separate inserts evict them (both tables' ingest: ``dataflow.insert_fitting``,
    ``cluster._fitting_groups``).

    Parameters
    ----------
    lengths : sequence of int
        Each episode's steps, in order.
    capacity : int
        A shard's.

    Returns
    -------
    list of numpy.ndarray
        int64 indices into ``lengths``, each group's, in order.

    Examples
    --------
    >>> [g.tolist() for g in capacity_groups([5, 5, 20, 20, 5, 30], 25)]
    [[0, 1], [2], [3, 4], [5]]
    """
    everything = np.arange(len(lengths))
    groups, start, steps = [], 0, 0
    for i, n in enumerate(lengths):
        if steps + n > capacity and i > start:
            groups.append(everything[start:i])
            start, steps = i, 0
        steps += n
    return groups + [everything[start:]]


def check_table_columns(spec: TableSpec) -> None:
    """Every column of the table must be one the readers can produce.

    Parameters
    ----------
    spec : TableSpec
        The table ingestion writes into.

    Raises
    ------
    SpecError
        A column is none of the canonical ones (:data:`COLUMNS`, ``next_obs``,
        ``obs__<key>``/``next_obs__<key>``).
    """
    unknown = [n for n in spec.names if n not in COLUMNS and not is_obs_column(n)]
    if unknown:
        raise SpecError(
            f"table column(s) {unknown} are not produced by the dataset readers; readers produce "
            f"{list(COLUMNS)}, next_obs, and obs__<key>/next_obs__<key> for Dict/Tuple observations "
            "(see gear_flow.ingest.episode_columns)"
        )


def wants_next(spec: TableSpec) -> bool:
    """Does the table keep next observations (a ``next_obs`` or ``next_obs__<key>`` column)?

    Parameters
    ----------
    spec : TableSpec
        The table.

    Returns
    -------
    bool
        True when the readers must keep each step's next observation.
    """
    return any(n == "next_obs" or n.startswith("next_obs" + SEP) for n in spec.names)


def _integral(path, episode, name, a: np.ndarray, dtype) -> np.ndarray:
    """Float values into an integer column: only when every value is a whole number (d4rl stores floats) that
    the column's type holds (a cast of one that it does not wraps round to another number: 300 into int8 is 44)."""
    bad = np.flatnonzero(~np.isfinite(a.reshape(len(a), -1)).all(axis=1) | (a.reshape(len(a), -1) % 1 != 0).any(axis=1))
    if len(bad):
        raise DatasetError(
            path,
            episode,
            f"{name}[{bad[0]}] = {a[bad[0]].tolist()!r} is not a whole number; the table's {name!r} is {dtype}",
        )
    info = np.iinfo(dtype)
    # the bounds as floats hold exactly: the least is -2**(bits - 1) or 0, one past the largest 2**bits(-1)
    out = (a < float(info.min)) | (a >= float(info.max) + 1.0)
    if out.any():
        v = a.reshape(-1)[np.flatnonzero(out.reshape(-1))[0]]
        raise DatasetError(
            path, episode, f"{name}: value {v:.0f} does not fit the table's {name!r}, {dtype} [{info.min}, {info.max}]"
        )
    return a.astype(dtype)


def fit_to_table(
    spec: TableSpec,
    path: str | os.PathLike[str],
    episode: int | str | None,
    ep: Mapping[str, np.ndarray],
    gamma: float = 1.0,
) -> dict[str, np.ndarray]:
    """The table's columns, cast to its dtypes, derived columns computed after the cast.

    Parameters
    ----------
    spec : TableSpec
        The table the episode goes into.
    path : str or os.PathLike
        The file it was read from (for messages).
    episode : int, str or None
        Its id in the file (for messages).
    ep : mapping of str to numpy.ndarray
        The episode at the file's precision (a reader's output).
    gamma : float, default 1.0
        Discount of the derived ``rtg`` column.

    Returns
    -------
    dict of str to numpy.ndarray
        Exactly the table's columns, in its dtypes.

    Raises
    ------
    DatasetError
        Naming the episode, when a column is missing or does not fit (shape,
        non-integral values for an integer column, longer than a shard).
    """
    from ..table.validate import check_episode

    have = {}
    for c in spec.columns:
        if c.name in DERIVED:
            continue
        if c.name not in ep:
            hint = " (the file has no such observation)" if is_obs_column(c.name) else ""
            raise DatasetError(path, episode, f"the dataset has no column {c.name!r}{hint}; it has {sorted(ep)}")
        a = ep[c.name]
        if c.shape == () and a.ndim == 2 and a.shape[1] == 1:
            # a scalar per step: the readers give 1-d observations as [T, 1] (make_episode), which a table of
            # scalar observations (episode_columns(obs_dim=())) refused, its own exports included
            a = a[:, 0]
        if c.dtype.kind in "iu" and a.dtype.kind == "f":
            a = _integral(path, episode, c.name, a, c.dtype)
        have[c.name] = a
    derived = [n for n in DERIVED if n in spec.names]
    if derived:
        src = have.get("reward", ep.get("reward"))
        rdt = spec.column("reward").dtype if "reward" in spec.names else np.float32
        base = {"reward": np.asarray(src).astype(rdt)} if src is not None else {"x": next(iter(ep.values()))}
        rtg_dtype = spec.column("rtg").dtype if "rtg" in spec.names else np.float32
        d = derive(base, gamma, derived, rtg_dtype)
        have.update({n: d[n] for n in derived})
    try:
        out, T = check_episode(spec, have, 0)
    except InvalidDataError as e:
        msg = str(e).removeprefix("episode 0, ").removeprefix("episode 0: ")
        raise DatasetError(path, episode, f"does not fit the table: {msg}") from None
    if T > spec.capacity:
        raise DatasetError(
            path, episode, f"has {T} steps; a shard of this table holds at most {spec.capacity} (capacity)"
        )
    return out


def parse_partition(
    fmt: Format, part: Partition, spec: TableSpec, gamma: float, strict: bool, options: dict
) -> ParsedPartition:
    """Read and validate one partition against the table (runs on the worker that will insert it).

    Parameters
    ----------
    fmt : Format
        The dataset's format.
    part : Partition
        The partition to read.
    spec : TableSpec
        The table its episodes go into.
    gamma : float
        Discount of the derived ``rtg`` column.
    strict : bool
        Reject non-finite values and early end flags (see :func:`resolve`).
    options : dict
        Format-specific options for ``fmt.read``.

    Returns
    -------
    ParsedPartition
        Its episodes fitted to the table, their source ids and checksums
        (``worker`` left None for the caller to fill in).
    """
    pairs = fmt.read(part, strict, **{**options, "next_obs": wants_next(spec)})
    eps = [fit_to_table(spec, part.path, sid, ep, gamma) for sid, ep in pairs]
    names = spec.names
    sums = np.stack([episode_sums(e, names) for e in eps]) if eps else np.zeros((0, len(names)))
    return ParsedPartition(part, eps, [sid for sid, _ in pairs], sums)
