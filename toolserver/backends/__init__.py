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
BACKEND_FACTORIES: dict[str, str] = {}


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
