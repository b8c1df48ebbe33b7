"""Offline RL end to end: dataset → Dask ingestion → replay table → Decision Transformer.

1. Generates (once) a mixed-quality CartPole-v1 dataset with scripted
   controllers of several skill levels, written in Minari's layout (and as
   D4RL HDF5 and Parquet) — nothing is downloaded.
2. Starts an embedded ``LocalCluster`` (or connects to ``--scheduler``),
   creates a :class:`~gear_flow.distributed.DistributedTable` with one shard
   per worker, and ingests the dataset as a Dask dataflow: the workers that
   own the shards read the files (return-to-go and timesteps are derived at
   ingestion).
3. Trains a Decision Transformer from the table's stream of right-aligned
   windows (``pad_head``), with a progress bar (loss, batches/s), periodic
   evaluation in the environment conditioned on a target return, and a
   checkpoint of the model.
4. Writes a PNG of the loss and evaluation return and prints a summary:
   dataset mean and best return, the DT's evaluation return, batches/s and
   table statistics.

    python pipelines/offline_dt.py [--steps 1000] [--scheduler tcp://...] [--out runs/offline_dt]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

COLUMNS = ("obs", "action", "rtg", "timestep")


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/offline_dt", help="run directory (plot, checkpoint, summary)")
    p.add_argument("--data", default="data/cartpole", help="dataset directory (generated if missing)")
    p.add_argument("--episodes", type=int, default=300)
    p.add_argument("--format", default="minari", choices=("minari", "d4rl", "parquet"))
    p.add_argument("--scheduler", default=None, help="existing scheduler address (default: embedded LocalCluster)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--context", type=int, default=20)
    p.add_argument("--eval-every", type=int, default=250)
    p.add_argument("--eval-episodes", type=int, default=5)
    p.add_argument("--target-return", type=float, default=500.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tier", default=None, help="storage tier of the shards (host, pinned, device)")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)

    import make_dataset
    import torch
    from decision_transformer import DecisionTransformer, evaluate
    from distributed import Client, LocalCluster
    from tqdm import tqdm

    import gear_flow as gf
    from gear_flow.distributed import DistributedTable
    from gear_flow.ingest import episode_columns, ingest

    torch.manual_seed(args.seed)
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    # 1. dataset --------------------------------------------------------------------------
    stats_file = Path(args.data) / "stats.json"
    if stats_file.exists() and json.loads(stats_file.read_text()).get("episodes") == args.episodes:
        ds = json.loads(stats_file.read_text())
    else:
        ds = make_dataset.main(["--out", args.data, "--episodes", str(args.episodes), "--seed", str(args.seed)])
        stats_file.write_text(json.dumps(ds, default=str))
    source = {"minari": ds["paths"]["minari"], "d4rl": ds["paths"]["d4rl"], "parquet": ds["paths"]["parquet"]}[
        args.format
    ]
    print(
        f"dataset: {ds['episodes']} episodes, {ds['steps']} steps; return mean {ds['mean_return']:.1f}, best {ds['best_return']:.1f}"
    )

    # 2. cluster, table, ingestion ------------------------------------------------------------
    cluster = None
    if args.scheduler:
        client = Client(args.scheduler)
    else:
        cluster = LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True, dashboard_address=None)
        client = Client(cluster)
    try:
        n_workers = len(client.nthreads())
        cols = episode_columns(ds["obs_dim"], np.int64)
        per_shard = int(ds["steps"] / n_workers * 1.5) + 1000
        spec = gf.TableSpec(cols, capacity=per_shard, num_shards=n_workers)
        table = DistributedTable.create(
            client,
            spec,
            sampler=gf.Uniform(),
            boundary="pad_head",
            tier=args.tier,
            seed=args.seed,
            name=f"offline-dt-{os.getpid()}",
        )
        t0 = time.perf_counter()
        report = ingest(table, source, fmt=args.format)
        t_ingest = time.perf_counter() - t0
        print(
            f"ingested {report.episodes_stored}/{report.episodes_read} episodes, {report.steps_stored}/{report.steps_read} steps "
            f"in {t_ingest:.1f} s onto {n_workers} worker(s)"
        )

        # 3. training ----------------------------------------------------------------------------
        max_t = int(max(ds["steps"], 1))
        model = DecisionTransformer(
            ds["obs_dim"], ds["n_actions"], context=args.context, max_timestep=min(max_t, 4096), rtg_scale=100.0
        )
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-4)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 100))
        losses, evals = [], []
        stream = gf.Stream(
            table, args.batch_size, args.context, columns=COLUMNS, prefetch=2, num_batches=args.steps, seed=args.seed
        )
        bar = tqdm(total=args.steps, disable=args.no_progress, desc="train", unit="batch")
        t0 = time.perf_counter()
        train_s = 0.0
        for step, batch in enumerate(stream):
            loss = model.loss(batch)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
            opt.step()
            sched.step()
            losses.append(loss.item())
            bar.update(1)
            if step % 20 == 0:
                bar.set_postfix(
                    loss=f"{np.mean(losses[-20:]):.3f}", bps=f"{(step + 1) / (time.perf_counter() - t0):.1f}"
                )
            if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
                te = time.perf_counter()
                r = evaluate(model, ds["env_id"], args.target_return, args.eval_episodes, seed=10_000 + step)
                evals.append((step + 1, float(np.mean(r)), float(np.std(r))))
                t0 += time.perf_counter() - te  # batches/s counts training only
                bar.write(
                    f"step {step + 1}: eval return {np.mean(r):.1f} ± {np.std(r):.1f} (target {args.target_return:g})"
                )
        bar.close()
        train_s = time.perf_counter() - t0
        ckpt = out / "decision_transformer.pt"
        torch.save(
            {"model": model.state_dict(), "args": vars(args), "obs_dim": ds["obs_dim"], "n_actions": ds["n_actions"]},
            ckpt,
        )
        info = table.info()
        table.close()
    finally:
        client.close()
        if cluster is not None:
            cluster.close()

    # 4. plot and summary -----------------------------------------------------------------------
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.8))
    k = max(1, len(losses) // 100)
    sm = np.convolve(losses, np.ones(k) / k, mode="valid")
    a1.plot(np.arange(len(sm)) + k, sm)
    a1.set(xlabel="batch", ylabel="action cross-entropy", title="training loss")
    xs = [e[0] for e in evals]
    a2.errorbar(xs, [e[1] for e in evals], yerr=[e[2] for e in evals], marker="o", label="Decision Transformer")
    a2.axhline(ds["mean_return"], color="gray", ls="--", label="dataset mean")
    a2.axhline(ds["best_return"], color="green", ls=":", label="dataset best")
    a2.set(xlabel="batch", ylabel="return", title=f"evaluation ({ds['env_id']}, target {args.target_return:g})")
    a2.legend(loc="lower right")
    fig.tight_layout()
    plot = out / "training.png"
    fig.savefig(plot, dpi=110)
    summary = {
        "dataset_mean_return": ds["mean_return"],
        "dataset_best_return": ds["best_return"],
        "dt_eval_return": evals[-1][1],
        "dt_eval_returns": evals,
        "batches_per_s": args.steps / train_s,
        "ingest_s": t_ingest,
        "first_loss": float(np.mean(losses[:20])),
        "last_loss": float(np.mean(losses[-20:])),
        "table": {
            "size": info["size"],
            "shards": [s["size"] for s in info["shards"]],
            "sampled": info["totals"]["sampled"],
        },
        "ingest": {"episodes": report.episodes_stored, "steps": report.steps_stored},
        "plot": str(plot),
        "checkpoint": str(ckpt),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(
        f"\nsummary: dataset return mean {ds['mean_return']:.1f} / best {ds['best_return']:.1f}; "
        f"Decision Transformer return {evals[-1][1]:.1f} (target {args.target_return:g}); "
        f"{summary['batches_per_s']:.1f} batches/s; table {info['size']} items on {len(info['shards'])} shards "
        f"{summary['table']['shards']}, {info['totals']['sampled']} windows sampled\nplot: {plot}\ncheckpoint: {ckpt}"
    )
    return summary


if __name__ == "__main__":
    main()
