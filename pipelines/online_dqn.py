"""Online RL end to end: actors on Dask workers → prioritized replay table → DQN learner.

1. Starts an embedded ``LocalCluster`` (or connects to ``--scheduler``) and
   creates a :class:`~gear_flow.distributed.DistributedTable` with one shard
   per worker: step items, ``Prioritized(alpha=0.6)`` sampler, ``Fifo``
   remover (the ring overwrites the oldest episodes), and a global
   ``SampleToInsertRatio`` limiter that paces actors and learner.
2. Runs actor tasks on the workers (``--actors-per-worker``).  Each plays
   CartPole-v1 epsilon-greedily with the latest published Q-network (NumPy
   weights, refreshed every ``--refresh-every`` steps) and streams its steps
   through ``table.writer()`` into its own worker's shard; an episode becomes
   sampleable at ``end_episode()``.  Rows follow :mod:`dqn`'s layout (one row
   per transition plus a row holding the final observation).
3. The learner (this process, an external learner) iterates a ``gf.Stream``
   of ``n + 1``-step windows (``boundary="pad_tail"``), trains a double DQN
   with n-step returns and a target network, importance weights with beta
   annealed 0.4 → 1, writes ``|TD| + eps`` back as priorities (in the
   background, in order) and publishes its weights through Dask
   (``client.scatter`` + a ``distributed.Variable`` holding the future and a
   version number).
4. Stops the actors with a ``distributed.Event`` (each ends or discards its
   pending episode), evaluates, writes a PNG of return vs env steps and the
   loss, a summary JSON, and prints the summary: greedy evaluation return vs
   a random policy measured in the same run, env steps, learner updates, the
   observed samples-per-insert ratio vs the limiter's target and band, and
   the table's counters.

Pacing: the limiter admits a sample of ``B`` windows only while
``inserts * spi - samples >= min_diff`` and an insert of ``k`` rows only
while ``inserts * spi - samples + k * spi <= max_diff``.  An episode is one
insert (up to ``max_steps + 1`` rows), so the error buffer is sized to hold
the largest episode plus a batch; smaller buffers could stall both sides.

    python pipelines/online_dqn.py [--env-steps 40000] [--scheduler tcp://...] [--out runs/online_dqn]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dqn import numpy_q  # noqa: E402  (the actors' policy; the learner imports the rest)

ENV_ID = "CartPole-v1"


# -- actor (a task on a worker) -------------------------------------------------------------------
def actor(table_name: str, actor_id: int, cfg: dict) -> dict:
    """Play episodes with the latest weights and stream them into this worker's shard until stopped.

    Returns what the actor did: steps, episodes, ``(wall time, return,
    length)`` of each episode, the weight versions it used, and how many
    buffered steps it discarded at the stop.
    """
    import gymnasium as gym
    from distributed import Event, Variable, get_worker

    from gear_flow import RateLimitTimeout
    from gear_flow.distributed import DistributedTable

    table = DistributedTable.attach(table_name)  # inserts go to this worker's own shards
    weights_var, stop = Variable(cfg["weights"]), Event(cfg["stop"])
    env = gym.make(cfg["env_id"])
    rng = np.random.default_rng(cfg["seed"] + 1000 * actor_id)
    writer = table.writer(max_episode_length=cfg["max_rows"], timeout=cfg["insert_timeout"])
    key, params, version, versions = None, None, -1, set()
    steps, episodes, discarded, stopped = 0, [], 0, False

    def refresh() -> bool:
        nonlocal key, params, version
        if stop.is_set():
            return False
        fut = weights_var.get(timeout=cfg["insert_timeout"] * 10)
        if fut.key != key:
            payload = fut.result()
            key, params, version = fut.key, payload["params"], payload["version"]
            versions.add(version)
        return True

    def flush() -> bool:
        """Insert the buffered episode, retrying while the limiter holds it back; discard it when stopped."""
        nonlocal discarded
        while True:
            try:
                writer.end_episode()  # on a timeout the steps stay buffered
                return True
            except RateLimitTimeout:
                if stop.is_set():
                    discarded += writer.discard()
                    return False

    def append(row) -> bool:
        try:
            writer.append(row)  # may end the episode itself at max_episode_length
            return True
        except RateLimitTimeout:  # that automatic end waited too long: the row is buffered
            return flush()

    try:
        obs, _ = env.reset(seed=cfg["seed"] + 7919 * actor_id)
        ep_return, ep_len = 0.0, 0
        while not stopped:
            if steps % cfg["refresh_every"] == 0 and not refresh():
                break
            # epsilon decays with this actor's share of the global step budget
            frac = min(1.0, steps * cfg["num_actors"] / cfg["eps_decay_steps"])
            eps = 1.0 + frac * (cfg["eps_final"] - 1.0)
            a = int(rng.integers(cfg["num_actions"])) if rng.random() < eps else int(np.argmax(numpy_q(params, obs)))
            nxt, r, term, trunc, _ = env.step(a)
            row = {"obs": obs, "action": a, "reward": r, "terminated": term, "truncated": trunc}
            stopped = not append(row)
            steps += 1
            ep_return += float(r)
            ep_len += 1
            obs = nxt
            if (term or trunc) and not stopped:
                # the final observation: the bootstrap state of a truncated episode
                final = {"obs": obs, "action": 0, "reward": 0.0, "terminated": term, "truncated": trunc}
                stopped = not (append(final) and flush())
                if not stopped:
                    episodes.append((time.time(), ep_return, ep_len))
                obs, _ = env.reset()
                ep_return, ep_len = 0.0, 0
    finally:
        discarded += writer.discard()  # a partial episode at the stop is not a real episode: drop it
        writer.close()
        env.close()
    return {
        "actor": actor_id,
        "worker": get_worker().address,
        "steps": steps,
        "episodes": episodes,
        "discarded_steps": discarded,
        "weight_versions": len(versions),
        "last_version": version,
    }


# -- learner (this process) -----------------------------------------------------------------------
class Publisher:
    """Publishes the learner's weights to the actors: a scattered future in a Variable, with a version."""

    def __init__(self, client, name: str):
        from distributed import Variable

        self.client = client
        self.var = Variable(name, client=client)
        self.version = 0

    def publish(self, params: list[np.ndarray]) -> None:
        payload = {"version": self.version, "params": params}
        [fut] = self.client.scatter([payload], broadcast=True, hash=False)  # a list: a dict would scatter per key
        self.var.set(fut)  # the Variable holds the future; the previous version is released
        self.version += 1


