"""A selector and a rate limiter of a user's own, for the registration tests (importable by workers)."""

from __future__ import annotations

import numpy as np

import gear_flow as gf
from gear_flow.ops import sumtree


class FlooredPrioritized(gf.Prioritized):
    """Prioritized with a floor: an item of priority 0 is still drawn, with weight ``floor ** alpha``."""

    def __init__(self, alpha: float = 1.0, beta: float = 0.0, floor: float = 1.0):
        super().__init__(alpha, beta)
        self.floor = float(floor)

    def params(self) -> dict:
        return {**super().params(), "floor": self.floor}

    def insert(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        sumtree.set_leaves(self.tree, slots, self._w(np.maximum(priorities, self.floor)))

    def update(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        sumtree.set_leaves(self.tree, slots, self._w(np.maximum(priorities, self.floor)))


class WarmUp(gf.RateLimiter):
    """Sampling waits for ``warm`` items; inserts never wait."""

    def __init__(self, warm: int = 1):
        super().__init__(1.0, warm, -1e300, 1e300)

    def params(self) -> dict:
        return {"warm": self.min_size_to_sample}


class Late(gf.Uniform):
    """A selector registered only after the cluster got the others (needs the hook in DistributedTable.create)."""
