"""The worker's insert path: validating, staging and writing inserts into local shards as transactions.

``stage`` validates and keeps the episodes (no copy, nothing visible),
``apply`` writes them, ``abort`` forgets them; ``write`` is both at once for
an insert that touches only this worker.  ``status`` tells the coordinator
what became of a transaction whose client went away.  What each transaction
became is kept by the table's
:class:`~gear_flow.distributed.host_transactions.TransactionMemory`; this
module validates the parts and writes them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..errors import CapacityError, SpecError
from ..shard import EpisodeBatch
from ..storage.staging import read_staged

if TYPE_CHECKING:
    from .host_tables import HostedTable, HostedTables


def _batch(t: HostedTable, p: dict) -> tuple[int, EpisodeBatch]:
    """One part of an insert, checked against the table's spec: ``(shard, EpisodeBatch)``."""
    s = t.shard(p["shard"])
    lengths = np.asarray(p["lengths"], dtype=np.int64)
    chunks = list(p["chunks"])
    if p.get("staged") is not None:  # the client's staging segment on this machine: views into it
        chunks = read_staged(p["staged"]["segment"], chunks, f"shard {s.shard_id}")
    if len(chunks) != len(lengths) or np.any(lengths < 1):
        raise SpecError(f"shard {s.shard_id}: {len(chunks)} chunks for {len(lengths)} episode lengths")
    if not len(np.asarray(p["episode_ids"])) == len(np.asarray(p["stamps"])) == len(lengths):
        raise SpecError(f"shard {s.shard_id}: one episode id and one stamp per episode are needed")
    if lengths.sum() > s.capacity:
        raise SpecError(f"shard {s.shard_id}: {int(lengths.sum())} steps exceed its capacity ({s.capacity})")
    names = t.spec.name_set
    for c, n in zip(chunks, lengths):
        # more keys than columns (each column is required below): some unknown, refused as the public insert
        # refuses them (InvalidDataError) where they were dropped; one len() per episode when there are none
        if hasattr(c, "keys") and len(c) > len(names):
            unknown = sorted(str(k) for k in c.keys() if k not in names)
            raise SpecError(f"shard {s.shard_id}: unknown column(s) {unknown[:8]}; the table's: {sorted(names)}")
        for col in t.spec.columns:
            a = c.get(col.name) if hasattr(c, "get") else None
            if not isinstance(a, np.ndarray) or a.dtype != col.dtype or a.shape != (int(n), *col.shape):
                raise SpecError(
                    f"shard {s.shard_id}: column {col.name!r} must be {col.dtype}[{int(n)}, *{col.shape}], got "
                    f"{getattr(a, 'dtype', type(a).__name__)}{list(getattr(a, 'shape', ()))}"
                )
    n_items = int(lengths.sum()) if t.spec.item_unit == "step" else len(lengths)
    pr = p.get("priorities")
    if pr is not None:
        pr = np.asarray(pr, dtype=np.float64)
        if pr.shape != (n_items,) or not np.all(np.isfinite(pr) & (pr >= 0)):
            raise SpecError(f"shard {s.shard_id}: priorities must be {n_items} finite values >= 0")
        t.cfg.check_priorities(pr)  # as an update's: a weight the sum tree cannot hold poisons every draw
    batch = EpisodeBatch(
        chunks,
        lengths,
        np.asarray(p["episode_ids"], dtype=np.int64),
        np.asarray(p["stamps"], dtype=np.int64),
        pr,
    )
    return s.shard_id, batch


