"""Tables: the global view over shards."""

from .config import TableConfig
from .local import LocalTable
from .results import InsertResult, UpdateResult

__all__ = ["InsertResult", "LocalTable", "TableConfig", "UpdateResult"]
