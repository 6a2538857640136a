"""Train and evaluate the paper's ablation grid (Table 5) from one YAML file.

    canvasagent ablate --grid configs/ablation/paper.yaml --out runs/ablation

Cells: SFT only, RL only, SFT+RL, SFT+RL without the outcome reward, SFT+RL without the process
reward. Training goes through the training CLI (`python -m canvasagent.train sft|grpo`, one
subprocess per run, so each run has a clean process and its own log); the reward ablations are
GRPO runs whose `grpo.reward_preset` names a preset in configs/reward/. The SFT run is shared by
every cell that starts from it. Each checkpoint is evaluated on the same split by
`training.evaluate.evaluate_checkpoint` (greedy, plus sampled with `eval.samples`), every cell
scored by the same reward, and written as one Table-5-shaped table plus training curves; the
table also checks the paper's Table-5 claims cell against cell, paired per held-out task
(`table5_shape.check_shape`).

Stages run through `canvasagent.stage_runner.StagedRun`. Layout under `--out` (a rerun skips
every finished stage and resumes unfinished training):

    sft/                      the shared SFT run (train.log, metrics.jsonl, final/)
    cells/<cell>/grpo/        the cell's GRPO run
    cells/<cell>/eval/greedy/ trajectories + report of the cell's evaluation (sampled/: with eval.samples)
    cells/<cell>/done.json    the cell's metrics (written last)
    table.md, table.json, curves.png
"""

from __future__ import annotations

import functools
import json
import logging
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable

from canvasagent.core.plotting import ema, figure
from canvasagent.evaluation.metrics import paired_difference, summarize
from canvasagent.evaluation.report import markdown_table, metrics_table, write_report
from canvasagent.evaluation.table5_shape import check_shape, shape_rows
from canvasagent.evaluation.tasks_io import load_tasks, write_tasks
from canvasagent.stage_runner import StagedRun, StageFailed, StaleStage, train_command
from rewards.hybrid import canonical_scores
from toolserver.config import find_config, from_dict, load_yaml

log = logging.getLogger(__name__)


class AblationError(RuntimeError):
    pass


@dataclass
class CellSpec:
    name: str
    sft: bool = True  # start from the shared SFT checkpoint (else from the base model)
    grpo: bool = True  # run GRPO (else evaluate the SFT checkpoint itself)
    reward_preset: str = "paper"  # configs/reward/<preset>.yaml for GRPO
    grpo_overrides: dict[str, Any] = field(default_factory=dict)


@dataclass
class TrainSection:
    sft_config: str = "sft_tiny_cpu"
    grpo_config: str = "grpo_tiny_cpu"
    sft_overrides: dict[str, Any] = field(default_factory=dict)  # `--set` KEY=VALUE for the SFT run
    grpo_overrides: dict[str, Any] = field(default_factory=dict)  # for every GRPO run
    launcher: list[str] = field(default_factory=list)  # e.g. [accelerate, launch, --config_file, X]; empty: this Python


@dataclass
class EvalSection:
    # A split path (anything `canvasagent eval --tasks` reads), or {scripted: {n, seed, max_steps, image_size}}
    # for held-out templated tasks from the training package (a seed training never uses).
    tasks: Any = field(default_factory=lambda: {"scripted": {"n": 12, "seed": 9999, "max_steps": 2, "image_size": 64}})
    judge: str = "offline"
    preset: str = "paper"  # the reward that *scores* every cell (fixed across cells, whatever they trained on)
    max_turns: int = 4
    workers: int = 1  # unused (tasks run in order, seeded); kept so existing grids load
    limit: int | None = None
    samples: int = 0  # besides greedy: episodes per task sampled at the GRPO temperature
    # max_new_tokens (null or absent: the GRPO config's max_completion_length, as long a reply as a rollout's,
    # as the pipeline's eval_max_new_tokens: null),
    # HFGenerationConfig fields (dtype, device); the layout and tools are the training ones.
    policy_options: dict[str, Any] = field(default_factory=lambda: {"layout": "train"})


