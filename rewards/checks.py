"""Verifiable alignment checks: the vocabulary tasks carry in `Task.checks`, and their evaluators.

The offline alignment judge runs the checks a task declares; the CanvasCraft RL builder emits
them and a user can write them by hand. Each check is a JSON-able dict with a `type`, an
optional `weight` (default 1.0) and the type-specific fields below.

Every check is *calibrated against doing nothing*: its score says what the trajectory achieved
compared with leaving the input as it was (the `baseline`, by default `img_1`). A no-op, a wrong
transform, a wrong parameter or a wrong asset scores near 0; the intended result scores 1. Each
check also says whether it *passed* its threshold; a task succeeds only when every verifiable
check passed (`all_passed`), and the mean score is reported separately as partial credit.

| type | fields | score (calibration) | passes when |
|---|---|---|---|
| `reference_similarity` | exactly one source: `image_index` (into `task.meta["reference_images"]`), `path` (relative to `task.meta["root"]`, which it may not leave) or `asset`; `metric` `ssim` (default) / `psnr` / `l1`; `size` (compare at this side, 128); `baseline` (asset ID, `img_1`; null: uncalibrated); `exact` (false); `threshold` (0.9) | gain = (sim(final, ref) − sim(baseline, ref)) / (1 − sim(baseline, ref)), clipped to [0, 1], times the size agreement min(w/w′, w′/w)·min(h/h′, h′/h). With `exact`, a pixel-exact match (same size, mean absolute difference ≤ `exact_tolerance`, 0.5/255) scores 1 and anything else scores `inexact_scale` (0.5) × gain | exact: the match is exact; otherwise score ≥ threshold |
| `ocr_contains` | `text`; `case_sensitive` (false); `fuzzy` (true); `min_ratio` (0.6); `baseline` (`img_1`) | r = 1 if the OCR tool reads `text` in the final image, else (fuzzy) the best similarity ratio of `text` to a same-length window of what was read, and 0 below `min_ratio` (no credit for text that is not there); calibrated as (r − r₀) / (1 − r₀) with r₀ the same reading of the baseline. Unverifiable when the baseline already reads the text (doing nothing would pass) | the text is read exactly |
| `answer_contains` | `text`; `tool` (OCR); `case_sensitive` (false) | 1 if a successful call of `tool` in the trajectory answered with `text` (normalised, spaces ignored), else 0; doing nothing answers nothing | score is 1 |
| `size_relation` | `of` (asset ID, default `img_1`) with `factor` (final = factor × of, per side) or `relation` `larger` / `smaller` / `equal`; or absolute `width` / `height`; `tolerance` (relative, 0.02) | 1 or 0; a no-op fails any relation but `equal` | score is 1 |
| `orientation` | `orientation` `landscape` / `portrait` / `square`, or `relation` `same` / `swapped` with `of` (asset ID); `tolerance` (0.02) | 1 or 0 | score is 1 |
| `asset_kind` | `kind` `image` / `mask` / `rgba`; `tool` (optional: made by this tool); `final` (false: the final image must be it) | 1 if a produced asset qualifies, else 0 (a no-op produces nothing) | score is 1 |
| `grounding_finds` | `text`; `region` (optional [x0, y0, x1, y1] in 0-1000); `min_iou` (0.1) | 1 if the grounding tool finds `text` in the final image (inside `region`: min(1, best IoU / min_iou)), else 0 | score is 1 |
| `easel_reconstruction` | `threshold` (0.8) | the EASEL outcome the environment recorded (`trajectory.meta["easel"]`: `score` = S of the final canvas, `s_blank` = S of the blank canvas), calibrated as (S − S_blank) / (1 − S_blank) | gain ≥ threshold |
| `differs_from` | `of` (asset ID, default `img_1`); `min_change` (mean absolute difference on [0, 1], default 0.02) | min(1, change / min_change). Necessary, not sufficient: any change passes, so builders pair it with a check of what the change should be | change ≥ min_change |

Rules every check obeys:

* No final image: every check scores 0 (`no_final_image`) and fails.
* **Plumbing-only results never count as success.** If the final image (or any asset it was
  made from) came from a random-weight backend, every check scores 0 (`plumbing_only`); an
  `asset_kind` check ignores plumbing-only assets. If the judge's own OCR/grounding tool
  answers with a plumbing-only result, the check is unverifiable (it measured nothing).
* A check that cannot be evaluated — unknown type, malformed fields, the OCR/grounding tool
  unavailable, a baseline that already passes — is *unverifiable*: it is left out of the mean
  and of `all_passed`, and its reason is logged and reported. If no check is verifiable, the
  judge returns its configured fallback, counted.
"""

