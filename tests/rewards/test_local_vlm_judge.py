"""The local VLM judge on the tiny offline Qwen3-VL (random weights: we test plumbing, not taste)."""

from __future__ import annotations

import math

import pytest

from rewards.config import JudgeConfig, LocalJudgeConfig, RewardConfig
from rewards.hybrid import HybridReward
from rewards.judges import TrajectoryView, make_judge
from tests.fixtures_models import tiny_qwen3vl_dir  # noqa: F401  (session fixture)
from tests.rewards.helpers import DONE, R, run

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def traj():
    return run([R("mirror", "Flip", {"image": "img_1"}), DONE], expected=["Flip"], instruction="Mirror the image.")


def test_logits_mode_scores_every_aspect(tiny_qwen3vl_dir, traj):  # noqa: F811
    cfg = RewardConfig.load("paper")
    cfg.judges = JudgeConfig(kind="local", local=LocalJudgeConfig(model=str(tiny_qwen3vl_dir), mode="logits"))
    h = HybridReward(cfg)
    flat = h.score(traj)
    for c in ("align", "aes", "traj"):
        assert 0.0 <= flat[c] <= 1.0 and math.isfinite(flat[c])
        assert flat[f"{c}/fallback"] == 0.0  # a digit distribution always yields a number
        assert 0.0 < flat[f"{c}/p_max"] <= 1.0
    assert flat["hybrid"] == pytest.approx(0.3 * flat["align"] + 0.1 * flat["aes"] + 0.2 * flat["traj"] + 0.4 * flat["rule"])
    again = h.judge.judge("alignment", TrajectoryView.of(traj))
    assert again.cached and again.score == pytest.approx(flat["align"])


def test_generate_mode_unparseable_reply_falls_back(tiny_qwen3vl_dir, traj):  # noqa: F811
    judge = make_judge(JudgeConfig(kind="local", fallback_score=0.25,
                                   local=LocalJudgeConfig(model=str(tiny_qwen3vl_dir), mode="generate", max_new_tokens=6)))
    res = judge.judge("aesthetic", TrajectoryView.of(traj))
    # Random weights write gibberish; whatever comes out, the result is defined and flagged.
    assert 0.0 <= res.score <= 1.0
    if res.fallback:
        assert res.score == 0.25 and "unparseable_reply" in res.reason
        assert judge.stats()["judge/aesthetic/fallbacks"] == 1


def test_missing_checkpoint_falls_back(tmp_path, traj):
    judge = make_judge(JudgeConfig(kind="local", local=LocalJudgeConfig(model=str(tmp_path / "missing"))))
    res = judge.judge("trajectory", TrajectoryView.of(traj))
    assert res.fallback and res.score == 0.3 and "model_unavailable" in res.reason
