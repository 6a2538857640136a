"""A policy that runs a local Hugging Face checkpoint with `transformers` `generate`.

Loading goes through `canvasagent.core.models.loading`, so the same code serves the tiny offline
Qwen3-VL and real checkpoints, with or without torchvision. Episode messages already use the
transformers multimodal content format (`{"type": "image", "image": PIL}`), so they go straight
into the processor's chat template: the prompt the policy sees here is the one training renders.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)


class ContextOverflowError(RuntimeError):
    """The conversation no longer fits the model's context window."""


@dataclass
class HFGenerationConfig:
    max_new_tokens: int = 256
    temperature: float = 0.0  # 0 means greedy decoding
    top_p: float = 1.0
    dtype: str | None = None  # e.g. "bfloat16"; None keeps the checkpoint default
    device: str = "cpu"
    seed: int | None = None


class HFLocalPolicy:
    """Greedy or sampled generation from a local checkpoint; one model shared by all episodes."""

    def __init__(self, model_path: str, config: HFGenerationConfig | None = None, model: Any = None, processor: Any = None):
        from canvasagent.core.models.loading import ensure_token_capacity, load_policy, load_processor

        self.config = config or HFGenerationConfig()
        self.model_path = str(model_path)
        self.name = f"hf:{self.model_path}"
        self.processor = processor or load_processor(self.model_path)
        self.model = model or load_policy(self.model_path, dtype=self.config.dtype)
        ensure_token_capacity(self.model, self.processor.tokenizer)
        self.model.to(self.config.device)
        self.model.eval()
        # generate() is not re-entrant on one model; concurrent evaluation workers take turns.
        self._lock = threading.Lock()

    @property
    def context_limit(self) -> int:
        text_cfg = getattr(self.model.config, "text_config", self.model.config)
        return int(getattr(text_cfg, "max_position_embeddings", 0) or self.processor.tokenizer.model_max_length)

    def render(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        return self.processor.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt"
        )

    def act(self, messages: list[dict[str, Any]], episode: Any = None) -> str:
        import torch

        cfg = self.config
        inputs = self.render(messages)
        n_prompt = int(inputs["input_ids"].shape[1])
        if n_prompt + cfg.max_new_tokens > self.context_limit:
            raise ContextOverflowError(
                f"prompt of {n_prompt} tokens + {cfg.max_new_tokens} new tokens exceeds the "
                f"{self.context_limit}-token context of {self.model_path}"
            )
        inputs = {k: v.to(cfg.device) if hasattr(v, "to") else v for k, v in inputs.items()}
        gen_kwargs: dict[str, Any] = {"max_new_tokens": cfg.max_new_tokens, "do_sample": cfg.temperature > 0}
        if cfg.temperature > 0:
            gen_kwargs.update(temperature=cfg.temperature, top_p=cfg.top_p)
        with self._lock, torch.inference_mode():
            if cfg.seed is not None:
                torch.manual_seed(cfg.seed)
            out = self.model.generate(**inputs, **gen_kwargs)
        # Protocol tokens are added-but-not-special, so skip_special_tokens keeps them.
        return self.processor.decode(out[0, n_prompt:], skip_special_tokens=True).strip()
