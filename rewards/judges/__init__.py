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
    inner: Judge
    if cfg.kind == "offline":
        from rewards.judges.offline import OfflineJudge

        inner = OfflineJudge(cfg.offline, toolbox=toolbox)
    elif cfg.kind == "http":
        from rewards.judges.http import HttpJudge

        inner = HttpJudge(cfg.http, fallback_score=cfg.fallback_score)
    elif cfg.kind == "local":
        from rewards.judges.local_vlm import LocalVLMJudge

        inner = LocalVLMJudge(cfg.local, fallback_score=cfg.fallback_score)
    else:
        raise ValueError(f"unknown judge kind {cfg.kind!r}; choose one of {', '.join(JUDGE_KINDS)}")
    if cfg.kind != "offline":
        from rewards.judges.offline import OfflineJudge
        from rewards.judges.with_checks import ChecksAndModelJudge

        inner = ChecksAndModelJudge(inner, OfflineJudge(cfg.offline, toolbox=toolbox), cfg.checks_weight, cfg.model_pass_threshold)
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
