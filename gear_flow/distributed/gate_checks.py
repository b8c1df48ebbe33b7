"""What a request to a table's gate may ask: refused at once, before anything is queued or counted.

The coordinator calls these before it hands a request to the
:class:`~gear_flow.distributed.gate.TableGate`: an insert larger than the
table (or than the limiter admits at once), a sample the limiter can never
admit, a commit that does not match its admission, or a removal report that
cannot be true is answered with an error and leaves the gate's state as it
was.

Plain functions over the gate they are handed: they read its state
(placement, spec, limiter, inserts in flight, shard sizes) and change
nothing, so the gate's state machine (admission, transactions, owners,
losses) stays readable on its own and knows nothing of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..errors import ProtocolError

if TYPE_CHECKING:
    from .gate import TableGate


def _shards(g: TableGate, per_shard: dict, op: str, field: str) -> None:
    unknown = sorted(int(s) for s in per_shard if int(s) not in g.placement)
    if unknown:
        raise ProtocolError(f"coordinator {op!r}: field {field!r} names shard(s) {unknown} of no table shard")


def check_insert(g: TableGate, n: int, episodes: int, per_shard: dict, grouped: bool = False) -> None:
    """Refuse an insert that can never be admitted, before it is queued.

    Parameters
    ----------
    g : TableGate
        The table's gate (read only).
    n : int
        Items of the insert.
    episodes : int
        Episodes of the insert.
    per_shard : dict
        ``{shard: items}`` routed to each shard.
    grouped : bool, default False
        An ingestion's insert, staged as consecutive groups of at most a
        shard's capacity: it may hold more items than the table, the newest
        kept (not for a Queue or Stack, which keeps every item).

    Raises
    ------
    ProtocolError
        More items or episodes than the table can ever hold, ``n !=
        episodes`` for episode items, an unknown shard, or per-shard
        counts above ``n``.
    SpecError
        ``n`` exceeds what the limiter admits at once.
    """
    room = g.spec.capacity * g.spec.num_shards
    too_many = (n > room or episodes > room) and (g.lossless or not grouped)
    if too_many or (g.spec.item_unit == "episode" and n != episodes):
        raise ProtocolError(
            f"coordinator 'admit_insert': {n} items in {episodes} episodes can never be stored by table "
            f"{g.name!r} ({g.spec.num_shards} shards of {g.spec.capacity} steps)"
        )
    _shards(g, per_shard, "admit_insert", "per_shard")
    if sum(int(k) for k in per_shard.values()) > n:
        raise ProtocolError(f"coordinator 'admit_insert': per_shard counts add up to more than n={n}")
    g.limiter.check_insert_size(n)


def check_sample(g: TableGate, n: int) -> None:
    """Refuse a sample of ``n`` that the limiter can never admit, before it is queued.

    Parameters
    ----------
    g : TableGate
        The table's gate (read only).
    n : int
        Items of the sample.

    Raises
    ------
    SpecError
        ``n`` exceeds what the limiter admits at once.
    """
    g.limiter.check_sample_size(n)


def check_commit(g: TableGate, txn: str, items: dict, evicted: dict, unsettled: Sequence[str] = ()) -> None:
    """Refuse a commit that does not match its admission.

    Parameters
    ----------
    g : TableGate
        The table's gate (read only).
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
    strangers = sorted(set(unsettled) - set(g.placement.values()))
    if strangers:
        raise ProtocolError(f"coordinator 'commit_insert': {strangers} hold no shard of table {g.name!r}")
    t = g.txns.get(txn)
    if t is None:
        if txn in g.committed:  # committed already: a repeat, ignored (TableGate.commit_insert)
            return
        raise ProtocolError(f"coordinator 'commit_insert': no insert {txn!r} is in flight on table {g.name!r}")
    _shards(g, items, "commit_insert", "items")
    _shards(g, evicted, "commit_insert", "evicted")
    if sum(int(k) for k in items.values()) > t.n:
        raise ProtocolError(f"coordinator 'commit_insert': items add up to more than the {t.n} admitted")


def check_removal(g: TableGate, k: int, per_shard: dict) -> None:
    """Refuse a removal report that cannot be true.

    Parameters
    ----------
    g : TableGate
        The table's gate (read only).
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
    _shards(g, per_shard, "removed", "per_shard")
    if per_shard and sum(int(j) for j in per_shard.values()) != k:
        raise ProtocolError(f"coordinator 'removed': per_shard adds up to {sum(per_shard.values())}, not k={k}")
    over = [s for s, j in per_shard.items() if int(s) not in g.lost and int(j) > g.shard_size.get(int(s), 0)]
    if over or (not per_shard and k > g.size):
        raise ProtocolError(
            f"coordinator 'removed': {k} items cannot have left table {g.name!r} "
            f"(shard sizes {g.shard_size}, size {g.size})"
        )
