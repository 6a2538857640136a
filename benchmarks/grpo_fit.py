"""Does GRPO raise the reward on the tasks it trained on? SFT and GRPO checkpoints of a finished
pipeline run, evaluated on the run's own GRPO training split, paired per task.

    python benchmarks/grpo_fit.py --run runs/ev_warm600_ho96_len384/seed_1 [--limit N] [--md FILE]

The held-out evaluation cannot tell an optimisation failure (GRPO does not raise the expected
reward even on its own prompts) from a generalisation failure (it raises it there, not on fresh
tasks). This runs `training.evaluate.evaluate_checkpoint` on the first `--limit` tasks of the
GRPO `train` split, greedy and sampled, under the run's evaluation inputs (the temperature,
episodes per task, tokens, turns, preset and judge of its held-out stages), for `sft/final` and
`grpo/final`, and reports the paired GRPO-minus-SFT difference of the hybrid reward, success
and the share of sampled episodes that passed every check, per task family and per argument
(exact share, `chain_behaviour.precision_table`), next to the run's held-out numbers.
Episodes go under `<run>/fit_train/{sft,grpo}/{greedy,sampled}` (`fit_train_first<N>` with
`--limit N`); a rerun resumes per task. Refuses a run without both final checkpoints or a
non-CanvasCraft GRPO split, a limit below 1, and a folder whose episodes came from other
checkpoints or evaluation inputs (`inputs.json`, held as `stage_runner.StagedRun` holds a
stage's). A finished folder (`done.json`) is reported again without loading the checkpoints.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

for _k, _v in (("OMP_NUM_THREADS", "1"), ("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1")):
    os.environ.setdefault(_k, _v)

from canvasagent.evaluation.metrics import paired_difference, task_score  # noqa: E402

STAGES = {"sft": "sft/final", "grpo": "grpo/final"}
PAIRED = {"hybrid": "hybrid", "success": "success", "pass_rate": "align/passed"}


def _positive(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"--limit must be at least 1, not {n}")
    return n


def _checkpoint_stamp(folder: Path) -> dict[str, list[int]]:
    """Size and modification time of each weight file: a retrained checkpoint changes them."""
    return {p.name: [p.stat().st_size, p.stat().st_mtime_ns] for p in sorted(folder.glob("*.safetensors"))}


def recorded_pipeline(run: Path):
    """The `Pipeline` of a finished run under the config the run recorded (pipeline_config.json),
    not its YAML's present state."""
    from canvasagent.pipeline import Pipeline, PipelineConfig
    from toolserver.config import from_dict

    return Pipeline(from_dict(PipelineConfig, {**json.loads((run / "pipeline_config.json").read_text()), "out": str(run)}))


