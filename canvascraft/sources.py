"""Pluggable image sources: a user's folder, a Hugging Face dataset, or the offline built-in.

A source hands the builder a `SourceImage`: the picture plus what is known about it (object
labels to ground, text to read, how the text was turned or mirrored). Chains declare the tags
they cannot do without (`needs`) and the ones they would like (`wants`, e.g. "rotated" for a
Rotate chain, so the rotation has something to correct); the "rgba" need asks for a ready
cut-out (a shape on a transparent background) that an object overlay can paste without an
Extract step. The built-in source needs no download: procedural scenes drawn with Pillow, plus
the sample photographs that ship inside scikit-image and scikit-learn.
"""

from __future__ import annotations

import functools
import logging
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from PIL import Image, ImageDraw, ImageFont

from canvasagent.core.imageio import open_image

log = logging.getLogger(__name__)

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif", ".tif", ".tiff"}


@dataclass
class SourceImage:
    image: Image.Image
    tags: frozenset[str] = frozenset({"image"})
    # JSON-safe facts: objects [{label, box}], text, font, rotation (degrees CCW applied to the scene),
    # mirrored, caption, origin.
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def labels(self) -> list[str]:
        return [o["label"] for o in self.meta.get("objects", [])]


class ImageSource(Protocol):
    name: str

    def sample(self, rng: random.Random, needs: frozenset[str], wants: frozenset[str]) -> SourceImage | None:
        """An image with every tag in `needs` (None if this source has none), preferring `wants`."""
        ...


def _fit(img: Image.Image, max_side: int) -> Image.Image:
    img = img.convert("RGB")
    scale = max_side / max(img.size)
    if scale < 1:
        img = img.resize((max(1, round(img.width * scale)), max(1, round(img.height * scale))), Image.Resampling.LANCZOS)
    return img


COLORS: dict[str, tuple[int, int, int]] = {
    "red": (214, 40, 40),
    "blue": (40, 90, 214),
    "green": (40, 160, 70),
    "yellow": (240, 200, 30),
    "purple": (140, 60, 180),
    "orange": (245, 130, 30),
    "black": (25, 25, 25),
}
SHAPES = ("circle", "square", "triangle", "star", "diamond")
SIGN_WORDS = (
    "OPEN", "SALE", "EXIT", "CAFE", "WELCOME", "BAKERY", "HOTEL", "BOOKS", "MARKET", "PIZZA",
    "GARDEN", "MUSEUM", "TICKETS", "FRESH FRUIT", "NO PARKING", "PHARMACY", "LIBRARY", "STATION",
)
# Fonts that ship inside matplotlib's wheel, so every machine that installs the project has them.
FONT_FILES = ("DejaVuSans-Bold.ttf", "DejaVuSerif-Bold.ttf", "DejaVuSansMono-Bold.ttf", "DejaVuSans.ttf", "STIXGeneralBol.ttf")
# Scene rotations (degrees counter-clockwise) whose correction is one Rotate call (45/90/180).
ROTATIONS = (315, 270, 180)


@functools.lru_cache(maxsize=64)
def _font(file: str, size: int) -> ImageFont.FreeTypeFont:
    import matplotlib

    return ImageFont.truetype(str(Path(matplotlib.get_data_path()) / "fonts" / "ttf" / file), size)


def _background(rng: random.Random, size: int) -> Image.Image:
    a = [rng.randint(150, 250) for _ in range(3)]
    b = [rng.randint(90, 230) for _ in range(3)]
    img = Image.new("RGB", (size, size), tuple(a))
    draw = ImageDraw.Draw(img)
    # A vertical gradient with some stripes: texture for Edit/SR, cheap to draw.
    for y in range(size):
        t = y / max(1, size - 1)
        draw.line([(0, y), (size, y)], fill=tuple(int(a[i] * (1 - t) + b[i] * t) for i in range(3)))
    for _ in range(rng.randint(0, 4)):
        x = rng.randrange(size)
        draw.line([(x, 0), (x + rng.randint(-40, 40), size)], fill=tuple(min(255, c + 15) for c in b), width=rng.randint(1, 4))
    return img


