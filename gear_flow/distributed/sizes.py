"""Resident bytes of a distributed table: what each shard worker holds for it.

A mixin of :class:`~gear_flow.distributed.DistributedTable`, so that
``nbytes()`` answers as :meth:`LocalTable.nbytes <gear_flow.LocalTable.nbytes>` does.
"""

from __future__ import annotations

from .transport import Retry

#: times ``nbytes`` asks again after a lost worker (each loss or move is seen once)
_ATTEMPTS = 8


class SizesMixin:
    """``nbytes()`` of a distributed table (needs ``_ctx``, ``name``, ``_workers()``, ``_on_workers()``)."""

    def nbytes(self) -> dict:
        """Bytes the table's shards hold on their workers, by part.

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
        return self._ctx.sync(self.nbytes_async)

    async def nbytes_async(self) -> dict:
        """:meth:`nbytes` from async code.

        Returns
        -------
        dict
            As :meth:`nbytes`: ``{"data": int, "overhead": int}``, bytes.
        """
        for _ in range(_ATTEMPTS):
            res, errors = await self._on_workers(
                {a: ("nbytes", dict(name=self.name)) for a in self._workers()}, partial=True
            )
            if not any(isinstance(e, Retry) for e in errors):
                break
            # degraded: a worker was lost (its shards now marked lost, counted 0), or held none of the
            # table's shards any more (moved): asked again, as the shards are placed now
        errors = [e for e in errors if not isinstance(e, Retry)]
        if errors:  # a lost worker of a table that is not degraded: ShardLostError
            raise errors[0]
        return {k: sum(int(p[k]) for p in res.values()) for k in ("data", "overhead")}
