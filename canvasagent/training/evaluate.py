"""Held-out check of a trained checkpoint, through the one evaluation implementation.

`evaluate_checkpoint` runs an HF checkpoint in the training layout (system text with the tool
block) with `canvasagent.evaluation`'s runner (seeded sampling, saved and resumable trajectories)
and its one metrics view (`policy_metrics`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from canvasagent.evaluation.metrics import TaskResult, policy_metrics
from canvasagent.core.policies.guards import GuardConfig
from canvasagent.core.tasks import Task
from canvasagent.core.trajectory import Trajectory
from canvasagent.training.messages import LayoutPolicy, system_text
from canvasagent.training.rewarding import rollout_diagnostics
from canvasagent.evaluation.scoring import HybridScorer

log = logging.getLogger(__name__)


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


def evaluate_checkpoint(
    model_dir: str | Path,
    tasks: list[Task],
    scorer: HybridScorer,
    toolbox: Any,
    tool_fns: list,
    out_dir: str | Path,
    max_turns: int = 4,
    max_new_tokens: int = 96,
    temperature: float = 1.0,
    samples: int = 0,
    seed: int = 0,
    image_budget: int | None = None,
    generation: dict[str, Any] | None = None,
    model: Any = None,
    processor: Any = None,
) -> dict[str, EvalResult]:
    """The one evaluation of a trained checkpoint (pipeline, evidence benchmark, ablation grid): the
    training layout (tool block of `tool_fns`, `image_budget`; a reply without a tool call ends the
    episode, as in a GRPO rollout), greedy under `<out_dir>/greedy` and, with `samples` > 0, that
    many episodes per task at `temperature` under `<out_dir>/sampled` (scores averaged per task);
    tasks in order, torch seeded by `seed`, resumable per task. `generation`: more
    `HFGenerationConfig` fields (dtype, device). Returns {"greedy": …[, "sampled": …]}."""
    from canvasagent.evaluation.runner import EvalConfig, EvalRunner
    from canvasagent.core.policies.hf_local import HFGenerationConfig, HFLocalPolicy

    out: dict[str, EvalResult] = {}
    for mode, temp, n in (("greedy", 0.0, 1), ("sampled", temperature, samples)):
        if n <= 0:
            continue
        inner = HFLocalPolicy(str(model_dir), HFGenerationConfig(max_new_tokens=max_new_tokens, temperature=temp, **(generation or {})),
                              model=model, processor=processor)
        model, processor = inner.model, inner.processor  # loaded once for both modes
        policy = LayoutPolicy(inner, system_text(inner.processor, tool_fns, "canvasagent"))
        cfg = EvalConfig(workers=1, max_turns=max_turns, samples=n, seed=seed, tools_in_system_prompt=False,
                         end_without_call=True, image_budget=image_budget,
                         # No early stop on invalid replies: a weak checkpoint's format validity is what we measure.
                         guard=GuardConfig(max_consecutive_invalid=0))
        t0 = time.perf_counter()
        one = SimpleNamespace(name=inner.name, for_task=lambda task=None, p=policy: p)  # one policy for every task, run in order
        results = EvalRunner(one, training_scorer(scorer), Path(out_dir) / mode, cfg, toolbox=toolbox).run(tasks)
        out[mode] = EvalResult({**policy_metrics(results), "seconds": time.perf_counter() - t0}, results)
        log.info("eval %s (%s): %s", model_dir, mode, {k: round(v, 3) for k, v in out[mode].metrics.items()})
    return out
