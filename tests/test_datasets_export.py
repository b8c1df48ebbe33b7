"""Export and tables as Dask collections: round trips, Minari loading its export, query → select → export on a cluster.

Real files in tmp_path, a real LocalCluster with two worker processes.
"""

from __future__ import annotations

import sys
from pathlib import Path

import dask
import dask.bag as db
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest
from distributed import Client, LocalCluster

import gear_flow as gf
from gear_flow.distributed import DistributedTable
from gear_flow.errors import DatasetError
from gear_flow.ingest import episode_columns, episodes, export, ingest, insert_collection, select
from gear_flow.ingest.shards import read_episodes

h5py = pytest.importorskip("h5py")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pipelines"))
import make_dataset  # noqa: E402

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    out = tmp_path_factory.mktemp("cartpole")
    return make_dataset.main(["--out", str(out), "--episodes", "12", "--seed", "4", "--parquet-files", "2"])


def _spec(num_shards=2, **kw):
    return gf.TableSpec(episode_columns(4, next_obs=True, **kw), capacity=20_000, num_shards=num_shards)


def contents(table) -> list[dict]:
    """Every stored episode, in insertion order (local table)."""
    eps = []
    for sh in table.shards:
        with sh.lock:
            live = sh.index.live()
            stamp = dict(zip(sh.index.get("episode_id", live).tolist(), sh.index.get("stamp", live).tolist()))
        eps.extend((stamp[e], ep) for e, ep in read_episodes(sh))
    return [ep for _, ep in sorted(eps, key=lambda x: x[0])]


def assert_same(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b) and a
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for n in x:
            assert x[n].dtype == y[n].dtype and np.array_equal(x[n], y[n]), n


@pytest.mark.parametrize("fmt", ["minari", "d4rl", "parquet"])
def test_a_table_of_scalar_observations_ingests_its_own_export(tmp_path, fmt):
    """``episode_columns(obs_dim=())`` makes a table of one number per step's observation; it exported, but
    its export could not be ingested again (the readers give 1-d observations as ``[T, 1]``, which its
    ``obs`` of shape () refused).  Now the round trip is exact, episode by episode, in order."""
    spec = gf.TableSpec(episode_columns((), next_obs=True), capacity=100)
    table = gf.LocalTable(spec)
    rng = np.random.default_rng(0)
    for T in (3, 5):
        o, r = rng.standard_normal(T + 1).astype(np.float32), np.arange(1, T + 1, dtype=np.float32)
        table.insert({"obs": o[:T], "next_obs": o[1:], "action": rng.integers(0, 3, T), "reward": r,
                      "done": np.arange(T) == T - 1, "truncated": np.zeros(T, bool),
                      "rtg": r[::-1].cumsum()[::-1], "timestep": np.arange(T)})  # fmt: skip
    target = tmp_path / ("out.hdf5" if fmt == "d4rl" else "out")
    assert export(table, target, fmt).ok
    again = gf.LocalTable(spec)
    assert ingest(again, target, fmt=fmt).ok
    assert_same(contents(table), contents(again))


@pytest.mark.parametrize("fmt", ["minari", "d4rl", "parquet"])
def test_ingest_export_ingest_gives_an_identical_table(tmp_path, dataset, fmt):
    table = gf.LocalTable(_spec())
    assert ingest(table, dataset["paths"]["minari"]).ok
    target = tmp_path / ("out.hdf5" if fmt == "d4rl" else "out")
    rep = export(table, target, fmt)
    assert rep.ok, rep.mismatches()
    assert rep.episodes == 12 and rep.steps == dataset["steps"] and set(rep.table_checksums) >= {"obs", "reward"}
    again = gf.LocalTable(_spec())
    rep2 = ingest(again, target, fmt=fmt)
    assert rep2.ok and rep2.steps_stored == dataset["steps"]
    assert_same(contents(table), contents(again))


