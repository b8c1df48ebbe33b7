"""Every selector, as sampler and as remover, through a Shard or a LocalTable."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import scalar_episode, x_spec

from gear_flow import (
    Fifo,
    Lifo,
    LocalTable,
    MaxHeap,
    MinHeap,
    MinSize,
    Prioritized,
    SampleToInsertRatio,
    SpecError,
    Uniform,
    WithoutReplacement,
)
from gear_flow.keys import decode
from gear_flow.selectors import REGISTRY
from gear_flow.shard import EpisodeBatch, Shard
from gear_flow.table.executor import evict_shards


def _single_steps(table, values, priorities=None, **kw):
    """Insert each value as its own one-step episode; returns key -> value."""
    res = table.insert([{"x": np.array([v], np.float32)} for v in values], priorities, **kw)
    return {int(k): float(v) for k, v in zip(res.first_keys, values)}


def _keys_values(batch):
    return batch.keys.numpy().tolist(), batch["x"].numpy()[:, 0].tolist()


# ---------------------------------------------------------------------------- registry / basics


def test_registry_names_map_to_classes():
    assert REGISTRY["uniform"] is Uniform and REGISTRY["without_replacement"] is WithoutReplacement
    for cls in REGISTRY.values():
        s = cls()
        assert repr(s).startswith(cls.__name__)
        c = s.clone()
        assert type(c) is cls and c is not s and c.params() == s.params()


@pytest.mark.parametrize(
    "kw", [{"alpha": -0.1}, {"alpha": float("inf")}, {"alpha": "1"}, {"beta": -0.01}, {"beta": 1.5}, {"beta": "x"}]
)
def test_prioritized_params_validated(kw):
    with pytest.raises(SpecError):
        Prioritized(**kw)


# ---------------------------------------------------------------------------- Shard level


def _shard(sampler, remover=None, capacity=16, item_unit="step"):
    spec = x_spec(capacity=capacity, item_unit=item_unit)
    return Shard(spec, 3, sampler, remover or Fifo())


def _batch(lengths, stamps_from=0, priorities=None):
    lengths = np.asarray(lengths, dtype=np.int64)
    chunks = [scalar_episode(int(n), 100 * i) for i, n in enumerate(lengths)]
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    return EpisodeBatch(chunks, lengths, np.arange(len(lengths)), stamps_from + starts, priorities)


def test_shard_prioritized_draw_probabilities():
    sh = _shard(Prioritized(alpha=0.5))
    pr = np.array([4.0, 0.0, 1.0, 9.0, 16.0])
    keys, n = sh.insert(_batch([5], priorities=pr))
    assert n == 5 and sh.size == 5
    w = np.sqrt(pr)
    rng = np.random.default_rng(0)
    slots, q = sh.draw(4000, 1, "strict", rng)
    assert np.allclose(q, w[slots] / w.sum())
    assert not np.any(slots == 1)  # zero priority never drawn
    freq = np.bincount(slots, minlength=5) / 4000
    assert np.allclose(freq, w / w.sum(), atol=0.03)


def test_shard_ordered_candidates():
    sh = _shard(MaxHeap(), capacity=8)
    sh.insert(_batch([3, 3], priorities=np.array([5.0, 1.0, 7.0, 7.0, 0.5, 2.0])))
    slots, keys = sh.candidates(4, 1, "strict")
    assert slots.tolist() == [2, 3, 0, 5]
    assert keys[:, 0].tolist() == [7.0, 7.0, 5.0, 2.0]
    assert keys[:, 1].tolist() == [-2.0, -3.0, -0.0, -5.0]  # tie-break: the negated insert stamp
    # strict length 2: the last step of each episode is not a valid window start
    slots, _ = sh.candidates(10, 2, "strict")
    assert slots.tolist() == [3, 0, 1, 4]  # priorities 7, 5, 1, 0.5


def test_shard_keys_carry_shard_id():
    sh = _shard(Uniform())
    keys, _ = sh.insert(_batch([2, 3]))
    assert (keys >> 56).tolist() == [3, 3]
    assert (keys & ((1 << 56) - 1)).tolist() == [0, 2]


@pytest.mark.parametrize("item_unit", ["step", "episode"])
@pytest.mark.parametrize("capacity", [16, 13])
def test_uniform_draw_by_arithmetic_is_the_trees_descent(item_unit, capacity):
    """A hole-free ring is drawn by arithmetic; the slots equal the tree's inverse CDF, wrap or not, edges included."""
    sel = Uniform()
    sh = _shard(sel, capacity=capacity, item_unit=item_unit)
    rng = np.random.default_rng(7)
    arithmetic, wrapped = 0, 0
    for round_ in range(120):
        lengths = rng.integers(1, 4, size=int(rng.integers(1, 3)))
        if item_unit == "episode":
            lengths = lengths[: max(1, capacity - sh.size)]
        sh.insert(_batch(lengths, stamps_from=10 * round_))
        if round_ % 17 == 16:  # holes: the tree's descent answers, and must still agree
            lo, hi = sh.live_seq_range()
            sh.delete(np.array([lo + (hi - lo) // 2]))
        lo, hi = sh.live_seq_range()
        n = hi - lo
        if sel.mass <= 0:
            continue
        arithmetic += sel.mass == n
        wrapped += sel.mass == n and lo % capacity + n > capacity
        m = sel.mass
        edges = [0.0, np.nextafter(1.0, 0.0)] + [np.nextafter(k / m, 1.0) for k in range(int(m))]
        edges += [k / m for k in range(int(m))]
        u = np.concatenate([rng.random(64), np.asarray(edges, dtype=np.float64)])
        drawn = sel.draw(u)
        assert drawn.tolist() == sel.sums.draw(u).tolist()
        assert sel.drawn_weights(drawn).tolist() == sel.leaf_weights(drawn).tolist()  # ones, read or not
    assert arithmetic > 40 and wrapped > 10  # the arithmetic path was taken, on wrapped rings too


# ---------------------------------------------------------------------------- samplers via LocalTable


@pytest.mark.parametrize("num_shards", [1, 2])
def test_uniform_sampler(num_shards):
    t = LocalTable(x_spec(capacity=20, num_shards=num_shards), sampler=Uniform(), seed=1)
    kv = _single_steps(t, np.arange(10.0))
    counts = {k: 0 for k in kv}
    for _ in range(300):
        b = t.sample(10)
        assert np.allclose(b.probabilities.numpy(), 1 / 10)
        assert np.all(b.weights.numpy() == 1)
        for k, v in zip(*_keys_values(b)):
            assert kv[k] == v
            counts[k] += 1
    c = np.array(list(counts.values()))
    # 3000 draws over 10 items: each ~300, binomial sd ~16
    assert c.min() > 220 and c.max() < 380


@pytest.mark.parametrize("num_shards", [1, 2])
def test_prioritized_sampler_probabilities_and_weights(num_shards):
    alpha, beta = 0.7, 0.4
    t = LocalTable(x_spec(capacity=20, num_shards=num_shards), sampler=Prioritized(alpha, beta), seed=2)
    pr = np.array([0.5, 1.0, 2.0, 0.0, 3.0, 8.0, 0.25, 1.5])
    kv = _single_steps(t, np.arange(8.0), priorities=pr)
    p_of = {k: pr[int(v)] for k, v in kv.items()}
    total = sum(p**alpha for p in pr)
    for _ in range(20):
        b = t.sample(16)
        keys, vals = _keys_values(b)
        expect = np.array([p_of[k] ** alpha / total for k in keys])
        assert np.allclose(b.probabilities.numpy(), expect, rtol=1e-12)
        w = expect**-beta
        assert np.allclose(b.weights.numpy(), w / w.max(), rtol=1e-6)
        assert all(p_of[k] > 0 for k in keys)


def test_prioritized_update_changes_distribution():
    t = LocalTable(x_spec(capacity=20), sampler=Prioritized(1.0, 0.0), seed=3)
    kv = _single_steps(t, np.arange(4.0), priorities=1.0)
    keys = list(kv)
    t.update_priorities(keys, [0.0, 0.0, 0.0, 5.0])
    b = t.sample(50)
    assert set(b.keys.numpy().tolist()) == {keys[3]}
    assert np.allclose(b.probabilities.numpy(), 1.0)


def test_prioritized_alpha_zero_is_uniform_even_at_zero_priority():
    t = LocalTable(x_spec(capacity=20), sampler=Prioritized(0.0, 0.5), seed=4)
    _single_steps(t, np.arange(4.0), priorities=[0.0, 1.0, 2.0, 100.0])
    b = t.sample(400)
    assert np.allclose(b.probabilities.numpy(), 0.25)
    assert len(set(b.keys.numpy().tolist())) == 4


@pytest.mark.parametrize("num_shards", [1, 2])
def test_fifo_sampler(num_shards):
    t = LocalTable(x_spec(capacity=20, num_shards=num_shards), sampler=Fifo(), seed=0)
    _single_steps(t, np.arange(7.0))
    b = t.sample(4)
    assert _keys_values(b)[1] == [0.0, 1.0, 2.0, 3.0]
    assert np.all(b.probabilities.numpy() == 1) and np.all(b.weights.numpy() == 1)
    # fewer items than the batch: repeated in order
    assert _keys_values(t.sample(9))[1] == [0, 1, 2, 3, 4, 5, 6, 0, 1]


@pytest.mark.parametrize("num_shards", [1, 2])
def test_lifo_sampler(num_shards):
    t = LocalTable(x_spec(capacity=20, num_shards=num_shards), sampler=Lifo(), seed=0)
    _single_steps(t, np.arange(7.0))
    assert _keys_values(t.sample(3))[1] == [6.0, 5.0, 4.0]
    _single_steps(t, [10.0, 11.0])
    assert _keys_values(t.sample(3))[1] == [11.0, 10.0, 6.0]


def test_fifo_lifo_order_is_insertion_order_not_slot_order():
    """After the ring wraps, the oldest item sits in a higher slot than newer ones."""
    t = LocalTable(x_spec(capacity=6), sampler=Fifo(), remover=Fifo(), seed=0)
    for i in range(10):
        t.insert(scalar_episode(1, float(i)))
    assert t.size == 6
    assert _keys_values(t.sample(6))[1] == [4, 5, 6, 7, 8, 9]
    t2 = LocalTable(x_spec(capacity=6), sampler=Lifo(), seed=0)
    for i in range(10):
        t2.insert(scalar_episode(1, float(i)))
    assert _keys_values(t2.sample(6))[1] == [9, 8, 7, 6, 5, 4]


@pytest.mark.parametrize("item_unit", ["step", "episode"])
@pytest.mark.parametrize("sampler", [Fifo(), Lifo()], ids=repr)
def test_fifo_lifo_order_is_stamp_order_when_inserts_land_out_of_order(sampler, item_unit):
    """A distributed shard stores inserts as they arrive, not as they were stamped (admitted): the
    candidates are still the n oldest (newest) by stamp, with deletions, ring wrap and a horizon."""
    rng = np.random.default_rng(0)
    sh = _shard(type(sampler)(), capacity=64, item_unit=item_unit)
    fifo = isinstance(sampler, Fifo)
    next_stamp = 0
    for _ in range(40):
        inserts = []  # a few admitted together, then written in a shuffled order
        for _ in range(int(rng.integers(1, 5))):
            lengths = rng.integers(1, 4, size=int(rng.integers(1, 3)))
            items = lengths if item_unit == "step" else np.ones_like(lengths)
            offs = np.concatenate(([0], np.cumsum(items)[:-1]))
            inserts.append((lengths, next_stamp + offs))
            next_stamp += int(items.sum())
        for i in rng.permutation(len(inserts)):
            lengths, stamps = inserts[i]
            chunks = [scalar_episode(int(n)) for n in lengths]
            sh.insert(EpisodeBatch(chunks, lengths.astype(np.int64), stamps.astype(np.int64), stamps.astype(np.int64)))
        live = np.flatnonzero(sh.active)
        sh.delete(sh.slot_seqs(rng.choice(live, size=len(live) // 8, replace=False)))
        live = np.flatnonzero(sh.active)
        stamps = sh.item_stamps(live)
        for horizon in (None, next_stamp - int(rng.integers(0, 6))):
            ok = live if horizon is None else live[stamps < horizon]
            ok_stamps = sh.item_stamps(ok)
            expect = ok[np.argsort(ok_stamps if fifo else -ok_stamps)]
            for n in (1, 3, 10, 200):
                slots, keys = sh.candidates(n, 1, "pad_tail", horizon)
                assert slots.tolist() == expect[:n].tolist()
                got = sh.item_stamps(slots)
                assert keys.tolist() == (-got if fifo else got).astype(np.float64).tolist()


@pytest.mark.parametrize("num_shards", [1, 2])
def test_max_heap_sampler(num_shards):
    t = LocalTable(x_spec(capacity=20, num_shards=num_shards), sampler=MaxHeap(), seed=0)
    pr = [3.0, 9.0, 1.0, 9.0, 4.0, 0.0]
    kv = _single_steps(t, np.arange(6.0), priorities=pr)
    vals = _keys_values(t.sample(4))[1]
    assert vals[:2] in ([1.0, 3.0], [3.0, 1.0])  # tie at 9 across shards/slots: both first
    assert vals[2:] == [4.0, 0.0]
    keys = list(kv)
    t.update_priorities([keys[2]], [100.0])
    assert _keys_values(t.sample(1))[1] == [2.0]


@pytest.mark.parametrize("sampler", [Fifo(), MaxHeap()])
@pytest.mark.parametrize("limiter", [None, "ratio"])
def test_an_ordered_batch_larger_than_the_table_cycles_where_reverb_repeats_the_head(sampler, limiter):
    """Where we differ from Reverb on purpose (docs/migration.md, "Reverb semantics"): without max_times_sampled a batch of
    B from an ordered selector is its best B in order, cycling once every item is in (Fifo over 3 items, B=5:
    [0, 1, 2, 0, 1]); Reverb samples item by item from an unchanged table, so it hands out the head B times
    ([0, 0, 0, 0, 0]).  The batch reports one table size, the size it was drawn from (Reverb: each row's)."""
    kw = {} if limiter is None else {"rate_limiter": SampleToInsertRatio(1.0, 3, 100.0)}
    t = LocalTable(x_spec(capacity=20), sampler=sampler, seed=0, **kw)
    _single_steps(t, [0.0, 1.0, 2.0], priorities=[3.0, 2.0, 1.0])  # MaxHeap's order is insertion order too
    b = t.sample(5, timeout=0)
    assert _keys_values(b)[1] == [0.0, 1.0, 2.0, 0.0, 1.0]
    assert b.table_size == 3


@pytest.mark.parametrize("limiter", ["ratio", "min_size"])
def test_every_kind_of_table_reports_the_size_its_batch_was_drawn_from(make_table, limiter):
    """A distributed batch reported table_size -1 (Reverb's SampleInfo.table_size, which docs/migration.md maps
    ours to), a local one the table's size.  Every kind reports the items counted when the batch was admitted:
    15, then 20 after an insert.  A distributed MinSize table's batches served under an admission lease report
    the size at the lease's grant, so they see the insert once the lease (16 batches) is used up."""
    if limiter == "ratio":  # admitted batch by batch (no lease), never held back
        kw = {"rate_limiter": SampleToInsertRatio(1e6, 1, 1e9)}
    else:
        kw = {"rate_limiter": MinSize(1)}
    t = make_table(x_spec(capacity=40, num_shards=2), sampler=Uniform(), seed=0, **kw)
    t.insert([scalar_episode(5, 10 * e) for e in range(3)])
    assert [t.sample(4, 1).table_size for _ in range(3)] == [15, 15, 15]
    t.insert([scalar_episode(5, 100)])
    sizes = [t.sample(4, 1).table_size for _ in range(18)]
    if limiter == "ratio" or isinstance(t, LocalTable):
        assert sizes == [20] * 18
    else:
        assert sizes == sorted(sizes) and set(sizes) <= {15, 20} and sizes[-1] == 20, sizes


@pytest.mark.parametrize("num_shards", [1, 2])
def test_min_heap_sampler(num_shards):
    t = LocalTable(x_spec(capacity=20, num_shards=num_shards), sampler=MinHeap(), seed=0)
    pr = [3.0, 9.0, 1.0, 0.5, 4.0, 2.0]
    kv = _single_steps(t, np.arange(6.0), priorities=pr)
    assert _keys_values(t.sample(3))[1] == [3.0, 2.0, 5.0]
    t.update_priorities([list(kv)[1]], [0.0])
    assert _keys_values(t.sample(2))[1] == [1.0, 3.0]


def test_heap_with_default_priorities_many_items():
    """Every item at the default (running max) priority: ties, and the heap must still deliver."""
    t = LocalTable(x_spec(capacity=2048), sampler=MaxHeap(), seed=0)
    t.insert(scalar_episode(1500))
    b = t.sample(5)
    assert len(set(b.keys.numpy().tolist())) == 5
    assert _keys_values(b)[1] == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("num_shards", [1, 2])
def test_without_replacement_epochs(num_shards):
    n = 12
    t = LocalTable(x_spec(capacity=32, num_shards=num_shards), sampler=WithoutReplacement(), seed=5)
    kv = _single_steps(t, np.arange(float(n)))
    draws = []
    for _ in range(9):  # 9 * 5 = 45 draws: batches straddle epoch ends
        b = t.sample(5)
        draws += b.keys.numpy().tolist()
        assert np.all(b.weights.numpy() == 1)
    for e in range(len(draws) // n):
        epoch = draws[e * n : (e + 1) * n]
        assert sorted(epoch) == sorted(kv), f"epoch {e} is not each item exactly once"
    rest = draws[(len(draws) // n) * n :]
    assert len(set(rest)) == len(rest)


def test_without_replacement_probabilities_and_mid_epoch_insert():
    t = LocalTable(x_spec(capacity=32, num_shards=2), sampler=WithoutReplacement(), seed=6)
    kv = _single_steps(t, np.arange(6.0))
    b = t.sample(2)
    assert np.allclose(b.probabilities.numpy(), 1 / 6)
    first = set(b.keys.numpy().tolist())
    kv2 = _single_steps(t, [50.0, 51.0])  # join the running epoch
    b = t.sample(3)
    assert np.allclose(b.probabilities.numpy(), 1 / 6)  # 4 old left + 2 new
    b2 = t.sample(3)
    assert np.allclose(b2.probabilities.numpy(), 1 / 3)
    epoch = first | set(b.keys.numpy().tolist()) | set(b2.keys.numpy().tolist())
    assert epoch == set(kv) | set(kv2)


def test_without_replacement_strict_skips_short_items():
    """Steps too close to their episode's end are skipped for the epoch, never returned."""
    t = LocalTable(x_spec(capacity=32, num_shards=2), sampler=WithoutReplacement(), seed=7)
    res = t.insert([scalar_episode(4, 0), scalar_episode(3, 10), scalar_episode(1, 20)])
    valid = {int(res.first_keys[0]) + j for j in range(3)} | {int(res.first_keys[1]) + j for j in range(2)}
    got = []
    for _ in range(4):
        b = t.sample(5, length=2)
        got.append(sorted(b.keys.numpy().tolist()))
        assert np.all(b.mask.numpy())
    assert all(g == sorted(valid) for g in got)


@pytest.mark.parametrize("num_shards", [1, 2])
def test_a_strict_batch_without_replacement_leaves_the_items_it_cannot_use_in_the_epoch(make_table, num_shards):
    """A strict batch drew by rejection and took every item it hit out of the epoch, those whose window did
    not fit too: a random few of them were lost to the epoch without being handed out (after one window of
    3 of 8 items, 6 were left, neither 7 nor 2).  They stay in the epoch for windows they fit."""
    t = make_table(x_spec(capacity=100, num_shards=num_shards), sampler=WithoutReplacement(), seed=0)
    r = t.insert([scalar_episode(1, 0), scalar_episode(5, 10), scalar_episode(2, 20)])
    every = {int(k) + j for k, n in zip(r.first_keys, (1, 5, 2)) for j in range(n)}
    for _ in range(3):  # (each epoch: one strict window of 3, then the other 7 steps one by one)
        first = t.sample(1, length=3).keys.numpy().tolist()
        b = t.sample(7, length=1)
        assert np.allclose(b.probabilities.numpy(), 1 / 7)
        assert sorted(first + b.keys.numpy().tolist()) == sorted(every)


# ---------------------------------------------------------------------------- removers (max_size eviction)
# Tables accept only a Fifo remover (ring storage cannot honour the others, see
# test_reverb_removers.py); the planner's rules for every remover are still
# tested here on bare shards, so they stay right for a storage that could.


class _Shards:
    """Shards driven directly: one-step episodes routed round robin, then the planner's eviction."""

    def __init__(self, remover, num_shards, seed):
        spec = x_spec(capacity=64, num_shards=num_shards)
        self.shards = {i: Shard(spec, i, Uniform(), remover.clone()) for i in range(num_shards)}
        self.rng = np.random.default_rng(seed)
        self.stamp = 0
        self.max_size = None

    def insert(self, values, priorities=None, shard=None):
        pr = np.broadcast_to(np.asarray(0.0 if priorities is None else priorities, float), (len(values),))
        keys = []
        for j, v in enumerate(values):
            i = (self.stamp % len(self.shards)) if shard is None else shard
            b = EpisodeBatch(
                [{"x": np.array([v], np.float32)}],
                np.array([1]),
                np.array([self.stamp]),
                np.array([self.stamp]),
                None if priorities is None else pr[j : j + 1].copy(),
            )
            keys.append(int(self.shards[i].insert(b)[0][0]))
            self.stamp += 1
        self.enforce()
        return keys

    @property
    def size(self):
        return sum(s.size for s in self.shards.values())

    def enforce(self):
        excess = self.size - self.max_size
        if excess > 0:
            evict_shards(self.shards, excess, next(iter(self.shards.values())).remover.deterministic, self.rng)

    def live(self, keys, values):
        shard, seq = decode(np.array(keys))
        out = []
        for i, q, v in zip(shard, seq, values):
            _, live = self.shards[int(i)].resolve(np.array([q]))
            if live[0]:
                out.append(v)
        return sorted(out)


def _evict_table(remover, num_shards=1, max_size=6, pr=None, seed=0):
    t = _Shards(remover, num_shards, seed)
    t.max_size = max_size
    vals = list(range(10))
    keys = t.insert([float(v) for v in vals], pr)
    assert t.size == max_size
    assert sum(s.counters.removed for s in t.shards.values()) == 10 - max_size
    assert sum(s.counters.evicted for s in t.shards.values()) == 0
    return t, (keys, vals)


def _live_values(t, kv):
    return t.live(*kv)


@pytest.mark.parametrize("num_shards", [1, 2])
def test_fifo_remover_evicts_oldest(num_shards):
    t = LocalTable(x_spec(capacity=64, num_shards=num_shards, max_size=6), sampler=Uniform(), remover=Fifo())
    kv = _single_steps(t, np.arange(10.0))
    assert t.size == 6 and t.info()["totals"]["removed"] == 4
    live = sorted(v for k, v in kv.items() if t.update_priorities([k], [1.0]).applied)
    assert live == [4, 5, 6, 7, 8, 9]
    t2, kv2 = _evict_table(Fifo(), num_shards)
    assert _live_values(t2, kv2) == [4, 5, 6, 7, 8, 9]


@pytest.mark.parametrize("num_shards", [1, 2])
def test_lifo_remover_evicts_newest(num_shards):
    t, kv = _evict_table(Lifo(), num_shards)
    assert _live_values(t, kv) == [0, 1, 2, 3, 4, 5]


@pytest.mark.parametrize("num_shards", [1, 2])
def test_min_heap_remover_evicts_lowest_priority(num_shards):
    pr = [5.0, 0.1, 7.0, 3.0, 0.2, 9.0, 1.0, 8.0, 6.0, 2.0]
    t, kv = _evict_table(MinHeap(), num_shards, pr=pr)
    assert _live_values(t, kv) == sorted(np.argsort(pr)[4:].tolist())


@pytest.mark.parametrize("num_shards", [1, 2])
def test_max_heap_remover_evicts_highest_priority(num_shards):
    pr = [5.0, 0.1, 7.0, 3.0, 0.2, 9.0, 1.0, 8.0, 6.0, 2.0]
    t, kv = _evict_table(MaxHeap(), num_shards, pr=pr)
    assert _live_values(t, kv) == sorted(np.argsort(pr)[:6].tolist())


@pytest.mark.parametrize("num_shards", [1, 2])
def test_uniform_remover_keeps_max_size(num_shards):
    t, kv = _evict_table(Uniform(), num_shards, seed=3)
    assert len(_live_values(t, kv)) == 6


@pytest.mark.parametrize("num_shards", [1, 2])
def test_prioritized_remover_only_evicts_weighted_items(num_shards):
    """Items with priority 0 have no remover weight: the 4 evicted are among the positive ones."""
    pr = [0.0, 2.0, 0.0, 1.0, 0.0, 3.0, 0.0, 5.0, 0.0, 0.0]
    for seed in range(5):
        t, kv = _evict_table(Prioritized(1.0), num_shards, pr=pr, seed=seed)
        assert _live_values(t, kv) == [0, 2, 4, 6, 8, 9]


def test_prioritized_remover_all_zero_priorities_still_evicts():
    """No remover weight anywhere: eviction falls back to uniform (Reverb) instead of failing."""
    t, kv = _evict_table(Prioritized(1.0), 2, pr=0.0, seed=1)
    assert len(_live_values(t, kv)) == 6


def test_prioritized_remover_mixed_weights_over_shards():
    """Few weighted items on one shard, many zero-weight ones: evicts exactly down to max_size."""
    for seed in range(20):
        t = _Shards(Prioritized(1.0), 2, seed)
        t.max_size = 20
        t.insert([0.0], 1000.0, shard=0)
        t.insert([0.0] * 19, 1.0, shard=1)
        t.insert([0.0] * 3, 1.0, shard=1)
        assert t.size == 20
        assert sum(s.counters.removed for s in t.shards.values()) == 3


def test_without_replacement_cannot_remove():
    with pytest.raises(SpecError, match="cannot be used as a remover"):
        LocalTable(x_spec(), remover=WithoutReplacement())
    assert LocalTable(x_spec(), sampler=WithoutReplacement()).size == 0


@pytest.mark.parametrize(
    "given, hint",
    [
        ("uniform", "sampler=gear_flow.Uniform()"),
        (Prioritized, "call it: sampler=Prioritized()"),
        ("Max_Heap", "gear_flow.MaxHeap()"),
        (3, "3$"),
    ],  # fmt: skip
)
def test_a_selector_given_as_a_name_or_a_class_is_refused_with_the_fix(given, hint):
    with pytest.raises(
        SpecError, match=r"sampler must be a Selector instance, got .*" + hint.replace("(", r"\(").replace(")", r"\)")
    ):
        LocalTable(x_spec(), sampler=given)


class _Reversed(Prioritized):
    """A selector of its own draw: the mirror image of the tree's (each uniform u drawn as 1 - u)."""

    def draw(self, uniforms):
        return super().draw(np.nextafter(1.0, 0.0) - np.asarray(uniforms))


def test_a_selector_that_draws_its_own_way_is_asked_to_draw():
    """A sample draws with the selector's own draw (the fused draw of the tree's weights is for selectors
    that keep the tree's): a selector overriding draw gets its slots, and their weights over the mass."""
    tables = [LocalTable(x_spec(capacity=64), sampler=s, seed=3) for s in (Prioritized(1.0, 0.0), _Reversed(1.0, 0.0))]
    for t in tables:
        t.insert([scalar_episode(8)], priorities=np.arange(1.0, 9.0))
    plain, mirrored = (t.sample(400) for t in tables)
    steps = [np.asarray(b["x"]).ravel() for b in (plain, mirrored)]
    assert steps[0].mean() > 4 and steps[1].mean() > 4  # both by weight (the heavy steps are the last)
    assert not np.array_equal(steps[0], steps[1])
    p = np.arange(1.0, 9.0) / 36.0
    for b in (plain, mirrored):
        assert np.allclose(b.probabilities.numpy(), p[decode(b.keys.numpy())[1]])
