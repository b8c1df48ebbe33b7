import numpy as np
from distributed import Client, LocalCluster

import gear_flow as gf


def main():
    spec = gf.TableSpec((gf.ColumnSpec("obs", (8,), np.float32), gf.ColumnSpec("reward", (), np.float32)),
                        capacity=50_000, num_shards=2)  # fmt: skip
    rng = np.random.default_rng(0)
    episodes = [{"obs": rng.standard_normal((T, 8), dtype=np.float32), "reward": np.ones(T, np.float32)}
                for T in rng.integers(50, 200, 20)]  # fmt: skip
    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None) as cluster, Client(cluster) as client:
        table = gf.DistributedTable.create(client, spec, sampler=gf.Prioritized(), name="replay")  # a shard per worker
        table.insert(episodes)  # routed to the shards, written on the workers
        with gf.Stream(table, batch_size=64, length=8, prefetch=2, num_batches=10) as stream:  # an external learner
            for batch in stream:
                stream.update_priorities(batch.keys, batch.weights.numpy() + 0.5)  # never blocks
        print(table.info()["size"], "steps in", len(table.placement), "shards")


if __name__ == "__main__":  # Dask's worker processes import this file: start the cluster only when run
    main()