def test_exports_that_re_ingesting_would_not_rebuild_are_refused(tmp_path):
    """D4RL marks episodes only by ``done`` and ``truncated``: an episode ending on a step flagged neither, or
    flagged before its last step, is refused (it was merged with the next on re-ingest, the report saying
    ok).  Parquet writes a vector column ``x`` as ``x_0``, ``x_1``, ...: a table with a column named like one
    of them is refused (its values were read back into the other)."""
    table = gf.LocalTable(_spec())
    ep = {n: np.zeros((5, *table.spec.column(n).shape), table.spec.column(n).dtype) for n in table.spec.names}
    table.insert([ep, {**ep, "done": np.arange(5) == 4}])
    with pytest.raises(gf.SpecError, match="ends on a step flagged neither"):
        export(table, tmp_path / "a.hdf5", "d4rl")
    flagged = gf.LocalTable(_spec())
    flagged.insert([{**ep, "done": np.arange(5) >= 2}])
    with pytest.raises(gf.SpecError, match="before its last step"):
        export(flagged, tmp_path / "b.hdf5", "d4rl")
    cols = (gf.ColumnSpec("obs__x", (2,), np.float32), gf.ColumnSpec("obs__x_0", (), np.float32))
    names = {c.name for c in table.spec.columns if not c.name.startswith("obs") and not c.name.startswith("next_obs")}
    spec = gf.TableSpec(cols + tuple(c for c in table.spec.columns if c.name in names), capacity=100)
    with pytest.raises(gf.SpecError, match="'obs__x' and 'obs__x_0'"):
        export(gf.LocalTable(spec), tmp_path / "c", "parquet")


@pytest.mark.parametrize("fmt", ["d4rl", "parquet", "minari"])
def test_a_float64_table_exported_exactly_reports_ok(tmp_path, fmt):
    """The written data summed as the table's are (each episode's rows, then the episodes exactly): a float64
    table that round-trips bit for bit reports ok.  Summed by whole files (D4RL) or sub-columns (Parquet),
    the sums differed in their last bits and the report said the export was wrong."""
    rng = np.random.default_rng(0)
    table = gf.LocalTable(gf.TableSpec(episode_columns(3, float_dtype=np.float64), capacity=1000))
    eps = []
    for T in (37, 51, 23, 64):
        eps.append({"obs": rng.standard_normal((T, 3)), "action": rng.integers(0, 3, T), "reward": rng.standard_normal(T),
                    "done": np.arange(T) == T - 1, "truncated": np.zeros(T, bool), "rtg": np.zeros(T), "timestep": np.arange(T)})  # fmt: skip
    table.insert(eps)
    rep = export(table, tmp_path / ("out.hdf5" if fmt == "d4rl" else "out"), fmt)
    assert rep.ok, rep.mismatches()
    assert rep.table_checksums == rep.written_checksums and rep.episodes == 4


@pytest.mark.parametrize("fmt", ["d4rl", "parquet", "minari"])
def test_nan_and_infinities_round_trip_and_both_reports_say_ok(tmp_path, fmt):
    """A reward column holding a NaN, or both infinities, sums to NaN on both sides, and NaN != NaN: the export
    and the ingest of its files both reported a checksum mismatch ("table nan, written nan") though every value
    came back bit for bit.  Both say ok now, and the data is the same, NaN, -0.0 and infinities in place;
    a NaN on one side only still differs."""
    table = gf.LocalTable(gf.TableSpec(episode_columns(2, derived=False), capacity=100))
    rewards = [np.array([1, np.nan, -0.0, 3], np.float32), np.array([np.inf, -np.inf, 2], np.float32)]
    table.insert([{"obs": np.ones((len(r), 2), np.float32), "action": np.arange(len(r)), "reward": r,
                   "done": np.arange(len(r)) == len(r) - 1, "truncated": np.zeros(len(r), bool)} for r in rewards])  # fmt: skip
    target = tmp_path / ("out.hdf5" if fmt == "d4rl" else "out")
    rep = export(table, target, fmt)
    assert rep.ok, rep.mismatches()
    again = gf.LocalTable(table.spec)
    back = ingest(again, target, fmt=fmt, strict=False)  # (strict refuses rewards that are not finite)
    assert back.ok, back.mismatches()
    got = [ep["reward"] for ep in contents(again)]
    assert [g.tobytes() for g in got] == [r.tobytes() for r in rewards]
    from gear_flow.ingest.common import same_checksum

    assert not same_checksum(float("nan"), 1.0) and not same_checksum(None, 0.0) and same_checksum(None, None)


