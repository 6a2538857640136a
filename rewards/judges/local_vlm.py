"""A judge run in-process by a Qwen-VL-family checkpoint through transformers.

The model and processor come from the shared loaders (`canvasagent.core.models.load_policy`,
`load_processor`), so any checkpoint the policy code can load works here. Two scoring modes:

* `logits` (default): the prompt asks for a 0-9 score and ends with `{"score": `; we read the
  next-token distribution over the digit tokens 0-9 and the score is its expectation / 9. It
  always yields a number, costs one forward pass, and is smooth (useful as a reward).
* `generate`: greedy-decode a reply and parse it like the HTTP judge's; an unusable reply is a
  counted fallback.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from rewards.config import LocalJudgeConfig
from rewards.judges import prompts
from rewards.judges.base import JudgeResult, TrajectoryView, parse_score

log = logging.getLogger(__name__)

_ANSWER_PREFIX = '{"score": '


class LocalVLMJudge:
    name = "local"

    def __init__(self, cfg: LocalJudgeConfig | None = None, fallback_score: float = 0.3):
        self.cfg = cfg or LocalJudgeConfig()
        self.fallback_score = fallback_score
        self._model: Any = None
        self._processor: Any = None
        self._digit_ids: list[int] | None = None
        self._load_error: str | None = None
        self._lock = threading.Lock()  # one forward pass at a time: the model is not thread-safe

    def fingerprint(self) -> str:
        return f"local:{self.cfg.model}:{self.cfg.mode}:{prompts.PROMPT_VERSION}:{self.cfg.max_image_side}"

    def _load(self) -> bool:
        if self._model is not None:
            return True
        if self._load_error is not None:
            return False
        if not self.cfg.model:
            self._load_error = "no judges.local.model configured"
            return False
        try:
            from canvasagent.core.models import load_policy, load_processor

            self._processor = load_processor(self.cfg.model)
            self._model = load_policy(self.cfg.model, dtype=self.cfg.dtype).to(self.cfg.device).eval()
            tok = self._processor.tokenizer
            encoded = [tok.encode(d, add_special_tokens=False) for d in "0123456789"]
            self._digit_ids = [e[0] for e in encoded] if all(len(e) == 1 for e in encoded) else None
            if self._digit_ids is None and self.cfg.mode == "logits":
                log.warning("local judge: digits are not single tokens in %s; using generate mode", self.cfg.model)
        except Exception as e:
            self._load_error = f"{type(e).__name__}: {e}"
            log.warning("local judge: cannot load %r: %s", self.cfg.model, self._load_error)
            return False
        return True

    @property
    def _logits_mode(self) -> bool:
        return self.cfg.mode == "logits" and self._digit_ids is not None

    @property
    def _scale(self) -> int:
        return 9 if self._logits_mode else int(prompts.SCALE)  # one digit token per answer

    def _inputs(self, aspect: str, view: TrajectoryView):
        content: list[dict[str, Any]] = []
        images = []
        for kind, value in prompts.user_content(aspect, view, self._scale):
            if kind == "text":
                content.append({"type": "text", "text": value})
            else:
                img = prompts.downscale(value, self.cfg.max_image_side)
                images.append(img)
                content.append({"type": "image", "image": img})
        messages = [
            {"role": "system", "content": [{"type": "text", "text": prompts.system_prompt(aspect, self._scale)}]},
            {"role": "user", "content": content},
        ]
        text = self._processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        if self._logits_mode:
            text += _ANSWER_PREFIX
        batch = self._processor(text=[text], images=images or None, return_tensors="pt")
        return batch.to(self.cfg.device)

    def judge(self, aspect: str, view: TrajectoryView) -> JudgeResult:
        if aspect not in prompts.ASPECTS_WITH_PROMPTS:
            return JudgeResult.failed(self.fallback_score, f"unknown aspect {aspect!r}", self.name)
        if aspect == "aesthetic" and view.final is None:
            return JudgeResult(score=0.0, reason="no_final_image", judge=self.name)
        if not self._load():
            return JudgeResult.failed(self.fallback_score, f"model_unavailable: {self._load_error}", self.name)
        import torch

        try:
            with self._lock, torch.inference_mode():
                batch = self._inputs(aspect, view)
                if self._logits_mode:
                    logits = self._model(**batch).logits[0, -1].float()
                    probs = torch.softmax(logits[self._digit_ids], dim=-1)
                    expected = float((probs * torch.arange(10, dtype=probs.dtype)).sum()) / 9.0
                    return JudgeResult(score=expected, reason="digit_expectation", details={"p_max": float(probs.max())}, judge=self.name)
                out = self._model.generate(**batch, max_new_tokens=self.cfg.max_new_tokens, do_sample=False)
                reply = self._processor.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)[0]
        except Exception as e:
            log.exception("local judge failed on %s", aspect)
            return JudgeResult.failed(self.fallback_score, f"inference_error: {type(e).__name__}: {e}", self.name)
        score, how = parse_score(reply, prompts.SCALE)
        if score is None:
            return JudgeResult.failed(self.fallback_score, f"unparseable_reply ({how}): {reply[:80]!r}", self.name)
        return JudgeResult(score=score, reason=f"parsed:{how}", judge=self.name)
