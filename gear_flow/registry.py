"""Registering your own :class:`Selector` and :class:`RateLimiter` subclasses.

Tables describe their selectors and limiter by a registered *kind* name and
constructor parameters (``{"kind": "prioritized", "params": {...}}``), so that
checkpoints and distributed tables (whose shards and limiter are rebuilt in
other processes) never pickle them.  A subclass of your own gets a kind with
:func:`register_selector` / :func:`register_rate_limiter`; its ``params()``
must return its constructor's keyword arguments (JSON-able).

A distributed table rebuilds them on the scheduler and on the workers, which
therefore need the registrations too: :func:`gear_flow.registry_share.share`
sends them (the classes travel by reference: their module must be importable
there) as a scheduler plugin and a worker plugin, so workers that join later
get them as well.  This module imports no Dask.

Examples
--------
>>> import gear_flow as gf
>>> class Recent(gf.Prioritized):
...     '''Prioritized, with a larger default exponent.'''
...     def __init__(self, alpha=0.9, beta=0.4):
...         super().__init__(alpha, beta)
>>> gf.register_selector("recent", Recent)
>>> gf.register_selector("recent", Recent)  # again: a no-op
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Mapping

from .errors import SpecError
from .rate_limiters import REGISTRY as LIMITERS
from .rate_limiters import RateLimiter
from .selectors import REGISTRY as SELECTORS
from .selectors import Selector

_KIND = re.compile(r"^[a-z][a-z0-9_]*$")
#: kinds shipped with gear_flow (never replaced)
BUILTIN = {"selector": frozenset(SELECTORS), "rate_limiter": frozenset(LIMITERS)}
_FAMILIES = {"selector": (SELECTORS, Selector), "rate_limiter": (LIMITERS, RateLimiter)}


def _register(family: str, kind: str, cls: type) -> None:
    registry, base = _FAMILIES[family]
    if not isinstance(kind, str) or not _KIND.match(kind):
        raise SpecError(f"{family} kind {kind!r} must be lower-case letters, digits and '_', starting with a letter")
    if not (isinstance(cls, type) and issubclass(cls, base)) or inspect.isabstract(cls):
        raise SpecError(f"{cls!r} is not a concrete {base.__name__} subclass; only those can be registered")
    old = registry.get(kind)
    if old is cls:
        return
    if old is not None:
        raise SpecError(f"{family} kind {kind!r} is already registered to {old.__module__}.{old.__qualname__}")
    if "<locals>" in cls.__qualname__:
        raise SpecError(
            f"{cls.__qualname__} is defined inside a function: define it at module level "
            "so that workers and checkpoints can find it"
        )
    registry[kind] = cls


def register_selector(kind: str, cls: type[Selector]) -> None:
    """Make a :class:`Selector` subclass usable in tables, checkpoints and distributed tables.

    Parameters
    ----------
    kind : str
        Its name in configurations (``[a-z][a-z0-9_]*``), unique.
    cls : type
        A concrete subclass of :class:`~gear_flow.Selector` (usually of
        ``WeightedSelector`` or ``OrderedSelector``) whose ``params()`` returns
        its constructor's keyword arguments.

    Returns
    -------
    None
        Registering the same class under the same kind again does nothing;
        another class under a taken kind raises :class:`~gear_flow.SpecError`.
    """
    _register("selector", kind, cls)


def register_rate_limiter(kind: str, cls: type[RateLimiter]) -> None:
    """Make a :class:`RateLimiter` subclass usable in tables, checkpoints and distributed tables.

    Parameters
    ----------
    kind : str
        Its name in configurations, unique.
    cls : type
        A subclass of :class:`~gear_flow.RateLimiter` whose ``params()``
        returns its constructor's keyword arguments.

    Returns
    -------
    None
    """
    _register("rate_limiter", kind, cls)


def custom() -> dict[str, dict[str, type]]:
    """The registrations made in this process beyond gear_flow's own kinds.

    Returns
    -------
    dict
        ``{"selector": {kind: class}, "rate_limiter": {kind: class}}``.
    """
    return {f: {k: c for k, c in reg.items() if k not in BUILTIN[f]} for f, (reg, _) in _FAMILIES.items()}


def install(entries: Mapping[str, Mapping[str, type]]) -> None:
    """Register classes in this process (a worker or the scheduler receiving the client's :func:`custom`).

    Parameters
    ----------
    entries : mapping of str to mapping of str to type
        ``{"selector": {kind: cls}, "rate_limiter": {kind: cls}}``, as
        :func:`custom` returns it.

    Raises
    ------
    SpecError
        A kind is malformed or already registered to another class, or a
        class is not a concrete subclass of its family's base.
    KeyError
        A family other than ``"selector"`` and ``"rate_limiter"``.
    """
    for family, kinds in entries.items():
        for kind, cls in kinds.items():
            _register(family, kind, cls)
