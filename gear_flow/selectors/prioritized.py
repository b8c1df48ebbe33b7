"""Proportional prioritized selection (Schaul et al., 2016)."""

from __future__ import annotations

import math

import numpy as np

from ..errors import SpecError
from ..ops import sumtree
from .base import WeightedSelector


class Prioritized(WeightedSelector):
    """Item ``i`` drawn with probability ``p_i**alpha / sum_j p_j**alpha``.

    Parameters
    ----------
    alpha : float
        Priority exponent, ``>= 0`` (0 is uniform over nonzero... and zero priorities:
        with ``alpha == 0`` every live item has weight 1, including priority 0).
    beta : float
        Importance-sampling exponent for the returned weights
        ``(N * P(i)) ** -beta`` normalised by the batch maximum, in ``[0, 1]``.

    Examples
    --------
    >>> from gear_flow.selectors import Prioritized
    >>> Prioritized(alpha=0.6, beta=0.4)
    Prioritized(alpha=0.6, beta=0.4)
    """

    importance_weighted = True

    def __init__(self, alpha: float = 0.6, beta: float = 0.4):
        if isinstance(alpha, bool) or not (isinstance(alpha, (int, float)) and math.isfinite(alpha) and alpha >= 0):
            raise SpecError(f"alpha ({alpha!r}) must be a finite number >= 0")
        if isinstance(beta, bool) or not (isinstance(beta, (int, float)) and 0 <= beta <= 1):
            raise SpecError(f"beta ({beta!r}) must be a number in [0, 1]")
        self.alpha = float(alpha)
        self.beta = float(beta)

    def params(self) -> dict:
        return {"alpha": self.alpha, "beta": self.beta}

    def _w(self, priorities: np.ndarray) -> np.ndarray:
        if self.alpha == 0.0:
            return np.ones(len(priorities), dtype=np.float64)
        if self.alpha == 1.0:
            return np.asarray(priorities, dtype=np.float64)
        return np.power(np.asarray(priorities, dtype=np.float64), self.alpha)

    def insert(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        sumtree.set_leaves(self.tree, slots, self._w(priorities))

    def update(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        sumtree.set_leaves(self.tree, slots, self._w(priorities))
