"""Which GRPO training tasks does the SFT policy not solve yet? A run's `sft/final` evaluated on the
train split of a CanvasCraft RL build, written as a task-id file for `data.task_ids`.

    python benchmarks/unsolved_tasks.py --run runs/ev_angles/seed_1 [--build DIR] [--samples N] [--ids FILE]

GRPO learns only from groups whose rollouts differ in reward; on a testbed the SFT policy mostly
solves, most groups carry no pass/fail signal. This evaluates the SFT checkpoint greedily and with
`--samples` episodes per task at the run's GRPO temperature (the run's held-out evaluation inputs
otherwise: tokens, turns, preset, judge, image budget, seed) on every task of the build's `train`
split (default: the run's own GRPO build; `--build` another one, e.g. a larger pool drawn with the
same mix) and writes the ids of the tasks where the greedy episode or any sampled one failed a
check, one per line, to `--ids` (default `<run>/unsolved_tasks/task_ids.txt`), with a table of
tasks and unsolved tasks per chain. GRPO then trains on those only with
`--grpo-set data.task_ids=FILE` (and `data.path=BUILD` for another build). Only training tasks
are read: the held-out split never decides what GRPO sees.

Episodes go under `<run>/unsolved_tasks/<build name>/{greedy,sampled}` and resume per task; a
folder begun under other evaluation inputs, another checkpoint or another task count is refused
(`stage_runner.StagedRun`'s `inputs.json`). Refuses a run without `sft/final`, a build that is not
a CanvasCraft RL build with a train split, and fewer than 1 sample.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections import Counter
from pathlib import Path

for _k, _v in (("OMP_NUM_THREADS", "1"), ("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1")):
    os.environ.setdefault(_k, _v)


def _at_least_one(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"--samples must be at least 1, not {n}")
    return n


def solved(greedy: dict[str, float], sampled: dict[str, float]) -> bool:
    """A task is solved when its greedy episode and every sampled one passed every check
    (`align/passed` is the passed share of a task's episodes)."""
    return greedy.get("align/passed", 0.0) >= 1.0 and sampled.get("align/passed", 0.0) >= 1.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", required=True, help="a pipeline run whose SFT stage finished (one seed folder of train_evidence)")
    ap.add_argument("--build", default=None, help="a CanvasCraft RL build (default: the run's GRPO build)")
    ap.add_argument("--samples", type=_at_least_one, default=None, help="sampled episodes per task (default: the run's eval_samples)")
    ap.add_argument("--ids", default=None, help="where to write the unsolved task ids")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    from grpo_fit import _checkpoint_stamp, recorded_pipeline  # sibling scripts: benchmarks/ is on sys.path
    from train_evidence import chain_key
    from canvascraft.build import read_tasks
    from canvasagent.stage_runner import StagedRun, StaleStage
    from canvasagent.training.common import workspace
    from canvasagent.training.evaluate import evaluate_checkpoint
    from canvasagent.training.rewarding import make_scorer

    run = Path(args.run).resolve()
    sft = run / "sft" / "final"
    if not sft.is_dir():
        raise SystemExit(f"{sft} is missing: unsolved_tasks needs a run whose SFT stage finished")
    pipe = recorded_pipeline(run)
    if args.build is None and pipe.grpo.data.format != "canvascraft":
        raise SystemExit(f"this run's GRPO data is {pipe.grpo.data.format!r}; name a CanvasCraft RL build with --build")
    build = Path(args.build).resolve() if args.build else pipe.grpo.resolve(pipe.grpo.data.path)
    try:
        tasks = read_tasks(build, "train")
    except (ValueError, FileNotFoundError) as err:
        raise SystemExit(f"{build}: not a CanvasCraft RL build with a train split ({err})") from None
    ws, e = workspace(pipe.sft), dict(pipe.eval_inputs("eval_sft"))
    e["samples"] = args.samples or e["samples"] or 1
    folder = run / "unsolved_tasks" / build.name
    inputs = {"eval": e, "build": str(build), "n_tasks": len(tasks), "checkpoint": _checkpoint_stamp(sft)}

    def measure() -> dict:
        toolbox = ws.env_cls.toolbox()
        try:
            res = evaluate_checkpoint(sft, tasks, make_scorer(e["preset"], e["judge"], toolbox), toolbox, ws.tool_fns, folder,
                                      max_turns=e["max_turns"], max_new_tokens=e["max_new_tokens"], temperature=e["temperature"],
                                      samples=e["samples"], seed=e["seed"], image_budget=e["image_budget"])
        finally:
            toolbox.close()
        return {"ids": [t.id for t in tasks], "greedy": res["greedy"].scores, "sampled": res["sampled"].scores}

    try:
        record = StagedRun(run / "unsolved_tasks", "unsolved_tasks").run(build.name, measure, inputs=inputs)
    except StaleStage as err:
        raise SystemExit(f"{folder} holds episodes of another checkpoint, build or evaluation inputs: {err}") from None
    keys = [chain_key(t.meta, t.expected_tools) for t in tasks]
    unsolved = [i for i, (g, s) in enumerate(zip(record["greedy"], record["sampled"], strict=True)) if not solved(g, s)]
    if not unsolved:
        raise SystemExit(f"the SFT policy solves all {len(tasks)} training tasks of {build}: no id file written")
    ids_path = Path(args.ids) if args.ids else folder / "task_ids.txt"
    ids_path.parent.mkdir(parents=True, exist_ok=True)
    ids_path.write_text(f"# training tasks of {build} that {sft} did not solve (greedy and {e['samples']} sampled at T {e['temperature']})\n"
                        + "".join(record["ids"][i] + "\n" for i in unsolved))
    total, left = Counter(keys), Counter(keys[i] for i in unsolved)
    lines = [f"# Training tasks the SFT policy does not solve yet: `{run}`", "",
             f"{len(unsolved)} of {len(tasks)} tasks of `{build}` (train split) unsolved: the greedy episode or one of "
             f"{e['samples']} sampled at T {e['temperature']} failed a check. Ids: `{ids_path}`.", "",
             "| chain (tone) | training tasks | unsolved |", "|---|---|---|",
             *[f"| {k} | {total[k]} | {left[k]} |" for k in sorted(total)], "",
             f"Evaluation time: {record['seconds']:.0f} s.", ""]
    text = "\n".join(lines)
    (folder / "report.md").write_text(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
