"""`batch_call` of the model backends: the same answers as one call per request, in order, with
incompatible requests split into sub-batches and a bad request failing only itself.

Runs on the tiny random-weight Grounding-DINO, SAM and FLUX.2 klein checkpoints (built once for
the module) through the very code the real models use; Real-ESRGAN in PyTorch runs a one-block
RRDBNet read from a BasicSR-style .pth. One test serves the tiny Grounding model on Ray Serve
with batching on.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw

from toolserver.backends import build_backend
from toolserver.request import ToolRequest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

pytest.importorskip("torch")
pytest.importorskip("transformers")


def _drawing(w: int, h: int, seed: int, mode: str = "RGB") -> Image.Image:
    """A small picture with shapes, different per seed (not noise: the processors resize it)."""
    rng = np.random.default_rng(seed)
    bg = (*(int(v) for v in rng.integers(0, 255, 3)), 0 if mode == "RGBA" else 255)
    img = Image.new("RGBA", (w, h), bg)
    d = ImageDraw.Draw(img)
    for _ in range(4):
        x0, y0 = int(rng.integers(0, w - 8)), int(rng.integers(0, h - 8))
        x1, y1 = x0 + int(rng.integers(6, w // 2 + 8)), y0 + int(rng.integers(6, h // 2 + 8))
        d.ellipse([x0, y0, x1, y1], fill=(*(int(v) for v in rng.integers(0, 255, 3)), 255))
    return img.convert(mode)


def _req(tool: str, **kw) -> ToolRequest:
    images = {k: v for k, v in kw.items() if isinstance(v, Image.Image)}
    args = {k: v for k, v in kw.items() if not isinstance(v, Image.Image)}
    return ToolRequest(tool, args, images)


def _count_groups(backend, monkeypatch) -> list[int]:
    """Record the size of every model call batch_call makes."""
    sizes: list[int] = []
    run = backend._run_group

    def counted(group):
        sizes.append(len(group))
        return run(group)

    monkeypatch.setattr(backend, "_run_group", counted)
    return sizes


def _assert_same_image(a: Image.Image, b: Image.Image, max_diff: int) -> None:
    assert a.mode == b.mode and a.size == b.size
    assert int(np.abs(np.asarray(a, dtype=np.int16) - np.asarray(b, dtype=np.int16)).max()) <= max_diff


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tiny_cache")


# ------------------------------------------------------------------------------- Grounding-DINO


@pytest.fixture(scope="module")
def grounding(tiny_dir):
    # Threshold 0: random weights rarely pass 0.35, and the comparison needs detections.
    return build_backend("grounding-tiny", {"cache_dir": str(tiny_dir), "box_threshold": 0.0, "text_threshold": 0.0, "max_detections": 5})


def test_grounding_batch_matches_single_calls(grounding, monkeypatch):
    reqs = [
        _req("Grounding", image=_drawing(96, 64, 0), reference_text="red ball"),
        _req("Grounding", image=_drawing(64, 64, 1), reference_text="a cat . the dog on the left"),  # another size
        _req("Grounding", image=_drawing(96, 64, 2), reference_text="sky"),  # a shorter prompt, padded
        _req("Grounding", image=_drawing(96, 64, 3, "RGBA"), reference_text="blue car"),
    ]
    single = [grounding(r) for r in reqs]
    sizes = _count_groups(grounding, monkeypatch)
    batch = grounding.batch_call(reqs)
    assert sorted(sizes) == [1, 3]  # the 64x64 image resizes to another shape: its own call
    for s, b in zip(single, batch, strict=True):
        assert b.ok and b.plumbing_only and b.text == s.text
        assert b.data["boxes"] == s.data["boxes"] and b.data["phrases"] == s.data["phrases"]
        np.testing.assert_allclose(b.data["scores"], s.data["scores"], atol=1e-3)


def test_grounding_bad_request_fails_alone(grounding):
    good = _req("Grounding", image=_drawing(96, 64, 0), reference_text="red ball")
    no_image = _req("Grounding", reference_text="red ball")
    out = grounding.batch_call([good, no_image, good])
    assert [r.ok for r in out] == [True, False, True]
    assert out[1].error_code == "tool_exception" and "KeyError" in out[1].text
    assert out[0].data == out[2].data == grounding(good).data


# ------------------------------------------------------------------------------------------ SAM


@pytest.fixture(scope="module")
def sam(tiny_dir):
    return build_backend("sam-tiny", {"cache_dir": str(tiny_dir)})


def test_sam_batch_matches_single_calls_across_sizes(sam, monkeypatch):
    reqs = [
        _req("SAM", image=_drawing(96, 64, 0), bbox=[100.0, 100.0, 600.0, 800.0]),
        _req("SAM", image=_drawing(50, 80, 1), bbox=[0.0, 0.0, 1000.0, 1000.0]),
        _req("SAM", image=_drawing(96, 64, 2), bbox=[500.0, 500.0, 500.0, 900.0]),  # zero width: fails alone
        _req("SAM", image=_drawing(120, 40, 3, "RGBA"), bbox=[10.0, 10.0, 400.0, 990.0]),
    ]
    sizes = _count_groups(sam, monkeypatch)
    batch = sam.batch_call(reqs)
    assert sizes == [3]  # every image is padded to the same frame: one call for all valid ones
    assert not batch[2].ok and batch[2].error_code == "empty_bbox"
    for i in (0, 1, 3):
        s, b = sam(reqs[i]), batch[i]
        assert b.ok and b.plumbing_only and b.image.mode == "L" and b.image.size == reqs[i].images["image"].size
        # A borderline logit may flip a pixel between batched and single float math; no more.
        agree = (np.asarray(s.image) == np.asarray(b.image)).mean()
        assert agree > 0.999, agree
        assert abs(b.data["score"] - s.data["score"]) < 1e-3 and b.data["bbox_pixels"] == s.data["bbox_pixels"]


def test_failed_model_call_retries_its_group_one_by_one(sam, monkeypatch):
    """If the batched forward pass itself raises, each request is retried alone, so one that
    breaks the model fails by itself and the others still get their masks."""

    def boom(group):
        raise RuntimeError("simulated out of memory")

    monkeypatch.setattr(sam, "_run_group", boom)
    good = _req("SAM", image=_drawing(96, 64, 0), bbox=[100.0, 100.0, 600.0, 800.0])
    out = sam.batch_call([good, _req("SAM", image=_drawing(96, 64, 1), bbox=[0.0, 0.0, 1000.0, 1000.0])])
    assert [r.ok for r in out] == [True, True]
    assert np.array_equal(np.asarray(out[0].image), np.asarray(sam(good).image))


# --------------------------------------------------------------------------------- FLUX.2 klein


@pytest.fixture(scope="module")
def flux(tiny_dir):
    pytest.importorskip("diffusers")
    return build_backend("flux2-tiny", {"cache_dir": str(tiny_dir), "seed": 0, "steps": 2})


def test_flux_generation_batch_matches_single_calls(flux, monkeypatch):
    edit = _req("ImageEdit", image=_drawing(80, 64, 5), edit_prompt="make it blue")
    reqs = [
        _req("ImageGeneration", prompt="a red ball"),
        _req("ImageGeneration", prompt="a cat on a long table in a house with a blue sky"),
        edit,
        _req("ImageGeneration", prompt="sky"),
        _req("Grounding", image=_drawing(64, 64, 0), reference_text="x"),  # not this backend's tool
    ]
    single = [flux(r) for r in reqs[:4]]
    sizes = _count_groups(flux, monkeypatch)
    batch = flux.batch_call(reqs)
    assert sorted(sizes) == [1, 3]  # the generations together, the edit alone
    assert not batch[4].ok and batch[4].error_code == "wrong_backend"
    for s, b in zip(single, batch[:4]):
        assert b.ok and b.plumbing_only and b.text == s.text and b.data == s.data
        # Same seed per prompt, so the same starting noise; only float rounding may differ.
        _assert_same_image(s.image, b.image, max_diff=2)


# ---------------------------------------------------------------------- Real-ESRGAN (PyTorch)


def _small_pth(tmp_path: Path) -> Path:
    """A one-block x4 RRDBNet with fixed random weights, saved as BasicSR saves one."""
    import torch

    from tests.toolserver.test_sr_torch import basicsr_state, small_net

    path = tmp_path / "small_x4.pth"
    torch.save({"params_ema": basicsr_state(small_net())}, path)
    return path


@pytest.mark.parametrize("tile", [0, 16])
def test_realesrgan_torch_batch_matches_single_calls(tmp_path, monkeypatch, tile):
    sr = build_backend("realesrgan-torch", {"model_path": str(_small_pth(tmp_path)), "tile": tile, "device": "cpu"})
    reqs = [
        _req("SR", image=_drawing(24, 16, 0)),
        _req("SR", image=_drawing(16, 16, 1)),  # another size: another group
        _req("SR", image=_drawing(24, 16, 2, "RGBA")),  # alpha is upscaled apart and re-attached
        _req("SR"),  # no image: fails alone
        _req("SR", image=_drawing(24, 16, 4, "L")),
    ]
    single = [sr(r) for i, r in enumerate(reqs) if i != 3]
    sizes = _count_groups(sr, monkeypatch)
    batch = sr.batch_call(reqs)
    assert sorted(sizes) == [1, 3]
    assert not batch[3].ok and batch[3].error_code == "tool_exception"
    for s, b in zip(single, [r for i, r in enumerate(batch) if i != 3]):
        assert b.ok and b.text == s.text and b.data == s.data and b.image.mode == s.image.mode
        _assert_same_image(s.image, b.image, max_diff=1)


# ------------------------------------------------------------------------------- Ray Serve


class _BatchSpy:
    """The tiny Grounding backend, noting in each result how many requests its batch held, so
    the served test can see that Serve really grouped the concurrent calls."""

    plumbing_only = True

    def __init__(self, **params):
        self.backend = build_backend("grounding-tiny", params)

    def __call__(self, request):
        result = self.backend(request)
        result.data["served_batch"] = 1
        return result

    def batch_call(self, requests):
        results = self.backend.batch_call(requests)
        for r in results:
            r.data["served_batch"] = len(requests)
        return results


def batch_spy(**params) -> _BatchSpy:
    return _BatchSpy(**params)


def _served_concurrently(cfg, reqs: list[ToolRequest], batched_tool: str) -> list:
    """Deploy `cfg` on a fresh local Ray, check `batched_tool` is served batched, call it once
    (a lazy backend loads there, so the calls that follow arrive together), then send every
    request at once from its own thread; the results in request order."""
    from concurrent.futures import ThreadPoolExecutor

    ray = pytest.importorskip("ray")
    from ray import serve

    from toolserver.client import RayToolbox
    from toolserver.serve_app import deploy

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        deploy(cfg)
        handle = serve.get_deployment_handle(batched_tool, app_name=cfg.app_name)
        assert handle.describe.remote().result()["batched"] is True
        box = RayToolbox(app_name=cfg.app_name)
        try:
            box.call(reqs[0])
            with ThreadPoolExecutor(len(reqs)) as pool:
                return list(pool.map(box.call, reqs))
        finally:
            box.close()
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.mark.ray
def test_served_grounding_batches_concurrent_calls(tiny_dir, grounding, monkeypatch):
    """The app builder with max_batch_size > 1 and a backend that has batch_call: concurrent
    callers are served in batches and each gets the answer a single local call gives."""
    pytest.importorskip("ray")
    from toolserver.serve_config import ServeConfig

    # The replica imports the spy from this module by name; Ray's workers inherit PYTHONPATH.
    root = str(Path(__file__).resolve().parents[2])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
    params = {"cache_dir": str(tiny_dir), "box_threshold": 0.0, "text_threshold": 0.0, "max_detections": 5}
    cfg = ServeConfig.from_dict(
        {
            "app_name": "batch_test",
            "pure_mode": "caller",  # no pure-tool deployments: only Grounding and the ingress start
            "http": {"enabled": False, "ray_actor_options": {"num_cpus": 0.05}},
            "defaults": {"ray_actor_options": {"num_cpus": 0.05}},
            "tools": {
                "Grounding": {
                    "backend": f"{__name__}:batch_spy",
                    "params": params,
                    "max_batch_size": 4,
                    "batch_wait_timeout_s": 0.5,
                }
            },
        }
    )
    texts = ["red ball", "sky", "a cat . a dog", "car", "green tree", "text"]
    reqs = [_req("Grounding", image=_drawing(96, 64, i), reference_text=t) for i, t in enumerate(texts)]
    expected = [grounding(r) for r in reqs]
    got = _served_concurrently(cfg, reqs, batched_tool="Grounding")
    assert all(g.ok and g.plumbing_only for g in got), got
    assert max(g.data["served_batch"] for g in got) > 1
    for e, g in zip(expected, got):
        assert g.data["boxes"] == e.data["boxes"] and g.data["phrases"] == e.data["phrases"]


@pytest.mark.ray
def test_a_replica_runs_max_concurrent_batches_at_once():
    """With max_concurrent_batches 2, calls that miss a running batch start in a second batch at
    once: the replica holds more calls than one batch takes."""
    pytest.importorskip("ray")
    from toolserver.serve_config import ServeConfig

    cfg = ServeConfig.from_dict(
        {
            "app_name": "concurrent_batches_test",
            "pure_mode": "caller",
            "http": {"enabled": False, "ray_actor_options": {"num_cpus": 0.05}},
            "defaults": {"ray_actor_options": {"num_cpus": 0.05}},
            "tools": {
                "ImageEdit": {
                    "backend": "latency",
                    "params": {"latency_s": 1.0, "stats_key": "concurrent_batches"},
                    "max_batch_size": 2,
                    "batch_wait_timeout_s": 0.05,
                    "max_concurrent_batches": 2,
                    "max_ongoing_requests": 4,
                }
            },
        }
    )
    reqs = [_req("ImageEdit", image=_drawing(32, 32, i), edit_prompt="x") for i in range(4)]
    got = _served_concurrently(cfg, reqs, batched_tool="ImageEdit")
    assert all(g.ok for g in got), got
    assert max(g.data["batch_size"] for g in got) <= 2
    assert max(g.data["in_flight"] for g in got) > 2  # one batch at a time holds at most 2
