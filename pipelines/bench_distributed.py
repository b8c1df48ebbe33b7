"""Distributed benchmark: the reference workload on a LocalCluster.

Reports, in one run:

* each of four data planes: ``shared`` (shards in shared memory, read by
  every process on the machine, which draws its batches itself from the
  shards' published selection state), ``shared_owner`` (the same, the
  owners drawing, over the fast lanes), ``tcp`` (shared
  memory off: what another host sees by default, draws and their windows over
  the workers' TCP lanes) and ``comm`` (shared memory and TCP lanes off:
  Dask's comm only);
* external learner: GB/s of windows delivered to the client process, against
  a raw Dask transfer of the same bytes from the same workers (NumPy arrays
  held by each worker, an equal share each as the batch draws them, fetched
  together with ``client.gather``) — targets: shared >= 5x (and
  >= 0.8x a memcpy in the client), tcp and comm >= 0.9x;
* co-located learner: a task on a worker sampling the table (its shard read
  in-process without copies), against a single-thread ``np.copyto`` of the
  same bytes measured in that worker — target >= 0.8x;
* per-batch overhead (a 1-window batch) vs the local table and one Dask comm
  round trip, the two timed in turn round by round — target (tcp, comm) <= 1.2x;
* insert from the client: GB/s of episodes inserted (``insert_batch``
  episodes per call, warm rings), against ``client.scatter(direct=True)`` of
  the same episodes to the same workers, timed alternately in the same loop —
  target >= 0.8x;
* actor insert: a task on a worker inserting episodes it made into that
  worker's own shards (in-process, no comm for the data), against a
  single-thread ``np.copyto`` of the same bytes into a cold destination in
  that worker — target >= 0.5x;
* scaling with 1 and 2 workers;
* two co-located learners, one per worker, sampling the same table at once,
  against one learner alone on the same cluster — target >= 1.6x;
* the comm plane over UCX (distributed-ucxx) beside TCP: the external learner
  with 1 and 2 workers against a raw Dask transfer over the same UCX cluster —
  target >= 0.9x (``--no-ucx`` skips it; a row says why when UCX cannot start);
* the transport choice: a comm-handler round trip (what the shards use) vs a
  Dask actor method call, for a tiny and a 17 MB reply.

Usage::

    python pipelines/bench_distributed.py [--quick] [--no-ucx] [--out PATH]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    alternate,
    make_episodes,
    memcpy_gbps,
    memcpy_step,
    print_table,
    raw_dask_step,
    reference_columns,
    reference_options,
    stream_gbps,
    timeit,
    write_json,
)
from learner_scaling import learners_rows, learners_scaling  # noqa: E402
from ucx_plane import run_ucx  # noqa: E402

import gear_flow as gf  # noqa: E402


def _colocated(name, B, L, repeat, pool_bytes):
    """Runs on a worker: sample from the table with the worker's shard read in-process."""
    import numpy as np

    import gear_flow as gf
    from gear_flow.distributed import DistributedTable

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from common import memcpy_gbps, stream_gbps, timeit

    t = DistributedTable.attach(name, seed=0)
    out = gf.SampleBuffers(t.spec, t.spec.names, B, L)
    ts = timeit(lambda: t.sample(B, L, out=out), repeat)
    nbytes = sum(a.nbytes for a in out.arrays.values())
    return {
        "stream_gbps": stream_gbps(t, B, L, repeat * 2),  # admission hidden behind the gather
        "gbps": nbytes / float(np.median(ts)) / 1e9,
        # in a block (see the external learner's)
        "memcpy_gbps": memcpy_gbps(nbytes, repeat=repeat, pool_bytes=pool_bytes),
        "local_shards": t.local_shards,
        "local_bytes": t.stats["local_bytes"],
        "remote_bytes": t.stats["remote_bytes"],
        "shared_bytes": t.stats["shared_bytes"],
        "in_thread": t.stats["in_thread"],
    }


