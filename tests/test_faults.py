"""A closed table, a lost scheduler: clear errors within bounded time, never a hang."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import dask
import numpy as np
import pytest
from dist_support import context, coordinator, own_cluster, wait_for
from distributed import Client, LocalCluster
from helpers import COLUMNS, episode, owned_segments

import gear_flow as gf
from gear_flow.distributed import DistributedTable
from gear_flow.storage.shared import SHM_DIR, sweep

pytestmark = pytest.mark.timeout(180)


def spec():
    return gf.TableSpec(COLUMNS, capacity=500, num_shards=2)


def test_closing_wakes_blocked_callers_and_refuses_new_ones():
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster,
        Client(cluster) as c,
    ):
        t = DistributedTable.create(c, spec(), rate_limiter=gf.MinSize(100), seed=0)
        t.insert([episode(1, 10)])
        got = []

        def blocked():
            try:
                t.sample(4, 1, timeout=60)
            except gf.GearFlowError as e:
                got.append(e)

        th = threading.Thread(target=blocked)
        th.start()
        wait_for(lambda: coordinator(t).lookup()["waiting"]["samples"] == 1, "the sample to wait")
        t0 = time.monotonic()
        t.close()
        th.join(timeout=20)
        assert not th.is_alive() and time.monotonic() - t0 < 20
        assert isinstance(got[0], gf.TableClosedError)
        with pytest.raises(gf.GearFlowError):
            t.insert([episode(2, 3)])


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _accepts(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def test_a_client_that_closed_its_connections_reports_the_coordinator_lost(dist_client):
    """A client that gave up on its scheduler closes its connection pool; a coordinator request over the
    comm then meets Dask's ``RuntimeError("ConnectionPool is closed")``, which is a lost coordinator (seen
    as an untranslated RuntimeError after a scheduler was killed, when the client closed first); so is a
    request to a worker."""
    from gear_flow.distributed.transport import call

    # coordinator and worker requests over the comm
    with dask.config.set({"gear-flow.distributed.fast-lane": False, "gear-flow.distributed.tcp-lane": False}):
        t = DistributedTable.create(dist_client, spec(), seed=0)
        c2 = Client(dist_client.scheduler.address, set_as_default=False)
        try:
            t2 = DistributedTable.attach(t.name, c2)
            assert coordinator(t2).lookup()["name"] == t.name
            c2.sync(c2.rpc.close)
            with pytest.raises(gf.CoordinatorLostError, match="cannot be reached.*ConnectionPool is closed"):
                coordinator(t2).lookup()
            with pytest.raises(gf.CoordinatorLostError, match="closed its connections"):
                t2.client.sync(call, context(t2), t.placement[0], "info", table=t.name, name=t.name)
        finally:
            c2.close()
            t.close()


def test_lost_scheduler_is_a_clear_error(tmp_path):
    port = _free_port()
    addr = f"tcp://127.0.0.1:{port}"
    py = os.path.dirname(sys.executable)
    sched = subprocess.Popen(
        [f"{py}/dask", "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    worker = subprocess.Popen(
        [f"{py}/dask", "worker", addr, "--nthreads", "1", "--no-dashboard", "--no-nanny"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        with dask.config.set({"distributed.comm.timeouts.connect": "3s"}):
            wait_for(lambda: _accepts(port), "the scheduler to listen", deadline=60)
            # the client's timeout is also how long it dials the killed scheduler again before the call fails
            with Client(addr, timeout="5s") as c:
                c.wait_for_workers(1, timeout=30)
                t = DistributedTable.create(c, spec(), seed=0)
                t.insert([episode(1, 10)])
                assert len(t.sample(4, 1)) == 4
                left_by = owned_segments([sched.pid, worker.pid])
                assert left_by  # the coordinator's lane at least, and the shard's rings
                os.killpg(sched.pid, signal.SIGKILL)
                sched.wait(timeout=10)
                t0 = time.monotonic()
                # a sample lease granted before the kill may still cover a few batches (drawn from the shard's
                # published state: no request at all); the first one past its batches must fail
                leased = 0
                with pytest.raises((gf.CoordinatorLostError, gf.ShardLostError, OSError)) as ei:
                    while leased <= dask.config.get("gear-flow.distributed.sample-lease"):
                        t.sample(4, 1)
                        leased += 1
                assert time.monotonic() - t0 < 60
                assert isinstance(ei.value, gf.GearFlowError), f"untranslated: {ei.value!r}"
                assert "scheduler" in str(ei.value)
                # the client closes itself once its timeout of redialling passes; closing it here meanwhile
                # races that close inside distributed (its connection pool cancels a dial twice: "Cannot
                # change state of expiring Timeout"), so the block ends once the client has closed
                wait_for(lambda: c.status == "closed", "the client to give up on the killed scheduler", deadline=60)
    finally:
        for p in (sched, worker):
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(timeout=10)
    # what the killed processes left goes with the next sweep, as when a worker starts on this machine after a
    # crash (this one, or that of a worker another test process starts meanwhile: the same sweep)
    sweep([sched.pid, worker.pid])
    assert not [n for n in os.listdir(SHM_DIR) if n in left_by]


def test_a_batch_too_large_for_the_owners_memory_is_refused_and_the_table_goes_on():
    """The owners drawing and gathering into batches of their own (shared memory off: as across hosts), a
    batch whose windows the worker would gather into more than its memory allows: refused before anything
    is drawn, where the worker's nanny killed it and its shards were lost. The same workers serve on, and
    the refused batch was not counted."""
    cols = (gf.ColumnSpec("obs", (16384,), np.float32),)  # 64 KiB a step
    cfg = {"gear-flow.distributed.reader-draw": False, "gear-flow.distributed.shared-memory": False}
    with own_cluster(cfg, n=1, memory_limit="1GiB") as c:
        t = DistributedTable.create(c, gf.TableSpec(cols, capacity=256, num_shards=1), seed=0)
        t.insert([{"obs": np.ones((64, 16384), np.float32)}])
        pids = c.run(os.getpid)
        with pytest.raises(gf.CapacityError, match=r"does not fit this worker's memory.*sample smaller batches"):
            t.sample(40_000)  # 2.4 GiB of windows
        assert c.run(os.getpid) == pids  # no worker was killed and restarted
        assert t.info()["lost"] == {}
        assert t.sample(64)["obs"].shape == (64, 1, 16384)
        assert t.info()["rate_limiter"]["samples"] == 64


async def _served_after_teardown(dask_worker=None):
    """Tear the plugin down as a closing worker does, then serve a request that needs its thread pool."""
    from gear_flow.distributed import protocol

    plugin = dask_worker.plugins["gear-flow"]
    plugin.teardown(dask_worker)
    ok, err = await plugin.serve("checkpoint", {"name": "t", "directory": "/nonexistent"}, protocol.VERSION)
    return ok, type(err).__name__, str(err)


def test_a_request_that_meets_its_worker_closing_is_refused_as_such():
    """A request still arriving as its worker closes (the plugin torn down, its thread pool shut down) is
    answered with a GearFlowError saying the worker is closing, logged without a traceback, not as the bug an
    unexpected error is (a move's destination closing during a scale-down logged 'move_in failed' with one)."""
    with own_cluster(n=1) as c:
        DistributedTable.create(c, spec(), seed=0)  # (gear_flow's plugins registered)
        (w,) = list(c.run(os.getpid))
        ok, kind, msg = c.run(_served_after_teardown, workers=[w])[w]
        assert (ok, kind) == (False, "GearFlowError")
        assert "the worker is closing" in msg, msg
