"""``max_times_sampled`` within one batch, as Reverb, on both tables.

Reverb samples a batch item by item: an ordered selector hands its best item
out again and again until the item reaches ``max_times_sampled`` and is
removed, then the next best; a weighted one draws each item from those left,
an item that reached the limit being out of the later draws.  So a batch never
hands an item out more often than it may still go, each row reports its own
occurrence's count and the probability of its own draw (``w_i / M`` over the
items left then), and the table ends empty exactly when every item went its
number of times.
"""

from __future__ import annotations

import itertools
import threading
from collections import Counter

import numpy as np
import pytest
from helpers import chi2_critical

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


def _weighted_table(make_table, sampler, mts, priorities):
    t = make_table(gf.TableSpec(TAG, capacity=64, num_shards=2), sampler=sampler, max_times_sampled=mts, seed=0)
    for tag, p in enumerate(priorities):
        t.insert([{"tag": np.array([tag], np.int64)}], priorities=[p])
    return t


@pytest.mark.parametrize("kind", ["uniform", "prioritized", "one_heavy", "tiny", "zeros"])
@pytest.mark.parametrize("mts", [1, 2])
def test_a_weighted_batch_draws_each_item_from_those_left(make_table, kind, mts):
    """Each row, in batch order, is an item still allowed then, with the probability ``w / M`` of the items
    left at that draw (replayed here); no item goes more than ``mts`` times, and the table ends empty.
    ``one_heavy``: once the heavy item is out, 4 of its 1000 parts are left, and the shard draws from the
    items left, listed, instead of by rejection.  ``tiny``: items of weight 1e-10 and 1e-12 beside ones of
    1 were taken for no mass once the others were out (below 1e-9 of it), and a batch they could fill
    waited for inserts for ever.  ``zeros`` (priorities 2, 0, 1, 0, 0): once the items with weight are out,
    partway through a batch, the batch goes on uniformly over those of weight 0 (``1/n`` a draw), as
    Reverb's prioritized selector does once no weight is left; it waited for inserts (and timed out)."""
    priorities = {
        "one_heavy": [1000.0, 1.0, 1.0, 1.0, 1.0],
        "tiny": [1.0, 1.0, 1e-10, 1e-12, 1.0],
        "zeros": [2.0, 0.0, 1.0, 0.0, 0.0],
    }.get(kind, PRIORITIES)
    sampler = gf.Uniform() if kind == "uniform" else gf.Prioritized(1.0, 0.0)
    t = _weighted_table(make_table, sampler, mts, priorities)
    weight = {tag: (1.0 if kind == "uniform" else p) for tag, p in enumerate(priorities)}
    used = dict.fromkeys(weight, 0)
    for n in {1: (3, 2), 2: (3, 4, 3)}[mts]:  # every time every item may go, over a few batches
        b = t.sample(n, timeout=30)  # (a batch that waits for inserts here never gets them)
        for tag, p, times in zip(b["tag"].numpy()[:, 0].tolist(), b.probabilities.tolist(), b.times_sampled.tolist()):
            left = {k: w for k, w in weight.items() if used[k] < mts and w > 0}  # by weight while any is left
            left = left or {k: 1.0 for k in weight if used[k] < mts}  # then uniformly over those without
            assert tag in left, (tag, used)
            assert p == pytest.approx(left[tag] / sum(left.values()), rel=1e-9)
            used[tag] += 1
            assert times == used[tag]
    assert used == dict.fromkeys(weight, mts)
    info = t.info()
    assert info["size"] == 0 and info["totals"]["expired"] == 5, info


def _reverb_chance(order: tuple, weights: list) -> float:
    """Reverb's probability of a batch handing out each item once in ``order`` (``max_times_sampled=1``): each
    row by weight among the items left with weight, then, once none is, uniformly over those left."""
    left, chance = dict(enumerate(weights)), 1.0
    for k in order:
        heavy = {j: w for j, w in left.items() if w > 0}
        if heavy and k not in heavy:
            return 0.0
        chance *= heavy[k] / sum(heavy.values()) if heavy else 1 / len(left)
        del left[k]
    return chance


