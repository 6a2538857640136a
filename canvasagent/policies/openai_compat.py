"""A policy served by any OpenAI-compatible chat-completions endpoint (vLLM, DashScope, …).

Our protocol is plain text (`<reason>…<tool_call>…`), so the endpoint is used as a chat model,
not through its native function calling: that keeps one parser and lets every server that speaks
`/v1/chat/completions` with image inputs serve a policy. Images travel as base64 PNG data URLs.
Tool observations are sent as `user` turns by default, because the `tool` role requires a
`tool_call_id` that a text-protocol conversation does not have.
"""

from __future__ import annotations

import base64
import io
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
from PIL import Image

log = logging.getLogger(__name__)

RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}


class EndpointError(RuntimeError):
    """The endpoint could not produce a reply; the message says which endpoint and why."""


@dataclass
class OpenAICompatConfig:
    model: str
    base_url: str = "http://127.0.0.1:8000/v1"
    api_key_env: str = "OPENAI_API_KEY"  # read at call time; the key itself is never stored or logged
    timeout_s: float = 60.0
    max_retries: int = 3
    backoff_s: float = 1.0  # doubled after each failed attempt
    temperature: float = 0.0
    max_tokens: int = 1024
    tool_role: str = "user"  # role that carries tool observations ("tool" for servers that accept it)
    max_image_side: int = 1536  # larger images are downscaled before upload (bandwidth, token cost)
    extra_body: dict[str, Any] = field(default_factory=dict)


def image_data_url(image: Image.Image, max_side: int | None = None) -> str:
    img = image
    if max_side and max(img.size) > max_side:
        img = img.copy()
        img.thumbnail((max_side, max_side))
    if img.mode not in ("RGB", "RGBA", "L", "LA"):
        img = img.convert("RGBA" if "A" in img.mode or "transparency" in img.info else "RGB")
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def to_openai_messages(messages: list[dict[str, Any]], tool_role: str = "user", max_image_side: int | None = None) -> list[dict[str, Any]]:
    """Convert episode messages (PIL images inline) into chat-completions messages."""
    out: list[dict[str, Any]] = []
    for m in messages:
        role = m["role"]
        content = m["content"]
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        if role in ("system", "assistant"):
            # Text-only roles: many servers reject image parts there.
            out.append({"role": role, "content": "".join(c.get("text", "") for c in content if c.get("type") == "text")})
            continue
        parts: list[dict[str, Any]] = []
        for c in content:
            if c.get("type") == "image" and c.get("image") is not None:
                parts.append({"type": "image_url", "image_url": {"url": image_data_url(c["image"], max_image_side)}})
            elif c.get("type") == "text":
                parts.append({"type": "text", "text": c.get("text", "")})
        out.append({"role": tool_role if role == "tool" else role, "content": parts})
    return out


def reply_text(payload: dict[str, Any]) -> str:
    try:
        content = payload["choices"][0]["message"].get("content")
    except (KeyError, IndexError, TypeError, AttributeError) as e:
        raise EndpointError(f"malformed chat-completions response (no choices[0].message): {str(payload)[:200]}") from e
    if isinstance(content, list):  # some servers return content parts
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


class OpenAICompatPolicy:
    """`act()` posts the conversation and returns the reply text; retries transient failures."""

    def __init__(self, config: OpenAICompatConfig, client: httpx.Client | None = None):
        self.config = config
        self.name = f"openai:{config.model}"
        self._client = client or httpx.Client(timeout=httpx.Timeout(config.timeout_s))

    @property
    def url(self) -> str:
        return self.config.base_url.rstrip("/") + "/chat/completions"

    def _headers(self) -> dict[str, str]:
        key = os.environ.get(self.config.api_key_env, "")
        return {"Authorization": f"Bearer {key}"} if key else {}

    def complete(self, oa_messages: list[dict[str, Any]], **overrides: Any) -> str:
        """One chat completion with retries; raises `EndpointError` with a clear reason."""
        cfg = self.config
        body = {
            "model": cfg.model,
            "messages": oa_messages,
            "temperature": cfg.temperature,
            "max_tokens": cfg.max_tokens,
            **cfg.extra_body,
            **overrides,
        }
        last = "no attempt made"
        for attempt in range(cfg.max_retries + 1):
            if attempt:
                time.sleep(cfg.backoff_s * 2 ** (attempt - 1))
            try:
                r = self._client.post(self.url, json=body, headers=self._headers())
            except httpx.TimeoutException as e:
                last = f"timed out after {cfg.timeout_s:g}s ({type(e).__name__})"
            except httpx.TransportError as e:
                last = f"cannot connect ({type(e).__name__}: {e})"
            else:
                if r.status_code == 200:
                    try:
                        return reply_text(r.json())
                    except ValueError as e:
                        raise EndpointError(f"{self.url} returned non-JSON: {r.text[:200]!r}") from e
                last = f"HTTP {r.status_code}: {r.text[:200]!r}"
                if r.status_code not in RETRY_STATUS:
                    break  # a client error will not fix itself
            log.warning("endpoint %s attempt %d/%d failed: %s", self.url, attempt + 1, cfg.max_retries + 1, last)
        raise EndpointError(f"endpoint {self.url} (model {cfg.model}) failed: {last}")

    def act(self, messages: list[dict[str, Any]], episode: Any) -> str:
        return self.complete(to_openai_messages(messages, self.config.tool_role, self.config.max_image_side))

    def close(self) -> None:
        self._client.close()
