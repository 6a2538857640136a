"""SAM with a box prompt.

* ``sam``: transformers' `SamModel` / `SamProcessor` (hub id or local path); no torchvision needed.
* ``segment-anything``: Meta's package with an original checkpoint (``sam_vit_h_4b8939.pth``),
  as the public CanvasAgent code runs it. That package imports torchvision.

The bbox arrives in 0-1000 (the protocol's coordinates) and is scaled to pixels of the input
image; the processor then maps it onto its 1024-pixel frame. The mask comes back as an "L"
image the size of the input, 255 inside, which is what Extract and masked ImageEdit take.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from toolserver.backends._base import (
    BackendUnavailable,
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
from toolserver.results import ToolError, ToolResult

log = logging.getLogger(__name__)

DEFAULT_MODEL = "facebook/sam-vit-huge"  # the public code uses SAM vit_h


@dataclass
class SamParams:
    model: str = DEFAULT_MODEL
    # Predict 3 candidates and keep the best by predicted IoU: more robust to the loose boxes
    # Grounding produces than SAM's single box output.
    multimask: bool = True
    mask_threshold: float = 0.0  # on mask logits
    device: str = "auto"
    dtype: str = "float32"
    plumbing_only: bool = False


def bbox_to_pixels(bbox: list[float], width: int, height: int) -> list[float]:
    x0, y0, x1, y1 = (float(v) for v in bbox)
    px = [x0 * width / 1000, y0 * height / 1000, x1 * width / 1000, y1 * height / 1000]
    return [min(max(px[0], 0.0), width), min(max(px[1], 0.0), height), min(max(px[2], 0.0), width), min(max(px[3], 0.0), height)]


def sam_text(mask: np.ndarray, score: float, box_px: list[float]) -> str:
    area = int(mask.sum())
    ratio = area / mask.size if mask.size else 0.0
    box = [round(v, 1) for v in box_px]
    return (
        "Segmentation completed successfully.\n"
        f"  - Mask shape: {list(mask.shape)}\n"
        f"  - Confidence score: {score:.4f}\n"
        f"  - Mask area: {area} pixels ({ratio:.2%} of image)\n"
        f"  - Bounding box: {box}"
    )


class SamBackend(LazyModelBackend):
    name = "sam"

    def __init__(self, params: SamParams):
        super().__init__(params)
        self.plumbing_only = params.plumbing_only or tiny_meta(params.model) is not None

    def _load(self) -> tuple[Any, Any, str, threading.Lock]:
        import torch

        # Random or small weights on the padded part of the frame produce denormal floats, which
        # are ~10x slower on x86 CPUs (measured 100 s -> 9 s). Flushing them changes nothing visible.
        torch.set_flush_denormal(True)
        transformers = require("transformers", "pip install 'transformers>=5'")
        p = self.params
        device = resolve_device(p.device)
        dtype = resolve_dtype(p.dtype, device)

        def build() -> tuple[Any, Any, str, threading.Lock]:
            processor = hf_from_pretrained(transformers.SamProcessor.from_pretrained, p.model, "the SAM processor")
            model = hf_from_pretrained(transformers.SamModel.from_pretrained, p.model, "the SAM model", dtype=dtype)
            log.info("loaded SAM model %s on %s (%s)", p.model, device, dtype)
            # The lock goes with the shared model, so every backend using it serialises on it.
            return processor, model.to(device).eval(), device, threading.Lock()

        return shared(("sam", p.model, device, str(dtype)), build)

    def _inputs(self, image: Image.Image, bbox: list[float]) -> dict[str, Any]:
        processor, model, _, _ = self._model.get()
        rgb = to_rgb(image)
        box_px = _checked_box(bbox, rgb)
        # Processed one by one: the processor scales each box into its own image's frame.
        inputs = dict(processor(images=rgb, input_boxes=[[box_px]], return_tensors="pt"))
        inputs["pixel_values"] = inputs["pixel_values"].to(model.dtype)
        inputs["box_px"] = box_px
        return inputs

    def _segment_group(self, group: list[dict[str, Any]]) -> list[tuple[np.ndarray, float, list[float]]]:
        """(mask, score, pixel box) for each of `group` (`_inputs` of one call each), in one model call."""
        import torch

        processor, model, device, lock = self._model.get()
        batch = {k: torch.cat([p[k] for p in group]).to(device) for k in ("pixel_values", "input_boxes")}
        with lock, torch.inference_mode():
            out = model(**batch, multimask_output=self.params.multimask)
        masks = processor.image_processor.post_process_masks(
            out.pred_masks.float().cpu(),
            torch.cat([p["original_sizes"] for p in group]),
            torch.cat([p["reshaped_input_sizes"] for p in group]),
            mask_threshold=self.params.mask_threshold,
        )
        scores = out.iou_scores.float().cpu()
        # Per image, its first (only) box -> (n_candidates, H, W); the best candidate wins.
        return [_best(masks[i][0], scores[i, 0], p["box_px"]) for i, p in enumerate(group)]

    def segment(self, image: Image.Image, bbox: list[float]) -> tuple[np.ndarray, float, list[float]]:
        return self._segment_group([self._inputs(image, bbox)])[0]

    def __call__(self, request: ToolRequest) -> ToolResult:
        segmented = self.segment(request.images["image"], list(request.args["bbox"]))
        return mark_plumbing(_mask_result(*segmented, self.name), self.plumbing_only)

    def _prepare(self, request: ToolRequest) -> dict[str, Any]:
        return self._inputs(request.images["image"], list(request.args["bbox"]))

    def _run_group(self, group: list[dict[str, Any]]) -> list[ToolResult]:
        segmented = self._segment_group(group)
        return [mark_plumbing(_mask_result(*seg, self.name), self.plumbing_only) for seg in segmented]

    def batch_call(self, requests: list[ToolRequest]) -> list[ToolResult]:
        """One model call for the whole batch: every image is resized and padded to the same
        square frame (1024 px for the real models), whatever its size, so any mix batches. The
        key still checks the shape, in case a checkpoint's processor does not pad."""
        return run_batched(requests, self._prepare, lambda p: tuple(p["pixel_values"].shape), self._run_group, self, self.name)


