"""Heap ties as in Reverb (issue 15, point 2): equal priorities come out least recently inserted
or updated first, across shards too, after updates and after the ring wrapped."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import x_spec

from gear_flow import Fifo, MaxHeap, MinHeap


def values(batch) -> list[float]:
    return batch["x"].numpy()[:, 0].tolist()


def one_by_one(t, vals, priority=1.0):
    """Insert each value as its own one-step episode, one call each; returns value -> key."""
    keys = {}
    for v in vals:
        r = t.insert({"x": np.array([v], np.float32)}, priorities=priority)
        keys[v] = int(r.first_keys[0])
    return keys


@pytest.mark.parametrize("heap", [MaxHeap, MinHeap])
@pytest.mark.parametrize("num_shards", [1, 2])
def test_equal_priorities_come_out_in_insertion_order(heap, num_shards, make_table):
    t = make_table(x_spec(capacity=16, num_shards=num_shards), sampler=heap(), remover=Fifo(), seed=0)
    one_by_one(t, [float(v) for v in range(6)])  # balanced routing alternates the shards
    assert values(t.sample(6)) == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


@pytest.mark.parametrize("num_shards", [1, 2])
def test_ties_below_better_items_also_in_insertion_order(num_shards, make_table):
    t = make_table(x_spec(capacity=16, num_shards=num_shards), sampler=MaxHeap(), remover=Fifo(), seed=0)
    for v, p in [(0, 1.0), (1, 5.0), (2, 1.0), (3, 1.0), (4, 5.0), (5, 1.0), (6, 0.5)]:
        one_by_one(t, [float(v)], p)
    assert values(t.sample(7)) == [1.0, 4.0, 0.0, 2.0, 3.0, 5.0, 6.0]
    assert values(t.sample(4)) == [1.0, 4.0, 0.0, 2.0]  # the cut falls inside the tie
    assert values(t.sample(2)) == [1.0, 4.0]  # the cut falls between two values: the tie is whole or not there
    assert values(t.sample(6)) == [1.0, 4.0, 0.0, 2.0, 3.0, 5.0]


@pytest.mark.parametrize("num_shards", [1, 2])
def test_an_update_to_the_same_priority_moves_the_item_behind_its_ties(num_shards, make_table):
    """Reverb: after an update, the item is the most recently touched one, across shards too
    (updates are stamped by the table-wide clock that stamps inserts)."""
    t = make_table(x_spec(capacity=16, num_shards=num_shards), sampler=MaxHeap(), remover=Fifo(), seed=0)
    keys = one_by_one(t, [float(v) for v in range(6)])
    assert values(t.sample(1)) == [0.0]
    t.update_priorities([keys[0.0]], [1.0])
    assert values(t.sample(1)) == [1.0]  # not the same item again
    t.update_priorities([keys[1.0], keys[3.0]], [1.0, 1.0])
    assert values(t.sample(6)) == [2.0, 4.0, 5.0, 0.0, 1.0, 3.0]


def test_an_update_moves_the_item_behind_its_ties_on_one_distributed_shard(make_table):
    t = make_table(x_spec(capacity=16, num_shards=1), sampler=MaxHeap(), remover=Fifo(), seed=0)
    keys = one_by_one(t, [float(v) for v in range(4)])
    t.update_priorities([keys[0.0]], [1.0])
    assert values(t.sample(4)) == [1.0, 2.0, 3.0, 0.0]


@pytest.mark.parametrize("num_shards", [1, 2])
def test_ties_after_the_ring_wrapped_are_still_in_insertion_order(num_shards, make_table):
    """Slots are reused once the ring wraps: the order must follow the items, not the slots."""
    t = make_table(x_spec(capacity=4, num_shards=num_shards), sampler=MaxHeap(), remover=Fifo(), seed=0)
    n = 6 * num_shards
    one_by_one(t, [float(v) for v in range(n)])
    live = 4 * num_shards
    assert values(t.sample(live)) == [float(v) for v in range(n - live, n)]


def test_min_heap_ties_with_a_lower_priority_first():
    from gear_flow import LocalTable

    t = LocalTable(x_spec(capacity=16, num_shards=2), sampler=MinHeap(), seed=0)
    for v, p in [(0, 2.0), (1, 1.0), (2, 2.0), (3, 1.0)]:
        one_by_one(t, [float(v)], p)
    assert values(t.sample(4)) == [1.0, 3.0, 0.0, 2.0]


def test_ties_by_stamp_survive_a_checkpoint_and_a_disk_reopen(tmp_path):
    """Ties many enough for the tree to rank them by stamp: a tree taken from a checkpoint or reopened from
    a disk shard's files gets its stamps again from the items' own (``touched``, mapped from the files): the
    restored and reopened tables hand out what the table that never stopped does, in order, for cuts
    through the ties, after updates that put the stamps in another order than the slots."""
    from gear_flow import LocalTable

    n = 1500
    spec = x_spec(capacity=2048, num_shards=1)
    live = LocalTable(spec, sampler=MaxHeap(), remover=Fifo(), seed=0)
    disk = LocalTable(spec, sampler=MaxHeap(), remover=Fifo(), seed=0, tier="disk", path=tmp_path / "d")
    moved = [3, 0, 1, 7, n - 1]
    for t in (live, disk):
        keys = t.insert([{"x": np.array([float(v)], np.float32)} for v in range(n)], priorities=1.0).first_keys
        t.sample(2)  # many ties: from here on the trees rank them
        t.update_priorities(np.asarray(keys)[moved], [1.0] * len(moved))  # behind their ties, in turn
        t.update_priorities([keys[5]], [2.0])
    assert live.shards[0].sampler.maxes.stamped
    live.checkpoint(tmp_path / "ckpt")
    disk.close()
    restored = LocalTable.restore(tmp_path / "ckpt", seed=0)
    reopened = LocalTable.open(tmp_path / "d", seed=0)
    want = [5.0] + [float(v) for v in range(n) if v not in moved and v != 5] + [float(v) for v in moved]
    for t in (live, restored, reopened):
        assert [values(t.sample(k)) for k in (1, 2, 6, 40, n)] == [want[:k] for k in (1, 2, 6, 40, n)]
        assert t.shards[0].sampler.maxes.stamped
        t.insert({"x": np.array([-1.0], np.float32)}, priorities=1.0)  # after the restore: the newest tie
        assert values(t.sample(n + 1)) == want + [-1.0]


@pytest.mark.parametrize("num_shards", [1, 2])
def test_many_ties_move_the_ties_into_the_tree_and_keep_the_order(num_shards, make_table):
    """Ties past what a batch can collect cheaply (all priorities equal): the first batch collects and sorts
    them, later ones take them from a tree that ranks ties by stamp, kept through later updates; every cut
    through the ties is in insertion-or-update order, as before."""
    t = make_table(x_spec(capacity=4096, num_shards=num_shards), sampler=MaxHeap(), remover=Fifo(), seed=0)
    n = 3000
    r = t.insert([{"x": np.array([float(v)], np.float32)} for v in range(n)], priorities=1.0)
    keys = np.asarray(r.first_keys)
    state = {v: (1.0, v) for v in range(n)}  # value -> (priority, stamp)

    def touch(vals, priority=1.0):
        t.update_priorities(keys[vals], [priority] * len(vals))
        for v in vals:
            state[v] = (priority, n + len(state) + touch.clock)
            touch.clock += 1

    def want(k):
        return [float(v) for v in sorted(state, key=lambda v: (-state[v][0], state[v][1]))[:k]]

    touch.clock = 0
    touch([10, 5, n - 1, 0])
    touch([7], 3.0)
    for k in (1, 4, 50, 1200):
        assert values(t.sample(k)) == want(k)
    if hasattr(t, "shards"):  # in process: the trees now rank the ties themselves
        assert all(s.sampler.maxes.stamped for s in t.shards)
    touch([20, 1, 30])
    touch([40, 41], 2.0)
    touch([40])
    for k in (1, 3, 64, n):
        assert values(t.sample(k)) == want(k)
