"""One property for both admission cores: the local table's and the distributed coordinator's.

:class:`~gear_flow.table.admission.Admission` (with the predicates
:class:`~gear_flow.table.local.LocalTable` gives it) and
:class:`~gear_flow.distributed.gate.TableGate` are driven with the same
generated sequences of insert requests of ``n`` items, sample requests of
``n``, insert commits, sample finishes (handed out; failed, the admission given
back; short of items, given back and asked again ``after`` the arrivals of its
grant), withdrawals (timeouts) and deletes, under the same limiter (MinSize,
SampleToInsertRatio, Queue, Stack).  After every step both must have granted
the same requests of each kind in the same order (lists compared as they are,
never sorted), have the same requests waiting in the same order, and agree on
the limiter's counters and the sizes.

Sans-I/O, no threads, no sleeps:

* **The gate** is plain state: each call decides at once.  Futures are looked
  at directly (no awaiting); the order of grants is recorded by wrapping the
  gate's ``_grant`` (behaviour unchanged).
* **Admission** only blocks: :meth:`Admission.wait` has no non-blocking path
  and no decision function of its own, only its loop's test
  ``line[0] == ticket and pred()``.  So a call's first pass goes through the
  real ``wait`` with a timeout of 0 (it returns when the call heads its line
  and the limiter admits it, or it leaves the line at once); a call that would
  block joins its line as ``wait`` does (a ticket at the end of its kind's
  deque) and is parked.  Every ``notify_all`` (``Admission.done``, a withdrawal
  leaving its line, the table's own after a write, a give-back, a delete)
  wakes every parked call, which re-runs that loop test, in an order drawn per
  example (threads woken by ``notify_all`` take the lock in any order); one
  admitted (limiter counted, ``done``) notifies again.  Withdrawal is the
  loop's ``except`` branch: the ticket leaves its line and the others are
  woken.  The predicates are LocalTable's: an insert of ``n`` is admitted on
  ``can_insert(n, stored + in_flight)``, a sample of ``n`` on ``(after is None
  or arrivals > after) and can_sample(n, stored)``.

What the two cores do differently on purpose, and how it is modelled:

* **Order across kinds.**  Inserts and samples wait in separate lines; which
  line's head goes first when both may is up to the thread scheduler in the
  local table (the gate serves inserts first).  It changes no grant: an
  admitted insert only raises ``diff`` (no sample's size), an admitted sample
  only lowers it, so a grant of one kind never stops the other kind's head.
  Each kind's order is compared, and so every step's grants.
* **Grants in flight, on ordered or exclusive tables** (Fifo/Lifo samplers,
  Queue, Stack).  The gate waits for what the local table gets from its shard
  locks (an admitted insert writes, and an admitted sample reads and expires,
  before any call admitted after it touches the shards): an ordered sample
  sees only the items below the horizon, a Queue's sample of ``n`` waits for
  ``n`` visible items, and exclusive samples hold the table until they finish
  (see gate.py's module docstring and ``TableGate._can``).  For these tables
  every grant is completed (in request order) as soon as both cores granted
  it, and the two are compared once nothing is left to complete.  On
  unordered, non-exclusive tables completions come whenever the sequence says,
  in any order, and the two are compared after every event.

Not covered: the gate's leases (``count_samples``, MinSize), eviction holds,
lost and restored shards, and aborted inserts (the local table has none: an
admitted insert is written).
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gear_flow as gf
from gear_flow.distributed.gate import TableGate
from gear_flow.errors import SpecError
from gear_flow.table.admission import Admission
from gear_flow.table.config import TableConfig

SETTINGS = settings(max_examples=200, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
KINDS = ("insert", "sample")


# -- the local core ------------------------------------------------------------------------------------
class _Notes:
    """Stands in for ``Admission.cond``: nothing here blocks, and a notify is followed by :meth:`LocalCore.wake`."""

    def __init__(self) -> None:
        self.notified = 0

    def notify_all(self) -> None:
        self.notified += 1


class _WouldBlock(Exception):
    """``Admission.wait``'s timeout at its first pass: the call would have blocked."""


@dataclass
class _Parked:
    rid: int
    kind: str
    n: int
    ticket: int
    after: int | None


