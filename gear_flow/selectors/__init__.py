"""Selectors: which items are sampled, and which are evicted."""

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
    return cls(**cfg.get("params", {}))
