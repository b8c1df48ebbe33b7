"""Admission and transactions of one distributed table: the coordinator's state, without Dask.

A :class:`TableGate` lives on the scheduler (one per table) and is driven by
:class:`~gear_flow.distributed.coordinator.GearFlowCoordinator` on the
scheduler's event loop; it does no I/O, so it is tested on its own.  What
a request may ask at all is checked first, by
:mod:`~gear_flow.distributed.gate_checks`.

* **Inserts** are transactions.  Admission (Reverb semantics: the limiter
  counts an insert when it is admitted) issues episode ids, stamps and a
  transaction id; the client stages the episodes on the shard workers, applies
  them, then *commits* here; a failure anywhere *aborts*, which gives back the
  limiter's count, so an insert leaves no trace.
* **Sizes**: ``size`` counts committed items (what samples may find);
  ``admitted`` adds the inserts in flight (what the limiter's size bound sees).
* **Horizon**: the stamp of the oldest insert still in flight.  Ordered samples
  (Fifo, Lifo, heaps) see only items stamped before it, so a Queue never hands
  out an item while an older one is still being written; ``visible`` counts
  those items for their admission, and a Queue's (or Stack's) sample of ``n``
  waits until ``n`` are visible (its limiter counts the inserts in flight).
* **Waiters** are served first come, first served, per kind (inserts; samples),
  as Reverb serves blocked calls.
* **Arrivals** count the events that can bring a sample items it did not
  have (commits, aborts that move the horizon, restores).  A batch whose items
  left could not fill it (``max_times_sampled``) gives its grant back and asks
  again with the count it was granted at (``after``): it is granted once
  something arrived since, as Reverb's sample waits for inserts.
* **Exclusive samples** (tables whose samples change the table: expiry,
  epochs) run one at a time: the grant holds the table until the sampler
  reports it finished (with the items it expired).  Evictions of such a table
  take the same hold, so an item a sample is about to hand out and expire is
  never also counted as excess (a Queue never evicts what it delivers).
* **Evictions** run one at a time on every table, each granted the size of
  the moment: concurrent inserts that each took the table past ``max_size``
  evict its excess once, not once each.  On a table whose samples change
  nothing, the hold queues apart from the samples and delays none of them.
* **Owners**: every request names its owner (a client id, or a worker address
  for handles in tasks).  When an owner goes away its waiters are dropped, its
  exclusive hold is released and its unfinished inserts are recovered.
* **Tickets**: a request may carry a ticket its caller chose.  A caller whose
  call was cancelled or interrupted before the answer reached it withdraws the
  ticket: a request still waiting leaves its line, and one granted meanwhile is
  given back (an insert aborted; a sample's count given back, its hold
  released), where the grant would go to nobody and a Queue's item would stay
  counted for good.  A withdraw that overtakes its request is remembered, and
  the request refused when it comes.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ..errors import ShardLostError, TableClosedError
from ..rate_limiters import MinSize, Queue
from ..table.config import TableConfig

#: granted tickets (and tickets withdrawn before their request came), and committed inserts, a table remembers,
#: the latest: a withdraw (or a commit sent again) follows its request within a round trip, while this many other
#: admissions are rare
TICKETS_KEPT = 1024


class OwnerGone(Exception):
    """Internal: the request's owner disconnected while it waited."""


class Withdrawn(Exception):
    """Internal: the request's caller withdrew it (its call was cancelled or interrupted)."""


@dataclass
class Txn:
    """An insert admitted and not yet committed or aborted (or committed but above the horizon).

    Attributes
    ----------
    txn : str
        Transaction id (32 hex digits), what the client commits or aborts.
    owner : str
        Client id or worker address that made the insert.
    n : int
        Items admitted.
    first_stamp : int
        Stamp of its first item (items are stamped consecutively).
    per_shard : dict of int to int
        Items routed to each shard.
    committed : bool
        Stored and counted in ``size``; kept until every older insert is
        settled, so the horizon stays below it.
    """

    txn: str
    owner: str
    n: int
    first_stamp: int
    per_shard: dict  # shard -> items routed there
    committed: bool = False


