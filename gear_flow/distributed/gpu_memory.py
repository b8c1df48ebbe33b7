"""GPU workers' memory: an RMM pool, and CuPy (and torch) allocating from it.

dask-cuda already does this for the workers it starts: ``LocalCUDACluster(rmm_pool_size=...,
rmm_allocator_external_lib_list=["cupy"])`` and ``dask cuda worker --rmm-pool-size ...
--set-rmm-allocator-for-libs cupy`` install its ``RMMSetup`` worker plugin, which is what
:func:`gear_flow.deploy.local.local_cuda_cluster` and ``cluster/start-worker.sh --kind gpu`` use.
:class:`GpuMemory` covers what that leaves out:

- workers dask-cuda did not start (``dask worker`` on a GPU node, a ``LocalCluster``, a cluster
  whose workers came up without RMM options), configured through ``dask.config``
  (``gear-flow.gpu.rmm-pool-size``, ``gear-flow.gpu.rmm-for``) like the rest of gear_flow;
- a worker without ``rmm``, without a GPU or without a pool configured: a no-op with the
  reason logged and recorded, never a worker that fails to start;
- a worker whose RMM resource someone already configured (dask-cuda's plugin, a user's
  ``rmm.reinitialize``): left alone, never a second pool on top of the first (which would ask
  the device for the pool's size twice);
- what was done, readable from a client: :func:`describe` on every worker
  (``client.run(describe)``) and the plugin's ``status``.

The pool itself is made by dask-cuda's ``RMMSetup`` where dask-cuda is importable, so the two
paths cannot drift; otherwise by ``rmm.reinitialize`` and RMM's own allocator hooks
(``rmm.allocators.cupy.rmm_cupy_allocator``, ``rmm.allocators.torch.rmm_torch_allocator``).

``gear_flow.distributed.preload`` records the plugin for every worker of a scheduler that has
the preload when ``gear-flow.gpu.rmm-pool-size`` is set.  Workers get it at registration, after
their own start-up plugins (dask-cuda's among them), which is why a worker's preload does not
set it up during start-up.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from distributed.diagnostics.plugin import WorkerPlugin

from ..config import get as config_get
from ..errors import SpecError

if TYPE_CHECKING:
    from distributed import Worker

logger = logging.getLogger(__name__)

PLUGIN_NAME = "gear-flow-gpu-memory"

#: libraries that can allocate from RMM (the names dask-cuda's --set-rmm-allocator-for-libs takes)
LIBRARIES = ("cupy", "torch")

#: RMM (and CUDA) allocations are aligned to this many bytes; dask-cuda aligns pool sizes the same way
ALIGNMENT = 256


def check_pool_size(value: int | float | str | None) -> int | float | None:
    """A pool size as given (bytes, ``"40GB"``, a fraction of device memory) -> int bytes or float fraction.

    Parameters
    ----------
    value : int, float, str or None
        Bytes (an integer, ``"40GB"``, ``"4e9"``) or a fraction of device memory in (0, 1]
        (``0.8``, ``"0.8"``); None for no pool.  An integer is always bytes (``1`` is one byte).

    Returns
    -------
    int, float or None
        Bytes (at least :data:`ALIGNMENT`), the fraction, or None.

    Raises
    ------
    SpecError
        Anything else, naming the value and what is allowed.

    Examples
    --------
    >>> check_pool_size("0.8"), check_pool_size("2GiB"), check_pool_size(None)
    (0.8, 2147483648, None)
    """
    if value is None:
        return None
    what = f"gear-flow.gpu.rmm-pool-size ({value!r})"
    allowed = 'bytes (an integer or "40GB") or a fraction of device memory in (0, 1]'
    if isinstance(value, bool):
        raise SpecError(f"{what} must be {allowed}")
    if isinstance(value, str):
        try:
            value = float(value) if "." in value else int(value)
        except ValueError:
            from dask.utils import parse_bytes

            try:
                value = parse_bytes(value)
            except ValueError:
                raise SpecError(f"{what} must be {allowed}") from None
    if isinstance(value, float):
        if 0 < value <= 1:
            return value
        if not (value > 1 and value.is_integer()):
            raise SpecError(f"{what} must be {allowed}")
    if not isinstance(value, (int, float)) or int(value) < ALIGNMENT:
        raise SpecError(f"{what} must be {allowed}, and at least {ALIGNMENT} bytes")
    return int(value)


def pool_bytes(size: int | float, device_bytes: int) -> int:
    """Bytes of a pool of ``size`` (from :func:`check_pool_size`) on a device of ``device_bytes``, aligned down.

    Parameters
    ----------
    size : int or float
        Bytes, or a fraction of the device's memory.
    device_bytes : int
        The device's total memory.

    Returns
    -------
    int
        The pool's size in bytes, a multiple of :data:`ALIGNMENT`.

    Examples
    --------
    >>> pool_bytes(0.5, 1000), pool_bytes(1000, 10**9)
    (256, 768)
    """
    n = int(size * device_bytes) if isinstance(size, float) else int(size)
    if n > device_bytes:
        raise SpecError(f"gear-flow.gpu.rmm-pool-size ({size!r}) is larger than the device ({device_bytes} bytes)")
    return n // ALIGNMENT * ALIGNMENT


def check_libraries(value: str | list[str] | tuple[str, ...] | None) -> tuple[str, ...]:
    """``"cupy,torch"`` or a list -> a tuple of names from :data:`LIBRARIES`.

    Parameters
    ----------
    value : str, list of str or None
        Comma-separated names or a sequence of them; None or ``""`` for none.

    Returns
    -------
    tuple of str
        The names, each once, in the order given.

    Raises
    ------
    SpecError
        A name not in :data:`LIBRARIES`.
    """
    names = value.split(",") if isinstance(value, str) else list(value or ())
    out = tuple(dict.fromkeys(n.strip() for n in names if n.strip()))
    bad = [n for n in out if n not in LIBRARIES]
    if bad:
        raise SpecError(f"gear-flow.gpu.rmm-for ({value!r}): unknown {bad}; allowed: any of {list(LIBRARIES)}")
    return out


def describe() -> dict:
    """What this process allocates device memory with; for ``client.run(describe)``.

    Returns
    -------
    dict
        ``rmm``: RMM's version, or None when it is not importable; ``resource``: the chain of
        the current device's memory resources (outermost first), e.g.
        ``["PoolMemoryResource", "CudaMemoryResource"]``; ``pool_bytes``: the pool's current
        size where the chain holds a pool; ``cupy_on_rmm``: whether CuPy's allocator is RMM's
        (None without CuPy).
    """
    out: dict = {"rmm": None, "resource": [], "pool_bytes": None, "cupy_on_rmm": None}
    try:
        import rmm
    except ImportError:
        return out
    out["rmm"] = rmm.__version__
    try:
        mr = rmm.mr.get_current_device_resource()
    except Exception as e:  # no usable device in this process
        out["error"] = f"{type(e).__name__}: {e}"
        return out
    while mr is not None:
        out["resource"].append(type(mr).__name__)
        if out["pool_bytes"] is None and hasattr(mr, "pool_size"):
            out["pool_bytes"] = int(mr.pool_size())
        mr = getattr(mr, "upstream_mr", None)
    try:
        import cupy
    except ImportError:
        return out
    from rmm.allocators.cupy import rmm_cupy_allocator

    out["cupy_on_rmm"] = cupy.cuda.get_allocator() is rmm_cupy_allocator
    return out


def _device_bytes() -> int:
    """Total memory of this process's current device (NVML through CuPy's runtime, else torch)."""
    try:
        import cupy

        return int(cupy.cuda.runtime.memGetInfo()[1])
    except ImportError:
        import torch

        return int(torch.cuda.mem_get_info()[1])


def _use_rmm(library: str) -> None:
    if library == "cupy":
        import cupy
        from rmm.allocators.cupy import rmm_cupy_allocator

        cupy.cuda.set_allocator(rmm_cupy_allocator)
    else:  # torch: only possible before torch's first CUDA allocation in this process
        import torch
        from rmm.allocators.torch import rmm_torch_allocator

        torch.cuda.memory.change_current_allocator(rmm_torch_allocator)


class GpuMemory(WorkerPlugin):
    """Put a GPU worker's device allocations on an RMM pool (see the module docstring).

    Parameters
    ----------
    pool_size : int, float or str, optional
        RMM pool per worker: bytes, ``"40GB"``, or a fraction of device memory (``0.8``).
        Default: ``gear-flow.gpu.rmm-pool-size`` (null: no pool, the plugin does nothing).
    libraries : str or list of str, optional
        Libraries that allocate from RMM: ``"cupy"``, ``"torch"``, ``"cupy,torch"``.
        Default: ``gear-flow.gpu.rmm-for``.

    Attributes
    ----------
    status : dict
        Set by ``setup`` on the worker: ``pool_bytes`` (the pool made, or found), ``by``
        (``"gear-flow"``, ``"dask-cuda"`` (its RMMSetup, called here), ``"existing"`` (a resource
        configured before this plugin; left alone) or None), ``libraries`` (those now allocating
        from RMM), ``reason`` (why nothing or not everything was done; None otherwise).

    Examples
    --------
    >>> client.register_plugin(GpuMemory(pool_size=0.8, libraries="cupy,torch"))  # doctest: +SKIP
    >>> client.run(lambda dask_worker: dask_worker.plugins["gear-flow-gpu-memory"].status)  # doctest: +SKIP
    """

    name = PLUGIN_NAME
    idempotent = True

    def __init__(
        self, pool_size: int | float | str | None = None, libraries: str | list[str] | tuple[str, ...] | None = None
    ):
        self.pool_size = check_pool_size(config_get("gpu.rmm-pool-size", pool_size))
        self.libraries = check_libraries(config_get("gpu.rmm-for", libraries))
        self.status: dict = {}

    def _skip(self, reason: str) -> None:
        self.status = {"pool_bytes": None, "by": None, "libraries": [], "reason": reason}
        logger.info("gear_flow GPU memory: nothing done: %s", reason)

    def setup(self, worker: Worker | None = None) -> None:
        """Make the pool and point the libraries at RMM, or record why not (never raises for a missing piece).

        Parameters
        ----------
        worker : distributed.Worker, optional
            The worker being set up (handed to dask-cuda's ``RMMSetup``).
        """
        if self.pool_size is None:
            return self._skip("no RMM pool configured (gear-flow.gpu.rmm-pool-size is null)")
        try:
            import rmm
        except ImportError as e:
            return self._skip(f"rmm is not importable ({e}); install rmm-cu13 (the gpu-cu13 extra)")
        from ..deploy.gpu import has_gpu

        if not has_gpu():
            return self._skip("no NVIDIA GPU on this node (nvidia-smi -L / NVML list none)")
        current = rmm.mr.get_current_device_resource()
        if type(current) is not rmm.mr.CudaMemoryResource:  # configured already: never a second pool
            by, done = "existing", describe()["pool_bytes"]
            reason = f"RMM was already configured on this worker ({type(current).__name__}); left as it is"
        else:
            done, reason = pool_bytes(self.pool_size, _device_bytes()), None
            try:
                from dask_cuda.plugins import RMMSetup
            except ImportError:
                by = "gear-flow"
                rmm.reinitialize(pool_allocator=True, initial_pool_size=done)
            else:  # dask-cuda's own setup, so the two paths cannot differ
                by = "dask-cuda"
                RMMSetup(initial_pool_size=done, maximum_pool_size=None, managed_memory=False, async_alloc=False,
                         release_threshold=None, log_directory=None, track_allocations=False,
                         external_lib_list=None).setup(worker)  # fmt: skip
        using, failed = [], []
        for lib in self.libraries:
            try:
                _use_rmm(lib)
                using.append(lib)
            except Exception as e:  # e.g. torch already allocated on the device: it keeps its allocator
                failed.append(f"{lib}: {type(e).__name__}: {e}")
        if failed:
            reason = "; ".join(filter(None, [reason, "not on RMM: " + "; ".join(failed)]))
        self.status = {"pool_bytes": done, "by": by, "libraries": using, "reason": reason}
        logger.info("gear_flow GPU memory: %s", self.status)
