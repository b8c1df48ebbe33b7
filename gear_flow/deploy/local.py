"""Dev-run clusters on this machine: :func:`local_cluster` (CPU) and :func:`local_cuda_cluster` (GPU).

Both are thin: they build the keyword arguments of Dask's ``LocalCluster`` / dask-cuda's
``LocalCUDACluster`` that a gear_flow deployment wants and start it.  What they add to a bare
cluster is what ``cluster/start-*.sh`` add to a deployed one:

- every listener (scheduler, workers, nannies, their HTTP servers) on one address, ``host``
  (127.0.0.1 by default); "no dashboard" means no HTTP server at all;
- ``gear_flow.distributed.preload`` on the scheduler and the workers (the coordinator, the
  :class:`~gear_flow.distributed.GearFlowWorker` plugin, the /gear-flow page, and with
  ``gear-flow.gpu.rmm-pool-size`` the :class:`~gear_flow.distributed.gpu_memory.GpuMemory`
  record), so a client can use tables at once;
- with ``protocol="ucx"``, what UCX needs on this node (:mod:`gear_flow.deploy.ucx`);
- on GPUs: one worker per visible GPU (dask-cuda), an RMM pool per worker and CuPy (and, when
  asked, torch) allocating from it, through dask-cuda's own ``rmm_pool_size`` /
  ``rmm_allocator_external_lib_list``, defaulting to ``gear-flow.gpu.rmm-pool-size`` /
  ``gear-flow.gpu.rmm-for``.

``gear-flow local`` (``--gpu`` for the GPU one) is the command line for both.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from ..config import get as config_get
from ..errors import DeployError, SpecError
from .gpu import has_gpu
from .net import http_address, join_host_port

if TYPE_CHECKING:
    from dask_cuda import LocalCUDACluster
    from distributed import LocalCluster
    from distributed.security import Security

PRELOAD = "gear_flow.distributed.preload"
NO_HTTP = "gear_flow.deploy.no_http"


def _listeners(host: str, dashboard_address: str | None, no_dashboard: bool) -> dict:
    """Keyword arguments putting every listener on ``host``, with the gear_flow preloads."""
    if not isinstance(host, str) or not host.strip():  # Dask binds "" to every interface
        raise SpecError(
            f"host {host!r} must be an address of this machine (default 127.0.0.1); an empty one would listen "
            "on every interface: give 0.0.0.0 if that is meant"
        )
    dashboard = None if no_dashboard else http_address(dashboard_address, host, 8787)
    no_dashboard = dashboard is None  # ("none": no HTTP server at all, as the launch scripts' GEAR_FLOW_DASHBOARD)
    # Dask starts an HTTP server even without a dashboard: the no_http preload stops it
    no_http = [NO_HTTP] if no_dashboard else []
    return {
        "host": host,
        "dashboard_address": dashboard,
        "worker_dashboard_address": join_host_port(host, 0),
        "scheduler_kwargs": {"dashboard": not no_dashboard, "preload": [PRELOAD, *no_http]},
        "preload": [PRELOAD, *no_http],
    }


def _with(ours: dict, theirs: dict) -> dict:
    """``ours`` with a caller's more arguments: theirs win, but a ``preload`` (the workers', or the scheduler's
    in ``scheduler_kwargs``) is added to gear_flow's, which the tables need, and ``scheduler_kwargs`` merge."""

    def preloads(mine, more):
        return [*mine, *([more] if isinstance(more, str) else list(more or []))]

    out = {**ours, **{k: v for k, v in theirs.items() if k not in ("preload", "scheduler_kwargs")}}
    if "preload" in theirs:
        out["preload"] = preloads(ours.get("preload", []), theirs["preload"])
    if "scheduler_kwargs" in theirs:
        sched = {**ours.get("scheduler_kwargs", {}), **dict(theirs["scheduler_kwargs"] or {})}
        if "preload" in (theirs["scheduler_kwargs"] or {}):
            sched["preload"] = preloads(ours.get("scheduler_kwargs", {}).get("preload", []), sched["preload"])
        out["scheduler_kwargs"] = sched
    return out


def _ucx_setup(host: str) -> None:
    """What UCX needs here, set in this process (the worker processes inherit it)."""
    import dask.config

    from .ucx import CUDA_CONTEXT_VAR, ucx_environment

    env = ucx_environment(host)  # no CUDA context without a GPU; UCX_NET_DEVICES=lo on loopback
    if CUDA_CONTEXT_VAR in env:
        dask.config.set({"distributed-ucxx.create-cuda-context": env.pop(CUDA_CONTEXT_VAR) == "True"})
    os.environ.update(env)


