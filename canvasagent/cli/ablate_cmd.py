"""`canvasagent ablate --grid configs/ablation/paper.yaml --out DIR`: train + evaluate the paper's grid."""

from __future__ import annotations

import argparse
import logging
import sys
import time

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ablate", help="train and evaluate an ablation grid (paper Table 5); reruns skip finished cells")
    p.add_argument("--grid", required=True, help="configs/ablation/<name>.yaml or a path (paper, tiny_cpu)")
    p.add_argument("--out", required=True, help="output dir (runs, evaluations, table.md, curves.png)")
    p.add_argument("--cell", action="append", default=[], metavar="NAME",
                   help="run only this cell (repeatable; e.g. one per machine); the table covers every finished cell")
    p.add_argument("--dry-run", action="store_true", help="print the stages (finished ones under --out marked [done]) and validate the grid; train nothing")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from canvasagent.evaluation.ablation import AblationConfig, AblationRunner

    cfg = AblationConfig.load(args.grid)
    unknown = set(args.cell) - {c.name for c in cfg.cells}
    if unknown:
        print(f"error: no cell named {', '.join(sorted(unknown))} in {args.grid} ({', '.join(c.name for c in cfg.cells)})", file=sys.stderr)
        return 2
    runner = AblationRunner(cfg, args.out)
    if args.dry_run:
        print("\n".join(runner.plan()))
        problems = runner.problems()
        for msg in problems:
            print(f"problem: {msg}", file=sys.stderr)
        return 1 if problems else 0
    t0 = time.monotonic()
    out = runner.run(only=args.cell or None)
    print(out["markdown"])
    log.info("ablation: done in %.1f min, %d cell(s) failed", (time.monotonic() - t0) / 60, len(out["failures"]))
    if out["failures"]:
        print(f"{len(out['failures'])} cell(s) failed; rerun the same command to retry them", file=sys.stderr)
        return 1
    return 0
