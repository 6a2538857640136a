"""Policy models: the tiny offline Qwen3-VL builder and the shared model/processor loaders.

Heavy imports (torch, transformers) happen inside the functions, so importing this package is cheap.
"""

from canvasagent.models.loading import (
    ModelUnavailableError,
    ensure_token_capacity,
    force_torch_image_outputs,
    load_policy,
    load_processor,
)
from canvasagent.models.special_tokens import PROTOCOL_TOKENS, add_protocol_tokens
from canvasagent.models.tiny import TinyQwen3VLSpec, build_tiny_qwen3vl, build_tiny_tokenizer

__all__ = [
    "PROTOCOL_TOKENS",
    "ModelUnavailableError",
    "TinyQwen3VLSpec",
    "add_protocol_tokens",
    "build_tiny_qwen3vl",
    "build_tiny_tokenizer",
    "ensure_token_capacity",
    "force_torch_image_outputs",
    "load_policy",
    "load_processor",
]