def _fmt(d: dict) -> str:
    return f"{d['mean_diff']:+.4f} (±{d['se']:.4f}; up {d['wins']}, down {d['losses']})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", required=True, help="a finished pipeline run (one seed folder of train_evidence)")
    ap.add_argument("--limit", type=_positive, default=None, help="the first N training tasks (default: all)")
    ap.add_argument("--md", default=None, help="also write the report to this markdown file")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    from chain_behaviour import precision_table, statement_table  # sibling scripts: benchmarks/ is on sys.path
    from train_evidence import family
    from canvascraft.build import read_tasks
    from canvasagent.stage_runner import StagedRun, StaleStage
    from canvasagent.training.common import workspace
    from canvasagent.training.evaluate import evaluate_checkpoint
    from canvasagent.training.rewarding import make_scorer

    run = Path(args.run).resolve()
    for rel in STAGES.values():
        if not (run / rel).is_dir():
            raise SystemExit(f"{run / rel} is missing: grpo_fit needs a run whose SFT and GRPO stages finished")
    pipe = recorded_pipeline(run)
    if pipe.grpo.data.format != "canvascraft":
        raise SystemExit(f"grpo_fit reads a CanvasCraft build's train split; this run's GRPO data is {pipe.grpo.data.format!r}")
    tasks = read_tasks(pipe.grpo.resolve(pipe.grpo.data.path), "train")[: args.limit]
    ws, e = workspace(pipe.sft), pipe.eval_inputs("eval_sft")
    # Episodes resume per task, so a folder holds one task count, one pair of checkpoints and one
    # set of evaluation inputs; anything else would pool episodes of different runs.
    folder = run / ("fit_train" if args.limit is None else f"fit_train_first{args.limit}")
    inputs = {"eval": e, "n_tasks": len(tasks), "checkpoints": {n: _checkpoint_stamp(run / rel) for n, rel in STAGES.items()}}

    def measure() -> dict:
        toolbox = ws.env_cls.toolbox()
        scorer = make_scorer(e["preset"], e["judge"], toolbox)
        scores: dict = {}
        try:
            for name, rel in STAGES.items():
                res = evaluate_checkpoint(run / rel, tasks, scorer, toolbox, ws.tool_fns, folder / name,
                                          max_turns=e["max_turns"], max_new_tokens=e["max_new_tokens"],
                                          temperature=e["temperature"], samples=e["samples"], seed=e["seed"],
                                          image_budget=e["image_budget"])
                scores[name] = {mode: r.scores for mode, r in res.items()}
        finally:
            toolbox.close()
        return {"scores": scores}

    try:
        record = StagedRun(run, "grpo_fit").run(folder.name, measure, inputs=inputs)
    except StaleStage as err:
        raise SystemExit(f"{folder} holds episodes of other checkpoints or evaluation inputs: {err}") from None
    scores = record["scores"]

    fams = [family(t.to_dict()) for t in tasks]
    lines = [f"# GRPO on its own training tasks: `{run}`", "",
             f"{len(tasks)} tasks of the GRPO train split ({fams.count('one call')} one call, {fams.count('chain')} chains) "
             f"against the run's held-out split; greedy and {e['samples']} sampled episodes per task at T {e['temperature']}; "
             "paired GRPO minus SFT.", "",
             "| split | mode | n | hybrid SFT -> GRPO | hybrid diff | success SFT -> GRPO | success diff | passed-episode share diff |",
             "|---|---|---|---|---|---|---|---|"]
    report: dict = {"run": str(run), "n_tasks": len(tasks), "train": {}, "held_out": {}}
    held = {s: json.loads((run / s / "done.json").read_text()) for s in ("eval_sft", "eval_grpo") if (run / s / "done.json").exists()}
    for mode, tkey in (("greedy", "per_task"), ("sampled", "per_task_sampled")):
        if mode not in scores["sft"]:
            continue
        b, a = scores["sft"][mode], scores["grpo"][mode]
        splits = [("train", b, a)]
        hb, ha = (held.get(s, {}).get(tkey) for s in ("eval_sft", "eval_grpo"))
        if hb and ha:
            splits.append(("held out", hb, ha))
        for split, before, after in splits:
            d = {k: paired_difference(before, after, pk) for k, pk in PAIRED.items()}
            means = {k: (sum(task_score(x, pk) for x in before) / len(before), sum(task_score(x, pk) for x in after) / len(after))
                     for k, pk in PAIRED.items()}
            report["train" if split == "train" else "held_out"][mode] = {"paired": d, "means": means}
            lines.append(f"| {split} | {mode} | {len(before)} | {means['hybrid'][0]:.4f} -> {means['hybrid'][1]:.4f} | {_fmt(d['hybrid'])} | "
                         f"{means['success'][0]:.3f} -> {means['success'][1]:.3f} | {_fmt(d['success'])} | {_fmt(d['pass_rate'])} |")
    lines += ["", "Training tasks by family (paired hybrid diff / success diff):", "",
              "| family | mode | n | hybrid diff | success diff |", "|---|---|---|---|---|"]
    for fam in ("one call", "chain"):
        ix = [i for i, f in enumerate(fams) if f == fam]
        for mode in scores["sft"]:
            b = [scores["sft"][mode][i] for i in ix]
            a = [scores["grpo"][mode][i] for i in ix]
            if ix:
                lines.append(f"| {fam} | {mode} | {len(ix)} | {_fmt(paired_difference(b, a, 'hybrid'))} | {_fmt(paired_difference(b, a, 'success'))} |")
    lines += ["", "Parameter precision on the training tasks (exact share of the episodes that ran the reference call):", ""]
    stages = (f"{folder.name}/sft", f"{folder.name}/grpo")
    lines += precision_table([run], stages=stages)
    lines += ["", *statement_table([run], stages)]
    lines += ["", f"Evaluation time: {record['seconds']:.0f} s."]
    text = "\n".join(lines) + "\n"
    (folder / "report.json").write_text(json.dumps(report, indent=2))
    (folder / "report.md").write_text(text)
    if args.md:
        Path(args.md).write_text(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
