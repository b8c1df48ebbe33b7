"""A table larger than memory: the disk tier, flushed, closed and reopened in place.

Each shard's rings, priorities and episode index are memory-mapped files under ``path``; the page
cache decides what is resident. The table is its own checkpoint: ``flush()`` makes it durable,
``LocalTable.open`` reopens it without copying anything.
"""

import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

import gear_flow as gf

path = Path(tempfile.mkdtemp()) / "replay"
spec = gf.TableSpec(
    (gf.ColumnSpec("obs", (84, 84), np.uint8), gf.ColumnSpec("reward", (), np.float32)),
    capacity=1_000_000,  # 7 GB of frames per shard: the files are sparse, the disk fills as steps arrive
    num_shards=2,
)
table = gf.LocalTable(spec, sampler=gf.Prioritized(alpha=0.6, beta=0.4), tier="disk", path=path)
rng = np.random.default_rng(0)
for _ in range(20):
    T = int(rng.integers(100, 300))
    table.insert({"obs": rng.integers(0, 255, (T, 84, 84), dtype=np.uint8), "reward": np.ones(T, np.float32)})
batch = table.sample(batch_size=32, length=4)
table.update_priorities(batch.keys, rng.random(32) + 0.1)
print(table.info()["storage"]["bytes_on_disk"] >> 20, "MiB on disk")
table.flush()  # durable: dirty pages written, checksums of what changed, the header fsync'ed
table.close()

t0 = time.perf_counter()
again = gf.LocalTable.open(path)  # every shard's layout, header and file sizes checked, then mapped
print(f"reopened {again.size} steps in {time.perf_counter() - t0:.3f} s")
with gf.Stream(again, batch_size=32, length=4, prefetch=4, num_batches=10) as stream:
    for batch in stream:
        stream.update_priorities(batch.keys, batch.weights.numpy() + 0.5)
again.close()
shutil.rmtree(path.parent)  # the files stay until removed: a disk table outlives its process