@dataclass
class Waiter:
    """A request waiting for the limiter (or for the table's exclusive hold).

    Attributes
    ----------
    kind : {"insert", "sample", "hold"}
        What it asks for; ``hold`` is an eviction of an exclusive table.
    n : int
        Items to insert or to sample (0 for a hold).
    owner : str
        Client id or worker address that asked.
    fut : asyncio.Future
        Resolved with the grant (a dict), or failed with
        :class:`TableClosedError` or :class:`OwnerGone`.
    extra : dict
        Kind-specific arguments: ``episodes`` and ``per_shard`` of an insert;
        ``exclusive``, ``done`` (leased samples to count), ``lease`` and
        ``after`` (granted only once :attr:`TableGate.arrivals` exceeds it) of a
        sample.
    ticket : str or None
        What its caller withdraws it by (:meth:`TableGate.withdraw_ticket`).
    """

    kind: str  # "insert" | "sample"
    n: int
    owner: str
    fut: asyncio.Future
    extra: dict = field(default_factory=dict)
    ticket: str | None = None


class TableGate:
    """Global state of one table; see the module docstring.

    Parameters
    ----------
    name : str
        The table's name.
    config : dict
        Its configuration, as :meth:`TableConfig.to_dict` writes it (validated
        here).
    placement : dict
        ``{shard: worker address}`` (keys may be strings, as JSON has them).

    Attributes
    ----------
    size : int
        Committed items (what samples may find).
    shard_size : dict of int to int
        Committed items per shard (0 for a lost shard).
    shard_inserted : dict of int to int
        Items ever inserted per shard.
    lost : dict of int to dict
        Lost shards: ``size_at_loss``, ``inserted_at_loss``, ``detail``.
    version : int
        Bumped whenever placement or lost shards change; handles refresh
        when it differs from theirs.
    limiter : RateLimiter
        The table's global limiter (a fresh copy of the configured one).

    Raises
    ------
    SpecError
        An invalid ``config``.

    Examples
    --------
    >>> import asyncio
    >>> from gear_flow import ColumnSpec, TableSpec
    >>> from gear_flow.table.config import TableConfig
    >>> cfg = TableConfig.build(TableSpec((ColumnSpec("x", ()),), capacity=8)).to_dict()
    >>> async def one_insert():
    ...     g = TableGate("t", cfg, {0: "tcp://w:1"})
    ...     grant = await g.request("insert", 3, "client-1", episodes=1, per_shard={0: 3}).fut
    ...     g.commit_insert(grant["txn"], {0: 3}, {})
    ...     return g.size
    >>> asyncio.run(one_insert())
    3
    """

    def __init__(self, name: str, config: dict, placement: dict) -> None:
        self.name = name
        self.config = config
        cfg = TableConfig.from_dict(config)
        self.spec = cfg.spec
        self.ordered = cfg.selection == "ordered"
        self.exclusive = cfg.exclusive
        self.lossless = cfg.lossless  # a Queue or Stack: every item is to be handed out
        self.limiter = cfg.fresh_limiter()
        self.placement = {int(k): v for k, v in placement.items()}
        self.size = 0
        self.shard_size = {s: 0 for s in self.placement}
        #: items ever inserted per shard (what a lost shard had received since a checkpoint)
        self.shard_inserted = {s: 0 for s in self.placement}
        self.next_episode_id = 0
        self.next_stamp = 0
        self.lost: dict[int, dict] = {}
        #: (shard, incarnation) -> items of that incarnation a queue's limiter forgot unsampled when it was lost
        #: or replaced: a sample granted before then may still hand some out (kept until it finishes)
        self.unsampled_gone: dict[tuple[int, int], int] = {}
        self.version = 0  # bumped when placement or lost shards change
        #: per shard, how often it was rebuilt (lost, or restored from a checkpoint; a move keeps it whole)
        self.incarnation = {s: 0 for s in self.placement}
        self.closed = False
        #: this creation of the table: a name dropped and used again names another, which an old handle's
        #: close must not touch
        self.created = uuid.uuid4().hex
        self.txns: dict[str, Txn] = {}  # in admission order
        self.inserts: deque[Waiter] = deque()
        self.samples: deque[Waiter] = deque()
        #: evictions waiting, on a table whose samples do not take the hold (else they queue with the samples)
        self.holds: deque[Waiter] = deque()
        self.holder: dict | None = None  # the exclusive sample or the eviction in progress
        #: commits, aborts and restores so far: a sample short of items waits for the next
        self.arrivals = 0
        #: committed inserts whose part on a worker that did not answer its apply is not known yet:
        #: txn -> {shard: items routed there}
        self.unsettled: dict[str, dict[int, int]] = {}
        #: ticket -> (kind, n, txn) of the latest grants made to requests with a ticket (what a withdraw gives
        #: back), and the tickets withdrawn before their request came (refused when it does)
        self.granted: OrderedDict[str, tuple[str, int, str]] = OrderedDict()
        self.withdrawn: OrderedDict[str, None] = OrderedDict()
        #: the latest inserts committed and gone from ``txns``: a commit of one sent again (its reply lost, or
        #: its caller interrupted and the commit finished from the event loop) is ignored, as one still there is
        self.committed: OrderedDict[str, None] = OrderedDict()

    # -- derived sizes ----------------------------------------------------------------------------
    @property
    def admitted(self) -> int:
        """Committed items plus those of inserts in flight (what the limiter's size bound sees)."""
        return self.size + sum(t.n for t in self.txns.values() if not t.committed)

    @property
    def horizon(self) -> int:
        """Stamp of the oldest insert in flight (the next stamp when none): ordered samples see items below it."""
        for t in self.txns.values():
            if not t.committed:
                return t.first_stamp
        return self.next_stamp

    @property
    def visible(self) -> int:
        """Committed items below the horizon (what an ordered sample may take)."""
        return max(0, self.size - sum(t.n for t in self.txns.values() if t.committed))

    # -- admission ----------------------------------------------------------------------------------
    def request(self, kind: str, n: int, owner: str, ticket: str | None = None, **extra: Any) -> Waiter:
        """Queue a request and serve what can be served; its future resolves with the grant.

        Parameters
        ----------
        kind : {"insert", "sample", "hold"}
            What is asked for (the hold of an eviction queues with the samples
            of a table whose samples are exclusive, else on its own).
        n : int
            Items to insert or sample.
        owner : str
            Client id or worker address asking.
        ticket : str, optional
            What the caller may withdraw it by (:meth:`withdraw_ticket`); one
            withdrawn already fails with :class:`Withdrawn`, nothing queued.
        **extra
            Kept in :attr:`Waiter.extra`: ``episodes``, ``per_shard`` of an
            insert; ``exclusive``, ``done``, ``lease``, ``after`` of a sample.

        Returns
        -------
        Waiter
            Its ``fut`` resolves with the grant: for an insert ``txn``,
            ``first_episode_id``, ``first_stamp``, ``version``; for a sample
            ``txn``, ``horizon`` (ordered tables, else None), ``version``,
            ``lease`` (batches the client may serve without asking; MinSize
            limiters only), ``arrivals`` (what ``after`` names), ``size``
            (the items counted, the batch's ``table_size``); for a hold
            ``txn`` and ``size``.

        Raises
        ------
        TableClosedError
            The table is closed.
        ShardLostError
            An insert or a sample of a table that is not degraded and has
            lost shards.
        """
        if self.closed:
            raise TableClosedError(f"table {self.name!r} is closed")
        if self.lost and kind in ("insert", "sample") and not self.config.get("degraded"):
            # as mark_lost refuses those already waiting: a handle that has not heard of the loss yet must
            # not wait out its timeout (the admission's hour) for a limiter the lost items no longer satisfy
            raise ShardLostError(
                min(self.lost),
                f"table {self.name!r} lost shard(s) {sorted(self.lost)}",
                stored=False if kind == "insert" else None,
            )
        w = Waiter(kind, int(n), owner, asyncio.get_running_loop().create_future(), extra, ticket)
        if ticket is not None and ticket in self.withdrawn:  # its withdraw came first
            del self.withdrawn[ticket]
            w.fut.set_exception(Withdrawn())
            self._count_unreported(w)
            return w
        self._queue(kind).append(w)
        self.pump()
        return w

    def _queue(self, kind: str) -> deque:
        if kind == "insert":
            return self.inserts
        return self.holds if kind == "hold" and not self.exclusive else self.samples

    @property
    def _queues(self) -> tuple[deque, deque, deque]:
        return (self.inserts, self.samples, self.holds)

    def withdraw(self, w: Waiter) -> None:
        """A waiter gave up (timeout); later waiters may now be served.

        Parameters
        ----------
        w : Waiter
            The waiter, granted or not (a grant is left as it is).
        """
        for q in self._queues:
            if w in q:
                q.remove(w)
        if not w.fut.done():
            w.fut.cancel()
        self.pump()

    def withdraw_ticket(self, ticket: str) -> str:
        """The caller of the request with ``ticket`` gave it up before its answer reached it: a request still
        waiting leaves its line (failed with :class:`Withdrawn`), one granted is given back (an insert aborted,
        a sample's count given back and its hold released, a hold released).

        A sample's ``done`` (samples its caller served under a lease, reported with it) is counted either way:
        they were handed out, and its caller does not report them again.

        Parameters
        ----------
        ticket : str
            The request's ticket.

        Returns
        -------
        str
            ``"waiting"`` (taken out of its line), ``"granted"`` (its grant given
            back) or ``"unknown"`` (not come yet, or answered otherwise: a
            request with it that comes later is refused).
        """
        for w in self._refuse(lambda w: w.ticket == ticket, lambda w: Withdrawn()):
            self._count_unreported(w)
            self.pump()
            return "waiting"
        got = self.granted.pop(ticket, None)
        if got is None:
            _keep(self.withdrawn, ticket, None)
            return "unknown"
        kind, n, txn = got
        if kind == "insert":
            self.abort_insert(txn)  # nothing was sent: its caller never had the txn
        else:  # the sample's count given back (the limiter's state as if never granted); a hold released
            self.sample_finished(txn, n if kind == "sample" else 0)
        return "granted"

    def _count_unreported(self, w: Waiter) -> None:
        done = int(w.extra.get("done", 0)) if w.kind == "sample" else 0
        if done:
            self.limiter.on_sample(done)

    def _can(self, w: Waiter) -> bool:
        if w.kind == "insert":
            return self.limiter.can_insert(w.n, self.admitted)
        if w.kind == "hold":
            return self.holder is None
        if w.extra.get("exclusive") and self.holder is not None:
            return False
        if w.extra.get("after") is not None and self.arrivals <= w.extra["after"]:
            return False  # its items left could not fill it when it last tried: nothing new since
        size = self.visible if self.ordered else self.size
        if isinstance(self.limiter, Queue) and size < w.n:
            # each item goes out once: the batch waits for n items it can see (the limiter's count has the
            # inserts still in flight too), or the draw would make it up by handing one out twice
            return False
        return self.limiter.can_sample(w.n, size)

    def pump(self) -> None:
        """Grant waiters first come, first served, per kind, while the limiter allows."""
        if self.closed:
            for q in self._queues:
                while q:
                    w = q.popleft()
                    if not w.fut.done():
                        w.fut.set_exception(TableClosedError(f"table {self.name!r} is closed"))
            return
        progress = True
        while progress:
            progress = False
            for q in self._queues:
                while q and (q[0].fut.done() or self._can(q[0])):
                    w = q.popleft()
                    if w.fut.done():
                        continue
                    grant = self._grant(w)
                    if w.ticket is not None:
                        _keep(self.granted, w.ticket, (w.kind, w.n, grant["txn"]))
                    w.fut.set_result(grant)
                    progress = True

    def _grant(self, w: Waiter) -> dict:
        if w.kind == "insert":
            return self._grant_insert(w)
        if w.kind == "hold":  # an eviction: one at a time (and, exclusive tables, with their samples)
            txn = uuid.uuid4().hex
            self.holder = {"txn": txn, "owner": w.owner, "n": 0}
            return {"txn": txn, "size": self.size}
        return self._grant_sample(w)

    def _grant_insert(self, w: Waiter) -> dict:
        self.limiter.on_insert(w.n)
        txn = uuid.uuid4().hex
        first_id, first_stamp = self.next_episode_id, self.next_stamp
        self.next_episode_id += int(w.extra.get("episodes", 0))
        self.next_stamp += w.n
        per = {int(s): int(k) for s, k in (w.extra.get("per_shard") or {}).items()}
        self.txns[txn] = Txn(txn, w.owner, w.n, first_stamp, per)
        return {"txn": txn, "first_episode_id": first_id, "first_stamp": first_stamp, "version": self.version}

    def _grant_sample(self, w: Waiter) -> dict:
        done = int(w.extra.get("done", 0))
        self.limiter.on_sample(w.n + done)
        txn = uuid.uuid4().hex
        if w.extra.get("exclusive"):
            # the incarnations it was granted on: what it hands out of a shard lost (or replaced) since is
            # of the incarnation it drew from, however often the shard was rebuilt meanwhile
            self.holder = {"txn": txn, "owner": w.owner, "n": w.n, "incarnation": dict(self.incarnation)}
        lease = int(w.extra.get("lease", 0))
        return {
            "txn": txn,
            "horizon": self.horizon if self.ordered else None,
            "version": self.version,
            "lease": lease if isinstance(self.limiter, MinSize) and lease > 0 else 0,
            "arrivals": self.arrivals,
            "size": self.size,  # (the batch's table_size)
        }

    # -- insert transactions -----------------------------------------------------------------------------
    def commit_insert(self, txn: str, items: dict, evicted: dict, unsettled: tuple[str, ...] = ()) -> bool:
        """The insert is stored: count it and serve waiters (a second commit is ignored).

        Items routed to a shard but not written (lost before the apply) are
        given back to the limiter.  The parts on ``unsettled`` workers (they
        did not answer their apply in time) are counted later, if they were
        written there, by :meth:`settle_late`.

        Parameters
        ----------
        txn : str
            Transaction id of the insert.
        items : dict
            ``{shard: items written}``.
        evicted : dict
            ``{shard: items overwritten by it}`` (the ring's eviction).
        unsettled : tuple of str, default ()
            Workers whose part's outcome is not known yet.

        Returns
        -------
        bool
            True when committed now; False for an insert unknown or committed
            already (nothing changes).
        """
        t = self.txns.get(txn)
        if t is None or t.committed:
            return False
        t.committed = True
        self._count_written(items, evicted)
        # items routed to a shard but never written (lost before the apply): the limiter forgets them
        unwritten = t.n - sum(int(k) for k in items.values())
        if unwritten > 0:
            self.limiter.give_back_insert(unwritten)
        written = {int(x) for x in items}
        shards = {
            int(s): k
            for s, k in (t.per_shard or {}).items()
            if self.placement.get(int(s)) in unsettled and int(s) not in written
        }
        if shards:
            self.unsettled[txn] = shards
            while len(self.unsettled) > 4096:  # (a worker that never answers: its oldest are forgotten)
                self.unsettled.pop(next(iter(self.unsettled)))
        self._trim()
        self.arrived()
        return True

    def _count_written(self, items: dict, evicted: dict) -> None:
        """Count ``items`` written (and ``evicted`` by them) per shard in the sizes and the limiter's deletes."""
        for s, k in items.items():
            s = int(s)
            self.shard_inserted[s] = self.shard_inserted.get(s, 0) + int(k)
            if s not in self.lost:
                self.shard_size[s] = self.shard_size.get(s, 0) + int(k) - int(evicted.get(s, 0))
        gone = sum(int(k) for k in evicted.values())
        lost_items = sum(int(k) for s, k in items.items() if int(s) in self.lost)
        self.size += sum(int(k) for k in items.values()) - gone - lost_items
        self.forget_waiting(lost_items)  # written to a shard lost before the commit: never to be sampled
        if gone:
            self.limiter.on_delete(gone)

    def settle_late(self, txn: str, shards: Iterable[int], items: dict, evicted: dict) -> None:
        """The unsettled part of committed insert ``txn`` on ``shards`` is known now: ``items`` were
        written (counted now, as the commit would have; their admission back in the limiter), or none (it
        was aborted).  Each part is settled once; items beyond what was routed to a shard are not counted.

        Parameters
        ----------
        txn : str
            Transaction id of the insert (one of :attr:`unsettled`).
        shards : iterable of int
            The shards whose part is settled (those of one worker).
        items : dict
            ``{shard: items written}`` (empty: aborted, nothing written).
        evicted : dict
            ``{shard: items overwritten by them}``.
        """
        left = self.unsettled.get(txn)
        if left is None:
            return
        mine = {int(s) for s in shards} & set(left)
        written = {int(s): min(int(k), left[int(s)]) for s, k in items.items() if int(s) in mine}
        for s in mine:
            del left[s]
        if not left:
            del self.unsettled[txn]
        self.limiter.on_insert(sum(written.values()))  # its admission, given back at the commit
        self._count_written(written, {int(s): int(k) for s, k in evicted.items() if int(s) in written})
        self.arrived()

    def abort_insert(self, txn: str) -> bool:
        """Nothing of the insert was stored: give back its admission.

        Parameters
        ----------
        txn : str
            Transaction id of the insert.

        Returns
        -------
        bool
            True when it was in flight and is now aborted; False when unknown
            or already committed.
        """
        t = self.txns.pop(txn, None)
        if t is None or t.committed:
            return False
        self.limiter.give_back_insert(t.n)
        self._trim()
        self.arrived()  # the horizon may have moved: ordered samples may see more
        return True

    def arrived(self) -> None:
        """Items may have arrived (a commit, an abort that moves the horizon, a restore): serve waiters,
        samples that found too few items included."""
        self.arrivals += 1
        self.pump()

    def _trim(self) -> None:
        while self.txns:
            first = next(iter(self.txns.values()))
            if not first.committed:
                break
            del self.txns[first.txn]
            _keep(self.committed, first.txn, None)

    # -- samples -----------------------------------------------------------------------------------------------
    def sample_finished(self, txn: str, rollback: int = 0) -> None:
        """A granted sample is over: release the table's hold if it had it.

        Parameters
        ----------
        txn : str
            Transaction id of the grant.
        rollback : int, default 0
            Samples not handed out after all (a failed sample): the limiter
            forgets them.
        """
        if self.holder is not None and self.holder["txn"] == txn:
            self.holder = None
            self.unsampled_gone.clear()  # samples are exclusive: none granted before a loss is left
        if rollback:
            self.limiter.give_back_sample(int(rollback))
        self.pump()

    def count_samples(self, n: int) -> None:
        """Count ``n`` samples served under a lease, then serve waiters.

        Parameters
        ----------
        n : int
            Items sampled.
        """
        self.limiter.on_sample(int(n))
        self.pump()

    def removed(self, k: int, per_shard: dict, unsampled: bool = False) -> None:
        """Items left the table (deletes, expiry, the remover).

        Parameters
        ----------
        k : int
            Items removed in all (the limiter's count).
        per_shard : dict
            ``{shard: items removed}``; a lost shard's left it before the loss: its loss record
            (``size_at_loss``) no longer counts them.
        unsampled : bool, default False
            They left unsampled (deletes, evictions, a failed sample's
            expiries): a queue's limiter no longer counts them as waiting.
        """
        live = {int(s): int(j) for s, j in per_shard.items() if int(s) not in self.lost}
        for s, j in live.items():
            self.shard_size[s] = self.shard_size.get(s, 0) - j
        self.size -= sum(live.values())
        for s, j in per_shard.items():  # a lost shard's: they left it before the loss, told after it
            self._left_before_loss(int(s), int(j))
        self.limiter.on_delete(int(k))
        if unsampled:
            self.forget_waiting(sum(live.values()))
        self.pump()

    # -- owners, losses --------------------------------------------------------------------------------------
    def release_owner(self, owner: str) -> tuple[list[Txn], dict | None]:
        """Drop ``owner``'s waiters (they fail with :class:`OwnerGone`); return what it left to recover.

        Parameters
        ----------
        owner : str
            Client id or worker address that went away.

        Returns
        -------
        txns : list of Txn
            Its inserts admitted and not committed.
        hold : dict or None
            Its exclusive hold (``txn``, ``owner``, ``n``), if it had it.
        """
        self._refuse(lambda w: w.owner == owner, lambda w: OwnerGone(owner))
        txns = [t for t in self.txns.values() if t.owner == owner and not t.committed]
        hold = self.holder if self.holder is not None and self.holder["owner"] == owner else None
        self.pump()
        return txns, hold

    def mark_lost(self, shard: int, detail: str) -> None:
        """Record ``shard`` as lost (once): its items leave ``size``, ``version`` is bumped; a table that is not
        degraded refuses the inserts and samples waiting for its limiter with :class:`ShardLostError`.

        Parameters
        ----------
        shard : int
            Shard id.
        detail : str
            Why, for ``info()["lost"]``.
        """
        shard = int(shard)
        if shard in self.lost:
            return
        size = self.shard_size.get(shard, 0)
        self.lost[shard] = {
            "size_at_loss": int(size),
            "inserted_at_loss": int(self.shard_inserted.get(shard, 0)),
            "detail": detail,
        }
        self.size -= int(size)
        self.shard_size[shard] = 0
        self.unsampled_gone[shard, self.incarnation.get(shard, 0)] = int(size)
        self.forget_waiting(int(size))
        self.incarnation[shard] = self.incarnation.get(shard, 0) + 1
        self.version += 1
        if not self.config.get("degraded"):
            # a table that is not degraded refuses every call while a shard is lost (a new one at its handle):
            # the inserts and samples already waiting for the limiter are refused too, where they waited out
            # their timeouts (or the admission's hour) and then said the limiter had not admitted them
            why = f"table {self.name!r} lost shard(s) {sorted(self.lost)} while the call waited for its limiter"
            self._refuse(
                lambda w: w.kind in ("insert", "sample"),
                lambda w: ShardLostError(shard, why, stored=False if w.kind == "insert" else None),
            )
        self.pump()

    def _refuse(self, which: Callable[[Waiter], bool], error: Callable[[Waiter], Exception]) -> list[Waiter]:
        """Take the waiters ``which`` selects out of their lines, each failed with ``error(waiter)`` (one
        granted meanwhile keeps its grant); the caller pumps the lines after.  Returns those it failed."""
        failed = []
        for q in self._queues:
            for w in [w for w in q if which(w)]:
                q.remove(w)
                if not w.fut.done():
                    w.fut.set_exception(error(w))
                    failed.append(w)
        return failed

    def take_stamps(self, n: int) -> int:
        """``n`` table-wide stamps (the insert clock) for priority updates; heap ties follow them across shards.

        Parameters
        ----------
        n : int
            Stamps taken.

        Returns
        -------
        int
            The first of them.
        """
        first = self.next_stamp
        self.next_stamp += int(n)
        self.pump()
        return first

    def restore(self, state: dict) -> None:
        """Set the counters of a restored table from its checkpoint (checked against
        :data:`~gear_flow.distributed.protocol.RESTORED_STATE` by the caller).

        Parameters
        ----------
        state : dict
            ``size``, ``shard_size``, ``shard_inserted``, ``next_episode_id``, ``next_stamp``.
        """
        self.size = int(state["size"])
        self.shard_size = {int(k): int(v) for k, v in state["shard_size"].items()}
        self.shard_inserted = {int(k): int(v) for k, v in state["shard_inserted"].items()}
        self.next_episode_id = int(state["next_episode_id"])
        self.next_stamp = int(state["next_stamp"])
        self.limiter.settle(self.size)  # (a queue's items waiting: as many as its shards restored hold)
        self.arrived()

    def shard_restored(self, shard: int, worker: str, size: int, inserted: int) -> dict | None:
        """``shard`` was rebuilt on ``worker`` from a checkpoint holding ``size`` items (a new incarnation and
        placement version); a live shard replaced this way takes its old items out of the count.

        Parameters
        ----------
        shard : int
            Shard id.
        worker : str
            Its worker now.
        size : int
            Items the checkpoint held.
        inserted : int
            Items ever inserted into the shard, as the checkpoint says.

        Returns
        -------
        dict or None
            The shard's loss record (``info()["lost"]``), None when it was live.
        """
        shard = int(shard)
        if shard not in self.lost:  # a live shard replaced: its old items leave the count
            self.size -= self.shard_size.get(shard, 0)
            self.forget_waiting(self.shard_size.get(shard, 0))
            self.unsampled_gone[shard, self.incarnation.get(shard, 0)] = self.shard_size.get(shard, 0)
        lost = self.lost.pop(shard, None)
        if lost is not None:
            # inserts in flight when the shard was lost are settled after the loss was
            # marked; the count now is what the shard really had received
            lost["inserted_at_loss"] = int(self.shard_inserted.get(shard, 0))
        self.placement[shard] = worker
        self.shard_size[shard] = int(size)
        self.size += int(size)
        self.forget_waiting(-int(size))  # a queue's restored items wait to be sampled again
        self.shard_inserted[shard] = int(inserted)
        self.incarnation[shard] = self.incarnation.get(shard, 0) + 1
        self.version += 1
        self.arrived()
        return lost

    def passed(self, epoch: int) -> None:
        """The placement version reaches ``epoch``: a worker took it for a move that was then undone (the
        placement is unchanged, but that worker refuses what was planned before it).

        Parameters
        ----------
        epoch : int
            The version.
        """
        self.version = max(self.version, int(epoch))

    def moved(self, shards: Iterable[int], worker: str, epoch: int) -> int:
        """``shards`` moved whole to ``worker`` (their keys, counts and sizes stay): the placement says so,
        at version ``epoch`` or later.

        Parameters
        ----------
        shards : iterable of int
            The shards.
        worker : str
            Their new worker.
        epoch : int
            The version the destination took them at.

        Returns
        -------
        int
            The new version (``epoch``, unless the version passed it meanwhile).
        """
        for s in shards:
            self.placement[int(s)] = worker
        self.version = max(self.version + 1, int(epoch))
        return self.version

    def sample_expired(self, txn: str, expired: dict) -> None:
        """Exclusive sample ``txn`` handed out, and so expired, ``expired[shard]`` items.

        Those of a shard still as the sample was granted left it: its size
        drops (:meth:`removed`).  Those of a shard lost, or replaced by a
        restore, after the grant expired with that incarnation (its size
        went with it; a restored shard's items are others): they are
        counted sampled and no longer forgotten as unsampled by a queue's
        limiter, at most what the incarnation had when it went.  Only the
        grant's incarnations tell the two apart once the shard is restored.

        Parameters
        ----------
        txn : str
            The sample's transaction id (its grant says which incarnations it drew from).
        expired : dict
            ``{shard: items}`` the sample expired.
        """
        holder = self.holder if self.holder is not None and self.holder["txn"] == txn else None
        granted = None if holder is None else holder.get("incarnation")
        live, gone = {}, {}
        for s, j in expired.items():
            s, now = int(s), self.incarnation.get(int(s), 0)
            if granted is not None:
                drew_from = granted.get(s, 0)
            else:  # no grant known: a lost shard's items are of the incarnation the loss ended
                drew_from = now - 1 if s in self.lost else now
            if drew_from == now and s not in self.lost:
                live[s] = int(j)
            else:
                gone[s, drew_from] = int(j)
        self.removed(sum(int(j) for j in expired.values()), live)
        for key, j in gone.items():
            left = self.unsampled_gone.get(key, 0)
            j = min(j, left)
            if j:
                self.unsampled_gone[key] = left - j
                self.forget_waiting(-j)
                if key[1] == self.incarnation.get(key[0], 0) - 1:  # of the incarnation lost last (not restored)
                    self._left_before_loss(key[0], j)

    def _left_before_loss(self, shard: int, k: int) -> None:
        """``k`` items left lost ``shard`` (handed out, expired, deleted) before its loss, which its record
        counted (the coordinator was told after the loss): they were not lost with it."""
        rec = self.lost.get(shard)
        if rec is not None:
            rec["size_at_loss"] = max(0, int(rec["size_at_loss"]) - int(k))

    def forget_waiting(self, k: int) -> None:
        """``k`` items left a queue's (or stack's) shard unsampled (lost with it, or replaced by a restore):
        its limiter no longer counts them as waiting.  Each item of a queue is sampled once, so its limiter's
        ``inserts - samples`` is the items waiting; lost ones left counted would let samples through that
        find nothing (Fifo cycling its last candidates) and keep their room from later inserts for good.
        Other limiters count a lost item as deleted: their counts do not change (Reverb's deletes).

        Parameters
        ----------
        k : int
            Items; negative for items brought back (a lost shard restored).
        """
        self.limiter.forget(int(k))

    def close(self) -> None:
        """Close the table: every waiter fails with TableClosedError, and so does every later request."""
        self.closed = True
        self.pump()

    def public(self) -> dict:
        """What ``lookup`` answers: the table's state as plain data.

        Returns
        -------
        dict
            ``name``, ``config``, ``placement``, ``size``, ``admitted``,
            ``shard_size``, ``rate_limiter`` (its ``info()``),
            ``rate_limiter_config`` (to rebuild it), ``lost``,
            ``shard_inserted``, ``next_episode_id``, ``next_stamp``,
            ``version``, ``incarnation``, ``closed``, ``created`` (this creation's
            id), ``inserts_in_flight`` (count),
            ``unsettled_inserts`` (committed inserts with a part whose worker
            did not answer its apply, not yet known) and ``waiting``
            (``{"inserts": n, "samples": n}`` blocked).
        """
        from ..rate_limiters import to_config

        return {
            "name": self.name,
            "config": self.config,
            "placement": self.placement,
            "size": self.size,
            "admitted": self.admitted,
            "shard_size": dict(self.shard_size),
            "rate_limiter": self.limiter.info(),
            "rate_limiter_config": to_config(self.limiter),
            "lost": self.lost,
            "shard_inserted": dict(self.shard_inserted),
            "next_episode_id": self.next_episode_id,
            "next_stamp": self.next_stamp,
            "version": self.version,
            "incarnation": dict(self.incarnation),
            "closed": self.closed,
            "created": self.created,
            "inserts_in_flight": sum(1 for t in self.txns.values() if not t.committed),
            "unsettled_inserts": len(self.unsettled),
            "waiting": {"inserts": len(self.inserts), "samples": len(self.samples)},
        }


def _keep(record: OrderedDict, key: str, value: Any) -> None:
    """Note ``key`` in a record of the latest :data:`TICKETS_KEPT` (the oldest forgotten)."""
    record[key] = value
    if len(record) > TICKETS_KEPT:
        record.popitem(last=False)
