"""Every check's calibration on a correct, a no-op and wrong outputs; strict success; the
aesthetic gate; and how GRPO counts, drops or aborts on judge fallbacks."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from PIL import Image
from skimage import data

from canvasagent.evaluation.metrics import policy_metrics, task_result
from canvasagent.core.tasks import Task
from canvasagent.evaluation.scoring import HybridScorer
from canvasagent.training.rewarding import JudgeOutage, TRLRewards
from rewards.checks import CheckContext, calibrated, run_check, run_checks
from rewards.hybrid import HybridReward
from tests.rewards.helpers import DONE, R, run
from tests.rewards.test_offline_judges import align, recorded_toolbox
from toolserver.toolbox import RecordedOutput


def photo(w: int = 96, h: int = 64) -> Image.Image:
    return Image.fromarray(data.astronaut()).resize((w, h), Image.Resampling.BILINEAR)


def crop(img: Image.Image, box: tuple[int, int, int, int]) -> Image.Image:
    """The canvascraft profile's Crop of a 0-1000 box, done by the tool itself."""
    traj = run([R("crop", "Crop", {"image": "img_1", "bbox": list(box)}), DONE], images=[img])
    return traj.final_asset().image


FULL = R("keep all", "Crop", {"image": "img_1", "bbox": [0, 0, 1000, 1000]})  # an edit that changes nothing
FLIP = R("mirror", "Flip", {"image": "img_1"})
TURN = R("turn", "Rotate", {"image": "img_1", "angle": 180})


def check(traj, c):
    return run_check(CheckContext(traj), c)


# -- reference_similarity ---------------------------------------------------------------------


@pytest.mark.parametrize("exact", [True, False])
def test_reference_similarity_calibration(exact):
    img = photo()
    target = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    c = {"type": "reference_similarity", "image_index": 0, "exact": exact}
    meta = {"reference_images": [target]}
    good = check(run([FLIP, DONE], images=[img], meta=meta), c)
    noop = check(run([FULL, DONE], images=[img], meta=meta), c)
    wrong = check(run([TURN, DONE], images=[img], meta=meta), c)
    assert good.score == pytest.approx(1.0) and good.passed
    assert noop.score == pytest.approx(0.0, abs=0.02) and not noop.passed  # zero is doing nothing
    assert wrong.score < 0.15 and not wrong.passed
    nothing = check(run([DONE], images=[img], meta=meta), c)
    assert nothing.score == 0.0 and not nothing.passed and nothing.reason == "no_final_image"


def test_reference_similarity_wrong_parameter_and_size():
    img = photo()
    c = {"type": "reference_similarity", "image_index": 0, "exact": True}
    meta = {"reference_images": [crop(img, (0, 0, 500, 1000))]}
    right = check(run([R("crop", "Crop", {"image": "img_1", "bbox": [0, 0, 500, 1000]}), DONE], images=[img], meta=meta), c)
    shifted = check(run([R("crop", "Crop", {"image": "img_1", "bbox": [250, 0, 750, 1000]}), DONE], images=[img], meta=meta), c)
    bigger = check(run([R("crop", "Crop", {"image": "img_1", "bbox": [0, 0, 600, 1000]}), DONE], images=[img], meta=meta), c)
    assert right.score == 1.0 and right.passed
    # Exactness required: a near miss keeps at most half of its calibrated gain and never passes.
    assert shifted.score < 0.3 and not shifted.passed
    assert bigger.score <= 0.5 and not bigger.passed


def test_reference_similarity_threshold_without_exactness():
    img = photo()
    target = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    c = {"type": "reference_similarity", "image_index": 0, "threshold": 0.9}
    near = target.copy()
    near.putpixel((3, 3), (0, 0, 0))  # one pixel off: not exact, still far above the threshold
    traj = run([FLIP, DONE], images=[img], meta={"reference_images": [near]})
    r = check(traj, c)
    assert 0.9 <= r.score < 1.0 and r.passed


def test_a_baseline_that_already_matches_is_unverifiable():
    img = photo()
    c = {"type": "reference_similarity", "image_index": 0}
    r = check(run([FULL, DONE], images=[img], meta={"reference_images": [img.copy()]}), c)
    assert r.score is None and "baseline_equals_reference" in r.reason