from __future__ import annotations

import difflib
import json
import logging
import re
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
from PIL import Image
from skimage.metrics import structural_similarity

from canvasagent.core.assets import Asset, AssetStore
from canvasagent.core.imageio import ImageLoadError, images_match, resolve_path, rgb_float
from canvasagent.core.trajectory import Trajectory, Turn
from rewards.judges.base import image_digest
from toolserver.registry import OutputKind
from toolserver.request import ToolRequest
from toolserver.results import ToolResult
from toolserver.validation import Profile

log = logging.getLogger(__name__)

@dataclass
class CheckResult:
    type: str
    score: float | None  # None: unverifiable
    reason: str = ""
    weight: float = 1.0
    passed: bool = False  # met its threshold (meaningless when unverifiable)

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
                self._tool_cache[key] = _TOOL_ANSWERS.get(self.toolbox, tool, args, image)
        return self._tool_cache[key]


class _ToolAnswers:
    """Successful judge-side tool answers by image content, per toolbox, shared by every context.

    GRPO's n rollouts of a task read the same baseline (often the same final image) with the same
    tool, and an OCR call costs ~0.1-0.5 s on a CPU. Failures are not kept, so a toolbox that
    comes back is asked again.
    """

    def __init__(self, size: int = 512):
        self._lock = threading.Lock()
        self._by_toolbox: "weakref.WeakKeyDictionary[Any, OrderedDict[tuple, ToolResult]]" = weakref.WeakKeyDictionary()
        self._size = size

    def _table(self, toolbox: Any) -> "OrderedDict[tuple, ToolResult] | None":
        try:
            return self._by_toolbox.setdefault(toolbox, OrderedDict())
        except TypeError:  # not weak-referenceable: no sharing
            return None

    def get(self, toolbox: Any, tool: str, args: dict[str, Any], image: Image.Image) -> ToolResult:
        key = (tool, json.dumps(args, sort_keys=True, default=str), image_digest(image))
        with self._lock:
            table = self._table(toolbox)
            hit = table.get(key) if table is not None else None
            if hit is not None:
                table.move_to_end(key)
                return hit
        req = ToolRequest(tool, {"image": "final", **args}, {"image": image}, {"image": "final", **args},
                          getattr(toolbox, "profile", None) or Profile.CANVASCRAFT)
        try:
            res = toolbox.call(req)
        except Exception as e:  # a remote toolbox down must not crash scoring
            return ToolResult.failure("toolbox_error", f"{type(e).__name__}: {e}")
        if res.ok and table is not None:
            with self._lock:
                table[key] = res
                while len(table) > self._size:
                    table.popitem(last=False)
        return res


_TOOL_ANSWERS = _ToolAnswers()


class CheckError(ValueError):
    """A malformed check: reported as unverifiable, never raised to the caller."""


def _asset_image(ctx: CheckContext, asset_id: Any) -> Image.Image:
    if not isinstance(asset_id, str) or asset_id not in ctx.store:
        raise CheckError(f"unknown asset {asset_id!r}")
    return ctx.store.get(asset_id).image


def similarity(a: Image.Image, b: Image.Image, metric: str = "ssim", size: int = 128) -> float:
    x, y = rgb_float(a, size), rgb_float(b, size)
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
    root = meta.get("root")
    try:
        # A task read from disk names its reference relative to its own folder and may not leave it.
        p = resolve_path(str(ref), [root] if root else None, root)
    except ImageLoadError as e:
        raise CheckError(str(e)) from None
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
        texts = [ln.get("text") if isinstance(ln, dict) else ln for ln in lines]
        out = [t for t in texts if isinstance(t, str)]
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


def box_iou(a: list[float], b: list[float]) -> float:
    """Intersection over union of two [x0, y0, x1, y1] boxes (0 for empty ones)."""
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


