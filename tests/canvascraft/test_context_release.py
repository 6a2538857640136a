"""A build's cached context (toolbox, models) does not outlive its use: a context for another
config closes the previous toolbox, and an in-process build releases its context when done."""

from __future__ import annotations

from PIL import Image

from canvascraft import context
from canvascraft.build import load_build_config, run_build
from toolserver.request import ToolRequest


def _ocr_backend(ctx):
    img = Image.new("RGB", (64, 32), "white")
    assert ctx.toolbox.call(ToolRequest(tool="OCR", args={"image": "img_1"}, images={"image": img})).ok
    backend = ctx.toolbox.backends["OCR"]._fn
    assert backend._model.loaded
    return backend


def test_a_new_config_closes_the_previous_toolbox():
    first = context.context_for(load_build_config("sft", None, seed=1))
    backend = _ocr_backend(first)
    second = context.context_for(load_build_config("sft", None, seed=2))
    assert second is not first and list(context._CACHE.values()) == [second]
    assert not backend._model.loaded and first.toolbox.backends["OCR"]._fn is None
    context.release_contexts()
    assert context._CACHE == {}


def test_in_process_build_releases_its_context(tmp_path):
    cfg = load_build_config("sft", None, n=2, seed=0, workers=1, mix={"single": 0, "hard": 0, "OCR": 1})
    manifest = run_build("sft", cfg, str(tmp_path / "sft"), progress=False)
    assert sum(s["rows"] for s in manifest["shards"].values()) >= 1
    assert context._CACHE == {}  # its toolbox (and OCR engine) went with it
