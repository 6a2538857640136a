"""The HTTP edge's formats, used by the ingress and by the HTTP client alike.

- **JSON** (`application/json`, the default public format): images as base64 PNG, results as
  plain JSON. PNG keeps the image mode (L masks, RGBA cut-outs) exactly, which JPEG would not.
- **Raw frames** (`RAW_CONTENT_TYPE`, opt-in): the same JSON document as a header, followed by
  the images' raw pixels (at 512^2 a stored PNG encode+decode costs ~18 ms and a call makes
  four; raw costs a copy). Content-Type selects the request format and `Accept` the response's;
  `GET /v1/tools` lists the formats the server speaks, which is how `HttpToolbox` picks raw.

  Layout: 4-byte big-endian header length, the UTF-8 JSON header, then the pixel section. In the
  header an image is `{"mode", "size": [w, h], "offset", "length"}` (offsets into the pixel
  section, pixels in Pillow's raw layout for the mode, rows top to bottom), or a base64 PNG
  string for modes without a portable raw layout (palette, 16/32-bit).
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import struct
import warnings
from typing import Any, Callable

from PIL import Image

from toolserver.limits import Limits, json_depth_exceeds, too_many_pixels
from toolserver.registry import OutputKind
from toolserver.request import ToolRequest
from toolserver.results import ToolResult
from toolserver.validation import Profile

# Stored (level 0) deflate: at 512^2 it encodes 2x faster than level 1 and decodes faster, for
# at most 1.4x the bytes; the edge is loopback or a datacenter link, latency-bound.
PNG_COMPRESS_LEVEL = 0

JSON_CONTENT_TYPE = "application/json"
RAW_CONTENT_TYPE = "application/x-canvasagent-raw-images"
FORMATS = (JSON_CONTENT_TYPE, RAW_CONTENT_TYPE)
_HEADER_LEN = struct.Struct(">I")
# Modes whose raw bytes mean the same on every machine (no byte order): bytes per pixel; mode
# "1" packs 8 pixels per byte, each row padded to a whole byte.
_RAW_BYTES_PER_PIXEL = {"L": 1, "LA": 2, "RGB": 3, "RGBA": 4}


class BadRequest(ValueError):
    """A request the edge refuses: `code` is the structured error code (bad_image, ...)."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


def encode_image(img: Image.Image) -> str:
    buf = io.BytesIO()
    img.save(buf, format="PNG", compress_level=PNG_COMPRESS_LEVEL)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def parse_json(data: bytes, max_depth: int, what: str) -> Any:
    """`json.loads(data)`; raises BadRequest("bad_request") for bytes that are not JSON (not
    UTF-8, an int past Python's digit limit, ...) and BadRequest("json_too_deep") for a document
    nested deeper than `max_depth`, however deep: the parser's own recursion limit included."""
    try:
        doc = json.loads(data)
    except RecursionError:
        raise BadRequest("json_too_deep", f"{what} nests deeper than the {max_depth}-level limit") from None
    except ValueError:  # JSONDecodeError, bytes that are not UTF-8, too many digits
        raise BadRequest("bad_request", f"{what} is not JSON") from None
    if json_depth_exceeds(doc, max_depth):
        raise BadRequest("json_too_deep", f"{what} nests deeper than the {max_depth}-level limit")
    return doc


def decode_image(data: str, max_pixels: int, name: str = "image", row_overhead_pixels: int = 0) -> Image.Image:
    """Decode base64 PNG, checking the declared size (counting `row_overhead_pixels` per row,
    `toolserver.limits.pixel_cost`) before any pixel is decompressed."""
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError, TypeError):
        raise BadRequest("bad_image", f"images.{name} is not valid base64") from None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(raw), formats=["PNG"])
            msg = too_many_pixels(name, *img.size, max_pixels, row_overhead_pixels)
            if msg:
                raise BadRequest("too_many_pixels", msg)
            img.load()
    except BadRequest:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise BadRequest("too_many_pixels", f"images.{name} looks like a decompression bomb") from None
    except (OSError, ValueError, SyntaxError):
        raise BadRequest("bad_image", f"images.{name} is not a readable PNG") from None
    return img


def request_to_json(req: ToolRequest, encode: Callable[[Image.Image], Any] = encode_image) -> dict[str, Any]:
    images = {k: encode(v) for k, v in req.images.items()}
    return {"args": req.args, "raw_args": req.raw_args, "profile": Profile(req.profile).value, "images": images}


def request_from_json(tool: str, body: Any, max_pixels: int, limits: Limits | None = None) -> ToolRequest:
    """The request in a parsed JSON body; images are checked against `max_pixels` with the
    per-row cost of `limits` before they are decoded. Raises BadRequest."""
    overhead = (limits or Limits()).row_overhead_pixels

    def decode(name: str, v: Any) -> Image.Image:
        if not isinstance(v, str):
            raise BadRequest("bad_image", f"images.{name:.40} must be a base64 PNG string")
        return decode_image(v, max_pixels, name, overhead)

    return _request_from_document(tool, body, decode)


def _request_from_document(tool: str, body: Any, decode: Callable[[str, Any], Image.Image]) -> ToolRequest:
    if not isinstance(body, dict):
        raise BadRequest("bad_request", "the request body must be a JSON object")
    args, raw, images = body.get("args", {}), body.get("raw_args", {}), body.get("images", {})
    if not isinstance(args, dict) or not isinstance(raw, dict) or not isinstance(images, dict):
        raise BadRequest("bad_request", "args, raw_args and images must be JSON objects")
    try:
        profile = Profile(body.get("profile", Profile.CANVASCRAFT.value))
    except ValueError:
        raise BadRequest("bad_request", f"unknown profile {body.get('profile')!r:.40}") from None
    decoded = {k: decode(k, v) for k, v in images.items()}
    return ToolRequest(tool, args, decoded, raw or dict(args), profile)


