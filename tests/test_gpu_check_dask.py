"""pipelines/gpu_check.py's ``dask_cuda`` section, the parts that run without a GPU: it skips (saying
why) without dask_cuda, it is bounded in time, and its round-trip check (insert, sample to the client,
compare every value) passes on a correct table and catches a wrong value, here on a CPU cluster with the
``host`` tier (the check does not depend on the tier; on the H200 it runs on ``device`` and ``pinned``).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from cuda_emu import fixtures
from distributed import Client, LocalCluster

emulated = fixtures.emulated
emu_cluster = fixtures.emu_cluster

ROOT = Path(__file__).resolve().parents[1]
SMALL = {"episodes": 12, "episode_length": 90, "batch_size": 16, "length": 7}


@pytest.fixture
def gpu_check(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "pipelines"))
    import gpu_check

    for k, v in SMALL.items():
        monkeypatch.setitem(gpu_check.REFERENCE, k, v)
    return gpu_check


def _call(what, fn, /, *args, seconds=60, **kw):
    return fn(*args, **kw)


@pytest.fixture(scope="module")
def client():
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address="127.0.0.1:0") as cluster:
        with Client(cluster) as c:
            yield c


def test_round_trip_check_passes_on_a_correct_table(gpu_check, client):
    res = gpu_check._dask_cuda_table(client, "host", _call)
    assert res["status"] == "ok" and res["exact"] and res["timesteps_match"], res.get("error")
    assert res["devices"]["obs"] == "cpu" and res["batch_bytes"] == 16 * 7 * (256 * 4 + 8 + 4 + 1)
    assert res["sample_ms"] > 0 and res["insert_gbps"] > 0


def test_round_trip_check_catches_a_wrong_value(gpu_check, client, monkeypatch):
    from gear_flow.distributed import DistributedTable

    insert = DistributedTable.insert

    def off_by_one(self, episodes, *a, **kw):  # one episode's rewards stored wrong
        bad = [{**ep, "reward": ep["reward"] + (i == 3)} for i, ep in enumerate(episodes)]
        return insert(self, bad, *a, **kw)

    monkeypatch.setattr(DistributedTable, "insert", off_by_one)
    res = gpu_check._dask_cuda_table(client, "host", _call)
    assert res["status"] == "failed" and not res["exact"]
    assert res["error"].startswith("sampled values differ from the inserted ones: reward: ")
    assert "obs" not in res["error"] and "action" not in res["error"]


@pytest.mark.slow
@pytest.mark.parametrize("tier", ["device", "pinned"])
def test_round_trip_check_on_the_gpu_tiers_under_emulation(gpu_check, emulated, emu_cluster, tier):
    """What the H200 run does with each GPU tier, on emulated workers: the values come back exact (the
    tensors are CPU ones here: the emulation runs with CPU torch)."""
    res = gpu_check._dask_cuda_table(emu_cluster, tier, _call)
    assert res["status"] == "ok" and res["exact"] and res["timesteps_match"], res.get("error")


def test_section_skips_without_dask_cuda():
    code = textwrap.dedent(
        f"""
        import sys
        class _Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "dask_cuda":
                    raise ImportError(f"No module named {{name!r}}")
        sys.meta_path.insert(0, _Block())
        sys.path.insert(0, {str(ROOT / "pipelines")!r})
        import gpu_check
        print(gpu_check.check_dask_cuda())
        """
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == (
        "{'status': 'skipped', 'reason': \"dask_cuda is not importable (No module named 'dask_cuda')\"}"
    )


@pytest.mark.skipif(importlib.util.find_spec("dask_cuda") is None, reason="dask_cuda is not installed here")
def test_section_is_bounded_and_says_where_it_stopped(gpu_check):
    t = time.monotonic()
    res = gpu_check.check_dask_cuda(timeout=0.3)  # the child cannot even import gear_flow and Dask in that time
    assert time.monotonic() - t < 30
    assert res["status"] == "failed" and res["error"] == "timed out after 0.3 s during import", res
