"""Verifiable alignment checks: the vocabulary tasks carry in `Task.checks`, and their evaluators.

The offline alignment judge scores a trajectory by running the checks its task declares. The
CanvasCraft RL builder emits them (it knows what the chain it executed must produce), and a
user can write them by hand. Each check is a JSON-able dict with a `type`, an optional `weight`
(default 1.0) and type-specific fields:

| type | fields | scores |
|---|---|---|
| `reference_similarity` | exactly one source: `image_index` (into `task.meta["reference_images"]`, PIL images or paths), `path` (a file; relative paths resolve against `task.meta["root"]`) or `asset` (an input ID such as `"img_2"`); `metric` `ssim` (default) / `psnr` / `l1`; `threshold` (optional); `size` (compare at this side, default 128) | similarity of the final image to the reference in [0, 1]; with a threshold, min(1, sim / threshold) |
| `ocr_contains` | `text`; `case_sensitive` (false); `fuzzy` (true) | 1 if the OCR tool reads `text` in the final image, else (fuzzy) the best similarity ratio of `text` to any same-length window of what was read, else 0 |
| `size_relation` | `of` (asset ID, default `img_1`) with `factor` (final = factor × of, per side) or `relation` `larger` / `smaller` / `equal`; or absolute `width` / `height`; `tolerance` (relative, 0.02) | 1 or 0 |
| `orientation` | `orientation` `landscape` / `portrait` / `square`, or `relation` `same` / `swapped` with `of` (asset ID); `tolerance` (0.02) | 1 or 0 |
| `asset_kind` | `kind` `image` / `mask` / `rgba`; `tool` (optional: made by this tool); `final` (false: the final image must be it) | 1 if a produced asset qualifies, else 0 |
| `grounding_finds` | `text`; `region` (optional [x0, y0, x1, y1] in 0-1000); `min_iou` (0.1) | 1 if the grounding tool finds `text` in the final image (inside `region`: min(1, best IoU / min_iou)), else 0 |
| `differs_from` | `of` (asset ID, default `img_1`); `min_change` (mean absolute difference on [0, 1], default 0.02) | min(1, change / min_change): the edit really changed the image |

Rules every check obeys:

* No final image: every check scores 0 (`no_final_image`).
* **Plumbing-only results never count as success.** If the final image (or any asset it was
  made from) came from a random-weight backend, every check scores 0 (`plumbing_only`); an
  `asset_kind` check ignores plumbing-only assets. If the judge's own OCR/grounding tool
  answers with a plumbing-only result, the check is unverifiable (it measured nothing).
* A check that cannot be evaluated — unknown type, malformed fields, the OCR/grounding tool
  unavailable — is *unverifiable*: it is left out of the mean, and its reason is logged and
  reported. If no check is verifiable, the judge returns its configured fallback, counted.
"""

from __future__ import annotations

import difflib
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
from PIL import Image
from skimage.metrics import structural_similarity

from canvasagent.assets import Asset, AssetStore
from canvasagent.trajectory import Trajectory
from toolserver.registry import OutputKind
from toolserver.request import ToolRequest
from toolserver.results import ToolResult

log = logging.getLogger(__name__)

CHECK_TYPES = (
    "reference_similarity",
    "ocr_contains",
    "size_relation",
    "orientation",
    "asset_kind",
    "grounding_finds",
    "differs_from",
)


@dataclass
class CheckResult:
    type: str
    score: float | None  # None: unverifiable
    reason: str = ""
    weight: float = 1.0

    @property
    def verifiable(self) -> bool:
        return self.score is not None


@dataclass
class CheckContext:
    trajectory: Trajectory
    toolbox: Any | None = None  # a toolserver Toolbox for OCR / Grounding checks
    _tool_cache: dict[tuple, ToolResult] = field(default_factory=dict)

    @property
    def store(self) -> AssetStore:
        return self.trajectory.assets

    @property
    def final(self) -> Asset | None:
        return self.trajectory.final_asset()

    def tainted(self, asset: Asset) -> bool:
        """True if the asset or anything it was made from is a plumbing-only result."""
        seen: set[str] = set()
        stack = [asset]
        while stack:
            a = stack.pop()
            if a.id in seen:
                continue
            seen.add(a.id)
            if a.plumbing_only:
                return True
            for src in a.provenance.inputs:
                if src in self.store:
                    stack.append(self.store.get(src))
        return False

    def call_tool(self, tool: str, args: dict[str, Any], image: Image.Image) -> ToolResult:
        key = (tool, tuple(sorted(args.items())), id(image))
        if key not in self._tool_cache:
            if self.toolbox is None:
                self._tool_cache[key] = ToolResult.failure("no_toolbox", f"no toolbox to run {tool}")
            else:
                req = ToolRequest(tool, {"image": "final", **args}, {"image": image}, {"image": "final", **args},
                                  getattr(self.toolbox, "profile", None) or _default_profile())
                try:
                    self._tool_cache[key] = self.toolbox.call(req)
                except Exception as e:  # a remote toolbox down must not crash scoring
                    self._tool_cache[key] = ToolResult.failure("toolbox_error", f"{type(e).__name__}: {e}")
        return self._tool_cache[key]


