"""Restoring a shard never destroys data silently and never leaves an orphan copy."""

from __future__ import annotations

import numpy as np
import pytest

import gear_flow as gf
from gear_flow.distributed import DistributedTable

pytestmark = pytest.mark.timeout(120)

X = (gf.ColumnSpec("x", (), np.float32),)


def xs(n):
    return [{"x": np.arange(3, dtype=np.float32)} for _ in range(n)]


def _hosted(name, dask_worker=None):
    t = dask_worker.plugins["gear-flow"].host.tables.get(name)
    return [] if t is None else sorted(t.shards)


def test_restoring_a_live_shard_is_refused_unless_replaced(dist_client, tmp_path):
    w0, w1 = sorted(dist_client.nthreads())
    # both shards on one worker: the other worker is empty (and must still be a restore target)
    t = DistributedTable.create(dist_client, gf.TableSpec(X, capacity=256, num_shards=2), workers=[w0], seed=0)
    try:
        t.insert(xs(8))
        t.checkpoint(tmp_path / "ck")
        t.insert(xs(4), shard=1)
        before = t.info()
        with pytest.raises(gf.SpecError, match="shard 1 .* is alive .* replace=True"):
            t.restore_shard(1, tmp_path / "ck")
        assert t.info()["totals"] == before["totals"]  # refused: nothing changed
        s1 = next(s for s in before["shards"] if s["shard"] == 1)
        rep = t.restore_shard(1, tmp_path / "ck", replace=True)
        assert rep["worker"] == w1  # the least loaded live worker, although it held none of this table
        assert rep["dropped_items"] == s1["size"] and rep["inserted_since_checkpoint"] == 4 * 3
        assert rep["items_restored"] == s1["size"] - 12
        info = t.info()
        assert [s["shard"] for s in info["shards"]] == [0, 1]  # listed once
        assert info["size"] == info["coordinator_size"] == before["size"] - 12
        assert dist_client.run(_hosted, t.name) == {w0: [0], w1: [1]}  # no orphan copy on w0
        assert t.placement == {0: w0, 1: w1}
        assert len(t.sample(16)) == 16
    finally:
        t.close()
