"""gear_flow's server-side setup as a Dask preload module.

    dask scheduler --preload gear_flow.distributed.preload
    dask worker tls://scheduler:8786 --preload gear_flow.distributed.preload
    dask cuda worker tls://scheduler:8786 --preload gear_flow.distributed.preload

(or list the module under ``distributed.scheduler.preload`` and
``distributed.worker.preload`` in a Dask config file, as
``cluster/config/gear-flow.yaml`` does).

On a **scheduler**, :func:`dask_setup` adds the
:class:`~gear_flow.distributed.GearFlowCoordinator` (so ``gear-flow list``
answers before any table exists) and records a
:class:`~gear_flow.distributed.GearFlowWorker` as a cluster-wide worker
plugin: every worker that joins, started with the preload or not, sets it up
at registration, and the plugin registration that
:meth:`DistributedTable.create <gear_flow.distributed.DistributedTable.create>`
makes is then a no-op (both plugins are idempotent).

On a **worker**, it sets up ``GearFlowWorker`` while the worker starts, so the
worker serves gear_flow's comm handler before any client connects (a learner
started on it can attach at once).  When the scheduler has the preload too,
the scheduler's copy replaces the worker's at registration: the same plugin,
with the scheduler's settings.  Shards are only ever created after that.

Settings, through ``dask.config``:

``gear-flow.worker.threads`` (2)
    Threads that run a worker's shard operations.
``gear-flow.worker.tier`` (null)
    Default storage tier of the worker's shards (a table's own setting wins).
``gear-flow.gpu.rmm-pool-size`` (null), ``gear-flow.gpu.rmm-for`` (cupy)
    With a pool size, the scheduler also records
    :class:`~gear_flow.distributed.gpu_memory.GpuMemory` for every worker: an RMM pool and
    CuPy/torch allocating from it, where dask-cuda has not already made one.

Without the preload nothing is lost: ``DistributedTable.create`` registers
both plugins itself.  The preload makes the setup happen at start, with the
deployment's settings.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import dask.config

from .coordinator import COORDINATOR_NAME, GearFlowCoordinator
from .plugin import PLUGIN_NAME, GearFlowWorker

if TYPE_CHECKING:
    from distributed import Nanny, Scheduler, Worker

logger = logging.getLogger(__name__)

#: dask.config keys read here, with their defaults (not in gear-flow.yaml: only deployments use them)
SETTINGS = {"gear-flow.worker.threads": 2, "gear-flow.worker.tier": None}


def worker_plugin() -> GearFlowWorker:
    """The worker plugin with the settings of ``dask.config`` (see the module docstring).

    Returns
    -------
    GearFlowWorker
        With ``threads`` from ``gear-flow.worker.threads`` and ``tier`` from
        ``gear-flow.worker.tier``.

    Raises
    ------
    ValueError
        ``gear-flow.worker.threads`` is not a positive integer, or
        ``gear-flow.worker.tier`` is not None, ``host``, ``pinned`` or
        ``device``.
    """
    threads = dask.config.get("gear-flow.worker.threads", SETTINGS["gear-flow.worker.threads"])
    tier = dask.config.get("gear-flow.worker.tier", SETTINGS["gear-flow.worker.tier"])
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"gear-flow.worker.threads ({threads!r}) must be a positive integer")
    if tier not in (None, "host", "pinned", "device"):
        raise ValueError(f"gear-flow.worker.tier ({tier!r}) must be one of None, 'host', 'pinned', 'device'")
    return GearFlowWorker(threads=threads, tier=tier)


def setup_scheduler(scheduler: Scheduler) -> None:
    """Add the coordinator and record the worker plugin for every worker that joins.

    Also records the GPU-memory plugin when ``gear-flow.gpu.rmm-pool-size`` is
    set, and installs the ``/gear-flow`` dashboard page where the scheduler
    serves a dashboard.  Idempotent.

    Parameters
    ----------
    scheduler : distributed.Scheduler
        The scheduler being set up.

    Raises
    ------
    ValueError
        Invalid ``gear-flow.worker.*`` settings (see :func:`worker_plugin`).
    """
    from distributed.protocol.pickle import dumps

    if COORDINATOR_NAME not in scheduler.plugins:
        # started by the scheduler with its other plugins, after the preloads
        scheduler.add_plugin(GearFlowCoordinator(), name=COORDINATOR_NAME, idempotent=True)
    scheduler.worker_plugins.setdefault(PLUGIN_NAME, dumps(worker_plugin()))
    if dask.config.get("gear-flow.gpu.rmm-pool-size", None) is not None:
        # installed at registration, after a worker's own start-up plugins (dask-cuda's RMMSetup):
        # it leaves a pool dask-cuda made alone and makes one where none was
        from .gpu_memory import PLUGIN_NAME as GPU_MEMORY
        from .gpu_memory import GpuMemory

        scheduler.worker_plugins.setdefault(GPU_MEMORY, dumps(GpuMemory()))
    from ..dashboard import install as install_dashboard

    install_dashboard(scheduler)  # the /gear-flow page, where the scheduler serves a dashboard
    logger.info("gear_flow: coordinator added, worker plugin %r recorded for all workers", PLUGIN_NAME)


async def setup_worker(worker: Worker) -> None:
    """Set up the worker plugin now (replaced by the scheduler's copy if it has one).

    Does nothing when the worker already has the plugin.

    Parameters
    ----------
    worker : distributed.Worker
        The worker being started.

    Raises
    ------
    ValueError
        Invalid ``gear-flow.worker.*`` settings (see :func:`worker_plugin`).
    """
    if PLUGIN_NAME in worker.plugins:
        return
    res = await worker.plugin_add(worker_plugin(), name=PLUGIN_NAME, catch_errors=False)
    logger.info("gear_flow: worker plugin %r set up on %s (%s)", PLUGIN_NAME, worker.address, res.get("status"))


async def dask_setup(server: Scheduler | Worker | Nanny) -> None:
    """Entry point of Dask's preload mechanism (``--preload gear_flow.distributed.preload``).

    Parameters
    ----------
    server : distributed.Scheduler or distributed.Worker
        The server whose start runs the preload: a scheduler gets
        :func:`setup_scheduler`, a worker :func:`setup_worker`; anything else
        (a Nanny under ``--preload-nanny``) is logged and ignored.
    """
    from distributed import Scheduler, Worker

    if isinstance(server, Scheduler):
        setup_scheduler(server)
    elif isinstance(server, Worker):
        await setup_worker(server)
    else:  # a Nanny (--preload-nanny) or a Client: the worker process and the scheduler do the work
        logger.warning(
            "gear_flow preload ignored on %s: use it with dask scheduler / dask worker", type(server).__name__
        )
