"""Uniform selection over live items."""

from __future__ import annotations

import numpy as np

from .base import WeightedSelector


class Uniform(WeightedSelector):
    """Every live item equally likely (weight 1 in a sum tree, so strict-window
    exclusions and two-level sampling stay exact).

    Examples
    --------
    >>> from gear_flow.selectors import Uniform
    >>> Uniform()
    Uniform()
    """

    def insert(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        self.set_weight(slots, 1.0)

    def update(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        pass
