"""What a request to a table's gate may ask: refused at once, before anything is queued or counted.

The coordinator calls these before it hands a request to the
:class:`~gear_flow.distributed.gate.TableGate`: an insert larger than the
table (or than the limiter admits at once), a sample the limiter can never
admit, a commit that does not match its admission, or a removal report that
cannot be true is answered with an error and leaves the gate's state as it
was.

:class:`GateChecks` is a mixin of :class:`~gear_flow.distributed.gate.TableGate`
rather than a set of functions because each check reads the gate's state
(placement, spec, limiter, inserts in flight, shard sizes); keeping them
here keeps the gate's state machine (admission, transactions, owners,
losses) readable on its own.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import ProtocolError


class GateChecks:
    """Request checks of :class:`~gear_flow.distributed.gate.TableGate` (needs its state; reads only)."""

    # -- what a request may ask (refused at once, before anything is queued or counted) ----------------
    def _shards(self, per_shard: dict, op: str, field: str) -> None:
        unknown = sorted(int(s) for s in per_shard if int(s) not in self.placement)
        if unknown:
            raise ProtocolError(f"coordinator {op!r}: field {field!r} names shard(s) {unknown} of no table shard")

    def check_insert(self, n: int, episodes: int, per_shard: dict) -> None:
        """Refuse an insert that can never be admitted, before it is queued.

        Parameters
        ----------
        n : int
            Items of the insert.
        episodes : int
            Episodes of the insert.
        per_shard : dict
            ``{shard: items}`` routed to each shard.

        Raises
        ------
        ProtocolError
            More items or episodes than the table can ever hold, ``n !=
            episodes`` for episode items, an unknown shard, or per-shard
            counts above ``n``.
        SpecError
            ``n`` exceeds what the limiter admits at once.
        """
        room = self.spec.capacity * self.spec.num_shards
        if n > room or episodes > room or (self.spec.item_unit == "episode" and n != episodes):
            raise ProtocolError(
                f"coordinator 'admit_insert': {n} items in {episodes} episodes can never be stored by table "
                f"{self.name!r} ({self.spec.num_shards} shards of {self.spec.capacity} steps)"
            )
        self._shards(per_shard, "admit_insert", "per_shard")
        if sum(int(k) for k in per_shard.values()) > n:
            raise ProtocolError(f"coordinator 'admit_insert': per_shard counts add up to more than n={n}")
        self.limiter.check_insert_size(n)

    def check_sample(self, n: int) -> None:
        """Refuse a sample of ``n`` that the limiter can never admit, before it is queued.

        Parameters
        ----------
        n : int
            Items of the sample.

        Raises
        ------
        SpecError
            ``n`` exceeds what the limiter admits at once.
        """
        self.limiter.check_sample_size(n)

    def check_commit(self, txn: str, items: dict, evicted: dict, unsettled: Sequence[str] = ()) -> None:
        """Refuse a commit that does not match its admission.

        Parameters
        ----------
        txn : str
            Transaction id of the insert.
        items : dict
            ``{shard: items written}``.
        evicted : dict
            ``{shard: items the insert overwrote}``.
        unsettled : sequence of str, default ()
            Workers whose part is not known yet (they did not answer).

        Raises
        ------
        ProtocolError
            No such insert in flight, an unknown shard, more items than
            were admitted, or an unsettled worker that holds none of the
            table's shards.
        """
        strangers = sorted(set(unsettled) - set(self.placement.values()))
        if strangers:
            raise ProtocolError(f"coordinator 'commit_insert': {strangers} hold no shard of table {self.name!r}")
        t = self.txns.get(txn)
        if t is None:
            raise ProtocolError(f"coordinator 'commit_insert': no insert {txn!r} is in flight on table {self.name!r}")
        self._shards(items, "commit_insert", "items")
        self._shards(evicted, "commit_insert", "evicted")
        if sum(int(k) for k in items.values()) > t.n:
            raise ProtocolError(f"coordinator 'commit_insert': items add up to more than the {t.n} admitted")

    def check_removal(self, k: int, per_shard: dict) -> None:
        """Refuse a removal report that cannot be true.

        Parameters
        ----------
        k : int
            Items removed in all.
        per_shard : dict
            ``{shard: items removed}``; empty when not known per shard.

        Raises
        ------
        ProtocolError
            An unknown shard, per-shard counts not adding up to ``k``, or more
            items than a shard (or the table) holds.
        """
        self._shards(per_shard, "removed", "per_shard")
        if per_shard and sum(int(j) for j in per_shard.values()) != k:
            raise ProtocolError(f"coordinator 'removed': per_shard adds up to {sum(per_shard.values())}, not k={k}")
        over = [s for s, j in per_shard.items() if int(s) not in self.lost and int(j) > self.shard_size.get(int(s), 0)]
        if over or (not per_shard and k > self.size):
            raise ProtocolError(
                f"coordinator 'removed': {k} items cannot have left table {self.name!r} "
                f"(shard sizes {self.shard_size}, size {self.size})"
            )
