"""`canvasagent tools list|call`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from canvasagent.cli.common import add_tools_config_arg, parse_image_args
from canvasagent.core.tasks import Task
from toolserver.client import make_toolbox
from toolserver.config import ToolsConfig
from toolserver.registry import openai_schemas, tools


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tools", help="list the tools or call one")
    tsub = p.add_subparsers(dest="tools_command", metavar="ACTION")
    lp = tsub.add_parser("list", help="list tools from the registry")
    lp.add_argument("--json", action="store_true", help="print OpenAI-style JSON schemas")
    lp.add_argument("--family", default="all", choices=["all", "canvasagent", "easel"])
    lp.set_defaults(func=cmd_list)
    cp = tsub.add_parser("call", help="call one tool on images")
    cp.add_argument("name")
    cp.add_argument("--image", action="append", metavar="img_N=PATH", help="input images, in order")
    cp.add_argument("--args", default="{}", help="JSON object of arguments")
    cp.add_argument("--out", required=True, help="output directory")
    add_tools_config_arg(cp)
    cp.set_defaults(func=cmd_call)
    p.set_defaults(func=lambda a: (p.print_help(), 2)[1])


def cmd_list(args: argparse.Namespace) -> int:
    family = None if args.family == "all" else args.family
    if args.json:
        print(json.dumps(openai_schemas(family), indent=2))
        return 0
    for t in tools(family):
        req = ", ".join(a.name + ("" if a.required else "?") for a in t.args)
        print(f"{t.name:16s} {t.family:12s} {t.backend.value:9s} -> {t.output.value:7s} ({req})")
    return 0


def cmd_call(args: argparse.Namespace) -> int:
    from canvasagent.core.episode import Episode, EpisodeConfig

    try:
        call_args = json.loads(args.args)
    except json.JSONDecodeError as e:
        print(f"error: --args is not valid JSON: {e}", file=sys.stderr)
        return 2
    images = parse_image_args(args.image)
    toolbox = make_toolbox(ToolsConfig.load(args.tools_config))
    ep = Episode(toolbox, EpisodeConfig(max_turns=1))
    ep.reset(Task("tools call", [images[k] for k in sorted(images)]))
    res = ep.call_tool(args.name, call_args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    turn = res.turn
    if turn.output_id:
        ep.assets.get(turn.output_id).image.save(out / f"{turn.output_id}.png")
    summary = {
        "tool": args.name,
        "status": turn.status,
        "error_code": turn.error_code,
        "output_id": turn.output_id,
        "observation": turn.observation,
        "data": turn.result_data,
        "plumbing_only": turn.plumbing_only,
    }
    (out / "result.json").write_text(json.dumps(summary, indent=2, default=str))
    print(turn.observation)
    if turn.plumbing_only:
        print("WARNING: this result comes from a random-weight backend (plumbing only)", file=sys.stderr)
    toolbox.close()
    return 0 if turn.status == "ok" else 1
