"""LocalTable end to end: inserts, routing, windows, priorities, deletes, expiry, output, writer."""

from __future__ import annotations

import copy
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from helpers import COLUMNS, Catalog, check_windows, episode, make_spec, reconcile, scalar_episode, x_spec

from gear_flow import (
    EpisodeWriter,
    Fifo,
    InvalidDataError,
    InvalidPriorityError,
    LocalTable,
    MinSize,
    Prioritized,
    RateLimitTimeout,
    SampleBuffers,
    SpecError,
    TableClosedError,
    Uniform,
    UnknownKeyError,
    WithoutReplacement,
)
from gear_flow.keys import decode, encode

# ---------------------------------------------------------------------------- insert


def test_insert_single_mapping():
    t = LocalTable(make_spec(), seed=0)
    r = t.insert(episode(1, 5))
    assert r.num_items == 5 and t.size == 5 and len(t) == 5
    assert r.episode_ids.tolist() == [0] and r.shards.tolist() == [0]
    assert decode(r.first_keys)[0].tolist() == [0]
    assert r.first_keys.dtype == np.int64


def test_insert_list_of_episodes_and_step_keys():
    t = LocalTable(make_spec(capacity=64), sampler=Fifo(), seed=0)
    cat = Catalog()
    r = cat.insert(t, [(1, 3), (2, 4), (3, 1)])
    assert r.num_items == 8 and r.episode_ids.tolist() == [0, 1, 2]
    # step j of episode i has key first_keys[i] + j: Fifo returns the steps in insertion order
    b = t.sample(8)
    expect = [int(r.first_keys[i]) + j for i, n in enumerate([3, 4, 1]) for j in range(n)]
    assert b.keys.numpy().tolist() == expect
    assert b["ep"].numpy()[:, 0].tolist() == [1, 1, 1, 2, 2, 2, 2, 3]
    r2 = cat.insert(t, [(4, 2)])
    assert r2.episode_ids.tolist() == [3]
    assert len(set(r.first_keys.tolist()) | set(r2.first_keys.tolist())) == 4


def test_insert_episode_items_keys():
    t = LocalTable(make_spec(capacity=64, item_unit="episode"), sampler=Fifo(), seed=0)
    r = t.insert([episode(1, 3), episode(2, 4)])
    assert r.num_items == 2 and t.size == 2
    assert (decode(r.first_keys)[1]).tolist() == [0, 1]
    b = t.sample(2, length=2)
    assert b.keys.numpy().tolist() == r.first_keys.tolist()


def test_insert_casts_to_column_dtypes():
    t = LocalTable(make_spec(), sampler=Fifo(), seed=0)
    ep = episode(1, 4)
    ep["obs"] = ep["obs"].astype(np.float64)
    ep["ep"] = ep["ep"].astype(np.int8)
    ep["t"] = ep["t"].tolist()  # lists are fine
    t.insert(ep)
    b = t.sample(4)
    assert b["obs"].dtype == torch.float32 and b["ep"].dtype == torch.int64 and b["t"].dtype == torch.int32
    assert b["t"].numpy().ravel().tolist() == [0, 1, 2, 3]


def _state(t: LocalTable):
    info = copy.deepcopy(t.info())
    return info, [s.ring.write_pos for s in t.shards], [len(s.index) for s in t.shards], t.rate_limiter.state.inserts


@pytest.mark.parametrize("num_shards", [1, 2])
def test_all_or_nothing_bad_episode(num_shards):
    t = LocalTable(make_spec(capacity=32, num_shards=num_shards), seed=0)
    t.insert([episode(1, 3), episode(2, 2)])
    before = _state(t)
    bad = episode(5, 3)
    bad["obs"] = np.zeros((3, 4), np.float32)  # wrong per-step shape
    with pytest.raises(InvalidDataError, match=r"episode 2, column 'obs'"):
        t.insert([episode(3, 4), episode(4, 2), bad, episode(6, 1)])
    assert _state(t) == before
    r = t.insert(episode(7, 2))
    assert r.episode_ids.tolist() == [2]  # no id was consumed by the failed call


# ---------------------------------------------------------------------------- routing


