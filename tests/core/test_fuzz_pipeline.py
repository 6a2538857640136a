"""Generated replies, arguments and records through the whole pipeline:
parse -> validate -> step -> save -> load -> reward (rule, hybrid with offline judges) -> replay.

Nothing in that chain may raise on any reply; the readers of outside records (ShareGPT,
task splits, trajectory.json) may only refuse with their documented errors. The larger run
is `benchmarks/fuzz.py`.
"""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from canvasagent.core.episode import EpisodeConfig, run_episode
from canvasagent.evaluation.tasks_io import TaskLoadError, task_from_record
from canvasagent.core.formats.sharegpt import FormatError, read_record, to_record
from canvasagent.core.imageio import ImageLoadError
from canvasagent.core.policies import ReplayPolicy
from canvasagent.core.protocol import format_reply
from canvasagent.replay import from_public, from_trajectory, replay
from canvasagent.core.tasks import Task
from canvasagent.core.trajectory import Trajectory, TrajectoryLoadError
from rewards import HybridReward, score_rule
from toolserver.registry import REGISTRY, Backend
from toolserver.toolbox import LocalToolbox
from toolserver.validation import Profile

FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck), database=None)
READER_ERRORS = (FormatError, ImageLoadError, TaskLoadError, TrajectoryLoadError)
PURE = sorted(n for n, s in REGISTRY.items() if s.backend is Backend.PURE)
TOOLBOXES = {p: LocalToolbox(profile=p) for p in Profile}

# -- generated values ----------------------------------------------------------------------------

hostile_text = st.one_of(
    st.text(max_size=20),
    st.sampled_from(["\ud800", "\udfff", "a\ud83dz", "\x00", "\u202e", "</tool_call>", "<Terminate>", "img_1", "../../x.png"]),
    st.builds(lambda c, n: c * n, st.sampled_from(["x", "é", "\ud800"]), st.integers(500, 5000)),
)
hostile_numbers = st.one_of(
    st.integers(-10**6, 10**6),
    st.integers(min_value=10**300, max_value=10**400),  # past float range
    st.integers(max_value=-(10**300), min_value=-(10**400)),
    st.floats(allow_nan=True, allow_infinity=True),
)
scalars = st.one_of(st.none(), st.booleans(), hostile_numbers, hostile_text)
values = st.recursive(scalars, lambda c: st.one_of(st.lists(c, max_size=5), st.dictionaries(st.text(max_size=6), c, max_size=4)), max_leaves=10)
refs = st.sampled_from(["img_1", "img_1", "img_2", "Flip_0", "Crop_0", "SAM_0", "../img_1", ""])


def _plausible(arg):
    kind = arg.type.value
    if kind == "asset":
        return refs
    if kind == "choice":
        return st.sampled_from(list(arg.choices))
    if kind == "bbox":
        return st.lists(st.integers(0, 1000), min_size=4, max_size=4).map(lambda v: sorted(v[::2]) + sorted(v[1::2])).map(
            lambda v: [v[0], v[2], v[1], v[3]])
    if kind == "position":
        return st.lists(st.integers(0, 1000), min_size=2, max_size=2)
    if kind == "unit":
        return st.floats(0, 1)
    return hostile_text


def _arguments(name):
    spec = REGISTRY.get(name)
    if spec is None:
        return st.dictionaries(st.text(max_size=8), values, max_size=3)
    plausible = st.fixed_dictionaries({a.name: _plausible(a) for a in spec.args})
    hostile = st.dictionaries(st.sampled_from(list(spec.arg_names) + ["extra"]), st.one_of(values, refs), max_size=len(spec.arg_names) + 1)
    return st.one_of(plausible, hostile, st.builds(lambda a, b: {**a, **b}, plausible, hostile))


tool_names = st.one_of(st.sampled_from(PURE), st.sampled_from(sorted(REGISTRY)), st.text(max_size=10))
calls = tool_names.flatmap(lambda n: st.tuples(st.just(n), _arguments(n)))


def _reply(reason, call, terminate):
    try:
        return format_reply(reason, {"name": call[0], "arguments": call[1]}, terminate=terminate)
    except (ValueError, TypeError):
        return reason


