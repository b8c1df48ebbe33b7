"""Reverb's admission on the local table (issue 15, points 1, 6 and 7).

* Inserts are admitted against the items stored plus those of inserts admitted
  and still being written: several producers never overfill a Queue or Stack.
* Blocked inserts (and samples) are served first come, first served.
* ``max_diff < samples_per_insert * min_size_to_sample`` is a working limiter.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from helpers import delete_race, x_spec

from gear_flow import Fifo, LocalTable, RateLimitTimeout, SampleToInsertRatio

SHORT = 0.05


def one(v: float) -> dict:
    return {"x": np.array([v], np.float32)}


class Call(threading.Thread):
    def __init__(self, fn):
        super().__init__(daemon=True)
        self.fn, self.result, self.error = fn, None, None
        self.start()

    def run(self):
        try:
            self.result = self.fn()
        except BaseException as e:  # noqa: BLE001  (reported by the test)
            self.error = e

    def outcome(self, timeout=20.0):
        self.join(timeout)
        assert not self.is_alive(), "call still blocked"
        if self.error is not None:
            raise self.error
        return self.result


def until(cond, timeout=5.0) -> bool:
    """Poll ``cond`` (a state another thread reaches) until it holds or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True


def waiting(t, kind: str = "insert") -> int:
    """Calls of ``kind`` waiting for admission (not ``info()``: it takes the shard locks a held write has)."""
    adm = getattr(t, "_admission", None)
    return 0 if adm is None else adm.waiting(kind)


def values(batch) -> list[float]:
    return batch["x"].numpy()[:, 0].tolist()


# -- point 1: inserts admitted but not yet written count ----------------------------------------------------
def test_a_producer_admitted_while_another_writes_does_not_overfill_the_queue():
    """Forced interleaving: P1 is admitted and held inside the shard's write; P2 arrives then.
    P2 must wait (admitted size 1 = the queue's size), not see the old stored size 0."""
    q = LocalTable.queue(x_spec(capacity=64), 1, timeout=5)
    q.insert(one(0))
    shard = q.shards[0]
    entered, release = threading.Event(), threading.Event()
    write = shard.insert

    def held_write(batch):
        entered.set()
        assert release.wait(10)
        return write(batch)

    assert values(q.sample(1)) == [0.0]  # the queue is empty again: the next insert is free
    shard.insert = held_write
    p1 = Call(lambda: q.insert(one(1)))
    assert entered.wait(10)
    p2 = Call(lambda: q.insert(one(2)))
    # P2 decides while P1 is still writing: it waits in line (or, wrongly, is admitted)
    until(lambda: waiting(q) == 1 or q.rate_limiter.state.inserts == 3)
    shard.insert = write
    release.set()
    p1.outcome()
    assert values(q.sample(1)) == [1.0]
    p2.outcome()
    assert values(q.sample(1)) == [2.0]
    assert q.info()["totals"]["removed"] == 0 and q.size == 0


@pytest.mark.parametrize("kind", ["queue", "stack"])
def test_issue_scenario_three_blocked_producers_four_samples(kind):
    """One item in a queue of 1, three producers blocked, four samples: all four items, nothing removed."""
    for trial in range(15):
        make = LocalTable.queue if kind == "queue" else LocalTable.stack
        q = make(x_spec(capacity=64), 1, timeout=5, seed=trial)
        q.insert(one(0))
        producers = []
        for i in (1, 2, 3):
            producers.append(Call(lambda i=i, q=q: q.insert(one(i))))
            assert until(lambda n=i, q=q: waiting(q) == n)  # arrival order 1, 2, 3
        got = [values(q.sample(1, timeout=5))[0] for _ in range(4)]
        for p in producers:
            p.outcome()
        assert got == [0.0, 1.0, 2.0, 3.0], (trial, got)  # one at a time: also the stack's order
        info = q.info()
        assert info["totals"]["removed"] == 0 and info["size"] == 0
        assert info["rate_limiter"]["inserts"] == info["rate_limiter"]["samples"] == 4


