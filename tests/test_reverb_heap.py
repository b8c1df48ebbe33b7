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
