"""Command line: ``gear-flow`` (also ``python -m gear_flow`` and ``dask gear-flow``).

    gear-flow local --workers 2
    gear-flow create --scheduler tcp://127.0.0.1:8786 --name replay --obs-dim 4 --capacity 100000
    gear-flow ingest --scheduler tcp://127.0.0.1:8786 --table replay data/cartpole/minari/cartpole-mixed-v0
    gear-flow info --scheduler tcp://127.0.0.1:8786 --table replay

Run ``gear-flow COMMAND --help`` for each command.  A user error prints one line on stderr (what went
wrong, why, what to do) and exits with status 2; ``--debug`` (or ``GEAR_FLOW_DEBUG=1``) shows the
traceback instead.
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from .errors import GearFlowError
from .spec import BOUNDARIES, column_dtype


class CLIError(GearFlowError):
    """A user error of the command line; the message says what is wrong and what to do."""


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
    cols = []
    for part in re.split(r",(?![^\[]*\])", text):
        m = _COLUMN.match(part)
        if not m:
            raise ValueError(f"column {part.strip()!r} must look like NAME:DTYPE or NAME:DTYPE[D1,D2,...]")
        shape = [int(s) for s in (m["shape"] or "").replace(" ", "").split(",") if s]
        cols.append({"name": m["name"], "shape": shape, "dtype": column_dtype(m["dtype"], f"column {m['name']!r}").str})
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
        raise CLIError(f"TLS needs a CA file, a certificate and a key; missing or unreadable: {missing} "
                       "(--tls-dir DIR with ca.pem, client.pem, client-key.pem from cluster/tls/make_certs.py)")  # fmt: skip
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
        raise CLIError(f"--tls-dir {d} lacks {missing} (make them with cluster/tls/make_certs.py)")
    return Security(require_encryption=True, **{k: str(v) for k, v in files.items()})


def connect(args):
    """A Client for --scheduler / --scheduler-file (default: Dask's ``scheduler-address`` setting).

    Every way this fails (no address, TLS on one side only, nothing listening, a refused
    certificate) is a :class:`CLIError` saying what to do.
    """
    import dask.config
    from distributed import Client

    sec = security_from_args(args)
    kw = {"timeout": args.timeout} if sec is None else {"timeout": args.timeout, "security": sec}
    if args.scheduler_file:
        if not Path(args.scheduler_file).is_file():
            raise CLIError(f"scheduler file {args.scheduler_file} does not exist: is the scheduler running, "
                           "and is the file on a filesystem this machine sees?")  # fmt: skip
        addr = json.loads(Path(args.scheduler_file).read_text()).get("address", "")
        target = {"scheduler_file": args.scheduler_file}
    else:
        addr = args.scheduler or dask.config.get("scheduler-address", None)
        if not addr:
            raise CLIError(
                "no scheduler given: pass --scheduler tls://HOST:8786 (or --scheduler-file), "
                "or set DASK_SCHEDULER_ADDRESS; `gear-flow local` starts one on this machine"
            )
        target = {"address": addr}
    tls_configured = sec is not None or dask.config.get("distributed.comm.tls.ca-file", None)
    if addr.startswith("tls://") and not tls_configured:
        raise CLIError(
            f"{addr} uses TLS: pass --tls-dir DIR (ca.pem, client.pem, client-key.pem) "
            "or --tls-ca-file/--tls-cert/--tls-key, or `source cluster/env.sh` with GEAR_FLOW_TLS_DIR set"
        )
    encrypted = sec.require_encryption if sec is not None else dask.config.get("distributed.comm.require-encryption")
    if addr and not addr.startswith("tls://") and encrypted:
        raise CLIError(
            f"{addr} is not a TLS address, but this shell requires encryption "
            "(DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION, set by `source cluster/env.sh` or --tls-dir): "
            f"use tls://{addr.split('://')[-1]} for a TLS cluster, or unset DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION "
            "for a plain-TCP one"
        )
    try:
        return Client(**target, **kw)
    except (OSError, TimeoutError) as e:
        hint = ("; with TLS, check that the certificates are signed by the cluster's CA" if addr.startswith("tls://")
                else "")  # fmt: skip
        raise CLIError(
            f"cannot reach the scheduler at {addr or args.scheduler_file} within {args.timeout} "
            f"({_first_line(e) or type(e).__name__}): is it running, and is the address right? "
            f"(--timeout to wait longer{hint})"
        ) from e


def table_names(client) -> list[str]:
    """Names of the tables registered with the scheduler ([] when gear_flow is not set up there yet)."""

    async def names():
        r = await client.scheduler.gear_flow_coord(action="list", name=None)
        return r["result"]

    try:
        return sorted(client.sync(names))
    except (KeyError, ValueError, AttributeError, TypeError):  # no coordinator handler yet: no tables
        return []


def attach(client, name: str):
    """The table ``name``, or a :class:`CLIError` listing the tables there are."""
    from .distributed import DistributedTable

    names = table_names(client)
    if name not in names:
        there = f"tables there: {', '.join(names)}" if names else "there are no tables"
        raise CLIError(
            f"no table {name!r} on {client.scheduler.address} ({there}); create it with "
            f"`gear-flow create --name {name} ...`, or check --table"
        )
    return DistributedTable.attach(name, client=client)


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
def _check_port_free(host: str, port: int, what: str) -> None:
    """A clear error now, instead of a traceback from deep inside the scheduler, for a busy port."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise CLIError(
                    f"{what} port {port} on {host} is already in use (another gear-flow local or Dask "
                    f"scheduler?): stop it, or pass --port 0 for any free port"
                ) from None
            raise CLIError(
                f"cannot listen on {host}:{port} ({e.strerror}): pass --host an address of this machine"
            ) from None


