"""Selection on the ``device`` tier against the ``host`` tier: the same samples, in the same order.

Shared by tests/test_device_selection.py (the CUDA emulation, in CI) and
tests/test_gpu_selection.py (a real device).  Each test takes a ``dev`` fixture
(:class:`parity_cases.Dev`) from the importing module.  A ``device``-tier table
selects with the kernels (its trees are device arrays); a ``host``-tier one with
the numba twins; with the same seed and the same calls every batch must be
equal: keys, probabilities, importance weights, priorities, episode ids,
timesteps, masks and the gathered bytes, row by row.
"""

from __future__ import annotations

import numpy as np
import pytest

from gear_flow import (
    ColumnSpec,
    Fifo,
    Lifo,
    LocalTable,
    MaxHeap,
    MinHeap,
    Prioritized,
    TableSpec,
    Uniform,
    WithoutReplacement,
)
from gear_flow.errors import GearFlowError
from gear_flow.shard import EpisodeBatch, Shard

SELECTORS = {
    "uniform": Uniform,
    "prioritized": lambda: Prioritized(0.7, 0.5),
    "prioritized_a1": lambda: Prioritized(1.0, 1.0),
    "without_replacement": WithoutReplacement,
    "fifo": Fifo,
    "lifo": Lifo,
    "maxheap": MaxHeap,
    "minheap": MinHeap,
}


def _episodes(rng, n: int, lo: int = 3, hi: int = 30) -> list[dict]:
    eps = []
    for _ in range(n):
        T = int(rng.integers(lo, hi))
        eps.append(
            {
                "obs": rng.random((T, 3), dtype=np.float32),
                "action": rng.integers(0, 9, T),
                "done": np.arange(T) == T - 1,
            }
        )
    return eps


def _spec(item_unit: str, capacity: int = 160, num_shards: int = 2, max_size: int | None = None) -> TableSpec:
    return TableSpec(
        (ColumnSpec("obs", (3,), np.float32), ColumnSpec("action", (), np.int64), ColumnSpec("done", (), np.bool_)),
        capacity=capacity,
        num_shards=num_shards,
        item_unit=item_unit,
        max_size=max_size,
    )


def _same_batch(got, ref, what: str) -> None:
    for f in ("keys", "probabilities", "weights", "priorities", "times_sampled", "episode_ids", "timesteps", "mask"):
        np.testing.assert_array_equal(getattr(got, f).cpu().numpy(), getattr(ref, f).cpu().numpy(), f"{what}: {f}")
    for name in ("obs", "action", "done"):
        np.testing.assert_array_equal(got[name].cpu().numpy(), ref[name].cpu().numpy(), f"{what}: {name}")


def _device_trees_used(table) -> None:
    """The device table's selectors hold device trees and the kernels' ops (not numba)."""
    for s in table.shards:
        for sel in (s.sampler, s.remover):
            assert sel.ops.on_device and sel.ops.sumtree.__name__ == "gear_flow.gpu.ops.sumtree", sel
            tree = getattr(sel, "tree", None)
            if tree is not None:
                assert not isinstance(tree, np.ndarray) or type(tree) is not np.ndarray, type(tree)
                assert hasattr(tree, "get"), type(tree)


