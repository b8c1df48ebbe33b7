"""Collection into the GPU tiers: many episodes per insert, from host or device memory.

An insert writes each column once (the episodes batched: concatenated on the
device, or staged through page-locked memory), and trajectories an actor made
on the GPU (CuPy arrays) go into a ``device`` ring without leaving the device.
Checked against the host tier, in order, under the CUDA emulation here and on
a GPU when there is one.
"""

from __future__ import annotations

import numpy as np
import pytest
from cuda_emu import fixtures

from gear_flow import ColumnSpec, LocalTable, Prioritized, TableSpec
from gear_flow.errors import InvalidDataError

emulated = fixtures.emulated


@pytest.fixture(params=["emulated", pytest.param("cuda", marks=pytest.mark.gpu)])
def cp(request):
    """The emulation's fake CuPy (``cuda_emu.fixtures.emulated``), or CuPy on a GPU."""
    if request.param == "emulated":
        return request.getfixturevalue("emulated")
    return pytest.importorskip("cupy")


SPEC = TableSpec((ColumnSpec("obs", (3,), np.float32), ColumnSpec("a", (), np.int64)), capacity=50)


def _rounds(seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for lengths in ([7, 1, 12, 5, 9], [13, 2, 4], [11, 8, 6, 3]):  # 81 steps: the ring of 50 wraps
        out.append(
            [{"obs": rng.standard_normal((t, 3)).astype(np.float32), "a": rng.integers(0, 100, t)} for t in lengths]
        )
    return out


def _host(cp, a):
    return a if isinstance(a, np.ndarray) else cp.asnumpy(a)


@pytest.mark.parametrize("tier", ["device", "pinned"])
@pytest.mark.parametrize("source", ["host", "device"])
def test_batched_inserts_store_and_sample_like_the_host_tier(cp, tier, source):
    ref, gpu = LocalTable(SPEC, seed=3), LocalTable(SPEC, tier=tier, seed=3)
    for batch in _rounds():
        ref.insert(batch)
        gpu.insert([{k: cp.asarray(v) for k, v in e.items()} for e in batch] if source == "device" else batch)
    for name in SPEC.names:  # every slot was written (81 steps into 50)
        assert np.array_equal(_host(cp, gpu.shards[0].ring.columns[name]), ref.shards[0].ring.columns[name]), name
    a, b = ref.sample(16, 4), gpu.sample(16, 4)
    assert a.keys.tolist() == b.keys.tolist()
    for name in SPEC.names:
        assert np.array_equal(b[name].cpu().numpy(), a[name].numpy()), name


def test_a_bad_device_episode_applies_nothing(cp):
    t = LocalTable(SPEC, tier="device", seed=0)
    good = {"obs": cp.asarray(np.ones((4, 3), np.float32)), "a": cp.asarray(np.arange(4))}
    bad = {"obs": cp.asarray(np.ones((4, 2), np.float32)), "a": cp.asarray(np.arange(4))}
    with pytest.raises(InvalidDataError, match=r"episode 1, column 'obs': shape \(4, 2\)"):
        t.insert([good, bad])
    assert t.size == 0 and t.shards[0].ring.write_pos == 0


def test_priorities_and_keys_from_the_learners_device(cp):
    """A learner computes new priorities (and holds the keys) on its GPU: accepted as they are."""
    t = LocalTable(SPEC, tier="device", seed=0, sampler=Prioritized(1.0, 0.4))
    t.insert(_rounds()[0])
    b = t.sample(8, 1)
    keys = cp.asarray(b.keys.numpy())
    res = t.update_priorities(keys, cp.asarray(np.full(8, 3.0)))
    assert res.applied == len(np.unique(b.keys.numpy()))
    after = t.sample(64, 1)
    got = dict(zip(after.keys.numpy().tolist(), after.priorities.numpy().tolist()))
    assert all(got[k] == 3.0 for k in b.keys.numpy().tolist() if k in got)
    with pytest.raises(InvalidDataError, match="keys must be integers"):
        t.update_priorities(cp.asarray(np.ones(2)), [1.0, 1.0])


SPEC2 = TableSpec((ColumnSpec("obs", (3,), np.float32), ColumnSpec("a", (), np.int64)), capacity=40, num_shards=2)


@pytest.mark.parametrize("tier", ["host", "device", "pinned"])
@pytest.mark.parametrize("source", ["host", "device"])
@pytest.mark.parametrize("unit", ["step", "episode"])
def test_insert_batch_is_insert_of_its_rows(cp, tier, source, unit):
    """``insert_batch`` of [B, T] arrays stores and samples exactly what ``insert`` of the B rows does
    (two shards: each gets every other row, so its rows are not one contiguous run)."""
    spec = TableSpec(SPEC2.columns, SPEC2.capacity, SPEC2.num_shards, unit)
    rng = np.random.default_rng(4)
    ref, t = LocalTable(spec, seed=9, tier=tier), LocalTable(spec, seed=9, tier=tier)
    for B, T in ((5, 6), (3, 9), (6, 4)):  # 3 batches: both rings wrap
        obs = rng.standard_normal((B, T, 3)).astype(np.float32)
        a = rng.integers(0, 1000, (B, T))
        n = B * T if unit == "step" else B
        pr = rng.random(n) + 0.1
        r1 = ref.insert([{"obs": obs[b], "a": a[b]} for b in range(B)], priorities=pr)
        cols = {"obs": cp.asarray(obs), "a": cp.asarray(a)} if source == "device" else {"obs": obs, "a": a}
        r2 = t.insert_batch(cols, priorities=pr)
        assert r1.first_keys.tolist() == r2.first_keys.tolist() and r1.shards.tolist() == r2.shards.tolist()
    for s1, s2 in zip(ref.shards, t.shards):
        assert s1.ring.write_pos == s2.ring.write_pos
        w = min(s1.ring.write_pos, s1.capacity)  # the slots written so far
        for name in spec.names:
            assert np.array_equal(_host(cp, s1.ring.columns[name])[:w], _host(cp, s2.ring.columns[name])[:w]), name
    x, y = ref.sample(10, 3), t.sample(10, 3)
    assert x.keys.tolist() == y.keys.tolist() and x.probabilities.tolist() == y.probabilities.tolist()
    for name in spec.names:
        assert np.array_equal(x[name].cpu().numpy(), y[name].cpu().numpy()), name


def test_insert_batch_refuses_bad_input_whole(cp):
    t = LocalTable(SPEC2, tier="device", seed=0)
    ok = {"obs": np.zeros((2, 5, 3), np.float32), "a": np.zeros((2, 5), np.int64)}
    for bad, msg in (
        ({**ok, "a": np.zeros((2, 4), np.int64)}, r"columns have different \(B, T\)"),
        ({**ok, "obs": np.zeros((2, 5, 4), np.float32)}, r"batch column 'obs': shape \(2, 5, 4\) must be \(B, T, 3\)"),
        ({"obs": ok["obs"]}, r"missing \['a'\]"),
        ({**ok, "obs": np.zeros((0, 5, 3), np.float32), "a": np.zeros((0, 5), np.int64)}, "at least one trajectory"),
    ):
        with pytest.raises(InvalidDataError, match=msg):
            t.insert_batch(bad)
    with pytest.raises(InvalidDataError, match="got 3 priorities for 10 items"):
        t.insert_batch(ok, priorities=np.ones(3))
    assert t.size == 0 and all(s.ring.write_pos == 0 for s in t.shards)
