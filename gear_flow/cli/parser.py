"""The ``gear-flow`` argument parser: every command, its options and help texts."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from ..spec import BOUNDARIES
from .commands import (
    cmd_bench,
    cmd_checkpoint,
    cmd_create,
    cmd_drop,
    cmd_info,
    cmd_ingest,
    cmd_list,
    cmd_local,
    cmd_rebalance,
    cmd_restore_shard,
    cmd_sample,
)
from .connect import _add_connection

QUICKSTART = """\
Start here (one machine; on a cluster see docs/deployment.md, "Running on a cluster"):

  gear-flow local --workers 2 --port 8786              # terminal 1: a cluster, until Ctrl-C
  export DASK_SCHEDULER_ADDRESS=tcp://127.0.0.1:8786   # terminal 2: the commands below use it
  python pipelines/make_dataset.py --out data/cartpole --episodes 100
  gear-flow create --name replay --obs-dim 4 --capacity 100000
  gear-flow ingest --table replay data/cartpole/minari/cartpole-mixed-v0
  gear-flow info --table replay
  gear-flow sample --table replay --batch-size 32 --length 8
  gear-flow bench local                                # benchmarks (--quick sizes), to ./bench_local.json

With TLS (cluster/tls/make_certs.py), add --tls-dir DIR to every command, or
`source cluster/env.sh` once: it exports the certificates in Dask's configuration.
"""


def _whole(lo: int, hi: int | None, why: str) -> Callable[[str], int]:
    """An argument type: a whole number from ``lo`` to ``hi`` (None: no bound), else ``why`` names the range."""

    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if n < lo or (hi is not None and n > hi):
            raise argparse.ArgumentTypeError(f"{n} {why}")
        return n

    return parse


#: processes or threads (0 is no default here); a TCP port to listen on
_count = _whole(1, None, "must be at least 1")
_port = _whole(0, 65535, "is not a port (0 for any free one, up to 65535)")


class _Parser(argparse.ArgumentParser):
    """argparse with its errors in one line, as every other ``gear-flow`` error (``--help`` shows the
    usage); its sub-commands' parsers are of this class too."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    """The ``gear-flow`` parser: one subcommand per ``cmd_*`` function, each with the connection options.

    Returns
    -------
    argparse.ArgumentParser
        Parsing sets ``args.cmd`` (the command's name) and ``args.func`` (its
        ``cmd_*`` function, called with the parsed arguments).
    """
    fmt = argparse.RawDescriptionHelpFormatter
    p = _Parser(
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
    sp.add_argument("--workers", type=_count, help="worker processes (default: 2; with --gpu one per GPU)")
    sp.add_argument("--threads", type=_count, help="threads per worker (default: 2; with --gpu 1)")
    sp.add_argument("--gpu", action="store_true",
                    help="a dask-cuda LocalCUDACluster: one worker per GPU (needs dask-cuda and a GPU)")  # fmt: skip
    sp.add_argument("--rmm-pool-size",
                    help="with --gpu: RMM pool per worker, e.g. 0.8 (of device memory) or 40GB; CuPy allocates from "
                    "it (default: gear-flow.gpu.rmm-pool-size, none)")  # fmt: skip
    sp.add_argument("--memory-limit", default="auto", help="memory per worker (default: %(default)s)")
    sp.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    sp.add_argument(
        "--port", type=_port, default=8786, help="scheduler port, 0 for any free port (default: %(default)s)"
    )
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
    g.add_argument(
        "--remover", help="eviction policy, KIND[:K=V,...] (default and only one ring storage honours: fifo)"
    )
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

    sp = sub.add_parser("rebalance", formatter_class=fmt, help="spread a table's shards evenly over the workers",
                        description="Move whole shards of a table from the workers holding the most to those "
                        "holding the fewest (workers with the table's resource and memory room, new ones "
                        "included) until the counts differ by at most one; each move is all or nothing and keeps "
                        "the shard's keys. Prints every move.")  # fmt: skip
    _add_connection(sp)
    sp.add_argument("--table", required=True, help="table name")
    sp.set_defaults(func=cmd_rebalance)

    sp = sub.add_parser("bench", formatter_class=fmt, help="run a benchmark",
                        description="local: pipelines/bench_local.py (in-process tables vs memcpy, TorchRL); "
                        "distributed: pipelines/bench_distributed.py (its own LocalClusters); both with --quick "
                        "sizes unless --full. table: sample throughput of a live table on a cluster.",
                        epilog="examples:\n  gear-flow bench local\n  gear-flow bench distributed --full -- --repeat 10\n"
                        "  gear-flow bench table --scheduler tls://10.0.0.5:8786 --tls-dir certs --table replay")  # fmt: skip
    sp.add_argument("which", choices=["local", "distributed", "table"], help="which benchmark")
    sp.add_argument("--full", action="store_true", help="local/distributed: the reference sizes (minutes)")
    sp.add_argument("--out", metavar="PATH", help="local/distributed: where the script writes its JSON (default: "
                    "./bench_<which>.json; the recorded benchmarks/results/ are written only by running "
                    "python pipelines/bench_<which>.py itself)")  # fmt: skip
    sp.add_argument("extra", nargs="*", help="local/distributed: more arguments for the script (after --)")
    _add_connection(sp)
    g = sp.add_argument_group("table")
    g.add_argument("--table", help="table name")
    g.add_argument("--batch-size", type=int, default=256, help="default: %(default)s")
    g.add_argument("--length", type=int, default=64, help="default: %(default)s")
    g.add_argument("--batches", type=int, default=20, help="batches timed (default: %(default)s)")
    sp.set_defaults(func=cmd_bench)
    return p
