"""Defaults through ``dask.config`` (key ``gear-flow``), loaded from gear-flow.yaml.

Keyword arguments default to ``None`` and fall back to these values, as
dask-cuda's ``LocalCUDACluster`` does; override them with ``dask.config.set``,
a YAML file in ``~/.config/dask/`` or ``DASK_GEAR_FLOW__TABLE__BOUNDARY=...``.

Without Dask installed (a bare GPU box running only the kernels and a local
table, e.g. ``pipelines/gpu_check.py``) the same defaults are read from
gear-flow.yaml into a plain dictionary; ``set``-style overrides then are not
available, keyword arguments still are.
"""

from __future__ import annotations

import os

_fn = os.path.join(os.path.dirname(__file__), "gear-flow.yaml")


def _parse_simple_yaml(text: str) -> dict:
    """Nested mappings of scalars (all gear-flow.yaml uses), for when PyYAML is missing."""
    root: dict = {}
    stack = [(-1, root)]
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].rstrip()
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        key, _, value = line.strip().partition(":")
        while stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1]
        value = value.strip()
        if not value:
            parent[key] = {}
            stack.append((indent, parent[key]))
        else:
            parent[key] = _scalar(value)
    return root


def _scalar(v: str):
    low = v.lower()
    if low in ("null", "~", "none"):
        return None
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(v)
        except ValueError:
            pass
    return v.strip("'\"")


with open(_fn) as f:
    _text = f.read()
try:
    import yaml

    defaults = yaml.safe_load(_text)
except ImportError:
    defaults = _parse_simple_yaml(_text)

try:
    import dask.config as _dask_config
except ImportError:
    _dask_config = None
else:
    _dask_config.update_defaults(defaults)


def get(key: str, value: object = None) -> object:
    """``value`` if not None, else ``gear-flow.<key>`` from dask.config (or the YAML defaults without Dask).

    Parameters
    ----------
    key : str
        Dotted key under ``gear-flow`` (``"table.boundary"``, ``"ingest.gamma"``).
    value : object, optional
        The caller's keyword argument; anything but None wins over the configuration.

    Returns
    -------
    object
        ``value``, or the configured value (as YAML/dask.config typed it).
    """
    if value is not None:
        return value
    if _dask_config is not None:
        return _dask_config.get(f"gear-flow.{key}")
    node = defaults["gear-flow"]
    for part in key.split("."):
        node = node[part]
    return node
