"""Hybrid reward: presets change the total exactly as their weights say; memo; bad input."""

from __future__ import annotations

import logging
import math
import socket

import pytest
from PIL import Image

from rewards.config import HttpJudgeConfig, JudgeConfig, RewardConfig
from rewards.hybrid import COMPONENTS, HybridReward
from tests.rewards.helpers import DONE, R, mask, run
from tests.stub_openai import StubServer
from toolserver.toolbox import RecordedOutput

A = pytest.approx
CHECKS = [{"type": "size_relation", "relation": "smaller"}, {"type": "differs_from", "of": "img_1"}]


@pytest.fixture(scope="module")
def trajs():
    chain = [
        R("find", "Grounding", {"image": "img_1", "reference_text": "square"}),
        R("mask", "SAM", {"image": "img_1", "bbox": [250, 250, 750, 750]}),
        R("cut", "Extract", {"image": "img_1", "mask": "SAM_0"}),
        R("paste", "Overlayer", {"base_image": "img_1", "overlay_type": "object", "content": "Extract_0"}),
        DONE,
    ]
    rec = {"Grounding": [RecordedOutput("[[250, 250, 750, 750]]")], "SAM": [RecordedOutput("mask", mask())]}
    return [
        run([R("c", "Crop", {"image": "img_1", "bbox": [0, 0, 500, 500]}), R("f", "Flip", {"image": "Crop_0"}), DONE], expected=["Crop", "Flip"], checks=CHECKS),
        run(chain, expected=["Grounding", "SAM", "Extract", "Overlayer"], recorded=rec, checks=CHECKS),
        run([R("bad", "Crop", {"image": "img_1", "bbox": [9, 9, 1, 1]}), R("f", "Flip", {"image": "img_1"}), R("f", "Flip", {"image": "img_1"}), DONE], expected=["Crop", "Rotate"], checks=CHECKS),
        run([DONE], expected=["Flip"], checks=CHECKS),
    ]


def test_flat_dict_has_total_components_and_subterms(trajs):
    flat = HybridReward("paper").score(trajs[1])
    for k in ("hybrid", *COMPONENTS, "rule/format/json", "rule/action/ref", "rule/p_eff/repeat", "aes/sharpness",
              "traj/order", "align/fallback", "fallbacks"):
        assert k in flat, k
    assert all(isinstance(v, float) and math.isfinite(v) for v in flat.values())


@pytest.mark.parametrize("preset", ["paper", "no-outcome", "no-process"])
def test_paper_mode_presets_are_weighted_sums(trajs, preset):
    h = HybridReward(preset)
    w = RewardConfig.load(preset).weights
    for flat in h.score_many(trajs):
        assert flat["hybrid"] == A(w.align * flat["align"] + w.aes * flat["aes"] + w.traj * flat["traj"] + w.rule * flat["rule"])


def test_presets_differ_exactly_by_their_weights(trajs):
    paper, no_out, no_proc = (HybridReward(p).score_many(trajs) for p in ("paper", "no-outcome", "no-process"))
    for p, o, q in zip(paper, no_out, no_proc):
        assert {c: p[c] for c in COMPONENTS} == {c: o[c] for c in COMPONENTS} == {c: q[c] for c in COMPONENTS}
        assert p["hybrid"] - o["hybrid"] == A(0.3 * p["align"] + 0.1 * p["aes"])
        assert p["hybrid"] - q["hybrid"] == A(0.2 * p["traj"] + 0.4 * p["rule"])


def test_public_code_preset_formula(trajs):
    for t, f in zip(trajs, HybridReward("public-code").score_many(trajs)):
        outcome = 0.3 * f["align"] + 0.1 * f["aes"]
        proc = 0.6 * min(1.0, (0.3 * f["traj"] + 0.15 * f["rule/format"] + 0.15 * f["rule/action"] + f["public/coverage"] + f["public/depth"]) / 0.92)
        assert f["public/outcome"] == A(outcome) and f["public/process"] == A(proc)
        assert f["hybrid"] == A(f["public/gate"] * min(1.0, max(0.0, outcome + proc - f["rule/p_eff"])))
    full = HybridReward("public-code").score(trajs[1])
    assert full["public/coverage"] == A(0.10) and full["public/depth"] == A(0.22) and full["public/gate"] == 1.0
    gated = HybridReward("public-code").score(trajs[3])  # no executable call for a task that expects one
    assert gated["public/gate"] == 0.0 and gated["hybrid"] == 0.0


def test_public_code_format_subweights(trajs):
    t = run(["```" + R("f", "Flip", {"image": "img_1"}) + "```", DONE])  # fails only the "no fences" check, in 1 of 2 turns
    assert HybridReward("public-code").score(t)["rule/format"] == A(1 - 0.10 * 0.5)
    assert HybridReward("paper").score(t)["rule/format"] == A(1 - 0.20 * 0.5)


