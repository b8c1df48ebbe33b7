"""First-in-first-out and last-in-first-out selection."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numba import njit

from .base import OrderedSelector


@njit(cache=True, nogil=True)
def _scan(active, capacity, lo, hi, step, n, out, first):
    """Collect up to ``n`` active slots scanning seq from lo upward (step=1) or hi-1 down; ``first[0]`` (upward):
    the first active seq met, or hi when none was."""
    k = 0
    if step > 0:
        s = lo
        first[0] = hi
        while s < hi and k < n:
            slot = s % capacity
            if active[slot]:
                if k == 0:
                    first[0] = s
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

    def bind(self, shard) -> None:
        super().bind(shard)
        #: every seq below it is inactive, as a FIFO scan found them: an item is made active only by the
        #: insert that issues its seq (above every seq issued before), so once inactive below here, always.
        #: A queue's consumed items lie before its live ones until the ring overwrites them; scanning them
        #: again each batch cost O(N) (1M items: 0.2 ms a batch)
        self._inactive_below = 0

    def candidates(
        self, n: int, valid: Callable[[np.ndarray], np.ndarray] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        # Scans by sequence number (ring order), but the order is the table-wide stamp: a distributed
        # shard may hold inserts in another order than they were admitted (stamped), so the best n of
        # the scan are final only once the shard's stamp bounds say nothing unscanned comes first
        sh = self.shard
        lo, hi = sh.live_seq_range()
        lo = max(lo, min(self._inactive_below, hi))
        fifo = self._direction > 0
        want = n
        first = np.empty(1, dtype=np.int64)
        while True:
            buf = np.empty(min(want, max(hi - lo, 0)), dtype=np.int64)
            k = _scan(sh.active, self.capacity, lo, hi, self._direction, len(buf), buf, first)
            if fifo and len(buf):  # everything scanned before the first active seq (or hi) was inactive
                self._inactive_below = int(first[0])
            scanned = buf[:k]
            slots = scanned if valid is None else scanned[valid(scanned)]
            stamps = sh.item_stamps(slots)
            best = np.argsort(stamps if fifo else -stamps, kind="stable")[:n]
            slots, stamps = slots[best], stamps[best]
            # stop once every seq in [lo, hi) was scanned: growing ``want`` cannot
            # find more (fewer live or valid items than ``n``)
            if k < len(buf) or len(buf) >= hi - lo:
                break
            if len(slots) >= n:
                last = int(sh.slot_seqs(scanned[-1:])[0])
                if fifo and (last + 1 >= hi or sh.stamp_floor(last + 1) > stamps[-1]):
                    break
                if not fifo and (last - 1 < lo or sh.stamp_ceiling(last - 1) < stamps[-1]):
                    break
            want *= 2
        stamps = stamps.astype(np.float64)
        return slots, (-stamps if fifo else stamps)


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
