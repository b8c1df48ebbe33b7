"""What every dataset reader shares: the canonical episode, its columns, partitions, checksums.

A reader turns the arrays of one episode in a file into the *canonical
episode*: a dict of NumPy arrays, one row per step,

==============  ==================  ================================================
column          dtype, shape        meaning
==============  ==================  ================================================
``obs``         float32 ``[T, d]``  observation at step ``t`` (Minari's final,
                                    post-episode observation is dropped)
``action``      int64 ``[T]``       action at step ``t`` (float32 ``[T, a]`` for
                                    continuous actions)
``reward``      float32 ``[T]``     reward after step ``t``
``done``        bool ``[T]``        the episode *terminated* at step ``t`` (only the
                                    last step can be True)
``truncated``   bool ``[T]``        the episode was cut (time limit, end of file)
                                    at step ``t`` (only the last step can be True)
``rtg``         float32 ``[T]``     derived: return-to-go ``sum_{k>=t} gamma^(k-t) r_k``
``timestep``    int64 ``[T]``       derived: ``0 .. T-1``
==============  ==================  ================================================

:func:`episode_columns` gives the matching :class:`~gear_flow.ColumnSpec` tuple,
so that a table can be created for a dataset.  A file is read in
*partitions* (:class:`Partition`: a chunk of Minari episode groups, a range of
D4RL rows, episodes of one Parquet file); every episode lies in exactly one partition.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from .. import config
from ..errors import DatasetError, InvalidDataError
from ..spec import ColumnSpec, TableSpec

#: canonical columns, in the order :func:`episode_columns` returns them
COLUMNS: tuple[str, ...] = ("obs", "action", "reward", "done", "truncated", "rtg", "timestep")
#: the columns computed at ingestion rather than read
DERIVED: tuple[str, ...] = ("rtg", "timestep")


def episode_columns(obs_dim, action_dtype=np.int64, action_shape=(), *, derived: bool = True) -> tuple[ColumnSpec, ...]:
    """The columns of the canonical episode, for a :class:`~gear_flow.TableSpec`.

    Parameters
    ----------
    obs_dim : int or tuple of int
        Observation size (or per-step observation shape).
    action_dtype : numpy dtype-like, default int64
        ``int64`` for discrete actions, ``float32`` for continuous ones.
    action_shape : tuple of int, default ()
        Per-step action shape (``(a,)`` for continuous actions).
    derived : bool, default True
        Include the derived ``rtg`` and ``timestep`` columns.

    Examples
    --------
    >>> [c.name for c in episode_columns(4)]
    ['obs', 'action', 'reward', 'done', 'truncated', 'rtg', 'timestep']
    """
    obs_shape = (int(obs_dim),) if np.ndim(obs_dim) == 0 else tuple(int(s) for s in obs_dim)
    cols = (
        ColumnSpec("obs", obs_shape, np.float32),
        ColumnSpec("action", tuple(action_shape), np.dtype(action_dtype)),
        ColumnSpec("reward", (), np.float32),
        ColumnSpec("done", (), np.bool_),
        ColumnSpec("truncated", (), np.bool_),
    )
    if derived:
        cols += (ColumnSpec("rtg", (), np.float32), ColumnSpec("timestep", (), np.int64))
    return cols


def return_to_go(reward: np.ndarray, gamma: float = 1.0) -> np.ndarray:
    """``rtg[t] = sum_{k >= t} gamma**(k - t) * reward[k]``, accumulated in float64, as float32."""
    r = np.asarray(reward, dtype=np.float64)
    if gamma == 1.0:
        return np.cumsum(r[::-1])[::-1].astype(np.float32)
    out = np.empty_like(r)
    acc = 0.0
    for t in range(len(r) - 1, -1, -1):  # a recurrence; T is an episode's length
        acc = r[t] + gamma * acc
        out[t] = acc
    return out.astype(np.float32)


def _kind_ok(path, episode, label, a: np.ndarray, kinds: str, what: str) -> None:
    if a.dtype.kind not in kinds:
        raise DatasetError(path, episode, f"{label!r} has dtype {a.dtype}; expected {what}")


def _flags(path, episode, label, a: np.ndarray) -> np.ndarray:
    """End flags: bool, or integers/floats holding only 0 and 1 (old D4RL files store floats)."""
    if a.dtype.kind == "b":
        return a.astype(np.bool_, copy=False)
    _kind_ok(path, episode, label, a, "iuf", "bool (or 0/1 numbers)")
    bad = np.flatnonzero((a != 0) & (a != 1))
    if len(bad):
        raise DatasetError(path, episode, f"{label}[{bad[0]}] = {a[bad[0]]!r}; end flags must be True/False (or 0/1)")
    return a != 0


def make_episode(
    path,
    episode,
    *,
    obs,
    action,
    reward,
    terminal,
    truncated,
    labels: dict[str, str] | None = None,
    final_obs: bool = False,
    gamma: float = 1.0,
    strict: bool = True,
) -> dict[str, np.ndarray]:
    """Validate one episode's raw arrays and return the canonical episode.

    ``labels`` maps the canonical roles (``obs``, ``action``, ``reward``,
    ``terminal``, ``truncated``) to the names used in the file, for messages.
    ``final_obs``: ``obs`` holds ``T + 1`` rows (Minari stores the final
    observation); the last row is dropped.  ``strict``: reject non-finite
    observations or rewards, and end flags before the last step.  Raises
    :class:`~gear_flow.errors.DatasetError` naming ``path``, ``episode`` and the problem.
    """
    lab = {"obs": "obs", "action": "action", "reward": "reward", "terminal": "terminal", "truncated": "truncated"}
    lab.update(labels or {})
    raw = {"obs": obs, "action": action, "reward": reward, "terminal": terminal, "truncated": truncated}
    arr = {}
    for role, v in raw.items():
        try:
            arr[role] = np.asarray(v)
        except (TypeError, ValueError) as e:
            raise DatasetError(path, episode, f"{lab[role]!r} cannot be read as an array ({e})") from None
    _kind_ok(path, episode, lab["obs"], arr["obs"], "biuf", "a numeric dtype")
    _kind_ok(path, episode, lab["action"], arr["action"], "biuf", "an integer (discrete) or float (continuous) dtype")
    _kind_ok(path, episode, lab["reward"], arr["reward"], "iuf", "a numeric dtype")
    for role in ("reward", "terminal", "truncated"):
        if arr[role].ndim != 1:
            raise DatasetError(
                path, episode, f"{lab[role]!r} has shape {arr[role].shape}; expected one value per step, (T,)"
            )
    if arr["obs"].ndim == 1:  # scalar observations
        arr["obs"] = arr["obs"][:, None]
    if arr["action"].ndim == 0 or arr["obs"].ndim == 0:
        raise DatasetError(path, episode, "observations and actions must have one row per step")
    T = len(arr["reward"])
    want = {"obs": T + 1 if final_obs else T, "action": T, "terminal": T, "truncated": T}
    for role, n in want.items():
        if len(arr[role]) != n:
            extra = " (T + 1: the final observation is stored)" if role == "obs" and final_obs else ""
            raise DatasetError(
                path,
                episode,
                f"ragged columns: {lab[role]!r} has {len(arr[role])} rows, {lab['reward']!r} has {T}; "
                f"expected {n}{extra}",
            )
    if T == 0:
        raise DatasetError(path, episode, "the episode has no steps")
    term = _flags(path, episode, lab["terminal"], arr["terminal"])
    trunc = _flags(path, episode, lab["truncated"], arr["truncated"])
    obs_arr = arr["obs"][:T] if final_obs else arr["obs"]
    if strict:
        for role, a in (("reward", arr["reward"]), ("obs", obs_arr)):
            if a.dtype.kind == "f":
                bad = np.flatnonzero(~np.isfinite(a.reshape(len(a), -1)).all(axis=1))
                if len(bad):
                    raise DatasetError(
                        path,
                        episode,
                        f"{lab[role]}[{bad[0]}] is not finite ({a[bad[0]]!r}); strict=True requires finite "
                        f"{lab[role]} (pass strict=False to keep them)",
                    )
        early = np.flatnonzero(term[:-1] | trunc[:-1])
        if len(early):
            raise DatasetError(
                path,
                episode,
                f"an end flag is set at step {early[0]}, before the episode's last step ({T - 1}); "
                "strict=True requires episodes to end only at their last step",
            )
    act = arr["action"]
    act = act.astype(np.int64) if act.dtype.kind in "biu" else act.astype(np.float32)
    reward32 = arr["reward"].astype(np.float32)
    return {
        "obs": np.ascontiguousarray(obs_arr, dtype=np.float32),
        "action": np.ascontiguousarray(act),
        "reward": reward32,
        "done": np.ascontiguousarray(term),
        "truncated": np.ascontiguousarray(trunc),
        "rtg": return_to_go(reward32, gamma),
        "timestep": np.arange(T, dtype=np.int64),
    }


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
    ``read(partition, gamma, strict, **options) -> list of (source id, canonical episode)``.
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
    """Read a whole dataset in this process, partition by partition (the public readers)."""
    gamma, strict, chunk = resolve(gamma, strict, chunk_episodes)
    for part in fmt.plan(source, chunk, **options).partitions:
        for _, ep in fmt.read(part, gamma, strict, **options):
            yield ep


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
    """Every column of the table must be one the readers produce."""
    unknown = [n for n in spec.names if n not in COLUMNS]
    if unknown:
        from ..errors import SpecError

        raise SpecError(
            f"table column(s) {unknown} are not produced by the dataset readers; "
            f"readers produce {list(COLUMNS)} (see gear_flow.ingest.episode_columns)"
        )


def fit_to_table(spec: TableSpec, path, episode, ep: dict) -> dict:
    """Keep the table's columns, checked and cast to its dtypes; DatasetError naming the episode otherwise."""
    from ..table.validate import check_episode

    try:
        out, T = check_episode(spec, {n: ep[n] for n in spec.names}, 0)
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
    pairs = fmt.read(part, gamma, strict, **options)
    eps = [fit_to_table(spec, part.path, sid, ep) for sid, ep in pairs]
    names = spec.names
    sums = np.stack([episode_sums(e, names) for e in eps]) if eps else np.zeros((0, len(names)))
    return ParsedPartition(part, eps, [sid for sid, _ in pairs], sums)
