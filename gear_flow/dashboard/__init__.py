"""The gear_flow page of the Dask dashboard: tables, shards, limiters and learners' transports.

:class:`GearFlowDashboard` (a scheduler plugin) adds ``/gear-flow`` to the
scheduler's dashboard; :func:`report_stats` sends a learner handle's
transport counters to it.  Importing this package imports no Bokeh: the page
is built only on a scheduler that serves the dashboard.
"""

from __future__ import annotations

from .plugin import DASHBOARD_NAME, ROUTE, GearFlowDashboard, install
from .report import report_stats

__all__ = ["DASHBOARD_NAME", "ROUTE", "GearFlowDashboard", "install", "report_stats"]
