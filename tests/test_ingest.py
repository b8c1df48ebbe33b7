"""Offline dataset ingestion: readers, derived columns, local and distributed ingest, malformed files.

Real files (written by pipelines/make_dataset.py into tmp_path) and a real
LocalCluster with two worker processes.
"""

from __future__ import annotations

import json
import math
import pickle
import sys
from pathlib import Path

import dask
import h5py
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from distributed import Client, LocalCluster

import gear_flow as gf
from gear_flow.distributed import DistributedTable
from gear_flow.errors import DatasetError
from gear_flow.ingest import (
    detect_format,
    episode_columns,
    ingest,
    read_d4rl,
    read_minari,
    read_parquet,
    return_to_go,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pipelines"))
import make_dataset  # noqa: E402

pytestmark = pytest.mark.timeout(240)

EPISODES, SEED = 40, 1
FORMATS = ("minari", "d4rl", "parquet")


@pytest.fixture(scope="module")
def client():
    with dask.config.set({"distributed.comm.timeouts.connect": "5s"}):
        with LocalCluster(n_workers=2, threads_per_worker=2, processes=True, dashboard_address=None) as cluster:
            with Client(cluster) as c:
                yield c


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    out = tmp_path_factory.mktemp("cartpole")
    return make_dataset.main(
        ["--out", str(out), "--episodes", str(EPISODES), "--seed", str(SEED), "--parquet-files", "3"]
    )


@pytest.fixture(scope="module")
def raw():
    return make_dataset.generate(EPISODES, SEED)


def source(dataset, fmt):
    return dataset["paths"]["minari" if fmt == "minari" else fmt]


def spec(capacity=20_000, num_shards=2, **kw):
    return gf.TableSpec(episode_columns(4), capacity=capacity, num_shards=num_shards, **kw)


# -- the generator ---------------------------------------------------------------------------------


def test_generator_is_deterministic_and_mixed(dataset, raw):
    again = make_dataset.generate(5, SEED)
    for a, b in zip(raw[:5], again):
        for k in make_dataset.ARRAYS:
            assert np.array_equal(a[k], b[k])
    rets = [float(e["rewards"].sum()) for e in raw]
    assert dataset["episodes"] == EPISODES and dataset["steps"] == sum(len(e["rewards"]) for e in raw)
    assert dataset["best_return"] == max(rets) == 500.0
    assert dataset["worst_return"] < 30 and dataset["mean_return"] < 0.7 * dataset["best_return"]
    assert len(dataset["per_policy"]) >= 4
    meta = json.loads((Path(dataset["paths"]["minari"]) / "data" / "metadata.json").read_text())
    for k in (
        "dataset_id",
        "total_episodes",
        "total_steps",
        "env_spec",
        "observation_space",
        "action_space",
        "data_format",
        "minari_version",
    ):
        assert k in meta
    assert meta["total_episodes"] == EPISODES and meta["total_steps"] == dataset["steps"]
    with h5py.File(Path(dataset["paths"]["minari"]) / "data" / "main_data.hdf5") as f:
        g = f["episode_0"]
        assert g["observations"].shape[0] == g["actions"].shape[0] + 1 == len(raw[0]["rewards"]) + 1


def test_generator_full_size_is_fast_and_mixed(tmp_path):
    res = make_dataset.main(["--out", str(tmp_path / "full"), "--episodes", "300", "--seed", "0"])
    assert res["episodes"] == 300 and res["seconds"] < 60
    assert res["best_return"] == 500 and res["worst_return"] < 30 and 120 < res["mean_return"] < 300
    assert json.loads((tmp_path / "full" / "stats.json").read_text())["steps"] == res["steps"]


def test_minari_itself_loads_the_dataset(dataset):
    minari = pytest.importorskip("minari")
    ds = minari.MinariDataset(Path(dataset["paths"]["minari"]) / "data")
    assert ds.total_episodes == EPISODES and ds.total_steps == dataset["steps"]


# -- readers ---------------------------------------------------------------------------------------


READERS = {
    "minari": lambda d, **kw: read_minari(d["paths"]["minari"], **kw),
    "d4rl": lambda d, **kw: read_d4rl(d["paths"]["d4rl"], **kw),
    "parquet": lambda d, **kw: read_parquet(d["paths"]["parquet"], **kw),
}


@pytest.mark.parametrize("fmt", FORMATS)
def test_reader_reproduces_the_generated_episodes(dataset, raw, fmt):
    eps = list(READERS[fmt](dataset, chunk_episodes=7))  # partitions of 7 episodes (Parquet: row filters)
    assert len(eps) == EPISODES
    for e, r in zip(eps, raw):
        T = len(r["rewards"])
        assert e["obs"].dtype == np.float32 and e["obs"].shape == (T, 4)
        assert np.array_equal(e["obs"], r["observations"][:-1])  # Minari's final observation is dropped
        assert e["action"].dtype == np.int64 and np.array_equal(e["action"], r["actions"])
        assert e["reward"].dtype == np.float32 and np.array_equal(e["reward"], r["rewards"].astype(np.float32))
        assert np.array_equal(e["done"], r["terminations"]) and np.array_equal(e["truncated"], r["truncations"])
        assert e["done"][-1] or e["truncated"][-1]
        assert np.array_equal(e["timestep"], np.arange(T)) and e["timestep"].dtype == np.int64
        assert e["rtg"].dtype == np.float32 and e["rtg"][0] == r["rewards"].sum() and e["rtg"][-1] == r["rewards"][-1]
        assert np.array_equal(e["rtg"], np.arange(T, 0, -1, dtype=np.float32))  # CartPole pays 1 per step


def test_return_to_go_discounted(dataset):
    gamma = 0.9
    r = np.array([1.0, 2.0, 0.5, -1.0], np.float32)
    want = [1 + 0.9 * 2 + 0.81 * 0.5 - 0.729, 2 + 0.9 * 0.5 - 0.81, 0.5 - 0.9, -1.0]
    assert np.allclose(return_to_go(r, gamma), want, rtol=1e-6)
    e = next(iter(read_d4rl(dataset["paths"]["d4rl"], gamma=gamma)))
    T = len(e["reward"])
    assert np.allclose(e["rtg"], (1 - gamma ** np.arange(T, 0, -1)) / (1 - gamma), rtol=1e-5)


def write_flat(path, n, terminals=(), timeouts=(), **override):
    data = {
        "observations": np.arange(n * 3, dtype=np.float32).reshape(n, 3),
        "actions": np.arange(n, dtype=np.int64) % 2,
        "rewards": np.arange(n, dtype=np.float32),
        "terminals": np.isin(np.arange(n), terminals),
        "timeouts": np.isin(np.arange(n), timeouts),
    }
    data.update(override)
    with h5py.File(path, "w") as f:
        for k, v in data.items():
            if v is not None:
                f.create_dataset(k, data=v)
    return path


@pytest.mark.parametrize("chunk", [1, 64])
def test_d4rl_split_the_flagged_step_belongs_to_the_episode_it_ends(tmp_path, chunk):
    p = write_flat(tmp_path / "flat.hdf5", 9, terminals=[2], timeouts=[5])
    eps = list(read_d4rl(p, chunk_episodes=chunk))
    assert [len(e["reward"]) for e in eps] == [3, 3, 3]
    assert eps[0]["reward"].tolist() == [0, 1, 2]  # row 2 (terminal) is the last step of episode 0
    assert eps[0]["done"].tolist() == [False, False, True] and not eps[0]["truncated"].any()
    assert eps[1]["reward"].tolist() == [3, 4, 5]  # row 5 (timeout) ends episode 1
    assert not eps[1]["done"].any() and eps[1]["truncated"].tolist() == [False, False, True]
    assert eps[2]["reward"].tolist() == [6, 7, 8]  # trailing rows: a final, truncated episode
    assert not eps[2]["done"].any() and eps[2]["truncated"].tolist() == [False, False, True]
    assert eps[0]["rtg"].tolist() == [3, 3, 2] and eps[2]["timestep"].tolist() == [0, 1, 2]
    assert np.array_equal(eps[1]["obs"], np.arange(9, 18, dtype=np.float32).reshape(3, 3))


def test_parquet_cudf_backend_is_a_clear_error_without_a_gpu(dataset):
    from gear_flow.backend import BackendUnavailableError, gpu_available

    if gpu_available():
        pytest.skip("a GPU is usable here")
    with pytest.raises(BackendUnavailableError, match="cudf"):
        next(iter(read_parquet(dataset["paths"]["parquet"], frame_backend="cudf")))
    with pytest.raises(gf.SpecError, match="frame_backend"):
        ingest(gf.LocalTable(spec()), dataset["paths"]["d4rl"], frame_backend="cudf")


def test_detect_format(dataset):
    assert detect_format(dataset["paths"]["minari"]) == "minari"
    assert detect_format(dataset["paths"]["d4rl"]) == "d4rl"
    assert detect_format(dataset["paths"]["parquet"]) == "parquet"
    assert detect_format(dataset["paths"]["parquet_files"]) == "parquet"


# -- ingest into a local table ------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_local_ingest_counts_and_checksums_match_the_source(dataset, raw, fmt):
    table = gf.LocalTable(spec())
    rep = ingest(table, source(dataset, fmt), fmt=fmt)
    assert rep.ok, rep.mismatches()
    assert rep.episodes_read == rep.episodes_stored == EPISODES
    assert rep.steps_read == rep.steps_stored == dataset["steps"] == table.size
    assert sum(s["steps"] for s in rep.shards.values()) == dataset["steps"]
    # checksums against the generator's own arrays
    fs = lambda xs: math.fsum(float(np.sum(x, dtype=np.float64)) for x in xs)  # noqa: E731
    assert rep.read_checksums["obs"] == fs(e["observations"][:-1].astype(np.float32) for e in raw)
    assert rep.read_checksums["reward"] == dataset["steps"]
    assert rep.read_checksums["action"] == fs(e["actions"] for e in raw)
    assert rep.read_checksums["done"] == sum(bool(e["terminations"][-1]) for e in raw)
    assert rep.read_checksums["rtg"] == sum(len(e["rewards"]) * (len(e["rewards"]) + 1) // 2 for e in raw)
    assert rep.stored_checksums == rep.read_checksums


def test_local_ingest_into_a_subset_of_columns_and_twice(dataset):
    cols = tuple(c for c in episode_columns(4) if c.name in ("obs", "reward", "rtg"))
    table = gf.LocalTable(gf.TableSpec(cols, capacity=20_000))
    first = ingest(table, dataset["paths"]["d4rl"])
    second = ingest(table, dataset["paths"]["minari"])  # earlier data does not disturb the comparison
    assert first.ok and second.ok and set(second.read_checksums) == {"obs", "reward", "rtg"}
    assert second.read_checksums == first.read_checksums and table.size == 2 * dataset["steps"]
    assert not set(first.episode_ids.tolist()) & set(second.episode_ids.tolist())


def test_table_columns_must_be_produced_by_the_readers(dataset):
    table = gf.LocalTable(gf.TableSpec((gf.ColumnSpec("pixels", (4,)),), capacity=100))
    with pytest.raises(gf.SpecError, match="pixels"):
        ingest(table, dataset["paths"]["d4rl"])


def test_episode_longer_than_capacity_is_rejected_before_anything(dataset):
    table = gf.LocalTable(spec(capacity=400))
    with pytest.raises(DatasetError, match=r"capacity.*nothing was inserted"):
        ingest(table, dataset["paths"]["d4rl"])
    assert table.size == 0


def test_dataset_error_pickles():
    e = pickle.loads(pickle.dumps(DatasetError("/x/f.hdf5", 3, "rewards[2] is not finite")))
    assert isinstance(e, gf.InvalidDataError) and (e.path, e.episode) == ("/x/f.hdf5", 3)
    assert str(e) == "/x/f.hdf5, episode 3: rewards[2] is not finite"


# -- ingest into a distributed table -----------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_distributed_ingest_reads_on_the_owning_workers(client, dataset, fmt):
    table = DistributedTable.create(client, spec(), seed=0)
    try:
        rep = ingest(table, source(dataset, fmt), fmt=fmt)
        assert rep.ok, rep.mismatches()
        assert rep.steps_stored == dataset["steps"] and rep.episodes_stored == EPISODES
        info = table.info()
        sizes = {s["shard"]: s["steps_stored"] for s in info["shards"]}
        assert all(v > 0 for v in sizes.values()) and len(sizes) == 2  # data on both shards, both workers
        assert sum(sizes.values()) == dataset["steps"] and info["size"] == info["coordinator_size"]
        assert {s: v["steps"] for s, v in rep.shards.items()} == sizes
        workers = set()
        for p in rep.partitions:  # read and inserted on the worker that hosts the target shard
            assert p["read_on"] == p["worker"]
            assert p["shards"] and all(table.placement[s] == p["worker"] for s in p["shards"])
            workers.add(p["worker"])
        assert workers == set(table.placement.values())
        assert len(rep.partitions) >= 8  # re-planned finer: >= 4 partitions per worker, for balance
        # episodes were never split: a window's stored position agrees with the source timestep
        b = table.sample(64, 6)
        assert np.array_equal(b.timesteps.numpy(), b["timestep"][:, 0].numpy())
        assert np.array_equal(np.diff(b["timestep"].numpy(), axis=1), np.ones((64, 5)))
        assert np.allclose(b["rtg"][:, :-1] - b["rtg"][:, 1:], b["reward"][:, :-1])
    finally:
        table.close()


# -- malformed files: a clear error, nothing inserted -------------------------------------------------------


@pytest.fixture(scope="module")
def good():
    return make_dataset.generate(6, 2)


@pytest.fixture(scope="module")
def empty_table(client):
    t = DistributedTable.create(client, spec(), seed=0)
    yield t
    t.close()


def _minari(tmp, eps, i, fix):
    eps = [dict(e) for e in eps]
    fix(eps[i])
    return make_dataset.write_minari(tmp / "minari", eps), "main_data.hdf5"


def _d4rl(tmp, eps, **override):
    p = make_dataset.write_d4rl(tmp / "flat.hdf5", eps)
    with h5py.File(p, "a") as f:
        for k, v in override.items():
            del f[k]
            if v is not None:
                f.create_dataset(k, data=v(np.asarray(_flat(eps, k))))
    return p, "flat.hdf5"


def _flat(eps, key):
    src = {"rewards": "rewards", "terminals": "terminations", "timeouts": "truncations", "actions": "actions"}[key]
    return np.concatenate([e[src] for e in eps])


def _parquet(tmp, eps, file, fix):
    paths = make_dataset.write_parquet(tmp / "pq", eps, files=3)
    t = pq.read_table(paths[file])
    pq.write_table(fix(t), paths[file])
    return tmp / "pq", paths[file].name


def _nan_at(i):
    def fix(e):
        e["rewards"] = e["rewards"].copy()
        e["rewards"][i] = np.nan

    return fix


def _set(col, values):
    return lambda t: t.set_column(t.schema.get_field_index(col), col, pa.array(values(t)))


MALFORMED = {
    "minari-missing-key": (
        lambda tmp, g: _minari(tmp, g, 4, lambda e: e.pop("rewards")),
        r"episode 4: dataset 'rewards' is missing",
    ),
    "minari-ragged": (
        lambda tmp, g: _minari(tmp, g, 5, lambda e: e.update(actions=e["actions"][:-1])),
        r"episode 5: ragged columns: 'actions'",
    ),
    "minari-nan-reward": (lambda tmp, g: _minari(tmp, g, 3, _nan_at(2)), r"episode 3: rewards\[2\] is not finite"),
    "minari-wrong-dtype": (
        lambda tmp, g: _minari(tmp, g, 2, lambda e: e.update(rewards=e["rewards"].astype("S8"))),
        r"episode 2: 'rewards' has dtype",
    ),
    "minari-metadata-steps": (
        lambda tmp, g: (make_dataset.write_minari(tmp / "minari", g, metadata={"total_steps": 5}), "main_data.hdf5"),
        r"the metadata promises 5 steps",
    ),
    "minari-flag-early": (
        lambda tmp, g: _minari(tmp, g, 1, lambda e: e.update(terminations=np.r_[True, e["terminations"][1:]])),
        r"episode 1: an end flag is set at step 0",
    ),
    # (timeouts are optional: older D4RL releases have none, see tests/test_datasets_d4rl.py)
    "d4rl-missing-key": (lambda tmp, g: _d4rl(tmp, g, rewards=None), r"\['rewards'\] are missing"),
    "d4rl-ragged": (lambda tmp, g: _d4rl(tmp, g, rewards=lambda a: a[:-1]), r"ragged columns"),
    "d4rl-nan-reward": (
        lambda tmp, g: _d4rl(
            tmp, g, rewards=lambda a: np.where(np.arange(len(a)) == len(g[0]["rewards"]) + 1, np.nan, a)
        ),
        r"episode 1 \(rows .*\): rewards\[1\] is not finite",
    ),
    "d4rl-wrong-dtype": (lambda tmp, g: _d4rl(tmp, g, actions=lambda a: a.astype("S4")), r"'actions' has dtype"),
    "parquet-missing-column": (
        lambda tmp, g: _parquet(tmp, g, 2, lambda t: t.drop_columns(["reward"])),
        r"\['reward'\] are missing",
    ),
    "parquet-wrong-dtype": (
        lambda tmp, g: _parquet(tmp, g, 1, _set("reward", lambda t: [str(x) for x in t.column("reward").to_pylist()])),
        r"'reward' has dtype",
    ),
    "parquet-nan-reward": (
        lambda tmp, g: _parquet(
            tmp, g, 2, _set("reward", lambda t: np.r_[np.nan, t.column("reward").to_numpy()[1:]].astype(np.float32))
        ),
        r"episode \d: reward\[0\] is not finite",
    ),
    "parquet-missing-step": (lambda tmp, g: _parquet(tmp, g, 1, lambda t: t.slice(1)), r"steps must be 0\.\."),
    "parquet-episode-spans-files": (
        lambda tmp, g: _parquet(tmp, g, 2, _set("episode_id", lambda t: np.full(t.num_rows, 0, np.int64))),
        r"episode 0: the episode also has rows in",
    ),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_file_raises_and_inserts_nothing(tmp_path, good, empty_table, case):
    make, pattern = MALFORMED[case]
    src, fname = make(tmp_path, good)
    with pytest.raises(DatasetError, match=pattern) as ei:
        ingest(empty_table, src, chunk_episodes=2)
    msg = str(ei.value)
    assert fname in msg and "nothing was inserted" in msg, msg
    info = empty_table.info()
    assert info["size"] == 0 and info["totals"]["inserted"] == 0 and info["coordinator_size"] == 0


def test_nan_rewards_are_kept_when_not_strict(tmp_path, good):
    src, _ = _minari(tmp_path, good, 3, _nan_at(2))
    table = gf.LocalTable(spec())
    rep = ingest(table, src, strict=False)
    assert rep.episodes_stored == len(good) and math.isnan(rep.read_checksums["reward"])
    with pytest.raises(DatasetError, match="not finite"):
        ingest(gf.LocalTable(spec()), src)


def test_early_end_flags_are_kept_as_the_file_has_them_when_not_strict(tmp_path, good):
    """strict=False stores an episode whose end flag comes before its last step as the file has it (neither
    cut nor repaired: the episode is the file's); strict refuses it and says how to keep it."""
    src, _ = _minari(tmp_path, good, 1, lambda e: e.update(terminations=np.r_[True, e["terminations"][1:]]))
    with pytest.raises(DatasetError, match=r"step 0, before .*\(pass strict=False to keep them\)"):
        ingest(gf.LocalTable(spec()), src)
    rep = ingest(gf.LocalTable(spec()), src, strict=False)
    assert rep.episodes_stored == len(good) and rep.steps_stored == sum(len(e["rewards"]) for e in good)
    eps = list(read_minari(src, strict=False))
    assert [len(e["done"]) for e in eps] == [len(e["rewards"]) for e in good]  # none cut
    assert eps[1]["done"].tolist() == [True, *good[1]["terminations"][1:].tolist()]  # nor repaired


@pytest.mark.parametrize("kind", ["uint64", "int32", "int64"])
def test_parquet_episode_ids_of_any_integer_type_are_read_in_partitions(tmp_path, kind):
    """Episode ids of the file's own type, uint64 ids at and above 2**63 included, are read the same whether
    the file is one partition or one partition per episode (a partition's row filter compares in the
    column's type), and in the file's order: ids written in another order than ascending were read in file
    order as one partition and ascending as several (30, 10, 20 came as 10, 20, 30)."""
    ids = {"uint64": [7, 2**63 + 5, 2**64 - 1], "int32": [-4, 7, 2**31 - 1], "int64": [30, 10, 20]}[kind]
    col = [i for i in ids for _ in range(2)]
    n = len(col)
    pq.write_table(pa.table({"episode_id": pa.array(col, getattr(pa, kind)()), "step": [0, 1] * 3,
                             "obs_0": np.arange(n, dtype=np.float32), "action": np.zeros(n, np.int64),
                             "reward": np.ones(n, np.float32), "terminal": [False, True] * 3,
                             "truncated": np.zeros(n, bool)}), tmp_path / "p.parquet")  # fmt: skip
    read = {}
    for chunk in (3, 1):
        rep = ingest(gf.LocalTable(gf.TableSpec(episode_columns(1), capacity=100)), tmp_path / "p.parquet",
                     chunk_episodes=chunk)  # fmt: skip
        assert rep.episodes_read == 3 and rep.steps_stored == n
        read[chunk] = [e["obs"][:, 0].tolist() for e in read_parquet(tmp_path / "p.parquet", chunk_episodes=chunk)]
    assert read[1] == read[3] == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]


def _drop_on(name, dask_worker=None):
    return dask_worker.plugins["gear-flow"].host.drop(name)


def test_a_failed_ingestion_leaves_no_trace(client, dataset):
    """One transaction for the whole dataset: a worker that cannot stage its part aborts it everywhere."""
    table = DistributedTable.create(client, spec(), seed=0)
    try:
        bad = table.placement[1]
        assert client.run(_drop_on, table.name, workers=[bad])[bad]  # that worker lost the table
        with pytest.raises(gf.GearFlowError, match="nothing was inserted"):
            ingest(table, dataset["paths"]["d4rl"], chunk_episodes=2)
        info = table.info()
        assert info["totals"]["inserted"] == 0 and info["totals"]["deleted"] == 0 and info["size"] == 0
        assert info["rate_limiter"]["inserts"] == 0 and info["inserts_in_flight"] == 0 and info["coordinator_size"] == 0
    finally:
        table.close()


def test_an_ingestion_the_limiter_can_never_admit_is_refused(client, dataset):
    limiter = gf.SampleToInsertRatio(samples_per_insert=1, min_size_to_sample=1, error_buffer=(0, 3000))
    table = DistributedTable.create(client, spec(), rate_limiter=limiter, seed=0)
    try:
        with pytest.raises(gf.SpecError, match="can never be admitted"):
            ingest(table, dataset["paths"]["d4rl"], chunk_episodes=2, timeout=0.5)
        assert table.info()["totals"]["inserted"] == 0 and table.info()["rate_limiter"]["inserts"] == 0
    finally:
        table.close()


# -- a disk table: validated first, then inserted one partition at a time --------------------------------


def _by_episode_id(table) -> list:
    out = {}
    for sh in table.shards:
        for seq in sh.index.live():
            start, n = int(sh.index.get("start", seq)), int(sh.index.get("length", seq))
            out[int(sh.index.get("episode_id", seq))] = {c: sh.ring.read(c, start, n).tolist() for c in sh.ring.columns}
    return sorted(out.items())


def _peak_bytes(fn) -> int:
    import tracemalloc

    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.fixture(scope="module")
def larger(tmp_path_factory):
    """Ten times the module's dataset: a partition's memory is then far above the ingestion's own overheads."""
    out = tmp_path_factory.mktemp("cartpole-larger")
    args = ["--out", str(out), "--episodes", str(10 * EPISODES), "--seed", "3", "--parquet-files", "3"]
    return make_dataset.main(args)


@pytest.mark.parametrize("fmt", FORMATS)
def test_ingest_into_a_disk_table_streams_partitions_and_stores_what_memory_would(larger, fmt, tmp_path):
    host = gf.LocalTable(spec(capacity=200_000), seed=4)
    disk = gf.LocalTable(spec(capacity=200_000), tier="disk", path=tmp_path / "t", seed=4)
    peaks, reps = {}, {}
    for name, t in (("host", host), ("disk", disk)):

        def run(t=t, name=name):
            reps[name] = ingest(t, source(larger, fmt), fmt=fmt, chunk_episodes=4)

        peaks[name] = _peak_bytes(run)
    a, b = reps["host"], reps["disk"]
    assert b.ok, b.mismatches()
    assert (b.episodes_stored, b.steps_stored) == (10 * EPISODES, larger["steps"])
    assert b.stored_checksums == b.read_checksums == a.read_checksums
    assert b.episode_ids.tolist() == a.episode_ids.tolist()
    # every episode's steps, by id (the partitions were routed one insert at a time, not as one batch)
    assert _by_episode_id(disk) == _by_episode_id(host)
    # one partition (4 of 400 episodes) in memory at a time, not the dataset
    assert peaks["disk"] < peaks["host"] / 5, peaks
    disk.close()
    again = gf.LocalTable.open(tmp_path / "t", verify="full", seed=4)
    assert again.size == larger["steps"]


def test_a_malformed_partition_stops_a_disk_ingestion_before_anything_is_inserted(tmp_path, good):
    src, fname = _minari(tmp_path, good, 5, _nan_at(2))  # a bad episode in the last partitions
    table = gf.LocalTable(spec(), tier="disk", path=tmp_path / "t")
    with pytest.raises(DatasetError, match="nothing was inserted") as ei:
        ingest(table, src, chunk_episodes=1)
    assert fname in str(ei.value)
    assert table.size == 0 and table.info()["totals"]["inserted"] == 0


def test_ingest_into_a_distributed_disk_table_streams_waves_on_the_owning_workers(client, larger, tmp_path):
    table = DistributedTable.create(client, spec(capacity=200_000), tier="disk", path=tmp_path / "d", seed=0)
    try:
        rep = ingest(table, larger["paths"]["parquet"], chunk_episodes=8)
        assert rep.ok, rep.mismatches()
        assert (rep.episodes_stored, rep.steps_stored) == (10 * EPISODES, larger["steps"])
        assert rep.stored_checksums == rep.read_checksums
        for p in rep.partitions:  # read again and inserted by the worker that validated it, into its own shards
            assert p["read_on"] == p["worker"] and all(table.placement[s] == p["worker"] for s in p["shards"])
        assert sorted(rep.episode_ids.tolist()) == list(range(10 * EPISODES))  # one id each, waves or not
        info = table.info()
        assert info["size"] == info["coordinator_size"] == larger["steps"]
        assert all(s["disk"]["bytes_on_disk"] > 0 for s in info["shards"])
        b = table.sample(64, 6)
        assert np.array_equal(np.diff(b["timestep"].numpy(), axis=1), np.ones((64, 5)))
    finally:
        table.close()


@pytest.mark.parametrize("kind", ["local", "local-disk", "distributed", "distributed-disk"])
@pytest.mark.parametrize("chunk, unit", [(1, "episode"), (2, "episode"), (5, "episode"), (2, "step"), (5, "step")])
def test_a_dataset_larger_than_the_table_evicts_its_oldest_episodes_whatever_the_partitions(
    client, tmp_path, kind, chunk, unit
):
    """Episodes of 5, 5, 20, 20, 5, 5, 5, 5 steps into one shard of 25: however the dataset is cut into
    partitions, on either table and tier, with episode or step items, it goes in as inserts of at most a
    shard's capacity and the table keeps the newest episodes, in order, as the report says (a partition of
    40 steps was refused after earlier ones went in, or the whole refused, depending on the partitions and
    the table; a DistributedTable of step items refused any dataset of more steps than it holds at its
    admission, 'can never be stored')."""
    lens = [5, 5, 20, 20, 5, 5, 5, 5]
    n, ends = sum(lens), np.cumsum(lens) - 1
    with h5py.File(tmp_path / "ds.hdf5", "w") as h:
        h["observations"] = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
        h["actions"], h["rewards"] = np.zeros(n, np.int64), np.arange(n, dtype=np.float32)
        h["terminals"], h["timeouts"] = np.isin(np.arange(n), ends), np.zeros(n, bool)
    s = gf.TableSpec(episode_columns(3), capacity=25, num_shards=1, item_unit=unit)
    disk = {"tier": "disk", "path": tmp_path / "t"} if kind.endswith("disk") else {}
    t = gf.LocalTable(s, **disk) if kind.startswith("local") else DistributedTable.create(client, s, **disk)
    try:
        r = ingest(t, tmp_path / "ds.hdf5", chunk_episodes=chunk)
        assert r.episodes_read == 8 and r.episodes_stored == 4 and r.steps_stored == 20
        assert t.info()["size"] == (4 if unit == "episode" else 20)
        assert t.info()["totals"]["inserted"] == (8 if unit == "episode" else 70)
        b = t.sample(16, 5, boundary="pad_tail")
        assert set(b.episode_ids.tolist()) <= {4, 5, 6, 7}  # the newest four, steps 50..69
        rewards = b["reward"].numpy()[b.mask.numpy()]
        assert rewards.min() >= 50 and rewards.max() <= 69
    finally:
        t.close()


def test_datasets_in_edge_cases_are_read_or_refused_in_one_line(client, tmp_path):
    """An empty Minari dataset Minari wrote is 0 episodes (its main file has no bytes); an HDF5 file with
    no episode group and no metadata.json is not Minari's (it read as 0 episodes, ok); one path in a list
    is that path, several D4RL paths are refused (a bare TypeError); a bag element that is no episode is
    refused by name (KeyError, AttributeError); a step table with an episode in two partitions is refused
    on both tables (it went in as pieces, none ended). Nothing is inserted by a refused call."""
    import dask.bag as db
    import dask.dataframe as dd
    import gymnasium as gym
    import pandas as pd
    from minari.dataset.minari_storage import MinariStorage

    from gear_flow.ingest import insert_collection

    t = gf.LocalTable(gf.TableSpec(episode_columns(3), capacity=100))
    (tmp_path / "empty" / "data").mkdir(parents=True)
    MinariStorage.new(tmp_path / "empty" / "data", observation_space=gym.spaces.Box(-1, 1, (3,), np.float32),
                      action_space=gym.spaces.Discrete(2), data_format="hdf5")  # fmt: skip
    assert ingest(t, tmp_path / "empty").episodes_read == 0
    n = 8
    with h5py.File(tmp_path / "main_data.hdf5", "w") as h:  # a D4RL file under Minari's file name
        h["observations"], h["actions"] = np.zeros((n, 3), np.float32), np.zeros(n, np.int64)
        h["rewards"], h["terminals"], h["timeouts"] = np.ones(n, np.float32), np.arange(n) == n - 1, np.zeros(n, bool)
    with pytest.raises(DatasetError, match="holds no episode_\\* group and there is no metadata.json"):
        ingest(t, tmp_path / "main_data.hdf5", fmt="minari")
    (tmp_path / "main_data.hdf5").rename(tmp_path / "d4rl.hdf5")
    assert ingest(t, [tmp_path / "d4rl.hdf5"], fmt="d4rl").episodes_read == 1
    with pytest.raises(gf.SpecError, match="a d4rl dataset is one file; got 2 paths"):
        ingest(t, [tmp_path / "d4rl.hdf5"] * 2, fmt="d4rl")
    before = t.size
    ep = {"obs": np.zeros((3, 3), np.float32), "action": np.zeros(3, np.int64), "reward": np.ones(3, np.float32),
          "done": np.array([False, False, True])}  # fmt: skip
    for bad in ({k: v for k, v in ep.items() if k != "reward"}, [1, 2]):
        with pytest.raises(DatasetError, match="partition 0, episode 1: a (dict|list) without 'reward'"):
            insert_collection(t, db.from_sequence([ep, bad], npartitions=1))
    frame = pd.DataFrame({"episode_id": [0] * 5, "step": range(5), "reward": np.ones(5, np.float32),
                          "terminal": [False] * 4 + [True], "truncated": [False] * 5, "action": np.zeros(5, np.int64),
                          **{f"obs_{i}": np.zeros(5, np.float32) for i in range(3)}})  # fmt: skip
    split = dd.from_pandas(frame, npartitions=2, sort=False)
    assert split.npartitions == 2
    d = DistributedTable.create(client, gf.TableSpec(episode_columns(3), capacity=100), seed=0)
    try:
        for table in (t, d):
            with pytest.raises(DatasetError, match="the episode is in partitions 0 and 1"):
                insert_collection(table, split)
        assert d.info()["size"] == 0
    finally:
        d.close()
    assert t.size == before
    assert insert_collection(t, dd.from_pandas(frame, npartitions=1)) == 1
