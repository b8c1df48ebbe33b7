"""Preload that stops a scheduler's or worker's HTTP server: "no dashboard" means no HTTP port.

Dask always starts an HTTP server (dashboard, ``/health``, ``/metrics``), even with
``--no-dashboard``.  Loaded as ``--preload gear_flow.deploy.no_http`` (``GEAR_FLOW_DASHBOARD=none``
in the launch scripts, ``gear-flow local --no-dashboard``), it stops that server as the process
starts (Dask opened it in the constructor; it lives a few milliseconds, about as long as the
process's start), so the process keeps only its comm port.  Kubernetes probes and the operator need that HTTP server: do not use it there.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)


def dask_setup(server) -> None:
    http = getattr(server, "http_server", None)
    if http is not None:
        http.stop()
        logger.info("gear_flow: HTTP server (dashboard, /health, /metrics) stopped: no dashboard was asked for")
