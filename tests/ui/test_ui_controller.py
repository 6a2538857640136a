"""The UI's behaviour without a browser: start, step, take over, roll back, close mid-episode."""

from __future__ import annotations

import json

from PIL import Image

from canvasagent.protocol import format_reply
from canvasagent.trajectory import Trajectory
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
    traj = st.session.trajectory
    assert [t.status for t in traj.turns] == ["ok", "ok", "error"] and traj.turns[-1].error_code == "user_rejected"
