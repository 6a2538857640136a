"""A judge behind any OpenAI-compatible chat-completions endpoint, through httpx.

Configuration comes from `HttpJudgeConfig`, with environment overrides for the secrets and the
place (`CANVASAGENT_JUDGE_API_KEY`, `_BASE_URL`, `_MODEL`). Images travel as PNG data URLs.
Transport errors, 429 and 5xx are retried with exponential backoff and jitter; a reply that
holds no usable score is retried once more as well (models occasionally ramble). When all
attempts fail, the judge returns the configured fallback with `fallback=True` and the reason;
`CachedJudge` counts and logs it.
"""

from __future__ import annotations

import base64
import io
import logging
import os
import random
import time
from typing import Any

import httpx
from PIL import Image

from rewards.config import HttpJudgeConfig
from rewards.judges import prompts
from rewards.judges.base import JudgeResult, TrajectoryView, parse_score

log = logging.getLogger(__name__)

_RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}


def image_data_url(img: Image.Image, side: int) -> str:
    buf = io.BytesIO()
    prompts.downscale(img, side).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


class HttpJudge:
    name = "http"

    def __init__(self, cfg: HttpJudgeConfig | None = None, fallback_score: float = 0.3, client: httpx.Client | None = None):
        self.cfg = cfg or HttpJudgeConfig()
        self.fallback_score = fallback_score
        self.base_url = (os.environ.get(self.cfg.base_url_env) or self.cfg.base_url).rstrip("/")
        self.model = os.environ.get(self.cfg.model_env) or self.cfg.model
        key = self.cfg.api_key or os.environ.get(self.cfg.api_key_env) or ""
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        self._client = client or httpx.Client(timeout=httpx.Timeout(self.cfg.timeout_s), headers=headers)

    def fingerprint(self) -> str:
        return f"http:{self.base_url}:{self.model}:{prompts.PROMPT_VERSION}:{self.cfg.max_image_side}:{self.cfg.temperature}"

    def _messages(self, aspect: str, view: TrajectoryView) -> list[dict[str, Any]]:
        content: list[dict[str, Any]] = []
        for kind, value in prompts.user_content(aspect, view, int(prompts.SCALE)):
            if kind == "text":
                content.append({"type": "text", "text": value})
            else:
                content.append({"type": "image_url", "image_url": {"url": image_data_url(value, self.cfg.max_image_side)}})
        return [{"role": "system", "content": prompts.system_prompt(aspect, int(prompts.SCALE))}, {"role": "user", "content": content}]

    def judge(self, aspect: str, view: TrajectoryView) -> JudgeResult:
        if aspect not in prompts.ASPECTS_WITH_PROMPTS:
            return JudgeResult.failed(self.fallback_score, f"unknown aspect {aspect!r}", self.name)
        if aspect == "aesthetic" and view.final is None:
            return JudgeResult(score=0.0, reason="no_final_image", judge=self.name)
        body = {
            "model": self.model,
            "messages": self._messages(aspect, view),
            "temperature": self.cfg.temperature,
            "max_tokens": self.cfg.max_tokens,
            **self.cfg.extra_body,
        }
        url = f"{self.base_url}/chat/completions"
        last = "no attempt"
        bad_replies = 0
        attempts = self.cfg.max_retries + 1
        for attempt in range(attempts):
            if attempt:
                delay = self.cfg.backoff_s * (2 ** (attempt - 1)) * (0.5 + random.random() / 2)
                time.sleep(delay)
            try:
                resp = self._client.post(url, json=body)
            except httpx.HTTPError as e:
                last = f"transport: {type(e).__name__}: {e}"
                log.info("judge %s attempt %d/%d: %s", aspect, attempt + 1, attempts, last)
                continue
            if resp.status_code in _RETRY_STATUS:
                last = f"http_{resp.status_code}"
                log.info("judge %s attempt %d/%d: %s", aspect, attempt + 1, attempts, last)
                continue
            if resp.status_code >= 400:
                last = f"http_{resp.status_code}: {resp.text[:200]}"
                break  # 4xx other than the retryable ones will not get better
            try:
                data = resp.json()
                text = data["choices"][0]["message"]["content"]
                if isinstance(text, list):  # some servers return content parts
                    text = "".join(p.get("text", "") for p in text if isinstance(p, dict))
            except (ValueError, KeyError, IndexError, TypeError) as e:
                last = f"bad_response: {type(e).__name__}: {str(e)[:120]}"
                continue
            score, how = parse_score(text, prompts.SCALE)
            if score is not None:
                return JudgeResult(score=score, reason=f"parsed:{how}", details={"attempts": float(attempt + 1)}, judge=self.name)
            last = f"unparseable_reply ({how}): {str(text)[:120]!r}"
            bad_replies += 1
            if bad_replies >= 2:
                break
        return JudgeResult.failed(self.fallback_score, last, self.name)

    def close(self) -> None:
        self._client.close()