replies = st.one_of(
    st.builds(_reply, hostile_text, calls, st.booleans()),
    st.builds(_reply, hostile_text, calls, st.just(False)),
    st.lists(st.one_of(hostile_text, st.sampled_from(["<reason>", "</reason>", "<tool_call>", "</tool_call>", "{", "}", '"name"'])),
             max_size=8).map("".join),
)
images = st.builds(lambda mode, size: Image.new(mode, size, 1 if mode in ("1", "L", "P", "I", "F") else None),
                   st.sampled_from(["RGB", "RGBA", "L", "LA", "P", "1", "I", "F", "CMYK"]),
                   st.sampled_from([(1, 1), (9, 1), (12, 8), (17, 23)]))


@pytest.fixture(scope="module")
def hybrid():
    h = HybridReward("paper")  # offline judges: no network, no model weights
    yield h
    h.close()


def _pairs(text: str) -> str:
    """A high+low surrogate pair reads back from JSON as the character it encodes."""
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")


@FUZZ
@given(st.lists(replies, min_size=1, max_size=4), st.lists(images, min_size=1, max_size=2), st.sampled_from(list(Profile)), hostile_text)
def test_any_replies_survive_step_save_reward_and_replay(hybrid, reply_list, inputs, profile, instruction):
    task = Task(instruction, inputs, id="fuzz")
    traj = run_episode(ReplayPolicy(reply_list), task, TOOLBOXES[profile], EpisodeConfig(max_turns=5))
    assert traj.stop_reason in ("terminate", "max_turns", "submit", "budget")
    with tempfile.TemporaryDirectory() as d:
        back = Trajectory.load(traj.save(Path(d) / "t"))
    assert [_pairs(t.reply) for t in back.turns] == [_pairs(t.reply) for t in traj.turns]
    assert [t.status for t in back.turns] == [t.status for t in traj.turns]
    assert back.assets.ids() == traj.assets.ids()
    for a in traj.assets:  # every asset comes back with its mode and pixels
        b = back.assets.get(a.id).image
        assert b.mode == a.image.mode and b.size == a.image.size and b.tobytes() == a.image.tobytes()
    rule = score_rule(back)
    assert 0.0 <= rule.r_rule <= 1.0
    flat = hybrid.score(back)
    assert 0.0 <= flat["hybrid"] <= 1.0 and all(math.isfinite(v) for v in flat.values())
    again, report = replay(from_trajectory(back), TOOLBOXES[profile])
    for a, b in zip(traj.turns, again.turns):
        if a.call is not None and a.call.name in PURE:
            assert a.status == b.status and a.error_code == b.error_code
    assert report["summary"]["pixel_matches"].split("/")[0] == report["summary"]["pixel_matches"].split("/")[1]


# -- readers of outside records --------------------------------------------------------------------

paths = st.one_of(st.sampled_from(["a.png", "missing.png", "../outside.png", "/etc/passwd", "", "."]), st.text(max_size=10), values)
roles = st.one_of(st.sampled_from(["user", "assistant", "tool", "gpt", "human", "observation", "system"]), values)
messages = st.lists(st.one_of(
    st.fixed_dictionaries({"role": roles, "content": st.one_of(replies, st.just("<image>"), values)}),
    st.fixed_dictionaries({"from": roles, "value": st.one_of(replies, values)}),
    values,
), max_size=6)
records = st.one_of(
    st.fixed_dictionaries({"messages": messages, "images": st.one_of(st.lists(paths, max_size=3), paths)},
                          optional={"extra_info": values, "path": values, "system": values}),
    st.builds(lambda m, tail: {"messages": [{"role": "user", "content": "img_1: <image>\nflip"}, *m, *tail], "images": ["a.png"] * 3},
              st.lists(st.fixed_dictionaries({"role": st.sampled_from(["assistant", "tool"]), "content": replies}), max_size=4),
              st.just([])),
    values,
)


def _folder(d: Path) -> Path:
    (d / "rec").mkdir()
    Image.new("RGB", (6, 4), (1, 2, 3)).save(d / "rec" / "a.png")
    Image.new("RGB", (3, 3)).save(d / "outside.png")
    return d / "rec"