@pytest.mark.parametrize("kind", ["queue", "stack"])
@pytest.mark.parametrize("consumers", [1, 2])
def test_many_producers_and_consumers_hand_out_every_item_once(kind, consumers):
    """3 producers, 1 or 2 consumers, a queue/stack of 2, 25 repetitions: every item exactly once,
    nothing removed or evicted; a queue with one consumer returns each producer's items in order."""
    n_per = 8
    for rep in range(25):
        make = LocalTable.queue if kind == "queue" else LocalTable.stack
        q = make(x_spec(capacity=256, num_shards=1 + rep % 2), 2, timeout=10, seed=rep)
        total = 3 * n_per
        share = [total // consumers + (c < total % consumers) for c in range(consumers)]
        cons = [
            Call(lambda k=k, q=q: [values(q.sample(1))[0] for _ in range(k)])  # started first: they block
            for k in share
        ]
        prods = [Call(lambda p=p, q=q: [q.insert(one(100 * p + i)) for i in range(n_per)]) for p in range(3)]
        for p in prods:
            p.outcome()
        got = [v for c in cons for v in c.outcome()]
        expect = sorted(100.0 * p + i for p in range(3) for i in range(n_per))
        assert sorted(got) == expect, rep
        tot = q.info()["totals"]
        assert tot["removed"] == 0 and tot["evicted"] == 0 and tot["expired"] == total
        if kind == "queue" and consumers == 1:
            for p in range(3):
                mine = [v for v in got if v // 100 == p]
                assert mine == sorted(mine), (rep, got)


def test_ratio_limiter_free_inserts_do_not_overshoot_while_one_is_being_written():
    """SampleToInsertRatio at the min_size_to_sample boundary: the last free insert is being
    written when another producer arrives; that one is not free (admitted size 4, not the stored 3)
    and diff + 1 > max_diff, so it waits and times out instead of overshooting the limiter."""
    for rep in range(5):
        t = LocalTable(x_spec(capacity=64), rate_limiter=SampleToInsertRatio(1.0, 4, (1.0, 4.0)), seed=rep)
        shard, write = t.shards[0], t.shards[0].insert
        entered, release = threading.Event(), threading.Event()

        def held_write(batch, entered=entered, release=release, write=write):
            entered.set()
            assert release.wait(10)
            return write(batch)

        for i in range(3):
            t.insert(one(i))
        shard.insert = held_write
        first = Call(lambda t=t: t.insert(one(3)))  # the last free insert, held while it writes
        assert entered.wait(10)
        late = Call(lambda t=t: t.insert(one(4), timeout=SHORT * 4))
        until(lambda t=t, late=late: not late.is_alive() or t.rate_limiter.state.inserts == 5)
        shard.insert = write
        release.set()
        first.outcome()
        with pytest.raises(RateLimitTimeout):
            late.outcome()
        assert t.rate_limiter.state.inserts == 4 and t.size == 4
        assert t.rate_limiter.diff <= t.rate_limiter.max_diff


# -- point 6: first come, first served -------------------------------------------------------------------
def test_blocked_inserts_are_served_in_arrival_order():
    """A large insert that arrived first is served before a small one that would fit now."""
    q = LocalTable.queue(x_spec(capacity=64), 3, timeout=5)
    q.insert([one(0), one(1)])
    big = Call(lambda: q.insert([one(10), one(11)]))
    until(lambda: waiting(q) == 1)
    small = Call(lambda: q.insert(one(20)))  # 2 + 1 <= 3 fits, but the big one came first
    until(lambda: waiting(q) == 2)
    got = values(q.sample(1))
    big.outcome()
    got += [values(q.sample(1))[0] for _ in range(3)]
    small.outcome()
    got += values(q.sample(1))
    assert got == [0.0, 1.0, 10.0, 11.0, 20.0]


def test_blocked_samples_are_served_in_arrival_order():
    """Two consumers blocked on an empty queue get the items in the order they asked."""
    q = LocalTable.queue(x_spec(capacity=64), 4, timeout=5)
    first = Call(lambda: values(q.sample(2)))
    until(lambda: waiting(q, "sample") == 1)
    second = Call(lambda: values(q.sample(1)))
    until(lambda: waiting(q, "sample") == 2)
    q.insert(one(0))  # the second could take this one; it must wait behind the first
    q.insert([one(1), one(2)])
    assert first.outcome() == [0.0, 1.0]
    assert second.outcome() == [2.0]


def test_a_waiter_that_times_out_leaves_the_line():
    q = LocalTable.queue(x_spec(capacity=64), 1, timeout=5)
    q.insert(one(0))
    with pytest.raises(RateLimitTimeout):
        q.insert(one(1), timeout=SHORT)
    assert q.info()["waiting"] == {"inserts": 0, "samples": 0}
    later = Call(lambda: q.insert(one(2)))
    assert values(q.sample(1)) == [0.0]
    later.outcome()
    assert values(q.sample(1)) == [2.0]


# -- point 7: max_diff below samples_per_insert * min_size_to_sample ---------------------------------------------
def test_max_diff_below_the_warm_up_offset_starts_sampling_after_the_free_inserts():
    t = LocalTable(x_spec(capacity=64), rate_limiter=SampleToInsertRatio(1.0, 10, (0.0, 9.0)), timeout=SHORT)
    for i in range(10):  # free while below min_size_to_sample
        t.insert(one(i))
    with pytest.raises(RateLimitTimeout):  # diff = 10 > max_diff 9: wait for samples
        t.insert(one(10))
    assert len(t.sample(2)) == 2  # sampling starts: nothing deadlocks
    t.insert(one(10))


def test_items_deleted_from_a_queue_wait_no_more(make_table):
    """A full queue of 4 (local and distributed): one item is deleted by key while it waits.  The limiter
    no longer counts it as waiting (left counted, a batch would be admitted for an item that is gone, and
    its room would stay taken for good): the 3 left come out once each, in order, and the queue's whole
    room takes 4 new items at once."""
    import gear_flow as gf

    spec = gf.TableSpec((gf.ColumnSpec("tag", (), np.int64),), capacity=64, num_shards=2)
    t = make_table.queue(spec, 4, timeout=10)
    r = t.insert([{"tag": np.array([k])} for k in range(1, 5)])
    assert t.delete(r.first_keys[1:2]).applied == 1  # item 2
    limiter = t.info()["rate_limiter"]
    assert limiter["inserts"] - limiter["samples"] == 3
    assert t.sample(3)["tag"].numpy()[:, 0].tolist() == [1, 3, 4]
    t.insert([{"tag": np.array([k])} for k in range(5, 9)], timeout=2.0)  # the whole room is free
    assert t.sample(4)["tag"].numpy()[:, 0].tolist() == [5, 6, 7, 8]


@pytest.mark.parametrize("unit", ["step", "episode"])
def test_a_fifo_with_expiry_hands_out_every_item_once_in_order_through_wraps_and_deletes(unit, make_table):
    """A Fifo sampler whose items go once (a queue without a size limit): batches of every size between
    inserts and deletes, the ring wrapping four times; every batch is the oldest items not yet handed out
    or deleted, in insertion order (the scans start past the items consumed before)."""
    from collections import deque

    from gear_flow import Fifo

    t = make_table(x_spec(capacity=64, item_unit=unit), sampler=Fifo(), remover=Fifo(), max_times_sampled=1,
                   seed=0, timeout=10)  # fmt: skip
    rng = np.random.default_rng(3)
    live, keys, v = deque(), {}, 0.0
    for _ in range(60):
        for _ in range(int(rng.integers(1, 6))):
            keys[v] = int(t.insert(one(v)).first_keys[0])
            live.append(v)
            v += 1.0
        while len(live) > 64:  # the ring overwrote the oldest
            live.popleft()
        if len(live) > 2 and rng.random() < 0.3:
            gone = live[1]
            t.delete([keys[gone]])
            live.remove(gone)
        b = int(rng.integers(1, len(live) + 1))
        got = t.sample(b)["x"].numpy()[:, 0].tolist()
        assert got == [live.popleft() for _ in range(b)]


def test_a_fifo_scan_starts_past_the_items_it_found_inactive(monkeypatch):
    """A queue's batch scans from where the batch before found its first live item, so it passes over only
    the items handed out since, not every consumed item still in the ring."""
    from gear_flow import Fifo
    from gear_flow.selectors import fifo

    starts = []
    scan = fifo._scan
    monkeypatch.setattr(fifo, "_scan", lambda active, cap, lo, *a: (starts.append(lo), scan(active, cap, lo, *a))[1])
    t = LocalTable(x_spec(capacity=4096), sampler=Fifo(), remover=Fifo(), max_times_sampled=1, seed=0, timeout=5)
    t.insert([one(float(v)) for v in range(3000)])
    assert t.sample(1000)["x"].numpy()[:, 0].tolist() == [float(v) for v in range(1000)]
    assert t.sample(5)["x"].numpy()[:, 0].tolist() == [1000.0, 1001.0, 1002.0, 1003.0, 1004.0]
    starts.clear()
    assert t.sample(5)["x"].numpy()[:, 0].tolist() == [1005.0, 1006.0, 1007.0, 1008.0, 1009.0]
    assert starts and min(starts) == 1000  # where the batch before met its first live item


@pytest.mark.parametrize("kind", ["queue", "fifo"])
def test_an_item_a_sample_hands_out_and_expires_is_never_also_reported_deleted(make_table, kind):
    """A producer deleting each item as it is stored, a consumer sampling it: each item is either handed
    out (and expired: it goes out once) or deleted, never both, as if the two came one after the other.
    A worker's delete of an item that a sample gathered and has not committed waits for that commit."""
    spec = x_spec(capacity=64, num_shards=2)
    if kind == "queue":
        t = make_table.queue(spec, 8, seed=0)
    else:
        t = make_table(spec, sampler=Fifo(), max_times_sampled=1, seed=0,
                       rate_limiter=SampleToInsertRatio(1.0, 1, 2.0))  # fmt: skip
    got, deleted, errors = delete_race(t, t)
    assert errors == []
    assert len(got) > 0 and len(deleted) > 0  # both raced for the items
    assert len(got) == len(set(got))  # each went out once
    assert sorted(set(got) & set(deleted)) == []
    info = t.info()["totals"]
    assert info["expired"] == len(got) and info["deleted"] == len(deleted)
