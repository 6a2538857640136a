"""Evidence that training learns: the pipeline over several seeds, on held-out tasks, paired per task.

    python benchmarks/train_evidence.py --out runs/train_evidence [--config testbed] [--seeds 0 1 2]

For each seed it runs `canvasagent pipeline --config CONFIG` (default: the GRPO testbed,
configs/pipeline/testbed.yaml: SFT on single-tool demonstrations and a few chains, GRPO and
held-out evaluation on compositional offline chains) and reports format validity, rule score,
hybrid reward and strict success before SFT (the first `n_eval_base` tasks), after SFT and after
GRPO, greedy and sampled. GRPO against SFT is paired per held-out task: per seed and pooled over
the seeds (mean difference and standard error). Targets: after GRPO the hybrid reward and the
success rate are higher than after SFT on every seed, greedy and sampled, and the pooled paired
difference exceeds 2 standard errors. Numbers are reported as measured, target met or not.
Writes `<out>/train_evidence.{md,json}` and `<out>/train_evidence.png` (the paired differences per
seed and pooled, with bars of 2 standard errors).
Resumable: finished stages of each seed are skipped on a rerun.

`--grpo-on-unsolved` runs every seed with the pipeline's `grpo_tasks: unsolved` (a config may set it
too): after SFT and its evaluation, the `unsolved_tasks` stage lists the GRPO training tasks the SFT
policy does not solve yet (greedy, or one of the run's `eval_samples` sampled episodes, fails a
check) in `seed_N/unsolved_tasks/task_ids.txt`, and GRPO trains on those only. A seed whose SFT
solves every training task stops the run with that message. The held-out split never decides what
GRPO sees.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections import Counter
from pathlib import Path

for _k, _v in (("OMP_NUM_THREADS", "1"), ("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"), ("TRL_EXPERIMENTAL_SILENCE", "1")):
    os.environ.setdefault(_k, _v)

from canvasagent.evaluation.metrics import paired_difference, task_score  # noqa: E402
from canvasagent.training.unsolved import chain_key  # noqa: E402

STAGES = ("eval_base", "eval_sft", "eval_grpo")
KEYS = ("format_validity", "rule", "hybrid", "success")
# Paired per task: name -> the per-task score (`metrics.task_score`). success: the task succeeded
# (greedy: every check passed; sampled: in at least half its episodes), so the paired difference is
# that of the success columns; pass_rate: the share of its episodes that passed every check.
PAIRED = {"hybrid": "hybrid", "success": "success", "pass_rate": "align/passed"}


def pooled_paired(ids: list[str], before: list[dict], after: list[dict], key: str) -> dict:
    """`paired_difference` over every (seed, task) pair, with its standard error the larger of the
    per-pair one and the task-clustered one (`se_pairs`, `se_tasks`): seeds that share held-out
    tasks are not independent samples of tasks, so there each task's differences are averaged
    over the seeds first and the se is taken over the `tasks` distinct tasks."""
    out = paired_difference(before, after, key)
    per_task: dict[str, list[float]] = {}
    for i, b, a in zip(ids, before, after, strict=True):
        per_task.setdefault(i, []).append(task_score(a, key) - task_score(b, key))
    means = [sum(v) / len(v) for v in per_task.values()]
    n, mean = len(means), sum(means) / max(len(means), 1)
    se_tasks = (sum((x - mean) ** 2 for x in means) / (n - 1) / n) ** 0.5 if n > 1 else 0.0
    return {**out, "tasks": n, "se_pairs": out["se"], "se_tasks": se_tasks, "se": max(out["se"], se_tasks)}


def draw_paired(rows: list[dict], pooled: dict[str, dict], path: Path) -> Path:
    """GRPO minus SFT, paired per held-out task, as a figure: one panel per measure (hybrid reward,
    success), one column of points per seed and the pooled one, greedy and sampled side by side,
    each with a bar of 2 standard errors either side, so a difference clear of zero is one whose
    bar does not cross the zero line. `rows` and `pooled` are main()'s (`<mode>_paired_<key>` and
    `<mode>_<key>` entries holding `mean_diff` and `se`)."""
    from canvasagent.core.plotting import figure

    labels = [f"seed {r['seed']}" for r in rows] + ["pooled"]
    with figure(path, 1, 2, figsize=(4.2 + 1.1 * len(labels), 3.8)) as (_, axes):
        for ax, (key, title) in zip(axes, (("hybrid", "hybrid reward"), ("success", "success"))):
            for shift, mode, colour in ((-0.12, "greedy", "tab:blue"), (0.12, "sampled", "tab:orange")):
                stats = [r[f"{mode}_paired_{key}"] for r in rows] + [pooled[f"{mode}_{key}"]]
                ax.errorbar([i + shift for i in range(len(stats))], [s["mean_diff"] for s in stats],
                            yerr=[2 * s["se"] for s in stats], fmt="o", capsize=4, color=colour, label=mode)
            ax.axhline(0.0, color="grey", linewidth=0.8)
            ax.axvline(len(rows) - 0.5, color="lightgrey", linewidth=0.8, linestyle=":")
            ax.set_xticks(range(len(labels)), labels)
            ax.set_title(f"GRPO - SFT, {title} (±2 se)")
        axes[0].legend(loc="best", fontsize="small")
    return path


def _eval_tasks(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "data" / "eval_tasks.jsonl").read_text().splitlines() if line.strip()]


def family(task: dict) -> str:
    """`one call` when the task's reference solution is a single call (its success hangs on that
    call's parameters: a box, an angle, a text), else `chain`."""
    return "one call" if len(task.get("meta", {}).get("reference_calls") or task["expected_tools"]) == 1 else "chain"


