"""Semantic-task runner: anchors, random and heuristic plans, table and PNG."""
import numpy as np

from canvasagent.easel import heuristics, semantic, tasks


def test_semantic_runner_table_and_png(tmp_path):
    names = ("circle_outline", "apple_outline", "handwriting", "simple_maze", "hard_maze")
    res = semantic.run(semantic.POLICIES, seeds=(0,), out_dir=tmp_path, task_names=names,
                       ocr=lambda img: "hello" if (img < 0.5).any() else "")
    by = {(r.task, r.policy): r for r in res}
    for name in names:
        assert by[(name, "blank")].score == 0.0 and by[(name, "blank")].steps_used == 0
        assert by[(name, "heuristic")].score > by[(name, "random")].score or name == "handwriting"
    assert by[("circle_outline", "heuristic")].score > 0.9 and by[("apple_outline", "heuristic")].score > 0.9
    assert by[("simple_maze", "heuristic")].score == 1.0 and by[("hard_maze", "heuristic")].score == 1.0
    # random strokes hit walls: rejected, but each one costs a step
    r = by[("hard_maze", "random")]
    assert r.rejected > 0 and r.steps_used == r.budget and r.strokes_applied + r.rejected == r.steps_used
    table = (tmp_path / "table.md").read_text()
    assert "| hard_maze | progress |" in table and "heuristic" in table
    assert (tmp_path / "semantic.png").exists() and len(list((tmp_path / "canvases").glob("*.png"))) == 15


def test_outline_heuristic_uses_pixels_not_mask():
    t = tasks.apple_outline_task(1)
    m = heuristics.target_mask(t)
    dice = 2 * (m & t.mask).sum() / (m.sum() + t.mask.sum())
    assert dice > 0.95  # left apple found from the image; stem and leaf dropped


def test_handwriting_heuristic_fits_budget():
    t = tasks.HandwritingTask(word="hello", budget=20)
    plan = heuristics.handwriting_plan(t)
    assert 0 < len(plan) <= 20 and np.all((plan >= 0) & (plan <= 1))


def test_grid_plan_beats_blank():
    t = tasks.make_reconstruction("abstract", 1)
    from canvasagent.easel import render
    canvas = render.render_strokes(heuristics.grid_plan(t.reference, t.budget), t.resolution)
    assert t.score(canvas) > t.score(t.initial_canvas())
