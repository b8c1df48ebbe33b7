"""Per-worker part writers and the client-side finishing step of each export format.

Each format has ``write(out_dir, part, episodes, names) -> dict`` (runs where
the episodes are; writes one part file; returns its file name, rows, and the
float64 sums of what it *read back* from that file, per table column) and
``finish(out_dir, parts, info)`` (runs on the client with only the parts'
small reports: writes the file that ties the parts together).

- ``parquet``: one step table per part (``part-<p>.parquet``), the layout
  :mod:`gear_flow.ingest.parquet` reads: ``episode_id``, ``step``, ``obs_<j>``
  (``obs__<key>_<j>`` for Dict observations), ``action``, ``reward``,
  ``terminal``, ``truncated`` (and ``next_obs_<j>``).
- ``d4rl``: ``parts/part-<p>.hdf5`` of flat arrays; ``<name>.hdf5`` holds HDF5
  *virtual datasets* mapping each episode's rows from its part, in export order
  (h5py/d4rl read them as ordinary datasets).
- ``minari``: ``data/parts/part-<p>.hdf5`` with ``episode_<k>`` groups;
  ``data/main_data.hdf5`` holds *external links* ``episode_<k>`` to them,
  plus ``data/metadata.json`` (``minari.load_dataset`` reads it).  The
  observation group holds ``T + 1`` rows: the final one is ``next_obs[-1]``
  when the table keeps next observations, else a repeat of the last (Minari
  needs a row there; re-ingestion drops it).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ...errors import SpecError
from ..common import combine_sums, episode_sums
from ..episode import SEP

if TYPE_CHECKING:
    from ...spec import TableSpec

EXPORTED = ("action", "reward", "done", "truncated")


def obs_columns(names: Iterable[str], role: str = "obs") -> list[str]:
    """The observation columns among ``names``: ``role`` itself or its ``role__<key>`` leaves.

    Parameters
    ----------
    names : iterable of str
        Column names.
    role : str, default "obs"
        ``"obs"`` or ``"next_obs"``.

    Returns
    -------
    list of str
        The matching names, in their order.
    """
    return [n for n in names if n == role or n.startswith(role + SEP)]


def check_exportable(spec: TableSpec, fmt: str) -> None:
    """The table has what ``fmt`` needs (obs, action, reward, done, truncated); D4RL needs a single obs.

    Parameters
    ----------
    spec : TableSpec
        The table's spec.
    fmt : str
        ``"minari"``, ``"d4rl"`` or ``"parquet"``.

    Raises
    ------
    SpecError
        A needed column is missing, D4RL with a Dict observation, or Parquet
        with observations of more than one dimension or a column whose name
        is another's flattened one (``x`` and ``x_0``).
    """
    names = spec.names
    missing = [n for n in EXPORTED if n not in names] + ([] if obs_columns(names) else ["obs"])
    if missing:
        raise SpecError(f"exporting to {fmt} needs the table column(s) {missing}; the table has {list(names)}")
    if fmt == "d4rl" and obs_columns(names) != ["obs"]:
        raise SpecError(
            "D4RL files hold one 'observations' array: a table with obs__<key> columns exports to minari or parquet"
        )
    for n in obs_columns(names) + obs_columns(names, "next_obs"):
        if fmt == "parquet" and len(spec.column(n).shape) > 1:
            raise SpecError(f"column {n!r} has shape {spec.column(n).shape}: Parquet export writes 1-D observations")
    if fmt == "parquet":  # a vector column c is written as c_0, c_1, ...: a column named so would be read as part of it
        flat = [n for n in names if n not in ("rtg", "timestep")]
        for a in flat:
            for b in flat:
                if b.startswith(a + "_") and b[len(a) + 1 :].isdigit():
                    raise SpecError(
                        f"columns {a!r} and {b!r}: Parquet export writes a vector column {a!r} as {a}_0, {a}_1, ..., "
                        f"and {b!r} would be read back as one of them; rename one"
                    )


def checksums(cols: dict[str, list]) -> dict[str, float]:
    """An export's checksum of each column, on the table's side and the written side alike: each episode's
    array by ``np.sum`` (whose rounding depends on how the rows are grouped: both sides group them so), the
    episodes by ``math.fsum``.

    Parameters
    ----------
    cols : dict of str to list of numpy.ndarray
        Per column, its episodes' arrays ``[steps, *shape]``.

    Returns
    -------
    dict of str to float
        Per column, the checksum.
    """
    names = list(cols)  # an ingest's checksums, by the same rule (an export read back by ingest agrees)
    return combine_sums([episode_sums(dict(zip(names, eps)), names) for eps in zip(*cols.values())], names)


def _read_checksums(read: Callable[[str], np.ndarray], lengths: Sequence[int], keep: Sequence[str]) -> dict[str, float]:
    """:func:`checksums` of what was read back: ``read(column)`` gives the column's rows, ``[steps, *shape]``,
    episodes of ``lengths`` back to back."""
    bounds = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    rows = {n: np.ascontiguousarray(read(n)) for n in keep}
    return checksums({n: [a[bounds[i] : bounds[i + 1]] for i in range(len(lengths))] for n, a in rows.items()})


# -- parquet -------------------------------------------------------------------------------------


def _flat_cols(name: str, a: np.ndarray) -> dict[str, np.ndarray]:
    return {name: a} if a.ndim == 1 else {f"{name}_{j}": a[:, j] for j in range(a.shape[1])}


def write_parquet(
    out: Path, part: int, episodes: list[tuple[int, dict[str, np.ndarray]]], names: Sequence[str]
) -> dict:
    """Write one part as a Parquet step table, ``part-<part>.parquet``, and read it back.

    Parameters
    ----------
    out : pathlib.Path
        The export's output directory (it exists).
    part : int
        This part's number, unique per worker; names the file (``part-<part:05d>``).
    episodes : list of (int, dict of str to numpy.ndarray)
        ``(export index, episode)`` pairs, in export order.
    names : sequence of str
        The table columns to write (derived ``rtg``/``timestep`` excluded).

    Returns
    -------
    dict
        ``file`` (its name), ``rows`` (steps written) and ``sums`` (per
        column, the float64 sum of what was read back).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    rename = {"done": "terminal"}
    cols: dict[str, list] = {"episode_id": [], "step": []}
    keep = [n for n in names if n not in ("rtg", "timestep")]
    for k, ep in episodes:
        T = len(ep["reward"])
        cols["episode_id"].append(np.full(T, k, np.int64))
        cols["step"].append(np.arange(T, dtype=np.int64))
        for n in keep:
            for c, v in _flat_cols(rename.get(n, n), ep[n]).items():
                cols.setdefault(c, []).append(v)
    table = pa.table({c: np.concatenate(v) for c, v in cols.items()})
    path = out / f"part-{part:05d}.parquet"
    pq.write_table(table, path)
    back = pq.read_table(path)

    def read(n):  # a vector column's sub-columns side by side again, [steps, d], as the table held it
        c = rename.get(n, n)
        sub = [x for x in back.column_names if x == c or (x.startswith(c + "_") and x[len(c) + 1 :].isdigit())]
        if sub == [c]:
            return back.column(c).to_numpy()
        return np.stack([back.column(x).to_numpy() for x in sorted(sub, key=lambda x: int(x[len(c) + 1 :]))], 1)

    sums = _read_checksums(read, [len(ep["reward"]) for _, ep in episodes], keep)
    return {"file": path.name, "rows": back.num_rows, "sums": sums}


