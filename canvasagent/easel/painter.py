"""Our stroke painter: greedy batched search, then joint optimisation.

1. **Greedy initialisation** (coarse to fine) at a low working resolution:
   for each stroke slot, ``n_candidates`` proposals are sampled around
   high-error pixels (radius from a decreasing schedule, colour read from the
   blurred reference, random orientation and bend) and rendered as one batch
   (:func:`render.render_batch_onto`); the proposal that most lowers the
   squared error is kept.
2. **Joint refinement**: all strokes are optimised together with Adam through
   the differentiable sequential composite (:func:`render.render_sequence`)
   against ``L2 + ssim_weight * (1 - SSIM)`` (a torch SSIM with the metric's
   7x7 uniform window), first at the working resolution and then at the
   target resolution; parameters are projected back to [0, 1] after each step.
   Strokes that end up nearly invisible are re-seeded at the largest error
   once, half-way through.

The output keeps the initialisation order, which is the paint order, so the
sequence is usable for next-action supervision.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from . import render

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PainterConfig:
    n_strokes: int = 128
    work_res: int = 64  # greedy search and first optimisation stage
    n_candidates: int = 24
    iters_low: int = 200
    iters_full: int = 120
    lr: float = 0.015
    lr_final_frac: float = 0.1  # cosine decay of the step size within each stage
    ssim_weight: float = 0.5
    opt_k: int = 10  # cheaper rasterisation inside the optimisation loop
    opt_golden: int = 6
    reseed_threshold: float = 0.5  # visible pixels (work res) below which a stroke is re-seeded
    radius_start: float = 0.45  # radius parameter of the first strokes
    radius_end: float = 0.04
    seed: int = 0
    device: str = "cpu"  # "cuda" / "auto": same algorithm on a GPU (results differ in float rounding)


@dataclass
class PaintResult:
    strokes: np.ndarray  # (N, 13) in paint order
    canvas: np.ndarray  # (H, W, 3) final render (exact renderer)
    seconds: float
    info: dict = field(default_factory=dict)


def _to_t(img: np.ndarray, device: str = "cpu") -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(img, dtype=np.float32)).permute(2, 0, 1).to(device)


def _device(cfg: "PainterConfig") -> str:
    if cfg.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return cfg.device


def _resize(img: np.ndarray, res: int) -> np.ndarray:
    import cv2
    if img.shape[0] == res and img.shape[1] == res:
        return img.astype(np.float32)
    return cv2.resize(img.astype(np.float32), (res, res), interpolation=cv2.INTER_AREA)


def ssim_torch(a: torch.Tensor, b: torch.Tensor, win: int = 7) -> torch.Tensor:
    """Mean SSIM of (3,H,W) images with a uniform window (matches the metric's setting)."""
    x, y = a.unsqueeze(0), b.unsqueeze(0)
    pool = lambda z: F.avg_pool2d(z, win, 1)  # noqa: E731  (valid region, like skimage's crop)
    mx, my = pool(x), pool(y)
    n = win * win
    cov = n / (n - 1)  # sample covariance as in skimage's default
    vx = (pool(x * x) - mx * mx) * cov
    vy = (pool(y * y) - my * my) * cov
    vxy = (pool(x * y) - mx * my) * cov
    c1, c2 = 0.01 ** 2, 0.03 ** 2
    s = ((2 * mx * my + c1) * (2 * vxy + c2)) / ((mx * mx + my * my + c1) * (vx + vy + c2))
    return s.mean()


def _radius_schedule(i: int, n: int, cfg: PainterConfig) -> float:
    # geometric decay: big strokes first (paint order coarse -> fine)
    f = i / max(1, n - 1)
    return float(cfg.radius_start * (cfg.radius_end / cfg.radius_start) ** f)


def _propose(rng: np.random.Generator, err: np.ndarray, ref_blur: np.ndarray, radius: float,
             m: int) -> np.ndarray:
    """m candidate strokes centred on pixels sampled proportionally to err^2."""
    h, w = err.shape
    p = (err.astype(np.float64) ** 2).ravel() + 1e-12
    idx = rng.choice(p.size, size=m, p=p / p.sum())
    cy, cx = (idx // w + 0.5) / h, (idx % w + 0.5) / w
    rad = np.clip(radius * rng.uniform(0.6, 1.4, m), 0.0, 1.0)
    r_norm = (render.R_MIN_PX + rad * (h * render.R_MAX_FRAC - render.R_MIN_PX)) / h
    half = r_norm * rng.uniform(0.5, 2.5, m)
    ang = rng.uniform(0, math.pi, m)
    dx, dy = np.cos(ang) * half, np.sin(ang) * half
    bend = rng.normal(0, 0.4, m) * half
    out = np.empty((m, 13))
    out[:, 0], out[:, 1] = cx - dx, cy - dy
    out[:, 4], out[:, 5] = cx + dx, cy + dy
    out[:, 2], out[:, 3] = cx - np.sin(ang) * bend, cy + np.cos(ang) * bend
    out[:, 6] = rad
    out[:, 8] = np.clip(rad * rng.uniform(0.7, 1.3, m), 0, 1)
    out[:, 7] = 1.0
    out[:, 9] = 1.0
    iy = np.clip((cy * h).astype(int), 0, h - 1)
    ix = np.clip((cx * w).astype(int), 0, w - 1)
    out[:, 10:13] = ref_blur[iy, ix]
    return np.clip(out, 0.0, 1.0)


def greedy_init(ref_lo: np.ndarray, n: int, cfg: PainterConfig, rng: np.random.Generator) -> np.ndarray:
    """Sequential batched search at the working resolution -> (n, 13)."""
    import cv2
    h = ref_lo.shape[0]
    dev = _device(cfg)
    ref_t = _to_t(ref_lo, dev)
    canvas = torch.ones_like(ref_t)
    strokes = np.zeros((n, 13), np.float32)
    with torch.no_grad():
        for i in range(n):
            radius = _radius_schedule(i, n, cfg)
            sig = max(0.5, (render.R_MIN_PX + radius * (h * render.R_MAX_FRAC - render.R_MIN_PX)) * 0.5)
            ref_blur = cv2.GaussianBlur(ref_lo, (0, 0), sig)
            err = ((canvas - ref_t) ** 2).sum(0).sqrt().cpu().numpy()
            err = cv2.GaussianBlur(err, (0, 0), sig)
            cand = torch.from_numpy(_propose(rng, err, ref_blur, radius, cfg.n_candidates).astype(np.float32)).to(dev)
            outs = render.render_batch_onto(canvas, cand)
            loss = ((outs - ref_t.unsqueeze(0)) ** 2).mean(dim=(1, 2, 3))
            j = int(torch.argmin(loss))
            strokes[i] = cand[j].cpu().numpy()
            canvas = outs[j]
    return strokes


def _visibility(p: torch.Tensor, res: int, cfg: PainterConfig) -> torch.Tensor:
    """Visible pixels (alpha times transmittance of later strokes) per stroke."""
    with torch.no_grad():
        a = render.stroke_alpha(p, res, res, k=cfg.opt_k, golden_steps=cfg.opt_golden)
        keep = 1 - a
        rev = torch.flip(keep, [0])
        after = torch.flip(torch.cumprod(torch.cat([torch.ones_like(rev[:1]), rev[:-1]], 0), 0), [0])
        return (a * after).sum(dim=(1, 2))


def _optimise(p0: np.ndarray, ref: np.ndarray, iters: int, cfg: PainterConfig, rng: np.random.Generator,
              reseed: bool) -> np.ndarray:
    res = ref.shape[0]
    dev = _device(cfg)
    ref_t = _to_t(ref, dev)
    p = torch.tensor(p0, dtype=torch.float32, device=dev, requires_grad=True)
    opt = torch.optim.Adam([p], lr=cfg.lr)
    for it in range(iters):
        frac = cfg.lr_final_frac + (1 - cfg.lr_final_frac) * 0.5 * (1 + math.cos(math.pi * it / max(1, iters)))
        for grp in opt.param_groups:
            grp["lr"] = cfg.lr * frac
        img = render.render_sequence(p, res, res, k=cfg.opt_k, golden_steps=cfg.opt_golden)
        loss = ((img - ref_t) ** 2).mean() + cfg.ssim_weight * (1 - ssim_torch(img, ref_t))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        with torch.no_grad():
            p.clamp_(0.0, 1.0)
        if reseed and it == iters // 2:
            vis = _visibility(p.detach(), res, cfg)
            dead = torch.nonzero(vis < cfg.reseed_threshold).flatten().tolist()
            if dead:
                with torch.no_grad():
                    img = render.render_sequence(p, res, res)
                    err = ((img - ref_t) ** 2).sum(0).sqrt().cpu().numpy()
                    import cv2
                    err = cv2.GaussianBlur(err, (0, 0), 1.5)
                    blur = cv2.GaussianBlur(ref, (0, 0), 1.0)
                    new = _propose(rng, err, blur, cfg.radius_end * 2, len(dead))
                    p[dead] = torch.from_numpy(new.astype(np.float32)).to(dev)
                opt = torch.optim.Adam([p], lr=cfg.lr)  # fresh moments for moved strokes
                log.debug("re-seeded %d strokes", len(dead))
    return p.detach().cpu().numpy().copy()


def paint(ref: np.ndarray, n_strokes: int | None = None, cfg: PainterConfig | None = None) -> PaintResult:
    """Paint ``ref`` (H, W, 3 float in [0,1], square) with an ordered stroke sequence."""
    cfg = cfg or PainterConfig()
    if n_strokes is not None:
        cfg = replace(cfg, n_strokes=n_strokes)
    t0 = time.perf_counter()
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    ref = np.asarray(ref, dtype=np.float32)
    if ref.dtype == np.uint8 or ref.max() > 1.0:
        ref = ref / 255.0
    res = ref.shape[0]
    lo = min(cfg.work_res, res)
    ref_lo = _resize(ref, lo)
    strokes = greedy_init(ref_lo, cfg.n_strokes, cfg, rng)
    t_init = time.perf_counter() - t0
    if cfg.iters_low > 0:
        strokes = _optimise(strokes, ref_lo, cfg.iters_low, cfg, rng, reseed=True)
    if cfg.iters_full > 0 and res != lo:
        strokes = _optimise(strokes, ref, cfg.iters_full, cfg, rng, reseed=False)
    strokes = np.clip(strokes, 0.0, 1.0).astype(np.float64)
    canvas = render.render_strokes(strokes, res, res)
    dt = time.perf_counter() - t0
    return PaintResult(strokes=strokes, canvas=canvas, seconds=dt, info={"init_s": t_init})


def _worker(args) -> PaintResult:
    ref, n, cfg = args
    torch.set_num_threads(1)
    return paint(ref, n, cfg)


def paint_many(refs: Sequence[np.ndarray], budgets: Sequence[int], cfg: PainterConfig | None = None,
               workers: int = 1, ray: bool = False) -> list[PaintResult]:
    """Paint several references in parallel (one torch thread each): local
    processes, or Ray tasks with ``ray=True`` (see :mod:`canvasagent.easel.parallel`)."""
    from .parallel import imap_jobs
    cfg = cfg or PainterConfig()
    jobs = [(r, int(b), cfg) for r, b in zip(refs, budgets)]
    out: list[PaintResult | None] = [None] * len(jobs)
    for i, res in imap_jobs(_worker, jobs, workers, "ray" if ray else "local"):
        out[i] = res
    return out  # type: ignore[return-value]
