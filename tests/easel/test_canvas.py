"""Canvas session: tool calls by name, undo, submit, budget, history and S curve."""
import numpy as np

from canvasagent.easel import render, tasks
from canvasagent.easel.canvas import CanvasSession
from toolserver.registry import get_tool, tool_names


def _args(p):
    return render.params_to_dict(p)


def test_stroke_undo_submit():
    t = tasks.make_reconstruction("programmatic", 1)
    s = CanvasSession.for_task(t)
    p = np.array([0.2, 0.2, 0.5, 0.5, 0.8, 0.8, 0.3, 1, 0.3, 1, 0.1, 0.2, 0.3])
    r = s.call("brush_stroke", _args(p))
    assert r.ok and r.steps_used == 1 and len(s.s_curve) == 1 and s.strokes.shape == (1, 13)
    assert not np.allclose(s.canvas, 1.0)
    r = s.call("undo", {})
    assert r.ok and np.allclose(s.canvas, 1.0) and s.strokes.shape == (0, 13) and r.steps_used == 2
    assert not s.call("undo", {}).ok  # nothing to undo, still a step
    assert not s.call("brush_stroke", {"xs": 0.1}).ok  # invalid args cost a step
    assert not s.call("paint_bucket", {}).ok
    r = s.call("submit", {})
    assert r.done and s.submitted and s.steps_used == 5
    assert not s.call("brush_stroke", _args(p)).ok  # finished
    assert [e.tool for e in s.history][:2] == ["brush_stroke", "undo"]
    d = s.diagnostics()
    assert d.steps == 5


def test_budget_exhaustion():
    s = CanvasSession(render.blank_canvas(16), budget=2)
    p = np.full(13, 0.5)
    s.brush_stroke(p)
    r = s.brush_stroke(p)
    assert r.done and s.done
    assert s.diagnostics().exact_repeat_rate == 0.0  # no reference -> empty curve


def test_fixed_appearance_and_maze_rejection():
    t = tasks.simple_maze_task(0)
    s = CanvasSession.for_task(t)
    assert s.fixed_appearance and s.reference is None
    r = s.call("brush_stroke", {"xs": 0.0, "ys": 0.5, "xc": 0.5, "yc": 0.5, "xe": 1.0, "ye": 0.5})
    assert not r.ok and "wall" in r.message and s.steps_used == 1
    assert np.array_equal(s.canvas, t.initial_canvas())
    for p in t.route_strokes():
        assert s.call("brush_stroke", dict(zip(render.PATH_NAMES, p[:6]))).ok
    assert t.score(s.canvas) == 1.0


def test_registry_names_consistent():
    assert set(CanvasSession(render.blank_canvas(8), budget=1).handlers()) == set(tool_names("easel"))
    assert tuple(a.name for a in get_tool("brush_stroke").args) == render.PARAM_NAMES


def test_one_task_factory_for_specs():
    assert np.array_equal(tasks.task_from_spec({"category": "spatial", "seed": 2}).reference,
                          tasks.make_reconstruction("spatial", 2).reference)
    small = tasks.task_from_spec({"kind": "reconstruction", "category": "spatial", "seed": 2, "resolution": 32, "budget": 5})
    assert small.reference.shape[0] == 32 and small.budget == 5 and small.task_id == "spatial-0002-32px"
    maze = tasks.task_from_spec({"kind": "semantic", "name": "simple_maze", "seed": 0})
    assert np.array_equal(maze.initial_canvas(), tasks.simple_maze_task(0).initial_canvas())


from hypothesis import given, settings, strategies as st  # noqa: E402

_vals = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-5, 1005), st.text(max_size=3),
                  st.none(), st.lists(st.floats(0, 1), max_size=2))


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.sampled_from(list(render.PARAM_NAMES) + ["as", "zz"]), _vals, max_size=15))
def test_session_never_crashes_on_arbitrary_arguments(args):
    s = CanvasSession(render.blank_canvas(16), budget=3)
    r = s.call("brush_stroke", args)
    assert r.steps_used == 1
    if r.ok:  # accepted only if every value is a number in [0, 1]
        assert s.strokes.shape == (1, 13) and np.all((s.strokes >= 0) & (s.strokes <= 1))
    else:
        assert np.array_equal(s.canvas, render.blank_canvas(16))


def test_strokes_the_schema_refuses_use_up_the_budget_the_prompt_states(tmp_path):
    """The prompt says every brush_stroke, accepted or rejected, costs a step; a stroke the runner's
    schema check refuses (xs = 1.5 is outside [0, 1]) never reaches the canvas and still costs one."""
    import json

    from canvasagent.easel import agent
    from canvasagent.core.protocol import format_reply
    from toolserver.registry import REGISTRY

    # The schema leaves the path's units to the prompt, which states them (unit here).
    assert "[0, 1]" in REGISTRY["brush_stroke"].description and "system prompt" in REGISTRY["brush_stroke"].description
    good = {k: 0.5 for k in render.PARAM_NAMES}
    bad = {**good, "xs": 1.5}
    replies = [format_reply("paint", {"name": "brush_stroke", "arguments": bad}),
               format_reply("paint", {"name": "brush_stroke", "arguments": good}),
               "no call at all",  # costs no step
               format_reply("paint", {"name": "brush_stroke", "arguments": bad})]
    (tmp_path / "r.json").write_text(json.dumps(replies))
    task = tasks.make_reconstruction("programmatic", 0)
    prompt = agent.agent_task(task, 3, "t").instruction
    assert "every brush_stroke (accepted or rejected)" in prompt and "without a tool call costs none" in prompt
    ep = agent.play(agent.AgentPolicySource(f"replay:{tmp_path / 'r.json'}"), task, agent.AgentConfig(budget=3), tmp_path)
    assert ep.stop_reason == "budget" and ep.session.steps_used == 3 and ep.turns == 4
    assert [e.ok for e in ep.session.history] == [False, True, False]
    assert ep.session.strokes.shape == (1, 13)  # the refused strokes painted nothing
    traj = json.loads((tmp_path / "trajectories" / "programmatic-0000" / "trajectory.json").read_text())
    assert "used step 1/3" in traj["turns"][0]["observation"] and traj["turns"][0]["result_data"]["charged"]
    # An accepted in-range stroke is exactly what the session applies directly.
    s = CanvasSession.for_task(task)
    assert s.call("brush_stroke", good).ok and not s.call("brush_stroke", bad).ok
