"""The paper's evaluation metrics, aggregated from per-task results.

Per task: the hybrid reward `hybrid` and its four components `align`, `aes`, `traj`, `rule` (the
reward vocabulary of `rewards.hybrid`), and the trajectory length (tool calls made). Over a split: their means
(paper Tables 4-5) with the success rate, reply validity and the rest in one view
(`policy_metrics`; success is `succeeded`), plus stop reasons and per-tool call statistics
(`summarize`). Everything here reads saved results, so a report can be rebuilt without rerunning.
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
    ("calls_per_task", "Calls"),
)


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


MATCH_THRESHOLD = 0.95  # success of results saved without per-check verdicts (older scorers)


def succeeded(scores: dict[str, float], match_threshold: float = MATCH_THRESHOLD) -> bool:
    """THE success of an episode or a task, in every view and report: `align/passed` >= 0.5. Per
    episode it is 1 only when every verifiable check passed (at least one; a judge fallback never
    passes); per sampled task it is the mean over episodes, so at least half must pass. Whether the
    policy ended the episode does not matter. Without `align/passed`: `align` >= `match_threshold`."""
    if "align/passed" in scores:
        return scores["align/passed"] >= 0.5
    return scores.get("align", 0.0) >= match_threshold


def task_result(traj: Trajectory, scores: dict[str, float], success_threshold: float = MATCH_THRESHOLD, seconds: float = 0.0) -> TaskResult:
    """Summarise a scored trajectory; `success` is `succeeded(scores, success_threshold)` (the
    threshold applies only to scores without per-check verdicts; mean alignment is never success)."""
    calls = [
        ToolCallRecord(t.call.name, t.status == "ok", t.error_code, t.tool_s)
        for t in traj.turns
        if t.call is not None
    ]
    measured = scores.get("align/fallback", 0.0) < 0.5
    return TaskResult(
        task_id=traj.task.id,
        scores=dict(scores),
        stop_reason=traj.stop_reason,
        n_turns=len(traj.turns),
        n_calls=len(traj.calls),
        valid_replies=sum(1 for t in traj.turns if not t.findings),
        success=succeeded(scores, success_threshold),
        align_measured=measured,
        error=traj.meta.get("error"),
        labels=dict(traj.task.labels),
        tool_calls=calls,
        seconds=seconds,
        terminated=int(traj.terminated),
    )


def merge_samples(results: list[TaskResult]) -> TaskResult:
    """Several episodes of one task as one result: scores are their means (a key counts over the
    episodes that have it), counts and tool calls are summed, success is `succeeded` of the mean scores."""
    first = results[0]
    keys = dict.fromkeys(k for r in results for k in r.scores)
    scores = {k: sum(r.scores[k] for r in results if k in r.scores) / sum(k in r.scores for r in results) for k in keys}
    return TaskResult(
        task_id=first.task_id,
        scores=scores,
        stop_reason=Counter(r.stop_reason for r in results).most_common(1)[0][0],
        n_turns=sum(r.n_turns for r in results),
        n_calls=sum(r.n_calls for r in results),
        valid_replies=sum(r.valid_replies for r in results),
        success=succeeded(scores),
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
    """A split's one metrics view (`policy_metrics`) plus the per-tool, per-label and stop-reason breakdowns of reports."""

    n_tasks: int
    metrics: dict[str, float]  # policy_metrics
    align_measured_rate: float
    stop_reasons: dict[str, int]
    tools: dict[str, ToolStats]
    by_label: dict[str, dict[str, float]]  # "axis=value" -> {"hybrid": mean, "n": tasks}
    n_errors: int

    @property
    def success_rate(self) -> float:
        return self.metrics["success"]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for name, st in self.tools.items():
            d["tools"][name]["success_rate"] = st.success_rate
        return d


def summarize(results: list[TaskResult]) -> Summary:
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
        metrics=policy_metrics(results),
        align_measured_rate=_mean(float(r.align_measured) for r in results),
        stop_reasons=dict(Counter(r.stop_reason for r in results)),
        tools=dict(sorted(tools.items())),
        by_label={k: {"hybrid": _mean(v), "n": float(len(v))} for k, v in sorted(by_label.items())},
        n_errors=sum(1 for r in results if r.error),
    )


def policy_metrics(results: list[TaskResult], match_threshold: float = MATCH_THRESHOLD) -> dict[str, float]:
    """The one aggregate view of a split (pipeline, evidence benchmark, ablation grid, reports):
    means of every per-task score (a key counts over the tasks that have it; the paper's columns
    `PAPER_METRICS` among them), `format_validity` = share of all assistant turns without a
    protocol finding (pooled, not a mean of per-task shares), `success` = share of tasks that
    `succeeded` (with `match_threshold`), `partial` = mean share of checks passed (0 for a task
    without verdicts), `terminated` = share of episodes the policy ended, `calls_per_task` = tool
    calls per episode, `n_tasks`. Computed from scores, so saved results read under today's definition."""
    keys = dict.fromkeys(k for r in results for k in r.scores)
    means = {k: sum(r.scores[k] for r in results if k in r.scores) / sum(k in r.scores for r in results) for k in keys}
    turns = sum(r.n_turns for r in results)
    episodes = sum(r.episodes for r in results)
    return {
        **means,
        "format_validity": sum(r.valid_replies for r in results) / turns if turns else 0.0,
        "success": sum(succeeded(r.scores, match_threshold) for r in results) / max(1, len(results)),
        "partial": sum(r.scores.get("align/pass_rate", 0.0) for r in results) / max(1, len(results)),
        "terminated": sum(r.terminated for r in results) / episodes if episodes else 0.0,
        "calls_per_task": sum(len(r.tool_calls) for r in results) / episodes if episodes else 0.0,
        "n_tasks": float(len(results)),
    }


def task_score(scores: dict[str, float], key: str) -> float:
    """One per-task score by name; 0 where the task lacks it. `success` is `succeeded` as 0 or 1,
    so a paired or averaged success is the success rate every report shows."""
    return float(succeeded(scores)) if key == "success" else scores.get(key, 0.0)


def paired_difference(before: Iterable[dict[str, float]], after: Iterable[dict[str, float]], key: str = "hybrid") -> dict[str, float]:
    """`after - before` of one per-task score (`task_score`), the i-th of each being the same task:
    `n`, `mean_diff`, its standard error `se` (sample sd / sqrt n; 0 below two tasks), `wins` and
    `losses` (tasks that moved up or down). Sequences of different lengths raise ValueError."""
    before, after = list(before), list(after)
    if len(before) != len(after):
        raise ValueError(f"paired scores need the same tasks: {len(before)} before, {len(after)} after")
    d = [task_score(a, key) - task_score(b, key) for b, a in zip(before, after)]
    n = len(d)
    mean = sum(d) / n if n else 0.0
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1)) if n > 1 else 0.0
    return {"n": n, "mean_diff": mean, "se": sd / math.sqrt(n) if n > 1 else 0.0,
            "wins": sum(x > 1e-9 for x in d), "losses": sum(x < -1e-9 for x in d)}
