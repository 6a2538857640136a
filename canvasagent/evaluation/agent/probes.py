"""Probe generators and their measurements, one `Suite` per property the agent can test.

A suite turns one setting of the conditions (for example text 8 px high, rotated 30 degrees)
into a `Case`: the input images, the tool arguments (or, for a policy, the task instruction),
and the ground truth the output is measured against. `measure(case, output)` returns numbers
and a pass/fail that follows from them alone; no suite looks at anything but pixels and text.

* `legibility` (OCR): a word rendered with DejaVuSans at a given cap height, rotation and
  foreground/background colour; OCR's reading is compared with the word (character accuracy).
* `overlay_text` (Overlayer): the word is asked for at a position on a plain canvas; OCR must
  read it back within `position_tol` of the position, and the ink must reach a WCAG contrast
  ratio of `min_contrast_ratio` against the canvas (people must be able to read it too).
* `mirror` (Flip): natural-looking and asymmetric images; the output is compared with the
  exact mirror in the asked direction (mean absolute difference, 0-255).
* `rotation` (Rotate): square asymmetric images (size cannot give the answer away); the output
  is compared with the exact turn in the asked direction. `rotation_content`: non-square
  images, compared with the lossless turn (size and pixels).
* `crop_region` (Crop): shapes at known positions; the crop must be the asked pixel region
  (size within 2 px, the shape's mask IoU with the expected one).
* `upscale` (SR): a ground-truth high-resolution image, downscaled by 4; the output must have
  the asked scale and its PSNR against the ground truth is compared with bicubic upscaling.
* `grounding` (Grounding): shapes at known positions; the returned box's IoU with the truth.
* `generation_text` (ImageGeneration): generated prompts asking for a word; OCR reads the output.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

from rewards.checks import box_iou
from toolserver.fonts import dejavu_sans


@dataclass
class Case:
    """One generated test input and its ground truth."""

    images: list[Image.Image]
    args: dict[str, Any] = field(default_factory=dict)  # tool arguments besides the input asset
    instruction: str = ""  # the task text when the target is a policy (or a generator's prompt)
    expected_tools: list[str] = field(default_factory=list)
    truth: dict[str, Any] = field(default_factory=dict)  # JSON-safe ground truth, saved as evidence
    expected: Image.Image | None = None  # the exact expected output, where one is computable


@dataclass
class Output:
    """What the target returned for a case."""

    image: Image.Image | None = None
    text: str | None = None
    data: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    error_code: str | None = None
    plumbing_only: bool = False


Measure = Callable[[Case, Output, dict[str, Any]], tuple[dict[str, float], bool]]


@dataclass(frozen=True)
class Axis:
    """A numeric condition the agent can search along; `easier` says which way probes get easier."""

    name: str
    lo: float
    hi: float
    easier: str  # "higher" | "lower"
    unit: str
    resolution: float
    grid: tuple[float, ...]
    label: str  # what passes: "reads text", "reads text with contrast"

    def clip(self, v: float) -> float:
        v = min(max(float(v), self.lo), self.hi)
        return float(round(v)) if self.resolution >= 1 else v


@dataclass
class Suite:
    name: str
    description: str
    tools: tuple[str, ...]  # the tools it tests (for a policy: the tool its tasks expect)
    make: Callable[[dict[str, Any], int, dict[str, Any]], Case]  # (conditions, index, settings)
    measure: Measure
    axes: dict[str, Axis] = field(default_factory=dict)
    needs_ocr: bool = False  # the measurement itself calls OCR


COLOURS: dict[str, tuple[int, int, int]] = {
    "black": (0, 0, 0), "white": (255, 255, 255), "navy": (20, 24, 60), "red": (200, 30, 30),
    "green": (30, 140, 50), "blue": (30, 60, 200), "yellow": (245, 220, 40), "grey": (128, 128, 128),
    "gray": (128, 128, 128), "orange": (240, 140, 30), "purple": (110, 40, 140), "brown": (110, 70, 40),
    "pink": (240, 160, 190), "dark": (30, 30, 36), "light": (235, 235, 230), "cream": (250, 240, 215),
}


def rel_luminance(rgb: tuple[float, float, float]) -> float:
    """WCAG 2 relative luminance of an sRGB colour (0-255 channels)."""
    def lin(c: float) -> float:
        c = c / 255.0
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4
    r, g, b = (lin(float(c)) for c in rgb[:3])
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast_ratio(a: tuple[float, float, float], b: tuple[float, float, float]) -> float:
    la, lb = sorted((rel_luminance(a), rel_luminance(b)), reverse=True)
    return (la + 0.05) / (lb + 0.05)


def norm_text(s: str) -> str:
    return re.sub(r"[^A-Z0-9]", "", s.upper().replace("0", "O"))


def char_accuracy(read: str, truth: str) -> float:
    """1 - Levenshtein(read, truth) / len(truth), floored at 0, on normalised text."""
    a, b = norm_text(read), norm_text(truth)
    if not b:
        return 0.0
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return max(0.0, 1.0 - prev[-1] / len(b))


def best_reading(lines: list[str], truth: str) -> tuple[str, float]:
    """The OCR line (or all lines joined) closest to the truth."""
    cands = list(lines) + ([" ".join(lines)] if len(lines) > 1 else [])
    if not cands:
        return "", 0.0
    acc, line = max((char_accuracy(c, truth), c) for c in cands)
    return line, acc


def mad(a: Image.Image, b: Image.Image) -> float:
    """Mean absolute difference (0-255) of two RGB images of the same size; 255 when sizes differ."""
    if a.size != b.size:
        return 255.0
    return float(np.abs(np.asarray(a.convert("RGB"), dtype=np.int16) - np.asarray(b.convert("RGB"), dtype=np.int16)).mean())


def psnr(a: Image.Image, b: Image.Image) -> float:
    if a.size != b.size:
        return 0.0
    mse = float(((np.asarray(a.convert("RGB"), dtype=np.float64) - np.asarray(b.convert("RGB"), dtype=np.float64)) ** 2).mean())
    return 99.0 if mse == 0 else 10 * math.log10(255.0**2 / mse)


def _rng(settings: dict[str, Any], index: int, salt: str) -> random.Random:
    return random.Random(f"{settings.get('seed', 0)}:{salt}:{index}")


def _word(settings: dict[str, Any], index: int, salt: str) -> str:
    words = settings.get("words") or ["KRAFT", "MOUNT", "PLANE", "TIGER", "VELVET", "BRICK", "HUMID", "QUEST"]
    return _rng(settings, index, salt).choice(words)


def font_for_cap_height(height: int):
    """The DejaVuSans font whose capital letters are `height` px high (ink rows of 'H')."""
    best = None
    for size in range(2, 4 * height + 8):
        font = dejavu_sans(size)
        bb = ImageDraw.Draw(Image.new("L", (1, 1))).textbbox((0, 0), "H", font=font)
        h = bb[3] - bb[1]
        if best is None or abs(h - height) < abs(best[1] - height):
            best = (font, h)
        if h > height:
            break
    assert best is not None
    return best[0]


def render_text_layer(word: str, height: int, fg: tuple[int, int, int]) -> tuple[Image.Image, int]:
    """The word as an RGBA layer with capitals `height` px high; returns the layer and the cap
    height the font really has (the nearest integer font size may miss `height` by a pixel)."""
    font = font_for_cap_height(height)
    bb = ImageDraw.Draw(Image.new("L", (1, 1))).textbbox((0, 0), word, font=font)
    pad = 2
    layer = Image.new("RGBA", (bb[2] - bb[0] + 2 * pad, bb[3] - bb[1] + 2 * pad), (*fg, 0))
    ImageDraw.Draw(layer).text((pad - bb[0], pad - bb[1]), word, font=font, fill=(*fg, 255))
    hb = ImageDraw.Draw(Image.new("L", (1, 1))).textbbox((0, 0), "H", font=font)
    return layer, hb[3] - hb[1]


def natural_image(w: int, h: int, rng: random.Random) -> Image.Image:
    """A smooth, textured scene (sky gradient, hills, sun, noise) with no symmetry."""
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
    top, bottom = np.array([rng.randint(60, 140), rng.randint(120, 190), rng.randint(200, 255)]), np.array([rng.randint(200, 255), rng.randint(170, 230), rng.randint(120, 190)])
    t = (yy / max(h - 1, 1))[..., None]
    img = top * (1 - t) + bottom * t
    img += (xx / max(w - 1, 1))[..., None] * rng.uniform(10, 40)  # a left-right light gradient
    hill = h * (0.55 + 0.12 * np.sin(xx[0] / w * rng.uniform(4, 9) + rng.uniform(0, 6)) + 0.1 * (xx[0] / w))
    mask = yy > hill[None, :]
    img[mask] = np.array([rng.randint(30, 90), rng.randint(100, 160), rng.randint(30, 80)])
    noise = np.random.default_rng(rng.randint(0, 2**31)).normal(0, 6, img.shape)
    out = Image.fromarray(np.clip(img + noise, 0, 255).astype(np.uint8), "RGB")
    d = ImageDraw.Draw(out)
    r = max(3, min(w, h) // 10)
    cx, cy = rng.randint(r, max(r + 1, w // 3)), rng.randint(r, max(r + 1, h // 3))
    d.ellipse([cx - r, cy - r, cx + r, cy + r], fill=(255, 220, 90))
    return out


def asymmetric_image(w: int, h: int, rng: random.Random) -> Image.Image:
    """Shapes and an 'F' placed off-centre, so every flip and turn of it is distinguishable."""
    bg = tuple(rng.randint(200, 250) for _ in range(3))
    img = Image.new("RGB", (w, h), bg)
    d = ImageDraw.Draw(img)
    d.rectangle([int(w * 0.08), int(h * 0.1), int(w * 0.35), int(h * 0.3)], fill=(200, 40, 40))
    d.ellipse([int(w * 0.6), int(h * 0.55), int(w * 0.9), int(h * 0.9)], fill=(40, 80, 200))
    d.polygon([(int(w * 0.1), int(h * 0.9)), (int(w * 0.3), int(h * 0.55)), (int(w * 0.42), int(h * 0.92))], fill=(40, 160, 60))
    x0, y0, s = int(w * 0.55), int(h * 0.12), max(4, min(w, h) // 4)
    d.rectangle([x0, y0, x0 + s // 5, y0 + s], fill=(20, 20, 20))  # an F: stem, top bar, middle bar
    d.rectangle([x0, y0, x0 + s * 3 // 4, y0 + s // 6], fill=(20, 20, 20))
    d.rectangle([x0, y0 + s * 2 // 5, x0 + s // 2, y0 + s * 2 // 5 + s // 6], fill=(20, 20, 20))
    return img


def _scene(kind: str, w: int, h: int, rng: random.Random) -> Image.Image:
    return natural_image(w, h, rng) if kind == "natural" else asymmetric_image(w, h, rng)


def _make_legibility(cond: dict[str, Any], index: int, settings: dict[str, Any]) -> Case:
    word = _word(settings, index, f"leg{cond}")
    height = int(round(cond.get("text_height", 16)))
    bg = tuple(cond.get("bg", (255, 255, 255)))
    if "contrast" in cond:  # luminance difference from the background, in grey levels
        delta = int(round(cond["contrast"]))
        base = int(round(sum(bg) / 3))
        g = base - delta if base - delta >= 0 else base + delta
        fg = (max(0, min(255, g)),) * 3
    else:
        fg = tuple(cond.get("fg", (0, 0, 0)))
    layer, cap_h = render_text_layer(word, height, fg)  # type: ignore[arg-type]
    angle = float(cond.get("rotation", 0))
    if angle:
        layer = layer.rotate(angle, expand=True, resample=Image.Resampling.BICUBIC)
    w, h = max(160, layer.width + 32), max(120, layer.height + 32)
    canvas = Image.new("RGB", (w, h), bg)  # type: ignore[arg-type]
    x, y = (w - layer.width) // 2, (h - layer.height) // 2
    canvas.paste(layer, (x, y), layer)
    truth = {"word": word, "cap_height_px": cap_h, "rotation_deg": angle, "fg": list(fg), "bg": list(bg),
             "contrast_ratio": round(contrast_ratio(fg, bg), 3), "box": [x, y, x + layer.width, y + layer.height]}  # type: ignore[arg-type]
    return Case([canvas], {}, "Read the text in the image.", ["OCR"], truth)


def _measure_legibility(case: Case, out: Output, settings: dict[str, Any]) -> tuple[dict[str, float], bool]:
    lines = list(out.data.get("lines") or ([] if out.text is None else [l for l in out.text.splitlines() if l.strip()]))
    if out.error:
        return {"char_accuracy": 0.0, "exact": 0.0}, False
    line, acc = best_reading(lines, case.truth["word"])
    case.truth["read"] = line
    exact = float(norm_text(line) == norm_text(case.truth["word"]))
    return {"char_accuracy": round(acc, 3), "exact": exact}, acc >= float(settings.get("min_char_accuracy", 1.0))


def _make_overlay(cond: dict[str, Any], index: int, settings: dict[str, Any]) -> Case:
    word = _word(settings, index, f"ovl{cond}")
    positions = settings.get("positions") or [[500, 500], [300, 300], [700, 650], [400, 750]]
    pos = list(cond.get("position") or positions[index % len(positions)])
    sizes = settings.get("canvas_sizes") or [[480, 320], [400, 400], [640, 360]]
    w, h = sizes[index % len(sizes)]
    bg = tuple(cond.get("bg", (245, 245, 240)))
    base = Image.new("RGB", (w, h), bg)  # type: ignore[arg-type]
    truth = {"word": word, "position": pos, "pixel_position": [int(pos[0] / 1000 * w), int(pos[1] / 1000 * h)], "bg": list(bg), "canvas": [w, h]}
    return Case([base], {"overlay_type": "text", "content": word, "position": pos},
                f"Write the word {word} on the image, centred at [{pos[0]}, {pos[1]}] (0-1000 coordinates).", ["Overlayer"], truth)


def _ink_colour(base: Image.Image, out: Image.Image) -> tuple[float, float, float] | None:
    a = np.asarray(base.convert("RGB"), dtype=np.int16)
    b = np.asarray(out.convert("RGB"), dtype=np.int16)
    if a.shape != b.shape:
        return None
    changed = np.abs(a - b).sum(axis=2) > 60
    if not changed.any():
        return None
    px = b[changed]
    # the most changed pixels are the glyph cores (anti-aliased edges blend with the canvas)
    far = np.abs(px - a[changed]).sum(axis=1)
    core = px[far >= np.percentile(far, 75)]
    return tuple(float(v) for v in np.median(core, axis=0))  # type: ignore[return-value]


def _read_word(case: Case, out: Output, settings: dict[str, Any]) -> tuple[list, list, str, float] | None:
    """OCR of the output against the case's word: (lines, boxes, best line, accuracy), recorded in
    `case.truth["read"]`; None without an output image or an OCR tool."""
    ocr = settings.get("_ocr")
    if out.image is None or ocr is None:
        return None
    lines, boxes = ocr(out.image)
    line, acc = best_reading(lines, case.truth["word"])
    case.truth["read"] = line
    return lines, boxes, line, acc


def _measure_overlay(case: Case, out: Output, settings: dict[str, Any]) -> tuple[dict[str, float], bool]:
    read = _read_word(case, out, settings)
    if read is None:
        return {"char_accuracy": 0.0}, False
    lines, boxes, line, acc = read
    metrics: dict[str, float] = {"char_accuracy": round(acc, 3)}
    w, h = case.truth["canvas"]
    if line and line in lines:
        b = boxes[lines.index(line)]
        cx, cy = (b[0] + b[2]) / 2, (b[1] + b[3]) / 2
        px, py = case.truth["pixel_position"]
        metrics["position_error"] = round(math.hypot(cx - px, cy - py) / max(w, h), 4)  # fraction of the long side
    ink = _ink_colour(case.images[0], out.image)
    metrics["contrast_ratio"] = round(contrast_ratio(ink, tuple(case.truth["bg"])), 3) if ink else 1.0
    ok = (acc >= float(settings.get("min_char_accuracy", 1.0))
          and metrics.get("position_error", 1.0) <= float(settings.get("position_tol", 0.05))
          and metrics["contrast_ratio"] >= float(settings.get("min_contrast_ratio", 3.0)))
    return metrics, ok


def _make_mirror(cond: dict[str, Any], index: int, settings: dict[str, Any]) -> Case:
    rng = _rng(settings, index, "mirror")
    kind = ("natural", "asymmetric")[index % 2]
    sizes = settings.get("sizes") or [[160, 112], [128, 128], [96, 144]]
    w, h = sizes[index % len(sizes)]
    img = _scene(kind, w, h, rng)
    direction = cond.get("direction", "horizontal")
    op = Image.Transpose.FLIP_LEFT_RIGHT if direction == "horizontal" else Image.Transpose.FLIP_TOP_BOTTOM
    words = "left to right (horizontally)" if direction == "horizontal" else "top to bottom (vertically)"
    return Case([img], {}, f"Mirror this image {words}.", ["Flip"], {"scene": kind, "size": [w, h], "direction": direction}, img.transpose(op))


def _measure_exact(case: Case, out: Output, settings: dict[str, Any]) -> tuple[dict[str, float], bool]:
    if out.image is None or case.expected is None:
        return {"mad_vs_expected": 255.0}, False
    d = mad(out.image, case.expected)
    src = mad(out.image, case.images[0])
    return {"mad_vs_expected": round(d, 3), "mad_vs_input": round(src, 3), "size_ok": float(out.image.size == case.expected.size)}, d <= float(settings.get("max_mad", 2.0))


def _turn(img: Image.Image, angle: int, direction: str) -> Image.Image:
    """The lossless turn: the canvas grows to hold the whole image (white corners at 45)."""
    ccw = angle if direction == "counter-clockwise" else -angle
    if angle % 90 == 0:
        op = {90: Image.Transpose.ROTATE_90, 180: Image.Transpose.ROTATE_180, 270: Image.Transpose.ROTATE_270}[ccw % 360]
        return img.transpose(op)
    return img.rotate(ccw, expand=True, fillcolor=(255, 255, 255), resample=Image.Resampling.BICUBIC)


def _make_rotation(cond: dict[str, Any], index: int, settings: dict[str, Any], square: bool) -> Case:
    rng = _rng(settings, index, f"rot{square}")
    kind = ("asymmetric", "natural")[index % 2]
    side = (settings.get("sizes") or [128, 112, 144])[index % 3]
    w, h = (side, side) if square else (side + side // 2, side)
    img = _scene(kind, w, h, rng)
    angle = int(cond.get("angle", 90))
    direction = cond.get("direction", "clockwise")
    words = "clockwise" if direction == "clockwise" else "counter-clockwise"
    truth = {"scene": kind, "size": [w, h], "angle": angle, "direction": direction, "either_direction": not square}
    return Case([img], {"angle": angle}, f"Rotate this image {angle} degrees {words}.", ["Rotate"], truth, _turn(img, angle, direction))


def _measure_rotation(case: Case, out: Output, settings: dict[str, Any]) -> tuple[dict[str, float], bool]:
    metrics, ok = _measure_exact(case, out, settings)
    if out.image is not None:  # the other direction, for the record: says which way it did turn
        other = "clockwise" if case.truth["direction"] == "counter-clockwise" else "counter-clockwise"
        metrics["mad_vs_other_direction"] = round(mad(out.image, _turn(case.images[0], case.truth["angle"], other)), 3)
    if out.image is None or case.expected is None:
        return metrics, ok
    # a 45-degree turn resamples: the tolerance is for an interpolated image, not an exact copy
    limit = float(settings.get("max_mad_resampled", 8.0)) if case.truth["angle"] % 90 else float(settings.get("max_mad", 2.0))
    best = metrics["mad_vs_expected"]
    if case.truth.get("either_direction"):  # the question is whether the content survives, not the direction
        best = min(best, metrics["mad_vs_other_direction"])
    return metrics, best <= limit


def _make_crop(cond: dict[str, Any], index: int, settings: dict[str, Any]) -> Case:
    rng = _rng(settings, index, "crop")
    sizes = settings.get("sizes") or [[320, 240], [257, 191], [400, 400], [199, 301]]
    w, h = sizes[index % len(sizes)]
    img = Image.new("RGB", (w, h), (235, 235, 235))
    d = ImageDraw.Draw(img)
    sw, sh = rng.randint(w // 8, w // 4), rng.randint(h // 8, h // 4)
    x0, y0 = rng.randint(2, w - sw - 2), rng.randint(2, h - sh - 2)
    d.rectangle([x0, y0, x0 + sw - 1, y0 + sh - 1], fill=(200, 30, 30))
    for _ in range(3):  # distractors in other colours
        a, b = rng.randint(0, w - 10), rng.randint(0, h - 10)
        d.ellipse([a, b, a + 9, b + 9], fill=(30, 60, 200))
    margin = float(cond.get("margin", 0.1))
    bx0, by0 = max(0, x0 - margin * sw), max(0, y0 - margin * sh)
    bx1, by1 = min(w, x0 + sw + margin * sw), min(h, y0 + sh + margin * sh)
    bbox = [int(bx0 * 1000 / w), int(by0 * 1000 / h), math.ceil(bx1 * 1000 / w), math.ceil(by1 * 1000 / h)]
    px = [bbox[0] * w // 1000, bbox[1] * h // 1000, bbox[2] * w // 1000, bbox[3] * h // 1000]
    expected = img.crop(tuple(px))
    return Case([img], {"bbox": bbox}, f"Crop the image to the red rectangle, region [{bbox[0]}, {bbox[1]}, {bbox[2]}, {bbox[3]}] (0-1000).",
                ["Crop"], {"size": [w, h], "shape_box_px": [x0, y0, x0 + sw, y0 + sh], "bbox": bbox, "expected_px": px}, expected)


def _red_mask(img: Image.Image) -> np.ndarray:
    a = np.asarray(img.convert("RGB"), dtype=np.int16)
    return (a[..., 0] > 150) & (a[..., 1] < 80) & (a[..., 2] < 80)


def _measure_crop(case: Case, out: Output, settings: dict[str, Any]) -> tuple[dict[str, float], bool]:
    if out.image is None or case.expected is None:
        return {"iou": 0.0}, False
    ew, eh = case.expected.size
    ow, oh = out.image.size
    size_err = max(abs(ew - ow), abs(eh - oh))
    m_out, m_exp = _red_mask(out.image), _red_mask(case.expected)
    hh, ww = min(oh, eh), min(ow, ew)
    a, b = m_out[:hh, :ww], m_exp[:hh, :ww]
    union = (a | b).sum() + (m_out.sum() - a.sum()) + (m_exp.sum() - b.sum())
    iou = float((a & b).sum() / union) if union else 0.0
    return {"iou": round(iou, 4), "size_error_px": float(size_err)}, iou >= float(settings.get("min_iou", 0.9)) and size_err <= 2


def _make_upscale(cond: dict[str, Any], index: int, settings: dict[str, Any]) -> Case:
    rng = _rng(settings, index, "sr")
    scale = int(cond.get("scale", 4))
    side = int(settings.get("lr_side", 40))
    kind = cond.get("scene") or ("natural", "asymmetric")[index % 2]
    hr = _scene(kind, side * 4, side * 4, rng)
    d = ImageDraw.Draw(hr)
    d.text((side // 3, side * 2), _word(settings, index, "sr"), font=dejavu_sans(max(8, side // 2)), fill=(15, 15, 15))
    hr = hr.filter(ImageFilter.GaussianBlur(0.6))  # no sub-pixel detail the low-res input cannot carry
    lr = hr.resize((side, side), Image.Resampling.BICUBIC)
    return Case([lr], {}, f"Upscale this image {scale}x.", ["SR"], {"scene": kind, "lr_size": [side, side], "hr_size": list(hr.size), "scale_asked": scale}, hr)


def _measure_upscale(case: Case, out: Output, settings: dict[str, Any]) -> tuple[dict[str, float], bool]:
    if out.image is None or case.expected is None:
        return {"scale": 0.0}, False
    scale = out.image.width / case.images[0].width
    asked = case.truth["scale_asked"]
    metrics = {"scale": round(scale, 3)}
    if out.image.size == case.expected.size:
        metrics["psnr"] = round(psnr(out.image, case.expected), 2)
        metrics["psnr_bicubic"] = round(psnr(case.images[0].resize(case.expected.size, Image.Resampling.BICUBIC), case.expected), 2)
    ok = abs(scale - asked) < 1e-6
    if settings.get("vs_bicubic"):  # the question asks for more than the scale: better than bicubic
        ok = ok and metrics.get("psnr", 0.0) > metrics.get("psnr_bicubic", 99.0)
    elif ok:
        ok = metrics.get("psnr", 0.0) >= float(settings.get("min_psnr", 20.0))
    return metrics, ok


def _make_grounding(cond: dict[str, Any], index: int, settings: dict[str, Any]) -> Case:
    case = _make_crop(cond, index, settings)
    x0, y0, x1, y1 = case.truth["shape_box_px"]
    w, h = case.truth["size"]
    case.args = {"reference_text": "the red rectangle"}
    case.truth["box_1000"] = [round(x0 * 1000 / w), round(y0 * 1000 / h), round(x1 * 1000 / w), round(y1 * 1000 / h)]
    case.expected = None
    case.expected_tools = ["Grounding"]
    return case


def _measure_grounding(case: Case, out: Output, settings: dict[str, Any]) -> tuple[dict[str, float], bool]:
    boxes = out.data.get("boxes") or []
    if out.error or not boxes:
        return {"iou": 0.0}, False
    iou = max(box_iou([float(v) for v in b[:4]], case.truth["box_1000"]) for b in boxes)
    return {"iou": round(iou, 4)}, iou >= float(settings.get("min_iou", 0.5))


def _make_generation(cond: dict[str, Any], index: int, settings: dict[str, Any]) -> Case:
    word = _word(settings, index, "gen")
    templates = settings.get("prompts") or ["A shop poster with the single word {w} in large letters",
                                            "A wooden sign that says {w}", "A book cover titled {w}"]
    prompt = templates[index % len(templates)].format(w=word)
    return Case([], {"prompt": prompt}, prompt, ["ImageGeneration"], {"word": word, "prompt": prompt})


def _measure_generation(case: Case, out: Output, settings: dict[str, Any]) -> tuple[dict[str, float], bool]:
    read = _read_word(case, out, settings)
    if read is None:
        return {"char_accuracy": 0.0}, False
    acc = read[3]
    return {"char_accuracy": round(acc, 3)}, acc >= float(settings.get("min_char_accuracy", 1.0))


TEXT_HEIGHT = Axis("text_height", 2, 64, "higher", "px", 1, (2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32, 48), "reads text")
CONTRAST = Axis("contrast", 1, 255, "higher", "grey levels", 1, (1, 2, 3, 5, 8, 12, 20, 32, 64, 128, 200, 255), "reads text with a luminance difference")

SUITES: dict[str, Suite] = {
    "legibility": Suite("legibility", "rendered text is read back exactly (character accuracy against the rendered word)", ("OCR",),
                        _make_legibility, _measure_legibility, {"text_height": TEXT_HEIGHT, "contrast": CONTRAST}),
    "overlay_text": Suite("overlay_text", "the text is readable (OCR and WCAG contrast) at the asked position", ("Overlayer",),
                          _make_overlay, _measure_overlay, needs_ocr=True),
    "mirror": Suite("mirror", "the output equals the exact mirror image in the asked direction", ("Flip",), _make_mirror, _measure_exact),
    "rotation": Suite("rotation", "the output equals the exact turn in the asked direction (square inputs)", ("Rotate",),
                      lambda c, i, s: _make_rotation(c, i, s, True), _measure_rotation),
    "rotation_content": Suite("rotation_content", "the whole image survives the turn (non-square inputs, lossless turn)", ("Rotate",),
                              lambda c, i, s: _make_rotation(c, i, s, False), _measure_rotation),
    "crop_region": Suite("crop_region", "the crop is the asked region (size and the marked shape's IoU)", ("Crop",), _make_crop, _measure_crop),
    "upscale": Suite("upscale", "the output has the asked scale and stays close to the high-resolution truth (PSNR)", ("SR",), _make_upscale, _measure_upscale),
    "grounding": Suite("grounding", "the returned box matches the shape's known box (IoU)", ("Grounding",), _make_grounding, _measure_grounding),
    "generation_text": Suite("generation_text", "the generated image contains the asked word (read by OCR)", ("ImageGeneration",),
                             _make_generation, _measure_generation, needs_ocr=True),
}
