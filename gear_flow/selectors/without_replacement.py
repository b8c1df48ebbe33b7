"""Epochs over all items, for offline training."""

from __future__ import annotations

import numpy as np

from .base import ShardState, WeightedSelector


class WithoutReplacement(WeightedSelector):
    """Each live item is drawn once per epoch, in uniformly random order.

    An epoch ends when every live item has been drawn; the table then starts
    the next one on all shards at once (epochs are global).  Items inserted
    during an epoch join it.  A batch that straddles two epochs may contain an
    item twice (once per epoch).  In strict-window mode a batch is drawn among
    the items whose window fits the requested length; the others stay in the
    epoch for batches of windows they fit (when no item whose window fits is
    left, the next epoch begins, for every item).  The probability reported for a
    draw is ``1 / U`` with ``U`` the items not yet drawn in the epoch (whose
    window fits) when the batch was drawn; importance weights are 1.

    Examples
    --------
    >>> from gear_flow.selectors import WithoutReplacement
    >>> WithoutReplacement()
    WithoutReplacement()
    """

    without_replacement = True
    can_remove = False

    def bind(self, shard: ShardState) -> None:
        """Allocate the tree for ``shard`` and start at epoch 0.

        Parameters
        ----------
        shard : ShardState
            The shard that owns this selector.
        """
        super().bind(shard)
        self.epoch = 0

    def insert(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        """New items join the current epoch (weight 1; priorities are ignored).

        Parameters
        ----------
        slots : numpy.ndarray
            int64 slots of the new items.
        priorities : numpy.ndarray
            float64 priorities (ignored).
        """
        self.set_weight(slots, 1.0)

    def update(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        """Nothing to do: priorities do not change the epoch.

        Parameters
        ----------
        slots : numpy.ndarray
            int64 slots.
        priorities : numpy.ndarray
            float64 priorities (ignored).
        """

    def consume(self, slots: np.ndarray) -> None:
        """Sampled items leave the epoch (weight 0) until :meth:`new_epoch`.

        Parameters
        ----------
        slots : numpy.ndarray
            int64 slots just sampled.
        """
        self.set_weight(slots, 0.0)

    def new_epoch(self) -> None:
        """Make every live item drawable again."""
        live = np.flatnonzero(self.shard.active)
        self.sums.reset(live.astype(np.int64), 1.0)
        self.epoch += 1
