"""The runnable scripts in pipelines/ run end to end (small sizes; speed is not asserted here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PIPELINES = Path(__file__).resolve().parents[1] / "pipelines"
sys.path.insert(0, str(PIPELINES))


def test_quickstart_learns():
    import quickstart

    s = quickstart.main(["--steps", "150", "--episodes", "60"])
    assert s["last_loss"] < 0.2 * s["first_loss"]
    assert s["sampled"] == 150 * 64 * 1 // 1 and s["table_size"] == s["stored_steps"]


def test_bench_local_quick_writes_ratios(tmp_path):
    import bench_local

    out = tmp_path / "b.json"
    bench_local.main(["--quick", "--no-peers", "--out", str(out)])
    data = json.loads(out.read_text())
    for path in ("uniform", "prioritized", "insert"):
        assert data[path]["gbps"] > 0 and data[path]["ratio"] > 0
    assert data["memory"]["accounted_per_raw"] > 1.0
    assert set(data["latency"]) == {"reference", "tiny"}
    fixed = data["fixed_cost"]  # each call next to its bare work, both measured in the run
    for path in ("uniform_tiny", "prioritized_update", "heap_ties", "insert_short_episodes"):
        assert fixed[path]["ratio"] > 0 and fixed[path]["target"] > 0
    assert fixed["uniform_tiny"]["np_take_us"] > 0 and fixed["insert_short_episodes"]["memcpy_gbps"] > 0
    assert fixed["prioritized_update_floor"]["ratio"] > 0 and fixed["prioritized_update_floor"]["bare_ms"] > 0
    assert fixed["heap_ties"]["distinct_ms"] > 0


def test_bench_remote_peers_quick_writes_ratios(tmp_path):
    """A learner over one worker's TCP lane, against a raw Dask transfer and a memcpy measured in the run; the
    Reverb rows say why they are missing where Reverb is not installed (it needs the bench extra's
    environment)."""
    import bench_remote_peers

    out = tmp_path / "r.json"
    bench_remote_peers.main(["--quick", "--out", str(out)])
    data = json.loads(out.read_text())
    for name in ("uniform", "prioritized"):
        r = data[name]
        assert r["gear_flow_gbps"] > 0 and r["raw_dask_gbps"] > 0 and r["gear_flow_memcpy_ratio"] > 0
        assert r.get("reverb_gbps", 0) > 0 or "not installed" in r["reverb"]["skipped"]
    assert data["uniform"]["gear_flow_stream_gbps"] > 0


@pytest.mark.parametrize("kind", ["local", "disk", "distributed"])
def test_reverb_parity_finds_no_difference(tmp_path, kind):
    """gear_flow's table (local, on the disk tier, or distributed on an embedded cluster) and Reverb's on a few
    random trials and the limiter boundaries (Reverb needs the bench extra's environment: skipped without it)."""
    pytest.importorskip("reverb")
    import reverb_parity

    out = tmp_path / "p.json"
    assert reverb_parity.main(["--kind", kind, "--trials", "3", "--ops", "20", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert (data["trials"], data["differences"], data["boundary_differences"]) == (3, [], [])


@pytest.mark.slow
def test_bench_distributed_quick(tmp_path):
    """Run as its users run it, in a process of its own: its UCX rows load distributed-ucxx, whose threads
    must not outlive the benchmark in the test process (faulthandler on: a native crash names its thread).
    Its nine clusters' workers fork from a server, as the suite's own clusters do (what it checks is that
    every path runs and reports; --quick times nothing it asserts on)."""
    out = tmp_path / "d.json"
    env = dict(os.environ, PYTHONFAULTHANDLER="1", DASK_DISTRIBUTED__WORKER__MULTIPROCESSING_METHOD="forkserver")
    r = subprocess.run(
        [sys.executable, str(PIPELINES / "bench_distributed.py"), "--quick", "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=280,
    )  # fmt: skip
    assert r.returncode == 0, (r.returncode, r.stdout[-2000:], r.stderr[-4000:])
    data = json.loads(out.read_text())
    for w in ("workers_1", "workers_2"):
        for plane in ("shared", "tcp", "comm"):
            assert data[f"{w}_{plane}"]["external_gbps"] > 0 and data[f"{w}_{plane}"]["colocated"]["gbps"] > 0
    assert data["workers_1_comm"]["colocated"]["remote_bytes"] == 0  # one worker: everything in-process
    assert data["workers_2_comm"]["colocated"]["remote_bytes"] > 0  # the other shard over the comm
    tcp = data["workers_2_tcp"]  # ... or its TCP lane, in the learner's thread
    assert tcp["colocated"]["remote_bytes"] > 0 and tcp["colocated"]["in_thread"] > 0
    assert tcp["stats"]["in_thread"] > 0 and data["workers_2_comm"]["stats"]["in_thread"] == 0
    two = data["workers_2_shared"]
    assert two["colocated"]["shared_bytes"] > 0 and two["colocated"]["remote_bytes"] == 0  # ... or shared memory
    assert two["stats"]["shared_bytes"] > 0 and two["stats"]["remote_bytes"] == 0
    owner = data["workers_2_shared_owner"]  # the same shared memory, the owners drawing
    assert two["stats"]["reader_draws"] > 0 and owner["stats"]["reader_draws"] == 0
    assert owner["stats"]["shared_bytes"] > 0 and owner["stats"]["remote_bytes"] == 0
    for w in ("workers_1", "workers_2"):  # an actor's inserts in its thread wherever it has the coordinator's lane
        assert data[f"{w}_shared"]["actor_insert"]["insert_in_thread"] > 0
        assert data[f"{w}_tcp"]["actor_insert"]["insert_in_thread"] > 0
        assert data[f"{w}_comm"]["actor_insert"]["insert_in_thread"] == 0
    for plane in ("shared", "tcp", "comm"):  # one learner per worker at once, vs one alone
        sc = data[f"workers_2_{plane}"]["learners"]
        assert sc["one"]["gbps"] > 0 and sc["two"]["gbps"] > 0 and sc["ratio"] > 0
        assert len({r["worker"] for r in sc["two"]["learners"]}) == 2
        assert all(r["local_bytes"] > 0 for r in sc["two"]["learners"])
    ucx = data["workers_2_comm_ucx"]  # measured, or a reason why not
    assert "skipped" in ucx or (ucx["external_gbps"] > 0 and ucx["stats"]["remote_bytes"] > 0)
    assert data["workers_1_comm_ucx"] == {"skipped": "--quick"}

    for run in (data[f"{w}_{p}"] for w in ("workers_1", "workers_2") for p in ("shared", "tcp", "comm")):
        assert run["insert_client_gbps"] > 0 and run["scatter_gbps"] > 0
        actor = run["actor_insert"]  # into its own shard: every inserted byte written in-process
        assert set(actor["shards"]) <= set(actor["local_shards"]) and actor["insert_remote_bytes"] == 0
        assert actor["insert_local_bytes"] > 0 and actor["gbps"] > 0 and actor["memcpy_gbps"] > 0


def test_bench_distributed_no_ucx_says_so():
    import argparse

    import bench_distributed

    rows, results = [], {}
    bench_distributed.run_ucx(1, argparse.Namespace(no_ucx=True), [], rows, results)
    assert results == {"workers_1_comm_ucx": {"skipped": "--no-ucx"}}
    assert rows == [{"path": "external learner, 1w, comm over UCX", "ref": "not run: --no-ucx"}]


@pytest.mark.slow
def test_colocated_data_parallel_learners():
    import colocated_train

    res = colocated_train.main(["--steps", "60", "--episodes", "40"])["results"]
    assert sorted(r["local_shards"][0] for r in res) == [0, 1]
    for r in res:
        assert r["local_bytes"] > 0 and r["remote_bytes"] + r["shared_bytes"] > 0  # the other shard too
        assert sum(r["losses"][-5:]) < 0.5 * sum(r["losses"][:5])


def test_bench_disk_quick_writes_ratios(tmp_path):
    import bench_disk

    out = tmp_path / "disk.json"
    bench_disk.main(["--quick", "--out", str(out), "--dir", str(tmp_path / "tables")])
    data = json.loads(out.read_text())
    for name in ("warm", "cold", "reopen_warm", "reopen_cold"):
        assert isinstance(data[name]["met"], bool) and data[name]["target"] > 0
    assert data["warm"]["ratio"] > 0 and data["warm"]["host_gbps"] > 0
    assert data["cold"]["ratio"] > 0 and data["cold"]["preadv_gbps"] > 0 and data["cold"]["same_windows"]
    assert data["reopen_cold"]["seconds_median"] > 0 and data["reopen_cold"]["first_sample_s"] > 0
    assert "beyond_ram" not in data  # only with --beyond-ram
    assert not list((tmp_path / "tables").iterdir())  # the tables are deleted
