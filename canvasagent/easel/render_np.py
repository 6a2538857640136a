"""Numpy core of the EASEL rasteriser: ``t*`` per pixel and stroke alpha in windows.

It computes the rasterisation documented in :mod:`canvasagent.easel.render`
(closed-form closest-point candidates, one search per distance basin, Newton
polish). Why numpy: for one stroke on a small canvas the work per array op is
tiny, and torch's per-op dispatch (~5 us) cost more than the arithmetic;
numpy's overhead is several times lower and pixels can be compacted cheaply,
so the expensive steps run only where they change the result. (Batching the
compacted search across strokes, with per-pixel stroke coefficients, was
measured ~6% slower than one stroke at a time at 128^2: the coefficient
gathers and concatenations cost more than the saved call overhead.)

The torch path in :mod:`canvasagent.easel.render` takes ``t*`` from here too
(``t*`` carries no gradient) and evaluates the differentiable ``g(t*)`` itself.

:mod:`canvasagent.easel.render_nb` repeats this module's arithmetic per pixel
as a compiled kernel (the default for the numpy-facing helpers; this module is
the fallback without numba). Keep the two in step: a change here needs the
same change there, and ``test_numba_kernel_matches_numpy`` compares them.
"""
from __future__ import annotations

import math

import numpy as np

_F32 = np.float32


def _curve_range(a: float, b: float, c: float) -> tuple[float, float]:
    """Range of one coordinate of the quadratic Bezier with control values a, b, c."""
    lo, hi = min(a, c), max(a, c)
    den = a - 2 * b + c
    if den != 0.0:
        t = (a - b) / den  # the coordinate's extremum
        if 0.0 < t < 1.0:
            v = (1 - t) * (1 - t) * a + 2 * t * (1 - t) * b + t * t * c
            lo, hi = min(lo, v), max(hi, v)
    return lo, hi


def bbox(p: np.ndarray, h: int, w: int, r_min: float, r_max_frac: float) -> tuple[int, int, int, int]:
    """Pixel window (x0, y0, x1, y1) holding every pixel the stroke can touch:
    the curve's own bounding box (tighter than the control hull: ~17% fewer
    pixels for random strokes) grown by the larger radius + 1."""
    span = min(h, w) * r_max_frac - r_min
    rmax = max(r_min + float(p[6]) * span, r_min + float(p[8]) * span) + 1.0
    xlo, xhi = _curve_range(float(p[0]) * w, float(p[2]) * w, float(p[4]) * w)
    ylo, yhi = _curve_range(float(p[1]) * h, float(p[3]) * h, float(p[5]) * h)
    return (max(0, int(math.floor(xlo - rmax))), max(0, int(math.floor(ylo - rmax))),
            min(w, int(math.ceil(xhi + rmax))), min(h, int(math.ceil(yhi + rmax))))


