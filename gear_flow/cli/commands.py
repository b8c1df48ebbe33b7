"""The ``gear-flow`` commands, one function each (``args`` from :func:`~gear_flow.cli.parser.build_parser`)."""

from __future__ import annotations

import argparse
import errno
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from ..spec import column_dtype
from .connect import attach, connect, local_security, table_names
from .errors import CLIError
from .text import format_info, format_rows, load_table_file, parse_columns, parse_kind


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


def cmd_local(args: argparse.Namespace) -> int:
    """Start a one-machine cluster with gear_flow installed and serve until Ctrl-C or SIGTERM.

    Parameters
    ----------
    args : argparse.Namespace
        The options of ``gear-flow local --help``, as :func:`~gear_flow.cli.parser.build_parser` parses them.

    Returns
    -------
    int
        Exit status: 0 once the cluster has stopped.
    """
    from distributed import Client

    from ..deploy.local import local_cluster, local_cuda_cluster

    sec = local_security(args.tls_dir)
    protocol = args.protocol or ("tls" if sec is not None else "tcp")
    if protocol == "tls" and sec is None:
        raise CLIError("--protocol tls needs --tls-dir (cluster/tls/make_certs.py makes one)")
    if args.rmm_pool_size is not None and not args.gpu:
        raise CLIError("--rmm-pool-size is for GPU workers: add --gpu")
    resources = _resources(args.resources)
    if protocol != "ucx":  # UCX binds its own way; Dask reports that clearly enough
        _check_port_free(args.host, args.port, "scheduler")
    common = {"memory_limit": args.memory_limit, "host": args.host, "port": args.port, "protocol": protocol,
              "security": sec, "resources": resources, "dashboard_address": args.dashboard_address,
              "no_dashboard": args.no_dashboard}  # fmt: skip
    # both load gear_flow's preload on the scheduler and the workers: coordinator, worker plugin, /gear-flow page
    if args.gpu:  # one worker per GPU unless --workers says otherwise; 1 thread each, as dask-cuda
        threads = args.threads or 1
        cluster = local_cuda_cluster(args.workers, threads_per_worker=threads, rmm_pool_size=args.rmm_pool_size,
                                     **common)  # fmt: skip
    else:
        threads = args.threads or 2
        cluster = local_cluster(args.workers or 2, threads, **common)
    stop = []

    def on_signal(signum, frame):
        stop.append(signum)

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with Client(cluster, security=sec):
            if args.scheduler_file:
                Path(args.scheduler_file).write_text(json.dumps({"address": cluster.scheduler_address}))
            print(f"gear-flow local: scheduler at {cluster.scheduler_address}", flush=True)
            if cluster.dashboard_link and not args.no_dashboard:
                print(f"gear-flow local: dashboard at {cluster.dashboard_link} (tables: /gear-flow)", flush=True)
            print(f"gear-flow local: {len(cluster.workers)} {'GPU ' if args.gpu else ''}worker(s) x {threads} thread(s)"
                  + (f", resources {resources}" if resources else "") + "; Ctrl-C stops it", flush=True)  # fmt: skip
            while not stop:
                time.sleep(0.2)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        cluster.close(timeout=30)
    print("gear-flow local: stopped", flush=True)
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    """Print the names of the cluster's tables, one a line.

    Parameters
    ----------
    args : argparse.Namespace
        The options of ``gear-flow list --help``, as :func:`~gear_flow.cli.parser.build_parser` parses them.

    Returns
    -------
    int
        Exit status: 0 (an empty cluster says so on stderr, stdout stays empty).
    """
    with connect(args) as client:
        names = table_names(client)
        for n in names:
            print(n)
        if not names:  # stdout stays empty for scripts; say so on stderr for people
            print(f"gear-flow list: no tables on {client.scheduler.address} (create one with `gear-flow create`)",
                  file=sys.stderr)  # fmt: skip
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    """Print a table's ``info()``: a summary table, or JSON with ``--json``.

    Parameters
    ----------
    args : argparse.Namespace
        The options of ``gear-flow info --help``, as :func:`~gear_flow.cli.parser.build_parser` parses them.

    Returns
    -------
    int
        Exit status: 0.
    """
    with connect(args) as client:
        info = attach(client, args.table).info()
        print(json.dumps(info, indent=2, default=str) if args.json else format_info(info))
    return 0


