"""`canvasagent evaluate "<question>" --target TOOL_OR_POLICY`: the evaluation agent."""

from __future__ import annotations

import argparse
import sys
import time


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("evaluate", help="ask an evaluation question; the agent probes the target and answers with evidence")
    p.add_argument("question", help='e.g. "How legible is the text that Overlayer renders?"')
    p.add_argument("--target", required=True, help="a tool name (ImageGeneration, Overlayer, …) or a policy spec (hf:…, openai:…, scripted:…)")
    p.add_argument("--planner", default="offline", help="offline (deterministic, fixed aspect list) or openai:MODEL@BASE_URL")
    p.add_argument("--config", default="default", help="configs/eval_agent/<name>.yaml or a path (budget, aspects)")
    p.add_argument("--judge", default="offline", choices=("offline", "http", "local"))
    p.add_argument("--preset", default="paper")
    p.add_argument("--tools-config", default="offline")
    p.add_argument("--out", default=None, help="output dir (default runs/evaluate-<time>)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from canvasagent.evaluation.agent import build_agent
    from canvasagent.evaluation.scoring import ScorerUnavailable
    from canvasagent.policies.spec import PolicySpecError

    out = args.out or f"runs/evaluate-{time.strftime('%Y%m%d-%H%M%S')}"
    try:
        agent = build_agent(args.target, out, args.planner, args.config, args.judge, args.preset, args.tools_config)
    except (PolicySpecError, ScorerUnavailable, OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    result = agent.run(args.question)
    for r in result.rounds:
        print(f"[round {r.index + 1}] {r.plan.sub_aspect} ({r.plan.source})\n  thought: {r.plan.thought}\n  " + r.observation.replace("\n", "\n  "))
    print(f"\n[stop] {result.stop.justification}\n")
    print(result.summary)
    print(f"\nrounds, summary and EA-CoT records in {out}")
    return 0
