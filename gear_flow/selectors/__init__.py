"""Selectors: which items are sampled, and which are evicted."""

import inspect
from collections.abc import Mapping
from typing import Any

from .base import OrderedSelector, Selector, WeightedSelector
from .fifo import Fifo, Lifo
from .heap import MaxHeap, MinHeap
from .prioritized import Prioritized
from .uniform import Uniform
from .without_replacement import WithoutReplacement

#: name -> class, for configuration files and checkpoints (never build class names from strings)
REGISTRY: dict[str, type[Selector]] = {
    "uniform": Uniform,
    "prioritized": Prioritized,
    "fifo": Fifo,
    "lifo": Lifo,
    "max_heap": MaxHeap,
    "min_heap": MinHeap,
    "without_replacement": WithoutReplacement,
}

__all__ = [
    "REGISTRY",
    "Fifo",
    "Lifo",
    "MaxHeap",
    "MinHeap",
    "OrderedSelector",
    "Prioritized",
    "Selector",
    "Uniform",
    "WeightedSelector",
    "WithoutReplacement",
]


def to_config(selector: Selector) -> dict:
    """A JSON-able description ``{"kind": ..., "params": {...}}``.

    Parameters
    ----------
    selector : Selector
        An instance of a registered selector class (exactly that class, not
        a subclass of it).

    Returns
    -------
    dict
        ``{"kind": registry name, "params": selector.params()}``.

    Raises
    ------
    TypeError
        The selector's class is not registered.
    """
    for kind, cls in REGISTRY.items():
        if type(selector) is cls:
            return {"kind": kind, "params": selector.params()}
    raise TypeError(f"{selector!r} is not a registered selector; registered: {sorted(REGISTRY)}")


def from_config(cfg: dict) -> Selector:
    """Inverse of :func:`to_config`: a new, unbound selector.

    Parameters
    ----------
    cfg : dict
        ``{"kind": registry name, "params": constructor arguments}``
        (``params`` may be absent).

    Returns
    -------
    Selector
        ``REGISTRY[cfg["kind"]](**cfg["params"])``.

    Raises
    ------
    SpecError
        An unknown kind, or parameters the selector refuses.
    """
    from ..errors import SpecError

    try:
        cls = REGISTRY[cfg["kind"]]
    except KeyError:
        raise SpecError(f"unknown selector kind {cfg.get('kind')!r}; known: {sorted(REGISTRY)}") from None
    return construct("selector", cfg["kind"], cls, cfg.get("params", {}))


def construct(family: str, kind: str, cls: type, params: Any) -> Any:
    """``cls(**params)`` for a registered kind, with parameters it does not take refused in one line.

    The one rule of both registries (this one and :data:`gear_flow.rate_limiters.REGISTRY`): a name
    the class does not take, or one it needs and is not given, is the user's mistake in a
    configuration or a ``KIND:KEY=VALUE`` option, not a ``TypeError`` from inside the library.

    Parameters
    ----------
    family : str
        What the class is, for the message (``"selector"``, ``"rate limiter"``).
    kind : str
        Its registered name.
    cls : type
        The registered class.
    params : mapping
        Its constructor's keyword arguments.

    Returns
    -------
    object
        ``cls(**params)``.

    Raises
    ------
    SpecError
        ``params`` is not a mapping, names a parameter ``cls`` does not take,
        or lacks one it requires.  A value ``cls`` refuses raises what it
        raises (``SpecError`` for the built-in kinds).

    Examples
    --------
    >>> construct("selector", "prioritized", Prioritized, {"gamma": 1})
    Traceback (most recent call last):
    ...
    gear_flow.errors.SpecError: selector 'prioritized' has no parameter gamma; its parameters: alpha=0.6, beta=0.4
    """
    from ..errors import SpecError

    if not isinstance(params, Mapping):
        raise SpecError(f"the params of {family} {kind!r} must be a mapping of names to values, not {params!r}")
    try:
        sig = inspect.signature(cls)
    except (TypeError, ValueError):  # a class whose signature Python cannot read: its own errors stand
        return cls(**params)
    try:
        sig.bind(**params)
    except TypeError:
        named = [p for p in sig.parameters.values() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        takes = ", ".join(p.name if p.default is p.empty else f"{p.name}={p.default!r}" for p in named)
        unknown = [k for k in params if k not in {p.name for p in named}]
        missing = [p.name for p in named if p.default is p.empty and p.name not in params]
        what = f"has no parameter {', '.join(map(str, unknown))}" if unknown else f"needs {', '.join(missing)}"
        raise SpecError(
            f"{family} {kind!r} {what}; " + (f"its parameters: {takes}" if named else "it takes none")
        ) from None
    return cls(**params)