@pytest.mark.parametrize("routing", ["balanced", "round_robin"])
def test_routing_over_shards_never_splits(routing):
    lengths = [5, 1, 7, 3, 3, 2, 6, 4]
    t = LocalTable(make_spec(capacity=40, num_shards=3), routing=routing, seed=0)
    cat = Catalog()
    r = cat.insert(t, [(i + 1, n) for i, n in enumerate(lengths)])
    shards = r.shards
    assert set(shards.tolist()) == {0, 1, 2}
    if routing == "round_robin":
        assert shards.tolist() == [i % 3 for i in range(8)]
    else:
        load = np.bincount(shards, weights=lengths, minlength=3)
        assert load.max() - load.min() <= max(lengths)
    info = t.info()
    for s in range(3):
        on = np.array(lengths)[shards == s]
        assert info["shards"][s]["steps_stored"] == on.sum()
        assert info["shards"][s]["episodes"] == len(on)
        assert (decode(r.first_keys[shards == s])[0] == s).all()
    # every window, whatever its length, stays inside one episode
    b = t.sample(300, length=8, boundary="pad_tail")
    check_windows(b, cat, 8, "pad_tail")


def test_shard_affinity():
    t = LocalTable(make_spec(capacity=40, num_shards=3), seed=0)
    r = t.insert([episode(1, 3), episode(2, 3)], shard=2)
    assert r.shards.tolist() == [2, 2]
    assert [s["size"] for s in t.info()["shards"]] == [0, 0, 6]


# ---------------------------------------------------------------------------- windows


def _fill(t: LocalTable, cat: Catalog, lengths, rounds: int, tag0: int = 1):
    tag = tag0
    for _ in range(rounds):
        batch = []
        for n in lengths:
            batch.append((tag, n))
            tag += 1
        cat.insert(t, batch)
    return tag


def _live_episodes(t: LocalTable, cat: Catalog):
    live = {}
    for s in t.shards:
        for seq in s.index.live():
            eid = int(s.index.get("episode_id", np.array([seq]))[0])
            live[eid] = cat.by_id[eid]
    return live


@pytest.mark.parametrize("boundary", ["strict", "pad_tail", "pad_head"])
@pytest.mark.parametrize("num_shards", [1, 2])
@pytest.mark.parametrize("item_unit", ["step", "episode"])
def test_windows_are_consecutive_steps_of_one_episode(boundary, num_shards, item_unit):
    L = 4
    t = LocalTable(make_spec(capacity=23, num_shards=num_shards, item_unit=item_unit), seed=11)
    cat = Catalog()
    # mixed lengths, several rounds: the rings wrap and evict, episodes straddle the ring's end
    _fill(t, cat, [5, 1, 3, 7, 2, 4], rounds=4)
    reconcile(t)
    for _ in range(10):
        b = t.sample(64, length=L, boundary=boundary)
        check_windows(b, cat, L, boundary, item_unit)
    live = _live_episodes(t, cat)
    seen = set()
    for _ in range(40):
        b = t.sample(64, length=L, boundary=boundary)
        for eid, t0, m in zip(b.episode_ids.tolist(), b.timesteps.tolist(), b.mask.numpy()):
            seen.add((eid, t0 + int(m.sum()) - 1 if boundary == "pad_head" else t0))
    # every live item position is reachable, and nothing else
    if boundary == "strict":
        expect = {(e, s) for e, (_, n, _) in live.items() for s in range(n - L + 1)}
    else:
        expect = {(e, s) for e, (_, n, _) in live.items() for s in range(n)}
    assert seen == expect


def test_strict_excludes_short_episodes_exactly():
    """Uniform over valid items only: probabilities renormalised over the items that fit."""
    t = LocalTable(make_spec(capacity=64, num_shards=2), sampler=Uniform(), seed=3)
    cat = Catalog()
    cat.insert(t, [(1, 2), (2, 6), (3, 3), (4, 1), (5, 5)])
    L = 3
    n_valid = sum(max(n - L + 1, 0) for n in (2, 6, 3, 1, 5))  # 4 + 1 + 3 = 8
    b = t.sample(200, length=L)
    assert np.allclose(b.probabilities.numpy(), 1 / n_valid)
    check_windows(b, cat, L, "strict")
    assert set(b["ep"].numpy()[:, 0].tolist()) == {2, 3, 5}


def test_episode_items_uniform_probability():
    t = LocalTable(make_spec(capacity=64, num_shards=2, item_unit="episode"), seed=4)
    cat = Catalog()
    cat.insert(t, [(1, 2), (2, 6), (3, 3), (4, 1), (5, 5)])
    b = t.sample(100, length=3)
    assert np.allclose(b.probabilities.numpy(), 1 / 3)  # episodes of >= 3 steps: 2, 3, 5
    check_windows(b, cat, 3, "strict", "episode")
    b = t.sample(100, length=3, boundary="pad_head")
    assert np.allclose(b.probabilities.numpy(), 1 / 5)
    check_windows(b, cat, 3, "pad_head", "episode")


