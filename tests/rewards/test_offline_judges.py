"""Offline judges: verifiable alignment checks, the quality proxy, the deterministic process score."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image, ImageFilter
from skimage import data

from rewards.checks import CHECK_TYPES, CheckContext, run_check
from rewards.config import OfflineJudgeConfig
from rewards.judges import TrajectoryView
from rewards.judges.iq import image_quality
from rewards.judges.offline import OfflineJudge
from tests.rewards.helpers import DONE, R, gradient, mask, run
from toolserver.registry import OutputKind
from toolserver.results import ToolResult
from toolserver.toolbox import LocalToolbox, RecordedOutput

FLIP = R("mirror", "Flip", {"image": "img_1"})


def judge_with(toolbox=None) -> OfflineJudge:
    return OfflineJudge(OfflineJudgeConfig(), toolbox=toolbox if toolbox is not None else LocalToolbox())


def align(traj, toolbox=None):
    return judge_with(toolbox).judge("alignment", TrajectoryView.of(traj))


def recorded_toolbox(**outs) -> LocalToolbox:
    tb = LocalToolbox()
    for tool, items in outs.items():
        for o in items:
            tb.add_recorded(tool, o)
    return tb


def plumbing_backend(kind: OutputKind, image=None, text="plumbing"):
    def fn(req):
        return ToolResult(True, text, kind, image, plumbing_only=True, backend="tiny-random")

    return fn


# -- reference similarity ----------------------------------------------------------------------


def test_reference_similarity_rewards_the_right_edit():
    img = gradient()
    ref = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    checks = [{"type": "reference_similarity", "image_index": 0}]
    good = run([FLIP, DONE], images=[img], checks=checks, meta={"reference_images": [ref]})
    bad = run([R("turn", "Rotate", {"image": "img_1", "angle": 180}), DONE], images=[img], checks=checks, meta={"reference_images": [ref]})
    g, b = align(good), align(bad)
    assert g.score == pytest.approx(1.0) and not g.fallback
    assert b.score < 0.8 and not b.fallback


def test_reference_from_path_and_threshold(tmp_path):
    img = gradient()
    img.transpose(Image.Transpose.FLIP_LEFT_RIGHT).save(tmp_path / "ref.png")
    traj = run([FLIP, DONE], images=[img], checks=[{"type": "reference_similarity", "path": "ref.png", "threshold": 0.9, "metric": "psnr"}],
               meta={"root": str(tmp_path)})
    assert align(traj).score == pytest.approx(1.0)


# -- OCR -----------------------------------------------------------------------------------------


def test_ocr_contains_through_the_toolbox():
    checks = [{"type": "ocr_contains", "text": "big sale"}]
    traj = run([R("text", "Overlayer", {"base_image": "img_1", "overlay_type": "text", "content": "BIG SALE"}), DONE], checks=checks)
    # Each check reads the final image, then the baseline input (which shows no text).
    assert align(traj, recorded_toolbox(OCR=[RecordedOutput("BIG SALE"), RecordedOutput("")])).score == 1.0
    fuzzy = align(traj, recorded_toolbox(OCR=[RecordedOutput("BIG SA1E"), RecordedOutput("")]))
    assert 0.6 < fuzzy.score < 1.0


def test_ocr_without_backend_is_unverifiable_and_falls_back():
    traj = run([FLIP, DONE], checks=[{"type": "ocr_contains", "text": "x"}])
    res = align(traj)  # the offline toolbox has no OCR backend here
    assert res.fallback and res.score == 0.5 and "ocr_unavailable" in res.reason


def test_unverifiable_checks_drop_out_of_the_mean():
    traj = run([FLIP, DONE], checks=[{"type": "ocr_contains", "text": "x"}, {"type": "size_relation", "relation": "equal"}])
    res = align(traj)
    assert res.score == 1.0 and not res.fallback and res.details["verifiable"] == 1


# -- geometry and kinds --------------------------------------------------------------------------


def test_size_and_orientation():
    checks = [
        {"type": "size_relation", "of": "img_1", "factor": 4},
        {"type": "orientation", "orientation": "landscape"},
        {"type": "orientation", "relation": "same", "of": "img_1"},
    ]
    big = gradient(256, 192)
    traj = run([R("upscale", "SR", {"image": "img_1"}), DONE], checks=checks, recorded={"SR": [RecordedOutput("x4", big)]})
    assert align(traj).score == 1.0
    portrait = run([R("crop", "Crop", {"image": "img_1", "bbox": [0, 0, 250, 1000]}), DONE],
                   checks=[{"type": "orientation", "orientation": "portrait"}, {"type": "size_relation", "relation": "smaller"}])
    assert align(portrait).score == 1.0
    wrong = run([FLIP, DONE], checks=[{"type": "orientation", "relation": "swapped"}])
    assert align(wrong).score == 0.0


def _cutout_chain(checks, toolbox=None):
    replies = [
        R("find", "Grounding", {"image": "img_1", "reference_text": "square"}),
        R("mask", "SAM", {"image": "img_1", "bbox": [250, 250, 750, 750]}),
        R("cut", "Extract", {"image": "img_1", "mask": "SAM_0"}),
        DONE,
    ]
    rec = {"Grounding": [RecordedOutput("[[250, 250, 750, 750]]")]}
    if toolbox is None:
        rec["SAM"] = [RecordedOutput("mask", mask())]
    return run(replies, recorded=rec, checks=checks, toolbox=toolbox, expected=["Grounding", "SAM", "Extract"])


def test_asset_kind():
    traj = _cutout_chain([{"type": "asset_kind", "kind": "rgba", "tool": "Extract", "final": True}])
    assert align(traj).score == 1.0
    assert align(run([FLIP, DONE], checks=[{"type": "asset_kind", "kind": "rgba"}])).score == 0.0


def test_plumbing_only_results_never_count_as_success():
    tb = LocalToolbox(backends={"SAM": plumbing_backend(OutputKind.MASK, mask())})
    traj = _cutout_chain([{"type": "asset_kind", "kind": "rgba"}, {"type": "size_relation", "relation": "smaller"}], toolbox=tb)
    assert traj.turns[1].plumbing_only and traj.final_asset_id == "Extract_0"
    res = align(traj)
    assert res.score == 0.0 and "plumbing_only" in res.reason
    aes = judge_with().judge("aesthetic", TrajectoryView.of(traj))
    assert aes.score == 0.0 and aes.reason == "plumbing_only"


def test_grounding_finds():
    checks = [{"type": "grounding_finds", "text": "square", "region": [200, 200, 800, 800], "min_iou": 0.5}]
    traj = run([FLIP, DONE], checks=checks)
    hit = align(traj, recorded_toolbox(Grounding=[RecordedOutput("Found: [[250, 250, 750, 750]]")]))
    assert hit.score == 1.0
    miss = align(traj, recorded_toolbox(Grounding=[RecordedOutput("no boxes")]))
    assert miss.score == 0.0
    fake = align(traj, LocalToolbox(backends={"Grounding": plumbing_backend(OutputKind.BOXES, text="[[0, 0, 1000, 1000]]")}))
    assert fake.fallback and "grounding_plumbing_only" in fake.reason


def test_differs_from_and_bad_checks():
    traj = run([FLIP, DONE], checks=[{"type": "differs_from", "of": "img_1", "min_change": 0.02}])
    assert align(traj).score == 1.0
    ctx = CheckContext(traj)
    for bad in ({"type": "nope"}, {"type": "ocr_contains"}, {"type": "reference_similarity"}, "not a dict",
                {"type": "orientation", "orientation": "diagonal"}, {"type": "size_relation", "of": "img_9", "factor": 2}):
        res = run_check(ctx, bad)
        assert res.score is None and res.reason
    assert set(CHECK_TYPES) >= {"reference_similarity", "ocr_contains", "size_relation", "orientation", "asset_kind", "grounding_finds"}


def test_no_final_image_scores_zero_on_checks():
    traj = run([DONE], checks=[{"type": "size_relation", "relation": "equal"}])
    res = align(traj)
    assert res.score == 0.0 and "no_final_image" in res.reason


# -- aesthetic proxy ------------------------------------------------------------------------------


def test_quality_proxy_orders_degradations():
    im = Image.fromarray(data.astronaut())
    clean = image_quality(im)
    blur = image_quality(im.filter(ImageFilter.GaussianBlur(4)))
    noisy = image_quality(Image.fromarray(np.clip(np.asarray(im) + np.random.default_rng(0).normal(0, 30, np.asarray(im).shape), 0, 255).astype(np.uint8)))
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=5)
    jpeg = image_quality(Image.open(buf).convert("RGB"))
    dark = image_quality(im.point(lambda v: v // 6))
    flat = image_quality(Image.new("RGB", (128, 128), (90, 90, 90)))
    assert blur.terms["sharpness"] < 0.2 < 0.8 < clean.terms["sharpness"]
    assert noisy.terms["noise"] < 0.2 < 0.8 < clean.terms["noise"]
    assert jpeg.terms["artefacts"] < 0.3 < 0.9 < clean.terms["artefacts"]
    assert dark.terms["exposure"] < 0.3 < clean.terms["exposure"]
    assert max(blur.score, noisy.score, jpeg.score, dark.score, flat.score) < clean.score
    assert flat.score < 0.2


# -- trajectory scorer ----------------------------------------------------------------------------


def traj_score(traj):
    return judge_with().judge("trajectory", TrajectoryView.of(traj))


def test_process_score_dependency_order_and_relevance():
    good = traj_score(_cutout_chain([]))
    assert good.score == 1.0 and good.details == {"choice": 1.0, "relevance": 1.0, "order": 1.0}
    # SAM with no Grounding before it, Extract fine, plus an irrelevant Flip.
    skipped = run(
        [R("mask", "SAM", {"image": "img_1", "bbox": [250, 250, 750, 750]}), R("cut", "Extract", {"image": "img_1", "mask": "SAM_0"}), FLIP, DONE],
        recorded={"SAM": [RecordedOutput("mask", mask())]},
        expected=["Grounding", "SAM", "Extract"],
    )
    s = traj_score(skipped)
    assert s.details["order"] == pytest.approx(0.5)
    assert s.details["choice"] == pytest.approx(2 / 3)
    assert s.details["relevance"] == pytest.approx(2 / 3)
    assert s.score == pytest.approx(0.5 * 2 / 3 + 0.3 * 0.5 + 0.2 * 2 / 3)


def test_generation_first_without_inputs():
    gen = RecordedOutput("generated", gradient())
    first = run([R("gen", "ImageGeneration", {"prompt": "a fox"}), R("f", "Flip", {"image": "ImageGeneration_0"}), DONE],
                images=[], recorded={"ImageGeneration": [gen]})
    later = run([R("f", "Flip", {"image": "img_1"}), DONE], images=[])
    assert traj_score(first).details["order"] == 1.0
    assert traj_score(later).details["order"] == 0.0


def test_no_call_with_expected_tools_is_zero():
    res = traj_score(run([DONE], expected=["Flip"]))
    assert res.score == 0.0 and res.reason == "no_tool_call"


def test_vacuous_terms_drop_out():
    res = traj_score(run([R("x", "Nope", {"image": "img_1"}), DONE], expected=["Crop"]))
    assert res.score == 0.0 and "order" not in res.details
    assert traj_score(run([FLIP, DONE])).score == 1.0  # nothing expected, nothing to violate, one success


def test_ocr_contains_with_the_real_offline_ocr():
    # rapidocr and onnxruntime are declared dependencies: a missing or broken OCR backend is a failure here, not a skip.
    white = Image.new("RGB", (400, 200), (255, 255, 255))
    checks = [{"type": "ocr_contains", "text": "big sale"}, {"type": "ocr_contains", "text": "free pizza", "fuzzy": False}]
    traj = run([R("text", "Overlayer", {"base_image": "img_1", "overlay_type": "text", "content": "BIG SALE"}), DONE],
               images=[white], checks=checks)
    res = OfflineJudge(OfflineJudgeConfig(tools="offline")).judge("alignment", TrajectoryView.of(traj))
    assert not res.fallback, f"offline OCR backend unavailable: {res.reason}"
    assert res.details["check/ocr_contains"] == 1.0 and res.details["check/ocr_contains_2"] == 0.0
    assert res.score == pytest.approx(0.5)


def test_order_flags_a_need_no_earlier_call_produced():
    """A mask given as an input is not SAM's output: Extract's `requires` counts as unmet; an RGBA
    input as an object overlay's content is supplied by the task, so that need drops out."""
    cutout = Image.new("RGBA", (64, 48), (255, 0, 0, 128))
    extract = R("cut", "Extract", {"image": "img_1", "mask": "img_2"})
    unmet = traj_score(run([extract, DONE], images=[gradient(), mask()]))
    assert unmet.details["order"] == 0.0
    overlay = R("paste", "Overlayer", {"base_image": "img_1", "overlay_type": "object", "content": "img_2"})
    supplied = traj_score(run([overlay, DONE], images=[gradient(), cutout]))
    assert "order" not in supplied.details
    text = R("caption", "Overlayer", {"base_image": "img_1", "overlay_type": "text", "content": "SALE"})
    assert "order" not in traj_score(run([text, DONE])).details  # the instruction states the caption


