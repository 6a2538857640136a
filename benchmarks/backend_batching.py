"""Per-item calls vs `batch_call` for the tiny random-weight backends, on the CPU.

    OMP_NUM_THREADS=1 python benchmarks/backend_batching.py [--n 8] [--repeats 3] [--json]

For each backend: `n` requests of one size (so they form a single sub-batch), timed as `n`
separate calls and as one `batch_call`, best of `repeats` after a warm-up. Prints requests/s for
both and their ratio. The tiny models are a few thousand parameters, so these ratios measure the
per-call overhead batching removes (processor, pipeline set-up, Python), not GPU utilisation:
the real models on a GPU are where the larger gain is expected, and this script does not show it.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402
from PIL import Image, ImageDraw  # noqa: E402

from toolserver.backends import build_backend  # noqa: E402
from toolserver.request import ToolRequest  # noqa: E402


def _drawing(w: int, h: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    img = Image.new("RGB", (w, h), tuple(int(v) for v in rng.integers(0, 255, 3)))
    d = ImageDraw.Draw(img)
    for _ in range(4):
        x0, y0 = int(rng.integers(0, w - 16)), int(rng.integers(0, h - 16))
        d.ellipse([x0, y0, x0 + int(rng.integers(8, w // 2)), y0 + int(rng.integers(8, h // 2))], fill=tuple(int(v) for v in rng.integers(0, 255, 3)))
    return img


WORDS = ["red ball", "a cat . a dog", "the sign on the left", "sky", "blue car", "a person", "green tree", "text"]


def _requests(kind: str, n: int) -> list[ToolRequest]:
    if kind == "grounding-tiny":
        return [ToolRequest("Grounding", {"reference_text": WORDS[i % len(WORDS)]}, {"image": _drawing(192, 128, i)}) for i in range(n)]
    if kind == "sam-tiny":
        return [ToolRequest("SAM", {"bbox": [100.0 + i, 100.0, 700.0, 900.0 - i]}, {"image": _drawing(192, 128, i)}) for i in range(n)]
    return [ToolRequest("ImageGeneration", {"prompt": WORDS[i % len(WORDS)]}, {}) for i in range(n)]


def _best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=8, help="requests per batch")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as cache:
        for kind, params in (
            ("grounding-tiny", {}),
            ("sam-tiny", {}),
            ("flux2-tiny", {"seed": 0}),  # 64x64, 4 steps (the tiny defaults)
        ):
            backend = build_backend(kind, {"cache_dir": cache, **params})
            reqs = _requests(kind, args.n)
            backend(reqs[0])  # load and warm up both paths
            backend.batch_call(reqs[:2])
            single = _best(lambda: [backend(r) for r in reqs], args.repeats)
            batched = _best(lambda: backend.batch_call(reqs), args.repeats)
            assert all(r.ok for r in backend.batch_call(reqs))
            rows.append({"backend": kind, "n": args.n, "per_item_rps": args.n / single, "batched_rps": args.n / batched, "ratio": single / batched})
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"{'backend':<16}{'n':>4}{'per-item req/s':>16}{'batched req/s':>15}{'ratio':>8}")
    for r in rows:
        print(f"{r['backend']:<16}{r['n']:>4}{r['per_item_rps']:>16.1f}{r['batched_rps']:>15.1f}{r['ratio']:>7.2f}x")


if __name__ == "__main__":
    main()
