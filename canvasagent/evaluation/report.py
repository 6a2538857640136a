"""Evaluation reports: `report.json`, `report.md` (paper-style tables) and PNG charts."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from canvasagent.core.plotting import figure
from canvasagent.evaluation.metrics import PAPER_METRICS, Summary, TaskResult


def _fmt(x: Any, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def markdown_table(head: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """The one Markdown table of every report: `head` the header cells, each row its cells (str())."""
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(map(str, cells)) + " |" for cells in rows]
    return "\n".join(lines)


def metrics_table(rows: Mapping[str, Mapping[str, float]], first_header: str = "Setting") -> str:
    """A Markdown table shaped like the paper's Tables 4-5: one row per setting."""
    return markdown_table([first_header] + [h for _, h in PAPER_METRICS],
                          ([name] + [_fmt(m.get(k), 2 if k == "calls_per_task" else 3) for k, _ in PAPER_METRICS] for name, m in rows.items()))


def tool_table(summary: Summary) -> str:
    def errors(st: Any) -> str:
        return ", ".join(f"{k}×{v}" for k, v in sorted(st.errors.items(), key=lambda kv: -kv[1])) or "–"

    return markdown_table(["Tool", "Calls", "Success", "Mean s", "Errors"],
                          ([name, st.calls, _fmt(st.success_rate), _fmt(st.mean_s, 4), errors(st)] for name, st in summary.tools.items()))


def render_markdown(summary: Summary, title: str, setting: str) -> str:
    m = summary.metrics
    parts = [
        f"# {title}",
        "",
        metrics_table({setting: summary.metrics}),
        "",
        f"- tasks: {summary.n_tasks}; success rate: {_fmt(m['success'])} (every verifiable check passed); "
        f"partial credit (share of checks passed): {_fmt(m['partial'])}; "
        f"valid replies: {_fmt(m['format_validity'])}; episodes with errors: {summary.n_errors}",
        f"- alignment measured by a verifiable check or judge (not a fallback) on {_fmt(summary.align_measured_rate)} of tasks; "
        "success needs a measured alignment",
        "- stop reasons: " + ", ".join(f"{k} {v}" for k, v in sorted(summary.stop_reasons.items())),
        "",
        "## Tool calls",
        "",
        tool_table(summary) if summary.tools else "_no tool calls_",
    ]
    if summary.by_label:
        parts += ["", "## Hybrid reward by label", "",
                  markdown_table(["Label", "Hybrid", "n"], ([k, _fmt(v["hybrid"]), int(v["n"])] for k, v in summary.by_label.items()))]
    return "\n".join(parts) + "\n"


def bar_chart(values: Mapping[str, float], path: Path, title: str, ylim: tuple[float, float] | None = (0, 1.1)) -> Path:
    names = list(values)
    ys = [0.0 if v is None or (isinstance(v, float) and math.isnan(v)) else float(v) for v in values.values()]
    with figure(path, figsize=(max(4, 0.9 * len(names) + 1), 3.2), dpi=100) as (fig, ax):
        bars = ax.bar(names, ys, color="#4C72B0")
        ax.bar_label(bars, fmt="%.2f", fontsize=8)
        ax.set_title(title)
        if ylim:
            ax.set_ylim(*ylim)
        ax.tick_params(axis="x", labelrotation=30, labelsize=8)
    return path


def write_report(summary: Summary, results: list[TaskResult], out_dir: str | Path, title: str = "Evaluation", setting: str = "policy", meta: dict[str, Any] | None = None) -> dict[str, Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    payload = {"title": title, "setting": setting, "meta": meta or {}, "summary": summary.to_dict(), "tasks": [r.to_dict() for r in results]}
    paths = {
        "json": out / "report.json",
        "markdown": out / "report.md",
        "metrics_png": out / "metrics.png",
        "tools_png": out / "tool_calls.png",
    }
    paths["json"].write_text(json.dumps(payload, indent=2, default=float))
    paths["markdown"].write_text(render_markdown(summary, title, setting))
    scores = {h: summary.metrics.get(k, float("nan")) for k, h in PAPER_METRICS if k != "calls_per_task"}
    scores["Success"] = summary.metrics["success"]
    bar_chart(scores, paths["metrics_png"], f"{title}: metrics")
    bar_chart({k: float(v.calls) for k, v in summary.tools.items()} or {"none": 0.0}, paths["tools_png"], "Tool calls", ylim=None)
    return paths
