"""Crop, Rotate, Flip, Extract and Overlayer, implemented for real.

Two semantics profiles (`toolserver.validation.Profile`); both get only known asset IDs (the
validator refuses others before any tool runs):

* `canvascraft` reproduces the public CanvasAgent tools pixel for pixel, because the
  CanvasCraft data and the policies trained on it were made with them: Rotate turns
  counter-clockwise and keeps W x H at 90/180, Crop truncates each number before scaling,
  images are converted to RGB first, and text is placed with Pillow's default anchor.
* `exact` does what the schema text promises: clockwise rotation, lossless 90/180 turns that
  expand the canvas, and no mode conversion.
"""

from __future__ import annotations

import math

from PIL import Image, ImageDraw

from toolserver.fonts import dejavu_sans
from toolserver.registry import OutputKind
from toolserver.request import ToolRequest
from toolserver.results import ToolError, ToolResult
from toolserver.validation import Profile

WHITE = (255, 255, 255)


def _ok(text: str, image: Image.Image, kind: OutputKind = OutputKind.IMAGE, **data) -> ToolResult:
    return ToolResult(ok=True, text=text, kind=kind, image=image, data=data, backend="pure")


def crop(req: ToolRequest) -> ToolResult:
    img = req.images["image"]
    w, h = img.size
    if req.profile is Profile.CANVASCRAFT:
        # The public tool truncates toward zero first, so 120.7 becomes 120 before scaling.
        x0, y0, x1, y1 = (int(v) for v in req.args["bbox"])
        if min(x0, y0, x1, y1) < 0:
            raise ToolError("bbox_out_of_range", f"bbox has negative coordinates {[x0, y0, x1, y1]}")
        if x1 <= x0 or y1 <= y0:
            raise ToolError("bbox_unordered", f"bbox needs xmin < xmax and ymin < ymax after truncation; got {[x0, y0, x1, y1]}")
        px = [min(max(x0 * w // 1000, 0), w), min(max(y0 * h // 1000, 0), h), min(max(x1 * w // 1000, 0), w), min(max(y1 * h // 1000, 0), h)]
        src = img.convert("RGB")
    else:
        x0, y0, x1, y1 = req.args["bbox"]
        px = [math.floor(x0 * w / 1000), math.floor(y0 * h / 1000), math.ceil(x1 * w / 1000), math.ceil(y1 * h / 1000)]
        px = [min(max(px[0], 0), w), min(max(px[1], 0), h), min(max(px[2], 0), w), min(max(px[3], 0), h)]
        src = img
    if px[2] <= px[0] or px[3] <= px[1]:
        raise ToolError("empty_crop", f"bbox selects no pixels on a {w}x{h} image (pixel box {px})")
    out = src.crop(tuple(px))
    return _ok(f"Cropped image with bounding box: [{px[0]},{px[1]},{px[2]},{px[3]}]", out, pixel_box=px)


def rotate(req: ToolRequest) -> ToolResult:
    img = req.images["image"]
    angle = int(req.args["angle"])
    if req.profile is Profile.CANVASCRAFT:
        # PIL rotates counter-clockwise; the public tool passes the angle straight through.
        out = img.convert("RGB").rotate(angle, expand=(angle == 45), fillcolor=WHITE, resample=Image.Resampling.BICUBIC)
    else:
        if angle == 90:
            out = img.transpose(Image.Transpose.ROTATE_270)  # 270 counter-clockwise = 90 clockwise
        elif angle == 180:
            out = img.transpose(Image.Transpose.ROTATE_180)
        else:
            fill = (255, 255, 255, 0) if img.mode == "RGBA" else WHITE if img.mode == "RGB" else 255
            src = img if img.mode in ("RGB", "RGBA", "L") else img.convert("RGB")
            out = src.rotate(-angle, expand=True, fillcolor=fill, resample=Image.Resampling.BICUBIC)
    kind = OutputKind.RGBA if out.mode == "RGBA" else OutputKind.MASK if out.mode == "L" else OutputKind.IMAGE
    return _ok(f"Rotated image by {angle} degrees", out, kind)


def flip(req: ToolRequest) -> ToolResult:
    img = req.images["image"]
    src = img.convert("RGB") if req.profile is Profile.CANVASCRAFT else img
    out = src.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    kind = OutputKind.RGBA if out.mode == "RGBA" else OutputKind.MASK if out.mode == "L" else OutputKind.IMAGE
    return _ok("Flipped image horizontally", out, kind)


def extract(req: ToolRequest) -> ToolResult:
    img, mask = req.images["image"], req.images["mask"]
    if img.size != mask.size:
        raise ToolError("mask_size_mismatch", f"Image and mask dimensions must match. Image: {img.size}, Mask: {mask.size}")
    mask_l = mask if mask.mode == "L" else mask.convert("L")
    box = mask_l.getbbox()
    if box is None:
        raise ToolError("empty_mask", "Mask is empty (no non-zero pixels found).")
    cut = img.crop(box)
    cut = cut.convert("RGBA") if cut.mode != "RGBA" else cut.copy()
    cut.putalpha(mask_l.crop(box))
    x0, y0, x1, y1 = box
    return _ok(
        f"Extracted object from image using mask. Cropped from bbox: [{x0},{y0},{x1},{y1}], Output size: {cut.size}",
        cut,
        OutputKind.RGBA,
        bbox=list(box),
    )


def overlayer(req: ToolRequest) -> ToolResult:
    base = req.images["base_image"]
    kind = req.args["overlay_type"]
    content = req.args.get("content")
    if "position" in req.args:
        pos_x, pos_y = (float(v) for v in req.args["position"])
    else:
        pos_x, pos_y = 500, 500  # ints on purpose: the public echo prints "[500,500]" for the default
    w, h = base.size
    # Float arithmetic as in the public tool; int(pos/1000*size) is not always floor(pos*size/1000).
    px, py = int(pos_x / 1000 * w), int(pos_y / 1000 * h)
    out = base.convert("RGBA") if base.mode != "RGBA" else base.copy()
    if kind == "text":
        if not isinstance(content, str) or not content:
            raise ToolError("bad_content", "text overlay needs a non-empty 'content' string")
        draw = ImageDraw.Draw(out)
        font = dejavu_sans(max(20, min(w, h) // 20))
        tb = draw.textbbox((0, 0), content, font=font)
        tw, th = tb[2] - tb[0], tb[3] - tb[1]
        draw.text((px - tw // 2, py - th // 2), content, font=font, fill=(0, 0, 0, 255))
    else:
        overlay = req.images.get("content")
        if overlay is None:
            raise ToolError("unknown_asset", f"Could not find overlay image {content!r}")
        if overlay.mode != "RGBA":
            raise ToolError("wrong_asset_kind", f"object overlay must be an RGBA cut-out; got mode {overlay.mode}")
        ow, oh = overlay.size
        out.paste(overlay, (px - ow // 2, py - oh // 2), overlay)
    if req.profile is Profile.CANVASCRAFT:
        if base.mode == "RGB":
            out = out.convert("RGB")
    elif base.mode != "RGBA":
        out = out.convert("RGB")
    out_kind = OutputKind.RGBA if out.mode == "RGBA" else OutputKind.IMAGE
    return _ok(
        f"Overlaid {kind} onto image at position [{pos_x!r},{pos_y!r}]. Output size: {out.size}",
        out,
        out_kind,
        pixel_position=[px, py],
    )


PURE_TOOLS = {"Crop": crop, "Rotate": rotate, "Flip": flip, "Extract": extract, "Overlayer": overlayer}