class Geometry:
    """Pixel-space stroke geometry and the closest-point cubic.

    ``e(t) = B(t) - x = E + t A + t^2 C`` with ``E = P0 - x``, ``A = 2 (P1 - P0)``,
    ``C = P0 - 2 P1 + P2``. ``d/dt |e|^2 / 2 = 2|C|^2 t^3 + 3 (A.C) t^2 +
    (|A|^2 + 2 E.C) t + E.A``; after dividing by the leading coefficient and
    substituting ``t = s - shift`` the depressed cubic ``s^3 + P s + Q`` has
    P/3 and Q/2 affine in the pixel position (one add per pixel each).
    Fields are Python floats.
    """

    def take(self, sel) -> "Geometry":
        return self  # scalars: the same for every compacted pixel

    def __init__(self, p, h: int, w: int, r_min: float, r_max_frac: float):
        p = [float(v) for v in p]
        span = min(h, w) * r_max_frac - r_min
        self.x0, self.y0 = p[0] * w, p[1] * h
        x1, y1 = p[2] * w, p[3] * h
        x2, y2 = p[4] * w, p[5] * h
        self.ax, self.ay = 2 * (x1 - self.x0), 2 * (y1 - self.y0)
        self.cx, self.cy = self.x0 - 2 * x1 + x2, self.y0 - 2 * y1 + y2
        self.r0 = r_min + p[6] * span
        self.dr = (r_min + p[8] * span) - self.r0
        self.o0, self.do = p[7], p[9] - p[7]
        aa = self.ax ** 2 + self.ay ** 2
        cc = self.cx ** 2 + self.cy ** 2
        # kind 2: a true parabola; 1: a straight segment traversed at constant
        # speed (C ~ 0: the cubic degenerates to a linear equation); 0: a point
        self.kind = 2 if cc > 1e-12 * max(aa, 1e-12) else (1 if aa > 1e-12 else 0)
        self.aa = aa
        if self.kind == 2:
            c3 = 2 * cc
            a2 = 3 * (self.ax * self.cx + self.ay * self.cy) / c3
            self.shift = a2 / 3
            # P/3 = p_c + p_x Ex + p_y Ey ; Q/2 = q_c + q_x Ex + q_y Ey
            self.p_c, self.p_x, self.p_y = (aa / c3 - a2 * a2 / 3) / 3, 2 * self.cx / c3 / 3, 2 * self.cy / c3 / 3
            self.q_c = (2 * a2 ** 3 / 27 - a2 * aa / (3 * c3)) / 2
            self.q_x = (self.ax / c3 - a2 * 2 * self.cx / (3 * c3)) / 2
            self.q_y = (self.ay / c3 - a2 * 2 * self.cy / (3 * c3)) / 2


def _dist(t, ex, ey, gm):
    bx = ex + t * (gm.ax + t * gm.cx)
    by = ey + t * (gm.ay + t * gm.cy)
    return np.sqrt(bx * bx + by * by)


def _g(t, ex, ey, gm):
    """g(t) = r(t) - |x - B(t)|."""
    return gm.r0 + gm.dr * t - _dist(t, ex, ey, gm)


def _best_of(tb, gb, tn, gn):
    up = gn > gb
    return np.where(up, tn, tb), np.where(up, gn, gb)


def closest_candidates(ex, ey, gm: Geometry):
    """Closest-point parameters of one stroke on the grid ex (1, W) x ey (H, 1):
    (t1, fold, t2, tmid), t1 (H, W) and, at the flat indices ``fold`` where the
    cubic has three real roots (the curve folds back towards the pixel), the
    smallest root t2 and the middle one tmid (a local maximum of the distance);
    t1 is then the largest root. Roots are clamped to [0, 1], where the
    distance is then smallest on the clamped side. float64: the closed form
    cancels badly in float32 for nearly straight strokes."""
    empty = np.zeros(0)
    if gm.kind == 0:
        return np.zeros(np.broadcast_shapes(ex.shape, ey.shape)), np.empty(0, np.intp), empty, empty
    if gm.kind == 1:
        return np.clip(-(ex * gm.ax + ey * gm.ay) / gm.aa, 0.0, 1.0), np.empty(0, np.intp), empty, empty
    p3 = (gm.p_c + gm.p_x * ex) + gm.p_y * ey  # P / 3
    half_q = (gm.q_c + gm.q_x * ex) + gm.q_y * ey  # Q / 2
    disc = p3 * p3
    disc *= p3
    disc += half_q * half_q
    # one real root, by Cardano in the cancellation-free form s = u - P / (3u);
    # on fold pixels (disc < 0) the value is replaced below
    u = np.sqrt(np.maximum(disc, 0.0))
    np.copysign(u, half_q, out=u)
    u += half_q
    np.cbrt(-u, out=u)
    u[u == 0] = 1.0  # P = Q = 0: s = 0 either way
    t1 = u - p3 / u
    t1 -= gm.shift
    fold = np.flatnonzero(disc < 0)
    t2 = tm = empty
    if fold.size:
        pf, qf = p3.reshape(-1)[fold], half_q.reshape(-1)[fold]
        m = 2 * np.sqrt(-pf)
        phi = np.arccos(np.clip(qf / (pf * np.sqrt(-pf)), -1.0, 1.0)) / 3  # in [0, pi/3]
        # roots m cos(phi - 2 pi k / 3) from one cos and the rotation identities
        # (np.cos costs ~10 adds)
        cph = np.cos(phi)
        sph = np.sqrt(np.maximum(1.0 - cph * cph, 0.0)) * (math.sqrt(3) / 2)
        t1.reshape(-1)[fold] = m * cph - gm.shift
        t2 = np.clip(m * (-0.5 * cph - sph) - gm.shift, 0.0, 1.0)
        tm = np.clip(m * (-0.5 * cph + sph) - gm.shift, 0.0, 1.0)
    np.clip(t1, 0.0, 1.0, out=t1)
    return t1, fold, t2, tm


