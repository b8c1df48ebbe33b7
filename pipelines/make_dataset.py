"""Generate a deterministic, mixed-quality offline dataset from gymnasium's CartPole-v1.

Scripted controllers at five skill levels, each with epsilon-random noise, act
in ``CartPole-v1`` (pure Python, no system libraries); the episodes are written
in three layouts that ``gear_flow.ingest`` reads:

- Minari: ``<out>/minari/<dataset_id>/data/{main_data.hdf5, metadata.json}``
  (one ``episode_{i}`` group per episode with ``observations`` [T+1, 4],
  ``actions``, ``rewards``, ``terminations``, ``truncations``);
- D4RL-style flat HDF5: ``<out>/d4rl/<dataset_id>.hdf5`` (``observations,
  next_observations, actions, rewards, terminals, timeouts`` over all steps);
- Parquet step tables: ``<out>/parquet/<dataset_id>/part-*.parquet`` (one row
  per step, ``episode_id``, ``step``, ``obs_0..obs_3``, ``action``, ``reward``,
  ``terminal``, ``truncated``; an episode never spans files).

Skill levels (policy ``u = 1 if w . obs > 0`` over ``obs = [x, x_dot, theta,
theta_dot]``, a random action with probability ``eps``) and their typical
returns: random (~20), novice (theta only, ~40), weak (~150), medium (~220),
expert (500, the time limit).  Drawn with equal probability the dataset's mean
return is ~190, well below the best (500): a dataset for return-conditioned
offline RL (Decision Transformer).

    python pipelines/make_dataset.py --out data/cartpole --episodes 300 --seed 0
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import numpy as np

ENV_ID = "CartPole-v1"
DATASET_ID = "cartpole-mixed-v0"
#: Minari version whose dataset layout this writes (Minari 0.5.x reads it; the
#: layout is unchanged across 0.5.x for Box observations and Discrete actions)
MINARI_VERSION = "0.5.0"

#: name -> (weights over [x, x_dot, theta, theta_dot], epsilon)
SKILLS = {
    "random": ((0.0, 0.0, 0.0, 0.0), 1.0),
    "novice": ((0.0, 0.0, 1.0, 0.0), 0.1),
    "weak": ((0.0, 0.0, 1.0, 0.2), 0.5),
    "medium": ((0.05, 0.1, 1.0, 0.5), 0.45),
    "expert": ((0.05, 0.1, 1.0, 0.5), 0.02),
}


def generate(episodes: int, seed: int = 0, skills: dict | None = None) -> list[dict]:
    """Roll out ``episodes`` episodes; deterministic in ``seed``.

    Each episode: ``observations`` float32 [T+1, 4], ``actions`` int64 [T],
    ``rewards`` float64 [T], ``terminations``/``truncations`` bool [T],
    ``policy`` (skill name) and ``seed`` (the env reset seed).
    """
    import gymnasium as gym

    skills = SKILLS if skills is None else skills
    names = list(skills)
    env = gym.make(ENV_ID)
    out = []
    for i in range(episodes):
        rng = np.random.default_rng([seed, i])  # episode i is the same whatever the count (prefixes agree)
        level = int(rng.integers(len(names)))
        env_seed = int(rng.integers(2**31 - 1))
        w, eps = skills[names[level]]
        w = np.asarray(w, dtype=np.float64)
        o, _ = env.reset(seed=env_seed)
        obs, acts, rews, terms, truncs = [o], [], [], [], []
        while True:
            a = int(rng.integers(2)) if rng.random() < eps else int(o @ w > 0)
            o, r, term, trunc, _ = env.step(a)
            obs.append(o)
            acts.append(a)
            rews.append(r)
            terms.append(term)
            truncs.append(trunc)
            if term or trunc:
                break
        out.append(
            {
                "observations": np.asarray(obs, dtype=np.float32),
                "actions": np.asarray(acts, dtype=np.int64),
                "rewards": np.asarray(rews, dtype=np.float64),
                "terminations": np.asarray(terms, dtype=np.bool_),
                "truncations": np.asarray(truncs, dtype=np.bool_),
                "policy": names[level],
                "seed": env_seed,
            }
        )
    env.close()
    return out


ARRAYS = ("observations", "actions", "rewards", "terminations", "truncations")


def stats(episodes: list[dict]) -> dict:
    """Episodes, steps, mean/best/worst return, and the same per skill level."""
    rets = np.array([float(np.sum(e["rewards"])) for e in episodes])
    per = {}
    for name in dict.fromkeys(e.get("policy", "?") for e in episodes):
        r = np.array([float(np.sum(e["rewards"])) for e in episodes if e.get("policy", "?") == name])
        per[name] = {"episodes": len(r), "mean_return": float(r.mean())}
    return {
        "episodes": len(episodes),
        "steps": int(sum(len(e["rewards"]) for e in episodes)),
        "mean_return": float(rets.mean()) if len(rets) else 0.0,
        "best_return": float(rets.max()) if len(rets) else 0.0,
        "worst_return": float(rets.min()) if len(rets) else 0.0,
        "median_return": float(np.median(rets)) if len(rets) else 0.0,
        "per_policy": per,
    }


def _spaces() -> tuple[str, str, str]:
    """Minari's serialized observation space, action space and env spec of CartPole-v1."""
    import gymnasium as gym

    env = gym.make(ENV_ID)
    o, a = env.observation_space, env.action_space
    obs = {"type": "Box", "dtype": str(o.dtype), "shape": list(o.shape), "low": o.low.tolist(), "high": o.high.tolist()}
    act = {"type": "Discrete", "dtype": "int64", "start": int(a.start), "n": int(a.n)}
    spec = env.spec.to_json()
    env.close()
    return json.dumps(obs), json.dumps(act), spec


