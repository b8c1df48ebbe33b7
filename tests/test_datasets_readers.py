"""Datasets written by their real tools, ingested, compared exactly with what the tool's own reader returns.

Minari datasets are written by Minari's ``DataCollector`` in its three storage
formats (with a Dict/Tuple observation space) and read back with
``minari.load_dataset``; D4RL files are written with h5py in D4RL's documented
layout (the variants d4rl 1.1's ``get_dataset`` accepts); LeRobot-style Parquet
is written with pandas/pyarrow.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import gear_flow as gf
from gear_flow.errors import DatasetError
from gear_flow.ingest import LEROBOT, ColumnMap, detect_format, episode_columns, ingest, read_d4rl, read_parquet
from gear_flow.ingest.shards import read_episodes

h5py = pytest.importorskip("h5py")
minari = pytest.importorskip("minari")
gym = pytest.importorskip("gymnasium")

pytestmark = pytest.mark.timeout(120)


class GoalEnv(gym.Env):
    """Dict observation with a nested Tuple (goal-conditioned style), continuous actions, both kinds of ending."""

    observation_space = gym.spaces.Dict(
        {
            "position": gym.spaces.Box(-10, 10, (2,), np.float32),
            "goal": gym.spaces.Tuple((gym.spaces.Box(-1, 1, (3,), np.float64), gym.spaces.Discrete(4))),
        }
    )
    action_space = gym.spaces.Box(-1, 1, (2,), np.float32)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self.observation_space.sample(), {}

    def step(self, action):
        self.t += 1
        terminated = self.t >= 5 and self.np_random.random() < 0.4
        return self.observation_space.sample(), float(self.np_random.normal()), terminated, self.t >= 9, {}


EPISODES = 6


@pytest.fixture(scope="module")
def minari_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("minari")
    mp = pytest.MonkeyPatch()
    mp.setenv("MINARI_DATASETS_PATH", str(root))
    for fmt in ("hdf5", "arrow", "parquet"):
        env = minari.DataCollector(GoalEnv(), data_format=fmt)
        env.observation_space.seed(1)
        env.action_space.seed(1)
        env.reset(seed=1)
        for _ in range(EPISODES):
            done = False
            while not done:
                _, _, te, tr, _ = env.step(env.action_space.sample())
                done = te or tr
            env.reset()
        env.create_dataset(dataset_id=f"test/goal-{fmt}-v0", algorithm_name="random")
        env.close()
    yield root
    mp.undo()


GOAL_COLS = {"position": 2, "goal__0": 3, "goal__1": 1}


def _table_episodes(table):
    eps = [x for sh in table.shards for x in read_episodes(sh)]
    return [e for _, e in sorted(eps, key=lambda x: x[0])]


@pytest.mark.parametrize("data_format", ["hdf5", "arrow", "parquet"])
def test_minari_storage_formats_with_dict_tuple_spaces_match_minari(minari_root, data_format):
    path = minari_root / "test" / f"goal-{data_format}-v0"
    assert detect_format(path) == "minari"  # the parquet storage is not mistaken for our step tables
    spec = gf.TableSpec(
        episode_columns(GOAL_COLS, np.float32, (2,), next_obs=True, float_dtype=np.float64), capacity=500, num_shards=2
    )
    table = gf.LocalTable(spec)
    rep = ingest(table, path)
    assert rep.ok and rep.episodes_stored == EPISODES
    ours = _table_episodes(table)
    theirs = list(minari.load_dataset(f"test/goal-{data_format}-v0").iterate_episodes())
    assert rep.source_ids == [m.id for m in theirs]
    for e, m in zip(ours, theirs):
        o = m.observations
        assert np.array_equal(e["obs__position"], o["position"][:-1])
        assert np.array_equal(e["next_obs__position"], o["position"][1:])  # the final observation is kept
        assert e["obs__goal__0"].dtype == np.float64 and np.array_equal(e["obs__goal__0"], o["goal"][0][:-1])
        assert np.array_equal(e["obs__goal__1"][:, 0], o["goal"][1][:-1])
        assert np.array_equal(e["action"], m.actions)
        assert e["reward"].dtype == np.float64 and np.array_equal(e["reward"], m.rewards)  # float64 kept exactly
        assert np.array_equal(e["done"], m.terminations) and np.array_equal(e["truncated"], m.truncations)
        assert np.array_equal(e["rtg"], np.cumsum(m.rewards[::-1])[::-1])


def test_minari_table_without_next_obs_and_missing_leaf_is_clear(minari_root):
    path = minari_root / "test" / "goal-arrow-v0"
    spec = gf.TableSpec(episode_columns({"position": 2, "velocity": 2}, np.float32, (2,)), capacity=500)
    with pytest.raises(DatasetError, match=r"no column 'obs__velocity'.*nothing was inserted"):
        ingest(gf.LocalTable(spec), path)


# -- D4RL variants d4rl 1.1's reader accepts ---------------------------------------------------------


def _d4rl(path, n=12, ends=(3, 8), timeouts=True, column=False, float_actions=False, next_obs=True):
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(n + 1, 3)).astype(np.float32)
    term = np.isin(np.arange(n), ends[:1])
    tout = np.isin(np.arange(n), ends[1:])
    data = {
        "observations": obs[:-1],
        "actions": (np.arange(n) % 3).astype(np.float32 if float_actions else np.int64),
        "rewards": rng.normal(size=n).astype(np.float32),
        "terminals": term,
    }
    if next_obs:
        data["next_observations"] = obs[1:]
    if timeouts:
        data["timeouts"] = tout
    if column:  # (N, 1), as some releases store them
        data["rewards"] = data["rewards"][:, None]
        data["terminals"] = data["terminals"][:, None]
    with h5py.File(path, "w") as f:
        for k, v in data.items():
            f.create_dataset(k, data=v)
    return data


def _d4rl_reference(path):
    """What d4rl 1.1's get_dataset returns: every key read as an array, rewards/terminals squeezed."""
    with h5py.File(path, "r") as f:
        data = {k: f[k][()] for k in f.keys()}
    for k in ("rewards", "terminals", "timeouts"):
        if k in data and data[k].ndim == 2:
            data[k] = data[k][:, 0]
    return data


