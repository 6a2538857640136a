"""The one bridge from a trajectory to the reward package (GRPO, evaluation, pipeline, ablations).

A `HybridScorer` is a callable `trajectory -> dict[str, float]` in the reward vocabulary
(`rewards.hybrid`): `hybrid` is the total (always present), `align`, `aes`, `traj`, `rule` its
components, and `<component>/<term>` their sub-terms. The EASEL scorer (`easel_scorer`) adds
`easel_s` (the final canvas's S) and the rule reward's `format` and `action` terms. `weights`
maps the components GRPO optimises to their weights, so that Σ weight·component is `hybrid` (or
`hybrid` itself carries weight 1 where the total is not a weighted sum).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from canvasagent.core.trajectory import Trajectory
from rewards.config import load_reward_config
from rewards.hybrid import HYBRID, HybridReward
from rewards.rule import score_rule

log = logging.getLogger(__name__)

JUDGES = ("offline", "http", "local")
# The components an EASEL run can weight (`easel.reward_weights` keys): easel_s (final S; semantic
# tasks: their score), format / action (the rule reward's R_format / R_action), rule (R_rule).
EASEL_COMPONENTS = ("easel_s", "format", "action", "rule")


class ScorerUnavailable(RuntimeError):
    """The preset or the judge a scorer needs cannot be had."""


@dataclass
class HybridScorer:
    """Scores a trajectory into named components and their total `hybrid`.

    `weights`: component -> weight of GRPO's reward (one TRL function per key); `source` names the
    scorer in reports; `max_fallback_share` and `on_excess_fallbacks` (drop | abort), from the
    preset's judges config, say what GRPO does when too many of a step's rollouts fell back.
    """

    weights: dict[str, float]
    score: Callable[[Trajectory], dict[str, float]]
    source: str
    max_fallback_share: float = 1.0
    on_excess_fallbacks: str = "drop"
    # A batch of trajectories -> their `score`s, in order, with their judge calls concurrent
    # (the hybrid reward's; bounded by judges.max_workers). None: `score` one after another.
    score_many: Callable[[Sequence[Trajectory]], list[dict[str, float]]] | None = None

    def __call__(self, traj: Trajectory) -> dict[str, float]:
        """The scores of `traj` with `hybrid` (`total` of the components where `score` gives none)."""
        return self.many([traj])[0]

    def many(self, trajs: Sequence[Trajectory]) -> list[dict[str, float]]:
        """`self(t)` for each of `trajs`, in order, equal to scoring them one by one; a GRPO step
        or an evaluation batch waits for its slowest judge call, not for the sum of them."""
        raw = self.score_many(trajs) if self.score_many is not None else [self.score(t) for t in trajs]
        return [s if HYBRID in s else {**s, HYBRID: self.total(s)} for s in raw]

    def total(self, scores: dict[str, float]) -> float:
        """`scores["hybrid"]` when the scorer gave it, else Σ weight·component (missing: 0)."""
        if HYBRID in scores:
            return scores[HYBRID]
        return sum(w * scores.get(k, 0.0) for k, w in self.weights.items())


def numeric(scores: dict[str, Any]) -> dict[str, float]:
    """The numeric entries of a score dict as floats (booleans and non-numbers dropped)."""
    return {k: float(v) for k, v in scores.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def make_scorer(preset: str = "paper", judge: str = "offline", toolbox: Any = None, judge_model: str | None = None,
                judge_url: str | None = None, every_judge: bool = False) -> HybridScorer:
    """The hybrid reward of `preset` (configs/reward/<preset>.yaml) under `judge` (offline | http | local).

    `toolbox` is lent to judges that run tools. `judge_model` is the local judge's checkpoint or
    the HTTP judge's model name, `judge_url` the HTTP judge's base URL; unset, they come from the
    preset (and its environment variables). `every_judge=False` (training) skips judges whose
    weight is 0; True (evaluation reports) scores every component. Raises ValueError for an unknown
    judge kind, `ScorerUnavailable` for a missing preset or a local judge without a checkpoint.
    """
    if judge not in JUDGES:
        raise ValueError(f"unknown judge {judge!r}; use one of {', '.join(JUDGES)}")
    try:
        cfg = load_reward_config(preset)
    except FileNotFoundError as e:
        raise ScorerUnavailable(str(e)) from e
    cfg.judges.kind = judge
    if judge_model:
        cfg.judges.local.model = judge_model
        cfg.judges.http.model = judge_model
    if judge_url:
        cfg.judges.http.base_url = judge_url
    if judge == "local" and not cfg.judges.local.model:
        raise ScorerUnavailable("--judge local needs a checkpoint: pass --judge-model PATH (or set judges.local.model in the preset)")
    reward = HybridReward(cfg, toolbox=toolbox, judge_unweighted=every_judge)
    j = cfg.judges
    return HybridScorer(dict(reward.weights), lambda t: numeric(reward.score(t)), f"rewards:{preset}",
                        j.max_fallback_share, j.on_excess_fallbacks, lambda ts: [numeric(s) for s in reward.score_many(ts)])


def easel_scorer(reward_weights: dict[str, float], preset: str = "paper") -> HybridScorer:
    """An EASEL episode's scorer: `easel_s` (the outcome `EaselEnv` recorded in `traj.meta["easel"]`;
    0 with a warning when there is none) and the rule reward's `format`, `action`, `rule` terms
    under `preset`'s rule config, weighted by `reward_weights` (missing components: 0) into `hybrid`."""
    rule_cfg = load_reward_config(preset).rule
    weights = {k: float(reward_weights.get(k, 0.0)) for k in EASEL_COMPONENTS}

    def score(traj: Trajectory) -> dict[str, float]:
        e = traj.meta.get("easel")
        if e is None:  # never finished through EaselEnv: no canvas to score
            log.warning("trajectory %s has no EASEL outcome; easel_s = 0", traj.task.id)
            e = {}
        rule = score_rule(traj, rule_cfg)
        s = {"easel_s": float(e.get("score", 0.0)), "format": rule.r_format, "action": rule.r_action, "rule": rule.r_rule}
        s[HYBRID] = sum(w * s[k] for k, w in weights.items())
        return s

    return HybridScorer(weights, score, f"easel+rule:{preset}")