def cmd_create(args: argparse.Namespace) -> int:
    """Create a distributed table from ``--columns``, ``--obs-dim`` or a ``--spec`` file, and print its info.

    Parameters
    ----------
    args : argparse.Namespace
        The options of ``gear-flow create --help``, as :func:`~gear_flow.cli.parser.build_parser` parses them. Command-line values win over the ``--spec`` file's; without ``--shards``, one shard per eligible worker.

    Returns
    -------
    int
        Exit status: 0.
    """
    from .. import rate_limiters, selectors
    from ..distributed import DistributedTable
    from ..parsing import default_num_shards
    from ..spec import TableSpec

    doc = load_table_file(args.spec) if args.spec else {"spec": {}}
    spec = dict(doc["spec"])
    if args.columns:
        spec["columns"] = parse_columns(args.columns)
    elif args.obs_dim:
        from ..ingest import episode_columns

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
    # built before connecting: a bad kind or parameter is the user's one-line error, with no cluster needed
    parts = {key: reg.from_config(opts[key]) for key, reg in (("sampler", selectors), ("remover", selectors),
             ("rate_limiter", rate_limiters)) if key in opts}  # fmt: skip
    with connect(args) as client:
        if "num_shards" not in spec:  # one shard per worker it can go on
            spec["num_shards"] = default_num_shards(client, opts.get("workers"), opts.get("resources"))
        spec.setdefault("item_unit", "step")
        spec.setdefault("max_size", None)
        kw = {k: opts[k] for k in ("name", "boundary", "tier", "routing", "timeout", "resources", "workers",
                                   "max_times_sampled", "degraded") if k in opts}  # fmt: skip
        kw.update(parts)
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


def cmd_ingest(args: argparse.Namespace) -> int:
    """Ingest an offline dataset into a table (:func:`gear_flow.ingest.ingest`) and print the report.

    Parameters
    ----------
    args : argparse.Namespace
        The options of ``gear-flow ingest --help``, as :func:`~gear_flow.cli.parser.build_parser` parses them.

    Returns
    -------
    int
        Exit status: 0 when the checksums of what was read and what is stored match, else 1.
    """
    from ..ingest import ingest
    from ..ingest.columns import parse_columns

    _check_sources(args.source, args.format)
    cmap = parse_columns(args.columns, layout=args.layout, episode=args.episode_column, step=args.step_column,
                         no_truncation=args.no_truncation_column)  # fmt: skip
    with connect(args) as client:
        table = attach(client, args.table)
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


def cmd_sample(args: argparse.Namespace) -> int:
    """Sample one batch and print its columns' shapes and dtypes, the time taken and the probabilities' range.

    Parameters
    ----------
    args : argparse.Namespace
        The options of ``gear-flow sample --help``, as :func:`~gear_flow.cli.parser.build_parser` parses them.

    Returns
    -------
    int
        Exit status: 0.
    """
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


def cmd_drop(args: argparse.Namespace) -> int:
    """Close a table and free its shards on every worker.

    Parameters
    ----------
    args : argparse.Namespace
        The options of ``gear-flow drop --help``, as :func:`~gear_flow.cli.parser.build_parser` parses them.

    Returns
    -------
    int
        Exit status: 0.
    """
    with connect(args) as client:
        attach(client, args.table).close(drop=True)
        print(f"dropped table {args.table!r}")
    return 0


