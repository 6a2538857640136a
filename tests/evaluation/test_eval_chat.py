"""Human-in-the-loop sessions: approve, edit, reject, take over, roll back; `canvasagent chat`."""

from __future__ import annotations

import json

import pytest
from PIL import Image

from canvasagent.core.assets import UnknownAssetError
from canvasagent.cli import main as cli_main
from toolserver.client import make_toolbox
from canvasagent.interactive.session import Session
from canvasagent.core.policies.replay import ReplayPolicy
from canvasagent.core.protocol import format_reply
from canvasagent.core.tasks import Task
from canvasagent.core.trajectory import Trajectory

FLIP = format_reply("mirror", {"name": "Flip", "arguments": {"image": "img_1"}})
CROP = format_reply("crop", {"name": "Crop", "arguments": {"image": "Flip_0", "bbox": [0, 0, 2000, -5]}})
ROT = format_reply("rotate", {"name": "Rotate", "arguments": {"image": "Crop_0", "angle": 90}})
DONE = format_reply("done", terminate=True)


def _session(tmp_path, replies):
    task = Task("mirror and crop", [Image.new("RGB", (40, 20), "red")], id="s")
    return Session(task, make_toolbox("offline"), ReplayPolicy(replies), out_dir=tmp_path / "s")


def test_session_approve_edit_reject_takeover_and_rollback(tmp_path):
    s = _session(tmp_path, [FLIP, CROP, ROT, DONE])
    assert s.approve(s.propose()).turn.output_id == "Flip_0"
    p = s.propose()
    assert p.call.name == "Crop"
    res = s.edit_arguments(p, {"image": "Flip_0", "bbox": [0, 0, 500, 500]})
    assert res.turn.status == "ok" and res.turn.output_id == "Crop_0"
    turn = s.reject(s.propose(), "keep it upright")
    assert turn.error_code == "user_rejected"
    assert "keep it upright" in s.episode.messages[-1]["content"][-1]["text"]
    res = s.take_over('Rotate {"image": "Crop_0", "angle": 180}')
    assert res.turn.output_id == "Rotate_0" and res.turn.result_data["user"] == "took_over"
    saved = Trajectory.load(tmp_path / "s")
    assert saved.assets.ids() == ["img_1", "Flip_0", "Crop_0", "Rotate_0"] and len(saved.turns) == 4

    s.rollback("Flip_0")
    assert s.episode.assets.ids() == ["img_1", "Flip_0"] and len(s.trajectory.turns) == 1
    assert [m["role"] for m in s.episode.messages] == ["system", "user", "assistant", "tool"]
    assert not (tmp_path / "s" / "assets" / "Crop_0.png").exists()
    # Counters rewind: the next Crop is Crop_0 again.
    assert s.take_over('Crop {"image": "Flip_0", "bbox": [0, 0, 500, 1000]}').turn.output_id == "Crop_0"
    s.rollback("img_1")
    assert s.trajectory.turns == [] and len(s.episode.messages) == 2
    with pytest.raises(UnknownAssetError):
        s.rollback("Nope_0")
    s.finish()
    assert Trajectory.load(tmp_path / "s").stop_reason == "user_closed"


def test_session_rollback_after_terminate_reopens(tmp_path):
    s = _session(tmp_path, [FLIP, DONE])
    s.approve(s.propose())
    s.approve(s.propose())
    assert s.done
    s.rollback("Flip_0")
    assert not s.done and s.trajectory.stop_reason == "running"


