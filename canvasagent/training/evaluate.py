"""Held-out check of a trained policy, through the one evaluation implementation.

A thin adapter: it shows an in-memory HF policy the training layout (system text with the tool
block) and runs it with `canvasagent.evaluation`'s runner (seeded sampling, saved and resumable
trajectories) and metrics (`policy_metrics`: format validity, rule score, hybrid reward and its
components, match rate). The scorer is the one GRPO optimises (the source's, from `canvasagent.evaluation.scoring`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from canvasagent.evaluation.metrics import TaskResult, policy_metrics
from canvasagent.core.policies.guards import GuardConfig
from canvasagent.core.tasks import Task
from canvasagent.core.trajectory import Trajectory
from canvasagent.training.messages import LayoutPolicy, system_text
from canvasagent.training.rewarding import rollout_diagnostics
from canvasagent.evaluation.scoring import HybridScorer

log = logging.getLogger(__name__)


class _OnePolicy:
    """The runner's policy factory for one policy object shared by every task (run in order)."""

    def __init__(self, policy: Any):
        self.policy = policy
        self.name = policy.name

    def for_task(self, task: Task | None = None) -> Any:
        return self.policy


@dataclass
class EvalResult:
    metrics: dict[str, float]
    results: list[TaskResult]  # per task, in task order

    @property
    def scores(self) -> list[dict[str, float]]:
        """Per task (sampled: the mean over its episodes)."""
        return [r.scores for r in self.results]

    def metrics_for(self, indices: list[int]) -> dict[str, float]:
        """The same metrics over a subset of the tasks (e.g. one data source of a mixed set)."""
        return policy_metrics([self.results[i] for i in indices])


def training_scorer(scorer: HybridScorer):
    """Per episode: the scorer's dict (components and `hybrid`) plus the episode's format validity."""

    def score(traj: Trajectory) -> dict[str, float]:
        s = scorer(traj)
        s["format_validity"] = rollout_diagnostics(traj)["format_validity"]
        return s

    return score


def evaluate_model(
    model_dir: str | Path,
    tasks: list[Task],
    scorer: HybridScorer,
    toolbox: Any,
    tool_fns: list,
    out_dir: str | Path,
    max_turns: int = 4,
    max_new_tokens: int = 96,
    family: str = "canvasagent",
    temperature: float = 0.0,
    samples: int = 1,
    seed: int = 0,
    model: Any = None,
    processor: Any = None,
    resume: bool = True,
    image_budget: int | None = None,
) -> EvalResult:
    """Greedy by default; with `temperature > 0`, `samples` episodes per task (scores averaged per
    task). Trajectories and per-task results go under `out_dir`; a rerun resumes there.
    `image_budget`: the training setting (`canvasagent.core.image_budget`), so the policy sees the
    context it was trained on."""
    from canvasagent.evaluation.runner import EvalConfig, EvalRunner
    from canvasagent.core.policies.hf_local import HFGenerationConfig, HFLocalPolicy

    inner = HFLocalPolicy(str(model_dir), HFGenerationConfig(max_new_tokens=max_new_tokens, temperature=temperature),
                          model=model, processor=processor)
    policy = LayoutPolicy(inner, system_text(inner.processor, tool_fns, family))
    cfg = EvalConfig(
        workers=1, max_turns=max_turns, resume=resume, samples=samples if temperature > 0 else 1, seed=seed,
        tools_in_system_prompt=False,
        # As in a GRPO rollout, which TRL ends at the first reply without a tool call.
        end_without_call=True,
        image_budget=image_budget,
        # No early stop on invalid replies: a weak checkpoint's format validity is what we measure.
        guard=GuardConfig(max_consecutive_invalid=0),
    )
    t0 = time.perf_counter()
    results = EvalRunner(_OnePolicy(policy), training_scorer(scorer), out_dir, cfg, toolbox=toolbox).run(tasks)
    metrics = {**policy_metrics(results), "seconds": time.perf_counter() - t0}
    log.info("eval %s: %s", model_dir, {k: round(v, 3) for k, v in metrics.items()})
    return EvalResult(metrics, results)
