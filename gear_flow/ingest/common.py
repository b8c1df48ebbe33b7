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
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

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
    """The partitions of a dataset and the totals its metadata promises (if any)."""

    fmt: str
    source: str
    partitions: list[Partition]
    expected_episodes: int | None = None
    expected_steps: int | None = None


@dataclass(frozen=True)
class Format:
    """A dataset format: how to find its partitions and how to read one.

    ``plan(source, chunk_episodes, **options) -> Plan``;
    ``read(partition, strict, **options) -> list of (source id, episode)``, the
    episodes at native precision (:func:`~gear_flow.ingest.episode.make_episode`).
    """

    name: str
    plan: Callable[..., Plan]
    read: Callable[..., list]


def resolve(gamma=None, strict=None, chunk_episodes=None) -> tuple[float, bool, int]:
    """Keyword arguments, falling back to the ``gear-flow.ingest`` configuration."""
    gamma = float(config.get("ingest.gamma", gamma))
    strict = bool(config.get("ingest.strict", strict))
    chunk = config.get("ingest.chunk_episodes", chunk_episodes)
    if not 0.0 <= gamma <= 1.0:
        raise InvalidDataError(f"gamma ({gamma}) must be in [0, 1]")
    if isinstance(chunk, bool) or not isinstance(chunk, (int, np.integer)) or chunk < 1:
        raise InvalidDataError(f"chunk_episodes ({chunk!r}) must be a positive integer")
    return gamma, strict, int(chunk)


def iter_episodes(fmt: Format, source, *, gamma=None, strict=None, chunk_episodes=None, **options) -> Iterator[dict]:
    """Read a whole dataset in this process, partition by partition (the public readers): canonical episodes."""
    gamma, strict, chunk = resolve(gamma, strict, chunk_episodes)
    for part in fmt.plan(source, chunk, **options).partitions:
        for _, ep in fmt.read(part, strict, **options):
            yield canonical(ep, gamma)


# -- parsed partitions, table checks, checksums ------------------------------------------------------


@dataclass
class ParsedPartition:
    """A read, validated partition: episodes cast to the table's columns, plus what the client needs.

    Kept where it was read (as a Dask future's result) until it is inserted.
    """

    partition: Partition
    episodes: list[dict] = field(default_factory=list)
    ids: list = field(default_factory=list)
    sums: np.ndarray | None = None  # float64 [episodes, columns]: per-episode column sums
    worker: str | None = None  # address of the worker that read it (None: in-process)

    def summary(self) -> dict:
        """Small enough to send to the client: counts, lengths, source ids, per-episode sums."""
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


def episode_sums(ep: dict, names) -> np.ndarray:
    """float64 sum of every column of one episode (bool columns: count of True)."""
    return np.array([np.sum(ep[n], dtype=np.float64) for n in names], dtype=np.float64)


def combine_sums(per_episode: list[np.ndarray], names) -> dict[str, float]:
    """Per-column checksums: ``math.fsum`` over per-episode sums.

    ``fsum`` is exactly rounded, so the result does not depend on the order
    (or the shard) in which episodes are combined: the same episodes give
    bit-identical checksums whether summed at reading or read back from a table.
    """
    rows = [np.atleast_2d(s) for s in per_episode if s is not None and np.size(s)]
    if not rows:
        return {n: 0.0 for n in names}
    m = np.concatenate(rows, axis=0)
    return {n: math.fsum(m[:, j].tolist()) for j, n in enumerate(names)}


def check_table_columns(spec: TableSpec) -> None:
    """Every column of the table must be one the readers can produce."""
    unknown = [n for n in spec.names if n not in COLUMNS and not is_obs_column(n)]
    if unknown:
        raise SpecError(
            f"table column(s) {unknown} are not produced by the dataset readers; readers produce "
            f"{list(COLUMNS)}, next_obs, and obs__<key>/next_obs__<key> for Dict/Tuple observations "
            "(see gear_flow.ingest.episode_columns)"
        )


def wants_next(spec: TableSpec) -> bool:
    """Does the table keep next observations (a ``next_obs`` or ``next_obs__<key>`` column)?"""
    return any(n == "next_obs" or n.startswith("next_obs" + SEP) for n in spec.names)


def _integral(path, episode, name, a: np.ndarray, dtype) -> np.ndarray:
    """Float values into an integer column: only when every value is a whole number (d4rl stores floats)."""
    bad = np.flatnonzero(~np.isfinite(a.reshape(len(a), -1)).all(axis=1) | (a.reshape(len(a), -1) % 1 != 0).any(axis=1))
    if len(bad):
        raise DatasetError(
            path,
            episode,
            f"{name}[{bad[0]}] = {a[bad[0]].tolist()!r} is not a whole number; the table's {name!r} is {dtype}",
        )
    return a.astype(dtype)


def fit_to_table(spec: TableSpec, path, episode, ep: dict, gamma: float = 1.0) -> dict:
    """The table's columns, cast to its dtypes, derived columns computed after the cast.

    DatasetError naming the episode when a column is missing or does not fit.
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
    """Read and validate one partition against the table (runs on the worker that will insert it)."""
    pairs = fmt.read(part, strict, **{**options, "next_obs": wants_next(spec)})
    eps = [fit_to_table(spec, part.path, sid, ep, gamma) for sid, ep in pairs]
    names = spec.names
    sums = np.stack([episode_sums(e, names) for e in eps]) if eps else np.zeros((0, len(names)))
    return ParsedPartition(part, eps, [sid for sid, _ in pairs], sums)
