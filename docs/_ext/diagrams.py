"""Draw the concept pages' diagrams at build time (PNG under ``docs/_generated/``, not committed).

Three pictures: a shard's storage (one ring per column, episodes back to back, windows as slices), the
path of a sample across workers, and the path of an insert across workers (one transaction).
"""

from __future__ import annotations

from pathlib import Path

import figures


def _box(ax, x, y, w, h, text, color="#dde8f4", size=9):
    from matplotlib.patches import FancyBboxPatch

    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02", fc=color, ec="#345"))
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=size, wrap=True)


def _arrow(ax, a, b, text="", color="#222", off=(0, 0.03), size=8):
    ax.annotate("", xy=b, xytext=a, arrowprops={"arrowstyle": "->", "color": color, "lw": 1.4})
    if text:
        ax.text((a[0] + b[0]) / 2 + off[0], (a[1] + b[1]) / 2 + off[1], text, ha="center", fontsize=size, color=color)


def storage(ax):
    from matplotlib.patches import Rectangle

    cols = [("obs", "#cfe3cf"), ("action", "#f3e0c0"), ("reward", "#e6d2ef")]
    eps = [(0, 9), (9, 6), (15, 12), (27, 5)]  # (start, length) back to back; the ring holds 40 steps
    for r, (name, color) in enumerate(cols):
        y = 0.72 - 0.2 * r
        ax.text(-1.5, y + 0.06, name, ha="right", va="center", fontsize=9)
        for e, (s, n) in enumerate(eps):
            ax.add_patch(Rectangle((s, y), n, 0.12, fc=color, ec="#555"))
            if r == 0:
                ax.text(s + n / 2, y + 0.17, f"episode {e}", ha="center", fontsize=8)
        ax.add_patch(Rectangle((32, y), 8, 0.12, fc="white", ec="#999", ls="--"))
    ax.add_patch(Rectangle((17, 0.3), 6, 0.56, fill=False, ec="#c22", lw=2))
    ax.text(20, 0.22, "a window of L=6 steps: one slice per column", ha="center", fontsize=8, color="#c22")
    ax.text(36, 0.93, "free: the next insert", ha="center", fontsize=8, color="#777")
    ax.text(20, 0.05, "one ring per column and shard ([capacity, *shape]), episodes back to back; a key is shard << 56 | seq",
            ha="center", fontsize=8)  # fmt: skip
    ax.set_xlim(-8, 41)
    ax.set_ylim(0, 1)


def sample_path(ax):
    _box(
        ax,
        0.02,
        0.62,
        0.26,
        0.3,
        "learner\n(Stream / table.sample)\nplans the batch:\nshard masses → counts",
        "#fbe6c8",
    )
    _box(ax, 0.36, 0.8, 0.28, 0.16, "coordinator (scheduler plugin)\nrate limiter, placement", "#e8e8e8")
    _box(ax, 0.72, 0.62, 0.26, 0.3, "worker A, shard 0\nrings + sum tree\n(published in shared memory)")
    _box(ax, 0.72, 0.12, 0.26, 0.3, "worker B, shard 1\n(another host)")
    _box(ax, 0.02, 0.12, 0.26, 0.3, "batch: torch tensors\n[B, L, ...], keys,\nprobabilities, weights", "#d7efd7")
    _arrow(ax, (0.28, 0.88), (0.36, 0.88), "1 admit")
    _arrow(
        ax, (0.72, 0.7), (0.28, 0.7), "2 same host: the learner draws\nand gathers from shared memory", off=(0, -0.11)
    )
    _arrow(ax, (0.72, 0.27), (0.28, 0.64), "3 another host: one request\nper host, windows back", off=(0.02, -0.12))
    _arrow(ax, (0.15, 0.62), (0.15, 0.42), "4 one exact\nglobal batch", off=(0.09, 0))
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)


def insert_path(ax):
    _box(ax, 0.02, 0.4, 0.24, 0.25, "writer\n(table.insert, an actor,\nan ingestion task)", "#fbe6c8")
    _box(ax, 0.38, 0.72, 0.26, 0.22, "coordinator\nadmits: ids, stamps,\na transaction", "#e8e8e8")
    _box(ax, 0.74, 0.58, 0.24, 0.22, "worker A, shard 0\nstages, then applies")
    _box(ax, 0.74, 0.12, 0.24, 0.22, "worker B, shard 1\nstages, then applies")
    _arrow(ax, (0.26, 0.6), (0.38, 0.8), "1 admit")
    _arrow(ax, (0.26, 0.5), (0.74, 0.66), "2 stage", off=(0, 0.02))
    _arrow(ax, (0.26, 0.45), (0.74, 0.24), "2 stage", off=(0, -0.05))
    _arrow(ax, (0.6, 0.72), (0.74, 0.7), "3 commit: apply", off=(0.0, 0.05))
    _arrow(ax, (0.6, 0.72), (0.8, 0.34))
    ax.text(0.5, 0.03, "a failure while staging aborts everywhere, limiter counts included: all or nothing", ha="center",
            fontsize=8)  # fmt: skip
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)


def draw_all(_app=None) -> list[Path]:
    """Draw every diagram; returns the files written."""
    pictures = [
        ("storage.png", storage, (9, 3)),
        ("sample_path.png", sample_path, (9, 4.2)),
        ("insert_path.png", insert_path, (9, 3.6)),
    ]
    return figures.draw(pictures, axes=False)


def setup(app):
    app.connect("builder-inited", draw_all)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
