"""Proportional prioritized selection (Schaul et al., 2016)."""

from __future__ import annotations

import math

import numpy as np

from ..errors import InvalidPriorityError, SpecError
from .base import WeightedSelector

#: largest sampling weight ``priority ** alpha`` accepted: a table's total weight (at most
#: 127 shards of 2**40 items) then stays finite, so probabilities are always defined
MAX_WEIGHT = 1e280


class Prioritized(WeightedSelector):
    """Item ``i`` drawn with probability ``p_i**alpha / sum_j p_j**alpha``.

    Parameters
    ----------
    alpha : float
        Priority exponent, ``>= 0``.
    beta : float
        Importance-sampling exponent for the returned weights
        ``(N * P(i)) ** -beta`` normalised by the batch maximum, in ``[0, 1]``.

    Notes
    -----
    As in Reverb: when every item whose window fits has priority 0 (no weight
    anywhere in the table), the sample is uniform over them and reports
    probability ``1 / n``.

    Where we differ from Reverb on purpose:

    * ``alpha == 0`` gives every live item weight 1, priority 0 included
      (``0 ** 0 == 1``), so sampling is uniform over the whole table.
    * Infinite and NaN priorities are rejected, and so is any priority whose
      weight ``priority ** alpha`` exceeds ``MAX_WEIGHT`` (1e280), at insert
      and update, before anything is applied: a larger weight would make the
      table's total weight overflow and every later sample fail.

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
        """Constructor arguments.

        Returns
        -------
        dict
            ``{"alpha": float, "beta": float}``.
        """
        return {"alpha": self.alpha, "beta": self.beta}

    def _w(self, priorities: np.ndarray) -> np.ndarray:
        if self.alpha == 0.0:
            return np.ones(len(priorities), dtype=np.float64)
        if self.alpha == 1.0:
            return np.asarray(priorities, dtype=np.float64)
        return np.power(np.asarray(priorities, dtype=np.float64), self.alpha)

    def check_priorities(self, priorities: np.ndarray, role: str = "sampler") -> None:
        """Refuse priorities whose weight ``p ** alpha`` exceeds ``MAX_WEIGHT`` (1e280).

        Parameters
        ----------
        priorities : numpy.ndarray
            float64 priorities, finite and >= 0.
        role : {"sampler", "remover"}, default "sampler"
            This selector's role, for the message.

        Raises
        ------
        InvalidPriorityError
            The first such priority, with its index and the largest allowed.
        """
        if not len(priorities):
            return
        # alpha <= 1 and p <= MAX_WEIGHT give p**alpha <= max(p, 1) <= MAX_WEIGHT: no power of a whole batch
        # is taken only to find that out (the update that follows takes it once)
        if self.alpha <= 1.0 and float(np.max(priorities)) <= MAX_WEIGHT:
            return
        with np.errstate(over="ignore"):
            w = self._w(priorities)
        bad = np.flatnonzero(~(w <= MAX_WEIGHT))
        if len(bad):
            i, p = int(bad[0]), float(priorities[bad[0]])
            raise InvalidPriorityError(
                i,
                p,
                f"priority[{i}] = {p!r} gives the {role} {self!r} the weight priority**alpha = {float(w[i]):g}, "
                f"above the largest allowed {MAX_WEIGHT:g} (the table's total weight would overflow); "
                f"priorities must be <= {MAX_WEIGHT ** (1 / self.alpha):g} with alpha={self.alpha:g}; "
                "nothing from this call was applied",
            )

    def insert(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        """New items get weight ``priority ** alpha``.

        Parameters
        ----------
        slots : numpy.ndarray
            int64 slots of the new items.
        priorities : numpy.ndarray
            float64 priorities.
        """
        self.set_weights(slots, self._w(priorities))

    def update(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        """Weights become ``priority ** alpha`` (duplicates: the last wins).

        Parameters
        ----------
        slots : numpy.ndarray
            int64 slots; may repeat.
        priorities : numpy.ndarray
            float64 new priorities.
        """
        self.set_weights(slots, self._w(priorities))
