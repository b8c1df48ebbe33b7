"""GPU deployment without a GPU: what ``local_cuda_cluster`` passes to dask-cuda and what it says
when something is missing (real interpreters, with dask_cuda hidden or present), and the
:class:`GpuMemory` worker plugin's decisions on real workers.

What needs a device (the pool actually made, CuPy allocating from it, a LocalCUDACluster round
trip) is proved by ``pipelines/gpu_check.py`` (section ``dask_cuda``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import dask.config
import pytest

from gear_flow.deploy.gpu import has_gpu
from gear_flow.deploy.local import NO_HTTP, PRELOAD, cuda_cluster_kwargs
from gear_flow.distributed import gpu_memory
from gear_flow.distributed.gpu_memory import PLUGIN_NAME, GpuMemory, check_libraries, check_pool_size, pool_bytes
from gear_flow.errors import DeployError, SpecError

ROOT = Path(__file__).resolve().parents[1]
HAVE_DASK_CUDA = importlib.util.find_spec("dask_cuda") is not None
HAVE_RMM = importlib.util.find_spec("rmm") is not None


@contextlib.contextmanager
def one_worker(preload: bool = False, config: dict | None = None):
    """``(client, scheduler, worker)`` of a one-worker LocalCluster in this process (the plugin's state is
    read off the real Worker object).  Not ``gen_cluster``: that kills every child process of the test
    session at its start (the session's shared clusters with them)."""
    from distributed import Client, LocalCluster

    kw = {"scheduler_kwargs": {"preload": ["gear_flow.distributed.preload"]}} if preload else {}
    with dask.config.set(config or {}):
        with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, protocol="tcp", host="127.0.0.1",
                          dashboard_address=None, **kw) as cluster, Client(cluster) as client:  # fmt: skip
            yield client, cluster.scheduler, next(iter(cluster.workers.values()))


# -- the arguments ---------------------------------------------------------------------------------


def test_cuda_cluster_kwargs_follow_arguments_then_config():
    kw = cuda_cluster_kwargs()
    assert kw["n_workers"] is None and kw["threads_per_worker"] == 1 and kw["protocol"] == "tcp"
    # no pool configured: nothing handed to RMM (CuPy keeps its own pool)
    assert kw["rmm_pool_size"] is None and kw["rmm_allocator_external_lib_list"] is None
    assert kw["host"] == "127.0.0.1" and kw["dashboard_address"] == "127.0.0.1:8787"
    assert kw["worker_dashboard_address"] == "127.0.0.1:0"
    assert kw["preload"] == [PRELOAD] and kw["scheduler_kwargs"] == {"dashboard": True, "preload": [PRELOAD]}
    with dask.config.set({"gear-flow.gpu.rmm-pool-size": "0.8", "gear-flow.gpu.rmm-for": "cupy,torch"}):
        kw = cuda_cluster_kwargs(host="10.0.0.5", protocol="ucx")
        assert (kw["rmm_pool_size"], kw["rmm_allocator_external_lib_list"]) == (0.8, ["cupy", "torch"])
        assert (kw["host"], kw["protocol"], kw["dashboard_address"]) == ("10.0.0.5", "ucx", "10.0.0.5:8787")
        kw = cuda_cluster_kwargs(rmm_pool_size="40GB", rmm_for=["torch"])  # arguments win over the config
        assert (kw["rmm_pool_size"], kw["rmm_allocator_external_lib_list"]) == (40_000_000_000, ["torch"])
    kw = cuda_cluster_kwargs(2, no_dashboard=True, resources={"replay": 1}, device_memory_limit=0.5)
    assert kw["dashboard_address"] is None and kw["preload"] == [PRELOAD, NO_HTTP]
    assert kw["scheduler_kwargs"] == {"dashboard": False, "preload": [PRELOAD, NO_HTTP]}
    assert (kw["n_workers"], kw["resources"], kw["device_memory_limit"]) == (2, {"replay": 1}, 0.5)


@pytest.mark.parametrize(
    "value, match",
    [("lots", "'lots'"), (1.5, "1.5"), (0, "at least 256 bytes"), (True, "True"), (-0.5, "-0.5")],
)
def test_bad_pool_sizes_are_named(value, match):
    with pytest.raises(SpecError, match=match):
        check_pool_size(value)
    with pytest.raises(SpecError, match="rmm-pool-size"):
        GpuMemory(pool_size=value)
    with pytest.raises(SpecError, match="rmm-pool-size"):
        cuda_cluster_kwargs(rmm_pool_size=value)


