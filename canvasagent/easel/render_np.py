"""Numpy fast path for one stroke at a time (the environment's ``brush_stroke``).

It computes exactly the rasterisation documented in :mod:`canvasagent.easel.render`
(same coarse samples, same compaction rule, same golden-section iterations,
float32) but with numpy instead of torch. Why: for one stroke on a small
canvas the work per array op is tiny, and torch's per-op dispatch (~5 us, a
few hundred ops per stroke) cost more than the arithmetic; numpy's overhead is
several times lower and the coarse search is vectorised over all samples in
one broadcast. The torch path stays the differentiable and batched one; the
two agree to float32 rounding (tests check it).
"""
from __future__ import annotations

import math

import numpy as np

_F32 = np.float32
# Above this many (sample x pixel) elements the coarse search runs in row
# chunks, so a large stroke at 512^2 does not allocate hundreds of MB.
_COARSE_ELEMS = 1 << 20


def bbox(p: np.ndarray, h: int, w: int, r_min: float, r_max_frac: float) -> tuple[int, int, int, int]:
    """Pixel window (x0, y0, x1, y1) holding every pixel the stroke can touch:
    the control hull (which contains the curve) grown by the larger radius + 1."""
    span = min(h, w) * r_max_frac - r_min
    rmax = max(r_min + float(p[6]) * span, r_min + float(p[8]) * span) + 1.0
    xs = (float(p[0]) * w, float(p[2]) * w, float(p[4]) * w)
    ys = (float(p[1]) * h, float(p[3]) * h, float(p[5]) * h)
    return (max(0, int(math.floor(min(xs) - rmax))), max(0, int(math.floor(min(ys) - rmax))),
            min(w, int(math.ceil(max(xs) + rmax))), min(h, int(math.ceil(max(ys) + rmax))))


def _g(t, x0, y0, ax, bx, ay, by, r0, dr):
    """g(t) = r(t) - |x - B(t)| (same operation order as the torch path)."""
    ex = x0 + t * (ax + t * bx)
    ey = y0 + t * (ay + t * by)
    return r0 + dr * t - np.sqrt(ex * ex + ey * ey)


class _Golden:
    """Golden-section search for argmax g on [t0 - step, t0 + step] (clamped to [0, 1]),
    per pixel, as in render's torch ``_golden``. Resumable on a subset of the
    pixels, so groups that need different iteration counts share the first
    iterations (fewer numpy calls: at a few thousand pixels each call's
    overhead is comparable to its arithmetic)."""

    phi = _F32(0.6180339887498949)

    def __init__(self, t0, g0, x0, y0, coef, step: float):
        self.t0, self.g0, self.x0, self.y0, self.coef = t0, g0, x0, y0, coef
        phi = self.phi
        self.a = np.maximum(t0 - _F32(step), _F32(0.0))
        self.b = np.minimum(t0 + _F32(step), _F32(1.0))
        self.c = self.b - phi * (self.b - self.a)
        self.d = self.a + phi * (self.b - self.a)
        self.gc = _g(self.c, x0, y0, *coef)
        self.gd = _g(self.d, x0, y0, *coef)

    def subset(self, sel: np.ndarray) -> "_Golden":
        out = object.__new__(_Golden)
        for k in ("t0", "g0", "x0", "y0", "a", "b", "c", "d", "gc", "gd"):
            setattr(out, k, getattr(self, k)[sel])
        out.coef = self.coef
        return out

    def run(self, steps: int) -> "_Golden":
        phi, a, b, c, d, gc, gd = self.phi, self.a, self.b, self.c, self.d, self.gc, self.gd
        for _ in range(steps):
            left = gc > gd  # the maximum lies in [a, d]
            a = np.where(left, a, c)
            b = np.where(left, d, b)
            ph = phi * (b - a)  # shared by both candidate probes (same operands as torch)
            nc = np.where(left, b - ph, d)
            nd = np.where(left, c, a + ph)
            gnew = _g(np.where(left, nc, nd), self.x0, self.y0, *self.coef)
            gc, gd = np.where(left, gnew, gd), np.where(left, gc, gnew)
            c, d = nc, nd
        self.a, self.b, self.c, self.d, self.gc, self.gd = a, b, c, d, gc, gd
        return self

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        """(t*, g(t*)): the better probe, or the coarse sample if the search did not beat it."""
        g_gs = np.maximum(self.gc, self.gd)
        t_gs = np.where(self.gc > self.gd, self.c, self.d)
        won = g_gs - self.g0 + _F32(1e-7) > 0
        return np.where(won, t_gs, self.t0), np.where(won, g_gs, self.g0)


