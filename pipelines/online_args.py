"""Command line and pacing arithmetic of ``online_dqn.py``."""

from __future__ import annotations

import argparse
import math


def error_buffer_for(spi: float, batch_size: int, max_insert: int) -> float:
    """An error buffer with which neither actors nor learner can stall.

    Once sampling runs, progress needs ``max_diff - min_diff >= max_insert *
    spi + batch_size`` (else some state admits neither the sample nor the
    largest insert); before it starts, the insert that crosses
    ``min_size_to_sample`` needs ``error_buffer >= (max_insert - 1) * spi``.
    ``max_insert * spi + batch_size`` satisfies both.
    """
    return float(math.ceil(max_insert * spi + batch_size))


def parse_args(argv=None, description: str | None = None):
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/online_dqn", help="run directory (plot, summary)")
    p.add_argument("--scheduler", default=None, help="existing scheduler address (default: embedded LocalCluster)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--actors-per-worker", type=int, default=2)
    p.add_argument("--env-steps", type=int, default=40_000, help="env steps the learner's updates are paced for")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--samples-per-insert", type=float, default=16.0, help="times each row is sampled on average")
    p.add_argument("--min-size", type=int, default=1000, help="rows before sampling starts")
    p.add_argument("--capacity", type=int, default=25_000, help="rows per shard (FIFO replay)")
    p.add_argument("--chunk", type=int, default=64, help="rows per insert (0: whole episodes, one insert each)")
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
    p.add_argument("--trace-every", type=int, default=250, help="updates between records of the limiter's counters")
    p.add_argument("--prefetch", type=int, default=2)
    p.add_argument("--timeout", type=float, default=120.0, help="seconds a sample may wait for the actors")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    if args.chunk and args.chunk < args.n_step + 1:
        p.error(f"--chunk ({args.chunk}) must be 0 (whole episodes) or at least n_step + 1 = {args.n_step + 1}")
    return args
