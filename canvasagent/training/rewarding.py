"""Hybrid reward -> TRL reward functions, one per component, weighted by the preset.

GRPO's total is Σ weight_k · component_k, which is exactly the hybrid reward when the weights
are the preset's; giving each component its own function makes TRL log every one of them
(`rewards/<name>/mean`). The trajectory is scored once per rollout and cached on its env.

Scoring is `rewards.hybrid.HybridReward` (presets in configs/reward/). We wrap it in our own TRL
functions (rather than `rewards.hybrid.reward_functions`) because each trajectory must first be
finished with the reply texts that only the completion holds (`env.trajectory_of`).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Callable

from canvasagent.trajectory import Trajectory
from canvasagent.training.env import CanvasEnv, trajectory_of

log = logging.getLogger(__name__)

Scorer = Callable[[Trajectory], dict[str, float]]


@dataclass
class HybridScorer:
    """Scores a trajectory into named components; `weights` turns them into the hybrid total."""

    weights: dict[str, float]
    score: Scorer
    source: str

    def total(self, scores: dict[str, float]) -> float:
        if "total" in scores:  # the rewards package computes it (public-code mode is not a weighted sum)
            return scores["total"]
        return sum(w * scores.get(k, 0.0) for k, w in self.weights.items())


def make_scorer(preset: str = "paper", judge: str = "offline", toolbox: Any = None) -> HybridScorer:
    """The hybrid reward of a preset (configs/reward/<preset>.yaml) with the given judge kind.

    An EASEL env's toolbox (data.format: easel) selects the EASEL scorer instead: the final
    canvas's S plus the preset's rule terms, weighted by `easel.reward_weights`.
    """
    from canvasagent.training.easel_env import easel_scorer, is_easel_toolbox

    if is_easel_toolbox(toolbox):
        return easel_scorer(toolbox.reward_weights, preset)
    from rewards.hybrid import HybridReward

    # judge_unweighted=False: training skips judges whose weight is 0 (an ablation preset).
    reward = HybridReward.from_preset(preset, judge=judge, toolbox=toolbox, judge_unweighted=False)
    return HybridScorer(dict(reward.weights), lambda t: {k: float(v) for k, v in reward.score(t).items()}, f"rewards:{preset}")


# -- TRL reward functions ------------------------------------------------------------------------


class TRLRewards:
    """Per-component TRL reward functions over env trajectories, plus a per-rollout hook."""

    def __init__(self, scorer: HybridScorer, on_scored: Callable[[int, list[Trajectory], list[dict]], None] | None = None):
        self.scorer = scorer
        self.on_scored = on_scored
        self.names = [k for k in scorer.weights]

    def _scores(self, completions: list, environments: list[CanvasEnv], trainer_state: Any = None) -> list[dict]:
        fresh: list[Trajectory] = []
        out = []
        for comp, env in zip(completions, environments):
            if env.scores is None:
                traj = trajectory_of(env, comp)
                try:
                    s = self.scorer.score(traj)
                except Exception:  # a scorer bug must not kill training: score 0 and say so
                    log.exception("reward scoring failed for %s", traj.task.id)
                    s = {k: 0.0 for k in self.names}
                s = {k: (float(v) if v is not None and math.isfinite(float(v)) else 0.0) for k, v in s.items()}
                s["hybrid"] = self.scorer.total(s)
                env.scores = s
                fresh.append(traj)
            out.append(env.scores)
        if fresh and self.on_scored is not None:
            step = getattr(trainer_state, "global_step", 0) if trainer_state is not None else 0
            self.on_scored(step, [trajectory_of(e, c) for c, e in zip(completions, environments)], out)
        return out

    def functions(self) -> list[Callable]:
        fns = []
        for name in self.names:

            def fn(completions, environments, trainer_state=None, _name=name, **kwargs):
                return [s[_name] for s in self._scores(completions, environments, trainer_state)]

            fn.__name__ = name  # TRL logs rewards/<__name__>/mean
            fns.append(fn)
        return fns

    def weights(self) -> list[float]:
        return [self.scorer.weights[n] for n in self.names]