def finish_parquet(out: Path, parts: list[dict], info: dict) -> list[str]:
    """Nothing ties Parquet parts together: the dataset is the directory of them.

    Parameters
    ----------
    out : pathlib.Path
        The export's output directory.
    parts : list of dict
        Every part writer's report.
    info : dict
        The export's settings (unused here).

    Returns
    -------
    list of str
        The dataset's files, relative to ``out``.
    """
    return [p["file"] for p in parts]


# -- d4rl ------------------------------------------------------------------------------------------


D4RL_KEYS = {"obs": "observations", "next_obs": "next_observations", "action": "actions", "reward": "rewards",
             "done": "terminals", "truncated": "timeouts"}  # fmt: skip


def write_d4rl(out: Path, part: int, episodes: list[tuple[int, dict[str, np.ndarray]]], names: Sequence[str]) -> dict:
    """Write one part as flat D4RL arrays, ``parts/part-<part>.hdf5``, and read it back.

    Parameters
    ----------
    out : pathlib.Path
        The export's output directory (it exists).
    part : int
        This part's number, unique per worker; names the file (``part-<part:05d>``).
    episodes : list of (int, dict of str to numpy.ndarray)
        ``(export index, episode)`` pairs, in export order.
    names : sequence of str
        The table columns to write (derived ``rtg``/``timestep`` excluded).

    Returns
    -------
    dict
        ``file``, ``rows`` and ``sums`` (as :func:`write_parquet`), ``spans``
        (``(export index, first row, steps)`` per episode) and ``meta`` (per
        column, its per-step shape and dtype string).
    """
    import h5py

    for k, ep in episodes:  # D4RL's episodes end where terminals or timeouts say, and nowhere else
        ends = np.asarray(ep["done"], bool).reshape(len(ep["reward"]), -1).any(1)
        ends |= np.asarray(ep["truncated"], bool).reshape(len(ep["reward"]), -1).any(1)
        if not ends[-1] or ends[:-1].any():
            why = "has done or truncated before its last step" if ends[-1] else "ends on a step flagged neither"
            raise SpecError(
                f"episode {k} of the export {why}: D4RL files mark episodes only by done and truncated, so "
                "re-ingesting it would not rebuild it; set them, or export to minari or parquet"
            )
    (out / "parts").mkdir(exist_ok=True)
    path = out / "parts" / f"part-{part:05d}.hdf5"
    keep = [n for n in D4RL_KEYS if n in names]
    with h5py.File(path, "w") as f:
        for n in keep:
            f.create_dataset(D4RL_KEYS[n], data=np.concatenate([ep[n] for _, ep in episodes]))
    with h5py.File(path, "r") as f:
        sums = _read_checksums(lambda n: f[D4RL_KEYS[n]][()], [len(ep["reward"]) for _, ep in episodes], keep)
        rows = f[D4RL_KEYS["reward"]].shape[0]
    spans, off = [], 0
    for k, ep in episodes:
        T = len(ep["reward"])
        spans.append((k, off, T))
        off += T
    meta = {n: (ep[n].shape[1:], ep[n].dtype.str) for n in keep for _, ep in episodes[:1]}
    return {"file": f"parts/{path.name}", "rows": rows, "sums": sums, "spans": spans, "meta": meta}