def test_episode_item_window_position_uniform():
    t = LocalTable(make_spec(capacity=64, item_unit="episode"), seed=5)
    cat = Catalog()
    cat.insert(t, [(1, 8)])
    b = t.sample(4000, length=3)
    counts = np.bincount(b.timesteps.numpy(), minlength=6)
    assert counts.shape == (6,)  # starts 0..5 only
    assert counts.min() > 4000 / 6 * 0.8


def test_sample_column_subset_and_length_one():
    t = LocalTable(make_spec(), sampler=Fifo(), seed=0)
    t.insert(episode(1, 3))
    b = t.sample(2, columns=["t"])
    assert set(b.data) == {"t"}
    assert tuple(b["t"].shape) == (2, 1)
    assert b["t"].numpy().ravel().tolist() == [0, 1]


def test_sample_batch_dtypes_and_shapes():
    t = LocalTable(make_spec(num_shards=2), sampler=Prioritized(0.6, 0.4), seed=0)
    t.insert([episode(1, 6), episode(2, 5)])
    B, L = 7, 3
    b = t.sample(B, length=L, boundary="pad_tail")
    assert len(b) == B and b.length == L and b.table_size == 11
    for c in COLUMNS:
        x = b[c.name]
        assert isinstance(x, torch.Tensor)
        assert tuple(x.shape) == (B, L, *c.shape)
        assert x.dtype == getattr(torch, np.dtype(c.dtype).name if c.dtype != np.bool_ else "bool")
    assert b.keys.dtype == torch.int64 and tuple(b.keys.shape) == (B,)
    assert b.probabilities.dtype == torch.float64 and tuple(b.probabilities.shape) == (B,)
    assert b.weights.dtype == torch.float32 and tuple(b.weights.shape) == (B,)
    assert b.mask.dtype == torch.bool and tuple(b.mask.shape) == (B, L)
    assert b.episode_ids.dtype == torch.int64 and b.timesteps.dtype == torch.int64
    c = b.to("cpu")
    assert torch.equal(c["obs"], b["obs"]) and torch.equal(c.keys, b.keys)


def test_out_buffers_are_reused():
    spec = make_spec(capacity=64, num_shards=2)
    t = LocalTable(spec, seed=6)
    cat = Catalog()
    cat.insert(t, [(1, 6), (2, 9), (3, 4)])
    buf = SampleBuffers(spec, spec.names, batch_size=16, length=3)
    b1 = t.sample(16, length=3, out=buf)
    check_windows(b1, cat, 3, "strict")
    ptr = {k: v.data_ptr() for k, v in b1.data.items()}
    assert ptr["obs"] == buf.arrays["obs"].ctypes.data  # zero-copy view of the buffers
    b2 = t.sample(16, length=3, out=buf)
    check_windows(b2, cat, 3, "strict")
    assert {k: v.data_ptr() for k, v in b2.data.items()} == ptr
    assert b2.keys.data_ptr() == b1.keys.data_ptr() and b2.mask.data_ptr() == b1.mask.data_ptr()
    # b1 aliases the buffers: it now shows the second batch
    assert torch.equal(b1.keys, b2.keys) and torch.equal(b1["obs"], b2["obs"])
    assert np.array_equal(buf.keys, b2.keys.numpy())
    with pytest.raises(SpecError, match="out buffers"):
        t.sample(8, length=3, out=buf)
    with pytest.raises(SpecError, match="out buffers"):
        t.sample(16, length=3, columns=["obs"], out=buf)


# ---------------------------------------------------------------------------- priorities


def _step_keys(r, lengths):
    return [int(r.first_keys[i]) + j for i, n in enumerate(lengths) for j in range(n)]


