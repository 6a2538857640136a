"""Two runs' evaluations of the same held-out tasks, paired per task.

    python benchmarks/stage_compare.py RUN_A RUN_B [--stage eval_sft] [--stage-b STAGE] [--results FILE]

RUN_A and RUN_B are pipeline run folders (or seed folders of `benchmarks/train_evidence.py`) whose
`data/eval_tasks.jsonl` are the same tasks in the same order (refused otherwise). For the stage
(`eval_sft`, `eval_grpo`; `--stage-b` for another stage of RUN_B) it reads each run's
`STAGE/done.json` and reports, greedy and sampled, the hybrid reward and the success rate of each
and B minus A paired per task (`canvasagent.evaluation.metrics.paired_difference`: mean ± standard
error, tasks up and down). Prints markdown and writes it to `--results`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from canvasagent.evaluation.metrics import paired_difference  # noqa: E402

MODES = (("greedy", "per_task", "metrics"), ("sampled", "per_task_sampled", "metrics_sampled"))


def load(run: Path, stage: str) -> dict[str, Any]:
    done = run / stage / "done.json"
    if not done.exists():
        raise SystemExit(f"{run}: no finished {stage} ({done} is missing)")
    return json.loads(done.read_text())


def tasks_digest(run: Path) -> str:
    path = run / "data" / "eval_tasks.jsonl"
    if not path.exists():
        raise SystemExit(f"{run}: no data/eval_tasks.jsonl")
    return hashlib.sha256(path.read_bytes()).hexdigest()


def compare(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    """Per mode present in both: each side's hybrid and success, and B minus A paired per task."""
    rows = []
    for mode, per_task, metrics in MODES:
        if not a.get(per_task) or not b.get(per_task):
            continue
        if len(a[per_task]) != len(b[per_task]):
            raise SystemExit(f"{mode}: {len(a[per_task])} tasks against {len(b[per_task])}; the runs were evaluated differently")
        row: dict[str, Any] = {"mode": mode, "n": len(a[per_task])}
        for key in ("hybrid", "success"):
            row[key] = (a[metrics][key], b[metrics][key], paired_difference(a[per_task], b[per_task], key))
        rows.append(row)
    return rows


def report(run_a: Path, run_b: Path, stage_a: str, stage_b: str, rows: list[dict[str, Any]]) -> str:
    def diff(d: dict[str, float]) -> str:
        return f"{d['mean_diff']:+.4f} ± {d['se']:.4f} ({d['wins']} up, {d['losses']} down)"

    lines = [f"# `{run_b}` {stage_b} minus `{run_a}` {stage_a}, paired per held-out task", "",
             "| mode | n | hybrid A → B | B − A | success A → B | B − A |", "|---|---|---|---|---|---|"]
    for r in rows:
        (ha, hb, hd), (sa, sb, sd) = r["hybrid"], r["success"]
        lines.append(f"| {r['mode']} | {r['n']} | {ha:.4f} → {hb:.4f} | {diff(hd)} | {sa:.3f} → {sb:.3f} | {diff(sd)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_a", type=Path)
    ap.add_argument("run_b", type=Path)
    ap.add_argument("--stage", default="eval_sft")
    ap.add_argument("--stage-b", help="RUN_B's stage (default: --stage)")
    ap.add_argument("--results", type=Path)
    args = ap.parse_args(argv)
    if tasks_digest(args.run_a) != tasks_digest(args.run_b):
        raise SystemExit(f"{args.run_a} and {args.run_b} were evaluated on different held-out tasks")
    stage_b = args.stage_b or args.stage
    a, b = load(args.run_a, args.stage), load(args.run_b, stage_b)
    from markdown_out import emit

    emit(report(args.run_a, args.run_b, args.stage, stage_b, compare(a, b)), args.results)


if __name__ == "__main__":
    main()
