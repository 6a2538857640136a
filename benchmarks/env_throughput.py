"""Env throughput: a scripted policy doing Crop/Flip/Rotate on 512x512 images, on one core.

Goal: >= 200 env steps/s. Prints steps/s for the full loop (parse + validate + execute +
observation) and, for reference, the raw PIL cost of the same operations, as a ratio.
"""

from __future__ import annotations

import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

from canvasagent.core.episode import Episode, EpisodeConfig  # noqa: E402
from canvasagent.core.protocol import format_reply  # noqa: E402
from canvasagent.core.tasks import Task  # noqa: E402
from toolserver.toolbox import LocalToolbox  # noqa: E402
from toolserver.validation import Profile  # noqa: E402


def replies():
    calls = [
        {"name": "Crop", "arguments": {"image": "img_1", "bbox": "[100, 100, 900, 900]"}},
        {"name": "Flip", "arguments": {"image": "img_1"}},
        {"name": "Rotate", "arguments": {"image": "img_1", "angle": 90}},
    ]
    return [format_reply("step", c) for c in calls]


def bench(profile: Profile, seconds: float = 3.0) -> float:
    img = Image.fromarray(np.random.default_rng(0).integers(0, 255, (512, 512, 3), dtype=np.uint8))
    rs = replies()
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        ep = Episode(LocalToolbox(profile=profile), EpisodeConfig(max_turns=13))
        ep.reset(Task("bench", [img]))
        for i in range(12):
            ep.step(rs[i % 3])
            steps += 1
    return steps / (time.perf_counter() - t0)


def raw_pil(seconds: float = 2.0) -> float:
    img = Image.fromarray(np.random.default_rng(0).integers(0, 255, (512, 512, 3), dtype=np.uint8))
    ops = [lambda: img.crop((51, 51, 460, 460)), lambda: img.transpose(Image.Transpose.FLIP_LEFT_RIGHT),
           lambda: img.rotate(90, resample=Image.Resampling.BICUBIC, fillcolor=(255, 255, 255))]
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        ops[n % 3]()
        n += 1
    return n / (time.perf_counter() - t0)


if __name__ == "__main__":
    raw = raw_pil()
    for profile in Profile:
        sps = bench(profile)
        print(f"{profile.value:12s} {sps:8.1f} env steps/s (goal >= 200): {sps / 200:.2f}x goal; loop overhead vs raw PIL ops {raw / sps:.2f}x")
    print(f"raw PIL ops  {raw:8.1f} ops/s")
