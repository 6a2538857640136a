"""Held-out check of a trained policy: run episodes in the training layout, score them.

Metrics per task set: format validity (share of assistant turns the protocol parser finds no
fault in), the rule score, the hybrid reward and its components (the same scorer GRPO
optimises), and the share of tasks whose final image matches the reference (align >= 0.95).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from canvasagent.episode import EpisodeConfig, run_episode
from canvasagent.tasks import Task
from canvasagent.trajectory import Trajectory
from canvasagent.training.messages import policy_messages, system_text
from canvasagent.training.rewarding import HybridScorer

log = logging.getLogger(__name__)


class LayoutPolicy:
    """Wraps a generation policy so it sees exactly the training layout (system text with the tool block)."""

    def __init__(self, inner: Any, system: str):
        self.inner = inner
        self.system = system
        self.name = getattr(inner, "name", "model")

    def act(self, messages: list[dict[str, Any]], episode: Any) -> str:
        return self.inner.act(policy_messages(messages, self.system), episode)


@dataclass
class EvalResult:
    metrics: dict[str, float]
    trajectories: list[Trajectory]
    scores: list[dict[str, float]]


def _means(scores: list[dict[str, float]]) -> dict[str, float]:
    keys = dict.fromkeys(k for s in scores for k in s)  # sub-terms may appear only for some tasks
    return {k: sum(s[k] for s in scores if k in s) / sum(k in s for s in scores) for k in keys}


def format_validity(trajs: list[Trajectory]) -> float:
    turns = [t for tr in trajs for t in tr.turns]
    return sum(not t.findings for t in turns) / len(turns) if turns else 0.0


def evaluate_model(
    model_dir: str | Path,
    tasks: list[Task],
    scorer: HybridScorer,
    toolbox: Any,
    tool_fns: list,
    max_turns: int = 4,
    max_new_tokens: int = 96,
    family: str = "canvasagent",
    out_dir: Path | None = None,
    temperature: float = 0.0,
    samples: int = 1,
    seed: int = 0,
    model: Any = None,
    processor: Any = None,
) -> EvalResult:
    """Greedy by default; with `temperature > 0`, `samples` episodes per task (scores averaged per task)."""
    import torch

    from canvasagent.policies.hf_local import HFGenerationConfig, HFLocalPolicy

    inner = HFLocalPolicy(str(model_dir), HFGenerationConfig(max_new_tokens=max_new_tokens, temperature=temperature),
                          model=model, processor=processor)
    policy = LayoutPolicy(inner, system_text(inner.processor, tool_fns, family))
    cfg = EpisodeConfig(max_turns=max_turns, family=family, tools_in_system_prompt=False)
    trajs, scores = [], []
    t0 = time.perf_counter()
    k = samples if temperature > 0 else 1
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for i, task in enumerate(tasks):
            per = []
            for j in range(k):
                traj = run_episode(policy, task, toolbox, cfg)
                s = scorer.score(traj)
                s["hybrid"] = scorer.total(s)
                s["format_validity"] = format_validity([traj])
                per.append(s)
                trajs.append(traj)
                if out_dir is not None and j == 0:
                    traj.save(Path(out_dir) / f"{i:03d}_{task.id}")
            scores.append(_means(per))
    n = max(1, len(tasks))
    metrics = {
        **_means(scores),
        "format_validity": format_validity(trajs),  # over all turns (not the mean of per-task shares)
        "success": sum(s.get("align", 0.0) >= 0.95 for s in scores) / n,
        "terminated": sum(t.terminated for t in trajs) / len(trajs) if trajs else 0.0,
        "calls_per_task": sum(len(t.tool_sequence) for t in trajs) / len(trajs) if trajs else 0.0,
        "n_tasks": float(len(tasks)),
        "seconds": time.perf_counter() - t0,
    }
    log.info("eval %s: %s", model_dir, {k: round(v, 3) for k, v in metrics.items()})
    return EvalResult(metrics, trajs, scores)
