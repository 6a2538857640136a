"""Host memory of the main job: peak RSS per stage with stages in-process against each stage in
its own subprocess, the SR network kept against released between calls, and whether the metrics
are the same.

    python benchmarks/pipeline_memory.py [--out runs/pipeline_memory] [--full]

Runs the pipeline (configs/pipeline/default.yaml) twice with the same seed on a reduced budget
(`--full`: the main job's budget, about 2 x 25 min here), each run from a fresh driver process:
once with every stage in the driver's process (`Pipeline.run(isolate=False)`), once with each
stage in a fresh subprocess (the default).
Both use configs/tools/offline.yaml (SR released between calls). It prints each stage's peak RSS
(the driver plus its stage subprocess) for both runs and compares the report's metrics JSON. Then
it measures the offline SR backend (configs/tools/offline.yaml: Real-ESRGAN x4plus): resident memory after a call with
`keep_loaded: true` and `false`, and the reload time `false` costs per call.
Results here: benchmarks/results/pipeline_memory.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import time
from pathlib import Path

REDUCED = {
    "n_eval": 4, "n_eval_base": 2, "eval_samples": 2, "cc_sft_n": 8, "cc_rl_n": 8, "cc_eval_n": 4,
    "sft_overrides": {"optim.max_steps": 30, "data.n_train": 32},
    "grpo_overrides": {"optim.max_steps": 4, "data.n_train": 8},
}


def _metrics(out: Path) -> dict:
    return json.loads((out / "report" / "metrics.json").read_text())["metrics"]


def _pipeline(out: Path, full: bool, isolate: bool) -> dict:
    from canvasagent.pipeline import PipelineConfig, run_pipeline

    if out.exists():
        shutil.rmtree(out)
    cfg = PipelineConfig.load("default", out=str(out), **({} if full else REDUCED))
    res = run_pipeline(cfg, isolate=isolate)
    return {s: res[s].get("peak_rss_mb") for s in res}


def _sr_resident() -> dict[str, float]:
    import numpy as np
    from PIL import Image

    from canvasagent.stage_runner import rss_mb
    from toolserver.backends import build_backend
    from toolserver.config import ToolsConfig

    spec = ToolsConfig.load("offline").backends["SR"]
    params = dict(spec.params)
    img = Image.fromarray((np.random.default_rng(0).random((64, 64, 3)) * 255).astype("uint8"))
    out: dict[str, float] = {}
    for keep in (True, False):
        base = rss_mb()["rss"]
        sr = build_backend(spec.name, {**params, "keep_loaded": keep})
        t0 = time.perf_counter()
        sr.upscale_rgb(img)
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        sr.upscale_rgb(img)
        out[f"second_call_s_keep_{keep}"] = time.perf_counter() - t0
        out[f"first_call_s_keep_{keep}"] = first
        out[f"resident_mb_keep_{keep}"] = rss_mb()["rss"] - base
        sr.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/pipeline_memory")
    ap.add_argument("--full", action="store_true", help="the main job's budget instead of the reduced one")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from canvasagent.stage_runner import run_stage

    out = Path(args.out)
    # Each variant's driver is a fresh process of its own (as `canvasagent pipeline` is), so
    # neither run's peaks include what the other left in this one.
    t0 = time.perf_counter()
    inproc = run_stage(_pipeline, out / "inprocess", args.full, False, isolate=True).value
    t1 = time.perf_counter()
    isolated = run_stage(_pipeline, out / "isolated", args.full, True, isolate=True).value
    t2 = time.perf_counter()
    same = _metrics(out / "inprocess") == _metrics(out / "isolated")
    sr = _sr_resident()

    print(f"pipeline ({'full' if args.full else 'reduced'} budget): in-process {t1 - t0:.0f} s, isolated {t2 - t1:.0f} s")
    print("| stage | peak RSS in-process (MB) | peak RSS isolated (MB) | in-process/isolated |")
    print("|---|---|---|---|")
    for stage, a in inproc.items():
        b = isolated.get(stage)
        print(f"| {stage} | {a} | {b} | {a / b:.2f} |" if a and b else f"| {stage} | {a} | {b} | |")
    peak_a, peak_b = max(v for v in inproc.values() if v), max(v for v in isolated.values() if v)
    print(f"metrics JSON identical (in-process vs isolated, same seed): {same}")
    print(f"SR x4plus resident after a call: kept {sr['resident_mb_keep_True']:.0f} MB, released "
          f"{sr['resident_mb_keep_False']:.0f} MB; a call {sr['second_call_s_keep_True']:.1f} s kept, "
          f"{sr['second_call_s_keep_False']:.1f} s released (reload included)")
    print(f"job peak RSS in-process/isolated: {peak_a / peak_b:.2f} x ({peak_a:.0f} / {peak_b:.0f} MB)")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
