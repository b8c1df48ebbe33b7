"""First-in-first-out and last-in-first-out selection."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numba import njit

from .base import OrderedSelector


@njit(cache=True, nogil=True)
def _scan(active, capacity, lo, hi, step, n, out):
    """Collect up to ``n`` active slots scanning seq from lo upward (step=1) or hi-1 down."""
    k = 0
    if step > 0:
        s = lo
        while s < hi and k < n:
            slot = s % capacity
            if active[slot]:
                out[k] = slot
                k += 1
            s += 1
    else:
        s = hi - 1
        while s >= lo and k < n:
            slot = s % capacity
            if active[slot]:
                out[k] = slot
                k += 1
            s -= 1
    return k


class _Scan(OrderedSelector):
    _direction = 1

    def candidates(
        self, n: int, valid: Callable[[np.ndarray], np.ndarray] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        lo, hi = self.shard.live_seq_range()
        want = n
        while True:
            buf = np.empty(min(want, max(hi - lo, 0)), dtype=np.int64)
            k = _scan(self.shard.active, self.capacity, lo, hi, self._direction, len(buf), buf)
            slots = buf[:k]
            if valid is not None:
                slots = slots[valid(slots)]
            # stop once every seq in [lo, hi) was scanned: growing ``want`` cannot
            # find more (fewer live or valid items than ``n``)
            if len(slots) >= n or k < len(buf) or len(buf) >= hi - lo:
                break
            want *= 2
        slots = slots[:n]
        stamps = self.shard.item_stamps(slots).astype(np.float64)
        return slots, (-stamps if self._direction > 0 else stamps)


class Fifo(_Scan):
    """The oldest live items first (by table-wide insertion order).

    Sampling ``n`` items returns the ``n`` oldest distinct items with
    probability 1 each.  As a remover, evicts the oldest.

    Examples
    --------
    >>> from gear_flow.selectors import Fifo
    >>> Fifo()
    Fifo()
    """

    _direction = 1


class Lifo(_Scan):
    """The newest live items first.

    Examples
    --------
    >>> from gear_flow.selectors import Lifo
    >>> Lifo()
    Lifo()
    """

    _direction = -1
