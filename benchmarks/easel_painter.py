"""EASEL painter benchmark: category table, trajectory diagnostics and wall time.

Runs the stroke painter on the reconstruction suite (n images per category)
in each budget mode (budget-aligned = the category budget, and 250 strokes by
default), and the blank / mean-fill / dominant-fill anchors on the same
references, then prints one Table-3 style table and the wall time of each run.

    python benchmarks/easel_painter.py --n-per-category 4 --workers 16 --out /tmp/easel_painter
"""
from __future__ import annotations

import argparse
import os
import time
from dataclasses import replace

os.environ.setdefault("OMP_NUM_THREADS", "1")

from canvasagent.easel import bench, tasks  # noqa: E402


def _parse_variant(base, spec: str):
    name, _, body = spec.partition(":")
    over = {}
    for kv in filter(None, body.split(",")):
        k, v = kv.split("=", 1)
        over[k] = type(getattr(base, k))(v)
    return name, replace(base, **over)


def tune(cfg, args):
    """Try each variant (budget-aligned) on references from a different seed than
    the evaluation suite, all jobs in one process pool; return the best config."""
    import multiprocessing as mp

    import numpy as np
    variants = [("base", cfg.painter)] + [_parse_variant(cfg.painter, v) for v in args.variant]
    suite = tasks.reconstruction_suite(args.tune_n, cfg.seed + 101, tuple(args.tune_categories.split(",")),
                                       cfg.natural_dir)
    jobs = [(t, "painter", "aligned", pc) for _, pc in variants for t in suite]
    t0 = time.perf_counter()
    with mp.get_context("spawn").Pool(min(cfg.workers, len(jobs))) as pool:
        outs = pool.map(bench._job, jobs, chunksize=1)
    scores = {}
    for i, (name, _) in enumerate(variants):
        rs = [o[0] for o in outs[i * len(suite):(i + 1) * len(suite)]]
        scores[name] = (float(np.mean([r.final for r in rs])), float(np.mean([r.seconds for r in rs])))
        print(f"tune {name}: mean S={scores[name][0]:.4f}  {scores[name][1]:.1f}s/image")
    best = max(variants, key=lambda v: scores[v[0]][0])
    print(f"tuning wall {time.perf_counter() - t0:.1f}s; chosen variant: {best[0]}", flush=True)
    return best[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n-per-category", type=int, default=4)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--budgets", default="aligned,250")
    ap.add_argument("--categories", default=",".join(tasks.CATEGORIES))
    ap.add_argument("--config", default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a painter setting, e.g. --set iters_full=120")
    ap.add_argument("--policies", default="blank,mean-fill,dominant-fill,painter")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME:K=V,K=V",
                    help="painter variants tried first on a separate tuning set; the best is used")
    ap.add_argument("--tune-n", type=int, default=4)
    ap.add_argument("--tune-categories", default="natural")
    args = ap.parse_args()
    cfg = bench.load_config(args.config)
    over = {}
    for kv in args.set:
        k, v = kv.split("=", 1)
        over[k] = type(getattr(cfg.painter, k))(v)
    cfg = replace(cfg, painter=replace(cfg.painter, **over))
    if args.variant:
        cfg = replace(cfg, painter=tune(cfg, args))
    cfg = replace(cfg, n_per_category=args.n_per_category, workers=args.workers,
                  categories=tuple(args.categories.split(",")),
                  budgets=tuple(b if b == "aligned" else int(b) for b in args.budgets.split(",")))
    suite = tasks.reconstruction_suite(cfg.n_per_category, cfg.seed, cfg.categories, cfg.natural_dir)
    print(f"{len(suite)} references, workers={cfg.workers}, budgets={cfg.budgets}")
    results, walls = [], {}
    print("painter:", cfg.painter)
    for policy in args.policies.split(","):
        t0 = time.perf_counter()
        out = None if args.out is None else os.path.join(args.out, policy)
        results += bench.run(policy, cfg, out, suite=suite)
        walls[policy] = time.perf_counter() - t0
    print(bench.format_table(results))
    for k, v in walls.items():
        print(f"wall time {k}: {v:.1f}s")
    pr = [r for r in results if r.policy == "painter"]
    if pr:
        for mode in sorted({r.mode for r in pr}):
            secs = [r.seconds for r in pr if r.mode == mode]
            print(f"painter {mode}: {sum(secs) / len(secs):.1f}s per image (one core each)")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "table.md"), "w") as f:
            f.write(bench.format_table(results))
            for k, v in walls.items():
                f.write(f"\nwall time {k}: {v:.1f}s")


if __name__ == "__main__":
    main()
