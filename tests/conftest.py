from __future__ import annotations

import os
import tempfile

import pytest

#: where the suite's forked workers mark their start and their normal end (``forkserver_preload``): one directory
#: for the run, set before xdist starts its workers (they inherit it) and before the fork server starts
MARKS_VAR = "GEAR_FLOW_TEST_MARKS"
_MADE_MARKS = MARKS_VAR not in os.environ  # (this process made the directory: it removes it at the session's end)
if _MADE_MARKS:
    os.environ[MARKS_VAR] = tempfile.mkdtemp(prefix="gf-test-marks-")


def _gpu_usable() -> bool:
    try:
        import cupy
    except Exception:
        return False
    try:
        return bool(cupy.cuda.is_available())
    except Exception:
        return False


#: the files that took longest in a run of the suite (``--durations=0``, summed per file), which the workers
#: take first: run last, one of them kept one worker busy minutes after the other had finished (xdist's
#: ``loadfile`` hands out whole files, by default the files with the most tests first).  A file missing here only
#: lengthens that tail.
LONGEST_FILES = (
    "test_dist_owners.py", "test_pipelines.py", "test_distributed.py", "test_dist_concurrency.py", "test_ingest.py",
    "test_dist_lost_replies.py", "test_cluster_processes.py", "test_docs.py", "test_dist_scaling.py",
    "test_device_selection.py", "test_deploy_ucx.py", "test_offline_dt.py", "test_kernels_emulated.py",
)  # fmt: skip


def pytest_configure(config):
    if hasattr(config.option, "loadscopereorder"):  # (xdist's controller: hand the files out in the order below)
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    files: dict[str, list] = {}
    for item in items:
        files.setdefault(item.path.name, []).append(item)
    first = {name: i for i, name in enumerate(LONGEST_FILES)}
    # the longest first, then the others with the most tests first (xdist's own order), each file's tests in
    # their order
    order = sorted(files, key=lambda f: (first.get(f, len(first)), -len(files[f]) if f not in first else 0))
    items[:] = [item for f in order for item in files[f]]
    if _gpu_usable():
        return
    skip = pytest.mark.skip(reason="no usable CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# -- worker processes ------------------------------------------------------------------------------
#: Dask's own diagnostics, at a slower pace in the suite's clusters (each process's event-loop tick every 20 ms,
#: each worker's statistical profiler every 10 ms, the system monitor every 0.5 s): nothing of gear_flow reads
#: them, and on the suite's 2 cores an idle 2-worker cluster spent 13-14 % of a core on them (under 4 % after), with
#: two such clusters (``dist_client``, one per xdist worker) alive the whole run.  The launch scripts' tests
#: start their processes with the deployment's own settings, untouched.
QUIET_DIAGNOSTICS = {
    "distributed.admin.tick.interval": "500ms",
    "distributed.worker.profile.enabled": False,
    "distributed.admin.system-monitor.interval": "2s",
}


@pytest.fixture(scope="session", autouse=True)
def _quiet_diagnostics():
    import dask

    dask.config.set(QUIET_DIAGNOSTICS)
    yield


@pytest.fixture(scope="session", autouse=True)
def _workers_fork_from_a_server():
    """The suite's in-process clusters start their workers from a fork server, as distributed's own suite
    does: a worker then costs a fork of a process that has imported distributed, numpy and the worker's
    plugin once, where a spawned one starts an interpreter and imports them again (about 1.4 s of CPU each,
    and the suite starts some two hundred; nothing of the package starts a thread or draws from a global
    generator at import, so the forks share no state that matters).  The server starts here, before any
    test changes the environment, with the variables a nanny sets before it spawns
    (``distributed.nanny.pre-spawn-environ``), so its workers see what spawned ones would.  It also loads
    numba's typing and lowering registries (``forkserver_preload``): about 0.5 s of CPU that each worker's
    first insert or sample paid, measured in a worker.  The launch
    scripts' tests keep Dask's default (spawn), as their users run them."""
    import multiprocessing.forkserver
    import os

    import dask
    from distributed.utils import get_mp_context

    dask.config.set({"distributed.worker.multiprocessing-method": "forkserver"})
    ctx = get_mp_context()  # (sets distributed's own preload list, which the next line replaces)
    # forkserver_preload (here, in tests/): numba's registries loaded once, not at each worker's first compile
    ctx.set_forkserver_preload(["distributed", "numpy", "pandas", "gear_flow.distributed.plugin", "forkserver_preload"])
    saved = dict(os.environ)
    os.environ.update({k: str(v) for k, v in dask.config.get("distributed.nanny.pre-spawn-environ").items()})
    # the server imports its preload with the path it starts with (Python 3.11 does not pass it this process's)
    here = os.path.dirname(os.path.abspath(__file__))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (here, saved.get("PYTHONPATH")) if p)
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    yield


