"""Does the offline reward tell a correct trajectory from a wrong one?

Runs the oracle and a family of wrong policies (all `scripted:NAME` specs) on tasks of every
source — scripted Crop/Flip/Rotate, CanvasCraft single-tool chains whose tools run offline
(OCR, Flip, Rotate, Overlay, SR) and EASEL stroke reconstruction — through the episode runner,
scores every trajectory with the hybrid reward (paper preset, offline judges) and prints, per
source and policy, the hybrid reward, each component and the strict success rate, then the
pairwise AUC (how often the oracle's trajectory outscores a wrong one on the same task) and the
targets with PASS/FAIL. A trivial policy whose result is the oracle's (always-Flip on a task that
asks for a flip) is right there: such pairs are counted in "tasks (wrong)" and "success, all
tasks" but left out of every other column and target.

    python benchmarks/reward_discrimination.py [--n 24] [--out benchmarks/results/reward_discrimination.md]
    python benchmarks/reward_discrimination.py --save-trajectories runs/rd.pkl   # keep them
    python benchmarks/reward_discrimination.py --score runs/rd.pkl               # rescore saved ones
    python benchmarks/reward_discrimination.py --chains offline --sources canvascraft --n 64
                                       # the offline 2-3-tool chains (configs/canvascraft/rl_offline_chains.yaml)

`--score` rescores saved trajectories with whatever `rewards` package is importable, which is
how the "before" table was made: the same pickled trajectories scored by the tree before the
calibrated checks (PYTHONPATH at that commit).
"""

from __future__ import annotations

import argparse
import logging
import os
import pickle
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

ORACLE = "oracle"
WRONG = ("oracle_wrong_param", "terminate", "flip", "rotate90", "crop_center", "garbage")
TRIVIAL = ("terminate", "flip", "rotate90", "crop_center", "garbage")
COMPONENTS = ("hybrid", "align", "aes", "traj", "rule")
CC_MIX = {"single": 0, "hard": 0, "OCR": 1, "Flip": 1, "Rotate": 1, "Overlay": 1, "SR": 1}


# -- tasks ------------------------------------------------------------------------------------


def scripted_tasks(n: int, toolbox: Any) -> list[Any]:
    from canvasagent.training.scripted import attach_reference, make_tasks

    return [attach_reference(t, toolbox) for t, _ in make_tasks(n, seed=1234)]


def canvascraft_tasks(n: int, work: Path, chains: str = "single") -> list[Any]:
    """`single`: the one-tool chains of CC_MIX; `offline`: the 2-3-tool offline chains."""
    from canvascraft.build import load_build_config, run_build, shard_files
    from canvascraft.formats import read_rows
    from canvascraft.rl import task_of

    easy = {"easy": 1}
    if chains == "offline":
        cfg = load_build_config("rl", "rl_offline_chains", seed=7, workers=1, n=n, eval_n=0)
    else:
        cfg = load_build_config("rl", None, seed=7, workers=1, tools_config="offline", mix=CC_MIX, sr_input_side=64,
                                n=n, eval_n=0, reasoning=easy, length=easy, diversity=easy)
    t0 = time.perf_counter()
    run_build("rl", cfg, work / "cc_rl", progress=False)
    rows = read_rows(shard_files(work / "cc_rl", "rl", "train"))
    mix: dict[str, int] = defaultdict(int)
    for r in rows:
        mix[r["chain"]] += 1
    sys.stderr.write(f"CanvasCraft ({chains}) build: {len(rows)} rows in {time.perf_counter() - t0:.0f} s; mix {dict(sorted(mix.items()))}\n")
    return [task_of(r) for r in rows]


def easel_tasks(n: int, res: int = 64, n_strokes: int = 3) -> list[tuple[Any, Any]]:
    """Reconstruction of a target painted by known strokes; the oracle replays them."""
    import numpy as np

    from canvasagent.easel import render, tasks
    from canvasagent.easel.agent import agent_task

    out = []
    for i in range(n):
        rng = np.random.default_rng(100 + i)
        strokes = []
        for _ in range(n_strokes):
            p = rng.uniform(0.15, 0.85, render.N_PARAMS)
            p[6:8] = rng.uniform(0.06, 0.14, 2)  # radii
            p[8:10] = 1.0  # opaque
            strokes.append(p)
        ref = render.render_strokes(np.array(strokes), res).astype("float32")
        # One step more than the strokes, so a policy can end the episode itself.
        et = tasks.ReconstructionTask(f"strokes-{i:03d}", "strokes", ref, n_strokes + 1)
        task = agent_task(et, et.budget, et.task_id)
        task.meta["reference_calls"] = [{"name": "brush_stroke", "arguments": {k: round(float(v), 5) for k, v in render.params_to_dict(p).items()}}
                                        for p in strokes]
        out.append((et, task))
    return out


