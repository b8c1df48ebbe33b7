"""Uniform selection over live items."""

from __future__ import annotations

import numpy as np
from numba import njit

from .base import WeightedSelector


@njit(nogil=True, cache=True)
def _ring_leaves(uniforms, mass, n, first, capacity, prob):
    """The leaf a sum tree's descent finds for each ``u * mass`` when its live leaves, of weight 1, are the
    ``n`` ring slots from ``first`` on (:meth:`Uniform.draw`), and ``prob`` for each (a draw's probability,
    :meth:`Uniform.draw_probs`: made here, where a separate ``np.full`` cost a call more than the draw)."""
    wrap = first + n - capacity  # live slots in slot order: [0, wrap) then [first, capacity)
    out = np.empty(uniforms.shape[0], np.int64)
    probs = np.empty(uniforms.shape[0], np.float64)
    for i in range(uniforms.shape[0]):
        # the descent goes right at equality, so u * mass in [k, k + 1) is the k-th leaf; a product rounded up
        # to the mass itself ends in the last positive leaf
        k = min(np.int64(uniforms[i] * mass), n - 1)
        out[i] = k + first if wrap <= 0 else (k if k < wrap else k + first - wrap)
        probs[i] = prob
    return out, probs


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

    def draw(self, uniforms: np.ndarray) -> np.ndarray:
        """Slots drawn uniformly; the tree's leaves when ``uniforms`` index its inverse CDF.

        While every sequence number in the shard's live range holds a live
        item (a ring that only appends and overwrites: no deletes, nothing
        expired), the live leaves are one ring segment of weight 1 and the
        tree's sums are exact integers, so the leaf its descent finds for
        ``u * mass`` is the ``floor(u * mass)``-th live leaf in slot order:
        arithmetic gives the very same slots without reading the tree (on the
        device, without a launch).  With holes, the tree's descent.

        Parameters
        ----------
        uniforms : numpy.ndarray
            float64 ``[n]`` in ``[0, 1)``; the tree's mass must be > 0.

        Returns
        -------
        numpy.ndarray
            int64 ``[n]`` slots, what :meth:`WeightedSelector.draw` returns.
        """
        return self._draw(uniforms, 1.0)[0]

    def _draw(self, uniforms: np.ndarray, prob: float) -> tuple[np.ndarray, np.ndarray | None]:
        """:meth:`draw`'s slots, and ``prob`` for each when the ring's arithmetic drew them (else None)."""
        lo, hi = self.shard.live_seq_range()
        n = hi - lo
        mass = self.mass
        if n <= 0 or mass != n:
            return super().draw(uniforms), None
        return _ring_leaves(np.asarray(uniforms, dtype=np.float64), mass, n, lo % self.capacity, self.capacity, prob)

    def draw_probs(self, uniforms: np.ndarray, denom: float) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`draw`, and each drawn slot's probability ``1 / denom`` (a live item weighs 1).

        Parameters
        ----------
        uniforms : numpy.ndarray
            float64 ``[n]`` in ``[0, 1)``; the tree's mass must be > 0.
        denom : float
            The mass the slots were drawn among.

        Returns
        -------
        slots : numpy.ndarray
            int64 ``[n]``, as :meth:`draw` returns them.
        probs : numpy.ndarray
            float64 ``[n]``, each ``1.0 / denom`` (what :meth:`drawn_weights` over ``denom`` gives, bit for bit).
        """
        if type(self).drawn_weights is not Uniform.drawn_weights:  # a subclass that weighs its draws itself
            return super().draw_probs(uniforms, denom)
        slots, probs = self._draw(uniforms, 1.0 / denom)
        return slots, np.full(len(slots), 1.0 / denom) if probs is None else probs

    def drawn_weights(self, slots: np.ndarray) -> np.ndarray:
        """Ones: a live item weighs 1 and a draw returns live items only (no read of the tree's leaves, a
        cache miss each in a large shard).

        Parameters
        ----------
        slots : numpy.ndarray
            int64 ``[n]`` slots from :meth:`draw`.

        Returns
        -------
        numpy.ndarray
            float64 ``[n]`` of 1.0.
        """
        return np.ones(len(slots))

    def update(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        """Nothing to do: priorities do not change uniform weights.

        Parameters
        ----------
        slots : numpy.ndarray
            int64 slots.
        priorities : numpy.ndarray
            float64 priorities (ignored).
        """