def test_minari_loads_the_exported_dataset(tmp_path, dataset, monkeypatch):
    minari = pytest.importorskip("minari")
    table = gf.LocalTable(_spec())
    ingest(table, dataset["paths"]["d4rl"])
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path))
    rep = export(
        table, tmp_path / "gearflow" / "cartpole-export-v0", "minari", dataset_id="gearflow/cartpole-export-v0"
    )
    assert rep.ok
    ds = minari.load_dataset("gearflow/cartpole-export-v0")
    assert ds.total_episodes == 12 and ds.total_steps == dataset["steps"]
    for m, e in zip(ds.iterate_episodes(), contents(table)):
        assert np.array_equal(m.observations[:-1], e["obs"]) and np.array_equal(m.observations[-1], e["next_obs"][-1])
        assert np.array_equal(m.actions, e["action"]) and np.array_equal(m.rewards, e["reward"])
        assert np.array_equal(m.terminations, e["done"]) and np.array_equal(m.truncations, e["truncated"])


@pytest.mark.parametrize(
    "shape, acts, space",
    [
        ((), [[-3, -1], [1, 0, 0]], "Discrete(5, start=-3)"),
        ((2,), [[[0, 3], [2, 1]], [[1, 1]]], "MultiDiscrete([3 3], start=[0 1])"),
        # both ends of int64: no Discrete counts them (n wrapped round to a negative number): int64's Box
        ((), [[-(2**63), 2**63 - 1]], "Box(-9223372036854775808, 9223372036854775807, (), int64)"),
    ],
)
def test_a_minari_export_names_an_action_space_that_holds_its_actions(tmp_path, monkeypatch, shape, acts, space):
    """The action space was Discrete(largest + 1) from 0: negative actions fell outside it, and integer
    actions of shape (2,) got a space of scalars.  It is now the least that holds them: Discrete from the
    least value, MultiDiscrete element by element; Minari loads every action inside it, and the export
    ingests back exactly."""
    minari = pytest.importorskip("minari")
    spec = gf.TableSpec(episode_columns(2, np.int64, shape), capacity=50)
    table = gf.LocalTable(spec)
    for a in acts:
        T, r = len(a), np.ones(len(a), np.float32)
        table.insert({"obs": np.zeros((T, 2), np.float32), "action": np.array(a), "reward": r, "done": np.arange(T) == T - 1,
                      "truncated": np.zeros(T, bool), "rtg": r[::-1].cumsum()[::-1], "timestep": np.arange(T)})  # fmt: skip
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path))
    assert export(table, tmp_path / "gf" / "acts-v0", "minari", dataset_id="gf/acts-v0").ok
    ds = minari.load_dataset("gf/acts-v0")
    assert str(ds.action_space) == space
    got = [m.actions for m in ds.iterate_episodes()]
    assert [g.tolist() for g in got] == acts and all(ds.action_space.contains(x) for g in got for x in g)
    again = gf.LocalTable(spec)
    assert ingest(again, tmp_path / "gf" / "acts-v0", fmt="minari").ok
    assert_same(contents(table), contents(again))


def test_episodes_frame_and_local_select(dataset):
    table = gf.LocalTable(_spec())
    rep = ingest(table, dataset["paths"]["minari"])
    df = table.episodes(rep)
    assert isinstance(df, dd.DataFrame) and df.npartitions == 2
    pdf = df.compute()
    assert sorted(pdf["episode_id"]) == sorted(rep.episode_ids.tolist())
    assert dict(zip(pdf["episode_id"], pdf["source_id"])) == rep.source_map()
    assert pdf["length"].sum() == dataset["steps"] and (pdf["return"] == pdf["length"]).all()  # CartPole: 1 per step
    assert (pdf["mean_priority"] == 1.0).all() and (pdf["times_sampled"] == -1).all()
    top = df[df["return"] >= 100]
    new = table.select(top)
    assert new.size == int(top["length"].sum().compute()) and len(top) >= 3
    kept = [e for e in contents(table) if float(e["reward"].sum()) >= 100]
    assert_same(kept, contents(new))


def test_insert_a_dask_bag_of_episodes_like_ingestion(dataset):
    src = gf.LocalTable(_spec())
    ingest(src, dataset["paths"]["minari"])
    eps = [{k: e[k] for k in ("obs", "next_obs", "action", "reward", "done", "truncated")} for e in contents(src)]
    table = gf.LocalTable(_spec())
    assert insert_collection(table, db.from_sequence(eps, npartitions=3)) == 12
    assert_same(contents(src), contents(table))  # rtg/timestep derived as at ingestion
    bad = [dict(e) for e in eps]
    bad[5] = {**bad[5], "reward": np.r_[np.nan, bad[5]["reward"][1:]].astype(np.float32)}
    empty = gf.LocalTable(_spec())
    with pytest.raises(DatasetError, match=r"partition 1, episode \d: reward\[0\] is not finite.*nothing was inserted"):
        insert_collection(empty, db.from_sequence(bad, npartitions=3))
    assert empty.size == 0