def finish_d4rl(out: Path, parts: list[dict], info: dict) -> list[str]:
    """Write the D4RL file: virtual datasets mapping each episode's rows from its part, in export order.

    Parameters
    ----------
    out : pathlib.Path
        The export's output directory.
    parts : list of dict
        Every part writer's report.
    info : dict
        The export's settings (``file``: the ``.hdf5`` file's name).

    Returns
    -------
    list of str
        The dataset's files, relative to ``out``.
    """
    import h5py

    spans = sorted((k, p["file"], o, T) for p in parts for k, o, T in p["spans"])
    total = sum(T for *_, T in spans)
    meta = next(p["meta"] for p in parts if p["meta"])
    path = out / info["file"]
    with h5py.File(path, "w") as f:
        for n, (shape, dt) in meta.items():
            layout = h5py.VirtualLayout(shape=(total, *shape), dtype=np.dtype(dt))
            pos = 0
            for _, file, o, T in spans:
                n_rows = next(p["rows"] for p in parts if p["file"] == file)
                src = h5py.VirtualSource(file, D4RL_KEYS[n], shape=(n_rows, *shape))
                layout[pos : pos + T] = src[o : o + T]
                pos += T
            f.create_virtual_dataset(D4RL_KEYS[n], layout)
        f.attrs["exported_by"] = "gear_flow"
    return [info["file"]] + sorted({p["file"] for p in parts})