def test_flow_sees_a_chain_step_applied_to_the_input():
    """Rotate then Flip of the rotated image, against Flip of the input: tool names and order are
    the same, the data flow is not. `flow` reports that in every preset and is scored only where
    it has a weight; without a reference solution it does not apply."""
    rotate = R("turn", "Rotate", {"image": "img_1", "angle": 90})
    reference = [{"name": "Rotate", "arguments": {"image": "img_1", "angle": 90}},
                 {"name": "Flip", "arguments": {"image": "Rotate_0"}}]
    meta = {"reference_calls": reference}
    right = run([rotate, R("flip", "Flip", {"image": "Rotate_0"}), DONE],
                expected=["Rotate", "Flip"], meta=meta)
    wrong = run([rotate, R("flip", "Flip", {"image": "img_1"}), DONE],
                expected=["Rotate", "Flip"], meta=meta)
    stopped = run([rotate, DONE], expected=["Rotate", "Flip"], meta=meta)
    paper = OfflineJudgeConfig()
    assert traj_score(right).details["flow"] == 1.0
    assert traj_score(wrong).details["flow"] == pytest.approx(0.5)
    assert traj_score(stopped).details["flow"] == pytest.approx(0.5)  # the Flip's edge is not reproduced
    assert traj_score(wrong).score == traj_score(right).score == 1.0  # weight 0: paper's score is unchanged
    weighted = OfflineJudgeConfig()
    weighted.trajectory.flow = 1.0
    judge = OfflineJudge(weighted)
    score = lambda t: judge.judge("trajectory", TrajectoryView.of(t)).score
    assert score(right) == 1.0
    assert score(wrong) == pytest.approx((0.5 * 1 + 0.2 * 1 + 1.0 * 0.5) / 1.7)  # choice, relevance, flow
    assert score(stopped) < score(wrong) < score(right)
    assert "flow" not in traj_score(run([rotate, DONE], expected=["Rotate"])).details
    assert paper.trajectory.flow == 0.0