@pytest.mark.parametrize("weights", [[1.0, 2.0, 3.0], [1.0, 0.0, 0.0, 0.0]], ids=["weighted", "zeros"])
def test_a_weighted_batch_of_every_item_once_is_drawn_as_reverb_draws_it(make_table, weights):
    """Prioritized weights, ``max_times_sampled=1``, a batch of every item: each order comes with Reverb's
    probability (chi-square over many batches): 1, 2, 3 give ``w_a / 6 * w_b / (6 - w_a)``; 1, 0, 0, 0 the
    item with weight first, then the other three in each of their 6 orders equally often (before, that
    batch waited for inserts once the item with weight was out)."""
    n = len(weights)
    rounds = (600 if make_table.kind == "local" else 240) if n == 3 else (480 if make_table.kind == "local" else 180)
    orders: Counter = Counter()
    t = None
    for r in range(rounds):
        if t is None or r % 60 == 0:
            t = make_table(gf.TableSpec(TAG, capacity=64, num_shards=2), sampler=gf.Prioritized(1.0, 0.0),
                           max_times_sampled=1, seed=r)  # fmt: skip
        t.insert([{"tag": np.array([tag], np.int64)} for tag in range(n)], priorities=weights)
        orders[tuple(t.sample(n, timeout=5)["tag"].numpy()[:, 0].tolist())] += 1
    chances = {o: _reverb_chance(o, weights) for o in itertools.permutations(range(n))}
    expected = {o: rounds * c for o, c in chances.items() if c > 0}
    assert len(expected) == 6 and set(orders) <= set(expected), orders
    stat = sum((orders[o] - e) ** 2 / e for o, e in expected.items())
    assert stat < chi2_critical(5), (stat, orders)


SAMPLERS = {"uniform": gf.Uniform, "fifo": gf.Fifo, "prioritized": lambda: gf.Prioritized(1.0, 0.0)}


def _tags(n0: int, n: int) -> list[dict]:
    return [{"tag": np.array([tag], np.int64)} for tag in range(n0, n0 + n)]


def test_a_batch_more_than_the_table_can_ever_hold_is_refused_at_once(make_table):
    """With max_size 3 and max_times_sampled 1 no batch of 4 can ever be filled: it is refused at once (it
    waited for inserts forever, first in line, so a batch of 1 behind it timed out too); one of 3 goes."""
    t = make_table(gf.TableSpec(TAG, capacity=64, num_shards=2, max_size=3), sampler=gf.Fifo(), max_times_sampled=1,
                   seed=0)  # fmt: skip
    with pytest.raises(gf.SpecError, match="a sample of 4 items can never be filled: .* 3 rows in all"):
        t.sample(4, timeout=None)
    t.insert(_tags(0, 3))
    assert sorted(t.sample(3, timeout=5)["tag"].numpy()[:, 0].tolist()) == [0, 1, 2]


@pytest.mark.parametrize("kind", sorted(SAMPLERS))
def test_a_batch_the_items_left_cannot_fill_waits_for_inserts_and_takes_nothing(make_table, kind):
    """3 items that may each go once and a batch of 5: the batch times out and nothing of it was taken (the
    three still go, once each); a batch of 4 waiting in another thread is served once 2 more arrive, with
    the four items left (Fifo: oldest first), never with an item twice."""
    t = make_table(gf.TableSpec(TAG, capacity=64, num_shards=2), sampler=SAMPLERS[kind](), max_times_sampled=1,
                   seed=0)  # fmt: skip
    t.insert(_tags(0, 3))
    with pytest.raises(gf.RateLimitTimeout, match="sample of 5"):
        t.sample(5, timeout=0.5)
    assert t.info()["size"] == 3
    b = t.sample(2)
    first = b["tag"].numpy()[:, 0].tolist()
    assert b.times_sampled.tolist() == [1, 1] and len(set(first)) == 2
    if kind == "fifo":
        assert first == [0, 1]
    got: list = []
    waiting = threading.Thread(target=lambda: got.append(t.sample(4, timeout=60)))
    waiting.start()
    t.insert(_tags(3, 1))  # 2 items left: still short
    t.insert(_tags(4, 1))
    t.insert(_tags(5, 1))  # 4 left: enough, whenever the sample looks again
    waiting.join()
    rows = got[0]["tag"].numpy()[:, 0].tolist()
    left = [tag for tag in range(6) if tag not in first]
    if kind == "fifo":
        assert rows == left
    else:
        assert Counter(rows) == Counter(left)
    assert got[0].times_sampled.tolist() == [1, 1, 1, 1]
    info = t.info()
    assert info["size"] == 0 and info["totals"]["expired"] == 6, info


