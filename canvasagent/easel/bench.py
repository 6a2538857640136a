"""EASEL reconstruction benchmark runner.

Runs a policy (the painter or an anchor) over the procedural/natural suite and
reports a per-category table like the paper's Table 3 (final S per category,
overall Final, @50%, AUC, Best, F-B gap, Edge IoU, exact-repeat rate) plus
average S curves as a PNG. Each budget mode ("aligned" = the category budget,
or a fixed stroke count such as 250) gets its own rows. Painter episodes run
in parallel across images: local processes (``workers``), or Ray tasks with
``ray: true`` (:mod:`canvasagent.easel.parallel`). Agent policies
(``agent:SPEC``) go through :mod:`canvasagent.easel.agent`, the semantic
suite through :mod:`canvasagent.easel.semantic`.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import yaml

from canvasagent.core.plotting import figure
from canvasagent.evaluation.report import markdown_table
from toolserver.config import from_dict

from . import anchors, metrics, parallel, render, tasks
from .canvas import CanvasSession
from .painter import PainterConfig, paint

log = logging.getLogger(__name__)

POLICIES = ("painter",) + anchors.ANCHORS
DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "easel" / "default.yaml"


@dataclass(frozen=True)
class BenchConfig:
    n_per_category: int = 4
    seed: int = 0
    categories: tuple[str, ...] = tuple(tasks.CATEGORIES)
    budgets: tuple[str | int, ...] = ("aligned",)
    workers: int = 1
    ray: bool = False  # paint images as Ray tasks instead of local processes
    natural_dir: str | None = None
    painter: PainterConfig = field(default_factory=PainterConfig)


def load_config(path: str | Path | None = None) -> BenchConfig:
    """Read configs/easel/default.yaml (or ``path``) into a BenchConfig."""
    p = Path(path) if path else DEFAULT_CONFIG
    raw: dict[str, Any] = yaml.safe_load(p.read_text()) if p.exists() else {}
    b = dict(raw.get("bench") or {})
    for key in ("categories", "budgets"):
        if key in b:
            b[key] = tuple(b[key])
    painter = from_dict(PainterConfig, raw.get("painter"))
    return replace(from_dict(BenchConfig, b), painter=painter)


def budget_for(task: tasks.ReconstructionTask, mode: str | int) -> int:
    return task.budget if str(mode) == "aligned" else int(mode)


@dataclass
class EpisodeResult:
    task_id: str
    category: str
    policy: str
    mode: str
    budget: int
    final: float
    edge_iou: float
    diagnostics: dict
    curve: list[float]
    seconds: float

    def row(self) -> dict:
        return asdict(self)


def run_episode(task: tasks.ReconstructionTask, policy: str, mode: str | int,
                painter_cfg: PainterConfig | None = None) -> tuple[EpisodeResult, np.ndarray, np.ndarray]:
    """One episode -> (result, final canvas, strokes (N, 13))."""
    t0 = time.perf_counter()
    budget = budget_for(task, mode)
    if policy == "painter":
        res = paint(task.reference, budget, painter_cfg or PainterConfig())
        strokes = res.strokes
        sess = CanvasSession(task.initial_canvas(), budget, reference=task.reference)
        for p in strokes:
            sess.brush_stroke(p)
        sess.submit()
        canvas = sess.canvas
        diag = sess.diagnostics()
        curve = list(sess.s_curve)
    elif policy in anchors.ANCHORS:
        canvas = anchors.anchor_canvas(policy, task.reference)
        strokes = np.zeros((0, render.N_PARAMS))
        s = metrics.similarity(task.reference, canvas).s
        diag = metrics.diagnostics([s])
        curve = [s]
    else:
        raise ValueError(f"unknown policy {policy!r}; choose from {POLICIES}")
    sim = metrics.similarity(task.reference, canvas)
    out = EpisodeResult(task.task_id, task.category, policy, str(mode), budget, sim.s, sim.edge_iou,
                        diag.as_dict(), [float(v) for v in curve], time.perf_counter() - t0)
    return out, canvas, strokes


def _job(args) -> tuple[EpisodeResult, np.ndarray, np.ndarray]:
    import torch
    torch.set_num_threads(1)
    return run_episode(*args)


def run(policy: str, cfg: BenchConfig, out_dir: str | Path | None = None,
        suite: Sequence[tasks.ReconstructionTask] | None = None) -> list[EpisodeResult]:
    """Run the benchmark; write results.jsonl, table.md, curves.png, final canvases."""
    suite = list(suite) if suite is not None else tasks.reconstruction_suite(
        cfg.n_per_category, cfg.seed, cfg.categories, cfg.natural_dir)
    modes = list(cfg.budgets) if policy == "painter" else ["aligned"]
    jobs = [(t, policy, m, cfg.painter) for m in modes for t in suite]
    t0 = time.perf_counter()
    partial = None
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        partial = open(Path(out_dir) / "partial.jsonl", "w")  # survives an interrupted run
    outs = []
    # anchors are instant: worker start-up would dominate, so run them inline
    parallel_ok = policy == "painter" and len(jobs) > 1 and (cfg.workers > 1 or cfg.ray)
    for _, o in parallel.imap_jobs(_job, jobs, cfg.workers if parallel_ok else 1,
                                   "ray" if parallel_ok and cfg.ray else "local"):
        outs.append(o)
        if partial is not None:
            partial.write(json.dumps(o[0].row()) + "\n")
            partial.flush()
    if partial is not None:
        partial.close()
    order = {(j[0].task_id, str(j[2])): i for i, j in enumerate(jobs)}
    outs.sort(key=lambda o: order[(o[0].task_id, o[0].mode)])
    wall = time.perf_counter() - t0
    results = [o[0] for o in outs]
    if out_dir is not None:
        out = Path(out_dir)
        (out / "canvases").mkdir(parents=True, exist_ok=True)
        with open(out / "results.jsonl", "w") as f:
            f.writelines(json.dumps(r.row()) + "\n" for r in results)
        from PIL import Image
        for (r, canvas, strokes) in outs:
            Image.fromarray(render.to_uint8(canvas)).save(out / "canvases" / f"{r.task_id}_{r.policy}_{r.mode}.png")
        (out / "table.md").write_text(format_table(results, wall))
        plot_curves(results, out / "curves.png")
    log.info("bench %s: %d episodes in %.1fs", policy, len(results), wall)
    return results


def summarise(results: Sequence[EpisodeResult]) -> list[dict]:
    """One row per (policy, mode): category means + overall diagnostics."""
    rows = []
    keys = sorted({(r.policy, r.mode) for r in results})
    for pol, mode in keys:
        rs = [r for r in results if r.policy == pol and r.mode == mode]
        row: dict[str, Any] = {"policy": pol, "mode": mode, "n": len(rs)}
        for c in tasks.CATEGORIES:
            v = [r.final for r in rs if r.category == c]
            row[c] = float(np.mean(v)) if v else None
        for k in ("final", "at50", "auc", "best", "fb_gap", "exact_repeat_rate"):
            row[k] = float(np.mean([r.diagnostics[k] for r in rs]))
        row["edge_iou"] = float(np.mean([r.edge_iou for r in rs]))
        row["seconds_per_episode"] = float(np.mean([r.seconds for r in rs]))
        rows.append(row)
    return rows


def format_table(results: Sequence[EpisodeResult], wall: float | None = None) -> str:
    cats = list(tasks.CATEGORIES)
    head = ["policy", "budget"] + [tasks.CATEGORIES[c].label for c in cats] + \
        ["Final", "@50%", "AUC", "Best", "F-B Gap", "EdgeIoU", "s/ep"]
    f3 = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
    table = markdown_table(head, ([row["policy"], row["mode"]] + [f3(row[c]) for c in cats] +
                                  [f3(row[k]) for k in ("final", "at50", "auc", "best", "fb_gap", "edge_iou")] +
                                  [f"{row['seconds_per_episode']:.1f}"] for row in summarise(results)))
    if wall is not None:
        table += f"\n\nwall time: {wall:.1f}s for {len(results)} episodes"
    return table + "\n"


def plot_curves(results: Sequence[EpisodeResult], path: str | Path) -> None:
    grid = np.linspace(0, 1, 101)
    with figure(path, figsize=(6, 4), save_dpi=120) as (fig, ax):
        for (pol, mode) in sorted({(r.policy, r.mode) for r in results}):
            for c in tasks.CATEGORIES:
                rs = [r for r in results if r.policy == pol and r.mode == mode and r.category == c and r.curve]
                if not rs:
                    continue
                ys = [np.interp(grid, np.linspace(0, 1, len(r.curve)) if len(r.curve) > 1 else [0, 1],
                                r.curve if len(r.curve) > 1 else r.curve * 2) for r in rs]
                ax.plot(grid * 100, np.mean(ys, 0), label=f"{pol}/{mode}/{c}")
        ax.set_xlabel("progress (% of budget)")
        ax.set_ylabel("similarity S")
        ax.set_ylim(0, 1)
        if ax.get_legend_handles_labels()[0]:  # episodes without a stroke draw no curve
            ax.legend(fontsize=6)


def plot_single_curve(curve: Sequence[float], path: str | Path, title: str = "") -> None:
    with figure(path, figsize=(5, 3), save_dpi=120) as (fig, ax):
        ax.plot(np.arange(1, len(curve) + 1), curve)
        ax.set_xlabel("step")
        ax.set_ylabel("S")
        ax.set_title(title)
