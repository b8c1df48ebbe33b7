"""The write path of a worker's host: inserts as transactions over local shards.

Inserts are transactions: ``stage`` validates and keeps the episodes (no copy,
nothing visible), ``apply`` writes them, ``abort`` forgets them; ``write`` is
both at once for an insert that touches only this worker.  ``status`` tells
the coordinator what became of a transaction whose client went away.

:class:`WritingHost` is a mixin of :class:`~gear_flow.distributed.host.ShardHost`
rather than a class of its own because these methods share the host's tables
and their locks with sampling and checkpoints, and the worker plugin calls
them as ``ShardHost.<method>``; keeping them here keeps the write path
readable on its own.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

import numpy as np

from ..errors import CapacityError, SpecError
from ..shard import EpisodeBatch
from ..storage.staging import read_staged

if TYPE_CHECKING:
    from .host import HostedTable

#: transactions whose outcome a worker remembers (for the coordinator's recovery, and a request sent again)
REMEMBER = 4096


def remember(memo: OrderedDict, txn: str, outcome: object) -> None:
    """Keep ``txn``'s outcome in ``memo``, forgetting the oldest beyond :data:`REMEMBER`.

    Parameters
    ----------
    memo : OrderedDict
        The table's ``applied`` or ``finished`` (the caller holds its lock).
    txn : str
        The transaction.
    outcome : object
        What a request sent again for ``txn`` is answered with.
    """
    memo[txn] = outcome
    while len(memo) > REMEMBER:
        memo.popitem(last=False)


def _refuse_aborted(t, txn: str) -> None:
    """Raise if insert ``txn`` was aborted here (the caller holds ``t.lock``)."""
    if txn in t.aborted:
        raise SpecError(f"insert {txn!r} of table {t.name!r} was aborted on this worker")


def _items(batches: list, step: bool) -> dict[int, int]:
    """Items per shard of staged ``(shard, EpisodeBatch)`` pairs."""
    out: dict[int, int] = {}
    for sid, b in batches:
        out[sid] = out.get(sid, 0) + (int(b.lengths.sum()) if step else len(b.lengths))
    return out


class WritingHost:
    """Insert methods of :class:`~gear_flow.distributed.host.ShardHost` (needs ``table``, ``tables``, ``finish_sample``)."""

    # -- inserts: stage, apply, abort -----------------------------------------------------
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
        t = self.table(name)
        batches = [self._batch(t, p) for p in parts]
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
        step = t.spec.item_unit == "step"
        with t.lock:
            prior = t.staged.get(txn)
            if prior is not None and _items(prior, step) == _items(batches, step):
                return sum(_items(batches, step).values())  # sent again (its reply was lost): staged once
            if prior is not None or txn in t.applied:
                raise SpecError(f"insert {txn!r} of table {name!r} was already staged on this worker")
            _refuse_aborted(t, txn)
            t.staged[txn] = batches
        return sum(_items(batches, step).values())

    def _batch(self, t: HostedTable, p: dict):
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
        for c, n in zip(chunks, lengths):
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
        batch = EpisodeBatch(
            chunks,
            lengths,
            np.asarray(p["episode_ids"], dtype=np.int64),
            np.asarray(p["stamps"], dtype=np.int64),
            pr,
        )
        return s.shard_id, batch

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
        t = self.table(name)
        with t.lock:
            if txn in t.applied:
                return t.applied[txn]
            _refuse_aborted(t, txn)
            try:
                batches = t.staged.pop(txn)
            except KeyError:
                raise SpecError(f"insert {txn!r} of table {name!r} is not staged on this worker") from None
            t.applying.add(txn)  # (status: being written, neither staged nor applied)
        res = {"first_keys": {}, "evicted": {}, "items": {}}
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
            with t.lock:
                remember(t.applied, txn, res)
        finally:
            with t.lock:
                t.applying.discard(txn)
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
        t = self.table(name)
        with t.lock:
            if txn in t.applied:  # sent again (its reply was lost): written once, the same answer
                return t.applied[txn]
        self.stage(name, txn, parts)  # (refuses an aborted txn)
        return self.apply(name, txn)

    def abort(self, name: str, txn: str) -> bool:
        """Forget a staged insert, or undo a pending sample; a stage, write or apply of ``txn`` that comes
        later (sent before, delivered after) is refused.  An insert applied already stays applied.

        Parameters
        ----------
        name : str
            The table's name (an unknown one: nothing to do).
        txn : str
            The insert's or sample's transaction id.

        Returns
        -------
        bool
            True if there was something to undo.
        """
        t = self.tables.get(name)
        if t is None:
            return False
        with t.lock:
            staged = t.staged.pop(txn, None) is not None
            if txn not in t.applied and txn not in t.applying:
                remember(t.aborted, txn, True)
        return staged or bool(self.finish_sample(name, txn, commit=False))

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
        if t is None:
            return {"state": "unknown"}
        with t.lock:
            if txn in t.applied:
                return {"state": "applied", "result": t.applied[txn]}
            for state, where in (("staged", t.staged), ("applying", t.applying), ("aborted", t.aborted)):
                if txn in where:
                    return {"state": state}
            return {"state": "unknown"}