def test_insert_priority_forms():
    t = LocalTable(x_spec(capacity=64), sampler=Prioritized(1.0, 0.0), seed=0)
    r1 = t.insert(scalar_episode(2), priorities=3.0)  # one value for all
    r2 = t.insert([scalar_episode(2), scalar_episode(1)], priorities=[[1.0, 2.0], [4.0]])  # per episode
    r3 = t.insert([scalar_episode(1), scalar_episode(1)], priorities=np.array([0.5, 0.25]))  # flat
    r4 = t.insert(scalar_episode(1))  # None: the running max so far (4.0)
    pr = {}
    pr.update(zip(_step_keys(r1, [2]), [3.0, 3.0]))
    pr.update(zip(_step_keys(r2, [2, 1]), [1.0, 2.0, 4.0]))
    pr.update(zip(_step_keys(r3, [1, 1]), [0.5, 0.25]))
    pr.update(zip(_step_keys(r4, [1]), [4.0]))
    total = sum(pr.values())
    b = t.sample(300)
    assert set(b.keys.tolist()) == set(pr)
    for k, p in zip(b.keys.tolist(), b.probabilities.tolist()):
        assert p == pytest.approx(pr[k] / total, rel=1e-12)


def test_update_priorities_applied_and_duplicates_last_wins():
    t = LocalTable(x_spec(capacity=64, num_shards=2), sampler=Prioritized(1.0, 0.0), seed=0)
    r = t.insert([scalar_episode(1), scalar_episode(1), scalar_episode(1)], priorities=1.0)
    k = r.first_keys.tolist()
    res = t.update_priorities([k[0], k[1], k[0], k[2]], [5.0, 0.0, 3.0, 1.0])
    assert (res.applied, res.stale) == (4, 0)
    b = t.sample(100)
    assert set(b.keys.tolist()) <= {k[0], k[2]}
    p = dict(zip(b.keys.tolist(), b.probabilities.tolist()))
    assert p[k[0]] == pytest.approx(3 / 4) and p[k[2]] == pytest.approx(1 / 4)


def test_update_priorities_accepts_torch_keys():
    t = LocalTable(x_spec(capacity=64), sampler=Prioritized(1.0), seed=0)
    t.insert(scalar_episode(4))
    b = t.sample(3)
    res = t.update_priorities(b.keys, torch.tensor([1.0, 2.0, 3.0]))
    assert res.applied == 3


@pytest.mark.parametrize("item_unit", ["step", "episode"])
def test_stale_keys_counted_never_applied_to_newer_data(item_unit):
    cap = 8
    t = LocalTable(make_spec(capacity=cap, item_unit=item_unit), sampler=Prioritized(1.0, 0.0), seed=0)
    old = t.insert([episode(1, 4), episode(2, 4)], priorities=1.0)
    old_keys = (old.first_keys[:, None] + np.arange(4)).ravel() if item_unit == "step" else old.first_keys
    new = t.insert([episode(3, 4), episode(4, 4)], priorities=1.0)  # same slots, new generation
    assert t.info()["totals"]["evicted"] == len(old_keys)
    res = t.update_priorities(old_keys, np.full(len(old_keys), 1000.0))
    assert (res.applied, res.stale) == (0, len(old_keys))
    assert t.info()["totals"]["stale_updates"] == len(old_keys)
    b = t.sample(100)
    n_items = 8 if item_unit == "step" else 2
    assert np.allclose(b.probabilities.numpy(), 1 / n_items)  # priorities of the new data untouched
    new_keys = set(
        ((new.first_keys[:, None] + np.arange(4)).ravel() if item_unit == "step" else new.first_keys).tolist()
    )
    assert set(b.keys.tolist()) <= new_keys
    # keys of the new generation differ from the old ones even though the slots are the same
    assert not new_keys & set(old_keys.tolist())


def test_unknown_keys_raise_and_nothing_applied():
    t = LocalTable(x_spec(capacity=64, num_shards=2), sampler=Prioritized(1.0, 0.0), seed=0)
    r = t.insert([scalar_episode(2), scalar_episode(2)], priorities=1.0)
    good = int(r.first_keys[0])
    future = int(encode(0, np.array([10_000]))[0])
    for bad in (future, int(encode(5, np.array([0]))[0]), -1):
        with pytest.raises(UnknownKeyError) as e:
            t.update_priorities([good, bad], [50.0, 1.0])
        assert f"{bad:#x}" in str(e.value)
        assert e.value.key == bad
        with pytest.raises(UnknownKeyError):
            t.delete([good, bad])
    assert t.size == 4
    b = t.sample(50)
    assert np.allclose(b.probabilities.numpy(), 1 / 4)
    assert t.info()["totals"]["stale_updates"] == 0