def _newton(t, ex, ey, gm, steps: int, lo, hi):
    """Newton steps on g'(t) = 0 for g = r(t) - |e(t)|, kept inside [lo, hi]."""
    for _ in range(steps):
        bx = ex + t * (gm.ax + t * gm.cx)
        by = ey + t * (gm.ay + t * gm.cy)
        vx = gm.ax + 2 * t * gm.cx
        vy = gm.ay + 2 * t * gm.cy
        d = np.maximum(np.sqrt(bx * bx + by * by), 1e-9)
        ev = bx * vx + by * vy
        g1 = gm.dr - ev / d
        g2 = (ev * ev / (d * d) - (vx * vx + vy * vy) - 2 * (bx * gm.cx + by * gm.cy)) / d
        # step only where g is concave; elsewhere the start (a sampled or
        # first-order maximum) is kept
        t = np.clip(t - np.where(g2 < -1e-12, g1 / np.minimum(g2, -1e-12), 0.0), lo, hi)
    return t


def _hyperbola_guess(t, lo, hi, ex, ey, gm):
    """First-order position of the maximum of g next to the closest point t,
    from the local hyperbola |e| ~ sqrt(d^2 + s^2 tau^2) (d, s: distance and
    speed at t): tau = dr d / (s sqrt(s^2 - dr^2)); returns (t, g(t))."""
    bx = ex + t * (gm.ax + t * gm.cx)
    by = ey + t * (gm.ay + t * gm.cy)
    vx = gm.ax + 2 * t * gm.cx
    vy = gm.ay + 2 * t * gm.cy
    s2 = vx * vx + vy * vy
    slack = np.maximum(s2 - gm.dr * gm.dr, 1e-12)
    # a zero speed (a cusp) sends the guess to the bracket end: the Newton step
    # and the samples take over there
    guess = np.clip(t + gm.dr * np.sqrt((bx * bx + by * by) / np.maximum(s2 * slack, 1e-12)), lo, hi)
    return guess, _g(guess, ex, ey, gm)


def _sampled(lo, hi, ex, ey, gm, m: int):
    """Best of m uniform samples of g on [lo, hi] per pixel, in one (m, n)
    broadcast (a sample costs ~2 ns there, ~10x less than a probe made of
    separate numpy calls); returns (t, g(t))."""
    u = (np.arange(m, dtype=np.float64) / (m - 1)).astype(_F32)
    width = hi - lo
    ts = lo + width * u[:, None]
    bx = ex + ts * (gm.ax + ts * gm.cx)
    by = ey + ts * (gm.ay + ts * gm.cy)
    bx *= bx
    by *= by
    bx += by
    np.sqrt(bx, out=bx)
    g = gm.r0 + gm.dr * ts
    g -= bx
    return lo + width * u[g.argmax(0)], g.max(0)