def _actor_insert(name, n_episodes, episode_length, insert_batch, repeat, pool_bytes):
    """Runs on a worker: insert episodes made here into this worker's own shards (no comm for the data).

    Timed alternately with a single-thread copy of the same bytes into a cold
    destination (the ring an insert writes is one), so that the machine's
    load weighs on both alike.
    """
    import time

    import numpy as np

    from gear_flow.distributed import DistributedTable

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from common import make_episodes

    t = DistributedTable.attach(name, seed=0)
    eps = make_episodes(n_episodes, episode_length, seed=1)
    groups = [eps[i : i + insert_batch] for i in range(0, len(eps), insert_batch)]
    nbytes = sum(a.nbytes for e in groups[0] for a in e.values())
    copy = memcpy_step(nbytes, pool_bytes, cold_dst=True)
    shards = set()
    ti, tc = [], []
    for i in range(repeat + 2):
        t0 = time.perf_counter()
        shards.update(t.insert(groups[i % len(groups)]).shards.tolist())
        t1 = time.perf_counter()
        copy()
        if i >= 2:
            ti.append(t1 - t0)
            tc.append(time.perf_counter() - t1)
    return {
        "gbps": nbytes / float(np.median(ti)) / 1e9,
        "memcpy_gbps": nbytes / float(np.median(tc)) / 1e9,
        # the fastest call of each: how far the medians are from what the machine allows when quiet
        "gbps_best": nbytes / min(ti) / 1e9,
        "memcpy_gbps_best": nbytes / min(tc) / 1e9,
        "bytes_per_call": nbytes,
        "local_shards": t.local_shards,
        "shards": sorted(shards),
        "insert_local_bytes": t.stats["insert_local_bytes"],
        "insert_remote_bytes": t.stats["insert_remote_bytes"],
        "insert_in_thread": t.stats["insert_in_thread"],  # calls written in this thread (a lane to the coordinator)
    }


