"""The summary, printout and plot of ``online_dqn.py`` (what a run reports, apart from the loop)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def trace_point(info: dict, updates: int, spi: float) -> dict:
    """The limiter's counters and the table's size now (one point of the run's trace)."""
    rl, t = info["rate_limiter"], info["totals"]
    return {
        "update": updates,
        "env_steps": t["inserted_steps"] - t["inserted_episodes"],  # each insert has one row more than transitions
        "inserts": rl["inserts"],
        "samples": rl["samples"],
        "diff": rl["inserts"] * spi - rl["samples"],
        "size": info["size"],
    }


def summary(env_id, args, info, evals, trace, results, learner, rand, error_buffer, chunk, status) -> dict:
    spi = args.samples_per_insert
    rl, totals = info["rate_limiter"], info["totals"]
    inserts = max(1, rl["inserts"])
    losses = learner.losses
    return {
        "env_id": env_id,
        "eval_return": evals[-1][2],
        "eval_return_std": evals[-1][3],
        "best_eval_return": max(e[2] for e in evals),
        "random_return": float(np.mean(rand)),
        "random_return_std": float(np.std(rand)),
        "evals": [dict(zip(("env_steps", "updates", "mean", "std"), e)) for e in evals],
        "env_steps": int(totals["inserted_steps"] - totals["inserted_episodes"]),
        "episodes": sum(len(r["episodes"]) for r in results),
        "learner_updates": learner.updates,
        "first_loss": float(np.mean(losses[:50])),
        "last_loss": float(np.mean(losses[-50:])),
        "loss_finite": bool(np.all(np.isfinite(losses))),
        "priorities": dict(learner.priorities),
        "rate": {
            "samples_per_insert": spi,
            "observed": rl["samples"] / inserts,
            # samples / inserts that the limiter allows at the final insert count
            "allowed": (spi - rl["max_diff"] / inserts, spi - rl["min_diff"] / inserts),
            "error_buffer": error_buffer,
            "min_size_to_sample": rl["min_size_to_sample"],
            "min_diff": rl["min_diff"],
            "max_diff": rl["max_diff"],
            "largest_insert": chunk,
            "inserts": rl["inserts"],
            "samples": rl["samples"],
            "trace": trace,
        },
        "table": {
            "size": info["size"],
            "coordinator_size": info["coordinator_size"],
            "inserts": int(totals["inserted_episodes"]),
            "totals": totals,
            "shards": [
                {k: s[k] for k in ("shard", "worker", "size", "inserted", "inserted_episodes", "sampled", "evicted")}
                for s in info["shards"]
            ],
        },
        "actors": [{k: v for k, v in r.items() if k != "episodes"} | {"episodes": len(r["episodes"])} for r in results],
        "actor_status": status["actors"],
        "tasks_left": status["tasks_left"],
        "insert_wait_s": {
            "mean": sum(r["wait_s"] for r in results) / max(1, sum(r["inserts"] for r in results)),
            "max": max(r["max_wait_s"] for r in results),
        },
        "args": vars(args),
    }


def print_summary(s: dict, out: Path) -> None:
    r, t = s["rate"], s["table"]
    a = s["args"]
    workers = len({x["worker"] for x in s["actors"]})
    print(
        f"\nsummary ({s['env_id']}, {s['wall_s']:.0f} s): greedy eval return {s['eval_return']:.1f} "
        f"± {s['eval_return_std']:.1f} over {a['eval_episodes']} episodes (best {s['best_eval_return']:.1f}); "
        f"random policy {s['random_return']:.1f} ± {s['random_return_std']:.1f} ({a['random_episodes']} episodes)\n"
        f"  {s['env_steps']} env steps in {s['episodes']} episodes from {len(s['actors'])} actors on {workers} "
        f"workers; {s['learner_updates']} learner updates ({s['updates_per_s']:.0f}/s), "
        f"loss {s['first_loss']:.3f} -> {s['last_loss']:.3f}\n"
        f"  samples/insert {r['observed']:.2f}: target {r['samples_per_insert']:g}, allowed now "
        f"[{r['allowed'][0]:.2f}, {r['allowed'][1]:.2f}] (error buffer {r['error_buffer']:g} for inserts of "
        f"<= {r['largest_insert']} rows; diff {r['trace'][-1]['diff']:.0f} in [{r['min_diff']:g}, {r['max_diff']:g}])\n"
        f"  inserts waited {s['insert_wait_s']['mean'] * 1e3:.0f} ms on average (max {s['insert_wait_s']['max']:.1f} s); "
        f"rows per actor {[x['steps'] for x in s['actors']]}\n"
        f"  priorities updated {s['priorities']['applied']} (stale {s['priorities']['stale']}); table {t['size']} "
        f"rows (coordinator {t['coordinator_size']}) on shards {[x['size'] for x in t['shards']]}, inserted "
        f"{t['totals']['inserted']} in {t['inserts']} inserts, evicted {t['totals']['evicted']}, "
        f"sampled {t['totals']['sampled']}\n"
        f"plot: {s['plot']}\nsummary: {out / 'summary.json'}"
    )


def plot(path: Path, evals, results, losses, summary) -> None:
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
        a1.plot(
            x[k - 1 :],
            np.convolve(y, np.ones(k) / k, mode="valid"),
            color="tab:blue",
            alpha=0.5,
            label=f"actors (mean of {k})",
        )
    a1.errorbar(
        [e[0] for e in evals],
        [e[2] for e in evals],
        yerr=[e[3] for e in evals],
        marker="o",
        color="tab:red",
        label="greedy eval",
    )
    a1.axhline(summary["random_return"], color="gray", ls="--", label="random policy")
    a1.set(xlabel="env steps", ylabel="episode return", title=f"{summary['env_id']}: return")
    a1.legend(loc="lower right")
    k = max(1, len(losses) // 100)
    sm = np.convolve(losses, np.ones(k) / k, mode="valid")
    a2.plot(np.arange(len(sm)) + k, sm)
    a2.set(xlabel="learner update", ylabel="Huber TD loss (IS weighted)", title="loss", yscale="log")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
