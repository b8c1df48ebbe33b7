"""The distributed table: shards on Dask workers, a coordinator on the scheduler."""

from .api import DistributedTable
from .coordinator import GearFlowCoordinator
from .host import ShardHost
from .plugin import GearFlowWorker

__all__ = ["DistributedTable", "GearFlowCoordinator", "GearFlowWorker", "ShardHost"]