def local_cluster(
    n_workers: int = 2,
    threads_per_worker: int = 2,
    *,
    memory_limit: int | float | str | None = "auto",
    host: str = "127.0.0.1",
    port: int = 0,
    protocol: str | None = None,
    security: Security | None = None,
    resources: dict | None = None,
    dashboard_address: str | None = ":8787",
    no_dashboard: bool = False,
    **kwargs: Any,
) -> LocalCluster:
    """A ``distributed.LocalCluster`` of worker processes with gear_flow set up.

    Parameters
    ----------
    n_workers, threads_per_worker, memory_limit, security, resources
        As for ``LocalCluster`` (``resources``: of each worker, e.g. ``{"replay": 1}``).
    host : str
        The one address every listener binds (default loopback: nothing reachable from outside).
    port : int
        Scheduler port (0: any free port).
    protocol : str, optional
        ``tcp`` (default; ``tls`` with ``security``) or ``ucx``.
    dashboard_address : str, optional
        ``":8787"`` (on ``host``), ``"HOST:PORT"``, or ``"none"`` (as ``no_dashboard``).
    no_dashboard : bool
        No HTTP server at all in the scheduler and the workers.
    **kwargs
        More ``LocalCluster`` arguments; a ``preload`` (or ``scheduler_kwargs``' one) is added to
        gear_flow's, other ``scheduler_kwargs`` are merged into its own.

    Returns
    -------
    distributed.LocalCluster
        Started, its workers joined; close it (or use it as a context manager).

    Examples
    --------
    >>> from distributed import Client                                    # doctest: +SKIP
    >>> with local_cluster(2) as cluster, Client(cluster) as client:      # doctest: +SKIP
    ...     table = gear_flow.DistributedTable.create(client, spec)
    """
    from distributed import LocalCluster

    protocol = protocol or ("tls" if security is not None else "tcp")
    if protocol == "ucx":
        _ucx_setup(host)
    return LocalCluster(
        n_workers=n_workers, threads_per_worker=threads_per_worker, processes=True, memory_limit=memory_limit,
        scheduler_port=port, protocol=protocol, security=security, resources=resources,
        **_with(_listeners(host, dashboard_address, no_dashboard), kwargs),
    )  # fmt: skip


def gpu_cluster_missing(rmm_pool: bool = False) -> str | None:
    """What this machine lacks for a ``LocalCUDACluster`` (one line), or None when nothing is missing.

    Parameters
    ----------
    rmm_pool : bool
        Whether an RMM pool is wanted (then ``rmm`` must import too).

    Returns
    -------
    str or None
        Each missing piece with what to do about it, ``; ``-separated, or None.
    """
    missing = []
    try:
        import dask_cuda  # noqa: F401
    except ImportError as e:
        missing.append(
            f"dask_cuda is not importable ({e}): install the gpu-cu13 extra, pip install 'gear-flow[gpu-cu13]'"
        )
    if rmm_pool:
        try:
            import rmm  # noqa: F401
        except ImportError as e:
            missing.append(f"an RMM pool needs rmm, which is not importable ({e}): install rmm-cu13")
    if not has_gpu():
        missing.append("no NVIDIA GPU is visible (nvidia-smi -L and NVML list none)")
    if not missing:
        return None
    return "; ".join(missing) + "; for a CPU cluster use gear_flow.local_cluster() or `gear-flow local`"


def cuda_cluster_kwargs(
    n_workers: int | None = None,
    *,
    CUDA_VISIBLE_DEVICES: str | list[int] | None = None,
    threads_per_worker: int = 1,
    memory_limit: int | float | str | None = "auto",
    host: str = "127.0.0.1",
    port: int = 0,
    protocol: str | None = None,
    security: Security | None = None,
    resources: dict | None = None,
    dashboard_address: str | None = ":8787",
    no_dashboard: bool = False,
    rmm_pool_size: int | float | str | None = None,
    rmm_for: str | list[str] | None = None,
    **kwargs: Any,
) -> dict:
    """The ``LocalCUDACluster`` keyword arguments :func:`local_cuda_cluster` passes.

    Needs neither dask-cuda nor a GPU (it only builds the dictionary).

    Parameters
    ----------
    n_workers, CUDA_VISIBLE_DEVICES, threads_per_worker, memory_limit, host, port, protocol, security, resources, dashboard_address, no_dashboard, rmm_pool_size, rmm_for, **kwargs
        As for :func:`local_cuda_cluster`.

    Returns
    -------
    dict
        Keyword arguments of ``dask_cuda.LocalCUDACluster`` (RMM settings validated, the
        config's defaults filled in, listeners and preloads as the module docstring says).

    Raises
    ------
    SpecError
        A bad ``rmm_pool_size`` or ``rmm_for`` (or configured default).

    Examples
    --------
    >>> kw = cuda_cluster_kwargs(rmm_pool_size=0.8)
    >>> kw["rmm_pool_size"], kw["rmm_allocator_external_lib_list"], kw["host"], kw["protocol"]
    (0.8, ['cupy'], '127.0.0.1', 'tcp')
    """
    from ..distributed.gpu_memory import check_libraries, check_pool_size

    pool = check_pool_size(config_get("gpu.rmm-pool-size", rmm_pool_size))
    libs = list(check_libraries(config_get("gpu.rmm-for", rmm_for)))
    out = {
        "n_workers": n_workers,  # None: one per visible GPU
        "CUDA_VISIBLE_DEVICES": CUDA_VISIBLE_DEVICES,
        "threads_per_worker": threads_per_worker,
        "memory_limit": memory_limit,
        "scheduler_port": port,
        "protocol": protocol or ("tls" if security is not None else "tcp"),
        "security": security,
        "resources": resources,
        # the pool by dask-cuda's RMMSetup; libraries only with a pool (without one, RMM's default
        # resource is plain cudaMalloc, and CuPy's own pool is faster than that)
        "rmm_pool_size": pool,
        "rmm_allocator_external_lib_list": libs if pool is not None and libs else None,
    }
    return _with({**out, **_listeners(host, dashboard_address, no_dashboard)}, kwargs)


