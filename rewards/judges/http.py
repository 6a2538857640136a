"""A judge behind any OpenAI-compatible chat-completions endpoint, through httpx.

Configuration comes from `HttpJudgeConfig`, with environment overrides for the secrets and the
place (`CANVASAGENT_JUDGE_API_KEY`, `_BASE_URL`, `_MODEL`). Images travel as PNG data URLs.
Transport errors, 429 and 5xx are retried with exponential backoff and jitter; a reply without
a usable score gets one more try (models occasionally ramble). When all attempts fail, the judge
returns the configured fallback (`fallback=True`, with the reason); `CachedJudge` counts it.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import httpx

from canvasagent.core.llm_client import ChatClient, ChatEndpoint, EndpointError, image_data_url
from rewards.config import HttpJudgeConfig
from rewards.judges import prompts
from rewards.judges.base import JudgeResult, TrajectoryView, parse_score

log = logging.getLogger(__name__)


class HttpJudge:
    name = "http"

    def __init__(self, cfg: HttpJudgeConfig | None = None, fallback_score: float = 0.3, client: httpx.Client | None = None):
        self.cfg = cfg or HttpJudgeConfig()
        self.fallback_score = fallback_score
        self.base_url = (os.environ.get(self.cfg.base_url_env) or self.cfg.base_url).rstrip("/")
        self.model = os.environ.get(self.cfg.model_env) or self.cfg.model
        endpoint = ChatEndpoint(
            self.base_url,
            self.model,
            api_key_env=self.cfg.api_key_env,
            api_key=self.cfg.api_key,
            timeout_s=self.cfg.timeout_s,
            max_retries=self.cfg.max_retries,
            backoff_s=self.cfg.backoff_s,
            extra_body=dict(self.cfg.extra_body),
        )
        self._chat = ChatClient(endpoint, client)

    def fingerprint(self) -> str:
        return f"http:{self.base_url}:{self.model}:{prompts.PROMPT_VERSION}:{self.cfg.max_image_side}:{self.cfg.temperature}"

    def _messages(self, aspect: str, view: TrajectoryView) -> list[dict[str, Any]]:
        content: list[dict[str, Any]] = []
        for kind, value in prompts.user_content(aspect, view, int(prompts.SCALE)):
            if kind == "text":
                content.append({"type": "text", "text": value})
            else:
                url = image_data_url(prompts.downscale(value, self.cfg.max_image_side))
                content.append({"type": "image_url", "image_url": {"url": url}})
        return [{"role": "system", "content": prompts.system_prompt(aspect, int(prompts.SCALE))}, {"role": "user", "content": content}]

    def judge(self, aspect: str, view: TrajectoryView) -> JudgeResult:
        if aspect not in prompts.ASPECTS_WITH_PROMPTS:
            return JudgeResult.failed(self.fallback_score, f"unknown aspect {aspect!r}", self.name)
        if aspect == "aesthetic" and view.final is None:
            return JudgeResult(score=0.0, reason="no_final_image", judge=self.name)
        messages = self._messages(aspect, view)
        last = "no attempt"
        attempts = 0
        for attempt in range(2):
            try:
                text = self._chat.complete(messages, temperature=self.cfg.temperature, max_tokens=self.cfg.max_tokens)
                attempts += self._chat.last_attempts
            except EndpointError as e:
                return JudgeResult.failed(self.fallback_score, f"judge at {self.base_url}: {e.reason}", self.name)
            score, how = parse_score(text, prompts.SCALE)
            if score is not None:
                return JudgeResult(score=score, reason=f"parsed:{how}", details={"attempts": float(attempts)}, judge=self.name)
            last = f"unparseable_reply ({how}): {str(text)[:120]!r}"
        return JudgeResult.failed(self.fallback_score, last, self.name)

    def close(self) -> None:
        self._chat.close()