def test_a_shards_update_with_an_unissued_seq_raises_and_writes_nothing():
    """A shard checks its seqs in the pass that writes them: one never issued, anywhere in the batch, raises
    before any item's priority, stamp or the shard's clock changes (a table's one-shard update relies on it)."""
    t = LocalTable(x_spec(capacity=64), sampler=Prioritized(1.0, 0.0), seed=0)
    t.insert([scalar_episode(4)], priorities=1.0)
    sh = t.shards[0]
    before = (sh.priority.copy(), sh.touched.copy(), sh._clock, sh.sampler.mass)
    with pytest.raises(UnknownKeyError):
        sh.update_priorities(np.array([0, 1, 4, 2]), np.array([5.0, 6.0, 7.0, 8.0]), 100)
    assert np.array_equal(sh.priority, before[0]) and np.array_equal(sh.touched, before[1])
    assert (sh._clock, sh.sampler.mass) == before[2:]
    assert sh.update_priorities(np.array([0, 3, 0]), np.array([5.0, 6.0, 7.0]), 100) == 0
    assert sh.priority[[0, 3]].tolist() == [7.0, 6.0] and sh.touched[[0, 3]].tolist() == [102, 101]
    assert sh.max_priority == 7.0 and sh._clock == 103


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), -1e-9, -3.0])
def test_invalid_priority_names_index_and_applies_nothing(bad):
    t = LocalTable(x_spec(capacity=64, num_shards=2), sampler=Prioritized(1.0, 0.0), seed=0)
    r = t.insert([scalar_episode(1) for _ in range(4)], priorities=1.0)
    with pytest.raises(InvalidPriorityError) as e:
        t.update_priorities(r.first_keys, [5.0, 7.0, bad, 2.0])
    assert e.value.index == 2
    assert "priority[2]" in str(e.value) and "nothing" in str(e.value)
    assert np.isnan(e.value.value) if np.isnan(bad) else e.value.value == bad
    b = t.sample(50)
    assert np.allclose(b.probabilities.numpy(), 1 / 4)
    with pytest.raises(InvalidPriorityError) as e:
        t.insert([scalar_episode(2), scalar_episode(2)], priorities=[[1.0, 1.0], [bad, 1.0]])
    assert e.value.index == 2
    assert t.size == 4


# ---------------------------------------------------------------------------- delete / expiry


def test_delete():
    t = LocalTable(x_spec(capacity=64, num_shards=2), seed=0)
    r = t.insert([scalar_episode(3), scalar_episode(3)])
    keys = (r.first_keys[:, None] + np.arange(3)).ravel()
    res = t.delete(keys[[0, 4, 4]])
    assert (res.applied, res.stale) == (2, 0)
    assert t.size == 4
    res = t.delete(keys[[0, 1]])
    assert (res.applied, res.stale) == (1, 1)
    left = set(keys.tolist()) - {keys[0], keys[1], keys[4]}
    b = t.sample(200)
    assert set(b.keys.tolist()) == left
    tot = reconcile(t)
    assert tot["deleted"] == 3 and tot["stale_deletes"] == 1
    assert t.rate_limiter.state.deletes == 3


def test_max_times_sampled_expiry():
    m = 2
    t = LocalTable(x_spec(capacity=64, num_shards=2), max_times_sampled=m, seed=0)
    r = t.insert([scalar_episode(5), scalar_episode(5)])
    count = {}
    gone = set()
    for _ in range(100):
        if t.size == 0:
            break
        b = t.sample(min(3, 10 * m - sum(count.values())), timeout=1)  # (a batch larger than what is left waits)
        keys = b.keys.tolist()
        assert not gone & set(keys), "an expired item was sampled"
        for k in keys:
            count[k] = count.get(k, 0) + 1
        gone |= {k for k, c in count.items() if c >= m}
        assert t.size == 10 - len(gone)
    assert len(gone) == 10 and t.size == 0
    with pytest.raises(RateLimitTimeout):  # drained: below MinSize(1), sampling waits
        t.sample(1, timeout=0.01)
    tot = reconcile(t)
    assert tot["expired"] == 10
    assert set(count) == set((r.first_keys[:, None] + np.arange(5)).ravel().tolist())


def test_max_times_sampled_fifo_each_item_exactly_m_times():
    """As Reverb, which samples a batch item by item: the oldest item comes again until it is removed."""
    t = LocalTable(x_spec(capacity=64), sampler=Fifo(), max_times_sampled=3, seed=0)
    t.insert(scalar_episode(4))
    vals = []
    for _ in range(6):
        vals += t.sample(2)["x"].numpy().ravel().tolist()
    assert vals == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert t.size == 0


