"""A policy served by any OpenAI-compatible chat-completions endpoint (vLLM, DashScope, …).

Our protocol is plain text (`<reason>…<tool_call>…`), so the endpoint is used as a chat model,
not through its native function calling: that keeps one parser and lets every server that speaks
`/v1/chat/completions` with image inputs serve a policy. Images travel as base64 PNG data URLs.
Tool observations are sent as `user` turns by default, because the `tool` role requires a
`tool_call_id` that a text-protocol conversation does not have.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import httpx

from canvasagent.core.llm_client import ChatClient, ChatEndpoint, EndpointError, image_data_url, reply_text

log = logging.getLogger(__name__)

__all__ = ["EndpointError", "OpenAICompatConfig", "OpenAICompatPolicy", "image_data_url", "reply_text", "to_openai_messages"]


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


class OpenAICompatPolicy:
    """`act()` posts the conversation and returns the reply text; retries transient failures."""

    def __init__(self, config: OpenAICompatConfig, client: httpx.Client | None = None):
        self.config = config
        self.name = f"openai:{config.model}"
        self._chat = ChatClient(
            ChatEndpoint(
                config.base_url, config.model, config.api_key_env, None, config.timeout_s, config.max_retries, config.backoff_s, dict(config.extra_body)
            ),
            client,
        )

    @property
    def url(self) -> str:
        return self._chat.endpoint.url

    def complete(self, oa_messages: list[dict[str, Any]], **overrides: Any) -> str:
        """One chat completion with retries; raises `EndpointError` with a clear reason."""
        params = {"temperature": self.config.temperature, "max_tokens": self.config.max_tokens, **overrides}
        return self._chat.complete(oa_messages, **params)

    def act(self, messages: list[dict[str, Any]], episode: Any) -> str:
        return self.complete(to_openai_messages(messages, self.config.tool_role, self.config.max_image_side))

    def close(self) -> None:
        self._chat.close()