@pytest.mark.parametrize("mts", [1, 2])
@pytest.mark.parametrize("kind", sorted(SAMPLERS))
def test_batches_taken_while_a_writer_inserts_hand_every_item_out_exactly_max_times_sampled(make_table, kind, mts):
    """A writer inserts 96 items in calls of 1, 2 and 3 while batches of 4 are taken until every item went
    ``mts`` times: no item goes more often, each row's count is its occurrence's, and a Fifo hands the items
    out in insertion order (each one ``mts`` times in a row)."""
    n, B = 96, 4
    t = make_table(gf.TableSpec(TAG, capacity=256, num_shards=2), sampler=SAMPLERS[kind](), max_times_sampled=mts,
                   seed=1)  # fmt: skip
    errors: list = []

    def write():
        try:
            at = 0
            for k in itertools.cycle((1, 2, 3)):
                if at == n:
                    return
                t.insert(_tags(at, k))
                at += k
        except Exception as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    writer = threading.Thread(target=write)
    writer.start()
    rows, times = [], []
    try:
        for _ in range(n * mts // B):
            b = t.sample(B, timeout=60)
            rows += b["tag"].numpy()[:, 0].tolist()
            times += b.times_sampled.tolist()
            assert ((b.probabilities > 0) & (b.probabilities <= 1)).all()
    finally:
        writer.join()
    assert not errors, errors
    assert Counter(rows) == dict.fromkeys(range(n), mts)
    seen: Counter = Counter()
    for tag, k in zip(rows, times):
        seen[tag] += 1
        assert k == seen[tag]
    if kind == "fifo":
        assert rows == [tag for tag in range(n) for _ in range(mts)]
    info = t.info()
    assert info["size"] == 0 and info["totals"]["expired"] == n, info


@pytest.mark.parametrize("num_shards", [1, 2])
def test_a_without_replacement_batch_the_items_left_cannot_fill_takes_nothing(make_table, num_shards):
    """WithoutReplacement with max_times_sampled=1: 6 items can fill no batch of 7 (each goes once, and a
    new epoch brings none back); the batch waits and times out with nothing taken, where it expired all six
    and raised EmptyTableError (local) or handed one out twice (distributed).  A batch of 6 then takes each
    once; with max_times_sampled=2 a batch of 7 straddles two epochs, no item out more than twice."""
    for mts in (1, 2):
        t = make_table(gf.TableSpec(TAG, capacity=64, num_shards=num_shards), sampler=gf.WithoutReplacement(),
                       max_times_sampled=mts, seed=0)  # fmt: skip
        t.insert([{"tag": np.arange(2 * i, 2 * i + 2, dtype=np.int64)} for i in range(3)])
        if mts == 1:
            with pytest.raises(gf.RateLimitTimeout, match="items left"):
                t.sample(7, timeout=0.3)
            info = t.info()
            assert info["size"] == 6 and info["totals"]["expired"] == 0 and info["totals"]["sampled"] == 0
            assert sorted(t.sample(6)["tag"].numpy()[:, 0].tolist()) == list(range(6))
        else:
            out = Counter(t.sample(7)["tag"].numpy()[:, 0].tolist())
            assert sum(out.values()) == 7 and set(out) == set(range(6)) and max(out.values()) == 2
        assert t.info()["totals"]["expired"] == (6 if mts == 1 else 1)


@pytest.mark.parametrize("seed", [0, 1])
def test_without_replacement_never_hands_an_item_out_more_than_max_times_sampled(make_table, seed):
    """Random inserts and batches of 1-5 on a WithoutReplacement table with max_times_sampled=2: no item goes
    out more than twice, also in a batch that straddles epochs, where an item drawn before the new epoch may
    not be drawn again in it once it went as often as it may (a distributed batch counts its draws only at
    its finish); a batch the items left cannot fill takes nothing."""
    t = make_table(gf.TableSpec(TAG, capacity=256, num_shards=2), sampler=gf.WithoutReplacement(),
                   max_times_sampled=2, seed=seed)  # fmt: skip
    rng, out, tag = np.random.default_rng(seed), Counter(), 0
    for _ in range(40):
        k = int(rng.integers(0, 3))
        if k:
            t.insert([{"tag": np.array([tag + j], np.int64)} for j in range(k)])
            tag += k
        before = t.info()["totals"]
        try:
            b = t.sample(int(rng.integers(1, 6)), timeout=0.05)
        except gf.RateLimitTimeout:
            assert t.info()["totals"] == before  # nothing taken
            continue
        out.update(b["tag"].numpy()[:, 0].tolist())
        assert max(out.values()) <= 2, out.most_common(3)
    assert sum(out.values()) > 40 and 2 in out.values()
