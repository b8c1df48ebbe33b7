"""A client's insert over the workers' TCP lanes runs in the client's thread.

With shared memory off (what another machine sees), a client's episodes go
to the workers' TCP lanes on blocking sockets from the caller's thread,
admitted and committed over the coordinator's lane: no hop into the event
loop.  Whatever it meets must end as on the event loop's path: a worker
refusing its part aborts the insert everywhere, and a lane that breaks
before its reply hands the transaction to the event loop, which sends the
step again over the comm and stores the insert once.
"""

from __future__ import annotations

import dask
import numpy as np
import pytest
from dist_support import assert_same, handed, snapshot
from helpers import COLUMNS, episode
from lane_support import break_lane_after
from test_dist_inserts import _check_rows, _nbytes

import gear_flow as gf
from gear_flow.distributed import DistributedTable
from gear_flow.distributed.coordinator import COORDINATOR_NAME
from gear_flow.distributed.plugin import PLUGIN_NAME

pytestmark = pytest.mark.timeout(120)

X = (gf.ColumnSpec("x", (), np.float32),)


@pytest.fixture
def tcp_lanes():
    """Tables made in the test are read and written over the workers' TCP lanes (shared memory off)."""
    with dask.config.set({"gear-flow.distributed.shared-memory": False, "gear-flow.distributed.tcp-lane": True}):
        yield


def _served(dask_scheduler):
    return dask_scheduler.plugins[COORDINATOR_NAME].lane.served


def _broke(dask_worker=None):
    return dask_worker.plugins[PLUGIN_NAME].broke


@pytest.mark.parametrize("workers", [1, 2])
def test_a_client_insert_over_tcp_lanes_runs_in_its_thread(dist_client, tcp_lanes, requests_seen, workers):
    t = DistributedTable.create(dist_client, gf.TableSpec(COLUMNS, capacity=2000, num_shards=2), seed=0)
    try:
        h, ctx = handed(t, seed=0)  # the handle whose lanes are read, on a context of the test's own
        shard = 0 if workers == 1 else None
        h.insert([episode(1, 10), episode(2, 10)], shard=shard)  # the event loop's path: the lanes are learnt
        assert h.stats["insert_in_thread"] == 0 and h.placement[0] in ctx.lanes.paths
        requests_seen.start()
        served = dist_client.run_on_scheduler(_served)
        calls = [[episode(10 * k + 1, 40), episode(10 * k + 2, 40)] for k in range(1, 5)]
        results = [h.insert(eps, shard=shard) for eps in calls]
        assert h.stats["insert_in_thread"] == len(calls)
        assert dist_client.run_on_scheduler(_served) - served == 2 * len(calls)  # an admission and a commit each
        seen = requests_seen.seen()
        op = "write" if workers == 1 else "stage"  # one worker: staged and applied in one request
        expect = {a: (len(calls) if workers == 2 or a == h.placement[0] else 0) for a in seen}
        assert {a: c["lane"][op] for a, c in seen.items()} == expect, seen
        assert all(c["comm"]["stage"] == c["comm"]["write"] == 0 for c in seen.values()), seen
        n = sum(_nbytes(eps) for eps in calls)
        assert sum(c["lane"]["bytes"] for c in seen.values()) >= n  # every byte arrived, over the lanes
        assert h.stats["insert_remote_bytes"] == n + _nbytes([episode(1, 10), episode(2, 10)])
        for res in results:
            assert res.num_items == 80 and len(res.shards) == 2
            assert sorted(res.shards.tolist()) == ([0, 0] if workers == 1 else [0, 1])
        ids = np.concatenate([r.episode_ids for r in results])
        assert np.array_equal(ids, np.arange(ids[0], ids[0] + len(ids)))  # one admission per call, in order
        info = h.info()
        assert info["size"] == info["coordinator_size"] == 20 + 80 * len(calls)
        _check_rows(h, 256)
        b = h.sample(512, 1)
        obs = b["obs"].numpy()[:, 0]
        tags = obs[:, 0].astype(np.int64)
        by_tag = {int(e["obs"][0, 0]): int(i) for eps, r in zip(calls, results) for e, i in zip(eps, r.episode_ids)}
        rows = [k for k, tag in enumerate(tags) if tag in by_tag]
        assert rows and all(b.episode_ids[k] == by_tag[int(tags[k])] for k in rows)
    finally:
        t.close()


