"""The wire protocol defends itself: malformed, out-of-range and version-skewed messages change nothing.

Messages are sent raw over Dask's comm to the workers' ``gear_flow`` handler
and the scheduler's ``gear_flow_coord`` handler of the session's 2-worker
LocalCluster, as a buggy or version-skewed client would.  After every one: the
reply is a GearFlowError, the worker processes are the same (none crashed and
was restarted by its nanny), the table's counters and data (read inside the
workers) are unchanged, and a normal sample still works.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from dist_support import assert_same, coordinator, snapshot
from distributed.protocol import to_serialize
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gear_flow as gf
from gear_flow.distributed import DistributedTable, checkers, protocol, wire
from gear_flow.distributed.transport import unwrap

pytestmark = pytest.mark.timeout(300)

COLS = (gf.ColumnSpec("obs", (64,), np.float32), gf.ColumnSpec("r", (), np.float32))


def eps(n, T=5):
    return [{"obs": np.full((T, 64), i, np.float32), "r": np.ones(T, np.float32)} for i in range(n)]


@pytest.fixture(scope="module")
def tables(dist_client):
    """A prioritized table and a Fifo table, both with two shards on two workers."""
    out = {}
    for kind, sampler in (("prio", gf.Prioritized()), ("fifo", gf.Fifo())):
        t = DistributedTable.create(
            dist_client, gf.TableSpec(COLS, capacity=256, num_shards=2), sampler=sampler, seed=0
        )
        t.insert(eps(8))
        out[kind] = t
    yield out
    for t in out.values():
        t.close()


def pids(client):
    return client.run(os.getpid)


def raw_worker(t, op, args, v=protocol.VERSION, shard=0, packed=False):
    """Send ``args`` as a plain ``args`` dict, or (``packed``) as the handles do (:mod:`gear_flow.distributed.wire`)."""

    async def go():
        body = wire.encode(args) if packed else {"args": to_serialize(args)}
        return await t.client.rpc(t.placement[shard]).gear_flow(action=op, v=v, **body)

    return t.client.sync(go)


def raw_packed(t, op, fields, shard=0):
    """Send the message fields as given (a hand-made ``packed``/``frames``)."""

    async def go():
        return await t.client.rpc(t.placement[shard]).gear_flow(action=op, v=protocol.VERSION, **fields)

    return t.client.sync(go)


def raw_coord(t, op, v=protocol.VERSION, **kw):
    async def go():
        return await t.client.scheduler.gear_flow_coord(action=op, v=v, **kw)

    return t.client.sync(go)


def refused(resp, *match) -> str:
    assert resp["status"] == "error", resp
    err = resp["error"]
    assert isinstance(err, gf.GearFlowError), repr(err)
    msg = str(err)
    for m in match:
        assert m in msg, msg
    return msg


class Unchanged:
    """Worker processes, table data and counters are the same after the block; a sample still works."""

    def __init__(self, client, t):
        self.client, self.t = client, t

    def __enter__(self):
        self.pids, self.state = pids(self.client), snapshot(self.t)
        return self

    def __exit__(self, *exc):
        if exc[0] is None:
            assert pids(self.client) == self.pids, "a worker process died and was restarted"
            assert_same(self.state, snapshot(self.t))
            assert len(self.t.sample(4)) == 4


# -- the cases found by hand, each pinned --------------------------------------------------------------------
def test_sample_part_out_buffer_smaller_than_the_batch(dist_client, tables):
    t = tables["prio"]
    small = {"obs": np.zeros((2, 1, 256), np.uint8), "r": np.zeros((2, 1, 4), np.uint8)}
    args = dict(name=t.name, length=1, boundary="pad_tail", columns=["obs", "r"], seed=1, counts={0: 64},
                scale={0: 0.5}, out=small, offsets={0: 0})  # fmt: skip
    with Unchanged(dist_client, t):
        refused(raw_worker(t, "sample_part", args), "do not fit out['obs']")
        args["offsets"] = {0: 10**6}  # far beyond the batch
        args["out"] = {"obs": np.zeros((64, 1, 256), np.uint8), "r": np.zeros((64, 1, 4), np.uint8)}
        refused(raw_worker(t, "sample_part", args), "offset 1000000")
        args.update(out=None, offsets=None, counts={0: 4}, scale={0: 0.5}, length=0)
        refused(raw_worker(t, "sample_part", args), "'length'")
        args.update(length=1, boundary="sideways")
        refused(raw_worker(t, "sample_part", args), "'boundary'")
        args.update(boundary="pad_tail", counts=None, scale=None, slots={0: np.array([-4095])})
        refused(raw_worker(t, "sample_part", args), "'slots'")


def test_stage_with_rows_narrower_than_the_spec(dist_client, tables):
    t = tables["prio"]
    part = {"shard": 0, "chunks": [{"obs": np.zeros((5, 1), np.float32), "r": np.ones(5, np.float32)}],
            "lengths": np.array([5]), "episode_ids": np.array([999]), "stamps": np.array([999]), "priorities": None}  # fmt: skip
    with Unchanged(dist_client, t):
        refused(raw_worker(t, "write", dict(name=t.name, txn="x" * 8, parts=[part])), "column 'obs' must be float32[5")
    info = t.info()
    assert info["size"] == info["coordinator_size"]


def test_a_write_the_public_insert_would_refuse_is_refused_by_the_worker(dist_client, tables):
    """A column the table does not have, and a priority whose weight the sum tree cannot hold, are refused by
    the worker's ``write`` as the public insert refuses them, not dropped or stored (a weight of 1e308 made
    every later draw's probabilities 0 and its weights NaN)."""
    t = tables["prio"]
    extra = {"shard": 0, "chunks": [{**eps(1)[0], "zz": np.ones(5)}], "lengths": np.array([5]),
             "episode_ids": np.array([998]), "stamps": np.array([998]), "priorities": None}  # fmt: skip
    with Unchanged(dist_client, t):
        refused(raw_worker(t, "write", dict(name=t.name, txn="y" * 8, parts=[extra])), "unknown column", "'zz'")
    t1 = DistributedTable.create(dist_client, gf.TableSpec(COLS, capacity=256, num_shards=2),
                                 sampler=gf.Prioritized(alpha=1.0), seed=0)  # fmt: skip
    try:
        t1.insert(eps(4))
        heavy = {**extra, "chunks": eps(1), "priorities": np.full(5, 1e308)}
        with Unchanged(dist_client, t1):
            refused(raw_worker(t1, "write", dict(name=t1.name, txn="z" * 8, parts=[heavy])), "1e+280")
    finally:
        t1.close()


