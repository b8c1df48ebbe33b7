"""D4RL-style flat HDF5: ``observations, actions, rewards, terminals[, timeouts]`` over all steps.

The file holds one row per step of all episodes back to back (``observations``
``[N, d]``, ``actions`` ``[N]`` or ``[N, a]``, ``rewards``, ``terminals``,
``timeouts`` ``[N]`` or ``[N, 1]``, as d4rl 1.1's ``get_dataset`` accepts;
``next_observations`` is read when the table keeps next observations; other
datasets, e.g. ``infos/*``, are ignored).  Splitting rule: an episode ends at a
step whose ``terminals`` *or* ``timeouts`` flag is True, and that step belongs
to the episode it ends; rows after the last flagged step form a final episode,
marked truncated.  Files of older releases have no ``timeouts``: episodes then
end at ``terminals`` only, or also every ``max_episode_steps`` steps since the
last end when that option is given (what d4rl's ``qlearning_dataset`` does with
the environment's time limit).  Float actions holding whole numbers go into an
integer action column.  Partitions are row ranges of ``chunk_episodes`` whole episodes.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from numpy.typing import ArrayLike

from ..errors import DatasetError
from .common import Format, Partition, Plan, iter_episodes, make_episode
from .episode import guard

KEYS = {
    "obs": "observations",
    "action": "actions",
    "reward": "rewards",
    "terminal": "terminals",
    "truncated": "timeouts",
}


def split_points(terminals: ArrayLike, timeouts: ArrayLike, max_episode_steps: int | None = None) -> np.ndarray:
    """``[0, e_1, ..., N]``: episode ``k`` is rows ``[b[k], b[k+1])``.

    An episode ends *after* each row flagged terminal or timeout (the flagged
    row is its last step); trailing unflagged rows form a last episode.  With
    ``max_episode_steps``, an episode also ends after that many steps.

    Parameters
    ----------
    terminals : array_like of bool
        ``[N]`` terminated flags, one per row.
    timeouts : array_like of bool
        ``[N]`` time-limit flags, one per row.
    max_episode_steps : int, optional
        Also end an episode after this many steps since the last end (None or
        0: only at flags).

    Returns
    -------
    numpy.ndarray
        int64 episode boundaries, starting with 0 and ending with ``N``.

    Examples
    --------
    >>> split_points(np.array([0, 0, 1, 0, 0, 0, 0], bool), np.array([0, 0, 0, 0, 0, 1, 0], bool)).tolist()
    [0, 3, 6, 7]
    >>> split_points(np.zeros(7, bool), np.zeros(7, bool), max_episode_steps=3).tolist()
    [0, 3, 6, 7]
    """
    ends = np.flatnonzero(np.asarray(terminals, bool) | np.asarray(timeouts, bool)) + 1
    n = len(terminals)
    if max_episode_steps:
        cut, last = [], 0
        for e in [*ends.tolist(), n]:
            cut.extend(range(last + max_episode_steps, e, max_episode_steps))
            last = e
        ends = np.union1d(ends, np.asarray(cut, dtype=np.int64))
    b = np.concatenate(([0], ends))
    if b[-1] != n:
        b = np.concatenate((b, [n]))
    return b.astype(np.int64)


def _open(path):
    import h5py

    p = Path(path)
    if not p.is_file():
        raise DatasetError(p, None, "no such file")
    try:
        return h5py.File(p, "r")
    except OSError as e:
        raise DatasetError(p, None, f"cannot be opened as HDF5 ({e})") from None


def _datasets(f, path) -> tuple[dict, int]:
    import h5py

    need = [KEYS[r] for r in ("obs", "action", "reward", "terminal")]
    missing = [k for k in need if k not in f]
    if missing:
        raise DatasetError(
            path,
            None,
            f"dataset(s) {missing} are missing (the file has {sorted(f.keys())}); "
            f"a D4RL file needs {need} (and 'timeouts' since d4rl's v1 datasets)",
        )
    ds = {role: f[k] for role, k in KEYS.items() if k in f}
    if "next_observations" in f:
        ds["next_obs"] = f["next_observations"]
    for d in ds.values():
        if not isinstance(d, h5py.Dataset) or len(d.shape) == 0:
            raise DatasetError(path, None, f"{d.name.lstrip('/')!r} must be an array with one row per step")
    n = ds["obs"].shape[0]
    rows = {d.name.lstrip("/"): d.shape[0] for d in ds.values()}
    if len(set(rows.values())) != 1:
        raise DatasetError(path, None, f"ragged columns: every dataset needs one row per step, got rows {rows}")
    return ds, n


def _flags(path, name, a: np.ndarray) -> np.ndarray:
    if a.ndim == 2 and a.shape[1] == 1:  # (N, 1), as some releases store them
        a = a[:, 0]
    if a.dtype.kind == "b":
        return a
    if a.dtype.kind not in "iuf" or np.any((a != 0) & (a != 1)):
        raise DatasetError(path, None, f"{name!r} (dtype {a.dtype}) must hold True/False (or 0/1)")
    return a != 0


def _ends(path, ds, sl=slice(None)) -> tuple[np.ndarray, np.ndarray]:
    term = _flags(path, "terminals", ds["terminal"][sl])
    tout = _flags(path, "timeouts", ds["truncated"][sl]) if "truncated" in ds else np.zeros(len(term), bool)
    return term, tout


def plan(
    source: str | os.PathLike[str], chunk_episodes: int, *, max_episode_steps: int | None = None, **_: object
) -> Plan:
    """Row ranges of ``chunk_episodes`` episodes, from the end flags only.

    Parameters
    ----------
    source : str or os.PathLike
        The HDF5 file.
    chunk_episodes : int
        Episodes per partition.
    max_episode_steps : int, optional
        As in :func:`split_points`.
    **_
        Other formats' options, ignored.

    Returns
    -------
    Plan
        Partitions whose ``selector`` is a ``(start, stop)`` row range; the
        expected totals are the episodes found and the file's rows.
    """
    with _open(source) as f, guard(source, None):
        ds, n = _datasets(f, source)
        b = split_points(*_ends(source, ds), max_episode_steps)
    parts = []
    for k, e in enumerate(range(0, len(b) - 1, chunk_episodes)):
        e2 = min(e + chunk_episodes, len(b) - 1)
        parts.append(Partition("d4rl", str(source), k, (int(b[e]), int(b[e2])), e2 - e, int(b[e2] - b[e]), e))
    return Plan("d4rl", str(source), parts, len(b) - 1, n)


def read(
    part: Partition, strict: bool, *, next_obs: bool = False, max_episode_steps: int | None = None, **_: object
) -> list[tuple[int, dict[str, np.ndarray]]]:
    """The episodes of one row range, as ``(dataset-wide episode index, episode)``.

    Parameters
    ----------
    part : Partition
        A partition from :func:`plan`.
    strict : bool
        Reject non-finite values and early end flags.
    next_obs : bool, default False
        Keep next observations (``next_observations`` must be in the file for
        episodes cut by a timeout).
    max_episode_steps : int, optional
        As in :func:`split_points`; must match the value :func:`plan` used.
    **_
        Other formats' options, ignored.

    Returns
    -------
    list of (int, dict of str to numpy.ndarray)
        Episodes at native precision (:func:`~gear_flow.ingest.episode.make_episode`);
        the last step of an episode not ended by ``terminals`` is marked truncated.
    """
    lo, hi = part.selector
    with _open(part.path) as f, guard(part.path, f"{part.first_episode}.. (rows {lo}..{hi - 1})"):
        ds, _ = _datasets(f, part.path)
        rows = {role: d[lo:hi] for role, d in ds.items() if role != "next_obs" or next_obs}
        term, tout = _ends(part.path, ds, slice(lo, hi))
    b = split_points(term, tout, max_episode_steps)
    out = []
    for j in range(len(b) - 1):
        s, e = int(b[j]), int(b[j + 1])
        k = part.first_episode + j
        trunc = tout[s:e].copy()
        if not term[e - 1]:  # cut by a timeout, the time limit, or the end of the file
            trunc[-1] = True
        raw = {
            "obs": rows["obs"][s:e],
            "action": rows["action"][s:e],
            "reward": rows["reward"][s:e],
            "terminal": term[s:e],
            "truncated": trunc,
            "next_obs": rows["next_obs"][s:e] if "next_obs" in rows else None,
        }
        try:
            ep = make_episode(part.path, k, **raw, labels=KEYS, want_next=next_obs, strict=strict)
        except DatasetError as err:  # name the rows too: D4RL episodes have no id in the file
            raise DatasetError(err.path, f"{k} (rows {lo + s}..{lo + e - 1})", err.problem) from None
        out.append((k, ep))
    return out


FORMAT = Format("d4rl", plan, read)


def read_d4rl(
    path: str | os.PathLike[str],
    *,
    gamma: float | None = None,
    strict: bool | None = None,
    chunk_episodes: int | None = None,
    next_obs: bool = False,
    max_episode_steps: int | None = None,
) -> Iterator[dict[str, np.ndarray]]:
    """Yield the canonical episodes of a D4RL-style flat HDF5 file, in file order.

    Parameters
    ----------
    path : str or Path
        The HDF5 file.
    gamma, strict, chunk_episodes, next_obs
        As for :func:`~gear_flow.ingest.read_minari`.
    max_episode_steps : int, optional
        For files without ``timeouts``: also end an episode after this many steps.

    Yields
    ------
    dict of str to numpy.ndarray
        The canonical episode; ``truncated[-1]`` is True for episodes cut by a
        timeout and for the trailing rows without an end flag.

    Examples
    --------
    >>> lengths = [len(e["reward"]) for e in read_d4rl("data/cartpole/d4rl/cartpole-mixed-v0.hdf5")]  # doctest: +SKIP
    """
    return iter_episodes(
        FORMAT,
        path,
        gamma=gamma,
        strict=strict,
        chunk_episodes=chunk_episodes,
        next_obs=next_obs,
        max_episode_steps=max_episode_steps,
    )
