"""Compiled (numba) per-pixel kernel of the EASEL rasteriser.

It computes the rasterisation documented in :mod:`canvasagent.easel.render`.
Why compiled: at 128^2 a stroke's window holds a few thousand pixels; a
per-pixel loop pays no per-array-op dispatch and needs no compaction of the
pixels that need the search.

Compilation: ``cache=True`` stores the machine code next to this module
(``__pycache__``) or, when that is read-only, in numba's user-wide cache dir;
when no cache location is usable the functions are compiled per process
instead (logged). The first call in a process without a cache compiles all
kernels (a few seconds; the benchmark reports it separately).
"""
from __future__ import annotations

import logging
import math

import numpy as np
from numba import njit

log = logging.getLogger(__name__)


def _jit(fn):
    """njit with the on-disk cache when numba finds a writable location for it."""
    try:
        return njit(cache=True, nogil=True)(fn)
    except RuntimeError as e:  # numba: "cannot cache function ...: no locator available"
        log.warning("numba cache unavailable for %s (%s); compiling per process", fn.__name__, e)
        return njit(nogil=True)(fn)


_SQRT3_2 = math.sqrt(3.0) / 2.0


@_jit
def _curve_range(a, b, c):
    lo, hi = min(a, c), max(a, c)
    den = a - 2.0 * b + c
    if den != 0.0:
        t = (a - b) / den
        if 0.0 < t < 1.0:
            v = (1 - t) * (1 - t) * a + 2 * t * (1 - t) * b + t * t * c
            lo, hi = min(lo, v), max(hi, v)
    return lo, hi


@_jit
def bbox(p, h, w, r_min, r_max_frac):
    """The pixel window (x0, y0, x1, y1) holding every pixel the stroke can touch."""
    span = min(h, w) * r_max_frac - r_min
    rmax = max(r_min + float(p[6]) * span, r_min + float(p[8]) * span) + 1.0
    xlo, xhi = _curve_range(float(p[0]) * w, float(p[2]) * w, float(p[4]) * w)
    ylo, yhi = _curve_range(float(p[1]) * h, float(p[3]) * h, float(p[5]) * h)
    return (max(0, int(math.floor(xlo - rmax))), max(0, int(math.floor(ylo - rmax))),
            min(w, int(math.ceil(xhi + rmax))), min(h, int(math.ceil(yhi + rmax))))


_F = np.float32


@_jit
def _gval(t, ex, ey, ax, ay, cx, cy, r0, dr):
    """g(t) = r(t) - |e(t)| in float32 (every argument float32)."""
    bx = ex + t * (ax + t * cx)
    by = ey + t * (ay + t * cy)
    return r0 + dr * t - np.sqrt(bx * bx + by * by)


@_jit
def _newton(t, ex, ey, ax, ay, cx, cy, dr, steps, lo, hi):
    """Newton steps on g'(t) from ``t``, kept in [lo, hi]; a step only where g is concave."""
    for _ in range(steps):
        bx = ex + t * (ax + t * cx)
        by = ey + t * (ay + t * cy)
        vx = ax + _F(2) * t * cx
        vy = ay + _F(2) * t * cy
        d = max(np.sqrt(bx * bx + by * by), _F(1e-9))
        ev = bx * vx + by * vy
        g1 = dr - ev / d
        g2 = (ev * ev / (d * d) - (vx * vx + vy * vy) - _F(2) * (bx * cx + by * cy)) / d
        if g2 < _F(-1e-12):
            t = t - g1 / g2
        t = min(max(t, lo), hi)
    return t


