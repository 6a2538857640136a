"""Pipeline report: metrics table (Markdown + JSON) and curves (PNG)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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
    rows: dict[str, dict[str, float]] = {}
    lines = ["| stage | n | " + " | ".join(COLUMNS) + " |", "|---" * (len(COLUMNS) + 2) + "|"]
    for key, label in ROWS:
        r = results.get(key)
        if not r:
            continue
        for name, m in _stage_rows(r, label + suffix, field):
            rows[name] = {c: m.get(c, float("nan")) for c in COLUMNS}
            n = int(m.get("n_tasks", 0))
            lines.append(f"| {name} | {n} | " + " | ".join(f"{m.get(c, float('nan')):.3f}" for c in COLUMNS) + " |")
    return "\n".join(lines), rows


def _history(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_report(out: Path, results: dict[str, Any]) -> dict[str, Any]:
    from canvasagent.training.callbacks import plot_curves

    out = Path(out)
    table, rows = metrics_table(results)
    table_s, rows_s = metrics_table(results, "metrics_sampled", " [sampled]")
    rows.update(rows_s)
    sft_png = plot_curves(_history(out / "sft" / "metrics.jsonl"), out / "report" / "sft_curves.png", "SFT")
    grpo_png = plot_curves(_history(out / "grpo" / "metrics.jsonl"), out / "report" / "grpo_curves.png", "GRPO rewards")
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
        "Stage wall time (s): " + ", ".join(f"{k} {v}" for k, v in timings.items()),
        "",
    ]
    if peak_rss:
        md += ["Peak RSS of the pipeline process per stage (MB): " + ", ".join(f"{k} {v}" for k, v in peak_rss.items()), ""]
    if sft_png:
        md.append("![SFT curves](sft_curves.png)")
    if grpo_png:
        md.append("![GRPO reward curves](grpo_curves.png)")
    (out / "report").mkdir(parents=True, exist_ok=True)
    md_path = out / "report" / "report.md"
    md_path.write_text("\n".join(md) + "\n")
    json_path = out / "report" / "metrics.json"
    json_path.write_text(json.dumps({"metrics": rows, "timings": timings, "peak_rss_mb": peak_rss}, indent=2))
    return {"markdown": str(md_path), "json": str(json_path), "curves": [str(p) for p in (sft_png, grpo_png) if p],
            "metrics": rows}