def insert_throughput(client, table, eps, args, workers):
    """Insert from the client (vs a direct scatter of the same bytes) and from an actor task (vs memcpy).

    Runs on a filled table, so rings are warm and every insert evicts as much
    as it adds (the steady state of a replay buffer).
    """
    from distributed import wait

    groups = [eps[i : i + args.insert_batch] for i in range(0, len(eps), args.insert_batch)]
    nbytes = sum(a.nbytes for e in groups[0] for a in e.values())
    addrs = sorted(client.nthreads())
    k = iter(range(1 << 62))

    def insert():
        table.insert(groups[next(k) % len(groups)])

    def scatter():  # the same episodes, one piece per worker as the insert spreads them, client -> worker
        g = groups[next(k) % len(groups)]
        pieces = [g[i :: len(addrs)] for i in range(len(addrs))]
        fs = client.scatter(pieces, workers=addrs, direct=True, hash=False)
        wait(fs)

    ti, tr = [], []
    for i in range(args.repeat + 2):  # alternately, so that the machine's load weighs on both alike
        for fn, out in ((insert, ti), (scatter, tr)):
            t = time.perf_counter()
            fn()
            if i >= 2:
                out.append(time.perf_counter() - t)
    res = {
        "insert_client_gbps": nbytes / float(np.median(ti)) / 1e9,
        "scatter_gbps": nbytes / float(np.median(tr)) / 1e9,
        "insert_client_gbps_best": nbytes / min(ti) / 1e9,
        "scatter_gbps_best": nbytes / min(tr) / 1e9,
        "insert_bytes_per_call": nbytes,
    }
    res["insert_client_ratio"] = res["insert_client_gbps"] / res["scatter_gbps"]
    a = client.submit(
        _actor_insert,
        table.name,
        max(2 * args.insert_batch, len(eps) // 4),
        args.episode_length,
        args.insert_batch,
        args.repeat,
        args.memcpy_pool_mb << 20,
        workers=[addrs[0]],
        pure=False,
    ).result()
    res["actor_insert"] = a
    res["actor_insert_ratio"] = a["gbps"] / a["memcpy_gbps"]
    return res


def insert_rows(res, tag):
    """Table rows of :func:`insert_throughput`."""
    a = res["actor_insert"]
    return [
        {
            "path": f"insert from client, {tag}",
            "GB/s": res["insert_client_gbps"],
            "ratio": res["insert_client_ratio"],
            "ref": f"scatter(direct) {res['scatter_gbps']:.3g} GB/s",
            "target": ">= 0.8",
        },
        {
            "path": f"actor insert (own shards), {tag}",
            "GB/s": a["gbps"],
            "ratio": res["actor_insert_ratio"],
            "ref": f"memcpy {a['memcpy_gbps']:.3g} GB/s",
            "target": ">= 0.5",
        },
    ]


class _Echo:
    """Actor used to compare transports."""

    def __init__(self, n):
        self.buf = np.ones(n, np.uint8)

    def get(self, k):
        return self.buf[:k]


def run(workers: int, plane: str, args, eps, rows, results):
    import dask
    from distributed import Client, LocalCluster

    from gear_flow.distributed import DistributedTable

    B, L = args.batch_size, args.length
    cols = reference_columns()
    step_bytes = sum(c.nbytes for c in cols)
    steps = sum(len(e["reward"]) for e in eps)
    batch_bytes = B * L * step_bytes
    res = {}
    # set for the whole run, workers included (they inherit it): with shared memory off every process acts as if
    # on another machine, reaching workers and the coordinator over their TCP lanes ("tcp") or the comm ("comm")
    shared = plane in ("shared", "shared_owner")
    plane_config = {
        "gear-flow.distributed.shared-memory": shared,
        "gear-flow.distributed.tcp-lane": plane != "comm",
        "gear-flow.distributed.reader-draw": plane != "shared_owner",
    }
    with (
        dask.config.set(plane_config),
        LocalCluster(n_workers=workers, threads_per_worker=2, processes=True, dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):
        spec = gf.TableSpec(cols, capacity=steps // workers + args.episode_length, num_shards=workers)
        table = DistributedTable.create(client, spec, sampler=gf.Uniform(), seed=0, name=f"bench{workers}")
        t0 = time.perf_counter()
        for i in range(0, len(eps), args.insert_batch):
            table.insert(eps[i : i + args.insert_batch])
        res["insert_gbps"] = steps * step_bytes / (time.perf_counter() - t0) / 1e9

        addrs = sorted(client.nthreads())
        w0 = addrs[0]
        out = gf.SampleBuffers(spec, spec.names, B, L)
        # timed in blocks, not in turn with the batch: a batch's parallel gather leaves this process's
        # OpenMP threads spinning for milliseconds (GNU OpenMP's default), which would slow a reference
        # timed right after it (a memcpy here ran at 5 GB/s that way, against 15-25 in a block)
        tr = [raw_dask_step(client, addrs, batch_bytes)() for _ in range(args.repeat)]
        res["raw_dask_gbps"] = batch_bytes / float(np.median(tr)) / 1e9
        ts = timeit(lambda: table.sample(B, L, out=out), args.repeat)
        res["external_gbps"] = batch_bytes / float(np.median(ts)) / 1e9
        res["external_ratio"] = res["external_gbps"] / res["raw_dask_gbps"]
        pool = args.memcpy_pool_mb << 20
        res["memcpy_gbps"] = memcpy_gbps(batch_bytes, repeat=args.repeat, pool_bytes=pool)  # in the learner's process
        res["external_memcpy_ratio"] = res["external_gbps"] / res["memcpy_gbps"]
        res["stats"] = dict(table.stats)
        res["stream_gbps"] = stream_gbps(table, B, L, 2 * args.repeat)

        co = client.submit(_colocated, table.name, B, L, args.repeat, pool, workers=[w0], pure=False).result()
        res["colocated"] = co
        res["colocated_ratio"] = co["gbps"] / co["memcpy_gbps"]
        res["colocated_stream_ratio"] = co["stream_gbps"] / co["memcpy_gbps"]
        if workers == 2:
            res["learners"] = learners_scaling(
                client, table.name, B, L, batch_bytes, 2 * args.repeat, args.learner_rounds
            )

        small = gf.SampleBuffers(spec, spec.names, 1, 1)

        async def ping():  # one comm round trip to a worker, from this thread as table.sample goes
            return await client.rpc(w0).identity()

        # in turn, round by round (a 1-window batch gathers on one thread): drift weighs on both alike
        ts, tp = alternate([lambda: table.sample(1, 1, out=small), lambda: client.sync(ping)], args.repeat * 3)
        res["batch_overhead_ms"] = 1e3 * float(np.median(ts))
        res["comm_rtt_ms"] = 1e3 * float(np.median(tp))
        res["batch_overhead_rtt_ratio"] = res["batch_overhead_ms"] / res["comm_rtt_ms"]

        if workers == 1 and plane == "comm":
            n17 = batch_bytes
            actor = client.submit(_Echo, n17, actor=True, workers=[w0]).result()
            ta = timeit(lambda: actor.get(1).result(), args.repeat)
            tb = timeit(lambda: actor.get(n17).result(), args.repeat)
            hp = timeit(lambda: table.info(), args.repeat)  # a handler round trip per worker + coordinator
            res["transport"] = {
                "actor_ping_ms": 1e3 * float(np.median(ta)),
                "actor_batch_ms": 1e3 * float(np.median(tb)),
                "handler_sample_batch_ms": 1e3
                * float(np.median(timeit(lambda: table.sample(B, L, out=out), args.repeat))),
                "handler_info_ms": 1e3 * float(np.median(hp)),
            }
        res.update(insert_throughput(client, table, eps, args, workers))
        table.close()
    results[f"workers_{workers}_{plane}"] = res
    tag = f"{workers}w, {plane}"
    rows.append(
        {
            "path": f"external learner, {tag}",
            "GB/s": res["external_gbps"],
            "ratio": res["external_ratio"],
            "ref": f"raw Dask {res['raw_dask_gbps']:.3g} GB/s",
            "target": ">= 5" if shared else ">= 0.9",
        }
    )
    if shared:
        rows.append(
            {
                "path": f"external learner vs memcpy, {tag}",
                "GB/s": res["external_gbps"],
                "ratio": res["external_memcpy_ratio"],
                "ref": f"memcpy {res['memcpy_gbps']:.3g} GB/s",
                "target": ">= 0.8",
            }
        )
    rows.append(
        {
            "path": f"external learner + Stream(prefetch=2), {tag}",
            "GB/s": res["stream_gbps"],
            "ratio": res["stream_gbps"] / res["raw_dask_gbps"],
        }
    )
    rows.append(
        {
            "path": f"co-located learner, {tag}",
            "GB/s": co["gbps"],
            "ratio": res["colocated_ratio"],
            "ref": f"memcpy {co['memcpy_gbps']:.3g} GB/s",
            "target": ">= 0.8",
        }
    )
    rows.append(
        {
            "path": f"co-located learner + Stream(prefetch=2), {tag}",
            "GB/s": co["stream_gbps"],
            "ratio": res["colocated_stream_ratio"],
            "ref": "same memcpy",
        }
    )
    if "learners" in res:
        learners_rows(tag, res["learners"], rows)
    rows.append(
        {
            "path": f"per-batch overhead (B=1, L=1), {tag}",
            "ms": res["batch_overhead_ms"],
            "ratio": res["batch_overhead_rtt_ratio"],
            "ref": f"one comm round trip {res['comm_rtt_ms']:.3g} ms",
            "target": "<= 1.2" if not shared else "",
        }
    )
    rows.append({"path": f"insert, first fill (cold rings), {tag}", "GB/s": res["insert_gbps"]})
    rows.extend(insert_rows(res, tag))


def _preload_forked_workers() -> None:
    """With workers forked from a server (``distributed.worker.multiprocessing-method: forkserver``), the
    server imports what every worker here imports (torch for its batches, the worker plugin) once, where
    each of the run's clusters' workers would import it again (a few seconds of CPU each).  Importing torch
    loads GNU OpenMP, which reads its spin count then: the server starts with the count the worker plugin
    gives a spawned worker (:func:`gear_flow.distributed.openmp.short_spin`), so that forked workers wait as
    spawned ones do.  Dask's default, spawn, is left as it is."""
    import multiprocessing.forkserver
    import os

    import dask
    from distributed.utils import get_mp_context

    from gear_flow.distributed.openmp import short_spin

    if dask.config.get("distributed.worker.multiprocessing-method") != "forkserver":
        return
    # (Dask's own list, set by get_mp_context, is distributed and the packages it imports)
    get_mp_context().set_forkserver_preload(["distributed", "numpy", "pandas", "torch", "gear_flow.distributed.plugin"])
    saved = dict(os.environ)
    try:
        short_spin()  # in this process's environment, which the server starts with, and only for it
        multiprocessing.forkserver.ensure_running()
    finally:
        os.environ.clear()
        os.environ.update(saved)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    reference_options(p)
    p.add_argument("--insert-batch", type=int, default=10)
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--quick", action="store_true")
    p.add_argument(
        "--memcpy-pool-mb", type=int, default=256, help="MiB the memcpy references copy from (larger than the caches)"
    )
    p.add_argument("--learner-rounds", type=int, default=3, help="rounds of the one-vs-two learners measurement")
    p.add_argument("--no-ucx", action="store_true", help="skip the comm plane over UCX")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if args.quick:
        args.episodes, args.episode_length, args.repeat, args.insert_batch = 10, 200, 2, 5
        # what --quick checks is that every path runs and reports, not how fast: a pool this small sits in
        # the caches, but making 256 MiB of random bytes costs a second per reference (16x the 1 MB insert)
        args.memcpy_pool_mb = 16
        args.batch_size, args.length = 32, 16
        args.learner_rounds = 1
    _preload_forked_workers()
    eps = make_episodes(args.episodes, args.episode_length)
    rows, results = [], {"args": vars(args)}
    local = gf.LocalTable(gf.TableSpec(reference_columns(), capacity=args.episodes * args.episode_length), seed=0)
    local.insert(eps)
    small = gf.SampleBuffers(local.spec, local.spec.names, 1, 1)
    results["local_batch_overhead_ms"] = 1e3 * float(
        np.median(timeit(lambda: local.sample(1, 1, out=small), args.repeat * 3))
    )
    rows.append({"path": "per-batch overhead (B=1, L=1), LocalTable", "ms": results["local_batch_overhead_ms"]})
    results["memcpy_batch_gbps"] = memcpy_gbps(
        args.batch_size * args.length * sum(c.nbytes for c in reference_columns()), pool_bytes=args.memcpy_pool_mb << 20
    )
    local = None
    for w in (1, 2):
        for plane in ("shared", "shared_owner", "tcp", "comm"):
            run(w, plane, args, eps, rows, results)
    for w in (1, 2):
        if args.quick and w == 1:  # a UCX cluster costs ~15 s here; --quick runs the 2-worker one only
            results["workers_1_comm_ucx"] = {"skipped": "--quick"}
            continue
        run_ucx(w, args, eps, rows, results)
    tr = results["workers_1_comm"].get("transport")
    if tr:
        rows.append({"path": "transport: actor call, tiny reply", "ms": tr["actor_ping_ms"]})
        rows.append({"path": "transport: actor call, one batch of bytes", "ms": tr["actor_batch_ms"]})
        rows.append({"path": "transport: handler sample, one batch", "ms": tr["handler_sample_batch_ms"]})
    print_table(rows, ["path", "GB/s", "ms", "ratio", "ref", "target"])
    print(f"\nwrote {write_json('bench_distributed', results, args.out)}")
    return results


if __name__ == "__main__":
    main()
