"""Hybrid reward -> TRL reward functions, one per component, weighted by the preset.

GRPO's total is Σ weight_k · component_k, which is exactly the hybrid reward when the weights
are the preset's; giving each component its own function makes TRL log every one of them
(`rewards/<name>/mean`). The trajectory is scored once per rollout and cached on its env.

Scoring uses the `rewards` package (`rewards.hybrid.HybridReward`, presets in configs/reward/).
Our own TRL functions (rather than `rewards.hybrid.reward_functions`) are used because the
trajectory must first be finished with the reply texts only the completion holds
(`env.trajectory_of`). If `rewards` cannot be imported, a small interim offline scorer with the
paper's weights stands in, so training never depends on another package being complete.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Callable

from PIL import Image, ImageChops, ImageStat

from canvasagent.trajectory import Trajectory
from canvasagent.training.env import CanvasEnv, trajectory_of

log = logging.getLogger(__name__)

Scorer = Callable[[Trajectory], dict[str, float]]

#: The paper's hybrid weights (Eq. 1), used when the `rewards` presets are not available.
PAPER_WEIGHTS: dict[str, float] = {"align": 0.3, "aes": 0.1, "traj": 0.2, "rule": 0.4}


# -- interim offline scorer ----------------------------------------------------------------------


def _format_score(traj: Trajectory) -> float:
    turns = [t for t in traj.turns if t.reply]
    if not turns:
        return 0.0
    return sum(1.0 - len({f.check for f in t.findings}) / 5.0 for t in turns) / len(turns)


def _action_score(traj: Trajectory) -> float:
    qs = []
    for t in traj.turns:
        if t.call is None:
            continue
        c = t.check or {}
        ref = 1.0 if not c.get("refs_total") else c.get("refs_found", 0) / c["refs_total"]
        qs.append(
            0.25 * bool(c.get("name_ok")) + 0.25 * bool(c.get("schema_ok")) + 0.2 * ref
            + 0.2 * bool(c.get("spec_ok")) + 0.1 * (t.status == "ok")
        )
    return sum(qs) / len(qs) if qs else 0.0


def _rule_score(traj: Trajectory) -> float:
    try:
        from rewards.rule import score_rule

        return float(score_rule(traj).r_rule)
    except ImportError:
        errors = sum(t.status in ("error", "parse_error", "no_call") for t in traj.turns)
        return max(0.0, 0.4 * _format_score(traj) + 0.6 * _action_score(traj) - min(0.5, 0.1 * errors))


def _similarity(a: Image.Image, b: Image.Image) -> float:
    """1 - mean abs pixel difference at 32x32, times an aspect-ratio agreement factor."""
    ra, rb = a.width / a.height, b.width / b.height
    shape = min(ra, rb) / max(ra, rb)
    x, y = (im.convert("RGB").resize((32, 32), Image.Resampling.BILINEAR) for im in (a, b))
    diff = sum(ImageStat.Stat(ImageChops.difference(x, y)).mean) / (3 * 255)
    return max(0.0, 1.0 - 2.0 * diff) * shape


def interim_scores(traj: Trajectory, toolbox: Any) -> dict[str, float]:
    final = traj.final_asset()
    refs = traj.task.meta.get("reference_images") or []
    ref = refs[0] if refs and isinstance(refs[0], Image.Image) else None
    if final is None or ref is None:
        align = 0.0
    else:
        align = _similarity(final.image, ref)
    if final is None:
        aes = 0.0
    else:  # a no-reference proxy: contrast of the final image (a blank output scores 0)
        aes = min(1.0, ImageStat.Stat(final.image.convert("L")).stddev[0] / 64.0)
    expected = list(traj.task.expected_tools)
    used = traj.tool_sequence
    if expected:
        hit = sum(min(used.count(t), expected.count(t)) for t in set(expected))
        prec = hit / len(used) if used else 0.0
        rec = hit / len(expected)
        traj_s = 0.0 if hit == 0 else 2 * prec * rec / (prec + rec)
        traj_s *= 1.0 if traj.terminated else 0.5
    else:
        traj_s = 1.0 if traj.terminated else 0.0
    return {"align": align, "aes": aes, "traj": traj_s, "rule": _rule_score(traj)}


# -- scorer selection ----------------------------------------------------------------------------


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
    """The hybrid reward for a preset: from `rewards` when available, else the interim scorer."""
    try:
        from rewards import hybrid as rh  # type: ignore[attr-defined]

        # judge_unweighted=False: training skips judges whose weight is 0 (an ablation preset).
        reward = rh.HybridReward.from_preset(preset, judge=judge, toolbox=toolbox, judge_unweighted=False)
        weights = dict(reward.weights)
        return HybridScorer(weights, lambda t: {k: float(v) for k, v in reward.score(t).items()}, f"rewards:{preset}")
    except (ImportError, AttributeError) as e:
        log.info("rewards.hybrid unavailable (%s): using the interim offline scorer with the paper weights", e)
    if toolbox is None:
        from canvasagent.config import make_toolbox

        toolbox = make_toolbox("offline")
    weights = dict(PAPER_WEIGHTS)
    if preset == "no-outcome":
        weights.update(align=0.0, aes=0.0)
    elif preset == "no-process":
        weights.update(traj=0.0, rule=0.0)
    return HybridScorer(weights, lambda t: interim_scores(t, toolbox), "interim")


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