def write_minari(root, episodes: list[dict], dataset_id: str = DATASET_ID, metadata: dict | None = None) -> Path:
    """Write Minari's dataset directory; returns ``<root>/<dataset_id>``.

    Writes whatever arrays each episode dict holds (tests use this to make
    malformed files); per-episode attributes ``id``, ``total_steps``, ``seed``.
    """
    import h5py

    ds_dir = Path(root) / dataset_id
    if ds_dir.exists():
        shutil.rmtree(ds_dir)
    data = ds_dir / "data"
    data.mkdir(parents=True)
    with h5py.File(data / "main_data.hdf5", "w", track_order=True) as f:
        for i, ep in enumerate(episodes):
            g = f.create_group(f"episode_{i}")
            g.attrs["id"] = i
            if "rewards" in ep:
                g.attrs["total_steps"] = len(ep["rewards"])
            if "seed" in ep:
                g.attrs["seed"] = ep["seed"]
            for k in ARRAYS:
                if k in ep:
                    g.create_dataset(k, data=ep[k])
    obs_space, act_space, env_spec = _spaces()
    st = stats(
        [e for e in episodes if np.asarray(e.get("rewards", "")).dtype.kind in "iuf"]
    )  # tolerate test-made bad files
    rand = st["per_policy"].get("random", {}).get("mean_return")
    meta = {
        "dataset_id": dataset_id,
        "total_episodes": len(episodes),
        "total_steps": int(sum(len(e.get("rewards", ())) for e in episodes)),
        "data_format": "hdf5",
        "observation_space": obs_space,
        "action_space": act_space,
        "env_spec": env_spec,
        "minari_version": MINARI_VERSION,
        "algorithm_name": "scripted linear controllers (" + ", ".join(SKILLS) + ") with epsilon-random actions",
        "author": ["gear_flow"],
        "code_permalink": "pipelines/make_dataset.py",
        "description": "Mixed-quality CartPole-v1 dataset for offline RL tests (gear_flow).",
        "requirements": ["gymnasium>=1.0"],
        "ref_min_score": rand if rand is not None else 0.0,
        "ref_max_score": 500.0,
        "num_episodes_average_score": st["per_policy"].get("random", {}).get("episodes", 0),
        "dataset_size": round(sum(p.stat().st_size for p in data.iterdir()) / 1e6, 1),
    }
    meta.update(metadata or {})
    (data / "metadata.json").write_text(json.dumps(meta))
    return ds_dir


