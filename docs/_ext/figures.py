"""What the docs' build-time pictures share: each drawn by a function into a matplotlib figure and saved as a
PNG under ``docs/_generated/`` (not committed), before Sphinx reads the pages that show them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "_generated"


def draw(pictures: list[tuple[str, Callable, tuple[float, float]]], axes: bool) -> list[Path]:
    """Save ``(file name, draw, size in inches)`` pictures; ``draw`` gets the figure, or with ``axes=False``
    one axis without its frame (a diagram)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    OUT.mkdir(exist_ok=True)
    written = []
    for name, fn, size in pictures:
        fig = plt.figure(figsize=size, dpi=100)
        if axes:
            fn(fig)
        else:
            ax = fig.add_subplot(1, 1, 1)
            fn(ax)
            ax.axis("off")
        fig.tight_layout()
        fig.savefig(OUT / name)
        plt.close(fig)
        written.append(OUT / name)
    return written
