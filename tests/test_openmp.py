"""A worker's OpenMP threads spin briefly after a parallel gather (gear_flow.distributed.openmp).

Each case that depends on when OpenMP is loaded runs in a fresh Python
process: OpenMP reads its environment once, when loaded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import gear_flow as gf
from gear_flow.distributed.openmp import CHOSEN, short_spin

_ENV = {k: v for k, v in os.environ.items() if k not in CHOSEN}

#: runs gathers big enough for numba's parallel loop, each followed by 10 ms of sleep; prints the status of
#: short_spin (when asked first), the process CPU spent while asleep (OpenMP threads spinning), and the env
_SCRIPT = """
import json, os, sys, time
import numpy as np
from gear_flow.distributed.openmp import short_spin, gomp_loaded
from gear_flow.ops.gather import gather_windows
first = sys.argv[1]
src = np.ones((10_000, 1024), np.uint8)
out = np.empty((64, 64, 1024), np.uint8)
starts = np.arange(64, dtype=np.int64) * 100
zeros, full = np.zeros(64, np.int64), np.full(64, 64, np.int64)
status = short_spin(int(sys.argv[2])) if first == "spin" else None
before = gomp_loaded()
gather_windows(src, starts, zeros, full, out)
if first == "gather":
    status = short_spin(int(sys.argv[2]))
asleep = 0.0
for _ in range(10):
    gather_windows(src, starts, zeros, full, out)
    c = time.process_time()
    time.sleep(0.01)
    asleep += time.process_time() - c
print(json.dumps({"status": status, "loaded_before": before, "loaded_after": gomp_loaded(),
                  "asleep_ms": asleep * 100, "env": os.environ.get("GOMP_SPINCOUNT")}))
"""


def _run(first: str, count: int = 30000, **env) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", _SCRIPT, first, str(count)],
        env={**_ENV, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_short_spin_frees_the_core_after_a_gather():
    """Set before OpenMP loads, the count holds: the threads stop spinning soon after a gather.

    GNU OpenMP's default keeps a thread spinning ~4 ms of CPU after each
    parallel loop; with 30,000 rounds it is a fraction of that.  Both are
    measured here, in processes alike but for the setting.  A default
    process on a busy machine (the suite's other process on the other core)
    spins less, descheduled: the pair is measured again, up to three times;
    a setting without effect fails every time.
    """
    pairs = []
    for _ in range(5):  # a loaded machine preempts the default spinner: up to five pairs
        spun, default = _run("spin"), _run("none")
        assert spun["status"] == "set" and spun["env"] == "30000"
        assert spun["loaded_before"] is False and spun["loaded_after"] is True  # loaded after it was set
        assert default["env"] is None
        pairs.append((spun["asleep_ms"], default["asleep_ms"]))
        if spun["asleep_ms"] < default["asleep_ms"] / 4:
            break
    assert spun["asleep_ms"] < default["asleep_ms"] / 4, pairs


def test_too_late_once_openmp_is_loaded():
    """OpenMP already loaded (it has read its environment): nothing is changed, and it says so."""
    r = _run("gather")
    assert r["status"] == "loaded" and r["env"] is None


def test_the_deployments_own_choice_is_kept():
    for env in ({"OMP_WAIT_POLICY": "PASSIVE"}, {"GOMP_SPINCOUNT": "5"}):
        r = _run("spin", **env)
        assert r["status"] == "chosen"
        assert r["env"] == env.get("GOMP_SPINCOUNT")


def test_null_leaves_openmp_alone():
    import dask

    with dask.config.set({"gear-flow.distributed.omp-spin-count": None}):
        assert short_spin() == "off"


@pytest.mark.parametrize("bad", [-1, 1.5, "many", True])
def test_a_bad_count_is_refused(bad):
    import dask

    with dask.config.set({"gear-flow.distributed.omp-spin-count": bad}):
        with pytest.raises(ValueError, match=r"gear-flow.distributed.omp-spin-count.* must be a whole number >= 0"):
            short_spin()


def test_dask_workers_get_the_short_spin():
    """A worker's plugin sets the count before its first gather loads OpenMP (real worker processes)."""
    import dask
    from distributed import Client, LocalCluster

    from gear_flow.distributed import DistributedTable
    from gear_flow.distributed.openmp import gomp_loaded

    def state():
        return os.environ.get("GOMP_SPINCOUNT"), gomp_loaded()

    def clear():
        for k in CHOSEN:
            os.environ.pop(k, None)

    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None
    ) as cluster, Client(cluster) as client:  # fmt: skip
        client.run(clear)
        assert sorted(client.run(state).values()) == [(None, False), (None, False)]
        # (the suite's workers fork from a server that loaded numba's registries, conftest: OpenMP still not)
        assert list(client.run(lambda: "forkserver_preload" in sys.modules).values()) == [True, True]
        spec = gf.TableSpec((gf.ColumnSpec("x", (256,), np.float32),), capacity=50_000, num_shards=2)
        with dask.config.set({"gear-flow.distributed.shared-memory": False}):  # the workers gather the windows
            t = DistributedTable.create(client, spec, sampler=gf.Uniform(), seed=0)
        try:
            t.insert([{"x": np.ones((1000, 256), np.float32)} for _ in range(20)])
            b = t.sample(256, 64)
            assert float(b.data["x"].sum()) == 256 * 64 * 256
            got = client.run(state)
        finally:
            t.close()
    assert sorted(got.values()) == [("30000", True), ("30000", True)], got
