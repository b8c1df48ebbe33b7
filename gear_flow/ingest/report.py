"""What an ingestion read and what the table holds afterwards: :class:`IngestReport`.

The stored side is read back from the shards themselves (episode index and
column rings, under the shard's lock) for exactly the episodes this ingestion
inserted, so data that was already in the table does not disturb the
comparison.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike

from .common import combine_sums, episode_sums, same_checksum

if TYPE_CHECKING:
    from ..shard import Shard


@dataclass
class IngestReport:
    """Outcome of :func:`~gear_flow.ingest.ingest`.

    Attributes
    ----------
    fmt : str
        Format read (``minari``, ``d4rl``, ``parquet``).
    source : str
        What was read.
    episodes_read, steps_read : int
        Episodes and steps read from the files (all validated).
    episodes_stored, steps_stored : int
        Of those, how many the table holds after the ingestion (fewer when the
        table's capacity made later episodes evict earlier ones).
    shards : dict of int to dict
        Per shard: ``{"episodes": n, "steps": n}`` of this ingestion's data it holds.
    read_checksums : dict of str to float
        Per table column, the float64 sum of every value read (bool columns:
        count of True), after casting to the column's dtype.
    stored_checksums : dict of str to float
        The same sums over what the table holds after ingestion.
    partitions : list of dict
        Per partition: ``index``, ``path``, ``episodes``, ``steps``,
        ``read_on`` and ``worker`` (addresses of the workers that read and that
        inserted it, the same one by construction; None for a local table) and
        ``shards`` (the shards its episodes went to).
    episode_ids : numpy.ndarray
        int64, table-wide ids of the inserted episodes (partition order).
    source_ids : list
        The source's id of each inserted episode, aligned with
        ``episode_ids`` (Minari episode index, D4RL episode number in file
        order, Parquet episode column value); :meth:`source_map` as a dict.
    elapsed_s : float
        Wall time of the whole ingestion.
    layout : str or None
        Parquet read without ``columns=``: the layout detected from the files'
        columns (``"gear-flow"`` or ``"lerobot"``); None otherwise.

    Notes
    -----
    Checksums are ``math.fsum`` over per-episode float64 sums, so they do not
    depend on the order in which episodes are combined: when every episode was
    kept, ``read_checksums == stored_checksums`` holds *exactly* (compare with
    ``==``, not a tolerance); :attr:`ok` checks that together with the counts
    and :meth:`mismatches` says what differs.

    Examples
    --------
    >>> report = ingest(table, "data/cartpole/minari/cartpole-mixed-v0")  # doctest: +SKIP
    >>> report.ok, report.steps_stored                                     # doctest: +SKIP
    (True, 56123)
    """

    fmt: str
    source: str
    episodes_read: int
    steps_read: int
    episodes_stored: int
    steps_stored: int
    shards: dict[int, dict]
    read_checksums: dict[str, float]
    stored_checksums: dict[str, float]
    partitions: list[dict] = field(default_factory=list)
    episode_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    elapsed_s: float = 0.0
    source_ids: list = field(default_factory=list)
    layout: str | None = None

    def source_map(self) -> dict[int, int | str]:
        """The source's id of every inserted episode (e.g. for :func:`~gear_flow.ingest.episodes`).

        Returns
        -------
        dict of int to int or str
            ``{table episode id: source episode id}``.
        """
        return dict(zip(self.episode_ids.tolist(), self.source_ids))

    def mismatches(self) -> list[str]:
        """What differs between what was read and what the table holds.

        Returns
        -------
        list of str
            One line per differing count or column checksum; empty when :attr:`ok`.
        """
        out = []
        if self.episodes_stored != self.episodes_read:
            out.append(f"episodes: read {self.episodes_read}, stored {self.episodes_stored}")
        if self.steps_stored != self.steps_read:
            out.append(f"steps: read {self.steps_read}, stored {self.steps_stored}")
        for n, v in self.read_checksums.items():
            if not same_checksum(self.stored_checksums.get(n), v):
                out.append(f"checksum of {n!r}: read {v!r}, stored {self.stored_checksums.get(n)!r}")
        return out

    @property
    def ok(self) -> bool:
        """Every episode read is in the table, bit for bit (by counts and checksums)."""
        return not self.mismatches()


def stored_summary(
    shards: Mapping[int, Shard], ids_by_shard: Mapping[int, ArrayLike], names: Sequence[str]
) -> dict[int, dict[str, Any]]:
    """Read back the given episodes from in-process shards.

    Parameters
    ----------
    shards : mapping of int to Shard
        Shard id to shard (those of ``ids_by_shard`` must be there).
    ids_by_shard : mapping of int to array_like of int
        Shard id to the table episode ids to read back from it.
    names : sequence of str
        Columns to sum, in order.

    Returns
    -------
    dict of int to dict
        Per shard ``{"episodes", "steps", "ids", "sums"}`` with ``sums`` the
        per-episode float64 column sums (``[episodes, columns]``).
    """
    out = {}
    for s, want in ids_by_shard.items():
        shard = shards[int(s)]
        want = np.asarray(want, dtype=np.int64)
        with shard.lock:
            seqs = shard.index.live()
            eids = shard.index.get("episode_id", seqs)
            keep = np.isin(eids, want)
            seqs, eids = seqs[keep], eids[keep]
            starts = shard.index.get("start", seqs)
            lengths = shard.index.get("length", seqs)
            sums = [
                episode_sums({n: shard.ring.read(n, int(a), int(t)) for n in names}, names)
                for a, t in zip(starts, lengths)
            ]
        out[int(s)] = {
            "episodes": len(seqs),
            "steps": int(lengths.sum()),
            "ids": eids,
            "sums": np.stack(sums) if sums else np.zeros((0, len(names))),
        }
    return out


def build_report(
    fmt: str,
    source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    names: Sequence[str],
    summaries: Sequence[Mapping[str, Any]],
    parts_info: list[dict[str, Any]],
    stored: Mapping[int, Mapping[str, Any]],
    episode_ids: ArrayLike,
    elapsed: float,
) -> IngestReport:
    """Assemble the report from partition summaries and per-shard read-backs.

    Parameters
    ----------
    fmt : str
        The format read.
    source : str, os.PathLike or sequence of them
        What was read (kept as ``str``).
    names : sequence of str
        The table's columns, in the order of the sums.
    summaries : sequence of mapping
        :meth:`ParsedPartition.summary <gear_flow.ingest.common.ParsedPartition.summary>`
        of every partition, in partition order.
    parts_info : list of dict
        Per-partition rows for :attr:`IngestReport.partitions`.
    stored : mapping of int to mapping
        :func:`stored_summary`'s result, for every shard written.
    episode_ids : array_like of int
        Table-wide ids of the inserted episodes, in partition order.
    elapsed : float
        Wall time of the ingestion, seconds.

    Returns
    -------
    IngestReport
        Counts and checksums of both sides.
    """
    shards = {s: {"episodes": v["episodes"], "steps": v["steps"]} for s, v in sorted(stored.items())}
    return IngestReport(
        fmt=fmt,
        source=str(source),
        episodes_read=sum(x["episodes"] for x in summaries),
        steps_read=sum(x["steps"] for x in summaries),
        episodes_stored=sum(v["episodes"] for v in stored.values()),
        steps_stored=sum(v["steps"] for v in stored.values()),
        shards=shards,
        read_checksums=combine_sums([x["sums"] for x in summaries], names),
        stored_checksums=combine_sums([v["sums"] for v in stored.values()], names),
        partitions=parts_info,
        episode_ids=np.asarray(episode_ids, dtype=np.int64),
        elapsed_s=float(elapsed),
        source_ids=[i for x in summaries for i in x["ids"]],
    )
