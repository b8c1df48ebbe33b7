"""Dask worker preload: run the worker's GPU code under the CUDA emulation.

``dask worker ... --preload cuda_emu.preload`` (or ``LocalCluster(preload=
["cuda_emu.preload"])``, as :func:`emulated_local_cluster` does)
imports this module in the worker process before it runs any task and calls
:func:`dask_setup`, which installs the emulation for good in that process
(:func:`cuda_emu.install_in_process`): ``import cupy`` returns the fake, kernel
launches run the host build of ``kernels/*.cu``, torch's stream is the host.
The kernels are built (or found in the on-disk cache) at the first launch, as
CuPy compiles them.  The worker must be able to import ``cuda_emu`` (the
``tests`` folder on ``PYTHONPATH``) and gear_flow.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

HERE = Path(__file__).resolve().parent


def dask_setup(worker=None) -> None:
    """Install the emulation in this (worker) process; marks it ``GEAR_FLOW_CUDA_EMULATION=1``."""
    from . import install_in_process

    install_in_process()
    os.environ["GEAR_FLOW_CUDA_EMULATION"] = "1"


@contextlib.contextmanager
def emulated_local_cluster(n_workers: int = 2, threads_per_worker: int = 1, **cluster_kwargs):
    """A Client of a ``LocalCluster(processes=True)`` on 127.0.0.1 whose workers are emulated.

    The worker processes inherit ``PYTHONPATH`` with the tests folder and the
    repository root first (so they import ``cuda_emu`` and this checkout's
    gear_flow); it is restored on exit.
    """
    import dask
    from distributed import Client, LocalCluster

    paths = [str(HERE.parent), str(HERE.parents[1])]
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(paths + ([old] if old else []))
    try:
        with dask.config.set({"distributed.comm.timeouts.connect": "10s"}):
            with LocalCluster(
                n_workers=n_workers,
                threads_per_worker=threads_per_worker,
                processes=True,
                host="127.0.0.1",
                dashboard_address=None,
                preload=["cuda_emu.preload"],  # the Nanny hands it to the worker process
                **cluster_kwargs,
            ) as cluster:
                with Client(cluster) as client:
                    yield client
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old
