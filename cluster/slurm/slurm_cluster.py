#!/usr/bin/env python3
"""A gear_flow cluster on SLURM through dask-jobqueue.

    python cluster/slurm/slurm_cluster.py --kind gpu --jobs 4 --tls-dir /shared/certs --scheduler-file /shared/sched.json
    python cluster/slurm/slurm_cluster.py --kind gpu --dry-run        # print the job script, submit nothing

Run it on a login node (or in a small batch job) of the cluster, inside the conda
environment of ``environment.yml`` on a shared filesystem. It

1. reads ``cluster/slurm/jobqueue.yaml`` (section ``slurm-gpu`` for ``--kind gpu``,
   ``slurm`` for ``--kind cpu``) and ``cluster/config/gear-flow.yaml`` through ``dask.config``;
2. starts the scheduler in this process, with gear_flow's coordinator
   (``--preload gear_flow.distributed.preload``) and, with ``--tls-dir``, TLS;
3. submits ``--jobs`` worker jobs with ``sbatch``; each runs ``dask cuda worker`` (GPU) or
   ``dask worker`` (CPU) with the preload and the resources ``replay``/``learner``;
4. prints the scheduler's address (and writes ``--scheduler-file``), then waits until
   Ctrl-C, which cancels the jobs.

Connect from your training script with ``Client(address, security=...)`` (or
``Client(scheduler_file=...)``) and create tables with
``DistributedTable.create(client, spec, resources="replay")``.

Prerequisites: SLURM's ``sbatch``/``squeue``/``scancel`` on this node; ``pip install
gear-flow[cluster]`` (dask-jobqueue); the certificates of ``cluster/tls/make_certs.py`` on the
shared filesystem (``--hosts`` naming the login node), readable by your jobs only; workers able
to reach this node's scheduler port (``--port``) and each other.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CLUSTER_DIR = HERE.parent
SECTIONS = {"gpu": "slurm-gpu", "cpu": "slurm"}


def load_config(path: Path = HERE / "jobqueue.yaml") -> None:
    """Merge the jobqueue settings into ``dask.config`` (and point DASK_CONFIG at cluster/config)."""
    import dask.config
    import dask_jobqueue  # noqa: F401  (loads jobqueue's defaults first)
    import yaml

    os.environ.setdefault("GEAR_FLOW_CLUSTER_DIR", str(CLUSTER_DIR))  # the jobs inherit it (sbatch --export=ALL)
    os.environ.setdefault("DASK_CONFIG", str(CLUSTER_DIR / "config"))
    dask.config.refresh()
    dask.config.update(dask.config.config, yaml.safe_load(path.read_text()), priority="new")


def security(tls_dir):
    """TLS for the scheduler (this process), the workers (passed as --tls-* flags) and clients."""
    if not tls_dir:
        return None
    from distributed import Security

    d = Path(tls_dir).resolve()
    return Security(
        tls_ca_file=str(d / "ca.pem"),
        tls_scheduler_cert=str(d / "scheduler.pem"),
        tls_scheduler_key=str(d / "scheduler-key.pem"),
        tls_worker_cert=str(d / "worker.pem"),
        tls_worker_key=str(d / "worker-key.pem"),
        tls_client_cert=str(d / "client.pem"),
        tls_client_key=str(d / "client-key.pem"),
        require_encryption=True,
    )


def job_script(kind: str, tls_dir=None, scheduler: str = "tls://SCHEDULER:8786") -> str:
    """The sbatch script of one worker job, without starting a scheduler or submitting anything."""
    from dask_jobqueue.slurm import SLURMJob

    sec = security(tls_dir)
    job = SLURMJob(scheduler=scheduler, name="gear-flow-worker", config_name=SECTIONS[kind], security=sec)
    return job.job_script()


def make_cluster(kind: str, tls_dir=None, port: int = 8786, dashboard: str = "127.0.0.1:8787", ucx: bool = False):
    """A ``dask_jobqueue.SLURMCluster`` with gear_flow's scheduler setup (no jobs yet: ``.scale(jobs=N)``).

    The dashboard listens on ``dashboard`` (default: this node's loopback, reach it with
    ``ssh -L 8787:localhost:8787``; a bare ``:PORT`` would be every interface); ``"none"``: no HTTP server.
    """
    from dask_jobqueue import SLURMCluster

    if ucx and tls_dir:
        raise ValueError("UCX does not encrypt: use either --ucx or --tls-dir (see cluster/README.md, Security)")
    sec = security(tls_dir)
    opts = {"preload": ["gear_flow.distributed.preload"], "port": port}
    if str(dashboard).lower() == "none":  # Dask starts an HTTP server regardless: the preload stops it
        opts.update(dashboard=False, preload=opts["preload"] + ["gear_flow.deploy.no_http"])
    else:
        opts["dashboard_address"] = dashboard
    return SLURMCluster(
        config_name=SECTIONS[kind],
        security=sec,
        protocol="ucx://" if ucx else "tls://" if sec else "tcp://",
        scheduler_options=opts,
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="slurm_cluster.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--kind", choices=sorted(SECTIONS), default="gpu", help="GPU or CPU worker jobs (default: gpu)")
    p.add_argument("--jobs", type=int, default=1, help="worker jobs to submit (default: %(default)s)")
    p.add_argument("--tls-dir", help="certificates of cluster/tls/make_certs.py on the shared filesystem")
    p.add_argument("--ucx", action="store_true", help="UCX (InfiniBand/NVLink) instead of TCP; not with --tls-dir")
    p.add_argument("--port", type=int, default=8786, help="scheduler port (default: %(default)s)")
    p.add_argument("--dashboard", default="127.0.0.1:8787",
                   help="dashboard address (plain HTTP; default: %(default)s, reach it through ssh -L; none: no HTTP)")  # fmt: skip
    p.add_argument("--scheduler-file", help="write the scheduler's address here (JSON, for Client(scheduler_file=...))")
    p.add_argument("--wait-workers", type=int, default=0, help="wait for this many workers before printing 'ready'")
    p.add_argument("--dry-run", action="store_true", help="print the job script and exit; submit nothing")
    args = p.parse_args(argv)
    if args.ucx and args.tls_dir:
        p.error("UCX does not encrypt: use either --ucx or --tls-dir (see cluster/README.md, Security)")
    load_config()
    if args.dry_run:
        addr = f"{'ucx' if args.ucx else 'tls' if args.tls_dir else 'tcp'}://SCHEDULER_HOST:{args.port}"
        print(job_script(args.kind, args.tls_dir, addr))
        return 0

    from distributed import Client

    cluster = make_cluster(args.kind, args.tls_dir, args.port, args.dashboard, args.ucx)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    try:
        cluster.scale(jobs=args.jobs)
        with Client(cluster, security=security(args.tls_dir)) as client:
            if args.scheduler_file:
                client.write_scheduler_file(args.scheduler_file)
            print(f"scheduler at {cluster.scheduler_address}; dashboard {cluster.dashboard_link}", flush=True)
            if args.wait_workers:
                client.wait_for_workers(args.wait_workers)
            print(f"ready: {args.jobs} {args.kind} job(s) submitted; Ctrl-C cancels them", flush=True)
            while not stop:
                time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        cluster.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