def _draw_shape(draw: ImageDraw.ImageDraw, shape: str, box: tuple[int, int, int, int], color: tuple[int, int, int]) -> None:
    x0, y0, x1, y1 = box
    cx, cy, r = (x0 + x1) / 2, (y0 + y1) / 2, (x1 - x0) / 2
    if shape == "circle":
        draw.ellipse(box, fill=color, outline=(0, 0, 0))
    elif shape == "square":
        draw.rectangle(box, fill=color, outline=(0, 0, 0))
    elif shape == "triangle":
        draw.polygon([(cx, y0), (x1, y1), (x0, y1)], fill=color, outline=(0, 0, 0))
    elif shape == "diamond":
        draw.polygon([(cx, y0), (x1, cy), (cx, y1), (x0, cy)], fill=color, outline=(0, 0, 0))
    else:  # star
        pts = []
        for k in range(10):
            rr = r if k % 2 == 0 else r * 0.45
            a = -math.pi / 2 + k * math.pi / 5
            pts.append((cx + rr * math.cos(a), cy + rr * math.sin(a)))
        draw.polygon(pts, fill=color, outline=(0, 0, 0))


def _norm_box(box: tuple[float, float, float, float], size: int) -> list[int]:
    return [max(0, min(1000, round(v * 1000 / size))) for v in box]


