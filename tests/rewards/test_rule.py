"""Hand-computed rule rewards on trajectories recorded by the real episode runner.

Paper defaults throughout: R_rule = 0.4·F + 0.6·A − P (clipped to [0, 1]),
q = 0.25·name + 0.25·schema + 0.20·ref + 0.20·spec + 0.10·exec, and the penalty scales of
configs/reward/paper.yaml (error 0.1/call cap 0.5, repeat 0.04 cap 0.12 with near = ½,
length 0.03 per excess-limit cap 0.10, cost 0.01 per unit over budget+2 cap 0.05,
miss 0.15·fraction cap 0.15). Tool costs come from the registry (Crop/Flip/Rotate/Extract/
Overlayer 0.5, Grounding/SAM/OCR 1, ImageGeneration 3).
"""

from __future__ import annotations

import json

import pytest
from PIL import Image

from rewards.config import RewardConfig, RuleConfig
from rewards.rule import score_rule
from tests.rewards.helpers import DONE, R, gradient, mask, run
from toolserver.toolbox import RecordedOutput

A = pytest.approx

CROP = {"image": "img_1", "bbox": [0, 0, 500, 500]}


def rule(traj, cfg: RuleConfig | None = None):
    return score_rule(traj, cfg or RewardConfig.load("paper").rule)


def test_01_perfect_two_step():
    b = rule(run([R("crop", "Crop", CROP), R("flip", "Flip", {"image": "Crop_0"}), DONE], expected=["Crop", "Flip"]))
    assert (b.r_format, b.r_action, b.p_eff, b.r_rule) == (A(1.0), A(1.0), A(0.0), A(1.0))
    assert [c.output_id for c in b.calls] == ["Crop_0", "Flip_0"]


def test_02_unknown_tool_scores_zero_q_and_one_error():
    b = rule(run([R("blur", "Blur", {"image": "img_1"}), DONE]))
    c = b.calls[0]
    assert (c.name, c.schema, c.ref, c.spec, c.exec, c.q) == (0, 0, 0, 0, 0, 0)
    assert b.penalties["error"] == A(0.1)
    assert b.r_rule == A(0.4 - 0.1)


def test_03_missing_required_argument_costs_schema_and_exec():
    b = rule(run([R("crop", "Crop", {"image": "img_1"}), DONE], expected=["Crop"]))
    c = b.calls[0]
    assert (c.name, c.schema, c.ref, c.spec, c.exec) == (1, 0, 1, 1, 0)
    assert c.q == A(0.65)
    assert b.penalties == {"error": A(0.1), "repeat": 0, "length": 0, "cost": 0, "miss": A(0.15)}
    assert b.r_rule == A(0.4 + 0.6 * 0.65 - 0.25)


def test_04_ref_fraction_counts_each_reference():
    b = rule(run([R("cut", "Extract", {"image": "img_1", "mask": "SAM_0"}), DONE]))
    c = b.calls[0]
    assert (c.name, c.schema, c.ref, c.spec, c.exec) == (1, 1, 0.5, 1, 0)
    assert c.q == A(0.8)
    assert b.r_rule == A(0.4 + 0.6 * 0.8 - 0.1)


def test_05_spec_failure_then_success():
    b = rule(run([R("bad", "Crop", {"image": "img_1", "bbox": [500, 500, 100, 100]}), R("good", "Crop", CROP), DONE], expected=["Crop"]))
    assert [c.q for c in b.calls] == [A(0.7), A(1.0)]
    assert b.calls[0].spec == 0 and "bbox_unordered" in b.calls[0].issues
    assert b.amounts["repeat"] == 0  # bboxes differ by 400 > 50: not a near repeat
    assert b.r_rule == A(0.4 + 0.6 * 0.85 - 0.1)


