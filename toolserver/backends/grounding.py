"""Grounding with a zero-shot object detector from transformers (Grounding-DINO by default).

Any checkpoint under ``AutoModelForZeroShotObjectDetection`` whose processor has
``post_process_grounded_object_detection`` works, by hub id or local path, on a CPU-only torch
too (transformers then resolves the PIL image processor, so torchvision is not needed). Output
follows the public CanvasAgent Grounding tool: boxes ``[xmin, ymin, xmax, ymax]`` as integers
in 0-1000 (the coordinates SAM and Crop take), thresholds 0.35 (box) / 0.25 (text).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

from PIL import Image

from toolserver.backends._base import (
    LazyModelBackend,
    hf_from_pretrained,
    mark_plumbing,
    parse_params,
    require,
    resolve_device,
    resolve_dtype,
    run_batched,
    shared,
    tiny_meta,
    to_rgb,
)
from toolserver.registry import OutputKind
from toolserver.request import ToolRequest
from toolserver.results import ToolResult

log = logging.getLogger(__name__)

DEFAULT_MODEL = "IDEA-Research/grounding-dino-base"
_SPECIAL_TOKENS = ("[CLS]", "[SEP]", "[PAD]", "[UNK]", "[MASK]")


@dataclass
class GroundingParams:
    model: str = DEFAULT_MODEL  # hub id or local directory
    box_threshold: float = 0.35
    text_threshold: float = 0.25
    max_detections: int = 100  # keep the best N; a real model rarely passes the threshold this often
    device: str = "auto"
    dtype: str = "float32"  # the deformable-attention kernels are most reliable in fp32
    plumbing_only: bool = False  # forced on for tiny random-weight checkpoints


@dataclass
class Detection:
    phrase: str
    box: list[int]  # [xmin, ymin, xmax, ymax] in 0-1000
    score: float


def prompt_text(reference_text: str) -> str:
    """Grounding-DINO separates categories with ' . ' and expects the prompt to end with '.'."""
    text = reference_text.strip()
    return text if text.endswith(".") else f"{text} ."


def clean_phrase(label: str, fallback: str) -> str:
    for tok in _SPECIAL_TOKENS:
        label = label.replace(tok, " ")
    label = " ".join(label.split()).strip(" .")
    return label or fallback


def to_1000(box: Any, width: int, height: int, normalised: bool) -> list[int]:
    x0, y0, x1, y1 = (float(v) for v in box)
    if not normalised:
        x0, x1, y0, y1 = x0 / width, x1 / width, y0 / height, y1 / height
    return [min(max(round(v * 1000), 0), 1000) for v in (x0, y0, x1, y1)]


def format_detections(dets: list[Detection], reference_text: str) -> str:
    if not dets:
        return f"No objects matching '{reference_text}' were found in the image."
    rows = "".join(f"  - '{d.phrase}': {d.box} (confidence: {d.score:.2f})\n" for d in dets)
    return f"Found {len(dets)} objects:\n{rows}"


class GroundingBackend(LazyModelBackend):
    name = "grounding-dino"

    def __init__(self, params: GroundingParams):
        super().__init__(params)
        self.plumbing_only = params.plumbing_only or tiny_meta(params.model) is not None

    def _load(self) -> tuple[Any, Any, str, threading.Lock]:
        p = self.params
        transformers = require("transformers", "pip install 'transformers>=5'")
        device = resolve_device(p.device)
        dtype = resolve_dtype(p.dtype, device)

        def build() -> tuple[Any, Any, str, threading.Lock]:
            processor = hf_from_pretrained(transformers.AutoProcessor.from_pretrained, p.model, "the Grounding processor")
            model = hf_from_pretrained(transformers.AutoModelForZeroShotObjectDetection.from_pretrained, p.model, "the Grounding model", dtype=dtype)
            if not hasattr(processor, "post_process_grounded_object_detection"):
                raise ValueError(f"{p.model!r} has no post_process_grounded_object_detection; use a Grounding-DINO-style checkpoint")
            log.info("loaded Grounding model %s on %s (%s)", p.model, device, dtype)
            # The lock goes with the shared model, so every backend using it serialises on it.
            return processor, model.to(device).eval(), device, threading.Lock()

        return shared(("grounding", p.model, device, str(dtype)), build)

    def detect(self, image: Image.Image, reference_text: str) -> list[Detection]:
        return self._detect_group([self._inputs(image, reference_text)])[0]

    def _detections(self, res: dict[str, Any], rgb: Image.Image, reference_text: str) -> list[Detection]:
        # "labels" is deprecated (and warns when read) where "text_labels" exists.
        labels = res["text_labels"] if "text_labels" in res else res.get("labels", [])
        dets = [
            Detection(clean_phrase(str(lab), reference_text.strip()), to_1000(box.tolist(), rgb.width, rgb.height, normalised=True), float(score))
            for box, score, lab in zip(res["boxes"], res["scores"], labels)
        ]
        dets.sort(key=lambda d: d.score, reverse=True)
        return dets[: self.params.max_detections]

    def _result(self, dets: list[Detection], text: str) -> ToolResult:
        result = ToolResult(
            ok=True,
            text=format_detections(dets, text),
            kind=OutputKind.BOXES,
            data={"boxes": [d.box for d in dets], "phrases": [d.phrase for d in dets], "scores": [round(d.score, 4) for d in dets]},
            backend=self.name,
        )
        return mark_plumbing(result, self.plumbing_only)

    def __call__(self, request: ToolRequest) -> ToolResult:
        text = str(request.args["reference_text"])
        return self._result(self.detect(request.images["image"], text), text)

    def _inputs(self, image: Image.Image, text: str) -> _Prepared:
        processor, model, _, _ = self._model.get()
        rgb = to_rgb(image)
        # Each image is resized on its own, so it is never padded: the processor would pad a
        # mixed-size batch to its largest image, and Swin's windows and convolutions over that
        # padding (and pred_boxes relative to the padded frame) would change the detections.
        pixels = processor.image_processor(images=rgb, return_tensors="pt")
        return _Prepared(rgb, text, pixels["pixel_values"].to(model.dtype), pixels["pixel_mask"])

    def _detect_group(self, group: list[_Prepared]) -> list[list[Detection]]:
        """The detections of each of `group` (`_inputs` of one call each), in one model call."""
        import torch

        processor, model, device, lock = self._model.get()
        # Text padding is harmless: Grounding-DINO's text self-attention is block-diagonal over
        # the phrases of each prompt, and padded tokens are masked out of fusion, the decoder
        # and the logits, so a prompt's detections do not depend on its batch-mates' lengths.
        tokens = processor.tokenizer([prompt_text(p.text) for p in group], padding="longest", return_token_type_ids=True, return_tensors="pt")
        inputs = {
            **tokens,
            "pixel_values": torch.cat([p.pixel_values for p in group]),
            "pixel_mask": torch.cat([p.pixel_mask for p in group]),
        }
        inputs = {k: v.to(device) for k, v in inputs.items()}
        with lock, torch.inference_mode():
            outputs = model(**inputs)
        # Without target_sizes the boxes come back relative (0-1) as xyxy: exactly what 0-1000 needs.
        found = processor.post_process_grounded_object_detection(
            outputs, inputs["input_ids"], threshold=self.params.box_threshold, text_threshold=self.params.text_threshold
        )
        return [self._detections(res, p.rgb, p.text) for res, p in zip(found, group)]

    def _prepare(self, request: ToolRequest) -> _Prepared:
        text = str(request.args["reference_text"])
        return self._inputs(request.images["image"], text)

    def _run_group(self, group: list[_Prepared]) -> list[ToolResult]:
        return [self._result(dets, p.text) for dets, p in zip(self._detect_group(group), group)]

    def batch_call(self, requests: list[ToolRequest]) -> list[ToolResult]:
        """One model call per group of requests whose images resize to the same shape."""
        return run_batched(requests, self._prepare, lambda p: tuple(p.pixel_values.shape), self._run_group, self, self.name)


@dataclass
class _Prepared:
    rgb: Image.Image
    text: str
    pixel_values: Any  # (1, 3, H, W), already in the model's dtype
    pixel_mask: Any


def grounding_dino(**params: Any) -> GroundingBackend:
    return GroundingBackend(parse_params(GroundingParams, params, "grounding-dino"))
