"""The UI's behaviour without a browser: start, step, take over, roll back, close mid-episode."""

from __future__ import annotations

import json

from PIL import Image

from canvasagent.core.protocol import format_reply
from canvasagent.core.trajectory import Trajectory
from canvasagent.ui.controller import UIConfig, UIController, UIState

FLIP = format_reply("mirror", {"name": "Flip", "arguments": {"image": "img_1"}})
CROP = format_reply("crop", {"name": "Crop", "arguments": {"image": "Flip_0", "bbox": [0, 0, 500, 500]}})


def _setup(tmp_path, replies):
    img = tmp_path / "a.png"
    Image.new("RGB", (30, 20), "green").save(img)
    (tmp_path / "r.json").write_text(json.dumps(replies))
    ctl = UIController(UIConfig(policy=f"replay:{tmp_path / 'r.json'}", runs_dir=str(tmp_path / "runs")))
    return ctl, str(img)


def test_step_execute_rollback_and_close(tmp_path):
    ctl, img = _setup(tmp_path, [FLIP, CROP])
    st = UIState()
    v = ctl.start(st, [img], "mirror", None)
    assert v.asset_ids == ["img_1"] and v.gallery[0][1] == "img_1 · input"
    v = ctl.step(st)
    assert v.asset_ids == ["img_1", "Flip_0"] and "Flip (turn 1) from img_1" in v.gallery[1][1]
    v = ctl.execute(st, 'Rotate {"image": "Flip_0", "angle": 90}')
    assert v.asset_ids[-1] == "Rotate_0" and v.final_image is not None
    v = ctl.rollback(st, "Flip_0")
    assert v.asset_ids == ["img_1", "Flip_0"] and "rolled back" in v.log_md
    v = ctl.rollback(st, "Nope_1")
    assert v.status.startswith("error") and "unknown image ID" in v.status
    assert any(f.endswith(".json") for f in v.files)
    # The tab closes mid-episode: the session ends and everything is on disk.
    UIController.close(st)
    traj = Trajectory.load(st.dir)
    assert traj.stop_reason == "user_closed" and traj.assets.ids() == ["img_1", "Flip_0"]


def test_run_streams_each_step_and_stops_on_endpoint_error(tmp_path):
    ctl, img = _setup(tmp_path, [FLIP, CROP])
    st = UIState()
    ctl.start(st, [img], "mirror", None)
    views = list(ctl.run(st))
    assert [v.asset_ids[-1] for v in views] == ["Flip_0", "Crop_0", "Crop_0"] and views[-1].status.startswith("finished")

    from tests.stub_openai import free_port

    st2 = UIState()
    ctl.start(st2, [img], "mirror", f"openai:m@http://127.0.0.1:{free_port()}/v1?max_retries=0")
    views = list(ctl.run(st2))
    assert len(views) == 1 and views[0].status == "policy error" and "cannot connect" in views[0].log_md


def test_bad_spec_and_no_policy(tmp_path):
    ctl, img = _setup(tmp_path, [])
    v = ctl.start(UIState(), [img], "x", "bogus:thing")
    assert v.status.startswith("error") and "unknown policy kind" in v.status
    ctl.config.policy = None
    st = UIState()
    ctl.start(st, [img], "x", "")
    assert "no policy" in ctl.step(st).status
    assert ctl.execute(st, 'Flip {"image": "img_1"}').asset_ids[-1] == "Flip_0"


def test_propose_then_approve_edit_or_reject(tmp_path):
    ctl, img = _setup(tmp_path, [FLIP, CROP, CROP])
    st = UIState()
    ctl.start(st, [img], "mirror", None)
    assert ctl.approve(st).status.startswith("nothing proposed")
    v = ctl.propose(st)
    assert v.status == "awaiting approval" and v.asset_ids == ["img_1"]  # nothing executed yet
    assert ctl.propose(st).log_md.count("awaiting your decision") == 1  # asking again keeps the same proposal
    v = ctl.approve(st)
    assert v.asset_ids == ["img_1", "Flip_0"] and st.pending is None
    ctl.propose(st)
    v = ctl.approve(st, "not json")
    assert v.status.startswith("error") and st.pending is not None  # a bad edit executes nothing
    v = ctl.approve(st, '{"image": "Flip_0", "bbox": [0, 0, 1000, 500]}')
    assert v.asset_ids[-1] == "Crop_0" and "you edited the call" in v.log_md
    ctl.propose(st)
    v = ctl.reject(st, "no more crops")
    assert "rejected: no more crops" in v.log_md and v.asset_ids[-1] == "Crop_0"
    assert v.transcript[-1]["role"] == "user" and "you rejected turn 3" in v.transcript[-1]["content"][0]["text"]
    assert "no more crops" in v.transcript[-1]["content"][0]["text"]
    traj = st.session.trajectory
    assert [t.status for t in traj.turns] == ["ok", "ok", "error"] and traj.turns[-1].error_code == "user_rejected"