# ---------------------------------------------------------------------------- eviction and info


def test_ring_eviction_counts_whole_episodes():
    t = LocalTable(make_spec(capacity=10), seed=0)
    t.insert([episode(1, 4), episode(2, 4)])
    t.insert(episode(3, 3))  # needs 1 step of episode 1's space: the whole episode goes
    info = t.info()
    assert info["totals"]["evicted"] == 4 and t.size == 7
    assert info["shards"][0]["episodes"] == 2 and info["shards"][0]["steps_stored"] == 7
    t.insert(episode(4, 10))  # a full-capacity episode evicts everything else
    assert t.size == 10 and t.info()["totals"]["evicted"] == 11
    reconcile(t)


def test_info_counters():
    t = LocalTable(
        make_spec(capacity=16, num_shards=2, max_size=10), sampler=Prioritized(1.0), seed=0, rate_limiter=MinSize(2)
    )
    r = t.insert([episode(1, 4), episode(2, 4), episode(3, 4)])
    t.sample(5)
    t.update_priorities(r.first_keys, [1.0, 2.0, 3.0])
    info = t.info()
    tot = info["totals"]
    assert info["size"] == 10 and info["max_size"] == 10 and info["num_shards"] == 2
    assert info["item_unit"] == "step" and info["sampler"].startswith("Prioritized")
    assert info["remover"] == "Fifo()"
    assert tot["inserted"] == 12 and tot["inserted_steps"] == 12 and tot["inserted_episodes"] == 3
    assert tot["removed"] == 2 and tot["sampled"] == 5
    assert info["rate_limiter"]["inserts"] == 12 and info["rate_limiter"]["samples"] == 5
    assert info["rate_limiter"]["kind"] == "MinSize" and info["rate_limiter"]["max_diff"] is None
    assert [s["shard"] for s in info["shards"]] == [0, 1]
    reconcile(t)
    nb = t.nbytes()
    assert nb["data"] == 2 * 16 * make_spec().step_nbytes and nb["overhead"] > 0


# ---------------------------------------------------------------------------- writer


def test_writer_append_end_episode():
    t = LocalTable(make_spec(capacity=64, num_shards=2), seed=0)
    cat = Catalog()
    w = t.writer()
    assert isinstance(w, EpisodeWriter)
    ep = episode(1, 5)
    for i in range(5):
        w.append({k: v[i] for k, v in ep.items()})
        assert w.pending == i + 1
        assert t.size == 0  # nothing sampleable before end_episode
    res = w.end_episode()
    assert t.size == 5 and w.pending == 0
    cat.by_id[int(res.episode_ids[0])] = (1, 5, int(res.first_keys[0]))
    check_windows(t.sample(20, length=5), cat, 5, "strict")
    assert w.ended == [(int(res.episode_ids[0]), 5, False)]
    assert w.end_episode() is None  # nothing pending


def test_writer_grows_buffer_and_priorities():
    t = LocalTable(x_spec(capacity=256), sampler=Prioritized(1.0, 0.0), seed=0)
    w = t.writer()
    for i in range(150):  # past the initial 64-step buffer
        w.append({"x": np.float32(i)}, priority=None if i < 100 else 2.0)
    r = w.end_episode()
    assert t.size == 150
    b = t.sample(300)
    k0 = int(r.first_keys[0])
    for k, p, x in zip(b.keys.tolist(), b.probabilities.tolist(), b["x"].numpy().ravel().tolist()):
        assert x == k - k0
        # steps without a priority get the episode's max given priority (2.0): all equal here
        assert p == pytest.approx(1 / 150)


def test_writer_max_episode_length_truncates():
    t = LocalTable(make_spec(capacity=64), sampler=Fifo(), seed=0)
    w = t.writer(max_episode_length=4)
    ep = episode(1, 10)
    for i in range(10):
        w.append({k: v[i] for k, v in ep.items()})
    assert [n for _, n, _ in w.ended] == [4, 4] and all(tr for _, _, tr in w.ended)
    assert t.size == 8 and w.pending == 2
    w.close()
    assert t.size == 10 and w.ended[-1][1:] == (2, True)  # cut by the close, as a VectorWriter's
    assert t.info()["totals"]["inserted_episodes"] == 3
    with pytest.raises(TableClosedError):
        w.append({k: v[0] for k, v in ep.items()})


