"""Shared harness of the benchmark scripts (after dask-cuda's benchmarks/common.py).

Every speed is reported next to a reference measured *in the same run* on the
same machine (single-thread ``np.copyto`` of the same bytes, or a raw Dask
transfer), because only ratios are stable on shared, noisy machines.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"

#: the reference workload of DESIGN.md
REFERENCE = {
    "episodes": 200,
    "episode_length": 1000,
    "batch_size": 256,
    "length": 64,
}


def reference_options(p) -> None:
    """The reference workload's sizes as options of argparse parser ``p``, :data:`REFERENCE` their defaults."""
    p.add_argument("--episodes", type=int, default=REFERENCE["episodes"])
    p.add_argument("--episode-length", type=int, default=REFERENCE["episode_length"])
    p.add_argument("--batch-size", type=int, default=REFERENCE["batch_size"])
    p.add_argument("--length", type=int, default=REFERENCE["length"])


def reference_columns():
    from gear_flow import ColumnSpec

    return (
        ColumnSpec("obs", (256,), np.float32),
        ColumnSpec("action", (), np.int64),
        ColumnSpec("reward", (), np.float32),
        ColumnSpec("done", (), np.bool_),
    )


def make_episodes(n: int, length: int, seed: int = 0, obs_dim: int = 256) -> list[dict]:
    rng = np.random.default_rng(seed)
    eps = []
    for _ in range(n):
        done = np.zeros(length, dtype=np.bool_)
        done[-1] = True
        eps.append(
            {
                "obs": rng.standard_normal((length, obs_dim), dtype=np.float32),
                "action": rng.integers(0, 18, length),
                "reward": rng.standard_normal(length, dtype=np.float32),
                "done": done,
            }
        )
    return eps


def timeit(fn, repeat: int, warmup: int = 2) -> list[float]:
    """Wall seconds of each of ``repeat`` calls after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def alternate(fns, repeat: int, warmup: int = 2) -> list[list[float]]:
    """Seconds of each of ``fns`` over ``repeat`` rounds (after ``warmup``), called in turn within a round.

    A ratio of two medians measured this way weighs the machine's drift (its
    load, its other tenants) on both alike, unlike two blocks timed one after
    the other; only for calls that leave nothing running after them (a
    parallel gather leaves this process's OpenMP threads spinning for
    milliseconds, which would slow whatever is timed next).  A function that returns a float reports its own seconds
    (one that prepares something untimed first); otherwise its call is timed.
    """
    for _ in range(warmup):
        for fn in fns:
            fn()
    out: list[list[float]] = [[] for _ in fns]
    for _ in range(repeat):
        for fn, ts in zip(fns, out):
            t = time.perf_counter()
            r = fn()
            ts.append(r if isinstance(r, float) else time.perf_counter() - t)
    return out


def memcpy_gbps(nbytes: int, repeat: int = 30, pool_bytes: int = 256 << 20, cold_dst: bool = False) -> float:
    """Single-thread ``np.copyto`` of ``nbytes`` (GB/s, median).

    The source is read at random offsets of a pool larger than the caches.
    The destination is one reused buffer (like a batch buffer a learner
    reuses), or with ``cold_dst`` random offsets of a second large pool (like
    the ring an insert writes into).
    """
    ts = timeit(memcpy_step(nbytes, pool_bytes, cold_dst), repeat)
    return nbytes / float(np.median(ts)) / 1e9


def memcpy_step(nbytes: int, pool_bytes: int = 256 << 20, cold_dst: bool = False):
    """One copy of :func:`memcpy_gbps` per call, to time alternately with what it is the reference of."""
    rng = np.random.default_rng(1)
    pool = np.random.default_rng(0).integers(0, 255, pool_bytes, dtype=np.uint8)
    if cold_dst:
        dpool = np.ones(pool_bytes, dtype=np.uint8)

        def one():
            o = int(rng.integers(0, pool_bytes - nbytes))
            d = int(rng.integers(0, pool_bytes - nbytes))
            np.copyto(dpool[d : d + nbytes], pool[o : o + nbytes])

    else:
        dst = np.ones(nbytes, dtype=np.uint8)

        def one():
            o = int(rng.integers(0, pool_bytes - nbytes))
            np.copyto(dst, pool[o : o + nbytes])

    return one


def stream_gbps(table, B: int, L: int, batches: int, prefetch: int = 2, warmup: int = 5) -> float:
    """GB/s of a ``gear_flow.Stream`` in its steady state: ``batches`` batches timed after ``warmup``.

    The first batches pay what a stream pays once (its threads, its buffer pool faulted in,
    the pipeline filling), which a learner's thousands of steps amortise; timing them would
    measure the start-up, not the rate (``timeit`` leaves the first calls of ``sample`` out
    the same way).
    """
    import gear_flow as gf

    n, nbytes, t0 = 0, 0, None
    for b in gf.Stream(table, B, L, prefetch=prefetch, num_batches=warmup + batches, seed=0):
        n += 1
        if n == warmup:
            t0 = time.perf_counter()
        elif n > warmup:
            nbytes += sum(a.nbytes for a in b.data.values())
    return nbytes / (time.perf_counter() - t0) / 1e9


def _filled(nbytes: int, i: int) -> np.ndarray:
    return np.full(nbytes, i % 251, dtype=np.uint8)


def raw_dask_step(client, workers: list[str], nbytes: int):
    """One raw Dask transfer of ``nbytes`` from ``workers`` to the client per call, returning its seconds.

    The bytes are held as NumPy arrays split evenly over the workers (as a
    batch sampled from their shards is), made first (untimed), and fetched
    together with one ``client.gather``: the same bytes from the same workers
    as the batch.  Timed in turn with what it is the reference of
    (:func:`alternate`).
    """
    from distributed import wait

    sizes = [nbytes // len(workers) + (i < nbytes % len(workers)) for i in range(len(workers))]
    calls = iter(range(1 << 62))

    def one() -> float:
        i = next(calls)
        fs = [client.submit(_filled, n, i, workers=[w], pure=False) for w, n in zip(workers, sizes)]
        wait(fs)
        t = time.perf_counter()
        client.gather(fs)
        return time.perf_counter() - t

    return one


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def packages(names) -> dict:
    """The installed version of each distribution in ``names`` (None where it is not installed): what a run
    measured with, for its JSON (the peers need an environment of their own)."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in names:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def machine() -> dict:
    return {"python": sys.version.split()[0], "platform": platform.platform(), "cpus": os.cpu_count()}


def print_table(rows: list[dict], cols: list[str]) -> None:
    widths = [max(len(c), *(len(_fmt(r.get(c))) for r in rows)) for c in cols]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths)))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print("  ".join(_fmt(r.get(c)).ljust(w) for c, w in zip(cols, widths)))


def _fmt(v) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
    return str(v)


def write_json(name: str, payload: dict, out: str | None = None) -> Path:
    path = Path(out) if out else RESULTS / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"machine": machine(), "time": time.strftime("%Y-%m-%dT%H:%M:%S"), **payload}
    path.write_text(json.dumps(payload, indent=2, default=float))
    return path
