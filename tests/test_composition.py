"""Every sampler x remover x limiter pairing (TorchRL's test_composable style), on small tables,
local and distributed (two shards on two worker processes).

Each pairing goes through inserts past capacity and max_size, samples, priority
updates (some stale) and deletes, checking after every step that sampled
windows are real, the table never exceeds max_size, and the accounting
``inserted == size + evicted + removed + deleted + expired`` holds.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from helpers import Catalog, check_windows, make_spec, reconcile

from gear_flow import (
    Fifo,
    Lifo,
    MaxHeap,
    MinHeap,
    MinSize,
    Prioritized,
    SampleToInsertRatio,
    Uniform,
    WithoutReplacement,
)
from gear_flow.keys import decode

SAMPLERS = {
    "uniform": Uniform,
    "prioritized": lambda: Prioritized(0.8, 0.5),
    "fifo": Fifo,
    "lifo": Lifo,
    "max_heap": MaxHeap,
    "min_heap": MinHeap,
    "without_replacement": WithoutReplacement,
}
# the only remover ring storage can honour; the others are refused at construction
# (tests/test_reverb_removers.py) and their eviction rules are tested on bare shards
# (tests/test_selectors.py)
REMOVERS = {"fifo": Fifo}
LIMITERS = {
    "min_size": lambda: MinSize(1),
    "ratio": lambda: SampleToInsertRatio(samples_per_insert=2.0, min_size_to_sample=2, error_buffer=10_000.0),
}
UNITS = {"step": 0, "episode": 3}  # item unit -> max_times_sampled used with it


@pytest.mark.parametrize("unit", list(UNITS))
@pytest.mark.parametrize("limiter", list(LIMITERS))
@pytest.mark.parametrize("remover", list(REMOVERS))
@pytest.mark.parametrize("sampler", list(SAMPLERS))
def test_composition(sampler, remover, limiter, unit, make_table):
    rng = np.random.default_rng(zlib.crc32(f"{sampler}-{remover}-{limiter}-{unit}".encode()))
    cap, shards = 16, 2
    max_size = 12 if unit == "step" else 5
    mts = UNITS[unit]
    t = make_table(
        make_spec(capacity=cap, num_shards=shards, item_unit=unit, max_size=max_size),
        sampler=SAMPLERS[sampler](),
        remover=REMOVERS[remover](),
        rate_limiter=LIMITERS[limiter](),
        max_times_sampled=mts,
        timeout=5,
        seed=int(rng.integers(1 << 31)),
    )
    cat = Catalog()
    tag = 1
    all_keys: set[int] = set()
    L = 2
    for rnd in range(6):
        batch = []
        for n in rng.integers(2, 6, 3):
            batch.append((tag, int(n)))
            tag += 1
        pr = None if rnd % 2 else rng.random(sum(n for _, n in batch) if unit == "step" else len(batch)) * 4
        r = cat.insert(t, batch, priorities=pr)
        all_keys |= set(r.first_keys.tolist())
        assert t.size <= max_size
        reconcile(t)
        if t.size == 0:
            continue
        boundary = ("strict", "pad_tail", "pad_head")[rnd % 3]
        b = t.sample(5, length=L, boundary=boundary, timeout=5)
        check_windows(b, cat, L, boundary, unit)
        p = b.probabilities.numpy()
        assert np.all((p > 0) & (p <= 1))
        w = b.weights.numpy()
        assert np.all((w > 0) & (w <= 1)) and w.max() == pytest.approx(1.0)
        keys = b.keys.numpy()
        assert set(decode(keys)[0].tolist()) <= set(range(shards))
        # new priorities for what was sampled; keys may have expired in the meantime (stale)
        res = t.update_priorities(keys, rng.random(len(keys)) * 3)
        assert res.applied + res.stale == len(keys)
        if rnd == 3:
            res = t.delete(keys[:2])
            assert res.applied + res.stale == len(keys[:2]) or keys[0] == keys[1]
        reconcile(t)
    tot = reconcile(t)
    assert tot["inserted"] == (tot["inserted_steps"] if unit == "step" else tot["inserted_episodes"])
    assert all(sh["write_pos"] > cap for sh in t.info()["shards"])  # both rings wrapped
    info = t.info()
    assert info["rate_limiter"]["inserts"] == tot["inserted"]
    assert info["rate_limiter"]["samples"] == tot["sampled"]
