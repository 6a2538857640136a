"""`canvasagent demo`: an agent session on a sample photograph, no downloads needed."""

from __future__ import annotations

import argparse
from pathlib import Path

from canvasagent.cli.common import add_tools_config_arg


def _sample_image():
    from PIL import Image
    from skimage import data  # ships its sample photographs inside the wheel

    return Image.fromarray(data.astronaut())


DEMO_REPLIES = [
    ('The astronaut is in the left half; crop that region first.', {"name": "Crop", "arguments": {"image": "img_1", "bbox": "[0, 0, 600, 1000]"}}),
    ("Mirror the crop so the subject faces the other way.", {"name": "Flip", "arguments": {"image": "Crop_0"}}),
    ("Turn it upside down as requested.", {"name": "Rotate", "arguments": {"image": "Flip_0", "angle": 180}}),
    ("Add the caption near the bottom.", {"name": "Overlayer", "arguments": {"base_image": "Rotate_0", "overlay_type": "text", "content": "CanvasAgent", "position": "[500, 900]"}}),
]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run a scripted agent session on a sample photograph")
    p.add_argument("--out", default="runs/demo")
    add_tools_config_arg(p)
    p.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    from rich.console import Console

    from canvasagent.core.episode import run_episode
    from canvasagent.core.policies import ReplayPolicy
    from canvasagent.core.protocol import format_reply
    from canvasagent.core.tasks import Task
    from toolserver.client import make_toolbox

    console = Console()
    replies = [format_reply(r, c) for r, c in DEMO_REPLIES] + [format_reply("The caption is placed; done.", terminate=True)]
    task = Task("Crop the astronaut, mirror it, turn it upside down and caption it 'CanvasAgent'.", [_sample_image()], id="demo")

    def show(turn, ep):
        console.print(f"[bold]turn {turn.index}[/] [cyan]{turn.reason}[/]")
        if turn.call:
            console.print(f"  call: {turn.call.name} {turn.call.arguments}")
        if turn.observation:
            console.print(f"  [green]{turn.observation}[/]" if turn.status == "ok" else f"  [red]{turn.observation}[/]")

    toolbox = make_toolbox(args.tools_config)
    traj = run_episode(ReplayPolicy(replies, name="demo-script"), task, toolbox, on_turn=show)
    path = traj.save(Path(args.out))
    console.print(f"final image {traj.final_asset_id}; trajectory and assets saved to {path.parent}")
    return 0 if traj.stop_reason == "terminate" else 1
