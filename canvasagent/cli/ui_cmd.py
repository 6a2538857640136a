"""`canvasagent ui`: the Gradio web app for interactive sessions (loopback by default)."""

from __future__ import annotations

import argparse
import os


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ui", help="web app: upload images, stream agent steps, browse/roll back assets")
    p.add_argument("--policy", default=None, help="default policy spec shown in the page")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default loopback only)")
    p.add_argument("--port", type=int, default=7860)
    p.add_argument("--runs-dir", default="runs/ui", help="where sessions are saved")
    p.add_argument("--max-turns", type=int, default=12)
    p.add_argument("--tools-config", default="offline")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # no phoning home from an offline tool
    try:
        from canvasagent.ui.app import launch
        from canvasagent.ui.controller import UIConfig
    except ImportError as e:
        print(f"error: the UI needs gradio ({e}); install it with: pip install -e '.[ui]'")
        return 2
    print(f"CanvasAgent UI on http://{args.host}:{args.port} (sessions saved under {args.runs_dir})")
    launch(UIConfig(policy=args.policy, tools=args.tools_config, runs_dir=args.runs_dir, max_turns=args.max_turns), args.host, args.port)
    return 0
