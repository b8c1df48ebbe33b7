"""Dask worker processes under the CUDA emulation (``cuda_emu.preload``, fixture ``emu_cluster``).

What this proves: a worker of a real ``LocalCluster(processes=True)`` imports
the fake CuPy, builds a ``device``/``pinned``-tier LocalTable whose gathers run
the host build of the kernels, and returns the same batches as a host-tier
table built from the same inserts and seed in the client.
"""

from __future__ import annotations

import numpy as np
import pytest
from cuda_emu import fixtures

pytestmark = pytest.mark.slow
emu_cluster = fixtures.emu_cluster  # the fixture: a Client of 2 emulated workers

SEED = 4


def _spec():
    from gear_flow import ColumnSpec, TableSpec

    cols = (ColumnSpec("obs", (3,), np.float32), ColumnSpec("action", (), np.int64), ColumnSpec("done", (), np.bool_))
    return TableSpec(cols, capacity=200, num_shards=2)


def _episodes():
    rng = np.random.default_rng(7)
    out = []
    for T in rng.integers(6, 30, 9):
        out.append(
            {
                "obs": rng.random((T, 3), dtype=np.float32),
                "action": rng.integers(0, 5, T),
                "done": np.arange(T) == T - 1,
            }
        )
    return out


def _sample_twice(tier: str) -> dict:
    """Insert, sample, update priorities, sample again: the batches as host arrays."""
    import os

    from gear_flow import LocalTable, Prioritized

    t = LocalTable(_spec(), sampler=Prioritized(0.8, 0.5), tier=tier, seed=SEED)
    t.insert(_episodes())
    out = {"pid": os.getpid(), "emulated": os.environ.get("GEAR_FLOW_CUDA_EMULATION")}
    for i in range(2):
        b = t.sample(8, 5)
        out[i] = {n: b[n].cpu().numpy().copy() for n in ("obs", "action", "done")}
        out[i]["keys"] = b.keys.numpy().copy()
        out[i]["is_cuda"] = bool(b["obs"].is_cuda)
        t.update_priorities(b.keys, np.arange(8) + 1.0)
    if tier != "host":
        import cupy

        out["cupy"] = cupy.__version__
        out["ring_type"] = type(t.shards[0].ring.columns["obs"]).__module__
    return out


def test_workers_are_emulated(emu_cluster):
    def probe():
        import os
        import sys

        import cupy

        a = cupy.arange(4)
        try:
            np.asarray(a)
            refused = False
        except TypeError:
            refused = True
        import gear_flow

        emulated = os.environ.get("GEAR_FLOW_CUDA_EMULATION")
        return cupy.__version__, refused, emulated, "cuda_emu" in sys.modules, gear_flow.__file__

    import gear_flow

    res = emu_cluster.run(probe)
    assert len(res) == 2
    assert set(res.values()) == {("emulated", True, "1", True, gear_flow.__file__)}  # this checkout's code


@pytest.mark.parametrize("tier", ["device", "pinned"])
def test_worker_builds_gpu_tier_table_and_samples(emu_cluster, tier):
    """A task on a worker: a GPU-tier LocalTable inserts and samples there, equal to the host tier here."""
    import os

    ref = _sample_twice("host")
    got = emu_cluster.submit(_sample_twice, tier, pure=False).result(timeout=120)
    assert got["pid"] != os.getpid() and got["emulated"] == "1"
    assert got["cupy"] == "emulated"
    assert got["ring_type"] == ("cuda_emu.ndarray" if tier == "device" else "numpy")
    for i in range(2):
        assert got[i]["is_cuda"] is False  # torch is CPU-only here: the emulation's device is the host
        for name in ("obs", "action", "done", "keys"):
            np.testing.assert_array_equal(got[i][name], ref[i][name], err_msg=f"sample {i}, {name}")


def test_every_worker_runs_the_gpu_tier(emu_cluster):
    """``client.run`` on both workers: each builds its own device-tier table (the kernels load there)."""
    res = emu_cluster.run(_sample_twice, "device")
    assert len(res) == 2 and len({r["pid"] for r in res.values()}) == 2
    ref = _sample_twice("host")
    for r in res.values():
        np.testing.assert_array_equal(r[1]["obs"], ref[1]["obs"])
