"""OCR backends.

* ``rapidocr`` (default): rapidocr 3.x ships the PP-OCRv6 small det/rec and a cls model as ONNX
  in its wheel, so it works offline. It does not declare onnxruntime; the project depends on it.
* ``paddleocr``: the full PaddleOCR pipeline, from local model directories (it cannot fetch
  models offline); a missing model gives a clear error, not a network traceback.

Text layout (``text_format``):

* ``lines`` (default): the recognised text, one detected line per line, top to bottom.
* ``public``: the layout of the public CanvasAgent OCR tool, with per-line confidence and box.

``data`` always holds ``lines``, ``scores`` and ``boxes`` (pixel ``[xmin, ymin, xmax, ymax]``).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from PIL import Image

from toolserver.backends._base import (
    BackendUnavailable,
    LazyModelBackend,
    forget_shared,
    parse_params,
    require,
    return_freed_memory,
    shared,
    to_rgb,
)
from toolserver.registry import OutputKind
from toolserver.request import ToolRequest
from toolserver.results import ToolResult

log = logging.getLogger(__name__)

NO_TEXT = "OCR completed but no text was detected."
TEXT_FORMATS = ("lines", "public")


@dataclass
class OcrLines:
    lines: list[str]
    scores: list[float]
    boxes: list[list[int]]  # pixel [xmin, ymin, xmax, ymax]


def _xyxy(points: Any) -> list[int]:
    pts = np.asarray(points, dtype=float).reshape(-1, 2)
    return [int(round(pts[:, 0].min())), int(round(pts[:, 1].min())), int(round(pts[:, 0].max())), int(round(pts[:, 1].max()))]


def merge_line_fragments(found: OcrLines, max_gap: float = 1.0, min_overlap: float = 0.6) -> OcrLines:
    """Join detections that are pieces of one text line (PP-OCR's detector splits a line into
    words on wide, short images). Two boxes are one line when they overlap vertically by
    `min_overlap` of the smaller height and the horizontal gap is at most `max_gap` line
    heights; farther apart they stay separate (columns, labels)."""
    order = sorted(range(len(found.lines)), key=lambda i: (found.boxes[i][1] + found.boxes[i][3]) / 2)
    groups: list[list[int]] = []
    for i in order:
        x0, y0, x1, y1 = found.boxes[i]
        for g in groups:
            gx0, gy0, gx1, gy1 = _union([found.boxes[j] for j in g])
            overlap = min(y1, gy1) - max(y0, gy0)
            height = min(y1 - y0, gy1 - gy0)
            gap = max(x0 - gx1, gx0 - x1)
            if height > 0 and overlap >= min_overlap * height and gap <= max_gap * height:
                g.append(i)
                break
        else:
            groups.append([i])
    merged = OcrLines([], [], [])
    for g in sorted(groups, key=lambda g: (_union([found.boxes[j] for j in g])[1], _union([found.boxes[j] for j in g])[0])):
        g.sort(key=lambda j: found.boxes[j][0])
        merged.lines.append(" ".join(found.lines[j] for j in g))
        merged.scores.append(min(found.scores[j] for j in g))
        merged.boxes.append(_union([found.boxes[j] for j in g]))
    return merged


def _union(boxes: list[list[int]]) -> list[int]:
    return [min(b[0] for b in boxes), min(b[1] for b in boxes), max(b[2] for b in boxes), max(b[3] for b in boxes)]


def format_ocr(found: OcrLines, text_format: str) -> str:
    if not found.lines:
        return NO_TEXT
    if text_format == "public":
        rows = [f"'{t}' (confidence: {s:.2f}, box: {b})" for t, s, b in zip(found.lines, found.scores, found.boxes)]
        return f"OCR Results ({len(rows)} text regions found):\n" + "\n".join(rows)
    return "\n".join(found.lines)


class _OcrBackend(LazyModelBackend):
    """What the OCR backends share: the `text_format` check and the tool call on `recognise`."""

    def __init__(self, params: Any):
        if params.text_format not in TEXT_FORMATS:
            raise ValueError(f"text_format must be one of {TEXT_FORMATS}, got {params.text_format!r}")
        super().__init__(params)

    def recognise(self, image: Image.Image) -> OcrLines:
        raise NotImplementedError

    def __call__(self, request: ToolRequest) -> ToolResult:
        found = self.recognise(request.images["image"])
        return ToolResult(
            ok=True,
            text=format_ocr(found, self.params.text_format),
            kind=OutputKind.TEXT,
            data={"lines": found.lines, "boxes": found.boxes, "scores": found.scores},
            backend=self.name,
        )


@dataclass
class RapidOcrParams:
    text_format: str = "lines"
    text_score: float = 0.5  # rapidocr's own default: lines recognised below this are dropped
    merge_lines: bool = True  # join word fragments of one line (see merge_line_fragments)
    # Detector input size. rapidocr's default ("min", 736) upscales until the short side is 736
    # px (a 72x700 banner 10x): 6/24 one-line banners read, 2.4 s each. Capping the long side:
    # 24/24, 0.12 s each, and the same results on multi-line and large images.
    det_limit_type: str = "max"
    det_limit_side_len: int = 2000
    use_cls: bool = True  # text-line orientation classifier (rotated text)
    threads: int = 0  # onnxruntime intra-op threads; 0 = onnxruntime's choice
    # Optional local ONNX files replacing the shipped PP-OCRv6 ones.
    det_model_path: str | None = None
    rec_model_path: str | None = None
    cls_model_path: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # raw rapidocr params ("Det.box_thresh": 0.5, ...)


class RapidOcrBackend(_OcrBackend):
    name = "rapidocr"

    def _key(self) -> tuple[Any, ...]:
        p = self.params
        return ("rapidocr", p.text_score, p.use_cls, p.threads, p.det_limit_type, p.det_limit_side_len, p.det_model_path, p.rec_model_path, p.cls_model_path, repr(sorted(p.extra.items())))

    def _load(self) -> tuple[Any, threading.Lock]:
        # Backends differing only in text layout share one engine (and its lock: rapidocr
        # keeps per-call state in its preprocessing objects).
        return shared(self._key(), lambda: (self._create(), threading.Lock()))

    def close(self) -> None:
        """Release this backend's engine (the onnxruntime sessions go once no other backend
        holds them); a later call loads one again."""
        forget_shared(self._key())
        if self._model.reset():
            return_freed_memory()

    def _create(self) -> Any:
        rapidocr = require("rapidocr", "pip install 'rapidocr>=3' onnxruntime")
        require("onnxruntime", "pip install onnxruntime (rapidocr does not declare it)")
        p = self.params
        cfg: dict[str, Any] = {
            "Global.log_level": "error",
            "Global.text_score": p.text_score,
            "Global.use_cls": p.use_cls,
            "Det.limit_type": p.det_limit_type,
            "Det.limit_side_len": p.det_limit_side_len,
        }
        if p.threads:
            cfg["EngineConfig.onnxruntime.intra_op_num_threads"] = p.threads
        for key, path in (("Det", p.det_model_path), ("Rec", p.rec_model_path), ("Cls", p.cls_model_path)):
            if path:
                if not Path(path).is_file():
                    raise BackendUnavailable(f"rapidocr {key} model {path!r} does not exist")
                cfg[f"{key}.model_path"] = path
        cfg.update(p.extra)
        try:
            return rapidocr.RapidOCR(params=cfg)
        except Exception as e:  # e.g. a model type not shipped in the wheel: rapidocr tries to download it
            raise BackendUnavailable(f"rapidocr failed to initialise ({type(e).__name__}: {e}); the shipped models need no download") from e

    def recognise(self, image: Image.Image) -> OcrLines:
        engine, lock = self._model.get()
        with lock:
            out = engine(to_rgb(image))
        txts: Sequence[str] = out.txts or ()
        scores = [round(float(s), 4) for s in (out.scores or ())]
        boxes = [_xyxy(b) for b in (out.boxes if out.boxes is not None else ())]
        found = OcrLines(list(txts), scores, boxes)
        return merge_line_fragments(found) if self.params.merge_lines else found

    # No batch_call: RapidOCR's __call__ takes one image, and detection (the bulk of the time)
    # runs per image, so batching requests would be a loop under the same lock.


def rapidocr(**params: Any) -> RapidOcrBackend:
    return RapidOcrBackend(parse_params(RapidOcrParams, params, "rapidocr"))


@dataclass
class PaddleOcrParams:
    text_format: str = "lines"
    text_detection_model_dir: str | None = None
    text_recognition_model_dir: str | None = None
    text_detection_model_name: str | None = None  # e.g. PP-OCRv5_server_det; must match the dir
    text_recognition_model_name: str | None = None
    lang: str | None = None
    device: str | None = None  # "gpu:0", "cpu"; PaddleOCR's own default when None
    use_textline_orientation: bool = False
    text_score: float = 0.5  # drop lines recognised below this, like rapidocr does
    merge_lines: bool = True
    extra: dict[str, Any] = field(default_factory=dict)  # further PaddleOCR(...) keyword arguments


class PaddleOcrBackend(_OcrBackend):
    name = "paddleocr"

    def __init__(self, params: PaddleOcrParams):
        super().__init__(params)
        self._lock = threading.Lock()  # PaddleOCR pipelines are not documented as thread-safe

    def _load(self) -> Any:
        paddleocr = require("paddleocr", "pip install paddleocr paddlepaddle (or paddlepaddle-gpu)")
        p = self.params
        kwargs: dict[str, Any] = {
            # The document preprocessing models are extra downloads and irrelevant to tool images.
            "use_doc_orientation_classify": False,
            "use_doc_unwarping": False,
            "use_textline_orientation": p.use_textline_orientation,
        }
        for key in ("text_detection_model_dir", "text_recognition_model_dir", "text_detection_model_name",
                    "text_recognition_model_name", "lang", "device"):
            value = getattr(p, key)
            if key.endswith("_dir") and value is not None and not Path(value).is_dir():
                raise BackendUnavailable(f"paddleocr {key} {value!r} is not a directory")
            if value is not None:
                kwargs[key] = value
        kwargs.update(p.extra)
        try:
            return paddleocr.PaddleOCR(**kwargs)
        except Exception as e:
            raise BackendUnavailable(
                f"PaddleOCR could not be created ({type(e).__name__}: {e}). Offline it cannot download models: "
                "set text_detection_model_dir and text_recognition_model_dir to local PP-OCR model directories"
            ) from e

    def recognise(self, image: Image.Image) -> OcrLines:
        engine = self._model.get()
        bgr = np.ascontiguousarray(np.asarray(to_rgb(image))[:, :, ::-1])  # Paddle follows OpenCV's BGR
        with self._lock:
            pages = list(engine.predict(bgr))
        found = OcrLines([], [], [])
        for page in pages:
            # PaddleOCR 3.x results are dict subclasses; older ones expose the dict under .json["res"].
            res = page if isinstance(page, dict) else page.json["res"]
            polys = res.get("rec_polys") if res.get("rec_polys") is not None else res.get("dt_polys", [])
            for text, score, poly in zip(res.get("rec_texts", []), res.get("rec_scores", []), polys):
                if float(score) < self.params.text_score:
                    continue
                found.lines.append(str(text))
                found.scores.append(round(float(score), 4))
                found.boxes.append(_xyxy(poly))
        return merge_line_fragments(found) if self.params.merge_lines else found

    # No batch_call: whether PaddleOCR 3's predict() stacks differently sized pages into one
    # forward pass is unverified (it cannot be tested offline); a mere loop would add nothing.


def paddleocr(**params: Any) -> PaddleOcrBackend:
    return PaddleOcrBackend(parse_params(PaddleOcrParams, params, "paddleocr"))
