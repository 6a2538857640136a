"""Pipeline report: metrics table (Markdown + JSON), GRPO training diagnostics and curves (PNG)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from canvasagent.evaluation.metrics import paired_difference
from canvasagent.evaluation.report import markdown_table

COLUMNS = ("format_validity", "rule", "hybrid", "align", "aes", "traj", "success", "terminated", "calls_per_task")
ROWS = (("eval_base", "before SFT (base)"), ("eval_sft", "after SFT"), ("eval_grpo", "after GRPO"))


def _stage_rows(r: dict[str, Any], label: str, field: str) -> list[tuple[str, dict[str, float]]]:
    """All held-out tasks, then one row per data source when there is more than one."""
    rows = [(label, r[field])] if field in r else []
    by_source = r.get("by_source") or {}
    if len(by_source) > 1:
        rows += [(f"{label}: {source}", m[field]) for source, m in by_source.items() if field in m]
    return rows


def metrics_table(results: dict[str, Any], field: str = "metrics", suffix: str = "") -> tuple[str, dict[str, dict[str, float]]]:
    """The stages' held-out metrics (`field` of each stage's record) as a Markdown table and as rows."""
    rows: dict[str, dict[str, float]] = {}
    cells = []
    for key, label in ROWS:
        for name, m in _stage_rows(results.get(key) or {}, label + suffix, field):
            rows[name] = {c: m.get(c, float("nan")) for c in COLUMNS}
            cells.append([name, int(m.get("n_tasks", 0))] + [f"{v:.3f}" for v in rows[name].values()])
    return markdown_table(["stage", "n", *COLUMNS], cells), rows


def paired_grpo_gain(results: dict[str, Any]) -> dict[str, dict[str, float]]:
    """After GRPO minus after SFT, paired per held-out task (`paired_difference` of the hybrid
    reward), for all tasks and per source, greedy and sampled: {"greedy: scripted": {...}, ...}.
    Empty unless both evaluations hold per-task scores of the same tasks."""
    sft, grpo = results.get("eval_sft") or {}, results.get("eval_grpo") or {}
    sources = sft.get("task_sources") or []
    out: dict[str, dict[str, float]] = {}
    for mode, key in (("greedy", "per_task"), ("sampled", "per_task_sampled")):
        before, after = sft.get(key) or [], grpo.get(key) or []
        if not before or len(before) != len(after) or (sources and len(sources) != len(before)):
            continue
        out[f"{mode}: all"] = paired_difference(before, after)
        for source in dict.fromkeys(sources) if len(set(sources)) > 1 else ():
            ix = [i for i, s in enumerate(sources) if s == source]
            out[f"{mode}: {source}"] = paired_difference([before[i] for i in ix], [after[i] for i in ix])
    return out


def paired_table(gain: dict[str, dict[str, float]]) -> str:
    cells = [[name, int(g["n"]), f"{g['mean_diff']:+.3f}", f"{g['se']:.3f}", f"{int(g['wins'])}/{int(g['losses'])}",
              _beyond_2se(g)] for name, g in gain.items()]
    return markdown_table(["decoding: tasks", "n", "GRPO - SFT hybrid", "se", "up/down", "beyond 2 se"], cells)


def _beyond_2se(g: dict[str, float]) -> str:
    if abs(g["mean_diff"]) <= 2 * g["se"]:
        return "no"
    return "up" if g["mean_diff"] > 0 else "down"


def _history(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# The per-step GRPO diagnostics the report summarises (keys of grpo/metrics.jsonl; see
# training.callbacks.PANELS for where each comes from).
DIAGNOSTICS = (
    "reward", "reward_std", "frac_reward_zero_std", "tools/call_frequency", "rewards/no_tool/mean",
    "rewards/format_validity/mean", "completions/mean_length", "kl", "entropy", "clip_ratio/region_mean",
    "rewards/judge_fallbacks/mean",
)


def diagnostics_summary(history: list[dict[str, Any]], window: int = 5) -> dict[str, Any]:
    """Per diagnostic over the logged GRPO steps: the mean of the first and of the last `window`
    steps that have a finite value, and its min and max; plus the steps flagged `tool_collapse`
    and the per-source means (`rewards/<hybrid|format_validity|no_tool>/<source>/mean`). Empty
    without GRPO steps."""
    steps = [h for h in history if "reward" in h]
    if not steps:
        return {}
    per_source = ("rewards/hybrid/", "rewards/format_validity/", "rewards/no_tool/")
    keys = list(DIAGNOSTICS) + sorted({k for h in steps for k in h
                                       if k.startswith(per_source) and k.endswith("/mean") and k.count("/") == 3})
    out: dict[str, Any] = {"n_steps": len(steps), "window": window, "metrics": {},
                           "tool_collapse_steps": [h.get("step") for h in steps if h.get("tool_collapse")]}
    for k in keys:
        ys = [float(h[k]) for h in steps if isinstance(h.get(k), (int, float)) and math.isfinite(float(h[k]))]
        if ys:
            head, tail = ys[:window], ys[-window:]
            out["metrics"][k] = {"first": sum(head) / len(head), "last": sum(tail) / len(tail), "min": min(ys), "max": max(ys)}
    return out


def diagnostics_table(summary: dict[str, Any]) -> str:
    if not summary.get("metrics"):
        return ""
    w = summary["window"]
    return markdown_table(["diagnostic", f"first {w} steps", f"last {w} steps", "min", "max"],
                          ([k, *(f"{m[s]:.3f}" for s in ("first", "last", "min", "max"))] for k, m in summary["metrics"].items()))


def write_report(out: Path, results: dict[str, Any]) -> dict[str, Any]:
    from canvasagent.training.callbacks import plot_curves

    out = Path(out)
    table, rows = metrics_table(results)
    table_s, rows_s = metrics_table(results, "metrics_sampled", " [sampled]")
    rows.update(rows_s)
    sft_png = plot_curves(_history(out / "sft" / "metrics.jsonl"), out / "report" / "sft_curves.png", "SFT")
    grpo_history = _history(out / "grpo" / "metrics.jsonl")
    grpo_png = plot_curves(grpo_history, out / "report" / "grpo_curves.png", "GRPO")
    diagnostics = diagnostics_summary(grpo_history)
    gain = paired_grpo_gain(results)
    timings = {k: v.get("seconds") for k, v in results.items() if v}
    peak_rss = {k: v.get("peak_rss_mb") for k, v in results.items() if v and v.get("peak_rss_mb") is not None}
    md = [
        "# CanvasAgent pipeline report",
        "",
        f"Held-out tasks ({', '.join((results.get('data') or {}).get('sources') or ['scripted'])}; rows per source "
        "follow the all-tasks row), offline judges "
        f"(scorer: {next((v.get('scorer') for v in results.values() if v and v.get('scorer')), 'n/a')}).",
        "",
        "Greedy decoding:",
        "",
        table,
        "",
        "Sampling at the GRPO training temperature (mean over several episodes per task):",
        "",
        table_s,
        "",
    ]
    if unsolved := results.get("unsolved_tasks"):
        md += [f"GRPO trained on the {len(unsolved['unsolved'])} of {unsolved['n_tasks']} training tasks the SFT policy "
               f"did not solve (its greedy episode or one of {unsolved['samples']} sampled at T {unsolved['temperature']} "
               "failed a check; `unsolved_tasks/report.md`).", ""]
    if gain:
        md += ["GRPO against SFT, paired per held-out task (the mean of after-GRPO minus after-SFT hybrid "
               "reward, its standard error, and the tasks it moved up / down):", "", paired_table(gain), ""]
    md += [
        "Stage wall time (s): " + ", ".join(f"{k} {v}" for k, v in timings.items()),
        "",
    ]
    if peak_rss:
        md += ["Peak RSS of the pipeline (its process plus the stage subprocess) per stage (MB): " + ", ".join(f"{k} {v}" for k, v in peak_rss.items()), ""]
    if diagnostics.get("metrics"):
        collapsed = diagnostics["tool_collapse_steps"]
        md += [f"GRPO training diagnostics over {diagnostics['n_steps']} logged steps (grpo/metrics.jsonl); "
               + (f"tool use collapsed at steps {', '.join(map(str, collapsed))}:" if collapsed else "no tool-use collapse:"),
               "", diagnostics_table(diagnostics), ""]
    if sft_png:
        md.append("![SFT curves](sft_curves.png)")
    if grpo_png:
        md.append("![GRPO training diagnostics](grpo_curves.png)")
    (out / "report").mkdir(parents=True, exist_ok=True)
    md_path = out / "report" / "report.md"
    md_path.write_text("\n".join(md) + "\n")
    json_path = out / "report" / "metrics.json"
    json_path.write_text(json.dumps({"metrics": rows, "timings": timings, "peak_rss_mb": peak_rss,
                                     "grpo_vs_sft": gain, "grpo_diagnostics": diagnostics}, indent=2))
    return {"markdown": str(md_path), "json": str(json_path), "curves": [str(p) for p in (sft_png, grpo_png) if p],
            "metrics": rows}
