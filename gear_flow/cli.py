"""Command line: ``gear-flow`` (also ``python -m gear_flow`` and ``dask gear-flow``).

    gear-flow local --workers 2
    gear-flow create --scheduler tcp://127.0.0.1:8786 --name replay --obs-dim 4 --capacity 100000
    gear-flow ingest --scheduler tcp://127.0.0.1:8786 --table replay data/cartpole/minari/cartpole-mixed-v0
    gear-flow info --scheduler tcp://127.0.0.1:8786 --table replay

Run ``gear-flow COMMAND --help`` for each command.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from .spec import BOUNDARIES

QUICKSTART = """\
Start here (one machine; on a cluster see README, "Running on a cluster"):

  gear-flow local --workers 2 --port 8786              # terminal 1: a cluster, until Ctrl-C
  export DASK_SCHEDULER_ADDRESS=tcp://127.0.0.1:8786   # terminal 2: the commands below use it
  python pipelines/make_dataset.py --out data/cartpole --episodes 100
  gear-flow create --name replay --obs-dim 4 --capacity 100000
  gear-flow ingest --table replay data/cartpole/minari/cartpole-mixed-v0
  gear-flow info --table replay
  gear-flow sample --table replay --batch-size 32 --length 8
  gear-flow bench local                                # benchmarks (pipelines/, --quick sizes)

