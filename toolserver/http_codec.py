"""The HTTP edge's JSON format: images as base64 PNG, results as plain JSON.

Used by the ingress deployment and by the HTTP client, so both sides agree on one format.
PNG keeps the image mode (L masks, RGBA cut-outs) exactly, which JPEG would not.
"""

from __future__ import annotations

import base64
import binascii
import io
import warnings
from typing import Any

from PIL import Image

from toolserver.registry import OutputKind
from toolserver.request import ToolRequest
from toolserver.results import ToolResult
from toolserver.validation import Profile

# Stored (level 0) deflate: measured here at 512^2, encode 16-21 ms and decode 1.5-3 ms, against
# 36 / 2-11 ms at level 1 and 44-49 / 7-9 ms at Pillow's default 6, for at most 1.4x the bytes
# of level 1 on photos. The edge is loopback or a datacenter link: latency-bound, not bandwidth-bound.
PNG_COMPRESS_LEVEL = 0


class BadRequest(ValueError):
    """A request the edge refuses: `code` is the structured error code (bad_image, ...)."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


def encode_image(img: Image.Image) -> str:
    buf = io.BytesIO()
    img.save(buf, format="PNG", compress_level=PNG_COMPRESS_LEVEL)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def decode_image(data: str, max_pixels: int, name: str = "image") -> Image.Image:
    """Decode base64 PNG, checking the declared size before any pixel is decompressed."""
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError, TypeError):
        raise BadRequest("bad_image", f"images.{name} is not valid base64") from None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(raw), formats=["PNG"])
            w, h = img.size
            if w * h > max_pixels:
                raise BadRequest("too_many_pixels", f"images.{name} is {w}x{h} = {w * h:,} pixels, over the {max_pixels:,}-pixel limit")
            img.load()
    except BadRequest:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise BadRequest("too_many_pixels", f"images.{name} looks like a decompression bomb") from None
    except (OSError, ValueError, SyntaxError):
        raise BadRequest("bad_image", f"images.{name} is not a readable PNG") from None
    return img


def request_to_json(req: ToolRequest) -> dict[str, Any]:
    return {
        "args": req.args,
        "raw_args": req.raw_args,
        "profile": Profile(req.profile).value,
        "images": {k: encode_image(v) for k, v in req.images.items()},
    }


def request_from_json(tool: str, body: Any, max_pixels: int) -> ToolRequest:
    if not isinstance(body, dict):
        raise BadRequest("bad_request", "the request body must be a JSON object")
    args, raw, images = body.get("args", {}), body.get("raw_args", {}), body.get("images", {})
    if not isinstance(args, dict) or not isinstance(raw, dict) or not isinstance(images, dict):
        raise BadRequest("bad_request", "args, raw_args and images must be JSON objects")
    try:
        profile = Profile(body.get("profile", Profile.CANVASCRAFT.value))
    except ValueError:
        raise BadRequest("bad_request", f"unknown profile {body.get('profile')!r:.40}") from None
    decoded = {}
    for k, v in images.items():
        if not isinstance(v, str):
            raise BadRequest("bad_image", f"images.{k:.40} must be a base64 PNG string")
        decoded[k] = decode_image(v, max_pixels, k)
    return ToolRequest(tool, args, decoded, raw or dict(args), profile)


def result_to_json(r: ToolResult) -> dict[str, Any]:
    return {
        "ok": r.ok,
        "text": r.text,
        "kind": OutputKind(r.kind).value,
        "image": encode_image(r.image) if r.image is not None else None,
        "data": r.data,
        "error_code": r.error_code,
        "plumbing_only": r.plumbing_only,
        "backend": r.backend,
        "elapsed_s": r.elapsed_s,
    }


def result_from_json(d: dict[str, Any], max_pixels: int) -> ToolResult:
    img = decode_image(d["image"], max_pixels, "result") if d.get("image") else None
    return ToolResult(
        ok=bool(d["ok"]),
        text=str(d.get("text", "")),
        kind=OutputKind(d.get("kind", OutputKind.NONE.value)),
        image=img,
        data=dict(d.get("data") or {}),
        error_code=d.get("error_code"),
        plumbing_only=bool(d.get("plumbing_only", False)),
        backend=d.get("backend"),
        elapsed_s=float(d.get("elapsed_s", 0.0)),
    )


def error_json(code: str, message: str) -> dict[str, Any]:
    """The body of every non-200 response: {"error": {"code", "message"}}."""
    return {"error": {"code": code, "message": message}}