@pytest.mark.parametrize("item_unit", ["step", "episode"])
@pytest.mark.parametrize("boundary", ["strict", "pad_tail", "pad_head"])
@pytest.mark.parametrize("selector", sorted(SELECTORS))
def test_device_tier_table_matches_host_tier(dev, selector, boundary, item_unit):
    """Inserts that wrap the rings (evictions), samples, priority updates (some stale), deletes and
    max_size removals interleaved: the device tier returns the host tier's batches exactly."""
    make = SELECTORS[selector]
    max_size = 200 if item_unit == "step" else 14
    spec = _spec(item_unit, max_size=max_size)
    tables = {
        t: LocalTable(spec, sampler=make(), remover=Fifo(), tier=t, seed=11, boundary=boundary)
        for t in ("host", "device")
    }
    _device_trees_used(tables["device"])
    rng = np.random.default_rng(7)
    L = 4
    batches = 0
    for rnd in range(6):
        eps = _episodes(rng, 5)
        n_items = sum(len(e["done"]) for e in eps) if item_unit == "step" else len(eps)
        pr = None if rnd % 2 else np.round(rng.random(n_items) * 3, 1)  # None: the running max
        for t in tables.values():
            t.insert(eps, priorities=pr)
        for t in tables.values():
            assert t.size == tables["host"].size
        for _ in range(2):
            try:
                ref = tables["host"].sample(9, L)
            except GearFlowError as e:
                with pytest.raises(type(e)):
                    tables["device"].sample(9, L)
                continue
            got = tables["device"].sample(9, L)
            _same_batch(got, ref, f"{selector}/{boundary}/{item_unit} round {rnd}")
            batches += 1
            keys = ref.keys.numpy()
            pr = rng.random(len(keys)) * 4
            pr[::3] = pr[0]  # ties for the heaps
            if rnd == 3:
                pr[1] = 0.0  # a zero priority
            res = {name: t.update_priorities(keys, pr) for name, t in tables.items()}
            assert res["device"] == res["host"]
            if rnd % 2:
                res = {name: t.delete(keys[:2]) for name, t in tables.items()}
                assert res["device"] == res["host"]
        for a, b in zip(tables["host"].shards, tables["device"].shards):
            assert a.counters.as_dict() == b.counters.as_dict()
            np.testing.assert_array_equal(a.active, b.active)
            if hasattr(a.sampler, "sums"):
                assert a.sampler.mass == b.sampler.mass
                np.testing.assert_array_equal(a.sampler.tree_state(), b.sampler.tree_state())
                np.testing.assert_array_equal(b.sampler.sums.leaves, a.sampler.sums.leaves)
            if hasattr(a.sampler, "maxes"):
                np.testing.assert_array_equal(a.sampler.tree_state(), b.sampler.tree_state())
    assert batches >= 6
    gone = {k: sum(getattr(s.counters, k) for s in tables["device"].shards) for k in ("evicted", "removed", "deleted")}
    assert gone["evicted"] + gone["removed"] > 0 and gone["deleted"] > 0, gone


@pytest.mark.parametrize("selector", ["prioritized", "uniform", "without_replacement", "maxheap"])
def test_device_tier_matches_host_with_max_times_sampled_and_epochs(dev, selector):
    """Expiry after max_times_sampled and (WithoutReplacement) epochs rolling over, on both tiers."""
    spec = _spec("step", capacity=120, num_shards=3)
    tables = {
        t: LocalTable(spec, sampler=SELECTORS[selector](), tier=t, seed=5, max_times_sampled=3, boundary="strict")
        for t in ("host", "device")
    }
    rng = np.random.default_rng(3)
    eps = _episodes(rng, 12, 4, 20)
    for t in tables.values():
        t.insert(eps)
    for i in range(12):
        if tables["host"].size == 0:
            break
        B = 7 if i % 3 else 23
        try:
            ref = tables["host"].sample(B, 3)
        except GearFlowError as e:
            with pytest.raises(type(e)):
                tables["device"].sample(B, 3)
            break
        got = tables["device"].sample(B, 3)
        _same_batch(got, ref, f"{selector} batch {i}")
        assert tables["host"].size == tables["device"].size
    if selector == "without_replacement":
        assert tables["device"].shards[0].sampler.epoch == tables["host"].shards[0].sampler.epoch
        assert tables["device"].shards[0].sampler.epoch >= 1


