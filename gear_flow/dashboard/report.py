"""Learners report which transport their bytes took, for the dashboard page.

A :class:`~gear_flow.distributed.DistributedTable` handle counts the bytes of
the windows it received in-process or from shared memory (``local_bytes``) and
over the Dask comm (``remote_bytes``) in ``table.stats``.  :func:`report_stats`
sends those counters to the scheduler's ``gear_flow_stats`` handler (added by
:class:`~gear_flow.dashboard.GearFlowDashboard`); :func:`maybe_report` does
it at most once per ``interval`` without waiting for the reply, so a learner
may call it after every batch.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import TYPE_CHECKING

from ..errors import GearFlowError

if TYPE_CHECKING:
    from ..distributed import DistributedTable

logger = logging.getLogger(__name__)


def learner_id(table: DistributedTable) -> str:
    """A name for this handle, stable for its lifetime.

    Parameters
    ----------
    table : DistributedTable
        A handle (a short random id is stored on it at the first call).

    Returns
    -------
    str
        ``"<owner>/<handle id>"``, the owner being the client id or worker address.
    """
    hid = getattr(table, "_dashboard_id", None)
    if hid is None:
        hid = uuid.uuid4().hex[:6]
        table._dashboard_id = hid
    return f"{table._ctx.owner}/{hid}"


async def report_stats_async(table: DistributedTable) -> None:
    """Send ``table.stats`` to the scheduler (see :func:`report_stats`).

    Parameters
    ----------
    table : DistributedTable
        The handle whose ``stats`` to send; awaited on its event loop.

    Raises
    ------
    GearFlowError
        The scheduler did not answer OK (no dashboard plugin, bad counters).
    """
    stats = {k: int(v) for k, v in table.stats.items()}
    resp = await table._ctx.scheduler.gear_flow_stats(table=table.name, learner=learner_id(table), stats=stats)
    if not isinstance(resp, dict) or resp.get("status") != "OK":
        raise GearFlowError(f"table {table.name!r}: the scheduler refused the transport report ({resp!r})")


def report_stats(table: DistributedTable) -> None:
    """Report a distributed table handle's transport counters to the dashboard page (blocking).

    Parameters
    ----------
    table : DistributedTable
        The handle whose ``stats`` to send.

    Returns
    -------
    None
        The scheduler has recorded the counters when this returns.
    """
    table._ctx.sync(report_stats_async, table)


def maybe_report(table: DistributedTable, interval: float = 1.0) -> bool:
    """Report ``table.stats`` if ``interval`` seconds passed since this handle last did; never waits.

    Parameters
    ----------
    table : DistributedTable
        The handle whose ``stats`` to send (in the background, on its event loop).
    interval : float, default 1.0
        Seconds between two reports of the same handle.

    Returns
    -------
    bool
        Whether a report was sent.
    """
    now = time.monotonic()
    if now - getattr(table, "_dashboard_reported", -float("inf")) < interval:
        return False
    table._dashboard_reported = now

    async def send():
        try:
            await report_stats_async(table)
        except Exception as e:  # no dashboard plugin, scheduler busy: the page just shows older numbers
            logger.debug("transport report of table %r failed: %s", table.name, e)

    asyncio.run_coroutine_threadsafe(send(), table._ctx.loop.asyncio_loop)
    return True
