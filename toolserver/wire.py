"""How requests and results travel inside Ray: raw pixels, never PNG.

Two carriers, both free of codecs (PNG encoding of a 1024^2 image alone costs tens of ms):

- **Shared memory** (`shm`), when caller and replica share a host: the sender writes the raw
  pixels to a file under /dev/shm and only its name travels through Ray. Measured here at 512^2
  RGB, moving 2 x 768 KB through Ray's object store costs ~3.5 ms above an empty call whether
  the array is passed by value, as a top-level `ray.put` ObjectRef or as a nested one (each
  object-store put/get is several IPC hops to the raylet); writing and reading a tmpfs file
  costs ~0.4 ms.
- **Numpy arrays**, everywhere else (another node, no /dev/shm): Ray serialises them out of band
  (pickle protocol 5) into its object store.

A replica that cannot find a request's shm file (it runs on another host) answers with
`SHM_UNAVAILABLE`; callers then resend that call as arrays and stop using shm for that
deployment. PNG/base64 exists only at the HTTP edge (`toolserver.http_codec`).

Ownership of shm files: a request's files belong to the caller, which removes them once the call
is over (`WireRequest.release`, after any retries); a result's file belongs to whoever unpacks
the result (`WireResult.unpack` removes it). A replica sweeps its own result files that nobody
collected (the caller timed out) after `SHM_ORPHAN_S`.
"""

from __future__ import annotations

import logging
import mmap
import os
import re
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from toolserver.registry import OutputKind
from toolserver.request import ToolRequest
from toolserver.results import ToolResult
from toolserver.validation import Profile

log = logging.getLogger(__name__)

# Modes whose pixels survive np.asarray -> Image.fromarray unchanged. Others (palette images,
# for instance) travel as PIL objects, which Pillow pickles as raw bytes: still no codec.
_ARRAY_MODES = frozenset({"1", "L", "LA", "RGB", "RGBA", "I", "F", "I;16"})
# Modes whose numpy layout is exactly Pillow's raw layout, so `Image.frombytes` can read the
# array's buffer directly: 5x cheaper than `Image.fromarray` at 512^2 RGB (0.1 vs 0.5 ms).
# Mode "1" is not among them (numpy holds one bool per pixel, Pillow packs bits).
_RAW_DTYPES = {m: np.dtype(d) for m, d in {"L": "u1", "LA": "u1", "RGB": "u1", "RGBA": "u1", "I": "=i4", "F": "=f4", "I;16": "<u2"}.items()}

SHM_DIR = Path("/dev/shm")
SHM_PREFIX = "canvasagent-ts-"
_SHM_NAME = re.compile(rf"{SHM_PREFIX}[0-9a-f]{{32}}")
# Below this Ray inlines the bytes in the RPC message itself, which is as cheap as a file.
SHM_MIN_BYTES = 64 * 1024
SHM_ORPHAN_S = 600.0  # a result file still there after this was never collected
SHM_UNAVAILABLE = "shm_unavailable"  # error code: the replica cannot see the caller's /dev/shm


class ShmMissing(Exception):
    """A shm file named in a request is not on this host (or was already removed)."""


def shm_available() -> bool:
    return SHM_DIR.is_dir() and os.access(SHM_DIR, os.W_OK)


def _shm_write(data: bytes) -> str:
    name = SHM_PREFIX + uuid.uuid4().hex
    # O_EXCL and 0600: never write through someone else's file or link.
    fd = os.open(SHM_DIR / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)
    return name


def _shm_path(name: str) -> Path:
    # The name comes from another process: only our own flat names, never a path.
    if not _SHM_NAME.fullmatch(name):
        raise ShmMissing(f"not a toolserver shm name: {name!r:.80}")
    return SHM_DIR / name


def _shm_read_image(name: str, mode: str, size: tuple[int, int], nbytes: int) -> Image.Image:
    try:
        fd = os.open(_shm_path(name), os.O_RDONLY)
    except FileNotFoundError:
        raise ShmMissing(f"{name} is not in {SHM_DIR} on this host") from None
    try:
        if os.fstat(fd).st_size != nbytes:
            raise ShmMissing(f"{name} holds {os.fstat(fd).st_size} bytes, expected {nbytes}")
        # frombytes decodes straight from the mapping into Pillow's own storage: one copy.
        with mmap.mmap(fd, nbytes, prot=mmap.PROT_READ) as mm:
            return Image.frombytes(mode, size, mm)
    finally:
        os.close(fd)


