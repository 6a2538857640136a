"""One client for OpenAI-compatible chat-completions endpoints (vLLM, DashScope, OpenAI, …).

Policies, judges, instruction writers and the evaluation agent's planner all talk to such
endpoints; they share this client so timeouts, retries with backoff, key handling and image
encoding behave the same everywhere.
"""

from __future__ import annotations

import base64
import io
import logging
import os
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
from PIL import Image

log = logging.getLogger(__name__)

# Statuses worth retrying: timeouts, conflicts, rate limits and server-side failures.
RETRY_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})


class EndpointError(RuntimeError):
    """The endpoint could not produce a reply; the message says which endpoint and why."""

    def __init__(self, message: str, reason: str = ""):
        super().__init__(message)
        self.reason = reason or message


def image_data_url(image: Image.Image, max_side: int | None = None) -> str:
    """A PNG data URL, downscaled so the longer side is at most `max_side`."""
    img = image
    if max_side and max(img.size) > max_side:
        img = img.copy()
        img.thumbnail((max_side, max_side))
    if img.mode not in ("RGB", "RGBA", "L", "LA"):
        img = img.convert("RGBA" if "A" in img.mode or "transparency" in img.info else "RGB")
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def reply_text(payload: Any) -> str:
    try:
        content = payload["choices"][0]["message"].get("content")
    except (KeyError, IndexError, TypeError, AttributeError) as e:
        raise EndpointError(f"malformed chat-completions response (no choices[0].message): {str(payload)[:200]}", "bad_response") from e
    if isinstance(content, list):  # some servers return content parts
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


@dataclass
class ChatEndpoint:
    base_url: str
    model: str
    api_key_env: str = "OPENAI_API_KEY"  # read at call time; the key itself is never logged
    api_key: str | None = None
    timeout_s: float = 60.0
    max_retries: int = 3
    backoff_s: float = 1.0  # doubled after each failed attempt, with jitter
    extra_body: dict[str, Any] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.base_url.rstrip("/") + "/chat/completions"


class ChatClient:
    def __init__(self, endpoint: ChatEndpoint, client: httpx.Client | None = None):
        self.endpoint = endpoint
        self._client = client or httpx.Client(timeout=httpx.Timeout(endpoint.timeout_s))
        self._local = threading.local()  # a judge's pool shares one client across threads

    @property
    def last_attempts(self) -> int:
        """HTTP attempts the calling thread's last complete() made (for logs and judges' details)."""
        return getattr(self._local, "attempts", 0)

    def _headers(self) -> dict[str, str]:
        key = self.endpoint.api_key or os.environ.get(self.endpoint.api_key_env, "")
        return {"Authorization": f"Bearer {key}"} if key else {}

    def complete(self, messages: list[dict[str, Any]], **params: Any) -> str:
        """One completion; transient failures are retried. Raises `EndpointError` with the last reason."""
        ep = self.endpoint
        body = {"model": ep.model, "messages": messages, **ep.extra_body, **params}
        last = "no attempt made"
        for attempt in range(ep.max_retries + 1):
            self._local.attempts = attempt + 1
            if attempt:
                time.sleep(ep.backoff_s * 2 ** (attempt - 1) * (0.5 + random.random() / 2))
            try:
                r = self._client.post(ep.url, json=body, headers=self._headers())
            except httpx.TimeoutException as e:
                last = f"transport: timed out after {ep.timeout_s:g}s ({type(e).__name__})"
            except httpx.HTTPError as e:
                last = f"transport: cannot connect ({type(e).__name__}: {e})"
            else:
                if r.status_code == 200:
                    try:
                        return reply_text(r.json())
                    except ValueError:
                        last = f"bad_response: non-JSON reply {r.text[:200]!r}"
                        continue
                last = f"HTTP {r.status_code} (http_{r.status_code}): {r.text[:200]!r}"
                if r.status_code not in RETRY_STATUS:
                    break  # a client error will not fix itself
            log.warning("endpoint %s attempt %d/%d failed: %s", ep.url, attempt + 1, ep.max_retries + 1, last)
        raise EndpointError(f"endpoint {ep.url} (model {ep.model}) failed: {last}", last)

    def close(self) -> None:
        self._client.close()
