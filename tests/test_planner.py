"""The one planner on its own: pure plans driven by hand-written answers and by in-process shards."""

from __future__ import annotations

import numpy as np
import pytest

import gear_flow as gf
from gear_flow.shard import EpisodeBatch, Shard
from gear_flow.table import planner
from gear_flow.table.executor import evict_shards

X = (gf.ColumnSpec("x", (), np.float32),)


def shard(i, remover, n, priority, capacity=64):
    s = Shard(gf.TableSpec(X, capacity=capacity), i, gf.Uniform(), remover)
    if n:
        ones = [{"x": np.zeros(1, np.float32)} for _ in range(n)]
        s.insert(EpisodeBatch(ones, np.ones(n, np.int64), np.arange(n), np.arange(n) + 100 * i, np.full(n, priority)))
    return s


def test_eviction_rounds_continue_until_the_excess_is_gone():
    """A weighted remover whose weight sits on 2 items of shard 0: the first multinomial round asks
    shard 0 for more than it holds (clipped), later rounds take the rest where the weight is left,
    and once every remaining weight is 0 the rounds fall back to sizes (uniform)."""
    shards = {0: shard(0, gf.Prioritized(1.0), 2, 1000.0), 1: shard(1, gf.Prioritized(1.0), 20, 0.0)}
    removed = evict_shards(shards, 12, ordered=False, rng=np.random.default_rng(0))
    assert removed == 12
    assert shards[0].size == 0 and shards[1].size == 10


def test_eviction_stops_when_nothing_is_left_or_nothing_moves():
    shards = {0: shard(0, gf.Prioritized(1.0), 3, 1.0)}
    assert evict_shards(shards, 10, ordered=False, rng=np.random.default_rng(0)) == 3
    plan = planner.evict(5, ordered=True, rng=np.random.default_rng(0))
    req = next(plan)
    assert isinstance(req, planner.Candidates) and req.role == "remover"
    with pytest.raises(StopIteration) as stop:
        plan.send({0: (np.array([3, 4]), np.array([2.0, 1.0]))})  # two victims offered...
        plan.send(0)  # ...but a concurrent removal took them: no progress, the plan ends
    assert stop.value.value == 0


def test_ordered_plans_put_rows_in_global_order():
    plan = planner.sample("ordered", 4, np.random.default_rng(0))
    assert isinstance(next(plan), planner.Candidates)
    take = plan.send({0: (np.array([10, 11]), np.array([4.0, 1.0])), 1: (np.array([20, 21]), np.array([3.0, 2.0]))})
    assert {s: v.tolist() for s, v in take.slots.items()} == {0: [10, 11], 1: [20, 21]}
    assert planner.offsets(take.slots) == {0: 0, 1: 2}
    with pytest.raises(StopIteration) as stop:
        plan.send(None)
    rows_at = stop.value.value.rows_at  # gathered [10, 11, 20, 21] belong at positions 0, 3, 1, 2
    assert rows_at.tolist() == [0, 3, 1, 2] and planner.sources(rows_at).tolist() == [0, 2, 3, 1]


def test_weighted_plans_report_the_planned_share_and_refuse_an_empty_table():
    plan = planner.sample("weighted", 1000, np.random.default_rng(1))
    assert next(plan) == planner.Summaries(("sampler",))
    draw = plan.send({"sampler": {0: 1.0, 1: 3.0}})
    assert draw.scale == {0: 0.25, 1: 0.75} and sum(draw.counts.values()) == 1000
    empty = planner.sample("weighted", 4, np.random.default_rng(1))
    next(empty)
    assert empty.send({"sampler": {0: 0.0}}) == planner.Summaries(("valid",))  # all weights 0: by valid count
    with pytest.raises(planner.NothingToSample):
        empty.send({"valid": {0: 0.0}})


