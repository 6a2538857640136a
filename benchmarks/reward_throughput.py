"""Reward throughput on one core: the rule score alone, and rule + offline judges.

    OMP_NUM_THREADS=1 python benchmarks/reward_throughput.py [--n 64] [--seconds 3] [--json]

Trajectories are recorded first by the real episode runner (pure tools, recorded model-tool
outputs), with a mix of clean chains, validation errors, repeats and format problems; timing
covers scoring only. Goal: ≥ 1,000 trajectories/s for the rule score alone.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

from toolserver.client import make_toolbox  # noqa: E402
from canvasagent.core.episode import EpisodeConfig, run_episode  # noqa: E402
from canvasagent.core.policies.replay import ReplayPolicy  # noqa: E402
from canvasagent.core.protocol import format_reply  # noqa: E402
from canvasagent.core.tasks import Task  # noqa: E402
from rewards.config import RewardConfig  # noqa: E402
from rewards.hybrid import HybridReward  # noqa: E402
from rewards.rule import score_rule  # noqa: E402
from toolserver.toolbox import RecordedOutput  # noqa: E402


def _image(rng: random.Random, w: int = 256, h: int = 192) -> Image.Image:
    x, y = np.meshgrid(np.arange(w), np.arange(h))
    k = rng.randint(1, 7)
    arr = np.stack([(x * k) % 256, (y * (k + 1)) % 256, ((x ^ y) * k) % 256], -1).astype(np.uint8)
    return Image.fromarray(arr, "RGB")


def _mask(w: int = 256, h: int = 192) -> Image.Image:
    m = np.zeros((h, w), np.uint8)
    m[h // 4 : 3 * h // 4, w // 4 : 3 * w // 4] = 255
    return Image.fromarray(m, "L")


def _call(name: str, **args) -> dict:
    return {"name": name, "arguments": args}


def make_trajectories(n: int, seed: int = 0):
    rng = random.Random(seed)
    done = format_reply("The task is complete.", terminate=True)
    out = []
    for i in range(n):
        tb = make_toolbox("offline")
        kind = i % 4
        if kind == 0:  # the cut-out chain
            tb.add_recorded("Grounding", RecordedOutput("[[250, 250, 750, 750]]"))
            tb.add_recorded("SAM", RecordedOutput("mask", _mask()))
            calls = [_call("Grounding", image="img_1", reference_text="box"), _call("SAM", image="img_1", bbox=[250, 250, 750, 750]),
                     _call("Extract", image="img_1", mask="SAM_0"), _call("Overlayer", base_image="img_1", overlay_type="object", content="Extract_0", position=[300, 300])]
            expected = ["Grounding", "SAM", "Extract", "Overlayer"]
        elif kind == 1:  # geometric edits with a validation error and a repeat
            calls = [_call("Crop", image="img_1", bbox=[600, 0, 100, 500]), _call("Crop", image="img_1", bbox=[0, 0, 600, 900]),
                     _call("Flip", image="Crop_0"), _call("Flip", image="Crop_0"), _call("Rotate", image="Flip_1", angle=90)]
            expected = ["Crop", "Flip", "Rotate"]
        elif kind == 2:  # text overlay and an unknown tool
            calls = [_call("Overlayer", base_image="img_1", overlay_type="text", content=f"SALE {i}", position=[500, 200]),
                     _call("Sharpen", image="Overlayer_0"), _call("Crop", image="Overlayer_0", bbox=[100, 100, 900, 900])]
            expected = ["Overlayer", "Crop"]
        else:  # long reasoning, two calls in a turn, a fence
            calls = [_call("Flip", image="img_1"), _call("Rotate", image="Flip_0", angle=180)]
            expected = ["Flip", "Rotate", "Crop"]
        replies = [format_reply(("Let me think about the layout. " * rng.randint(1, 60)).strip(), c) for c in calls]
        if kind == 3:
            replies.insert(1, replies[0] + replies[0].split("</reason>")[1])
            replies.append("```" + format_reply("check", _call("Crop", image="Rotate_0", bbox=[0, 0, 500, 500])) + "```")
        task = Task(f"Task {i}", images=[_image(rng)], id=f"bench-{i}", expected_tools=expected,
                    checks=[{"type": "size_relation", "relation": "smaller"}, {"type": "differs_from", "of": "img_1"},
                            {"type": "asset_kind", "kind": "rgba"}])
        out.append(run_episode(ReplayPolicy(replies + [done]), task, tb, EpisodeConfig(max_turns=12)))
    return out


def rate(fn, trajs, seconds: float) -> tuple[float, float]:
    """(per CPU-second, per wall-second). CPU time is what one core delivers; wall time also
    counts waiting for a core on a shared machine."""
    n, c0, w0 = 0, time.process_time(), time.perf_counter()
    while True:
        for t in trajs:
            fn(t)
        n += len(trajs)
        cpu = time.process_time() - c0
        if cpu >= seconds:
            return n / cpu, n / (time.perf_counter() - w0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=64, help="distinct trajectories")
    ap.add_argument("--seconds", type=float, default=3.0, help="time per measurement")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    import cv2

    cv2.setNumThreads(1)
    t0 = time.perf_counter()
    trajs = make_trajectories(args.n)
    build_s = time.perf_counter() - t0
    cfg = RewardConfig.load("paper")
    rule_rate = rate(lambda t: score_rule(t, cfg.rule), trajs, args.seconds)

    cold = RewardConfig.load("paper")
    cold.judges.cache_size, cold.judges.max_workers = 0, 1  # every call really computes
    hybrid_cold = HybridReward(cold, memo_size=0)
    cold_rate = rate(lambda t: hybrid_cold.score_many([t]), trajs, args.seconds)

    warm = RewardConfig.load("paper")
    warm.judges.max_workers = 1
    hybrid_warm = HybridReward(warm, memo_size=0)  # no per-object memo: measure the content-hash cache
    hybrid_warm.score_many(trajs)
    warm_rate = rate(lambda t: hybrid_warm.score_many([t]), trajs, args.seconds)

    res = {
        "trajectories": len(trajs),
        "mean_calls": sum(len(t.tool_sequence) for t in trajs) / len(trajs),
        "build_s": round(build_s, 2),
        "rule_traj_per_cpu_s": round(rule_rate[0], 1),
        "rule_traj_per_wall_s": round(rule_rate[1], 1),
        "rule_plus_offline_judges_traj_per_cpu_s": round(cold_rate[0], 1),
        "rule_plus_offline_judges_traj_per_wall_s": round(cold_rate[1], 1),
        "rule_plus_offline_judges_cached_traj_per_cpu_s": round(warm_rate[0], 1),
        "rule_plus_offline_judges_cached_traj_per_wall_s": round(warm_rate[1], 1),
        "load_average_1min": os.getloadavg()[0],
    }
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        print(f"{len(trajs)} trajectories ({res['mean_calls']:.1f} calls each, 256x192 images), one core "
              f"(load average {res['load_average_1min']:.1f})")
        print("                                  per CPU-second   per wall-second")
        print(f"  rule score alone:               {rule_rate[0]:10.1f}      {rule_rate[1]:10.1f}   traj/s (goal >= 1000)")
        print(f"  rule + offline judges (cold):   {cold_rate[0]:10.1f}      {cold_rate[1]:10.1f}   traj/s")
        print(f"  rule + offline judges (cached): {warm_rate[0]:10.1f}      {warm_rate[1]:10.1f}   traj/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