class LocalCore:
    """An :class:`Admission` with LocalTable's predicates, admissions and completions, driven without threads."""

    def __init__(self, limiter, rng: random.Random, expires: bool) -> None:
        self.limiter = limiter
        self.adm = Admission()
        self.adm.cond = _Notes()
        self.rng = rng
        self.expires = expires  # samples hand out each item once (a queue): finishing takes their items
        self.stored = 0  # what LocalTable.size is: items written to the shards
        self.parked: list[_Parked] = []
        self.rid_of: dict[int, int] = {}  # ticket -> request
        self.grants: list[tuple[str, int]] = []
        self.seen: dict[int, int] = {}  # sample -> arrivals at its admission

    def _pred(self, kind: str, n: int, after: int | None) -> bool:
        adm = self.adm
        if kind == "insert":  # LocalTable._insert
            return self.limiter.can_insert(n, self.stored + adm.in_flight)
        return (after is None or adm.arrivals > after) and self.limiter.can_sample(n, self.stored)  # _sample_admitted

    def _admit(self, rid: int, kind: str, n: int) -> None:
        if kind == "insert":
            self.limiter.on_insert(n)
            self.adm.in_flight += n
        else:
            self.limiter.on_sample(n)
            self.seen[rid] = self.adm.arrivals
        self.adm.done(kind)
        self.grants.append((kind, rid))

    def request(self, rid: int, kind: str, n: int, after: int | None = None) -> None:
        try:  # the first pass of Admission.wait's loop
            self.adm.wait(kind, lambda: self._pred(kind, n, after), 0, lambda _t: _WouldBlock())
        except _WouldBlock:
            ticket = next(self.adm._tickets)  # it blocks: joins its line as wait does, and waits there
            self.adm._lines[kind].append(ticket)
            self.rid_of[ticket] = rid
            self.parked.append(_Parked(rid, kind, n, ticket, after))
        else:
            self._admit(rid, kind, n)
        self.wake()

    def wake(self) -> None:
        """``notify_all``: every parked call re-runs ``line[0] == ticket and pred()``, in a drawn order."""
        while True:
            order = list(self.parked)
            self.rng.shuffle(order)
            for p in order:
                if self.adm._lines[p.kind][0] == p.ticket and self._pred(p.kind, p.n, p.after):
                    self.parked.remove(p)
                    self._admit(p.rid, p.kind, p.n)
                    break
            else:
                return

    def withdraw(self, rid: int) -> None:
        """The wait timed out: Admission.wait's ``except`` branch."""
        p = next(p for p in self.parked if p.rid == rid)
        self.parked.remove(p)
        self.adm._lines[p.kind].remove(p.ticket)
        self.adm.cond.notify_all()
        self.wake()

    def commit(self, rid: int, n: int) -> None:
        """The admitted insert is written (LocalTable._insert's ``finally``, then its notify)."""
        self.stored += n
        self.adm.in_flight -= n
        self.adm.arrivals += 1
        self.wake()

    def finish(self, rid: int, n: int, how: str, again: int | None) -> None:
        """The admitted sample is over: it handed its batch out (a queue's items expire), or gave it back."""
        if how == "ok":
            if self.expires:
                self.stored -= n
                self.limiter.on_delete(n)
        else:
            self.limiter.give_back_sample(n)
        self.wake()
        if how == "short":  # LocalTable.sample waits again, once something arrived since its admission
            self.request(again, "sample", n, after=self.seen[rid])

    def delete(self, k: int) -> None:
        """LocalTable.delete of ``k`` stored items."""
        self.stored -= k
        self.limiter.on_delete(k)
        self.limiter.forget(k)
        self.wake()

    def waiting(self, kind: str) -> list[int]:
        return [self.rid_of[t] for t in self.adm._lines[kind]]