def test_06_execution_failure_after_valid_call():
    # ImageGeneration validates, but the offline toolbox has no generation backend.
    b = rule(run([R("gen", "ImageGeneration", {"prompt": "a red fox"}), DONE], images=[], expected=["ImageGeneration"]))
    c = b.calls[0]
    assert (c.name, c.schema, c.ref, c.spec, c.exec) == (1, 1, 1, 1, 0)
    assert c.q == A(0.9)
    assert b.penalties["error"] == A(0.1) and b.penalties["miss"] == A(0.15)
    assert b.r_rule == A(0.4 + 0.6 * 0.9 - 0.25)


def test_07_replay_failed_call_registers_nothing():
    b = rule(
        run(
            [
                R("bad crop", "Crop", {"image": "img_1", "bbox": [500, 500, 100, 100]}),
                R("flip the crop", "Flip", {"image": "Crop_0"}),  # Crop_0 does not exist yet
                R("crop", "Crop", CROP),
                R("flip the crop", "Flip", {"image": "Crop_0"}),  # now it does
                DONE,
            ],
            expected=["Crop", "Flip"],
        )
    )
    assert [c.ref for c in b.calls] == [1, 0, 1, 1]
    assert [c.q for c in b.calls] == [A(0.7), A(0.7), A(1.0), A(1.0)]
    assert [c.output_id for c in b.calls] == [None, None, "Crop_0", "Flip_0"]
    assert b.penalties["error"] == A(0.2)
    assert b.r_rule == A(0.4 + 0.6 * 0.85 - 0.2)


def test_08_replay_text_tools_add_no_asset():
    b = rule(
        run(
            [R("read", "OCR", {"image": "img_1"}), R("flip", "Flip", {"image": "OCR_0"}), DONE],
            expected=["OCR"],
            recorded={"OCR": [RecordedOutput("SALE")]},
        )
    )
    assert [c.q for c in b.calls] == [A(1.0), A(0.7)]
    assert b.calls[0].output_id is None
    assert b.r_rule == A(0.4 + 0.6 * 0.85 - 0.1)


def test_09_extract_needs_a_mask_asset():
    b = rule(run([R("cut", "Extract", {"image": "img_1", "mask": "img_1"}), DONE]))
    c = b.calls[0]
    assert (c.ref, c.spec, c.exec) == (1, 0, 0) and "wrong_asset_kind" in c.issues
    assert b.r_rule == A(0.4 + 0.6 * 0.7 - 0.1)


def test_10_full_cutout_chain_is_perfect():
    replies = [
        R("find", "Grounding", {"image": "img_1", "reference_text": "square"}),
        R("mask", "SAM", {"image": "img_1", "bbox": [250, 250, 750, 750]}),
        R("cut", "Extract", {"image": "img_1", "mask": "SAM_0"}),
        R("paste", "Overlayer", {"base_image": "img_1", "overlay_type": "object", "content": "Extract_0", "position": [300, 300]}),
        DONE,
    ]
    rec = {"Grounding": [RecordedOutput("[[250, 250, 750, 750]]")], "SAM": [RecordedOutput("mask", mask())]}
    traj = run(replies, expected=["Grounding", "SAM", "Extract", "Overlayer"], recorded=rec)
    b = rule(traj)
    assert [c.output_id for c in b.calls] == [None, "SAM_0", "Extract_0", "Overlayer_0"]
    assert b.r_rule == A(1.0) and b.p_eff == 0
    assert traj.final_asset_id == "Overlayer_0"


def test_11_object_overlay_needs_rgba_content():
    b = rule(
        run(
            [R("paste", "Overlayer", {"base_image": "img_1", "overlay_type": "object", "content": "img_1"}), DONE],
            expected=["Overlayer"],
        )
    )
    c = b.calls[0]
    assert (c.ref, c.spec, c.exec) == (1, 0, 0)
    assert b.r_rule == A(0.4 + 0.6 * 0.7 - 0.1 - 0.15)


