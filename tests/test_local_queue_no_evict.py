"""A local queue or stack never evicts to ``max_size`` (``TableConfig.evicts_to_max_size``), whatever it holds.

Its limiter bounds the items waiting and each of them is to be handed out,
so the remover's eviction that keeps other tables within ``max_size`` does
not run for it.  A :class:`~gear_flow.rate_limiters.Queue` limiter larger
than the spec's ``max_size`` takes a local table past ``max_size`` through
the public API alone: every item stays and goes out once, in order.  A
queue built by :meth:`LocalTable.queue` (limiter and ``max_size`` the same)
holds an insert beyond it back instead: it times out, and nothing stored is
lost.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import x_spec

import gear_flow as gf
from gear_flow import LocalTable

SHORT = 0.05


def one(v: float) -> dict:
    return {"x": np.array([v], np.float32)}


def values(batch) -> list[float]:
    return batch["x"].numpy().ravel().tolist()


def lossless(lifo: bool, num_shards: int) -> LocalTable:
    """A queue (stack) admitting 8 waiting items over a spec whose ``max_size`` is 4."""
    sel, lim = (gf.Lifo, gf.Stack) if lifo else (gf.Fifo, gf.Queue)
    return LocalTable(
        x_spec(capacity=16, num_shards=num_shards, max_size=4),
        sampler=sel(),
        remover=sel(),
        max_times_sampled=1,
        rate_limiter=lim(8),
        timeout=SHORT,
    )


@pytest.mark.parametrize("num_shards", [1, 2])
@pytest.mark.parametrize("lifo", [False, True], ids=["queue", "stack"])
def test_a_queue_or_stack_over_max_size_keeps_every_item_and_hands_each_out_once_in_order(lifo, num_shards):
    t = lossless(lifo, num_shards)
    assert not t.cfg.evicts_to_max_size(8)
    for v in range(8):
        t.insert(one(v))
    assert len(t) == 8 and t.info()["max_size"] == 4  # nothing evicted back to max_size
    got = values(t.sample(3)) + values(t.sample(5))
    assert got == [float(v) for v in (range(7, -1, -1) if lifo else range(8))]  # ordered, never sorted
    assert len(t) == 0
    with pytest.raises(gf.RateLimitTimeout):  # each went out once: nothing is left to hand out
        t.sample(1)


def test_the_same_table_under_a_limiter_that_allows_eviction_drops_back_to_max_size():
    """The contrast: Fifo selectors and ``max_times_sampled=1`` without a queue's limiter evict the oldest
    items beyond ``max_size`` (the rule is the limiter's kind, not the selectors)."""
    t = LocalTable(x_spec(capacity=16, max_size=4), sampler=gf.Fifo(), remover=gf.Fifo(), max_times_sampled=1)
    assert t.cfg.evicts_to_max_size(8)
    for v in range(8):
        t.insert(one(v))
    assert len(t) == 4
    assert values(t.sample(4)) == [4.0, 5.0, 6.0, 7.0]


@pytest.mark.parametrize("lifo", [False, True], ids=["queue", "stack"])
def test_an_insert_beyond_a_full_queue_times_out_and_nothing_stored_is_lost(lifo):
    spec = x_spec(capacity=16)
    t = (LocalTable.stack if lifo else LocalTable.queue)(spec, 4, timeout=SHORT)
    for v in range(4):
        t.insert(one(v))
    with pytest.raises(gf.RateLimitTimeout):
        t.insert(one(99))
    assert len(t) == 4
    first = values(t.sample(2))
    t.insert(one(4))
    t.insert(one(5))
    rest = values(t.sample(4))
    if lifo:
        assert first == [3.0, 2.0] and rest == [5.0, 4.0, 1.0, 0.0]
    else:
        assert first + rest == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert len(t) == 0
