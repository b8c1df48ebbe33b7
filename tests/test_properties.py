"""Property tests (hypothesis): nothing lost, keys never reused, exact probabilities, real windows.

The expected live items come from an independent model of the storage: per
shard, episodes are written back to back and the oldest whole episodes are
dropped when a call's steps would overwrite them.
"""

from __future__ import annotations

import numpy as np
import pytest
from dist_support import active_items, on_both_tables
from helpers import Catalog, check_windows, episode, make_spec, reconcile
from hypothesis import HealthCheck, example, settings
from hypothesis import strategies as st

from gear_flow import (
    EmptyTableError,
    Fifo,
    Lifo,
    MinHeap,
    Prioritized,
    RateLimitTimeout,
    Uniform,
    WindowTooLongError,
)

SETTINGS = settings(
    max_examples=50,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
#: the distributed table: fewer examples (each is a table on the cluster, every call a round trip)
DIST_SETTINGS = settings(SETTINGS, max_examples=8, suppress_health_check=list(HealthCheck))

MAX_LEN = 8
MAX_EPS = 3  # per call: a call holds at most MIN_CAP steps, so it always fits one shard
MIN_CAP = MAX_LEN * MAX_EPS
calls = st.lists(st.lists(st.integers(1, MAX_LEN), min_size=1, max_size=MAX_EPS), min_size=1, max_size=10)


class RingModel:
    """Which episodes each shard still stores, computed without the library."""

    def __init__(self, num_shards: int, capacity: int):
        self.capacity = capacity
        self.wp = [0] * num_shards
        self.eps: list[list[tuple[int, int, int]]] = [[] for _ in range(num_shards)]  # (first_key, length, start)

    def insert(self, lengths, shards, first_keys):
        for s in sorted(set(shards.tolist())):
            mine = [i for i in range(len(lengths)) if shards[i] == s]
            n = sum(lengths[i] for i in mine)
            bound = self.wp[s] + n - self.capacity
            while self.eps[s] and self.eps[s][0][2] < bound:
                self.eps[s].pop(0)
            for i in mine:
                self.eps[s].append((int(first_keys[i]), lengths[i], self.wp[s]))
                self.wp[s] += lengths[i]

    def live(self):
        return [e for eps in self.eps for e in eps]


def _expect_step_keys(model: RingModel):
    return {k + j for k, n, _ in model.live() for j in range(n)}


def _nothing_lost(make_table, calls, capacity, num_shards, max_frac, remover, item_unit, ops, seed):
    rng = np.random.default_rng(seed)
    max_size = None if max_frac is None else max(1, int(capacity * num_shards * max_frac))
    removers = {"fifo": Fifo, "lifo": Lifo, "uniform": Uniform, "min_heap": MinHeap, "prioritized": Prioritized}
    t = make_table(
        make_spec(capacity=capacity, num_shards=num_shards, item_unit=item_unit, max_size=max_size),
        remover=removers[remover](),
        max_times_sampled=(mts := int(rng.integers(0, 3))),
        seed=seed,
    )
    cat = Catalog()
    tag = 1
    issued = []
    n_inserted = 0
    for lengths, op in zip(calls, ops):
        pr = rng.random(sum(lengths) if item_unit == "step" else len(lengths)) * (rng.random() < 0.7)
        r = cat.insert(t, [(tag + i, n) for i, n in enumerate(lengths)], priorities=pr)
        tag += len(lengths)
        issued += r.first_keys.tolist()
        tot = reconcile(t)
        assert t.size <= t.spec.max_size
        assert active_items(t) == t.size
        for s in t.info()["shards"]:
            assert s["steps_stored"] <= capacity
        n_inserted += sum(lengths) if item_unit == "step" else len(lengths)
        assert tot["inserted"] == n_inserted
        if t.size == 0:
            continue
        if op == "sample":
            try:
                b = t.sample(int(rng.integers(1, 8)), length=1, timeout=0.05 if mts else 1)
            except RateLimitTimeout as e:  # max_times_sampled: fewer left than the batch (it waits for inserts)
                assert mts and "items left" in str(e), e
                continue
            check_windows(b, cat, 1, "strict", item_unit)
        elif op == "delete":
            t.delete(rng.choice(issued, size=min(3, len(issued)), replace=False))
        else:
            t.update_priorities(issued, rng.random(len(issued)))
        reconcile(t)


def _keys_never_reused_and_stale_detected(make_table, calls, capacity, num_shards, item_unit):
    t = make_table(make_spec(capacity=capacity, num_shards=num_shards, item_unit=item_unit), seed=0)
    model = RingModel(num_shards, capacity)
    cat = Catalog()
    tag = 1
    issued: list[int] = []
    for _ in range(3):  # the same calls three times over: the rings wrap several times
        for lengths in calls:
            r = cat.insert(t, [(tag + i, n) for i, n in enumerate(lengths)])
            tag += len(lengths)
            model.insert(lengths, r.shards, r.first_keys)
            if item_unit == "step":
                issued += [int(k) + j for k, n in zip(r.first_keys, lengths) for j in range(n)]
            else:
                issued += r.first_keys.tolist()
    assert len(issued) == len(set(issued)), "a key was issued twice"
    live = _expect_step_keys(model) if item_unit == "step" else {k for k, _, _ in model.live()}
    assert t.size == len(live)
    res = t.update_priorities(issued, np.ones(len(issued)))
    assert res.applied == len(live) and res.stale == len(issued) - len(live)
    # only live keys are ever sampled
    b = t.sample(64, length=1)
    assert set(b.keys.tolist()) <= live
    # deleting every issued key empties the table; stale ones are counted, not errors
    res = t.delete(issued)
    assert res.applied == len(live) and t.size == 0


def _prioritized_probabilities_are_exact(make_table, calls, capacity, num_shards, alpha, length, item_unit, seed):
    rng = np.random.default_rng(seed)
    t = make_table(
        make_spec(capacity=capacity, num_shards=num_shards, item_unit=item_unit),
        sampler=Prioritized(alpha, 0.6),
        seed=seed,
    )
    model = RingModel(num_shards, capacity)
    cat = Catalog()
    prio: dict[int, float] = {}
    tag = 1
    for lengths in calls:
        n_items = sum(lengths) if item_unit == "step" else len(lengths)
        pr = rng.choice([0.0, 0.1, 1.0, 2.5, 7.0], size=n_items)
        r = cat.insert(t, [(tag + i, n) for i, n in enumerate(lengths)], priorities=pr)
        tag += len(lengths)
        model.insert(lengths, r.shards, r.first_keys)
        if item_unit == "step":
            keys = [int(k) + j for k, n in zip(r.first_keys, lengths) for j in range(n)]
        else:
            keys = r.first_keys.tolist()
        prio.update(zip(keys, pr.tolist()))
    # weight of every live item whose window fits, computed here from the model
    weights = {}
    for k, n, _ in model.live():
        items = [(k + j, n - j) for j in range(n)] if item_unit == "step" else [(k, n)]
        for key, room in items:
            if room >= length:
                weights[key] = 1.0 if alpha == 0 else prio[key] ** alpha
    if weights and not sum(weights.values()):  # no weight anywhere: uniform over the items that fit, as Reverb
        weights = dict.fromkeys(weights, 1.0)
    total = sum(weights.values())
    if total == 0:  # nothing fits
        with pytest.raises(EmptyTableError) as e:
            t.sample(8, length=length)
        longest = max(n for _, n, _ in model.live())
        assert isinstance(e.value, WindowTooLongError) == (longest < length)
        return
    b = t.sample(32, length=length)
    got = b.probabilities.numpy()
    expect = np.array([weights[k] / total for k in b.keys.tolist()])
    np.testing.assert_allclose(got, expect, rtol=1e-9)
    iw = expect**-0.6
    np.testing.assert_allclose(b.weights.numpy(), iw / iw.max(), rtol=1e-5)
    check_windows(b, cat, length, "strict", item_unit)


def _windows_are_real(make_table, calls, capacity, num_shards, length, boundary, sampler, item_unit):
    samplers = {"uniform": Uniform, "fifo": Fifo, "lifo": Lifo, "min_heap": MinHeap}
    t = make_table(
        make_spec(capacity=capacity, num_shards=num_shards, item_unit=item_unit), sampler=samplers[sampler](), seed=1
    )
    cat = Catalog()
    model = RingModel(num_shards, capacity)
    tag = 1
    for lengths in calls:
        r = cat.insert(t, [(tag + i, n) for i, n in enumerate(lengths)])
        model.insert(lengths, r.shards, r.first_keys)
        tag += len(lengths)
    longest = max(n for _, n, _ in model.live())
    if boundary == "strict" and longest < length:
        with pytest.raises(WindowTooLongError, match=f"longest: {longest} steps"):
            t.sample(8, length=length)
        return
    b = t.sample(24, length=length, boundary=boundary)
    check_windows(b, cat, length, boundary, item_unit)
    live_ids = {eid for eid, (_, _, fk) in cat.by_id.items() if fk in {k for k, _, _ in model.live()}}
    assert set(b.episode_ids.tolist()) <= live_ids


churn_ops = st.lists(
    st.one_of(
        st.tuples(st.just("insert"), st.lists(st.integers(1, MAX_LEN), min_size=1, max_size=MAX_EPS)),
        st.tuples(st.just("update"), st.integers(1, 12)),
        st.tuples(st.just("delete"), st.integers(1, 4)),
    ),
    min_size=4,
    max_size=25,
)


def _strict_probabilities_stay_exact_under_churn(
    make_table, ops, capacity, num_shards, alpha, item_unit, max_times, seed
):
    """Strict-window masses are cached per window length and updated incrementally by the
    shards; after any mix of inserts (with evictions), updates, deletes and expiries, with a
    sample of one of 6 window lengths (more than the cache holds) after every operation,
    every reported probability must still be exact."""
    rng = np.random.default_rng(seed)
    t = make_table(
        make_spec(capacity=capacity, num_shards=num_shards, item_unit=item_unit),
        sampler=Prioritized(alpha, 0.0),
        max_times_sampled=max_times,
        seed=seed,
    )
    model = RingModel(num_shards, capacity)
    prio: dict[int, float] = {}
    gone: set[int] = set()  # deleted or expired
    times: dict[int, int] = {}
    issued: list[int] = []
    tag = 1

    def live_items():
        out = {}
        for k, n, _ in model.live():
            for key, room in [(k + j, n - j) for j in range(n)] if item_unit == "step" else [(k, n)]:
                if key not in gone:
                    out[key] = room
        return out

    for op, arg in ops:
        if op == "insert":
            n_items = sum(arg) if item_unit == "step" else len(arg)
            pr = rng.choice([0.0, 0.1, 1.0, 2.5, 7.0], size=n_items)
            r = t.insert([episode(tag + i, n) for i, n in enumerate(arg)], priorities=pr)
            tag += len(arg)
            model.insert(arg, r.shards, r.first_keys)
            keys = (
                [int(k) + j for k, n in zip(r.first_keys, arg) for j in range(n)]
                if item_unit == "step"
                else r.first_keys.tolist()
            )
            prio.update(zip(keys, pr.tolist()))
            issued += keys
        elif op == "update" and issued:
            keys = rng.choice(issued, size=min(arg, len(issued)), replace=False).tolist()
            pr = rng.choice([0.0, 0.3, 1.0, 4.0], size=len(keys))
            res = t.update_priorities(keys, pr)
            live = live_items()
            assert res.applied == sum(k in live for k in keys)
            for k, p in zip(keys, pr.tolist()):
                if k in live:
                    prio[k] = p
        elif op == "delete" and issued:
            keys = rng.choice(issued, size=min(arg, len(issued)), replace=False).tolist()
            live = live_items()
            res = t.delete(keys)
            assert res.applied == sum(k in live for k in keys)
            gone |= {k for k in keys if k in live}
        # after every operation: a strict sample (L >= 2 uses the cached tail masses)
        L = int(rng.integers(2, 8))
        live = live_items()
        weights = {k: prio[k] ** alpha for k, room in live.items() if room >= L}
        total = sum(weights.values())
        if total == 0 and weights:  # no valid item has weight: uniform over them (Reverb)
            weights = dict.fromkeys(weights, 1.0)
            total = float(len(weights))
        # with max_times_sampled, the times the items that can be drawn may still go: by weight those with some,
        # then (once they are out) uniformly those without, as Reverb's prioritized selector
        budget = sum(max_times - times.get(k, 0) for k in weights) if max_times else 4
        if not live:
            pass  # below MinSize(1): the sample would wait
        elif total == 0:
            with pytest.raises(EmptyTableError):
                t.sample(4, length=L)
        elif budget < 4:  # too few left for the batch: it waits for inserts (as Reverb) and takes nothing
            with pytest.raises(RateLimitTimeout, match="items left"):
                t.sample(4, length=L, timeout=0.05)
        else:
            b = t.sample(4, length=L)
            keys = b.keys.tolist()
            if not max_times:
                expect = np.array([weights[k] / total for k in keys])  # KeyError: an invalid item was drawn
            else:  # item by item (Reverb): each row among the items left then, one that reached the limit out;
                # by weight while an item with weight is left, then uniformly over those without
                expect, left = [], dict(weights)
                for k in keys:
                    heavy = {j: w for j, w in left.items() if w > 0}
                    if heavy:  # KeyError: an invalid or spent item was drawn, or one without weight
                        expect.append(heavy[k] / sum(heavy.values()))
                    else:
                        assert k in left, (k, left)  # an invalid or spent item was drawn
                        expect.append(1.0 / len(left))
                    times[k] = times.get(k, 0) + 1
                    if times[k] >= max_times:
                        gone.add(k)
                        del left[k]
                expect = np.array(expect)
            np.testing.assert_allclose(b.probabilities.numpy(), expect, rtol=1e-9)
        assert t.size == len(live_items())


test_nothing_lost, test_nothing_lost_distributed = on_both_tables(
    SETTINGS,
    DIST_SETTINGS,
    calls=calls,
    capacity=st.integers(MIN_CAP, MIN_CAP + 16),
    num_shards=st.integers(1, 3),
    max_frac=st.sampled_from([None, 0.5]),
    remover=st.sampled_from(["fifo"]),  # the only remover ring storage honours (others refused)
    item_unit=st.sampled_from(["step", "episode"]),
    ops=st.lists(st.sampled_from(["sample", "delete", "update"]), min_size=10, max_size=10),
    seed=st.integers(0, 2**16),
)(_nothing_lost)

test_keys_never_reused_and_stale_detected, test_keys_never_reused_and_stale_detected_distributed = on_both_tables(
    SETTINGS,
    DIST_SETTINGS,
    calls=calls,
    capacity=st.integers(MIN_CAP, MIN_CAP + 6),
    num_shards=st.integers(1, 3),
    item_unit=st.sampled_from(["step", "episode"]),
)(_keys_never_reused_and_stale_detected)
test_keys_never_reused_and_stale_detected = example(
    calls=[[8, 8, 8]] * 5 + [[1, 2, 3], [7]], capacity=MIN_CAP + 1, num_shards=2, item_unit="step"
)(test_keys_never_reused_and_stale_detected)
test_keys_never_reused_and_stale_detected = example(
    calls=[[1, 1, 1]] * 10, capacity=MIN_CAP, num_shards=1, item_unit="episode"
)(test_keys_never_reused_and_stale_detected)

test_prioritized_probabilities_are_exact, test_prioritized_probabilities_are_exact_distributed = on_both_tables(
    SETTINGS,
    DIST_SETTINGS,
    calls=calls,
    capacity=st.integers(MIN_CAP, MIN_CAP + 16),
    num_shards=st.integers(1, 3),
    alpha=st.sampled_from([0.0, 0.5, 1.0, 1.7]),
    length=st.integers(1, 6),
    item_unit=st.sampled_from(["step", "episode"]),
    seed=st.integers(0, 2**16),
)(_prioritized_probabilities_are_exact)

test_windows_are_real, test_windows_are_real_distributed = on_both_tables(
    SETTINGS,
    DIST_SETTINGS,
    calls=calls,
    capacity=st.integers(MIN_CAP, MIN_CAP + 16),
    num_shards=st.integers(1, 3),
    length=st.integers(1, 12),
    boundary=st.sampled_from(["strict", "pad_tail", "pad_head"]),
    sampler=st.sampled_from(["uniform", "fifo", "lifo", "min_heap"]),
    item_unit=st.sampled_from(["step", "episode"]),
)(_windows_are_real)

test_strict_probabilities_stay_exact_under_churn, test_strict_probabilities_stay_exact_under_churn_distributed = (
    on_both_tables(
        SETTINGS,
        DIST_SETTINGS,
        ops=churn_ops,
        capacity=st.integers(MIN_CAP, MIN_CAP + 8),
        num_shards=st.integers(1, 2),
        alpha=st.sampled_from([0.5, 1.0]),
        item_unit=st.sampled_from(["step", "episode"]),
        max_times=st.sampled_from([0, 2]),
        seed=st.integers(0, 2**16),
    )(_strict_probabilities_stay_exact_under_churn)
)
