"""Minari datasets: ``<root>/<dataset_id>/data/{main_data.hdf5, metadata.json}``.

``main_data.hdf5`` holds one group per episode, ``episode_{i}`` (``i = 0 ..
total_episodes - 1``), with the datasets ``observations`` (``T + 1`` rows:
Minari stores the final observation), ``actions``, ``rewards``,
``terminations`` and ``truncations`` (``T`` rows each); ``metadata.json``
holds ``dataset_id``, ``total_episodes``, ``total_steps``, the serialized
spaces, ``env_spec`` and ``minari_version`` (Minari's ``MinariStorage``).
Only Box observations and Box/Discrete actions are read (Dict/Tuple spaces are
stored as HDF5 groups and rejected with a clear error).  Partitions are chunks
of consecutive episode groups.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from ..errors import DatasetError
from .common import Format, Partition, Plan, iter_episodes, make_episode

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


def locate(source) -> tuple[Path, Path | None]:
    """``(main_data.hdf5, metadata.json or None)`` for a dataset dir, its ``data`` dir or the HDF5 file."""
    p = Path(source)
    for cand in (p / "data" / MAIN_FILE, p / MAIN_FILE, p):
        if cand.is_file():
            meta = cand.parent / METADATA_FILE
            return cand, (meta if meta.is_file() else None)
    raise DatasetError(p, None, f"no Minari dataset here: expected {p}/data/{MAIN_FILE} (or {p}/{MAIN_FILE})")


def _h5(path):
    import h5py

    try:
        return h5py.File(path, "r")
    except OSError as e:
        raise DatasetError(path, None, f"cannot be opened as HDF5 ({e})") from None


def plan(source, chunk_episodes: int, **_) -> Plan:
    """Chunks of ``chunk_episodes`` consecutive episode groups; checks the groups against metadata.json."""
    main, meta_path = locate(source)
    meta = {}
    if meta_path is not None:
        try:
            meta = json.loads(meta_path.read_text())
        except (OSError, ValueError) as e:
            raise DatasetError(meta_path, None, f"is not valid JSON ({e})") from None
    with _h5(main) as f:
        idx = sorted(int(m.group(1)) for k in f.keys() if (m := _EPISODE_RE.match(k)))
        if idx != list(range(len(idx))):
            missing = sorted(set(range(max(idx, default=-1) + 1)) - set(idx))
            raise DatasetError(
                main, None, f"episode groups must be episode_0 .. episode_{{n-1}}; missing {missing[:5]}"
            )
        steps = []
        for i in idx:
            g = f[f"episode_{i}"]
            n = g.attrs.get("total_steps")
            if n is None:
                d = g.get("rewards", g.get("actions"))
                n = d.shape[0] if d is not None and hasattr(d, "shape") and len(d.shape) else 0
            steps.append(int(n))
    total = meta.get("total_episodes")
    if total is not None and int(total) != len(idx):
        raise DatasetError(
            main, None, f"{METADATA_FILE} says total_episodes={total} but the file has {len(idx)} episode groups"
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


def read(part: Partition, gamma: float, strict: bool, **_) -> list[tuple[int, dict]]:
    """The canonical episodes of a chunk of episode groups, as ``(episode index, episode)``."""
    import h5py

    out = []
    with _h5(part.path) as f:
        for i in part.selector:
            name = f"episode_{i}"
            if name not in f:
                raise DatasetError(part.path, i, f"group {name!r} is missing")
            g = f[name]
            raw = {}
            for role, key in KEYS.items():
                if key not in g:
                    raise DatasetError(
                        part.path, i, f"dataset {key!r} is missing (group {name!r} has {sorted(g.keys())})"
                    )
                d = g[key]
                if not isinstance(d, h5py.Dataset):
                    raise DatasetError(
                        part.path,
                        i,
                        f"{key!r} is an HDF5 group (a Dict/Tuple space); only Box observations and Box/Discrete actions are supported",
                    )
                raw[role] = d[()]
            out.append((i, make_episode(part.path, i, **raw, labels=KEYS, final_obs=True, gamma=gamma, strict=strict)))
    return out


FORMAT = Format("minari", plan, read)


def read_minari(path, *, gamma: float | None = None, strict: bool | None = None, chunk_episodes: int | None = None):
    """Yield the canonical episodes of a Minari dataset, in episode order.

    Parameters
    ----------
    path : str or Path
        The dataset directory (``<root>/<dataset_id>``), its ``data`` directory,
        or ``main_data.hdf5`` itself.
    gamma : float, optional
        Discount of the ``rtg`` column (config ``ingest.gamma``, default 1.0).
    strict : bool, optional
        Reject non-finite rewards/observations and early end flags (config
        ``ingest.strict``, default True).
    chunk_episodes : int, optional
        Episodes read per HDF5 pass (config ``ingest.chunk_episodes``).

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
    return iter_episodes(FORMAT, path, gamma=gamma, strict=strict, chunk_episodes=chunk_episodes)