def test_writer_context_manager():
    t = LocalTable(x_spec(capacity=64), seed=0)
    with t.writer() as w:
        w.append({"x": np.float32(1)})
        w.append({"x": np.float32(2)})
    assert t.size == 2  # clean exit ends the episode
    with pytest.raises(RuntimeError, match="boom"):
        with t.writer() as w:
            w.append({"x": np.float32(3)})
            raise RuntimeError("boom")
    assert t.size == 2  # exception: buffered steps discarded
    with pytest.raises(TableClosedError):
        w.append({"x": np.float32(4)})


def test_writer_rejects_bad_steps_without_appending():
    t = LocalTable(make_spec(capacity=64), seed=0)
    w = t.writer()
    good = {k: v[0] for k, v in episode(1, 1).items()}
    w.append(good)
    with pytest.raises(InvalidDataError):
        w.append({**good, "obs": np.zeros(4, np.float32)})
    with pytest.raises(InvalidDataError):
        w.append({k: v for k, v in good.items() if k != "t"})
    with pytest.raises(InvalidDataError):
        w.append({**good, "t": np.float64(1.5)})
    with pytest.raises(InvalidPriorityError):
        w.append(good, priority=float("nan"))
    assert w.pending == 1
    with pytest.raises(SpecError):
        t.writer(max_episode_length=0)


def test_writer_episode_items_and_shard():
    t = LocalTable(make_spec(capacity=64, num_shards=2, item_unit="episode"), sampler=Prioritized(1.0), seed=0)
    w = EpisodeWriter(t, shard=1)
    for i, p in enumerate([1.0, 5.0, 2.0]):
        w.append({k: v[i] for k, v in episode(1, 3).items()}, priority=p)
    r = w.end_episode()
    assert r.shards.tolist() == [1] and t.size == 1
    assert t.shards[1].priority[0] == 5.0  # an episode item gets the max of its steps' priorities


def test_writer_retries_after_timeout():
    t = LocalTable.queue(x_spec(capacity=64), 2, seed=0)
    t.insert({"x": np.zeros(2, np.float32)})
    w = t.writer(timeout=0.05)
    w.append({"x": np.float32(7)})
    with pytest.raises(RateLimitTimeout):
        w.end_episode()
    assert w.pending == 1  # kept for a retry
    t.sample(2)
    w.end_episode()
    assert t.sample(1)["x"].item() == 7.0


def test_writer_failed_automatic_end_never_exceeds_max_length():
    t = LocalTable.queue(x_spec(capacity=64), 8, seed=0)
    t.insert({"x": np.zeros(6, np.float32)})
    w = t.writer(max_episode_length=3, timeout=0.02)
    w.append({"x": np.float32(1)})
    w.append({"x": np.float32(2)})
    with pytest.raises(RateLimitTimeout):
        w.append({"x": np.float32(3)})  # completes the episode; 6 + 3 > 8: the automatic end waits
    assert w.pending == 3  # the step was appended, the episode kept
    with pytest.raises(RateLimitTimeout):
        w.append({"x": np.float32(4)})  # retries the pending episode first and appends nothing
    assert w.pending == 3
    t.sample(2)  # room for 3 more
    w.append({"x": np.float32(4)})
    assert [n for _, n, _ in w.ended] == [3] and w.ended[0][2] is True
    assert w.pending == 1
    t.sample(4)
    assert t.sample(3)["x"].numpy().ravel().tolist() == [1.0, 2.0, 3.0]


def test_without_replacement_table_sample_probability_counts_all_shards():
    t = LocalTable(x_spec(capacity=64, num_shards=2), sampler=WithoutReplacement(), seed=0)
    t.insert([scalar_episode(3), scalar_episode(5)])
    b = t.sample(4)
    assert np.allclose(b.probabilities.numpy(), 1 / 8)


def test_closing_a_shared_tier_table_unlinks_its_segments():
    """LocalTable(tier="shared").close() left every segment in /dev/shm: 20 create/close cycles of a
    10,000 x 256 float32 table kept about 195 MiB of tmpfs until the process exited.  The close unlinks them;
    the table refuses its calls as any closed table."""
    import os

    from gear_flow import ColumnSpec, TableSpec

    def mine():
        return {n for n in os.listdir("/dev/shm") if n.startswith(f"gf_{os.getpid()}_")}

    before = mine()
    spec = TableSpec((ColumnSpec("obs", (256,), np.float32),), capacity=10_000, num_shards=2)
    for _ in range(3):
        with LocalTable(spec, tier="shared", seed=0) as t:
            t.insert([{"obs": np.ones((10, 256), np.float32)}])
            assert len(mine() - before) >= 2  # the two shards' rings, at least
            assert t.sample(4, 1)["obs"].numpy().sum() == 4 * 256
        assert mine() == before
        with pytest.raises(TableClosedError):
            t.sample(1)