def write_d4rl(path, episodes: list[dict]) -> Path:
    """Write the D4RL-style flat HDF5 file (observations without each episode's final one)."""
    import h5py

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    cat = lambda xs, dt: np.concatenate(xs).astype(dt) if xs else np.zeros(0, dt)  # noqa: E731
    with h5py.File(path, "w") as f:
        f.create_dataset(
            "observations", data=np.concatenate([e["observations"][:-1] for e in episodes]).astype(np.float32)
        )
        f.create_dataset(
            "next_observations", data=np.concatenate([e["observations"][1:] for e in episodes]).astype(np.float32)
        )
        f.create_dataset("actions", data=cat([e["actions"] for e in episodes], np.int64))
        f.create_dataset("rewards", data=cat([e["rewards"] for e in episodes], np.float32))
        f.create_dataset("terminals", data=cat([e["terminations"] for e in episodes], np.bool_))
        f.create_dataset("timeouts", data=cat([e["truncations"] for e in episodes], np.bool_))
        f.attrs["env"] = ENV_ID
        f.attrs["dataset_id"] = DATASET_ID
    return path


def write_parquet(directory, episodes: list[dict], files: int = 4) -> list[Path]:
    """Write one row per step into ``files`` Parquet files of consecutive whole episodes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory = Path(directory)
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    paths = []
    for k, idx in enumerate(np.array_split(np.arange(len(episodes)), max(1, min(files, len(episodes))))):
        eps = [episodes[i] for i in idx]
        lens = [len(e["rewards"]) for e in eps]
        obs = np.concatenate([e["observations"][:-1] for e in eps]).astype(np.float32)
        cols = {
            "episode_id": np.repeat(idx.astype(np.int64), lens),
            "step": np.concatenate([np.arange(n, dtype=np.int64) for n in lens]),
            **{f"obs_{j}": obs[:, j] for j in range(obs.shape[1])},
            "action": np.concatenate([e["actions"] for e in eps]).astype(np.int64),
            "reward": np.concatenate([e["rewards"] for e in eps]).astype(np.float32),
            "terminal": np.concatenate([e["terminations"] for e in eps]),
            "truncated": np.concatenate([e["truncations"] for e in eps]),
        }
        p = directory / f"part-{k:05d}.parquet"
        pq.write_table(pa.table(cols), p)
        paths.append(p)
    return paths


def main(argv=None) -> dict:
    """Generate and write the dataset; returns its paths and statistics.

    Returns
    -------
    dict
        ``paths``: ``minari`` (dataset dir), ``minari_root``, ``d4rl`` (file),
        ``parquet`` (directory), ``parquet_files``, ``stats_json``;
        ``dataset_id``, ``env_id``, ``obs_dim``, ``action_dtype``, ``n_actions``;
        ``episodes``, ``steps``, ``mean_return``, ``best_return``,
        ``worst_return``, ``median_return``, ``per_policy``; ``seconds``.
    """
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="data/cartpole", help="output directory")
    p.add_argument("--episodes", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--parquet-files", type=int, default=4)
    p.add_argument("--dataset-id", default=DATASET_ID)
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    out = Path(args.out)
    eps = generate(args.episodes, args.seed)
    minari_dir = write_minari(out / "minari", eps, args.dataset_id)
    d4rl_path = write_d4rl(out / "d4rl" / f"{args.dataset_id}.hdf5", eps)
    pq_dir = out / "parquet" / args.dataset_id
    pq_files = write_parquet(pq_dir, eps, args.parquet_files)
    st = stats(eps)
    result = {
        "paths": {
            "minari": str(minari_dir),
            "minari_root": str(out / "minari"),
            "d4rl": str(d4rl_path),
            "parquet": str(pq_dir),
            "parquet_files": [str(f) for f in pq_files],
            "stats_json": str(out / "stats.json"),
        },
        "dataset_id": args.dataset_id,
        "env_id": ENV_ID,
        "obs_dim": 4,
        "action_dtype": "int64",
        "n_actions": 2,
        "seed": args.seed,
        **st,
    }
    result["seconds"] = round(time.perf_counter() - t0, 3)
    (out / "stats.json").write_text(json.dumps(result, indent=2))
    print(
        f"{st['episodes']} episodes, {st['steps']} steps; return mean {st['mean_return']:.1f}, "
        f"best {st['best_return']:.0f}, worst {st['worst_return']:.0f}; "
        + ", ".join(f"{k} {v['mean_return']:.0f} (x{v['episodes']})" for k, v in st["per_policy"].items())
        + f"; wrote {out} in {result['seconds']:.1f} s"
    )
    return result


if __name__ == "__main__":
    main()
