"""EASEL tasks: reconstruction references (4 categories) and semantic tasks.

Reconstruction (paper Table 1):

=================  ==========  ======
category           resolution  budget
=================  ==========  ======
programmatic       64 x 64     32
spatial            128 x 128   96
abstract           128 x 128   96
natural            128 x 128   128
=================  ==========  ======

Programmatic, spatial and abstract references are drawn procedurally from a
seed with OpenCV (anti-aliased). Natural references are square crops (side
uniform in [0.3, 0.6] x the image's short side, at least 128 px; near-flat
crops are redrawn) of the photographs shipped with scikit-image and
scikit-learn, or of images in a user folder, resized to 128 x 128 with area
averaging.

Semantic tasks (fixed brush appearance, 6 path parameters, ``undo`` and
``submit`` allowed): circle outline and object ("left apple") outline scored
by Dice of the enclosed region against the mask; handwriting a word scored by
letter-level positional match of an OCR reading; a simple and a hard maze where
wall-hitting strokes are rejected (but cost a step), scored by progress along
the reference route.
"""
from __future__ import annotations

import logging
import math
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import cv2
import numpy as np
from PIL import Image
from scipy import ndimage

from toolserver.backends.ocr import rapidocr

from . import metrics, render

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Category:
    name: str
    resolution: int
    budget: int
    label: str


CATEGORIES: dict[str, Category] = {
    "programmatic": Category("programmatic", 64, 32, "Prog."),
    "spatial": Category("spatial", 128, 96, "Spatial"),
    "abstract": Category("abstract", 128, 96, "Abs."),
    "natural": Category("natural", 128, 128, "Nat."),
}


@dataclass
class ReconstructionTask:
    task_id: str
    category: str
    reference: np.ndarray  # (H, W, 3) float32 in [0, 1]
    budget: int
    instruction: str = "Reproduce the reference image on the canvas with brush strokes."

    @property
    def resolution(self) -> int:
        return self.reference.shape[0]

    def initial_canvas(self) -> np.ndarray:
        return render.blank_canvas(self.resolution)

    def score(self, canvas: np.ndarray) -> float:
        return metrics.similarity(self.reference, canvas).s


def _rand_color(rng: np.random.Generator) -> tuple[int, int, int]:
    return tuple(int(v) for v in rng.integers(0, 256, 3))


