"""Simple scripted plans for EASEL tasks, so benchmark numbers have a reference.

A plan is an ordered array of 13-parameter strokes (fixed appearance already
applied for semantic tasks); a runner feeds it to a :class:`CanvasSession`
(or, as tool calls, through the agent episode runner).

* ``random``: uniformly random paths (seeded); the floor any policy should beat.
* ``heuristic``, per task:

  - reconstruction: a mosaic -- one horizontal stroke per cell of a
    ``ceil(sqrt(budget))`` grid, coloured with the reference's cell mean;
  - circle / object outline: segment the target from the image pixels
    (colour distance from the border colour; for "left" tasks the leftmost
    large component; pixels near the component's median colour, which drops
    the apple's stem and leaf), erode by the brush radius so the ink's outer
    edge lies on the boundary, and trace the contour as straight strokes;
  - handwriting: typeset the word with OpenCV's single-line Hershey font and
    trace each line chain as straight strokes;
  - mazes: the generator's route (an oracle), one stroke per straight run of
    cell centres.
"""
from __future__ import annotations

import logging
import math

import cv2
import numpy as np
from scipy import ndimage

from . import render
from .tasks import HandwritingTask, MazeTask, OutlineTask, ReconstructionTask

log = logging.getLogger(__name__)

PLANS = ("random", "heuristic")


def _segments_to_paths(points: np.ndarray, res: int, closed: bool) -> list[list[float]]:
    """Polyline vertices (pixel units) -> straight-stroke 6-vectors in [0, 1]."""
    pts = [tuple(p) for p in np.asarray(points, np.float64).reshape(-1, 2)]
    if closed and len(pts) > 2:
        pts.append(pts[0])
    return [[x0 / res, y0 / res, (x0 + x1) / 2 / res, (y0 + y1) / 2 / res, x1 / res, y1 / res]
            for (x0, y0), (x1, y1) in zip(pts[:-1], pts[1:])]


def _fit_budget(polys: list[tuple[np.ndarray, bool]], res: int, budget: int) -> np.ndarray:
    """Simplify polylines with a growing tolerance until the strokes fit the budget."""
    for eps in (1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0):
        paths: list[list[float]] = []
        for pts, closed in polys:
            approx = cv2.approxPolyDP(pts.reshape(-1, 1, 2).astype(np.float32), eps, closed).reshape(-1, 2)
            paths += _segments_to_paths(approx, res, closed)
        if len(paths) <= budget:
            break
    paths = paths[:budget]
    return render.expand_fixed(np.clip(np.array(paths, np.float64).reshape(-1, 6), 0.0, 1.0))


def brush_radius_px(res: int) -> float:
    fa = render.FIXED_APPEARANCE
    return render.R_MIN_PX + fa.radius * (res * render.R_MAX_FRAC - render.R_MIN_PX)


def grid_plan(reference: np.ndarray, budget: int) -> np.ndarray:
    """Mosaic: one horizontal stroke per grid cell with the cell's mean colour."""
    res = reference.shape[0]
    n = max(1, int(math.floor(math.sqrt(budget))))
    cell = res / n
    # radius so a stroke covers its row of cells: R(r) = cell / 2 (+ half a pixel overlap)
    r = float(np.clip((cell / 2 + 0.5 - render.R_MIN_PX) / (res * render.R_MAX_FRAC - render.R_MIN_PX), 0, 1))
    out = []
    for i in range(n):
        for j in range(n):
            y0, y1 = int(round(i * cell)), int(round((i + 1) * cell))
            x0, x1 = int(round(j * cell)), int(round((j + 1) * cell))
            col = reference[y0:y1, x0:x1].reshape(-1, 3).mean(0)
            yc = (i + 0.5) / n
            xa, xb = (j + 0.25) / n, (j + 0.75) / n
            out.append([xa, yc, (xa + xb) / 2, yc, xb, yc, r, 1.0, r, 1.0, *col])
    return np.clip(np.array(out[:budget], np.float64), 0, 1)


def target_mask(task: OutlineTask) -> np.ndarray:
    """The region to outline, from the image alone (the task's mask is not used)."""
    img = task.image
    border = np.concatenate([img[0], img[-1], img[:, 0], img[:, -1]])
    bg = np.median(border, axis=0)
    fg = np.abs(img - bg).max(-1) > 0.15
    lab, n = ndimage.label(fg)
    if n == 0:
        return fg
    sizes = ndimage.sum(fg, lab, range(1, n + 1))
    big = [i + 1 for i, s in enumerate(sizes) if s >= 0.2 * sizes.max()]
    if "left" in task.instruction.lower():
        xs = ndimage.center_of_mass(fg, lab, big)
        pick = big[int(np.argmin([c[1] for c in xs]))]
    else:
        pick = big[int(np.argmax([sizes[i - 1] for i in big]))]
    comp = lab == pick
    med = np.median(img[comp], axis=0)
    body = comp & (np.abs(img - med).max(-1) < 0.2)
    lab2, n2 = ndimage.label(body)
    if n2 > 1:
        body = lab2 == (1 + int(np.argmax(ndimage.sum(body, lab2, range(1, n2 + 1)))))
    return ndimage.binary_fill_holes(body)


