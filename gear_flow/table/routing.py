"""Which shard each inserted episode goes to (episodes are never split)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..errors import CapacityError, SpecError

ROUTINGS = ("balanced", "round_robin")


def check_shard(shard: object, num_shards: int) -> int:
    """A shard a caller names (``insert(shard=...)``): an integer in ``[0, num_shards)``, not a bool or a float
    that compares equal to one.

    Parameters
    ----------
    shard : object
        The value given.
    num_shards : int
        The table's shards.

    Returns
    -------
    int
        ``shard``.

    Raises
    ------
    SpecError
        Anything else.
    """
    if isinstance(shard, bool) or not isinstance(shard, (int, np.integer)) or not 0 <= shard < num_shards:
        raise SpecError(f"shard {shard} must be in [0, {num_shards})")
    return int(shard)


def route(
    lengths: np.ndarray, num_shards: int, capacity: int, policy: str, start: int, shard: int | None = None
) -> np.ndarray:
    """Shard of each episode, so that no shard receives more than ``capacity`` steps.

    ``balanced`` gives each episode to the shard that received the fewest steps
    so far in this call (ties: the next in round-robin order from ``start``);
    ``round_robin`` cycles from ``start``.  ``shard`` pins all episodes.

    Parameters
    ----------
    lengths : numpy.ndarray
        int64 ``[E]``, steps of each episode of the call.
    num_shards : int
        Shards to route over (indices ``0 .. num_shards - 1``).
    capacity : int
        Steps a shard's ring holds.
    policy : {"balanced", "round_robin"}
        The routing policy.
    start : int
        Round-robin position to start from (the table advances it per call).
    shard : int, optional
        Put every episode on this shard.

    Returns
    -------
    numpy.ndarray
        int64 ``[E]``, the shard of each episode.

    Raises
    ------
    SpecError
        An unknown ``policy``, or ``shard`` outside ``[0, num_shards)``.
    CapacityError
        An episode longer than ``capacity``, or a call putting more than
        ``capacity`` steps on one shard; nothing is inserted.

    Examples
    --------
    >>> import numpy as np
    >>> route(np.array([5, 1, 1, 1]), 2, 10, "balanced", 0).tolist()
    [0, 1, 1, 1]
    """
    if policy not in ROUTINGS:
        raise SpecError(f"routing {policy!r} must be one of {ROUTINGS}")
    too_long = np.flatnonzero(lengths > capacity)
    if len(too_long):
        i = int(too_long[0])
        raise CapacityError(
            f"episode {i} has {int(lengths[i])} steps, more than a shard's capacity ({capacity}); nothing was inserted"
        )
    n = len(lengths)
    if shard is not None:
        check_shard(shard, num_shards)
        dest = np.full(n, shard, dtype=np.int64)
    elif policy == "round_robin" or num_shards == 1:
        dest = (start + np.arange(n)) % num_shards
    else:
        load = np.zeros(num_shards, dtype=np.int64)
        order = (start + np.arange(num_shards)) % num_shards
        dest = np.empty(n, dtype=np.int64)
        for i, ln in enumerate(lengths):
            s = order[np.argmin(load[order])]
            dest[i] = s
            load[s] += ln
    per = np.bincount(dest, weights=lengths, minlength=num_shards)
    if per.max() > capacity:
        s = int(per.argmax())
        raise CapacityError(
            f"this insert puts {int(per[s])} steps on shard {s}, more than its capacity ({capacity}); "
            "insert fewer steps per call; nothing was inserted"
        )
    return dest


def pick(items: Sequence, sel: np.ndarray) -> list:
    """The items of the episodes ``sel`` (ascending indices into ``items``): ``items`` itself when that is
    all of them, as for every insert into one shard.

    Parameters
    ----------
    items : sequence
        One entry per episode of the call.
    sel : numpy.ndarray
        int64 ascending indices, the episodes one shard receives.

    Returns
    -------
    list
        ``[items[i] for i in sel]``.
    """
    if len(sel) == len(items) and type(items) is list:
        return items
    return list(map(items.__getitem__, sel.tolist()))


def item_rows(values: np.ndarray | None, item_off: np.ndarray, sel: np.ndarray) -> np.ndarray | None:
    """The per-item ``values`` (priorities) of the episodes ``sel``, in order: one slice when they are
    consecutive episodes.

    Parameters
    ----------
    values : numpy.ndarray or None
        One value per item of the call, episode after episode (None: none given).
    item_off : numpy.ndarray
        int64 ``[E + 1]``: episode ``i``'s items are ``values[item_off[i]:item_off[i + 1]]``.
    sel : numpy.ndarray
        int64 ascending indices, the episodes one shard receives.

    Returns
    -------
    numpy.ndarray or None
        Their values back to back (None when ``values`` is).
    """
    if values is None:
        return None
    if not len(sel):
        return values[:0]
    first, last = int(sel[0]), int(sel[-1])
    if last - first + 1 == len(sel):
        return values[item_off[first] : item_off[last + 1]]
    return np.concatenate([values[item_off[i] : item_off[i + 1]] for i in sel])
