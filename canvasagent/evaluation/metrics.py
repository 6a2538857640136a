"""The paper's evaluation metrics, aggregated from per-task results.

Per task: the hybrid reward's overall score and its four components (alignment, aesthetic,
trajectory, rule-based), and the trajectory length (tool calls made). Over a split: their means
(paper Tables 4-5), plus the success rate, stop reasons, reply validity and per-tool call
statistics. Everything here reads saved results, so a report can be rebuilt without rerunning.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

from canvasagent.trajectory import Trajectory

# (key in a task's scores, column header) in the paper's column order.
PAPER_METRICS: tuple[tuple[str, str], ...] = (
    ("overall", "Overall"),
    ("align", "Align."),
    ("aes", "Aes."),
    ("traj", "Traj."),
    ("rule", "Rule"),
    ("calls", "Calls"),
)
SCORE_KEYS = tuple(k for k, _ in PAPER_METRICS if k != "calls")


@dataclass
class ToolCallRecord:
    tool: str
    ok: bool
    error_code: str | None
    seconds: float


@dataclass
class TaskResult:
    """One evaluated task; saved as `result.json` next to its trajectory."""

    task_id: str
    scores: dict[str, float] = field(default_factory=dict)  # flat: overall, align, …, sub-terms
    stop_reason: str = ""
    n_turns: int = 0
    n_calls: int = 0
    valid_replies: int = 0  # turns whose reply had no format finding
    success: bool = False
    align_measured: bool = True  # False when the alignment score is a judge fallback
    error: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    tool_calls: list[ToolCallRecord] = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TaskResult":
        d = dict(d)
        d["tool_calls"] = [ToolCallRecord(**c) for c in d.get("tool_calls", [])]
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


def task_result(traj: Trajectory, scores: dict[str, float], success_threshold: float, seconds: float = 0.0) -> TaskResult:
    """Summarise a scored trajectory. Success: the policy ended the episode itself and the
    alignment judge measured the instruction as met (align >= threshold). A fallback alignment
    (no verifiable check, judge unreachable) is not evidence of success."""
    calls = [
        ToolCallRecord(t.call.name, t.status == "ok", t.error_code, t.tool_s)
        for t in traj.turns
        if t.call is not None
    ]
    align = scores.get("align", float("nan"))
    measured = scores.get("align/fallback", 0.0) < 0.5
    return TaskResult(
        task_id=traj.task.id,
        scores=dict(scores),
        stop_reason=traj.stop_reason,
        n_turns=len(traj.turns),
        n_calls=len(traj.calls),
        valid_replies=sum(1 for t in traj.turns if not t.findings),
        success=bool(traj.terminated and measured and not math.isnan(align) and align >= success_threshold),
        align_measured=measured,
        error=traj.meta.get("error"),
        labels=dict(traj.task.labels),
        tool_calls=calls,
        seconds=seconds,
    )


def _mean(xs: Iterable[float]) -> float:
    vals = [x for x in xs if x is not None and not math.isnan(x)]
    return sum(vals) / len(vals) if vals else float("nan")


@dataclass
class ToolStats:
    calls: int = 0
    ok: int = 0
    mean_s: float = 0.0
    errors: dict[str, int] = field(default_factory=dict)

    @property
    def success_rate(self) -> float:
        return self.ok / self.calls if self.calls else float("nan")


@dataclass
class Summary:
    n_tasks: int
    metrics: dict[str, float]  # PAPER_METRICS keys
    success_rate: float
    align_measured_rate: float
    valid_reply_rate: float
    stop_reasons: dict[str, int]
    tools: dict[str, ToolStats]
    by_label: dict[str, dict[str, float]]  # "axis=value" -> mean overall
    n_errors: int

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for name, st in self.tools.items():
            d["tools"][name]["success_rate"] = st.success_rate
        return d


def summarize(results: list[TaskResult]) -> Summary:
    metrics = {k: _mean(r.scores.get(k, float("nan")) for r in results) for k in SCORE_KEYS}
    metrics["calls"] = _mean(float(r.n_calls) for r in results)
    turns = sum(r.n_turns for r in results)
    tools: dict[str, ToolStats] = {}
    secs: dict[str, list[float]] = defaultdict(list)
    for r in results:
        for c in r.tool_calls:
            st = tools.setdefault(c.tool, ToolStats())
            st.calls += 1
            st.ok += int(c.ok)
            secs[c.tool].append(c.seconds)
            if not c.ok:
                code = c.error_code or "error"
                st.errors[code] = st.errors.get(code, 0) + 1
    for name, st in tools.items():
        st.mean_s = _mean(secs[name])
    by_label: dict[str, list[float]] = defaultdict(list)
    for r in results:
        for axis, value in r.labels.items():
            by_label[f"{axis}={value}"].append(r.scores.get("overall", float("nan")))
    return Summary(
        n_tasks=len(results),
        metrics=metrics,
        success_rate=_mean(float(r.success) for r in results),
        align_measured_rate=_mean(float(r.align_measured) for r in results),
        valid_reply_rate=(sum(r.valid_replies for r in results) / turns) if turns else float("nan"),
        stop_reasons=dict(Counter(r.stop_reason for r in results)),
        tools=dict(sorted(tools.items())),
        by_label={k: {"overall": _mean(v), "n": float(len(v))} for k, v in sorted(by_label.items())},
        n_errors=sum(1 for r in results if r.error),
    )
