"""Safe image loading: allowed roots, pixel limits, no silent mode conversion."""

from __future__ import annotations

import io
import os
import warnings
from pathlib import Path
from typing import Iterable

from PIL import Image

DEFAULT_MAX_INPUT_PIXELS = 40_000_000


class ImageLoadError(ValueError):
    pass


def resolve_path(path: str | Path, allowed_roots: Iterable[str | Path] | None = None, base: str | Path | None = None) -> Path:
    """Resolve `path` (relative to `base`), refusing anything that escapes the allowed roots
    (and any path no file system can hold, such as one with a NUL byte) with `ImageLoadError`."""
    if "\x00" in str(path) or (base is not None and "\x00" in str(base)):
        raise ImageLoadError(f"{str(path)[:80]!r} is not a valid path (it contains a NUL byte)")
    try:
        os.fsencode(str(path))
    except UnicodeEncodeError:
        raise ImageLoadError(f"{str(path)[:80]!r} is not a valid path (it holds a character no file name can)") from None
    p = Path(path)
    if not p.is_absolute() and base is not None:
        p = Path(base) / p
    p = p.resolve()
    if allowed_roots is not None:
        roots = [Path(r).resolve() for r in allowed_roots]
        if not any(p.is_relative_to(root) for root in roots):
            raise ImageLoadError(f"{path} is outside the allowed roots ({', '.join(map(str, roots))})")
    return p


def open_image(source: str | Path | bytes, max_pixels: int = DEFAULT_MAX_INPUT_PIXELS) -> Image.Image:
    """Open and fully decode an image, keeping its mode (an RGBA input stays RGBA)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            fp = io.BytesIO(source) if isinstance(source, (bytes, bytearray)) else source
            img = Image.open(fp)
            w, h = img.size
            if w * h > max_pixels:
                raise ImageLoadError(f"image is {w}x{h} = {w * h:,} pixels, over the {max_pixels:,}-pixel limit")
            img.load()
    except ImageLoadError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise ImageLoadError(f"refused a decompression bomb: {e}") from None
    except FileNotFoundError:
        raise ImageLoadError(f"no such image: {source}") from None
    except (OSError, ValueError, SyntaxError) as e:
        raise ImageLoadError(f"cannot read image {str(source)[:80]}: {e}") from None
    return img


def load_image(
    path: str | Path,
    allowed_roots: Iterable[str | Path] | None = None,
    base: str | Path | None = None,
    max_pixels: int = DEFAULT_MAX_INPUT_PIXELS,
) -> Image.Image:
    return open_image(resolve_path(path, allowed_roots, base), max_pixels)


def to_png_bytes(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def rgb_float(img: Image.Image, size: int = 0):
    """The image as an RGB float32 array on [0, 1] (RGBA composited on white), resized to
    size x size (0: native size)."""
    import numpy as np

    if img.mode == "RGBA":
        bg = Image.new("RGB", img.size, (255, 255, 255))
        bg.paste(img, mask=img.getchannel("A"))
        img = bg
    img = img.convert("RGB")
    if size:
        img = img.resize((size, size), Image.Resampling.BILINEAR)
    return np.asarray(img, dtype=np.float32) / 255.0


def images_match(a: Image.Image, b: Image.Image, tolerance: float = 0.5 / 255) -> bool:
    """Same size and a mean absolute RGB difference of at most `tolerance` on [0, 1]: what a
    deterministic tool chain reproduces."""
    if a.size != b.size:
        return False
    return float(abs(rgb_float(a) - rgb_float(b)).mean()) <= tolerance


def images_equal(a: Image.Image, b: Image.Image) -> bool:
    """Exactly the same image: size, mode and every pixel."""
    import numpy as np

    return a.size == b.size and a.mode == b.mode and np.array_equal(np.asarray(a), np.asarray(b))
