"""Property tests: for any generated trajectory every score is finite and in its range."""

from __future__ import annotations

import json
import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rewards.config import RewardConfig
from rewards.hybrid import COMPONENTS, HybridReward
from rewards.rule import ACTION_TERMS, PENALTY_TERMS, score_rule
from tests.rewards.helpers import gradient, run
from toolserver.registry import tool_names

_IDS = st.sampled_from(["img_1", "img_2", "Crop_0", "Flip_0", "Rotate_0", "SAM_0", "Extract_0", "Overlayer_0", "../x", "", 7])
_NUM = st.one_of(st.integers(-2000, 3000), st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(["12", "a", None]))
_BOX = st.one_of(st.lists(_NUM, min_size=0, max_size=5), st.text(max_size=20), st.builds(lambda a, b, c, d: f"[{a}, {b}, {c}, {d}]", _NUM, _NUM, _NUM, _NUM))
_ARGS = st.fixed_dictionaries(
    {},
    optional={
        "image": _IDS, "base_image": _IDS, "mask": _IDS, "content": st.one_of(_IDS, st.text(max_size=8)),
        "bbox": _BOX, "position": _BOX, "angle": st.one_of(st.sampled_from([45, 90, 180, "90", 30]), _NUM),
        "overlay_type": st.sampled_from(["text", "object", "image"]), "prompt": st.text(max_size=10),
        "edit_prompt": st.text(max_size=10), "reference_text": st.text(max_size=10), "junk": st.integers(),
    },
)
_NAME = st.one_of(st.sampled_from(list(tool_names()) + ["brush_stroke", "Nope", ""]), st.text(max_size=6))


def _safe_dumps(obj) -> str:
    return json.dumps(obj, allow_nan=True, default=str)


@st.composite
def reply(draw) -> str:
    kind = draw(st.sampled_from(["call", "call", "call", "two", "bad_json", "terminate", "text", "fence", "long"]))
    reason = draw(st.text(max_size=30)) if kind != "long" else "word " * draw(st.integers(200, 700))
    head = f"<reason>{reason}</reason>" if draw(st.booleans()) or kind == "long" else ""
    call = "<tool_call>" + _safe_dumps({"name": draw(_NAME), "arguments": draw(_ARGS)}) + "</tool_call>"
    if kind in ("call", "long"):
        return head + call
    if kind == "two":
        return head + call + call
    if kind == "bad_json":
        return head + "<tool_call>{" + draw(st.text(max_size=10)) + "</tool_call>"
    if kind == "terminate":
        return head + "<Terminate>"
    if kind == "fence":
        return "```" + head + call + "```"
    return draw(st.text(max_size=40))


_EXPECTED = st.lists(st.sampled_from(list(tool_names()) + ["Unknown"]), max_size=5)
_SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

PAPER = RewardConfig.load("paper")
HYBRIDS = {p: HybridReward(p) for p in ("paper", "public-code")}
_CAPS = sum(getattr(PAPER.rule.penalties, k).cap for k in PENALTY_TERMS)


@_SETTINGS
@given(replies=st.lists(reply(), max_size=7), expected=_EXPECTED, n_images=st.integers(0, 2))
def test_rule_scores_are_finite_and_in_range(replies, expected, n_images):
    traj = run(replies, images=[gradient(40 + 8 * i, 30) for i in range(n_images)], expected=expected, max_turns=8)
    b = score_rule(traj, PAPER.rule)
    flat = b.to_flat()
    assert all(isinstance(v, float) and math.isfinite(v) for v in flat.values())
    assert 0.0 <= b.r_rule <= 1.0 and 0.0 <= b.r_format <= 1.0 and 0.0 <= b.r_action <= 1.0
    assert 0.0 <= b.p_eff <= _CAPS + 1e-9
    assert b.r_rule_raw == b.r_rule or not 0.0 < b.r_rule_raw < 1.0
    for c in b.calls:
        assert all(0.0 <= getattr(c, t) <= 1.0 for t in ACTION_TERMS) and 0.0 <= c.q <= 1.0 + 1e-9
    assert b.replay_mismatch == 0  # the replayed asset state agrees with what the runner validated against


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(replies=st.lists(reply(), max_size=5), expected=_EXPECTED, preset=st.sampled_from(sorted(HYBRIDS)))
def test_hybrid_scores_are_finite_and_in_range(replies, expected, preset):
    checks = [{"type": "size_relation", "relation": "smaller"}, {"type": "asset_kind", "kind": "rgba"}, {"type": "ocr_contains", "text": "hi"}]
    traj = run(replies, expected=expected, checks=checks, max_turns=6)
    flat = HYBRIDS[preset].score(traj)
    assert all(isinstance(v, float) and math.isfinite(v) for v in flat.values())
    assert 0.0 <= flat["hybrid"] <= 1.0
    for c in COMPONENTS:
        assert 0.0 <= flat[c] <= 1.0


_SCORE_KEYS = st.one_of(st.sampled_from(["hybrid", "total", "overall", *COMPONENTS, "rule/format", "fallbacks"]), st.text(max_size=8))


@given(st.dictionaries(_SCORE_KEYS, st.floats(allow_nan=False), max_size=8))
def test_canonical_scores_reads_every_saved_total_as_hybrid(saved):
    from rewards.hybrid import HYBRID, LEGACY_TOTALS, canonical_scores

    out = canonical_scores(saved)
    assert not set(out) & set(LEGACY_TOTALS)
    assert {k: v for k, v in out.items() if k != HYBRID} == {k: v for k, v in saved.items() if k not in (HYBRID, *LEGACY_TOTALS)}
    legacy = [saved[k] for k in LEGACY_TOTALS if k in saved]
    if HYBRID in saved:
        assert out[HYBRID] == saved[HYBRID]
    elif legacy:
        assert out[HYBRID] == legacy[0]
    else:
        assert HYBRID not in out
    assert canonical_scores(out) == out
