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

import math
import numbers
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
        return _checked(key, _dask_config.get(f"gear-flow.{key}"))
    node = defaults["gear-flow"]
    for part in key.split("."):
        node = node[part]
    return node


#: keys whose configured value may be null though their default is not (null: the library's own default)
_NULLABLE = frozenset({"distributed.omp-spin-count"})
#: keys of whole numbers (the other numbers may have a fraction: seconds, a discount)
_WHOLE = frozenset(
    {"distributed.rpc-retries", "distributed.sample-lease", "distributed.omp-spin-count", "ingest.chunk_episodes"}
)
#: keys of one of a few words (the table's own are checked, with their arguments, where they are used)
_CHOICES = {"distributed.scale-down": ("keep", "move")}


def _default(key: str) -> object:
    node: object = defaults["gear-flow"]
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _checked(key: str, v: object) -> object:
    """A configured value of ``key``, refused unless it is of its default's kind: a flag for a flag, a number
    >= 0 for a number (a whole one for a count), one of its words for a choice.  A default of null says
    nothing (the key's user checks it).  A string for a number, or a negative timeout, failed far from the
    setting: a TypeError inside the event loop, or a request that waited -15 s."""
    d = _default(key)
    if d is None or isinstance(d, dict) or (v is None and key in _NULLABLE):
        return v
    bad = None
    if isinstance(d, bool):
        bad = None if isinstance(v, bool) or type(v).__name__ == "bool_" else "true or false"  # (NumPy's too)
    elif isinstance(d, (int, float)):
        whole = key in _WHOLE
        ok = isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v) and v >= 0  # (NumPy's too)
        bad = None if ok and (not whole or v == int(v)) else ("a whole number >= 0" if whole else "a number >= 0")
    elif key in _CHOICES and v not in _CHOICES[key]:
        bad = " or ".join(repr(c) for c in _CHOICES[key])
    if bad is not None:
        from .errors import SpecError

        raise SpecError(f"gear-flow.{key} = {v!r} (configuration) must be {bad}")
    return v


def check_section(section: str) -> None:
    """Check every configured key of ``gear-flow.<section>`` (:func:`get` does so for the key it reads): a call
    that sets a table up refuses a bad value at once, not at the first request that reads it.

    Parameters
    ----------
    section : str
        ``"distributed"``, ``"ingest"``, ...

    Raises
    ------
    SpecError
        Naming the first key whose value is not of its default's kind.
    """
    for key in _default(section) or {}:
        get(f"{section}.{key}")
