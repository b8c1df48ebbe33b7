"""Defaults through ``dask.config`` (key ``gear-flow``), loaded from gear-flow.yaml.

Keyword arguments default to ``None`` and fall back to these values, as
dask-cuda's ``LocalCUDACluster`` does; override them with ``dask.config.set``,
a YAML file in ``~/.config/dask/`` or ``DASK_GEAR_FLOW__TABLE__BOUNDARY=...``.
"""

from __future__ import annotations

import os

import dask.config
import yaml

_fn = os.path.join(os.path.dirname(__file__), "gear-flow.yaml")
with open(_fn) as f:
    defaults = yaml.safe_load(f)

dask.config.update_defaults(defaults)


def get(key: str, value=None):
    """``value`` if not None, else ``gear-flow.<key>`` from dask.config."""
    return dask.config.get(f"gear-flow.{key}") if value is None else value
