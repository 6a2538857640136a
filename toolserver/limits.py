"""Input limits a tool server enforces before any work, and the request check that applies them.

`Limits` is the `limits:` block of a serving config (`configs/serve/*.yaml`); its defaults are
what an in-process `LocalToolbox` uses. `check_request` validates a served call exactly as the
episode runner does in-process, bounds text arguments and checks each input image's pixel
cost. Every refusal is a failed `ToolResult` with a stable error code, never an exception.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from PIL import Image

from toolserver.registry import REGISTRY, ArgType, OutputKind
from toolserver.request import ToolRequest
from toolserver.results import ToolResult
from toolserver.validation import DEFAULT_MAX_TEXT_CHARS, Profile, validate_call

# An image costs per row as well as per pixel (row pointers, PNG filter bytes, per-line calls):
# a 1 x 40M image took 1.3 GB and 11 s to decode. Each row counts as this many extra pixels.
DEFAULT_ROW_OVERHEAD_PIXELS = 64
DEFAULT_MAX_JSON_DEPTH = 32


@dataclass
class Limits:
    """Limits checked before any work (docs/serving.md, "Limits"); the pixel and byte limits
    themselves are the serving config's `max_pixels` and `http.max_request_bytes`.

    - `max_text_chars`: longest text argument (prompt, Overlayer text, grounding phrase);
    - `max_json_depth`: deepest nesting of a request's JSON document (HTTP);
    - `row_overhead_pixels`: what each image row costs on top of its pixels when an input image
      is measured against the pixel limit (`pixel_cost`).
    """

    max_text_chars: int = DEFAULT_MAX_TEXT_CHARS
    max_json_depth: int = DEFAULT_MAX_JSON_DEPTH
    row_overhead_pixels: int = DEFAULT_ROW_OVERHEAD_PIXELS

    def problems(self) -> list[str]:
        out = []
        if self.max_text_chars < 1:
            out.append("limits.max_text_chars must be >= 1")
        if not 2 <= self.max_json_depth <= 500:
            out.append("limits.max_json_depth must be in 2..500 (the request itself is 2 deep)")
        if self.row_overhead_pixels < 0:
            out.append("limits.row_overhead_pixels must be >= 0")
        return out


def pixel_cost(width: int, height: int, row_overhead_pixels: int = DEFAULT_ROW_OVERHEAD_PIXELS) -> int:
    """What a `width` x `height` image counts against a pixel limit: pixels plus a cost per row."""
    return (width + row_overhead_pixels) * height


def too_many_pixels(name: str, width: int, height: int, max_pixels: int, row_overhead_pixels: int) -> str | None:
    """The refusal message for an input image over the limit, or None when it fits."""
    cost = pixel_cost(width, height, row_overhead_pixels)
    if cost <= max_pixels:
        return None
    return (
        f"images.{name:.40} is {width}x{height}, which counts as {cost:,} pixels "
        f"({row_overhead_pixels} per row on top of each pixel), over the {max_pixels:,}-pixel limit"
    )


def input_pixels_refusal(request: ToolRequest, max_pixels: int, row_overhead_pixels: int) -> ToolResult | None:
    """`too_many_pixels` for the first input image over the limit; None when all fit."""
    for name, img in request.images.items():
        msg = too_many_pixels(name, img.width, img.height, max_pixels, row_overhead_pixels)
        if msg:
            return ToolResult.failure("too_many_pixels", msg)
    return None


def json_depth_exceeds(doc: Any, max_depth: int) -> bool:
    """True when `doc` (parsed JSON) nests deeper than `max_depth`; iterative, so any depth is safe."""
    stack: list[tuple[Any, int]] = [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        if depth > max_depth:
            return True
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return False


def image_kind(image: Image.Image) -> OutputKind:
    """The asset kind an image stands for when only its pixels travel: alpha means a cut-out,
    one channel a mask (the rule the asset store applies to a user's images)."""
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        return OutputKind.RGBA
    if image.mode in ("L", "1"):
        return OutputKind.MASK
    return OutputKind.IMAGE


@dataclass(frozen=True)
class _Seen:
    kind: OutputKind
    size: tuple[int, int]


class RequestAssets:
    """The validator's asset lookup for a request that carries its images: each image argument's
    ID names the image sent with it. An image sent without an ID gets the placeholder `<arg>`,
    since the image itself is the reference."""

    def __init__(self, request: ToolRequest):
        self.args = dict(request.args)
        self._assets: dict[str, _Seen] = {}
        spec = REGISTRY.get(request.tool)
        names = [a.name for a in spec.args if a.type is ArgType.ASSET] if spec is not None else []
        if "content" in request.images:
            names.append("content")  # an object overlay sends its cut-out under "content"
        for name in names:
            img = request.images.get(name)
            if img is None:
                continue
            aid = self.args.get(name)
            if not isinstance(aid, str) or not aid.strip():
                aid = self.args[name] = f"<{name}>"
            self._assets[aid] = _Seen(image_kind(img), img.size)

    def __contains__(self, asset_id: object) -> bool:
        return isinstance(asset_id, str) and asset_id in self._assets

    def get(self, asset_id: str) -> Any:
        return self._assets[asset_id]

    def ids(self) -> list[str]:
        return list(self._assets)


def predicted_output_refusal(request: ToolRequest, max_output_pixels: int) -> ToolResult | None:
    """`output_too_large` for a tool whose output size follows its input (`ToolSpec.output_scale`,
    SR: 4x each side) when that output would exceed `max_output_pixels`; None otherwise."""
    spec = REGISTRY.get(request.tool)
    scale = spec.output_scale if spec is not None else 0
    if not scale:
        return None
    for name, img in request.images.items():
        w, h = img.width * scale, img.height * scale
        if w * h > max_output_pixels:
            return ToolResult.failure(
                "output_too_large",
                f"{request.tool} would turn images.{name:.40} ({img.width}x{img.height}) into {w}x{h}, over the "
                f"{max_output_pixels:,}-pixel output limit; refused before running",
            )
    return None


def output_refusal(tool: str, result: ToolResult, max_output_pixels: int) -> ToolResult | None:
    """`output_too_large` for a successful result whose image is over `max_output_pixels`; None otherwise."""
    img = result.image
    if result.ok and img is not None and img.width * img.height > max_output_pixels:
        return ToolResult.failure("output_too_large", f"{tool} produced {img.width}x{img.height}, over the {max_output_pixels:,}-pixel limit")
    return None


def check_request(request: ToolRequest, limits: Limits, max_pixels: int) -> tuple[ToolRequest | None, ToolResult | None]:
    """(the request with validated, normalised arguments, None) or (None, the refusal).

    Refused: input images whose `pixel_cost` is over `max_pixels` (`too_many_pixels`); any
    call `validate_call` blocks, text over `limits.max_text_chars` included (the first blocking
    issue's code: `bad_choice`, `number_too_large`, `text_too_long`, ...); and an output that
    `predicted_output_refusal` says would exceed `max_pixels` (`output_too_large`).
    """
    refusal = input_pixels_refusal(request, max_pixels, limits.row_overhead_pixels)
    if refusal is not None:
        return None, refusal
    assets = RequestAssets(request)
    chk = validate_call(request.tool, assets.args, assets, Profile(request.profile), max_text_chars=limits.max_text_chars)
    if not chk.executable:
        first = chk.first_error()
        return None, ToolResult.failure(first.code if first else "invalid_call", chk.error_message()[:2000])
    refusal = predicted_output_refusal(request, max_pixels)
    if refusal is not None:
        return None, refusal
    args = {k: v for k, v in chk.args.items() if k != "__refs__"}
    return ToolRequest(request.tool, args, request.images, request.raw_args or dict(request.args), request.profile), None
