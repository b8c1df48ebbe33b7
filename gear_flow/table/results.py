"""What table operations return (shared by the local and the distributed table)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class InsertResult:
    """What an insert stored.

    Attributes
    ----------
    episode_ids : numpy.ndarray
        int64, table-wide id of each inserted episode, in input order.
    first_keys : numpy.ndarray
        int64, key of each episode's first item (for episode items: the
        episode's key; for step items, step ``j`` of episode ``i`` has key
        ``first_keys[i] + j``).
    shards : numpy.ndarray
        Shard of each episode.
    num_items : int
        Items created.
    """

    episode_ids: np.ndarray
    first_keys: np.ndarray
    shards: np.ndarray
    num_items: int


@dataclass(frozen=True)
class UpdateResult:
    """Outcome of a priority update or delete.

    Attributes
    ----------
    applied : int
        An update: the keys applied, a repeated key each time (its last
        value kept), so that ``applied + stale`` is the number of keys.  A
        delete: the items removed, a repeated key once.
    stale : int
        Keys ignored because their item was already gone (evicted, expired,
        deleted, or on a lost shard).
    """

    applied: int
    stale: int