# -- episodes -----------------------------------------------------------------------------------


def run_all(n: int, work: Path, chains: str = "single", only: tuple[str, ...] = ("scripted", "canvascraft", "easel")) -> list[dict[str, Any]]:
    from toolserver.client import make_toolbox
    from canvasagent.easel.agent import NoToolbox, charge_refused, outcome_scores
    from canvasagent.easel.canvas import CanvasSession
    from canvasagent.core.episode import EpisodeConfig, run_episode
    from canvasagent.core.policies.scripted import scripted_policy

    toolbox = make_toolbox("offline")
    runs: list[dict[str, Any]] = []
    sources = {}
    if "scripted" in only:
        sources["scripted"] = scripted_tasks(n, toolbox)
    if "canvascraft" in only:
        sources["canvascraft"] = canvascraft_tasks(n, work, chains)
    for source, tasks in sources.items():
        for task in tasks:
            for pol in (ORACLE, *WRONG):
                traj = run_episode(scripted_policy(pol, task), task, toolbox, EpisodeConfig(max_turns=12))
                runs.append({"source": source, "policy": pol, "task": task.id, "traj": traj})
    for et, task in (easel_tasks(max(4, n // 3)) if "easel" in only else []):
        for pol in (ORACLE, *WRONG):
            session = CanvasSession.for_task(et)
            session.budget = et.budget
            traj = run_episode(scripted_policy(pol, task), task, NoToolbox(), EpisodeConfig(max_turns=et.budget + 4, family="easel"),
                               stateful=session.handlers(), on_turn=charge_refused(session))
            traj.meta["easel"] = outcome_scores(et, session.canvas)
            runs.append({"source": "easel", "policy": pol, "task": task.id, "traj": traj})
    toolbox.close()
    oracle = {(r["source"], r["task"]): r for r in runs if r["policy"] == ORACLE}
    for r in runs:  # decided here, with this tree's image comparison, so a rescore cannot differ
        r["coincides"] = r["policy"] != ORACLE and coincides(r, oracle[(r["source"], r["task"])])
    return runs


# -- scoring and the table ----------------------------------------------------------------------


def score_all(runs: list[dict[str, Any]]) -> None:
    from canvasagent.evaluation.metrics import task_result
    from canvasagent.evaluation.scoring import make_scorer

    scorer = make_scorer("paper", "offline", every_judge=True)
    for r in runs:
        s = scorer(r["traj"])
        r["scores"] = s
        r["success"] = task_result(r["traj"], s, 0.5).success


def _mean(xs: list[float]) -> float:
    return statistics.fmean(xs) if xs else float("nan")


def _final_image(traj: Any) -> Any:
    a = traj.final_asset()
    return a.image if a is not None else None


def coincides(run: dict[str, Any], oracle: dict[str, Any]) -> bool:
    """The policy's result is the oracle's: the same final image, pixel for pixel (always-Flip on
    a task that asks for a flip). Such a pair is a correct answer, not a wrong one."""
    from canvasagent.core.imageio import images_match

    if run["source"] == "easel":
        e, o = run["traj"].meta.get("easel") or {}, oracle["traj"].meta.get("easel") or {}
        return e.get("score") == o.get("score") and run["policy"] != "terminate"
    a, b = _final_image(run["traj"]), _final_image(oracle["traj"])
    return a is not None and b is not None and images_match(a, b)


def table(runs: list[dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    by = defaultdict(list)
    for r in runs:
        by[(r["source"], r["policy"])].append(r)
    sources = sorted({r["source"] for r in runs}, key=["scripted", "canvascraft", "easel"].index)
    lines = ["| source | policy | tasks (wrong) | hybrid | align | aes | traj | rule | success | success, all tasks | AUC vs oracle |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    stats: dict[str, Any] = {}
    for src in sources:
        oracle = {r["task"]: r for r in by[(src, ORACLE)]}
        for pol in (ORACLE, *WRONG):
            rs_all = by[(src, pol)]
            rs = rs_all if pol == ORACLE else [r for r in rs_all if not r["coincides"]]
            m = {c: _mean([r["scores"].get(c, 0.0) for r in rs]) for c in COMPONENTS}
            m["success"] = _mean([float(r["success"]) for r in rs])
            m["success_all"] = _mean([float(r["success"]) for r in rs_all])
            o_of = {t: r["scores"]["hybrid"] for t, r in oracle.items()}
            pairs = [1.0 if o_of[r["task"]] > r["scores"]["hybrid"] else 0.5 if o_of[r["task"]] == r["scores"]["hybrid"] else 0.0
                     for r in rs] if pol != ORACLE else []
            m["auc"] = _mean(pairs)
            m["pairs"] = pairs
            # The oracle's means over the same tasks, for the margin targets.
            m["oracle"] = {c: _mean([oracle[r["task"]]["scores"].get(c, 0.0) for r in rs]) for c in COMPONENTS}
            stats[(src, pol)] = m
            auc = "" if pol == ORACLE else f"{m['auc']:.3f}"
            n = f"{len(rs_all)}" if pol == ORACLE else f"{len(rs_all)} ({len(rs)})"
            lines.append(f"| {src} | {pol} | {n} | " + " | ".join(f"{m[c]:.3f}" for c in COMPONENTS)
                         + f" | {m['success']:.3f} | {m['success_all']:.3f} | {auc} |")
    return "\n".join(lines), stats


def targets(stats: dict[str, Any]) -> list[str]:
    out = []
    sources = sorted({s for s, _ in stats}, key=["scripted", "canvascraft", "easel"].index)
    all_pairs = []
    for src in sources:
        o = stats[(src, ORACLE)]
        out.append(f"- {src}: oracle success {o['success']:.3f} >= 0.9: {'PASS' if o['success'] >= 0.9 else 'FAIL'}")
        for pol in (*TRIVIAL, "oracle_wrong_param"):
            m = stats[(src, pol)]
            ref = m["oracle"]
            margin = 0.2 if pol == "oracle_wrong_param" else 0.35
            ok = m["hybrid"] <= ref["hybrid"] - margin and (pol == "oracle_wrong_param" or m["success"] <= 0.1)
            worst = max(m[c] - ref[c] for c in COMPONENTS[1:])
            cond = f"hybrid {m['hybrid']:.3f} <= {ref['hybrid'] - margin:.3f}"
            if pol != "oracle_wrong_param":
                cond = f"success {m['success']:.3f} <= 0.1, " + cond
            out.append(f"- {src}/{pol}: {cond}: {'PASS' if ok else 'FAIL'}; "
                       f"largest component lead over the oracle {worst:+.3f} <= 0.05: {'PASS' if worst <= 0.05 else 'FAIL'}")
        for pol in WRONG:
            all_pairs += stats[(src, pol)]["pairs"]
    auc = _mean(all_pairs)
    out.append(f"- pairwise AUC over {len(all_pairs)} (task, wrong policy) pairs: {auc:.3f} >= 0.95: {'PASS' if auc >= 0.95 else 'FAIL'}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=24, help="tasks per CanvasAgent source (EASEL gets n/3, at least 4)")
    ap.add_argument("--out", type=Path, default=None, help="write the table and targets as Markdown here")
    ap.add_argument("--title", default="after: calibrated checks, strict success, gated aesthetics")
    ap.add_argument("--save-trajectories", type=Path, default=None, help="pickle the trajectories here")
    ap.add_argument("--score", type=Path, default=None, help="rescore pickled trajectories instead of running episodes")
    ap.add_argument("--chains", choices=("single", "offline"), default="single",
                    help="CanvasCraft tasks: the one-tool offline chains, or the 2-3-tool offline chains")
    ap.add_argument("--sources", default="scripted,canvascraft,easel", help="comma-separated sources to run")
    args = ap.parse_args(argv)
    only = tuple(s.strip() for s in args.sources.split(",") if s.strip())
    if set(only) - {"scripted", "canvascraft", "easel"} or not only:
        ap.error(f"--sources takes scripted, canvascraft and easel, not {args.sources!r}")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    for noisy in ("rewards", "canvasagent", "canvascraft", "toolserver"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    t0 = time.perf_counter()
    if args.score:
        runs = pickle.loads(args.score.read_bytes())
    else:
        with tempfile.TemporaryDirectory() as tmp:
            runs = run_all(args.n, Path(tmp), args.chains, only)
        if args.save_trajectories:
            args.save_trajectories.parent.mkdir(parents=True, exist_ok=True)
            args.save_trajectories.write_bytes(pickle.dumps([{k: v for k, v in r.items() if k != "scores"} for r in runs]))
    t_run = time.perf_counter() - t0
    score_all(runs)
    text, stats = table(runs)
    lines = targets(stats)
    report = (f"## {args.title}\n\n{len(runs)} trajectories, episodes {t_run:.0f} s, scoring {time.perf_counter() - t0 - t_run:.0f} s "
              f"(paper preset, offline judges)\n\n{text}\n\nTargets:\n\n" + "\n".join(lines) + "\n")
    sys.stdout.write(report)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "a") as fh:
            fh.write(report + "\n")
    return 0 if all("FAIL" not in ln for ln in lines) else 1


if __name__ == "__main__":
    sys.exit(main())
