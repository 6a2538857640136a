"""EASEL reconstruction similarity and trajectory diagnostics.

``S = 0.5 * SSIM + 0.3 * (1 - L1) + 0.2 * EdgeIoU`` with, for float RGB images
in [0, 1] of identical shape (H, W, 3):

* **SSIM**: ``skimage.metrics.structural_similarity`` on the RGB image
  (``channel_axis=-1``, mean over channels), ``data_range=1``, library
  defaults otherwise: 7 x 7 uniform window, sample covariance, K1=0.01,
  K2=0.03. SSIM can be negative; it is used as is.
* **L1**: mean absolute difference over pixels and channels (range [0, 1]).
* **EdgeIoU**: Canny edges (``skimage.feature.canny``) of the luminance
  (ITU-R 601 weights) with ``sigma = EDGE_SIGMA * H / 128`` (at least 1;
  ``EDGE_SIGMA = 2``), hysteresis thresholds ``low=0.1``, ``high=0.2`` on the
  smoothed gradient magnitude (skimage's float defaults). Both edge maps are dilated with a 3 x 3 square (one-pixel
  tolerance) before ``|A & B| / |A | B|``. Two edge-free images score 1; an
  edge-free image against one with edges scores 0 (so uniform fills get 0,
  as in the paper's anchors).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np
from scipy import ndimage
from skimage.feature import canny
from skimage.metrics import structural_similarity

W_SSIM, W_L1, W_EDGE = 0.5, 0.3, 0.2
EDGE_SIGMA = 2.0
EDGE_LOW, EDGE_HIGH = 0.1, 0.2
_LUMA = np.array([0.299, 0.587, 0.114], dtype=np.float64)


@dataclass(frozen=True)
class Similarity:
    s: float
    ssim: float
    l1: float
    edge_iou: float

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def _as_float(img: np.ndarray) -> np.ndarray:
    a = np.asarray(img)
    if a.dtype == np.uint8:
        a = a.astype(np.float64) / 255.0
    a = a.astype(np.float64)
    if a.ndim == 2:
        a = np.repeat(a[..., None], 3, axis=-1)
    if a.shape[-1] == 4:  # drop alpha (composited on white)
        a = a[..., :3] * a[..., 3:4] + (1 - a[..., 3:4])
    return np.clip(a, 0.0, 1.0)


def edge_map(img: np.ndarray) -> np.ndarray:
    """Dilated Canny edges (bool H x W) with the documented settings."""
    a = _as_float(img)
    lum = a @ _LUMA
    sigma = max(1.0, EDGE_SIGMA * a.shape[0] / 128.0)
    e = canny(lum, sigma=sigma, low_threshold=EDGE_LOW, high_threshold=EDGE_HIGH)
    return ndimage.binary_dilation(e, structure=np.ones((3, 3), bool))


def edge_iou(ref: np.ndarray, canvas: np.ndarray, ref_edges: np.ndarray | None = None) -> float:
    a = edge_map(ref) if ref_edges is None else ref_edges
    b = edge_map(canvas)
    union = np.logical_or(a, b).sum()
    if union == 0:
        return 1.0
    return float(np.logical_and(a, b).sum() / union)


def ssim(ref: np.ndarray, canvas: np.ndarray) -> float:
    a, b = _as_float(ref), _as_float(canvas)
    return float(structural_similarity(a, b, channel_axis=-1, data_range=1.0, win_size=7))


def similarity(ref: np.ndarray, canvas: np.ndarray, ref_edges: np.ndarray | None = None) -> Similarity:
    """Composite EASEL similarity S and its components."""
    a, b = _as_float(ref), _as_float(canvas)
    if a.shape != b.shape:
        raise ValueError(f"shape mismatch: reference {a.shape} vs canvas {b.shape}")
    s_ssim = ssim(a, b)
    l1 = float(np.abs(a - b).mean())
    e = edge_iou(a, b, ref_edges)
    s = W_SSIM * s_ssim + W_L1 * (1 - l1) + W_EDGE * e
    return Similarity(s=float(s), ssim=s_ssim, l1=l1, edge_iou=e)


def score(ref: np.ndarray, canvas: np.ndarray) -> float:
    return similarity(ref, canvas).s


@dataclass(frozen=True)
class TrajectoryDiagnostics:
    """Paper Sec. 3.3 diagnostics of a curve S_1..S_T (S_t after step t)."""

    final: float
    at50: float
    auc: float
    best: float
    fb_gap: float
    exact_repeat_rate: float
    steps: int

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def exact_repeat_rate(actions: Sequence[Sequence[float]] | None) -> float:
    """Fraction of actions (after the first) identical to the previous action."""
    if not actions or len(actions) < 2:
        return 0.0
    reps = sum(1 for a, b in zip(actions[1:], actions[:-1]) if np.array_equal(np.asarray(a), np.asarray(b)))
    return reps / (len(actions) - 1)


def diagnostics(curve: Sequence[float], actions: Sequence[Sequence[float]] | None = None,
                s0: float | None = None) -> TrajectoryDiagnostics:
    """Diagnostics over S_1..S_T; an empty curve falls back to ``s0`` (blank canvas).
    @50% is S at step ceil(T/2); AUC = mean_t S_t; Best = max_t S_t; F-B gap = Best - S_T."""
    c = [float(v) for v in curve]
    if not c:
        v = float(s0) if s0 is not None else 0.0
        return TrajectoryDiagnostics(v, v, v, v, 0.0, 0.0, 0)
    t = len(c)
    half = c[max(0, int(np.ceil(t / 2)) - 1)]
    best = max(c)
    return TrajectoryDiagnostics(final=c[-1], at50=half, auc=float(np.mean(c)), best=best,
                                 fb_gap=best - c[-1], exact_repeat_rate=exact_repeat_rate(actions), steps=t)