# -- the gate ------------------------------------------------------------------------------------------
class GateCore:
    """A :class:`TableGate` called as the coordinator calls it for a client's requests and reports."""

    def __init__(self, cfg: TableConfig) -> None:
        self.g = TableGate("t", cfg.to_dict(), {0: "w0"})
        self.exclusive = cfg.exclusive
        self.expires = cfg.max_times_sampled > 0
        self.waiters: dict = {}
        self.grants: list[tuple[str, int]] = []
        grant = self.g._grant

        def logged(w):
            self.grants.append((w.kind, w.extra["rid"]))
            return grant(w)

        self.g._grant = logged

    def request(self, rid: int, kind: str, n: int, after: int | None = None) -> None:
        if kind == "insert":
            extra = {"episodes": 1, "per_shard": {0: n}}
        else:
            extra = {"exclusive": self.exclusive} | ({} if after is None else {"after": after})
        self.waiters[rid] = self.g.request(kind, n, "client", rid=rid, **extra)

    def _grant(self, rid: int) -> dict:
        return self.waiters[rid].fut.result()

    def withdraw(self, rid: int) -> None:
        self.g.withdraw(self.waiters[rid])

    def commit(self, rid: int, n: int) -> None:
        assert self.g.commit_insert(self._grant(rid)["txn"], {0: n}, {})

    def finish(self, rid: int, n: int, how: str, again: int | None) -> None:
        grant = self._grant(rid)
        if how == "ok":
            if self.expires:
                self.g.sample_expired(grant["txn"], {0: n})
            self.g.sample_finished(grant["txn"])
        else:
            self.g.sample_finished(grant["txn"], rollback=n)
        if how == "short":
            self.request(again, "sample", n, after=grant["arrivals"])

    def delete(self, k: int) -> None:
        self.g.removed(k, {0: k}, unsampled=True)

    def waiting(self, kind: str) -> list[int]:
        return [w.extra["rid"] for w in (self.g.inserts if kind == "insert" else self.g.samples)]


# -- the property --------------------------------------------------------------------------------------
def _config(limiter, sampler) -> TableConfig:
    spec = gf.TableSpec((gf.ColumnSpec("x", (), np.float32),), capacity=1000, num_shards=1)
    more = {}
    if isinstance(limiter, gf.Queue):  # a queue's (or stack's) own selectors, each item sampled once
        more = dict(remover=type(sampler)(), max_times_sampled=1)
    return TableConfig.build(spec, sampler=sampler, rate_limiter=limiter, **more)


def _of(grants: list[tuple[str, int]], kind: str) -> list[int]:
    return [rid for k, rid in grants if k == kind]


def _agree(local: LocalCore, gate: GateCore, where: str) -> None:
    g = gate.g
    for kind in KINDS:
        assert _of(local.grants, kind) == _of(gate.grants, kind), f"{kind} grants differ {where}"
        assert local.waiting(kind) == gate.waiting(kind), f"{kind}s waiting differ {where}"
    assert vars(local.limiter.state) == vars(g.limiter.state), f"limiter counters differ {where}"
    assert (local.stored, local.stored + local.adm.in_flight) == (g.size, g.admitted), f"sizes differ {where}"
    assert local.adm.arrivals == g.arrivals, f"arrivals differ {where}"


def check(limiter, sampler, events, rng: random.Random) -> tuple[LocalCore, GateCore]:
    """Run ``events`` on both cores (see the module docstring), compare them after each, return them."""
    cfg = _config(limiter, sampler)
    prompt = cfg.selection == "ordered" or cfg.exclusive  # grants in flight: completed at once (see above)
    local = LocalCore(cfg.fresh_limiter(), rng, expires=cfg.max_times_sampled > 0)
    gate = GateCore(cfg)
    cores = (local, gate)
    reqs: dict[int, tuple] = {}  # request -> (kind, n, how a sample ends)
    done: set[int] = set()  # completed grants
    next_rid = iter(range(10**6))

    def ask(kind, n, how=None):
        rid = next(next_rid)
        reqs[rid] = (kind, n, how)
        return rid

    def complete(rid):
        kind, n, how = reqs[rid]
        done.add(rid)
        if kind == "insert":
            for c in cores:
                c.commit(rid, n)
        else:
            again = ask("sample", n, "ok") if how == "short" else None
            for c in cores:
                c.finish(rid, n, how, again)

    def in_flight(kind):  # granted by both, not completed, in grant order
        both = set(_of(local.grants, kind))
        return [r for r in _of(gate.grants, kind) if r in both and r not in done]

    with asyncio.Runner() as runner:

        async def go():
            for step, ev in enumerate(events):
                op = ev[0]
                if op in KINDS:
                    n, how = ev[1], ev[2] if op == "sample" else None
                    try:
                        if op == "insert":
                            local.limiter.check_insert_size(n)
                        else:
                            local.limiter.check_sample_size(n)
                    except SpecError:
                        continue  # refused before admission by either table
                    if how == "short" and prompt:  # (completed at once, it finds what the gate let it see)
                        how = "ok"
                    rid = ask(op, n, how)
                    for c in cores:
                        c.request(rid, op, n)
                elif op == "withdraw":
                    waiting = local.waiting("insert") + local.waiting("sample")
                    if not waiting:
                        continue
                    rid = waiting[ev[1] % len(waiting)]
                    for c in cores:
                        c.withdraw(rid)
                elif op == "delete":
                    k = min(ev[1], local.stored)
                    if not k:
                        continue
                    for c in cores:
                        c.delete(k)
                elif not prompt:  # a commit or a finish of one of the grants in flight
                    pending = in_flight("insert" if op == "commit" else "sample")
                    if pending:
                        complete(pending[ev[1] % len(pending)])
                if prompt:
                    while True:
                        pending = sorted(in_flight("insert") + in_flight("sample"))
                        if not pending:
                            break
                        complete(pending[0])
                _agree(local, gate, f"after step {step} {ev!r}")

        runner.run(go())
    return local, gate