@dataclass
class AblationConfig:
    name: str = "ablation"
    # A configs/pipeline/<name> whose data stage builds the grid's data under <out>/data: every run
    # trains on it and every cell is evaluated on its held-out tasks (replacing `eval.tasks`) with
    # its tools config. None: the train configs' own data. A pipeline with `grpo_tasks: unsolved`
    # makes every GRPO cell (RL only too) train on the tasks the grid's shared SFT leaves unsolved.
    data: str | None = None
    train: TrainSection = field(default_factory=TrainSection)
    eval: EvalSection = field(default_factory=EvalSection)
    cells: list[CellSpec] = field(default_factory=list)

    @classmethod
    def load(cls, name_or_path: str | Path) -> "AblationConfig":
        data = load_yaml(find_config(name_or_path, "ablation"))
        cells = [from_dict(CellSpec, c) for c in data.pop("cells", [])]
        cfg = from_dict(cls, data)
        cfg.cells = cells
        if not cells:
            raise ValueError(f"{name_or_path}: the grid has no cells")
        names = [slug(c.name) for c in cells]
        if len(set(names)) != len(names):
            raise ValueError(f"{name_or_path}: cell names must be unique")
        limit = cfg.eval.policy_options.get("max_new_tokens")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise ValueError(f"{name_or_path}: eval.policy_options.max_new_tokens must be an integer of at least 1 or null, not {limit!r}")
        return cfg


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "cell"


PAIRED_COLUMNS = ("hybrid", "align", "traj", "rule")
REFERENCE_CELL = "SFT+RL"  # the paper's full method: the other cells are read against it


def cell_task_scores(out: Path, name: str, mode: str = "greedy") -> dict[str, dict[str, float]] | None:
    """A cell's canonical scores per held-out task ({task_id: scores}) from its
    `cells/<slug>/eval/<mode>/report.json`; None without one."""
    path = out / "cells" / slug(name) / "eval" / mode / "report.json"
    if not path.exists():
        return None
    return {t["task_id"]: canonical_scores(t["scores"]) for t in json.loads(path.read_text()).get("tasks") or []}


def paired_against(out: Path, cells: list[str], reference: str, mode: str = "greedy") -> dict[str, dict[str, dict[str, float]]]:
    """Each cell minus `reference` on `PAIRED_COLUMNS`, paired per held-out task, from the cells'
    `cells/<slug>/eval/<mode>/report.json`: {cell: {column: `paired_difference`}}. A cell without
    a report, or with other tasks than the reference's, is left out (it cannot be paired)."""
    scores = {n: s for n in {*cells, reference} if (s := cell_task_scores(out, n, mode)) is not None}
    return paired_rows(scores, [n for n in cells if n in scores], reference)


def paired_rows(scores: dict[str, dict[str, dict[str, float]]], cells: list[str], reference: str) -> dict[str, dict[str, dict[str, float]]]:
    """`paired_against` on per-task scores already read ({cell: `cell_task_scores`})."""
    ref = scores.get(reference)
    if not ref:
        return {}
    ids = sorted(ref)
    out_rows: dict[str, dict[str, dict[str, float]]] = {}
    for name in cells:
        got = scores.get(name) if name != reference else None
        if got is None or sorted(got) != ids:
            continue
        out_rows[name] = {c: paired_difference([ref[i] for i in ids], [got[i] for i in ids], c) for c in PAIRED_COLUMNS}
    return out_rows


def paired_table(paired: dict[str, dict[str, dict[str, float]]], reference: str) -> str:
    cells = [[name, *(f"{cols[c]['mean_diff']:+.3f} ± {cols[c]['se']:.3f}" for c in PAIRED_COLUMNS)] for name, cols in paired.items()]
    return markdown_table([f"Setting - {reference}", *PAIRED_COLUMNS], cells)


# A trainer: (kind, config, output_dir, overrides, log_path) -> final checkpoint dir.
Trainer = Callable[[str, str, Path, dict[str, Any], Path], Path]


def cli_trainer(launcher: list[str] | None = None) -> Trainer:
    """The grid's trainer: `stage_runner.train_command` under `launcher` (default: this Python)."""
    return functools.partial(train_command, launcher=launcher)


