"""`canvasagent pipeline --out runs/main`: data, SFT, GRPO, evaluation and a report, offline on CPU."""

from __future__ import annotations

import argparse
import logging
import os
import time

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("pipeline", help="the main job: build data, SFT, GRPO, evaluate, report (resumable)")
    p.add_argument("--out", default="runs/main", help="run folder (rerunning resumes it)")
    p.add_argument("--config", default="default", help="configs/pipeline/<name>.yaml or a path; the flags below override it")
    p.add_argument("--seed", type=int)
    p.add_argument("--sft-config")
    p.add_argument("--grpo-config")
    p.add_argument("--n-eval", type=int, help="held-out scripted tasks")
    p.add_argument("--n-eval-base", type=int, help="held-out tasks per source for the untrained model (slow, scores ~0)")
    p.add_argument("--data", choices=["mixed", "scripted", "canvascraft"],
                   help="mixed (default): scripted tasks plus a small offline CanvasCraft build; or one of them")
    p.add_argument("--stage", action="append", help="run only these stages (repeatable)")
    p.add_argument("--skip-base-eval", action="store_true", default=None)
    p.add_argument("--grpo-tasks", choices=["all", "unsolved"],
                   help="GRPO training tasks: all, or only those the SFT policy does not solve yet (an unsolved_tasks stage finds them)")
    p.add_argument("--sft-set", action="append", default=[], metavar="KEY=VALUE", help="override an SFT config field")
    p.add_argument("--grpo-set", action="append", default=[], metavar="KEY=VALUE", help="override a GRPO config field")
    p.set_defaults(func=_run)


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no affinity API (macOS, Windows)
        return max(1, os.cpu_count() or 1)


def _run(args: argparse.Namespace) -> int:
    # Stages run one at a time, each in a subprocess that inherits this environment, so torch may
    # use every usable core (SFT 1.4x faster on 2 cores than on 1). A set OMP_NUM_THREADS wins:
    # OMP_NUM_THREADS=1 gives the single-thread job (its float sums run in another order, so its
    # weights differ slightly: 4e-5 at most after 30 SFT steps).
    for k, v in (("OMP_NUM_THREADS", str(usable_cpus())), ("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"),
                 ("TRL_EXPERIMENTAL_SILENCE", "1")):
        os.environ.setdefault(k, v)
    from canvasagent.pipeline import PipelineConfig, run_pipeline
    from canvasagent.training.config import parse_override

    cfg = PipelineConfig.load(
        args.config, out=args.out, seed=args.seed, sft_config=args.sft_config, grpo_config=args.grpo_config,
        n_eval=args.n_eval, n_eval_base=args.n_eval_base, data=args.data, skip_base_eval=args.skip_base_eval, grpo_tasks=args.grpo_tasks,
        sft_overrides=dict(parse_override(s) for s in args.sft_set) or None,
        grpo_overrides=dict(parse_override(s) for s in args.grpo_set) or None,
    )
    t0 = time.monotonic()
    results = run_pipeline(cfg, args.stage)
    report = results.get("report") or {}
    if report.get("markdown"):
        print(open(report["markdown"]).read())
    log.info("pipeline: %s done in %.1f min; report %s", ", ".join(k for k in results if k != "report") or "nothing",
             (time.monotonic() - t0) / 60, report.get("markdown") or "not written")
    return 0
