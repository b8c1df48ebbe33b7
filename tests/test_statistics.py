"""Sampling frequencies against the intended distributions (chi-square, fixed seeds).

The statistic is compared with the 1e-4 upper critical value of the
chi-square distribution (computed in helpers; scipy is not needed), so a
correct sampler fails with probability ~1e-4 per test and the fixed seeds make
the outcome reproducible.  Expected frequencies are computed here from the
inserted priorities, never from the probabilities the table reports.  Every
test runs on the local table and on a distributed table over two workers.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import chi2_critical, episode, make_spec, scalar_episode, x_spec

from gear_flow import Prioritized, Uniform, WithoutReplacement


def chi2(observed: np.ndarray, expected: np.ndarray) -> float:
    assert expected.min() >= 5, "too few expected draws per cell for a chi-square test"
    return float(((observed - expected) ** 2 / expected).sum())


def test_critical_values_match_tables():
    # published upper quantiles of chi-square
    assert chi2_critical(10) == pytest.approx(35.564, abs=2e-3)  # p = 1e-4
    assert chi2_critical(50) == pytest.approx(95.969, abs=2e-3)
    assert chi2_critical(1, 0.05) == pytest.approx(3.841, abs=2e-3)
    assert chi2_critical(20, 0.01) == pytest.approx(37.566, abs=2e-3)


def _draw_counts(t, keys: list[int], n_batches: int, B: int, length: int = 1, boundary="strict"):
    index = {k: i for i, k in enumerate(keys)}
    counts = np.zeros(len(keys))
    for _ in range(n_batches):
        b = t.sample(B, length=length, boundary=boundary)
        for k in b.keys.tolist():
            counts[index[k]] += 1
    return counts


@pytest.mark.parametrize("alpha", [0.6, 1.0])
def test_prioritized_frequencies_two_shards(alpha, make_table):
    rng = np.random.default_rng(12)
    t = make_table(x_spec(capacity=64, num_shards=2), sampler=Prioritized(alpha, 0.4), seed=123)
    pr = rng.uniform(0.2, 5.0, 40)
    res = t.insert([scalar_episode(1) for _ in range(40)], priorities=pr)
    assert set(res.shards.tolist()) == {0, 1}
    keys = res.first_keys.tolist()
    n_batches, B = 100, 512
    counts = _draw_counts(t, keys, n_batches, B)
    w = pr**alpha
    expected = w / w.sum() * n_batches * B
    assert chi2(counts, expected) < chi2_critical(len(keys) - 1)


def test_prioritized_unequal_shards_and_zero_priorities(make_table):
    """Shard masses differ a lot (3 heavy items on one shard, 30 light on the other)."""
    t = make_table(x_spec(capacity=64, num_shards=2), sampler=Prioritized(1.0, 0.4), seed=7)
    heavy = t.insert([scalar_episode(1) for _ in range(3)], priorities=[10.0, 20.0, 30.0], shard=0)
    light = t.insert([scalar_episode(1) for _ in range(30)], priorities=np.linspace(0.5, 3.0, 30), shard=1)
    zero = t.insert([scalar_episode(1) for _ in range(5)], priorities=0.0, shard=1)
    keys = heavy.first_keys.tolist() + light.first_keys.tolist() + zero.first_keys.tolist()
    counts = _draw_counts(t, keys, 100, 512)
    assert counts[-5:].sum() == 0  # zero priority: never drawn
    w = np.concatenate([[10.0, 20.0, 30.0], np.linspace(0.5, 3.0, 30)])
    expected = w / w.sum() * counts.sum()
    assert chi2(counts[:-5], expected) < chi2_critical(len(w) - 1)


@pytest.mark.parametrize("item_unit", ["step", "episode"])
def test_prioritized_strict_windows_mixed_lengths(item_unit, make_table):
    """Strict windows of L=4 over episodes of mixed lengths (some too short), rings wrapped."""
    L, alpha = 4, 0.7
    rng = np.random.default_rng(3)
    t = make_table(make_spec(capacity=48, num_shards=2, item_unit=item_unit), sampler=Prioritized(alpha, 0.5), seed=99)
    lengths = [2, 5, 7, 3, 9, 4, 1, 6, 8, 5]
    # a first batch, partly evicted by the second, which then straddles the rings' ends; its
    # survivors have priority 0 and must never be drawn
    t.insert([episode(100 + i, 9) for i in range(8)], priorities=0.0)
    n_items = sum(lengths) if item_unit == "step" else len(lengths)
    pr = rng.uniform(0.1, 4.0, n_items)
    r = t.insert([episode(i + 1, n) for i, n in enumerate(lengths)], priorities=pr)
    info = t.info()
    assert info["totals"]["evicted"] > 0
    assert all(sh["write_pos"] > 48 for sh in info["shards"])
    # valid items and their weights, computed from what we inserted
    keys, weights = [], []
    off = 0
    for i, n in enumerate(lengths):
        if item_unit == "step":
            for j in range(n):
                if n - j >= L:
                    keys.append(int(r.first_keys[i]) + j)
                    weights.append(pr[off + j] ** alpha)
            off += n
        elif n >= L:
            keys.append(int(r.first_keys[i]))
            weights.append(pr[i] ** alpha)
    w = np.array(weights)
    n_batches, B = 60, 512
    counts = _draw_counts(t, keys, n_batches, B, length=L)  # KeyError if an invalid item is drawn
    expected = w / w.sum() * n_batches * B
    assert chi2(counts, expected) < chi2_critical(len(keys) - 1)


@pytest.mark.parametrize("item_unit", ["step", "episode"])
def test_prioritized_strict_windows_whose_items_hold_almost_no_weight(item_unit, make_table):
    """Strict windows whose items hold ~1e-5 of the weight (heavy items whose windows do not fit): every draw
    is an item whose window fits, drawn by its weight, with its probability; rejection against the whole
    tree, drawing each round only what was still missing, gave up with an EmptyTableError (an owner's
    draw) or a sample redone until it failed (a distributed handle's)."""
    L, alpha = 3, 1.0
    rng = np.random.default_rng(4)
    t = make_table(make_spec(capacity=64, num_shards=2, item_unit=item_unit), sampler=Prioritized(alpha, 0.5), seed=17)
    lengths = [1, 4, 2, 5, 1, 4, 3, 1, 6, 2]
    keys, weights, pr = [], [], []
    for n in lengths:
        for j in range(n if item_unit == "step" else 1):
            fits = (n - j if item_unit == "step" else n) >= L
            pr.append(rng.uniform(0.5, 2.0) * 1e-4 if fits else 10.0)
    r = t.insert([episode(i + 1, n) for i, n in enumerate(lengths)], priorities=pr)
    off = 0
    for i, n in enumerate(lengths):
        for j in range(n if item_unit == "step" else 1):
            if (n - j if item_unit == "step" else n) >= L:
                keys.append(int(r.first_keys[i]) + j)
                weights.append(pr[off + j] ** alpha)
        off += n if item_unit == "step" else 1
    w = np.array(weights)
    assert w.sum() / (np.array(pr) ** alpha).sum() < 1e-4
    n_batches, B = 30, 512
    counts = _draw_counts(t, keys, n_batches, B, length=L)  # KeyError if an item whose window does not fit is drawn
    expected = w / w.sum() * n_batches * B
    assert chi2(counts, expected) < chi2_critical(len(keys) - 1)
    b = t.sample(B, length=L)
    want = dict(zip(keys, w / w.sum()))
    assert np.allclose(b.probabilities.numpy(), [want[k] for k in b.keys.tolist()], rtol=1e-6, atol=0)


def test_a_key_repeated_in_an_update_changes_the_strict_windows_mass_once(make_table):
    """An update whose keys repeat (a batch drawn with replacement does) changes each item's weight once, to
    its last value: strict windows keep reporting their weight over the weight of the items whose windows fit,
    once that mass is cached (the first strict batch of the length).  Each repeat had moved the cached mass
    again: step 2's window does not fit, and updating it twice made the reported probabilities 1/3 and 1."""
    t = make_table(make_spec(capacity=64, num_shards=1), sampler=Prioritized(1.0, 0.0), seed=3)
    k = int(t.insert([episode(1, 3)], priorities=[1.0, 3.0, 1.0]).first_keys[0])

    def drawn():
        b = t.sample(256, length=2, boundary="strict")
        return dict(zip(b.keys.tolist(), b.probabilities.tolist()))

    assert drawn() == pytest.approx({k: 0.25, k + 1: 0.75}, rel=1e-12)
    t.update_priorities([k + 2, k + 2], [2.0, 2.0])  # the step whose window does not fit, twice
    assert drawn() == pytest.approx({k: 0.25, k + 1: 0.75}, rel=1e-12)
    t.update_priorities([k, k, k + 1, k], [5.0, 6.0, 3.0, 7.0])  # the last value wins: 7 and 3
    assert drawn() == pytest.approx({k: 0.7, k + 1: 0.3}, rel=1e-12)


def test_strict_windows_holding_a_billionth_of_the_weight_are_drawn_by_it(make_table):
    """Fitting items that hold less than 1e-9 of a shard's weight still have weight: they are drawn by it, with
    their probabilities, not uniformly as items of no weight are.  A remainder of the cached tail mass that
    small was taken for nothing: 0.5 and 0.5 where 0.25 and 0.75."""
    t = make_table(make_spec(capacity=64, num_shards=1), sampler=Prioritized(1.0, 0.0), seed=5)
    k = int(t.insert([episode(1, 3)], priorities=[1e-6, 3e-6, 1e4]).first_keys[0])
    b = t.sample(4000, length=2, boundary="strict")
    assert dict(zip(b.keys.tolist(), b.probabilities.tolist())) == pytest.approx({k: 0.25, k + 1: 0.75}, rel=1e-9)
    counts = np.array([(b.keys.numpy() == k).sum(), (b.keys.numpy() == k + 1).sum()])
    assert chi2(counts, np.array([0.25, 0.75]) * 4000) < chi2_critical(1)


def test_a_huge_weight_lowered_where_no_window_fits_leaves_strict_probabilities_exact(make_table):
    """The cached tail mass of strict windows follows each weight change by adding its delta: lowering two
    steps whose windows do not fit from 1e20 to 1 left it ~1e4 off (the rounding of 2e20), so shard 0
    reported 1/16384-ish probabilities, or, with the error below zero, took almost every draw.  It is now
    recomputed before use when its rounding is not small against the mass it leaves."""
    t = make_table(make_spec(capacity=64, num_shards=2), sampler=Prioritized(1.0, 0.0), seed=6)
    a = t.insert([episode(1, 2), episode(2, 2)], priorities=[1.0, 1e20, 3.0, 1e20], shard=0)
    b = t.insert([episode(3, 2)], priorities=[4.0, 0.0], shard=1)
    t.sample(4, length=2, boundary="strict")  # the tail mass of L=2 cached on each shard
    k1, k2, k3 = int(a.first_keys[0]), int(a.first_keys[1]), int(b.first_keys[0])
    t.update_priorities([k1 + 1, k2 + 1], [1.0, 1.0])  # the steps whose windows do not fit: 1e20 -> 1
    got = t.sample(4000, length=2, boundary="strict")
    keys = got.keys.numpy()
    assert dict(zip(keys.tolist(), got.probabilities.tolist())) == pytest.approx(
        {k1: 1 / 8, k2: 3 / 8, k3: 4 / 8}, rel=1e-9
    )
    counts = np.array([(keys == k).sum() for k in (k1, k2, k3)])
    assert counts.sum() == 4000
    assert chi2(counts, np.array([1, 3, 4]) / 8 * 4000) < chi2_critical(2)


def test_uniform_two_level_exact_with_unequal_shards(make_table):
    t = make_table(x_spec(capacity=64, num_shards=2), sampler=Uniform(), seed=5)
    a = t.insert([scalar_episode(1) for _ in range(4)], shard=0)
    b = t.insert([scalar_episode(1) for _ in range(36)], shard=1)
    keys = a.first_keys.tolist() + b.first_keys.tolist()
    counts = _draw_counts(t, keys, 50, 512)
    expected = np.full(40, counts.sum() / 40)
    assert chi2(counts, expected) < chi2_critical(39)
    # shard 0 holds 4 of 40 items: 10 % of the draws
    assert counts[:4].sum() / counts.sum() == pytest.approx(0.1, abs=0.01)


def test_episode_window_position_uniform(make_table):
    t = make_table(make_spec(capacity=64, item_unit="episode"), seed=8)
    t.insert(episode(1, 20))
    L = 5
    counts = np.zeros(16)
    for _ in range(40):
        b = t.sample(512, length=L)
        counts += np.bincount(b.timesteps.numpy(), minlength=16)
    assert counts.shape == (16,)
    assert chi2(counts, np.full(16, counts.sum() / 16)) < chi2_critical(15)


def test_without_replacement_batches_are_uniform_subsets(make_table):
    """Items on a small and a large shard are equally likely to open an epoch."""
    t = make_table(x_spec(capacity=64, num_shards=2), sampler=WithoutReplacement(), seed=4)
    a = t.insert([scalar_episode(1) for _ in range(3)], shard=0)
    b = t.insert([scalar_episode(1) for _ in range(9)], shard=1)
    keys = a.first_keys.tolist() + b.first_keys.tolist()
    index = {k: i for i, k in enumerate(keys)}
    first = np.zeros(12)
    epochs = 1500
    for _ in range(epochs):
        opening = t.sample(4).keys.tolist()
        assert len(set(opening)) == 4
        for k in opening:
            first[index[k]] += 1
        rest = t.sample(8).keys.tolist()  # the rest of the epoch: exactly the other 8
        assert sorted(opening + rest) == sorted(keys)
    # hypergeometric counts vary less than multinomial ones: the test is conservative
    assert chi2(first, np.full(12, epochs * 4 / 12)) < chi2_critical(11)


@pytest.mark.parametrize("beta", [0.0, 0.4, 1.0])
def test_importance_weights(beta, make_table):
    alpha = 0.8
    rng = np.random.default_rng(21)
    t = make_table(x_spec(capacity=64, num_shards=2), sampler=Prioritized(alpha, beta), seed=2)
    pr = rng.uniform(0.1, 6.0, 25)
    r = t.insert([scalar_episode(1) for _ in range(25)], priorities=pr)
    P = dict(zip(r.first_keys.tolist(), (pr**alpha / (pr**alpha).sum()).tolist()))
    for _ in range(5):
        b = t.sample(64)
        p = np.array([P[k] for k in b.keys.tolist()])
        expect = p**-beta / (p**-beta).max()
        np.testing.assert_allclose(b.weights.numpy(), expect, rtol=1e-6)
        np.testing.assert_allclose(b.probabilities.numpy(), p, rtol=1e-12)
        assert b.weights.numpy().max() == pytest.approx(1.0)
