"""The typed coordinator client is the registry's coordinator operations, one method each, field for field."""

from __future__ import annotations

import asyncio
import inspect
import re

import pytest

from gear_flow.distributed.operations import COORDINATOR_OPS
from gear_flow.distributed.transport import CoordinatorClient


def _optional(checker) -> bool:
    try:
        checker(None)
    except Exception:  # noqa: BLE001 - the checker's own error type: None is refused
        return False
    return True


def test_every_coordinator_operation_has_one_method():
    methods = {n for n, f in vars(CoordinatorClient).items() if inspect.isfunction(f) and not n.startswith("_")}
    assert methods == set(COORDINATOR_OPS)


@pytest.mark.parametrize("op", sorted(COORDINATOR_OPS))
def test_a_methods_parameters_are_its_operations_fields_in_order(op):
    params = list(inspect.signature(getattr(CoordinatorClient, op)).parameters.values())[1:]
    fields = COORDINATOR_OPS[op].fields
    assert [p.name for p in params] == list(fields)
    for p in params:  # a field the coordinator may go without is an argument the caller may leave out
        assert (p.default is None) == _optional(fields[p.name]), (op, p.name)


class _Recorder(CoordinatorClient):
    def __init__(self, blocking: bool) -> None:
        super().__init__(None, "t", blocking)
        self.sent = []

    def _send(self, op, wait=0.0, **kw):  # what the real one sends, before the None fields are dropped
        self.sent.append((op, wait, kw))
        return None if self.blocking else asyncio.sleep(0)


def _answered(got):
    """What a client's method gave: the answer, or (on the event loop) the awaitable's."""
    return asyncio.run(got) if inspect.iscoroutine(got) else got


def test_admissions_from_a_callers_thread_may_be_held_as_long_as_their_timeout():
    c = _Recorder(blocking=True)
    c.admit_sample(4, timeout=2.5, owner="me")
    c.admit_insert(3, 1, {0: 3}, 7.0, "me")
    c.admit_hold(1.5)
    c.lookup()
    assert [(op, wait) for op, wait, _ in c.sent] == [
        ("admit_sample", 2.5), ("admit_insert", 7.0), ("admit_hold", 1.5), ("lookup", 0.0)
    ]  # fmt: skip
    ticket = c.sent[1][2].pop("ticket")
    assert c.sent[1][2] == dict(n=3, episodes=1, per_shard={0: 3}, timeout=7.0, owner="me")
    assert re.fullmatch("[0-9a-f]{32}", ticket)


@pytest.mark.parametrize("blocking", [True, False], ids=["callers-thread", "event-loop"])
def test_every_admission_carries_a_ticket_of_its_own_or_the_callers(blocking):
    """What the caller withdraws it by when its answer never comes (the coordinator's ``withdraw``)."""
    c = _Recorder(blocking)
    for got in (
        c.admit_sample(4),
        c.admit_sample(4),
        c.admit_insert(3, 1),
        c.admit_hold(),
        c.admit_sample(2, ticket="mine"),
    ):
        _answered(got)
    tickets = [kw["ticket"] for _, _, kw in c.sent]
    assert len(set(tickets[:4])) == 4 and tickets[4] == "mine"
    assert [op for op, _, _ in c.sent] == ["admit_sample", "admit_sample", "admit_insert", "admit_hold", "admit_sample"]


def test_an_admission_from_a_callers_thread_carries_the_wait_the_coordinator_gives_it():
    """Without a timeout of its own, the request says how long the coordinator holds it (both ends give up
    together); on the event loop the coordinator decides alone."""
    from gear_flow import config

    here, loop = _Recorder(blocking=True), _Recorder(blocking=False)
    for c in (here, loop):
        _answered(c.admit_sample(4))
        _answered(c.admit_insert(3, 1))
    wait = config.get("distributed.admission-timeout")
    assert [(w, kw["timeout"]) for _, w, kw in here.sent] == [(wait, wait), (wait, wait)]
    assert [kw["timeout"] for _, _, kw in loop.sent] == [None, None]
