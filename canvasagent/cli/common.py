"""Helpers shared by CLI subcommands."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from PIL import Image

from canvasagent.core.imageio import load_image

_IMG_ARG = re.compile(r"^img_(\d+)=(.+)$")


def add_tools_config_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tools-config", default="offline", help="tools config name in configs/tools/ or a YAML path")


def parse_image_args(specs: list[str] | None, max_pixels: int = 40_000_000) -> dict[int, Image.Image]:
    """`img_1=PATH img_2=PATH` -> {1: image, 2: image}; paths are the user's own, so any root is allowed."""
    out: dict[int, Image.Image] = {}
    for spec in specs or []:
        m = _IMG_ARG.match(spec)
        if not m:
            raise SystemExit(f"--image expects img_N=PATH, got {spec!r}")
        k = int(m.group(1))
        if k in out:
            raise SystemExit(f"img_{k} given twice")
        out[k] = load_image(Path(m.group(2)).expanduser(), max_pixels=max_pixels)
    if out and sorted(out) != list(range(1, len(out) + 1)):
        raise SystemExit(f"input images must be img_1..img_{len(out)} without gaps; got {sorted(out)}")
    return out
