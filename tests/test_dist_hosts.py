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