def test_pool_sizes_and_libraries():
    assert check_pool_size(0.8) == 0.8 and check_pool_size("0.25") == 0.25 and check_pool_size(1.0) == 1.0
    assert check_pool_size("2GiB") == 2**31 and check_pool_size(4096) == 4096 and check_pool_size("4e9") == 4 * 10**9
    with pytest.raises(SpecError, match="at least 256 bytes"):
        check_pool_size(1)  # an integer is bytes
    assert pool_bytes(0.5, 10**9 + 100) == (10**9 + 100) // 2 // 256 * 256
    assert pool_bytes(2**31, 2**34) == 2**31
    with pytest.raises(SpecError, match="larger than the device"):
        pool_bytes(2**35, 2**34)
    assert check_libraries("cupy, torch") == ("cupy", "torch") and check_libraries(["torch", "torch"]) == ("torch",)
    assert check_libraries(None) == () and check_libraries("") == ()
    with pytest.raises(SpecError, match=r"unknown \['numba'\].*allowed: any of \['cupy', 'torch'\]"):
        check_libraries("cupy,numba")


# -- starting it: what is missing, in one line --------------------------------------------------------

PROBE = """
import json, sys
if sys.argv[1] == "absent":
    class _Block:  # dask_cuda not installed, as far as this interpreter can tell
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "dask_cuda":
                raise ImportError(f"No module named {name!r}")
    sys.meta_path.insert(0, _Block())
from gear_flow.deploy.local import cuda_cluster_kwargs, gpu_cluster_missing, local_cuda_cluster
from gear_flow.errors import DeployError
out = {"missing": gpu_cluster_missing(rmm_pool=True)}
try:
    local_cuda_cluster(rmm_pool_size=0.5)
except DeployError as e:
    out["error"] = str(e)
    out["fields"] = [e.what, e.missing]
if sys.argv[1] == "present":  # every argument is one LocalCUDACluster, LocalCluster or a worker takes
    import inspect
    from dask_cuda import LocalCUDACluster
    from distributed import LocalCluster, Nanny, Worker
    known = set()
    for f in (LocalCUDACluster.__init__, LocalCluster.__init__, Nanny.__init__, Worker.__init__):
        known |= set(inspect.signature(f).parameters)
    out["unknown"] = sorted(set(cuda_cluster_kwargs(rmm_pool_size=0.5)) - known)
print(json.dumps(out))
"""


def _probe(mode: str) -> dict:
    r = subprocess.run([sys.executable, "-c", PROBE, mode], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.splitlines()[-1])


@pytest.mark.skipif(has_gpu(), reason="this machine has a GPU: a LocalCUDACluster would start")
@pytest.mark.parametrize("dask_cuda", ["absent", "present"])
def test_local_cuda_cluster_says_what_is_missing(dask_cuda):
    if dask_cuda == "present" and not HAVE_DASK_CUDA:
        pytest.skip("dask_cuda is not installed here (the gpu-cu13 extra)")
    out = _probe(dask_cuda)
    no_gpu = "no NVIDIA GPU is visible (nvidia-smi -L and NVML list none)"
    assert out["error"].startswith("cannot start a LocalCUDACluster here: ") and "\n" not in out["error"]
    assert out["fields"][0] == "a LocalCUDACluster" and out["missing"] in out["error"]
    assert no_gpu in out["missing"] and "gear_flow.local_cluster()" in out["missing"]
    assert ("dask_cuda is not importable" in out["missing"]) == (dask_cuda == "absent")
    assert ("needs rmm" in out["missing"]) == (not HAVE_RMM)
    if dask_cuda == "present":
        assert out["unknown"] == []


