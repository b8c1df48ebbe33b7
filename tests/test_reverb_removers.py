"""Removers the storage respects (issue 15, point 3).

Storage is one ring per shard that overwrites its oldest steps once it has gone
round: only a Fifo remover agrees with it.  Tables refuse any other remover at
construction, say why, and a Queue or Stack never lets the ring overwrite an
item still waiting to be sampled.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import x_spec

from gear_flow import (
    CapacityError,
    Fifo,
    Lifo,
    LocalTable,
    MaxHeap,
    MinHeap,
    Prioritized,
    SpecError,
    Uniform,
)
from gear_flow.table.config import TableConfig


def values(batch) -> list[float]:
    return batch["x"].numpy()[:, 0].tolist()


def live_values(t, keys: dict) -> list[float]:
    return sorted(v for v, k in keys.items() if t.update_priorities([k], [1.0]).applied)


def one_by_one(t, vals, priorities=None):
    keys = {}
    for i, v in enumerate(vals):
        p = None if priorities is None else priorities[i]
        keys[v] = int(t.insert({"x": np.array([v], np.float32)}, priorities=p).first_keys[0])
    return keys


@pytest.mark.parametrize("remover", [Lifo, MinHeap, MaxHeap, Uniform, lambda: Prioritized(1.0)])
def test_removers_the_ring_cannot_honour_are_refused(remover, make_table):
    r = remover()
    with pytest.raises(SpecError) as e:
        make_table(x_spec(capacity=8, max_size=3), remover=r)
    msg = str(e.value)
    assert repr(r) in msg and "capacity 8" in msg and "max_size 3" in msg and "remover=Fifo()" in msg
    with pytest.raises(SpecError, match="cannot be honoured"):  # default max_size too: the remover would never run
        TableConfig.build(x_spec(capacity=8, num_shards=2), remover=remover())


def test_the_issue_min_heap_example_is_refused_not_silently_fifo():
    """MinHeap remover, max_size 3, capacity 8, item 0 at priority 100: Reverb keeps [0, 8, 9];
    a ring keeps [7, 8, 9].  We refuse the table rather than act as Fifo."""
    with pytest.raises(SpecError, match=r"MinHeap\(\)"):
        LocalTable(x_spec(capacity=8, max_size=3), remover=MinHeap())


@pytest.mark.parametrize("num_shards", [1, 2])
def test_a_long_running_fifo_table_keeps_what_the_remover_says(num_shards, make_table):
    """Many laps of every ring: what survives is the newest max_size items, in order."""
    t = make_table(x_spec(capacity=8, num_shards=num_shards, max_size=5), remover=Fifo(), sampler=Fifo(), seed=0)
    keys = one_by_one(t, [float(v) for v in range(60)])
    assert live_values(t, keys) == [55.0, 56.0, 57.0, 58.0, 59.0]
    assert values(t.sample(5)) == [55.0, 56.0, 57.0, 58.0, 59.0]
    tot = t.info()["totals"]
    assert tot["removed"] == 55 and tot["evicted"] == 0  # the remover did it, not the ring


def test_a_stack_keeps_its_bottom_item_or_refuses_the_insert():
    """A stack's bottom item waits while items are pushed and popped above it; once the ring
    would overwrite it, the insert raises (nothing applied) instead of dropping it."""
    s = LocalTable.stack(x_spec(capacity=4), 2, timeout=1)
    s.insert({"x": np.array([0.0], np.float32)})
    for v in (1.0, 2.0, 3.0):
        s.insert({"x": np.array([v], np.float32)})
        assert values(s.sample(1)) == [v]
    before = s.info()
    with pytest.raises(CapacityError, match="would overwrite 1 item"):
        s.insert({"x": np.array([4.0], np.float32)})
    after = s.info()
    assert after["rate_limiter"] == before["rate_limiter"] and after["totals"] == before["totals"]
    assert after["waiting"] == {"inserts": 0, "samples": 0}
    assert values(s.sample(1)) == [0.0]  # still there, handed out once
    s.insert({"x": np.array([4.0], np.float32)})  # the ring has room again
    assert values(s.sample(1)) == [4.0]
    assert s.info()["totals"]["evicted"] == 0


def test_a_queue_of_long_episodes_refuses_what_its_ring_cannot_hold():
    q = LocalTable.queue(x_spec(capacity=8, item_unit="episode"), 3, timeout=1)
    ep = {"x": np.zeros(3, np.float32)}
    q.insert(ep)
    q.insert(ep)
    with pytest.raises(CapacityError, match="capacity"):
        q.insert(ep)  # 9 steps in a ring of 8: the first episode would be overwritten
    assert q.size == 2 and q.info()["totals"]["evicted"] == 0
    assert len(q.sample(2)) == 2
