"""The latency backend: holds calls for their latency, counts calls held at once, refuses bad params."""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from toolserver.config import ToolsConfig
from toolserver.backends import build_backend
from toolserver.backends.latency import latency_stats, reset_latency_stats
from toolserver.registry import OutputKind
from toolserver.request import ToolRequest
from toolserver.toolbox import LocalToolbox


def _edit(img: Image.Image) -> ToolRequest:
    return ToolRequest("ImageEdit", {"image": "img_1", "edit_prompt": "x"}, images={"image": img})


def test_concurrent_calls_overlap_and_are_counted():
    stats = reset_latency_stats("t-overlap")
    fn = build_backend("latency", {"latency_s": 0.2, "stats_key": "t-overlap"})
    img = Image.new("RGB", (16, 12), (10, 20, 30))
    results = [None] * 8

    def one(k: int) -> None:
        results[k] = fn(_edit(img))

    threads = [threading.Thread(target=one, args=(k,)) for k in range(8)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    assert 0.2 <= wall < 0.2 * 8 / 2  # overlapped: far less than 8 serial calls
    snap = stats.snapshot()
    assert snap["calls"] == 8 and snap["in_flight"] == 0
    assert snap["max_in_flight"] >= 4  # 8 threads started together; at least half were held at once
    assert snap["held_s"] >= 8 * 0.2 * 0.95
    for r in results:
        assert r.ok and r.plumbing_only and r.kind is OutputKind.IMAGE
        assert r.image.size == (16, 12) and r.image.getpixel((0, 0)) == (10, 20, 30)


def test_serial_calls_see_one_in_flight_and_take_latency_each():
    stats = reset_latency_stats("t-serial")
    fn = build_backend("latency", {"latency_s": 0.05, "stats_key": "t-serial"})
    t0 = time.perf_counter()
    for _ in range(4):
        fn(_edit(Image.new("RGB", (8, 8))))
    assert time.perf_counter() - t0 >= 4 * 0.05
    assert stats.snapshot()["max_in_flight"] == 1


def test_batch_call_holds_a_batch_once_and_counts_each_request():
    stats = reset_latency_stats("t-batch")
    fn = build_backend("latency", {"latency_s": 0.1, "stats_key": "t-batch"})
    t0 = time.perf_counter()
    out = fn.batch_call([_edit(Image.new("RGB", (8, 8))) for _ in range(5)])
    assert time.perf_counter() - t0 < 0.1 * 3
    assert [r.data["batch_size"] for r in out] == [5] * 5
    assert stats.snapshot()["max_in_flight"] == 5 and stats.snapshot()["batches"] == [5]


def test_generation_without_input_returns_a_flat_image_and_text_tools_text():
    fn = build_backend("latency", {"latency_s": 0.0, "size": 24, "stats_key": "t-kinds"})
    gen = fn(ToolRequest("ImageGeneration", {"prompt": "a cat"}))
    assert gen.ok and gen.image.size == (24, 24)
    ocr = fn(ToolRequest("OCR", {"image": "img_1"}, images={"image": Image.new("RGB", (8, 8))}))
    assert ocr.ok and ocr.image is None and "plumbing only" in ocr.text


@settings(max_examples=40, deadline=None)
@given(latency=st.floats(allow_nan=True, allow_infinity=True), jitter=st.floats(allow_nan=True, allow_infinity=True))
def test_bad_params_are_refused(latency, jitter):
    ok = 0 <= latency <= 600 and 0 <= jitter <= 600
    if ok:
        build_backend("latency", {"latency_s": latency, "jitter_s": jitter})
    else:
        with pytest.raises(ValueError):
            build_backend("latency", {"latency_s": latency, "jitter_s": jitter})


def test_unknown_param_is_refused():
    with pytest.raises(ValueError, match="unknown params"):
        build_backend("latency", {"latency": 0.5})


def test_jitter_stays_in_range_and_is_seeded():
    a = build_backend("latency", {"latency_s": 0.3, "jitter_s": 0.1, "seed": 3})
    b = build_backend("latency", {"latency_s": 0.3, "jitter_s": 0.1, "seed": 3})
    da, db = [a._delay() for _ in range(50)], [b._delay() for _ in range(50)]
    assert da == db and all(0.2 <= d <= 0.4 for d in da) and len(set(da)) > 1


def test_latency_tools_config_routes_model_tools_through_it():
    cfg = ToolsConfig.load("latency")
    assert cfg.max_concurrent_calls == 32 and cfg.concurrency["ImageEdit"] == 16
    box = LocalToolbox.from_config(cfg)
    reset_latency_stats("ImageEdit")
    res = box.call(_edit(Image.new("RGB", (8, 8))))
    assert res.ok and res.backend == "latency" and latency_stats("ImageEdit").snapshot()["calls"] == 1


def test_latency_is_never_a_default():
    for name in ("offline", "offline_plumbing", "paper_gpu"):
        cfg = ToolsConfig.load(name)
        assert all(b.name != "latency" for b in cfg.backends.values()), name


@pytest.mark.parametrize("bad", [{"max_concurrent_calls": 0}, {"concurrency": {"ImageEdit": 0}}, {"concurrency": {"Nope": 2}},
                                 {"concurrency": {"ImageEdit": True}}])
def test_tools_config_refuses_bad_concurrency(tmp_path, bad):
    import yaml

    p = tmp_path / "t.yaml"
    p.write_text(yaml.safe_dump({"profile": "canvascraft", "client": "local", **bad}))
    with pytest.raises(ValueError, match="concurrency|max_concurrent_calls"):
        ToolsConfig.load(str(p))
