"""The evaluation agent on questions with known answers: accuracy, and probes spent vs a fixed grid.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/eval_agent.py [--out DIR] [--only 1,4] [--no-grid] [--md PATH]

Each question runs twice on the offline tools config (OCR = RapidOCR, SR = Real-ESRGAN ncnn on
the CPU, pure tools in-process): once with the agent's adaptive search and once with the fixed
grid (every grid value of the axis, or `set_max` probes per setting, see
`EvaluationAgent.run(fixed_grid=True)`). A question is correct when the agent's answer equals
the known answer. Known answers come from one of two places, named in the table:

* `construction`: what the tool's code does, independent of any measurement (Flip transposes
  left-right; the canvascraft Rotate turns counter-clockwise and keeps W x H at 90; Overlayer
  draws black text; `scripted:expected` crops with the generic bbox [100, 100, 900, 900]; the
  offline config has no ImageGeneration backend).
* `grid`: the fixed grid's answer on the same tool, i.e. the dense measurement the adaptive
  search tries to reproduce with fewer probes (used where the answer depends on a model: OCR
  at a text height, SR against bicubic).

Writes a Markdown table (default `benchmarks/results/eval_agent.md`) and prints it.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import subprocess
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

from canvasagent.evaluation.agent import build_agent

# (target, question, known answer, where the known answer comes from)
QUESTIONS: list[tuple[str, str, str, str]] = [
    ("OCR", "Can the OCR tool read text 24 px high rotated 30 degrees?", "yes", "grid"),
    ("OCR", "Can OCR read text 3 px high?", "no", "grid"),
    ("OCR", "Can the OCR tool read small rotated text?", "partly", "grid"),
    ("OCR", "Can OCR read faint text?", "no", "grid"),
    ("Flip", "Does Flip mirror images horizontally?", "yes", "construction"),
    ("Flip", "Does Flip mirror images vertically?", "no", "construction"),
    ("Rotate", "Does Rotate turn images clockwise?", "no", "construction"),
    ("Rotate", "Does Rotate turn images 90 degrees counter-clockwise?", "yes", "construction"),
    ("Rotate", "Does Rotate keep the whole image when it turns it?", "partly", "construction"),
    ("Crop", "Does Crop return exactly the requested region?", "yes", "construction"),
    ("SR", "Does SR upscale images 4x?", "yes", "construction"),
    ("SR", "Does SR upscale images 8x?", "no", "construction"),
    ("SR", "Does SR recover more detail than bicubic upscaling?", "partly", "grid"),
    ("Overlayer", "Does Overlayer put readable text at the requested position?", "yes", "construction"),
    ("Overlayer", "Is Overlayer's text readable on dark backgrounds?", "no", "construction"),
    ("scripted:expected", "Does the policy mirror images when asked to?", "yes", "construction"),
    ("scripted:expected", "Does the policy crop to the region it is asked for?", "no", "construction"),
    ("scripted:terminate", "Does the policy mirror images when asked to?", "no", "construction"),
    ("ImageGeneration", "Can ImageGeneration render legible text?", "cannot evaluate", "construction"),
    ("Grounding", "Does Grounding find the red rectangle?", "cannot evaluate", "construction"),
]


def _short(answer: str) -> str:
    return "cannot evaluate" if answer.startswith("cannot evaluate") else answer


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="run dirs (default: a temporary dir)")
    ap.add_argument("--only", default="", help="comma-separated question numbers (1-based)")
    ap.add_argument("--no-grid", action="store_true", help="skip the fixed-grid runs (probe counts of the grid are still reported)")
    ap.add_argument("--md", default="benchmarks/results/eval_agent.md")
    ap.add_argument("--tools-config", default="offline")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    only = {int(x) for x in args.only.split(",") if x.strip()}
    root = Path(args.out or tempfile.mkdtemp(prefix="eval_agent_bench_"))
    rows = []
    t_all = time.perf_counter()
    for i, (target, question, known, source) in enumerate(QUESTIONS, 1):
        if only and i not in only:
            continue
        t0 = time.perf_counter()
        agent = build_agent(target, root / f"q{i:02d}", tools_config=args.tools_config)
        try:
            res = agent.run(question)
        finally:
            agent.close()
        t_agent = time.perf_counter() - t0
        grid_answer, grid_probes = "–", res.details.get("grid_probes", 0)
        if not args.no_grid and not res.answer.startswith("cannot evaluate"):
            g = build_agent(target, root / f"q{i:02d}_grid", tools_config=args.tools_config)
            try:
                gres = g.run(question, fixed_grid=True)
            finally:
                g.close()
            grid_answer, grid_probes = _short(gres.answer), gres.probes_used
        rows.append({"i": i, "target": target, "question": question, "known": known, "source": source,
                     "answer": _short(res.answer), "boundary": res.boundary or "", "probes": res.probes_used,
                     "grid_answer": grid_answer, "grid_probes": grid_probes, "s": t_agent,
                     "correct": _short(res.answer) == known})
        print(f"q{i:02d} {target:18s} {_short(res.answer):15s} known {known:15s} probes {res.probes_used:3d} grid {grid_probes:3d} ({grid_answer}) {t_agent:.1f}s")
    n = len(rows)
    correct = sum(r["correct"] for r in rows)
    probes = sum(r["probes"] for r in rows)
    grid = sum(r["grid_probes"] for r in rows)
    grid_known = [r for r in rows if r["grid_answer"] != "–"]
    grid_correct = sum(r["grid_answer"] == r["known"] for r in grid_known)
    code = ["canvasagent/evaluation/agent", "configs/eval_agent", "benchmarks/eval_agent.py"]
    commit = subprocess.run(["git", "log", "-1", "--format=%h", "--", *code], capture_output=True, text=True).stdout.strip() or "?"
    if subprocess.run(["git", "status", "--porcelain", "--", *code], capture_output=True, text=True).stdout.strip():
        commit += " plus uncommitted changes"
    lines = [
        "# Evaluation agent benchmark",
        "",
        f"`OMP_NUM_THREADS=1 .venv/bin/python benchmarks/eval_agent.py`, agent code at commit {commit}, tools config `{args.tools_config}`, "
        f"{platform.processor() or platform.machine()}, {time.perf_counter() - t_all:.0f} s in all.",
        "",
        f"**Agent: {correct}/{n} correct ({100 * correct / max(n, 1):.0f} %), {probes} probes; fixed grid: {grid} probes"
        + (f", {grid_correct}/{len(grid_known)} correct" if grid_known else "") + f" ({100 * probes / max(grid, 1):.0f} % of the grid's probes).**",
        "",
        "| # | target | question | known (source) | agent answer | boundary / breakdown | probes | grid probes | grid answer | agent s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        mark = "" if r["correct"] else " ✗"
        lines.append(f"| {r['i']} | {r['target']} | {r['question']} | {r['known']} ({r['source']}) | {r['answer']}{mark} | {r['boundary']} | "
                     f"{r['probes']} | {r['grid_probes']} | {r['grid_answer']} | {r['s']:.1f} |")
    lines += ["", "Known answers marked `construction` follow from the tool's or policy's code alone; those marked `grid` are the "
              "fixed grid's dense measurement of a model (OCR, SR), so for them the agent's accuracy is its agreement with the "
              "grid, reached with fewer probes.",
              "", "Probes: generated inputs each measured against its ground truth (see `canvasagent/evaluation/agent/probes.py`). "
              "The grid probes every value of the axis grid (2 words each) or `set_max` inputs per setting; the agent stops when "
              "the evidence settles the answer (`canvasagent/evaluation/agent/search.py`). Run dirs (result.json, summary.md, "
              f"probes/) were under `{root}`."]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.md and not only:
        Path(args.md).parent.mkdir(parents=True, exist_ok=True)
        Path(args.md).write_text(text)
    return 0 if n and correct / n >= 0.9 else 1


if __name__ == "__main__":
    raise SystemExit(main())
