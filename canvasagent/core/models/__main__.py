"""``python -m canvasagent.core.models build-tiny --out DIR [--seed N]``."""

from __future__ import annotations

import argparse
import logging
import os
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m canvasagent.core.models", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build-tiny", help="build the tiny random Qwen3-VL checkpoint offline")
    build.add_argument("--out", required=True, help="output directory (created if missing)")
    build.add_argument("--seed", type=int, default=0, help="weight-initialisation seed (default 0)")
    args = parser.parse_args(argv)

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    # Building never needs the network; make sure nothing tries it.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

    from canvasagent.core.models.tiny import build_tiny_qwen3vl

    print(build_tiny_qwen3vl(args.out, seed=args.seed))  # build-tiny: argparse rejects any other command
    return 0


if __name__ == "__main__":
    sys.exit(main())
