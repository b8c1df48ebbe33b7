"""The comm data plane over UCX (distributed-ucxx), beside TCP: ``bench_distributed.py``'s UCX rows.

On a host without RDMA, ``ucx://`` runs over UCX's TCP transports; the cluster starts the way the
project deploys one (``gear_flow.local_cluster(protocol="ucx")``: no CUDA context without a GPU,
loopback devices only). The reference is a raw Dask transfer over the same UCX cluster, timed in turn
with the batch round by round (``common.alternate``): no parallel gather runs in the client on this
path (the one worker's reply is copied into the batch by NumPy; two workers' parts likewise), so
neither leaves OpenMP threads spinning into the other's time.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from unittest import mock

import numpy as np
from common import alternate, raw_dask_step, reference_columns

import gear_flow as gf


@contextlib.contextmanager
def _ucx_cluster(workers):
    """A UCX LocalCluster started the project's way (``gear_flow.local_cluster(protocol="ucx")``).

    ``local_cluster`` sets what UCX needs in this process (no CUDA context without a GPU,
    ``UCX_NET_DEVICES=lo``; distributed-ucxx adds its own ``UCX_*`` variables); both the
    environment and that config key are restored afterwards, so later clusters of this process
    (and tests calling :func:`main`) see what they saw before.
    """
    import dask

    key = "distributed-ucxx.create-cuda-context"
    with (
        mock.patch.dict(os.environ),
        dask.config.set({key: dask.config.get(key, None)}),  # its exit restores what local_cluster sets
        gf.local_cluster(workers, 2, protocol="ucx", no_dashboard=True) as cluster,
    ):
        yield cluster


def run_ucx(workers, args, eps, rows, results):
    """The external learner on the comm plane over UCX, against raw Dask over the same UCX cluster."""
    import dask
    from distributed import Client

    from gear_flow.distributed import DistributedTable

    tag = f"{workers}w, comm over UCX"
    key = f"workers_{workers}_comm_ucx"
    if args.no_ucx:
        results[key] = {"skipped": "--no-ucx"}
        rows.append({"path": f"external learner, {tag}", "ref": "not run: --no-ucx"})
        return
    if importlib.util.find_spec("distributed_ucxx") is None:
        results[key] = {"skipped": "distributed-ucxx is not installed (the ucx extra)"}
        rows.append({"path": f"external learner, {tag}", "ref": "not run: no distributed-ucxx"})
        return
    B, L = args.batch_size, args.length
    cols = reference_columns()
    step_bytes = sum(c.nbytes for c in cols)
    steps = sum(len(e["reward"]) for e in eps)
    batch_bytes = B * L * step_bytes
    res = {}
    with contextlib.ExitStack() as stack:
        # another machine stands in: no shared memory, and the coordinator, like the workers, over the comm
        stack.enter_context(dask.config.set({"gear-flow.distributed.shared-memory": False}))
        try:
            cluster = stack.enter_context(_ucx_cluster(workers))
            client = stack.enter_context(Client(cluster))
        except Exception as e:  # UCX cannot start here: say why in the table, measure the rest
            reason = f"{type(e).__name__}: {e}".splitlines()[0][:120]
            results[key] = {"skipped": f"UCX did not start: {reason}"}
            rows.append({"path": f"external learner, {tag}", "ref": f"not run: UCX did not start ({reason})"})
            return
        res["scheduler"] = cluster.scheduler_address
        spec = gf.TableSpec(cols, capacity=steps // workers + args.episode_length, num_shards=workers)
        table = DistributedTable.create(client, spec, sampler=gf.Uniform(), seed=0, name=f"bench{workers}ucx")
        for i in range(0, len(eps), args.insert_batch):
            table.insert(eps[i : i + args.insert_batch])
        step = raw_dask_step(client, sorted(client.nthreads()), batch_bytes)
        out = gf.SampleBuffers(spec, spec.names, B, L)
        # in turn, round by round: a transfer over UCX's TCP transports here drifts by a third within a
        # minute, so two blocks one after the other compare two moments of the machine more than the two paths
        ts, tr = alternate([lambda: table.sample(B, L, out=out), step], 5 * args.repeat)
        res["raw_dask_gbps"] = batch_bytes / float(np.median(tr)) / 1e9
        res["external_gbps"] = batch_bytes / float(np.median(ts)) / 1e9
        res["external_ratio"] = res["external_gbps"] / res["raw_dask_gbps"]
        # the spread of the rounds, both paths: GB/s at the slow and the fast quartile (the middle half between)
        for path, times in (("external", ts), ("raw_dask", tr)):
            res[f"{path}_gbps_quartiles"] = [batch_bytes / float(q) / 1e9 for q in np.quantile(times, [0.75, 0.25])]
        res["stats"] = dict(table.stats)
        table.close()
    tcp = results.get(f"workers_{workers}_comm", {})
    if "external_gbps" in tcp:
        res["vs_tcp"] = res["external_gbps"] / tcp["external_gbps"]
        res["raw_dask_vs_tcp"] = res["raw_dask_gbps"] / tcp["raw_dask_gbps"]
    results[key] = res
    rows.append(
        {
            "path": f"external learner, {tag}",
            "GB/s": res["external_gbps"],
            "ratio": res["external_ratio"],
            "ref": f"raw Dask over UCX {res['raw_dask_gbps']:.3g} GB/s",
            "target": ">= 0.9",
        }
    )
