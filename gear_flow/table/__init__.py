"""Tables: the global view over shards."""

from .local import InsertResult, LocalTable, UpdateResult

__all__ = ["InsertResult", "LocalTable", "UpdateResult"]
