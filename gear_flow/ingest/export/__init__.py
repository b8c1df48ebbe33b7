"""Export a table, or the episodes chosen by a query, to Minari, D4RL HDF5 or Parquet, as a Dask dataflow.

1. **plan** (one small task per worker, or in-process): each shard lists its
   live episodes (id, insertion stamp, length); the client keeps the chosen
   ones, orders them by insertion (so that re-ingesting the export rebuilds the
   same table) and numbers them ``0 .. n-1``;
2. **write** (one task per worker, pinned to it): the worker reads its own
   shards' episodes in place and writes one part file, then reads the file back
   and returns its per-column checksums; no step data reaches the client;
3. **finish** (client): the file tying the parts together from their small
   reports (Minari's ``main_data.hdf5`` of external links and
   ``metadata.json``; D4RL's virtual datasets; nothing for Parquet).

The :class:`ExportReport` compares the checksums of what the shards held with
what was read back from the written files (exactly: ``math.fsum``).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ...errors import SpecError
from ..common import same_checksum
from ..shards import read_episodes, run_on_shards
from .writers import WRITERS, check_exportable, checksums

if TYPE_CHECKING:
    import dask.dataframe
    import pandas
    from numpy.typing import ArrayLike

    from ...distributed.api import DistributedTable
    from ...table.local import LocalTable


@dataclass
class ExportReport:
    """Outcome of :func:`export`.

    Attributes
    ----------
    fmt : str
        ``minari``, ``d4rl`` or ``parquet``.
    path : str
        The dataset directory (Minari, Parquet) or HDF5 file (D4RL).
    files : list of str
        Files written, relative to the dataset directory.
    episodes, steps : int
        Exported.
    episode_ids : numpy.ndarray
        Table episode ids, in export order (export index ``k`` is ``episode_ids[k]``).
    table_checksums, written_checksums : dict of str to float
        Per exported column, the float64 sum over the table's episodes and over
        what was read back from the written files.
    workers : dict
        Per worker address (None: in-process), the part file it wrote.
    elapsed_s : float
        Wall time of the whole export, seconds.
    """

    fmt: str
    path: str
    files: list = field(default_factory=list)
    episodes: int = 0
    steps: int = 0
    episode_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    table_checksums: dict = field(default_factory=dict)
    written_checksums: dict = field(default_factory=dict)
    workers: dict = field(default_factory=dict)
    elapsed_s: float = 0.0

    def mismatches(self) -> list[str]:
        """Columns whose checksums differ between the table and the written files.

        Returns
        -------
        list of str
            One line per differing column; empty when :attr:`ok`.
        """
        return [
            f"checksum of {n!r}: table {v!r}, written {self.written_checksums.get(n)!r}"
            for n, v in self.table_checksums.items()
            if not same_checksum(self.written_checksums.get(n), v)
        ]

    @property
    def ok(self) -> bool:
        """What was read back from the files equals what the table held, column by column."""
        return not self.mismatches()


def _list(shards: dict) -> list:
    out = []
    for s, sh in shards.items():
        with sh.lock:
            seqs = sh.index.live()
            for e, st, t in zip(*(sh.index.get(f, seqs) for f in ("episode_id", "stamp", "length"))):
                out.append((int(e), int(st), int(t), int(s)))
    return out


def _write(shards: dict, fmt: str, out: str, part: int, order: dict, names) -> dict:
    eps = []
    for sh in shards.values():
        eps.extend(read_episodes(sh, list(order), names))
    eps = sorted(((order[e], ep) for e, ep in eps), key=lambda x: x[0])
    if not eps:
        return {"file": None, "sums": {}, "table_sums": {}}
    info = WRITERS[fmt][0](Path(out), part, eps, names)
    info["table_sums"] = checksums({n: [ep[n] for _, ep in eps] for n in info["sums"]})
    return info


def _id_column(frame):
    return frame["episode_id"]


def _ids_of(episodes) -> np.ndarray | None:
    """Episode ids from None (all), ids, a pandas frame or a dask dataframe (only its ``episode_id`` column is computed)."""
    if episodes is None:
        return None
    if hasattr(episodes, "columns"):
        if hasattr(episodes, "compute"):
            # map_partitions rather than ["episode_id"]: dask-expr's projection pushdown fails
            # through nlargest/nsmallest (TypeError), the "top k by return" query
            return np.asarray(episodes.map_partitions(_id_column, meta=("episode_id", "int64")).compute(), np.int64)
        return np.asarray(episodes["episode_id"], dtype=np.int64)
    return np.asarray(episodes, dtype=np.int64).reshape(-1)


def export(
    table: LocalTable | DistributedTable,
    path: str | os.PathLike[str],
    fmt: str,
    episodes: ArrayLike | pandas.DataFrame | dask.dataframe.DataFrame | None = None,
    *,
    dataset_id: str | None = None,
) -> ExportReport:
    """Write a table's episodes (or those chosen) to a Minari, D4RL or Parquet dataset.

    Parameters
    ----------
    table : LocalTable or DistributedTable
        Needs ``obs`` (or ``obs__<key>`` columns), ``action``, ``reward``,
        ``done`` and ``truncated``; ``next_obs`` is written when present
        (Minari: as the final observation).  Derived ``rtg``/``timestep`` are
        not written (ingestion derives them again).
    path : str or Path
        Minari: the dataset directory (``<MINARI_DATASETS_PATH>/<dataset_id>``
        to load it with ``minari.load_dataset``); D4RL: the ``.hdf5`` file
        (parts go to ``parts/`` beside it); Parquet: a directory.  Paths are
        written *by the workers*: use a filesystem they share.
    fmt : {"minari", "d4rl", "parquet"}
        The dataset format to write.
    episodes : array of int, pandas or dask DataFrame, optional
        Table episode ids to export (a frame from :func:`~gear_flow.ingest.episodes`,
        filtered; only its ``episode_id`` column is computed).  Default: all.
    dataset_id : str, optional
        Minari's ``dataset_id`` (default: the directory's name).

    Returns
    -------
    ExportReport
        Files written and checksums of the table's side and of what was read
        back from the files; ``report.ok`` when they agree exactly.

    Raises
    ------
    SpecError
        ``fmt`` is unknown, the table lacks a column the format needs, or a
        chosen episode is not in the table.

    Examples
    --------
    >>> rep = export(table, tmp / "top", "parquet", episodes=top)  # doctest: +SKIP
    >>> rep.ok                                                       # doctest: +SKIP
    True
    """
    t0 = time.perf_counter()
    if fmt not in WRITERS:
        raise SpecError(f"fmt {fmt!r} must be one of {sorted(WRITERS)}")
    check_exportable(table.spec, fmt)
    path = Path(path).absolute()
    out = path.parent if fmt == "d4rl" else path
    out.mkdir(parents=True, exist_ok=True)
    names = [n for n in table.spec.names if n not in ("rtg", "timestep")]
    listed = [x for r in run_on_shards(table, _list, tag="export-list").values() for x in r]
    want = _ids_of(episodes)
    if want is not None:
        have = {e for e, *_ in listed}
        unknown = sorted(set(want.tolist()) - have)
        if unknown:
            raise SpecError(
                f"episode id(s) {unknown[:5]} are not in table {getattr(table, 'name', '')!r} (evicted or never inserted)"
            )
        listed = [x for x in listed if x[0] in set(want.tolist())]
    listed.sort(key=lambda x: x[1])  # insertion order
    index = {e: k for k, (e, *_) in enumerate(listed)}
    shard_of = {e: s for e, _, _, s in listed}
    addrs = {}

    def args_of(addr, shard_ids):
        part = addrs.setdefault(addr, len(addrs))
        mine = {e: k for e, k in index.items() if shard_of[e] in shard_ids}
        return fmt, str(out), part, mine, names

    results = run_on_shards(table, _write, args_of, tag="export-write")
    parts = [r for r in results.values() if r["file"] is not None]
    info = {"file": path.name, "dataset_id": dataset_id or path.name, "table": getattr(table, "name", None)}
    files = WRITERS[fmt][1](out, parts, info) if parts else []
    from ..common import combine_sums

    cols = [n for n in names if parts and n in parts[0]["sums"]]
    tsum = combine_sums([np.array([[p["table_sums"][n] for n in cols]]) for p in parts], cols) if parts else {}
    wsum = combine_sums([np.array([[p["sums"][n] for n in cols]]) for p in parts], cols) if parts else {}
    return ExportReport(
        fmt=fmt,
        path=str(path),
        files=files,
        episodes=len(listed),
        steps=int(sum(t for _, _, t, _ in listed)),
        episode_ids=np.array([e for e, *_ in listed], dtype=np.int64),
        table_checksums=tsum,
        written_checksums=wsum,
        workers={a: r["file"] for a, r in results.items()},
        elapsed_s=time.perf_counter() - t0,
    )
