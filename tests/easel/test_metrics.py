"""Metric sanity: identical images score 1; scores are monotone under added noise."""
import numpy as np

from canvasagent.easel import anchors, metrics, tasks


def _ref():
    return tasks.make_reconstruction("spatial", 5).reference


def test_identical_images_score_one():
    r = _ref()
    sim = metrics.similarity(r, r.copy())
    assert sim.s == 1.0 and sim.ssim == 1.0 and sim.l1 == 0.0 and sim.edge_iou == 1.0


def test_monotone_under_noise():
    r = _ref()
    rng = np.random.default_rng(0)
    noise = rng.standard_normal(r.shape)
    scores = [metrics.similarity(r, np.clip(r + s * noise, 0, 1)).s for s in (0.0, 0.05, 0.1, 0.2, 0.4)]
    assert all(a > b for a, b in zip(scores, scores[1:])), scores


def test_uniform_fills_have_zero_edge_iou_and_uint8_input():
    r = _ref()
    for name in anchors.ANCHORS:
        sim = metrics.similarity(r, anchors.anchor_canvas(name, r))
        assert sim.edge_iou == 0.0 and 0.0 < sim.s < 1.0
    u8 = (r * 255).round().astype(np.uint8)
    assert abs(metrics.score(u8, r) - 1.0) < 0.05


def test_dominant_colour_is_background():
    img = np.ones((32, 32, 3), np.float32) * np.array([0.2, 0.4, 0.6], np.float32)
    img[:8, :8] = [1, 0, 0]
    assert np.allclose(anchors.dominant_color(img), [0.2, 0.4, 0.6], atol=1e-3)


def test_diagnostics():
    d = metrics.diagnostics([0.1, 0.5, 0.4, 0.3], actions=[[1, 2], [1, 2], [3, 4], [3, 4]])
    assert d.final == 0.3 and d.best == 0.5 and abs(d.fb_gap - 0.2) < 1e-12
    assert d.at50 == 0.5 and abs(d.auc - 0.325) < 1e-12
    assert abs(d.exact_repeat_rate - 2 / 3) < 1e-12
    assert metrics.diagnostics([], s0=0.4).final == 0.4
