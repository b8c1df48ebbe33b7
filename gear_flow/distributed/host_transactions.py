"""The worker's transaction memory: what became of each insert and two-phase sample on one hosted table.

An insert is staged (kept, nothing visible), applying (being written),
applied (its result remembered) or aborted (a tombstone: a stage, write or
apply of it that arrives later, sent before the abort, is refused).  A
two-phase sample's gathered parts are pending until its finish has applied
them, whose outcome is then remembered; a delete of an item they hold waits
for that (:meth:`TransactionMemory.holds`).  The coordinator's recovery and a
request sent again after its reply was lost both ask this memory, which is
why outcomes are kept for the last :data:`REMEMBER` transactions and why a
resent request is answered as the first one.  Every field changes only through :class:`TransactionMemory`'s
methods, under its one lock.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import SpecError

if TYPE_CHECKING:
    from ..shard import Shard

#: transactions whose outcome a worker remembers (for the coordinator's recovery, and a request sent again)
REMEMBER = 4096
#: ... and the bytes of the arrays those outcomes hold at most (an insert of many episodes remembers each
#: one's first key): past either bound the oldest is forgotten, the newest always kept
REMEMBER_BYTES = 64 << 20


class SampleHolds(Exception):
    """A delete met an item that a sample gathered here and has not finished holds: nothing was deleted.

    Never leaves the worker: its operation is asked again once the sample
    finished (:meth:`~gear_flow.distributed.plugin.GearFlowWorker.run`).
    """


class Memo:
    """Transactions' outcomes in the order they ended, bounded by :data:`REMEMBER` of them and
    :data:`REMEMBER_BYTES` of the arrays they hold (the newest always kept); its owner's lock guards it.

    Examples
    --------
    >>> m = Memo()
    >>> m.put("t1", {"first_keys": {0: np.arange(4)}})
    >>> "t1" in m, m.get("t2"), m.nbytes
    (True, None, 32)
    """

    def __init__(self) -> None:
        self._outcomes: OrderedDict[str, object] = OrderedDict()
        self._sizes: dict[str, int] = {}
        #: bytes of the arrays the outcomes kept hold
        self.nbytes = 0

    def __contains__(self, txn: object) -> bool:
        return txn in self._outcomes

    def __len__(self) -> int:
        return len(self._outcomes)

    def __getitem__(self, txn: str) -> object:
        return self._outcomes[txn]

    def get(self, txn: str, default: object = None) -> object:
        """``txn``'s outcome, or ``default`` when it is not (or no longer) remembered.

        Parameters
        ----------
        txn : str
            The transaction.
        default : object, optional
            What to answer for one not remembered.

        Returns
        -------
        object
            The outcome, or ``default``.
        """
        return self._outcomes.get(txn, default)

    def put(self, txn: str, outcome: object) -> None:
        """Keep ``txn``'s outcome, forgetting the oldest ones past either bound.

        Parameters
        ----------
        txn : str
            The transaction.
        outcome : object
            What a request sent again for it is answered with.
        """
        if txn in self._outcomes:
            del self._outcomes[txn]
            self.nbytes -= self._sizes.pop(txn)
        self._outcomes[txn] = outcome
        self._sizes[txn] = n = _array_bytes(outcome)
        self.nbytes += n
        while len(self._outcomes) > 1 and (len(self._outcomes) > REMEMBER or self.nbytes > REMEMBER_BYTES):
            old, _ = self._outcomes.popitem(last=False)
            self.nbytes -= self._sizes.pop(old)


def _array_bytes(x: object) -> int:
    """Bytes of the NumPy arrays in ``x`` (dicts, lists and tuples of them, at any depth)."""
    if isinstance(x, np.ndarray):
        return int(x.nbytes)
    if isinstance(x, dict):
        return sum(_array_bytes(v) for v in x.values())
    if isinstance(x, (list, tuple)):
        return sum(_array_bytes(v) for v in x)
    return 0


def _items(batches: list, step: bool) -> dict[int, int]:
    """Items per shard of staged ``(shard, EpisodeBatch)`` pairs."""
    out: dict[int, int] = {}
    for sid, b in batches:
        out[sid] = out.get(sid, 0) + (int(b.lengths.sum()) if step else len(b.lengths))
    return out


class TransactionMemory:
    """Staged, applying, applied and aborted inserts and pending and finished samples of one hosted table.

    Parameters
    ----------
    table : str
        The table's name (for messages).
    step : bool
        Items are steps (else episodes): how a staged insert's items are
        counted.

    Examples
    --------
    >>> memory = TransactionMemory("t", step=False)
    >>> memory.forget("never-staged")
    False
    >>> memory.status("never-staged")
    {'state': 'aborted'}
    """

    def __init__(self, table: str, step: bool) -> None:
        self.table = table
        self.step = step
        self._lock = threading.Lock()
        #: an apply's end (a request sent again while its first was applied waits for it: :meth:`_wait_applied`)
        self._applied_now = threading.Condition(self._lock)
        self._staged: dict[str, list] = {}  # insert txn -> [(shard, EpisodeBatch)]
        self._applied = Memo()  # insert txn -> its apply's result
        self._applying: set[str] = set()
        self._aborted = Memo()  # tombstones
        self._pending: dict[str, list] = {}  # sample txn -> [(shard, slots, seqs, drawn)]
        self._finishing: dict[str, list] = {}  # taken by a finish not yet applied: still held from deletes
        self._finished = Memo()  # sample txn -> (committed, result)

    @property
    def staged(self) -> Mapping[str, list]:
        """A read-only view of the staged inserts: ``{txn: [(shard, EpisodeBatch), ...]}``."""
        return MappingProxyType(self._staged)

    def _refuse_aborted(self, txn: str) -> None:
        """Raise if insert ``txn`` was aborted here (the lock is held)."""
        if txn in self._aborted:
            raise SpecError(f"insert {txn!r} of table {self.table!r} was aborted on this worker")

    # -- inserts -----------------------------------------------------------------------------
    def stage(self, txn: str, batches: list) -> int:
        """Keep the validated ``batches`` of insert ``txn`` until it is applied or aborted.

        Parameters
        ----------
        txn : str
            The insert's transaction id.
        batches : list
            ``[(shard, EpisodeBatch), ...]``.

        Returns
        -------
        int
            Items staged (the same parts staged again are staged once).

        Raises
        ------
        SpecError
            ``txn`` was staged before with other parts, applied, or aborted.
        """
        items = _items(batches, self.step)
        with self._lock:
            self._wait_applied(txn)
            prior = self._staged.get(txn)
            if prior is not None and _items(prior, self.step) == items:
                return sum(items.values())  # sent again (its reply was lost): staged once
            if prior is not None or txn in self._applied:
                raise SpecError(f"insert {txn!r} of table {self.table!r} was already staged on this worker")
            self._refuse_aborted(txn)
            self._staged[txn] = batches
        return sum(items.values())

    def applied(self, txn: str) -> dict | None:
        """The result insert ``txn`` was applied with here, if it was.

        Parameters
        ----------
        txn : str
            The insert's transaction id.

        Returns
        -------
        dict or None
            As :meth:`~gear_flow.distributed.host_writes.HostWriter.apply`
            returned it, or None.
        """
        with self._lock:
            return self._applied.get(txn)

    def begin_apply(self, txn: str) -> tuple[dict | None, list | None]:
        """Take insert ``txn``'s staged batches to write them (it is *applying* until :meth:`end_apply`).

        Parameters
        ----------
        txn : str
            The insert's transaction id.

        Returns
        -------
        tuple of (dict or None, list or None)
            ``(result, None)`` when ``txn`` was applied already, otherwise
            ``(None, batches)``.

        Raises
        ------
        SpecError
            ``txn`` is neither staged nor applied here, or was aborted.
        """
        with self._lock:
            self._wait_applied(txn)
            if txn in self._applied:
                return self._applied[txn], None
            self._refuse_aborted(txn)
            try:
                batches = self._staged.pop(txn)
            except KeyError:
                raise SpecError(f"insert {txn!r} of table {self.table!r} is not staged on this worker") from None
            self._applying.add(txn)  # (status: being written, neither staged nor applied)
            return None, batches

    def end_apply(self, txn: str, result: dict | None) -> None:
        """Insert ``txn`` is no longer being written: applied with ``result``, or failed (None).

        Parameters
        ----------
        txn : str
            The insert's transaction id.
        result : dict or None
            What its apply returned; None when it raised.
        """
        with self._lock:
            if result is not None:
                self._applied.put(txn, result)
            self._applying.discard(txn)
            self._applied_now.notify_all()

    def _wait_applied(self, txn: str) -> None:
        """Wait (the lock held, released meanwhile) while insert ``txn`` is being applied: a stage, write or apply
        of it sent again (its reply lost, or its caller interrupted) while the first one writes then answers as
        the first one does, where it staged the episodes again and wrote them twice, or was refused as not
        staged while they were written."""
        while txn in self._applying:
            self._applied_now.wait()

    def forget(self, txn: str) -> bool:
        """Forget staged insert ``txn`` and leave a tombstone unless it was applied or is being applied.

        Parameters
        ----------
        txn : str
            The transaction id.

        Returns
        -------
        bool
            Whether it was staged.
        """
        with self._lock:
            staged = self._staged.pop(txn, None) is not None
            if txn not in self._applied and txn not in self._applying:
                self._aborted.put(txn, True)
        return staged

    def status(self, txn: str) -> dict:
        """What became of insert ``txn`` here.

        Parameters
        ----------
        txn : str
            The insert's transaction id.

        Returns
        -------
        dict
            ``{"state": "staged" | "applying" | "applied" | "aborted" |
            "unknown"}``, with ``result`` when applied.
        """
        with self._lock:
            if txn in self._applied:
                return {"state": "applied", "result": self._applied[txn]}
            for state, where in (("staged", self._staged), ("applying", self._applying), ("aborted", self._aborted)):
                if txn in where:
                    return {"state": state}
            return {"state": "unknown"}

    # -- two-phase samples -------------------------------------------------------------------
    def add_pending(self, txn: str, parts: Iterable[tuple]) -> None:
        """Keep gathered parts of sample ``txn`` until its finish.

        Parameters
        ----------
        txn : str
            The sample's transaction id.
        parts : iterable of tuple
            ``(shard, slots, seqs, drawn)`` per part; ``drawn``: a draw's (its
            epoch bookkeeping is undone on abort), not a take's.  ``shard`` is
            the shard's id, or the copy itself once :meth:`retire` replaced it.
        """
        with self._lock:
            self._pending.setdefault(txn, []).extend(parts)

    def retire(self, shards: Mapping[int, Shard]) -> None:
        """Shards about to be replaced here (a restore): pending parts drawn from them keep the replaced copy.

        Their finish commits or undoes them on that copy (no longer hosted), so it reports what they handed
        out of it and leaves the new copy as restored.

        Parameters
        ----------
        shards : mapping of int to Shard
            The copies being replaced, by shard id.
        """
        with self._lock:
            for parts in self._pending.values():
                parts[:] = [(shards[p[0]], *p[1:]) if p[0] in shards else p for p in parts]

    def take_pending(self, txn: str, commit: bool) -> tuple[list | None, dict]:
        """Take sample ``txn``'s pending parts to finish them.

        Parameters
        ----------
        txn : str
            The sample's transaction id.
        commit : bool
            The finish asked for.

        Returns
        -------
        tuple of (list or None, dict)
            ``(parts, {})``; or ``(None, result)`` when nothing is pending:
            the first finish's result if ``txn`` was finished the same way,
            else empty.
        """
        with self._lock:
            parts = self._pending.pop(txn, None)
            if parts is not None:
                self._finishing[txn] = parts
                return parts, {}
            done = self._finished.get(txn)
            return None, dict(done[1]) if done is not None and done[0] == bool(commit) else {}

    def finished(self, txn: str, commit: bool, result: dict | None) -> None:
        """Remember how sample ``txn`` finished (a finish sent again answers with it); its parts are no longer
        held.

        Parameters
        ----------
        txn : str
            The sample's transaction id.
        commit : bool
            Whether it was committed.
        result : dict or None
            The finish's result; None when it raised (nothing is remembered).
        """
        with self._lock:
            self._finishing.pop(txn, None)
            if result is not None:
                self._finished.put(txn, (bool(commit), dict(result)))

    def pending_slots(self, txn: str) -> dict[int, np.ndarray]:
        """The slots sample ``txn``'s pending parts drew, per shard (repeats as drawn; a replaced copy's left out).

        Parameters
        ----------
        txn : str
            The sample's transaction id.

        Returns
        -------
        dict of int to numpy.ndarray
            ``{shard: int64 slots}``; empty when nothing is pending.
        """
        with self._lock:
            parts = [p for p in self._pending.get(txn, ()) if isinstance(p[0], int)]
        out: dict[int, list] = {}
        for i, slots, _, _ in parts:
            out.setdefault(i, []).append(np.asarray(slots, dtype=np.int64))
        return {i: np.concatenate(a) for i, a in out.items()}

    def holds(self, shard: int, seqs: np.ndarray) -> bool:
        """Whether a sample gathered but not yet finished here holds one of ``seqs``' items of ``shard``.

        A delete of such an item waits for the finish: the sample may hand it
        out (and expire it), and the delete must then find it gone, as it
        would after the sample on a LocalTable.  The caller holds the shard's
        lock, under which a part is gathered and made pending.

        Parameters
        ----------
        shard : int
            The shard's id.
        seqs : numpy.ndarray
            int64 item sequence numbers.

        Returns
        -------
        bool
            Whether one is held.
        """
        with self._lock:
            held = [
                p[2] for where in (self._pending, self._finishing) for parts in where.values() for p in parts
                if p[0] == shard
            ]  # fmt: skip
        return bool(held) and bool(np.isin(seqs, np.concatenate(held)).any())

    # -- what a move waits for ---------------------------------------------------------------
    def joins(self, txn: Any) -> bool:
        """Whether a request naming ``txn`` goes on with a transaction begun here (staged or pending).

        Parameters
        ----------
        txn : object
            The transaction the request names (not a str: none).

        Returns
        -------
        bool
            Whether ``txn`` is staged or pending here.
        """
        if not isinstance(txn, str):
            return False
        with self._lock:
            return txn in self._staged or txn in self._pending

    def touches(self, shards: set[int]) -> bool:
        """Whether a staged insert, an insert being applied or a pending sample touches ``shards``.

        Parameters
        ----------
        shards : set of int
            Shard ids.

        Returns
        -------
        bool
            Whether one does (any insert being applied counts).
        """
        with self._lock:
            if self._applying:
                return True
            if any(s in shards for parts in self._staged.values() for s, _ in parts):
                return True
            return any(p[0] in shards for w in (self._pending, self._finishing) for parts in w.values() for p in parts)
