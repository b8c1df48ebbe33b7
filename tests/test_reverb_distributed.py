"""Reverb semantics that the distributed table must keep as the local one does (issue: Reverb's semantics)."""

from __future__ import annotations

import numpy as np
import pytest
from dist_support import assert_same, snapshot

import gear_flow as gf
from gear_flow.distributed import DistributedTable

pytestmark = pytest.mark.timeout(120)

X = (gf.ColumnSpec("x", (), np.float32),)


def xs(n):
    return [{"x": np.array([float(i)], np.float32)} for i in range(n)]


def test_unrepresentable_priorities_are_refused_before_anything_is_sent(dist_client):
    t = DistributedTable.create(dist_client, gf.TableSpec(X, capacity=16, num_shards=2), sampler=gf.Prioritized(1.0))
    try:
        keys = t.insert(xs(3)).first_keys
        before = snapshot(t)
        with pytest.raises(gf.InvalidPriorityError):
            t.insert(xs(3), priorities=[1e308, 1e308, 1.0])
        with pytest.raises(gf.InvalidPriorityError):
            t.update_priorities(keys, [1e300, 1.0, 1.0])
        assert_same(before, snapshot(t))
    finally:
        t.close()


def test_a_queue_never_lets_the_ring_overwrite_a_waiting_item(dist_client):
    t = DistributedTable.queue(dist_client, gf.TableSpec(X, capacity=4, num_shards=2), 16, timeout=5)
    try:
        t.insert(xs(3), shard=0)
        before = snapshot(t)
        with pytest.raises(gf.CapacityError, match="never handed out"):
            t.insert(xs(3), shard=0)  # would wrap shard 0's ring over two waiting items
        assert_same(before, snapshot(t))
        assert t.sample(3)["x"].numpy()[:, 0].tolist() == [0.0, 1.0, 2.0]
    finally:
        t.close()
