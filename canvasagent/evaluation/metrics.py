"""The paper's evaluation metrics, aggregated from per-task results.

Per task: the hybrid reward `hybrid` and its four components `align`, `aes`, `traj`, `rule` (the
reward vocabulary of `rewards.hybrid`), and the trajectory length (tool calls made). Over a split: their means
(paper Tables 4-5), plus the success rate, stop reasons, reply validity and per-tool call
statistics. Everything here reads saved results, so a report can be rebuilt without rerunning.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

from canvasagent.core.trajectory import Trajectory
from rewards.hybrid import canonical_scores

# (key in a task's scores, column header) in the paper's column order.
PAPER_METRICS: tuple[tuple[str, str], ...] = (
    ("hybrid", "Hybrid"),
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
    scores: dict[str, float] = field(default_factory=dict)  # flat: hybrid, align, …, sub-terms
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
    episodes: int = 1  # > 1 with EvalConfig.samples: counts below are sums over the episodes
    terminated: int = 0  # episodes the policy ended itself

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TaskResult":
        """A saved result; scores saved under a legacy total name read as `hybrid` (`canonical_scores`)."""
        d = dict(d)
        d["scores"] = canonical_scores(d.get("scores") or {})
        d["tool_calls"] = [ToolCallRecord(**c) for c in d.get("tool_calls", [])]
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


def strictly_succeeded(scores: dict[str, float]) -> bool:
    """Every verifiable check of the task passed its threshold (`align/passed`, from the
    alignment judge), and alignment was measured, not a fallback."""
    return scores.get("align/passed", 0.0) >= 0.5 and scores.get("align/fallback", 0.0) < 0.5


def task_result(traj: Trajectory, scores: dict[str, float], success_threshold: float, seconds: float = 0.0) -> TaskResult:
    """Summarise a scored trajectory. Success is strict: the policy ended the episode itself and
    every verifiable check of the task passed (`strictly_succeeded`). The mean alignment is
    partial credit and is reported as such, never as success; `success_threshold` applies only
    to scores that carry no per-check verdict (older results)."""
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
        success=bool(traj.terminated and measured and (
            strictly_succeeded(scores) if "align/passed" in scores else not math.isnan(align) and align >= success_threshold)),
        align_measured=measured,
        error=traj.meta.get("error"),
        labels=dict(traj.task.labels),
        tool_calls=calls,
        seconds=seconds,
        terminated=int(traj.terminated),
    )


def merge_samples(results: list[TaskResult]) -> TaskResult:
    """Several episodes of one task as one result: scores are their means (a key counts over the
    episodes that have it), counts and tool calls are summed, success means most episodes succeeded."""
    first = results[0]
    keys = dict.fromkeys(k for r in results for k in r.scores)
    return TaskResult(
        task_id=first.task_id,
        scores={k: sum(r.scores[k] for r in results if k in r.scores) / sum(k in r.scores for r in results) for k in keys},
        stop_reason=Counter(r.stop_reason for r in results).most_common(1)[0][0],
        n_turns=sum(r.n_turns for r in results),
        n_calls=sum(r.n_calls for r in results),
        valid_replies=sum(r.valid_replies for r in results),
        success=2 * sum(r.success for r in results) > len(results),
        align_measured=all(r.align_measured for r in results),
        error=next((r.error for r in results if r.error), None),
        labels=dict(first.labels),
        tool_calls=[c for r in results for c in r.tool_calls],
        seconds=sum(r.seconds for r in results),
        episodes=sum(r.episodes for r in results),
        terminated=sum(r.terminated for r in results),
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
    by_label: dict[str, dict[str, float]]  # "axis=value" -> {"hybrid": mean, "n": tasks}
    n_errors: int
    partial_credit: float = float("nan")  # mean share of verifiable checks passed

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
            by_label[f"{axis}={value}"].append(r.scores.get("hybrid", float("nan")))
    return Summary(
        n_tasks=len(results),
        metrics=metrics,
        success_rate=_mean(float(r.success) for r in results),
        align_measured_rate=_mean(float(r.align_measured) for r in results),
        valid_reply_rate=(sum(r.valid_replies for r in results) / turns) if turns else float("nan"),
        stop_reasons=dict(Counter(r.stop_reason for r in results)),
        tools=dict(sorted(tools.items())),
        by_label={k: {"hybrid": _mean(v), "n": float(len(v))} for k, v in sorted(by_label.items())},
        n_errors=sum(1 for r in results if r.error),
        partial_credit=_mean(r.scores.get("align/pass_rate", float("nan")) for r in results),
    )


def policy_metrics(results: list[TaskResult], match_threshold: float = 0.95) -> dict[str, float]:
    """The training-side view of a split (pipeline, evidence benchmark): means of every per-task
    score (a key counts over the tasks that have it), `format_validity` = share of all assistant
    turns without a protocol finding (pooled, not a mean of per-task shares), `success` = share of
    tasks whose episodes strictly succeeded (every verifiable check passed, mean over samples
    >= 0.5; `match_threshold` on align for results without per-check verdicts, whether or not the
    policy ended the episode), `partial` = mean share of checks passed, `terminated` = share of episodes the policy ended, `calls_per_task` = tool
    calls per episode."""
    keys = dict.fromkeys(k for r in results for k in r.scores)
    means = {k: sum(r.scores[k] for r in results if k in r.scores) / sum(k in r.scores for r in results) for k in keys}
    turns = sum(r.n_turns for r in results)
    episodes = sum(r.episodes for r in results)
    return {
        **means,
        "format_validity": sum(r.valid_replies for r in results) / turns if turns else 0.0,
        "success": sum(
            r.scores.get("align/passed", 0.0) >= 0.5 if "align/passed" in r.scores else r.scores.get("align", 0.0) >= match_threshold
            for r in results) / max(1, len(results)),
        "partial": sum(r.scores.get("align/pass_rate", 0.0) for r in results) / max(1, len(results)),
        "terminated": sum(r.terminated for r in results) / episodes if episodes else 0.0,
        "calls_per_task": sum(len(r.tool_calls) for r in results) / episodes if episodes else 0.0,
        "n_tasks": float(len(results)),
    }