def test_a_shared_tier_table_closed_under_its_readers_keeps_their_memory_mapped():
    """LocalTable(tier="shared").close() unmapped the rings and selection arrays at once, while the table's
    arrays still pointed at them: info() after close() crashed the process (SIGSEGV), and so did most calls
    racing a close (a Stream consuming while another thread closed the table).  The close unlinks the
    segments; their memory stays mapped until the arrays over it are gone.  (In a process of its own: the
    failure is a crash.)"""
    code = """
import numpy as np, gear_flow as gf
spec = gf.TableSpec((gf.ColumnSpec("x", (4,), np.float32),), capacity=64)
t = gf.LocalTable(spec, tier="shared")
t.insert({"x": np.ones((10, 4), np.float32)})
held = t.shards[0].step_episode  # what a call racing the close reads
t.close()
print(t.info()["size"], len(held.tolist()))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.split() == ["10", "64"], (r.returncode, r.stdout, r.stderr[-2000:])


def test_a_shared_tier_table_not_closed_unlinks_its_segments_when_dropped_or_at_exit():
    """A shared-tier table never closed kept its segments until the process exited, and there Python's resource
    tracker unlinked them with a warning ("There appear to be 4 leaked shared_memory objects"): a script's table
    that ends with the script warned a user who did nothing wrong.  A table dropped unlinks its segments then,
    one left at exit then, silently; a child forked from its process that exits normally (running the finalizers
    it inherited) leaves them to the parent, whose table still reads them.  (In a process of its own: what is
    asserted is what happens at its exit.)"""
    code = """
import os, sys, numpy as np, gear_flow as gf
def mine():
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(f"gf_{os.getpid()}_"))
spec = gf.TableSpec((gf.ColumnSpec("x", (4,), np.float32),), capacity=64)
t = gf.LocalTable(spec, tier="shared")
t.insert({"x": np.ones((10, 4), np.float32)})
made = mine()
dropped = gf.LocalTable(spec, tier="shared")
more = sorted(set(mine()) - set(made))
del dropped
print("dropped", len(more) > 0, sorted(set(mine()) & set(more)) == [])
if os.fork() == 0:
    sys.exit(0)  # a normal exit: the inherited finalizers run
os.wait()
print("after child", mine() == made, float(t.sample(4)["x"].numpy().sum()))
print("left", made[0])
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (r.stdout, r.stderr[-2000:])
    lines = r.stdout.split("\n")
    assert lines[:2] == ["dropped True True", "after child True 16.0"], r.stdout
    assert "leaked" not in r.stderr and "resource_tracker" not in r.stderr, r.stderr[-2000:]
    assert not os.path.exists("/dev/shm/" + lines[2].split()[1])  # unlinked at the exit


@pytest.mark.parametrize("tier", ["host", "shared", "disk"])
@pytest.mark.parametrize("sampler", [Prioritized(), Uniform(), Fifo(), WithoutReplacement()])
def test_a_table_let_go_of_is_freed_without_the_cyclic_gc(tmp_path, tier, sampler):
    """Every shard was in reference cycles (its selectors, its tail masses, its published state and its files
    held it back): a closed table nobody referenced kept its rings' memory, and a disk table its files open
    and mapped, until a pass of Python's cyclic GC, which large arrays do not prompt.  With the cyclic GC off,
    the last reference gone frees the shards."""
    import gc
    import weakref

    kw = {"path": tmp_path / "t"} if tier == "disk" else {}
    gc.collect()
    gc.disable()
    try:
        t = LocalTable(make_spec(capacity=64, num_shards=2), sampler=sampler.clone(), tier=tier, seed=0, **kw)
        t.insert([episode(k + 1, 5) for k in range(4)])
        t.sample(4, 2)
        shards = [weakref.ref(s) for s in t.shards]
        t.close()
        del t
        assert [s() for s in shards] == [None, None]
    finally:
        gc.enable()
