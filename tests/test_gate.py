"""The coordinator's admission state (TableGate) on its own: no Dask, no sleeps.

Every scenario runs on one event loop and checks grants right after the state
change that allows them, so the order of grants is the order of events.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import gear_flow as gf
from gear_flow.distributed.gate import TICKETS_KEPT, OwnerGone, TableGate, Withdrawn
from gear_flow.table.config import TableConfig


def _gate(limiter, sampler=None, degraded=False, **kw) -> TableGate:
    spec = gf.TableSpec((gf.ColumnSpec("x", (), np.float32),), capacity=1000, num_shards=2, **kw)
    more = {}
    if isinstance(limiter, gf.Queue):  # a queue's (or stack's) own selectors, each item sampled once
        more = dict(remover=type(sampler)(), max_times_sampled=1)
    cfg = TableConfig.build(spec, sampler=sampler, rate_limiter=limiter, **more)
    return TableGate("t", {**cfg.to_dict(), "degraded": degraded}, {0: "w0", 1: "w1"})


def run(coro):
    return asyncio.run(coro())


def granted(waiters):
    return [w.fut.done() and not w.fut.cancelled() and w.fut.exception() is None for w in waiters]


def test_room_for_one_admits_exactly_one():
    async def go():
        g = _gate(gf.SampleToInsertRatio(1.0, min_size_to_sample=10, error_buffer=20))  # diff in [-10, 30]
        for _ in range(30):
            r = g.request("insert", 1, "a").fut.result()
            g.commit_insert(r["txn"], {0: 1}, {})
        assert g.limiter.diff == g.limiter.max_diff
        waiting = [g.request("insert", 5, "a") for _ in range(4)]
        assert granted(waiting) == [False] * 4
        g.request("sample", 5, "b")  # room for exactly one insert of 5
        assert granted(waiting) == [True, False, False, False]
        assert g.limiter.diff == g.limiter.max_diff

    run(go)


def test_waiting_inserts_are_served_in_arrival_order():
    """A large insert that arrived first is not overtaken by small ones (no starvation)."""

    async def go():
        g = _gate(gf.SampleToInsertRatio(1.0, min_size_to_sample=1, error_buffer=100))
        while g.limiter.can_insert(1, g.admitted):
            r = g.request("insert", 1, "a").fut.result()
            g.commit_insert(r["txn"], {0: 1}, {})
        big = g.request("insert", 60, "big")
        small = [g.request("insert", 1, f"s{i}") for i in range(5)]
        order = []
        for w in [big, *small]:
            w.fut.add_done_callback(lambda f, w=w: order.append(w.owner))
        for _ in range(1000):  # room grows by 1 per sample: smalls would fit long before the big one
            g.request("sample", 1, "learner")
            await asyncio.sleep(0)  # let done-callbacks run (not a barrier: the grants are decided already)
            if len(order) == 6:
                break
        assert order == ["big"] + [f"s{i}" for i in range(5)]

    run(go)


def test_abort_gives_back_the_admission_and_commit_counts_the_size():
    async def go():
        g = _gate(gf.MinSize(1))
        a = g.request("insert", 5, "c").fut.result()
        b = g.request("insert", 3, "c").fut.result()
        assert (g.admitted, g.size, g.limiter.state.inserts) == (8, 0, 8)
        g.abort_insert(a["txn"])
        assert (g.admitted, g.size, g.limiter.state.inserts) == (3, 0, 3)
        g.commit_insert(b["txn"], {0: 2, 1: 1}, {1: 1})  # one item overwritten by the ring
        assert (g.admitted, g.size, g.shard_size) == (2, 2, {0: 2, 1: 0})
        assert g.limiter.state.deletes == 1 and not g.txns

    run(go)


def test_ordered_samples_see_only_the_committed_prefix():
    """Horizon: a newer insert that commits first is invisible to an ordered sample until the older one commits."""

    async def go():
        g = _gate(gf.MinSize(1), sampler=gf.Fifo())
        old = g.request("insert", 2, "p1").fut.result()
        new = g.request("insert", 2, "p2").fut.result()
        assert g.commit_insert(new["txn"], {1: 2}, {})
        assert not g.commit_insert(new["txn"], {1: 2}, {})  # a repeat (kept behind the older one): ignored
        assert (g.size, g.visible, g.horizon) == (2, 0, old["first_stamp"])
        s = g.request("sample", 1, "c")
        assert granted([s]) == [False]  # nothing before the horizon yet
        g.commit_insert(old["txn"], {0: 2}, {})
        assert granted([s]) == [True] and s.fut.result()["horizon"] == 4 == g.horizon

    run(go)


def test_a_commit_sent_again_after_its_insert_left_the_transactions_is_ignored():
    """A commit sent again (its reply lost, or its caller interrupted and the commit finished from the event
    loop) once its insert was committed and trimmed from the transactions was refused as 'no insert in flight',
    and the steps after it (the eviction to max_size) never ran.  The latest commits are remembered: the repeat
    is ignored, nothing counted twice; a made-up transaction is still refused."""
    from gear_flow.distributed.gate_checks import check_commit
    from gear_flow.errors import ProtocolError

    async def go():
        g = _gate(gf.MinSize(1))
        r = g.request("insert", 2, "p").fut.result()
        check_commit(g, r["txn"], {0: 2}, {})
        assert g.commit_insert(r["txn"], {0: 2}, {}) and not g.txns  # committed, and gone from the transactions
        check_commit(g, r["txn"], {0: 2}, {})
        assert not g.commit_insert(r["txn"], {0: 2}, {}) and g.size == 2 and g.limiter.state.inserts == 2
        with pytest.raises(ProtocolError, match="no insert 'made-up' is in flight"):
            check_commit(g, "made-up", {0: 2}, {})
        for _ in range(TICKETS_KEPT):  # the latest are remembered, the oldest forgotten
            x = g.request("insert", 1, "p").fut.result()
            g.commit_insert(x["txn"], {0: 1}, {})
        with pytest.raises(ProtocolError, match="is in flight"):
            check_commit(g, r["txn"], {0: 2}, {})

    run(go)


@pytest.mark.parametrize("kind", [gf.Queue, gf.Stack])
def test_a_queue_sample_waits_until_as_many_items_as_it_takes_are_visible(kind):
    """A Queue's limiter counts an insert when it is admitted: with one item committed and one in flight it
    would let a sample of 2 through, whose draw finds one item (and would hand it out twice).  The sample
    waits for the second commit; a sample of 1 goes at once.  A lost shard's items are not waited for (a
    degraded table: one that is not refuses every insert and sample once a shard is lost)."""

    async def go():
        g = _gate(kind(8), sampler=gf.Fifo() if kind is gf.Queue else gf.Lifo(), degraded=True)
        a = g.request("insert", 1, "p").fut.result()
        g.commit_insert(a["txn"], {0: 1}, {})
        b = g.request("insert", 1, "p").fut.result()  # in flight
        two = g.request("sample", 2, "c", exclusive=True)
        assert granted([two]) == [False] and g.limiter.diff == 2
        g.commit_insert(b["txn"], {1: 1}, {})
        assert granted([two]) == [True]
        g.sample_finished(two.fut.result()["txn"], rollback=2)  # say it failed: both items wait again
        g.mark_lost(1, "gone")
        two = g.request("sample", 2, "c", exclusive=True)
        one = g.request("sample", 1, "c", exclusive=True)
        assert granted([two, one]) == [False, False]  # one item left: first come, first served
        c = g.request("insert", 1, "p").fut.result()
        g.commit_insert(c["txn"], {0: 1}, {})
        assert granted([two, one]) == [True, False]

    run(go)


def test_exclusive_samples_run_one_at_a_time_and_owners_are_released():
    async def go():
        g = _gate(gf.MinSize(1), sampler=gf.Fifo())
        r = g.request("insert", 4, "p").fut.result()
        g.commit_insert(r["txn"], {0: 4}, {})
        first = g.request("sample", 1, "c1", exclusive=True)
        second = g.request("sample", 1, "c2", exclusive=True)
        assert granted([first, second]) == [True, False]
        g.sample_finished(first.fut.result()["txn"])
        assert granted([second]) == [True]
        third = g.request("sample", 1, "c3", exclusive=True)
        pending = g.request("insert", 2, "dead")
        txns, hold = g.release_owner("c2")  # the holder dies: its hold comes back for recovery
        assert hold["owner"] == "c2" and txns == []
        g.sample_finished(hold["txn"], rollback=hold["n"])
        assert granted([third]) == [True]
        assert pending.fut.done()  # MinSize admits at once; an unfinished insert of a departed owner:
        txns, _ = g.release_owner("dead")
        assert [t.txn for t in txns] == [pending.fut.result()["txn"]]
        waiter = g.request("sample", 1, "gone", exclusive=True)  # c3 still holds the table
        g.release_owner("gone")
        with pytest.raises(OwnerGone):
            waiter.fut.result()

    run(go)


def test_a_sample_short_of_items_is_granted_again_only_once_something_arrived():
    """A sample whose items left could not fill it asks again ``after`` the arrivals of its grant: not
    granted on the limiter's word alone (that would spin), and not ahead of the samples before it; a commit
    or an abort since (the horizon moves) grants it."""

    async def go():
        g = _gate(gf.MinSize(1), sampler=gf.Fifo())
        r = g.request("insert", 3, "p").fut.result()
        g.commit_insert(r["txn"], {0: 3}, {})
        grant = g.request("sample", 5, "c", exclusive=True).fut.result()
        g.sample_finished(grant["txn"], rollback=5)  # short: given back
        again = g.request("sample", 5, "c", exclusive=True, after=grant["arrivals"])
        later = g.request("sample", 1, "d", exclusive=True)
        assert granted([again, later]) == [False, False]  # first come, first served
        pending = g.request("insert", 2, "p").fut.result()
        assert granted([again]) == [False]  # admitted, not stored: nothing to see yet
        g.commit_insert(pending["txn"], {1: 2}, {})
        assert granted([again, later]) == [True, False]
        assert again.fut.result()["arrivals"] > grant["arrivals"]
        g.sample_finished(again.fut.result()["txn"], rollback=5)
        assert granted([later]) == [True]
        g.sample_finished(later.fut.result()["txn"], rollback=1)
        last = g.request("sample", 1, "c", exclusive=True).fut.result()
        g.sample_finished(last["txn"], rollback=1)
        waiting = g.request("sample", 1, "c", exclusive=True, after=last["arrivals"])
        lost = g.request("insert", 1, "p").fut.result()
        assert granted([waiting]) == [False]
        g.abort_insert(lost["txn"])
        assert granted([waiting]) == [True]

    run(go)


def test_an_unsettled_part_is_counted_once_and_no_more_than_was_routed_to_it():
    """An insert of 3 + 2 items committed with shard 1's worker silent counts shard 0's 3 and gives the
    other 2 back to the limiter; the settled part counts once, clipped to what was routed there."""

    async def go():
        g = _gate(gf.MinSize(1))
        grant = g.request("insert", 5, "p", episodes=5, per_shard={0: 3, 1: 2}).fut.result()
        g.commit_insert(grant["txn"], {0: 3}, {}, unsettled=("w1",))
        assert (g.size, g.limiter.state.inserts, g.unsettled) == (3, 3, {grant["txn"]: {1: 2}})
        g.settle_late(grant["txn"], [1], {1: 7}, {})  # (more than routed: clipped)
        assert (g.size, g.shard_size[1], g.limiter.state.inserts, g.unsettled) == (5, 2, 5, {})
        g.settle_late(grant["txn"], [1], {1: 2}, {})  # settled again: nothing more
        assert (g.size, g.limiter.state.inserts) == (5, 5)
        other = g.request("insert", 2, "p", episodes=2, per_shard={0: 1, 1: 1}).fut.result()
        g.commit_insert(other["txn"], {0: 1}, {}, unsettled=("w1",))
        g.settle_late(other["txn"], [1], {}, {})  # aborted there: nothing written
        assert (g.size, g.limiter.state.inserts, g.unsettled) == (6, 6, {})

    run(go)


def test_evictions_run_one_at_a_time_and_delay_no_sample_of_a_non_exclusive_table():
    """Each hold is granted the size of its moment, after the eviction before it has reported what it
    removed; samples queued behind a waiting hold are served at once (they do not take the hold)."""

    async def go():
        g = _gate(gf.MinSize(1), max_size=10)
        r = g.request("insert", 12, "p").fut.result()
        g.commit_insert(r["txn"], {0: 6, 1: 6}, {})
        first, second = g.request("hold", 0, "a"), g.request("hold", 0, "b")
        sample = g.request("sample", 1, "c")
        assert granted([first, second, sample]) == [True, False, True]
        assert first.fut.result()["size"] == 12
        g.removed(2, {0: 2})
        assert granted([second]) == [False]
        g.sample_finished(first.fut.result()["txn"])
        assert granted([second]) == [True] and second.fut.result()["size"] == 10
        third = g.request("hold", 0, "d")
        _, hold = g.release_owner("b")  # the holder goes away: its hold comes back for recovery
        assert hold["txn"] == second.fut.result()["txn"]
        g.sample_finished(hold["txn"], rollback=hold["n"])
        assert granted([third]) == [True]

    run(go)


@pytest.mark.parametrize("restored_before_finish", [False, True])
def test_a_queue_sample_finished_from_a_lost_shard_counts_its_items_even_after_the_shard_was_restored(
    restored_before_finish,
):
    """An exclusive queue sample takes 2 items of shard 1, whose worker is then lost: the loss forgets
    shard 1's 4 waiting items (the 2 in the batch among them), and the sample's finish counts its 2 as
    handed out again.  When the shard is restored from a checkpoint (3 items) before that finish
    arrives, the 2 still belong to the lost incarnation: they must be counted all the same, or the
    limiter believes 2 fewer items wait than the table holds and a batch of all of them is never
    admitted (consumers stuck with items present)."""

    async def go():
        g = _gate(gf.Queue(16), gf.Fifo())
        r = g.request("insert", 6, "w").fut.result()
        g.commit_insert(r["txn"], {0: 2, 1: 4}, {})
        s = g.request("sample", 2, "learner", exclusive=True).fut.result()  # its 2 items: shard 1's
        g.mark_lost(1, "killed")
        assert g.size == 2 and g.limiter.state.inserts - g.limiter.state.samples == 0
        if restored_before_finish:
            g.shard_restored(1, "w2", size=3, inserted=3)
        g.sample_expired(s["txn"], {1: 2})
        g.sample_finished(s["txn"])
        if not restored_before_finish:
            g.shard_restored(1, "w2", size=3, inserted=3)
        waiting = g.limiter.state.inserts - g.limiter.state.samples
        assert (g.size, waiting) == (5, 5)  # shard 0's 2 and the 3 restored: all waiting, all sampleable
        assert g.request("sample", 5, "learner", exclusive=True).fut.done()

    run(go)


def test_items_that_left_a_shard_before_its_loss_are_not_in_its_loss_record():
    """A shard's worker dies after it handed items out (a queue's exclusive sample, which expires them) or
    deleted them, and before the coordinator was told: the loss recorded them as lost with the shard, and
    the late report was ignored, so ``size_at_loss`` said 3 items more than were lost (a stress hunt: a
    queue's lost shard reported 107, 104 stored there).  The late report now takes them out of the record;
    the queue's limiter counts them as it did."""

    async def go():
        g = _gate(gf.Queue(16), gf.Fifo())
        r = g.request("insert", 6, "w").fut.result()
        g.commit_insert(r["txn"], {0: 2, 1: 4}, {})
        s = g.request("sample", 3, "learner", exclusive=True).fut.result()  # 3 of shard 1's items handed out
        g.mark_lost(1, "killed")
        assert g.lost[1]["size_at_loss"] == 4  # (the expiry not told yet)
        g.sample_expired(s["txn"], {1: 3})
        g.sample_finished(s["txn"])
        assert g.lost[1]["size_at_loss"] == 1  # the one item that was still there
        assert (g.size, g.limiter.state.inserts - g.limiter.state.samples) == (2, 2)  # shard 0's, waiting

        g = _gate(gf.MinSize(1), gf.Uniform())
        r = g.request("insert", 9, "w").fut.result()
        g.commit_insert(r["txn"], {0: 4, 1: 5}, {})
        g.mark_lost(1, "killed")
        g.removed(3, {0: 1, 1: 2}, unsampled=True)  # deletes applied on both workers, told after the loss
        assert (g.lost[1]["size_at_loss"], g.size, g.shard_size[0]) == (3, 3, 3)

    run(go)


def test_a_withdrawn_ticket_leaves_its_line_or_gives_its_grant_back():
    """What a caller's withdraw (its call cancelled or interrupted before the answer reached it) does, by where
    the request is: waiting, it leaves its line (its lease's samples counted: they were served); granted, an
    insert is aborted, a sample's count given back and an exclusive hold released; not come yet, it is refused
    when it comes."""

    async def go():
        m = _gate(gf.MinSize(2))  # (leases: MinSize only)
        waiting = m.request("sample", 1, "c", "t-wait", done=3)
        assert m.withdraw_ticket("t-wait") == "waiting" and not m.samples
        with pytest.raises(Withdrawn):
            waiting.fut.result()
        assert (m.limiter.state.inserts, m.limiter.state.samples) == (0, 3)

        g = _gate(gf.Queue(2), sampler=gf.Fifo())
        waiting = g.request("sample", 1, "c", "t-wait")
        assert g.withdraw_ticket("t-wait") == "waiting" and not g.samples
        later = g.request("sample", 1, "c2")
        r = g.request("insert", 1, "p").fut.result()
        g.commit_insert(r["txn"], {0: 1}, {})
        assert granted([later]) == [True]  # the item went to the sample still waiting, not the withdrawn one

        ins = g.request("insert", 1, "p", "t-ins")
        assert granted([ins]) == [True] and g.admitted == 2
        assert g.withdraw_ticket("t-ins") == "granted"
        assert g.admitted == 1 and ins.fut.result()["txn"] not in g.txns and g.limiter.state.inserts == 1

        r = g.request("insert", 1, "p").fut.result()
        g.commit_insert(r["txn"], {1: 1}, {})
        before = g.limiter.state.samples
        smp = g.request("sample", 1, "c", "t-smp", exclusive=True)
        assert granted([smp]) == [True] and g.holder is not None and g.limiter.state.samples == before + 1
        assert g.withdraw_ticket("t-smp") == "granted"
        assert g.holder is None and g.limiter.state.samples == before  # the item is there for the next sample
        assert g.withdraw_ticket("t-smp") == "unknown"  # once

        assert m.withdraw_ticket("t-early") == "unknown"  # the withdraw overtook its request
        early = m.request("sample", 1, "c", "t-early", done=2)
        with pytest.raises(Withdrawn):
            early.fut.result()
        assert not m.samples and m.limiter.state.samples == 5

    run(go)


def test_a_table_remembers_only_the_latest_tickets():
    async def go():
        g = _gate(gf.MinSize(1))
        for i in range(TICKETS_KEPT + 5):
            g.request("insert", 1, "p", f"t{i}")
            g.withdraw_ticket(f"never-{i}")
        assert len(g.granted) == len(g.withdrawn) == TICKETS_KEPT
        assert "t4" not in g.granted and f"t{TICKETS_KEPT + 4}" in g.granted

    run(go)