def stroke_alpha_window(p: np.ndarray, h: int, w: int, win: tuple[int, int, int, int], k: int,
                        golden_steps: int, r_min: float, r_max_frac: float, opacity_steps: int) -> np.ndarray:
    """Alpha (y1-y0, x1-x0) float32 of one 13-parameter stroke inside window ``win``."""
    q = np.asarray(p, dtype=_F32)
    xa, ya, xb, yb = win
    px = np.arange(xa, xb, dtype=_F32) + _F32(0.5)
    py = np.arange(ya, yb, dtype=_F32) + _F32(0.5)
    span = _F32(min(h, w) * r_max_frac - r_min)
    x0, y0 = q[0] * _F32(w), q[1] * _F32(h)
    x1, y1 = q[2] * _F32(w), q[3] * _F32(h)
    x2, y2 = q[4] * _F32(w), q[5] * _F32(h)
    r0 = _F32(r_min) + q[6] * span
    r1 = _F32(r_min) + q[8] * span
    coef = (_F32(2) * (x1 - x0), x0 - _F32(2) * x1 + x2, _F32(2) * (y1 - y0), y0 - _F32(2) * y1 + y2,
            r0, r1 - r0)
    ax, bx, ay, by, _, dr = coef
    X0 = (x0 - px)[None, :]  # (1, W)
    Y0 = (y0 - py)[:, None]  # (H, 1)
    nh, nw = Y0.shape[0], X0.shape[1]

    # coarse search, all samples in one broadcast (first maximum wins, as in torch)
    ts = (np.arange(k, dtype=np.float64) / (k - 1)).astype(_F32)
    step = 1.0 / (k - 1)
    best_g = np.empty((nh, nw), _F32)
    best_t = np.empty((nh, nw), _F32)
    rows = max(1, _COARSE_ELEMS // max(1, k * nw))
    tt = ts[:, None, None]
    ex = X0[None] + tt * (ax + tt * bx)  # (K, 1, W)
    ex2 = ex * ex
    rk = r0 + dr * tt
    for s in range(0, nh, rows):
        ey = Y0[None, s:s + rows] + tt * (ay + tt * by)  # (K, h, 1)
        g = ex2 + ey * ey  # (K, h, W); in place below: the big temporaries dominate
        np.sqrt(g, out=g)
        np.subtract(rk, g, out=g)
        best_g[s:s + rows] = g.max(0)  # a reduction: far cheaper than gathering at argmax
        best_t[s:s + rows] = ts[g.argmax(0)]

    # refine only pixels whose alpha depends on t* (see render's docstring)
    speed = max(math.hypot(ax, ay), math.hypot(ax + 2 * bx, ay + 2 * by))
    bound = _F32(0.5 * step * (speed + abs(float(dr))) + 0.05)
    maybe = best_g > (_F32(-0.5) - bound)
    flat_t = best_t.reshape(-1)
    flat_g = best_g.reshape(-1)
    edge = np.flatnonzero(maybe & (best_g < _F32(0.5)))  # coverage depends on g(t*)
    # covered pixels of a varying-opacity stroke need t* only for a(t*): fewer steps
    inner = np.flatnonzero(best_g >= _F32(0.5)) if abs(float(q[9]) - float(q[7])) > 1e-6 else edge[:0]
    n_inner = min(golden_steps, opacity_steps) if inner.size else 0
    idx = np.concatenate([edge, inner])
    # g(t*) of every pixel: the coarse maximum, replaced in place by the
    # search's value where it ran (the same arithmetic as evaluating g at t*
    # again); the search copied its inputs when it was set up
    flat_gs = flat_g
    if idx.size and golden_steps > 0:
        search = _Golden(flat_t[idx], flat_g[idx], X0[0, idx % nw], Y0[idx // nw, 0], coef, step)
        search.run(n_inner if inner.size else golden_steps)
        if inner.size:
            flat_t[inner], flat_gs[inner] = search.subset(slice(edge.size, None)).result()
            if edge.size:
                rest = search.subset(slice(0, edge.size)).run(golden_steps - n_inner)
                flat_t[edge], flat_gs[edge] = rest.result()
        else:
            flat_t[edge], flat_gs[edge] = search.result()
    g = best_g
    g += _F32(0.5)
    np.clip(g, _F32(0.0), _F32(1.0), out=g)  # coverage
    g *= q[7] + (q[9] - q[7]) * best_t  # times the opacity a(t*)
    return g
