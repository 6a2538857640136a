"""Every kind of bad input gives a precise error observation and the episode continues."""

import io

import numpy as np
import pytest
from PIL import Image

from canvasagent.core.episode import Episode, EpisodeConfig, run_episode
from canvasagent.core.imageio import ImageLoadError, load_image, open_image
from canvasagent.core.policies import ReplayPolicy, ScriptedPolicy
from canvasagent.core.tasks import Task
from toolserver.toolbox import LocalToolbox


@pytest.fixture
def ep():
    e = Episode(LocalToolbox(), EpisodeConfig(max_turns=50))
    e.reset(Task("t", [Image.new("RGB", (40, 30), (1, 2, 3))]))
    return e


CASES = [
    ('<reason>x</reason><tool_call>{"name": "Blur", "arguments": {"image": "img_1"}}</tool_call>', "unknown_tool"),
    ('<reason>x</reason><tool_call>{"name": "Crop", "arguments": {"image": "img_1"}}</tool_call>', "missing_argument"),
    ('<reason>x</reason><tool_call>{"name": "Crop", "arguments": {"image": "img_1", "bbox": ""}}</tool_call>', "empty_argument"),
    ('<reason>x</reason><tool_call>{"name": "Crop", "arguments": {"image": "img_1", "bbox": [0,0,2000,500]}}</tool_call>', None),
    ('<reason>x</reason><tool_call>{"name": "Crop", "arguments": {"image": "img_1", "bbox": [9,0,2,10]}}</tool_call>', "bbox_unordered"),
    ('<reason>x</reason><tool_call>{"name": "Flip", "arguments": {"image": "img_9"}}</tool_call>', "unknown_asset"),
    ('<reason>x</reason><tool_call>{"name": "Extract", "arguments": {"image": "img_1", "mask": "img_1"}}</tool_call>', "wrong_asset_kind"),
    ('<reason>x</reason><tool_call>{"name": "Flip", "arguments": {"image": "img_1"</tool_call>', "bad_json"),
    ('<reason>x</reason><tool_call>{"name": "Flip", "arguments": {"image": "img_1"}}</tool_call><tool_call>{"name": "Flip", "arguments": {"image": "img_1"}}</tool_call>', "multiple_calls"),
    ('<reason>x</reason><tool_call>{"name": "Crop", "arguments": {"image": "img_1", "bbox": [0,0,NaN,5]}}</tool_call>', "not_finite"),
    ('<reason>x</reason><tool_call>{"name": "Crop", "arguments": {"image": "img_1", "bbox": [0,0,1e308,5]}}</tool_call>', "number_too_large"),
    ('<reason>x</reason><tool_call>{"name": "Crop", "arguments": {"image": "img_1", "bbox": [0,0,1e999,5]}}</tool_call>', "not_finite"),
    ('<reason>x</reason><tool_call>{"name": "OCR", "arguments": {"image": "img_1"}}</tool_call>', "backend_not_configured"),
    ('<reason>x</reason><tool_call>{"name": "brush_stroke", "arguments": {}}</tool_call>', "missing_argument"),
    ('<reason>x</reason><tool_call>["Flip"]</tool_call>', "call_not_object"),
    ('<reason>x</reason><tool_call>{"name": "Flip", "arguments": "img_1"}</tool_call>', "arguments_not_object"),
    ("<reason>thinking only</reason>", "no_action"),
    ("", "empty_reply"),
]


@pytest.mark.parametrize("reply,code", CASES)
def test_bad_call_is_precise_observation(ep, reply, code):
    before = ep.assets.ids()
    res = ep.step(reply)
    if code is None:  # canvascraft clamps coordinates above 1000, as the public tool did
        assert res.turn.status == "ok" and res.turn.check["spec_ok"] is False
        return
    assert res.turn.error_code == code, res.turn.error
    assert not res.done
    assert ep.assets.ids() == before
    assert res.observation["role"] == "tool" and res.turn.observation.startswith("Error: ")
    # The episode continues normally afterwards and the per-tool counter did not advance.
    ok = ep.step('<reason>x</reason><tool_call>{"name": "Flip", "arguments": {"image": "img_1"}}</tool_call>')
    assert ok.turn.output_id == "Flip_0"


def test_turn_budget_and_garbage_forever():
    toolbox = LocalToolbox()
    traj = run_episode(ScriptedPolicy(lambda m, e: "garbage"), Task("t", [Image.new("RGB", (4, 4))]), toolbox, EpisodeConfig(max_turns=5))
    assert traj.stop_reason == "max_turns" and len(traj.turns) == 5
    assert all(t.status == "no_call" for t in traj.turns)


def test_policy_crash_keeps_partial_trajectory():
    calls = iter(['<reason>a</reason><tool_call>{"name": "Flip", "arguments": {"image": "img_1"}}</tool_call>'])

    def act(m, e):
        try:
            return next(calls)
        except StopIteration:
            raise ConnectionError("endpoint down")

    traj = run_episode(ScriptedPolicy(act), Task("t", [Image.new("RGB", (4, 4))]), LocalToolbox())
    assert traj.stop_reason == "policy_error" and "endpoint down" in traj.meta["error"]
    assert traj.assets.ids() == ["img_1", "Flip_0"]


def test_decompression_bomb_and_pixel_limits(tmp_path):
    big = Image.new("L", (3000, 3000))
    buf = io.BytesIO()
    big.save(buf, format="PNG")
    with pytest.raises(ImageLoadError, match="pixel limit"):
        open_image(buf.getvalue(), max_pixels=1_000_000)
    ep = Episode(LocalToolbox(), EpisodeConfig(max_input_pixels=1000))
    with pytest.raises(ImageLoadError):
        ep.reset(Task("t", [Image.new("RGB", (100, 100))]))


def test_paths_outside_allowed_roots(tmp_path):
    (tmp_path / "ok").mkdir()
    Image.new("RGB", (2, 2)).save(tmp_path / "ok" / "a.png")
    Image.new("RGB", (2, 2)).save(tmp_path / "b.png")
    assert load_image("a.png", allowed_roots=[tmp_path / "ok"], base=tmp_path / "ok").size == (2, 2)
    with pytest.raises(ImageLoadError, match="outside the allowed roots"):
        load_image("../b.png", allowed_roots=[tmp_path / "ok"], base=tmp_path / "ok")
    with pytest.raises(ImageLoadError, match="no such image|cannot read"):
        load_image(tmp_path / "nope.png")
    (tmp_path / "junk.png").write_bytes(b"not an image")
    with pytest.raises(ImageLoadError):
        load_image(tmp_path / "junk.png")


def test_unknown_ids_never_fall_back_to_img_1(ep):
    res = ep.step('<reason>x</reason><tool_call>{"name": "Flip", "arguments": {"image": "../../etc/passwd"}}</tool_call>')
    assert res.turn.error_code == "unknown_asset" and "imglist" in res.turn.error


def test_step_after_end_and_before_reset():
    e = Episode(LocalToolbox())
    with pytest.raises(RuntimeError, match="reset"):
        e.step("<reason>x</reason><Terminate>")
    e.reset(Task("t", []))
    assert e.step("<reason>x</reason><Terminate>").done
    with pytest.raises(RuntimeError, match="already ended"):
        e.step("<reason>x</reason><Terminate>")
