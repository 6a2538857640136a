"""Judge plumbing: score parsing, the content-hash cache under concurrency, judge selection."""

from __future__ import annotations

import math
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rewards.config import JudgeConfig
from rewards.judges import CachedJudge, JudgeResult, TrajectoryView, make_judge, parse_score
from tests.rewards.helpers import DONE, R, gradient, run


@pytest.mark.parametrize(
    "text, expected",
    [
        ('{"score": 7, "reason": "ok"}', 0.7),
        ('Here you go: {"score": 10}', 1.0),
        ("score: 3", 0.3),
        ("Score = 4.5 overall", 0.45),
        ("8", 0.8),
        ("8/10", 0.8),
        ("3/5", 0.6),
        ('{"score": "9"}', 0.9),
    ],
)
def test_parse_score_accepts(text, expected):
    assert parse_score(text)[0] == pytest.approx(expected)


@pytest.mark.parametrize("text", [None, "", "great image!", '{"score": 11}', '{"score": -1}', '{"score": "high"}',
                                  '{"score": NaN}', '{"score": true}', "score: 99"])
def test_parse_score_rejects(text):
    assert parse_score(text)[0] is None


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60))
def test_parse_score_is_none_or_in_range(text):
    v, how = parse_score(text)
    assert v is None or (math.isfinite(v) and 0.0 <= v <= 1.0)
    assert isinstance(how, str)


class SlowJudge:
    """Counts calls; sleeps so concurrent requests for one key overlap."""

    name = "slow"

    def __init__(self):
        self.calls = 0
        self.lock = threading.Lock()

    def fingerprint(self) -> str:
        return "slow"

    def judge(self, aspect, view):
        with self.lock:
            self.calls += 1
        time.sleep(0.05)
        if aspect == "trajectory":
            raise RuntimeError("judge bug")
        return JudgeResult(score=0.6, judge=self.name)


def test_concurrent_identical_requests_are_computed_once():
    traj = run([R("f", "Flip", {"image": "img_1"}), DONE])
    inner = SlowJudge()
    judge = CachedJudge(inner, fallback_score=0.2, max_workers=4)
    views = [TrajectoryView.of(traj) for _ in range(4)]  # distinct objects, identical content
    out = judge.judge_many([("aesthetic", v) for v in views])
    assert [r.score for r in out] == [0.6] * 4 and inner.calls == 1 and sum(r.cached for r in out) == 3
    # Same content in another trajectory object is also a hit.
    again = run([R("f", "Flip", {"image": "img_1"}), DONE], images=[gradient()])
    assert judge.judge("aesthetic", TrajectoryView.of(again)).cached
    # A judge that raises becomes a counted fallback, never an exception.
    bad = judge.judge("trajectory", views[0])
    assert bad.fallback and bad.score == 0.2 and "judge bug" in bad.reason
    assert judge.stats()["judge/trajectory/fallbacks"] == 1


def test_make_judge_rejects_unknown_kind():
    with pytest.raises(ValueError):
        make_judge(JudgeConfig(kind="oracle"))