def _default_profile():
    from toolserver.validation import Profile

    return Profile.CANVASCRAFT


class CheckError(ValueError):
    """A malformed check: reported as unverifiable, never raised to the caller."""


# -- helpers ----------------------------------------------------------------------------------


def _asset_image(ctx: CheckContext, asset_id: Any) -> Image.Image:
    if not isinstance(asset_id, str) or asset_id not in ctx.store:
        raise CheckError(f"unknown asset {asset_id!r}")
    return ctx.store.get(asset_id).image


def _rgb_array(img: Image.Image, size: int) -> np.ndarray:
    if img.mode == "RGBA":
        bg = Image.new("RGB", img.size, (255, 255, 255))
        bg.paste(img, mask=img.getchannel("A"))
        img = bg
    return np.asarray(img.convert("RGB").resize((size, size), Image.Resampling.BILINEAR), dtype=np.float32) / 255.0


def similarity(a: Image.Image, b: Image.Image, metric: str = "ssim", size: int = 128) -> float:
    x, y = _rgb_array(a, size), _rgb_array(b, size)
    if metric == "ssim":
        return float(max(0.0, structural_similarity(x, y, channel_axis=2, data_range=1.0)))
    if metric == "psnr":
        mse = float(((x - y) ** 2).mean())
        return 1.0 if mse <= 1e-10 else float(min(1.0, max(0.0, 10 * np.log10(1.0 / mse) / 40.0)))
    if metric == "l1":
        return float(1.0 - np.abs(x - y).mean())
    raise CheckError(f"unknown metric {metric!r} (ssim | psnr | l1)")


def _reference(ctx: CheckContext, check: dict[str, Any]) -> Image.Image:
    meta = ctx.trajectory.task.meta
    sources = [k for k in ("image_index", "path", "asset") if k in check]
    if len(sources) != 1:
        raise CheckError("reference_similarity needs exactly one of image_index, path, asset")
    if "asset" in check:
        return _asset_image(ctx, check["asset"])
    if "image_index" in check:
        refs = meta.get("reference_images") or []
        i = check["image_index"]
        if not isinstance(i, int) or not 0 <= i < len(refs):
            raise CheckError(f"image_index {i!r} is not in task.meta['reference_images'] ({len(refs)} images)")
        ref = refs[i]
    else:
        ref = check["path"]
    if isinstance(ref, Image.Image):
        return ref
    p = Path(str(ref))
    if not p.is_absolute() and meta.get("root"):
        p = Path(meta["root"]) / p
    if not p.exists():
        raise CheckError(f"reference image {str(p)!r} does not exist")
    with Image.open(p) as im:
        return im.copy()


def _norm_text(s: str, case_sensitive: bool) -> str:
    s = " ".join(s.split())
    return s if case_sensitive else s.lower()


def _ocr_text(result: ToolResult) -> str:
    data = result.data or {}
    for key in ("text", "full_text"):
        if isinstance(data.get(key), str):
            return data[key]
    lines = data.get("lines")
    if isinstance(lines, list):
        out = []
        for ln in lines:
            if isinstance(ln, str):
                out.append(ln)
            elif isinstance(ln, dict) and isinstance(ln.get("text"), str):
                out.append(ln["text"])
        if out:
            return "\n".join(out)
    return result.text or ""


_BOX_RE = re.compile(r"\[\s*(-?\d+(?:\.\d+)?)\s*,\s*(-?\d+(?:\.\d+)?)\s*,\s*(-?\d+(?:\.\d+)?)\s*,\s*(-?\d+(?:\.\d+)?)\s*\]")


def _boxes(result: ToolResult) -> list[list[float]]:
    data = result.data or {}
    raw = data.get("boxes") or data.get("detections") or []
    out: list[list[float]] = []
    if isinstance(raw, list):
        for b in raw:
            if isinstance(b, dict):
                b = b.get("bbox") or b.get("box")
            if isinstance(b, (list, tuple)) and len(b) == 4:
                try:
                    out.append([float(v) for v in b])
                except (TypeError, ValueError):
                    continue
    if not out:
        out = [[float(v) for v in m.groups()] for m in _BOX_RE.finditer(result.text or "")]
    return out


