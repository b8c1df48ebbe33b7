"""The coordinator's lane: a handle's admissions, commits and other coordinator requests over a socket
of the scheduler's own (:meth:`gear_flow.distributed.coordinator.GearFlowCoordinator.serve`).

Through Dask's comm such a request costs ~0.35 ms from a worker on a 2-core
host, over the lane ~0.15 ms, and an insert makes two.  A handle on the
scheduler's machine uses its Unix socket (private directory), one elsewhere
(or with shared memory off) its TCP socket on the host the scheduler's comm
listens on; the requests are checked like the comm's, a lane that cannot be
reached is not used, and a request whose reply is lost is never sent again.
"""

from __future__ import annotations

import asyncio
import os
import stat

import dask
import numpy as np
import pytest
from dist_support import handed
from distributed.comm.addressing import get_address_host
from lane_support import check_garbage_is_refused

import gear_flow as gf
from gear_flow.distributed import DistributedTable, protocol
from gear_flow.distributed.coordinator import COORDINATOR_NAME
from gear_flow.distributed.lane import TCP, Lanes
from gear_flow.distributed.transport import coord
from gear_flow.errors import CoordinatorLostError, ProtocolError

SPEC = gf.TableSpec((gf.ColumnSpec("x", (), np.float32),), capacity=512, num_shards=2)


def _served(dask_scheduler):
    return dask_scheduler.plugins[COORDINATOR_NAME].lane.served


def _episode(n=20):
    return {"x": np.arange(n, dtype=np.float32)}


@pytest.fixture(params=["unix", "tcp"])
def handed_table(dist_client, request):
    """A table and a handle on it that reaches the coordinator over its Unix socket (same machine, shared
    memory on) or, with shared memory off (as from another machine), over its TCP socket; with the transport
    context that handle is handed (:func:`dist_support.handed`), where the test reads and breaks its lanes."""
    with dask.config.set(
        {
            "gear-flow.distributed.shared-memory": request.param == "unix",
            "gear-flow.distributed.fast-lane": True,
            "gear-flow.distributed.tcp-lane": True,
        }
    ):
        t = DistributedTable.create(dist_client, SPEC, sampler=gf.Uniform(), seed=0)
        h, ctx = handed(t, seed=0)  # its lookup looks for the coordinator's lane under this config
    h.lane_kind = request.param
    try:
        yield h, ctx
    finally:
        t.close()


@pytest.fixture
def table(handed_table):
    """The handle of :func:`handed_table`."""
    return handed_table[0]


@pytest.fixture
def ctx(handed_table):
    """The transport context :func:`table` is handed."""
    return handed_table[1]


def _lane(ctx):
    return ctx.sync(ctx.coord_lane)


def test_admissions_and_commits_take_the_coordinators_lane(table, ctx, dist_client):
    table.insert([_episode()], shard=0)  # the lane was looked for at the handle's first request
    lane = _lane(ctx)
    before = dist_client.run_on_scheduler(_served)
    for _ in range(3):  # one worker: admit_insert, write, commit_insert
        table.insert([_episode()], shard=1)
    assert dist_client.run_on_scheduler(_served) - before == 6
    assert len(table) == 80
    if table.lane_kind == "unix":
        assert not lane.startswith(TCP) and os.path.exists(lane)
        assert stat.S_IMODE(os.stat(os.path.dirname(lane)).st_mode) == 0o700  # only this user may connect
    else:  # listening on the scheduler's own host only
        sched = dist_client.scheduler.address
        assert lane.startswith(TCP) and get_address_host(lane) == get_address_host(sched) == "127.0.0.1"


def test_a_worker_task_reaches_the_coordinator_over_the_lane(table, dist_client):
    def insert_here(name):
        t, ctx = handed(name, worker=True, seed=0)  # attached in this task, on a context the test holds
        t.insert([{"x": np.arange(10, dtype=np.float32)}])  # to this worker's own shard
        return ctx.sync(ctx.coord_lane)

    before = dist_client.run_on_scheduler(_served)
    lane = dist_client.submit(insert_here, table.name, pure=False).result()
    assert lane is not None and dist_client.run_on_scheduler(_served) - before >= 2
    assert len(table) == 10


@pytest.mark.parametrize(
    "off",
    [
        {"gear-flow.distributed.fast-lane": False},  # no lane at all
        {"gear-flow.distributed.shared-memory": False, "gear-flow.distributed.tcp-lane": False},  # no TCP lane
    ],
)
def test_without_the_lane_the_coordinator_is_reached_over_the_comm(dist_client, off):
    with dask.config.set(off):
        t = DistributedTable.create(dist_client, SPEC, sampler=gf.Uniform(), seed=0)
        try:
            h, ctx = handed(t, seed=0)
            before = dist_client.run_on_scheduler(_served)
            for _ in range(3):
                h.insert([_episode()])
            assert _lane(ctx) is None and dist_client.run_on_scheduler(_served) == before
            assert len(h) == 60
        finally:
            t.close()


