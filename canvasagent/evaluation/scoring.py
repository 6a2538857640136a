"""The bridge from evaluation to the reward package: one call per trajectory, a flat dict back.

Evaluation never computes a reward itself; it asks `rewards` (issue 3) for the hybrid reward and
its components under a preset and a judge kind, and reads the keys `overall, align, aes, traj,
rule` (plus any sub-terms, kept for the report).
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from canvasagent.trajectory import Trajectory

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


def make_scorer(judge: str = "offline", preset: str = "paper", judge_config: str | None = None) -> Scorer:
    """The hybrid reward as a scorer, under `preset` (configs/reward/) with the given judge kind."""
    if judge not in JUDGES:
        raise ValueError(f"unknown judge {judge!r}; use one of {', '.join(JUDGES)}")
    try:
        from rewards import hybrid  # type: ignore[attr-defined]
    except ImportError as e:
        raise ScorerUnavailable(
            f"the hybrid reward is not available ({e}); evaluation needs rewards.hybrid from issue 3"
        ) from e
    reward = hybrid.HybridReward.from_preset(preset, judge=judge)

    def score(traj: Trajectory) -> dict[str, float]:
        return normalise_keys(reward.score(traj))

    return score