def test_calibrated_bounds():
    assert calibrated(0.7, 0.7) == 0.0 and calibrated(1.0, 0.3) == 1.0 and calibrated(0.1, 0.5) == 0.0
    assert calibrated(0.65, 0.3) == pytest.approx(0.5) and calibrated(0.9, 1.0) is None


# -- OCR ----------------------------------------------------------------------------------------

OVERLAY = R("text", "Overlayer", {"base_image": "img_1", "overlay_type": "text", "content": "BIG SALE"})


def _ocr_align(final_reads: str, baseline_reads: str, replies=(OVERLAY, DONE)):
    traj = run(list(replies), checks=[{"type": "ocr_contains", "text": "big sale"}])
    # The judge reads the final image first, then the baseline input.
    return align(traj, recorded_toolbox(OCR=[RecordedOutput(final_reads), RecordedOutput(baseline_reads)]))


def test_ocr_contains_calibration():
    assert _ocr_align("BIG SALE", "").score == 1.0  # correct
    assert _ocr_align("", "").score == 0.0  # the text is not there
    assert _ocr_align("XQ 7", "").score == 0.0  # no credit for text that is not there
    assert _ocr_align("BIG SA1E", "").details["passed"] == 0.0  # partial credit, never success
    # Doing nothing would already read it: the check cannot tell, so it is not counted.
    unver = _ocr_align("BIG SALE", "BIG SALE")
    assert unver.fallback and unver.details["verifiable"] == 0
    # Part of the text was readable before the edit: only the improvement counts.
    part = _ocr_align("BIG SA1E", "BIG")
    assert 0.0 < part.score < 0.875


def test_answer_contains_reads_the_tool_answer():
    c = [{"type": "answer_contains", "text": "OPEN 24H", "tool": "OCR"}]
    read = run([R("read", "OCR", {"image": "img_1"}), DONE], checks=c, recorded={"OCR": [RecordedOutput("open 24h")]})
    other = run([R("read", "OCR", {"image": "img_1"}), DONE], checks=c, recorded={"OCR": [RecordedOutput("CLOSED")]})
    nothing = run([DONE], checks=c)
    flipped = run([FLIP, DONE], checks=c)
    assert align(read).score == 1.0 and align(read).details["passed"] == 1.0
    assert align(other).score == align(nothing).score == align(flipped).score == 0.0


# -- binary checks and EASEL --------------------------------------------------------------------


@pytest.mark.parametrize("c", [
    {"type": "size_relation", "of": "img_1", "factor": 4},
    {"type": "size_relation", "relation": "smaller"},
    {"type": "orientation", "relation": "swapped"},
    {"type": "asset_kind", "kind": "mask"},
    {"type": "differs_from", "of": "img_1"},
])
def test_binary_checks_fail_a_no_op(c):
    r = check(run([FULL, DONE], images=[photo()]), c)
    assert r.score == 0.0 and not r.passed


def test_differs_from_is_necessary_not_sufficient():
    # Any change passes it: builders pair it with a check of what the change should be.
    r = check(run([FLIP, DONE], images=[photo()]), {"type": "differs_from", "of": "img_1"})
    assert r.score == 1.0 and r.passed


def test_easel_reconstruction_calibration():
    def at(score, s_blank=0.5):
        traj = run([DONE])
        traj.meta["easel"] = {"score": score, "s_blank": s_blank}
        return check(traj, {"type": "easel_reconstruction", "threshold": 0.8})

    assert at(0.5).score == 0.0 and not at(0.5).passed  # the blank canvas: nothing painted
    assert at(1.0).score == 1.0 and at(1.0).passed
    assert at(0.95).score == pytest.approx(0.9) and at(0.95).passed
    assert at(0.7).score == pytest.approx(0.4) and not at(0.7).passed
    assert run_check(CheckContext(run([DONE])), {"type": "easel_reconstruction"}).score is None  # no outcome recorded


# -- strict success -----------------------------------------------------------------------------