@pytest.mark.skipif(has_gpu(), reason="this machine has a GPU: a LocalCUDACluster would start")
def test_gear_flow_local_gpu_is_one_line_error(tmp_path):
    r = subprocess.run([sys.executable, "-m", "gear_flow", "local", "--gpu", "--port", "0"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120, env={**_env(), "PYTHONPATH": str(ROOT)})  # fmt: skip
    assert r.returncode == 2 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gear-flow local: DeployError: cannot start a LocalCUDACluster")
    r = subprocess.run([sys.executable, "-m", "gear_flow", "local", "--rmm-pool-size", "0.5"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120, env={**_env(), "PYTHONPATH": str(ROOT)})  # fmt: skip
    assert r.returncode == 2 and r.stderr.strip() == "gear-flow local: --rmm-pool-size is for GPU workers: add --gpu"


def _env() -> dict:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("DASK_")}


# -- the worker plugin on real workers -----------------------------------------------------------------


def test_gpu_memory_without_a_pool_does_nothing_and_says_why():
    with one_worker() as (c, s, a):
        c.register_plugin(GpuMemory())
        st = a.plugins[PLUGIN_NAME].status
    assert st == {"pool_bytes": None, "by": None, "libraries": [],
                  "reason": "no RMM pool configured (gear-flow.gpu.rmm-pool-size is null)"}  # fmt: skip


@pytest.mark.skipif(has_gpu(), reason="on a GPU machine the pool is made (gpu_check proves that)")
def test_gpu_memory_with_a_pool_but_no_gpu_or_rmm():
    with dask.config.set({"gear-flow.gpu.rmm-pool-size": "1GB"}):
        plugin = GpuMemory()  # the client's config travels inside the plugin
    assert (plugin.pool_size, plugin.libraries) == (10**9, ("cupy",))
    with one_worker() as (c, s, a):
        c.register_plugin(plugin)
        st = a.plugins[PLUGIN_NAME].status
    assert st["pool_bytes"] is None and st["by"] is None and st["libraries"] == []
    if HAVE_RMM:
        assert st["reason"] == "no NVIDIA GPU on this node (nvidia-smi -L / NVML list none)"
    else:
        assert st["reason"].startswith("rmm is not importable")


def test_gpu_memory_without_rmm():
    saved = sys.modules.get("rmm", False)
    sys.modules["rmm"] = None  # this process's `import rmm` fails, as where it is not installed
    try:
        with one_worker() as (c, s, a):
            c.register_plugin(GpuMemory(pool_size=0.5))
            st = a.plugins[PLUGIN_NAME].status
    finally:
        if saved is False:
            del sys.modules["rmm"]
        else:
            sys.modules["rmm"] = saved
    assert st["pool_bytes"] is None and st["reason"].startswith("rmm is not importable (")
    assert st["reason"].endswith("install rmm-cu13 (the gpu-cu13 extra)")


def test_scheduler_preload_without_a_pool_records_no_gpu_memory():
    with one_worker(preload=True) as (c, s, a):
        assert "gear-flow" in s.worker_plugins and "gear-flow" in a.plugins
        assert PLUGIN_NAME not in s.worker_plugins and PLUGIN_NAME not in a.plugins


@pytest.mark.skipif(has_gpu(), reason="on a GPU machine the pool is made (gpu_check proves that)")
def test_scheduler_preload_with_a_pool_sets_up_gpu_memory_on_every_worker():
    pool = {"gear-flow.gpu.rmm-pool-size": 0.8, "gear-flow.gpu.rmm-for": "cupy"}
    with one_worker(preload=True, config=pool) as (c, s, a):
        plugin = a.plugins[PLUGIN_NAME]  # installed at registration, after the worker's own start-up plugins
        assert isinstance(plugin, GpuMemory) and plugin.pool_size == 0.8
        assert plugin.status["by"] is None and plugin.status["reason"].startswith(("no NVIDIA GPU", "rmm is not"))


def test_describe_without_a_device():
    d = gpu_memory.describe()
    assert set(d) >= {"rmm", "resource", "pool_bytes", "cupy_on_rmm"}
    if not HAVE_RMM:
        assert d["rmm"] is None and d["resource"] == []


def test_local_cuda_cluster_signature_mirrors_the_kwargs_builder():
    from gear_flow.deploy.local import local_cuda_cluster

    assert (
        inspect.signature(local_cuda_cluster).parameters.keys()
        == inspect.signature(cuda_cluster_kwargs).parameters.keys()
    )
    assert DeployError("x", "y").__reduce__()[1] == ("x", "y")


def test_plugin_settings_are_plain_data():
    """``__init__`` keeps picklable settings only (dask-cuda's plugins do the same)."""
    import pickle

    p = pickle.loads(pickle.dumps(GpuMemory(pool_size="2GB", libraries="torch,cupy")))
    assert (p.pool_size, p.libraries, p.status) == (2 * 10**9, ("torch", "cupy"), {})
    assert textwrap.dedent(gpu_memory.__doc__).startswith("GPU workers' memory")
