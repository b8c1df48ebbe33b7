"""What a distributed table reports about itself: its size, its counters (``info()``) and its bytes (``nbytes()``).

``size`` is the coordinator's count of committed items; ``info()`` adds every
reachable shard's own counters, the limiter's state and the lost shards;
``nbytes()`` sums what each shard worker holds for the table.  These are
functions over the handle they are given; the handle's ``size``, ``len()``,
``info()`` and ``nbytes()`` call them, so that they answer as
:class:`~gear_flow.LocalTable`'s do, on the handle itself.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from ..errors import ShardMovedError
from . import reader_draw
from .transport import Retry, call

if TYPE_CHECKING:
    from .api import DistributedTable

#: times ``info`` asks again when shards move while it asks
_MOVES = 4
#: times ``nbytes`` asks again after a lost worker (each loss or move is seen once)
_ATTEMPTS = 8


def size(table: DistributedTable) -> int:
    """Items in the table, as the coordinator counts them (committed inserts).

    Parameters
    ----------
    table : DistributedTable
        The handle on the table (its ``size`` and ``len()`` ask this).

    Returns
    -------
    int
        The coordinator's count of committed items.
    """
    return int(table._link.coordinator_here.lookup()["size"])


def info(table: DistributedTable) -> dict:
    """Global and per-shard sizes and counters, limiter state, lost shards.

    Samples served from this handle's lease are reported to the
    coordinator first, so the limiter state is current.

    Parameters
    ----------
    table : DistributedTable
        The handle on the table (the handle itself, on its method of this
        name).

    Returns
    -------
    dict
        ``name``; ``size`` (items, summed over the reachable shards);
        ``coordinator_size`` (items of committed inserts, as the
        coordinator counts them); ``max_size``, ``num_shards``,
        ``item_unit`` (from the spec); ``sampler``, ``remover``
        (their configs); ``rate_limiter`` (the limiter's state);
        ``totals`` (each per-shard counter summed over shards);
        ``shards`` (one dict per reachable shard, by shard id, with its
        ``worker``); ``lost`` (``{shard: record}``);
        ``unreachable_workers`` (addresses that did not answer);
        ``placement`` (``{shard: address}``); ``inserts_in_flight``
        (count); ``unsettled_inserts`` (committed inserts with a part
        whose worker did not answer in time, which the coordinator has
        not settled yet), ``waiting`` (``{"inserts": n, "samples":
        n}`` blocked by the limiter) and ``reader`` (what this handle draws
        itself from its host's published selection state, and what its
        owners have not learnt yet:
        :func:`~gear_flow.distributed.reader_draw.state`).
    """
    table.flush()
    return table._ctx.sync(info_async, table)


async def info_async(table: DistributedTable) -> dict:
    """:meth:`info` for a caller inside the event loop (leased samples are not reported first).

    Parameters
    ----------
    table : DistributedTable
        The handle on the table (the handle itself, on its method of this
        name).

    Returns
    -------
    dict
        As :meth:`info`.
    """
    for attempt in range(_MOVES + 1):
        state = await table._link.coordinator.lookup()
        await table._link.refresh(state["version"])  # the shards as placed now (moved, restored or lost since)
        calls = {a: ("info", dict(name=table.name)) for a in table._view.workers()}
        res = await asyncio.gather(
            *(call(table._ctx, a, "info", table=table.name, **calls[a][1]) for a in calls), return_exceptions=True
        )
        moved = [r.epoch for r in res if isinstance(r, ShardMovedError)]
        if not moved or attempt == _MOVES:
            break
        await table._link.moved(max(moved))  # shards moved while they were asked: asked again, as placed now
    shards, unreachable = [], []
    for a, r in zip(calls, res):
        if isinstance(r, BaseException):
            unreachable.append(a)
        else:
            shards.extend({**i, "worker": a} for i in r)
    shards.sort(key=lambda i: i["shard"])
    skip = ("shard", "capacity", "write_pos", "worker", "longest_episode", "disk")
    keys = [k for k in (shards[0] if shards else {}) if k not in skip]
    return {
        "name": table.name,
        "size": sum(i["size"] for i in shards),
        "coordinator_size": state["size"],
        "max_size": table.spec.max_size,
        "num_shards": table.spec.num_shards,
        "item_unit": table.spec.item_unit,
        "sampler": table._config["sampler"],
        "remover": table._config["remover"],
        "rate_limiter": state["rate_limiter"],
        "totals": {k: sum(i[k] for i in shards) for k in keys},
        "shards": shards,
        "lost": {int(k): v for k, v in state["lost"].items()},
        "unreachable_workers": unreachable,
        "placement": table.placement,
        "inserts_in_flight": state["inserts_in_flight"],
        "unsettled_inserts": state["unsettled_inserts"],
        "waiting": state["waiting"],
        "reader": reader_draw.state(table),
    }


def nbytes(table: DistributedTable) -> dict:
    """Bytes the table's shards hold on their workers, by part.

    Parameters
    ----------
    table : DistributedTable
        The handle on the table (the handle itself, on its method of this
        name).

    Returns
    -------
    dict
        ``{"data": bytes of the column rings, "overhead": index, priorities,
        selector trees}`` summed over the reachable shards (lost shards
        count 0), as :meth:`LocalTable.nbytes <gear_flow.LocalTable.nbytes>`.

    Raises
    ------
    ShardLostError
        A shard's worker is found lost by this call and the table is not
        ``degraded`` (a degraded table marks it lost and counts it 0;
        shards known lost before count 0 either way).
    """
    return table._ctx.sync(nbytes_async, table)


async def nbytes_async(table: DistributedTable) -> dict:
    """:meth:`nbytes` from async code.

    Parameters
    ----------
    table : DistributedTable
        The handle on the table (the handle itself, on its method of this
        name).

    Returns
    -------
    dict
        As :meth:`nbytes`: ``{"data": int, "overhead": int}``, bytes.
    """
    for _ in range(_ATTEMPTS):
        res, errors = await table._link.on_workers(
            {a: ("nbytes", dict(name=table.name)) for a in table._view.workers()}, partial=True
        )
        if not any(isinstance(e, Retry) for e in errors):
            break
        # degraded: a worker was lost (its shards now marked lost, counted 0), or held none of the
        # table's shards any more (moved): asked again, as the shards are placed now
    errors = [e for e in errors if not isinstance(e, Retry)]
    if errors:  # a lost worker of a table that is not degraded: ShardLostError
        raise errors[0]
    return {k: sum(int(p[k]) for p in res.values()) for k in ("data", "overhead")}