def outline_plan(task: OutlineTask) -> np.ndarray:
    res = task.resolution
    mask = target_mask(task)
    rad = int(round(brush_radius_px(res)))
    inner = ndimage.binary_erosion(mask, np.ones((3, 3), bool), iterations=max(1, rad)) if rad > 0 else mask
    if inner.sum() < 10:
        inner = mask
    cs, _ = cv2.findContours(inner.astype(np.uint8), cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_NONE)
    if not cs:
        return np.zeros((0, render.N_PARAMS))
    c = max(cs, key=cv2.contourArea).reshape(-1, 2).astype(np.float64) + 0.5  # pixel centres
    return _fit_budget([(c, True)], res, task.budget)


_NBRS = [(-1, -1), (-1, 0), (-1, 1), (0, -1), (0, 1), (1, -1), (1, 0), (1, 1)]


def _chains(skel: np.ndarray) -> list[np.ndarray]:
    """Split a one-pixel-wide drawing into chains (x, y) between ends and junctions."""
    pix = set(zip(*np.nonzero(skel)))
    deg = {p: sum((p[0] + dy, p[1] + dx) in pix for dy, dx in _NBRS) for p in pix}
    used: set[frozenset] = set()
    chains = []

    def walk(start, nxt):
        path = [start, nxt]
        used.add(frozenset((start, nxt)))
        cur = nxt
        while deg[cur] == 2:
            step = [q for q in ((cur[0] + dy, cur[1] + dx) for dy, dx in _NBRS)
                    if q in pix and frozenset((cur, q)) not in used]
            if not step:
                break
            used.add(frozenset((cur, step[0])))
            path.append(step[0])
            cur = step[0]
        return path

    # ends and junctions first, then leftover loops; sorted for determinism
    starts = sorted(p for p in pix if deg[p] != 2) + sorted(pix)
    for s in starts:
        for dy, dx in _NBRS:
            q = (s[0] + dy, s[1] + dx)
            if q in pix and frozenset((s, q)) not in used:
                chains.append(np.array([(x + 0.5, y + 0.5) for y, x in walk(s, q)], np.float64))
    return [c for c in chains if len(c) >= 2]


def handwriting_plan(task: HandwritingTask) -> np.ndarray:
    res = task.resolution
    font = cv2.FONT_HERSHEY_SIMPLEX
    (tw, th), _ = cv2.getTextSize(task.word, font, 1.0, 1)
    scale = min(0.8 * res / max(tw, 1), 0.35 * res / max(th, 1))
    (tw, th), _ = cv2.getTextSize(task.word, font, scale, 1)
    img = np.zeros((res, res), np.uint8)
    cv2.putText(img, task.word, ((res - tw) // 2, (res + th) // 2), font, scale, 1, 1, cv2.LINE_8)
    from skimage.morphology import skeletonize
    chains = _chains(skeletonize(img > 0))
    return _fit_budget([(c, False) for c in chains], res, task.budget)


def maze_plan(task: MazeTask) -> np.ndarray:
    """One stroke per straight run of the route's cell centres (oracle route)."""
    route = task.maze.route
    corners = [route[0]]
    for a, b, c in zip(route[:-2], route[1:-1], route[2:]):
        if (b[0] - a[0], b[1] - a[1]) != (c[0] - b[0], c[1] - b[1]):
            corners.append(b)
    corners.append(route[-1])
    pts = np.array([task.cell_center(rc) for rc in corners], np.float64)
    paths = _segments_to_paths(pts, task.resolution, closed=False)[:task.budget]
    return render.expand_fixed(np.clip(np.array(paths).reshape(-1, 6), 0, 1))


def random_plan(task, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng([seed, 99])
    if isinstance(task, ReconstructionTask):
        return rng.random((task.budget, render.N_PARAMS))
    return render.expand_fixed(rng.random((task.budget, 6)))


def heuristic_plan(task) -> np.ndarray:
    if isinstance(task, ReconstructionTask):
        return grid_plan(task.reference, task.budget)
    if isinstance(task, OutlineTask):
        return outline_plan(task)
    if isinstance(task, HandwritingTask):
        return handwriting_plan(task)
    if isinstance(task, MazeTask):
        return maze_plan(task)
    raise TypeError(f"no heuristic for {type(task).__name__}")


def plan_for(name: str, task, seed: int = 0) -> np.ndarray:
    if name == "random":
        return random_plan(task, seed)
    if name == "heuristic":
        return heuristic_plan(task)
    raise ValueError(f"unknown plan {name!r}; choose from {PLANS}")
