"""Hostile records and replies at the application edge: lone surrogates, paths out of their root."""

import json
import os

import pytest
from PIL import Image

from canvasagent.cli import main
from canvasagent.core.episode import EpisodeConfig, run_episode
from canvasagent.evaluation.tasks_io import TaskLoadError, load_tasks
from canvasagent.core.formats.sharegpt import read_record
from canvasagent.core.imageio import ImageLoadError
from canvasagent.core.policies import ReplayPolicy
from canvasagent.core.tasks import Task
from canvasagent.core.trajectory import Trajectory, TrajectoryLoadError, json_bytes
from rewards import HybridReward, score_rule
from tests.core.conftest import gradient
from toolserver.toolbox import LocalToolbox
from toolserver.validation import Profile

SURROGATE_REPLY = (
    '<reason>mirror it \ud800 now</reason><tool_call>{"name": "Flip", "arguments": '
    '{"image": "img_1", "direction": "horizontal", "note": "\udfff"}}</tool_call>'
)


def _surrogate_traj():
    task = Task("flip \ud83d it", [gradient(24, 16)], id="surr")
    return run_episode(ReplayPolicy([SURROGATE_REPLY, "<reason>done \udc80</reason><Terminate>"]), task,
                       LocalToolbox(profile=Profile.CANVASCRAFT), EpisodeConfig(max_turns=4))


def test_lone_surrogates_save_load_and_score(tmp_path):
    traj = _surrogate_traj()
    assert traj.turns[0].status == "ok" and traj.final_asset_id == "Flip_0"
    path = traj.save(tmp_path / "t")
    raw = path.read_bytes()
    raw.decode("utf-8")  # strict UTF-8 on disk: other readers (jq, pandas) can read it
    assert b"\\ud800" in raw and "\u00e9".encode() in json_bytes({"x": "\u00e9"})  # non-ASCII kept readable
    back = Trajectory.load(tmp_path / "t")
    assert [t.reply for t in back.turns] == [t.reply for t in traj.turns]
    assert back.task.instruction == "flip \ud83d it"
    assert back.turns[0].call.arguments["note"] == "\udfff"
    assert score_rule(back).r_rule == pytest.approx(score_rule(traj).r_rule)
    h = HybridReward("paper")
    try:
        flat = h.score(back)
    finally:
        h.close()
    assert 0.0 <= flat["hybrid"] <= 1.0


def test_reward_and_replay_cli_read_a_surrogate_record(tmp_path, capsys):
    _surrogate_traj().save(tmp_path / "t")
    assert main(["reward", str(tmp_path / "t"), "--json"]) == 0
    assert "hybrid" in json.loads(capsys.readouterr().out)
    assert main(["replay", str(tmp_path / "t"), "--out", str(tmp_path / "r")]) == 0
    report = json.loads((tmp_path / "r" / "report.json").read_text(encoding="utf-8"))
    assert report["steps"][0]["arguments"]["note"] == "\udfff" and report["summary"]["pixel_matches"] == "1/1"


# -- paths that escape their root ---------------------------------------------------------------


@pytest.fixture
def secret(tmp_path):
    """A readable PNG outside the folder of every record below."""
    (tmp_path / "secret").mkdir()
    p = tmp_path / "secret" / "x.png"
    Image.new("RGB", (8, 8), (200, 10, 10)).save(p)
    (tmp_path / "pub" / "deep").mkdir(parents=True)
    Image.new("RGB", (8, 8)).save(tmp_path / "pub" / "deep" / "ok.png")
    return p


def _sharegpt(images):
    return {
        "messages": [
            {"role": "user", "content": "img_1: <image>\nflip it"},
            {"role": "assistant", "content": '<reason>r</reason><tool_call>{"name": "Flip", "arguments": {"image": "img_1"}}</tool_call>'},
        ],
        "images": images,
    }


@pytest.mark.parametrize("where", ["../../secret/x.png", "../secret/x.png", "ABS", "LINK"])
def test_replay_refuses_sharegpt_images_outside_the_record_folder(tmp_path, secret, capsys, where):
    rec_dir = tmp_path / "pub" / "deep"
    if where == "ABS":
        where = str(secret)
    elif where == "LINK":  # a symlink inside the folder that points out of it
        os.symlink(secret, rec_dir / "link.png")
        where = "link.png"
    rec = rec_dir / "rec.json"
    rec.write_text(json.dumps(_sharegpt([where])))
    out = tmp_path / "out"
    assert main(["replay", str(rec), "--out", str(out)]) == 2
    assert "outside the allowed roots" in capsys.readouterr().err
    assert not out.exists()  # nothing was copied
    with pytest.raises(ImageLoadError, match="outside the allowed roots"):
        read_record(json.loads(rec.read_text()), base_dir=rec_dir)


