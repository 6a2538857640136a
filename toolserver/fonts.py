"""Locate DejaVuSans, the text-overlay font of the public tools: a system copy, else the one
matplotlib ships in its wheel, so the font exists wherever the project installs."""

from __future__ import annotations

import functools
from pathlib import Path

_SYSTEM_CANDIDATES = (
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
)


@functools.lru_cache(maxsize=None)
def dejavu_sans_path() -> str:
    for cand in _SYSTEM_CANDIDATES:
        if Path(cand).is_file():
            return cand
    import matplotlib

    bundled = Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSans.ttf"
    if bundled.is_file():
        return str(bundled)
    raise FileNotFoundError("DejaVuSans.ttf not found (install fonts-dejavu-core or matplotlib)")


@functools.lru_cache(maxsize=64)
def dejavu_sans(size: int):
    from PIL import ImageFont

    return ImageFont.truetype(dejavu_sans_path(), size)