def _draw_shape(img: np.ndarray, rng: np.random.Generator, kind: str, s: int, scale: float) -> None:
    col = _rand_color(rng)
    cx, cy = (int(v) for v in rng.integers(int(0.15 * s), int(0.85 * s), 2))
    size = int(max(3, rng.uniform(0.08, 0.3) * s * scale))
    aa = cv2.LINE_AA
    if kind == "circle":
        cv2.circle(img, (cx, cy), size, col, -1, aa)
    elif kind == "rect":
        w2, h2 = size, int(size * rng.uniform(0.5, 1.5))
        cv2.rectangle(img, (cx - w2, cy - h2), (cx + w2, cy + h2), col, -1, aa)
    elif kind == "triangle":
        ang = rng.uniform(0, 2 * math.pi)
        pts = np.array([[cx + size * math.cos(ang + k * 2.094), cy + size * math.sin(ang + k * 2.094)]
                        for k in range(3)], np.int32)
        cv2.fillPoly(img, [pts], col, aa)
    elif kind == "ellipse":
        cv2.ellipse(img, (cx, cy), (size, max(2, size // 2)), float(rng.uniform(0, 180)), 0, 360, col, -1, aa)
    else:  # line
        x2, y2 = (int(v) for v in rng.integers(0, s, 2))
        cv2.line(img, (cx, cy), (x2, y2), col, max(1, int(0.03 * s)), aa)


def _flat_shapes(rng: np.random.Generator, res: int, p_white: float, n_lo: int, n_hi: int, scale: float) -> np.ndarray:
    """n_lo..n_hi-1 shapes on a flat background, white with probability `p_white`."""
    img = np.zeros((res, res, 3), np.uint8)
    img[:] = (255, 255, 255) if rng.random() < p_white else _rand_color(rng)
    for _ in range(int(rng.integers(n_lo, n_hi))):
        _draw_shape(img, rng, str(rng.choice(["circle", "rect", "triangle", "ellipse", "line"])), res, scale)
    return img.astype(np.float32) / 255.0


def make_programmatic(seed: int, res: int = 64) -> np.ndarray:
    """1-3 flat shapes on a flat background (clean geometric baseline)."""
    return _flat_shapes(np.random.default_rng([seed, 1]), res, 0.5, 1, 4, 1.3)


def make_spatial(seed: int, res: int = 128) -> np.ndarray:
    """Multi-object layout: 4-8 overlapping shapes on a flat background."""
    return _flat_shapes(np.random.default_rng([seed, 2]), res, 0.4, 4, 9, 0.8)


def make_abstract(seed: int, res: int = 128) -> np.ndarray:
    """Cartoon-like: gradient background, smooth colour blobs with dark outlines."""
    rng = np.random.default_rng([seed, 3])
    c0, c1 = np.array(_rand_color(rng), float), np.array(_rand_color(rng), float)
    ramp = np.linspace(0, 1, res)[:, None, None]
    img = (c0 * (1 - ramp) + c1 * ramp) * np.ones((res, res, 3))
    img = np.ascontiguousarray(img.astype(np.uint8))
    for _ in range(int(rng.integers(2, 5))):
        noise = ndimage.gaussian_filter(rng.standard_normal((res, res)), res / 10)
        yy, xx = np.mgrid[:res, :res]
        cx, cy = rng.uniform(0.25, 0.75, 2) * res
        bump = np.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / (2 * (rng.uniform(0.12, 0.25) * res) ** 2))
        field_ = bump + 3 * noise
        mask = (field_ > 0.5).astype(np.uint8)
        if mask.sum() < 20:
            continue
        img[mask > 0] = _rand_color(rng)
        contours, _ = cv2.findContours(mask, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_NONE)
        cv2.drawContours(img, contours, -1, (20, 20, 30), 2, cv2.LINE_AA)
    return img.astype(np.float32) / 255.0


def _builtin_photos() -> list[np.ndarray]:
    from skimage import data
    imgs: list[np.ndarray] = []
    for name in ("astronaut", "chelsea", "coffee", "rocket", "immunohistochemistry", "retina", "cat"):
        try:
            imgs.append(getattr(data, name)())
        except Exception as e:  # some skimage data need downloads; skip quietly
            log.debug("skimage.data.%s unavailable: %s", name, e)
    try:
        from sklearn.datasets import load_sample_images
        imgs.extend(load_sample_images().images)
    except Exception as e:
        log.debug("sklearn sample images unavailable: %s", e)
    return [i[..., :3] for i in imgs if i.ndim == 3 and min(i.shape[:2]) >= 128]


_PHOTO_CACHE: dict[str, list[np.ndarray]] = {}


def load_photos(folder: str | Path | None = None) -> list[np.ndarray]:
    key = str(folder) if folder else "<builtin>"
    if key not in _PHOTO_CACHE:
        if folder:
            paths = sorted(p for p in Path(folder).iterdir() if p.suffix.lower() in (".png", ".jpg", ".jpeg", ".bmp", ".webp"))
            read = [cv2.imread(str(p), cv2.IMREAD_COLOR) for p in paths]
            imgs = [cv2.cvtColor(im, cv2.COLOR_BGR2RGB) for im in read
                    if im is not None and min(im.shape[:2]) >= 64]
            if not imgs:
                raise ValueError(f"no usable images in {folder}")
            _PHOTO_CACHE[key] = imgs
        else:
            _PHOTO_CACHE[key] = _builtin_photos()
    return _PHOTO_CACHE[key]


def make_natural(seed: int, res: int = 128, folder: str | Path | None = None) -> np.ndarray:
    """Square crop of a photo (see the module doc), area-resized to ``res``. Crops with edge
    density below 2% (the metric's edge detector) are redrawn: no flat sky or black borders."""
    photos = load_photos(folder)
    rng = np.random.default_rng([seed, 4])
    out = None
    for _ in range(20):
        img = photos[int(rng.integers(len(photos)))]
        h, w = img.shape[:2]
        m = min(h, w)
        lo, hi = min(m, max(128, int(0.3 * m))), min(m, max(128, int(0.6 * m)))
        side = int(rng.integers(lo, hi + 1))
        y, x = int(rng.integers(0, h - side + 1)), int(rng.integers(0, w - side + 1))
        crop = img[y:y + side, x:x + side].astype(np.float32) / 255.0
        out = cv2.resize(crop, (res, res), interpolation=cv2.INTER_AREA)
        if metrics.edge_map(out).mean() >= 0.02:
            break
    return out


_MAKERS: dict[str, Callable[..., np.ndarray]] = {
    "programmatic": make_programmatic,
    "spatial": make_spatial,
    "abstract": make_abstract,
    "natural": make_natural,
}


def make_reconstruction(category: str, seed: int, natural_dir: str | Path | None = None,
                        resolution: int | None = None, budget: int | None = None) -> ReconstructionTask:
    """The bench's task of `category` and `seed` (Table 1 size and budget). Another `resolution`
    draws the same generator at that size (task id suffixed ``-{res}px``); `budget` overrides."""
    cat = CATEGORIES[category]
    res = resolution or cat.resolution
    kw = {"folder": natural_dir} if category == "natural" else {}
    ref = _MAKERS[category](seed, res, **kw)
    tid = f"{category}-{seed:04d}" + ("" if res == cat.resolution else f"-{res}px")
    return ReconstructionTask(tid, category, np.clip(ref, 0, 1).astype(np.float32), budget or cat.budget)


def task_from_spec(spec: dict, ocr: "OCRFn | None" = None):
    """The one spec -> task factory: ``{"kind": "reconstruction", "category", "seed"[, "resolution",
    "budget", "natural_dir"]}`` or ``{"kind": "semantic", "name", "seed"}``. At the category's own
    size a reconstruction task is the bench's, bit for bit; a spec's budget applies to a resized one
    (the runners read a spec's budget themselves)."""
    seed = int(spec.get("seed", 0))
    if spec.get("kind", "reconstruction") == "semantic":
        return semantic_task(spec["name"], seed, ocr)
    cat, res = spec["category"], spec.get("resolution")
    resized = res is not None and int(res) != CATEGORIES[cat].resolution
    return make_reconstruction(cat, seed, spec.get("natural_dir"), int(res) if resized else None,
                               int(spec["budget"]) if resized and spec.get("budget") else None)


def reconstruction_suite(n_per_category: int, seed: int = 0, categories: Sequence[str] | None = None,
                         natural_dir: str | Path | None = None) -> list[ReconstructionTask]:
    cats = list(categories or CATEGORIES)
    return [make_reconstruction(c, seed * 1000 + i, natural_dir) for c in cats for i in range(n_per_category)]


def reference_task(ref: np.ndarray, budget: int | None = None, task_id: str = "custom") -> ReconstructionTask:
    """Wrap a user image as a reconstruction task (budget defaults by size)."""
    ref = metrics._as_float(ref).astype(np.float32)
    if budget is None:
        budget = 32 if ref.shape[0] <= 64 else 128
    return ReconstructionTask(task_id, "custom", ref, int(budget))


def ink_mask(canvas: np.ndarray, initial: np.ndarray, thresh: float = 0.15) -> np.ndarray:
    """Pixels changed by painting (max channel difference above ``thresh``)."""
    return np.abs(np.asarray(canvas, np.float32) - np.asarray(initial, np.float32)).max(-1) > thresh


def dice(a: np.ndarray, b: np.ndarray) -> float:
    s = a.sum() + b.sum()
    return 1.0 if s == 0 else float(2 * np.logical_and(a, b).sum() / s)


@dataclass
class OutlineTask:
    """Draw the outline of a target region; score = Dice(filled drawing, mask)."""

    name: str
    instruction: str
    image: np.ndarray
    mask: np.ndarray
    budget: int = 64

    @property
    def resolution(self) -> int:
        return self.image.shape[0]

    def initial_canvas(self) -> np.ndarray:
        return self.image.copy()

    def region(self, canvas: np.ndarray) -> np.ndarray:
        """Ink plus everything it encloses."""
        return ndimage.binary_fill_holes(ink_mask(canvas, self.image))

    def score(self, canvas: np.ndarray) -> float:
        return dice(self.region(canvas), self.mask)


def circle_outline_task(seed: int = 0, res: int = 256) -> OutlineTask:
    rng = np.random.default_rng([seed, 10])
    img = np.full((res, res, 3), 255, np.uint8)
    cx, cy = (int(v) for v in rng.integers(int(0.35 * res), int(0.65 * res), 2))
    r = int(rng.uniform(0.15, 0.28) * res)
    mask = np.zeros((res, res), np.uint8)
    cv2.circle(mask, (cx, cy), r, 1, -1)
    cv2.circle(img, (cx, cy), r, (235, 180, 90), -1, cv2.LINE_AA)
    return OutlineTask("circle_outline", "Trace the outline of the orange circle.",
                       img.astype(np.float32) / 255.0, mask.astype(bool), budget=64)


def _apple(img: np.ndarray, mask: np.ndarray | None, cx: int, cy: int, r: int, color) -> None:
    # two overlapping discs give the apple's top notch, a third its body; stem and leaf on top
    discs = [((int(cx + dx * r), cy), int(0.8 * r)) for dx in (-0.35, 0.35)]
    for c, rad in discs + [((cx, int(cy + 0.15 * r)), int(0.85 * r))]:
        cv2.circle(img, c, rad, color, -1, cv2.LINE_AA)
        if mask is not None:
            cv2.circle(mask, c, rad, 1, -1)
    cv2.line(img, (cx, cy - int(0.6 * r)), (cx + int(0.1 * r), cy - int(1.05 * r)), (90, 60, 30), max(2, r // 10), cv2.LINE_AA)
    cv2.ellipse(img, (cx + int(0.3 * r), cy - int(0.95 * r)), (int(0.25 * r), int(0.1 * r)), -20, 0, 360,
                (60, 150, 60), -1, cv2.LINE_AA)


def apple_outline_task(seed: int = 0, res: int = 256) -> OutlineTask:
    """Two procedural apples; outline the left one (paper: 'left apple')."""
    rng = np.random.default_rng([seed, 11])
    img = np.full((res, res, 3), 250, np.uint8)
    mask = np.zeros((res, res), np.uint8)
    r = int(rng.uniform(0.14, 0.18) * res)
    cy = int(rng.uniform(0.45, 0.6) * res)
    _apple(img, mask, int(0.3 * res), cy, r, (200, 30, 40))
    _apple(img, None, int(0.72 * res), cy + int(rng.integers(-10, 10)), r, (190, 40, 30))
    return OutlineTask("apple_outline", "Outline the left apple.", img.astype(np.float32) / 255.0,
                       mask.astype(bool), budget=64)


OCRFn = Callable[[np.ndarray], str]


def rapidocr_reader() -> OCRFn:
    """Default OCR callable: the toolbox's OCR backend (rapidocr, shipped models, loaded lazily
    once) on the canvas as 8-bit RGB; the recognised lines joined by spaces."""
    backend = rapidocr()

    def read(img: np.ndarray) -> str:
        return " ".join(backend.recognise(Image.fromarray(render.to_uint8(img))).lines)
    return read


def letter_match(recognised: str, word: str) -> float:
    """Positional letter match rate (case-insensitive, spaces ignored)."""
    rec = "".join(recognised.lower().split())
    w = word.lower()
    if not w:
        return 0.0
    return sum(1 for i, ch in enumerate(w) if i < len(rec) and rec[i] == ch) / len(w)


@dataclass
class HandwritingTask:
    word: str = "hello"
    resolution: int = 256
    budget: int = 64
    ocr: OCRFn | None = None
    name: str = "handwriting"

    @property
    def instruction(self) -> str:
        return f'Write the word "{self.word}" on the canvas.'

    def initial_canvas(self) -> np.ndarray:
        return render.blank_canvas(self.resolution)

    def score(self, canvas: np.ndarray) -> float:
        if self.ocr is None:
            self.ocr = rapidocr_reader()
        return letter_match(self.ocr(canvas), self.word)


@dataclass
class Maze:
    cells: int
    walls_h: np.ndarray  # (cells+1, cells) horizontal wall segments present
    walls_v: np.ndarray  # (cells, cells+1) vertical wall segments present
    route: list[tuple[int, int]]  # (row, col) cells from start to goal


def generate_maze(cells: int, seed: int) -> Maze:
    """Perfect maze by randomised DFS; start top-left, goal bottom-right."""
    rng = np.random.default_rng([seed, 12])
    wh = np.ones((cells + 1, cells), bool)
    wv = np.ones((cells, cells + 1), bool)
    seen = np.zeros((cells, cells), bool)
    stack = [(0, 0)]
    seen[0, 0] = True
    while stack:
        r, c = stack[-1]
        nbrs = [(r + dr, c + dc) for dr, dc in ((1, 0), (-1, 0), (0, 1), (0, -1))
                if 0 <= r + dr < cells and 0 <= c + dc < cells and not seen[r + dr, c + dc]]
        if not nbrs:
            stack.pop()
            continue
        nr, nc = nbrs[int(rng.integers(len(nbrs)))]
        if nr != r:
            wh[max(r, nr), c] = False
        else:
            wv[r, max(c, nc)] = False
        seen[nr, nc] = True
        stack.append((nr, nc))
    goal = (cells - 1, cells - 1)
    prev: dict[tuple[int, int], tuple[int, int] | None] = {(0, 0): None}
    q = deque([(0, 0)])
    while q:
        r, c = q.popleft()
        if (r, c) == goal:
            break
        moves = (((r + 1, c), wh[r + 1, c]), ((r - 1, c), wh[r, c]),  # (neighbour, wall between)
                 ((r, c + 1), wv[r, c + 1]), ((r, c - 1), wv[r, c]))
        for m, walled in moves:
            if not walled and m not in prev:
                prev[m] = (r, c)
                q.append(m)
    route = [goal]
    while prev[route[-1]] is not None:
        route.append(prev[route[-1]])  # type: ignore[arg-type]
    return Maze(cells, wh, wv, route[::-1])


@dataclass
class MazeTask:
    """Draw the path from the green start to the red goal without touching walls."""

    maze: Maze
    resolution: int = 256
    budget: int = 64
    name: str = "maze"
    wall_px: int = 2
    appearance: render.FixedAppearance = field(default_factory=render.FixedAppearance)
    instruction: str = "Draw a path through the maze from the green start cell to the red goal cell without crossing walls."

    def __post_init__(self) -> None:
        self.image, self.wall_mask = self._draw()

    @property
    def cell_px(self) -> float:
        return (self.resolution - 2 * self.margin) / self.maze.cells

    @property
    def margin(self) -> int:
        return max(4, self.resolution // 32)

    def cell_center(self, rc: tuple[int, int]) -> tuple[float, float]:
        r, c = rc
        return (self.margin + (c + 0.5) * self.cell_px, self.margin + (r + 0.5) * self.cell_px)

    def _draw(self) -> tuple[np.ndarray, np.ndarray]:
        res, m, cp = self.resolution, self.margin, self.cell_px
        img = np.full((res, res, 3), 255, np.uint8)
        wall = np.zeros((res, res), np.uint8)
        n = self.maze.cells
        for (r, c), col in (((0, 0), (120, 220, 120)), ((n - 1, n - 1), (230, 110, 110))):
            x0, y0 = int(m + c * cp + 2), int(m + r * cp + 2)
            cv2.rectangle(img, (x0, y0), (int(m + (c + 1) * cp - 2), int(m + (r + 1) * cp - 2)), col, -1)
        # wall segments as (row, col) grid corners: horizontal ones first, then vertical ones
        segments = [((r, c), (r, c + 1)) for r, c in zip(*np.nonzero(self.maze.walls_h))]
        segments += [((r, c), (r + 1, c)) for r, c in zip(*np.nonzero(self.maze.walls_v))]
        for (r0, c0), (r1, c1) in segments:
            p0, p1 = (int(m + c0 * cp), int(m + r0 * cp)), (int(m + c1 * cp), int(m + r1 * cp))
            cv2.line(img, p0, p1, (0, 0, 0), self.wall_px)
            cv2.line(wall, p0, p1, 1, self.wall_px)
        return img.astype(np.float32) / 255.0, wall.astype(bool)

    def initial_canvas(self) -> np.ndarray:
        return self.image.copy()

    def check_stroke(self, params13: np.ndarray, canvas: np.ndarray) -> str | None:
        """Reject a stroke whose painted footprint overlaps a wall pixel."""
        a = render.alpha_np(params13, self.resolution)
        hits = int(np.logical_and(a > 0.5, self.wall_mask).sum())
        return f"stroke hits a wall ({hits} px); rejected" if hits else None

    def score(self, canvas: np.ndarray) -> float:
        """Progress: longest prefix of the route whose consecutive cell centres are
        joined by ink (sampled along the centre-to-centre segment), normalised by
        the route length."""
        ink = ink_mask(canvas, self.image)
        route = self.maze.route
        if len(route) < 2:
            return 1.0
        done = 0
        for a, b in zip(route[:-1], route[1:]):
            (x0, y0), (x1, y1) = self.cell_center(a), self.cell_center(b)
            ts = np.linspace(0, 1, 9)
            xs = np.clip((x0 + (x1 - x0) * ts).astype(int), 0, self.resolution - 1)
            ys = np.clip((y0 + (y1 - y0) * ts).astype(int), 0, self.resolution - 1)
            # a 5x5 neighbourhood tolerance so thin strokes near the centre line count
            near = ndimage.binary_dilation(ink, np.ones((5, 5), bool))[ys, xs]
            if near.mean() < 0.8:
                break
            done += 1
        return done / (len(route) - 1)

    def route_strokes(self) -> np.ndarray:
        """Oracle solution: one fixed-appearance stroke per route edge (for tests)."""
        out = []
        for a, b in zip(self.maze.route[:-1], self.maze.route[1:]):
            (x0, y0), (x1, y1) = self.cell_center(a), self.cell_center(b)
            r = self.resolution
            out.append([x0 / r, y0 / r, (x0 + x1) / 2 / r, (y0 + y1) / 2 / r, x1 / r, y1 / r])
        return render.expand_fixed(np.array(out))


def simple_maze_task(seed: int = 0) -> MazeTask:
    return MazeTask(generate_maze(4, seed), resolution=256, budget=64, name="simple_maze")


def hard_maze_task(seed: int = 0) -> MazeTask:
    return MazeTask(generate_maze(8, seed), resolution=512, budget=128, name="hard_maze")


def semantic_task(name: str, seed: int = 0, ocr: "OCRFn | None" = None):
    """A semantic task by name (``canvasagent.easel.semantic.TASK_NAMES``)."""
    if name == "handwriting":
        return HandwritingTask(ocr=ocr)
    makers = {"circle_outline": circle_outline_task, "apple_outline": apple_outline_task,
              "simple_maze": simple_maze_task, "hard_maze": hard_maze_task}
    return makers[name](seed)
