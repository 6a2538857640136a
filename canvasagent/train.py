"""`python -m canvasagent.train sft|grpo --config configs/train/<name>.yaml [--dry-run] [--resume] [--set k=v]`.

Multi-GPU runs go through accelerate, e.g.
`accelerate launch --config_file configs/accelerate/zero2_6gpu.yaml -m canvasagent.train grpo --config configs/train/grpo_qwen3vl_8b.yaml`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(prog="python -m canvasagent.train", description=__doc__)
    parser.add_argument("kind", choices=["sft", "grpo"])
    parser.add_argument("--config", required=True, help="configs/train/<name>.yaml or a name")
    parser.add_argument("--dry-run", action="store_true", help="build everything except the weights, then stop")
    parser.add_argument("--resume", action="store_true", help="continue from the last checkpoint in run.output_dir")
    parser.add_argument("--output-dir", help="override run.output_dir")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config field, e.g. optim.max_steps=3")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    return run_command(args)


def run_command(args: argparse.Namespace) -> int:
    from canvasagent.training import dry_run, run
    from canvasagent.training.config import TrainConfig, parse_override

    overrides = dict(parse_override(s) for s in args.set)
    if args.output_dir:
        overrides["run.output_dir"] = args.output_dir
    if args.resume:
        overrides["run.resume"] = True
    cfg = TrainConfig.load(args.config, overrides)
    if cfg.kind != args.kind:
        raise SystemExit(f"{args.config} is a {cfg.kind} config, not {args.kind}")
    if args.dry_run:
        sys.stdout.write(json.dumps(dry_run(cfg), indent=2, default=str) + "\n")
        return 0
    summary = run(cfg)
    sys.stdout.write(json.dumps({k: v for k, v in summary.items() if k != "log_history"}, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
