"""Interactive EASEL painting without a browser: commands, S after every stroke, undo, submit, `chat --easel`."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from canvasagent.cli import main as cli_main
from canvasagent.easel import render
from canvasagent.interactive.paint import (
    EXAMPLE_STROKE,
    PaintCommandError,
    PaintSession,
    load_reference,
    parse_command,
)


def test_parse_command_forms_and_refusals():
    assert parse_command(" U ") == ("undo", {}) and parse_command("submit") == ("submit", {})
    name, args = parse_command(json.dumps(EXAMPLE_STROKE))
    assert name == "brush_stroke" and args == pytest.approx(EXAMPLE_STROKE)
    nums = " ".join(str(EXAMPLE_STROKE[k]) for k in render.PARAM_NAMES)
    assert parse_command(nums)[1] == pytest.approx(EXAMPLE_STROKE)
    assert parse_command("brush_stroke " + nums.replace(" ", ", "))[1] == pytest.approx(EXAMPLE_STROKE)
    for bad, msg in (("", "empty"), ("{oops", "not valid JSON"), ("1 2 3", "expected 13"), ("paint!", "unknown command"),
                     (json.dumps({**EXAMPLE_STROKE, "xs": 1.5}), "invalid stroke"), ("[1]", "unknown command")):
        with pytest.raises(PaintCommandError, match=msg):
            parse_command(bad)


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.text(max_size=80), st.dictionaries(st.sampled_from(render.PARAM_NAMES), st.one_of(st.floats(), st.integers(), st.text(max_size=3))).map(json.dumps)))
def test_parse_command_accepts_only_schema_strokes(text):
    try:
        name, args = parse_command(text)
    except PaintCommandError:
        return
    if name == "brush_stroke":
        p = np.array([args[k] for k in render.PARAM_NAMES])
        assert p.shape == (13,) and np.all((p >= 0) & (p <= 1))


def test_session_shows_s_after_every_stroke_undo_and_submit(tmp_path):
    ref = load_reference("astronaut", 32)
    assert ref.shape == (32, 32, 3) and 0 <= ref.min() and ref.max() <= 1
    ps = PaintSession(ref, budget=4, out_dir=tmp_path)
    blank = ps.s
    step = ps.command(json.dumps({**EXAMPLE_STROKE, "cr": float(ref[..., 0].mean()), "cg": float(ref[..., 1].mean()), "cb": float(ref[..., 2].mean())}))
    assert step.result.ok and step.result.s == pytest.approx(ps.s) and ps.s != blank
    assert "step 1/4" in ps.status() and "1 stroke(s)" in ps.status()
    with pytest.raises(PaintCommandError):
        ps.command("{typo")  # costs nothing
    assert ps.canvas_session.steps_used == 1
    assert ps.command("undo").result.ok and ps.s == pytest.approx(blank) and np.allclose(ps.canvas, 1.0)
    assert (tmp_path / "canvas.png").exists() and (tmp_path / "s_curve.png").exists()
    assert ps.command("s").result.done and "submitted" in ps.status()
    with pytest.raises(PaintCommandError, match="finished"):
        ps.command("undo")
    hist = [json.loads(x) for x in (tmp_path / "strokes.jsonl").read_text().splitlines()]
    assert [h["name"] for h in hist] == ["brush_stroke", "undo", "submit"]


def test_chat_easel_paints_stroke_by_stroke(tmp_path, monkeypatch, capsys):
    answers = iter(["nonsense", json.dumps(EXAMPLE_STROKE), "undo", json.dumps(EXAMPLE_STROKE)])
    monkeypatch.setattr("builtins.input", lambda prompt="": next(answers))
    out = tmp_path / "paint"
    assert cli_main(["chat", "--easel", "coffee", "--budget", "3", "--size", "32", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "unknown command 'nonsense'" in text and text.count("S=") >= 4 and "step 3/3" in text and "out of budget" in text
    assert (out / "canvas.png").exists() and not np.allclose(np.asarray(__import__("PIL.Image").Image.open(out / "canvas.png")), 255)
    assert cli_main(["chat", "--easel", "no_such_image.png", "--out", str(tmp_path / "x")]) == 2


def test_easel_draw_is_the_same_loop(tmp_path, monkeypatch, capsys):
    answers = iter([json.dumps(EXAMPLE_STROKE), "submit"])
    monkeypatch.setattr("builtins.input", lambda prompt="": next(answers))
    assert cli_main(["easel", "draw", "rocket", "--budget", "5", "--size", "24", "--out", str(tmp_path / "d")]) == 0
    text = capsys.readouterr().out
    assert "step 1/5" in text and "submitted" in text and (tmp_path / "d" / "s_curve.png").exists()
