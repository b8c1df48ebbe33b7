"""gear_flow: distributed, GPU-centric experience replay on Dask.

Importing gear_flow never imports CuPy, cuDF or torch and never touches CUDA.
"""

from __future__ import annotations

from . import config  # noqa: F401  registers dask.config defaults
from .errors import (
    CapacityError,
    CheckpointError,
    CoordinatorLostError,
    EmptyTableError,
    GearFlowError,
    InvalidDataError,
    InvalidPriorityError,
    ProtocolError,
    RateLimitTimeout,
    ShardLostError,
    SpecError,
    TableClosedError,
    UnknownKeyError,
    WindowTooLongError,
)
from .rate_limiters import MinSize, Queue, RateLimiter, SampleToInsertRatio, Stack
from .sample import SampleBatch, SampleBuffers
from .selectors import Fifo, Lifo, MaxHeap, MinHeap, Prioritized, Selector, Uniform, WithoutReplacement
from .shard import Shard
from .spec import ColumnSpec, TableSpec
from .stream import Stream
from .table import InsertResult, LocalTable, UpdateResult
from .writer import EpisodeWriter

__version__ = "0.1.0"

__all__ = [
    "CapacityError",
    "CheckpointError",
    "CoordinatorLostError",
    "ColumnSpec",
    "EmptyTableError",
    "EpisodeWriter",
    "Fifo",
    "GearFlowError",
    "InsertResult",
    "InvalidDataError",
    "InvalidPriorityError",
    "ProtocolError",
    "Lifo",
    "LocalTable",
    "MaxHeap",
    "MinHeap",
    "MinSize",
    "Prioritized",
    "Queue",
    "RateLimitTimeout",
    "RateLimiter",
    "SampleBatch",
    "SampleBuffers",
    "SampleToInsertRatio",
    "Selector",
    "Shard",
    "ShardLostError",
    "SpecError",
    "Stack",
    "Stream",
    "TableClosedError",
    "TableSpec",
    "Uniform",
    "UnknownKeyError",
    "UpdateResult",
    "WindowTooLongError",
    "WithoutReplacement",
]
