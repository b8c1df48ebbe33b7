"""Samples a handle served under an admission lease, until the coordinator hears of them.

A table whose limiter is ``MinSize`` lends a handle a *lease*: the next
batches of the same size are served without asking the coordinator, and
their count rides on the handle's next admission (or :meth:`flush
<gear_flow.distributed.DistributedTable.flush>`).  A handle that is dropped
first (a task that attaches, samples a few batches and returns) would take
that count with it: the table's ``sampled`` total would miss up to a lease of
batches per handle, and a thousand short tasks miss thousands.  So the count
lives in a :class:`LeasedSamples` that outlives the handle: when the handle
is garbage-collected, :func:`report_dropped` hands what is left to the event
loop, which reports it.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from .transport import coord

if TYPE_CHECKING:
    from .transport import Context

logger = logging.getLogger(__name__)


class LeasedSamples:
    """A thread-safe count of samples served under a lease and not reported yet.

    Examples
    --------
    >>> c = LeasedSamples()
    >>> c.add(8); c.add(8)
    >>> c.take(), c.take()
    (16, 0)
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._n = 0

    def add(self, n: int) -> None:
        """Count a batch of ``n`` served under the lease.

        Parameters
        ----------
        n : int
            Its rows.
        """
        with self._lock:
            self._n += n

    def take(self) -> int:
        """What is counted, now reported by the caller (the count starts again from 0).

        Returns
        -------
        int
            Samples served under the lease since the last :meth:`take`.
        """
        with self._lock:
            n, self._n = self._n, 0
            return n


def report_dropped(ctx: Context, name: str, leased: LeasedSamples) -> None:
    """A handle of table ``name`` was dropped: report its unreported leased samples from the event loop.

    Called by the handle's ``weakref.finalize``, in whichever thread
    collected it (the event loop's included), so it never waits: the report
    is handed to the loop.  Best effort: a closed loop or table, or an
    unreachable coordinator, loses it (logged).

    Parameters
    ----------
    ctx : Context
        The handle's context.
    name : str
        The table's name.
    leased : LeasedSamples
        The handle's count.
    """
    n = leased.take()
    if not n:
        return

    async def report() -> None:
        try:
            await coord(ctx, "count_samples", name, n=n)
        except Exception as e:  # noqa: BLE001 - the table closed, or the scheduler went away
            logger.info("table %r: %d samples of a dropped handle not reported (%s)", name, n, e)

    try:
        ctx.loop.add_callback(report)
    except Exception as e:  # noqa: BLE001 - the loop is closed (the process is exiting)
        logger.info("table %r: %d samples of a dropped handle not reported (%s)", name, n, e)