def calibrated(value: float, baseline: float) -> float | None:
    """What a result achieved over doing nothing, on [0, 1]: 0 at the baseline's value, 1 at a
    perfect result; None when the baseline is already perfect (nothing left to measure)."""
    if baseline >= 1.0 - 1e-6:
        return None
    return float(min(1.0, max(0.0, (value - baseline) / (1.0 - baseline))))


def _baseline(ctx: CheckContext, check: dict[str, Any]) -> Image.Image | None:
    """The `baseline` image (default `img_1`); None if uncalibrated or the task has no input image."""
    b = check.get("baseline", "img_1")
    if b is None:
        return None
    if not isinstance(b, str):
        raise CheckError(f"baseline must be an asset ID or null, not {b!r}")
    if b not in ctx.store:
        if "baseline" in check:
            raise CheckError(f"unknown baseline asset {b!r}")
        return None
    return ctx.store.get(b).image


def _size_agreement(a: tuple[int, int], b: tuple[int, int]) -> float:
    (aw, ah), (bw, bh) = a, b
    if min(aw, ah, bw, bh) <= 0:
        return 0.0
    return min(aw / bw, bw / aw) * min(ah / bh, bh / ah)


def _reference_similarity(ctx: CheckContext, check: dict[str, Any], final: Image.Image) -> CheckResult:
    ref = _reference(ctx, check)
    metric, size = str(check.get("metric", "ssim")), int(check.get("size", 128))
    thr = float(check.get("threshold", 0.9))
    exact = bool(check.get("exact", False))
    if exact and images_match(final, ref, float(check.get("exact_tolerance", 0.5 / 255))):
        return CheckResult("reference_similarity", 1.0, "exact match", passed=True)
    sim = similarity(final, ref, metric, size)
    base = _baseline(ctx, check)
    if base is None:
        gain, how = sim, f"similarity {sim:.3f} (uncalibrated)"
    else:
        sim0 = similarity(base, ref, metric, size)
        g = calibrated(sim, sim0)
        if g is None:
            return CheckResult("reference_similarity", None, "baseline_equals_reference: doing nothing already matches")
        gain, how = g, f"similarity {sim:.3f} vs {sim0:.3f} doing nothing"
    score = gain * _size_agreement(final.size, ref.size)
    if exact:
        score *= float(check.get("inexact_scale", 0.5))
        return CheckResult("reference_similarity", score, f"not exact; {how}", passed=False)
    return CheckResult("reference_similarity", score, how, passed=score >= thr)


def _read_ratio(read: str, want: str, fuzzy: bool, min_ratio: float) -> float:
    if want in read or want.replace(" ", "") in read.replace(" ", ""):
        return 1.0
    if not fuzzy:
        return 0.0
    hay, needle = read.replace(" ", ""), want.replace(" ", "")
    n = len(needle)
    best = max(difflib.SequenceMatcher(None, needle, hay[i : i + n]).ratio() for i in range(max(1, len(hay) - n + 1)))
    return best if best >= min_ratio else 0.0


def _text(check: dict[str, Any], ctype: str) -> str:
    text = check.get("text")
    if not isinstance(text, str) or not text.strip():
        raise CheckError(f"{ctype} needs a non-empty 'text'")
    return text


def answering_turn(traj: Trajectory, tool: str, text: str, case_sensitive: bool = False) -> Turn | None:
    """The first successful `tool` call of `traj` that answered with `text` (normalised, spaces
    ignored), as the `answer_contains` check reads it; None if there is none."""
    want = _norm_text(text, case_sensitive).replace(" ", "")
    return next((t for t in traj.turns if t.call is not None and t.call.name == tool and t.status == "ok"
                 and want in _norm_text(t.observation or "", case_sensitive).replace(" ", "")), None)