def test_an_unreachable_coordinator_lane_is_not_used(table, ctx):
    table.insert([_episode()])

    async def vanish():  # as if its socket were gone (or a firewall dropped its port)
        f = asyncio.get_running_loop().create_future()
        f.set_result("/nonexistent/gear-flow-lane" if table.lane_kind == "unix" else "tcp://127.0.0.1:1")
        ctx.lanes.close_path(await ctx.coord_lane())
        # the found lane replaced by one nothing listens on: no public member plants a lane (drop_coord_lane
        # would spare the handle finding out that it is unreachable, which is what is tested), so this writes
        # the attribute of the test's own Context, not the handle's
        ctx._coord_lane = f

    ctx.sync(vanish)
    for _ in range(2):
        table.insert([_episode()])
    assert _lane(ctx) is None and len(table) == 60  # the comm from now on, nothing lost or doubled


def test_a_reply_lost_on_the_coordinators_lane_is_not_sent_again(table, ctx, dist_client):
    """The coordinator may have acted on a request whose reply never came (an admission granted): sending it
    again over the comm could count it twice, so the request fails and later ones take the comm."""
    table.insert([_episode()])
    lane = _lane(ctx)

    def break_after_serving(dask_scheduler):
        plugin = dask_scheduler.plugins[COORDINATOR_NAME]
        real = plugin.lane._serve
        plugin.served_then_broke = []

        async def serve(action, args, v):
            plugin.served_then_broke.append((action, await real(action, args, v)))
            plugin.lane._serve = real
            raise ConnectionResetError("the connection broke before the reply")

        plugin.lane._serve = serve

    def stamps_given(dask_scheduler):
        return [(a, ok, int(v)) for a, (ok, v) in dask_scheduler.plugins[COORDINATOR_NAME].served_then_broke]

    dist_client.run_on_scheduler(break_after_serving)
    with pytest.raises(CoordinatorLostError, match="broke during 'stamps'"):
        ctx.sync(coord, ctx, "stamps", table.name, n=5)
    assert [(a, ok) for a, ok, _ in dist_client.run_on_scheduler(stamps_given)] == [("stamps", True)]  # once
    first = dist_client.run_on_scheduler(stamps_given)[0][2]
    assert _lane(ctx) is None  # no more requests over that lane
    assert ctx.sync(coord, ctx, "stamps", table.name, n=5) == first + 5  # the comm, counted once
    assert lane is not None
    table.insert([_episode()])
    assert len(table) == 40


def test_the_coordinators_lane_checks_every_request_like_the_comm(table, ctx):
    table.insert([_episode()])
    path = _lane(ctx)
    info = table.info()

    async def ask(op, args, v=protocol.VERSION):
        return await Lanes().call(path, op, args, v)

    for op, args, v, words in [
        ("admit_insert", {"name": table.name, "n": 1, "episodes": 1}, protocol.VERSION - 1, "version"),
        ("no_such_op", {"name": table.name}, protocol.VERSION, "no_such_op"),
        ("lane", {"name": None}, protocol.VERSION, "does not take the lane"),
        ("admit_insert", {"name": table.name, "n": -1, "episodes": 1}, protocol.VERSION, "'n'"),
        ("stamps", {"name": table.name, "n": 1, "extra": 2}, protocol.VERSION, "extra"),
        ("stamps", {"n": 1}, protocol.VERSION, "'name'"),
        ("commit_insert", {"name": table.name, "txn": 5}, protocol.VERSION, "txn"),
    ]:
        ok, err = asyncio.run(ask(op, args, v))
        assert not ok and isinstance(err, ProtocolError) and words in str(err), (op, err)
    ok, err = asyncio.run(ask("stamps", "not a dict"))
    assert not ok and isinstance(err, ProtocolError) and "must be a dict" in str(err)
    ok, err = asyncio.run(ask("lookup", {"name": "no-such-table"}))
    assert not ok and isinstance(err, gf.GearFlowError) and "no-such-table" in str(err)
    check_garbage_is_refused(path)
    assert table.info() == info  # nothing changed
    table.insert([_episode()])  # and the lane still serves
    assert len(table) == 40


def test_the_coordinators_lane_leaves_with_the_scheduler():
    from distributed import Client, LocalCluster

    from gear_flow.distributed.transport import Context

    with LocalCluster(n_workers=0, processes=False, dashboard_address=None) as cluster, Client(cluster) as client:
        from gear_flow.distributed.coordinator import GearFlowCoordinator

        client.register_plugin(GearFlowCoordinator())
        ctx = Context(client=client)
        path = ctx.sync(ctx.coord_lane)
        assert path is not None and os.path.exists(path)
        assert ctx.sync(coord, ctx, "list", None) == []  # over the lane
    assert not os.path.exists(os.path.dirname(path))
