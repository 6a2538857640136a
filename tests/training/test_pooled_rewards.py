"""GRPO's reward functions score a step's rollouts as one batch, its judge calls concurrent.

Real rollouts (a TRL env of the offline toolbox, a Flip executed, the completion's final reply
stepped through the episode) are scored through the one scorer bridge (`make_scorer` from a
preset file) under an HTTP judge served by a local OpenAI-compatible server that answers each
request after 0.3 s.
"""

from __future__ import annotations

import json
import re
import time

import pytest
import yaml

from canvasagent.core.tasks import Task
from canvasagent.evaluation.scoring import make_scorer
from canvasagent.training.env import make_env_class
from canvasagent.training.messages import grpo_row
from canvasagent.training.rewarding import TRLRewards
from tests.rewards.helpers import gradient
from tests.stub_openai import StubServer
from toolserver.client import make_toolbox

LATENCY = 0.3
N = 16
DONE = [{"role": "assistant", "content": [{"type": "text", "text": "<reason>Mirrored.</reason><Terminate>"}]}]


def _judge_reply(body: dict) -> str:
    """A score that depends on the rollout's instruction, so a result given to the wrong rollout shows."""
    i = int(re.search(r"picture (\d+)", json.dumps(body)).group(1))
    return json.dumps({"score": i % 11, "reason": "ok"})


@pytest.fixture(scope="module")
def rollouts():
    env_cls = make_env_class(["Flip"], lambda: make_toolbox("offline"), max_turns=3)
    envs = []
    for i in range(N):
        env = env_cls()
        env.reset(**grpo_row(Task(f"Mirror picture {i}.", [gradient(32 + i, 32)], id=f"t{i}", expected_tools=["Flip"])))
        env.Flip(image="img_1")
        envs.append(env)
    return envs


def _preset(tmp_path, workers: int) -> str:
    """The paper preset with alignment as its only judged component (one judge request per
    rollout) and `workers` concurrent judge calls."""
    cfg = yaml.safe_load(open("configs/reward/paper.yaml"))
    cfg["weights"] = {"align": 0.6, "aes": 0.0, "traj": 0.0, "rule": 0.4}
    cfg["judges"]["max_workers"] = workers
    cfg["judges"]["http"].update(timeout_s=10, max_retries=0)
    path = tmp_path / f"pooled-{workers}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def _step(rollouts, preset: str, url: str) -> tuple[float, list[dict]]:
    for env in rollouts:
        env.scores = None  # a fresh step over the same finished trajectories
    fn = TRLRewards(make_scorer(preset, "http", judge_url=url)).functions()[0]
    t0 = time.perf_counter()
    fn(completions=[DONE] * N, environments=rollouts)
    return time.perf_counter() - t0, [dict(env.scores) for env in rollouts]


def test_a_step_is_scored_concurrently_with_the_serial_scores(rollouts, tmp_path):
    with StubServer(_judge_reply, delay_s=LATENCY) as srv:
        pooled_s, pooled = _step(rollouts, _preset(tmp_path, N), srv.base_url)
        assert len(srv.requests) == N and srv.peak > 1
        peak_pooled, srv.peak = srv.peak, 0
        serial_s, serial = _step(rollouts, _preset(tmp_path, 1), srv.base_url)
        assert len(srv.requests) == 2 * N and srv.peak == 1
    assert peak_pooled <= N
    assert pooled_s < 3 * LATENCY, f"16 rollouts with 16 concurrent judge calls took {pooled_s:.2f} s"
    assert serial_s > 0.8 * N * LATENCY
    assert pooled == serial  # every term, in rollout order
    assert [s["align/judge_score"] for s in pooled] == [pytest.approx((i % 11) / 10) for i in range(N)]
    assert all(s["judge_fallbacks"] == 0.0 for s in pooled)