@FUZZ
@given(records)
def test_sharegpt_reader_refuses_or_replays(rec):
    with tempfile.TemporaryDirectory() as d:
        base = _folder(Path(d))
        try:
            pt = read_record(rec, base_dir=base)
        except READER_ERRORS:
            return
        for img in pt.task.images:
            assert img.size == (6, 4)  # only the file inside the folder can have been read
        traj, _ = replay(from_public(pt), TOOLBOXES[Profile.CANVASCRAFT])
        rec2 = to_record(traj, Path(d) / "out", image_prefix="")
        written = [m["content"] for m in rec2["messages"] if m["role"] == "assistant"]
        assert written[: len(pt.replies)] == pt.replies[: len(written)]  # the replay may add a closing <Terminate>


task_records = st.one_of(
    st.fixed_dictionaries({"path": values, "image": paths, "prompt": st.one_of(hostile_text, values)},
                          optional={"extra_info": st.one_of(values, st.fixed_dictionaries({"id": values, "reference_image": paths}))}),
    st.fixed_dictionaries({"instruction": st.one_of(hostile_text, values), "images": st.one_of(paths, st.lists(paths, max_size=2))},
                          optional={"id": values, "meta": st.one_of(values, st.fixed_dictionaries({"reference_images": st.lists(paths, max_size=2)})),
                                    "checks": values, "labels": values, "expected_tools": values}),
    values,
)


@FUZZ
@given(task_records)
def test_task_reader_refuses_or_returns_a_task(rec):
    with tempfile.TemporaryDirectory() as d:
        base = _folder(Path(d))
        try:
            task = task_from_record(rec, base)
        except READER_ERRORS:
            return
        assert isinstance(task.instruction, str) and isinstance(task.id, str)
        assert all(img.size == (6, 4) for img in task.images)
        for ref in task.meta.get("reference_images") or []:
            assert Path(ref).resolve().is_relative_to(base.resolve())


_FLIP = '<reason>r</reason><tool_call>{"name": "Flip", "arguments": {"image": "img_1"}}</tool_call>'


@st.composite
def mutated_trajectories(draw):
    traj = run_episode(ReplayPolicy([_FLIP]), Task("x", [Image.new("RGB", (4, 4))], id="t"), TOOLBOXES[Profile.CANVASCRAFT],
                       EpisodeConfig(max_turns=2))
    d = traj.to_dict()
    for _ in range(draw(st.integers(1, 4))):
        where = draw(st.sampled_from(["task", "turns", "assets", "top"]))
        if where == "top":
            d[draw(st.sampled_from(sorted(d)))] = draw(values)
        # An earlier mutation may have replaced a whole section; mutate inside only what is still a
        # list of objects.
        elif where == "assets" and isinstance(d.get("assets"), list) and d["assets"]:
            a = d["assets"][draw(st.integers(0, len(d["assets"]) - 1))]
            if isinstance(a, dict):
                a[draw(st.sampled_from(["id", "file", "kind", "provenance", "mode"]))] = draw(st.one_of(paths, values))
        elif where == "turns" and isinstance(d.get("turns"), list) and d["turns"] and isinstance(d["turns"][0], dict) and d["turns"][0]:
            d["turns"][0][draw(st.sampled_from(sorted(d["turns"][0])))] = draw(values)
        elif isinstance(d.get("task"), dict) and d["task"]:
            d["task"][draw(st.sampled_from(sorted(d["task"])))] = draw(values)
    return traj, d


@FUZZ
@given(mutated_trajectories())
def test_trajectory_reader_refuses_or_loads(case):
    traj, data = case
    with tempfile.TemporaryDirectory() as d:
        folder = Path(d) / "t"
        traj.save(folder)
        Image.new("RGB", (4, 4)).save(Path(d) / "x.png")  # something to escape to
        try:
            (folder / "trajectory.json").write_text(json.dumps(data), encoding="utf-8", errors="surrogatepass")
        except ValueError:
            return
        try:
            back = Trajectory.load(folder)
        except READER_ERRORS:
            return
        assert all(isinstance(t.reply, str) and isinstance(t.output_id, (str, type(None))) for t in back.turns)
        assert 0.0 <= score_rule(back).r_rule <= 1.0  # a record that loads can be scored
