"""The steps of an insert whose parts the workers hold (the ingestion's), sans I/O: the same admission, give-back
and eviction as every insert's, driven by a scripted executor that records each request in order."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from helpers import Script

from gear_flow.distributed.writes import Unstored, held_insert_steps
from gear_flow.table import planner

MAX_SIZE = 4
ADM = {"txn": "x", "first_episode_id": 7, "first_stamp": 3, "version": 2}


def handle():
    """What the steps read of a handle: its name, owner id, timeout and the one eviction rule."""
    return SimpleNamespace(
        name="t",
        timeout=5.0,
        _ctx=SimpleNamespace(owner="me"),
        _cfg=SimpleNamespace(evicts_to_max_size=lambda size: size > MAX_SIZE),
    )


def test_admitted_learnt_staged_where_held_and_evicted_past_max_size():
    s = Script(AdmitInsert=lambda r: ADM, StoreHeld=lambda r: ({"a": "applied"}, MAX_SIZE + 1))
    got = planner.run(held_insert_steps(handle(), 10, 2, {0: 0, 1: 0}, None), s)
    assert got == ({"a": "applied"}, MAX_SIZE + 1)
    assert s.kinds() == ["AdmitInsert", "Learn", "StoreHeld", "Evict"]
    # (grouped: its parts are staged in groups of at most a shard's capacity, it may hold more than the table)
    assert s.seen[0][1].args == dict(n=10, episodes=2, per_shard={0: 0, 1: 0}, timeout=5.0, owner="me", grouped=True)
    assert s.seen[1][1].version == 2 and s.seen[2][1].adm is ADM and s.seen[3][1].size == MAX_SIZE + 1


def test_no_eviction_within_max_size():
    s = Script(AdmitInsert=lambda r: ADM, StoreHeld=lambda r: ({}, MAX_SIZE))
    planner.run(held_insert_steps(handle(), 10, 2, {0: 0}, 0.5), s)
    assert s.kinds() == ["AdmitInsert", "Learn", "StoreHeld"] and s.seen[0][1].args["timeout"] == 0.5


def test_a_failed_staging_is_aborted_on_every_worker_that_may_hold_a_part_and_raised():
    cause = ValueError("worker b could not stage")

    def fail(r):
        raise Unstored(cause, ["a", "b"], held=["a", "b"])

    s = Script(AdmitInsert=lambda r: ADM, StoreHeld=fail)
    with pytest.raises(Unstored) as ei:
        planner.run(held_insert_steps(handle(), 10, 2, {0: 0}, None), s)
    assert ei.value.cause is cause
    assert s.kinds() == ["AdmitInsert", "Learn", "StoreHeld", "Abort"]
    abort = s.seen[3][1]
    assert (abort.txn, abort.addrs, abort.cause) == ("x", ["a", "b"], cause)


def test_a_placement_not_learnt_gives_the_admission_back_with_nothing_sent():
    def fail(r):
        raise OSError("scheduler gone")

    s = Script(AdmitInsert=lambda r: ADM, Learn=fail)
    with pytest.raises(OSError, match="scheduler gone"):
        planner.run(held_insert_steps(handle(), 10, 2, {0: 0}, None), s)
    assert s.kinds() == ["AdmitInsert", "Learn", "Abort"] and s.seen[2][1].addrs == []


def test_a_failed_apply_is_not_given_back_twice():
    """Once staged everywhere the transaction settles the grant (it commits what it applied): no abort."""

    def fail(r):
        raise RuntimeError("lost while applying")

    s = Script(AdmitInsert=lambda r: ADM, StoreHeld=fail)
    with pytest.raises(RuntimeError, match="lost while applying"):
        planner.run(held_insert_steps(handle(), 10, 2, {0: 0}, None), s)
    assert s.kinds() == ["AdmitInsert", "Learn", "StoreHeld"]