def local_cuda_cluster(
    n_workers: int | None = None,
    *,
    CUDA_VISIBLE_DEVICES: str | list[int] | None = None,
    threads_per_worker: int = 1,
    memory_limit: int | float | str | None = "auto",
    host: str = "127.0.0.1",
    port: int = 0,
    protocol: str | None = None,
    security: Security | None = None,
    resources: dict | None = None,
    dashboard_address: str | None = ":8787",
    no_dashboard: bool = False,
    rmm_pool_size: int | float | str | None = None,
    rmm_for: str | list[str] | None = None,
    **kwargs: Any,
) -> LocalCUDACluster:
    """A dask-cuda ``LocalCUDACluster`` (one worker per GPU) with gear_flow set up.

    Parameters
    ----------
    n_workers : int, optional
        Workers (default: one per GPU of ``CUDA_VISIBLE_DEVICES``).
    CUDA_VISIBLE_DEVICES : str or list of int, optional
        GPUs to use (default: all).
    threads_per_worker : int
        Task threads per worker (1, as dask-cuda; shard operations have their own threads).
    rmm_pool_size : int, float or str, optional
        RMM pool per worker: bytes, ``"40GB"`` or a fraction of device memory.  Default:
        ``gear-flow.gpu.rmm-pool-size`` (null: no pool).
    rmm_for : str or list of str, optional
        With a pool, the libraries that allocate from it (``"cupy"``, ``"torch"``,
        ``"cupy,torch"``).  Default: ``gear-flow.gpu.rmm-for`` (``cupy``).
    host, port, protocol, security, resources, memory_limit, dashboard_address, no_dashboard
        As for :func:`local_cluster`.
    **kwargs
        More ``LocalCUDACluster`` arguments (``device_memory_limit``, ``enable_nvlink``, ...).

    Returns
    -------
    dask_cuda.LocalCUDACluster
        Started, its workers joined; close it (or use it as a context manager).

    Raises
    ------
    DeployError
        dask_cuda is not importable, no GPU is visible, or a pool was asked for without rmm;
        the message names each, in one line.

    Examples
    --------
    >>> from distributed import Client                                            # doctest: +SKIP
    >>> with local_cuda_cluster(rmm_pool_size=0.8) as cluster, Client(cluster) as client:  # doctest: +SKIP
    ...     table = gear_flow.DistributedTable.create(client, spec, tier="device")
    """
    # what is missing first: without distributed even the arguments cannot be checked
    missing = gpu_cluster_missing(rmm_pool=config_get("gpu.rmm-pool-size", rmm_pool_size) is not None)
    if missing:
        raise DeployError("a LocalCUDACluster", missing)
    kw = cuda_cluster_kwargs(
        n_workers, CUDA_VISIBLE_DEVICES=CUDA_VISIBLE_DEVICES, threads_per_worker=threads_per_worker,
        memory_limit=memory_limit, host=host, port=port, protocol=protocol, security=security, resources=resources,
        dashboard_address=dashboard_address, no_dashboard=no_dashboard, rmm_pool_size=rmm_pool_size, rmm_for=rmm_for,
        **kwargs,
    )  # fmt: skip
    if kw["protocol"] == "ucx":
        _ucx_setup(host)
    from dask_cuda import LocalCUDACluster

    return LocalCUDACluster(**kw)
