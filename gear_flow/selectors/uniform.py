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
        """New items get weight 1 (priorities are ignored).

        Parameters
        ----------
        slots : numpy.ndarray
            int64 slots of the new items.
        priorities : numpy.ndarray
            float64 priorities (ignored).
        """
        self.set_weight(slots, 1.0)

    def update(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        """Nothing to do: priorities do not change uniform weights.

        Parameters
        ----------
        slots : numpy.ndarray
            int64 slots.
        priorities : numpy.ndarray
            float64 priorities (ignored).
        """
