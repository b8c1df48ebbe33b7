"""An insert's transaction, sans I/O: what the workers' answers mean is decided by the steps alone, whichever
executor carries the requests (the comm's or the lanes'). Driven here by a scripted executor: every request
the steps make is recorded in order, and each answer is the script's."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from helpers import Script

from gear_flow.distributed.transactions import (
    AbortAt,
    Commit,
    EvictTo,
    LostWorkers,
    apply_steps,
    transaction_steps,
)
from gear_flow.distributed.transport import NotAnswered, WorkerLost
from gear_flow.errors import GearFlowError, ShardLostError
from gear_flow.table import planner

MAX_SIZE = 4


def handle():
    """What the steps read of a handle: its name, where its shards are, the one eviction rule."""
    return SimpleNamespace(
        name="t", placement={0: "a", 1: "b"}, _cfg=SimpleNamespace(evicts_to_max_size=lambda size: size > MAX_SIZE)
    )


def applied(items):
    return {"items": {0: items}, "evicted": {}, "first_keys": {0: [0]}}


def sends(script):
    return [(sorted(r.calls), {op for op, _ in r.calls.values()}) for k, r in script.seen if k == "Send"]


def test_one_worker_writes_in_one_request_then_commits():
    s = Script(Send=lambda r: {"a": applied(2)}, Commit=lambda r: 2)
    res, size = planner.run(transaction_steps(handle(), "x", {"a": [{"chunks": []}]}), s)
    assert (res, size) == ({"a": applied(2)}, 2)
    assert sends(s) == [(["a"], {"write"})]
    assert s.kinds() == ["Send", "Commit"]


def test_a_write_not_answered_is_committed_as_unsettled_and_reported():
    s = Script(Send=lambda r: {"a": NotAnswered("slow")}, Commit=lambda r: 0)
    with pytest.raises(GearFlowError, match="did not answer for its part"):
        planner.run(transaction_steps(handle(), "x", {"a": []}), s)
    [(_, commit)] = [x for x in s.seen if x[0] == "Commit"]
    assert commit == Commit("x", {}, ["a"], [])  # the coordinator settles it: counted if written, else aborted


def test_a_refused_stage_aborts_everywhere_and_nothing_is_applied():
    refused = GearFlowError("bad part")
    s = Script(Send=lambda r: {"a": {"staged": 1}, "b": refused})
    with pytest.raises(GearFlowError, match="bad part"):
        planner.run(transaction_steps(handle(), "x", {"a": [], "b": []}), s)
    assert s.kinds() == ["Send", "AbortAt"]
    assert s.seen[1][1] == AbortAt("x", ["a", "b"], refused)


def test_a_lost_worker_before_staging_stores_nothing():
    lost = WorkerLost("b", "gone")
    s = Script(Send=lambda r: {"a": {"staged": 1}, "b": lost})
    with pytest.raises(ShardLostError) as e:
        planner.run(transaction_steps(handle(), "x", {"a": [], "b": []}), s)
    assert e.value.stored is False and e.value.shard == 1
    assert s.kinds() == ["Send", "AbortAt"]


def test_staged_parts_are_not_sent_again():
    s = Script(Send=lambda r: {a: applied(1) for a in r.calls}, Commit=lambda r: 2)
    planner.run(transaction_steps(handle(), "x", {"a": [], "b": []}, staged=["a"]), s)
    assert sends(s) == [(["b"], {"stage"}), (["a", "b"], {"apply"})]


def test_a_worker_lost_while_applying_keeps_the_rest_evicts_and_says_stored():
    answers = iter([{"a": applied(3), "b": WorkerLost("b", "gone")}])
    s = Script(Send=lambda r: next(answers), Commit=lambda r: 5)
    with pytest.raises(ShardLostError) as e:
        planner.run(apply_steps(handle(), "x", ["a", "b"]), s)
    assert e.value.stored is True
    assert s.kinds() == ["Send", "Commit", "LostWorkers", "EvictTo"]
    assert s.seen[1][1] == Commit("x", {"a": applied(3)}, [], [])
    assert s.seen[2][1] == LostWorkers(["b"]) and s.seen[3][1] == EvictTo(5)


def test_a_refused_apply_is_aborted_there_committed_without_it_and_raised():
    refused = GearFlowError("no room")
    answers = iter([{"a": applied(3), "b": refused}, {"b": OSError("unreachable")}])
    s = Script(Send=lambda r: next(answers), Commit=lambda r: 3)
    with pytest.raises(GearFlowError, match="did not apply its part"):
        planner.run(apply_steps(handle(), "x", ["b", "a"]), s)
    assert sends(s) == [(["a", "b"], {"apply"}), (["b"], {"abort"})]
    # the abort was not answered: the coordinator aborts that part itself
    assert s.seen[2][1] == Commit("x", {"a": applied(3)}, [], ["b"])
    assert s.kinds()[-1] == "Commit"  # 3 items: not over max_size, no eviction


def test_an_executor_that_cannot_send_a_stage_has_it_aborted_everywhere():
    def interrupted(r):
        raise KeyboardInterrupt

    s = Script(Send=interrupted)
    with pytest.raises(KeyboardInterrupt):
        planner.run(transaction_steps(handle(), "x", {"a": [], "b": []}), s)
    assert s.kinds() == ["Send", "AbortAt"] and s.seen[1][1].addrs == ["a", "b"]
