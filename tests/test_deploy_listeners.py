"""Safe defaults of the launch scripts, for real: a scheduler and a worker started without
GEAR_FLOW_HOST listen on 127.0.0.1 only (dashboards included), read from the processes' sockets; a
task asking for a resource no worker has fails at once with a clear error; the CLI's errors against
a live cluster (missing table, no tables, unknown resource) are one line each."""

from __future__ import annotations

import subprocess
import sys
import urllib.request

import dask
import numpy as np
import pytest
from dist_support import handed
from processes import (
    CLUSTER,
    Processes,
    cluster_env,
    gear_flow_cli,
    launch_env,
    listening,
    port_of,
    wait_for_line,
    workers_of,
)

import gear_flow as gf
from gear_flow.distributed import DistributedTable
from gear_flow.errors import SpecError
from gear_flow.resources import check_resources, submit

pytestmark = pytest.mark.timeout(120)


def cli_error(*args, env) -> str:
    """Run a gear-flow command that must fail; its stderr, which must be one line."""
    r = subprocess.run([sys.executable, "-m", "gear_flow", *map(str, args)], env=env, capture_output=True,
                       text=True, timeout=60)  # fmt: skip
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"gear-flow {args[0]}: "), r.stderr
    assert "Traceback" not in r.stderr
    return lines[0]


def test_launch_scripts_listen_on_loopback_by_default_and_resources_fail_fast(tmp_path):
    from distributed import Client

    env, addr = launch_env(tmp_path, "tcp")
    procs = Processes(tmp_path)
    with procs:
        sched = procs.start("scheduler", ["bash", str(CLUSTER / "start-scheduler.sh")], env)
        wait_for_line(tmp_path / "scheduler.log", r"Scheduler at:\s+tcp://127\.0\.0\.1:", sched)
        # the default worker resources include `learner` (the docs' co-located learner runs)
        procs.start("worker", ["bash", str(CLUSTER / "start-worker.sh"), "--kind", "cpu", addr], env)
        with Client(addr, timeout="20s") as client:
            client.wait_for_workers(1, timeout=60)
            ws = workers_of(client)
            socks = listening(procs.group_members())
            assert {ip for ip, _ in socks} == {"127.0.0.1"}, socks
            comm = {port_of(addr)} | {port_of(a) for a in ws} | {port_of(w["nanny"]) for w in ws.values()}
            http = {p for _, p in socks} - comm
            assert len(http) == 2, socks  # the scheduler's and the worker's dashboards, on 127.0.0.1 too
            for p in http:
                with urllib.request.urlopen(f"http://127.0.0.1:{p}/health", timeout=10) as r:
                    assert r.read() == b"ok"
            log = (tmp_path / "scheduler.log").read_text()
            assert "listening on 127.0.0.1 only (GEAR_FLOW_HOST is not set)" in log

            (w,) = ws.values()
            assert w["resources"] == {"replay": 1, "learner": 1}
            assert check_resources(client, {"learner": 1}) == list(ws)
            assert submit(client, lambda x: x + 1, 1, resources={"learner": 1}).result(timeout=30) == 2
            with pytest.raises(SpecError) as e:
                submit(client, lambda: 0, resources={"learner": 1, "gpu": 1})
            msg = str(e.value)
            assert "missing: gpu" in msg and "1 worker with learner=1,replay=1" in msg
            assert "GEAR_FLOW_RESOURCES=gpu=1,learner=1,replay=1" in msg
            with pytest.raises(SpecError, match="must be > 0"):
                check_resources(client, {"learner": 0})

            # the CLI against this cluster: one line for each user error
            cenv = cluster_env(DASK_SCHEDULER_ADDRESS=addr)
            r = subprocess.run([sys.executable, "-m", "gear_flow", "list"], env=cenv, capture_output=True,
                               text=True, timeout=60)  # fmt: skip
            assert r.returncode == 0 and r.stdout == "", r
            assert r.stderr.strip() == f"gear-flow list: no tables on {addr} (create one with `gear-flow create`)"
            line = cli_error("info", "--table", "nope", env=cenv)
            assert line == (f"gear-flow info: no table 'nope' on {addr} (there are no tables); create it with "
                            "`gear-flow create --name nope ...`, or check --table")  # fmt: skip
            line = cli_error("create", "--name", "t", "--obs-dim", "4", "--capacity", "100", "--resources", "gpu",
                             env=cenv)  # fmt: skip
            assert "no worker has the resources gpu=1" in line and "1 worker with learner=1,replay=1" in line
            gear_flow_cli("create", "--name", "t", "--obs-dim", "4", "--capacity", "100", env=cenv)
            line = cli_error("sample", "--table", "other", env=cenv)
            assert "no table 'other'" in line and "tables there: t" in line
            # checkpoint and restore-shard: written private; a restore's refusal is one line too
            out = gear_flow_cli("checkpoint", "--table", "t", tmp_path / "ck", env=cenv)
            assert f"written to {tmp_path / 'ck'}" in out and oct((tmp_path / "ck").stat().st_mode & 0o777) == "0o700"
            line = cli_error("restore-shard", "--table", "t", "--shard", "7", tmp_path / "ck", env=cenv)
            assert "SpecError: shard 7 must be in [0, 1)" in line, line  # the table has no shard 7
            line = cli_error("restore-shard", "--table", "t", "--shard", "0", tmp_path / "nowhere", env=cenv)
            assert "is not a gear_flow checkpoint" in line, line

            # a handle that does not map the worker's rings (shared memory off) draws over the worker's TCP
            # lane and reaches the coordinator over the scheduler's: two more sockets, on the same address as
            # everything else
            with dask.config.set({"gear-flow.distributed.shared-memory": False}):
                spec = gf.TableSpec((gf.ColumnSpec("x", (), np.float32),), capacity=64)
                lt = DistributedTable.create(client, spec, seed=0, name="lane")
                h, ctx = handed(lt, seed=0)  # the handle whose lanes are read, on a context of the test's own
                h.insert([{"x": np.arange(10, dtype=np.float32)}])
                h.sample(4, 1)
                h.sample(4, 1)
            (lane,) = ctx.lanes.paths.values()
            assert lane.startswith("tcp://127.0.0.1:") and h.stats["in_thread"] >= 1, (lane, h.stats)
            coord_lane = ctx.sync(ctx.coord_lane)
            assert coord_lane.startswith("tcp://127.0.0.1:"), coord_lane
            after = listening(procs.group_members())
            assert {ip for ip, _ in after} == {"127.0.0.1"}
            assert after - socks == {("127.0.0.1", port_of(lane)), ("127.0.0.1", port_of(coord_lane))}
            lt.close()