@dataclass
class CellResult:
    name: str
    metrics: dict[str, float]
    success_rate: float
    valid_reply_rate: float
    checkpoint: str
    seconds: float
    metrics_sampled: dict[str, float] | None = None  # with `eval.samples`: the sampled episodes' metrics

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> CellResult:
        """From a cell's done.json (which also holds the stage's peak RSS); metrics saved under a
        legacy total name read as `hybrid`, legacy `calls` as `calls_per_task`, and greedy metrics
        without `success` / `format_validity` take them from the record's rates."""
        sampled = record.get("metrics_sampled")
        return cls(**{f.name: record[f.name] for f in fields(cls) if f.name not in ("metrics", "metrics_sampled")}, metrics_sampled=_canonical(sampled) if sampled else None,
                   metrics={"success": record["success_rate"], "format_validity": record["valid_reply_rate"], **_canonical(record["metrics"])})


def _canonical(metrics: dict[str, float]) -> dict[str, float]:
    m = canonical_scores(metrics)
    return {"calls_per_task": m.get("calls", float("nan")), **m}


class AblationRunner:
    def __init__(self, config: AblationConfig, out_dir: str | Path, trainer: Trainer | None = None, evaluator: Callable | None = None):
        self.cfg = config
        self.out = Path(out_dir).resolve()
        self.trainer = trainer or cli_trainer(config.train.launcher)
        self.evaluator = evaluator or self.evaluate
        self.stages = StagedRun(self.out, "ablation")

    def plan(self) -> list[str]:
        """Human-readable stages, in order (for --dry-run); a stage already finished under `--out`
        (a rerun, or done markers copied from another run) ends in "[done]" and will be skipped."""
        from canvasagent.pipeline import PipelineConfig

        t = self.cfg.train

        def step(stage: str, text: str) -> str:
            return f"{text}  [done]" if self.stages.done(stage) is not None else text

        steps = [step("data", f"data: pipeline {self.cfg.data} data stage -> {self.out / 'data'}")] if self.cfg.data else []
        unsolved = bool(self.cfg.data) and PipelineConfig.load(self.cfg.data).grpo_tasks == "unsolved"
        if any(c.sft for c in self.cfg.cells) or (unsolved and any(c.grpo for c in self.cfg.cells)):
            steps.append(step("sft", f"train sft  --config {t.sft_config} -> {self.out / 'sft'}"))
        if unsolved and any(c.grpo for c in self.cfg.cells):
            steps.append(step("unsolved_tasks", f"unsolved_tasks: sft/final on the GRPO training tasks -> "
                              f"{self.out / 'unsolved_tasks' / 'task_ids.txt'} (every GRPO cell trains on those)"))
        for c in self.cfg.cells:
            stage = f"cells/{slug(c.name)}"
            if c.grpo:
                start = "sft/final" if c.sft else "base model"
                steps.append(step(f"{stage}/grpo", f"train grpo --config {t.grpo_config} (reward {c.reward_preset}, from {start}) -> {self.out / stage / 'grpo'}"))
            steps.append(step(stage, f"eval {c.name} -> {self.out / stage / 'eval'}"))
        return steps

    def problems(self) -> list[str]:
        """What would make the grid fail before it trains anything (checked by --dry-run)."""
        from canvasagent.training.config import TrainConfig
        from rewards.config import load_reward_config

        out = []
        t = self.cfg.train
        for name in ([t.sft_config] if any(c.sft for c in self.cfg.cells) else []) + [t.grpo_config]:
            try:
                TrainConfig.load(name)
            except Exception as e:
                out.append(f"train config {name!r}: {e}")
        for preset in sorted({c.reward_preset for c in self.cfg.cells if c.grpo} | {self.cfg.eval.preset}):
            try:
                load_reward_config(preset)
            except Exception as e:
                out.append(f"reward preset {preset!r}: {e}")
        if isinstance(self.cfg.eval.tasks, str) and not Path(self.cfg.eval.tasks).exists():
            out.append(f"eval split {self.cfg.eval.tasks} does not exist yet (build it with python -m canvascraft build-rl)")
        return out

    @functools.cached_property
    def _data(self) -> dict[str, Any]:
        """Build (or find, on a rerun) the `data` pipeline's data, once: the training overrides it
        gives every run, the pipeline (whose held-out tasks every cell is evaluated on) and its seed."""
        from canvasagent.pipeline import Pipeline, PipelineConfig

        pipe = Pipeline(PipelineConfig.load(self.cfg.data, out=str(self.out)))
        pipe.run(only=["data"])
        unsolved = pipe.cfg.grpo_tasks == "unsolved"
        return {"sft": {**pipe.train_data("sft"), **pipe.cfg.sft_overrides},
                "grpo": {**pipe.train_data("grpo"), **pipe.cfg.grpo_overrides,
                         **({"data.task_ids": pipe.grpo.data.task_ids} if unsolved else {})},
                "pipeline": pipe, "seed": pipe.cfg.seed, "unsolved": unsolved}

    def eval_tasks(self) -> list:
        """The held-out tasks every cell is evaluated on (read once per grid): the `data` pipeline's
        (the first `eval.limit` of each source), else `eval.tasks` (a split path, or scripted tasks)."""
        return list(self._all_eval_tasks)

    @functools.cached_property
    def _all_eval_tasks(self) -> list:
        limit = self.cfg.eval.limit
        if self.cfg.data:
            return self._data["pipeline"].eval_tasks(limit)[0]
        tasks = self.cfg.eval.tasks
        if isinstance(tasks, str):
            return load_tasks(tasks, limit=limit)
        if isinstance(tasks, dict) and "scripted" in tasks:
            path = self.out / "eval_tasks"
            if not (path / "tasks.jsonl").exists():
                from canvasagent.training.scripted import attach_reference, make_tasks
                from toolserver.client import make_toolbox

                s = dict(tasks["scripted"])
                pairs = make_tasks(int(s.get("n", 12)), int(s.get("seed", 9999)), int(s.get("max_steps", 2)), int(s.get("image_size", 64)))
                toolbox = make_toolbox("offline")
                try:  # the reference solution's final image is what the alignment check compares with
                    write_tasks([attach_reference(t, toolbox) for t, _ in pairs], path)
                finally:
                    toolbox.close()
            return load_tasks(path, limit=limit)
        raise AblationError(f"eval.tasks must be a path or {{scripted: {{...}}}}, got {tasks!r}")

    def _train(self, kind: str, config: str, out: Path, overrides: Callable[[], dict[str, Any]]) -> Path:
        """A training stage of the grid; `overrides` is called only when the stage runs."""
        rec = self.stages.run(str(out.relative_to(self.out)), lambda: {"final": str(self.trainer(kind, config, out, overrides(), out / "train.log"))})
        return Path(rec["final"])

    def _sft(self) -> Path:
        return self._train("sft", self.cfg.train.sft_config, self.out / "sft",
                           lambda: {**(self._data["sft"] if self.cfg.data else {}), **self.cfg.train.sft_overrides})

    def _unsolved_tasks(self) -> None:
        """With a data pipeline of `grpo_tasks: unsolved`: the grid's shared SFT checkpoint on every
        GRPO training task, once (stage `unsolved_tasks`, under that pipeline's evaluation inputs),
        writing the id file every GRPO cell's data.task_ids names. So every GRPO cell, RL only
        included, trains on the tasks the shared SFT leaves unsolved: one task set for all cells."""
        pipe = self._data["pipeline"]
        self.stages.run("unsolved_tasks", pipe.stage_unsolved_tasks, self._sft(), inputs=pipe.eval_inputs("unsolved_tasks"))

    def _grpo(self, cell: CellSpec, init: Path | None) -> Path:
        if self.cfg.data and self._data["unsolved"]:
            self._unsolved_tasks()
        return self._train("grpo", self.cfg.train.grpo_config, self.out / "cells" / slug(cell.name) / "grpo", lambda: {
            **(self._data["grpo"] if self.cfg.data else {}), **self.cfg.train.grpo_overrides,
            "grpo.reward_preset": cell.reward_preset, "run.init_from": str(init) if init else None, **cell.grpo_overrides})

    def evaluate(self, checkpoint: Path, out: Path, title: str) -> dict[str, Any]:
        """`evaluate_checkpoint` on the grid's split with the GRPO runs' tools, image budget and
        temperature, `eval.max_turns`, scored by `eval.preset` with every judge; a report per mode
        under `out`. Returns {mode: EvalResult}."""
        from canvasagent.evaluation.scoring import make_scorer
        from canvasagent.training.common import workspace
        from canvasagent.training.config import TrainConfig
        from canvasagent.training.evaluate import evaluate_checkpoint

        e, t = self.cfg.eval, self.cfg.train
        grpo = TrainConfig.load(t.grpo_config, {**(self._data["grpo"] if self.cfg.data else {}), **t.grpo_overrides})
        ws = workspace(grpo, build_model=False)
        toolbox = ws.env_cls.toolbox()
        options = {k: v for k, v in e.policy_options.items() if k not in ("layout", "tools")}
        tasks = self.eval_tasks()
        try:
            res = evaluate_checkpoint(
                checkpoint, tasks, make_scorer(e.preset, e.judge, toolbox, every_judge=True),
                toolbox, ws.tool_fns, out, max_turns=e.max_turns, max_new_tokens=options.pop("max_new_tokens", None) or grpo.grpo.max_completion_length,
                temperature=grpo.grpo.temperature, samples=e.samples, seed=self._data["seed"] if self.cfg.data else 0,
                image_budget=grpo.image_budget, generation=options)
        finally:
            toolbox.close()
        for mode, r in res.items():
            if len(r.results) < len(tasks):
                raise AblationError(f"{title!r}: {mode} evaluation incomplete ({len(r.results)}/{len(tasks)}); rerun to resume")
            write_report(summarize(r.results), r.results, out / mode, title=title, setting=str(checkpoint),
                         meta={"checkpoint": str(checkpoint), "judge": e.judge, "preset": e.preset, "mode": mode})
        return res

    def run_cell(self, cell: CellSpec) -> CellResult:
        """The cell's stage: its training stages (shared SFT, its GRPO), then its evaluation."""
        return CellResult.from_record(self.stages.run(f"cells/{slug(cell.name)}", self._cell, cell, inputs=self.cell_inputs(cell)))

    def cell_inputs(self, cell: CellSpec) -> dict[str, Any]:
        """What a cell's result depends on: its spec, the grid's data, training and evaluation
        sections (the GRPO config also sets how every cell is evaluated: its tools, temperature and
        reply limit). A cell begun under other ones is refused (`StaleStage`), finished or not."""
        return {"cell": asdict(cell), "data": self.cfg.data,
                "train": {k: v for k, v in asdict(self.cfg.train).items() if k != "launcher"},  # where it runs, not what
                "eval": {k: v for k, v in asdict(self.cfg.eval).items() if k != "workers"}}  # unused

    def _cell(self, cell: CellSpec) -> dict[str, Any]:
        sft = self._sft() if cell.sft else None
        ckpt = self._grpo(cell, sft) if cell.grpo else sft
        if ckpt is None:
            raise AblationError(f"cell {cell.name!r} neither trains SFT nor GRPO: nothing to evaluate")
        res = self.evaluator(ckpt, self.out / "cells" / slug(cell.name) / "eval", cell.name)
        m = res["greedy"].metrics
        return {"name": cell.name, "metrics": m, "success_rate": m["success"], "valid_reply_rate": m["format_validity"],
                "checkpoint": str(ckpt), **({"metrics_sampled": res["sampled"].metrics} if "sampled" in res else {})}  # `seconds`: the stage's

    def run(self, only: list[str] | None = None) -> dict[str, Any]:
        """Run every cell (or the cells named in `only`); the table covers every finished cell."""
        results: dict[str, CellResult] = {}
        failures: dict[str, str] = {}
        # Before any cell trains: a grid resumed under changed settings is refused whole, not at its n-th cell.
        if stale := [r for c in self.cfg.cells if not (only and c.name not in only) and (r := self.stages.stale(f"cells/{slug(c.name)}", self.cell_inputs(c)))]:
            raise StaleStage("\n".join(stale))
        for cell in self.cfg.cells:
            if only and cell.name not in only:
                if done := self.stages.done(f"cells/{slug(cell.name)}"):
                    results[cell.name] = CellResult.from_record(done)
                continue
            try:
                results[cell.name] = self.run_cell(cell)
            except (AblationError, StageFailed) as e:  # one failed cell must not cost the others
                log.error("cell %r failed: %s", cell.name, e)
                failures[cell.name] = str(e)
        return self.write(results, failures)

    def write(self, results: dict[str, CellResult], failures: dict[str, str]) -> dict[str, Any]:
        notes = [f"- {n}: FAILED — {msg.splitlines()[0]}" for n, msg in failures.items()]
        md = f"# Ablation: {self.cfg.name}\n\nEvaluated with the `{self.cfg.eval.preset}` reward, {self.cfg.eval.judge} judges.\n"
        paired: dict[str, dict] = {}
        shape: dict[str, list[dict[str, Any]]] = {}
        for mode, heading in (("greedy", ""), ("sampled", f"Sampled ({self.cfg.eval.samples} episodes a task at the GRPO temperature; "
                                                          "success: at least half of a task's episodes passed every check):\n\n")):
            field_name = "metrics" if mode == "greedy" else "metrics_sampled"
            rows = {c.name: m for c in self.cfg.cells if c.name in results and (m := getattr(results[c.name], field_name))}
            if not rows:
                continue
            md += f"\n{heading}{metrics_table(rows)}\n\n" + markdown_table(["Setting", "Success", "Valid replies", "Minutes"], (
                [n, f"{m['success']:.3f}", f"{m['format_validity']:.3f}", f"{results[n].seconds / 60:.1f}"] for n, m in rows.items())) + "\n"
            scores = {n: s for n in rows if (s := cell_task_scores(self.out, n, mode))}  # each report read once
            paired[mode] = paired_rows(scores, list(rows), REFERENCE_CELL)
            if paired[mode]:
                md += (f"\nEach cell minus {REFERENCE_CELL}, paired per held-out task ({mode}; mean ± standard error):\n\n"
                       + paired_table(paired[mode], REFERENCE_CELL) + "\n")
            if checks := check_shape(scores):
                shape[mode] = [c.to_dict() for c in checks]
                md += (f"\nAgainst paper Table 5's shape ({mode}; higher minus lower cell, paired per held-out task):\n\n"
                       + markdown_table(["Claim", "Score", "Difference", "Holds", "Beyond 2 se"], shape_rows(checks)) + "\n")
        if notes:
            md += "\n" + "\n".join(notes) + "\n"
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "table.md").write_text(md)
        payload = {"name": self.cfg.name, "cells": {n: r.to_dict() for n, r in results.items()}, "failures": failures,
                   "paired_vs_reference": {"reference": REFERENCE_CELL, "cells": paired.get("greedy", {}), "cells_sampled": paired.get("sampled", {})},
                   "table5_shape": shape}
        (self.out / "table.json").write_text(json.dumps(payload, indent=2, default=float))
        self.curves()
        return {"markdown": md, **payload}

    def curves(self) -> Path | None:
        """Training curves of every run: SFT loss and each cell's GRPO reward, from metrics.jsonl."""
        series: dict[str, list[tuple[int, float]]] = {}
        for name, path, key in [("SFT loss", self.out / "sft" / "metrics.jsonl", "loss")] + [
            (c.name, self.out / "cells" / slug(c.name) / "grpo" / "metrics.jsonl", "reward") for c in self.cfg.cells if c.grpo
        ]:
            if path.exists():
                pts = []
                for line in path.read_text().splitlines():
                    try:
                        rec = json.loads(line)
                    except ValueError:
                        continue
                    if isinstance(rec.get(key), (int, float)):
                        pts.append((int(rec.get("step", len(pts))), float(rec[key])))
                if pts:
                    series[name] = pts
        if not series:
            return None
        path = self.out / "curves.png"
        with figure(path, 1, 2, figsize=(10, 3.5), dpi=100) as (fig, axes):
            for name, pts in series.items():
                ax = axes[0] if name == "SFT loss" else axes[1]
                raw, = ax.plot([p[0] for p in pts], [p[1] for p in pts], alpha=0.25, linewidth=0.8, marker=".")
                ax.plot([p[0] for p in pts], ema([p[1] for p in pts]), color=raw.get_color(), label=f"{name} (EMA)")
            axes[0].set_title("SFT loss")
            axes[1].set_title("GRPO reward (each cell's training preset)")
            for ax in axes:
                ax.set_xlabel("step")
                if ax.lines:
                    ax.legend(fontsize=7)
                else:
                    ax.text(0.5, 0.5, "no metrics.jsonl under this grid", ha="center", va="center", transform=ax.transAxes)
        return path