def search_basins(root, d_root, lo, hi, ex, ey, tb, gb, gm, samples: int, newton_steps: int):
    """Improve (tb, gb) with the maximum of g on each element's basin bracket
    [lo, hi] (root: the basin's nearest point, d_root its distance; gm holds
    per-element geometry). Within a bracket the distance only grows away from
    the root, so g <= r(far end) - d_root: elements where that cannot beat the
    best so far, or reach coverage, are skipped. The rest: the best of
    ``samples`` uniform samples and the first-order maximum next to the root,
    then one Newton step (t* for the opacity of covered pixels), and
    ``newton_steps - 1`` more where g(t*) sets the coverage (the few edge
    pixels; Newton converges quadratically there)."""
    r_far = gm.r0 + gm.dr * np.where(gm.dr > 0, hi, lo)
    sel = np.flatnonzero(r_far - d_root > np.maximum(gb, -0.5))
    if not sel.size:
        return tb, gb
    tb, gb = tb.copy(), gb.copy()
    gs = gm.take(sel)
    r, lo, hi, ex, ey = root[sel], lo[sel], hi[sel], ex[sel], ey[sel]
    t, g = _best_of(tb[sel], gb[sel], *_sampled(lo, hi, ex, ey, gs, samples))
    t, g = _best_of(t, g, *_hyperbola_guess(r, lo, hi, ex, ey, gs))
    if newton_steps > 0:
        # pixels more than half a pixel from coverage after the search stay
        # outside: a Newton step from the best sample/first-order point moves
        # g by far less (checked against dense sampling in the tests)
        near = np.flatnonzero(g > -1.0)
        gn_, sub = gs.take(near), (t[near], ex[near], ey[near], lo[near], hi[near])
        tn = _newton(sub[0], sub[1], sub[2], gn_, 1, sub[3], sub[4])
        t[near], g[near] = _best_of(sub[0], g[near], tn, _g(tn, sub[1], sub[2], gn_))
        edge = np.flatnonzero(g < 0.6)
        if edge.size and newton_steps > 1:
            ge = gs.take(edge)
            te = _newton(t[edge], ex[edge], ey[edge], ge, newton_steps - 1, lo[edge], hi[edge])
            t[edge], g[edge] = _best_of(t[edge], g[edge], te, _g(te, ex[edge], ey[edge], ge))
    tb[sel], gb[sel] = t, g
    return tb, gb


class _Pending:
    """One stroke's pixels that need the basin search: their flat indices and,
    per basin, (positions among them, root, root distance, bracket lo/hi, E)."""

    __slots__ = ("idx", "parts")

    def __init__(self, idx, parts):
        self.idx, self.parts = idx, parts


