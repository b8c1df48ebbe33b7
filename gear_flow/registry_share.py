"""Sending custom selector and limiter registrations to a Dask cluster.

See :mod:`gear_flow.registry`.  Kept apart from it so that registering a class
imports no Dask.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

from distributed.diagnostics.plugin import SchedulerPlugin, WorkerPlugin

from .registry import custom, install

if TYPE_CHECKING:
    from distributed import Client, Scheduler, Worker


def _name(entries: dict) -> str:
    text = repr(sorted((f, k, c.__module__, c.__qualname__) for f, ks in entries.items() for k, c in ks.items()))
    return "gear-flow-registry-" + hashlib.sha1(text.encode()).hexdigest()[:12]


class RegistryWorkerPlugin(WorkerPlugin):
    """Installs registrations on every worker (present and future).

    Parameters
    ----------
    entries : dict of str to dict of str to type
        ``{"selector": {kind: cls}, "rate_limiter": {kind: cls}}``, as
        :func:`~gear_flow.registry.custom` returns it; the classes travel by
        reference (module and name), so the workers must be able to import them.
    """

    idempotent = True

    def __init__(self, entries: dict[str, dict[str, type]]):
        self.entries = entries
        self.name = _name(entries)

    def setup(self, worker: Worker) -> None:
        """Install the registrations in the worker's process.

        Parameters
        ----------
        worker : distributed.Worker
            The worker the plugin is attached to (unused: the registries are per process).
        """
        install(self.entries)


class RegistrySchedulerPlugin(SchedulerPlugin):
    """Installs registrations on the scheduler (where the coordinator rebuilds limiters).

    Parameters
    ----------
    entries : dict of str to dict of str to type
        As for :class:`RegistryWorkerPlugin`.
    """

    idempotent = True

    def __init__(self, entries: dict[str, dict[str, type]]):
        self.entries = entries
        self.name = _name(entries)

    async def start(self, scheduler: Scheduler) -> None:
        """Install the registrations in the scheduler's process.

        Parameters
        ----------
        scheduler : distributed.Scheduler
            The scheduler (unused: the registries are per process).
        """
        install(self.entries)


def share(client: Client) -> bool:
    """Send this process's custom registrations to the client's scheduler and workers.

    Parameters
    ----------
    client : distributed.Client
        A client of the cluster the tables live on.

    Returns
    -------
    bool
        Whether there was anything to send (nothing is sent without custom
        registrations; sending the same set again is a no-op).

    Raises
    ------
    SpecError
        A registered class cannot be imported on the scheduler or a worker
        (nothing is sent).
    """
    entries = {f: ks for f, ks in custom().items() if ks}
    if not entries:
        return False
    classes = sorted({(c.__module__, c.__qualname__) for ks in entries.values() for c in ks.values()})
    # the classes travel by reference: where one cannot be imported, the plugin failed to unpickle there with a
    # bare Exception(ModuleNotFoundError) and logged tracebacks; asked first, by name, it is said plainly
    missing = {"the scheduler": client.run_on_scheduler(_missing, classes), **client.run(_missing, classes)}
    missing = {where: m for where, m in missing.items() if m}
    if missing:
        from .errors import SpecError

        where, what = next(iter(missing.items()))
        raise SpecError(
            f"custom selector/limiter classes {what} cannot be imported on {where}"
            f"{f' (and {len(missing) - 1} more processes)' if len(missing) > 1 else ''}: registered classes travel "
            "by reference, so their module must be importable on the scheduler and every worker"
        )
    client.register_plugin(RegistrySchedulerPlugin(entries))
    client.register_plugin(RegistryWorkerPlugin(entries))
    return True


def _missing(classes: list) -> list[str]:
    """Of ``classes`` ((module, qualified name) pairs), those this process cannot import, as dotted names."""
    import importlib

    out = []
    for module, qualname in classes:
        try:
            obj = importlib.import_module(module)
            for part in qualname.split("."):
                obj = getattr(obj, part)
        except Exception:  # noqa: BLE001  (whatever stops the import: the class is not there)
            out.append(f"{module}.{qualname}")
    return out