def test_chat_cli_hitl(tmp_path, monkeypatch, capsys):
    img = tmp_path / "in.png"
    Image.new("RGB", (40, 20), "blue").save(img)
    (tmp_path / "r.json").write_text(json.dumps([FLIP, CROP, ROT, DONE]))
    answers = iter(["a", "e", '{"image": "Flip_0", "bbox": [0, 0, 500, 500]}', "r", "no rotation", "t", "done"])
    monkeypatch.setattr("builtins.input", lambda prompt="": next(answers))
    out = tmp_path / "chat"
    rc = cli_main(["chat", "--image", f"img_1={img}", "-m", "mirror then crop", "--policy", f"replay:{tmp_path / 'r.json'}", "--out", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "reason: mirror" in text and "call:   Flip" in text and "result: ok -> Flip_0" in text
    traj = Trajectory.load(out)
    assert [t.status for t in traj.turns] == ["ok", "ok", "error", "terminate"]
    assert traj.turns[2].error_code == "user_rejected" and traj.stop_reason == "terminate"
    assert (out / "assets" / "Crop_0.png").exists()


def test_chat_cli_closed_mid_episode_saves(tmp_path, monkeypatch, capsys):
    img = tmp_path / "in.png"
    Image.new("RGB", (40, 20), "blue").save(img)

    answers = iter(['Flip {"image": "img_1"}'])

    def fake_input(prompt=""):
        try:
            return next(answers)
        except StopIteration:
            raise EOFError from None  # the user closed the terminal

    monkeypatch.setattr("builtins.input", fake_input)
    out = tmp_path / "chat"
    assert cli_main(["chat", "--image", f"img_1={img}", "-m", "mirror", "--out", str(out)]) == 0
    traj = Trajectory.load(out)
    assert traj.stop_reason == "user_closed" and traj.assets.ids() == ["img_1", "Flip_0"]
    assert "session closed" in capsys.readouterr().out


def test_chat_with_endpoint_down_offers_takeover(tmp_path, monkeypatch, capsys):
    from tests.stub_openai import free_port

    img = tmp_path / "in.png"
    Image.new("RGB", (40, 20), "blue").save(img)
    answers = iter(["t", 'Flip {"image": "img_1"}', "q"])
    monkeypatch.setattr("builtins.input", lambda prompt="": next(answers))
    spec = f"openai:m@http://127.0.0.1:{free_port()}/v1?max_retries=0&timeout_s=2"
    out = tmp_path / "chat"
    assert cli_main(["chat", "--image", f"img_1={img}", "-m", "mirror", "--policy", spec, "--out", str(out)]) == 0
    assert "the policy failed: EndpointError" in capsys.readouterr().out
    assert Trajectory.load(out).assets.ids() == ["img_1", "Flip_0"]


def test_chat_asks_again_on_a_typo_or_an_unknown_asset_and_records_only_decisions(tmp_path, monkeypatch, capsys):
    img = tmp_path / "in.png"
    Image.new("RGB", (40, 20), "blue").save(img)
    (tmp_path / "r.json").write_text(json.dumps([FLIP, CROP, CROP, DONE]))  # replayed by turn number
    answers = iter([
        "a",  # Flip as proposed
        "x", "t",  # an unknown choice asks again; then take over
        'Rotate {"image": "Flip_0", "angle": 9',  # typo: unbalanced JSON
        'Rotate {"image": "Flip_9", "angle": 90}',  # unknown asset
        'Rotate {"image": "Flip_0", "angle": 90}',  # runs
        "e",  # edit the proposed Crop
        "{not json",  # typo
        '{"image": "Crop_7", "bbox": [0, 0, 500, 500]}',  # unknown asset
        "",  # back to the choices
        "e", '{"image": "Rotate_0", "bbox": [0, 0, 500, 500]}',  # runs
        "a",  # the policy's <Terminate>
    ])
    monkeypatch.setattr("builtins.input", lambda prompt="": next(answers))
    out = tmp_path / "chat"
    rc = cli_main(["chat", "--image", f"img_1={img}", "-m", "mirror", "--policy", f"replay:{tmp_path / 'r.json'}", "--out", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "unknown choice 'x'" in text
    assert text.count("would not run") == 3 and "Flip_9" in text and "Crop_7" in text
    assert "could not use that edit" in text and "edit cancelled" in text
    traj = Trajectory.load(out)
    # Only the decisions: approve, take over, edit, terminate. No parse_error or error turn.
    assert [t.status for t in traj.turns] == ["ok", "ok", "ok", "terminate"]
    assert traj.assets.ids() == ["img_1", "Flip_0", "Rotate_0", "Crop_0"]
    assert traj.turns[1].result_data["user"] == "took_over" and traj.turns[2].result_data["user"] == "edited"


def test_session_check_names_what_would_not_run(tmp_path):
    s = _session(tmp_path, [])
    assert s.check(format_reply("x", {"name": "Flip", "arguments": {"image": "img_1"}})) is None
    assert s.check(DONE) is None
    assert "img_4" in s.check(format_reply("x", {"name": "Flip", "arguments": {"image": "img_4"}}))
    assert s.check("<tool_call>{oops</tool_call>")
    assert "no tool call" in s.check("just words")
    assert s.trajectory.turns == []  # checking records nothing
