"""The worker's item edits: priority updates, deletes and removal over local shards.

``update`` sets priorities by item seq, ``delete`` removes items by seq (both
all or nothing for unknown keys, which ``check_keys`` finds), and ``remove``
evicts what the table's remover chose (a planner's ``Evict`` part).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..errors import SpecError
from ..ops.seeds import generator
from ..table.executor import evict_on, summary
from .host_sampling import release
from .host_transactions import SampleHolds

if TYPE_CHECKING:
    from .host_tables import HostedTables


class HostEditor:
    """Priority updates, deletes and removal on the tables a worker hosts.

    Parameters
    ----------
    tables : HostedTables
        The worker's hosted tables.

    Examples
    --------
    >>> from gear_flow.distributed.host_tables import HostedTables
    >>> HostEditor(HostedTables()).delete("t", {})  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    SpecError: no table 't' on this worker; tables here: []
    """

    def __init__(self, tables: HostedTables) -> None:
        self.tables = tables

    def check_keys(self, name: str, seqs_by_shard: dict) -> None:
        """Raise UnknownKeyError if any seq was never issued (nothing applied).

        Parameters
        ----------
        name : str
            The table's name.
        seqs_by_shard : dict
            ``{shard: int64 item seqs}`` (keys decoded).

        Raises
        ------
        UnknownKeyError
            A seq at or above its shard's next one.
        SpecError
            No such table or shard here.
        """
        t = self.tables.table(name)
        for i, seqs in seqs_by_shard.items():
            t.shard(i).resolve(np.asarray(seqs, dtype=np.int64))

    def update(
        self,
        name: str,
        seqs_by_shard: dict,
        prios_by_shard: dict,
        stamps_by_shard: dict | None = None,
        masses: list | None = None,
    ) -> int | dict:
        """Set priorities by item seq; all or nothing for invalid input or unknown keys.

        Parameters
        ----------
        name : str
            The table's name.
        seqs_by_shard : dict
            ``{shard: int64 item seqs}``.
        prios_by_shard : dict
            ``{shard: float64 priorities}``, one per seq, same shards.
        stamps_by_shard : dict, optional
            ``{shard: int64 stamps}`` from the table-wide clock, to order heap
            ties across shards.
        masses : list of dict, optional
            ``[{"length", "boundary"}]``: the plans the caller keeps masses
            for.

        Returns
        -------
        int or dict
            Without ``masses``: the number of stale seqs (items gone).  With
            it: ``{"stale": n, "masses": [{shard: sampler mass}]}``, the
            updated shards' masses after the update for each plan (empty for
            unweighted selection), so the caller's next plan needs no masses
            round trip.

        Raises
        ------
        SpecError
            Seqs and priorities that do not pair up.
        InvalidPriorityError
            Priorities the sampler or remover cannot represent.
        UnknownKeyError
            A seq never issued.
        """
        if set(seqs_by_shard) != set(prios_by_shard) or any(
            len(np.asarray(seqs_by_shard[i])) != len(np.asarray(prios_by_shard[i])) for i in seqs_by_shard
        ):
            raise SpecError("worker 'update': one priority per key, for the same shards")
        for i, st in (stamps_by_shard or {}).items():  # (the compiled update reads one per key, unchecked)
            if i not in seqs_by_shard or len(np.asarray(st)) != len(np.asarray(seqs_by_shard[i])):
                raise SpecError(f"worker 'update': shard {i!r}'s stamps are not one per key of that shard")
        self.check_keys(name, seqs_by_shard)
        t = self.tables.table(name)
        for i in seqs_by_shard:
            t.cfg.check_priorities(np.asarray(prios_by_shard[i], np.float64))
        st = stamps_by_shard or {}
        stale = sum(
            t.shard(i).update_priorities(
                np.asarray(seqs, np.int64), np.asarray(prios_by_shard[i], np.float64), st.get(i)
            )
            for i, seqs in seqs_by_shard.items()
        )
        if masses is None or t.cfg.selection != "weighted":
            return stale if masses is None else {"stale": stale, "masses": []}
        return {
            "stale": stale,
            "masses": [
                {int(i): summary(t.shard(i), "sampler", m["length"], m["boundary"]) for i in seqs_by_shard}
                for m in masses
            ],
        }

    def delete(self, name: str, seqs_by_shard: dict) -> tuple[dict, int]:
        """Remove items by seq (all or nothing for unknown keys).

        Parameters
        ----------
        name : str
            The table's name.
        seqs_by_shard : dict
            ``{shard: int64 item seqs}``.

        Returns
        -------
        deleted : dict of int to int
            Items removed per shard.
        stale : int
            Seqs whose item was already gone.

        Raises
        ------
        UnknownKeyError
            A seq never issued.
        SampleHolds
            A sample gathered but not yet finished here holds one of the
            items: nothing was deleted; the caller asks again once it finished.
        """
        self.check_keys(name, seqs_by_shard)
        t = self.tables.table(name)
        seqs_by_shard = {i: np.asarray(seqs, np.int64) for i, seqs in seqs_by_shard.items()}
        locks = t.locked(sorted(seqs_by_shard))  # no part is gathered and made pending meanwhile
        try:
            for i, seqs in seqs_by_shard.items():
                if t.txns.holds(int(i), seqs):
                    raise SampleHolds(f"table {name!r}: shard {i}'s items are held by a sample being finished")
            d, st = {}, 0
            for i, seqs in seqs_by_shard.items():
                a, b = t.shard(i).delete(seqs)
                d[int(i)] = a
                st += b
            return d, st
        finally:
            release(locks)

    def remove(
        self,
        name: str,
        counts: dict | None = None,
        slots: dict | None = None,
        seed: int | None = None,
        seqs: dict | None = None,
    ) -> dict:
        """Evict by the remover (an :class:`planner.Evict` part).

        Parameters
        ----------
        name : str
            The table's name.
        counts : dict, optional
            ``{shard: items}`` for the remover to choose (random removers).
        slots : dict, optional
            ``{shard: slots}`` chosen by a global merge (ordered removers).
            Give exactly one of ``counts`` and ``slots``.
        seed : int, optional
            Seeds the removers' generator.
        seqs : dict, optional
            ``{shard: seqs}``, one per slot of ``slots``: the items meant (as
            the candidates listed them); a slot an insert has written over
            since is spared.

        Returns
        -------
        dict of int to int
            Items removed, per shard that removed any.

        Raises
        ------
        SpecError
            Both or neither of ``counts`` and ``slots``, slots beyond a
            shard's capacity, seqs without slots or not one per slot, or a
            shard not here.
        """
        rng = generator(seed)
        t = self.tables.table(name)
        if (counts is None) == (slots is None):
            raise SpecError("worker 'remove': give exactly one of counts and slots")
        if seqs is not None and (slots is None or set(seqs) != set(slots)):
            raise SpecError("worker 'remove': seqs must name the shards of slots")
        for i, v in (slots or {}).items():
            if len(v) and int(np.max(v)) >= t.shard(i).capacity:
                raise SpecError(f"worker 'remove': slots of shard {i} must be below its capacity")
            if seqs is not None and len(seqs[i]) != len(v):
                raise SpecError(f"worker 'remove': shard {i} has {len(v)} slots and {len(seqs[i])} seqs")
        for i in counts or {}:
            t.shard(i)
        out = {}
        for i, v in (slots if slots is not None else counts or {}).items():
            if slots is not None:
                k = evict_on(t.shard(i), slots=v, rng=rng, seqs=None if seqs is None else seqs[i])
            else:
                k = evict_on(t.shard(i), counts=v, rng=rng)
            if k:
                out[int(i)] = k
        return out