def test_12_nonblocking_spec_issue_still_executes():
    # The public Overlayer accepts off-canvas positions; the validator records it (spec = 0).
    b = rule(run([R("text", "Overlayer", {"base_image": "img_1", "overlay_type": "text", "content": "Hi", "position": [1500, 500]}), DONE]))
    c = b.calls[0]
    assert (c.name, c.schema, c.ref, c.spec, c.exec) == (1, 1, 1, 0, 1)
    assert c.output_id == "Overlayer_0"
    assert b.r_rule == A(0.4 + 0.6 * 0.8)


def test_13_exact_repeats():
    b = rule(run([R("f", "Flip", {"image": "img_1"})] * 3 + [DONE], expected=["Flip"]))
    assert b.amounts["repeat"] == 2
    assert b.r_rule == A(1.0 - 0.08)


def test_14_near_repeat_counts_half():
    b = rule(run([R("c", "Crop", CROP), R("c again", "Crop", {"image": "img_1", "bbox": "[10, 10, 510, 490]"}), DONE], expected=["Crop"]))
    assert b.amounts["repeat"] == A(0.5)
    assert b.r_rule == A(1.0 - 0.02)


def test_15_overlong_reasoning():
    long_reason = " ".join(["word"] * 512)  # 512 tokens: one limit (256) over
    b = rule(run([R(long_reason, "Flip", {"image": "img_1"}), DONE], expected=["Flip"]))
    assert b.amounts["length"] == A(1.0)
    assert b.r_rule == A(1.0 - 0.03)


def test_16_cost_beyond_budget():
    replies = []
    src = "img_1"
    for i in range(10):
        tool = "Rotate" if i % 2 == 0 else "Flip"
        args = {"image": src, "angle": 90} if tool == "Rotate" else {"image": src}
        replies.append(R(f"step {i}", tool, args))
        src = f"{tool}_{i // 2}"
    b = rule(run(replies + [DONE], expected=["Flip"]))
    # spent 10 × 0.5 = 5.0, budget 0.5 + grace 2.0 -> 2.5 over -> 0.025
    assert b.amounts["cost"] == A(2.5)
    assert b.penalties["cost"] == A(0.025)
    assert b.r_rule == A(1.0 - 0.025)


def test_17_missing_expected_tools():
    b = rule(run([R("f", "Flip", {"image": "img_1"}), DONE], expected=["Crop", "Flip", "Rotate"]))
    assert b.amounts["miss"] == A(2 / 3)
    assert b.r_rule == A(1.0 - 0.15 * 2 / 3)


def test_18_two_calls_in_one_turn():
    two = R("both", "Flip", {"image": "img_1"}) + '<tool_call>{"name": "Flip", "arguments": {"image": "img_1"}}</tool_call>'
    traj = run([two, DONE])
    b = rule(traj)
    assert traj.turns[0].status == "parse_error"
    assert b.format_checks["one_call"] == A(0.5) and b.r_format == A(0.9)
    assert [c.q for c in b.calls] == [A(0.9), A(0.9)]  # recovered by the parser, never executed
    assert b.amounts["repeat"] == 1 and b.n_errors == 0
    assert b.r_rule == A(0.4 * 0.9 + 0.6 * 0.9 - 0.04)


def test_19_broken_json():
    traj = run(['<reason>flip it</reason><tool_call>{"name": "Flip", "arguments": {</tool_call>', DONE])
    b = rule(traj)
    assert b.format_checks["json"] == A(0.5)
    assert b.n_calls == 0 and b.r_action == 0 and "no_tool_call" in b.reasons
    assert b.r_rule == A(0.4 * 0.9)


def test_20_no_tool_call_at_all():
    b = rule(run([DONE], expected=["Flip"]))
    assert b.r_format == 1 and b.r_action == 0 and "no_tool_call" in b.reasons
    assert b.r_rule == A(0.4 - 0.15)


def test_21_not_terminated():
    traj = run([R("f", "Flip", {"image": "img_1"}), R("f", "Flip", {"image": "Flip_0"})], max_turns=2)
    b = rule(traj)
    assert traj.stop_reason == "max_turns"
    assert b.format_checks["terminate"] == 0 and b.r_format == A(0.8)
    assert b.amounts["repeat"] == 0  # same tool on different inputs is not a repeat
    assert b.r_rule == A(0.4 * 0.8 + 0.6)


