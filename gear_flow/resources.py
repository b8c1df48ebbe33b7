"""Dask resources that fail fast: a task asking for a resource no worker has would wait forever.

Dask keeps a task that needs ``resources={"learner": 1}`` pending, without a warning, until a
worker advertising ``learner >= 1`` joins.  On a deployment where none will (CPU nodes started
with ``GEAR_FLOW_RESOURCES=replay=1``), that is a hang.  :func:`check_resources` asks the
scheduler once and raises :class:`~gear_flow.errors.SpecError` naming the resource and what the
workers do advertise; :func:`submit` is ``client.submit`` behind that check.

Examples
--------
>>> from gear_flow.resources import submit            # doctest: +SKIP
>>> fut = submit(client, learner, resources={"learner": 1})   # doctest: +SKIP
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from .errors import SpecError

if TYPE_CHECKING:
    from distributed import Client, Future


def _normalise(resources) -> dict[str, float]:
    if isinstance(resources, str):
        resources = {resources: 1}
    if not isinstance(resources, Mapping) or not resources:
        raise SpecError(f"resources ({resources!r}) must be a non-empty mapping like {{'learner': 1}}")
    out = {}
    for name, amount in resources.items():
        try:
            out[str(name)] = float(amount)
        except (TypeError, ValueError):
            raise SpecError(f"resource {name!r}: amount {amount!r} must be a number") from None
        if out[str(name)] <= 0:
            raise SpecError(f"resource {name!r}: amount {amount!r} must be > 0")
    return out


def _on_scheduler(dask_scheduler=None) -> dict:
    return {a: dict(ws.resources or {}) for a, ws in dask_scheduler.workers.items()}


def advertised(client: Client) -> dict[str, dict[str, float]]:
    """``{worker address: {resource: amount}}`` of every worker the scheduler knows now.

    Asked of the scheduler itself: ``client.scheduler_info()`` reads a cache that the
    client's periodic refresh may have just replaced by cluster totals without workers.

    Parameters
    ----------
    client : distributed.Client
        A client of the cluster.

    Returns
    -------
    dict of str to dict of str to float
        Per worker address, its advertised resources (empty for a worker with none).
    """
    return client.run_on_scheduler(_on_scheduler)


def placement_workers(client: Client, workers: Iterable[str] | None) -> list[str]:
    """The workers a table's shards are placed on (a new table's, a restored one's): those given, each a
    worker of the cluster now, else every worker the scheduler knows.

    Parameters
    ----------
    client : distributed.Client
        A client of the cluster.
    workers : iterable of str or None
        Worker addresses, or None for all.

    Returns
    -------
    list of str
        The addresses, in the order given (sorted for all).

    Raises
    ------
    SpecError
        ``workers`` is not a collection of addresses (a bare string), names
        no worker, or names one the cluster does not have; or the cluster has
        no worker.
    """
    known = advertised(client)
    if workers is None:
        addrs = sorted(known)
    else:
        if isinstance(workers, (str, bytes)) or not isinstance(workers, Iterable):
            raise SpecError(f"workers ({workers!r}) must be a list of worker addresses")
        addrs = list(workers)
        bad = [a for a in addrs if not isinstance(a, str) or a not in known]
        if bad:
            raise SpecError(f"{bad[0]!r} is not a worker of this cluster (its workers: {sorted(known)})")
    if not addrs:
        raise SpecError(
            "no worker to place shards on" if workers is not None else "the cluster has no workers to place shards on"
        )
    return addrs


def describe(adv: Mapping[str, Mapping[str, float]]) -> str:
    """What workers advertise, grouped, for messages.

    Parameters
    ----------
    adv : mapping of str to mapping of str to float
        As :func:`advertised` returns it.

    Returns
    -------
    str
        E.g. ``"1 worker with none; 2 workers with replay=1"``, or
        ``"no worker is connected"``.
    """
    if not adv:
        return "no worker is connected"
    groups = Counter(",".join(f"{k}={v:g}" for k, v in sorted(r.items())) or "none" for r in adv.values())
    parts = [f"{n} worker{'s' if n > 1 else ''} with {r}" for r, n in sorted(groups.items())]
    return "; ".join(parts)


def has_resources(have: Mapping[str, float] | None, need: str | Mapping[str, float]) -> bool:
    """Does a worker advertising ``have`` have ``need`` (every resource, at least that amount)?

    Parameters
    ----------
    have : mapping of str to float, or None
        What the worker advertises (None: nothing).
    need : str or mapping
        ``"learner"`` (one unit) or ``{"learner": 1, "replay": 1}``.

    Returns
    -------
    bool
        Whether it does.

    Raises
    ------
    SpecError
        ``need`` is not a valid resource request.
    """
    have = have or {}
    return all(have.get(k, 0) >= v for k, v in _normalise(need).items())


def check_resources(client: Client, resources: str | Mapping[str, float]) -> list[str]:
    """The addresses of the workers that can run a task needing ``resources``; never empty.

    Parameters
    ----------
    client : distributed.Client
        A client of the cluster.
    resources : str or mapping
        ``"learner"`` (one unit) or ``{"learner": 1, "replay": 1}``: every resource on one worker,
        as Dask requires for one task.

    Returns
    -------
    list of str
        Sorted addresses of the workers advertising at least those amounts.

    Raises
    ------
    SpecError
        No connected worker advertises all of them; the message names the missing resource,
        what the workers advertise, and how to start workers that have it.
    """
    need = _normalise(resources)
    adv = advertised(client)
    fit = [a for a, r in adv.items() if has_resources(r, need)]
    if fit:
        return sorted(fit)
    short = [k for k, v in need.items() if not any(r.get(k, 0) >= v for r in adv.values())] or sorted(need)
    wanted = ",".join(f"{k}={v:g}" for k, v in need.items())
    raise SpecError(
        f"no worker has the resources {wanted} (missing: {', '.join(short)}); {describe(adv)}. "
        f"A task asking for them would wait forever: start workers with "
        f"GEAR_FLOW_RESOURCES={','.join(f'{k}={need.get(k, 1):g}' for k in sorted({*need, 'replay'}))} "
        "(cluster/start-worker.sh) "
        f"or submit without resources={{{', '.join(repr(k) + ': ' + f'{v:g}' for k, v in need.items())}}}"
    )


def submit(client: Client, fn: Callable, *args: Any, resources: str | Mapping[str, float], **kwargs: Any) -> Future:
    """``client.submit(fn, *args, resources=resources, **kwargs)`` after :func:`check_resources`.

    The check is made once, when submitting: a worker that leaves afterwards can still leave the
    task waiting (as with any Dask task).

    Parameters
    ----------
    client : distributed.Client
        The client to submit with.
    fn : callable
        The task's function.
    *args
        Its positional arguments.
    resources : str or mapping
        As for :func:`check_resources`.
    **kwargs
        Passed to ``client.submit`` (``key``, ``pure``, ``workers``...; keyword
        arguments of ``fn`` too, as ``client.submit`` takes them).

    Returns
    -------
    distributed.Future
        The task's future.

    Raises
    ------
    SpecError
        As :func:`check_resources`, before anything is submitted.
    """
    check_resources(client, resources)
    if isinstance(resources, str):
        resources = {resources: 1}
    return client.submit(fn, *args, resources=dict(resources), **kwargs)
