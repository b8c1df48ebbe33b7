"""A short spin for the OpenMP threads of a worker process (numba's parallel gathers).

NumPy-heavy code in gear_flow is compiled with numba; its parallel loops (the
window gather, the ring writes) run on numba's OpenMP threading layer.  GNU
OpenMP keeps its threads spinning after every parallel loop, waiting for the
next one: 300,000 rounds by default, measured at ~4 ms of a core on this
project's CI machine.  In a process alone on a machine that spin is free.  A
Dask worker is never alone: the other workers, the scheduler and the learners
on the machine need that core, and a worker that has just gathered a reply
holds one for 4 ms while the learner reads it and the other worker gathers
its own.  Measured (``pipelines/bench_distributed.py``, 2 workers on 2 cores):
the external learner over TCP lanes went from 1.0 to 1.6 GB/s, over the comm
from 0.9 to 1.2 GB/s, with a spin of 30,000 rounds (~0.2 ms) in the workers;
the shared-memory and co-located rows did not move.

:func:`short_spin` sets ``GOMP_SPINCOUNT`` for this process before GNU OpenMP
is loaded (it reads its environment once, when loaded).  The worker plugin
calls it when it is set up: the count is ``gear-flow.distributed.omp-spin-count``
(null: leave OpenMP's defaults).  An ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT``
already in the environment is the deployment's choice and is kept.  Other
OpenMP runtimes (LLVM's ``libomp``, Intel's) do not read ``GOMP_SPINCOUNT``;
their ``KMP_BLOCKTIME`` is left to the deployment.
"""

from __future__ import annotations

import logging
import os

from ..config import get as config_get

logger = logging.getLogger(__name__)

#: environment variables that already say how OpenMP threads wait
CHOSEN = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def gomp_loaded() -> bool | None:
    """Is GNU OpenMP (``libgomp``) loaded in this process?

    Returns
    -------
    bool or None
        From ``/proc/self/maps``; None where that file does not exist
        (not Linux: unknown).
    """
    try:
        with open("/proc/self/maps") as f:
            return any("libgomp" in line for line in f)
    except OSError:
        return None


def short_spin(count: int | None = None) -> str:
    """Make this process's GNU OpenMP threads spin ``count`` rounds after a parallel loop, then sleep.

    Parameters
    ----------
    count : int, optional
        Spin rounds (``GOMP_SPINCOUNT``); default
        ``gear-flow.distributed.omp-spin-count``.  None there too: nothing
        is changed.

    Returns
    -------
    str
        ``"set"`` (takes effect when OpenMP loads), ``"off"`` (no count
        configured), ``"chosen"`` (the environment already says how OpenMP
        threads wait), or ``"loaded"`` (OpenMP is already loaded here and
        read its environment: too late, nothing changed).

    Raises
    ------
    ValueError
        ``count`` is not an integer >= 0.
    """
    if count is None:
        count = config_get("distributed.omp-spin-count")
        if count is None:
            return "off"
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ValueError(f"gear-flow.distributed.omp-spin-count must be an integer >= 0 or null, got {count!r}")
    if any(k in os.environ for k in CHOSEN):
        return "chosen"
    if gomp_loaded():
        logger.info("GNU OpenMP is already loaded in this worker: its threads keep their default spin")
        return "loaded"
    os.environ["GOMP_SPINCOUNT"] = str(count)
    return "set"
