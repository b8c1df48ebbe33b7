"""Resident bytes of a distributed table: what each shard worker holds for it.

A mixin of :class:`~gear_flow.distributed.DistributedTable`, so that
``nbytes()`` answers as :meth:`LocalTable.nbytes <gear_flow.LocalTable.nbytes>` does.
"""

from __future__ import annotations

import asyncio

from .transport import call


class SizesMixin:
    """``nbytes()`` of a distributed table (needs ``_ctx``, ``name``, ``_workers()``)."""

    def nbytes(self) -> dict:
        """Bytes the table's shards hold on their workers, by part.

        Returns
        -------
        dict
            ``{"data": bytes of the column rings, "overhead": index, priorities,
            selector trees}`` summed over the reachable shards (lost shards
            count 0), as :meth:`LocalTable.nbytes <gear_flow.LocalTable.nbytes>`.
        """
        return self._ctx.sync(self.nbytes_async)

    async def nbytes_async(self) -> dict:
        """:meth:`nbytes` from async code.

        Returns
        -------
        dict
            As :meth:`nbytes`: ``{"data": int, "overhead": int}``, bytes.
        """
        addrs = list(self._workers())
        parts = await asyncio.gather(*(call(self._ctx, a, "nbytes", table=self.name, name=self.name) for a in addrs))
        return {k: sum(int(p[k]) for p in parts) for k in ("data", "overhead")}
