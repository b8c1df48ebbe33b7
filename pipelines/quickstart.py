"""End-to-end example: a prioritized table feeding a small torch model.

Creates a 2-shard table, inserts episodes of a toy task (the reward of a step
is a fixed linear function of its observation), samples prioritized windows,
trains a small MLP to predict the reward for a few hundred steps while
updating priorities with the absolute error (as prioritized replay does), and
prints the loss and the throughput.

    python pipelines/quickstart.py [--steps 300]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

import gear_flow as gf


def make_episodes(n: int, rng: np.random.Generator, w: np.ndarray) -> list[dict]:
    eps = []
    for _ in range(n):
        T = int(rng.integers(50, 400))
        obs = rng.standard_normal((T, len(w)), dtype=np.float32)
        eps.append(
            {
                "obs": obs,
                "action": rng.integers(0, 4, T),
                "reward": (obs @ w).astype(np.float32),
                "done": np.arange(T) == T - 1,
            }
        )
    return eps


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--episodes", type=int, default=200)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--length", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    obs_dim = 32
    w = rng.standard_normal(obs_dim).astype(np.float32)

    spec = gf.TableSpec(
        (
            gf.ColumnSpec("obs", (obs_dim,), np.float32),
            gf.ColumnSpec("action", (), np.int64),
            gf.ColumnSpec("reward", (), np.float32),
            gf.ColumnSpec("done", (), np.bool_),
        ),
        capacity=50_000,
        num_shards=2,
    )
    table = gf.LocalTable(
        spec, sampler=gf.Prioritized(alpha=0.6, beta=0.4), rate_limiter=gf.MinSize(1000), seed=args.seed
    )
    eps = make_episodes(args.episodes, rng, w)
    t0 = time.perf_counter()
    for i in range(0, len(eps), 20):
        table.insert(eps[i : i + 20])
    t_insert = time.perf_counter() - t0
    steps = sum(len(e["reward"]) for e in eps)

    model = torch.nn.Sequential(torch.nn.Linear(obs_dim, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    out = gf.SampleBuffers(spec, ("obs", "reward"), args.batch_size, args.length)
    losses = []
    sample_s = 0.0
    t0 = time.perf_counter()
    for step in range(args.steps):
        ts = time.perf_counter()
        batch = table.sample(args.batch_size, args.length, columns=("obs", "reward"), out=out)
        sample_s += time.perf_counter() - ts
        pred = model(batch["obs"]).squeeze(-1)  # [B, L]
        err = (pred - batch["reward"]) * batch.mask
        loss = (batch.weights[:, None] * err.pow(2)).sum() / batch.mask.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        # priority of a window: its mean absolute error (PER)
        prio = err.detach().abs().sum(1) / batch.mask.sum(1)
        table.update_priorities(batch.keys, prio.numpy() + 1e-3)
        losses.append(loss.item())
        if step % max(1, args.steps // 6) == 0 or step == args.steps - 1:
            print(f"step {step:4d}  loss {loss.item():8.4f}")
    train_s = time.perf_counter() - t0
    info = table.info()
    window_bytes = args.batch_size * args.length * (obs_dim * 4 + 4)
    summary = {
        "stored_steps": steps,
        "insert_steps_per_s": steps / t_insert,
        "batches_per_s": args.steps / train_s,
        "sample_ms": 1e3 * sample_s / args.steps,
        "sample_gbps": window_bytes * args.steps / sample_s / 1e9,
        "first_loss": float(np.mean(losses[:10])),
        "last_loss": float(np.mean(losses[-10:])),
        "table_size": info["size"],
        "sampled": info["totals"]["sampled"],
    }
    print(
        f"\ninserted {steps} steps at {summary['insert_steps_per_s']:.3g} steps/s; "
        f"{summary['batches_per_s']:.1f} train batches/s; sampling {summary['sample_ms']:.3f} ms/batch "
        f"({summary['sample_gbps']:.2f} GB/s)\nloss {summary['first_loss']:.4f} -> {summary['last_loss']:.4f}; "
        f"table size {summary['table_size']}, windows sampled {summary['sampled']}"
    )
    return summary


if __name__ == "__main__":
    main()
