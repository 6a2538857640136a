"""A documented no-reference image-quality proxy for the offline aesthetic judge.

It does not claim to measure beauty; it measures the defects the paper's aesthetic rubric names
(blur, bad lighting, washed-out colour, noise, artefacts) with classical, fast estimators. Each
term is in [0, 1] (1 = good) and the score is their weighted mean (`AestheticWeights`).

* **sharpness** — variance of the Laplacian of the grey image (Pech-Pacheco et al., 2000),
  mapped by 1 − exp(−var / 300). A flat or blurred image has little second-derivative energy.
* **exposure** — mean luminance near mid-grey, a usable dynamic range (5th-95th percentile
  spread), and few clipped pixels: (1 − |μ − 0.5|·2)^0.5 · min(1, spread / 0.5) · (1 − clip).
* **colourfulness** — Hasler & Süsstrunk (2003): M = σ_rgyb + 0.3·μ_rgyb on the opponent
  channels rg = R − G, yb = ½(R + G) − B, mapped by min(1, M / 80) ("quite colourful" ≈ 59-82).
  Grey images are not failures, so this term has a low default weight.
* **noise** — Immerkær's (1996) fast noise σ from the 3×3 Laplacian-difference mask, measured on
  a native-resolution centre crop (downscaling would average the noise away), mapped by
  1 − clip((σ − 2) / 12) (σ on 0-255; clean photographs measure about 1-4).
* **artefacts** — JPEG-style blockiness: mean absolute step across 8-pixel boundaries divided by
  the mean step elsewhere (1 for a clean image), on the native-resolution centre crop, mapped by 1 − clip((ratio − 1) / 1.5); and
  an image that is a single flat colour counts as fully artefactual (nothing was rendered).

Images are analysed at most `side` pixels on the long edge (default 256), so one score costs a
few milliseconds on one core.
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np
from PIL import Image

from rewards.config import AestheticWeights

TERMS = ("sharpness", "exposure", "colourfulness", "noise", "artefacts")

_IMMERKAER = np.array([[1, -2, 1], [-2, 4, -2], [1, -2, 1]], dtype=np.float32)


@dataclass
class Quality:
    score: float
    terms: dict[str, float]


def _prepare(img: Image.Image, side: int) -> np.ndarray:
    if img.mode == "RGBA":
        # Judge a cut-out as it would be seen: composited on white.
        bg = Image.new("RGB", img.size, (255, 255, 255))
        bg.paste(img, mask=img.getchannel("A"))
        img = bg
    elif img.mode != "RGB":
        img = img.convert("RGB")
    if max(img.size) > side:
        img = img.copy()
        img.thumbnail((side, side), Image.Resampling.BILINEAR)
    return np.asarray(img, dtype=np.float32)


def sharpness(grey: np.ndarray) -> float:
    var = float(cv2.Laplacian(grey, cv2.CV_32F).var())
    return float(1.0 - np.exp(-var / 300.0))


def exposure(grey: np.ndarray) -> float:
    g = grey / 255.0
    mu = float(g.mean())
    lo, hi = np.percentile(g, [5, 95])
    clip = float(((g <= 0.01) | (g >= 0.99)).mean())
    centre = max(0.0, 1.0 - abs(mu - 0.5) * 2.0) ** 0.5
    spread = min(1.0, float(hi - lo) / 0.5)
    return float(centre * spread * (1.0 - clip))


def colourfulness(rgb: np.ndarray) -> float:
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    rg = r - g
    yb = 0.5 * (r + g) - b
    m = float(np.hypot(rg.std(), yb.std()) + 0.3 * np.hypot(rg.mean(), yb.mean()))
    return float(min(1.0, m / 80.0))


def noise_sigma(grey: np.ndarray) -> float:
    h, w = grey.shape
    if h < 3 or w < 3:
        return 0.0
    conv = cv2.filter2D(grey, cv2.CV_32F, _IMMERKAER)[1:-1, 1:-1]
    return float(np.sqrt(np.pi / 2.0) * np.abs(conv).sum() / (6.0 * (w - 2) * (h - 2)))


def noise(grey_native: np.ndarray) -> float:
    return float(1.0 - min(1.0, max(0.0, (noise_sigma(grey_native) - 2.0) / 12.0)))


def _native_crop(img: Image.Image, side: int) -> np.ndarray:
    w, h = img.size
    x0, y0 = max(0, (w - side) // 2), max(0, (h - side) // 2)
    crop = img.crop((x0, y0, min(w, x0 + side), min(h, y0 + side)))
    return np.asarray(crop.convert("L"), dtype=np.float32)


def blockiness(grey: np.ndarray) -> float:
    dx = np.abs(np.diff(grey, axis=1))
    dy = np.abs(np.diff(grey, axis=0))
    if dx.shape[1] < 16 or dy.shape[0] < 16:
        return 1.0
    # Steps across the 8-pixel block boundaries (columns/rows 7|8, 15|16, ...).
    bx, by = np.arange(dx.shape[1]) % 8 == 7, np.arange(dy.shape[0]) % 8 == 7
    edge = (dx[:, bx].mean() + dy[by, :].mean()) / 2.0
    inner = (dx[:, ~bx].mean() + dy[~by, :].mean()) / 2.0
    return float((edge + 1.0) / (inner + 1.0))


def artefacts(grey: np.ndarray, grey_native: np.ndarray) -> float:
    if float(grey.std()) < 1.0:
        return 0.0  # a single flat colour: nothing was rendered
    ratio = blockiness(grey_native)  # JPEG blocks sit on the native 8-pixel grid
    return float(1.0 - min(1.0, max(0.0, (ratio - 1.0) / 1.5)))


def image_quality(img: Image.Image, weights: AestheticWeights | None = None, side: int = 256) -> Quality:
    w = weights or AestheticWeights()
    rgb = _prepare(img, side)
    grey = cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY)
    native = _native_crop(img, side)
    terms = {
        "sharpness": sharpness(grey),
        "exposure": exposure(grey),
        "colourfulness": colourfulness(rgb),
        "noise": noise(native),
        "artefacts": artefacts(grey, native),
    }
    terms = {k: float(min(1.0, max(0.0, v))) if np.isfinite(v) else 0.0 for k, v in terms.items()}
    total_w = sum(getattr(w, k) for k in TERMS)
    score = sum(getattr(w, k) * terms[k] for k in TERMS) / total_w if total_w > 0 else 0.0
    return Quality(score=float(score), terms=terms)