_INSERT = st.tuples(st.just("insert"), st.integers(1, 4))
_SAMPLE = st.tuples(st.just("sample"), st.integers(1, 4), st.sampled_from(["ok", "ok", "rollback", "short"]))
_COMMIT = st.tuples(st.just("commit"), st.integers(0, 7))
_FINISH = st.tuples(st.just("finish"), st.integers(0, 7))
EVENTS = st.lists(
    st.one_of(
        _INSERT,
        _SAMPLE,
        _INSERT,
        _SAMPLE,
        _COMMIT,
        _FINISH,
        _COMMIT,
        _FINISH,
        st.tuples(st.just("withdraw"), st.integers(0, 7)),
        st.tuples(st.just("delete"), st.integers(1, 3)),
    ),
    min_size=20,
    max_size=80,
)


@st.composite
def sample_to_insert_ratio(draw):
    spi = draw(st.sampled_from([0.5, 1.0, 2.0, 3.0]))
    min_size = draw(st.integers(1, 5))
    if draw(st.booleans()):
        return gf.SampleToInsertRatio(spi, min_size, draw(st.sampled_from([1.0, 1.5, 2.0, 4.0, 8.0])) * max(1.0, spi))
    low = draw(st.integers(-6, int(spi * min_size)))
    span = draw(st.sampled_from([2.0, 3.0, 5.0, 8.0])) * max(1.0, spi)
    return gf.SampleToInsertRatio(spi, min_size, (float(low), low + span))


LIMITERS = {
    "min_size": st.builds(gf.MinSize, st.integers(1, 5)),
    "sample_to_insert_ratio": sample_to_insert_ratio(),
}


@pytest.mark.parametrize("sampler", [gf.Uniform, gf.Fifo], ids=["uniform", "fifo"])
@pytest.mark.parametrize("name", sorted(LIMITERS))
def test_both_cores_grant_the_same_requests_in_the_same_order(name, sampler):
    @SETTINGS
    @given(limiter=LIMITERS[name], events=EVENTS, rng=st.randoms(use_true_random=False))
    def prop(limiter, events, rng):
        check(limiter, sampler(), events, rng)

    prop()


@pytest.mark.parametrize("kind", [gf.Queue, gf.Stack])
def test_both_cores_serve_a_queue_or_stack_in_the_same_order(kind):
    @SETTINGS
    @given(size=st.integers(1, 6), events=EVENTS, rng=st.randoms(use_true_random=False))
    def prop(size, events, rng):
        check(kind(size), gf.Fifo() if kind is gf.Queue else gf.Lifo(), events, rng)

    prop()


def test_a_big_request_at_the_head_blocks_smaller_ones_behind_it_in_both():
    """Reverb's head-of-line rule, spelled out on a Queue(4) holding one item: a sample of 3 waiting first is
    not overtaken by a sample of 1 that the limiter alone would admit; two more items let the 3 go, not the 1."""
    events = [("insert", 1), ("sample", 3, "ok"), ("sample", 1, "ok"), ("insert", 2)]
    local, gate = check(gf.Queue(4), gf.Fifo(), events[:3], random.Random(0))
    for core in (local, gate):
        assert _of(core.grants, "sample") == [] and core.waiting("sample") == [1, 2]
    local, gate = check(gf.Queue(4), gf.Fifo(), events, random.Random(0))
    for core in (local, gate):
        assert _of(core.grants, "sample") == [1] and core.waiting("sample") == [2]
