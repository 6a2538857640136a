"""Headless matplotlib figures: every chart writer of the project opens its figure here."""

from __future__ import annotations

import itertools
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

EMA_WEIGHT = 0.8  # smoothed line: y_t = 0.8 * y_{t-1} + 0.2 * x_t (missing points are skipped)


def ema(ys: list[float], weight: float = EMA_WEIGHT) -> list[float]:
    """Exponential moving average, seeded with the first value."""
    return list(itertools.accumulate(ys, lambda prev, y: weight * prev + (1 - weight) * y))


@contextmanager
def figure(path: str | Path, *args: Any, save_dpi: float | None = None, **subplots_kw: Any) -> Iterator[tuple[Any, Any]]:
    """A headless (Agg) figure: yields (fig, axes) from plt.subplots(*args, **subplots_kw) (a `dpi`
    there is the figure's); on a clean exit tight_layout() and savefig(path, dpi=save_dpi) (None:
    rcParams["savefig.dpi"], as savefig without dpi); always closed."""
    import matplotlib  # deferred: matplotlib is slow to import and only chart writers need it

    matplotlib.use("Agg")  # reports are written on servers, training machines and CI: no display
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(*args, **subplots_kw)
    try:
        yield fig, axes
        fig.tight_layout()
        fig.savefig(path, dpi=save_dpi)
    finally:
        plt.close(fig)
