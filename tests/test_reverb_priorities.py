"""Zero and huge priorities (issue 15, points 4 and 5)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import x_spec

from gear_flow import InvalidPriorityError, LocalTable, MaxHeap, Prioritized


def steps(n: int) -> dict:
    return {"x": np.arange(n, dtype=np.float32)}


@pytest.mark.parametrize("num_shards", [1, 2])
def test_all_zero_priorities_sample_uniformly_and_report_one_over_n(num_shards, make_table):
    t = make_table(x_spec(capacity=32, num_shards=num_shards), sampler=Prioritized(1.0, 0.5), seed=0)
    t.insert([steps(3), steps(3)], priorities=0.0)
    b = t.sample(600)
    np.testing.assert_array_equal(b.probabilities.numpy(), np.full(600, 1 / 6))
    np.testing.assert_array_equal(b.weights.numpy(), np.ones(600))
    counts = np.unique(b.keys.numpy(), return_counts=True)[1]
    assert len(counts) == 6 and counts.min() > 60  # every item drawn (expected 100 each)


def test_zero_priorities_with_strict_windows_sample_only_items_whose_window_fits(make_table):
    t = make_table(x_spec(capacity=32), sampler=Prioritized(1.0), seed=0)
    t.insert(steps(4), priorities=0.0)
    b = t.sample(50, length=3)  # only the first two steps start a window of 3
    assert set(b["x"].numpy()[:, 0].tolist()) == {0.0, 1.0}
    np.testing.assert_array_equal(b.probabilities.numpy(), np.full(50, 0.5))


def test_updates_to_zero_then_back(make_table):
    t = make_table(x_spec(capacity=32), sampler=Prioritized(1.0), seed=0)
    r = t.insert(steps(4), priorities=1.0)
    keys = int(r.first_keys[0]) + np.arange(4)
    t.update_priorities(keys, np.zeros(4))
    assert np.allclose(t.sample(8).probabilities.numpy(), 0.25)
    t.update_priorities(keys[:1], [2.0])
    b = t.sample(8)
    assert b.keys.numpy().tolist() == [keys[0]] * 8 and np.allclose(b.probabilities.numpy(), 1.0)


@pytest.mark.parametrize(
    "alpha, priorities",
    [(1.0, [1e308, 1e308, 1.0]), (2.0, [1.0, 1e200, 1.0]), (1.0, [1.0, 1e281, 0.0]), (3.0, [1e100, 1.0, 1.0])],
)
def test_priorities_whose_weight_overflows_are_rejected_at_insert(alpha, priorities):
    t = LocalTable(x_spec(capacity=32), sampler=Prioritized(alpha), seed=0)
    t.insert(steps(1), priorities=1.0)
    with pytest.raises(InvalidPriorityError, match="priority\\[1\\]|priority\\[0\\]") as e:
        t.insert(steps(3), priorities=np.array(priorities))
    assert e.value.value in priorities and "alpha" in str(e.value)
    assert t.size == 1 and t.info()["totals"]["inserted"] == 1 and t.rate_limiter.state.inserts == 1
    assert len(t.sample(4)) == 4  # sampling still works


def test_priorities_whose_weight_overflows_are_rejected_at_update():
    t = LocalTable(x_spec(capacity=32), sampler=Prioritized(2.0), seed=0)
    r = t.insert(steps(3), priorities=1.0)
    keys = int(r.first_keys[0]) + np.arange(3)
    with pytest.raises(InvalidPriorityError, match="priority\\[2\\]"):
        t.update_priorities(keys, [3.0, 3.0, 1e150])
    np.testing.assert_allclose(t.sample(30).probabilities.numpy(), 1 / 3)  # nothing applied


def test_the_largest_allowed_weights_still_sample():
    t = LocalTable(x_spec(capacity=64, num_shards=2), sampler=Prioritized(1.0), seed=0)
    t.insert([steps(20), steps(20)], priorities=1e280)
    p = t.sample(10).probabilities.numpy()
    assert np.all(np.isfinite(p)) and np.allclose(p, 1 / 40)


def test_heaps_take_any_finite_priority():
    t = LocalTable(x_spec(capacity=32), sampler=MaxHeap(), seed=0)
    t.insert(steps(3), priorities=np.array([1e308, 1e308, 1.0]))
    assert t.sample(3)["x"].numpy()[:, 0].tolist() == [0.0, 1.0, 2.0]