def test_limited_plans_short_of_items_raise_before_taking_anything():
    """With ``max_times_sampled`` (``ordered_limited``, ``sequential``), candidates or draws that cannot fill
    the batch raise ShortOfItems instead of a Take (no row repeated); without it the ordered best repeat."""
    cands = {0: (np.array([10]), np.array([4.0])), 1: (np.array([20, 20]), np.array([3.0, 3.0]))}
    limited = planner.sample("ordered_limited", 4, np.random.default_rng(0))
    next(limited)
    with pytest.raises(planner.ShortOfItems) as short:
        limited.send(cands)
    assert (short.value.have, short.value.want) == (3, 4)
    free = planner.sample("ordered", 4, np.random.default_rng(0))
    next(free)
    assert isinstance(free.send(cands), planner.Take)
    seq = planner.sample("sequential", 4, np.random.default_rng(0))
    next(seq)
    req = seq.send({"sampler": {0: 1.0, 1: 1.0}})
    assert req == planner.Sequences(4, False)
    one = (np.array([7]), np.array([1.0]), np.array([1.0, 0.0]), np.array([70]))  # slots, probs, masses, seqs
    none = (np.zeros(0, np.int64), np.zeros(0), np.zeros(1), np.zeros(0, np.int64))  # no item of weight 0 left
    with pytest.raises(planner.ShortOfItems) as short:
        seq.send({0: one + none, 1: one + none})
    assert (short.value.have, short.value.want) == (2, 4)
    # the same with one item of weight 0 on each shard: the batch goes on uniformly over them (Reverb's)
    seq = planner.sample("sequential", 4, np.random.default_rng(0))
    next(seq)
    seq.send({"sampler": {0: 1.0, 1: 1.0}})
    zero = (np.array([9]), np.array([1.0]), np.array([1.0, 0.0]), np.array([90]))
    take = seq.send({0: one + zero, 1: one + zero})
    assert isinstance(take, planner.Take)
    for s in (0, 1):  # each shard's item with weight in the first two rows, its item without in the last two
        assert sorted(take.slots[s].tolist()) == [7, 9] and sorted(take.seqs[s].tolist()) == [70, 90]
    assert sorted(p for s in (0, 1) for p in take.probs[s].tolist()) == [0.5, 0.5, 1.0, 1.0]


def test_an_executors_error_is_thrown_into_the_generator_it_drives():
    """run and run_async throw an answer's error in at the request that met it: the generator says what it
    means (the distributed table's sample steps give their grant back and wait, or raise it on)."""
    import asyncio

    def steps():
        try:
            yield "first"
        except KeyError as e:
            got = yield f"after {e.args[0]}"
            return ("handled", got)

    def answer(req):
        if req == "first":
            raise KeyError("k")
        return req.upper()

    async def answer_async(req):
        return answer(req)

    assert planner.run(steps(), answer) == ("handled", "AFTER K")
    assert asyncio.run(planner.run_async(steps(), answer_async)) == ("handled", "AFTER K")

    def unhandled():
        yield "first"

    with pytest.raises(KeyError):
        planner.run(unhandled(), answer)


def _steps(log):
    """A plan of three requests that records each answer, and what was thrown into it."""
    for req in ("a", "b", "c"):
        try:
            log.append((req, (yield req)))
        except KeyError as e:
            log.append((req, f"thrown {e}"))
    return "done"


def test_a_plan_handed_over_midway_is_resumed_at_its_request_elsewhere():
    """``run``'s ``hand_over`` takes the plan at the request whose answer raised (the error is raised, not
    thrown in); ``resumed`` asks that request again and goes on, errors thrown in as ``run`` does."""
    log, taken = [], []

    def answer(req):
        if req == "b":
            raise KeyboardInterrupt
        return req.upper()

    def hand_over(plan, req, error):
        taken.append((plan, req, type(error)))
        return not isinstance(error, Exception)

    plan = _steps(log)
    with pytest.raises(KeyboardInterrupt):
        planner.run(plan, answer, hand_over)
    assert log == [("a", "A")] and [(r, e) for _, r, e in taken] == [("b", KeyboardInterrupt)]

    def again(req):
        if req == "c":
            raise KeyError("lost")
        return req * 2

    assert planner.run(planner.resumed(taken[0][0], "b"), again) == "done"
    assert log == [("a", "A"), ("b", "bb"), ("c", "thrown 'lost'")]


def test_an_error_hand_over_declines_is_thrown_into_the_plan():
    log = []

    def answer(req):
        if req == "a":
            raise KeyError("x")
        return req

    assert planner.run(_steps(log), answer, lambda plan, req, e: False) == "done"
    assert log == [("a", "thrown 'x'"), ("b", "b"), ("c", "c")]