def _ocr_contains(ctx: CheckContext, check: dict[str, Any], final: Image.Image) -> CheckResult:
    target = _text(check, "ocr_contains")
    cs, fuzzy = bool(check.get("case_sensitive", False)), bool(check.get("fuzzy", True))
    min_ratio = float(check.get("min_ratio", 0.6))
    want = _norm_text(target, cs)

    def ratio(img: Image.Image) -> float | CheckResult:
        ans = _tool_answer(ctx, "OCR", {}, img)
        if isinstance(ans, CheckResult):
            return ans
        return _read_ratio(_norm_text(_ocr_text(ans), cs), want, fuzzy, min_ratio)

    r = ratio(final)
    if isinstance(r, CheckResult):
        return r
    base = _baseline(ctx, check)
    r0 = ratio(base) if base is not None else 0.0
    if isinstance(r0, CheckResult):
        return r0
    score = calibrated(r, r0)
    if score is None:
        return CheckResult("ocr_contains", None, f"baseline_already_reads {target!r}: doing nothing would pass")
    return CheckResult("ocr_contains", score, f"read ratio {r:.2f} vs {r0:.2f} doing nothing", passed=r >= 1.0)


def _answer_contains(ctx: CheckContext, check: dict[str, Any], final: Image.Image | None) -> CheckResult:
    target, tool = _text(check, "answer_contains"), str(check.get("tool", "OCR"))
    t = answering_turn(ctx.trajectory, tool, target, bool(check.get("case_sensitive", False)))
    if t is not None:
        return CheckResult("answer_contains", 1.0, f"{tool} answered {target!r} at turn {t.index}", passed=True)
    return CheckResult("answer_contains", 0.0, f"no successful {tool} call answered {target!r}")


def _easel_reconstruction(ctx: CheckContext, check: dict[str, Any], final: Image.Image | None) -> CheckResult:
    e = ctx.trajectory.meta.get("easel") or {}
    if not isinstance(e.get("score"), (int, float)) or not isinstance(e.get("s_blank"), (int, float)):
        raise CheckError("no EASEL outcome recorded (trajectory.meta['easel'] needs score and s_blank)")
    s, s0 = float(e["score"]), float(e["s_blank"])
    gain = calibrated(s, s0)
    if gain is None:
        return CheckResult("easel_reconstruction", None, "the blank canvas already matches the reference")
    thr = float(check.get("threshold", 0.8))
    return CheckResult("easel_reconstruction", gain, f"S {s:.3f} vs {s0:.3f} for the blank canvas", passed=gain >= thr)


def _size_relation(ctx: CheckContext, check: dict[str, Any], final: Image.Image) -> CheckResult:
    tol = float(check.get("tolerance", 0.02))
    fw, fh = final.size

    def close(a: float, b: float) -> bool:
        return abs(a - b) <= tol * max(abs(b), 1.0)

    if "width" in check or "height" in check:
        ok = all(close(v, float(check[k])) for k, v in (("width", fw), ("height", fh)) if k in check)
        return _binary("size_relation", ok, f"final {fw}x{fh}")
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
    return _binary("size_relation", ok, f"final {fw}x{fh} vs {ow}x{oh}")


def _binary(ctype: str, ok: bool, reason: str) -> CheckResult:
    return CheckResult(ctype, 1.0 if ok else 0.0, reason, passed=bool(ok))


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
        return _binary("orientation", got == want, f"final is {got}")
    rel = check.get("relation")
    ref = _aspect_class(*_asset_image(ctx, check.get("of", "img_1")).size, tol)
    if rel == "same":
        ok = got == ref
    elif rel == "swapped":
        ok = {got, ref} == {"landscape", "portrait"}
    else:
        raise CheckError("orientation needs 'orientation' or relation same|swapped")
    return _binary("orientation", ok, f"final is {got}, reference is {ref}")


def _asset_kind(ctx: CheckContext, check: dict[str, Any], final: Image.Image) -> CheckResult:
    try:
        kind = OutputKind(check.get("kind"))
    except ValueError:
        raise CheckError(f"asset_kind needs kind image|mask|rgba, not {check.get('kind')!r}") from None
    tool = check.get("tool")
    pool = [ctx.final] if check.get("final") else [a for a in ctx.store if a.provenance.tool is not None]
    for a in pool:
        if a is not None and a.kind is kind and (tool is None or a.provenance.tool == tool) and not ctx.tainted(a):
            return _binary("asset_kind", True, f"{a.id} is {kind.value}")
    return _binary("asset_kind", False, f"no real {kind.value} asset" + (f" from {tool}" if tool else ""))


