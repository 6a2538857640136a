"""Every task's generator and scorer."""
import numpy as np
import pytest

from canvasagent.easel import render, tasks


@pytest.mark.parametrize("cat", list(tasks.CATEGORIES))
def test_reconstruction_categories(cat):
    t = tasks.make_reconstruction(cat, 7)
    c = tasks.CATEGORIES[cat]
    assert t.reference.shape == (c.resolution, c.resolution, 3) and t.budget == c.budget
    assert t.reference.dtype == np.float32 and 0 <= t.reference.min() and t.reference.max() <= 1
    assert np.array_equal(t.reference, tasks.make_reconstruction(cat, 7).reference)  # seeded
    assert t.score(t.reference) == pytest.approx(1.0)
    assert t.score(t.initial_canvas()) < 1.0


def test_natural_from_user_folder(tmp_path):
    from PIL import Image
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 255, (200, 300, 3), dtype=np.uint8)).save(tmp_path / "a.png")
    ref = tasks.make_natural(0, 128, folder=tmp_path)
    assert ref.shape == (128, 128, 3)


def _circle_strokes(mask, n=10):
    ys, xs = np.nonzero(mask)
    res = mask.shape[0]
    cx, cy, r = xs.mean() / res, ys.mean() / res, np.sqrt(mask.sum() / np.pi) / res
    ang = np.linspace(0, 2 * np.pi, n + 1)
    out = []
    for a0, a1 in zip(ang[:-1], ang[1:]):
        m, k = (a0 + a1) / 2, 1 / np.cos((a1 - a0) / 2)
        out.append([cx + r * np.cos(a0), cy + r * np.sin(a0), cx + k * r * np.cos(m), cy + k * r * np.sin(m),
                    cx + r * np.cos(a1), cy + r * np.sin(a1)])
    return render.expand_fixed(np.clip(np.array(out), 0, 1))


@pytest.mark.parametrize("make", [tasks.circle_outline_task, tasks.apple_outline_task])
def test_outline_scorers(make):
    t = make(0)
    assert t.score(t.initial_canvas()) == 0.0
    canvas = render.render_strokes(_circle_strokes(t.mask), t.resolution, canvas=t.initial_canvas())
    good = t.score(canvas)
    assert good > 0.6
    # a small outline elsewhere scores lower
    off = render.render_strokes(_circle_strokes(np.roll(t.mask, t.resolution // 3, axis=1)), t.resolution,
                                canvas=t.initial_canvas())
    assert t.score(off) < good


def test_handwriting_scorer_with_stub_ocr():
    t = tasks.HandwritingTask(word="hello", ocr=lambda img: "he1lo")
    assert t.score(t.initial_canvas()) == pytest.approx(0.8)
    assert tasks.letter_match("HELLO", "hello") == 1.0
    assert tasks.letter_match("", "hello") == 0.0


@pytest.mark.parametrize("make", [tasks.simple_maze_task, tasks.hard_maze_task])
def test_maze_scorer_and_walls(make):
    t = make(0)
    assert t.score(t.initial_canvas()) == 0.0
    strokes = t.route_strokes()
    canvas = t.initial_canvas()
    for p in strokes:
        assert t.check_stroke(p, canvas) is None
        canvas = render.apply_stroke(canvas, p)
    assert t.score(canvas) == 1.0
    half = t.initial_canvas()
    for p in strokes[: len(strokes) // 2]:
        half = render.apply_stroke(half, p)
    assert 0.0 < t.score(half) < 1.0
    across = render.expand_fixed([0.0, 0.5, 0.5, 0.5, 1.0, 0.5])
    assert t.check_stroke(across, canvas) is not None


def test_maze_route_is_connected():
    m = tasks.generate_maze(6, 3)
    assert m.route[0] == (0, 0) and m.route[-1] == (5, 5)
    assert all(abs(a[0] - b[0]) + abs(a[1] - b[1]) == 1 for a, b in zip(m.route, m.route[1:]))


def test_handwriting_default_ocr_reads_text():
    pytest.importorskip("rapidocr")
    import cv2
    t = tasks.HandwritingTask(word="hello")
    img = np.full((256, 256, 3), 255, np.uint8)
    cv2.putText(img, "hello", (20, 140), cv2.FONT_HERSHEY_SIMPLEX, 2, (30, 30, 110), 6, cv2.LINE_AA)
    assert t.score(img.astype(np.float32) / 255) == 1.0
    assert t.score(t.initial_canvas()) == 0.0