def test_sample_all_and_parts_refuse_windows_longer_than_the_shards(dist_client, tables):
    """A raw ``sample_all`` or ``sample_part`` is checked as the public sample is: a window longer than the
    shard's capacity (a length of 2**30 had ``sample_all`` allocate the batch until its nanny killed the
    worker, its shards lost; ``sample_part`` answered a misleading stale selection, which invites a retry)."""
    t = tables["fifo"]
    args = dict(name=t.name, n=1, length=257, boundary="pad_tail", columns=["obs", "r"], seed=0)
    with Unchanged(dist_client, t):
        refused(raw_worker(t, "sample_all", args), "longer than a shard holds")
    p = tables["prio"]
    args = dict(name=p.name, length=257, boundary="pad_tail", columns=["obs", "r"], seed=0, counts={0: 1},
                scale={0: 1.0})  # fmt: skip
    with Unchanged(dist_client, p):
        refused(raw_worker(p, "sample_part", args), "longer than a shard holds")


def test_coordinator_counts_cannot_be_corrupted(dist_client, tables):
    t = tables["prio"]
    with Unchanged(dist_client, t):
        refused(raw_coord(t, "admit_insert", name=t.name, n=10**12, episodes=1), "can never be stored")
        refused(raw_coord(t, "admit_insert", name=t.name, n=-100, episodes=1), "field 'n'")
        refused(raw_coord(t, "admit_insert", name=t.name, n=float("nan"), episodes=1), "field 'n'")
        refused(raw_coord(t, "admit_sample", name=t.name, n=-5), "field 'n'")
        refused(raw_coord(t, "admit_sample", name=t.name, n=10**12), "field 'n'")  # refused at once, no waiter
        refused(raw_coord(t, "admit_sample", name=t.name, n=1, after=-1), "field 'after'")
        refused(raw_coord(t, "admit_sample", name=t.name, n=1, after="soon"), "field 'after'")
        refused(raw_coord(t, "removed", name=t.name, k=-(10**12)), "field 'k'")
        refused(raw_coord(t, "removed", name=t.name, k=10**6, per_shard={0: 10**6}), "cannot have left")
        refused(raw_coord(t, "count_samples", name=t.name, n=-(10**12)), "field 'n'")
        refused(raw_coord(t, "commit_insert", name=t.name, txn="nope", items={0: 5}, evicted={}), "no insert")
        refused(raw_coord(t, "commit_insert", name=t.name, txn="nope", items={}, evicted={},
                          unsettled=["tcp://10.9.9.9:1"]), "hold no shard")  # fmt: skip
        refused(raw_coord(t, "abort_insert", name=t.name, txn="nope", unreached="tcp://10.9.9.9:1"), "'unreached'")
        refused(raw_coord(t, "abort_insert", name=t.name, txn="nope", unreached=[7]), "'unreached'")
        refused(raw_coord(t, "commit_insert", name=t.name, txn="nope", items={}, evicted={}, unreached=[7]),
                "'unreached'")  # fmt: skip
        # an insert not in flight: nothing given back, and no abort sent to the worker named
        ok = raw_coord(t, "abort_insert", name=t.name, txn="nope", unreached=[t.placement[0]])
        assert unwrap(ok) is False, ok
        refused(raw_coord(t, "mark_lost", name=t.name, shard=200), "field 'shard'")
        refused(raw_coord(t, "mark_lost", name=t.name, shard=5), "no shard 5")
        refused(raw_coord(t, "shard_restored", name=t.name, shard=99, worker="x", size=1, inserted=1), "no shard 99")
        refused(raw_coord(t, "admit_insert", name=t.name, n=1, episodes=1, bogus=1), "unknown field(s) ['bogus']")
    assert coordinator(t).lookup()["waiting"] == {"inserts": 0, "samples": 0}


