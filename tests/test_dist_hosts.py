"""Workers declared on another host (config ``distributed.host-id``) are reached as a learner on another host
reaches them, on one machine: no shared rings, no staging segments, no Unix lane; the TCP lanes carry the
draws and their windows. The same workers, declared on the learner's host, are read from shared memory."""

from __future__ import annotations

import dask
import numpy as np
import pytest
from distributed import Client, LocalCluster
from helpers import COLUMNS, episode

import gear_flow as gf
from gear_flow.distributed import DistributedTable


def workers_on(host: str) -> LocalCluster:
    """Two worker processes that count as on ``host`` (each takes the config it was started with, as a
    deployment sets ``DASK_GEAR_FLOW__DISTRIBUTED__HOST_ID`` per host)."""
    with dask.config.set({"gear-flow.distributed.host-id": host}):
        return LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None)


@pytest.mark.parametrize("learner_host", [None, "workers"], ids=["another-host", "same-host"])
def test_a_learner_reaches_workers_as_their_host_id_says(learner_host):
    with (
        workers_on("workers") as c,
        dask.config.set({"gear-flow.distributed.host-id": learner_host}),
        Client(c) as client,
    ):
        t = DistributedTable.create(client, gf.TableSpec(COLUMNS, capacity=256, num_shards=2), seed=0)
        try:
            t.insert([episode(i + 1, 10) for i in range(6)])
            for _ in range(5):
                b = t.sample(16, 4)
                obs = b["obs"].numpy()
                # every window is its episode's own steps, in order: (tag, t, 1000 * tag + t)
                assert (obs[:, :, 2] == 1000 * obs[:, :, 0] + obs[:, :, 1]).all()
                assert (np.diff(obs[:, :, 1], axis=1) == 1).all()
            s = t.stats
            if learner_host is None:  # another host: the TCP lanes, nothing mapped or staged
                assert s["shared_bytes"] == 0 and s["insert_shared_bytes"] == 0
                assert s["remote_bytes"] > 0 and s["in_thread"] > 0
            else:  # the same host: the shared rings
                assert s["shared_bytes"] > 0 and s["insert_shared_bytes"] > 0 and s["remote_bytes"] == 0
        finally:
            t.close()


def two_hosts(n: int = 4):
    """``n`` worker processes on host ``a`` and ``n`` on host ``b`` (each takes the host id it was started
    with), on this machine: a learner without a host id is on a third host."""
    with dask.config.set({"gear-flow.distributed.host-id": "a"}):
        c = LocalCluster(n_workers=n, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None)
    with dask.config.set({"gear-flow.distributed.host-id": "b"}):
        c.scale(2 * n)
        c.wait_for_workers(2 * n)
    return c


def _host_id(dask_worker=None):
    from gear_flow.storage.shared import machine_id

    return machine_id()


@pytest.mark.parametrize("boundary", ["pad_tail", "strict"])
def test_a_learner_on_another_host_sends_one_request_per_host(boundary):
    """Two hosts of four workers: each batch is one ``draw_host`` request per host (2, not 8), one worker
    of each host drawing for its host's shards from their published state, with the owners' seeds: the
    same batches, row for row, as the owners drawing them one request each."""
    with two_hosts() as c, Client(c) as client:
        assert len(set(client.run(_host_id).values())) == 2
        spec = gf.TableSpec(COLUMNS, capacity=256, num_shards=8)
        t = DistributedTable.create(client, spec, sampler=gf.Prioritized(0.7, 0.4), seed=0)
        with dask.config.set({"gear-flow.distributed.reader-draw": False}):
            owners = DistributedTable.attach(t.name, client=client)
        try:
            t.insert([episode(i + 1, 10 + i % 5) for i in range(40)], priorities=1.0)
            t.sample(64, 4, boundary=boundary)  # the routes learnt (and, strict: each owner's tail published)
            before = dict(t.requests)
            for step in range(10):
                # the masses of t's last batch held for this one, however long the owners' batch took on this
                # host (older than distributed.mass-max-age they are asked for first: a request per worker)
                with dask.config.set({"gear-flow.distributed.mass-max-age": 600}):
                    a = t.sample(64, 4, boundary=boundary, rng=np.random.default_rng(step))
                b = owners.sample(64, 4, boundary=boundary, rng=np.random.default_rng(step))
                obs = a["obs"].numpy()
                m = a.mask.numpy()
                assert (obs[:, :, 2] == 1000 * obs[:, :, 0] + obs[:, :, 1])[m].all()
                for f in ("keys", "probabilities", "weights", "mask", "timesteps", "episode_ids", "priorities"):
                    assert np.array_equal(getattr(a, f).numpy(), getattr(b, f).numpy()), (step, f)
                assert np.array_equal(a["obs"].numpy(), b["obs"].numpy()), step
            sent = {op: n - before.get(op, 0) for op, n in t.requests.items() if n != before.get(op, 0)}
            assert sent.pop("draw_host") == 2 * 10 and not sent.get("sample_part"), sent
            assert set(sent) <= {"count_drawn"}, sent  # and the draws counted to their owners, batched
            owners.flush()  # its leased batches to the coordinator; t.info() flushes t's own
            info = t.info()
            assert info["totals"]["sampled"] == info["rate_limiter"]["samples"] == 64 * 21, info
        finally:
            t.close()


def test_a_part_a_host_leaves_to_its_owner_is_drawn_with_the_owners_seed():
    """Strict windows that seldom fit: a worker drawing for its host gives up on some shards after its
    rejection rounds, and their owners draw the parts: each worker's whole part, with the seed it would have
    drawn it with, so the batches are the owners', row for row.  They were drawn with fresh seeds, and the
    worker's other shards stayed drawn by its host's worker: the batches differed."""
    with two_hosts(2) as c, Client(c) as client:
        spec = gf.TableSpec((gf.ColumnSpec("x", (), np.float32),), capacity=64, num_shards=8)
        with dask.config.set({"gear-flow.distributed.mass-max-age": 0}):
            t = DistributedTable.create(client, spec, sampler=gf.Prioritized(1.0, 0.5), seed=0)
        with dask.config.set({"gear-flow.distributed.reader-draw": False}):
            owners = DistributedTable.attach(t.name, client=client)
        try:
            for s in range(8):  # a window of 5 steps fits 3 items in 45 of each shard
                eps = [{"x": 100 * s + 10 * e + np.arange(5, dtype=np.float32)} for e in range(3)]
                t.insert(eps + [{"x": np.full(1, -1.0, np.float32)}] * 30, priorities=1.0, shard=s)
            t.sample(16, 5, boundary="strict")  # the routes learnt, each owner's tail published
            before = dict(t.requests)
            for step in range(10):
                a = t.sample(12, 5, boundary="strict", rng=np.random.default_rng(step))
                b = owners.sample(12, 5, boundary="strict", rng=np.random.default_rng(step))
                for f in ("keys", "probabilities", "weights", "mask", "timesteps", "episode_ids"):
                    assert np.array_equal(getattr(a, f).numpy(), getattr(b, f).numpy()), (step, f)
                assert np.array_equal(a["x"].numpy(), b["x"].numpy()) and (a["x"].numpy() >= 0).all(), step
            sent = {op: n - before.get(op, 0) for op, n in t.requests.items()}
            assert sent["draw_host"] > 0 and sent["sample_part"] > 0, sent  # drawn by hosts, and left to owners
        finally:
            t.close()
