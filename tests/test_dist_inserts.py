"""Where inserted episodes travel: from a client over the worker's lane (the same machine: a staging
segment's places; another, or shared memory off: the episodes themselves, over its TCP lane) or over the comm
(no lane), in-process from a task on a shard's worker.

Checked on the workers themselves: a counting wrapper around each worker's
``gear_flow`` comm handler and its lane's server sees every insert request
that arrives and the bytes it carried, so "nothing crossed the comm" is what
the workers saw, not what the handle believes.
"""

from __future__ import annotations

import numpy as np
import pytest
from dist_support import DATA_OPS, handed
from helpers import COLUMNS, episode, owned_segments
from lane_support import break_lane_after

import gear_flow as gf
from gear_flow.distributed import DistributedTable
from gear_flow.distributed.plugin import PLUGIN_NAME

pytestmark = [pytest.mark.timeout(240), pytest.mark.usefixtures("data_plane")]


@pytest.fixture
def client(dist_client):
    """The session's 2-worker cluster (tests/conftest.py); the wrappers are undone after each test."""
    return dist_client


def _nbytes(eps):
    return sum(a.nbytes for e in eps for a in e.values())


def _actor(name, tags, length):
    """A task on a worker: insert episodes made here, report what the handle saw."""
    from helpers import episode

    from gear_flow.distributed import DistributedTable as DT

    t = DT.attach(name)
    res = t.insert([episode(k, length) for k in tags])
    return t.local_shards, [int(s) for s in res.shards], dict(t.stats)


def _check_rows(table, n_items):
    b = table.sample(n_items, 1)
    obs = b["obs"].numpy()[:, 0]
    tag, t = obs[:, 0].astype(np.int64), obs[:, 1].astype(np.int64)
    assert np.array_equal(obs[:, 2], 1000 * tag + t), "rows written in-process hold the episodes' values"
    assert np.array_equal(b["ep"].numpy()[:, 0], tag)


def test_actor_insert_into_own_shards_goes_in_process(client, requests_seen):
    t = DistributedTable.create(client, gf.TableSpec(COLUMNS, capacity=500, num_shards=2), seed=0, name="own")
    try:
        requests_seen.start()
        worker = t.placement[0]
        tags, length = [1, 2, 3], 40
        local, dest, stats = client.submit(_actor, t.name, tags, length, workers=[worker], pure=False).result()
        assert local == [0] and dest == [0, 0, 0], (local, dest)  # writer affinity: the worker's own shard
        nbytes = _nbytes([episode(k, length) for k in tags])
        assert stats["insert_local_bytes"] == nbytes and stats["insert_remote_bytes"] == 0, stats
        seen = requests_seen.seen()
        none = {"bytes": 0, **{op: 0 for op in DATA_OPS}}
        assert all(c == {"comm": none, "lane": none} for c in seen.values()), seen  # none at all
        info = t.info()
        assert info["size"] == info["coordinator_size"] == len(tags) * length
        _check_rows(t, 64)
    finally:
        t.close()