@pytest.mark.parametrize("remover", ["uniform", "prioritized", "maxheap", "minheap", "lifo"])
def test_device_shard_removers_match_host(dev, remover):
    """Bare shards (tables accept only Fifo as remover): every remover evicts the same items."""
    spec = _spec("step", capacity=256, num_shards=1)
    shards = {t: Shard(spec, 0, Uniform(), SELECTORS[remover](), tier=t) for t in ("host", "device")}
    rng = np.random.default_rng(2)
    lengths = np.array([10, 25, 7, 40, 13])
    n = int(lengths.sum())
    batch = EpisodeBatch(
        [{"obs": rng.random((n, 3), dtype=np.float32), "action": np.arange(n), "done": np.zeros(n, bool)}],
        lengths,
        np.arange(5),
        np.concatenate(([0], np.cumsum(lengths)[:-1])),
        priorities=np.round(rng.random(n) * 5, 1),  # ties
    )
    for s in shards.values():
        s.insert(batch)
    rngs = {t: np.random.default_rng(9) for t in shards}
    for k in (5, 1, 17, 3):
        for t, s in shards.items():
            assert s.remove_by_remover(k, rngs[t]) == k
        np.testing.assert_array_equal(shards["host"].active, shards["device"].active, f"{remover} after {k}")
        seqs = np.flatnonzero(shards["host"].active)[:6]
        pr = np.round(rng.random(len(seqs)) * 5, 1)
        for s in shards.values():
            s.update_priorities(seqs, pr)
    assert shards["device"].size == n - 26


def test_device_tier_checkpoint_round_trip_keeps_the_samples(dev, tmp_path):
    """A device-tier table restored from its checkpoint samples what the original samples."""
    spec = _spec("step")
    a = LocalTable(spec, sampler=Prioritized(0.6, 0.4), tier="device", seed=1)
    rng = np.random.default_rng(4)
    a.insert(_episodes(rng, 8))
    b0 = a.sample(8, 3)
    a.update_priorities(b0.keys.cpu().numpy(), np.arange(8) + 0.5)
    a.checkpoint(tmp_path / "ck")
    b = LocalTable.restore(tmp_path / "ck", tier="device", seed=2)
    a.rng = np.random.default_rng(2)
    for s, t in zip(a.shards, b.shards):
        np.testing.assert_array_equal(s.sampler.tree_state(), t.sampler.tree_state())
        np.testing.assert_array_equal(s.sampler.sums.leaves, t.sampler.sums.leaves)
        assert s.sampler.mass == t.sampler.mass
    _same_batch(b.sample(8, 3), a.sample(8, 3), "restored")


@pytest.mark.parametrize("heap", [MaxHeap, MinHeap])
def test_device_tier_heaps_with_many_ties_match_host(dev, heap, tmp_path):
    """Ties past what a batch collects cheaply (every priority equal, then updates to the same one): once
    a batch has met them, the host tree and the device tree's host twin rank them by stamp; batch by batch
    the device tier hands out the host tier's, and a device table restored from a checkpoint builds its
    twin again from the leaves."""
    spec = _spec("step", capacity=4096, num_shards=1)
    tables = {t: LocalTable(spec, sampler=heap(), remover=Fifo(), tier=t, seed=5) for t in ("host", "device")}
    rng = np.random.default_rng(2)
    eps = _episodes(rng, 150, 10, 30)  # ~3,000 items of one priority
    for t in tables.values():
        t.insert(eps, priorities=1.0)
    for rnd in range(8):
        ref = tables["host"].sample(9, 2)
        _same_batch(tables["device"].sample(9, 2), ref, f"round {rnd}")
        keys = ref.keys.numpy()
        pr = np.where(np.arange(9) % 3 == 0, 1.0, 0.5 + rnd)  # a third back among the ties, behind them
        for t in tables.values():
            t.update_priorities(keys, pr)
        if rnd == 3:
            for t in tables.values():
                t.insert(_episodes(np.random.default_rng(rnd), 3), priorities=1.0)
    assert all(s.sampler.maxes.stamped for t in tables.values() for s in t.shards)
    tables["device"].checkpoint(tmp_path / "ck")
    restored = LocalTable.restore(tmp_path / "ck", tier="device", seed=5)
    for rnd in range(3):
        ref = tables["host"].sample(40, 1)
        _same_batch(restored.sample(40, 1), ref, f"restored, round {rnd}")