@_jit
def _search(root, d_root, lo, hi, ex, ey, tb, gb, ax, ay, cx, cy, r0, dr, dr2, samples, newton_steps, us, gbuf):
    """The best (t, g) of one pixel after searching the basin bracket [lo, hi] from (tb, gb),
    float32 (dr2: dr * dr rounded from float64; us: the sample positions in [0, 1], gbuf:
    scratch for their g)."""
    r_far = r0 + dr * (hi if dr > 0 else lo)
    if not r_far - d_root > max(gb, _F(-0.5)):
        return tb, gb
    t, g = tb, gb
    if samples > 0:
        width = hi - lo
        # branch-free so LLVM can vectorise it (SIMD sqrt); the argmax below keeps the first maximum
        for k in range(samples):
            ts = lo + width * us[k]
            bx = ex + ts * (ax + ts * cx)
            by = ey + ts * (ay + ts * cy)
            gbuf[k] = r0 + dr * ts - np.sqrt(bx * bx + by * by)
        kb = 0
        for k in range(1, samples):
            if gbuf[k] > gbuf[kb]:
                kb = k
        if gbuf[kb] > g:
            t, g = lo + width * us[kb], gbuf[kb]
    # first-order peak next to the basin's nearest point (local hyperbola)
    bx = ex + root * (ax + root * cx)
    by = ey + root * (ay + root * cy)
    vx = ax + _F(2) * root * cx
    vy = ay + _F(2) * root * cy
    s2 = vx * vx + vy * vy
    slack = max(s2 - dr2, _F(1e-12))
    guess = root + dr * np.sqrt((bx * bx + by * by) / max(s2 * slack, _F(1e-12)))
    guess = min(max(guess, lo), hi)
    gg = _gval(guess, ex, ey, ax, ay, cx, cy, r0, dr)
    if gg > g:
        t, g = guess, gg
    if newton_steps > 0:
        if g > _F(-1.0):
            tn = _newton(t, ex, ey, ax, ay, cx, cy, dr, 1, lo, hi)
            gn = _gval(tn, ex, ey, ax, ay, cx, cy, r0, dr)
            if gn > g:
                t, g = tn, gn
        # the remaining steps go to every uncovered pixel, even those the first skipped (g <= -1)
        if g < _F(0.6) and newton_steps > 1:
            tn = _newton(t, ex, ey, ax, ay, cx, cy, dr, newton_steps - 1, lo, hi)
            gn = _gval(tn, ex, ey, ax, ay, cx, cy, r0, dr)
            if gn > g:
                t, g = tn, gn
    return t, g


