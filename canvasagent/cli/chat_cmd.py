"""`canvasagent chat --image img_1=PATH … [--policy SPEC]`: a human-in-the-loop terminal session.

`canvasagent chat --easel REF [--budget N]`: paint REF (an image file or a scikit-image sample
name) stroke by stroke in EASEL, with the step, S and the saved canvas shown after every stroke.
"""

from __future__ import annotations

import argparse
import time

from canvasagent.cli.common import add_tools_config_arg, parse_image_args


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("chat", help="work with the agent in the terminal: approve, edit or reject each tool call")
    p.add_argument("--image", action="append", default=[], metavar="img_N=PATH", help="input image (repeatable)")
    p.add_argument("--instruction", "-m", default=None, help="the task; asked for when omitted")
    p.add_argument("--policy", default=None, help="policy spec (hf:…, openai:…, replay:…, scripted:…); none: you type every call")
    p.add_argument("--auto", action="store_true", help="approve every proposed call without asking")
    p.add_argument("--out", default=None, help="session dir (default runs/chat-<time>); images and trajectory are saved each step")
    p.add_argument("--max-turns", type=int, default=12)
    p.add_argument("--easel", default=None, metavar="REF",
                   help="paint REF stroke by stroke instead (an image file or astronaut|chelsea|coffee|rocket)")
    p.add_argument("--budget", type=int, default=20, help="--easel: steps (strokes and undos)")
    p.add_argument("--size", type=int, default=128, help="--easel: canvas side in pixels")
    add_tools_config_arg(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.easel:
        from canvasagent.interactive.paint import run_paint  # deferred: imports torch

        return run_paint(args.easel, args.size, args.budget, args.out)
    from canvasagent.core.episode import EpisodeConfig
    from canvasagent.interactive.session import Session
    from canvasagent.interactive.terminal import TerminalChat
    from canvasagent.policy_spec import build_policy
    from canvasagent.core.tasks import Task
    from toolserver.client import make_toolbox

    images = parse_image_args(args.image)
    instruction = args.instruction
    if instruction is None:
        try:
            instruction = input("instruction> ").strip()
        except EOFError:
            instruction = ""
    task = Task(instruction, [images[k] for k in sorted(images)], id="chat")
    policy = build_policy(args.policy, task) if args.policy else None
    out = args.out or f"runs/chat-{time.strftime('%Y%m%d-%H%M%S')}"
    toolbox = make_toolbox(args.tools_config)
    try:
        session = Session(task, toolbox, policy, EpisodeConfig(max_turns=args.max_turns), out_dir=out)
        print(f"session saved to {out}; imglist: {session.episode.assets.imglist_text()}")
        traj = TerminalChat(session, auto=args.auto).run()
    finally:
        toolbox.close()
    return 0 if traj.stop_reason in ("terminate", "submit", "user_closed") else 1
