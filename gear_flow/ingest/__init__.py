"""Offline-RL datasets into replay tables: Minari, D4RL-style HDF5 and Parquet step tables.

Readers (:func:`read_minari`, :func:`read_d4rl`, :func:`read_parquet`) yield
*canonical episodes* — dicts of NumPy arrays ``obs``, ``action``, ``reward``,
``done``, ``truncated`` plus the derived ``rtg`` (return-to-go) and
``timestep`` — whatever the file layout (see :mod:`gear_flow.ingest.common`).
:func:`episode_columns` gives the matching ``ColumnSpec`` tuple, and
:func:`ingest` loads a dataset into a :class:`~gear_flow.LocalTable` or a
:class:`~gear_flow.distributed.DistributedTable`, all or nothing, with the files
read on the workers that own the shards (see :mod:`gear_flow.ingest.dataflow`).
The way out: :func:`episodes` (a table as a ``dask.dataframe`` of per-episode
metadata), :func:`select` (chosen episodes into a new table) and
:func:`export` (to Minari, D4RL HDF5 or Parquet, written by the workers);
:func:`insert_collection` takes a ``dask.bag``/``dask.dataframe`` of episodes.

Needs the ``pipelines`` extra (h5py, pyarrow); importing this package does not
import them.

Examples
--------
>>> import gear_flow as gf
>>> from gear_flow.ingest import episode_columns, ingest
>>> spec = gf.TableSpec(episode_columns(obs_dim=4), capacity=200_000)
>>> table = gf.LocalTable(spec)
>>> report = ingest(table, "data/cartpole/minari/cartpole-mixed-v0")  # doctest: +SKIP
>>> report.ok                                                          # doctest: +SKIP
True
"""

from __future__ import annotations

from ..errors import DatasetError
from .collection import episodes, insert_collection, select
from .columns import LEROBOT, ColumnMap
from .common import COLUMNS, DERIVED, Partition, episode_columns, return_to_go
from .d4rl import read_d4rl
from .dataflow import ingest
from .export import ExportReport, export
from .formats import FORMATS, detect_format
from .minari import read_minari
from .parquet import read_parquet
from .report import IngestReport

__all__ = [
    "COLUMNS",
    "LEROBOT",
    "ColumnMap",
    "ExportReport",
    "episodes",
    "export",
    "insert_collection",
    "select",
    "DERIVED",
    "DatasetError",
    "FORMATS",
    "IngestReport",
    "Partition",
    "detect_format",
    "episode_columns",
    "ingest",
    "read_d4rl",
    "read_minari",
    "read_parquet",
    "return_to_go",
]