@pytest.mark.parametrize(
    "variant",
    [{}, {"column": True}, {"float_actions": True}, {"timeouts": False}],
    ids=["plain", "Nx1-rewards-terminals", "float-actions-into-int", "no-timeouts"],
)
def test_d4rl_variants_ingest_exactly(tmp_path, variant):
    p = tmp_path / "d.hdf5"
    _d4rl(p, **variant)
    ref = _d4rl_reference(p)
    table = gf.LocalTable(gf.TableSpec(episode_columns(3, next_obs=True), capacity=100))
    rep = ingest(table, p)
    assert rep.ok
    eps = _table_episodes(table)
    bounds = [0, 4, 9, 12] if variant.get("timeouts", True) else [0, 4, 12]
    assert [len(e["reward"]) for e in eps] == np.diff(bounds).tolist()
    for e, a, b in zip(eps, bounds[:-1], bounds[1:]):
        assert np.array_equal(e["obs"], ref["observations"][a:b])
        assert np.array_equal(e["next_obs"], ref["next_observations"][a:b])
        assert e["action"].dtype == np.int64 and np.array_equal(e["action"], ref["actions"][a:b])
        assert np.array_equal(e["reward"], ref["rewards"][a:b])
        assert e["done"][-1] == ref["terminals"][b - 1] and e["truncated"][-1] == (not ref["terminals"][b - 1])


def test_d4rl_without_timeouts_split_by_max_episode_steps(tmp_path):
    p = tmp_path / "old.hdf5"
    _d4rl(p, n=12, ends=(3,), timeouts=False)
    lengths = [len(e["reward"]) for e in read_d4rl(p, max_episode_steps=5)]
    assert lengths == [4, 5, 3]


def test_d4rl_fractional_actions_into_int_column_and_truncation_without_next_obs_are_clear(tmp_path):
    p = tmp_path / "frac.hdf5"
    _d4rl(p, float_actions=True)
    with h5py.File(p, "a") as f:
        f["actions"][5] = 0.5
    with pytest.raises(
        DatasetError, match=r"episode 1: action\[1\] = 0\.5 is not a whole number.*nothing was inserted"
    ):
        ingest(gf.LocalTable(gf.TableSpec(episode_columns(3), capacity=100)), p)
    # whole numbers that the column's type does not hold were cast, wrapping round (300 stored as 44 in int8,
    # -1 as 255 in uint8), where the same values from an integer file were refused
    for value, dtype, shown in (
        (300.0, np.int8, "300"),
        (-1.0, np.uint8, "-1"),
        (2.0**63, np.int64, "9223372036854775808"),
    ):
        with h5py.File(p, "a") as f:
            f["actions"][5] = value
        table = gf.LocalTable(gf.TableSpec(episode_columns(3, action_dtype=dtype), capacity=100))
        with pytest.raises(
            DatasetError, match=rf"episode 1: action: value {shown} does not fit .*nothing was inserted"
        ):
            ingest(table, p)
        assert table.size == 0
    q = tmp_path / "nonext.hdf5"
    _d4rl(q, next_obs=False)
    with pytest.raises(DatasetError, match=r"episode 1 \(rows 4\.\.8\).*no next observation"):
        ingest(gf.LocalTable(gf.TableSpec(episode_columns(3, next_obs=True), capacity=100)), q)


