"""The distributed table: shards on Dask workers, a coordinator on the scheduler."""

from .coordinator import GearFlowCoordinator
from .host import ShardHost
from .plugin import GearFlowWorker
from .table import DistributedTable

__all__ = ["DistributedTable", "GearFlowCoordinator", "GearFlowWorker", "ShardHost"]
