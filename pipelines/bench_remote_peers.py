"""A learner reading from another process, gear_flow against DeepMind Reverb, side by side in one run.

The reference workload (DESIGN.md) is held in another process and a learner here draws B=256 x L=64 windows
from it as torch tensors:

* gear_flow: a ``DistributedTable`` on one Dask worker, with shared memory off (what a learner on another
  host sees: its draws and their windows over the worker's TCP lane);
* Reverb 0.14: a ``reverb.Server`` in its own process holding every strict window as an item (written step
  by step there, by its ``Writer`` in chunks of L steps: its fastest writer on this workload), read here
  over gRPC through a ``TrajectoryDataset`` (Reverb's fast path; its threads keep samples in flight), each
  column made a torch tensor.

Uniform and prioritized tables (a prioritized batch's B priorities written back: ``update_priorities``,
``mutate_priorities``).  Each learner's batches are timed in a block of their own, steady (Reverb's dataset
draws ahead on its own threads: timed in turn with the others, it would draw while they run), and reported
as GB/s and against a raw Dask transfer of the same bytes from the worker and a single-thread memcpy here,
both measured in this run.  gear_flow's own drawing ahead, a ``Stream(prefetch=2)``, is the uniform
table's second row.  Reverb needs the ``bench`` extra's environment (see ``pipelines/bench_local.py``);
without it the Reverb rows say so.

Usage::

    python pipelines/bench_remote_peers.py [--quick] [--out PATH]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    make_episodes,
    memcpy_gbps,
    print_table,
    raw_dask_step,
    reference_columns,
    reference_options,
    stream_gbps,
    timeit,
    write_json,
)

import gear_flow as gf  # noqa: E402

#: the Reverb server's process: makes the workload as this script does, writes it, then serves until stdin closes
SERVER = """
import sys
sys.path.insert(0, {here!r})
import reverb, reverb_peer
from common import make_episodes

eps = make_episodes({episodes}, {episode_length})
server = reverb.Server(tables=reverb_peer.tables(reverb_peer.SELECTORS, eps, {length}), port=None)
reverb_peer.write(server.localhost_client(), reverb_peer.SELECTORS, eps, {length})
print(server.port, flush=True)
sys.stdin.read()
server.stop()
"""


def reverb_learner(args):
    """Start the Reverb server's process; ``(process, {table: one batch per call})``, or ``(None, reason)``."""
    try:
        import reverb
        import reverb_peer
    except ImportError as e:
        return None, f"not installed ({e})"
    here = str(Path(__file__).resolve().parent)
    code = SERVER.format(here=here, length=args.length, episodes=args.episodes, episode_length=args.episode_length)
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    address = f"localhost:{int(proc.stdout.readline())}"
    client, rng = reverb.Client(address), np.random.default_rng(1)
    return proc, {n: reverb_peer.reader(address, n, args.batch_size, client, rng) for n in reverb_peer.SELECTORS}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    reference_options(p)
    p.add_argument("--repeat", type=int, default=30)
    p.add_argument("--memcpy-pool-mb", type=int, default=256)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if args.quick:
        args.episodes, args.episode_length, args.repeat, args.memcpy_pool_mb = 10, 200, 3, 16
        args.batch_size, args.length = 32, 16
    import dask
    from distributed import Client, LocalCluster

    from gear_flow.distributed import DistributedTable

    B, L = args.batch_size, args.length
    cols = reference_columns()
    batch_bytes = B * L * sum(c.nbytes for c in cols)
    eps = make_episodes(args.episodes, args.episode_length)
    steps = sum(len(e["reward"]) for e in eps)
    rows: list[dict] = []
    results: dict = {"args": vars(args)}
    proc, reverb_batches = reverb_learner(args)
    plane = {"gear-flow.distributed.shared-memory": False, "gear-flow.distributed.tcp-lane": True}
    try:
        with (
            dask.config.set(plane),
            LocalCluster(n_workers=1, threads_per_worker=2, processes=True, dashboard_address=None) as cluster,
            Client(cluster) as client,
        ):
            rng = np.random.default_rng(0)
            addrs = sorted(client.nthreads())
            spec = gf.TableSpec(cols, capacity=steps + args.episode_length, num_shards=1)
            ours, tables = {}, {}
            for name, sampler in (("uniform", gf.Uniform()), ("prioritized", gf.Prioritized(0.6, 0.4))):
                t = DistributedTable.create(client, spec, sampler=sampler, seed=0, name=f"remote_{name}")
                for i in range(0, len(eps), 10):
                    chunk = eps[i : i + 10]
                    t.insert(chunk, priorities=rng.random(sum(len(e["reward"]) for e in chunk)) + 0.01)
                out = gf.SampleBuffers(spec, spec.names, B, L)
                tables[name] = t

                def once(t=t, out=out, name=name):
                    b = t.sample(B, L, out=out)
                    if name == "prioritized":
                        t.update_priorities(b.keys, rng.random(B) + 0.01)

                ours[name] = once
            raw = raw_dask_step(client, addrs, batch_bytes)
            memcpy = memcpy_gbps(batch_bytes, repeat=args.repeat, pool_bytes=args.memcpy_pool_mb << 20)
            results["memcpy_gbps"] = memcpy
            for name in ("uniform", "prioritized"):
                # in blocks, each steady: Reverb's dataset keeps samples in flight on its own threads, so timed in
                # turn with the others it would draw ahead while they run, and they would pay for its threads
                g = batch_bytes / float(np.median(timeit(ours[name], args.repeat))) / 1e9
                r = batch_bytes / float(np.median([raw() for _ in range(args.repeat)])) / 1e9
                res = {"gear_flow_gbps": g, "raw_dask_gbps": r, "memcpy_gbps": memcpy}
                res["gear_flow_raw_ratio"], res["gear_flow_memcpy_ratio"] = g / r, g / memcpy
                rows.append({"path": f"gear_flow {name}, 1 worker, TCP lane", "GB/s": g, "x raw Dask": g / r,
                             "x memcpy": g / memcpy})  # fmt: skip
                if name == "uniform":  # its own batches drawn ahead too, as Reverb's dataset draws: a Stream
                    res["gear_flow_stream_gbps"] = sg = stream_gbps(tables[name], B, L, args.repeat)
                    rows.append({"path": "gear_flow uniform, Stream(prefetch=2)", "GB/s": sg, "x raw Dask": sg / r,
                                 "x memcpy": sg / memcpy})  # fmt: skip
                if proc is not None:
                    v = batch_bytes / float(np.median(timeit(reverb_batches[name], args.repeat))) / 1e9
                    res["reverb_gbps"], res["reverb_raw_ratio"], res["reverb_memcpy_ratio"] = v, v / r, v / memcpy
                    res["gear_flow_over_reverb"] = g / v
                    rows.append({"path": f"reverb {name}, its server over gRPC", "GB/s": v, "x raw Dask": v / r,
                                 "x memcpy": v / memcpy, "note": f"gear_flow sample is {g / v:.2f}x"})  # fmt: skip
                else:
                    res["reverb"] = {"skipped": reverb_batches}
                results[name] = res
            rows.append({"path": "raw Dask transfer, one batch", "GB/s": results["uniform"]["raw_dask_gbps"]})
    finally:
        if proc is not None:
            proc.stdin.close()
            proc.wait(timeout=60)
    print_table(rows, ["path", "GB/s", "x raw Dask", "x memcpy", "note"])
    print(f"\nwrote {write_json('bench_remote_peers', results, args.out)}")
    return results


if __name__ == "__main__":
    main()