def test_custom_yaml_preset(tmp_path, trajs):
    p = tmp_path / "align-only.yaml"
    p.write_text("name: align-only\nweights: {align: 1.0, aes: 0.0, traj: 0.0, rule: 0.0}\n")
    flat = HybridReward(p).score(trajs[0])
    assert flat["hybrid"] == flat["align"]
    with pytest.raises(ValueError):
        bad = tmp_path / "typo.yaml"
        bad.write_text("weights: {allign: 1.0}\n")
        RewardConfig.load(bad)


# -- memo --------------------------------------------------------------------------------------


def test_a_rescored_trajectory_is_memoised(trajs):
    h = HybridReward("paper")
    first = h.score(trajs[0])
    before = h.stats()
    assert h.score_many([trajs[0]])[0] is first
    after = h.stats()  # from the memo: not judged, not even looked up in the judge's cache
    assert (after["judge/cache_hits"], after["judge/cache_misses"]) == (before["judge/cache_hits"], before["judge/cache_misses"])


# -- bad input ---------------------------------------------------------------------------------


def _finite_in_range(flat):
    assert all(math.isfinite(v) for v in flat.values())
    assert 0.0 <= flat["hybrid"] <= 1.0
    for c in COMPONENTS:
        assert 0.0 <= flat[c] <= 1.0


def test_bad_inputs_give_defined_scores_and_reasons(caplog):
    h = HybridReward("paper")
    empty = Image.new("RGB", (0, 0))
    cases = {
        "no tool call": run([DONE], expected=["Flip"], checks=CHECKS),
        "empty final image": run([R("up", "SR", {"image": "img_1"}), DONE], recorded={"SR": [RecordedOutput("x4", empty)]}, checks=CHECKS),
        "broken json": run(['<reason>x</reason><tool_call>{"name": "Flip", "arguments": </tool_call>', DONE]),
        "unknown tools": run([R("x", "Teleport", {"image": "img_1"}), R("y", "", {}), DONE]),
        "empty reply": run(["", "   ", DONE]),
        "garbage": run(["\x00\x01 <tool_call>[1, 2]</tool_call> ```", None, 42, DONE]),
    }
    with caplog.at_level(logging.DEBUG, logger="rewards"):
        for name, t in cases.items():
            flat = h.score(t)
            _finite_in_range(flat)
    assert h.score(cases["empty final image"])["aes"] == 0.0
    assert h.score(cases["no tool call"])["rule/action"] == 0.0
    assert any("no_tool_call" in r.getMessage() for r in caplog.records)
    invalid = h.score(None)  # not a trajectory at all
    assert invalid["hybrid"] == 0.0 and invalid["invalid"] == 1.0


def _dead_url() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}/v1"


@pytest.mark.parametrize("reply", [None, "I think it is quite good."])
def test_unreachable_or_non_numeric_judge_gives_fallback_total(trajs, reply, caplog):
    cfg = RewardConfig.load("paper")
    if reply is None:
        cfg.judges = JudgeConfig(kind="http", fallback_score=0.3, http=HttpJudgeConfig(base_url=_dead_url(), max_retries=1, backoff_s=0.01, timeout_s=1))
        flat = HybridReward(cfg).score(trajs[0])
    else:
        with StubServer([reply]) as srv:
            cfg.judges = JudgeConfig(kind="http", fallback_score=0.3, http=HttpJudgeConfig(base_url=srv.base_url, max_retries=1, backoff_s=0.01))
            with caplog.at_level(logging.WARNING):
                flat = HybridReward(cfg).score(trajs[0])
        assert any("fell back" in r.getMessage() for r in caplog.records)
    # Every aspect fell back and is counted; alignment keeps what the verifiable checks measured,
    # and the aesthetic fallback is gated by it.
    assert flat["fallbacks"] == 3 and flat["traj"] == A(0.3) and flat["aes/raw"] == A(0.3)
    assert flat["align"] == A(flat["align/checks_score"]) and flat["aes"] == A(0.3 * flat["align"])
    assert flat["hybrid"] == A(0.3 * flat["align"] + 0.1 * flat["aes"] + 0.2 * 0.3 + 0.4 * flat["rule"])


def test_compat_api_for_trainers(trajs):
    h = HybridReward.from_preset("no-outcome", judge="offline")
    assert h.weights == {"align": 0.0, "aes": 0.0, "traj": 0.2, "rule": 0.4}
    comps = h.components(trajs[0])
    assert sum(w * comps[k] for k, w in h.weights.items()) == A(comps["hybrid"])
    pc = HybridReward.from_preset("public-code")
    assert pc.weights == {"hybrid": 1.0}


def test_training_can_skip_unweighted_judges(trajs):
    h = HybridReward("no-process", judge_unweighted=False)
    flat = h.score(trajs[0])
    assert flat["traj/skipped"] == 1.0 and flat["traj"] == 0.0
    assert flat["hybrid"] == A(0.3 * flat["align"] + 0.1 * flat["aes"])
    assert h.stats()["judge/trajectory/calls"] == 0
