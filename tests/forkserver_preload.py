"""Imported once by the suite's fork server (``conftest._workers_fork_from_a_server``), so its workers fork with it
done: numba's CPU target loads its registries of typing and lowering (about 0.7 s of CPU, at a process's first
compile or cache load; every worker's first insert or sample pays it otherwise).  It starts no thread (OpenBLAS's
pool stays at the one thread ``OMP_NUM_THREADS=1`` gives it) and loads no OpenMP runtime: the worker plugin still
sets OpenMP's spin before one is loaded."""

from numba.core.registry import cpu_target

cpu_target.target_context.refresh()

# -- each forked child marks its start and its normal end, for the suite's check of leftovers (conftest) ----------
import multiprocessing.util as _mp_util  # noqa: E402
import os  # noqa: E402

_MARKS = os.environ.get("GEAR_FLOW_TEST_MARKS")


class _Anchor:
    """What the after-fork hook hangs on (multiprocessing keeps its hooks by weak reference)."""


def _started(_anchor: _Anchor) -> None:
    """In each child, at its start: ``<pid>.started``, and a finalizer that marks ``<pid>.exited`` when the child
    ends normally (multiprocessing runs it last on a child's way out; a killed child never does)."""
    pid = os.getpid()
    open(os.path.join(_MARKS, f"{pid}.started"), "w").close()
    _mp_util.Finalize(None, _exited, args=(pid,), exitpriority=-100)


def _exited(pid: int) -> None:
    open(os.path.join(_MARKS, f"{pid}.exited"), "w").close()


if _MARKS:
    _ANCHOR = _Anchor()
    _mp_util.register_after_fork(_ANCHOR, _started)
