"""EASEL semantic-task benchmark: circle and object outline (Dice), handwriting
(OCR letter match), simple and hard maze (route progress; wall hits are
rejected but cost a step).

Policies: the ``blank`` anchor (submit at once), ``random`` and ``heuristic``
plans from :mod:`canvasagent.easel.heuristics`, executed through a
:class:`CanvasSession` (so the budget, rejections and step accounting are the
environment's). Agent policies run through :mod:`canvasagent.easel.agent` and
produce the same :class:`SemanticResult` rows. Output: ``results.jsonl``,
``table.md`` (task x policy), ``semantic.png`` (bars) and final canvases.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from canvasagent.core.plotting import figure
from canvasagent.evaluation.report import markdown_table

from . import heuristics, render, tasks
from .canvas import CanvasSession

log = logging.getLogger(__name__)

TASK_NAMES = ("circle_outline", "apple_outline", "handwriting", "simple_maze", "hard_maze")
POLICIES = ("blank",) + heuristics.PLANS
METRIC = {"circle_outline": "Dice", "apple_outline": "Dice", "handwriting": "letter match",
          "simple_maze": "progress", "hard_maze": "progress"}


@dataclass
class SemanticResult:
    task: str
    seed: int
    policy: str
    score: float
    budget: int
    steps_used: int
    strokes_applied: int
    rejected: int
    seconds: float

    def row(self) -> dict:
        return asdict(self)


def make_tasks(task_names: Sequence[str], seeds: Sequence[int],
               ocr: tasks.OCRFn | None = None) -> list[tuple[int, Any]]:
    """(seed, task) for every task name and seed; the handwriting tasks share one OCR reader."""
    if ocr is None and "handwriting" in task_names:
        ocr = tasks.rapidocr_reader()  # load once, shared by every handwriting episode
    return [(seed, tasks.semantic_task(name, seed, ocr)) for name in task_names for seed in seeds]


def result_of(task: Any, seed: int, policy: str, session: CanvasSession, seconds: float) -> SemanticResult:
    strokes = [e for e in session.history if e.tool == "brush_stroke"]
    return SemanticResult(task.name, seed, policy, float(task.score(session.canvas)), session.budget,
                          session.steps_used, sum(e.ok for e in strokes), sum(not e.ok for e in strokes), seconds)


def run_plan_episode(task: Any, policy: str, seed: int = 0) -> tuple[SemanticResult, np.ndarray]:
    """Run an anchor or scripted plan on one task -> (result, final canvas)."""
    t0 = time.perf_counter()
    sess = CanvasSession.for_task(task, track_s=False)
    plan = np.zeros((0, render.N_PARAMS)) if policy == "blank" else heuristics.plan_for(policy, task, seed)
    for p in plan:
        if sess.done:
            break
        sess.brush_stroke(p)
    if not sess.done:
        sess.submit()
    return result_of(task, seed, policy, sess, time.perf_counter() - t0), sess.canvas


def run(policies: Sequence[str], seeds: Sequence[int] = (0,), out_dir: str | Path | None = None,
        task_names: Sequence[str] = TASK_NAMES, ocr: tasks.OCRFn | None = None) -> list[SemanticResult]:
    """Every (task, seed, policy); writes the table, PNG and canvases when ``out_dir`` is given."""
    results, canvases = [], []
    for seed, task in make_tasks(task_names, seeds, ocr):
        for pol in policies:
            r, canvas = run_plan_episode(task, pol, seed)
            results.append(r)
            canvases.append(canvas)
            log.info("%s seed %d %s: %.3f", task.name, seed, pol, r.score)
    if out_dir is not None:
        write_outputs(results, canvases, out_dir)
    return results


def write_outputs(results: Sequence[SemanticResult], canvases: Sequence[np.ndarray] | None,
                  out_dir: str | Path) -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "results.jsonl", "w") as f:
        f.writelines(json.dumps(r.row()) + "\n" for r in results)
    (out / "table.md").write_text(format_table(results))
    plot(results, out / "semantic.png")
    if canvases is not None:
        from PIL import Image
        (out / "canvases").mkdir(exist_ok=True)
        for r, c in zip(results, canvases):
            safe = r.policy.replace(":", "_").replace("/", "_")
            Image.fromarray(render.to_uint8(c)).save(out / "canvases" / f"{r.task}_{r.seed}_{safe}.png")


def summarise(results: Sequence[SemanticResult]) -> list[dict]:
    """One row per (task, policy): mean score, steps, rejections."""
    rows = []
    order = {n: i for i, n in enumerate(TASK_NAMES)}
    for task, pol in sorted({(r.task, r.policy) for r in results}, key=lambda k: (order.get(k[0], 99), k[1])):
        rs = [r for r in results if r.task == task and r.policy == pol]
        rows.append({"task": task, "policy": pol, "n": len(rs), "metric": METRIC.get(task, "score"),
                     "score": float(np.mean([r.score for r in rs])),
                     "steps": float(np.mean([r.steps_used for r in rs])),
                     "rejected": float(np.mean([r.rejected for r in rs])),
                     "budget": int(rs[0].budget)})
    return rows


def format_table(results: Sequence[SemanticResult]) -> str:
    """Task x policy table of mean scores (steps used / rejected strokes in brackets)."""
    rows = summarise(results)
    pols = sorted({r["policy"] for r in rows}, key=lambda p: (POLICIES.index(p) if p in POLICIES else 99, p))
    head = ["task", "metric", "budget"] + pols
    table = []
    for task in [t for t in TASK_NAMES if any(r["task"] == t for r in rows)] + \
            sorted({r["task"] for r in rows} - set(TASK_NAMES)):
        cells = [task, METRIC.get(task, "score"), str(next(r["budget"] for r in rows if r["task"] == task))]
        for p in pols:
            m = [r for r in rows if r["task"] == task and r["policy"] == p]
            cells.append("-" if not m else f"{m[0]['score']:.3f} ({m[0]['steps']:.0f}/{m[0]['rejected']:.0f})")
        table.append(cells)
    return markdown_table(head, table) + "\n\nscore (mean steps used / mean rejected strokes)\n"


def plot(results: Sequence[SemanticResult], path: str | Path) -> None:
    rows = summarise(results)
    task_list = [t for t in TASK_NAMES if any(r["task"] == t for r in rows)]
    pols = sorted({r["policy"] for r in rows})
    width = 0.8 / max(1, len(pols))
    with figure(path, figsize=(7, 3.5), save_dpi=120) as (fig, ax):
        for i, p in enumerate(pols):
            ys = [next((r["score"] for r in rows if r["task"] == t and r["policy"] == p), 0.0) for t in task_list]
            ax.bar(np.arange(len(task_list)) + i * width, ys, width, label=p)
        ax.set_xticks(np.arange(len(task_list)) + width * (len(pols) - 1) / 2)
        ax.set_xticklabels(task_list, fontsize=8)
        ax.set_ylim(0, 1.05)
        ax.set_ylabel("score")
        ax.legend(fontsize=7)
