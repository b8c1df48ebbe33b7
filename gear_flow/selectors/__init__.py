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