def test_a_part_a_worker_refuses_leaves_nothing_anywhere(dist_client, tcp_lanes):
    """A queue's shard that would overwrite items never handed out refuses its part: the other worker's
    staged part is forgotten, the admission given back, and the queue hands out what it held."""
    t = DistributedTable.queue(dist_client, gf.TableSpec(X, capacity=4, num_shards=2), 16, timeout=5)
    try:
        t.insert([{"x": np.array([0.0, 1.0, 2.0], np.float32)}], shard=0)
        t.insert([{"x": np.array([10.0], np.float32)}], shard=1)
        assert t.stats["insert_in_thread"] == 0  # the event loop's path: each learnt its worker's lane
        before = snapshot(t)
        two = [{"x": np.array([20.0, 21.0], np.float32)}, {"x": np.array([30.0, 31.0], np.float32)}]
        with pytest.raises(gf.CapacityError, match="never handed out") as e:
            t.insert(two)  # one episode per shard: shard 0 holds 3 of 4 steps unread
        assert "\n" not in str(e.value)
        assert t.stats["insert_in_thread"] == 0
        assert_same(before, snapshot(t))
        assert t.info()["inserts_in_flight"] == 0
        assert [t.sample(1)["x"].numpy()[0, 0] for _ in range(4)] == [0.0, 1.0, 2.0, 10.0]
        t.insert(two)
        assert t.stats["insert_in_thread"] == 1
        assert [float(t.sample(1)["x"].numpy()[0, 0]) for _ in range(4)] == [20.0, 21.0, 30.0, 31.0]
    finally:
        t.close()


@pytest.mark.parametrize("op", ["stage", "apply"])
def test_a_lane_that_breaks_mid_insert_hands_it_to_the_comm(dist_client, tcp_lanes, requests_seen, op):
    """The worker staged (or applied) and its reply never came: the event loop's path sends that step again
    over the comm, the worker answers as the first time, and the insert is stored and counted once."""
    t = DistributedTable.create(dist_client, gf.TableSpec(COLUMNS, capacity=500, num_shards=2), seed=0)
    try:
        h, ctx = handed(t, seed=0)  # the handle whose lanes are read, on a context of the test's own
        h.insert([episode(1, 10), episode(2, 10)])  # the lanes are learnt
        w0 = h.placement[0]
        lanes = dict(ctx.lanes.paths)
        requests_seen.start()
        dist_client.run(break_lane_after, op, workers=[w0])
        res = h.insert([episode(3, 30), episode(4, 30)])
        assert dist_client.run(_broke, workers=[w0])[w0] == [(op, True)]
        seen = requests_seen.seen()
        if op == "stage":  # sent twice to the broken lane's worker (the second over the comm), once to the other
            assert (seen[w0]["lane"]["stage"], seen[w0]["comm"]["stage"]) == (1, 1), seen
        w1 = h.placement[1]
        assert (seen[w1]["lane"]["stage"], seen[w1]["comm"]["stage"]) == (1, 0), seen
        assert w0 not in ctx.lanes.paths and ctx.lanes.paths[w1] == lanes[w1]  # the broken lane dropped
        assert h.stats["insert_in_thread"] == 0  # finished by the event loop's path
        info = h.info()
        assert info["size"] == info["coordinator_size"] == 80 and info["inserts_in_flight"] == 0
        assert res.num_items == 60 and sorted(res.shards.tolist()) == [0, 1]
        _check_rows(h, 64)
        h.insert([episode(5, 10), episode(6, 10)])
        assert len(h) == 100
    finally:
        t.close()


def _ran(dask_worker=None):
    return dict(dask_worker.plugins[PLUGIN_NAME].ran)


@pytest.mark.parametrize("workers", [1, 2])
def test_small_writes_run_on_the_workers_event_loop_large_ones_in_its_pool(dist_client, tcp_lanes, workers):
    """A few steps are written (or staged, then applied) right on the worker's event loop, where the hop to its
    thread pool and back would cost more than the write; a part over ``QUICK_BYTES`` goes to the pool."""
    from gear_flow.distributed.plugin import QUICK_BYTES

    t = DistributedTable.create(dist_client, gf.TableSpec(COLUMNS, capacity=30000, num_shards=2), seed=0)
    try:
        shard = 0 if workers == 1 else None
        t.insert([episode(1, 10), episode(2, 10)], shard=shard)  # the event loop's path: the lanes are learnt

        def ran_by(eps):
            before = dist_client.run(_ran)
            t.insert(eps, shard=shard)
            after = dist_client.run(_ran)
            return {a: (after[a]["loop"] - before[a]["loop"], after[a]["pool"] - before[a]["pool"]) for a in after}

        small = ran_by([episode(3, 10), episode(4, 10)])
        large = [episode(5, 12000), episode(6, 12000)]
        assert all(_nbytes([e]) > QUICK_BYTES for e in large)
        large = ran_by(large)
        assert t.stats["insert_in_thread"] == 2
        requests = 1 if workers == 1 else 2  # a write; or a stage and an apply
        used = {t.placement[0]} if workers == 1 else set(t.placement.values())
        assert small == {a: ((requests, 0) if a in used else (0, 0)) for a in small}
        assert large == {a: ((0, requests) if a in used else (0, 0)) for a in large}
        info = t.info()
        assert info["size"] == info["coordinator_size"] == 40 + 24000
        _check_rows(t, 256)
    finally:
        t.close()