def test_updates_and_selections_are_checked_by_the_worker(dist_client, tables):
    t = tables["prio"]
    with Unchanged(dist_client, t):
        for bad in ([float("nan")], [float("inf")], [-1.0]):
            refused(raw_worker(t, "update", dict(name=t.name, seqs_by_shard={0: np.array([0])},
                                                 prios_by_shard={0: np.array(bad)})), "'prios_by_shard'")  # fmt: skip
        one = dict(name=t.name, seqs_by_shard={0: np.array([0, 1])}, prios_by_shard={0: np.array([5.0, 6.0])})
        for stamps in ({0: np.array([100])}, {0: np.array([100, 101, 102])}, {1: np.array([100, 101])}):
            refused(raw_worker(t, "update", dict(one, stamps_by_shard=stamps)), "stamps are not one per key")
        refused(raw_worker(t, "candidates", dict(name=t.name, n=4)), "is not ordered")
        refused(raw_worker(t, "summaries", dict(name=t.name, kinds=["unseen"])), "without epochs")
        refused(raw_worker(t, "sample_part", dict(name=t.name, length=1)), "'boundary'")
        refused(raw_worker(t, "sample", dict(name=t.name)), "unknown operation 'sample'")
        refused(raw_worker(t, "info", dict(name=t.name, extra=1)), "unknown field(s) ['extra']")
    f = tables["fifo"]
    with Unchanged(dist_client, f):
        refused(raw_worker(f, "summaries", dict(name=f.name, kinds=["sampler"])), "ordered sampler")
        refused(raw_worker(f, "sample_part", dict(name=f.name, length=1, boundary="strict", columns=["obs"], seed=0,
                                                  counts={0: 2}, scale={0: 1.0})), "give slots")  # fmt: skip
        refused(raw_worker(f, "remove", dict(name=f.name, counts={0: 1}, seqs={0: np.array([0])})), "seqs must name")
        refused(raw_worker(f, "remove", dict(name=f.name, slots={0: np.array([0, 1])}, seqs={0: np.array([0])})),
                "shard 0 has 2 slots and 1 seqs")  # fmt: skip


def test_unreadable_packed_arguments_are_refused(dist_client, tables):
    t = tables["prio"]
    good = wire.encode(dict(name=t.name))
    big = wire.encode({"name": t.name, "x": np.zeros(wire.INLINE_MAX, np.uint8)})  # one frame
    with Unchanged(dist_client, t):
        refused(raw_packed(t, "info", {"packed": b"not a pickle"}), "'info'", "unreadable packed arguments")
        refused(raw_packed(t, "info", {"packed": 12}), "unreadable packed arguments")
        refused(raw_packed(t, "info", {"packed": big["packed"]}), "frame reference 0 out of range")
        refused(raw_packed(t, "info", {**good, "args": to_serialize(dict(name=t.name))}), "not both")
        refused(raw_packed(t, "info", {"packed": wire.encode([1, 2])["packed"]}), "'info'")  # not a dict of fields
        assert raw_packed(t, "info", good)["status"] == "OK"


