"""One call that evaluates a policy spec on a split and writes the report (CLI and ablations)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from canvasagent.evaluation.metrics import Summary, summarize
from canvasagent.evaluation.report import write_report
from canvasagent.evaluation.runner import EvalConfig, EvalRunner, Progress, Scorer
from canvasagent.evaluation.scoring import make_scorer
from canvasagent.evaluation.tasks_io import load_tasks
from canvasagent.policy_spec import PolicyFactory

log = logging.getLogger(__name__)


@dataclass
class EvalOutcome:
    summary: Summary
    paths: dict[str, Path]
    n_done: int
    n_tasks: int

    @property
    def complete(self) -> bool:
        return self.n_done == self.n_tasks


def evaluate_policy(
    policy: str,
    tasks_path: str | Path,
    out_dir: str | Path,
    judge: str = "offline",
    preset: str = "paper",
    config: EvalConfig | None = None,
    limit: int | None = None,
    scorer: Scorer | None = None,
    progress: Progress | None = None,
    title: str = "Evaluation",
    judge_model: str | None = None,
    judge_url: str | None = None,
) -> EvalOutcome:
    tasks = load_tasks(tasks_path, limit=limit)
    scorer = scorer or make_scorer(preset, judge, judge_model=judge_model, judge_url=judge_url, every_judge=True)
    factory = PolicyFactory(policy)
    if factory.spec.kind == "human" and config is not None and config.workers > 1:
        config.workers = 1  # one person answers one prompt at a time
    try:
        results = EvalRunner(factory, scorer, out_dir, config).run(tasks, progress)
    finally:
        factory.close()
    summary = summarize(results)
    meta: dict[str, Any] = {"policy": str(policy), "tasks": str(tasks_path), "judge": judge, "preset": preset}
    paths = write_report(summary, results, out_dir, title=title, setting=str(policy), meta=meta)
    return EvalOutcome(summary, paths, len(results), len(tasks))
