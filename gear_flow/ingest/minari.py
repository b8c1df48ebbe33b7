"""Minari datasets: ``<root>/<dataset_id>/data/`` in any of Minari's storage formats.

``data/metadata.json`` holds ``dataset_id``, ``total_episodes``,
``total_steps``, ``data_format``, the serialized spaces, ``env_spec`` and
``minari_version`` (Minari's ``MinariStorage``).  By ``data_format``:

``hdf5`` (the default)
    ``main_data.hdf5`` with one group per episode, ``episode_{i}``, holding
    ``observations`` (``T + 1`` rows: Minari stores the final observation),
    ``actions``, ``rewards``, ``terminations`` and ``truncations`` (``T`` rows).
    A Dict observation space is a group per key, a Tuple space a group of
    ``_index_{j}`` members.
``arrow``, ``parquet``
    one directory per episode, ``data/{i}/``, of Arrow IPC or Parquet files
    (see :mod:`.minari_arrow`).

Dict/Tuple observations become one column per leaf, ``obs__<key>``
(``obs__<j>`` for Tuple member ``j``, nested with ``__``), the naming an export
inverts to rebuild the space.  Actions must be Box or Discrete.  Partitions
are chunks of consecutive episodes.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import DatasetError
from . import minari_arrow
from .common import Format, Partition, Plan, iter_episodes, make_episode
from .episode import guard

MAIN_FILE = "main_data.hdf5"
METADATA_FILE = "metadata.json"
KEYS = {
    "obs": "observations",
    "action": "actions",
    "reward": "rewards",
    "terminal": "terminations",
    "truncated": "truncations",
}
_EPISODE_RE = re.compile(r"episode_(\d+)$")


def locate(source: str | os.PathLike[str]) -> tuple[Path, Path | None]:
    """Find a Minari dataset's data and metadata.

    Parameters
    ----------
    source : str or os.PathLike
        The dataset directory, its ``data`` directory, or ``main_data.hdf5``.

    Returns
    -------
    tuple of (Path, Path or None)
        ``main_data.hdf5`` (or, for the arrow/parquet formats, the data
        directory), and ``metadata.json`` or None where there is none.

    Raises
    ------
    DatasetError
        Neither is there.
    """
    p = Path(source)
    for cand in (p / "data" / MAIN_FILE, p / MAIN_FILE, p):
        if cand.is_file():
            meta = cand.parent / METADATA_FILE
            return cand, (meta if meta.is_file() else None)
    for d in (p / "data", p):
        if (d / METADATA_FILE).is_file():
            return d, d / METADATA_FILE
    raise DatasetError(
        p, None, f"no Minari dataset here: expected {p}/data/{MAIN_FILE} or {p}/data/{METADATA_FILE} (arrow/parquet)"
    )


def read_metadata(meta_path: str | os.PathLike[str] | None) -> dict[str, Any]:
    """A dataset's ``metadata.json``.

    Parameters
    ----------
    meta_path : str, os.PathLike or None
        The file, as :func:`locate` found it.

    Returns
    -------
    dict
        Its contents (``total_episodes``, ``total_steps``, ``data_format``...);
        empty when ``meta_path`` is None.

    Raises
    ------
    DatasetError
        The file cannot be read or is not JSON.
    """
    if meta_path is None:
        return {}
    try:
        return json.loads(Path(meta_path).read_text())
    except (OSError, ValueError) as e:
        raise DatasetError(meta_path, None, f"is not valid JSON ({e})") from None


def _h5(path):
    import h5py

    try:
        return h5py.File(path, "r")
    except OSError as e:
        raise DatasetError(path, None, f"cannot be opened as HDF5 ({e})") from None


def plan(source: str | os.PathLike[str], chunk_episodes: int, **_: object) -> Plan:
    """Chunks of ``chunk_episodes`` consecutive episodes; checks the episodes against metadata.json.

    Parameters
    ----------
    source : str or os.PathLike
        As for :func:`locate`.
    chunk_episodes : int
        Episodes per partition.
    **_
        Other formats' options, ignored.

    Returns
    -------
    Plan
        Partitions whose ``selector`` is a tuple of episode indices; expected
        totals from ``metadata.json`` (steps None where it does not say).

    Raises
    ------
    DatasetError
        Episodes are not numbered ``0 .. n-1``, their count disagrees with
        ``total_episodes``, or the data format is unknown.
    """
    main, meta_path = locate(source)
    meta = read_metadata(meta_path)
    if main.is_dir():
        fmt = meta.get("data_format")
        if fmt not in minari_arrow.FORMATS:
            raise DatasetError(
                meta_path,
                None,
                f"data_format {fmt!r} without {MAIN_FILE}; expected hdf5 (with {MAIN_FILE}), arrow or parquet",
            )
        idx, steps = minari_arrow.episodes(main)
    elif main.stat().st_size == 0 and meta_path is not None and meta.get("total_episodes") == 0:
        idx, steps = [], []  # Minari writes an empty dataset's main file with no bytes at all
    else:
        with _h5(main) as f, guard(main, None):
            idx = sorted(int(m.group(1)) for k in f.keys() if (m := _EPISODE_RE.match(k)))
            if not idx and meta_path is None:  # no episode and nothing saying there are none: not Minari's
                raise DatasetError(
                    main, None, f"holds no episode_* group and there is no {METADATA_FILE}: not a Minari dataset"
                )
            steps = []
            for i in idx:
                g = f[f"episode_{i}"]
                n = g.attrs.get("total_steps")
                if n is None:
                    d = g.get("rewards", g.get("actions"))
                    n = d.shape[0] if d is not None and hasattr(d, "shape") and len(d.shape) else 0
                steps.append(int(n))
    if idx != list(range(len(idx))):
        missing = sorted(set(range(max(idx, default=-1) + 1)) - set(idx))
        raise DatasetError(main, None, f"episodes must be numbered 0 .. n-1; missing {missing[:5]}")
    total = meta.get("total_episodes")
    if total is not None and int(total) != len(idx):
        raise DatasetError(
            main, None, f"{METADATA_FILE} says total_episodes={total} but the dataset has {len(idx)} episodes"
        )
    parts = [
        Partition(
            "minari",
            str(main),
            k,
            tuple(idx[a : a + chunk_episodes]),
            len(idx[a : a + chunk_episodes]),
            sum(steps[a : a + chunk_episodes]),
            a,
        )
        for k, a in enumerate(range(0, len(idx), chunk_episodes))
    ]
    exp_steps = meta.get("total_steps")
    return Plan("minari", str(main), parts, len(idx), None if exp_steps is None else int(exp_steps))


def _tree(path, i, node, label):
    """An HDF5 dataset as an array; a group (Dict/Tuple space) as a dict of its members, ``_index_j`` as ``j``."""
    import h5py

    if isinstance(node, h5py.Dataset):
        return node[()]
    if label != "observations":
        raise DatasetError(path, i, f"{label!r} is an HDF5 group (a Dict/Tuple space); actions must be Box or Discrete")
    out = {k.removeprefix("_index_"): _tree(path, i, node[k], label) for k in node.keys()}
    if all(k.startswith("_index_") for k in node.keys()):
        return tuple(out[str(j)] for j in range(len(out)))
    return out


def read(
    part: Partition, strict: bool, *, next_obs: bool = False, **_: object
) -> list[tuple[int, dict[str, np.ndarray]]]:
    """The episodes of a chunk, as ``(episode index, episode)``.

    Parameters
    ----------
    part : Partition
        A partition from :func:`plan`.
    strict : bool
        Reject non-finite values and early end flags.
    next_obs : bool, default False
        Keep next observations (from the stored final observation).
    **_
        Other formats' options, ignored.

    Returns
    -------
    list of (int, dict of str to numpy.ndarray)
        Episodes at native precision (:func:`~gear_flow.ingest.episode.make_episode`).
    """
    if Path(part.path).is_dir():
        return minari_arrow.read(part, strict, next_obs=next_obs)
    out = []
    with _h5(part.path) as f:
        for i in part.selector:
            name = f"episode_{i}"
            with guard(part.path, i):
                if name not in f:
                    raise DatasetError(part.path, i, f"group {name!r} is missing")
                g = f[name]
                raw = {}
                for role, key in KEYS.items():
                    if key not in g:
                        raise DatasetError(
                            part.path, i, f"dataset {key!r} is missing (group {name!r} has {sorted(g.keys())})"
                        )
                    raw[role] = _tree(part.path, i, g[key], key)
            ep = make_episode(part.path, i, **raw, labels=KEYS, final_obs=True, want_next=next_obs, strict=strict)
            out.append((i, ep))
    return out


FORMAT = Format("minari", plan, read)


def read_minari(
    path: str | os.PathLike[str],
    *,
    gamma: float | None = None,
    strict: bool | None = None,
    chunk_episodes: int | None = None,
    next_obs: bool = False,
) -> Iterator[dict[str, np.ndarray]]:
    """Yield the canonical episodes of a Minari dataset, in episode order.

    Parameters
    ----------
    path : str or Path
        The dataset directory (``<root>/<dataset_id>``), its ``data`` directory,
        or ``main_data.hdf5`` itself; any of Minari's ``data_format`` values.
    gamma : float, optional
        Discount of the ``rtg`` column (config ``ingest.gamma``, default 1.0).
    strict : bool, optional
        Reject non-finite rewards/observations and early end flags (config
        ``ingest.strict``, default True).
    chunk_episodes : int, optional
        Episodes read per HDF5 pass (config ``ingest.chunk_episodes``).
    next_obs : bool, default False
        Add ``next_obs`` (``obs`` shifted by one, the final observation last).

    Yields
    ------
    dict of str to numpy.ndarray
        See :mod:`gear_flow.ingest.common` for the columns.

    Examples
    --------
    >>> eps = list(read_minari("data/cartpole/minari/cartpole-mixed-v0"))  # doctest: +SKIP
    >>> eps[0]["rtg"][0] == eps[0]["reward"].sum()                            # doctest: +SKIP
    True
    """
    return iter_episodes(FORMAT, path, gamma=gamma, strict=strict, chunk_episodes=chunk_episodes, next_obs=next_obs)
