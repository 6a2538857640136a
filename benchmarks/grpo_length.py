"""Held-out reward and success against the number of GRPO steps, from evidence runs that share
their SFT stages (each a `benchmarks/train_evidence.py` folder whose GRPO ran for a given number
of steps, e.g. one run resumed to more steps in a copy of its folder).

    python benchmarks/grpo_length.py --run 180=runs/ev_sft800x3 --run 360=runs/ev_sft800x3_360 \
        --run 540=runs/ev_sft800x3_540 --out benchmarks/results/grpo_length_precision_sft800

Step 0 is the first run's `eval_sft`. Every point is GRPO minus SFT paired per held-out task and
pooled over the seeds (mean and standard error), greedy and sampled, for the hybrid reward and
the success rate. The training reward of the longest run (its `grpo/metrics.jsonl`, a moving
average per seed) is drawn beside it. Writes `<out>.md` and `<out>.png`. Refuses runs whose
seeds or held-out tasks differ from the first run's: their differences would not be paired.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from canvasagent.core.plotting import figure
from canvasagent.evaluation.metrics import paired_difference

MODES = {"greedy": "per_task", "sampled": "per_task_sampled"}
KEYS = ("hybrid", "success")


def _per_task(run: Path, seed: int, stage: str, mode: str) -> list[dict]:
    return json.loads((run / f"seed_{seed}" / stage / "done.json").read_text())[MODES[mode]]


def paired_points(runs: dict[int, Path], seeds: list[int]) -> dict[str, dict[str, list[tuple[int, float, float]]]]:
    """{mode: {key: [(steps, mean, se), ...]}}: GRPO minus SFT pooled over the seeds, step 0 first."""
    first = runs[min(runs)]
    out: dict[str, dict[str, list[tuple[int, float, float]]]] = {m: {k: [(0, 0.0, 0.0)] for k in KEYS} for m in MODES}
    for mode in MODES:
        sft = {s: _per_task(first, s, "eval_sft", mode) for s in seeds}
        for steps, run in sorted(runs.items()):
            before, after = [], []
            for s in seeds:
                grpo = _per_task(run, s, "eval_grpo", mode)
                if len(grpo) != len(sft[s]):
                    raise SystemExit(f"{run}: seed {s} has {len(grpo)} held-out tasks, {first} has {len(sft[s])}")
                before, after = before + sft[s], after + grpo
            for k in KEYS:
                d = paired_difference(before, after, k)
                out[mode][k].append((steps, d["mean_diff"], d["se"]))
    return out


def _check_same_tasks(runs: dict[int, Path], seeds: list[int]) -> None:
    first = runs[min(runs)]
    for steps, run in runs.items():
        for s in seeds:
            a, b = (r / f"seed_{s}" / "data" / "eval_tasks.jsonl" for r in (first, run))
            if a.read_text() != b.read_text():
                raise SystemExit(f"{run} seed {s}: its held-out tasks differ from {first}'s")


def training_reward(run: Path, seeds: list[int], window: int = 30) -> dict[int, list[tuple[int, float]]]:
    """{seed: [(step, moving average of the batch reward over `window` steps)]}."""
    curves = {}
    for s in seeds:
        by_step = {}
        for line in (run / f"seed_{s}" / "grpo" / "metrics.jsonl").read_text().splitlines():
            rec = json.loads(line) if line.strip() else {}
            if "reward" in rec:
                by_step[rec["step"]] = rec["reward"]  # a resumed run logs its replayed steps again: the last one counts
        steps = sorted(by_step)
        curves[s] = [(st, sum(by_step[x] for x in steps[max(0, i - window + 1): i + 1]) / min(i + 1, window))
                     for i, st in enumerate(steps)]
    return curves


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", action="append", required=True, metavar="STEPS=FOLDER",
                    help="an evidence run folder and its GRPO steps (repeatable)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--out", required=True, help="output path without suffix (.md and .png are written)")
    args = ap.parse_args(argv)
    runs = {}
    for item in args.run:
        steps, _, folder = item.partition("=")
        if not steps.isdigit() or not folder:
            raise SystemExit(f"--run {item!r}: expected STEPS=FOLDER, e.g. 360=runs/ev_sft800x3_360")
        runs[int(steps)] = Path(folder)
    _check_same_tasks(runs, args.seeds)
    points = paired_points(runs, args.seeds)
    curves = training_reward(runs[max(runs)], args.seeds)

    rows = ["| GRPO steps | " + " | ".join(f"{m} {k} (GRPO - SFT)" for m in MODES for k in KEYS) + " |",
            "|---|" + "---|" * (len(MODES) * len(KEYS))]
    for i, (steps, *_) in enumerate(points["greedy"]["hybrid"]):
        cells = [f"{points[m][k][i][1]:+.4f} ± {points[m][k][i][2]:.4f}" for m in MODES for k in KEYS]
        rows.append(f"| {steps} | " + " | ".join(cells) + " |")
    n = sum(len(_per_task(runs[min(runs)], s, "eval_sft", "greedy")) for s in args.seeds)
    command = " ".join(["python benchmarks/grpo_length.py", *(sys.argv[1:] if argv is None else argv)])
    header = (f"<!-- {command} -->\n# Held-out reward against GRPO steps\n\nRuns: {', '.join(f'{k} steps `{v}`' for k, v in sorted(runs.items()))}; "
              f"seeds {args.seeds}, {n} held-out tasks pooled. GRPO minus SFT paired per task (mean ± se).\n\n")
    Path(args.out).with_suffix(".md").write_text(header + "\n".join(rows) + "\n")

    with figure(Path(args.out).with_suffix(".png"), 1, 3, figsize=(15, 4.2)) as (_, axes):
        for ax, key in zip(axes[:2], KEYS):
            for shift, mode in zip((-4, 4), MODES):  # side by side, so the error bars do not hide each other
                xs, ms, ses = zip(*points[mode][key])
                ax.errorbar([x + shift for x in xs], ms, yerr=[2 * e for e in ses], marker="o", capsize=4, label=mode)
            ax.axhline(0, color="grey", lw=0.8)
            ax.set(xlabel="GRPO steps", ylabel=f"{key}: GRPO - SFT (± 2 se)", title=f"held-out {key}, paired, n={n}")
            ax.legend()
        for s, curve in curves.items():
            xs, ys = zip(*curve)
            axes[2].plot(xs, ys, label=f"seed {s}")
        axes[2].set(xlabel="GRPO step", ylabel="batch reward (30-step mean)", title=f"training reward, {max(runs)}-step run")
        axes[2].legend()
    print("\n".join(rows))


if __name__ == "__main__":
    main()
