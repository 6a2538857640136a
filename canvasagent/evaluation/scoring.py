"""The bridge from evaluation to the reward package: one call per trajectory, a flat dict back.

Evaluation never computes a reward itself; it asks `rewards` for the hybrid reward and
its components under a preset and a judge kind, and reads the keys `overall, align, aes, traj,
rule` (plus any sub-terms, kept for the report).
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from canvasagent.core.trajectory import Trajectory

log = logging.getLogger(__name__)

Scorer = Callable[[Trajectory], dict[str, float]]
JUDGES = ("offline", "http", "local")

# Names the hybrid reward may use for its components, mapped to the paper's column keys.
_ALIASES = {
    "total": "overall",
    "reward": "overall",
    "hybrid": "overall",
    "R": "overall",
    "alignment": "align",
    "R_align": "align",
    "aesthetic": "aes",
    "aesthetics": "aes",
    "R_aes": "aes",
    "trajectory": "traj",
    "R_traj": "traj",
    "rule_based": "rule",
    "R_rule": "rule",
}


class ScorerUnavailable(RuntimeError):
    pass


def normalise_keys(scores: dict[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for k, v in scores.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        out[k] = float(v)
        key = _ALIASES.get(k)
        if key and key not in scores:
            out[key] = float(v)
    return out


def make_scorer(judge: str = "offline", preset: str = "paper", judge_model: str | None = None, judge_url: str | None = None) -> Scorer:
    """The hybrid reward as a scorer, under `preset` (configs/reward/) with the given judge kind.

    `judge_model` is the local judge's checkpoint or the HTTP judge's model name; `judge_url` the
    HTTP judge's base URL. Unset, they come from the preset (and its environment variables).
    """
    if judge not in JUDGES:
        raise ValueError(f"unknown judge {judge!r}; use one of {', '.join(JUDGES)}")
    try:
        from rewards.config import load_reward_config
        from rewards.hybrid import HybridReward
    except ImportError as e:
        raise ScorerUnavailable(f"the hybrid reward is not available ({e}); evaluation needs rewards.hybrid") from e
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
    reward = HybridReward(cfg)

    def score(traj: Trajectory) -> dict[str, float]:
        return normalise_keys(reward.score(traj))

    return score