def test_replay_reads_paths_inside_the_record_folder_and_extra_roots(tmp_path, secret, capsys):
    rec_dir = tmp_path / "pub" / "deep"
    (rec_dir / "rec.json").write_text(json.dumps(_sharegpt(["ok.png"])))
    assert main(["replay", str(rec_dir / "rec.json"), "--out", str(tmp_path / "o1")]) == 0
    (rec_dir / "esc.json").write_text(json.dumps(_sharegpt(["../../secret/x.png"])))
    # An explicit extra root lets the user opt in to a shared image folder.
    assert main(["replay", str(rec_dir / "esc.json"), "--allow-root", str(secret.parent), "--out", str(tmp_path / "o2")]) == 0
    assert Image.open(tmp_path / "o2" / "img_1.png").getpixel((0, 0)) == (200, 10, 10)


@pytest.mark.parametrize("field", ["image", "reference_image"])
def test_task_split_refuses_images_outside_its_folder(tmp_path, secret, field):
    split = tmp_path / "pub" / "deep"
    rec = {"path": ["Flip"], "image": ["ok.png"], "prompt": "flip", "extra_info": {"id": "t0"}}
    if field == "image":
        rec["image"] = ["../../secret/x.png"]
    else:
        rec["extra_info"]["reference_image"] = "../../secret/x.png"
    (split / "tasks.jsonl").write_text(json.dumps(rec) + "\n")
    with pytest.raises(TaskLoadError, match="outside the allowed roots"):
        load_tasks(split)
    assert load_tasks(split, allowed_roots=[split, secret.parent])[0].id == "t0"


def test_our_task_records_refuse_escaping_reference_images(tmp_path, secret):
    split = tmp_path / "pub" / "deep"
    rec = {"id": "t0", "instruction": "flip", "images": ["ok.png"], "meta": {"reference_images": [str(secret)]}}
    (split / "tasks.jsonl").write_text(json.dumps(rec) + "\n")
    with pytest.raises(TaskLoadError, match="outside the allowed roots"):
        load_tasks(split)
    rec["meta"]["reference_images"] = ["ok.png"]
    (split / "tasks.jsonl").write_text(json.dumps(rec) + "\n")
    (t,) = load_tasks(split)
    assert t.meta["reference_images"] == [str((split / "ok.png").resolve())]


def test_trajectory_load_refuses_asset_files_outside_its_folder(tmp_path, secret, capsys):
    traj = run_episode(ReplayPolicy(['<reason>r</reason><tool_call>{"name": "Flip", "arguments": {"image": "img_1"}}</tool_call>']),
                       Task("flip", [gradient(12, 8)], id="t"), LocalToolbox(), EpisodeConfig(max_turns=2))
    path = traj.save(tmp_path / "pub" / "t")
    d = json.loads(path.read_text())
    d["assets"][0]["file"] = "../../secret/x.png"
    path.write_text(json.dumps(d))
    with pytest.raises(TrajectoryLoadError, match="outside the allowed roots"):
        Trajectory.load(path)
    assert main(["reward", str(path)]) == 2
    assert main(["replay", str(path), "--out", str(tmp_path / "o")]) == 2
    assert "outside the allowed roots" in capsys.readouterr().err


# -- the tested versions ---------------------------------------------------------------------------


def test_constraints_pin_every_dependency_inside_its_range():
    """setup.sh installs with constraints.txt: every dependency pyproject.toml names (extras too)
    is pinned there to one version, and that version satisfies the declared range."""
    from pathlib import Path

    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    root = Path(__file__).resolve().parents[2]
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    pins = {}
    for line in (root / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            pins[canonicalize_name(name)] = version
    reqs = [Requirement(r) for r in project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]]
    for req in reqs:
        pinned = pins.get(canonicalize_name(req.name))
        assert pinned is not None, f"{req.name} is not pinned in constraints.txt"
        assert req.specifier.contains(pinned, prereleases=True), f"{req.name}=={pinned} is outside {req.specifier}"
    assert next(r for r in reqs if r.name == "trl").specifier.contains("1.17.0") is False  # private TRL API: bounded
    setup = (root / "scripts" / "setup.sh").read_text()
    assert f"torch=={pins['torch']}" in setup and setup.count("-c constraints.txt") == 2


# -- writers: every input mode is saved, no ID becomes a path out of the folder -----------------


