"""Judges for the outcome and trajectory components: one interface, three kinds.

`make_judge(cfg)` builds the configured judge wrapped in the content-hash cache and the bounded
pool (`CachedJudge`). A model judge (http, local) scores alignment together with the task's
verifiable checks (`with_checks.py`). See `base.py` for the interface.
"""

from __future__ import annotations

from typing import Any

from rewards.config import JudgeConfig
from rewards.judges.base import ASPECTS, COMPONENT_OF, Judge, JudgeResult, TrajectoryView, parse_score
from rewards.judges.cache import CachedJudge

JUDGE_KINDS = ("offline", "http", "local")


def make_judge(cfg: JudgeConfig | None = None, toolbox: Any | None = None) -> CachedJudge:
    cfg = cfg or JudgeConfig()
    if cfg.kind not in JUDGE_KINDS:
        raise ValueError(f"unknown judge kind {cfg.kind!r}; choose one of {', '.join(JUDGE_KINDS)}")
    from rewards.judges.offline import OfflineJudge

    inner: Judge = OfflineJudge(cfg.offline, toolbox=toolbox)
    if cfg.kind != "offline":  # a model judge, whose alignment also runs the offline checks
        if cfg.kind == "http":
            from rewards.judges.http import HttpJudge as ModelJudge
        else:
            from rewards.judges.local_vlm import LocalVLMJudge as ModelJudge
        from rewards.judges.with_checks import ChecksAndModelJudge

        model = ModelJudge(getattr(cfg, cfg.kind), fallback_score=cfg.fallback_score)
        inner = ChecksAndModelJudge(model, inner, cfg.checks_weight, cfg.model_pass_threshold)
    return CachedJudge(inner, cfg.fallback_score, cfg.cache_size, cfg.max_workers)


__all__ = [
    "ASPECTS",
    "COMPONENT_OF",
    "CachedJudge",
    "JUDGE_KINDS",
    "Judge",
    "JudgeResult",
    "TrajectoryView",
    "make_judge",
    "parse_score",
]