@dataclass
class ProceduralSource:
    """Shapes and objects on backgrounds, and signs with rendered text (optionally turned/mirrored)."""

    size: int = 256
    name: str = "procedural"
    # CCW scene rotations to draw; the builder keeps those one Rotate call can undo under the profile.
    rotations: tuple[int, ...] = ROTATIONS

    def sample(self, rng: random.Random, needs: frozenset[str], wants: frozenset[str]) -> SourceImage:
        size = self.size
        if "rgba" in needs:
            return cutout(rng, size)
        img = _background(rng, size)
        draw = ImageDraw.Draw(img)
        objects: list[dict[str, Any]] = []
        meta: dict[str, Any] = {"origin": "procedural"}
        with_text = "text" in needs or "text" in wants or rng.random() < 0.35
        n_shapes = rng.randint(1, 2) if with_text else rng.randint(1, 3)
        occupied: list[tuple[int, int, int, int]] = []
        if with_text:
            word = rng.choice(SIGN_WORDS)
            font_file = rng.choice(FONT_FILES)
            font = _font(font_file, max(14, size // (7 if len(word) <= 7 else 10)))
            tb = draw.textbbox((0, 0), word, font=font)
            tw, th = tb[2] - tb[0], tb[3] - tb[1]
            pad = size // 24
            sw, sh = min(size - 8, tw + 2 * pad), th + 2 * pad
            x0 = (size - sw) // 2 + rng.randint(-size // 16, size // 16)
            y0 = rng.choice((size // 10, size // 2 - sh // 2, size - sh - size // 10))
            x0 = max(2, min(size - sw - 2, x0))
            sign_box = (x0, y0, x0 + sw, y0 + sh)
            plate = rng.choice(((255, 255, 255), (250, 235, 180), (220, 235, 250)))
            draw.rectangle(sign_box, fill=plate, outline=(30, 30, 30), width=max(2, size // 128))
            draw.text((x0 + (sw - tw) // 2 - tb[0], y0 + (sh - th) // 2 - tb[1]), word, font=font, fill=(10, 10, 10))
            objects.append({"label": "sign", "box": _norm_box(sign_box, size)})
            occupied.append(sign_box)
            meta.update(text=word, font=font_file)
        for _ in range(n_shapes):
            for _try in range(20):  # rejection-sample a free spot so boxes stay unambiguous
                s = rng.randint(size // 6, size // 3)
                x0, y0 = rng.randint(4, size - s - 4), rng.randint(4, size - s - 4)
                box = (x0, y0, x0 + s, y0 + s)
                if all(box[2] < o[0] or box[0] > o[2] or box[3] < o[1] or box[1] > o[3] for o in occupied):
                    break
            else:
                continue
            color = rng.choice(list(COLORS))
            shape = rng.choice(SHAPES)
            _draw_shape(draw, shape, box, COLORS[color])
            occupied.append(box)
            objects.append({"label": f"{color} {shape}", "box": _norm_box(box, size)})
        tags = {"image", "objects", "procedural"} | ({"text"} if with_text else set())
        if with_text and "mirrored" in wants:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
            meta["mirrored"] = True
            tags.add("mirrored")
        if with_text and "rotated" in wants:
            angle = rng.choice(self.rotations)
            # The scene is square, so 90/180 keep everything; 45 clips corners, which is fine.
            img = img.rotate(angle, fillcolor=(255, 255, 255), resample=Image.Resampling.BICUBIC)
            meta["rotation"] = angle
            tags.add("rotated")
        if "mirrored" in meta or "rotation" in meta:
            # Labels still hold; boxes no longer match (a grounding model finds them from pixels).
            objects = [{"label": o["label"], "box": None} for o in objects]
        meta["objects"] = objects
        meta["caption"] = _caption(meta)
        return SourceImage(img, frozenset(tags), meta)


def cutout(rng: random.Random, size: int = 256) -> SourceImage:
    """A ready cut-out: one coloured shape on a fully transparent RGBA canvas (tag "rgba"), what
    Extract would have produced, so an object overlay can run without Grounding/SAM backends."""
    side = max(16, size // 3)
    img = Image.new("RGBA", (side, side), (0, 0, 0, 0))
    color, shape = rng.choice(list(COLORS)), rng.choice(SHAPES)
    _draw_shape(ImageDraw.Draw(img), shape, (1, 1, side - 2, side - 2), COLORS[color])
    label = f"{color} {shape}"
    meta = {"origin": "procedural-cutout", "cutout": True, "objects": [{"label": label, "box": [0, 0, 1000, 1000]}],
            "caption": f"a cut-out {label} on a transparent background"}
    return SourceImage(img, frozenset({"image", "objects", "rgba", "procedural"}), meta)


def _caption(meta: dict[str, Any]) -> str:
    labels = [o["label"] for o in meta.get("objects", []) if o["label"] != "sign"]
    parts = []
    if meta.get("text"):
        parts.append(f"a sign that reads '{meta['text']}'")
    parts.extend(f"a {lbl}" for lbl in labels)
    return ("a simple scene with " + ", ".join(parts)) if parts else "a simple scene"


# (loader, name, object labels worth grounding). Only images that ship inside the wheels.
_SKIMAGE_PHOTOS = (
    ("astronaut", ["astronaut", "flag"]),
    ("coffee", ["coffee cup", "saucer"]),
    ("chelsea", ["cat"]),
    ("rocket", ["rocket"]),
    ("colorwheel", ["color wheel"]),
    ("immunohistochemistry", ["cells"]),
)
_SKLEARN_PHOTOS = (("china.jpg", ["temple", "tree"]), ("flower.jpg", ["flower"]))


@functools.lru_cache(maxsize=None)
def bundled_photos(max_side: int) -> tuple[tuple[str, Image.Image, tuple[str, ...]], ...]:
    out: list[tuple[str, Image.Image, tuple[str, ...]]] = []
    try:
        import skimage.data as skd

        for name, labels in _SKIMAGE_PHOTOS:
            out.append((f"skimage:{name}", _fit(Image.fromarray(getattr(skd, name)()), max_side), tuple(labels)))
    except Exception as e:  # an old scikit-image without one of them: use what there is
        log.warning("scikit-image sample photos unavailable: %s", e)
    try:
        from sklearn.datasets import load_sample_images

        bunch = load_sample_images()
        for (fname, labels), arr in zip(_SKLEARN_PHOTOS, bunch.images):
            out.append((f"sklearn:{fname}", _fit(Image.fromarray(arr), max_side), tuple(labels)))
    except Exception as e:
        log.warning("scikit-learn sample photos unavailable: %s", e)
    return tuple(out)


@dataclass
class PhotoSource:
    max_side: int = 320
    name: str = "photos"

    def sample(self, rng: random.Random, needs: frozenset[str], wants: frozenset[str]) -> SourceImage | None:
        if needs - {"image", "objects"}:
            return None
        photos = bundled_photos(self.max_side)
        if not photos:
            return None
        origin, img, labels = rng.choice(photos)
        meta = {"origin": origin, "objects": [{"label": lbl, "box": None} for lbl in labels], "caption": f"a photo of {labels[0]}"}
        return SourceImage(img.copy(), frozenset({"image", "objects", "photo"}), meta)


@dataclass
class BuiltinSource:
    """Procedural scenes mixed with the bundled photographs (no download, no network)."""

    size: int = 256
    photo_fraction: float = 0.3
    name: str = "builtin"
    rotations: tuple[int, ...] = ROTATIONS

    def sample(self, rng: random.Random, needs: frozenset[str], wants: frozenset[str]) -> SourceImage:
        # Photos cannot show rotated/mirrored text, so chains that want those get a scene.
        if not (wants & {"text", "rotated", "mirrored"}) and rng.random() < self.photo_fraction:
            got = PhotoSource(max_side=self.size + self.size // 4).sample(rng, needs, wants)
            if got is not None:
                return got
        return ProceduralSource(self.size, rotations=self.rotations).sample(rng, needs, wants)


@dataclass
class FolderSource:
    """Every image under a folder (sorted, so a seed picks the same files on every machine)."""

    root: str
    max_side: int = 512
    name: str = "folder"

    def __post_init__(self) -> None:
        root = Path(self.root)
        self.files = sorted(p for p in root.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
        if not self.files:
            raise FileNotFoundError(f"no images under {root}")

    def sample(self, rng: random.Random, needs: frozenset[str], wants: frozenset[str]) -> SourceImage | None:
        if needs - {"image"}:
            return None
        path = rng.choice(self.files)
        img = _fit(open_image(path), self.max_side)
        return SourceImage(img, frozenset({"image"}), {"origin": f"folder:{path.relative_to(self.root)}", "objects": []})


@dataclass
class HFSource:
    """A Hugging Face dataset: a hub name (`load_dataset`) or a folder saved with `save_to_disk`.

    `label_column` (an object name to ground) and `text_column` (text visible in the image) are
    optional; without them only chains that need a bare image can use this source.
    """

    path: str
    split: str = "train"
    image_column: str | None = None
    label_column: str | None = None
    text_column: str | None = None
    max_side: int = 512
    name: str = "hf"

    def __post_init__(self) -> None:
        import datasets

        p = Path(self.path)
        if p.is_dir() and ((p / "dataset_info.json").exists() or (p / "dataset_dict.json").exists() or (p / "state.json").exists()):
            ds = datasets.load_from_disk(str(p))
        else:
            ds = datasets.load_dataset(self.path, split=self.split)
        if isinstance(ds, datasets.DatasetDict):
            ds = ds[self.split]
        if self.image_column is None:
            cols = [k for k, f in ds.features.items() if isinstance(f, datasets.Image)]
            if not cols:
                raise ValueError(f"{self.path}: no Image column; set image_column")
            self.image_column = cols[0]
        self.ds = ds

    def sample(self, rng: random.Random, needs: frozenset[str], wants: frozenset[str]) -> SourceImage | None:
        have = {"image"} | ({"objects"} if self.label_column else set()) | ({"text"} if self.text_column else set())
        if needs - have:
            return None
        i = rng.randrange(len(self.ds))
        row = self.ds[i]
        img = _fit(row[self.image_column], self.max_side)
        meta: dict[str, Any] = {"origin": f"hf:{self.path}#{i}", "objects": []}
        if self.label_column:
            meta["objects"] = [{"label": str(row[self.label_column]), "box": None}]
        if self.text_column:
            meta["text"] = str(row[self.text_column])
        return SourceImage(img, frozenset(have), meta)


def make_source(spec: str | None, size: int = 256) -> ImageSource:
    """`builtin` (default), `procedural`, `photos`, a folder of images, a saved dataset folder,
    or `hf:NAME[:SPLIT][?image=col&label=col&text=col]`."""
    by_size = {"builtin": BuiltinSource, "procedural": ProceduralSource, "photos": PhotoSource}
    if not spec or spec in by_size:
        return by_size[spec or "builtin"](size)
    if spec.startswith("hf:"):
        body, _, query = spec[3:].partition("?")
        name, _, split = body.partition(":")
        opts = dict(kv.split("=", 1) for kv in query.split("&") if "=" in kv)
        return HFSource(name, split or "train", opts.get("image"), opts.get("label"), opts.get("text"), max(size, 512))
    p = Path(spec)
    if p.is_dir() and any((p / f).exists() for f in ("dataset_info.json", "dataset_dict.json", "state.json")):
        return HFSource(str(p))
    if p.is_dir():
        return FolderSource(str(p), max(size, 512))
    raise ValueError(f"unknown image source {spec!r}")
