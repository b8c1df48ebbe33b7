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
    """A JSON-able description ``{"kind": ..., "params": {...}}``."""
    for kind, cls in REGISTRY.items():
        if type(selector) is cls:
            return {"kind": kind, "params": selector.params()}
    raise TypeError(f"{selector!r} is not a registered selector; registered: {sorted(REGISTRY)}")


def from_config(cfg: dict) -> Selector:
    """Inverse of :func:`to_config`."""
    from ..errors import SpecError

    try:
        cls = REGISTRY[cfg["kind"]]
    except KeyError:
        raise SpecError(f"unknown selector kind {cfg.get('kind')!r}; known: {sorted(REGISTRY)}") from None
    return cls(**cfg.get("params", {}))
