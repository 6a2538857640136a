"""`python -m canvasagent.train sft|grpo --config configs/train/<name>.yaml [--dry-run] [--resume] [--set k=v]`.

Multi-GPU runs go through accelerate, e.g.
`accelerate launch --config_file configs/accelerate/zero2_6gpu.yaml -m canvasagent.train grpo --config configs/train/grpo_qwen3vl_8b.yaml`.

Exit codes: 0 done (or a dry run that found nothing), 1 a dry run that found problems (listed on
stderr, and under `problems` in the JSON report), 2 a bad config name, key or value, or a run
that could not start. Errors are one line per problem; `--debug` shows tracebacks.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from canvasagent.cli import errors
from canvasagent.cli.errors import add_debug_arg, quiet_third_party_loggers


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or errors.ShortErrorParser(prog="python -m canvasagent.train", description=__doc__)
    parser.add_argument("kind", choices=["sft", "grpo"])
    parser.add_argument("--config", required=True, help="configs/train/<name>.yaml or a name")
    parser.add_argument("--dry-run", action="store_true", help="build everything except the weights, then stop")
    parser.add_argument("--resume", action="store_true", help="continue from the last checkpoint in run.output_dir")
    parser.add_argument("--output-dir", help="override run.output_dir")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config field, e.g. optim.max_steps=3")
    add_debug_arg(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not args.debug:
        quiet_third_party_loggers()
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    return errors.run_command(run_command, args)


def load_config(name: str, overrides: dict):
    """The config, or a ValueError naming the shipped configs when `name` is neither a file nor one of them."""
    from canvasagent.training.config import TrainConfig

    try:
        return TrainConfig.load(name, overrides)
    except FileNotFoundError:
        raise ValueError(f"no training config {name!r}; choose a YAML path or one of: {errors.config_choices('train')}") from None


def run_command(args: argparse.Namespace) -> int:
    from canvasagent.training import dry_run, run
    from canvasagent.training.config import parse_override

    overrides = dict(parse_override(s) for s in args.set)
    if args.output_dir:
        overrides["run.output_dir"] = args.output_dir
    if args.resume:
        overrides["run.resume"] = True
    cfg = load_config(args.config, overrides)
    if cfg.kind != args.kind:
        raise ValueError(f"{args.config} is a {cfg.kind} config, not {args.kind} (run `python -m canvasagent.train {cfg.kind} --config {args.config}`)")
    if args.dry_run:
        report = dry_run(cfg)
        sys.stdout.write(json.dumps(report, indent=2, default=str) + "\n")
        if not report["ok"]:
            sys.stderr.write("dry run: the run cannot start:\n" + "".join(f"  - {p}\n" for p in report["problems"]))
            return 1
        return 0
    summary = run(cfg)
    sys.stdout.write(json.dumps({k: v for k, v in summary.items() if k != "log_history"}, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