def test_client_insert_sends_episodes_over_a_lane_or_the_comm(client, requests_seen, data_plane):
    t = DistributedTable.create(client, gf.TableSpec(COLUMNS, capacity=500, num_shards=2), seed=0, name="remote")
    try:
        requests_seen.start()
        eps = [episode(k, 200) for k in (4, 5)]
        res = t.insert(eps)
        assert sorted(res.shards.tolist()) == [0, 1]  # balanced: one episode per shard, so one per worker
        n = _nbytes(eps)
        seen = requests_seen.seen()
        took = "comm" if data_plane == "comm" else "lane"  # the lane when there is one: fast (Unix) or TCP
        other = "lane" if took == "comm" else "comm"
        # two workers: each staged its part (then applied it), nothing written in one step
        assert {a: (c[took]["stage"], c[took]["write"]) for a, c in seen.items()} == {a: (1, 0) for a in seen}, seen
        assert all(c[other] == {"bytes": 0, **{op: 0 for op in DATA_OPS}} for c in seen.values()), seen
        if data_plane == "shared-memory":  # same machine: the episodes went through the staging segment
            assert t.stats["insert_shared_bytes"] == n and t.stats["insert_remote_bytes"] == 0, t.stats
            assert all(c["lane"]["bytes"] < n // 4 for c in seen.values()), seen  # only where the columns lie
        else:  # the episodes themselves: every byte arrived at the workers
            assert t.stats["insert_remote_bytes"] == n and t.stats["insert_shared_bytes"] == 0, t.stats
            assert sum(c[took]["bytes"] for c in seen.values()) >= n, seen
        assert t.stats["insert_local_bytes"] == 0
        _check_rows(t, 32)
    finally:
        t.close()


def test_staging_segments_are_reused_and_bad_places_are_refused(client, data_plane):
    """Calls reuse the process's staging segment; a stage naming a missing segment or a place past its
    end is refused with one line, and nothing of that insert is stored anywhere."""
    import os

    from gear_flow.distributed import protocol, wire

    if data_plane != "shared-memory":
        pytest.skip("staging is the shared-memory data plane's")
    t = DistributedTable.create(client, gf.TableSpec(COLUMNS, capacity=500, num_shards=2), seed=0, name="staging")
    try:
        mine = lambda: sorted(  # noqa: E731  (this process's staging segments; its scheduler's lane is no segment)
            n for n in owned_segments([os.getpid()]) if "_lane" not in n
        )
        t.insert([episode(k, 20) for k in (1, 2)])
        before = mine()
        for k in range(5):
            t.insert([episode(10 + k, 20), episode(20 + k, 20)])
        assert mine() == before  # the same segment, call after call
        size = t.info()["size"]

        def raw(part):
            async def go():
                msg = {"name": t.name, "txn": "x" * 16, "parts": [part]}
                return await t.client.rpc(t.placement[0]).gear_flow(action="stage", v=protocol.VERSION,
                                                                    **wire.encode(msg))  # fmt: skip

            return t.client.sync(go)

        rings = sorted(  # not the staging segments, nor the lanes' socket directories (the scheduler's is here)
            n for n in os.listdir("/dev/shm") if n.startswith("gf_") and "_st" not in n and "_lane" not in n
        )
        assert rings  # this table's shards (shared-memory data plane)
        obs = COLUMNS[0]
        good = {"shard": 0, "lengths": [2], "episode_ids": [999], "stamps": [999], "priorities": None}
        for seg, place, match in [
            ("gf_1_st" + "0" * 16, [0, [2, *obs.shape], np.dtype(obs.dtype).str], "does not exist"),
            ("../etc/passwd", [0, [2, *obs.shape], "<f4"], "not a gear_flow staging segment"),
            (rings[0], [0, [2, *obs.shape], np.dtype(obs.dtype).str], "not a gear_flow staging segment"),
            (before[0], [len(b"x") << 30, [0], "<f4"], "inside the segment"),
            (before[0], [1 << 40, [2, *obs.shape], np.dtype(obs.dtype).str], "inside the segment"),
            (before[0], [0, [2, *obs.shape], "|O"], "inside the segment"),
        ]:
            resp = raw({**good, "chunks": [{c.name: place for c in COLUMNS}], "staged": {"segment": seg}})
            assert resp["status"] == "error" and match in str(resp["error"]), resp
        assert t.info()["size"] == size and t.info()["inserts_in_flight"] == 0
    finally:
        t.close()


def test_an_insert_too_large_for_the_lane_takes_the_comm(client, requests_seen, data_plane, monkeypatch):
    """A request over half the lane's limit would be refused by the lane: it goes over the comm, and the lane
    stays in use for the rest."""
    from gear_flow.distributed import lane

    if data_plane != "tcp-lane":
        pytest.skip("the episodes themselves take the TCP lane")
    t = DistributedTable.create(client, gf.TableSpec(COLUMNS, capacity=5000, num_shards=2), seed=0, name="large")
    try:
        h, ctx = handed(t, seed=0)  # the handle whose lanes are read, on a context of the test's own
        h.insert([episode(1, 10), episode(2, 10)])  # the lanes are learnt
        lanes = dict(ctx.lanes.paths)
        assert len(lanes) == 2
        eps = [episode(k, 1500) for k in (3, 4)]  # 37.5 KB of arrays per worker, over the 30 KB routed by lane
        monkeypatch.setattr(lane, "MAX_BYTES", 2 * 30_000)  # in this process only: what the handle routes by
        requests_seen.start()
        h.insert(eps)
        h.insert([episode(5, 10), episode(6, 10)])  # small: the lanes again
        seen = requests_seen.seen()
        assert {a: (c["comm"]["stage"], c["lane"]["stage"]) for a, c in seen.items()} == {a: (1, 1) for a in seen}
        assert ctx.lanes.paths == lanes  # not dropped
        assert len(h) == 2 * 10 + 2 * 1500 + 2 * 10
    finally:
        t.close()


def test_an_insert_whose_lane_reply_is_lost_is_stored_once(client, requests_seen, data_plane):
    """The worker wrote the episodes and the reply never came: the handle sends the request again over the
    comm, the worker answers with what it did the first time, and the insert is counted and stored once."""
    if data_plane == "comm":
        pytest.skip("no lane")
    t = DistributedTable.create(client, gf.TableSpec(COLUMNS, capacity=500, num_shards=2), seed=0, name="lost")
    try:
        t.insert([episode(1, 10)], shard=0)  # the lanes are learnt
        w0 = t.placement[0]
        requests_seen.start()
        client.run(break_lane_after, "write", workers=[w0])
        res = t.insert([episode(2, 30), episode(3, 30)], shard=0)  # one worker: written in one request
        assert client.run(lambda dask_worker: dask_worker.plugins[PLUGIN_NAME].broke, workers=[w0])[w0] == [
            ("write", True)
        ]
        seen = requests_seen.seen()[w0]
        assert (seen["lane"]["write"], seen["comm"]["write"]) == (1, 1)  # sent twice ...
        info = t.info()
        assert info["size"] == info["coordinator_size"] == 70  # ... stored and counted once
        assert res.num_items == 60 and res.shards.tolist() == [0, 0]
        assert res.first_keys.tolist() == sorted(res.first_keys.tolist()) and len(set(res.first_keys.tolist())) == 2
        _check_rows(t, 64)
        t.insert([episode(4, 10)], shard=0)
        assert len(t) == 80
    finally:
        t.close()