def _shm_remove(name: str) -> None:
    try:
        os.unlink(_shm_path(name))
    except (FileNotFoundError, ShmMissing):
        pass


def sweep_orphans(names: dict[str, float], max_age_s: float = SHM_ORPHAN_S) -> None:
    """Remove result files (name -> creation time) older than `max_age_s`; forget the rest that
    are gone. Called by the replica that wrote them, so it never touches another's files."""
    now = time.monotonic()
    for name, t in list(names.items()):
        if now - t > max_age_s:
            _shm_remove(name)
            del names[name]
        elif not (SHM_DIR / name).exists():
            del names[name]


@dataclass
class WireImage:
    mode: str
    array: np.ndarray | None = None
    pil: Image.Image | None = None
    shm: str | None = None  # file name under SHM_DIR holding `tobytes()`
    size: tuple[int, int] = (0, 0)
    nbytes: int = 0

    @classmethod
    def pack(cls, img: Image.Image, shm: bool = False) -> "WireImage":
        if img.mode in _ARRAY_MODES:
            if shm:
                data = img.tobytes()
                if len(data) >= SHM_MIN_BYTES:
                    try:
                        return cls(img.mode, shm=_shm_write(data), size=img.size, nbytes=len(data))
                    except OSError as e:  # /dev/shm full or read-only: arrays still work
                        log.warning("shared memory write failed (%s); sending the image as an array", e)
            return cls(img.mode, array=np.asarray(img))
        return cls(img.mode, pil=img)

    def unpack(self) -> Image.Image:
        if self.pil is not None:
            return self.pil
        if self.shm is not None:
            return _shm_read_image(self.shm, self.mode, self.size, self.nbytes)
        arr = self.array
        assert arr is not None
        if _RAW_DTYPES.get(self.mode) == arr.dtype and arr.flags.c_contiguous and arr.ndim in (2, 3):
            # Arrays from Ray's object store are read-only; frombytes copies, so the image is
            # writable and does not pin the object store buffer.
            return Image.frombytes(self.mode, (arr.shape[1], arr.shape[0]), arr)
        # fromarray infers exactly these modes from dtype and shape (checked in the tests).
        return Image.fromarray(arr)

    def release(self) -> None:
        if self.shm is not None:
            _shm_remove(self.shm)


@dataclass
class WireRequest:
    tool: str
    args: dict[str, Any]
    images: dict[str, WireImage] = field(default_factory=dict)
    raw_args: dict[str, Any] = field(default_factory=dict)
    profile: str = Profile.CANVASCRAFT.value

    @classmethod
    def pack(cls, req: ToolRequest, shm: bool = False) -> "WireRequest":
        images: dict[str, WireImage] = {}
        try:
            for k, v in req.images.items():
                images[k] = WireImage.pack(v, shm)
        except BaseException:
            for w in images.values():  # a half-written request must not leave files behind
                w.release()
            raise
        return cls(req.tool, req.args, images, req.raw_args, Profile(req.profile).value)

    @property
    def uses_shm(self) -> bool:
        return any(w.shm is not None for w in self.images.values())

    def unpack(self) -> ToolRequest:
        """Raises ShmMissing when a shm image is not on this host; the caller's files stay."""
        return ToolRequest(self.tool, self.args, {k: v.unpack() for k, v in self.images.items()}, self.raw_args, Profile(self.profile))

    def release(self) -> None:
        for w in self.images.values():
            w.release()


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
    def pack(cls, r: ToolResult, shm: bool = False) -> "WireResult":
        img = WireImage.pack(r.image, shm) if r.image is not None else None
        return cls(r.ok, r.text, OutputKind(r.kind).value, img, r.data, r.error_code, r.plumbing_only, r.backend, r.elapsed_s)

    def unpack(self) -> ToolResult:
        """The result; a shm image is read once and its file removed."""
        img = None
        if self.image is not None:
            try:
                img = self.image.unpack()
            finally:
                self.image.release()
        return ToolResult(
            self.ok, self.text, OutputKind(self.kind), img, dict(self.data), self.error_code, self.plumbing_only, self.backend, self.elapsed_s
        )