def test_transcript_reads_like_a_conversation_and_follows_rollback(tmp_path):
    ctl, img = _setup(tmp_path, [FLIP, CROP])
    st = UIState()
    ctl.start(st, [img], "mirror then crop", None)
    ctl.step(st)
    ctl.propose(st)
    v = ctl.view(st)
    roles = [m["role"] for m in v.transcript]
    assert roles == ["user", "assistant", "assistant", "assistant"]  # task, call, observation, proposal
    task, call, obs, proposal = v.transcript
    assert "mirror then crop" in task["content"][0]["text"] and task["content"][1]["path"].endswith(".png")
    assert "reason: mirror" in call["content"][0]["text"] and 'Flip {"image": "img_1"}' in call["content"][0]["text"]
    assert "observation" in obs["content"][0]["text"] and "Flip_0" in obs["content"][0]["text"]
    from PIL import Image as _I

    assert _I.open(obs["content"][1]["path"]).size == (30, 20)  # the turn's output image
    assert "Proposed (turn 2)" in proposal["content"][0]["text"] and "awaiting your decision" in proposal["content"][0]["text"]
    v = ctl.execute(st, 'Rotate {"image": "Flip_0", "angle": 90}')
    assert "you took over" in v.transcript[-2]["content"][0]["text"] and v.transcript[-2]["role"] == "user"
    v = ctl.rollback(st, "img_1")
    assert len(v.transcript) == 1  # back to the task alone


def test_take_over_and_edit_typos_record_nothing(tmp_path):
    ctl, img = _setup(tmp_path, [FLIP])
    st = UIState()
    ctl.start(st, [img], "x", "")
    for bad in ('Flip {"image": "img_1"', 'Flip {"image": "img_7"}', "Nope {}"):
        v = ctl.execute(st, bad)
        assert v.status.startswith("error: that would not run") and st.session.trajectory.turns == []
    ctl2, _ = _setup(tmp_path, [FLIP])
    st2 = UIState()
    ctl2.start(st2, [img], "x", None)
    ctl2.propose(st2)
    v = ctl2.approve(st2, '{"image": "img_3"}')
    assert "would not run" in v.status and "img_3" in v.status and st2.pending is not None and st2.session.trajectory.turns == []
    assert ctl2.approve(st2, '{"image": "img_1"}').asset_ids[-1] == "Flip_0"


def test_offline_examples_run_with_the_offline_tools(tmp_path):
    from canvasagent.ui.controller import EXAMPLES, example_files

    ctl, _ = _setup(tmp_path, [])
    for ex in EXAMPLES:
        files = example_files(ex, tmp_path / "examples")
        assert Image.open(files[0]).size[0] >= 256
        st = UIState()
        ctl.start(st, files, ex.instruction, ex.policy or "")
        v = ctl.step(st) if ex.policy else ctl.execute(st, ex.command)
        assert v.status.startswith(("running", "finished")) and len(v.asset_ids) == 2, (ex.label, v.status)


def test_paint_controller_stroke_undo_submit(tmp_path):
    from canvasagent.interactive.paint import EXAMPLE_STROKE
    from canvasagent.ui.controller import PaintController, PaintState

    pc = PaintController(tmp_path)
    st = PaintState()
    assert "Start painting" in pc.command(st, "undo").status
    assert pc.start(st, "rocket", None, 2, 8).status.startswith("error")  # 8 px is refused
    v = pc.start(st, "rocket", None, 2, 24)
    assert "step 0/2" in v.status and v.curve is None and Image.open(v.reference).size == (24, 24)
    v = pc.command(st, json.dumps(EXAMPLE_STROKE))
    assert "step 1/2" in v.status and v.curve is not None and "brush_stroke" in v.log_md
    assert pc.command(st, "{bad").status.startswith("error") and "step 1/2" in pc.view(st).status
    v = pc.command(st, "undo")
    assert "step 2/2" in v.status and "out of budget" in v.status
    assert "finished" in pc.command(st, "submit").status
