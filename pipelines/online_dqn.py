"""Online RL end to end: actors on Dask workers → prioritized replay table → DQN learner.

1. Starts an embedded ``LocalCluster`` (or connects to ``--scheduler``) and
   creates a :class:`~gear_flow.distributed.DistributedTable` with one shard
   per worker: step items, ``Prioritized(alpha=0.6)`` sampler, ``Fifo``
   remover (the ring overwrites the oldest episodes), and a global
   ``SampleToInsertRatio`` limiter that paces actors and learner.
2. Runs actor tasks on the workers (``--actors-per-worker``).  Each plays
   CartPole-v1 epsilon-greedily with the latest published Q-network (NumPy
   weights, refreshed every ``--refresh-every`` steps) and streams its steps
   through a ``gf.TrajectoryWriter`` into its own worker's shard.  Rows follow
   :mod:`dqn`'s layout (one row per transition plus a row holding the final
   observation); an episode is written in chunks of ``--chunk`` rows that
   overlap by one row, each chunk one insert, sampleable once inserted.
3. The learner (this process, an external learner) iterates a ``gf.Stream``
   of ``n + 1``-step windows (``boundary="pad_tail"``), trains a double DQN
   with n-step returns and a target network, importance weights with beta
   annealed 0.4 → 1, writes ``|TD| + eps`` back as priorities (a
   ``gf.PriorityWriter``: in the background, in order) and publishes its weights through Dask
   (``client.scatter`` + a ``distributed.Variable`` holding the future and a
   version number).
4. Stops the actors with a ``distributed.Event`` (each discards its pending,
   not yet inserted chunk), evaluates, writes a PNG of return vs env steps
   and the loss, a summary JSON, and prints the summary: greedy evaluation
   return vs a random policy measured in the same run, env steps, learner
   updates, the observed samples-per-insert ratio vs the limiter's target and
   band, and the table's counters.

Pacing: the limiter counts rows (items are steps).  It admits a sample of
``B`` windows only while ``inserts * spi - samples - B >= min_diff`` and an
insert of ``k`` rows only while ``inserts * spi - samples + k * spi <=
max_diff``; an insert is admitted whole.  The error buffer is therefore
sized from the largest insert (:func:`error_buffer_for`).  Whole episodes as
inserts (``--chunk 0``: up to 501 rows) need a buffer of ~8000 at spi 16 and
let short inserts overtake a long one that waits for room; chunks keep
inserts small and alike, the buffer tight and the actors' policies fresh.

    python pipelines/online_dqn.py [--env-steps 40000] [--scheduler tcp://...] [--out runs/online_dqn]
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from functools import partial
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dqn import numpy_q  # noqa: E402  (the actors' policy; the learner imports the rest)
from online_args import error_buffer_for, parse_args  # noqa: E402,F401  (error_buffer_for: part of this script's API)

ENV_ID = "CartPole-v1"


# -- actor (a task on a worker) -------------------------------------------------------------------
def actor(table_name: str, actor_id: int, cfg: dict) -> dict:
    """Play episodes with the latest weights and stream them into this worker's shard until stopped.

    Rows go through a :class:`gear_flow.TrajectoryWriter`: a long episode is
    written as chunks of at most ``chunk`` rows, each one insert (the
    limiter's unit of admission).  Consecutive chunks overlap by one row: a
    chunk's last row is its bootstrap state (its own item is no transition)
    and the next chunk's first transition, so no transition and no n-step
    target is lost, only shortened to the chunk's end.

    Returns what the actor did: steps, ``(wall time, return, length)`` of each
    episode, inserts and the seconds they waited for the limiter, the weight
    versions used, and the buffered rows discarded at the stop.
    """
    import gymnasium as gym
    from distributed import Event, Variable, get_worker

    from gear_flow import DistributedTable, RateLimitTimeout, TrajectoryWriter

    table = DistributedTable.attach(table_name)  # inserts go to this worker's own shards
    weights_var, stop = Variable(cfg["weights"]), Event(cfg["stop"])
    env = gym.make(cfg["env_id"])
    rng = np.random.default_rng(cfg["seed"] + 1000 * actor_id)
    # chunks of `chunk` rows sharing one row: a chunk's last row opens the next one
    writer = TrajectoryWriter(table, cfg["chunk"], overlap=1, timeout=cfg["insert_timeout"])
    st = {"steps": 0, "inserts": 0, "wait_s": 0.0, "max_wait_s": 0.0, "discarded_rows": 0, "versions": set()}
    key, params, version = None, None, -1

    def refresh() -> bool:
        nonlocal key, params, version
        if stop.is_set():
            return False
        fut = weights_var.get(timeout=30)
        if fut.key != key:
            payload = fut.result()
            key, params, version = fut.key, payload["params"], payload["version"]
            st["versions"].add(version)
        return True

    def insert(call) -> bool:
        """Run ``call`` (an append that may insert a chunk, or end_episode), retrying while the limiter
        holds the chunk back (it stays buffered, the append is not made); discard the rows when stopped."""
        t0 = time.perf_counter()
        before = len(writer.chunks)
        while True:
            try:
                call()
                break
            except RateLimitTimeout:
                if stop.is_set():
                    st["discarded_rows"] += writer.discard()
                    return False
        if len(writer.chunks) > before:
            dt = time.perf_counter() - t0
            st["inserts"] += len(writer.chunks) - before
            st["wait_s"] += dt
            st["max_wait_s"] = max(st["max_wait_s"], dt)
        return True

    episodes = []
    try:
        obs, _ = env.reset(seed=cfg["seed"] + 7919 * actor_id)
        ep_return, ep_len, running = 0.0, 0, True
        while running:
            if st["steps"] % cfg["refresh_every"] == 0 and not refresh():
                break
            # epsilon decays with this actor's share of the global step budget
            frac = min(1.0, st["steps"] * cfg["num_actors"] / cfg["eps_decay_steps"])
            eps = 1.0 + frac * (cfg["eps_final"] - 1.0)
            a = int(rng.integers(cfg["num_actions"])) if rng.random() < eps else int(np.argmax(numpy_q(params, obs)))
            nxt, r, term, trunc, _ = env.step(a)
            row = {"obs": obs, "action": a, "reward": r, "terminated": term, "truncated": trunc}
            running = insert(partial(writer.append, row))
            st["steps"] += 1
            ep_return += float(r)
            ep_len += 1
            obs = nxt
            if running and (term or trunc):
                # the final observation: the bootstrap state when the episode was truncated
                final = {"obs": obs, "action": 0, "reward": 0.0, "terminated": term, "truncated": trunc}
                running = insert(partial(writer.append, final)) and insert(writer.end_episode)
                if running:
                    episodes.append((time.time(), ep_return, ep_len))
                obs, _ = env.reset()
                ep_return, ep_len = 0.0, 0
    finally:
        st["discarded_rows"] += writer.discard()  # the stop cuts the episode: drop its pending chunk
        writer.close()
        env.close()
    st["versions"] = len(st["versions"])
    return {"actor": actor_id, "worker": get_worker().address, "episodes": episodes, "last_version": version, **st}


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


class Learner:
    """Double DQN on the table's batches; priorities and weights go out in the background, in order.

    Writes go through a :class:`gear_flow.PriorityWriter`: the learner never
    waits for them unless more than ``backlog`` are pending, so it runs at
    most that many updates ahead of its priorities.
    """

    def __init__(self, table, publisher: Publisher, obs_dim: int, num_actions: int, args, backlog: int = 8):
        import dqn
        import torch

        import gear_flow as gf

        self.table, self.publisher, self.args = table, publisher, args
        hidden = (args.hidden, args.hidden)
        self.online = dqn.q_network(obs_dim, num_actions, hidden)
        self.target = dqn.q_network(obs_dim, num_actions, hidden)
        self.target.load_state_dict(self.online.state_dict())
        self.opt = torch.optim.Adam(self.online.parameters(), lr=args.lr)
        self.writes = gf.PriorityWriter(table, backlog=backlog)
        self.updates, self.losses = 0, []
        publisher.publish(self.params())

    @property
    def priorities(self) -> dict:
        """Priority writes applied, and ignored because their item was evicted meanwhile."""
        return {"applied": self.writes.applied, "stale": self.writes.stale}

    def params(self) -> list[np.ndarray]:
        import dqn

        return dqn.numpy_params(self.online)

    def step(self, batch, beta: float) -> float:
        import dqn
        import torch

        a = self.args
        loss, td, valid = dqn.dqn_loss(self.online, self.target, batch, a.n_step, a.gamma, beta)
        self.opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.online.parameters(), 10.0)
        self.opt.step()
        self.updates += 1
        self.losses.append(loss.item())
        # items that start no transition (a chunk's last row) get priority 0: never drawn again
        prios = torch.where(valid, td.abs() + a.priority_eps, torch.zeros_like(td)).numpy().astype(np.float64)
        self.writes.update(batch.keys, prios)  # copies the keys (they alias reused buffers)
        if self.updates % a.target_every == 0:
            self.target.load_state_dict(self.online.state_dict())
        if self.updates % a.publish_every == 0:
            self.writes.call(self.publisher.publish, self.params())
        return self.losses[-1]

    def drain(self) -> None:
        """Wait for every pending write; stop the background thread."""
        self.writes.close(wait=True)

    def close(self) -> None:
        self.writes.close(wait=False)


def main(argv=None) -> dict:
    args = parse_args(argv, __doc__)

    import dqn
    import gymnasium as gym
    import online_report as report
    import torch
    from distributed import Client, Event, LocalCluster
    from tqdm import tqdm

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
    chunk = min(args.chunk or max_rows, max_rows)  # the largest insert, in rows
    updates = max(1, int((args.env_steps - args.min_size) * spi / B))
    error_buffer = error_buffer_for(spi, B, chunk)
    limiter = gf.SampleToInsertRatio(spi, args.min_size, error_buffer)

    t_run = time.perf_counter()
    rand = dqn.run_episodes(dqn.uniform_random(num_actions), ENV_ID, args.random_episodes, seed=args.seed + 50_000)

    cluster = None
    if args.scheduler:
        client = Client(args.scheduler)
        for f in (
            "dqn.py",
            "online_dqn.py",
            "online_report.py",
        ):  # the actors' code, for workers that lack pipelines/ on their path
            client.upload_file(str(Path(__file__).resolve().parent / f))
    else:
        cluster = LocalCluster(
            n_workers=args.workers, threads_per_worker=args.actors_per_worker, processes=True, dashboard_address=None
        )
        client = Client(cluster)
    run_id = f"online-dqn-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    stop = Event(f"{run_id}-stop", client=client)
    publisher = Publisher(client, f"{run_id}-weights")
    actors, table, learner = [], None, None
    try:
        workers = sorted(client.nthreads())
        table = DistributedTable.create(
            client,
            gf.TableSpec(dqn.columns(obs_dim), capacity=args.capacity, num_shards=len(workers)),
            sampler=gf.Prioritized(alpha=args.alpha, beta=args.beta),
            remover=gf.Fifo(),
            rate_limiter=limiter,
            boundary="pad_tail",
            seed=args.seed,
            name=run_id,
            timeout=args.timeout,
        )
        learner = Learner(table, publisher, obs_dim, num_actions, args)
        cfg = {
            "env_id": ENV_ID,
            "weights": publisher.var.name,
            "stop": stop.name,
            "seed": args.seed,
            "num_actors": len(workers) * args.actors_per_worker,
            "num_actions": num_actions,
            "chunk": chunk,
            "insert_timeout": 1.0,  # per try: between tries an actor checks the stop flag
            "refresh_every": args.refresh_every,
            "eps_decay_steps": args.eps_decay_steps,
            "eps_final": args.eps_final,
        }
        actors = [  # actor i on worker i mod W: every worker's shard gets its own actors' data
            client.submit(
                actor, run_id, i, cfg, workers=[workers[i % len(workers)]], pure=False, key=f"{run_id}-actor-{i}"
            )
            for i in range(cfg["num_actors"])
        ]

        def check_actors():
            for f in actors:
                if f.status == "error":
                    f.result()  # raises the actor's error here

        evals, trace = [], []

        def record():
            trace.append(report.trace_point(table.info(), learner.updates, spi))
            return trace[-1]["env_steps"]

        # warm-up: the actors fill the table to min_size (polled, so that a failing actor shows at once)
        while table.info()["coordinator_size"] < args.min_size:
            check_actors()
            time.sleep(0.25)
        stream = gf.Stream(table, B, n + 1, prefetch=args.prefetch, num_batches=updates, seed=args.seed)
        bar = tqdm(total=updates, disable=args.no_progress, desc="learn", unit="upd")
        t_learn, eval_s = time.perf_counter(), 0.0
        try:
            for batch in stream:
                loss = learner.step(batch, beta=args.beta + (1.0 - args.beta) * learner.updates / max(1, updates - 1))
                bar.update(1)
                if learner.updates % 50 == 0:
                    bar.set_postfix(loss=f"{np.mean(learner.losses[-50:]):.3f}")
                if learner.updates % args.eval_every == 0 or learner.updates == updates:
                    te = time.perf_counter()
                    check_actors()
                    env_steps = record()
                    policy = dqn.greedy(learner.params())
                    r = dqn.run_episodes(policy, ENV_ID, args.eval_episodes, seed=10_000 + learner.updates)
                    evals.append((env_steps, learner.updates, float(np.mean(r)), float(np.std(r))))
                    bar.write(
                        f"update {learner.updates} ({env_steps} env steps): eval return {np.mean(r):.1f} "
                        f"± {np.std(r):.1f}, loss {np.mean(learner.losses[-200:]):.3f} (last {loss:.3f}), "
                        f"samples/insert {trace[-1]['samples'] / max(1, trace[-1]['inserts']):.2f}"
                    )
                    eval_s += time.perf_counter() - te
                elif learner.updates % args.trace_every == 0:
                    record()
        except gf.RateLimitTimeout:
            check_actors()  # an actor's failure explains a starved learner better than the timeout
            raise
        bar.close()
        learn_s = time.perf_counter() - t_learn - eval_s
        learner.drain()

        # stop the actors: each ends or discards its pending chunk and returns
        stop.set()
        results = client.gather(actors)
        status = {
            "actors": [f.status for f in actors],
            "tasks_left": sum(len(v) for v in client.processing().values()),
        }
        record()
        info = table.info()
    finally:
        stop.set()
        if learner is not None:
            learner.close()
        for f in actors:
            if not f.done():
                f.cancel()
        if table is not None:
            table.close()
        publisher.var.delete()
        client.close()
        if cluster is not None:
            cluster.close()

    summary = report.summary(ENV_ID, args, info, evals, trace, results, learner, rand, error_buffer, chunk, status)
    summary["wall_s"] = time.perf_counter() - t_run
    summary["updates_per_s"] = learner.updates / max(learn_s, 1e-9)
    plot = out / "training.png"
    report.plot(plot, evals, results, learner.losses, summary)
    summary["plot"] = str(plot)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=float))
    report.print_summary(summary, out)
    return summary


if __name__ == "__main__":
    main()
