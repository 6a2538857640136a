"""`canvasagent ui`: the Gradio web app (loopback by default).

Tabs: an interactive session, the rollout viewer (`--rollouts DIR` opens a GRPO trajectory dump
or an eval run there), and EASEL painting stroke by stroke.
"""

from __future__ import annotations

import argparse
import os


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ui", help="web app: interactive sessions, the rollout viewer (GRPO dumps, eval runs), EASEL painting")
    p.add_argument("--policy", default=None, help="default policy spec shown in the page")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default loopback only)")
    p.add_argument("--port", type=int, default=7860)
    p.add_argument("--runs-dir", default="runs/ui", help="where sessions are saved")
    p.add_argument("--max-turns", type=int, default=12)
    p.add_argument("--tools-config", default="offline")
    p.add_argument("--rollouts", default=None, metavar="DIR",
                   help="open the rollout viewer on DIR: a GRPO run dir (or its trajectories/) or an eval run dir")
    p.add_argument("--scale-rewards", choices=["group", "batch", "none"], default="group",
                   help="how the viewer recomputes GRPO advantages: the run's grpo.scale_rewards")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # no phoning home from an offline tool
    try:
        from canvasagent.ui.app import launch
        from canvasagent.ui.controller import UIConfig
    except ImportError as e:
        print(f"error: the UI needs gradio ({e}); install it with: pip install -e '.[ui]'")
        return 2
    if args.rollouts:
        from canvasagent.ui.rollouts import RolloutError, load

        try:  # a wrong folder is a one-line error now, not an empty viewer later
            rs = load(args.rollouts, args.scale_rewards)
        except RolloutError as e:
            print(f"error: {e}")
            return 2
        print(f"rollout viewer: {len(rs.rollouts)} {rs.kind} rollouts from {rs.root} (Rollouts tab)")
    print(f"CanvasAgent UI on http://{args.host}:{args.port} (sessions saved under {args.runs_dir})")
    launch(UIConfig(policy=args.policy, tools=args.tools_config, runs_dir=args.runs_dir, max_turns=args.max_turns,
                    rollouts=args.rollouts, scale_rewards=args.scale_rewards), args.host, args.port)
    return 0
