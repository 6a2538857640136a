"""EASEL brush renderer benchmark: speed vs the reference renderer, and accuracy.

Reports strokes/s for one stroke at a time and for a batch of 64 independent
strokes on one canvas, at 128^2 and 512^2, for our renderer and for the
Learning-to-Paint style reference (100 circles at 2x, downsampled), as medians
over interleaved timing rounds of process CPU time (shared CPUs); and PSNR of
both against a 4x-supersampled render (dense t sampling); and the t* error of
our alpha against the same stroke model with t* from dense sampling (4097 t),
which is where folded strokes used to fail. Strokes are drawn uniformly from
[0, 1]^13 (seeded). Single-threaded: run with OMP_NUM_THREADS=1.

Our renderer is the compiled numba kernel. Its one-off cost is reported
separately and kept out of the ratios (the timed functions are warmed first):
compiling in a fresh process with an empty cache,
and loading from the cache in the next process (``cache=True``), each in a
child process with its own ``NUMBA_CACHE_DIR``.

    python benchmarks/easel_render.py [--quick]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from canvasagent.easel import render  # noqa: E402
from canvasagent.easel.reference_render import composite_np, dense_alpha, reference_alpha, supersampled_alpha  # noqa: E402


def _time(fn, min_s: float = 1.0, max_n: int = 1000) -> float:
    """CPU seconds per call (at least one call, repeated until min_s).

    Process CPU time rather than wall time: everything here is single-threaded,
    and on shared CPUs wall time mostly measures the neighbours' load.
    """
    fn()
    n, t0 = 0, time.process_time()
    while True:
        fn()
        n += 1
        dt = time.process_time() - t0
        if dt >= min_s or n >= max_n:
            return dt / n


def _time_rounds(fns: dict, rounds: int, min_s: float, max_n: dict) -> dict:
    """Median seconds per call of each fn over interleaved rounds.

    The CPUs are shared, so load changes within a run; interleaving ours and
    the reference and taking medians keeps the ratio comparable.
    """
    samples: dict = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            samples[k].append(_time(fn, min_s, max_n.get(k, 1000)))
    return {k: float(np.median(v)) for k, v in samples.items()}


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(((a.astype(np.float64) - b) ** 2).mean())
    return float("inf") if mse == 0 else 10 * np.log10(1.0 / mse)


_FIRST_CALL = r"""
import json, time
import numpy as np
from canvasagent.easel import render
t0 = time.process_time()
from canvasagent.easel import render_nb  # noqa: F401  (numba itself; compiling is lazy)
t1 = time.process_time()
render.render_batch_np(render.blank_canvas(64), np.random.default_rng(0).random((4, 13)))
render.alpha_np(np.random.default_rng(1).random(13), 64)
t2 = time.process_time()
print(json.dumps({"import": t1 - t0, "first_call": t2 - t1}))
"""


def numba_first_call() -> tuple[dict, dict]:
    """CPU seconds of importing the kernel module (numba; the renderer and torch
    are imported before the clock starts) and of the first renders, in a
    fresh process with an empty numba cache (compiles) and in the next one
    (loads the cache)."""
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "NUMBA_CACHE_DIR": cache, "OMP_NUM_THREADS": "1"}
        runs = [json.loads(subprocess.run([sys.executable, "-c", _FIRST_CALL], env=env, check=True,
                                          capture_output=True, text=True).stdout.strip().splitlines()[-1])
                for _ in range(2)]
    return runs[0], runs[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer strokes (smoke run)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    strokes = rng.random((256, 13))
    print(f"threads={torch.get_num_threads()}  strokes ~ U[0,1]^13")
    cold, warm = numba_first_call()
    print(f"numba kernel, CPU s: import {cold['import']:.2f} + first renders {cold['first_call']:.2f} "
          f"with an empty cache (compiles); import {warm['import']:.2f} + first renders "
          f"{warm['first_call']:.2f} from the cache")
    print("| size | mode | ours strokes/s | reference strokes/s | speed-up |")
    print("|---|---|---|---|---|")
    for size in (128, 512):
        canvas = render.blank_canvas(size)
        n_single = 8 if args.quick else 32
        it = iter(range(10**9))

        def one():
            render.apply_stroke(canvas, strokes[next(it) % n_single])

        def ref_one():
            p = strokes[next(it) % n_single]
            composite_np(canvas, reference_alpha(p, size), p[10:13])

        batch = strokes[:64].astype(np.float32)
        fns = {"ours": one, "ref": ref_one, "batch": lambda: render.render_batch_np(canvas, batch)}
        min_s = 0.3 if args.quick else 1.0
        t = _time_rounds(fns, rounds=3 if args.quick else 5, min_s=min_s, max_n={"ref": n_single})
        t_ref = t["ref"]
        for mode, a in (("single", t["ours"]), ("batch64", t["batch"] / 64)):
            # the reference has no batch path: a batch costs 64 single renders
            print(f"| {size} | {mode} | {1 / a:.1f} | {1 / t_ref:.2f} | {t_ref / a:.1f}x |")

    print("\nPSNR (dB) against a 4x-supersampled render (sequence of strokes composited on white)")
    print("| size | strokes | ours | reference |")
    print("|---|---|---|---|")
    for size, n in ((128, 4 if args.quick else 12), (512, 1 if args.quick else 3)):
        ps = strokes[100:100 + n].copy()
        if size == 512:
            ps[:, [6, 8]] *= 0.3  # keep the dense ground truth affordable
        gt = render.blank_canvas(size)
        ref = render.blank_canvas(size)
        for p in ps:
            gt = composite_np(gt, supersampled_alpha(p, size, ss=4, n_t=1024), p[10:13])
            ref = composite_np(ref, reference_alpha(p, size), p[10:13])
        ours = render.render_strokes(ps, size)
        print(f"| {size} | {n} | {psnr(ours, gt):.1f} | {psnr(ref, gt):.1f} |")

    n_fold = 10 if args.quick else 40
    errs, mses = [], []
    for p in np.random.default_rng(0).random((n_fold, 13)).astype(np.float32):
        d = render.alpha_np(p, 64) - dense_alpha(p, 64)
        errs.append(float(np.abs(d).max()))
        mses.append(float((d.astype(np.float64) ** 2).mean()))
    errs_a = np.array(errs)
    print(f"\nt* against dense sampling (4097 t), {n_fold} random strokes at 64^2: "
          f"strokes with a pixel off by > 0.05: {int((errs_a > 0.05).sum())}, > 0.02: {int((errs_a > 0.02).sum())}, "
          f"worst {errs_a.max():.3f}, PSNR {10 * np.log10(1 / max(np.mean(mses), 1e-20)):.1f} dB")


if __name__ == "__main__":
    main()