def test_another_protocol_version_is_refused_naming_both(dist_client, tables):
    t = tables["prio"]
    with Unchanged(dist_client, t):
        msg = refused(raw_worker(t, "info", dict(name=t.name), v=protocol.VERSION - 1), f"protocol {protocol.VERSION}")
        assert repr(protocol.VERSION - 1) in msg
        refused(raw_worker(t, "info", dict(name=t.name), v=None), "version None")
        refused(raw_coord(t, "lookup", name=t.name, v=protocol.VERSION + 1), f"version {protocol.VERSION + 1}")
    # a client process of another version: attach is refused with a clear error
    code = (
        "import sys\nfrom distributed import Client\nimport gear_flow.distributed.protocol as p\n"
        "p.VERSION += 1\nfrom gear_flow.distributed import DistributedTable\n"
        "try:\n    DistributedTable.attach(sys.argv[2], Client(sys.argv[1]))\n"
        "except Exception as e:\n    print(type(e).__name__, e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, dist_client.scheduler.address, t.name], capture_output=True, text=True, timeout=60
    ).stdout
    assert out.startswith("ProtocolError") and f"version {protocol.VERSION + 1}" in out, out


def test_move_messages_that_name_no_move_change_nothing(dist_client, tables):
    """The steps of a move sent by hand with a made-up move id, a shard the worker does not hold, an
    unreachable source, the worker itself or a shard it holds as the source: refused with a clear error or
    answered as a no-op, and the table is as it was (no worker left sealed: the sample after it works)."""
    t = tables["prio"]
    with Unchanged(dist_client, t):
        assert wire.result(raw_worker(t, "move_thaw", {"name": t.name, "move": "m" * 8}, packed=True)) is False
        assert wire.result(raw_worker(t, "move_abort", {"name": t.name, "move": "m" * 8}, packed=True)) is False
        args = {"name": t.name, "shards": [0], "move": "m" * 8, "epoch": 1 << 40}
        assert wire.result(raw_worker(t, "move_release", args, packed=True)) is False  # not sealed by that move
        refused(raw_worker(t, "move_commit", {"name": t.name, "move": "m" * 8, "epoch": 1 << 40}), "no shards")
        refused(raw_worker(t, "move_out", {"name": t.name, "shards": [99], "move": "m" * 8, "lease": 60.0}), "99")
        # a seal that would end at once (or never): refused before anything is sealed
        refused(raw_worker(t, "move_out", {"name": t.name, "shards": [0], "move": "m" * 8, "lease": 0.0}), "lease")
        refused(raw_worker(t, "move_out", {"name": t.name, "shards": [0], "move": "m" * 8}), "lease")
        bad = {"name": t.name, "config": t._config, "move": "m" * 8, "source": "tcp://127.0.0.1:1", "shards": [0]}
        bad["lease"] = 60.0
        refused(raw_worker(t, "move_in", bad, packed=True))
        refused(raw_worker(t, "move_in", {**bad, "source": t.placement[0]}, packed=True), "the source is this worker")
        refused(raw_worker(t, "move_in", {**bad, "source": t.placement[1]}, packed=True), "on this worker already")
        # that move id was aborted here above: a pull for it never begins (the source is not sealed for it)
        refused(raw_worker(t, "move_in", {**bad, "source": t.placement[1], "shards": [1]}, packed=True), "was undone")
        refused(raw_coord(t, "move", name=t.name, shards=[0], worker="tcp://10.9.9.9:1"), "not a worker")
        refused(raw_coord(t, "move", name=t.name, shards=[99]), "not a live shard")
    # the worker's epoch is what it is: a request planned at a later one passes, none is refused yet
    assert wire.result(raw_worker(t, "info", {"name": t.name, "epoch": 1 << 40}, packed=True))


# -- fuzz: every operation, junk in one field ----------------------------------------------------------------
JUNK = [None, -1, -(10**12), 10**19, float("nan"), float("inf"), 1.5, True, "", "x" * 600, [1, "a"], {"a": 1},
        np.zeros((2, 2)), np.array([-5]), np.array(["a"])]  # fmt: skip


def _valid(t, op) -> dict:
    """A well-formed message for ``op`` that nevertheless names no real data (so junk in one field is all that differs)."""
    base = {"name": t.name}
    return {
        "create": {**base, "config": {}, "shard_ids": [0]},
        "drop_shard": {**base, "shard": 0, "epoch": 1},
        "stage": {**base, "txn": "t" * 8, "parts": []},
        "apply": {**base, "txn": "t" * 8},
        "write": {**base, "txn": "t" * 8, "parts": []},
        "abort": {**base, "txn": "t" * 8},
        "status": {**base, "txn": "t" * 8},
        "summaries": {**base, "kinds": ["size"], "length": 1, "boundary": "strict"},
        "candidates": {**base, "n": 1, "role": "remover"},
        "sample_part": {
            **base,
            "length": 1,
            "boundary": "strict",
            "columns": ["r"],
            "seed": 0,
            "counts": {0: 1},
            "scale": {0: 0.5},
        },  # fmt: skip
        "finish_sample": {**base, "txn": "t" * 8, "commit": False},
        "uncount": {**base, "counts": {0: 0}},
        "sample_all": {**base, "n": 1, "length": 1, "boundary": "strict", "columns": ["r"], "seed": 0},
        "check_keys": {**base, "seqs_by_shard": {0: np.array([0])}},
        "update": {**base, "seqs_by_shard": {0: np.array([0])}, "prios_by_shard": {0: np.array([1.0])}},
        "delete": {**base, "seqs_by_shard": {0: np.array([0])}},
        "remove": {**base, "counts": {0: 0}},
        "checkpoint": {**base, "directory": "/nonexistent/x"},
        "restore": {**base, "config": {}, "directory": "/nonexistent", "files": {}},
    }.get(op, base)


