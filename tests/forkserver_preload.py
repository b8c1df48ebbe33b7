"""Imported once by the suite's fork server (``conftest._workers_fork_from_a_server``), so its workers fork with it
done: numba's CPU target loads its registries of typing and lowering (about 0.7 s of CPU, at a process's first
compile or cache load; every worker's first insert or sample pays it otherwise).  It starts no thread (OpenBLAS's
pool stays at the one thread ``OMP_NUM_THREADS=1`` gives it) and loads no OpenMP runtime: the worker plugin still
sets OpenMP's spin before one is loaded."""

from numba.core.registry import cpu_target

cpu_target.target_context.refresh()