def test_success_needs_every_check():
    img = photo()
    target = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    both = [{"type": "reference_similarity", "image_index": 0, "exact": True}, {"type": "size_relation", "relation": "smaller"}]
    traj = run([FLIP, DONE], images=[img], checks=both, meta={"reference_images": [target]})
    score, results = run_checks(CheckContext(traj), both)
    assert score == pytest.approx(0.5) and [r.passed for r in results] == [True, False]
    flat = HybridReward.from_preset("paper", judge="offline").score(traj)
    assert flat["align/passed"] == 0.0 and flat["align/pass_rate"] == 0.5
    res = task_result(traj, {**flat, "align": 0.99}, 0.5)  # a high mean is partial credit, not success
    assert not res.success
    one = both[:1]
    ok = run([FLIP, DONE], images=[img], checks=one, meta={"reference_images": [target]})
    ok_flat = HybridReward.from_preset("paper", judge="offline").score(ok)
    assert task_result(ok, ok_flat, 0.5).success
    pm = policy_metrics([task_result(traj, flat, 0.5), task_result(ok, ok_flat, 0.5)])
    assert pm["success"] == 0.5 and pm["partial"] == pytest.approx(0.75)


def test_no_check_is_no_success():
    traj = run([FLIP, DONE], images=[photo()])
    flat = HybridReward.from_preset("paper", judge="offline").score(traj)
    assert flat["align/fallback"] == 1.0 and not task_result(traj, flat, 0.5).success


# -- aesthetics never reward inaction -------------------------------------------------------------


def test_a_mirror_or_a_no_op_never_outscores_the_correct_edit_on_aesthetics():
    img = photo(128, 96)
    target = crop(img, (250, 250, 750, 750))
    c = [{"type": "reference_similarity", "image_index": 0, "exact": True}]
    meta = {"reference_images": [target]}
    h = HybridReward.from_preset("paper", judge="offline")
    good = h.score(run([R("crop", "Crop", {"image": "img_1", "bbox": [250, 250, 750, 750]}), DONE], images=[img], checks=c, meta=meta))
    mirror = h.score(run([FLIP, DONE], images=[img], checks=c, meta=meta))
    noop = h.score(run([FULL, DONE], images=[img], checks=c, meta=meta))
    # The raw proxy prefers the uncropped photo; gated by alignment it cannot.
    assert mirror["aes/raw"] >= good["aes/raw"] - 0.2
    assert good["aes"] > mirror["aes"] and good["aes"] > noop["aes"]
    assert mirror["aes"] < 0.05 and noop["aes"] < 0.05


# -- judge fallbacks in GRPO --------------------------------------------------------------------


class _Rollout:
    """Stands in for an env and its (empty) trajectory: TRLRewards scores it once and caches
    `scores`; `pre` is what the scorer returns for it."""

    def __init__(self, pre):
        self.pre, self.scores = pre, None
        self.turns: list = []
        self.task = Task("x")


@pytest.fixture
def rollouts(monkeypatch):
    monkeypatch.setattr("canvasagent.training.rewarding.trajectory_of", lambda env, completion: env)

    def make(fallbacks: list[int]):
        return [_Rollout({"align": 0.3 if f else 0.1 * (i % 4), "rule": 1.0, "fallbacks": float(f)}) for i, f in enumerate(fallbacks)]

    return make


def _rewards(fallback_share: float, on_excess: str, group: int = 4):
    scorer = HybridScorer({"align": 0.5, "rule": 0.5}, lambda r: dict(r.pre), "test", fallback_share, on_excess)
    return TRLRewards(scorer, group_size=group)


def _step(rw, envs):
    fn = rw.functions()[0]  # every function shares one scoring pass per batch
    fn(completions=[None] * len(envs), environments=envs)
    return [e.scores for e in envs]


def test_fallbacks_are_counted_and_warned(rollouts, caplog):
    rw = _rewards(0.5, "abort")
    envs = rollouts([1, 0, 0, 0, 0, 0, 0, 0])
    with caplog.at_level(logging.WARNING):
        out = _step(rw, envs)
    assert [s["judge_fallbacks"] for s in out] == [1.0] + [0.0] * 7
    assert any("1 of 8 rollouts were scored by a judge fallback" in r.getMessage() for r in caplog.records)
    logged = {fn.__name__: fn for fn in rw.functions()}
    assert logged["judge_fallbacks"](completions=[None] * 8, environments=envs) == [1.0] + [0.0] * 7
    assert rw.weights()[-1] == 0.0 and len(rw.weights()) == len(rw.functions())


