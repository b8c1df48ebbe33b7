"""Dataset methods every table has: its episodes as a Dask collection, selections, exports.

The work is done by :mod:`gear_flow.ingest.collection` and
:mod:`gear_flow.ingest.export` (on the workers that hold the shards, for a
distributed table); this mixin only gives both table kinds the same methods.
"""

from __future__ import annotations

from collections.abc import Mapping
from os import PathLike
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import dask.bag
    import dask.dataframe

    from ..ingest.export import ExportReport


class DatasetMethods:
    """``episodes``, ``select``, ``export`` and ``insert_collection`` of a table."""

    def episodes(self, sources: Mapping | None = None) -> dask.dataframe.DataFrame:
        """The table's episodes as a ``dask.dataframe``, one partition per shard, built where the shard lives.

        Parameters
        ----------
        sources : mapping or ingest report, optional
            Episode id -> source id, to add a ``source`` column.

        Returns
        -------
        dask.dataframe.DataFrame
            Columns: episode id, source id, shard, length, return, first key,
            insertion order, times sampled, mean priority.  See
            :func:`gear_flow.ingest.collection.episodes`.
        """
        from ..ingest.collection import episodes

        return episodes(self, sources)

    def select(self, episodes: dask.dataframe.DataFrame, **table_kwargs: Any) -> DatasetMethods:
        """A new table (same kind) holding the episodes of ``episodes``.

        Parameters
        ----------
        episodes : dask.dataframe.DataFrame
            Rows of :meth:`episodes` (filtered as you like).
        **table_kwargs
            Options of the new table (sampler, remover, name, ...).

        Returns
        -------
        LocalTable or DistributedTable
        """
        from ..ingest.collection import select

        return select(self, episodes, **table_kwargs)

    def export(
        self, path: str | PathLike, fmt: str, episodes: dask.dataframe.DataFrame | None = None, **kw: Any
    ) -> ExportReport:
        """Write the table (or the episodes of ``episodes``) to ``path``.

        Parameters
        ----------
        path : str or path-like
        fmt : {"minari", "d4rl", "parquet"}
        episodes : dask.dataframe.DataFrame, optional
            Rows of :meth:`episodes` to write (default: all).
        **kw
            ``dataset_id`` for Minari.

        Returns
        -------
        ExportReport
        """
        from ..ingest.export import export

        return export(self, path, fmt, episodes, **kw)

    def insert_collection(self, collection: dask.bag.Bag | dask.dataframe.DataFrame, **kw: Any) -> int:
        """Insert the episodes of a ``dask.bag`` / ``dask.dataframe`` (the ingestion path).

        Parameters
        ----------
        collection : dask.bag.Bag or dask.dataframe.DataFrame
            Episodes (dicts) or a step table; see
            :func:`gear_flow.ingest.collection.insert_collection`.
        **kw
            ``columns``, ``gamma``, ``strict``, ``timeout``.

        Returns
        -------
        int
            Episodes inserted.
        """
        from ..ingest.collection import insert_collection

        return insert_collection(self, collection, **kw)
