"""`canvasagent eval --policy SPEC --tasks DIR --judge offline|http|local --out DIR`."""

from __future__ import annotations

import argparse
import logging
import sys
import time

from canvasagent.cli.common import add_tools_config_arg

log = logging.getLogger("canvasagent.eval")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="evaluate a policy on an eval split (paper metrics, report, charts)")
    p.add_argument("--policy", required=True, help="replay:PATH | hf:PATH_OR_ID | openai:MODEL@BASE_URL | scripted:NAME")
    p.add_argument("--tasks", required=True, help="eval split: a dir with tasks.jsonl, a .jsonl file, or a dir of */task.json")
    p.add_argument("--judge", default="offline", choices=("offline", "http", "local"))
    p.add_argument("--judge-model", default=None, help="local judge checkpoint, or the HTTP judge's model name")
    p.add_argument("--judge-url", default=None, help="HTTP judge base URL (OpenAI-compatible)")
    p.add_argument("--preset", default="paper", help="reward preset in configs/reward/ (default: paper)")
    p.add_argument("--out", required=True, help="output dir (trajectories, report.json/.md, charts)")
    p.add_argument("--workers", type=int, default=2, help="episodes run concurrently")
    p.add_argument("--max-turns", type=int, default=12)
    p.add_argument("--limit", type=int, default=None, help="evaluate only the first N tasks")
    p.add_argument("--no-resume", action="store_true", help="rerun tasks that already have results")
    p.add_argument("--success-threshold", type=float, default=0.5, help="alignment needed to count a success")
    p.add_argument("--image-budget", type=int, default=None, metavar="N",
                   help="show the policy only the last N tool images (older ones as their asset id); default all. "
                        "Use the image_budget the checkpoint was trained with")
    p.add_argument("--max-invalid", type=int, default=4, help="stop an episode after N unparseable replies in a row (0: never)")
    p.add_argument("--episode-timeout", type=float, default=0.0, help="wall-clock seconds per episode (0: none)")
    add_tools_config_arg(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from canvasagent.evaluation.api import evaluate_policy
    from canvasagent.evaluation.report import metrics_table
    from canvasagent.evaluation.runner import EvalConfig
    from canvasagent.core.policies.guards import GuardConfig

    console = Console(stderr=True)
    cfg = EvalConfig(
        workers=args.workers,
        max_turns=args.max_turns,
        tools=args.tools_config,
        success_threshold=args.success_threshold,
        resume=not args.no_resume,
        image_budget=args.image_budget,
        guard=GuardConfig(max_consecutive_invalid=args.max_invalid, episode_timeout_s=args.episode_timeout),
    )
    t0 = time.monotonic()
    seen = {"done": 0, "total": 0, "errors": 0, "logged": -1}
    # The bar is transient and drawn only on a terminal; logs get a line per tenth of the run
    # when nothing draws it, and a summary line at the end either way.
    with Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console, transient=True) as bar:
        job = bar.add_task("evaluating", total=None)

        def progress(done: int, total: int, res) -> None:
            bar.update(job, completed=done, total=total)
            seen.update(done=done, total=total)
            if res is not None and res.error:
                seen["errors"] += 1
                console.print(f"[yellow]{res.task_id}: {res.stop_reason}: {res.error}", soft_wrap=True)
            tenth = done * 10 // max(total, 1)
            if not console.is_terminal and res is not None and tenth > seen["logged"] and done < total:
                seen["logged"] = tenth
                log.info("eval: %d/%d tasks, %.0f s elapsed", done, total, time.monotonic() - t0)

        outcome = evaluate_policy(
            args.policy, args.tasks, args.out, args.judge, args.preset, cfg, args.limit, progress=progress,
            judge_model=args.judge_model, judge_url=args.judge_url,
        )
    log.info("eval: %d/%d tasks done in %.1f s (%d with errors); report %s", outcome.n_done, outcome.n_tasks,
             time.monotonic() - t0, seen["errors"], outcome.paths["markdown"])
    print(metrics_table({args.policy: outcome.summary.metrics}))
    s = outcome.summary
    print(f"\n{outcome.n_done}/{outcome.n_tasks} tasks done; success rate {s.success_rate:.3f}; report: {outcome.paths['markdown']}")
    if not outcome.complete:
        print("some tasks are unfinished (interrupted or not scored); rerun the same command to resume", file=sys.stderr)
        return 1
    return 0