def test_22_fences_and_extra_text():
    b = rule(run(["```" + R("f", "Flip", {"image": "img_1"}) + "```", DONE]))
    assert b.format_checks["clean"] == A(0.5) and b.r_action == A(1.0)
    assert b.r_rule == A(0.4 * 0.9 + 0.6)


def test_23_missing_reason():
    b = rule(run(['<tool_call>{"name": "Flip", "arguments": {"image": "img_1"}}</tool_call>', DONE]))
    assert b.format_checks["reason"] == A(0.5)
    assert b.r_rule == A(0.4 * 0.9 + 0.6)


def test_24_error_penalty_is_capped():
    replies = [R(f"bad {i}", "Crop", {"image": "img_1", "bbox": [500 + 100 * i, 500, 100, 100]}) for i in range(6)]
    b = rule(run(replies + [DONE]))
    assert b.amounts["error"] == 6 and b.penalties["error"] == A(0.5)
    assert b.r_rule == A(0.4 + 0.6 * 0.7 - 0.5)


def test_25_rule_is_clipped_at_zero_but_raw_is_reported():
    b = rule(run([R("x", f"Tool{i}", {"image": "img_1"}) for i in range(6)] + [DONE]))
    assert b.r_rule_raw == A(0.4 - 0.5) and b.r_rule == 0.0


def test_26_pure_tool_failure_is_exec_zero():
    # SAM returns an empty mask, so Extract validates but the tool itself refuses.
    empty = Image.new("L", (64, 48), 0)
    b = rule(
        run(
            [R("m", "SAM", {"image": "img_1", "bbox": [0, 0, 500, 500]}), R("cut", "Extract", {"image": "img_1", "mask": "SAM_0"}), DONE],
            recorded={"SAM": [RecordedOutput("mask", empty)]},
        )
    )
    assert [(c.spec, c.exec) for c in b.calls] == [(1, 1), (1, 0)]
    assert b.r_rule == A(0.4 + 0.6 * 0.95 - 0.1)


def test_replay_ignores_a_tampered_stored_check_and_counts_it():
    traj = run([R("f", "Flip", {"image": "img_1"}), DONE])
    traj.turns[0].check = {**traj.turns[0].check, "name_ok": False}
    b = rule(traj)
    assert b.replay_mismatch == 1 and b.r_rule == A(1.0)


def test_score_survives_save_and_load(tmp_path):
    traj = run([R("bad", "Crop", {"image": "img_1", "bbox": [5, 5, 1, 1]}), R("c", "Crop", CROP), R("f", "Flip", {"image": "Crop_0"}), DONE], expected=["Crop", "Flip"])
    from canvasagent.core.trajectory import Trajectory

    traj.save(tmp_path / "t")
    again = Trajectory.load(tmp_path / "t")
    assert score_rule(again).to_flat() == score_rule(traj).to_flat()


def test_flat_dict_is_json_and_complete():
    b = rule(run([R("f", "Flip", {"image": "img_1"}), DONE]))
    flat = b.to_flat()
    json.dumps(flat)
    for k in ("rule", "rule/format", "rule/action", "rule/p_eff", "rule/format/json", "rule/action/spec", "rule/p_eff/miss"):
        assert k in flat


def test_weights_are_configurable():
    cfg = RuleConfig()
    cfg.format_weight, cfg.action_weight = 0.5, 0.5
    cfg.penalties.error.scale = 0.3
    b = score_rule(run([R("bad", "Crop", {"image": "img_1"}), DONE]), cfg)
    assert b.r_rule == A(0.5 * 1 + 0.5 * 0.65 - 0.3)