def error_buffer_for(spi: float, batch_size: int, max_rows: int) -> float:
    """An error buffer with which neither actors nor learner can stall.

    Once sampling runs, progress needs ``max_diff - min_diff >= max_rows * spi
    + batch_size`` (else some state admits neither the sample nor the
    largest episode insert); before it starts, the insert that crosses
    ``min_size_to_sample`` needs ``error_buffer >= (max_rows - 1) * spi``.
    ``max_rows * spi + batch_size`` satisfies both.
    """
    return float(math.ceil(max_rows * spi + batch_size))


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/online_dqn", help="run directory (plot, summary)")
    p.add_argument("--scheduler", default=None, help="existing scheduler address (default: embedded LocalCluster)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--actors-per-worker", type=int, default=2)
    p.add_argument("--env-steps", type=int, default=40_000, help="env steps the learner's updates are paced for")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--samples-per-insert", type=float, default=16.0, help="times each row is sampled on average")
    p.add_argument("--min-size", type=int, default=1000, help="rows before sampling starts")
    p.add_argument("--capacity", type=int, default=25_000, help="rows per shard (FIFO replay)")
    p.add_argument("--n-step", type=int, default=3)
    p.add_argument("--gamma", type=float, default=0.99)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--target-every", type=int, default=250, help="updates between target-network copies")
    p.add_argument("--publish-every", type=int, default=50, help="updates between weight publications")
    p.add_argument("--refresh-every", type=int, default=50, help="actor steps between weight refreshes")
    p.add_argument("--eps-decay-steps", type=int, default=10_000)
    p.add_argument("--eps-final", type=float, default=0.05)
    p.add_argument("--alpha", type=float, default=0.6)
    p.add_argument("--beta", type=float, default=0.4, help="initial IS exponent, annealed to 1")
    p.add_argument("--priority-eps", type=float, default=1e-3)
    p.add_argument("--eval-every", type=int, default=1000, help="updates between evaluations")
    p.add_argument("--eval-episodes", type=int, default=5)
    p.add_argument("--random-episodes", type=int, default=20)
    p.add_argument("--prefetch", type=int, default=2)
    p.add_argument("--timeout", type=float, default=120.0, help="seconds a sample may wait for the actors")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)

    import gymnasium as gym
    import torch
    from distributed import Client, Event, LocalCluster
    from tqdm import tqdm

    import dqn
    import gear_flow as gf
    from gear_flow.distributed import DistributedTable

    torch.manual_seed(args.seed)
    torch.set_num_threads(1)  # a small MLP: more threads only contend with the actors and the comm
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    probe = gym.make(ENV_ID)
    obs_dim, num_actions = probe.observation_space.shape[0], int(probe.action_space.n)
    max_rows = probe.spec.max_episode_steps + 1  # transitions + the final observation
    probe.close()
    n, B, spi = args.n_step, args.batch_size, args.samples_per_insert
    updates = max(1, int((args.env_steps - args.min_size) * spi / B))
    error_buffer = error_buffer_for(spi, B, max_rows)
    limiter = gf.SampleToInsertRatio(spi, args.min_size, error_buffer)

    t_run = time.perf_counter()
    rand = dqn.run_episodes(dqn.uniform_random(num_actions), ENV_ID, args.random_episodes, seed=args.seed + 50_000)

    cluster = None
    if args.scheduler:
        client = Client(args.scheduler)
        for f in ("dqn.py", "online_dqn.py"):  # the actors' code, for workers that lack pipelines/ on their path
            client.upload_file(str(Path(__file__).resolve().parent / f))
    else:
        cluster = LocalCluster(
            n_workers=args.workers,
            threads_per_worker=args.actors_per_worker,
            processes=True,
            dashboard_address=None,
        )
        client = Client(cluster)
    run_id = f"online-dqn-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    stop = Event(f"{run_id}-stop", client=client)
    publisher = Publisher(client, f"{run_id}-weights")
    comm = ThreadPoolExecutor(1, thread_name_prefix="online-dqn-comm")  # priority updates + publishing, in order
    actors = []
    table = None
    try:
        workers = sorted(client.scheduler_info()["workers"])
        spec = gf.TableSpec(dqn.columns(obs_dim), capacity=args.capacity, num_shards=len(workers))
        table = DistributedTable.create(
            client,
            spec,
            sampler=gf.Prioritized(alpha=args.alpha, beta=args.beta),
            remover=gf.Fifo(),
            rate_limiter=limiter,
            boundary="pad_tail",
            seed=args.seed,
            name=run_id,
            timeout=args.timeout,
        )
        online = dqn.q_network(obs_dim, num_actions, (args.hidden, args.hidden))
        target = dqn.q_network(obs_dim, num_actions, (args.hidden, args.hidden))
        target.load_state_dict(online.state_dict())
        opt = torch.optim.Adam(online.parameters(), lr=args.lr)
        publisher.publish(dqn.numpy_params(online))

        n_actors = len(workers) * args.actors_per_worker
        cfg = {
            "env_id": ENV_ID,
            "weights": publisher.var.name,
            "stop": stop.name,
            "seed": args.seed,
            "num_actors": n_actors,
            "num_actions": num_actions,
            "max_rows": max_rows,
            "insert_timeout": 1.0,
            "refresh_every": args.refresh_every,
            "eps_decay_steps": args.eps_decay_steps,
            "eps_final": args.eps_final,
        }
        actors = [
            client.submit(actor, table.name, i, cfg, workers=[workers[i % len(workers)]], pure=False, key=f"{run_id}-actor-{i}")
            for i in range(n_actors)
        ]

        def check_actors():
            for f in actors:
                if f.status == "error":
                    f.result()  # raises the actor's error here

        losses, evals, trace, prio_futs = [], [], [], []
        applied = stale = 0

        def record(step):
            info = table.info()
            rl = info["rate_limiter"]
            t = info["totals"]
            env_steps = t["inserted_steps"] - t["inserted_episodes"]  # rows minus final observations
            trace.append(
                {"update": step, "env_steps": env_steps, "inserts": rl["inserts"], "samples": rl["samples"],
                 "diff": rl["inserts"] * spi - rl["samples"], "size": info["size"]}
            )
            return env_steps

        # warm-up: the actors fill the table to min_size (checked here so that a failing actor shows at once)
        while table.info()["coordinator_size"] < args.min_size:
            check_actors()
            time.sleep(0.25)
        stream = gf.Stream(table, B, n + 1, prefetch=args.prefetch, num_batches=updates, seed=args.seed)
        bar = tqdm(total=updates, disable=args.no_progress, desc="learn", unit="upd")
        t_learn = None
        try:
            for step, batch in enumerate(stream):
                if t_learn is None:
                    t_learn = time.perf_counter()  # from the first batch: the warm-up is the actors' part
                beta = args.beta + (1.0 - args.beta) * step / max(1, updates - 1)
                loss, td, valid = dqn.dqn_loss(online, target, batch, n, args.gamma, beta)
                opt.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(online.parameters(), 10.0)
                opt.step()
                losses.append(loss.item())
                # items that start no transition (final observations) get priority 0: never drawn again
                prios = torch.where(valid, td.abs() + args.priority_eps, torch.zeros_like(td)).numpy().astype(np.float64)
                prio_futs.append(comm.submit(table.update_priorities, batch.keys.numpy().copy(), prios))
                if (step + 1) % args.target_every == 0:
                    target.load_state_dict(online.state_dict())
                if (step + 1) % args.publish_every == 0:
                    comm.submit(publisher.publish, dqn.numpy_params(online))
                while prio_futs and (prio_futs[0].done() or len(prio_futs) > 8):
                    r = prio_futs.pop(0).result()
                    applied, stale = applied + r.applied, stale + r.stale
                bar.update(1)
                if step % 50 == 0:
                    bar.set_postfix(loss=f"{np.mean(losses[-50:]):.3f}")
                if (step + 1) % args.eval_every == 0 or step + 1 == updates:
                    check_actors()
                    env_steps = record(step + 1)
                    r = dqn.run_episodes(dqn.greedy(dqn.numpy_params(online)), ENV_ID, args.eval_episodes, 10_000 + step)
                    evals.append((env_steps, step + 1, float(np.mean(r)), float(np.std(r))))
                    bar.write(
                        f"update {step + 1} ({env_steps} env steps): eval return {np.mean(r):.1f} ± {np.std(r):.1f}, "
                        f"loss {np.mean(losses[-200:]):.3f}, samples/insert {trace[-1]['samples'] / max(1, trace[-1]['inserts']):.2f}"
                    )
        except gf.RateLimitTimeout:
            check_actors()  # an actor's failure explains a starved learner better than the timeout
            raise
        bar.close()
        learn_s = time.perf_counter() - (t_learn or time.perf_counter())
        for f in prio_futs:
            r = f.result()
            applied, stale = applied + r.applied, stale + r.stale
        comm.shutdown(wait=True)

        # stop the actors: each ends or discards its pending episode and returns
        stop.set()
        results = client.gather(actors)
        record(updates)
        info = table.info()
    finally:
        comm.shutdown(wait=True, cancel_futures=True)
        stop.set()
        for f in actors:
            f.cancel()
        if table is not None:
            table.close()
        publisher.var.delete()
        client.close()
        if cluster is not None:
            cluster.close()
    wall_s = time.perf_counter() - t_run

    # -- summary and plot ------------------------------------------------------------------------
    rl = info["rate_limiter"]
    totals = info["totals"]
    env_steps = totals["inserted_steps"] - totals["inserted_episodes"]
    observed = rl["samples"] / max(1, rl["inserts"])
    band = (spi - rl["max_diff"] / max(1, rl["inserts"]), spi - rl["min_diff"] / max(1, rl["inserts"]))
    final = evals[-1]
    summary = {
        "env_id": ENV_ID,
        "eval_return": final[2],
        "eval_return_std": final[3],
        "best_eval_return": max(e[2] for e in evals),
        "random_return": float(np.mean(rand)),
        "random_return_std": float(np.std(rand)),
        "evals": [dict(zip(("env_steps", "updates", "mean", "std"), e)) for e in evals],
        "env_steps": int(env_steps),
        "episodes": int(totals["inserted_episodes"]),
        "learner_updates": len(losses),
        "updates_per_s": len(losses) / max(learn_s, 1e-9),
        "wall_s": wall_s,
        "first_loss": float(np.mean(losses[:50])),
        "last_loss": float(np.mean(losses[-50:])),
        "loss_finite": bool(np.all(np.isfinite(losses))),
        "priorities": {"applied": applied, "stale": stale},
        "rate": {
            "samples_per_insert_target": spi,
            "observed": observed,
            "allowed_band": band,
            "error_buffer": error_buffer,
            "min_diff": rl["min_diff"],
            "max_diff": rl["max_diff"],
            "trace": trace,
            "inserts": rl["inserts"],
            "samples": rl["samples"],
        },
        "table": {
            "size": info["size"],
            "coordinator_size": info["coordinator_size"],
            "totals": totals,
            "shards": [
                {k: s[k] for k in ("shard", "worker", "size", "inserted", "inserted_episodes", "sampled", "evicted")}
                for s in info["shards"]
            ],
        },
        "actors": [{k: v for k, v in r.items() if k != "episodes"} | {"episodes": len(r["episodes"])} for r in results],
        "actor_status": [f.status for f in actors],
        "args": vars(args),
    }
    plot = out / "training.png"
    _plot(plot, evals, results, losses, summary)
    summary["plot"] = str(plot)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=float))
    print(
        f"\nsummary ({ENV_ID}, {wall_s:.0f} s): greedy eval return {final[2]:.1f} ± {final[3]:.1f} over "
        f"{args.eval_episodes} episodes (best {summary['best_eval_return']:.1f}); random policy "
        f"{summary['random_return']:.1f} ± {summary['random_return_std']:.1f}\n"
        f"  {env_steps} env steps in {summary['episodes']} episodes from {len(results)} actors on "
        f"{len({r['worker'] for r in results})} workers; {len(losses)} learner updates "
        f"({summary['updates_per_s']:.0f}/s), loss {summary['first_loss']:.3f} -> {summary['last_loss']:.3f}\n"
        f"  samples/insert {observed:.2f} (target {spi:g}, allowed now [{band[0]:.2f}, {band[1]:.2f}]: "
        f"error buffer {error_buffer:g}, diff {rl['inserts'] * spi - rl['samples']:.0f} in [{rl['min_diff']:g}, {rl['max_diff']:g}])\n"
        f"  priorities updated {applied} (stale {stale}); table {info['size']} rows "
        f"(coordinator {info['coordinator_size']}) on shards {[s['size'] for s in info['shards']]}, "
        f"inserted {totals['inserted']}, evicted {totals['evicted']}, sampled {totals['sampled']}\n"
        f"plot: {plot}\nsummary: {out / 'summary.json'}"
    )
    return summary


def _plot(path: Path, evals, results, losses, summary) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    # actors' episodes in wall-clock order: cumulative length approximates the global env step
    eps = sorted(e for r in results for e in r["episodes"])
    if eps:
        x = np.cumsum([e[2] for e in eps])
        y = np.array([e[1] for e in eps])
        k = max(1, min(20, len(y) // 10))
        a1.plot(x[k - 1 :], np.convolve(y, np.ones(k) / k, mode="valid"), color="tab:blue", alpha=0.5, label=f"actors (mean of {k})")
    a1.errorbar([e[0] for e in evals], [e[2] for e in evals], yerr=[e[3] for e in evals], marker="o", color="tab:red", label="greedy eval")
    a1.axhline(summary["random_return"], color="gray", ls="--", label="random policy")
    a1.set(xlabel="env steps", ylabel="episode return", title=f"{summary['env_id']}: return")
    a1.legend(loc="upper left")
    k = max(1, len(losses) // 100)
    sm = np.convolve(losses, np.ones(k) / k, mode="valid")
    a2.plot(np.arange(len(sm)) + k, sm)
    a2.set(xlabel="learner update", ylabel="Huber TD loss (IS weighted)", title="loss", yscale="log")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
