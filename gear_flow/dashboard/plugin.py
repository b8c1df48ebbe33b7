"""Scheduler plugin of the gear_flow dashboard page.

:class:`GearFlowDashboard` does three things on the scheduler:

* registers a ``gear_flow_stats`` handler, by which learner handles report
  which transport their bytes took (:func:`gear_flow.dashboard.report.report_stats`);
* where the scheduler serves Dask's dashboard (Bokeh installed, a dashboard
  address given), adds the page ``/gear-flow`` to the same HTTP server, with
  the same prefix and template; elsewhere it adds no route and polls nothing;
* while the page exists, polls every table once per ``interval``: the
  coordinator's state in-process and each shard worker's counters over the
  worker's ``gear_flow`` handler, keeping a bounded history of
  :class:`~gear_flow.dashboard.model.Snapshot` objects that the page draws.

Register it next to the coordinator (``DistributedTable.create``, the
preload), or yourself::

    client.register_plugin(GearFlowDashboard())
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import TYPE_CHECKING

from distributed.diagnostics.plugin import SchedulerPlugin

from ..config import get as config_get
from ..errors import SpecError
from .model import TRANSPORT_KEYS, Snapshot, rates, snapshot

if TYPE_CHECKING:
    from bokeh.server.server import BokehTornado
    from distributed import Scheduler

logger = logging.getLogger(__name__)

DASHBOARD_NAME = "gear-flow-dashboard"
#: the page's route, under the dashboard's prefix
ROUTE = "/gear-flow"
COORDINATOR_NAME = "gear-flow-coordinator"  # gear_flow.distributed.coordinator.COORDINATOR_NAME
#: a learner's report not renewed for this long is dropped (its handle is gone: a task that sampled and
#: returned, a restarted actor), and at most this many are kept, the oldest dropped first
REPORT_TTL_S = 600.0
MAX_REPORTS = 1024


class GearFlowDashboard(SchedulerPlugin):
    """Adds the gear_flow page to the scheduler's dashboard.

    Parameters
    ----------
    interval : float, optional
        Seconds between polls of the tables (and the page's refresh);
        default ``gear-flow.dashboard.interval`` (1.0) where the scheduler
        runs.
    history : int, optional
        Polls kept for the time series; default
        ``gear-flow.dashboard.history`` (600: ten minutes at 1 s).

    Notes
    -----
    One plugin of this name serves a scheduler, and the first one added
    stays: gear_flow's scheduler preload (``local_cluster``, ``gear-flow
    local``, ``start-scheduler.sh``) adds one, and so does every table's
    ``create``.  To poll at another pace, set the two configuration keys
    where the scheduler runs (``DASK_GEAR_FLOW__DASHBOARD__INTERVAL=5``);
    a plugin registered later with other arguments changes nothing.

    Examples
    --------
    >>> client.register_plugin(GearFlowDashboard())  # doctest: +SKIP
    >>> # then open http://<scheduler>:8787/gear-flow
    """

    name = DASHBOARD_NAME
    idempotent = True

    def __init__(self, interval: float | None = None, history: int | None = None):
        self._asked = (interval, history)  # (None: the scheduler's configuration, read when it starts)

    async def start(self, scheduler: Scheduler) -> None:
        """Register the stats handler; add the page and start polling where the dashboard is served.

        Parameters
        ----------
        scheduler : distributed.Scheduler
            The scheduler the plugin was added to.
        """
        interval, history = self._asked
        self.interval = float(config_get("dashboard.interval", interval))
        self.history_len = int(config_get("dashboard.history", history))
        if not self.interval > 0 or self.history_len < 1:
            raise SpecError(f"dashboard interval {self.interval} s and history {self.history_len} must be positive")
        self.scheduler = scheduler
        self.reports: dict = {}
        self.history: deque[Snapshot] = deque(maxlen=self.history_len)
        self.series: deque[dict] = deque(maxlen=self.history_len)
        self._poll_task: asyncio.Task | None = None
        scheduler.handlers["gear_flow_stats"] = self.handle_stats
        self.served = add_page(scheduler, self)
        if self.served:
            self._poll_task = asyncio.ensure_future(self._poll_loop())

    async def close(self) -> None:
        """Stop polling."""
        if self._poll_task is not None:
            self._poll_task.cancel()

    # -- learners' reports ------------------------------------------------------------------------
    def handle_stats(
        self, comm: object = None, table: str | None = None, learner: str | None = None, stats: dict | None = None
    ) -> dict:
        """Record a learner's transport counters (``DistributedTable.stats``); the ``gear_flow_stats`` handler.

        Parameters
        ----------
        comm : object, optional
            The comm the message came on (passed by Dask's handler machinery; unused).
        table : str
            The table's name.
        learner : str
            Identifies the learner's handle (:func:`~gear_flow.dashboard.report.learner_id`).
        stats : dict
            Cumulative counters; the keys of
            :data:`~gear_flow.dashboard.model.TRANSPORT_KEYS` are kept (missing: 0).

        Returns
        -------
        dict
            ``{"status": "OK"}``, or ``{"status": "error", "error": message}``
            when an argument has the wrong type or a counter is not a
            whole number >= 0.  A report of a table the coordinator does not
            hold is not kept; reports older than :data:`REPORT_TTL_S`, and
            past :data:`MAX_REPORTS` the oldest, are dropped.
        """
        if not isinstance(table, str) or not isinstance(learner, str) or not isinstance(stats, dict):
            return {"status": "error", "error": "gear_flow_stats needs table, learner (str) and stats (dict)"}
        bad = [k for k in TRANSPORT_KEYS if k in stats and not _count(stats[k])]
        if bad:
            return {"status": "error", "error": f"gear_flow_stats: {bad[0]} must be a whole number >= 0"}
        now = time.time()
        if table in self._tables():
            self.reports[(table, learner)] = {**{k: int(stats.get(k, 0)) for k in TRANSPORT_KEYS}, "time": now}
        self._prune(now)
        return {"status": "OK"}

    def _tables(self) -> dict:
        coord = self.scheduler.plugins.get(COORDINATOR_NAME)
        return dict(getattr(coord, "tables", {}) or {}) if coord is not None else {}

    def _prune(self, now: float) -> None:
        """Drop the reports of tables gone, those not renewed for :data:`REPORT_TTL_S`, and the oldest past
        :data:`MAX_REPORTS`: the learners of a long-lived table come and go."""
        tables = self._tables()
        for key, row in list(self.reports.items()):
            if key[0] not in tables or now - row["time"] > REPORT_TTL_S:
                del self.reports[key]
        if len(self.reports) > MAX_REPORTS:
            for key, _ in sorted(self.reports.items(), key=lambda kv: kv[1]["time"])[: len(self.reports) - MAX_REPORTS]:
                del self.reports[key]

    # -- polling -------------------------------------------------------------------------------------
    async def _poll_loop(self) -> None:
        while True:
            try:
                await self.poll()
            except asyncio.CancelledError:
                raise
            except Exception:  # a poll that failed is shown as a gap, never takes the scheduler down
                logger.exception("gear_flow dashboard: poll failed")
            await asyncio.sleep(self.interval)

    async def poll(self) -> Snapshot:
        """Read every table once; append the snapshot and its rates to the history.

        Asks each live shard's worker for its counters and resident bytes; an
        unreachable worker is skipped (its shards show as such).

        Returns
        -------
        Snapshot
            The new poll (also appended to :attr:`history`, its rates to :attr:`series`).
        """
        # a table closed with drop=False too: its shards hold their memory (and keep their workers from
        # being retired) until it is dropped, which is what an operator looking here needs to see
        tables = {name: g.public() for name, g in self._tables().items()}
        self._prune(time.time())
        infos: dict = {}
        resident: dict = {}
        calls = []
        for name, pub in tables.items():
            lost = {int(s) for s in pub["lost"]}
            for addr in sorted({a for s, a in pub["placement"].items() if int(s) not in lost}):
                calls.append((name, addr))
        results = await asyncio.gather(*(self._worker_call(addr, name) for name, addr in calls), return_exceptions=True)
        for (name, addr), r in zip(calls, results):
            if isinstance(r, BaseException):
                continue  # unreachable: its shards show as such
            info, nbytes = r
            infos.setdefault(name, []).extend({**i, "worker": addr} for i in info)
            resident.setdefault(name, {})[addr] = nbytes
        snap = snapshot(tables, infos, resident, self.reports)
        prev = self.history[-1] if self.history else None
        self.history.append(snap)
        self.series.append({"time": snap.time, **rates(prev, snap)})
        return snap

    async def _worker_call(self, addr: str, name: str) -> tuple[list, dict]:
        info = await _call(self.scheduler, addr, "info", name)
        nbytes = await _call(self.scheduler, addr, "nbytes", name)
        return info, nbytes


def install(scheduler: Scheduler) -> None:
    """Add the dashboard plugin to a scheduler being set up (a preload's ``dask_setup``); idempotent.

    Parameters
    ----------
    scheduler : distributed.Scheduler
        The scheduler being set up.
    """
    if DASHBOARD_NAME not in scheduler.plugins:
        # started by the scheduler with its other plugins, after the preloads
        scheduler.add_plugin(GearFlowDashboard(), name=DASHBOARD_NAME, idempotent=True)


async def _call(scheduler: Scheduler, addr: str, action: str, name: str) -> object:
    from ..distributed import protocol, wire

    resp = await asyncio.wait_for(
        scheduler.rpc(addr).gear_flow(action=action, v=protocol.VERSION, **wire.encode({"name": name})), 10
    )
    if not isinstance(resp, dict) or resp.get("status") != "OK":
        raise RuntimeError(f"worker {addr}: {action} of table {name!r} failed")
    return wire.result(resp)  # the scheduler keeps frames as they came: decoded there


def dashboard_app(scheduler: Scheduler) -> BokehTornado | None:
    """The Bokeh application of the scheduler's dashboard.

    Parameters
    ----------
    scheduler : distributed.Scheduler
        A started scheduler.

    Returns
    -------
    bokeh.server.server.BokehTornado or None
        None where the scheduler serves no dashboard (no HTTP server, or no Bokeh).
    """
    app = getattr(scheduler, "http_application", None)
    if app is None:
        return None
    try:
        from bokeh.server.server import BokehTornado
    except ImportError:
        return None
    return next((a for a in getattr(app, "applications", []) if isinstance(a, BokehTornado)), None)


def add_page(scheduler: Scheduler, plugin: GearFlowDashboard) -> bool:
    """Add the page to the scheduler's HTTP server when it serves the dashboard.

    The page goes at ``/gear-flow`` under the dashboard's own prefix, in its
    navigation bar.

    Parameters
    ----------
    scheduler : distributed.Scheduler
        A started scheduler.
    plugin : GearFlowDashboard
        The plugin whose polls the page shows.

    Returns
    -------
    bool
        True if the page was added, False where there is no dashboard.
    """
    dashboard = dashboard_app(scheduler)
    if dashboard is None:
        logger.info("gear_flow dashboard: the scheduler serves no dashboard, no page added")
        return False
    from functools import partial

    from distributed.dashboard.core import BokehApplication
    from distributed.dashboard.scheduler import template_variables
    from tornado.ioloop import IOLoop

    from .page import gear_flow_doc

    prefix = getattr(dashboard, "_prefix", "") or ""  # the dashboard's own (Scheduler(http_prefix=...))
    # the page named in Dask's own navigation (the scheduler's one set of template variables, which every Dask
    # page renders its bar from): linked from the status page a user opens, not only from its own bar
    extra = template_variables(scheduler)
    pages = extra.setdefault("pages", [])
    if ROUTE.strip("/") not in pages:
        pages.append(ROUTE.strip("/"))
    app = BokehApplication({ROUTE: partial(gear_flow_doc, plugin)}, scheduler, prefix=prefix, template_variables=extra)
    scheduler.http_application.add_application(app)
    app.initialize(IOLoop.current())
    app.start()
    logger.info("gear_flow dashboard: page %s added", ROUTE)
    return True


def _count(v: object) -> bool:
    """A counter's value: a whole number >= 0 (an int, or a float without a fraction; not a bool)."""
    if isinstance(v, bool):
        return False
    if isinstance(v, int):
        return v >= 0
    return isinstance(v, float) and v.is_integer() and v >= 0