With TLS (cluster/tls/make_certs.py), add --tls-dir DIR to every command, or
`source cluster/env.sh` once: it exports the certificates in Dask's configuration.
"""


# -- output -------------------------------------------------------------------------------------
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


def format_rows(rows: list[dict], cols: list[str]) -> list[str]:
    """Rows as aligned text lines under a header."""
    cells = [[str(r.get(c, "")) for c in cols] for r in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(cols)]
    out = ["  ".join(c.ljust(w) for c, w in zip(cols, widths)).rstrip()]
    out += ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in cells]
    return out


# -- parsing helpers ------------------------------------------------------------------------------
_COLUMN = re.compile(
    r"^\s*(?P<name>[A-Za-z_][\w.-]*)\s*:\s*(?P<dtype>[A-Za-z0-9_]+)\s*(?:\[(?P<shape>[\d,\s]*)\])?\s*$"
)


def parse_columns(text: str) -> list[dict]:
    """``"obs:float32[4],action:int64,done:bool"`` → column dicts of :meth:`TableSpec.from_dict`."""
    import numpy as np

    cols = []
    for part in re.split(r",(?![^\[]*\])", text):
        m = _COLUMN.match(part)
        if not m:
            raise ValueError(f"column {part.strip()!r} must look like NAME:DTYPE or NAME:DTYPE[D1,D2,...]")
        shape = [int(s) for s in (m["shape"] or "").replace(" ", "").split(",") if s]
        cols.append({"name": m["name"], "shape": shape, "dtype": np.dtype(m["dtype"]).str})
    return cols


def parse_kind(text: str) -> dict:
    """``"prioritized:alpha=0.6,beta=0.4"`` → ``{"kind": "prioritized", "params": {"alpha": 0.6, ...}}``."""
    import yaml

    kind, _, rest = text.partition(":")
    params = {}
    for item in filter(None, re.split(r",(?![^\[]*\])", rest)):
        key, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"{item!r} in {text!r} must be KEY=VALUE")
        params[key.strip()] = yaml.safe_load(value)
    return {"kind": kind.strip(), "params": params}


def load_table_file(path: str) -> dict:
    """A table file (JSON or YAML): ``spec`` (TableSpec.to_dict layout) plus table options."""
    import yaml

    text = Path(path).read_text()
    doc = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
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


# -- connecting -----------------------------------------------------------------------------------
def security_from_args(args, role: str = "client"):
    """A ``distributed.Security`` from --tls-dir / --tls-* flags, or None (Dask's configuration decides)."""
    from distributed import Security

    ca, cert, key = args.tls_ca_file, args.tls_cert, args.tls_key
    if args.tls_dir:
        d = Path(args.tls_dir)
        ca, cert, key = ca or d / "ca.pem", cert or d / f"{role}.pem", key or d / f"{role}-key.pem"
    if not (ca or cert or key):
        return None
    missing = [str(p) for p in (ca, cert, key) if not p or not Path(p).is_file()]
    if missing:
        raise SystemExit(f"gear-flow: TLS needs a CA file, a certificate and a key; missing or unreadable: {missing}")
    return Security(
        require_encryption=True, tls_ca_file=str(ca), **{f"tls_{role}_cert": str(cert), f"tls_{role}_key": str(key)}
    )


def local_security(tls_dir):
    """Security for all three roles of a local cluster from a make_certs.py folder (None without one)."""
    from distributed import Security

    if not tls_dir:
        return None
    d = Path(tls_dir)
    files = {f"tls_{r}_{k}": d / f"{r}{'-key' if k == 'key' else ''}.pem" for r in ("scheduler", "worker", "client")
             for k in ("cert", "key")}  # fmt: skip
    files["tls_ca_file"] = d / "ca.pem"
    missing = sorted(str(p) for p in files.values() if not p.is_file())
    if missing:
        raise SystemExit(f"gear-flow local: --tls-dir {d} lacks {missing} (make them with cluster/tls/make_certs.py)")
    return Security(require_encryption=True, **{k: str(v) for k, v in files.items()})


def connect(args):
    """A Client for --scheduler / --scheduler-file (default: Dask's ``scheduler-address`` setting)."""
    import dask.config
    from distributed import Client

    sec = security_from_args(args)
    kw = {"timeout": args.timeout} if sec is None else {"timeout": args.timeout, "security": sec}
    if args.scheduler_file:
        return Client(scheduler_file=args.scheduler_file, **kw)
    addr = args.scheduler or dask.config.get("scheduler-address", None)
    if not addr:
        raise SystemExit(
            "gear-flow: no scheduler given: pass --scheduler tls://HOST:8786 (or --scheduler-file), "
            "or set DASK_SCHEDULER_ADDRESS; `gear-flow local` starts one on this machine"
        )
    if addr.startswith("tls://") and sec is None and not dask.config.get("distributed.comm.tls.ca-file", None):
        raise SystemExit(
            f"gear-flow: {addr} uses TLS: pass --tls-dir DIR (ca.pem, client.pem, client-key.pem) "
            "or --tls-ca-file/--tls-cert/--tls-key, or `source cluster/env.sh` with GEAR_FLOW_TLS_DIR set"
        )
    return Client(addr, **kw)


def _add_connection(p) -> None:
    g = p.add_argument_group("connecting to a cluster")
    g.add_argument("--scheduler", metavar="ADDR", help="scheduler address, e.g. tls://10.0.0.5:8786 "
                   "(default: $DASK_SCHEDULER_ADDRESS / dask config scheduler-address)")  # fmt: skip
    g.add_argument(
        "--scheduler-file", metavar="FILE", help="scheduler file written by `dask scheduler --scheduler-file`"
    )
    g.add_argument(
        "--tls-dir", metavar="DIR", help="folder with ca.pem, client.pem, client-key.pem (cluster/tls/make_certs.py)"
    )
    g.add_argument("--tls-ca-file", metavar="FILE", help="CA certificate (overrides --tls-dir)")
    g.add_argument("--tls-cert", metavar="FILE", help="this client's certificate (overrides --tls-dir)")
    g.add_argument("--tls-key", metavar="FILE", help="this client's private key (overrides --tls-dir)")
    g.add_argument("--timeout", default="10s", help="how long to try connecting (default: %(default)s)")


# -- commands -------------------------------------------------------------------------------------
def cmd_local(args) -> int:
    from distributed import Client, LocalCluster

    from .distributed.coordinator import GearFlowCoordinator
    from .distributed.preload import worker_plugin

    sec = local_security(args.tls_dir)
    protocol = args.protocol or ("tls" if sec is not None else "tcp")
    if protocol == "tls" and sec is None:
        raise SystemExit("gear-flow local: --protocol tls needs --tls-dir (cluster/tls/make_certs.py makes one)")
    resources = dict(parse_kind("x:" + args.resources.replace(" ", ","))["params"]) if args.resources else None
    cluster = LocalCluster(
        n_workers=args.workers, threads_per_worker=args.threads, processes=True, memory_limit=args.memory_limit,
        host=args.host, scheduler_port=args.port, protocol=protocol, security=sec, resources=resources,
        # without the dashboard the scheduler's HTTP routes (health, metrics) still listen: any free port
        dashboard_address=":0" if args.no_dashboard else args.dashboard_address,
        scheduler_kwargs={"dashboard": not args.no_dashboard},
    )  # fmt: skip
    stop = []

    def on_signal(signum, frame):
        stop.append(signum)

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with Client(cluster, security=sec) as client:
            client.register_plugin(GearFlowCoordinator())
            client.register_plugin(worker_plugin())
            if args.scheduler_file:
                Path(args.scheduler_file).write_text(json.dumps({"address": cluster.scheduler_address}))
            print(f"gear-flow local: scheduler at {cluster.scheduler_address}", flush=True)
            if cluster.dashboard_link and not args.no_dashboard:
                print(f"gear-flow local: dashboard at {cluster.dashboard_link}", flush=True)
            print(f"gear-flow local: {args.workers} worker(s) x {args.threads} thread(s)"
                  + (f", resources {resources}" if resources else "") + "; Ctrl-C stops it", flush=True)  # fmt: skip
            while not stop:
                time.sleep(0.2)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        cluster.close(timeout=30)
    print("gear-flow local: stopped", flush=True)
    return 0


def cmd_list(args) -> int:
    with connect(args) as client:

        async def names():
            r = await client.scheduler.gear_flow_coord(action="list", name=None)
            return r["result"]

        try:
            for n in client.sync(names):
                print(n)
        except Exception as e:  # no coordinator yet: no tables
            print(f"no gear_flow tables ({type(e).__name__})", file=sys.stderr)
    return 0


def cmd_info(args) -> int:
    from .distributed import DistributedTable

    with connect(args) as client:
        info = DistributedTable.attach(args.table, client=client).info()
        print(json.dumps(info, indent=2, default=str) if args.json else format_info(info))
    return 0


def cmd_create(args) -> int:
    from . import rate_limiters, selectors
    from .distributed import DistributedTable
    from .distributed.table import workers_with_resource
    from .spec import TableSpec

    doc = load_table_file(args.spec) if args.spec else {"spec": {}}
    spec = dict(doc["spec"])
    if args.columns:
        spec["columns"] = parse_columns(args.columns)
    elif args.obs_dim:
        from .ingest import episode_columns

        cols = episode_columns(tuple(args.obs_dim), args.action_dtype, tuple(args.action_shape or ()))
        spec["columns"] = [{"name": c.name, "shape": list(c.shape), "dtype": c.dtype.str} for c in cols]
    for key, value in (("capacity", args.capacity), ("num_shards", args.shards), ("item_unit", args.item_unit),
                       ("max_size", args.max_size)):  # fmt: skip
        if value is not None:
            spec[key] = value
    if "columns" not in spec or "capacity" not in spec:
        raise SystemExit("gear-flow create: give the columns (--columns, --obs-dim or a --spec file) and --capacity")
    opts = {k: v for k, v in doc.items() if k != "spec"}
    for key in ("name", "boundary", "tier", "routing", "resources"):
        if getattr(args, key) is not None:
            opts[key] = getattr(args, key)
    for key in ("sampler", "remover", "rate_limiter"):
        if getattr(args, key) is not None:
            opts[key] = parse_kind(getattr(args, key))
    if args.workers:
        opts["workers"] = args.workers.split(",")
    if args.degraded:
        opts["degraded"] = True
    with connect(args) as client:
        if "num_shards" not in spec:  # default: one shard per worker it can go on
            if opts.get("workers"):
                spec["num_shards"] = len(opts["workers"])
            elif opts.get("resources"):
                spec["num_shards"] = len(workers_with_resource(client, opts["resources"]))
            else:
                spec["num_shards"] = max(1, len(client.scheduler_info(n_workers=-1)["workers"]))
        spec.setdefault("item_unit", "step")
        spec.setdefault("max_size", None)
        kw = {k: opts[k] for k in ("name", "boundary", "tier", "routing", "timeout", "resources", "workers",
                                   "max_times_sampled", "degraded") if k in opts}  # fmt: skip
        for key, reg in (("sampler", selectors), ("remover", selectors), ("rate_limiter", rate_limiters)):
            if key in opts:
                kw[key] = reg.from_config(opts[key])
        table = DistributedTable.create(client, TableSpec.from_dict(spec), **kw)
        print(f"created table {table.name!r}: {table.spec.num_shards} shard(s) of {table.spec.capacity} steps")
        print(format_info(table.info()))
    return 0


def cmd_ingest(args) -> int:
    from .distributed import DistributedTable
    from .ingest import ingest
    from .ingest.columns import parse_columns

    cmap = parse_columns(args.columns, layout=args.layout, episode=args.episode_column, step=args.step_column,
                         no_truncation=args.no_truncation_column)  # fmt: skip
    with connect(args) as client:
        table = DistributedTable.attach(args.table, client=client)
        source = args.source[0] if len(args.source) == 1 else args.source
        rep = ingest(table, source, args.format, gamma=args.gamma, chunk_episodes=args.chunk_episodes,
                     columns=cmap, max_episode_steps=args.max_episode_steps,
                     timeout=args.insert_timeout, client=client)  # fmt: skip
        print(f"ingested {rep.fmt} {rep.source}: read {rep.episodes_read} episodes / {rep.steps_read} steps, "
              f"stored {rep.episodes_stored} / {rep.steps_stored} in {rep.elapsed_s:.1f} s; "
              f"checksums {'match' if rep.ok else 'DIFFER: ' + '; '.join(rep.mismatches())}")  # fmt: skip
        rows = [{"shard": s, **v} for s, v in sorted(rep.shards.items())]
        print("\n".join(format_rows(rows, ["shard", "episodes", "steps"])))
        return 0 if rep.ok else 1


def cmd_sample(args) -> int:
    from .distributed import DistributedTable

    with connect(args) as client:
        table = DistributedTable.attach(args.table, client=client)
        t0 = time.perf_counter()
        batch = table.sample(args.batch_size, args.length, boundary=args.boundary)
        ms = 1e3 * (time.perf_counter() - t0)
        rows = [{"column": n, "shape": list(batch[n].shape), "dtype": str(batch[n].dtype).replace("torch.", "")}
                for n in table.spec.names]  # fmt: skip
        print(f"{args.table}: one batch of {args.batch_size} windows of {args.length} steps in {ms:.1f} ms")
        print("\n".join(format_rows(rows, ["column", "shape", "dtype"])))
        p = batch.probabilities
        print(f"probabilities {float(p.min()):.3g}..{float(p.max()):.3g}, masked steps {int((~batch.mask).sum())}")
    return 0


def cmd_drop(args) -> int:
    from .distributed import DistributedTable

    with connect(args) as client:
        DistributedTable.attach(args.table, client=client).close(drop=True)
        print(f"dropped table {args.table!r}")
    return 0


def cmd_bench(args) -> int:
    if args.which == "table":
        return _bench_table(args)
    script = Path(__file__).resolve().parents[1] / "pipelines" / f"bench_{args.which}.py"
    if not script.is_file():
        raise SystemExit(f"gear-flow bench: {script} not found: the benchmarks are scripts in the repository's "
                         "pipelines/ folder; run this from a clone installed with `pip install -e .`")  # fmt: skip
    cmd = [sys.executable, str(script)] + ([] if args.full else ["--quick"]) + list(args.extra)
    print("running", " ".join(cmd), flush=True)
    return subprocess.call(cmd)


def _bench_table(args) -> int:
    import numpy as np

    from .distributed import DistributedTable

    if not args.table:
        raise SystemExit("gear-flow bench table: --table NAME is required")
    with connect(args) as client:
        table = DistributedTable.attach(args.table, client=client)
        table.sample(args.batch_size, args.length)  # warm up connections and buffers
        times, nbytes = [], 0
        for _ in range(args.batches):
            t0 = time.perf_counter()
            b = table.sample(args.batch_size, args.length)
            times.append(time.perf_counter() - t0)
            nbytes = sum(b[n].numel() * b[n].element_size() for n in table.spec.names)
        med = float(np.median(times))
        print("\n".join(format_rows([{"table": args.table, "batch": f"{args.batch_size}x{args.length}",
                                      "MB/batch": f"{nbytes / 1e6:.2f}", "median ms": f"{1e3 * med:.2f}",
                                      "GB/s": f"{nbytes / med / 1e9:.3f}"}],
                                    ["table", "batch", "MB/batch", "median ms", "GB/s"])))  # fmt: skip
    return 0


# -- the parser -----------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    p = argparse.ArgumentParser(
        prog="gear-flow", formatter_class=fmt, epilog=QUICKSTART,
        description="gear_flow: distributed experience replay tables on Dask. Start a local cluster, "
                    "or connect to one (--scheduler), and create, fill, inspect and sample tables.",
    )  # fmt: skip
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    sp = sub.add_parser("local", formatter_class=fmt, help="start a local Dask cluster with gear_flow; print its address",
                        description="Start a Dask cluster of worker processes on this machine with gear_flow set up, "
                        "print the scheduler's address and keep running until Ctrl-C (or SIGTERM).")  # fmt: skip
    sp.add_argument("--workers", type=int, default=2, help="worker processes (default: %(default)s)")
    sp.add_argument("--threads", type=int, default=2, help="threads per worker (default: %(default)s)")
    sp.add_argument("--memory-limit", default="auto", help="memory per worker (default: %(default)s)")
    sp.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    sp.add_argument("--port", type=int, default=8786, help="scheduler port, 0 for any free port (default: %(default)s)")
    sp.add_argument("--protocol", choices=["tcp", "tls", "ucx"], help="default: tls with --tls-dir, else tcp")
    sp.add_argument("--resources", default="replay=1", help="Dask resources of each worker (default: %(default)s)")
    sp.add_argument("--dashboard-address", default=":8787", help="dashboard (default: %(default)s)")
    sp.add_argument("--no-dashboard", action="store_true", help="no dashboard")
    sp.add_argument("--scheduler-file", help="also write the address to this JSON file")
    sp.add_argument("--tls-dir", help="TLS with the scheduler certificate of this folder (cluster/tls/make_certs.py)")
    sp.set_defaults(func=cmd_local)

    sp = sub.add_parser(
        "list",
        formatter_class=fmt,
        help="list the tables of a cluster",
        description="Print the names of the gear_flow tables registered with the scheduler.",
    )
    _add_connection(sp)
    sp.set_defaults(func=cmd_list)

    sp = sub.add_parser(
        "info",
        formatter_class=fmt,
        help="show a table's sizes and counters",
        description="Print a table's totals, rate limiter and one line per shard (--json: everything).",
    )
    _add_connection(sp)
    sp.add_argument("--table", required=True, help="table name")
    sp.add_argument("--json", action="store_true", help="print JSON instead of a table")
    sp.set_defaults(func=cmd_info)

    sp = sub.add_parser("create", formatter_class=fmt, help="create a table from a spec file or flags",
                        description="Create a distributed table. Columns come from --columns, from --obs-dim (the "
                        "columns of gear_flow.ingest, for datasets) or from a --spec file (JSON/YAML, see "
                        "cluster/examples/cartpole-table.yaml); flags override the file.",
                        epilog="examples:\n  gear-flow create --name replay --obs-dim 4 --capacity 100000\n"
                        "  gear-flow create --name pixels --columns 'obs:uint8[3,84,84],action:int64,reward:float32,"
                        "done:bool' \\\n      --capacity 1000000 --sampler prioritized:alpha=0.6,beta=0.4 "
                        "--resources replay\n  gear-flow create --spec cluster/examples/cartpole-table.yaml")  # fmt: skip
    _add_connection(sp)
    g = sp.add_argument_group("the table")
    g.add_argument("--spec", help="table file (JSON or YAML): 'spec' plus options")
    g.add_argument("--name", help="table name (default: generated)")
    g.add_argument("--columns", help="NAME:DTYPE[SHAPE],... e.g. 'obs:float32[4],action:int64,done:bool'")
    g.add_argument("--obs-dim", type=int, nargs="+", help="observation shape: the dataset columns of gear_flow.ingest")
    g.add_argument(
        "--action-dtype", default="int64", help="with --obs-dim (default: %(default)s; float32 for continuous)"
    )
    g.add_argument(
        "--action-shape", type=int, nargs="*", help="with --obs-dim: per-step action shape (default: scalar)"
    )
    g.add_argument("--capacity", type=int, help="steps per shard")
    g.add_argument("--shards", type=int, help="number of shards (default: one per eligible worker)")
    g.add_argument("--item-unit", choices=["step", "episode"], help="what carries a priority (default: step)")
    g.add_argument("--max-size", type=int, help="most items kept (default: every step)")
    g.add_argument("--sampler", help="KIND[:K=V,...], e.g. uniform, prioritized:alpha=0.6,beta=0.4, fifo")
    g.add_argument("--remover", help="eviction policy, KIND[:K=V,...] (default: fifo)")
    g.add_argument("--rate-limiter", help="KIND[:K=V,...], e.g. min_size:min_size_to_sample=1000")
    g.add_argument("--boundary", choices=BOUNDARIES, help="default window boundary")
    g.add_argument("--tier", choices=["host", "pinned", "device"], help="storage tier of the shards")
    g.add_argument("--routing", choices=["balanced", "round_robin"], help="how inserts are spread over shards")
    g.add_argument("--resources", help="place shards on the workers advertising this Dask resource, e.g. replay")
    g.add_argument("--workers", help="or on these worker addresses (comma-separated)")
    g.add_argument("--degraded", action="store_true", help="keep serving from the other shards when a worker is lost")
    sp.set_defaults(func=cmd_create)

    sp = sub.add_parser("ingest", formatter_class=fmt, help="load a dataset (Minari, D4RL HDF5, Parquet) into a table",
                        description="Read an offline RL dataset into an existing table, all or nothing: the workers "
                        "holding the shards read the files, so the paths must be readable on the workers. "
                        "Create the table first with `gear-flow create --obs-dim D`.",
                        epilog="example:\n  gear-flow ingest --table replay data/cartpole/minari/cartpole-mixed-v0")  # fmt: skip
    _add_connection(sp)
    sp.add_argument("source", nargs="+", help="Minari dataset folder, D4RL .hdf5 file, or Parquet files/folder/glob")
    sp.add_argument("--table", required=True, help="table name")
    sp.add_argument("--format", choices=["minari", "d4rl", "parquet"], help="default: guessed from the path")
    sp.add_argument("--gamma", type=float, help="discount of the derived return-to-go (default: config, 1.0)")
    sp.add_argument("--chunk-episodes", type=int, help="episodes per partition (default: config, 64)")
    sp.add_argument("--insert-timeout", type=float, help="seconds each insert may wait for the rate limiter")
    g = sp.add_argument_group("Parquet from other tools (column mapping)")
    g.add_argument("--layout", choices=["gear-flow", "lerobot"], help="a known layout (lerobot: episode_index, "
                   "frame_index, observation.state, action, next.reward, next.done)")  # fmt: skip
    g.add_argument("--columns", help="COLUMN=ROLE,... with roles obs, obs.<key>, next_obs, action, reward, "
                   "terminal, truncated (e.g. observation.state=obs,next.reward=reward)")  # fmt: skip
    g.add_argument("--episode-column", help="integer column naming each row's episode (default episode_id)")
    g.add_argument("--step-column", help="integer column ordering an episode's rows (default step)")
    g.add_argument("--no-truncation-column", action="store_true",
                   help="the layout has no truncation flag: an episode not ending terminal is truncated")  # fmt: skip
    sp.add_argument("--max-episode-steps", type=int, help="D4RL files without timeouts: end episodes after N steps")
    sp.set_defaults(func=cmd_ingest)

    sp = sub.add_parser("sample", formatter_class=fmt, help="draw one batch and print its shapes",
                        description="Sample one batch from a table as an external learner would, and print the "
                        "columns' shapes and dtypes.")  # fmt: skip
    _add_connection(sp)
    sp.add_argument("--table", required=True, help="table name")
    sp.add_argument("--batch-size", type=int, default=32, help="default: %(default)s")
    sp.add_argument("--length", type=int, default=8, help="window length (default: %(default)s)")
    sp.add_argument("--boundary", choices=BOUNDARIES, help="default: the table's")
    sp.set_defaults(func=cmd_sample)

    sp = sub.add_parser(
        "drop",
        formatter_class=fmt,
        help="close a table and free its shards",
        description="Close a table (blocked callers get TableClosedError) and free its shards.",
    )
    _add_connection(sp)
    sp.add_argument("--table", required=True, help="table name")
    sp.set_defaults(func=cmd_drop)

    sp = sub.add_parser("bench", formatter_class=fmt, help="run a benchmark",
                        description="local: pipelines/bench_local.py (in-process tables vs memcpy, TorchRL); "
                        "distributed: pipelines/bench_distributed.py (its own LocalClusters); both with --quick "
                        "sizes unless --full. table: sample throughput of a live table on a cluster.",
                        epilog="examples:\n  gear-flow bench local\n  gear-flow bench distributed --full -- --repeat 10\n"
                        "  gear-flow bench table --scheduler tls://10.0.0.5:8786 --tls-dir certs --table replay")  # fmt: skip
    sp.add_argument("which", choices=["local", "distributed", "table"], help="which benchmark")
    sp.add_argument("--full", action="store_true", help="local/distributed: the reference sizes (minutes)")
    sp.add_argument("extra", nargs="*", help="local/distributed: more arguments for the script (after --)")
    _add_connection(sp)
    g = sp.add_argument_group("table")
    g.add_argument("--table", help="table name")
    g.add_argument("--batch-size", type=int, default=256, help="default: %(default)s")
    g.add_argument("--length", type=int, default=64, help="default: %(default)s")
    g.add_argument("--batches", type=int, default=20, help="batches timed (default: %(default)s)")
    sp.set_defaults(func=cmd_bench)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, OSError, TimeoutError) as e:
        print(f"gear-flow {args.cmd}: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    except Exception as e:
        from .errors import GearFlowError

        if isinstance(e, GearFlowError):
            print(f"gear-flow {args.cmd}: {type(e).__name__}: {e}", file=sys.stderr)
            return 2
        raise


def _dask_command():
    """``dask gear-flow ...`` (entry point group ``dask_cli``, as dask-cuda's ``dask cuda``)."""
    import click

    @click.command(name="gear-flow", add_help_option=False,
                   context_settings={"ignore_unknown_options": True, "allow_extra_args": True})  # fmt: skip
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    def gear_flow(args):
        """gear_flow replay tables on Dask (same as `gear-flow`; try `dask gear-flow --help`)."""
        sys.exit(main(list(args)))

    return gear_flow


try:
    dask_command = _dask_command()
except ImportError:  # click comes with distributed; without it there is no `dask` command either
    dask_command = None


if __name__ == "__main__":
    sys.exit(main())