# -- minari ----------------------------------------------------------------------------------------

MINARI_KEYS = {"action": "actions", "reward": "rewards", "done": "terminations", "truncated": "truncations"}


def _obs_tree(g, cols: dict[str, np.ndarray]) -> None:
    """Write ``{leaf path: array}`` (``obs`` or ``obs__a__0``) as Minari's groups (Tuple members ``_index_j``)."""
    if list(cols) == [""]:
        g.create_dataset("observations", data=cols[""])
        return
    root = g.create_group("observations")
    for leaf, a in cols.items():
        node = root
        parts = leaf.split(SEP)
        for p in parts[:-1]:
            p = f"_index_{p}" if p.isdigit() else p
            node = node[p] if p in node else node.create_group(p)
        last = parts[-1]
        node.create_dataset(f"_index_{last}" if last.isdigit() else last, data=a)


def write_minari(out: Path, part: int, episodes: list[tuple[int, dict[str, np.ndarray]]], names: Sequence[str]) -> dict:
    """Write one part of ``episode_<k>`` groups, ``data/parts/part-<part>.hdf5``, and read it back.

    Parameters
    ----------
    out : pathlib.Path
        The export's output directory (it exists).
    part : int
        This part's number, unique per worker; names the file (``part-<part:05d>``).
    episodes : list of (int, dict of str to numpy.ndarray)
        ``(export index, episode)`` pairs, in export order.
    names : sequence of str
        The table columns to write (derived ``rtg``/``timestep`` excluded).

    Returns
    -------
    dict
        ``file``, ``sums`` (as :func:`write_parquet`), ``episodes``
        (``(export index, steps)`` pairs), ``leaves`` (per observation
        column, its shape and dtype string) and ``action`` (shape, dtype
        string, largest value for integer actions; None without episodes).
    """
    import h5py

    parts_dir = out / "data" / "parts"
    parts_dir.mkdir(parents=True, exist_ok=True)
    path = parts_dir / f"part-{part:05d}.hdf5"
    obs = obs_columns(names)
    sums: dict[str, list] = {n: [] for n in obs + list(MINARI_KEYS)}
    leaves = {}
    with h5py.File(path, "w") as f:
        for k, ep in episodes:
            g = f.create_group(f"episode_{k}")
            T = len(ep["reward"])
            g.attrs["id"] = k
            g.attrs["total_steps"] = T
            cols = {}
            for n in obs:
                last = ep["next_" + n][-1:] if "next_" + n in names else ep[n][-1:]
                cols[n[len("obs__") :] if n != "obs" else ""] = np.concatenate([ep[n], last])
                leaves[n] = (ep[n].shape[1:], ep[n].dtype.str)
            _obs_tree(g, cols)
            for n, key in MINARI_KEYS.items():
                g.create_dataset(key, data=ep[n])
    with h5py.File(path, "r") as f:
        for k, _ in episodes:
            g = f[f"episode_{k}"]
            for n in obs:
                node = g["observations"]
                if n != "obs":
                    for p in n[len("obs__") :].split(SEP):
                        node = node[f"_index_{p}" if p.isdigit() else p]
                sums[n].append(node[()][:-1])
            for n, key in MINARI_KEYS.items():
                sums[n].append(g[key][()])
    act = [ep["action"] for _, ep in episodes]
    return {
        "file": f"parts/{path.name}",
        "episodes": [(k, len(ep["reward"])) for k, ep in episodes],
        "sums": checksums(sums),
        "leaves": leaves,
        "action": (act[0].shape[1:], act[0].dtype.str, *_int_range(act)) if act else None,
    }


def _int_range(act: list[np.ndarray]) -> tuple:
    """Integer actions' least and largest values, element by element (lists shaped as one action); floats: None."""
    if act[0].dtype.kind not in "iu":
        return None, None
    return (
        np.min([a.min(axis=0) for a in act], axis=0).tolist(),
        np.max([a.max(axis=0) for a in act], axis=0).tolist(),
    )


