"""Minari's ``arrow`` and ``parquet`` storage formats: one directory of files per episode.

Layout (Minari 0.5's ``ArrowStorage`` / ``ParquetStorage``, written with
``pyarrow.dataset.write_dataset(partitioning=["episode_id"])``)::

    data/metadata.json          {"data_format": "arrow" | "parquet", "total_episodes", ...}
    data/{i}/part-0.{arrow,parquet}
    data/{i}/metadata.json      {"id": i, "total_steps": T, ...}

Each episode's table has ``T + 1`` rows: ``observations`` (the final
observation included), and ``actions``, ``rewards``, ``terminations``,
``truncations`` padded with one trailing row (dropped here, as Minari's own
reader does).  Box spaces are fixed-size lists (reshaped to the space's shape
from ``metadata.json``), Discrete spaces integers, Dict/Tuple spaces structs
(Tuple members named ``"0"``, ``"1"``...).  JPEG-encoded image observations
(binary columns) are rejected: decoding them is lossy.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from ..errors import DatasetError
from .common import Partition
from .episode import guard, make_episode

#: data_format -> pyarrow.dataset format name
FORMATS = {"arrow": "arrow", "parquet": "parquet"}
KEYS = {
    "obs": "observations",
    "action": "actions",
    "reward": "rewards",
    "terminal": "terminations",
    "truncated": "truncations",
}


def episodes(data: str | os.PathLike[str]) -> tuple[list[int], list[int]]:
    """Episode indices (directory names) and their steps (from each episode's metadata.json).

    Parameters
    ----------
    data : str or os.PathLike
        The dataset's ``data`` directory.

    Returns
    -------
    tuple of (list of int, list of int)
        Episode indices in ascending order, and each one's ``total_steps``
        (0 where its metadata does not say).

    Raises
    ------
    DatasetError
        An episode's ``metadata.json`` is not JSON.
    """
    idx, steps = [], []
    for d in sorted((p for p in Path(data).iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name)):
        meta = d / "metadata.json"
        try:
            n = json.loads(meta.read_text()).get("total_steps", 0) if meta.is_file() else 0
        except (OSError, ValueError) as e:
            raise DatasetError(meta, int(d.name), f"is not valid JSON ({e})") from None
        idx.append(int(d.name))
        steps.append(int(n))
    return idx, steps


def _space(meta: dict, key: str):
    s = meta.get(key)
    return json.loads(s) if isinstance(s, str) else s


def _decode(path, i, arr, space, label):
    """A pyarrow column as an array, or a dict/tuple tree of them for struct (Dict/Tuple) columns."""
    import pyarrow as pa

    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    t = arr.type
    if pa.types.is_struct(t):
        sub = (space or {}).get("subspaces")
        names = [t.field(j).name for j in range(t.num_fields)]
        kids = {}
        for j, n in enumerate(names):
            ss = sub.get(n) if isinstance(sub, dict) else (sub[int(n)] if isinstance(sub, list) else None)
            kids[n] = _decode(path, i, arr.field(j), ss, f"{label}/{n}")
        if (space or {}).get("type") == "Tuple" or (space is None and all(n.isdigit() for n in names)):
            return tuple(kids[str(j)] for j in range(len(kids)))
        return kids
    if pa.types.is_fixed_size_list(t):
        flat = arr.flatten().to_numpy(zero_copy_only=False)
        shape = tuple((space or {}).get("shape") or (t.list_size,))
        return flat.reshape(len(arr), *shape)
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        raise DatasetError(path, i, f"{label!r} holds JPEG-encoded images; only unencoded arrays can be read")
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        vals = arr.to_numpy(zero_copy_only=False)
        try:
            return np.stack([np.asarray(v) for v in vals])
        except ValueError as e:
            raise DatasetError(path, i, f"{label!r} has rows of different lengths ({e})") from None
    return arr.to_numpy(zero_copy_only=False)


def read(part: Partition, strict: bool, *, next_obs: bool = False) -> list[tuple[int, dict[str, np.ndarray]]]:
    """The episodes of one chunk of episode directories, as ``(episode index, episode)``.

    Parameters
    ----------
    part : Partition
        A Minari partition whose ``path`` is the ``data`` directory.
    strict : bool
        Reject non-finite values and early end flags.
    next_obs : bool, default False
        Keep next observations (from the stored final observation).

    Returns
    -------
    list of (int, dict of str to numpy.ndarray)
        Episodes at native precision (the padding row of actions, rewards and
        flags dropped).

    Raises
    ------
    DatasetError
        A missing episode directory or column, or JPEG-encoded observations.
    """
    import pyarrow.dataset as pads

    data = Path(part.path)
    meta = json.loads((data / "metadata.json").read_text())
    fmt = FORMATS[meta.get("data_format", "arrow")]
    spaces = {"observations": _space(meta, "observation_space"), "actions": _space(meta, "action_space")}
    out = []
    for i in part.selector:
        d = data / str(i)
        with guard(d, i):
            if not d.is_dir():
                raise DatasetError(data, i, f"episode directory {d.name!r} is missing")
            table = pads.dataset(str(d), format=fmt, ignore_prefixes=["_", ".", "metadata.json"]).to_table()
            missing = [k for k in KEYS.values() if k not in table.column_names]
            if missing:
                raise DatasetError(d, i, f"column(s) {missing} are missing (columns: {table.column_names})")
            raw = {role: _decode(d, i, table.column(k), spaces.get(k), k) for role, k in KEYS.items()}
        for role in ("action", "reward", "terminal", "truncated"):  # one padding row after the last step
            raw[role] = raw[role][:-1]
        out.append((i, make_episode(d, i, **raw, labels=KEYS, final_obs=True, want_next=next_obs, strict=strict)))
    return out
