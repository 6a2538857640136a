"""How requests and results travel inside Ray: images as numpy arrays, never PNG.

Ray serialises numpy arrays out of band (pickle protocol 5), so a large image goes into the
object store as one buffer and is read back without a decode; PNG encoding of a 1024^2 image
alone costs tens of milliseconds. PNG/base64 exists only at the HTTP edge (`toolserver.http_codec`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from PIL import Image

from toolserver.registry import OutputKind
from toolserver.request import ToolRequest
from toolserver.results import ToolResult
from toolserver.validation import Profile

# Modes whose pixels survive np.asarray -> Image.fromarray unchanged. Others (palette images,
# for instance) travel as PIL objects, which Pillow pickles as raw bytes: still no codec.
_ARRAY_MODES = frozenset({"1", "L", "LA", "RGB", "RGBA", "I", "F", "I;16"})


@dataclass
class WireImage:
    mode: str
    array: np.ndarray | None = None
    pil: Image.Image | None = None

    @classmethod
    def pack(cls, img: Image.Image) -> "WireImage":
        if img.mode in _ARRAY_MODES:
            return cls(img.mode, array=np.asarray(img))
        return cls(img.mode, pil=img)

    def unpack(self) -> Image.Image:
        if self.pil is not None:
            return self.pil
        assert self.array is not None
        # fromarray infers exactly these modes from dtype and shape (checked in the tests).
        # Arrays from Ray's object store are read-only; tools return new images, never mutate.
        return Image.fromarray(self.array)


@dataclass
class WireRequest:
    tool: str
    args: dict[str, Any]
    images: dict[str, WireImage] = field(default_factory=dict)
    raw_args: dict[str, Any] = field(default_factory=dict)
    profile: str = Profile.CANVASCRAFT.value

    @classmethod
    def pack(cls, req: ToolRequest) -> "WireRequest":
        return cls(req.tool, req.args, {k: WireImage.pack(v) for k, v in req.images.items()}, req.raw_args, Profile(req.profile).value)

    def unpack(self) -> ToolRequest:
        return ToolRequest(self.tool, self.args, {k: v.unpack() for k, v in self.images.items()}, self.raw_args, Profile(self.profile))


@dataclass
class WireResult:
    ok: bool
    text: str
    kind: str = OutputKind.NONE.value
    image: WireImage | None = None
    data: dict[str, Any] = field(default_factory=dict)
    error_code: str | None = None
    plumbing_only: bool = False
    backend: str | None = None
    elapsed_s: float = 0.0

    @classmethod
    def pack(cls, r: ToolResult) -> "WireResult":
        img = WireImage.pack(r.image) if r.image is not None else None
        return cls(r.ok, r.text, OutputKind(r.kind).value, img, r.data, r.error_code, r.plumbing_only, r.backend, r.elapsed_s)

    def unpack(self) -> ToolResult:
        img = self.image.unpack() if self.image is not None else None
        return ToolResult(
            self.ok, self.text, OutputKind(self.kind), img, dict(self.data), self.error_code, self.plumbing_only, self.backend, self.elapsed_s
        )
