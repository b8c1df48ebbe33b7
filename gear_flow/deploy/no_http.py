"""Preload that stops a scheduler's or worker's HTTP server: "no dashboard" means no HTTP port.

Dask always starts an HTTP server (dashboard, ``/health``, ``/metrics``), even with
``--no-dashboard``.  Loaded as ``--preload gear_flow.deploy.no_http`` (``GEAR_FLOW_DASHBOARD=none``
in the launch scripts, ``gear-flow local --no-dashboard``), it stops that server as the process
starts (Dask opened it in the constructor; it lives a few milliseconds, about as long as the
process's start), so the process keeps only its comm port.  Kubernetes probes and the operator need that HTTP server: do not use it there.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from distributed.core import Server

logger = logging.getLogger(__name__)


def dask_setup(server: Server) -> None:
    """Stop the server's HTTP server, if it has one (Dask calls this when the preload is loaded).

    Parameters
    ----------
    server : distributed.Scheduler or distributed.Worker
        The process's server, being set up.
    """
    http = getattr(server, "http_server", None)
    if http is not None:
        http.stop()
        logger.info("gear_flow: HTTP server (dashboard, /health, /metrics) stopped: no dashboard was asked for")
