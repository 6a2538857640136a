"""The policy interface the episode runner drives."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Policy(Protocol):
    name: str

    def act(self, messages: list[dict[str, Any]], episode: Any) -> str:
        """Return the next assistant reply given the messages so far (system, user, assistant, tool…).
        `episode` is the running `canvasagent.core.episode.Episode`, for policies that want the asset
        state directly (scripted painters, the human policy's prompt) rather than reading text."""
        ...
