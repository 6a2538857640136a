"""What the hybrid reward pays for each way of ending a held-out chain, without training.

    python benchmarks/chain_endings.py [--config testbed_more_chains] [--out runs/chain_endings]
                                       [--results benchmarks/results/chain_endings.md] [--preset paper]

Builds (or finds) the pipeline's data, takes its held-out tasks whose reference solution has two
or more calls, and replays five endings of each through the episode runner: the reference
solution; its first call, then Terminate; the first call plus the second call applied to the input
instead of the first call's output (valid, executes, wrong); the first call plus a second call on
an asset that does not exist (fails); Terminate at once. Every trajectory is scored by the
scorer GRPO and the evaluation use (the GRPO config's preset and judge; `--preset` another). It prints the mean of
each component and the strict success rate per ending. What GRPO learns to prefer among the
wrong endings is read off this table: an ending that stops early must not be paid more than
one that tries the next step.
"""

from __future__ import annotations

import argparse
import copy
import os
from pathlib import Path
from statistics import mean

for _k, _v in (("OMP_NUM_THREADS", "1"), ("HF_HUB_OFFLINE", "1")):
    os.environ.setdefault(_k, _v)

from canvasagent.core.episode import EpisodeConfig, run_episode  # noqa: E402
from canvasagent.core.policies.replay import ReplayPolicy  # noqa: E402
from canvasagent.core.protocol import format_reply  # noqa: E402
from canvasagent.pipeline import Pipeline, PipelineConfig  # noqa: E402
from canvasagent.training.common import workspace  # noqa: E402
from canvasagent.training.rewarding import make_scorer  # noqa: E402

KEYS = ("hybrid", "rule", "align", "traj", "traj/flow", "aes", "align/passed")


def on_the_input(call: dict, first: dict) -> dict:
    """`call` with every reference to the first call's output replaced by the input img_1."""
    c = copy.deepcopy(call)
    produced = f"{first['name']}_0"
    c["arguments"] = {k: "img_1" if v == produced else v for k, v in c["arguments"].items()}
    return c


def on_a_missing_asset(call: dict) -> dict:
    c = copy.deepcopy(call)
    c["arguments"] = {k: "img_99" if isinstance(v, str) and (v.startswith("img_") or v.rsplit("_", 1)[-1].isdigit()) else v
                      for k, v in c["arguments"].items()}
    return c


def endings(calls: list[dict]) -> dict[str, list[dict]]:
    first, second = calls[0], calls[1]
    return {"reference": calls, "first call only": [first], "second call on the input": [first, on_the_input(second, first)],
            "second call fails": [first, on_a_missing_asset(second)], "nothing": []}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="testbed_more_chains", help="configs/pipeline/<name>.yaml or a path")
    ap.add_argument("--out", default="runs/chain_endings", help="the pipeline run folder whose data stage is used (built if missing)")
    ap.add_argument("--results", default="benchmarks/results/chain_endings.md")
    ap.add_argument("--preset", default=None, help="a configs/reward/ preset (default: the GRPO config's)")
    args = ap.parse_args(argv)

    pipe = Pipeline(PipelineConfig.load(args.config, out=args.out))
    pipe.run(only=["data"])
    tasks, _ = pipe.eval_tasks()
    ws = workspace(pipe.sft, build_model=False)
    toolbox = ws.env_cls.toolbox()
    preset, judge = args.preset or pipe.grpo.grpo.reward_preset, pipe.grpo.grpo.judge
    scorer = make_scorer(preset, judge, toolbox)
    rows: dict[str, dict[str, list[float]]] = {}
    try:
        for task in tasks:
            calls = task.meta.get("reference_calls") or []
            if len(calls) < 2:
                continue
            for name, seq in endings(calls).items():
                replies = [format_reply("step", c) for c in seq] + [format_reply("done", terminate=True)]
                traj = run_episode(ReplayPolicy(replies), task, toolbox, EpisodeConfig(max_turns=pipe.grpo.grpo.max_turns))
                scores = scorer(traj)
                acc = rows.setdefault(name, {k: [] for k in KEYS})
                for k in KEYS:
                    if k in scores or k != "traj/flow":  # flow exists only where a call can be compared
                        acc[k].append(float(scores.get(k, 0.0)))
    finally:
        toolbox.close()
    n = len(rows.get("reference", {}).get("hybrid", []))
    lines = [f"# Chain endings: what the reward pays ({args.config})", "",
             f"`python benchmarks/chain_endings.py --config {args.config}{f' --preset {args.preset}' if args.preset else ''}`: "
             f"{n} held-out tasks with a reference solution "
             f"of two or more calls, scored with preset `{preset}`, judge `{judge}`.", "",
             "| ending | hybrid | rule | align | traj | traj flow | aes | success |", "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {name} | " + " | ".join(f"{mean(r[k]):.3f}" if r[k] else "–" for k in KEYS) + " |" for name, r in rows.items()]
    if n:
        stop, fail = mean(rows["first call only"]["hybrid"]), mean(rows["second call fails"]["hybrid"])
        lines += ["", f"stopping after the first call minus a failed second call: {stop - fail:+.3f} hybrid "
                      f"({'stopping early pays more' if stop > fail else 'trying pays at least as much'})"]
    text = "\n".join(lines) + "\n"
    Path(args.results).parent.mkdir(parents=True, exist_ok=True)
    Path(args.results).write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
