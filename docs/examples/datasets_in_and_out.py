"""Datasets in and out: a D4RL file and a LeRobot Parquet dataset in, a selection of episodes out.

Writes both inputs with the tools that make them (h5py, pandas/pyarrow) into a temporary directory,
ingests each into a table (checksums of what was read against what is stored), selects the long
episodes through the table's Dask collection of episodes, and exports them to Parquet and reads them back.
"""

import tempfile
from pathlib import Path

import h5py
import numpy as np
import pandas as pd

import gear_flow as gf
from gear_flow.ingest import episode_columns, ingest, read_parquet

rng = np.random.default_rng(0)
d = Path(tempfile.mkdtemp())

# -- a D4RL-style HDF5 file: flat arrays over all steps, episodes ended by terminals and timeouts ----------
n = 300
with h5py.File(d / "hopper.hdf5", "w") as f:
    f["observations"] = rng.standard_normal((n, 4)).astype(np.float32)
    f["actions"] = rng.integers(0, 3, n)
    f["rewards"] = rng.random(n).astype(np.float32)
    f["terminals"] = np.isin(np.arange(n), [49, 169])
    f["timeouts"] = np.isin(np.arange(n), [99, 249, 299])
d4rl = gf.LocalTable(gf.TableSpec(episode_columns(4), capacity=10_000))
report = ingest(d4rl, d / "hopper.hdf5")
print("D4RL:", report.episodes_stored, "episodes, checksums equal:", report.ok)

# -- a LeRobot dataset: one Parquet file per episode, LeRobot's columns (the layout is detected) ------------
(d / "lerobot").mkdir()
for ep, T in enumerate((40, 90, 60)):
    pd.DataFrame({
        "observation.state": list(rng.standard_normal((T, 6)).astype(np.float32)),
        "action": list(rng.standard_normal((T, 2)).astype(np.float32)),
        "episode_index": np.full(T, ep), "frame_index": np.arange(T),
        "next.reward": rng.random(T).astype(np.float32), "next.done": np.arange(T) == T - 1,
    }).to_parquet(d / "lerobot" / f"episode_{ep:06d}.parquet", index=False)  # fmt: skip
robot = gf.LocalTable(gf.TableSpec(episode_columns(6, np.float32, (2,)), capacity=10_000))
report = ingest(robot, d / "lerobot")
print("LeRobot:", report.episodes_stored, "episodes, layout detected:", report.layout)

# -- out: the episodes as a Dask DataFrame, the long ones selected, exported, read back ----------------------
eps = d4rl.episodes().compute()  # one row per episode: id, length, return, ...
print(eps[["episode_id", "length"]].to_string(index=False))
long = d4rl.episodes()
long = long[long["length"] >= 60]
out = d4rl.export(d / "long", "parquet", episodes=long)
back = list(read_parquet(d / "long"))
print("exported", len(back), "episodes of", sorted(len(e["reward"]) for e in back), "steps")
assert sorted(len(e["reward"]) for e in back) == sorted(eps.loc[eps["length"] >= 60, "length"].tolist())
