"""What the command line reads and prints: column and selector strings, table files, info tables."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..parsing import parse_columns, parse_kind  # noqa: F401  (part of this module's API)
from .errors import CLIError


# -- output -------------------------------------------------------------------------------------
def format_info(info: Mapping[str, Any]) -> str:
    """A table's ``info()`` as text: totals, limiter, one line per shard.

    Parameters
    ----------
    info : mapping
        What ``DistributedTable.info()`` (or ``LocalTable.info()``) returns:
        ``size``, ``max_size`` and ``num_shards`` are required; ``name``,
        ``sampler``, ``remover``, ``rate_limiter``, ``totals``, ``shards`` and
        ``lost`` are shown when present.

    Returns
    -------
    str
        Several lines, no trailing newline.
    """
    lines = []
    title = info.get("name", "table")
    lines.append(f"{title}: {info['size']} items (max {info['max_size']}), {info['num_shards']} shard(s)")
    sampler = info.get("sampler")
    remover = info.get("remover")
    lines.append(f"  sampler {sampler}  remover {remover}")
    lim = info.get("rate_limiter", {})
    lines.append(
        "  rate limiter {kind}: inserts {inserts}, samples {samples}, deletes {deletes}".format(
            **{k: lim.get(k) for k in ("kind", "inserts", "samples", "deletes")}
        )
    )
    t = info.get("totals", {})
    lines.append(
        "  totals: inserted {inserted}, evicted {evicted}, removed {removed}, deleted {deleted}, "
        "expired {expired}, sampled {sampled}, stale updates {stale_updates}".format(
            **{
                k: t.get(k, 0)
                for k in ("inserted", "evicted", "removed", "deleted", "expired", "sampled", "stale_updates")
            }
        )
    )
    cols = ["shard", "worker", "size", "episodes", "steps_stored", "inserted", "evicted", "sampled"]
    lines += [
        "  " + line for line in format_rows([{c: s.get(c, "") for c in cols} for s in info.get("shards", [])], cols)
    ]
    for s, v in (info.get("lost") or {}).items():
        lines.append(f"  LOST shard {s}: {v}")
    return "\n".join(lines)


def format_rows(rows: Sequence[Mapping[str, Any]], cols: Sequence[str]) -> list[str]:
    """Rows as aligned text lines under a header.

    Parameters
    ----------
    rows : sequence of mapping
        One mapping per row; a missing key shows as an empty cell.
    cols : sequence of str
        The columns to show, in order; also the header.

    Returns
    -------
    list of str
        The header line, then one line per row; columns left-aligned, two
        spaces apart, trailing spaces stripped.
    """
    cells = [[str(r.get(c, "")) for c in cols] for r in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(cols)]
    out = ["  ".join(c.ljust(w) for c, w in zip(cols, widths)).rstrip()]
    out += ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in cells]
    return out


# -- parsing: the library's (gear_flow.parsing), re-exported for the CLI's users


def load_table_file(path: str) -> dict[str, Any]:
    """A table file (JSON or YAML): ``spec`` (TableSpec.to_dict layout) plus table options.

    Parameters
    ----------
    path : str
        The file; ``.json`` is read as JSON, anything else as YAML.

    Returns
    -------
    dict
        ``spec`` and any of the options ``name``, ``sampler``, ``remover``,
        ``rate_limiter``, ``max_times_sampled``, ``boundary``, ``tier``,
        ``routing``, ``timeout``, ``degraded``, ``resources``, ``workers``.

    Raises
    ------
    CLIError
        The file does not exist or does not parse.
    ValueError
        It is not a mapping with ``spec``, or has unknown keys.
    """
    import yaml

    if not Path(path).is_file():
        raise CLIError(f"table file {path} does not exist (see cluster/examples/cartpole-table.yaml for one)")
    text = Path(path).read_text()
    try:
        doc = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        raise CLIError(f"table file {path} is not valid {'JSON' if path.endswith('.json') else 'YAML'}: "
                       f"{' '.join(str(e).split())}") from None  # fmt: skip
    if not isinstance(doc, dict) or "spec" not in doc:
        raise ValueError(
            f"{path}: a table file is a mapping with a 'spec' key (see cluster/examples/cartpole-table.yaml)"
        )
    known = {"name", "spec", "sampler", "remover", "rate_limiter", "max_times_sampled", "boundary", "tier",
             "routing", "timeout", "degraded", "resources", "workers"}  # fmt: skip
    unknown = sorted(set(doc) - known)
    if unknown:
        raise ValueError(f"{path}: unknown keys {unknown}; allowed: {sorted(known)}")
    return doc