def test_corrupted_hdf5_names_file_and_rows_and_inserts_nothing(tmp_path):
    p = tmp_path / "big.hdf5"
    n = 20_000
    with h5py.File(p, "w") as f:
        f.create_dataset("observations", data=np.ones((n, 3), np.float32), chunks=(1000, 3), compression="gzip")
        for k, v in {"actions": np.zeros(n, np.int64), "rewards": np.ones(n, np.float32)}.items():
            f.create_dataset(k, data=v)
        f.create_dataset("terminals", data=np.arange(n) % 1000 == 999)
        f.create_dataset("timeouts", data=np.zeros(n, bool))
        off = f["observations"].id.get_chunk_info(5).byte_offset
    raw = bytearray(p.read_bytes())
    raw[off : off + 64] = b"\xff" * 64  # damage one compressed chunk inside the file (not a truncation)
    p.write_bytes(bytes(raw))
    table = gf.LocalTable(gf.TableSpec(episode_columns(3), capacity=n))
    with pytest.raises(DatasetError, match=r"big\.hdf5, episode \d+\.\. \(rows .*cannot be read.*nothing was inserted"):
        ingest(table, p, chunk_episodes=4)
    assert table.size == 0


# -- Parquet from other tools: a column mapping ---------------------------------------------------------


def _lerobot(directory, per_file: bool, episodes=4):
    rng = np.random.default_rng(3)
    frames, idx = [], 0
    for ep in range(episodes):
        T = 5 + ep
        frames.append(
            pd.DataFrame(
                {
                    "observation.state": list(rng.normal(size=(T, 6)).astype(np.float32)),
                    "action": list(rng.normal(size=(T, 2)).astype(np.float32)),
                    "episode_index": np.full(T, ep, np.int64),
                    "frame_index": np.arange(T, dtype=np.int64),
                    "timestamp": np.arange(T, dtype=np.float32) / 30,
                    "next.reward": rng.normal(size=T).astype(np.float32),
                    "next.done": np.arange(T) == T - 1,
                    "index": np.arange(idx, idx + T, dtype=np.int64),
                    "task_index": np.zeros(T, np.int64),
                }
            ).sample(frac=1.0, random_state=ep)  # rows out of order: frame_index orders them
        )
        idx += T
    directory.mkdir(parents=True)
    if per_file:  # LeRobot v2: data/chunk-000/episode_000000.parquet
        for ep, fr in enumerate(frames):
            fr.to_parquet(directory / f"episode_{ep:06d}.parquet", index=False)
    else:
        pd.concat(frames).to_parquet(directory / "episodes.parquet", index=False)
    return {ep: fr.sort_values("frame_index") for ep, fr in enumerate(frames)}


def _stored_by_source(table, rep):
    by_src = dict(zip(rep.episode_ids.tolist(), rep.source_ids))
    return [e for _eid, e in sorted((x for sh in table.shards for x in read_episodes(sh)), key=lambda x: by_src[x[0]])]


@pytest.mark.parametrize("per_file", [True, False], ids=["episode-per-file", "many-per-file"])
@pytest.mark.parametrize("how", ["detected", "ColumnMap", "dict"])
def test_lerobot_parquet_detected_or_mapped(tmp_path, per_file, how):
    """LeRobot's layout read as it is: detected from its columns (and named in the report), given as a
    ColumnMap, or given as a dict of file column -> role (over the detected layout)."""
    src = _lerobot(tmp_path / "data" / "chunk-000", per_file)
    spec = gf.TableSpec(episode_columns(6, np.float32, (2,)), capacity=200, num_shards=2)
    table = gf.LocalTable(spec)
    columns = {"detected": None, "ColumnMap": LEROBOT, "dict": {"next.reward": "reward"}}[how]
    rep = ingest(table, tmp_path / "data", columns=columns)
    assert rep.layout == (None if how == "ColumnMap" else "lerobot")
    assert rep.ok and rep.episodes_stored == 4 and sorted(rep.source_ids) == [0, 1, 2, 3]
    for e, ref in zip(_stored_by_source(table, rep), src.values()):
        assert np.array_equal(e["obs"], np.stack(ref["observation.state"].to_numpy()))
        assert np.array_equal(e["action"], np.stack(ref["action"].to_numpy()))
        assert np.array_equal(e["reward"], ref["next.reward"].to_numpy())
        assert e["done"][-1] and not e["truncated"].any()  # next.done: terminal; no truncation column
    assert [len(e["reward"]) for e in read_parquet(tmp_path / "data")] == [5, 6, 7, 8]  # the reader detects too


