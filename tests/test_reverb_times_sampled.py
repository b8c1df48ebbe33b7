"""``max_times_sampled`` within one batch of an ordered sampler, as Reverb, on both tables.

Reverb samples a batch item by item: an ordered selector hands its best item
out again and again until the item reaches ``max_times_sampled`` and is
removed, then the next best.  So a batch never hands an item out more often
than it may still go, each occurrence reports its own count, and the table
ends empty exactly when every item went its number of times.
"""

from __future__ import annotations

import numpy as np
import pytest

import gear_flow as gf

TAG = (gf.ColumnSpec("tag", (), np.int64),)
PRIORITIES = [1.0, 5.0, 3.0, 4.0, 2.0]  # of tags 0..4: MaxHeap order 1, 3, 2, 4, 0


@pytest.mark.parametrize(
    "sampler, batches",
    [
        (gf.Fifo, [[0, 0, 1], [1, 2, 2], [3, 3, 4, 4]]),
        (gf.Lifo, [[4, 4, 3], [3, 2, 2], [1, 1, 0, 0]]),
        (gf.MaxHeap, [[1, 1, 3], [3, 2, 2], [4, 4, 0, 0]]),
    ],
)
def test_an_ordered_batch_hands_its_best_item_out_until_it_reaches_max_times_sampled(make_table, sampler, batches):
    t = make_table(gf.TableSpec(TAG, capacity=64, num_shards=2), sampler=sampler(), max_times_sampled=2, seed=0)
    for tag, p in enumerate(PRIORITIES):  # one call each: the insertion order is the tags'
        t.insert([{"tag": np.array([tag], np.int64)}], priorities=[p])
    counts: dict[int, int] = {}
    for want in batches:
        b = t.sample(len(want))
        got = b["tag"].numpy()[:, 0].tolist()
        assert got == want
        seen = []
        for tag in got:
            counts[tag] = counts.get(tag, 0) + 1
            seen.append(counts[tag])
        assert b.times_sampled.tolist() == seen  # occurrence by occurrence, as Reverb's sample info
    assert counts == dict.fromkeys(range(5), 2)
    info = t.info()
    assert info["size"] == 0 and info["totals"]["expired"] == 5, info