def grpo_pool(run: Path) -> Counter[str] | None:
    """How many of the run's GRPO training tasks each chain has (`chain_key`), read from its
    CanvasCraft build, only the tasks of its `data.task_ids` file when the run's recorded GRPO config
    (`pipeline_config.json`, `grpo_fit.recorded_pipeline`) names one; None when the run trained GRPO
    on no build (made tasks only)."""
    from grpo_fit import recorded_pipeline  # a sibling script
    from canvasagent.evaluation.tasks_io import load_tasks
    from canvasagent.training.data import read_task_ids

    path = run / "data" / "canvascraft" / "rl"
    if not path.is_dir():
        return None
    tasks = load_tasks(path, split="train")
    grpo = recorded_pipeline(run).grpo if (run / "pipeline_config.json").exists() else None
    if grpo is not None and grpo.data.task_ids is not None:
        wanted = read_task_ids(grpo.resolve(grpo.data.task_ids))
        tasks = [t for t in tasks if t.id in wanted]
    return Counter(chain_key(t.meta, t.expected_tools) for t in tasks)


def _by_chain(tasks: list[dict], res: dict, pool: Counter[str] | None = None) -> dict[str, dict[str, float]]:
    """Greedy and sampled hybrid reward and success after SFT and after GRPO, per held-out chain
    (tone: explicit or implicit instruction), and the chain's GRPO training tasks (`pool`, under
    `grpo_tasks`; absent without one); sums and counts, so seeds pool."""
    out: dict[str, dict[str, float]] = {}
    for i, t in enumerate(tasks):
        key = chain_key(t.get("meta", {}), t["expected_tools"])
        acc = out.setdefault(key, {"n": 0, **({"grpo_tasks": pool.get(key, 0)} if pool is not None else {})})
        acc["n"] += 1
        for mode, tkey in (("greedy", "per_task"), ("sampled", "per_task_sampled")):
            for stage in ("eval_sft", "eval_grpo"):
                scores = res[stage].get(tkey) or []
                if i < len(scores):
                    for k, pk in PAIRED.items():
                        name = f"{mode}_{stage}_{k}"
                        acc[name] = acc.get(name, 0.0) + task_score(scores[i], pk)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/train_evidence")
    ap.add_argument("--config", default="testbed", help="configs/pipeline/<name>.yaml or a path")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--sft-set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--grpo-set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--grpo-on-unsolved", action="store_true",
                    help="GRPO trains only on the training tasks the SFT policy does not solve yet (see above)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    from chain_behaviour import grpo_groups, group_preference, precision_table, statement_table, success_signal, table as ending_table  # a sibling script: benchmarks/ is on sys.path
    from canvasagent.pipeline import PipelineConfig, run_pipeline
    from canvasagent.training.config import parse_override

    out = Path(args.out)
    rows, pooled, by_family, t0 = [], {}, {}, time.perf_counter()
    for seed in args.seeds:
        cfg = PipelineConfig.load(args.config, out=str(out / f"seed_{seed}"), seed=seed,
                                  grpo_tasks="unsolved" if args.grpo_on_unsolved else None)
        cfg.sft_overrides.update(dict(parse_override(s) for s in args.sft_set))
        cfg.grpo_overrides.update(dict(parse_override(s) for s in args.grpo_set))
        grpo_tasks = cfg.grpo_tasks
        res = run_pipeline(cfg)
        tasks = _eval_tasks(out / f"seed_{seed}")
        families = [family(t) for t in tasks]
        row: dict = {"seed": seed, "seconds": {k: v.get("seconds") for k, v in res.items() if isinstance(v, dict)}}
        if unsolved := res.get("unsolved_tasks"):
            row["unsolved_tasks"] = {"unsolved": len(unsolved["unsolved"]), "of": unsolved["n_tasks"]}
        for mode, mkey, tkey in (("greedy", "metrics", "per_task"), ("sampled", "metrics_sampled", "per_task_sampled")):
            for stage in STAGES:
                m = res[stage].get(mkey) or {}
                for k in KEYS:
                    row[f"{mode}_{stage}_{k}"] = m.get(k, float("nan"))
            for key, pkey in PAIRED.items():
                sft, grpo = res["eval_sft"][tkey], res["eval_grpo"][tkey]
                row[f"{mode}_paired_{key}"] = paired_difference(sft, grpo, pkey)
                ids, before, after = pooled.setdefault(f"{mode}_{key}", (pkey, [], [], []))[1:]
                ids.extend(t["id"] for t in tasks)
                before.extend(sft)
                after.extend(grpo)
                for fam, b, a in zip(families, sft, grpo, strict=True):  # eval_tasks.jsonl is the evaluated order
                    fb, fa = by_family.setdefault((fam, mode, key), ([], []))
                    fb.append(b)
                    fa.append(a)
        row["by_chain"] = _by_chain(tasks, res, grpo_pool(out / f"seed_{seed}"))
        rows.append(row)
    pooled_stats = {k: pooled_paired(ids, sft, grpo, pkey) for k, (pkey, ids, sft, grpo) in pooled.items()}
    family_stats = {f"{fam} {mode} {key}": {**paired_difference(b, a, PAIRED[key]),
                                            "sft": sum(task_score(x, PAIRED[key]) for x in b) / len(b),
                                            "grpo": sum(task_score(x, PAIRED[key]) for x in a) / len(a)}
                    for (fam, mode, key), (b, a) in sorted(by_family.items())}

    # -- tables --------------------------------------------------------------------------------------
    def table(mode: str) -> list[str]:
        hdr = ("| seed | format base / SFT / GRPO | rule base / SFT / GRPO | reward base / SFT / GRPO | "
               "success base / SFT / GRPO | reward diff (±se) | success diff (±se) | reward up | success up |")
        lines = [hdr, "|" + "---|" * (hdr.count("|") - 1)]
        for r in rows:
            cell = lambda k, f: " / ".join(f.format(r[f"{mode}_{st}_{k}"]) for st in STAGES)
            ph, ps = r[f"{mode}_paired_hybrid"], r[f"{mode}_paired_success"]
            lines.append(
                f"| {r['seed']} | {cell('format_validity', '{:.3f}')} | {cell('rule', '{:.3f}')} | {cell('hybrid', '{:.4f}')} | "
                f"{cell('success', '{:.3f}')} | {ph['mean_diff']:+.4f} (±{ph['se']:.4f}) | {ps['mean_diff']:+.3f} (±{ps['se']:.3f}) | "
                f"{'yes' if r[f'{mode}_eval_grpo_hybrid'] > r[f'{mode}_eval_sft_hybrid'] else 'NO'} | "
                f"{'yes' if r[f'{mode}_eval_grpo_success'] > r[f'{mode}_eval_sft_success'] else 'NO'} |")
        ph, ps = pooled_stats[f"{mode}_hybrid"], pooled_stats[f"{mode}_success"]
        lines.append(f"| pooled (n={ph['n']}, {ph['tasks']} tasks) | | | | | {ph['mean_diff']:+.4f} (±{ph['se']:.4f}) | "
                     f"{ps['mean_diff']:+.3f} (±{ps['se']:.3f}) | {'yes' if ph['mean_diff'] > 2 * ph['se'] else 'NO'} (>2 se) | "
                     f"{'yes' if ps['mean_diff'] > 2 * ps['se'] else 'NO'} (>2 se) |")
        return lines

    def pass_rate_line() -> str:
        cells = [f"seed {r['seed']} {r['sampled_paired_pass_rate']['mean_diff']:+.3f} (±{r['sampled_paired_pass_rate']['se']:.3f})" for r in rows]
        p = pooled_stats["sampled_pass_rate"]
        return ("Sampled episodes that passed every check, GRPO minus SFT paired per task: " + ", ".join(cells)
                + f"; pooled {p['mean_diff']:+.3f} (±{p['se']:.3f}).")

    chains: dict[str, dict[str, float]] = {}
    for r in rows:
        for key, acc in r["by_chain"].items():
            tot = chains.setdefault(key, {})
            for k, v in acc.items():
                tot[k] = tot.get(k, 0.0) + v
    chain_lines = ["| chain (tone) | tasks x seeds | GRPO training tasks x seeds | greedy reward SFT -> GRPO | greedy success SFT -> GRPO | "
                   "sampled reward SFT -> GRPO | sampled success SFT -> GRPO |", "|---|---|---|---|---|---|---|"]
    for key, t in sorted(chains.items()):
        n = t["n"]
        cell = lambda mode, k: f"{t.get(f'{mode}_eval_sft_{k}', 0) / n:.3f} -> {t.get(f'{mode}_eval_grpo_{k}', 0) / n:.3f}"
        chain_lines.append(f"| {key} | {int(n)} | {int(t['grpo_tasks']) if 'grpo_tasks' in t else '-'} | {cell('greedy', 'hybrid')} | "
                           f"{cell('greedy', 'success')} | {cell('sampled', 'hybrid')} | {cell('sampled', 'success')} |")

    fam_lines = ["| task family | mode | tasks x seeds | reward SFT -> GRPO | paired (±se) | success SFT -> GRPO | paired (±se) |",
                 "|---|---|---|---|---|---|---|"]
    for fam in sorted({f for f, _, _ in by_family}):
        for mode in ("greedy", "sampled"):
            h, sc = family_stats[f"{fam} {mode} hybrid"], family_stats[f"{fam} {mode} success"]
            fam_lines.append(f"| {fam} | {mode} | {h['n']} | {h['sft']:.3f} -> {h['grpo']:.3f} | {h['mean_diff']:+.4f} (±{h['se']:.4f}) | "
                             f"{sc['sft']:.3f} -> {sc['grpo']:.3f} | {sc['mean_diff']:+.3f} (±{sc['se']:.3f}) |")

    targets = {}
    for mode in ("greedy", "sampled"):
        for k in ("hybrid", "success"):
            targets[f"{mode}: GRPO {k} > SFT every seed"] = all(r[f"{mode}_eval_grpo_{k}"] > r[f"{mode}_eval_sft_{k}"] for r in rows)
            p = pooled_stats[f"{mode}_{k}"]
            targets[f"{mode}: pooled paired {k} diff > 2 se"] = p["mean_diff"] > 2 * p["se"]
    summary = {"config": args.config, "sft_set": args.sft_set, "grpo_set": args.grpo_set,
               "grpo_tasks": grpo_tasks, "targets": targets, "pooled": pooled_stats, "by_family": family_stats, "rows": rows,
               "wall_s": round(time.perf_counter() - t0, 1)}
    out.mkdir(parents=True, exist_ok=True)
    (out / "train_evidence.json").write_text(json.dumps(summary, indent=2, default=str))
    draw_paired(rows, pooled_stats, out / "train_evidence.png")
    seed_runs = [out / f"seed_{seed}" for seed in args.seeds]
    groups = grpo_groups(seed_runs)
    options = ([f"`--sft-set {x}`" for x in args.sft_set] + [f"`--grpo-set {x}`" for x in args.grpo_set]
               + (["`--grpo-on-unsolved`"] if args.grpo_on_unsolved else []))
    unsolved_line = ("GRPO trained on the training tasks each seed's SFT policy left unsolved (`grpo_tasks: unsolved`): "
                     + ", ".join(f"seed {r['seed']} {r['unsolved_tasks']['unsolved']} of {r['unsolved_tasks']['of']}"
                                 for r in rows if "unsolved_tasks" in r) + ".") if grpo_tasks == "unsolved" else ""
    md = "\n".join([
        f"# Training evidence (pipeline config `{args.config}`, held-out tasks, paired per task)", "",
        *([f"Options: {', '.join(options)}.", ""] if options else []),
        *([unsolved_line, ""] if unsolved_line else []),
        "Reward: hybrid reward (paper preset, offline judges); success: every verifiable check passed; format validity: "
        "share of assistant turns without a protocol finding. Base = the untrained model on the first n_eval_base tasks.", "",
        "Pooled rows: n (seed, task) pairs over that many distinct held-out tasks; their se is the larger of the "
        "per-pair and the task-clustered one (seeds that share tasks are not independent samples of tasks).", "",
        "GRPO minus SFT per seed and pooled, with bars of 2 se: `train_evidence.png`.", "",
        "Greedy decoding:", "", *table("greedy"), "",
        "Sampling at the GRPO temperature (reward: the mean of a task's sampled episodes; success: at least half of "
        "them passed every check):", "", *table("sampled"), "", pass_rate_line(), "",
        "Per task family (one call: the reference solution is a single call, so success hangs on its parameters; "
        "chain: two or more calls), pooled over the seeds, paired per task:", "", *fam_lines, "",
        "Per held-out chain, pooled over the seeds (GRPO training tasks: how many of the GRPO runs' training tasks "
        "are of that chain and tone; \"-\": GRPO trained on made tasks):", "", *chain_lines, "",
        "How the held-out chains end (share of episodes, pooled over the seeds; benchmarks/chain_behaviour.py):", "",
        *ending_table(seed_runs), "",
        "Parameter precision (per non-asset argument of the reference calls, the share of the episodes that ran "
        "that call which passed exactly the reference's value; benchmarks/chain_behaviour.py):", "",
        *precision_table(seed_runs), "",
        *statement_table(seed_runs), "",
        *group_preference(groups), *success_signal(groups), "",
        "Targets: " + "; ".join(f"{k}: **{'met' if v else 'NOT met'}**" for k, v in targets.items()) + ".",
        f"Wall time: {summary['wall_s']} s.", ""])
    (out / "train_evidence.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