def _checked_box(bbox: list[float], rgb: Image.Image) -> list[float]:
    box_px = bbox_to_pixels(bbox, rgb.width, rgb.height)
    if box_px[2] - box_px[0] < 1 or box_px[3] - box_px[1] < 1:
        raise ToolError("empty_bbox", f"bbox {bbox} covers no pixels of the {rgb.width}x{rgb.height} image")
    return box_px


def _best(masks: Any, scores: Any, box_px: list[float]) -> tuple[np.ndarray, float, list[float]]:
    """The candidate mask with the highest predicted IoU."""
    import torch

    best = int(torch.argmax(scores))
    return masks[best].numpy().astype(bool), float(scores[best]), box_px


def _mask_result(mask: np.ndarray, score: float, box_px: list[float], backend: str) -> ToolResult:
    return ToolResult(
        ok=True,
        text=sam_text(mask, score, box_px),
        kind=OutputKind.MASK,
        image=Image.fromarray(mask.astype(np.uint8) * 255),  # 2-D uint8 -> mode "L"
        data={"score": round(score, 4), "mask_area": int(mask.sum()), "bbox_pixels": [round(v, 1) for v in box_px]},
        backend=backend,
    )


def sam(**params: Any) -> SamBackend:
    return SamBackend(parse_params(SamParams, params, "sam"))


@dataclass
class SegmentAnythingParams:
    checkpoint: str | None = None  # e.g. weights/sam_vit_h_4b8939.pth
    model_type: str = "vit_h"  # vit_h | vit_l | vit_b, matching the checkpoint
    multimask: bool = True
    device: str = "auto"


class SegmentAnythingBackend(LazyModelBackend):
    name = "segment-anything"

    def __init__(self, params: SegmentAnythingParams):
        super().__init__(params)
        self._lock = threading.Lock()  # the predictor holds the current image's embedding

    def _load(self) -> Any:
        import torch

        torch.set_flush_denormal(True)
        p = self.params
        if not p.checkpoint or not Path(p.checkpoint).is_file():
            raise BackendUnavailable(f"the segment-anything backend needs params.checkpoint, a local SAM .pth file (got {p.checkpoint!r})")
        try:
            from segment_anything import SamPredictor, sam_model_registry
        except Exception as e:  # it imports torchvision, which may be missing or broken beside a CPU torch
            raise BackendUnavailable(
                f"segment-anything is not usable here ({type(e).__name__}: {e}); `pip install segment-anything` with a "
                "working torchvision, or use backend sam (transformers)"
            ) from e
        if p.model_type not in sam_model_registry:
            raise ValueError(f"model_type must be one of {sorted(sam_model_registry)}, got {p.model_type!r}")
        model = sam_model_registry[p.model_type](checkpoint=p.checkpoint)
        model.to(resolve_device(p.device)).eval()
        log.info("loaded segment-anything %s from %s", p.model_type, p.checkpoint)
        return SamPredictor(model)

    def segment(self, image: Image.Image, bbox: list[float]) -> tuple[np.ndarray, float, list[float]]:
        predictor = self._model.get()
        rgb = to_rgb(image)
        box_px = _checked_box(bbox, rgb)
        with self._lock:
            predictor.set_image(np.asarray(rgb), image_format="RGB")
            masks, scores, _ = predictor.predict(box=np.asarray(box_px), multimask_output=self.params.multimask)
        best = int(np.argmax(scores))
        return np.asarray(masks[best], dtype=bool), float(scores[best]), box_px

    def __call__(self, request: ToolRequest) -> ToolResult:
        return _mask_result(*self.segment(request.images["image"], list(request.args["bbox"])), self.name)


def segment_anything(**params: Any) -> SegmentAnythingBackend:
    return SegmentAnythingBackend(parse_params(SegmentAnythingParams, params, "segment-anything"))
