"""A model judge (HTTP or local) whose alignment also runs the task's verifiable checks.

For `alignment`: score = checks_weight · checks (`rewards.checks`) + (1 − checks_weight) · model,
with both parts in `details` (`checks_score`, `judge_score`) and strict success (`passed`) from the
checks alone. A task without a verifiable check is scored by the model alone and passes when the
model's score reaches `model_pass_threshold`. If the model fails, the result is the checks'
score flagged as a fallback, so the outage is counted. Other aspects go to the model unchanged.
"""

from __future__ import annotations

from rewards.judges.base import Judge, JudgeResult, TrajectoryView
from toolserver.results import close_if_closable


class ChecksAndModelJudge:
    def __init__(self, model: Judge, checks: Judge, checks_weight: float, model_pass_threshold: float):
        if not 0.0 <= checks_weight <= 1.0:
            raise ValueError(f"judges.checks_weight must be in [0, 1], not {checks_weight}")
        self.model, self.checks = model, checks
        self.checks_weight, self.model_pass_threshold = checks_weight, model_pass_threshold
        self.name = f"{model.name}+checks"

    def fingerprint(self) -> str:
        return f"{self.model.fingerprint()}|{self.checks.fingerprint()}|w={self.checks_weight}|p={self.model_pass_threshold}"

    def judge(self, aspect: str, view: TrajectoryView) -> JudgeResult:
        if aspect != "alignment":
            return self.model.judge(aspect, view)
        m = self.model.judge(aspect, view)
        c = self.checks.judge(aspect, view)
        details: dict[str, float] = {**m.details, **{k: v for k, v in c.details.items() if k != "passed"}}
        details["judge_score"] = m.score
        if c.fallback:  # nothing verifiable: the model's word is all there is
            details["passed"] = float(not m.fallback and m.score >= self.model_pass_threshold)
            return JudgeResult(m.score, m.ok, m.fallback, m.reason, details, judge=self.name)
        details["checks_score"] = c.score
        details["passed"] = c.details.get("passed", 0.0)
        if m.fallback:
            return JudgeResult(c.score, False, True, f"model judge fell back ({m.reason}); checks only", details, judge=self.name)
        w = self.checks_weight
        return JudgeResult(w * c.score + (1 - w) * m.score, True, False, "; ".join(r for r in (c.reason, m.reason) if r),
                           details, judge=self.name)

    def close(self) -> None:
        for j in (self.model, self.checks):
            close_if_closable(j)
