"""Policy models: the tiny offline Qwen3-VL builder and the shared model/processor loaders.

Names are resolved lazily (PEP 562) so that ``from canvasagent.core.models.special_tokens import ...``
or ``from canvasagent.core.models import PROTOCOL_TOKENS`` does not import torch or transformers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS: dict[str, str] = {
    "ModelUnavailableError": "canvasagent.core.models.loading",
    "ensure_token_capacity": "canvasagent.core.models.loading",
    "force_torch_image_outputs": "canvasagent.core.models.loading",
    "load_policy": "canvasagent.core.models.loading",
    "load_processor": "canvasagent.core.models.loading",
    "PROTOCOL_TOKENS": "canvasagent.core.models.special_tokens",
    "add_protocol_tokens": "canvasagent.core.models.special_tokens",
    "TinyQwen3VLSpec": "canvasagent.core.models.tiny",
    "build_tiny_qwen3vl": "canvasagent.core.models.tiny",
    "build_tiny_tokenizer": "canvasagent.core.models.tiny",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # for type checkers and IDEs
    from canvasagent.core.models.loading import (
        ModelUnavailableError,
        ensure_token_capacity,
        force_torch_image_outputs,
        load_policy,
        load_processor,
    )
    from canvasagent.core.models.special_tokens import PROTOCOL_TOKENS, add_protocol_tokens
    from canvasagent.core.models.tiny import TinyQwen3VLSpec, build_tiny_qwen3vl, build_tiny_tokenizer


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # cache: later lookups skip __getattr__
    return value