def _prepare(gm: Geometry, win: tuple[int, int, int, int]):
    """Closest-point candidates of one stroke in its window; returns
    (t, g, pending): t/g (H, W) float32 are final unless ``pending`` lists
    pixels for the basin search (their indices and per-basin inputs)."""
    xa, ya, xb, yb = win
    nw = xb - xa
    ex = (gm.x0 - 0.5 - np.arange(xa, xb, dtype=np.float64))[None, :]  # E = P0 - x, (1, W)
    ey = (gm.y0 - 0.5 - np.arange(ya, yb, dtype=np.float64))[:, None]  # (H, 1)
    t1, fold, t2, tmid = closest_candidates(ex, ey, gm)
    # float32 from here: numpy's float32 sqrt and arithmetic are 2-3x faster,
    # and g only needs ~1e-4 px
    t1, t2, tmid = t1.astype(_F32), t2.astype(_F32), tmid.astype(_F32)
    ex, ey = ex.astype(_F32), ey.astype(_F32)
    d = _dist(t1, ex, ey, gm)
    g = gm.r0 + gm.dr * t1 - d
    if gm.dr == 0.0 and not fold.size:
        return t1, g, None  # constant radius: the nearest point maximises g exactly
    best_t = t1.copy()
    flat_t, flat_g, flat_t1, flat_d = best_t.reshape(-1), g.reshape(-1), t1.reshape(-1), d.reshape(-1)
    dmin = flat_d
    if fold.size:
        fx, fy = ex[0, fold % nw], ey[fold // nw, 0]
        d2 = _dist(t2, fx, fy, gm)
        flat_t[fold], flat_g[fold] = _best_of(flat_t[fold], flat_g[fold], t2, gm.r0 + gm.dr * t2 - d2)
        dmin = flat_d.copy()
        dmin[fold] = np.minimum(dmin[fold], d2)
    if gm.dr == 0.0:
        return best_t, g, None  # the nearer basin's nearest point is exact
    # g(t) <= max(r0, r1) - min_t |e(t)|, and the candidates hold the minimum
    # distance, so this culls exactly the pixels that no t can touch
    need = (gm.r0 + max(gm.dr, 0.0)) - dmin > -0.5
    if gm.do == 0.0:
        need &= flat_g < 0.5  # covered anyway; t* would only set a constant opacity
    idx = np.flatnonzero(need)
    if not idx.size:
        return best_t, g, None
    ix, iy = ex[0, idx % nw], ey[idx // nw, 0]
    # The maximum of g lies, from each local minimum of the distance, on the
    # side the radius grows towards, before the distance's next critical point
    # (beyond it the distance falls again and g rises to the next minimum):
    # one bracket per basin. For dr > 0: [t1, 1] without a fold, else [r3, 1]
    # and [r1, r2] (r1 < r2 < r3 the roots); for dr < 0 the mirror image.
    ta = flat_t1[idx]
    if gm.dr > 0:
        lo, hi = ta, np.ones_like(ta)
    else:
        lo, hi = np.zeros_like(ta), ta
    parts = [(np.arange(idx.size), ta, flat_d[idx], lo, hi, ix, iy)]
    if fold.size:
        kpos = np.full(flat_t.size, -1, np.intp)
        kpos[fold] = np.arange(fold.size)
        k = kpos[idx]
        inf = np.flatnonzero(k >= 0)
        if inf.size:
            kk = k[inf]
            if gm.dr > 0:
                parts.append((inf, t2[kk], d2[kk], t2[kk], tmid[kk], ix[inf], iy[inf]))
            else:
                lo[inf] = tmid[kk]
                parts.append((inf, t2[kk], d2[kk], np.zeros(kk.size, _F32), t2[kk], ix[inf], iy[inf]))
    return best_t, g, _Pending(idx, parts)


def tstar_window(p, h: int, w: int, win: tuple[int, int, int, int], r_min: float, r_max_frac: float,
                 samples: int, newton_steps: int) -> tuple[np.ndarray, np.ndarray]:
    """(t*, g(t*)) float32 (H, W) of one stroke in its window."""
    gm = Geometry(p, h, w, r_min, r_max_frac)
    t, g, pe = _prepare(gm, win)
    if pe is None or samples + newton_steps <= 0:
        return t, g
    ft, fg = t.reshape(-1), g.reshape(-1)
    tb, gb = ft[pe.idx], fg[pe.idx]
    for sel, root, d_root, lo, hi, ex, ey in pe.parts:
        if sel.size == tb.size:
            tb, gb = search_basins(root, d_root, lo, hi, ex, ey, tb, gb, gm, samples, newton_steps)
        else:  # a fold's second basin, from the first basin's result
            tb[sel], gb[sel] = search_basins(root, d_root, lo, hi, ex, ey, tb[sel], gb[sel], gm, samples,
                                             newton_steps)
    ft[pe.idx], fg[pe.idx] = tb, gb
    return t, g


def alpha_from(t: np.ndarray, g: np.ndarray, p) -> np.ndarray:
    """Alpha = a(t*) clamp(g(t*) + 0.5, 0, 1), in place on g."""
    g += _F32(0.5)
    np.clip(g, _F32(0.0), _F32(1.0), out=g)  # coverage
    g *= _F32(p[7]) + (_F32(p[9]) - _F32(p[7])) * t  # times the opacity a(t*)
    return g


def stroke_alpha_window(p, h: int, w: int, win: tuple[int, int, int, int], r_min: float, r_max_frac: float,
                        samples: int, newton_steps: int) -> np.ndarray:
    """Alpha (y1-y0, x1-x0) float32 of one 13-parameter stroke inside window ``win``."""
    return alpha_from(*tstar_window(p, h, w, win, r_min, r_max_frac, samples, newton_steps), p)