def _box(shape, dtype: str) -> dict:
    dt = np.dtype(dtype)
    lo, hi = (np.iinfo(dt).min, np.iinfo(dt).max) if dt.kind in "iu" else (-np.inf, np.inf)
    full = lambda v: np.full(tuple(shape), v).tolist()  # noqa: E731
    return {"type": "Box", "dtype": str(dt), "shape": list(shape), "low": full(lo), "high": full(hi)}


def _space_of(leaves: dict) -> dict:
    if list(leaves) == ["obs"]:
        return _box(*leaves["obs"])
    tree: dict = {}
    for n, (shape, dt) in leaves.items():
        node, parts = tree, n[len("obs__") :].split(SEP)
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = _box(shape, dt)

    def build(node):
        if "type" in node:
            return node
        sub = {k: build(v) for k, v in node.items()}
        if all(k.isdigit() for k in sub):
            return {"type": "Tuple", "subspaces": [sub[str(j)] for j in range(len(sub))]}
        return {"type": "Dict", "subspaces": sub}

    return build(tree)


def finish_minari(out: Path, parts: list[dict], info: dict) -> list[str]:
    """Write ``data/main_data.hdf5`` (external links to the parts' episodes) and ``data/metadata.json``.

    Parameters
    ----------
    out : pathlib.Path
        The export's output directory.
    parts : list of dict
        Every part writer's report.
    info : dict
        The export's settings (``dataset_id``, ``table``, optional ``minari_version``).

    Returns
    -------
    list of str
        The dataset's files, relative to ``out``.
    """
    import h5py

    data = out / "data"
    eps = sorted((k, T, p["file"]) for p in parts for k, T in p["episodes"])
    with h5py.File(data / "main_data.hdf5", "w") as f:
        for k, _, file in eps:
            f[f"episode_{k}"] = h5py.ExternalLink(file, f"episode_{k}")
    leaves = next(p["leaves"] for p in parts if p["leaves"])
    acts = [p["action"] for p in parts if p["action"] is not None]
    shape, dt, lo, hi = acts[0]
    if hi is None:
        act = _box(shape, dt)
    else:  # the least space that holds every action: from the least value (negative ones too), each element's own
        lo = np.min([a[2] for a in acts], axis=0).astype(np.int64)
        hi = np.max([a[3] for a in acts], axis=0).astype(np.int64)
        # counted in Python's ints: a span past int64's (actions at both its ends) wrapped round to a negative n
        n = np.reshape([int(h) - int(low) + 1 for h, low in zip(hi.ravel().tolist(), lo.ravel().tolist())], lo.shape)
        if max(n.ravel().tolist(), default=0) > np.iinfo(np.int64).max:  # no Discrete counts it: the dtype's Box
            act = _box(shape, dt)
        elif lo.ndim == 0:
            act = {"type": "Discrete", "dtype": "int64", "start": int(lo), "n": int(n)}
        else:
            act = {"type": "MultiDiscrete", "dtype": "int64", "nvec": n.tolist(), "start": lo.tolist()}
    meta = {
        "dataset_id": info["dataset_id"],
        "total_episodes": len(eps),
        "total_steps": int(sum(T for _, T, _ in eps)),
        "data_format": "hdf5",
        "observation_space": json.dumps(_space_of(leaves)),
        "action_space": json.dumps(act),
        "env_spec": None,
        "minari_version": info.get("minari_version", "0.5.0"),  # a release Minari 0.4-0.5 loads
        "algorithm_name": "exported by gear_flow",
        "author": ["gear_flow"],
        "code_permalink": "https://github.com/",
        "description": f"Exported from gear_flow table {info.get('table')!r}.",
    }
    (data / "metadata.json").write_text(json.dumps(meta))
    return ["data/main_data.hdf5", "data/metadata.json"] + sorted({"data/" + p["file"] for p in parts})


WRITERS = {
    "parquet": (write_parquet, finish_parquet),
    "d4rl": (write_d4rl, finish_d4rl),
    "minari": (write_minari, finish_minari),
}