def test_calls_made_through_call_tool_have_unobserved_format():
    # TRL parses calls itself and executes them with Episode.call_tool: no reply text, no findings.
    from toolserver.client import make_toolbox
    from canvasagent.core.episode import Episode
    from canvasagent.core.tasks import Task

    ep = Episode(make_toolbox("offline"))
    ep.reset(Task("Mirror it.", images=[gradient()], expected_tools=["Flip"]))
    ep.call_tool("Flip", {"image": "img_1"})
    ep.call_tool("Crop", {"image": "Flip_0", "bbox": [0, 0, 500, 500]})
    traj = ep.finish("terminate")
    b = rule(traj)
    assert b.n_format_turns == 0 and "format_unobserved" in b.reasons
    assert b.r_format == 0.0 and b.r_action == A(1.0)
    assert [c.output_id for c in b.calls] == ["Flip_0", "Crop_0"]
    assert b.r_rule == A(0.6)


def test_a_huge_integer_is_a_refused_call_not_a_zeroed_trajectory():
    # A 400-digit int parses from JSON but overflows float(); it must cost only its own call.
    huge = 10**400
    b = rule(
        run(
            [
                R("turn", "Rotate", {"image": "img_1", "angle": huge}),
                R("blur", "Blur", {"image": "img_1", "bbox": [huge, 0, 1, 2]}),
                R("flip", "Flip", {"image": "img_1"}),
                DONE,
            ]
        )
    )
    assert not any(r.startswith("rule_reward_exception") for r in b.reasons), b.reasons
    rot, blur, flip = b.calls
    assert (rot.name, rot.schema, rot.ref, rot.spec, rot.exec) == (1, 1, 1, 0, 0)
    assert "bad_choice" in rot.issues
    assert blur.q == 0 and blur.numbers == {}
    assert flip.q == A(1.0) and flip.output_id == "Flip_0"
    assert b.n_errors == 2
    assert b.r_rule > 0


def test_an_int_with_no_decimal_form_costs_only_its_call():
    # TRL hands Episode.call_tool Python objects: 10**5000 has no str() (Python's digit limit).
    from toolserver.client import make_toolbox
    from canvasagent.core.episode import Episode
    from canvasagent.core.tasks import Task

    ep = Episode(make_toolbox("offline"))
    ep.reset(Task("Turn it.", images=[gradient()], expected_tools=["Flip"]))
    ep.call_tool("Rotate", {"image": "img_1", "angle": 10**5000})
    ep.call_tool("Blur", {"image": "img_1", "radius": 10**5000})  # unknown tool: its raw arguments are keyed
    ep.call_tool("Flip", {"image": "img_1"})
    b = rule(ep.finish("terminate"))
    assert not any(r.startswith("rule_reward_exception") for r in b.reasons), b.reasons
    assert [c.exec for c in b.calls] == [0, 0, 1] and b.calls[2].q == A(1.0)


def test_try_chains_preset_pays_a_failed_next_step_above_stopping_early():
    """On a Rotate+Flip task: the paper preset pays stopping after Rotate more than trying Flip on
    an asset that does not exist (the failure is charged as an error, in the action mean and as a
    missing tool); `paper-try-chains` reverses that, and both keep the finished chain on top."""
    from rewards.config import load_reward_config

    img = [gradient()]
    rotate = R(name="Rotate", args={"image": "img_1", "angle": 90})
    finished = run([rotate, R(name="Flip", args={"image": "Rotate_0"}), DONE], img, ["Rotate", "Flip"])
    stopped = run([rotate, DONE], img, ["Rotate", "Flip"])
    failed = run([rotate, R(name="Flip", args={"image": "img_99"}), DONE], img, ["Rotate", "Flip"])
    paper, tries = load_reward_config("paper").rule, load_reward_config("paper-try-chains").rule
    assert score_rule(stopped, paper).r_rule > score_rule(failed, paper).r_rule
    assert score_rule(failed, tries).r_rule > score_rule(stopped, tries).r_rule
    for cfg in (paper, tries):
        assert score_rule(finished, cfg).r_rule == A(1.0)
        assert score_rule(finished, cfg).r_rule > max(score_rule(stopped, cfg).r_rule, score_rule(failed, cfg).r_rule)
