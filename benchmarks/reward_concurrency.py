"""Reward time of one GRPO step under an HTTP judge: serial judge calls against the pooled batch.

Setup: 16 real rollouts (a TRL env of the offline toolbox, a Flip executed, the final reply
stepped through the episode), scored by GRPO's reward functions (`training.rewarding.TRLRewards`
over `evaluation.scoring.make_scorer`) under the paper preset with `--judge http`: every rollout
needs three judge calls (alignment, aesthetics, trajectory), 48 in all. The judge is a local
OpenAI-compatible server that answers each request after `--latency` seconds (threaded, so it
serves concurrent requests as a real endpoint does). "Serial" is `judges.max_workers: 1`;
"pooled" is `--workers` (default 16) concurrent judge calls for the whole step.

    .venv/bin/python benchmarks/reward_concurrency.py [--rollouts 16] [--latency 0.3] [--workers 16]

The last line is `serial/pooled reward time for 16 rollouts: R x`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

for _k, _v in (("OMP_NUM_THREADS", "1"), ("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1")):
    os.environ.setdefault(_k, _v)

import numpy as np
import yaml
from PIL import Image

from canvasagent.core.tasks import Task
from canvasagent.evaluation.scoring import make_scorer
from canvasagent.training.env import make_env_class
from canvasagent.training.messages import grpo_row
from canvasagent.training.rewarding import TRLRewards
from toolserver.client import make_toolbox

ROOT = Path(__file__).resolve().parents[1]
DONE = [{"role": "assistant", "content": [{"type": "text", "text": "<reason>Mirrored.</reason><Terminate>"}]}]


class SlowJudge:
    """An OpenAI-compatible chat endpoint that answers `{"score": 7}` after `latency` s; counts requests and the peak in flight."""

    def __init__(self, latency: float):
        judge = self
        self.requests = self.active = self.peak = 0
        self.lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server API)
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with judge.lock:
                    judge.requests += 1
                    judge.active += 1
                    judge.peak = max(judge.peak, judge.active)
                time.sleep(latency)
                data = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": '{"score": 7}'}}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                with judge.lock:
                    judge.active -= 1

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"


def rollouts(n: int) -> list:
    env_cls = make_env_class(["Flip"], lambda: make_toolbox("offline"), max_turns=3)
    rng = np.random.default_rng(0)
    envs = []
    for i in range(n):
        image = Image.fromarray(rng.integers(0, 256, (96, 128, 3), dtype=np.uint8))
        env = env_cls()
        env.reset(**grpo_row(Task(f"Mirror picture {i}.", [image], id=f"t{i}", expected_tools=["Flip"])))
        env.Flip(image="img_1")
        envs.append(env)
    return envs


def step(envs: list, preset: Path, judge: SlowJudge) -> dict:
    for env in envs:
        env.scores = None
    fn = TRLRewards(make_scorer(str(preset), "http", judge_url=judge.url)).functions()[0]
    before, judge.peak = judge.requests, 0
    t0 = time.perf_counter()
    fn(completions=[DONE] * len(envs), environments=envs)
    return {"s": time.perf_counter() - t0, "requests": judge.requests - before, "peak": judge.peak,
            "scores": [dict(e.scores) for e in envs]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rollouts", type=int, default=16)
    ap.add_argument("--latency", type=float, default=0.3)
    ap.add_argument("--workers", type=int, default=16)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    judge, envs = SlowJudge(args.latency), rollouts(args.rollouts)
    base = yaml.safe_load((ROOT / "configs/reward/paper.yaml").read_text())
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, workers in (("serial", 1), ("pooled", args.workers)):
            cfg = {**base, "judges": {**base["judges"], "max_workers": workers, "http": {**base["judges"]["http"], "max_retries": 0}}}
            preset = Path(tmp) / f"{name}.yaml"
            preset.write_text(yaml.safe_dump(cfg))
            rows[name] = step(envs, preset, judge)
    same = rows["serial"]["scores"] == rows["pooled"]["scores"]
    print(f"{args.rollouts} rollouts, paper preset, HTTP judge at {args.latency:g} s a request")
    print("| run | judges.max_workers | judge requests | peak in flight | reward time (s) | x latency |")
    print("|---|---|---|---|---|---|")
    for name, workers in (("serial", 1), ("pooled", args.workers)):
        r = rows[name]
        print(f"| {name} | {workers} | {r['requests']} | {r['peak']} | {r['s']:.2f} | {r['s'] / args.latency:.1f} |")
    print(f"scores identical to serial (every term, rollout order): {same}")
    print(f"serial/pooled reward time for {args.rollouts} rollouts: {rows['serial']['s'] / rows['pooled']['s']:.1f} x")


if __name__ == "__main__":
    main()
