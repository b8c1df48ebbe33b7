"""Command line: ``python -m gear_flow`` (or ``gear-flow``).

    gear-flow list --scheduler tcp://host:8786
    gear-flow info --scheduler tcp://host:8786 --table replay
"""

from __future__ import annotations

import argparse
import json
import sys


def format_info(info: dict) -> str:
    """A table's ``info()`` as text: totals, limiter, one line per shard."""
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
        "expired {expired}, sampled {sampled}, stale updates {stale_updates}".format(**{k: t.get(k, 0) for k in (
            "inserted", "evicted", "removed", "deleted", "expired", "sampled", "stale_updates")})
    )
    cols = ["shard", "worker", "size", "episodes", "steps_stored", "inserted", "evicted", "sampled"]
    rows = [[str(s.get(c, "")) for c in cols] for s in info.get("shards", [])]
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(cols)]
    lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(cols, widths)))
    for r in rows:
        lines.append("  " + "  ".join(v.ljust(w) for v, w in zip(r, widths)))
    for s, v in (info.get("lost") or {}).items():
        lines.append(f"  LOST shard {s}: {v}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="gear-flow", description="gear_flow replay tables on Dask")
    sub = p.add_subparsers(dest="cmd", required=True)
    for name, helptext in (("list", "list the distributed tables of a cluster"), ("info", "show a table's sizes and counters")):
        sp = sub.add_parser(name, help=helptext)
        sp.add_argument("--scheduler", required=True, help="scheduler address, e.g. tcp://10.0.0.1:8786")
        if name == "info":
            sp.add_argument("--table", required=True, help="table name")
            sp.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = p.parse_args(argv)
    from distributed import Client

    from .distributed import DistributedTable

    with Client(args.scheduler, timeout="10s") as client:
        if args.cmd == "list":
            async def names():
                r = await client.scheduler.gear_flow_coord(action="list", name=None)
                return r["result"]

            try:
                for n in client.sync(names):
                    print(n)
            except Exception as e:  # no coordinator yet: no tables
                print(f"no gear_flow tables ({type(e).__name__})", file=sys.stderr)
            return 0
        info = DistributedTable.attach(args.table, client=client).info()
        print(json.dumps(info, indent=2, default=str) if args.json else format_info(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