def result_to_json(r: ToolResult, encode: Callable[[Image.Image], Any] = encode_image) -> dict[str, Any]:
    return {
        "ok": r.ok,
        "text": r.text,
        "kind": OutputKind(r.kind).value,
        "image": encode(r.image) if r.image is not None else None,
        "data": r.data,
        "error_code": r.error_code,
        "plumbing_only": r.plumbing_only,
        "backend": r.backend,
        "elapsed_s": r.elapsed_s,
    }


def result_from_json(d: dict[str, Any], max_pixels: int, decode: Callable[[Any], Image.Image] | None = None) -> ToolResult:
    decode = decode or (lambda v: decode_image(v, max_pixels, "result"))
    img = decode(d["image"]) if d.get("image") else None
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


def media_type(header: str | None) -> str:
    return (header or "").split(";", 1)[0].strip().lower()


def accepts_raw(accept: str | None) -> bool:
    return any(media_type(part) == RAW_CONTENT_TYPE for part in (accept or "").split(","))


def raw_length(mode: str, size: tuple[int, int]) -> int | None:
    """Bytes of `mode` pixels at `size` in raw form; None for modes sent as PNG instead."""
    w, h = size
    if mode == "1":
        return (w + 7) // 8 * h
    bpp = _RAW_BYTES_PER_PIXEL.get(mode)
    return None if bpp is None else bpp * w * h


class _FrameWriter:
    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.offset = 0

    def image(self, img: Image.Image) -> Any:
        if raw_length(img.mode, img.size) is None:
            return encode_image(img)
        data = img.tobytes()
        desc = {"mode": img.mode, "size": list(img.size), "offset": self.offset, "length": len(data)}
        self.chunks.append(data)
        self.offset += len(data)
        return desc

    def frame(self, header: dict[str, Any]) -> bytes:
        head = json.dumps(header).encode()
        return b"".join([_HEADER_LEN.pack(len(head)), head, *self.chunks])


def _split_frame(body: bytes, max_depth: int = 500) -> tuple[Any, memoryview]:
    if len(body) < _HEADER_LEN.size:
        raise BadRequest("bad_request", "the raw frame is shorter than its header length")
    (n,) = _HEADER_LEN.unpack_from(body)
    if _HEADER_LEN.size + n > len(body):
        raise BadRequest("bad_request", f"the raw frame's header claims {n:,} bytes, past the end of the body")
    header = parse_json(body[_HEADER_LEN.size : _HEADER_LEN.size + n], max_depth, "the raw frame's header")
    return header, memoryview(body)[_HEADER_LEN.size + n :]


def _read_raw_image(desc: Any, pixels: memoryview, max_pixels: int, name: str, row_overhead_pixels: int = 0) -> Image.Image:
    if isinstance(desc, str):
        return decode_image(desc, max_pixels, name, row_overhead_pixels)
    if not isinstance(desc, dict):
        raise BadRequest("bad_image", f"images.{name:.40} must be a raw image descriptor or a base64 PNG string")
    mode, size, offset, length = desc.get("mode"), desc.get("size"), desc.get("offset"), desc.get("length")
    if not (isinstance(size, list) and len(size) == 2 and all(type(v) is int and v > 0 for v in size)):
        raise BadRequest("bad_image", f"images.{name:.40}: size must be [width, height], positive integers")
    w, h = size
    # Checked before any pixel is touched, like the PNG path's declared-size check.
    msg = too_many_pixels(name, w, h, max_pixels, row_overhead_pixels)
    if msg:
        raise BadRequest("too_many_pixels", msg)
    want = raw_length(mode, (w, h)) if isinstance(mode, str) else None
    if want is None:
        raise BadRequest("bad_image", f"images.{name:.40}: mode {mode!r:.20} has no raw form; send it as PNG")
    if type(offset) is not int or type(length) is not int or length != want or offset < 0 or offset + length > len(pixels):
        raise BadRequest("bad_image", f"images.{name:.40}: {w}x{h} {mode} needs {want:,} bytes inside the pixel section")
    return Image.frombytes(mode, (w, h), pixels[offset : offset + length])


def request_to_raw(req: ToolRequest) -> bytes:
    out = _FrameWriter()
    return out.frame(request_to_json(req, encode=out.image))


def request_from_raw(tool: str, body: bytes, max_pixels: int, limits: Limits | None = None) -> ToolRequest:
    """The request in a raw frame; sizes and the header's depth are checked before any pixel
    is read. Raises BadRequest."""
    limits = limits or Limits()
    header, pixels = _split_frame(body, limits.max_json_depth)
    return _request_from_document(tool, header, lambda name, v: _read_raw_image(v, pixels, max_pixels, name, limits.row_overhead_pixels))


def result_to_raw(r: ToolResult) -> bytes:
    out = _FrameWriter()
    return out.frame(result_to_json(r, encode=out.image))


def result_from_raw(body: bytes, max_pixels: int) -> ToolResult:
    header, pixels = _split_frame(body)
    if not isinstance(header, dict):
        raise BadRequest("bad_request", "the raw frame's header is not a JSON object")
    return result_from_json(header, max_pixels, decode=lambda v: _read_raw_image(v, pixels, max_pixels, "result"))


def error_json(code: str, message: str) -> dict[str, Any]:
    """The body of every non-200 response: {"error": {"code", "message"}}."""
    return {"error": {"code": code, "message": message}}
