"""The HTTP judge against a local OpenAI-compatible stub server, through the real httpx client."""

from __future__ import annotations

import logging
import socket

import pytest

from rewards.config import HttpJudgeConfig, JudgeConfig, RewardConfig
from rewards.hybrid import HybridReward
from rewards.judges import TrajectoryView, make_judge
from rewards.judges.http import HttpJudge
from tests.rewards.helpers import DONE, R, gradient, run
from tests.stub_openai import StubServer


@pytest.fixture(scope="module")
def traj():
    return run([R("flip", "Flip", {"image": "img_1"}), DONE], expected=["Flip"], instruction="Mirror the picture.")


def judge_cfg(url: str, **kw) -> JudgeConfig:
    http = HttpJudgeConfig(base_url=url, model="judge-model", timeout_s=kw.pop("timeout_s", 2.0),
                           max_retries=kw.pop("max_retries", 2), backoff_s=0.01)
    return JudgeConfig(kind="http", fallback_score=0.3, http=http, **kw)


def test_scores_alignment_with_images_and_key(traj, monkeypatch):
    monkeypatch.setenv("CANVASAGENT_JUDGE_API_KEY", "sk-test")
    with StubServer(['Sure. {"score": 8, "reason": "mirrored"}']) as srv:
        judge = make_judge(judge_cfg(srv.base_url))
        res = judge.judge("alignment", TrajectoryView.of(traj))
    assert res.score == pytest.approx(0.8) and not res.fallback
    body = srv.requests[0]
    assert body["model"] == "judge-model" and body["temperature"] == 0.0
    assert body["messages"][0]["role"] == "system" and "instruction" in body["messages"][0]["content"]
    parts = body["messages"][1]["content"]
    urls = [p["image_url"]["url"] for p in parts if p["type"] == "image_url"]
    assert len(urls) == 2 and all(u.startswith("data:image/png;base64,") for u in urls)  # input + final
    assert any("Mirror the picture." in p.get("text", "") for p in parts)
    assert srv.headers[0]["Authorization"] == "Bearer sk-test"


def test_trajectory_prompt_has_tool_set_and_no_image(traj):
    with StubServer(['{"score": 10}']) as srv:
        res = make_judge(judge_cfg(srv.base_url)).judge("trajectory", TrajectoryView.of(traj))
    assert res.score == 1.0
    parts = srv.requests[0]["messages"][1]["content"]
    assert all(p["type"] == "text" for p in parts)
    assert any('["Flip"]' in p["text"] for p in parts)


def test_retries_5xx_with_backoff(traj):
    with StubServer([503, 429, '{"score": 6}']) as srv:
        res = make_judge(judge_cfg(srv.base_url)).judge("aesthetic", TrajectoryView.of(traj))
    assert res.score == pytest.approx(0.6) and res.details["attempts"] == 3
    assert len(srv.requests) == 3


def test_non_numeric_reply_falls_back_counted_and_logged(traj, caplog):
    with StubServer(["What a lovely image!", '{"score": "great"}']) as srv:
        judge = make_judge(judge_cfg(srv.base_url))
        with caplog.at_level(logging.WARNING):
            res = judge.judge("alignment", TrajectoryView.of(traj))
    assert res.fallback and res.score == pytest.approx(0.3)
    assert "unparseable_reply" in res.reason
    assert judge.stats()["judge/alignment/fallbacks"] == 1
    assert any("fell back" in r.message for r in caplog.records)


def test_unreachable_endpoint_falls_back(traj):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens here now
    judge = make_judge(judge_cfg(f"http://127.0.0.1:{port}/v1", max_retries=1))
    res = judge.judge("aesthetic", TrajectoryView.of(traj))
    assert res.fallback and res.score == pytest.approx(0.3) and "transport" in res.reason
    assert res.reason.startswith(f"judge at http://127.0.0.1:{port}/v1: ")  # names the service that did not answer


def test_timeout_falls_back(traj):
    with StubServer(['{"score": 9}'], delay_s=0.5) as srv:
        res = make_judge(judge_cfg(srv.base_url, timeout_s=0.1, max_retries=0)).judge("aesthetic", TrajectoryView.of(traj))
    assert res.fallback and "Timeout" in res.reason


def test_cache_makes_repeats_free(traj):
    with StubServer(['{"score": 7}']) as srv:
        judge = make_judge(judge_cfg(srv.base_url))
        a = judge.judge("alignment", TrajectoryView.of(traj))
        b = judge.judge("alignment", TrajectoryView.of(traj))
    assert a.score == b.score and b.cached and len(srv.requests) == 1


def test_pool_bounds_concurrency():
    trajs = [run([DONE], images=[gradient(32 + i, 32)]) for i in range(8)]
    with StubServer(lambda body: '{"score": 5}', delay_s=0.05) as srv:
        judge = make_judge(judge_cfg(srv.base_url, max_workers=2))
        out = judge.judge_many([("alignment", TrajectoryView.of(t)) for t in trajs])
    assert [r.score for r in out] == [0.5] * 8
    assert 1 <= srv.peak <= 2 and len(srv.requests) == 8


def test_hybrid_with_http_judge(traj):
    with StubServer(['{"score": 10}']) as srv:
        cfg = RewardConfig.load("paper")
        cfg.judges = judge_cfg(srv.base_url)
        flat = HybridReward(cfg).score(traj)
    assert flat["align"] == flat["aes"] == flat["traj"] == 1.0
    assert flat["hybrid"] == pytest.approx(0.3 + 0.1 + 0.2 + 0.4 * flat["rule"])
    assert flat["fallbacks"] == 0


def test_no_final_image_is_zero_aesthetic_without_a_call():
    t = run([DONE])
    with StubServer(['{"score": 9}']) as srv:
        res = HttpJudge(judge_cfg(srv.base_url).http).judge("aesthetic", TrajectoryView.of(t))
    assert res.score == 0.0 and res.reason == "no_final_image" and not srv.requests


def test_a_batch_with_repeated_content_meets_the_cache_as_serially():
    """The second of two jobs reading the same content is a cache hit, as it would be serially,
    however the pool's threads are scheduled."""
    a, b = run([DONE], images=[gradient(40, 32)]), run([DONE], images=[gradient(48, 32)])
    jobs = [("alignment", TrajectoryView.of(t)) for t in (a, a, b, b)]
    with StubServer(lambda body: '{"score": 5}', delay_s=0.05) as srv:
        out = make_judge(judge_cfg(srv.base_url, max_workers=4)).judge_many(jobs)
    assert [r.cached for r in out] == [False, True, False, True] and len(srv.requests) == 2
