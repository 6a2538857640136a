"""The evaluation agent: question parsing, the boundary search, probe generators with ground truth,
real runs on tools and policies, the LLM planner (stub endpoint), the CLI and the EA-CoT export."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from canvasagent.cli import main as cli_main
from canvasagent.evaluation.agent import AgentConfig, build_agent
from canvasagent.evaluation.agent.planner import check_llm_plan, parse_json_object
from canvasagent.evaluation.agent.probes import (
    SUITES,
    TEXT_HEIGHT,
    Output,
    char_accuracy,
    contrast_ratio,
)
from canvasagent.evaluation.agent.search import (
    SearchConfig,
    axis_decision,
    set_decision,
)
from canvasagent.evaluation.agent.types import Evidence
from canvasagent.evaluation.agent.vocab import parse_question
from tests.stub_openai import StubOpenAI, chat_payload, free_port

CFG = AgentConfig.load("default")
TERMS = CFG.planner_view()


# ------------------------------------------------------------------------------ question parsing


def test_offline_planner_reads_target_property_and_conditions():
    p = parse_question("Can the OCR tool read small rotated text?", "OCR", TERMS)
    assert (p.property, p.axis, p.asked, p.conditions) == ("legibility", "text_height", [6, 12], {"rotation": 30.0})
    p = parse_question("Can OCR read text 3 px high, upside down?", "OCR", TERMS)
    assert p.asked == [3.0, 3.0] and p.conditions["rotation"] == 180
    p = parse_question("Can OCR read low-contrast text?", "OCR", TERMS)
    assert p.axis == "contrast" and p.asked == [8, 32]
    p = parse_question("Can OCR read black text on navy?", "OCR", TERMS)
    assert p.conditions["fg"] == [0, 0, 0] and p.conditions["bg"] == [20, 24, 60]
    p = parse_question("Is Overlayer's text readable on dark backgrounds?", "Overlayer", TERMS)
    assert p.property == "overlay_text" and len(p.strata) == 3
    p = parse_question("Does Rotate turn images clockwise?", "Rotate", TERMS)
    assert p.property == "rotation" and p.strata == [{"angle": 45}, {"angle": 90}]  # 180 cannot tell the direction
    assert parse_question("Does Rotate keep the whole image?", "Rotate", TERMS).property == "rotation_content"
    assert parse_question("Does Flip mirror vertically?", "Flip", TERMS).conditions == {"direction": "vertical"}
    assert parse_question("Does SR upscale 8x?", "SR", TERMS).conditions == {"scale": 8}
    # a policy: the property (and the tool its tasks expect) comes from the question's words
    p = parse_question("Does the policy crop to the bbox it is given?", "scripted:expected", TERMS)
    assert (p.target_kind, p.property, p.tool) == ("policy", "crop_region", "Crop")
    p = parse_question("Does the policy use Flip correctly?", "scripted:expected", TERMS)
    assert p.property == "mirror"
    assert parse_question("Is it any good?", "scripted:expected", TERMS).unsupported
    assert "no probe generator" in parse_question("Does it work?", "SAM", TERMS).unsupported
    assert "names Flip but the target is OCR" in parse_question("Does Flip mirror text?", "OCR", TERMS).unsupported
    assert "angle is one of" in parse_question("Can Rotate turn 30 degrees?", "Rotate", TERMS).unsupported
    with pytest.raises(ValueError, match="empty"):
        parse_question("  ", "OCR", TERMS)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200), st.sampled_from(["OCR", "Flip", "Rotate", "Crop", "SR", "Overlayer", "SAM", "ImageGeneration", "scripted:expected"]))
def test_offline_planner_never_crashes_on_any_question(question, target):
    try:
        p = parse_question(question, target, TERMS)
    except ValueError as e:
        assert "empty" in str(e)
        return
    assert p.unsupported or p.property in SUITES
    if p.axis:
        assert p.axis in SUITES[p.property].axes
        assert p.asked is None or (len(p.asked) == 2 and p.asked[0] <= p.asked[1])


# --------------------------------------------------------------------------------------- search


def _simulate(threshold: float, asked, cfg: SearchConfig, noisy_at: float | None = None):
    """Run the axis search against an oracle that reads text >= threshold (and flips one probe at `noisy_at`)."""
    ev: list[Evidence] = []
    for _ in range(40):
        d = axis_decision(TEXT_HEIGHT, asked, ev, cfg)
        if d.settled:
            return d, ev
        for item in d.next:
            for k in range(cfg.samples_per_value):
                v = item["value"]
                ok = v >= threshold and not (v == noisy_at and k == 0)
                ev.append(Evidence(f"p{len(ev)}", {}, v, {}, {}, ok))
    raise AssertionError("the search did not settle")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(2, 64), st.integers(2, 64), st.integers(0, 20))
def test_axis_search_answers_and_brackets_a_monotone_boundary(threshold, a, width):
    lo, hi = min(a, 64), min(a + width, 64)
    cfg = SearchConfig()
    d, ev = _simulate(threshold, [lo, hi], cfg)
    truth = "yes" if threshold <= lo else "no" if threshold > hi else "partly"
    assert d.answer == truth
    assert len(ev) < 12 * cfg.samples_per_value  # fewer than the fixed grid's probes
    passes = [e.value for e in ev if e.passed]
    fails = [e.value for e in ev if not e.passed]
    # the evidence brackets the threshold wherever it was probed on both sides of it
    assert all(p >= threshold for p in passes) and all(f < threshold for f in fails)
    if truth == "partly":
        assert passes and fails and min(passes) / max(fails) <= cfg.boundary_ratio or min(passes) - max(fails) <= 1


def test_axis_search_reports_mixed_values_and_non_monotone_results():
    cfg = SearchConfig()
    d, _ = _simulate(6, [6, 12], cfg, noisy_at=6)
    assert d.answer == "partly" and "1/2 probes pass at 6 px" in d.boundary
    ev = [Evidence("a", {}, 4.0, {}, {}, True), Evidence("b", {}, 4.0, {}, {}, True),
          Evidence("c", {}, 12.0, {}, {}, False), Evidence("d", {}, 12.0, {}, {}, False)]
    d = axis_decision(TEXT_HEIGHT, [4, 12], ev, cfg)
    assert d.answer == "partly" and d.settled and "not monotone" in d.boundary


def test_set_search_settles_per_setting():
    cfg = SearchConfig(set_min=4, set_max=8, set_batch=2)
    strata = [{"angle": 45}, {"angle": 90}]
    ev, of = [], []
    d = set_decision(strata, ev, cfg, of)
    assert d.answer is None and [n["n"] for n in d.next] == [2, 2]
    for s, ok in [(0, True)] * 4 + [(1, False)] * 4:
        ev.append(Evidence("p", {}, None, {}, {}, ok))
        of.append(s)
    d = set_decision(strata, ev, cfg, of)
    assert d.settled and d.answer == "partly" and d.boundary == "passes at angle 45; fails at angle 90"


# ------------------------------------------------------------------------------ probe generators


def test_text_probes_have_the_asked_cap_height_and_contrast():
    for h in (4, 8, 16):
        case = SUITES["legibility"].make({"text_height": h}, 0, {"words": ["HILL"]})
        assert abs(case.truth["cap_height_px"] - h) <= 1 and case.truth["word"] == "HILL"
        ink = np.asarray(case.images[0].convert("L")) < 128
        rows = np.nonzero(ink.any(axis=1))[0]
        assert abs((rows[-1] - rows[0] + 1) - h) <= 1  # HILL has no descender: its ink is the cap height
    low = SUITES["legibility"].make({"text_height": 16, "contrast": 10}, 0, {})
    assert low.truth["fg"] == [245, 245, 245] and low.truth["contrast_ratio"] < 1.2
    assert contrast_ratio((0, 0, 0), (20, 24, 60)) < 3 < contrast_ratio((0, 0, 0), (245, 245, 240))


def test_measurements_tell_a_right_output_from_a_wrong_one():
    mirror = SUITES["mirror"]
    case = mirror.make({"direction": "horizontal"}, 0, {})
    right = Output(image=case.images[0].transpose(Image.Transpose.FLIP_LEFT_RIGHT))
    wrong = Output(image=case.images[0].transpose(Image.Transpose.FLIP_TOP_BOTTOM))
    assert mirror.measure(case, right, {})[1] and not mirror.measure(case, wrong, {})[1]
    assert not mirror.measure(case, Output(image=case.images[0]), {})[1]  # an untouched input is no mirror
    crop = SUITES["crop_region"]
    case = crop.make({}, 1, {})
    x0, y0, x1, y1 = case.truth["expected_px"]
    assert crop.measure(case, Output(image=case.images[0].crop((x0, y0, x1, y1))), {})[1]
    assert not crop.measure(case, Output(image=case.images[0].crop((0, 0, x1 - x0, y1 - y0))), {})[1]
    assert char_accuracy("JUNOLE", "JUNGLE") == pytest.approx(5 / 6) and char_accuracy("", "A") == 0.0


# ---------------------------------------------------------------------------------- real runs


def test_flip_run_writes_answer_evidence_and_ea_cot(tmp_path):
    out = tmp_path / "ea"
    agent = build_agent("Flip", out)
    res = agent.run("Does Flip mirror images horizontally?")
    agent.close()
    assert res.answer == "yes" and res.probes_used == 4 and res.details["grid_probes"] == 8
    saved = json.loads((out / "result.json").read_text())
    assert saved["answer"] == "yes" and len(saved["evidence"]) == 4
    e = saved["evidence"][0]
    assert e["passed"] and e["metrics"]["mad_vs_expected"] == 0.0 and e["metrics"]["mad_vs_input"] > 5
    assert (out / e["output"]).exists() and (out / "probes" / e["probe_id"] / "expected.png").exists()
    assert "Answer: YES" in (out / "summary.md").read_text()
    records = json.loads((out / "ea_cot.json").read_text())
    assert [r["ea_cot"]["kind"] for r in records] == ["plan"] + ["probe"] * len(res.rounds) + ["summary"]
    assert "<plan>" in records[0]["messages"][2]["content"] and "(none)" in records[0]["messages"][1]["content"]
    assert "<information>" in records[-1]["messages"][1]["content"] and "Answer: yes" in records[-1]["messages"][2]["content"]

    no = build_agent("Flip", None).run("Does Flip mirror images vertically?")
    assert no.answer == "no" and all(not e.passed for e in no.evidence)


def test_rotate_answers_no_to_clockwise_under_the_canvascraft_profile():
    res = build_agent("Rotate", None).run("Does Rotate turn images 90 degrees clockwise?")
    assert res.answer == "no"
    e = res.evidence[0]
    assert e.metrics["mad_vs_other_direction"] == 0.0 and e.metrics["mad_vs_expected"] > 5  # it turned the other way


def test_ocr_boundary_from_real_ocr(tmp_path):
    agent = build_agent("OCR", tmp_path / "ocr")
    res = agent.run("Can OCR read text 3 px high?")
    agent.close()
    assert res.answer == "no"
    m = re.fullmatch(r"reads text ≥ (\d+) px, fails at ≤ (\d+) px", res.boundary or "")
    assert m and int(m.group(2)) >= 3 and 0 < int(m.group(1)) - int(m.group(2)) <= 1  # bracketed to one pixel
    assert res.probes_used < res.details["grid_probes"]
    e = res.evidence[0]
    assert e.value == 3 and e.truth["word"] and "read" in e.truth and not e.passed


def test_policy_targets_on_generated_tasks():
    yes = build_agent("scripted:expected", None).run("Does the policy mirror images when asked to?")
    assert yes.answer == "yes"
    no = build_agent("scripted:expected", None).run("Does the policy crop to the region it is asked for?")
    assert no.answer == "no" and no.evidence[0].metrics["size_error_px"] > 2  # the generic bbox, not the asked one
    none = build_agent("scripted:terminate", None).run("Does the policy mirror images?")
    assert none.answer == "no" and "produced no image" in none.evidence[0].error


def test_unconfigured_generation_backend_cannot_be_evaluated(tmp_path):
    res = build_agent("ImageGeneration", tmp_path / "gen").run("Can ImageGeneration render legible text?")
    assert res.answer.startswith("cannot evaluate: ImageGeneration needs a generation backend") and not res.rounds
    saved = json.loads((tmp_path / "gen" / "result.json").read_text())
    assert saved["answer"] == res.answer and saved["boundary"] is None and saved["evidence"] == []
    assert build_agent("SAM", None).run("Does SAM work?").answer.startswith("cannot evaluate")


# ------------------------------------------------------------------------------ the LLM planner


def test_llm_planner_plans_and_probes_checked_by_the_vocabulary(tmp_path):
    answers = [
        json.dumps({"thought": "Text height is the axis.", "property": "legibility", "conditions": {"rotation": 0},
                    "axis": "text_height", "asked": [3, 3]}),
        json.dumps({"thought": "Probe the asked height and a large one.", "values": [3, 40]}),
        "not JSON at all",  # the search's choice is used for this round, and recorded as a fallback
        json.dumps({"stop": True}),  # a stop before the evidence settles is not honoured
        json.dumps({"values": [2, 2]}),
        json.dumps({"values": [5]}),
        json.dumps({"values": [6]}),
    ]
    queue = list(answers)

    def respond(body):
        if "Write the answer" in body["messages"][0]["content"]:
            return 200, chat_payload("OCR cannot read 3 px text (0/2 read).")
        return 200, chat_payload(queue.pop(0) if queue else json.dumps({"values": [7]}))

    with StubOpenAI(respond) as stub:
        agent = build_agent("OCR", tmp_path / "llm", planner=f"openai:planner@{stub.base_url}")
        res = agent.run("Can OCR read tiny text 3 px high?")
        agent.close()
    assert res.plan.source == "openai" and res.plan.asked == [3, 3]
    sources = [r.source for r in res.rounds]
    assert sources[0] == "openai" and res.rounds[0].action["probe"] == [{"value": 3.0}, {"value": 40.0}]
    assert sources[1].startswith("offline-fallback (planner reply was not a JSON object")
    assert any(s.startswith("offline-fallback (planner stopped before the evidence") for s in sources)
    assert res.answer == "no"  # from the measurements, whatever the model writes
    assert res.summary.startswith("OCR cannot read 3 px text") and "Answer: NO" in res.summary


def test_llm_planner_invalid_plan_or_endpoint_down_falls_back():
    with StubOpenAI(lambda body: (200, chat_payload(json.dumps({"property": "legibility", "conditions": {"colour": "mauve"}, "axis": "text_height"})))) as stub:
        res = build_agent("Flip", None, planner=f"openai:p@{stub.base_url}").run("Does Flip mirror horizontally?")
    assert res.plan.source.startswith("offline-fallback (property 'legibility' does not test Flip") and res.answer == "yes"
    spec = f"openai:planner@http://127.0.0.1:{free_port()}/v1?max_retries=0&timeout_s=2"
    res = build_agent("Flip", None, planner=spec).run("Does Flip mirror horizontally?")
    assert res.plan.source.startswith("offline-fallback (planner endpoint failed") and res.answer == "yes"


_json = st.recursive(st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12),
                     lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=10), kids, max_size=4), max_leaves=12)
_plan_keys = st.sampled_from(["property", "conditions", "axis", "asked", "thought", "text_height", "rotation", "bg"])
_plan_vals = st.one_of(_json, st.sampled_from(list(SUITES) + ["text_height", "contrast", "rotation"]),
                       st.dictionaries(st.sampled_from(["text_height", "rotation", "contrast", "fg", "bg", "scale", "direction", "angle", "position"]), _json, max_size=3))


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(_plan_keys, _plan_vals, max_size=5), st.sampled_from(["OCR", "Flip", "Rotate", "scripted:expected"]))
def test_llm_plan_checker_takes_only_what_the_vocabulary_allows(obj, target):
    offline = parse_question("Does it work on small text?", target, TERMS)
    plan, why = check_llm_plan(obj, offline)
    if plan is None:
        assert why
        return
    assert plan.property in SUITES and plan.source == "openai"
    if plan.axis:
        axis = SUITES[plan.property].axes[plan.axis]
        assert plan.asked is None or all(axis.lo <= a <= axis.hi for a in plan.asked)


@given(st.text(max_size=300))
def test_parse_json_object_never_raises(text):
    obj = parse_json_object(text)
    assert obj is None or isinstance(obj, dict)


# --------------------------------------------------------------------------------------- CLI


def test_evaluate_cli_as_the_readme_writes_it(tmp_path, capsys):
    out = tmp_path / "cli"
    assert cli_main(["evaluate", "Does Crop return exactly the requested region?", "--target", "Crop", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "[answer] yes" in text and "[round 1]" in text
    assert {p.name for p in out.iterdir()} >= {"result.json", "rounds.json", "summary.md", "ea_cot.json", "probes"}
    assert json.loads((out / "result.json").read_text())["answer"] == "yes"
    assert cli_main(["evaluate", "x", "--target", "nope:1", "--out", str(out)]) == 2
    assert cli_main(["evaluate", "", "--target", "Flip", "--out", str(out)]) == 2
    assert cli_main(["evaluate", "x", "--target", "Flip", "--planner", "hf:x", "--out", str(out)]) == 2


# ----------------------------------------------------------------------------- EA-CoT as SFT data


def test_ea_cot_records_render_and_train_with_the_sft_command(tmp_path, tiny_qwen3vl_dir):
    from canvasagent.core.models.loading import load_processor
    from canvasagent.train import main as train_main

    agent = build_agent("Flip", tmp_path / "ea")
    agent.run("Does Flip mirror images horizontally?")
    agent.close()
    path = tmp_path / "ea" / "ea_cot.json"
    records = json.loads(path.read_text())
    processor = load_processor(tiny_qwen3vl_dir)
    for rec in records:
        ids = processor.apply_chat_template(rec["messages"], tokenize=True, return_dict=True)["input_ids"]
        text = processor.decode(ids if isinstance(ids[0], int) else ids[0])
        assert text.count("<|im_start|>") == 3 and rec["messages"][2]["content"][:40] in text
    rc = train_main([
        "sft", "--config", "sft_tiny_cpu", "--output-dir", str(tmp_path / "sft"),
        "--set", "data.format=sharegpt", "--set", f"data.path={path}",
        "--set", "optim.max_steps=1", "--set", "optim.per_device_train_batch_size=2", "--set", "run.save_steps=1",
    ])
    assert rc == 0 and (tmp_path / "sft" / "final" / "config.json").exists()