def _grounding_finds(ctx: CheckContext, check: dict[str, Any], final: Image.Image) -> CheckResult:
    text = _text(check, "grounding_finds")
    ans = _tool_answer(ctx, "Grounding", {"reference_text": text}, final)
    if isinstance(ans, CheckResult):
        return ans
    boxes = _boxes(ans)
    if not boxes:
        return _binary("grounding_finds", False, f"{text!r} not found")
    region = check.get("region")
    if region is None:
        return _binary("grounding_finds", True, f"{text!r} found ({len(boxes)} boxes)")
    if not (isinstance(region, (list, tuple)) and len(region) == 4):
        raise CheckError("region must be [x0, y0, x1, y1] in 0-1000")
    best = max(box_iou([float(v) for v in region], b) for b in boxes)
    min_iou = float(check.get("min_iou", 0.1))
    score = min(1.0, best / min_iou) if min_iou > 0 else 1.0
    return CheckResult("grounding_finds", score, f"best IoU {best:.2f}", passed=score >= 1.0)


def _differs_from(ctx: CheckContext, check: dict[str, Any], final: Image.Image) -> CheckResult:
    ref = _asset_image(ctx, check.get("of", "img_1"))
    change = float(np.abs(rgb_float(final, 128) - rgb_float(ref, 128)).mean())
    need = float(check.get("min_change", 0.02))
    return CheckResult("differs_from", min(1.0, change / need) if need > 0 else 1.0, f"mean change {change:.3f}", passed=change >= need)


EVALUATORS: dict[str, Callable[[CheckContext, dict[str, Any], Image.Image], CheckResult]] = {
    "reference_similarity": _reference_similarity,
    "ocr_contains": _ocr_contains,
    "answer_contains": _answer_contains,
    "easel_reconstruction": _easel_reconstruction,
    "size_relation": _size_relation,
    "orientation": _orientation,
    "asset_kind": _asset_kind,
    "grounding_finds": _grounding_finds,
    "differs_from": _differs_from,
}
CHECK_TYPES = tuple(EVALUATORS)
_NO_IMAGE_NEEDED = frozenset({"answer_contains", "easel_reconstruction"})  # they need no final image


def run_check(ctx: CheckContext, check: Any) -> CheckResult:
    """Evaluate one check dict; never raises."""
    if not isinstance(check, dict):
        return CheckResult("invalid", None, f"a check must be a dict, not {type(check).__name__}")
    ctype = str(check.get("type", ""))
    try:
        weight = float(check.get("weight", 1.0))
        if not np.isfinite(weight):
            raise ValueError
    except (TypeError, ValueError, OverflowError):
        weight = 1.0
    fn = EVALUATORS.get(ctype)
    if fn is None:
        return CheckResult(ctype or "invalid", None, f"unknown check type {ctype!r}; known: {', '.join(CHECK_TYPES)}", weight)
    final = ctx.final
    if ctype not in _NO_IMAGE_NEEDED:
        if final is None:
            return CheckResult(ctype, 0.0, "no_final_image", weight)
        if final.image.width == 0 or final.image.height == 0:
            return CheckResult(ctype, 0.0, "empty_final_image", weight)
        if ctx.tainted(final):
            return CheckResult(ctype, 0.0, f"plumbing_only: {final.id} comes from a random-weight backend", weight)
    try:
        res = fn(ctx, check, final.image if final is not None else None)
    except (CheckError, KeyError, TypeError, ValueError, OverflowError) as e:
        return CheckResult(ctype, None, f"malformed check: {e}", weight)
    except Exception as e:  # an image library error on odd input: unverifiable, logged
        log.exception("check %s failed", ctype)
        return CheckResult(ctype, None, f"check_error: {type(e).__name__}: {e}", weight)
    res.type, res.weight = ctype, weight
    if res.score is not None:
        res.score = float(min(1.0, max(0.0, res.score))) if np.isfinite(res.score) else 0.0
    else:
        res.passed = False
    return res


def all_passed(results: list[CheckResult]) -> bool:
    """Strict success: at least one verifiable check, and every verifiable one passed."""
    ver = [r for r in results if r.verifiable and r.weight > 0]
    return bool(ver) and all(r.passed for r in ver)


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
