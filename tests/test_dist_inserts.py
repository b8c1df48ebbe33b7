"""Where inserted episodes travel: over the comm from a client, in-process from a task on a shard's worker.

Checked on the workers themselves: a counting wrapper around each worker's
``gear_flow`` comm handler sees every insert request that arrives over the
comm, so "nothing crossed the comm" is what the workers saw, not what the
handle believes.
"""

from __future__ import annotations

import dask
import numpy as np
import pytest
from distributed import Client, LocalCluster
from helpers import COLUMNS, episode

import gear_flow as gf
from gear_flow.distributed import DistributedTable
from gear_flow.distributed.plugin import PLUGIN_NAME

pytestmark = [pytest.mark.timeout(240), pytest.mark.usefixtures("data_plane")]

#: insert operations that carry episodes
DATA_OPS = ("stage", "write")


@pytest.fixture(scope="module")
def client():
    with dask.config.set({"distributed.comm.timeouts.connect": "5s"}):
        with LocalCluster(n_workers=2, threads_per_worker=2, processes=True, dashboard_address=None) as cluster:
            with Client(cluster) as c:
                yield c


def _count_comm_requests(dask_worker=None):
    """Wrap this worker's ``gear_flow`` handler: count the requests with episodes that arrive over the comm."""
    plugin = dask_worker.plugins[PLUGIN_NAME]
    counts = {op: 0 for op in DATA_OPS}
    plugin.comm_counts = counts

    async def counting(comm=None, action=None, args=None, v=None):
        if action in counts:
            counts[action] += 1
        return await plugin.handle(comm=comm, action=action, args=args, v=v)

    dask_worker.handlers["gear_flow"] = counting


def _comm_requests(dask_worker=None):
    return dict(dask_worker.plugins[PLUGIN_NAME].comm_counts)


def _restore_handler(dask_worker=None):
    plugin = dask_worker.plugins.get(PLUGIN_NAME)
    if plugin is not None and hasattr(plugin, "comm_counts"):
        dask_worker.handlers["gear_flow"] = plugin.handle
        del plugin.comm_counts


class CommCounts:
    """Counts, on every worker, the insert requests with episodes that arrive over the comm."""

    def __init__(self, client):
        self.client = client

    def start(self):
        """Install the counters (after a table exists: its creation sets up the workers' plugin)."""
        self.client.run(_count_comm_requests)

    def seen(self) -> dict:
        """``{worker: {op: requests}}`` since :meth:`start`."""
        return self.client.run(_comm_requests)


@pytest.fixture
def comm_counts(client):
    try:
        yield CommCounts(client)
    finally:
        client.run(_restore_handler)


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


def test_actor_insert_into_own_shards_goes_in_process(client, comm_counts):
    t = DistributedTable.create(client, gf.TableSpec(COLUMNS, capacity=500, num_shards=2), seed=0, name="own")
    try:
        comm_counts.start()
        worker = t.placement[0]
        tags, length = [1, 2, 3], 40
        local, dest, stats = client.submit(_actor, t.name, tags, length, workers=[worker], pure=False).result()
        assert local == [0] and dest == [0, 0, 0], (local, dest)  # writer affinity: the worker's own shard
        nbytes = _nbytes([episode(k, length) for k in tags])
        assert stats["insert_local_bytes"] == nbytes and stats["insert_remote_bytes"] == 0, stats
        seen = comm_counts.seen()
        assert all(c == {op: 0 for op in DATA_OPS} for c in seen.values()), seen  # no episode crossed the comm
        info = t.info()
        assert info["size"] == info["coordinator_size"] == len(tags) * length
        _check_rows(t, 64)
    finally:
        t.close()


def test_client_insert_sends_episodes_over_the_comm(client, comm_counts):
    t = DistributedTable.create(client, gf.TableSpec(COLUMNS, capacity=500, num_shards=2), seed=0, name="remote")
    try:
        comm_counts.start()
        eps = [episode(k, 30) for k in (4, 5)]
        res = t.insert(eps)
        assert sorted(res.shards.tolist()) == [0, 1]  # balanced: one episode per shard, so one per worker
        assert t.stats["insert_remote_bytes"] == _nbytes(eps) and t.stats["insert_local_bytes"] == 0, t.stats
        seen = comm_counts.seen()
        # two workers: each staged its part over the comm (then applied it), nothing written in one step
        assert {a: c["stage"] for a, c in seen.items()} == {a: 1 for a in seen}, seen
        _check_rows(t, 32)
    finally:
        t.close()
