"""Hybrid reward -> TRL reward functions, one per component, weighted by the preset.

GRPO's total is Σ weight_k · component_k, which is exactly the hybrid reward when the weights
are the preset's; giving each component its own function makes TRL log every one of them
(`rewards/<name>/mean`). The trajectory is scored once per rollout and cached on its env.

Scoring is `rewards.hybrid.HybridReward` (presets in configs/reward/). We wrap it in our own TRL
functions (rather than `rewards.hybrid.reward_functions`) because each trajectory must first be
finished with the reply texts that only the completion holds (`env.trajectory_of`).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from canvasagent.core.tasks import Task
from canvasagent.training.config import EASEL_COMPONENTS
from canvasagent.training.env import CanvasEnv, trajectory_of
from canvasagent.core.trajectory import Trajectory

log = logging.getLogger(__name__)

Scorer = Callable[[Trajectory], dict[str, float]]


@dataclass
class HybridScorer:
    """Scores a trajectory into named components; `weights` turns them into the hybrid total.

    `max_fallback_share` and `on_excess_fallbacks` (drop | abort) come from the preset's judges
    config: what GRPO does when too many of a step's rollouts were scored by a judge fallback.
    """

    weights: dict[str, float]
    score: Scorer
    source: str
    max_fallback_share: float = 1.0
    on_excess_fallbacks: str = "drop"

    def total(self, scores: dict[str, float]) -> float:
        if "total" in scores:  # the rewards package computes it (public-code mode is not a weighted sum)
            return scores["total"]
        return sum(w * scores.get(k, 0.0) for k, w in self.weights.items())


def make_scorer(preset: str = "paper", judge: str = "offline", toolbox: Any = None) -> HybridScorer:
    """The hybrid reward of a preset (configs/reward/<preset>.yaml) with the given judge kind.

    An EASEL env's toolbox (data.format: easel) selects the EASEL scorer instead: the final
    canvas's S plus the preset's rule terms, weighted by `easel.reward_weights`.
    """
    from canvasagent.training.easel_env import is_easel_toolbox

    if is_easel_toolbox(toolbox):
        return easel_scorer(toolbox.reward_weights, preset)
    from rewards.hybrid import HybridReward

    # judge_unweighted=False: training skips judges whose weight is 0 (an ablation preset).
    reward = HybridReward.from_preset(preset, judge=judge, toolbox=toolbox, judge_unweighted=False)
    j = reward.cfg.judges
    return HybridScorer(dict(reward.weights), lambda t: {k: float(v) for k, v in reward.score(t).items()}, f"rewards:{preset}",
                        j.max_fallback_share, j.on_excess_fallbacks)


def easel_scorer(reward_weights: dict[str, float], preset: str = "paper"):
    """`easel_s` (outcome) + the rule reward's format / action / total terms, as a HybridScorer."""
    from rewards.config import load_reward_config
    from rewards.rule import score_rule

    rule_cfg = load_reward_config(preset).rule

    def score(traj: Any) -> dict[str, float]:
        e = traj.meta.get("easel")
        if e is None:  # never finished through EaselEnv: no canvas to score
            log.warning("trajectory %s has no EASEL outcome; easel_s = 0", traj.task.id)
            e = {}
        rule = score_rule(traj, rule_cfg)
        return {"easel_s": float(e.get("score", 0.0)), "format": rule.r_format, "action": rule.r_action, "rule": rule.r_rule}

    weights = {k: float(reward_weights.get(k, 0.0)) for k in EASEL_COMPONENTS}
    return HybridScorer(weights, score, f"easel+rule:{preset}")


def source_of(task: Task) -> str:
    """The data source a task came from: `meta["source"]` when the loader set it, else what its
    meta shows (an EASEL spec: `easel`; a CanvasCraft chain: `canvascraft`), else its family."""
    meta = task.meta or {}
    if meta.get("source"):
        return str(meta["source"])
    if "easel" in meta:
        return "easel"
    if "chain" in meta:
        return "canvascraft"
    return task.family or "unknown"


def rollout_diagnostics(traj: Trajectory) -> dict[str, float]:
    """Per rollout: `format_validity` (share of turns without a format finding; 0 with no turn),
    `tool_calls` (calls recorded in the trajectory) and `no_tool` (1.0 when there were none)."""
    turns = traj.turns
    calls = sum(t.call is not None for t in turns)
    return {
        "format_validity": sum(not t.findings for t in turns) / len(turns) if turns else 0.0,
        "tool_calls": float(calls),
        "no_tool": float(calls == 0),
    }


class JudgeOutage(RuntimeError):
    """Too many rollouts of a GRPO step were scored by a judge fallback (on_excess_fallbacks: abort)."""


# -- TRL reward functions ------------------------------------------------------------------------