def test_inputs_png_cannot_hold_round_trip_through_save(tmp_path):
    import numpy as np

    cmyk = Image.fromarray(np.arange(4 * 6 * 4, dtype=np.uint8).reshape(4, 6, 4), "CMYK")
    f32 = Image.fromarray(np.linspace(-1.5, 3.25, 24, dtype=np.float32).reshape(4, 6), "F")
    i32 = Image.fromarray(np.arange(24, dtype=np.int32).reshape(4, 6) * 100_000, "I")  # PNG would cut it to 16 bits
    task = Task("flip", [cmyk, f32, i32], id="modes")
    replies = ['<reason>r</reason><tool_call>{"name": "Flip", "arguments": {"image": "img_1"}}</tool_call>']
    traj = run_episode(ReplayPolicy(replies), task, LocalToolbox(profile=Profile.CANVASCRAFT), EpisodeConfig(max_turns=2))
    back = Trajectory.load(traj.save(tmp_path / "t"))
    for a in traj.assets:
        b = back.assets.get(a.id).image
        assert (b.mode, b.tobytes()) == (a.image.mode, a.image.tobytes()), a.id
    assert {"img_1.tiff", "img_2.tiff", "img_3.tiff"} <= {p.name for p in (tmp_path / "t" / "assets").iterdir()}


def test_hostile_ids_never_become_paths_out_of_the_folder(tmp_path):
    from canvasagent.evaluation.tasks_io import write_tasks
    from canvasagent.core.formats.sharegpt import to_record

    traj = run_episode(ReplayPolicy([]), Task("x", [gradient(4, 4)], id="../../evil/x"), LocalToolbox(), EpisodeConfig(max_turns=1))
    rec = to_record(traj, tmp_path / "pub" / "images", image_prefix="images")
    assert all(p.startswith("images/") and p.count("/") == 1 and (tmp_path / "pub" / p).is_file() for p in rec["images"])
    write_tasks([traj.task], tmp_path / "split")
    assert not (tmp_path / "evil").exists() and not (tmp_path / "pub" / "evil").exists()
    assert load_tasks(tmp_path / "split")[0].id == "../../evil/x"  # the ID itself is kept, only file names are safe
    d = json.loads(traj.save(tmp_path / "t").read_text())
    d["assets"][0]["id"] = "../../evil"
    (tmp_path / "t" / "trajectory.json").write_text(json.dumps(d))
    with pytest.raises(TrajectoryLoadError, match="not a safe name"):
        Trajectory.load(tmp_path / "t")


def test_a_nul_byte_or_a_lone_surrogate_in_a_path_is_a_clear_refusal(tmp_path, capsys):
    rec_dir = tmp_path / "pub"
    rec_dir.mkdir()
    (rec_dir / "rec.json").write_text(json.dumps(_sharegpt(["a\x00.png"])))
    assert main(["replay", str(rec_dir / "rec.json"), "--out", str(tmp_path / "o")]) == 2
    assert "NUL byte" in capsys.readouterr().err
    (rec_dir / "rec.json").write_text(json.dumps(_sharegpt(["a\udd13.png"])))  # a lone surrogate no file name can hold
    assert main(["replay", str(rec_dir / "rec.json"), "--out", str(tmp_path / "o")]) == 2
    assert "not a valid path" in capsys.readouterr().err
    traj = run_episode(ReplayPolicy([]), Task("x", [gradient(4, 4)], id="t"), LocalToolbox(), EpisodeConfig(max_turns=1))
    path = traj.save(tmp_path / "t")
    d = json.loads(path.read_text())
    d["assets"][0]["file"] = "assets/\x00img_1.png"
    path.write_text(json.dumps(d))
    with pytest.raises(TrajectoryLoadError, match="NUL byte"):
        Trajectory.load(path)
    (tmp_path / "split").mkdir()
    (tmp_path / "split" / "tasks.jsonl").write_text(json.dumps({"instruction": "x", "images": ["\x00.png"]}) + "\n")
    with pytest.raises(TaskLoadError, match="NUL byte"):
        load_tasks(tmp_path / "split")


@pytest.mark.parametrize("content", [b"[" * 100_000, b'{"messages": "\xff\xfe"}'], ids=["deep", "not_utf8"])
def test_deeply_nested_or_undecodable_files_are_clear_refusals(tmp_path, capsys, content):
    (tmp_path / "rec.json").write_bytes(content)
    assert main(["replay", str(tmp_path / "rec.json"), "--out", str(tmp_path / "o")]) == 2
    assert "error:" in capsys.readouterr().err
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "trajectory.json").write_bytes(content)
    with pytest.raises(TrajectoryLoadError):
        Trajectory.load(tmp_path / "t")
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "tasks.jsonl").write_bytes(content + b"\n")
    with pytest.raises(TaskLoadError):
        load_tasks(tmp_path / "s")
    (tmp_path / "s" / "tasks.jsonl").write_text(json.dumps({"prompt": "x", "image": [], "extra_info": {"checks": "[" * 100_000}}) + "\n")
    with pytest.raises(TaskLoadError):
        load_tasks(tmp_path / "s")
