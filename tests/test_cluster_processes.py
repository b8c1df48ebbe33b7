"""cluster/ for real: a TLS scheduler and two workers started by the launch scripts, the CLI against
them, a co-located learner; and ``gear-flow local``. Every process runs in its own process group and
is killed in a ``finally``; the tests check that none is left behind."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from processes import CLUSTER, ROOT, Processes, cluster_env, free_port, gear_flow_cli, listening, port_of, workers_of

pytestmark = pytest.mark.timeout(120)


def tls_without_client_cert_accepted(port: int, ca: Path) -> bool:
    """Whether the scheduler answers a TLS client that trusts its CA but shows no certificate."""
    import ssl

    ctx = ssl.create_default_context(cafile=str(ca))
    ctx.check_hostname = False
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s, ctx.wrap_socket(s) as ss:
            ss.sendall(b"\0" * 64)  # TLS 1.3 reports a refused client certificate on the first read
            return bool(ss.recv(1))
    except (ssl.SSLError, OSError):
        return False


def make_learner():
    """A co-located learner; built in a function so that cloudpickle ships it by value (the worker
    processes cannot import this test module)."""

    def learner(name: str, n: int) -> dict:
        from distributed import get_worker

        import gear_flow as gf
        from gear_flow.distributed import DistributedTable

        t = DistributedTable.attach(name)
        rng = np.random.default_rng(0)
        shapes = []
        for b in gf.Stream(t, batch_size=16, length=8, prefetch=2, num_batches=n, seed=1, copy=True):
            shapes.append(tuple(b["obs"].shape))
            t.update_priorities(b.keys.numpy(), rng.uniform(0.1, 2.0, 16))
        return {"worker": get_worker().address, "shapes": shapes, "local_shards": t.local_shards,
                "stats": dict(t.stats)}  # fmt: skip

    return learner


def test_tls_cluster_from_launch_scripts(tmp_path):
    """make_certs.py → start-scheduler.sh + 2 × start-worker.sh (TLS, preload, resources) →
    gear-flow create / ingest / info over TLS → a learner on the `learner` worker → teardown."""
    from distributed import Client, Security

    from gear_flow.distributed import DistributedTable

    if not shutil.which("openssl") and importlib.util.find_spec("cryptography") is None:
        pytest.skip("cluster/tls/make_certs.py needs the openssl command or the cryptography package")
    certs = tmp_path / "certs"
    r = subprocess.run([sys.executable, str(CLUSTER / "tls" / "make_certs.py"), "--out", str(certs)],
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 0, r.stderr
    data = tmp_path / "data"
    r = subprocess.run([sys.executable, str(ROOT / "pipelines" / "make_dataset.py"), "--out", str(data),
                        "--episodes", "12", "--parquet-files", "2"], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    port = free_port()
    addr = f"tls://127.0.0.1:{port}"
    # the deployment's config, in a copy: packages imported by `dask` commands (dask-kubernetes)
    # write their default config files into $DASK_CONFIG, which should not be the source tree here
    (tmp_path / "config").mkdir()
    shutil.copy(CLUSTER / "config" / "gear-flow.yaml", tmp_path / "config")
    env = cluster_env(DASK_CONFIG=tmp_path / "config", GEAR_FLOW_TLS_DIR=certs, GEAR_FLOW_HOST="127.0.0.1", GEAR_FLOW_SCHEDULER_PORT=port,
                      GEAR_FLOW_DASHBOARD="none", GEAR_FLOW_NTHREADS=2, GEAR_FLOW_MEMORY_LIMIT="2GB",
                      GEAR_FLOW_LOCAL_DIRECTORY=tmp_path / "scratch")  # fmt: skip
    procs = Processes(tmp_path)
    sec = Security(tls_ca_file=str(certs / "ca.pem"), tls_client_cert=str(certs / "client.pem"),
                   tls_client_key=str(certs / "client-key.pem"), require_encryption=True)  # fmt: skip
    t0 = time.monotonic()
    with procs:
        # the scheduler's preload installs the worker plugin with the scheduler's settings on every worker
        procs.start(
            "scheduler", ["bash", str(CLUSTER / "start-scheduler.sh")], {**env, "DASK_GEAR_FLOW__WORKER__THREADS": "3"}
        )
        worker = ["bash", str(CLUSTER / "start-worker.sh"), "--kind", "cpu", addr]
        procs.start("worker-learner", worker, {**env, "GEAR_FLOW_RESOURCES": "replay=1,learner=1"})
        procs.start("worker-replay", worker, {**env, "GEAR_FLOW_RESOURCES": "replay=1"})
        with Client(addr, security=sec, timeout="30s") as client:
            client.wait_for_workers(2, timeout=60)
            started = time.monotonic() - t0
            workers = workers_of(client)
            assert all(a.startswith("tls://") for a in workers), workers
            # GEAR_FLOW_HOST=127.0.0.1, GEAR_FLOW_DASHBOARD=none: the scheduler's, workers' and nannies'
            # comm ports on 127.0.0.1 and nothing else (no HTTP server anywhere)
            comm = {port} | {port_of(a) for a in workers} | {port_of(w["nanny"]) for w in workers.values()}
            assert listening(procs.group_members()) == {("127.0.0.1", p) for p in comm}
            learner_addr = next(a for a, w in workers.items() if w["resources"].get("learner"))
            # the preload set gear_flow up on both sides before any table existed
            assert set(client.run(lambda dask_worker: "gear_flow" in dask_worker.handlers).values()) == {True}
            assert client.run_on_scheduler(lambda dask_scheduler: "gear_flow_coord" in dask_scheduler.handlers)

            # TLS is required: no plain TCP, no certificate from another CA, no client certificate
            import dask

            with dask.config.set({"distributed.comm.require-encryption": False}):
                with pytest.raises((OSError, TimeoutError)):
                    Client(f"tcp://127.0.0.1:{port}", timeout="2s")
            other = tmp_path / "other-ca"
            subprocess.run([sys.executable, str(CLUSTER / "tls" / "make_certs.py"), "--out", str(other)], check=True,
                           capture_output=True, timeout=60)  # fmt: skip
            bad = Security(tls_ca_file=str(certs / "ca.pem"), tls_client_cert=str(other / "client.pem"),
                           tls_client_key=str(other / "client-key.pem"), require_encryption=True)  # fmt: skip
            with pytest.raises((OSError, TimeoutError)):
                Client(addr, security=bad, timeout="2s")
            assert not tls_without_client_cert_accepted(port, certs / "ca.pem")

            # the CLI over TLS: create (placed by resource), ingest (read on the workers), info
            tls = ["--scheduler", addr, "--tls-dir", certs]
            out = gear_flow_cli("create", *tls, "--name", "replay", "--obs-dim", "4", "--capacity", "4000",
                                "--resources", "replay", "--sampler", "prioritized:alpha=0.6,beta=0.4", env=env)  # fmt: skip
            assert "created table 'replay': 2 shard(s)" in out, out
            # create()'s own plugin registration did not replace the preloaded one (idempotent)
            assert set(client.run(lambda dask_worker: dask_worker.plugins["gear-flow"].threads).values()) == {3}
            out = gear_flow_cli("ingest", *tls, "--table", "replay", data / "minari" / "cartpole-mixed-v0", env=env)
            assert "read 12 episodes" in out and "checksums match" in out, out
            out = gear_flow_cli("info", *tls, "--table", "replay", env=env)
            assert re.search(r"replay: \d+ items", out) and out.count("tls://127.0.0.1:") == 2, out
            assert gear_flow_cli("list", *tls, env=env).split() == ["replay"]

            # a co-located learner on the worker advertising `learner`, reading both shards
            res = client.submit(make_learner(), "replay", 6, resources={"learner": 1}, pure=False).result(timeout=60)
            assert res["worker"] == learner_addr
            assert res["shapes"] == [(16, 8, 4)] * 6
            assert (
                res["local_shards"]
                and res["stats"]["local_bytes"] > 0
                and res["stats"]["remote_bytes"] + res["stats"]["shared_bytes"] > 0
            )

            # and an external learner on this client
            table = DistributedTable.attach("replay", client=client)
            b = table.sample(32, 8)
            assert tuple(b["obs"].shape) == (32, 8, 4) and np.isfinite(b.weights.numpy()).all()
            info = table.info()
            assert info["size"] == info["coordinator_size"] > 0
            assert info["totals"]["sampled"] >= 6 * 16 + 32
            assert sorted(set(table.placement.values())) == sorted(workers)
            gear_flow_cli("drop", *tls, "--table", "replay", env=env)
            assert gear_flow_cli("list", *tls, env=env).split() == []
    assert started < 60, f"cluster took {started:.0f} s to start"


def test_gear_flow_local_starts_serves_and_stops(tmp_path):
    """``gear-flow local`` prints a usable address, serves the CLI, and stops on SIGINT."""
    procs = Processes(tmp_path)
    env = cluster_env()
    with procs:
        p = procs.start("local", [sys.executable, "-m", "gear_flow", "local", "--workers", "1", "--threads", "1",
                                  "--port", "0", "--no-dashboard", "--memory-limit", "1GB"], env)  # fmt: skip
        log = tmp_path / "local.log"
        deadline = time.monotonic() + 60
        while "scheduler at" not in log.read_text() and time.monotonic() < deadline and p.poll() is None:
            time.sleep(0.2)
        m = re.search(r"scheduler at (\S+)", log.read_text())
        assert m, log.read_text()
        addr = m[1]
        from distributed import Client

        with Client(addr, timeout="10s") as client:  # --no-dashboard: comm ports only, all on 127.0.0.1
            ws = workers_of(client)
            comm = {port_of(addr)} | {port_of(a) for a in ws} | {port_of(w["nanny"]) for w in ws.values()}
        assert listening(procs.group_members()) == {("127.0.0.1", p) for p in comm}
        out = gear_flow_cli("create", "--scheduler", addr, "--name", "t", "--columns", "obs:float32[3],done:bool",
                            "--capacity", "100", env=env)  # fmt: skip
        assert "created table 't': 1 shard(s) of 100 steps" in out, out
        out = gear_flow_cli("create", "--scheduler", addr, "--spec", CLUSTER / "examples" / "cartpole-table.yaml",
                            "--capacity", "1000", env=env)  # fmt: skip
        assert "created table 'cartpole': 1 shard(s) of 1000 steps" in out and "prioritized" in out, out
        env_addr = {**env, "DASK_SCHEDULER_ADDRESS": addr}
        assert sorted(gear_flow_cli("list", env=env_addr).split()) == ["cartpole", "t"]
        from gear_flow.distributed import DistributedTable

        with Client(addr, timeout="10s") as client:
            DistributedTable.attach("t", client=client).insert(
                [{"obs": np.ones((10, 3), np.float32), "done": np.arange(10) == 9}]
            )
        out = gear_flow_cli("sample", "--table", "t", "--batch-size", "4", "--length", "2", env=env_addr)
        assert "obs     [4, 2, 3]  float32" in out, out
        out = gear_flow_cli("bench", "table", "--table", "t", "--batches", "3", "--batch-size", "4", "--length", "2",
                            env=env_addr)  # fmt: skip
        assert "GB/s" in out and "4x2" in out, out
        os.killpg(p.pid, signal.SIGINT)
        assert p.wait(timeout=40) == 0
        assert "gear-flow local: stopped" in log.read_text()
