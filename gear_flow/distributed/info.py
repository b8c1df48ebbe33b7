"""What a distributed table holds, as reported to its users: ``size``, ``len()`` and ``info()``.

``size`` is the coordinator's count of committed items; ``info()`` adds every
reachable shard's own counters, the limiter's state and the lost shards.
:meth:`~gear_flow.distributed.sizes.SizesMixin.nbytes` (bytes held) is
beside it in :mod:`~gear_flow.distributed.sizes`.

:class:`InfoMixin` is a mixin of
:class:`~gear_flow.distributed.DistributedTable` so that these answer as
:class:`~gear_flow.LocalTable`'s do, on the handle itself.
"""

from __future__ import annotations

import asyncio

from ..errors import ShardMovedError
from .transport import call

#: times ``info`` asks again when shards move while it asks
_MOVES = 4


class InfoMixin:
    """``size``, ``len()``, ``info()`` of :class:`~gear_flow.distributed.DistributedTable`
    (needs the handle's state, ``_coord``, ``_workers()`` and ``flush()``)."""

    # -- info ---------------------------------------------------------------------------------
    @property
    def size(self) -> int:
        """Items in the table, as the coordinator counts them (committed inserts)."""
        return int(self._ctx.sync(self._coord, "lookup")["size"])

    def __len__(self) -> int:
        """Items in the table (:attr:`size`)."""
        return self.size

    def info(self) -> dict:
        """Global and per-shard sizes and counters, limiter state, lost shards.

        Samples served from this handle's lease are reported to the
        coordinator first, so the limiter state is current.

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
            not settled yet) and ``waiting`` (``{"inserts": n, "samples":
            n}`` blocked by the limiter).
        """
        self.flush()
        return self._ctx.sync(self.info_async)

    async def info_async(self) -> dict:
        """:meth:`info` for a caller inside the event loop (leased samples are not reported first).

        Returns
        -------
        dict
            As :meth:`info`.
        """
        for attempt in range(_MOVES + 1):
            state = await self._coord("lookup")
            await self._refresh(state["version"])  # the shards as placed now (moved, restored or lost since)
            calls = {a: ("info", dict(name=self.name)) for a in self._workers()}
            res = await asyncio.gather(
                *(call(self._ctx, a, "info", table=self.name, **calls[a][1]) for a in calls), return_exceptions=True
            )
            moved = [r.epoch for r in res if isinstance(r, ShardMovedError)]
            if not moved or attempt == _MOVES:
                break
            await self._moved(max(moved))  # shards moved while they were asked: asked again, as placed now
        shards, unreachable = [], []
        for a, r in zip(calls, res):
            if isinstance(r, BaseException):
                unreachable.append(a)
            else:
                shards.extend({**i, "worker": a} for i in r)
        shards.sort(key=lambda i: i["shard"])
        skip = ("shard", "capacity", "write_pos", "worker", "longest_episode")
        keys = [k for k in (shards[0] if shards else {}) if k not in skip]
        return {
            "name": self.name,
            "size": sum(i["size"] for i in shards),
            "coordinator_size": state["size"],
            "max_size": self.spec.max_size,
            "num_shards": self.spec.num_shards,
            "item_unit": self.spec.item_unit,
            "sampler": self._config["sampler"],
            "remover": self._config["remover"],
            "rate_limiter": state["rate_limiter"],
            "totals": {k: sum(i[k] for i in shards) for k in keys},
            "shards": shards,
            "lost": {int(k): v for k, v in state["lost"].items()},
            "unreachable_workers": unreachable,
            "placement": self.placement,
            "inserts_in_flight": state["inserts_in_flight"],
            "unsettled_inserts": state["unsettled_inserts"],
            "waiting": state["waiting"],
        }