@_jit
def stroke_window(p, h, w, x0w, y0w, x1w, y1w, r_min, r_max_frac, samples, newton_steps, t_out, a_out):
    """t* and alpha of one 13-parameter stroke on an h x w canvas, for the pixels of the window
    (x0w, y0w)-(x1w, y1w), into ``t_out`` and ``a_out`` (y1w-y0w, x1w-x0w) float32."""
    span = min(h, w) * r_max_frac - r_min
    px0, py0 = float(p[0]) * w, float(p[1]) * h
    px1, py1 = float(p[2]) * w, float(p[3]) * h
    px2, py2 = float(p[4]) * w, float(p[5]) * h
    ax, ay = 2 * (px1 - px0), 2 * (py1 - py0)
    cx, cy = px0 - 2 * px1 + px2, py0 - 2 * py1 + py2
    r0 = r_min + float(p[6]) * span
    dr = (r_min + float(p[8]) * span) - r0
    do = float(p[9]) - float(p[7])
    aa = ax * ax + ay * ay
    cc = cx * cx + cy * cy
    kind = 2 if cc > 1e-12 * max(aa, 1e-12) else (1 if aa > 1e-12 else 0)
    shift = p_c = p_x = p_y = q_c = q_x = q_y = 0.0
    if kind == 2:
        c3 = 2 * cc
        a2 = 3 * (ax * cx + ay * cy) / c3
        shift = a2 / 3
        p_c, p_x, p_y = (aa / c3 - a2 * a2 / 3) / 3, 2 * cx / c3 / 3, 2 * cy / c3 / 3
        q_c = (2 * a2 ** 3 / 27 - a2 * aa / (3 * c3)) / 2
        q_x = (ax / c3 - a2 * 2 * cx / (3 * c3)) / 2
        q_y = (ay / c3 - a2 * 2 * cy / (3 * c3)) / 2
    # After the roots everything is float32: g needs only ~1e-4 px.
    fax, fay, fcx, fcy = _F(ax), _F(ay), _F(cx), _F(cy)
    fr0, fdr, fdr2 = _F(r0), _F(dr), _F(dr * dr)
    reach = _F(r0 + max(dr, 0.0))
    o0 = _F(p[7])
    do32 = _F(p[9]) - o0
    search = dr != 0.0 and samples + newton_steps > 0
    us = np.zeros(max(samples, 1), np.float32)
    for k in range(samples):
        us[k] = k / (samples - 1) if samples > 1 else 0.0
    gbuf = np.empty(max(samples, 1), np.float32)
    for iy in range(y1w - y0w):
        ey = py0 - 0.5 - (y0w + iy)
        fey = _F(ey)
        for ix in range(x1w - x0w):
            ex = px0 - 0.5 - (x0w + ix)
            fex = _F(ex)
            fold = False
            t2 = tm = 0.0
            if kind == 0:
                t1 = 0.0
            elif kind == 1:
                t1 = min(max(-(ex * ax + ey * ay) / aa, 0.0), 1.0)
            else:
                p3 = (p_c + p_x * ex) + p_y * ey
                hq = (q_c + q_x * ex) + q_y * ey
                disc = p3 * p3 * p3 + hq * hq
                if disc < 0:  # three real roots: the curve folds back
                    fold = True
                    sp = math.sqrt(-p3)
                    m = 2 * sp
                    phi = math.acos(min(max(hq / (p3 * sp), -1.0), 1.0)) / 3
                    cph = math.cos(phi)
                    sph = math.sqrt(max(1.0 - cph * cph, 0.0)) * _SQRT3_2
                    t1 = m * cph - shift
                    t2 = min(max(m * (-0.5 * cph - sph) - shift, 0.0), 1.0)
                    tm = min(max(m * (-0.5 * cph + sph) - shift, 0.0), 1.0)
                else:
                    # Cardano, cancellation-free: s = u - P / (3u)
                    u = math.copysign(math.sqrt(disc), hq) + hq
                    u = np.cbrt(-u)
                    if u == 0.0:
                        u = 1.0
                    t1 = u - p3 / u - shift
                t1 = min(max(t1, 0.0), 1.0)
            ft1 = _F(t1)
            bx = fex + ft1 * (fax + ft1 * fcx)
            by = fey + ft1 * (fay + ft1 * fcy)
            d1 = np.sqrt(bx * bx + by * by)
            t, g = ft1, fr0 + fdr * ft1 - d1
            dmin = d1
            ft2, ftm, d2 = _F(t2), _F(tm), _F(0)
            if fold:
                bx = fex + ft2 * (fax + ft2 * fcx)
                by = fey + ft2 * (fay + ft2 * fcy)
                d2 = np.sqrt(bx * bx + by * by)
                g2 = fr0 + fdr * ft2 - d2
                if g2 > g:
                    t, g = ft2, g2
                dmin = min(d1, d2)
            # culls exactly the pixels no t can touch; covered ones need t* only for a varying opacity
            if search and reach - dmin > _F(-0.5) and (do != 0.0 or g < _F(0.5)):
                if dr > 0:
                    lo, hi = ft1, _F(1)
                else:
                    lo, hi = (ftm if fold else _F(0)), ft1
                t, g = _search(ft1, d1, lo, hi, fex, fey, t, g, fax, fay, fcx, fcy, fr0, fdr, fdr2,
                               samples, newton_steps, us, gbuf)
                if fold:
                    if dr > 0:
                        lo, hi = ft2, ftm
                    else:
                        lo, hi = _F(0), ft2
                    t, g = _search(ft2, d2, lo, hi, fex, fey, t, g, fax, fay, fcx, fcy, fr0, fdr, fdr2,
                                   samples, newton_steps, us, gbuf)
            cov = min(max(g + _F(0.5), _F(0)), _F(1))
            t_out[iy, ix] = t
            a_out[iy, ix] = cov * (o0 + do32 * t)


@_jit
def composite_stroke(canvas, p, r_min, r_max_frac, samples, newton_steps):
    """Composite one stroke in place on a C-order (H, W, 3) float32 canvas."""
    h, w = canvas.shape[0], canvas.shape[1]
    x0, y0, x1, y1 = bbox(p, h, w, r_min, r_max_frac)
    if x1 <= x0 or y1 <= y0:
        return
    a = np.empty((y1 - y0, x1 - x0), np.float32)
    stroke_window(p, h, w, x0, y0, x1, y1, r_min, r_max_frac, samples, newton_steps, np.empty_like(a), a)
    for iy in range(y1 - y0):
        for ix in range(x1 - x0):
            ai = a[iy, ix]
            if ai != 0.0:  # C += (c - C) * 0 leaves C unchanged
                for ch in range(3):
                    v = canvas[y0 + iy, x0 + ix, ch]
                    canvas[y0 + iy, x0 + ix, ch] = v + (np.float32(p[10 + ch]) - v) * ai


@_jit
def composite_batch(out, params, r_min, r_max_frac, samples, newton_steps):
    """Stroke i composited in place on out[i] (B, H, W, 3) float32."""
    for i in range(params.shape[0]):
        composite_stroke(out[i], params[i], r_min, r_max_frac, samples, newton_steps)
