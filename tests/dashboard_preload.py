"""A scheduler preload that adds the dashboard page the way gear_flow.distributed.preload will (one line)."""

from gear_flow.dashboard import install


def dask_setup(scheduler):
    install(scheduler)
