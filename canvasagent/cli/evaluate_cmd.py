"""`canvasagent evaluate "<question>" --target TOOL_OR_POLICY`: the evaluation agent."""

from __future__ import annotations

import argparse
import time


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("evaluate", help="ask an evaluation question; the agent probes the target against ground truth and answers yes/no/partly")
    p.add_argument("question", help='e.g. "Can the OCR tool read small rotated text?"')
    p.add_argument("--target", required=True, help="a tool name (OCR, Flip, Rotate, Crop, SR, Overlayer, …) or a policy spec (scripted:expected, hf:…, openai:…)")
    p.add_argument("--planner", default="offline", help="offline (parses the question against the tool registry) or openai:MODEL@BASE_URL")
    p.add_argument("--config", default="default", help="configs/eval_agent/<name>.yaml or a path (budgets, terms, thresholds)")
    p.add_argument("--tools-config", default="offline")
    p.add_argument("--out", default=None, help="output dir (default runs/evaluate-<time>): result.json, summary.md, ea_cot.json, probes/")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from canvasagent.evaluation.agent import build_agent

    out = args.out or f"runs/evaluate-{time.strftime('%Y%m%d-%H%M%S')}"
    agent = build_agent(args.target, out, args.planner, args.config, args.tools_config)
    try:
        result = agent.run(args.question)
    finally:
        agent.close()
    print(f"[plan] {result.plan.thought} ({result.plan.source})")
    for r in result.rounds:
        print(f"[round {r.index + 1}] {r.thought} ({r.source})\n  " + r.observation.replace("\n", "\n  "))
    print(f"\n[answer] {result.answer}" + (f"\n[boundary] {result.boundary}" if result.boundary else ""))
    print(f"[stop] {result.stop}\n[probes] {result.probes_used}\n\nresult.json, summary.md and EA-CoT records in {out}")
    return 0