# -- the same suites against the local and the distributed table ---------------------------------
@pytest.fixture(scope="session")
def dist_client():
    """One 2-worker LocalCluster (real processes, loopback only) shared by the suites that run on both tables."""
    import dask
    from distributed import Client, LocalCluster

    with dask.config.set({"distributed.comm.timeouts.connect": "5s"}):
        with LocalCluster(
            n_workers=2, threads_per_worker=2, processes=True, host="127.0.0.1", dashboard_address=None
        ) as cluster:
            with Client(cluster) as c:
                yield c


@pytest.fixture(params=["local", "disk", "distributed", "owner-draw"])
def make_table(request, tmp_path):
    """``make_table(spec, **LocalTable kwargs)``: a LocalTable (in memory, or on the ``disk`` tier under
    ``tmp_path``), or a DistributedTable over two workers whose batches are drawn by the handle from the
    shards' published state where it can, or by their owners.

    For the distributed kind, making a table closes the one made before (suites
    use one table at a time; hypothesis makes one per example).
    """
    from dist_support import TableFactory

    local = request.param in ("local", "disk")
    f = TableFactory(request.param, None if local else request.getfixturevalue("dist_client"), tmp=tmp_path)
    yield f
    f.close()


@pytest.fixture(params=["shared-memory", "tcp-lane", "comm"])
def data_plane(request):
    """Tables created in the test read remote shards from shared memory (same machine, control over the
    fast lane), over the workers' TCP lanes (shared memory off, as from another machine), or through
    Dask's comm only (shared memory and TCP lanes off)."""
    import dask

    with dask.config.set(
        {
            "gear-flow.distributed.shared-memory": request.param == "shared-memory",
            "gear-flow.distributed.tcp-lane": request.param == "tcp-lane",
        }
    ):
        yield request.param


@pytest.fixture
def requests_seen(dist_client):
    """Counts, on every worker of the session's cluster, the insert requests with episodes that arrive over
    its comm and its lane (:class:`dist_support.RequestCounts`); the counters are removed after the test."""
    from dist_support import RequestCounts, restore_requests

    try:
        yield RequestCounts(dist_client)
    finally:
        dist_client.run(restore_requests)


def pytest_sessionfinish(session, exitstatus):
    """No shared-memory segment may outlive its owner: a leak fails the run.

    Except a killed worker's: killed, a worker leaves its segments and its lane's directory, as after a crash,
    and the next worker on the machine sweeps them (``gear_flow.storage.shared.sweep``).  A test that kills
    one sweeps after it, but a worker can also be killed where no test meant it to: a nanny closing its
    cluster kills a worker that does not close within its timeout (a loaded two-core machine), and nothing
    starts a worker after the last cluster.  So the leftovers of the suite's workers that never ended
    normally (``forkserver_preload`` marks each one's start and its normal end) are swept here, as the
    next worker would; those of a worker that ended normally, or of any other process, fail the run."""
    from helpers import killed_workers, marked

    from gear_flow.storage.shared import leftover_segments, segment_owner, sweep

    left = leftover_segments()
    if left:
        sweep(killed_workers())
        left = leftover_segments()
    if left:
        ended = marked(".exited")
        whose = {
            n: "a worker that ended normally" if segment_owner(n) in ended else "not a worker of the suite"
            for n in left
        }
        print(f"\nleaked gear_flow shared-memory segments: {whose}")
        session.exitstatus = 1
    if _MADE_MARKS:
        import shutil

        shutil.rmtree(os.environ[MARKS_VAR], ignore_errors=True)
