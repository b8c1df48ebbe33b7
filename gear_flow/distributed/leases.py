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
import time
from typing import TYPE_CHECKING

from .. import config
from .transport import CoordinatorClient

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


class Lease:
    """A handle's admission lease (the batch size it covers, batches left, when granted) and the samples
    served under it not reported yet; thread-safe (a learner's thread and the event loop both sample).

    Examples
    --------
    >>> lease = Lease()
    >>> lease.granted(8, 2)
    >>> lease.take(8), lease.take(4), lease.take(8), lease.take(8)
    (True, False, True, False)
    >>> lease.served(8); lease.served(8)
    >>> lease.report(), lease.report()
    (16, 0)
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._size, self._left, self._since = 0, 0, 0.0
        #: the table's items when the lease was granted: the ``table_size`` of the batches served under it
        self.table_size = -1
        #: outlives the handle: a dropped handle's count is reported by :func:`report_dropped`
        self.unreported = LeasedSamples()

    def granted(self, n: int, batches: int, table_size: int = -1) -> None:
        """An admission of a batch of ``n`` came with a lease of ``batches`` more (0: none).

        Parameters
        ----------
        n : int
            The batch size the lease covers.
        batches : int
            Batches of that size it covers.
        table_size : int, default -1
            The table's items at the admission (-1: not known).
        """
        with self._lock:
            self._size, self._left, self._since = n, int(batches), time.monotonic()
            self.table_size = int(table_size)

    def revoke(self) -> None:
        """The lease covers no more batches (the handle changed the table: its next admission is asked)."""
        with self._lock:
            self._left = 0

    def take(self, n: int) -> bool:
        """Take one batch of ``n`` from the lease, if it covers it (same size, not used up, still fresh).

        Parameters
        ----------
        n : int
            The batch's rows.

        Returns
        -------
        bool
            True: served under the lease (count it with :meth:`served` once
            served); False: ask the coordinator.
        """
        with self._lock:
            fresh = time.monotonic() - self._since <= config.get("distributed.sample-lease-seconds")
            if self._size != n or self._left <= 0 or not fresh:
                return False
            self._left -= 1
            return True

    def served(self, n: int) -> None:
        """A batch of ``n`` was served under the lease: reported with the next admission (or ``flush``).

        Counted once served, not when taken: a report sent meanwhile
        (another thread's admission) must not carry a batch that then fails.

        Parameters
        ----------
        n : int
            Its rows.
        """
        self.unreported.add(n)

    def report(self) -> int:
        """The samples served under the lease since the last report, now reported by the caller.

        Returns
        -------
        int
            Their count.
        """
        return self.unreported.take()

    def not_reported(self, n: int) -> None:
        """A report of ``n`` did not reach the coordinator (its admission was refused): kept for the next.

        Parameters
        ----------
        n : int
            The count that was to be reported.
        """
        self.unreported.add(n)


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
            await CoordinatorClient(ctx, name).count_samples(n)
        except Exception as e:  # noqa: BLE001 - the table closed, or the scheduler went away
            logger.info("table %r: %d samples of a dropped handle not reported (%s)", name, n, e)

    try:
        ctx.loop.add_callback(report)
    except Exception as e:  # noqa: BLE001 - the loop is closed (the process is exiting)
        logger.info("table %r: %d samples of a dropped handle not reported (%s)", name, n, e)