WORKER_OPS = sorted(set(protocol.WORKER) - {"drop", "new_epoch", "info", "nbytes"})  # those take only a name
COORD_OPS = sorted(set(protocol.COORDINATOR) - {"lookup", "list", "workers", "close", "drop"})


@settings(max_examples=120, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_fuzz_every_operation_with_junk(dist_client, tables, data):
    t = tables[data.draw(st.sampled_from(["prio", "fifo"]))]
    to_worker = data.draw(st.booleans())
    ops = WORKER_OPS if to_worker else COORD_OPS
    op = data.draw(st.sampled_from(ops))
    schema = (protocol.WORKER if to_worker else protocol.COORDINATOR)[op]
    msg = _valid(t, op) if to_worker else {}
    how = data.draw(st.sampled_from(["junk", "unknown", "drop"] if schema else ["unknown"]))
    if how == "unknown":
        msg["no_such_field"] = 1
    else:
        field = data.draw(st.sampled_from(sorted(schema)))
        if how == "drop" and field in msg:
            del msg[field]
            if msg.get(field) is None and _accepts_none(schema[field]):
                msg["no_such_field"] = 1  # an optional field's absence is valid: make the message bad another way
        else:
            value = data.draw(st.sampled_from(JUNK))
            if _accepts(schema[field], value):
                value = -(10**12) if not _accepts(schema[field], -(10**12)) else "x" * 600
            if _accepts(schema[field], value):
                msg["no_such_field"] = 1
            msg[field] = value
    packed = data.draw(st.booleans())  # as the handles send it, or as a plain dict
    with Unchanged(dist_client, t):
        resp = raw_worker(t, op, msg, packed=packed) if to_worker else raw_coord(t, op, name=t.name, **msg)
        refused(resp)


def _accepts(checker, value) -> bool:
    try:
        checker(value)
        return True
    except checkers._Bad:
        return False


def _accepts_none(checker) -> bool:
    return _accepts(checker, None)


def _layout(name, dask_worker=None):
    return dask_worker.plugins["gear-flow"].host.shared_layout(name)


def test_draw_host_maps_only_gear_flow_segments_it_is_told_of(dist_client, tables):
    """A ``draw_host`` request names the layouts of the segments to draw from: one that is not a shard
    layout gear_flow publishes, or names another kind of segment, is refused in one line, nothing mapped."""
    t = tables["prio"]
    lay = t.client.run(_layout, t.name, workers=[t.placement[0]])[t.placement[0]]
    good = lay["shards"][0]
    part = {"counts": {0: 2}, "scale": {0: 1.0}, "seed": 1}
    args = dict(name=t.name, length=1, boundary="pad_tail", columns=["obs"])
    with Unchanged(dist_client, t):
        refused(raw_worker(t, "draw_host", {**args, "parts": {"w": {**part, "layout": 5}}}), "shared_layout")
        bad = {**good, "header": {**good["header"], "segment": "../../etc/passwd"}}
        msg = refused(raw_worker(t, "draw_host", {**args, "parts": {"w": {**part, "layout": {**lay, "shards": {0: bad}}}}}),
                      "not a gear_flow segment of this host")  # fmt: skip
        assert "\n" not in msg
        nosel = {**good, "selection": None}
        refused(raw_worker(t, "draw_host", {**args, "parts": {"w": {**part, "layout": {**lay, "shards": {0: nosel}}}}}),
                "publishes no selection state")  # fmt: skip
        refused(raw_worker(t, "draw_host", {**args, "columns": ["nope"], "parts": {}}), "nope")
    # a good layout: drawn here, from the shard's published state (this worker is on the layout's host)
    resp = raw_worker(t, "draw_host", {**args, "parts": {"w": {**part, "layout": lay}}})
    assert resp["status"] == "OK", resp