def test_too_many_fallbacks_abort(rollouts):
    rw = _rewards(0.2, "abort")
    with pytest.raises(JudgeOutage, match="3 of 8 rollouts"):
        _step(rw, rollouts([1, 1, 0, 0, 1, 0, 0, 0]))


def test_too_many_fallbacks_are_dropped_from_the_advantage(rollouts):
    rw = _rewards(0.2, "drop", group=4)
    out = _step(rw, rollouts([1, 0, 0, 0, 1, 1, 1, 1]))
    g1 = [s["align"] for s in out[:4]]
    # The fallback rollout takes its group's judged mean: zero advantage, the others unchanged.
    assert g1[0] == pytest.approx(np.mean([0.1, 0.2, 0.3])) and g1[1:] == pytest.approx([0.1, 0.2, 0.3])
    assert out[0]["dropped"] == 1.0 and "dropped" not in out[1]
    assert out[0]["hybrid"] == pytest.approx(0.5 * out[0]["align"] + 0.5)
    # A group with nothing judged is constant, so it teaches nothing.
    assert len({s["align"] for s in out[4:]}) == 1 and all(s["dropped"] == 1.0 for s in out[4:])


def test_below_the_share_fallbacks_are_kept(rollouts):
    rw = _rewards(0.5, "drop")
    out = _step(rw, rollouts([1, 0, 0, 0]))
    assert out[0]["align"] == 0.3 and "dropped" not in out[0]


# -- a model judge keeps the verifiable checks ------------------------------------------------


def test_http_judge_alignment_combines_the_checks_with_the_model():
    from rewards.config import HttpJudgeConfig, JudgeConfig, RewardConfig
    from tests.stub_openai import StubServer

    img = photo()
    target = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    c = [{"type": "reference_similarity", "image_index": 0, "exact": True}]
    meta = {"reference_images": [target]}
    good = run([FLIP, DONE], images=[img], checks=c, meta=meta)
    wrong = run([TURN, DONE], images=[img], checks=c, meta=meta)
    with StubServer(['{"score": 8, "reason": "looks right"}'] * 8) as srv:
        cfg = RewardConfig.load("paper")
        cfg.judges = JudgeConfig(kind="http", http=HttpJudgeConfig(base_url=srv.base_url, max_retries=1, backoff_s=0.01))
        h = HybridReward(cfg)
        g, w = h.score(good), h.score(wrong)
    # The model is fooled by the wrong edit; the checks are not, and they alone decide success.
    assert g["align/judge_score"] == w["align/judge_score"] == pytest.approx(0.8)
    assert g["align"] == pytest.approx(0.5 * 1.0 + 0.5 * 0.8) and g["align/passed"] == 1.0
    assert w["align/checks_score"] < 0.1 and w["align"] < 0.5 and w["align/passed"] == 0.0


def test_presets_refuse_unknown_gate_and_fallback_policy(tmp_path):
    from rewards.config import RewardConfig

    for bad in ("aes_gate: sometimes\n", "judges: {on_excess_fallbacks: ignore}\n"):
        p = tmp_path / "bad.yaml"
        p.write_text("name: bad\nmode: paper\n" + bad)
        with pytest.raises(ValueError, match="aes_gate|on_excess_fallbacks"):
            RewardConfig.load(p)


def test_a_reference_path_may_not_leave_the_task_root(tmp_path):
    root = tmp_path / "split"
    root.mkdir()
    img = photo()
    img.save(tmp_path / "secret.png")
    img.save(root / "ref.png")
    meta = {"root": str(root)}
    inside = check(run([FULL, DONE], images=[img], meta=meta), {"type": "reference_similarity", "path": "ref.png", "baseline": None})
    assert inside.score is not None
    for bad in ("../secret.png", str(tmp_path / "secret.png")):
        r = check(run([FULL, DONE], images=[img], meta=meta), {"type": "reference_similarity", "path": bad})
        assert r.score is None and "malformed check" in r.reason
