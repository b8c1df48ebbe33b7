"""gear_flow: distributed, GPU-centric experience replay on Dask.

Importing gear_flow never imports CuPy, cuDF or torch and never touches CUDA,
and imports Dask's distributed machinery only when a name that needs it is
first used (``gear_flow.DistributedTable``, ``gear_flow.GearFlowDashboard``,
``gear_flow.local_cluster``, ``gear_flow.local_cuda_cluster``).
"""

from __future__ import annotations

from . import config  # noqa: F401  registers dask.config defaults
from .errors import (
    CapacityError,
    CheckpointError,
    CoordinatorLostError,
    DeployError,
    EmptyTableError,
    GearFlowError,
    InvalidDataError,
    InvalidPriorityError,
    ProtocolError,
    RateLimitTimeout,
    ShardLostError,
    ShardMovedError,
    SpecError,
    TableClosedError,
    UnknownKeyError,
    WindowTooLongError,
)
from .rate_limiters import MinSize, Queue, RateLimiter, SampleToInsertRatio, Stack
from .registry import register_rate_limiter, register_selector
from .sample import SampleBatch, SampleBuffers
from .selectors import Fifo, Lifo, MaxHeap, MinHeap, Prioritized, Selector, Uniform, WithoutReplacement
from .shard import Shard
from .spec import ColumnSpec, TableSpec
from .stream import Stream
from .table import InsertResult, LocalTable, UpdateResult
from .writer import EpisodeWriter
from .writers import PriorityWriter, TrajectoryWriter, VectorWriter

__version__ = "0.1.0"

#: names imported on first use, each from its module (they import distributed)
_LAZY = {
    "DistributedTable": "gear_flow.distributed.api",
    "GearFlowDashboard": "gear_flow.dashboard.plugin",
    "local_cluster": "gear_flow.deploy.local",
    "local_cuda_cluster": "gear_flow.deploy.local",
}


def __getattr__(name: str):
    """``gear_flow.DistributedTable`` and friends, imported on first use (PEP 562)."""
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'gear_flow' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


__all__ = [
    "CapacityError",
    "CheckpointError",
    "CoordinatorLostError",
    "ColumnSpec",
    "DeployError",
    "DistributedTable",
    "EmptyTableError",
    "EpisodeWriter",
    "Fifo",
    "GearFlowDashboard",
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
    "PriorityWriter",
    "Queue",
    "RateLimitTimeout",
    "RateLimiter",
    "SampleBatch",
    "SampleBuffers",
    "SampleToInsertRatio",
    "Selector",
    "Shard",
    "ShardLostError",
    "ShardMovedError",
    "SpecError",
    "Stack",
    "Stream",
    "TableClosedError",
    "TableSpec",
    "TrajectoryWriter",
    "Uniform",
    "UnknownKeyError",
    "UpdateResult",
    "VectorWriter",
    "WindowTooLongError",
    "WithoutReplacement",
    "local_cluster",
    "local_cuda_cluster",
    "register_rate_limiter",
    "register_selector",
]