def _iou(a: list[float], b: list[float]) -> float:
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def _tool_answer(ctx: CheckContext, tool: str, args: dict[str, Any], image: Image.Image) -> ToolResult | CheckResult:
    res = ctx.call_tool(tool, args, image)
    if not res.ok:
        return CheckResult("", None, f"{tool.lower()}_unavailable: {res.error_code}: {res.text[:120]}")
    if res.plumbing_only:
        return CheckResult("", None, f"{tool.lower()}_plumbing_only: the judge's {tool} backend has random weights")
    return res


# -- evaluators -------------------------------------------------------------------------------


def _reference_similarity(ctx: CheckContext, check: dict[str, Any], final: Image.Image) -> CheckResult:
    sim = similarity(final, _reference(ctx, check), str(check.get("metric", "ssim")), int(check.get("size", 128)))
    thr = check.get("threshold")
    score = sim if thr is None else min(1.0, sim / float(thr)) if float(thr) > 0 else 1.0
    return CheckResult("reference_similarity", score, f"similarity {sim:.3f}")


def _ocr_contains(ctx: CheckContext, check: dict[str, Any], final: Image.Image) -> CheckResult:
    target = check.get("text")
    if not isinstance(target, str) or not target.strip():
        raise CheckError("ocr_contains needs a non-empty 'text'")
    ans = _tool_answer(ctx, "OCR", {}, final)
    if isinstance(ans, CheckResult):
        return ans
    cs = bool(check.get("case_sensitive", False))
    read, want = _norm_text(_ocr_text(ans), cs), _norm_text(target, cs)
    if want in read or want.replace(" ", "") in read.replace(" ", ""):
        return CheckResult("ocr_contains", 1.0, f"found {target!r}")
    if not check.get("fuzzy", True):
        return CheckResult("ocr_contains", 0.0, f"{target!r} not in OCR text {read[:60]!r}")
    hay, needle = read.replace(" ", ""), want.replace(" ", "")
    n = len(needle)
    best = 0.0
    for i in range(max(1, len(hay) - n + 1)):
        best = max(best, difflib.SequenceMatcher(None, needle, hay[i : i + n]).ratio())
    return CheckResult("ocr_contains", best, f"closest match to {target!r}: ratio {best:.2f}")


def _size_relation(ctx: CheckContext, check: dict[str, Any], final: Image.Image) -> CheckResult:
    tol = float(check.get("tolerance", 0.02))
    fw, fh = final.size

    def close(a: float, b: float) -> bool:
        return abs(a - b) <= tol * max(abs(b), 1.0)

    if "width" in check or "height" in check:
        ok = all(close(v, float(check[k])) for k, v in (("width", fw), ("height", fh)) if k in check)
        return CheckResult("size_relation", 1.0 if ok else 0.0, f"final {fw}x{fh}")
    ow, oh = _asset_image(ctx, check.get("of", "img_1")).size
    if "factor" in check:
        f = float(check["factor"])
        ok = close(fw, f * ow) and close(fh, f * oh)
    else:
        rel = check.get("relation")
        if rel == "larger":
            ok = fw * fh > ow * oh * (1 + tol)
        elif rel == "smaller":
            ok = fw * fh < ow * oh * (1 - tol)
        elif rel == "equal":
            ok = close(fw, ow) and close(fh, oh)
        else:
            raise CheckError("size_relation needs factor, relation (larger|smaller|equal), or width/height")
    return CheckResult("size_relation", 1.0 if ok else 0.0, f"final {fw}x{fh} vs {ow}x{oh}")


def _aspect_class(w: int, h: int, tol: float) -> str:
    r = w / h if h else 0.0
    if abs(r - 1.0) <= tol:
        return "square"
    return "landscape" if r > 1 else "portrait"


def _orientation(ctx: CheckContext, check: dict[str, Any], final: Image.Image) -> CheckResult:
    tol = float(check.get("tolerance", 0.02))
    got = _aspect_class(*final.size, tol)
    if "orientation" in check:
        want = check["orientation"]
        if want not in ("landscape", "portrait", "square"):
            raise CheckError(f"orientation must be landscape|portrait|square, not {want!r}")
        return CheckResult("orientation", 1.0 if got == want else 0.0, f"final is {got}")
    rel = check.get("relation")
    ref = _aspect_class(*_asset_image(ctx, check.get("of", "img_1")).size, tol)
    if rel == "same":
        ok = got == ref
    elif rel == "swapped":
        ok = {got, ref} == {"landscape", "portrait"}
    else:
        raise CheckError("orientation needs 'orientation' or relation same|swapped")
    return CheckResult("orientation", 1.0 if ok else 0.0, f"final is {got}, reference is {ref}")


