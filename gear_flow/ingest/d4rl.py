"""D4RL-style flat HDF5: ``observations, actions, rewards, terminals, timeouts`` over all steps.

The file holds one row per step of all episodes back to back (``observations``
``[N, d]``, ``actions`` ``[N]`` or ``[N, a]``, ``rewards``, ``terminals``,
``timeouts`` ``[N]``; any other datasets, e.g. ``next_observations`` or
``infos/*``, are ignored).  Splitting rule: an episode ends at a step whose
``terminals`` *or* ``timeouts`` flag is True, and that step belongs to the
episode it ends; rows after the last flagged step form a final episode, marked
truncated.  Partitions are row ranges holding ``chunk_episodes`` whole episodes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import DatasetError
from .common import Format, Partition, Plan, iter_episodes, make_episode

KEYS = {
    "obs": "observations",
    "action": "actions",
    "reward": "rewards",
    "terminal": "terminals",
    "truncated": "timeouts",
}


def split_points(terminals: np.ndarray, timeouts: np.ndarray) -> np.ndarray:
    """``[0, e_1, ..., N]``: episode ``k`` is rows ``[b[k], b[k+1])``.

    An episode ends *after* each row flagged terminal or timeout (the flagged
    row is its last step); trailing unflagged rows form a last episode.

    Examples
    --------
    >>> split_points(np.array([0, 0, 1, 0, 0, 0, 0], bool), np.array([0, 0, 0, 0, 0, 1, 0], bool)).tolist()
    [0, 3, 6, 7]
    """
    ends = np.flatnonzero(np.asarray(terminals, bool) | np.asarray(timeouts, bool)) + 1
    n = len(terminals)
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

    missing = [k for k in KEYS.values() if k not in f]
    if missing:
        raise DatasetError(
            path,
            None,
            f"dataset(s) {missing} are missing (the file has {sorted(f.keys())}); "
            f"a D4RL file needs {list(KEYS.values())}",
        )
    ds = {role: f[k] for role, k in KEYS.items()}
    for role, d in ds.items():
        if not isinstance(d, h5py.Dataset) or len(d.shape) == 0:
            raise DatasetError(path, None, f"{KEYS[role]!r} must be an array with one row per step")
    n = ds["obs"].shape[0]
    rows = {KEYS[r]: d.shape[0] for r, d in ds.items()}
    if len(set(rows.values())) != 1:
        raise DatasetError(path, None, f"ragged columns: every dataset needs one row per step, got rows {rows}")
    return ds, n


def _flags(path, name, a: np.ndarray) -> np.ndarray:
    if a.dtype.kind == "b":
        return a
    if a.dtype.kind not in "iuf" or np.any((a != 0) & (a != 1)):
        raise DatasetError(path, None, f"{name!r} (dtype {a.dtype}) must hold True/False (or 0/1)")
    return a != 0


def plan(source, chunk_episodes: int, **_) -> Plan:
    """Row ranges of ``chunk_episodes`` episodes, from the ``terminals`` and ``timeouts`` flags only."""
    with _open(source) as f:
        ds, n = _datasets(f, source)
        b = split_points(
            _flags(source, "terminals", ds["terminal"][()]), _flags(source, "timeouts", ds["truncated"][()])
        )
    parts = []
    for k, e in enumerate(range(0, len(b) - 1, chunk_episodes)):
        e2 = min(e + chunk_episodes, len(b) - 1)
        parts.append(Partition("d4rl", str(source), k, (int(b[e]), int(b[e2])), e2 - e, int(b[e2] - b[e]), e))
    return Plan("d4rl", str(source), parts, len(b) - 1, n)


def read(part: Partition, gamma: float, strict: bool, **_) -> list[tuple[int, dict]]:
    """The canonical episodes of one row range, as ``(dataset-wide episode index, episode)``."""
    lo, hi = part.selector
    with _open(part.path) as f:
        ds, _ = _datasets(f, part.path)
        rows = {role: d[lo:hi] for role, d in ds.items()}
    term = _flags(part.path, "terminals", rows["terminal"])
    tout = _flags(part.path, "timeouts", rows["truncated"])
    b = split_points(term, tout)
    out = []
    for j in range(len(b) - 1):
        s, e = int(b[j]), int(b[j + 1])
        k = part.first_episode + j
        trunc = tout[s:e].copy()
        if not (term[e - 1] or tout[e - 1]):  # rows after the last flag: a final, truncated episode
            trunc[-1] = True
        raw = {
            "obs": rows["obs"][s:e],
            "action": rows["action"][s:e],
            "reward": rows["reward"][s:e],
            "terminal": term[s:e],
            "truncated": trunc,
        }
        try:
            out.append((k, make_episode(part.path, k, **raw, labels=KEYS, gamma=gamma, strict=strict)))
        except DatasetError as err:  # name the rows too: D4RL episodes have no id in the file
            raise DatasetError(err.path, f"{k} (rows {lo + s}..{lo + e - 1})", err.problem) from None
    return out


FORMAT = Format("d4rl", plan, read)


def read_d4rl(path, *, gamma: float | None = None, strict: bool | None = None, chunk_episodes: int | None = None):
    """Yield the canonical episodes of a D4RL-style flat HDF5 file, in file order.

    Parameters
    ----------
    path : str or Path
        The HDF5 file.
    gamma, strict, chunk_episodes
        As for :func:`~gear_flow.ingest.read_minari`.

    Yields
    ------
    dict of str to numpy.ndarray
        The canonical episode; ``truncated[-1]`` is True for episodes cut by a
        timeout and for the trailing rows without an end flag.

    Examples
    --------
    >>> lengths = [len(e["reward"]) for e in read_d4rl("data/cartpole/d4rl/cartpole-mixed-v0.hdf5")]  # doctest: +SKIP
    """
    return iter_episodes(FORMAT, path, gamma=gamma, strict=strict, chunk_episodes=chunk_episodes)
