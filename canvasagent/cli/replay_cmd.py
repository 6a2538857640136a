"""`canvasagent replay TRAJ --image img_1=PATH … --out DIR`."""

from __future__ import annotations

import argparse
from pathlib import Path

from canvasagent.cli.common import add_tools_config_arg, parse_image_args
from toolserver.config import ToolsConfig
from toolserver.client import make_toolbox
from canvasagent.core.formats.sharegpt import FormatError, is_sharegpt, iter_records, read_record
from canvasagent.replay import from_public, from_trajectory, replay, write_report
from canvasagent.core.trajectory import Trajectory


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("replay", help="replay a recorded trajectory (ours or public ShareGPT) and report")
    p.add_argument("traj", help="trajectory.json / its directory, or a ShareGPT .json/.jsonl file")
    p.add_argument("--image", action="append", metavar="img_N=PATH", help="input images (default: from the record)")
    p.add_argument("--index", type=int, default=0, help="record index in a multi-record ShareGPT file")
    p.add_argument("--images-root", default=None, help="base directory for the record's image paths (default: its folder)")
    p.add_argument("--allow-root", action="append", metavar="DIR",
                   help="a folder the record's image paths may point into (repeatable; default: the base directory only)")
    p.add_argument("--out", required=True)
    add_tools_config_arg(p)
    p.set_defaults(func=cmd_replay)


def _load_input(args: argparse.Namespace):
    path = Path(args.traj)
    if path.is_dir() or path.name == "trajectory.json":
        traj = Trajectory.load(path)
        rin = from_trajectory(traj)
        overrides = parse_image_args(args.image)
        if overrides:
            rin.task.images = [overrides[k] for k in sorted(overrides)]
        return rin
    records = list(iter_records(path))
    if not records:
        raise FormatError(f"{path} holds no records")
    if not 0 <= args.index < len(records):
        raise FormatError(f"--index {args.index} out of range: {path} holds {len(records)} records")
    rec = records[args.index]
    if not is_sharegpt(rec):
        raise FormatError(f"{path} is neither our trajectory.json nor a ShareGPT record")
    base = Path(args.images_root) if args.images_root else path.parent
    roots = [base, *args.allow_root] if args.allow_root else None
    pt = read_record(rec, base_dir=base, allowed_roots=roots, input_overrides=parse_image_args(args.image) or None)
    return from_public(pt)


def cmd_replay(args: argparse.Namespace) -> int:
    rin = _load_input(args)
    toolbox = make_toolbox(ToolsConfig.load(args.tools_config))
    traj, report = replay(rin, toolbox)
    path = write_report(traj, report, args.out)
    s = report["summary"]
    print(
        f"replayed {s['turns']} turns: {s['ok']} ok, {s['errors']} errors; echo matches {s['echo_matches']}, "
        f"pixel matches {s['pixel_matches']}; final {report['final_asset_id']} -> {path}"
    )
    return 0
