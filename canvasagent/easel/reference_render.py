"""Straightforward reference renderers for the EASEL brush.

* :func:`reference_alpha` follows the Learning-to-Paint recipe: 100 filled
  circles at ``t = i/100`` along the Bezier, drawn at 2x resolution, then
  downsampled by 2x2 box averaging. To describe the same stroke model as
  :mod:`canvasagent.easel.render`, each 2x sub-pixel takes the opacity of the
  circle that covers it most deeply (largest ``r_i - d_i``).
* :func:`supersampled_alpha` is the accuracy yardstick: hard coverage evaluated
  on an ``ss x ss`` grid of sub-pixels per pixel, with ``t`` sampled densely
  (``n_t`` points), averaged back to pixel resolution.

Both are plain numpy and intentionally unoptimised (full-canvas work per
circle); they exist to check and time the fast renderer.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .render import R_MAX_FRAC, R_MIN_PX


def _disc_union_alpha(params: Sequence[float], h: int, w: int, scale: int, ts: np.ndarray,
                      windowed: bool = False) -> np.ndarray:
    """Hard-coverage alpha at ``scale``x resolution using discs at parameters ``ts``.
    ``windowed`` restricts each disc's work to its bounding box (same result; for the dense ground truth)."""
    p = np.asarray(params, dtype=np.float64)
    hh, ww = h * scale, w * scale
    u = 1 - ts
    bx = (u * u * p[0] + 2 * ts * u * p[2] + ts * ts * p[4]) * w
    by = (u * u * p[1] + 2 * ts * u * p[3] + ts * ts * p[5]) * h
    rad = lambda r: R_MIN_PX + r * (min(h, w) * R_MAX_FRAC - R_MIN_PX)  # noqa: E731
    rr = (1 - ts) * rad(p[6]) + ts * rad(p[8])
    aa = (1 - ts) * p[7] + ts * p[9]
    # sub-pixel centres in canvas pixel units
    ys = ((np.arange(hh) + 0.5) / scale)[:, None]
    xs = ((np.arange(ww) + 0.5) / scale)[None, :]
    best = np.full((hh, ww), -np.inf, dtype=np.float64)
    alpha = np.zeros((hh, ww), dtype=np.float64)
    for cx, cy, r, a in zip(bx, by, rr, aa):
        if windowed:
            y0, y1 = max(0, int((cy - r) * scale) - 1), min(hh, int((cy + r) * scale) + 2)
            x0, x1 = max(0, int((cx - r) * scale) - 1), min(ww, int((cx + r) * scale) + 2)
            if y1 <= y0 or x1 <= x0:
                continue
            depth = r - np.sqrt((xs[:, x0:x1] - cx) ** 2 + (ys[y0:y1] - cy) ** 2)
            win_b = best[y0:y1, x0:x1]
            better = depth > win_b
            win_b[better] = depth[better]
            alpha[y0:y1, x0:x1][better] = a
            continue
        depth = r - np.sqrt((xs - cx) ** 2 + (ys - cy) ** 2)
        better = depth > best
        best = np.where(better, depth, best)
        alpha = np.where(better, a, alpha)
    alpha = np.where(best >= 0, alpha, 0.0)
    return alpha.reshape(h, scale, w, scale).mean(axis=(1, 3)).astype(np.float32)


def reference_alpha(params: Sequence[float], h: int, w: int | None = None) -> np.ndarray:
    """Learning-to-Paint style: 100 circles at 2x, then 2x2 box downsample."""
    return _disc_union_alpha(params, h, w or h, 2, np.arange(100) / 100.0)


def supersampled_alpha(params: Sequence[float], h: int, w: int | None = None, ss: int = 4,
                       n_t: int = 1024) -> np.ndarray:
    """Ground truth: ss x ss supersampled hard coverage with dense t sampling."""
    return _disc_union_alpha(params, h, w or h, ss, np.linspace(0.0, 1.0, n_t), windowed=True)


def composite_np(canvas: np.ndarray, alpha: np.ndarray, color: Sequence[float]) -> np.ndarray:
    a = alpha[..., None]
    return (canvas * (1 - a) + np.asarray(color, dtype=np.float32)[None, None] * a).astype(np.float32)


def dense_alpha(params: Sequence[float], h: int, n_t: int = 4097) -> np.ndarray:
    """Ground truth for t*: the stroke model with t* = argmax over n_t uniform t of
    g(t) = r(t) - |x - B(t)| (square h x h canvas).

    The renderers solve for t* in closed form; dense sampling cannot pick the wrong basin on a
    folded stroke, only miss the optimum by the sampling step, so it is what they are checked
    against (tests and benchmarks/easel_render.py).
    """
    p = np.asarray(params, dtype=np.float64)
    ts = np.linspace(0.0, 1.0, n_t)[:, None]
    u = 1 - ts
    span = h * R_MAX_FRAC - R_MIN_PX
    bx = (u * u * p[0] + 2 * ts * u * p[2] + ts * ts * p[4]) * h
    by = (u * u * p[1] + 2 * ts * u * p[3] + ts * ts * p[5]) * h
    rr = u * (R_MIN_PX + p[6] * span) + ts * (R_MIN_PX + p[8] * span)
    aa = (u * p[7] + ts * p[9])[:, 0]
    px = np.arange(h) + 0.5
    out = np.zeros((h, h))
    for i in range(h):
        g = rr - np.sqrt((px[None, :] - bx) ** 2 + (i + 0.5 - by) ** 2)
        j = g.argmax(0)
        out[i] = aa[j] * np.clip(g[j, np.arange(h)] + 0.5, 0, 1)
    return out