class HostWriter:
    """Inserts into the tables a worker hosts.

    Parameters
    ----------
    tables : HostedTables
        The worker's hosted tables.

    Examples
    --------
    >>> from gear_flow.distributed.host_tables import HostedTables
    >>> HostWriter(HostedTables()).status("t", "txn")
    {'state': 'unknown'}
    """

    def __init__(self, tables: HostedTables) -> None:
        self.tables = tables

    def stage(self, name: str, txn: str, parts: list[dict]) -> int:
        """Validate and keep ``parts`` of insert ``txn`` (nothing visible yet, no copy).

        Parameters
        ----------
        name : str
            The table's name.
        txn : str
            The insert's transaction id.
        parts : list of dict
            Each ``{"shard", "chunks", "lengths", "episode_ids", "stamps",
            "priorities"}``: one chunk (``{column: [T, *shape] array}``), one
            length, episode id and first stamp per episode, and None or one
            float64 priority per item; with ``staged`` (``{"segment"}``) the
            chunks are places in a client's staging segment on this machine
            (:mod:`gear_flow.storage.staging`).

        Returns
        -------
        int
            Items staged.

        Raises
        ------
        SpecError
            A malformed part (wrong dtype or shape, more steps than the
            shard's capacity, bad priorities), or a transaction staged
            before with other parts or already applied.  The same parts
            staged again (a request sent again after its reply was lost)
            are staged once.
        CapacityError
            A queue or stack would overwrite items never handed out.
        """
        t = self.tables.table(name)
        batches = [_batch(t, p) for p in parts]
        if t.cfg.lossless:  # a Queue/Stack: the ring may never overwrite an item still waiting
            steps = {}
            for sid, b in batches:
                steps[sid] = steps.get(sid, 0) + int(b.lengths.sum())
            for sid, n in steps.items():
                lost = t.shards[sid].live_overwritten(n)
                if lost:
                    raise CapacityError(
                        f"shard {sid} of table {name!r}: storing {n} more steps would overwrite {lost} items that "
                        f"were never handed out (capacity {t.spec.capacity}); give the table more capacity; "
                        "nothing was inserted"
                    )
        return t.txns.stage(txn, batches)

    def apply(self, name: str, txn: str) -> dict:
        """Write the staged insert ``txn``.

        Applying a transaction twice returns the first result (the coordinator's
        recovery and the client may both ask).

        Parameters
        ----------
        name : str
            The table's name.
        txn : str
            The insert's transaction id.

        Returns
        -------
        dict
            ``{"first_keys": {shard: int64 key of each episode's first item},
            "items": {shard: items written}, "evicted": {shard: items
            overwritten}}``.

        Raises
        ------
        SpecError
            ``txn`` is neither staged nor applied here (or was aborted).
        """
        t = self.tables.table(name)
        done, batches = t.txns.begin_apply(txn)
        if done is not None:
            return done
        res = {"first_keys": {}, "evicted": {}, "items": {}}
        written = None
        try:
            for sid, batch in batches:
                s = t.shards[sid]
                with s.lock:  # count only this insert's evictions
                    before = s.counters.evicted
                    fk, n = s.insert(batch)
                    ev = s.counters.evicted - before
                res["first_keys"][sid] = (
                    np.concatenate([res["first_keys"][sid], fk]) if sid in res["first_keys"] else fk
                )
                res["items"][sid] = res["items"].get(sid, 0) + int(n)
                if ev:
                    res["evicted"][sid] = res["evicted"].get(sid, 0) + int(ev)
            written = res
        finally:
            t.txns.end_apply(txn, written)
        return res

    def write(self, name: str, txn: str, parts: list[dict]) -> dict:
        """Stage and apply at once (an insert that touches only this worker).

        Writing a transaction already applied returns the first result: a
        request sent again after its reply was lost is written once.

        Parameters
        ----------
        name : str
            The table's name.
        txn : str
            The insert's transaction id.
        parts : list of dict
            As :meth:`stage`.

        Returns
        -------
        dict
            As :meth:`apply`.

        Raises
        ------
        SpecError, CapacityError
            As :meth:`stage`.
        """
        txns = self.tables.table(name).txns
        done = txns.applied(txn)
        if done is not None:  # sent again (its reply was lost): written once, the same answer
            return done
        try:
            self.stage(name, txn, parts)  # (refuses an aborted txn; waits for the same write being applied)
        except SpecError:
            done = txns.applied(txn)  # sent again while the first was applied: its answer
            if done is None:
                raise
            return done
        return self.apply(name, txn)

    def forget(self, name: str, txn: str) -> bool:
        """Forget a staged insert; a stage, write or apply of ``txn`` that comes later (sent before, delivered
        after) is refused.  An insert applied already stays applied.

        Parameters
        ----------
        name : str
            The table's name (an unknown one: nothing to do).
        txn : str
            The insert's transaction id.

        Returns
        -------
        bool
            True if it was staged.
        """
        t = self.tables.get(name)
        return t is not None and t.txns.forget(txn)

    def status(self, name: str, txn: str) -> dict:
        """What became of ``txn`` here (for the coordinator's recovery of a departed client's insert).

        Parameters
        ----------
        name : str
            The table's name.
        txn : str
            The insert's transaction id.

        Returns
        -------
        dict
            ``{"state": "staged" | "applying" | "applied" | "aborted" |
            "unknown"}``, with ``result`` (as :meth:`apply` returned it) when
            applied.
        """
        t = self.tables.get(name)
        return {"state": "unknown"} if t is None else t.txns.status(txn)
