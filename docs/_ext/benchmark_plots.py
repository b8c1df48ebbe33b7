"""Draw the benchmark page's plots from the committed results (``benchmarks/results/*.json``) when the docs build.

Each plot is a PNG under ``docs/_generated/`` (not committed: the JSON is the record, the plots are views
of it).  A result file that is missing, or a section it does not have, leaves its plot out with a note in
the figure instead of failing the build: the page says what was not measured.
"""

from __future__ import annotations

import json
from pathlib import Path

import figures

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def _load(name: str) -> dict:
    p = RESULTS / f"{name}.json"
    return json.loads(p.read_text()) if p.exists() else {}


def _bars(ax, labels, values, targets, title, xlabel):
    import numpy as np

    y = np.arange(len(labels))
    colors = ["#2a7" if t is None or ok else "#c44" for t, ok in targets]
    ax.barh(y, values, color=colors)
    for i, (t, _) in enumerate(targets):
        if t is not None:
            ax.plot([t, t], [i - 0.4, i + 0.4], color="black", lw=1.5)
    ax.set_yticks(y, labels)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.set_title(title, fontsize=10)


def local(fig):
    d = _load("bench_local")
    ax = fig.add_subplot(2, 1, 1)
    rows = [(k, d.get(k, {})) for k in ("uniform", "prioritized", "insert")]
    labels = ["uniform windows", "prioritized + update", "insert, 10 episodes"]
    for peer, title in (("torchrl", "TorchRL"), ("reverb", "Reverb")):  # the peers on the same workload, when measured
        for kind in ("uniform", "prioritized"):
            r = d.get(peer, {}).get(kind, {})
            if "ratio" in r:
                rows.append((f"{peer}_{kind}", {"ratio": r["ratio"]}))
                labels.append(f"{title} {kind}{' + update' * (kind == 'prioritized')}")
    _bars(
        ax,
        labels,
        [r.get("ratio", 0.0) for _, r in rows],
        [(r.get("target"), r.get("ratio", 0) >= r.get("target", 0)) for _, r in rows],
        "Local table and its peers, B=256 x L=64 (x single-thread memcpy)",
        "x memcpy (higher is better; line: target)",
    )
    ax = fig.add_subplot(2, 1, 2)
    f = d.get("fixed_cost", {})
    names = [("uniform_tiny", "uniform B=256 tiny / np.take"), ("prioritized_update", "prioritized B=1024 / bare tree")]
    vals = [f.get(k, {}).get("ratio", 0.0) for k, _ in names]
    tg = [
        (f.get(k, {}).get("target"), f.get(k, {}).get("ratio", 1e9) <= f.get(k, {}).get("target", 0)) for k, _ in names
    ]
    _bars(ax, [n for _, n in names], vals, tg, "A call's fixed cost (x its bare work)", "ratio (lower is better)")


def distributed(fig):
    d = _load("bench_distributed")
    ax = fig.add_subplot(1, 1, 1)
    planes = ["shared", "shared_owner", "tcp", "comm"]
    labels, vals, tg = [], [], []
    for w in (1, 2):
        for p in planes:
            r = d.get(f"workers_{w}_{p}")
            if not r:
                continue
            labels.append(f"{w} worker{'s' * (w > 1)}, {p}")
            vals.append(r.get("external_gbps", 0.0))
            tg.append((None, True))
    _bars(ax, labels, vals, tg, "External learner, B=256 x L=64 batches", "GB/s (higher is better)")


def control_plane(fig):
    d = _load("bench_control_plane")
    ax = fig.add_subplot(1, 1, 1)
    res = d.get("results", [])
    ws = [r["workers"] for r in res]
    for mode, style in (("comm", "o-"), ("tcp_lane", "s-"), ("lane", "^-"), ("reader", "D-")):
        ys = [r.get(mode, {}).get("pair_ms") for r in res]
        if any(y is not None for y in ys):
            ax.plot(ws, ys, style, label=mode)
    ax.set_xscale("log", base=2)
    ax.set_xticks(ws, [str(w) for w in ws])
    ax.set_xlabel("workers (one shard each)")
    ax.set_ylabel("ms per B=32 prioritized sample + update")
    ax.set_title("Control plane: one learner step against the number of workers", fontsize=10)
    ax.legend()


def gpu(fig):
    d = _load("gpu_check")
    ax = fig.add_subplot(1, 1, 1)
    rows = [r for r in d.get("summary", []) if isinstance(r.get("ratio"), (int, float)) and "GB/s" in r]
    _bars(
        ax,
        [r["check"] for r in rows],
        [r["ratio"] for r in rows],
        [(None, True) for _ in rows],
        "GPU (one H200): each path against its reference copy",
        "x reference (higher is better)",
    )


def disk(fig):
    d = _load("bench_disk")
    names = [
        ("warm", "warm: disk / host tier"),
        ("cold", "cold: table.sample / os.preadv"),
        ("cold_stream", "cold: Stream / os.preadv"),
    ]
    rows = [d.get(k, {}) for k, _ in names]
    _bars(
        fig.add_subplot(1, 1, 1),
        [n for _, n in names],
        [r.get("ratio", 0.0) for r in rows],
        [(r.get("target"), bool(r.get("met"))) for r in rows],
        "Disk tier, B=256 x L=64 windows (x its reference)",
        "x reference (higher is better; line: target)",
    )


def draw_all(_app=None) -> list[Path]:
    """Draw every plot; returns the files written."""
    pictures = [
        ("local.png", local, (7, 5)),
        ("distributed.png", distributed, (7, 3.5)),
        ("control_plane.png", control_plane, (7, 3.5)),
        ("gpu.png", gpu, (8, 4)),
        ("disk.png", disk, (7, 3)),
    ]
    return figures.draw(pictures, axes=True)


def setup(app):
    app.connect("builder-inited", draw_all)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
