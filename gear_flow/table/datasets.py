"""Dataset methods every table has: its episodes as a Dask collection, selections, exports.

The work is done by :mod:`gear_flow.ingest.collection` and
:mod:`gear_flow.ingest.export` (on the workers that hold the shards, for a
distributed table); this mixin only gives both table kinds the same methods.
"""

from __future__ import annotations


class DatasetMethods:
    """``episodes``, ``select``, ``export`` and ``insert_collection`` of a table."""

    def episodes(self, sources=None):
        """The table's episodes as a ``dask.dataframe``, one partition per shard, built where the shard lives.

        Columns: episode id, source id (``sources``: an ingest report or a
        mapping), shard, length, return, first key, insertion order, times
        sampled, mean priority.  See :func:`gear_flow.ingest.collection.episodes`.
        """
        from ..ingest.collection import episodes

        return episodes(self, sources)

    def select(self, episodes, **table_kwargs):
        """A new table (same kind) holding the episodes of ``episodes`` (a frame from :meth:`episodes`)."""
        from ..ingest.collection import select

        return select(self, episodes, **table_kwargs)

    def export(self, path, fmt: str, episodes=None, **kw):
        """Write the table (or the episodes of ``episodes``) to ``path`` as ``minari``, ``d4rl`` or ``parquet``."""
        from ..ingest.export import export

        return export(self, path, fmt, episodes, **kw)

    def insert_collection(self, collection, **kw) -> int:
        """Insert the episodes of a ``dask.bag`` / ``dask.dataframe`` (the ingestion path); returns episodes."""
        from ..ingest.collection import insert_collection

        return insert_collection(self, collection, **kw)