def _asset_kind(ctx: CheckContext, check: dict[str, Any], final: Image.Image) -> CheckResult:
    try:
        kind = OutputKind(check.get("kind"))
    except ValueError:
        raise CheckError(f"asset_kind needs kind image|mask|rgba, not {check.get('kind')!r}") from None
    tool = check.get("tool")
    pool = [ctx.final] if check.get("final") else [a for a in ctx.store if a.provenance.tool is not None]
    for a in pool:
        if a is not None and a.kind is kind and (tool is None or a.provenance.tool == tool) and not ctx.tainted(a):
            return CheckResult("asset_kind", 1.0, f"{a.id} is {kind.value}")
    return CheckResult("asset_kind", 0.0, f"no real {kind.value} asset" + (f" from {tool}" if tool else ""))


def _grounding_finds(ctx: CheckContext, check: dict[str, Any], final: Image.Image) -> CheckResult:
    text = check.get("text")
    if not isinstance(text, str) or not text.strip():
        raise CheckError("grounding_finds needs a non-empty 'text'")
    ans = _tool_answer(ctx, "Grounding", {"reference_text": text}, final)
    if isinstance(ans, CheckResult):
        return ans
    boxes = _boxes(ans)
    if not boxes:
        return CheckResult("grounding_finds", 0.0, f"{text!r} not found")
    region = check.get("region")
    if region is None:
        return CheckResult("grounding_finds", 1.0, f"{text!r} found ({len(boxes)} boxes)")
    if not (isinstance(region, (list, tuple)) and len(region) == 4):
        raise CheckError("region must be [x0, y0, x1, y1] in 0-1000")
    best = max(_iou([float(v) for v in region], b) for b in boxes)
    min_iou = float(check.get("min_iou", 0.1))
    return CheckResult("grounding_finds", min(1.0, best / min_iou) if min_iou > 0 else 1.0, f"best IoU {best:.2f}")


def _differs_from(ctx: CheckContext, check: dict[str, Any], final: Image.Image) -> CheckResult:
    ref = _asset_image(ctx, check.get("of", "img_1"))
    change = float(np.abs(_rgb_array(final, 128) - _rgb_array(ref, 128)).mean())
    need = float(check.get("min_change", 0.02))
    return CheckResult("differs_from", min(1.0, change / need) if need > 0 else 1.0, f"mean change {change:.3f}")


EVALUATORS: dict[str, Callable[[CheckContext, dict[str, Any], Image.Image], CheckResult]] = {
    "reference_similarity": _reference_similarity,
    "ocr_contains": _ocr_contains,
    "size_relation": _size_relation,
    "orientation": _orientation,
    "asset_kind": _asset_kind,
    "grounding_finds": _grounding_finds,
    "differs_from": _differs_from,
}


def run_check(ctx: CheckContext, check: Any) -> CheckResult:
    """Evaluate one check dict; never raises."""
    if not isinstance(check, dict):
        return CheckResult("invalid", None, f"a check must be a dict, not {type(check).__name__}")
    ctype = str(check.get("type", ""))
    try:
        weight = float(check.get("weight", 1.0))
    except (TypeError, ValueError):
        weight = 1.0
    fn = EVALUATORS.get(ctype)
    if fn is None:
        return CheckResult(ctype or "invalid", None, f"unknown check type {ctype!r}; known: {', '.join(CHECK_TYPES)}", weight)
    final = ctx.final
    if final is None:
        return CheckResult(ctype, 0.0, "no_final_image", weight)
    if final.image.width == 0 or final.image.height == 0:
        return CheckResult(ctype, 0.0, "empty_final_image", weight)
    if ctx.tainted(final):
        return CheckResult(ctype, 0.0, f"plumbing_only: {final.id} comes from a random-weight backend", weight)
    try:
        res = fn(ctx, check, final.image)
    except (CheckError, KeyError, TypeError, ValueError) as e:
        return CheckResult(ctype, None, f"malformed check: {e}", weight)
    except Exception as e:  # an image library error on odd input: unverifiable, logged
        log.exception("check %s failed", ctype)
        return CheckResult(ctype, None, f"check_error: {type(e).__name__}: {e}", weight)
    res.type, res.weight = ctype, weight
    if res.score is not None:
        res.score = float(min(1.0, max(0.0, res.score))) if np.isfinite(res.score) else 0.0
    return res


def run_checks(ctx: CheckContext, checks: list[Any]) -> tuple[float | None, list[CheckResult]]:
    """Weighted mean over verifiable checks (None when none is verifiable), and every result."""
    results = [run_check(ctx, c) for c in checks]
    ver = [r for r in results if r.verifiable and r.weight > 0]
    for r in results:
        if not r.verifiable:
            log.info("alignment check %s unverifiable: %s", r.type, r.reason)
    if not ver:
        return None, results
    total_w = sum(r.weight for r in ver)
    return sum(r.weight * (r.score or 0.0) for r in ver) / total_w, results
