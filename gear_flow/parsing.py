"""Tables from text: column strings, selector and limiter strings, the default number of shards.

What the command line, configuration files and scripts share, so that
``"obs:float32[4],action:int64"`` or ``"prioritized:alpha=0.6"`` mean the same
everywhere.  Kinds are looked up in the registries (never built from names),
so registered custom selectors and limiters parse too.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from .errors import SpecError
from .rate_limiters import RateLimiter
from .selectors import Selector
from .spec import column_dtype

if TYPE_CHECKING:
    from distributed import Client

_COLUMN = re.compile(
    r"^\s*(?P<name>[A-Za-z_][\w.-]*)\s*:\s*(?P<dtype>[A-Za-z0-9_]+)\s*(?:\[(?P<shape>[\d,\s]*)\])?\s*$"
)
_TOP_COMMAS = r",(?![^\[]*\])"  # commas outside brackets


def parse_columns(text: str) -> list[dict]:
    """Column dicts of :meth:`TableSpec.from_dict <gear_flow.TableSpec.from_dict>` from a string.

    Parameters
    ----------
    text : str
        ``"obs:float32[4],action:int64,done:bool"``: ``NAME:DTYPE`` or ``NAME:DTYPE[D1,D2,...]``.

    Returns
    -------
    list of dict
        ``{"name", "shape", "dtype"}`` per column.
    """
    cols = []
    for part in re.split(_TOP_COMMAS, text):
        m = _COLUMN.match(part)
        if not m:
            raise ValueError(f"column {part.strip()!r} must look like NAME:DTYPE or NAME:DTYPE[D1,D2,...]")
        shape = [int(s) for s in (m["shape"] or "").replace(" ", "").split(",") if s]
        cols.append({"name": m["name"], "shape": shape, "dtype": column_dtype(m["dtype"], f"column {m['name']!r}").str})
    return cols


def parse_kind(text: str) -> dict:
    """A selector or limiter configuration from ``"KIND:KEY=VALUE,..."``.

    Parameters
    ----------
    text : str
        ``"prioritized:alpha=0.6,beta=0.4"``; values are YAML scalars or lists.

    Returns
    -------
    dict
        ``{"kind": "prioritized", "params": {"alpha": 0.6, "beta": 0.4}}``.
    """
    import yaml

    kind, _, rest = text.partition(":")
    params = {}
    for item in filter(None, re.split(_TOP_COMMAS, rest)):
        key, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"{item!r} in {text!r} must be KEY=VALUE")
        params[key.strip()] = yaml.safe_load(value)
    return {"kind": kind.strip(), "params": params}


def parse_selector(text: str) -> Selector:
    """A selector from ``"KIND:KEY=VALUE,..."`` (see :func:`parse_kind`).

    Parameters
    ----------
    text : str
        A registered selector kind and its constructor arguments, e.g.
        ``"uniform"`` or ``"prioritized:alpha=0.6"``.

    Returns
    -------
    Selector
        A new instance.

    Raises
    ------
    SpecError
        Unknown kind, or arguments the class rejects.
    ValueError
        An item is not ``KEY=VALUE``.
    """
    from .selectors import from_config

    return from_config(_checked(parse_kind(text), text))


def parse_rate_limiter(text: str) -> RateLimiter:
    """A rate limiter from ``"KIND:KEY=VALUE,..."`` (see :func:`parse_kind`).

    Parameters
    ----------
    text : str
        A registered limiter kind and its constructor arguments, e.g.
        ``"min_size:min_size_to_sample=1000"`` or
        ``"sample_to_insert_ratio:samples_per_insert=4,min_size_to_sample=100,error_buffer=50"``.

    Returns
    -------
    RateLimiter
        A new instance, with zero counters.

    Raises
    ------
    SpecError
        Unknown kind, or arguments the class rejects.
    ValueError
        An item is not ``KEY=VALUE``.
    """
    from .rate_limiters import from_config

    return from_config(_checked(parse_kind(text), text))


def _checked(cfg: dict, text: str) -> dict:
    if not cfg["kind"]:
        raise SpecError(f"{text!r} names no kind (write KIND or KIND:KEY=VALUE,...)")
    return cfg


def default_num_shards(client: Client, workers: list[str] | None = None, resources: str | None = None) -> int:
    """Shards of a new distributed table when none is asked for: one per worker it can go on.

    Parameters
    ----------
    client : distributed.Client
        A client of the cluster (to count its workers).
    workers : list of str, optional
        The workers the table is placed on (then: one shard each).
    resources : str, optional
        The Dask resource its workers advertise (then: one per such worker;
        none raises a clear error).

    Returns
    -------
    int
        At least 1.
    """
    if workers:
        return len(workers)
    if resources:
        from .resources import check_resources

        return max(1, len(check_resources(client, resources)))
    from .resources import advertised

    return max(1, len(advertised(client)))