def cmd_local(args) -> int:
    from distributed import Client, LocalCluster

    from .deploy.net import http_address, join_host_port
    from .distributed.coordinator import GearFlowCoordinator
    from .distributed.preload import worker_plugin

    sec = local_security(args.tls_dir)
    protocol = args.protocol or ("tls" if sec is not None else "tcp")
    if protocol == "tls" and sec is None:
        raise CLIError("--protocol tls needs --tls-dir (cluster/tls/make_certs.py makes one)")
    if protocol == "ucx":
        import dask.config

        from .deploy.ucx import CUDA_CONTEXT_VAR, ucx_environment

        env = ucx_environment(args.host)  # no CUDA context without a GPU; UCX_NET_DEVICES=lo on loopback
        if CUDA_CONTEXT_VAR in env:
            dask.config.set({"distributed-ucxx.create-cuda-context": env.pop(CUDA_CONTEXT_VAR) == "True"})
        os.environ.update(env)  # the worker processes inherit it
    if protocol != "ucx":  # UCX binds its own way; Dask reports that clearly enough
        _check_port_free(args.host, args.port, "scheduler")
    resources = dict(parse_kind("x:" + args.resources.replace(" ", ","))["params"]) if args.resources else None
    # every listener on --host: scheduler, workers, nannies and their HTTP servers; "no dashboard"
    # means no HTTP server at all (Dask starts one regardless: the no_http preload stops it)
    dashboard = None if args.no_dashboard else http_address(args.dashboard_address, args.host, 8787)
    no_http = ["gear_flow.deploy.no_http"] if args.no_dashboard else []
    cluster = LocalCluster(
        n_workers=args.workers, threads_per_worker=args.threads, processes=True, memory_limit=args.memory_limit,
        host=args.host, scheduler_port=args.port, protocol=protocol, security=sec, resources=resources,
        dashboard_address=dashboard, worker_dashboard_address=join_host_port(args.host, 0),
        scheduler_kwargs={"dashboard": not args.no_dashboard, "preload": no_http}, preload=no_http,
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
        names = table_names(client)
        for n in names:
            print(n)
        if not names:  # stdout stays empty for scripts; say so on stderr for people
            print(f"gear-flow list: no tables on {client.scheduler.address} (create one with `gear-flow create`)",
                  file=sys.stderr)  # fmt: skip
    return 0


def cmd_info(args) -> int:
    with connect(args) as client:
        info = attach(client, args.table).info()
        print(json.dumps(info, indent=2, default=str) if args.json else format_info(info))
    return 0


def cmd_create(args) -> int:
    from . import rate_limiters, selectors
    from .distributed import DistributedTable
    from .distributed.table import workers_with_resource
    from .resources import check_resources
    from .spec import TableSpec

    doc = load_table_file(args.spec) if args.spec else {"spec": {}}
    spec = dict(doc["spec"])
    if args.columns:
        spec["columns"] = parse_columns(args.columns)
    elif args.obs_dim:
        from .ingest import episode_columns

        column_dtype(args.action_dtype, "--action-dtype")

        cols = episode_columns(tuple(args.obs_dim), args.action_dtype, tuple(args.action_shape or ()))
        spec["columns"] = [{"name": c.name, "shape": list(c.shape), "dtype": c.dtype.str} for c in cols]
    for key, value in (("capacity", args.capacity), ("num_shards", args.shards), ("item_unit", args.item_unit),
                       ("max_size", args.max_size)):  # fmt: skip
        if value is not None:
            spec[key] = value
    if "columns" not in spec or "capacity" not in spec:
        raise CLIError("give the columns (--columns, --obs-dim or a --spec file) and --capacity")
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
                check_resources(client, opts["resources"])  # a clear error when no worker has it
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


def _check_sources(sources: list[str], fmt: str | None) -> None:
    """A missing path is named as such (the format is guessed from the path, so it must exist here)."""
    import glob

    missing = [p for p in sources if not Path(p).exists() and not glob.glob(p)]
    if missing and not fmt:
        raise CLIError(
            f"{', '.join(missing)} does not exist on this machine: check the path; if only the workers "
            "see it (they read the files), pass --format minari|d4rl|parquet"
        )


def cmd_ingest(args) -> int:
    from .ingest import ingest

    _check_sources(args.source, args.format)
    with connect(args) as client:
        table = attach(client, args.table)
        source = args.source[0] if len(args.source) == 1 else args.source
        rep = ingest(table, source, args.format, gamma=args.gamma, chunk_episodes=args.chunk_episodes,
                     timeout=args.insert_timeout, client=client)  # fmt: skip
        print(f"ingested {rep.fmt} {rep.source}: read {rep.episodes_read} episodes / {rep.steps_read} steps, "
              f"stored {rep.episodes_stored} / {rep.steps_stored} in {rep.elapsed_s:.1f} s; "
              f"checksums {'match' if rep.ok else 'DIFFER: ' + '; '.join(rep.mismatches())}")  # fmt: skip
        rows = [{"shard": s, **v} for s, v in sorted(rep.shards.items())]
        print("\n".join(format_rows(rows, ["shard", "episodes", "steps"])))
        return 0 if rep.ok else 1


def cmd_sample(args) -> int:
    with connect(args) as client:
        table = attach(client, args.table)
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
    with connect(args) as client:
        attach(client, args.table).close(drop=True)
        print(f"dropped table {args.table!r}")
    return 0


def cmd_checkpoint(args) -> int:
    with connect(args) as client:
        r = attach(client, args.table).checkpoint(args.path)
        print(f"checkpoint of {args.table!r} written to {r['path']}: {r.get('bytes', 0) / 1e6:.1f} MB in "
              f"{r.get('seconds', 0):.2f} s (longest pause of a shard {1e3 * r.get('pause_s', 0):.1f} ms)")  # fmt: skip
    return 0


def cmd_restore_shard(args) -> int:
    import inspect

    with connect(args) as client:
        table = attach(client, args.table)
        kw = {"worker": args.worker}
        if args.replace:
            if "replace" not in inspect.signature(table.restore_shard).parameters:
                raise CLIError("--replace is not supported by this gear_flow's restore_shard (update gear_flow)")
            kw["replace"] = True
        report = table.restore_shard(args.shard, args.path, **kw)
        print(f"restored shard {args.shard} of {args.table!r} from {args.path}")
        for key, value in (report or {}).items():
            print(f"  {key}: {value}")
    return 0


def cmd_bench(args) -> int:
    if args.which == "table":
        return _bench_table(args)
    script = Path(__file__).resolve().parents[1] / "pipelines" / f"bench_{args.which}.py"
    if not script.is_file():
        raise CLIError(f"{script} not found: the benchmarks are scripts in the repository's "
                         "pipelines/ folder; run this from a clone installed with `pip install -e .`")  # fmt: skip
    cmd = [sys.executable, str(script)] + ([] if args.full else ["--quick"]) + list(args.extra)
    print("running", " ".join(cmd), flush=True)
    return subprocess.call(cmd)


def _bench_table(args) -> int:
    import numpy as np

    if not args.table:
        raise CLIError("bench table needs --table NAME (gear-flow list shows the tables)")
    with connect(args) as client:
        table = attach(client, args.table)
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
    p.add_argument("--debug", action="store_true", help="show tracebacks instead of one-line errors")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show tracebacks instead of one-line errors (also GEAR_FLOW_DEBUG=1)")  # fmt: skip
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    _add_parser = sub.add_parser

    def add_parser(*a, **kw):
        return _add_parser(*a, parents=[common], **kw)

    sub.add_parser = add_parser

    sp = sub.add_parser("local", formatter_class=fmt, help="start a local Dask cluster with gear_flow; print its address",
                        description="Start a Dask cluster of worker processes on this machine with gear_flow set up, "
                        "print the scheduler's address and keep running until Ctrl-C (or SIGTERM).")  # fmt: skip
    sp.add_argument("--workers", type=int, default=2, help="worker processes (default: %(default)s)")
    sp.add_argument("--threads", type=int, default=2, help="threads per worker (default: %(default)s)")
    sp.add_argument("--memory-limit", default="auto", help="memory per worker (default: %(default)s)")
    sp.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    sp.add_argument("--port", type=int, default=8786, help="scheduler port, 0 for any free port (default: %(default)s)")
    sp.add_argument("--protocol", choices=["tcp", "tls", "ucx"], help="default: tls with --tls-dir, else tcp")
    sp.add_argument(
        "--resources",
        default="replay=1,learner=1",
        help="Dask resources of each worker (default: %(default)s: shards and a co-located learner)",
    )
    sp.add_argument(
        "--dashboard-address",
        default=":8787",
        help="dashboard; without a host it listens on --host (default: %(default)s)",
    )
    sp.add_argument("--no-dashboard", action="store_true",
                    help="no HTTP server at all (no dashboard, /health or /metrics) in the scheduler and workers")  # fmt: skip
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

    sp = sub.add_parser("checkpoint", formatter_class=fmt, help="write a table's checkpoint",
                        description="Write an atomic, checksummed checkpoint of a table into directory PATH "
                        "(files 0600, directories 0700: gear-flow.checkpoint.file-mode / dir-mode). The workers "
                        "write the shard files: PATH must be on a filesystem they share with this machine.")  # fmt: skip
    _add_connection(sp)
    sp.add_argument("path", help="checkpoint directory (replaced atomically if it exists)")
    sp.add_argument("--table", required=True, help="table name")
    sp.set_defaults(func=cmd_checkpoint)

    sp = sub.add_parser("restore-shard", formatter_class=fmt, help="rebuild a lost shard from a checkpoint",
                        description="Rebuild shard SHARD of a table from checkpoint PATH on a live worker and print "
                        "what was lost (items inserted into it after the checkpoint). A shard that is still alive "
                        "is refused unless --replace, which reports what it drops.")  # fmt: skip
    _add_connection(sp)
    sp.add_argument("path", help="checkpoint directory written by `gear-flow checkpoint` or table.checkpoint()")
    sp.add_argument("--table", required=True, help="table name")
    sp.add_argument("--shard", type=int, required=True, help="the shard to rebuild")
    sp.add_argument("--worker", help="worker address to rebuild it on (default: the least loaded eligible one)")
    sp.add_argument("--replace", action="store_true", help="replace a live shard (its newer items are dropped)")
    sp.set_defaults(func=cmd_restore_shard)

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


def _first_line(e: BaseException) -> str:
    """An exception's message on one line (Dask's remote errors can carry several)."""
    return " ".join(str(e).split())


def _chain(e: BaseException):
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or (None if e.__suppress_context__ else e.__context__)


def explain(e: BaseException) -> str:
    """One line for a failed command: what, why, and what to do where we know it."""
    if isinstance(e, CLIError):  # ours already says all that
        return _first_line(e)
    for x in _chain(e):
        if isinstance(x, OSError) and x.errno == errno.EADDRINUSE or "Address already in use" in str(x):
            return f"an address is already in use ({_first_line(x)}): stop what listens there, or pick another port"
        if "encryption required by Dask configuration" in str(x):
            return (f"{_first_line(x)}: this shell requires TLS (DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION, from "
                    "cluster/env.sh or --tls-dir): use the tls:// address, or unset that variable for a TCP cluster")  # fmt: skip
    if isinstance(e, GearFlowError):
        return f"{type(e).__name__}: {_first_line(e)}"
    if isinstance(e, FileNotFoundError):
        return f"no such file or directory: {e.filename or _first_line(e)}"
    if isinstance(e, (ValueError, OSError, TimeoutError)):
        return f"{type(e).__name__}: {_first_line(e)}"
    return f"unexpected {type(e).__name__}: {_first_line(e)} (rerun with --debug for the traceback)"


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    debug = args.debug or os.environ.get("GEAR_FLOW_DEBUG", "") not in ("", "0")
    if not debug and args.cmd != "local":
        # distributed logs connection trouble as multi-line warnings; the error below says it in one
        logging.getLogger("distributed").setLevel(logging.CRITICAL)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print(f"gear-flow {args.cmd}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        if debug:
            raise
        print(f"gear-flow {args.cmd}: {explain(e)}", file=sys.stderr)
        return 2


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