class TRLRewards:
    """Per-component TRL reward functions over env trajectories, plus a per-rollout hook.

    Besides one function per weighted component, `functions()` ends with `judge_fallbacks`
    (weight 0, logged only): 1 for a rollout some judge could not score. Every fallback is
    warned about with its count. Past `scorer.max_fallback_share` of a batch, `abort` raises
    `JudgeOutage`, and `drop` gives each such rollout the mean of its group's judged rollouts
    (groups are `group_size` consecutive completions, as TRL orders them), so its advantage is 0
    and the fallback's constant score cannot flatten the others'.

    The other logged-only functions (weight 0, so TRL logs `rewards/<name>/mean` and `/std` per
    step without them entering the reward) are diagnostics of the rollout itself:
    `format_validity` (share of its turns without a format finding), `tool_calls` (calls recorded
    in its trajectory, i.e. what the reward saw), `no_tool` (1 when it called no tool), and for
    each name in `sources` one `<value>/<source>` function per value in `PER_SOURCE` (the hybrid
    total, format validity, the no-tool flag): the value for rollouts of that source
    (`source_of`) and None for the others, which TRL turns into NaN and leaves out of the mean.
    """

    LOGGED = ("judge_fallbacks", "format_validity", "tool_calls", "no_tool")
    PER_SOURCE = ("hybrid", "format_validity", "no_tool")

    def __init__(self, scorer: HybridScorer, on_scored: Callable[[int, list[Trajectory], list[dict]], None] | None = None,
                 group_size: int = 1, sources: Iterable[str] = ()):
        self.scorer = scorer
        self.on_scored = on_scored
        self.names = [k for k in scorer.weights]
        self.group_size = max(1, int(group_size))
        self.sources = tuple(dict.fromkeys(sources))

    @staticmethod
    def sources_in(task_json: Iterable[str | dict]) -> tuple[str, ...]:
        """The sorted distinct `source_of` of a GRPO data set's `task` column (JSON or dicts)."""
        found = set()
        for d in task_json:
            d = json.loads(d) if isinstance(d, str) else d
            found.add(source_of(Task.from_dict(d)))
        return tuple(sorted(found))

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
                s.update(rollout_diagnostics(traj))
                env.scores = s
                fresh.append(traj)
            out.append(env.scores)
        step = getattr(trainer_state, "global_step", 0) if trainer_state is not None else 0
        if fresh:
            self._guard_fallbacks(out, step)
        if fresh and self.on_scored is not None:
            self.on_scored(step, [trajectory_of(e, c) for c, e in zip(completions, environments)], out)
        return out

    def _guard_fallbacks(self, scores: list[dict], step: int) -> None:
        bad = [i for i, s in enumerate(scores) if s.get("fallbacks", 0.0) > 0 and not s.get("dropped")]
        for i, s in enumerate(scores):
            s.setdefault("judge_fallbacks", float(i in bad))
        if not bad:
            return
        share = len(bad) / len(scores)
        log.warning("GRPO step %d: %d of %d rollouts were scored by a judge fallback (%.0f%%; limit %.0f%%)",
                    step, len(bad), len(scores), 100 * share, 100 * self.scorer.max_fallback_share)
        if share <= self.scorer.max_fallback_share:
            return
        if self.scorer.on_excess_fallbacks == "abort":
            raise JudgeOutage(f"{len(bad)} of {len(scores)} rollouts at step {step} were scored by a judge fallback "
                              f"(more than judges.max_fallback_share = {self.scorer.max_fallback_share}); is the judge up?")
        gs = self.group_size
        for g0 in range(0, len(scores), gs):
            group = range(g0, min(len(scores), g0 + gs))
            judged = [j for j in group if j not in bad]
            for i in (i for i in group if i in bad):
                for k in (*self.names, "total"):
                    if k in scores[i]:
                        scores[i][k] = sum(scores[j].get(k, 0.0) for j in judged) / len(judged) if judged else 0.0
                scores[i]["hybrid"] = self.scorer.total(scores[i])
                scores[i]["dropped"] = 1.0
        log.warning("GRPO step %d: dropped %d fallback rollouts from the advantage", step, len(bad))

    def functions(self) -> list[Callable]:
        fns = []
        for name in self.names:

            def fn(completions, environments, trainer_state=None, _name=name, **kwargs):
                return [s[_name] for s in self._scores(completions, environments, trainer_state)]

            fn.__name__ = name  # TRL logs rewards/<__name__>/mean
            fns.append(fn)
        for name in self.LOGGED:

            def logged(completions, environments, trainer_state=None, _name=name, **kwargs):
                return [s.get(_name, 0.0) for s in self._scores(completions, environments, trainer_state)]

            logged.__name__ = name
            fns.append(logged)
        for source in self.sources:
            for name in self.PER_SOURCE:

                def per_source(completions, environments, trainer_state=None, _source=source, _name=name, **kwargs):
                    scores = self._scores(completions, environments, trainer_state)
                    return [s[_name] if source_of(trajectory_of(e, c).task) == _source else None
                            for s, c, e in zip(scores, completions, environments)]

                per_source.__name__ = f"{name}/{source}"
                fns.append(per_source)
        return fns

    def weights(self) -> list[float]:
        n_logged = len(self.LOGGED) + len(self.PER_SOURCE) * len(self.sources)
        return [self.scorer.weights[n] for n in self.names] + [0.0] * n_logged