def test_a_plain_dict_of_columns_and_its_errors(tmp_path):
    """A dict is the file column -> role mappings over the detected layout; anything else, or a bad role, is
    refused in one line naming ColumnMap or the roles, before anything is read."""
    df = pd.DataFrame({"episode_id": [3, 3, 3], "step": [0, 1, 2], "pos": [1.0, 2.0, 3.0], "action": [0, 1, 0],
                       "reward": [1.0, 0.0, 1.0], "terminal": [False, False, True], "truncated": [False] * 3})  # fmt: skip
    df.to_parquet(tmp_path / "x.parquet", index=False)
    spec = gf.TableSpec(episode_columns(1), capacity=100)
    table = gf.LocalTable(spec)
    rep = ingest(table, tmp_path / "x.parquet", columns={"pos": "obs"})
    assert rep.ok and rep.layout == "gear-flow" and rep.steps_stored == 3
    df.rename(columns={"episode_id": "ep"}).to_parquet(tmp_path / "y.parquet", index=False)  # neither layout
    with pytest.raises(DatasetError, match=r"'episode_id' is missing.*columns="):  # says how to map it
        ingest(gf.LocalTable(spec), tmp_path / "y.parquet")
    with pytest.raises(gf.SpecError, match="ColumnMap or a dict"):
        ingest(gf.LocalTable(spec), tmp_path / "x.parquet", columns=[("pos", "obs")])
    with pytest.raises(gf.SpecError, match="roles are"):
        ingest(gf.LocalTable(spec), tmp_path / "x.parquet", columns={"pos": "observation"})
    with pytest.raises(gf.SpecError, match="str -> str"):
        ColumnMap({"pos": 0})


def test_parquet_written_by_pandas_with_an_index_named_like_a_column(tmp_path):
    """pandas writes an index named "step" next to the "step" column; its own read_parquet rebuilds the index,
    ours reads the columns as stored (no "cannot insert step, already exists")."""
    rows = [{"episode_id": e, "step": t, "obs_0": float(10 * e + t), "action": t % 2, "reward": 1.0,
             "terminal": t == 3, "truncated": False} for e in range(2) for t in range(4)]  # fmt: skip
    pd.DataFrame(rows).set_index("step", drop=False).to_parquet(tmp_path / "idx.parquet")
    table = gf.LocalTable(gf.TableSpec(episode_columns(1), capacity=100))
    rep = ingest(table, tmp_path / "idx.parquet")
    assert rep.ok and rep.episodes_stored == 2
    assert [e["obs"][:, 0].tolist() for e in _stored_by_source(table, rep)] == [[0, 1, 2, 3], [10, 11, 12, 13]]


def test_column_mapping_from_cli_text_and_no_truncation(tmp_path):
    from gear_flow.ingest.columns import parse_columns

    m = parse_columns("observation.state=obs,next.reward=reward,next.done=terminal", episode="episode_index",
                      step="frame_index", no_truncation=True)  # fmt: skip
    assert m.source("obs") == "observation.state" and m.truncated is None and m.episode == "episode_index"
    assert parse_columns(layout="lerobot") == LEROBOT and parse_columns() is None
    with pytest.raises(gf.SpecError, match="roles are"):
        ColumnMap({"x": "pixels"})
    # an episode that ends without terminating, in a layout without a truncation column, was cut
    df = pd.DataFrame({"ep": [7, 7, 7], "o": [1.0, 2.0, 3.0], "action": [0, 1, 0], "r": [1.0, 1.0, 1.0],
                       "d": [False, False, False]})  # fmt: skip
    df.to_parquet(tmp_path / "x.parquet", index=False)
    cm = ColumnMap({"o": "obs", "r": "reward", "d": "terminal"}, episode="ep", step=None, truncated=None)
    (e,) = read_parquet(tmp_path / "x.parquet", columns=cm)
    assert e["truncated"].tolist() == [False, False, True] and not e["done"].any()