# -- on a 2-worker cluster ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def client():
    with dask.config.set({"distributed.comm.timeouts.connect": "5s"}):
        with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
            with Client(cluster) as c:
                yield c


OBS = 256


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """40 episodes x 100 steps of float32[256] observations (~4 MB), D4RL layout, returns 0..39."""
    p = tmp_path_factory.mktemp("big") / "big.hdf5"
    n, T = 40, 100
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(n * T, OBS)).astype(np.float32)
    rewards = np.repeat(np.arange(n, dtype=np.float32), T) / T
    with h5py.File(p, "w") as f:
        f.create_dataset("observations", data=obs)
        f.create_dataset("next_observations", data=np.roll(obs, -1, axis=0))
        f.create_dataset("actions", data=np.zeros(n * T, np.int64))
        f.create_dataset("rewards", data=rewards)
        f.create_dataset("terminals", data=np.arange(n * T) % T == T - 1)
        f.create_dataset("timeouts", data=np.zeros(n * T, bool))
    return p


class BytesIn:
    """Bytes the client process reads from its Dask TCP comms (wraps distributed's own frame reader)."""

    def __init__(self, monkeypatch):
        import distributed.comm.tcp as tcp

        self.n = 0
        real = tcp.read_bytes_rw

        async def counting(stream, n):
            self.n += n
            return await real(stream, n)

        monkeypatch.setattr(tcp, "read_bytes_rw", counting)


def test_query_select_export_on_a_cluster_never_moves_steps_through_the_client(client, big, tmp_path, monkeypatch):
    spec = gf.TableSpec(episode_columns(OBS, next_obs=True), capacity=4000, num_shards=2)
    table = DistributedTable.create(client, spec, seed=0)
    try:
        rep = ingest(table, big)
        assert rep.ok and rep.episodes_stored == 40
        counter = BytesIn(monkeypatch)
        df = episodes(table, rep)
        assert df.npartitions == 2
        top = df.nlargest(int(np.ceil(0.1 * len(df))), "return")  # the top 10% by return, for BC
        best = select(table, top)
        out = table.export(tmp_path / "top", "parquet", episodes=top)
        received = counter.n
        print(f"client received {received} bytes over the comm during query, select and export")
        chosen = sorted(top.compute()["source_id"].tolist())  # (top["source_id"] trips a dask-expr bug)
        assert chosen == list(range(36, 40))  # returns are 0..39
        assert out.ok and out.episodes == 4 and out.steps == 400 and len(out.workers) == 2
        step_bytes = 400 * spec.step_nbytes  # ~0.8 MB selected, ~8 MB in the table
        assert received < step_bytes / 4, (received, step_bytes)
        assert best.info()["size"] == 400
        # control: the counter does see step data when it is pulled to the client over the comm
        # (with shared memory, a client on the workers' machine reads it without the comm; with a TCP lane,
        # over the worker's lane)
        before = counter.n
        with dask.config.set({"gear-flow.distributed.shared-memory": False, "gear-flow.distributed.tcp-lane": False}):
            best.sample(8, 100)
        assert counter.n - before > 8 * 100 * OBS * 4
        # the export is the chosen episodes, bit for bit
        back = gf.LocalTable(spec)
        ingest(back, tmp_path / "top")
        with h5py.File(big) as f:
            obs = f["observations"][3600:]
        got = np.concatenate([e["obs"] for e in contents(back)])
        assert np.array_equal(np.sort(got, axis=0), np.sort(obs, axis=0))
        best.close()
    finally:
        table.close()


def test_insert_a_dask_dataframe_into_a_distributed_table(client, dataset):
    table = DistributedTable.create(client, _spec(), seed=0)
    try:
        frame = dd.from_pandas(pd.read_parquet(dataset["paths"]["parquet_files"][0]), npartitions=1)
        n = insert_collection(table, frame)
        assert n > 0 and table.info()["size"] == len(frame)
    finally:
        table.close()
