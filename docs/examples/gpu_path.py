"""The GPU path: a table whose rings and selection live on the GPU, in one process and on a LocalCUDACluster.

Needs a CUDA device, CuPy and dask-cuda (``environment.yml``, or the ``gpu-cu13`` extra); the test suite
runs it where a device is present (``tests/test_docs.py``, marked ``gpu``).
"""

import numpy as np
from distributed import Client

import gear_flow as gf


def trajectories(rng, B, T):
    """What a vectorised collector hands over: one [B, T, ...] array per column."""
    return {"obs": rng.standard_normal((B, T, 64), dtype=np.float32), "reward": rng.random((B, T), dtype=np.float32)}


def main():
    rng = np.random.default_rng(0)
    columns = (gf.ColumnSpec("obs", (64,), np.float32), gf.ColumnSpec("reward", (), np.float32))

    # one process: the rings, the sum tree and the gather on this GPU; the batch's columns are CUDA tensors
    table = gf.LocalTable(gf.TableSpec(columns, capacity=100_000), sampler=gf.Prioritized(), tier="device", seed=0)
    table.insert_batch(trajectories(rng, 64, 100))
    batch = table.sample(256, 16)
    print("local:", batch["obs"].shape, batch["obs"].device)
    table.update_priorities(batch.keys, batch.weights.numpy() + 0.5)

    # a LocalCUDACluster: one worker per GPU, a shard on each, batches gathered on the workers' GPUs
    with gf.local_cuda_cluster(no_dashboard=True) as cluster, Client(cluster) as client:
        spec = gf.TableSpec(columns, capacity=100_000, num_shards=len(cluster.workers))
        dist = gf.DistributedTable.create(client, spec, sampler=gf.Prioritized(), tier="device", name="gpu")
        dist.insert_batch(trajectories(rng, 64, 100))
        with gf.Stream(dist, 256, 16, num_batches=5) as stream:
            for batch in stream:
                stream.update_priorities(batch.keys, batch.weights.numpy() + 0.5)
        print("distributed:", batch["obs"].shape, batch["obs"].device, dist.info()["size"], "steps")


if __name__ == "__main__":
    main()