def cmd_checkpoint(args: argparse.Namespace) -> int:
    """Checkpoint a table to a directory the workers can write, and print size, time and the longest shard pause.

    Parameters
    ----------
    args : argparse.Namespace
        The options of ``gear-flow checkpoint --help``, as :func:`~gear_flow.cli.parser.build_parser` parses them.

    Returns
    -------
    int
        Exit status: 0.
    """
    with connect(args) as client:
        r = attach(client, args.table).checkpoint(args.path)
        print(f"checkpoint of {args.table!r} written to {r['path']}: {r.get('bytes', 0) / 1e6:.1f} MB in "
              f"{r.get('seconds', 0):.2f} s (longest pause of a shard {1e3 * r.get('pause_s', 0):.1f} ms)")  # fmt: skip
    return 0


def cmd_restore_shard(args: argparse.Namespace) -> int:
    """Restore one shard of a table from a checkpoint (after a lost worker).

    Parameters
    ----------
    args : argparse.Namespace
        The options of ``gear-flow restore-shard --help``, as :func:`~gear_flow.cli.parser.build_parser` parses them.

    Returns
    -------
    int
        Exit status: 0.
    """
    with connect(args) as client:
        table = attach(client, args.table)
        report = table.restore_shard(args.shard, args.path, worker=args.worker, replace=args.replace)
        print(f"restored shard {args.shard} of {args.table!r} from {args.path}")
        for key, value in (report or {}).items():
            print(f"  {key}: {value}")
    return 0


def cmd_rebalance(args: argparse.Namespace) -> int:
    """Even out a table's shards over the workers (:meth:`DistributedTable.rebalance`) and print each move.

    Parameters
    ----------
    args : argparse.Namespace
        The options of ``gear-flow rebalance --help``, as :func:`~gear_flow.cli.parser.build_parser` parses them.

    Returns
    -------
    int
        Exit status: 0.
    """
    with connect(args) as client:
        moves = attach(client, args.table).rebalance()
        for m in moves:
            print(f"shard {m['shard']}: {m['source']} -> {m['destination']}")
        print(f"table {args.table!r}: {len(moves)} shard(s) moved" + ("" if moves else " (already balanced)"))
    return 0


def _resources(text: str | None) -> dict | None:
    """``--resources "replay=1,learner=1"`` (commas or spaces) as the workers' Dask resources, or None."""
    if not text:
        return None
    try:  # the KEY=VALUE list of a KIND:KEY=VALUE,... option; errors quote what the user typed, not that form
        res = parse_kind("resources:" + text.replace(" ", ","))["params"]
    except ValueError:
        res = {}
    if not res or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in res.values()):
        raise CLIError(f"--resources {text!r}: give NAME=AMOUNT pairs (numbers), e.g. --resources replay=1,learner=1")
    return dict(res)


def cmd_bench(args: argparse.Namespace) -> int:
    """Run a benchmark: ``table`` times batches of an existing table here; the others run ``pipelines/bench_<which>.py``.

    The scripts write their JSON to ``--out`` (default ``./bench_<which>.json``), never to the
    repository's recorded ``benchmarks/results/``: recording those stays ``python pipelines/bench_<which>.py``.

    Parameters
    ----------
    args : argparse.Namespace
        The options of ``gear-flow bench --help``, as :func:`~gear_flow.cli.parser.build_parser` parses them.

    Returns
    -------
    int
        Exit status: The script's exit status, or 0 for ``table``.
    """
    if args.which == "table":
        return _bench_table(args)
    script = Path(__file__).resolve().parents[2] / "pipelines" / f"bench_{args.which}.py"
    if not script.is_file():
        raise CLIError(f"{script} not found: the benchmarks are scripts in the repository's "
                         "pipelines/ folder; run this from a clone installed with `pip install -e .`")  # fmt: skip
    # the scripts' own default is benchmarks/results/, the recorded numbers the docs draw from; a run from
    # here (quick sizes by default) must not replace them, so it writes where --out says (./bench_<which>.json)
    out = Path(args.out or f"bench_{args.which}.json").resolve()
    cmd = [sys.executable, str(script)] + ([] if args.full else ["--quick"]) + ["--out", str(out)] + list(args.extra)
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
