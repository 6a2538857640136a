"""Replay and scripted policies: recorded replies, or a function of the episode state."""

from __future__ import annotations

from typing import Any, Callable, Iterable

from canvasagent.core.protocol import TERMINATE


class ReplayPolicy:
    """Plays back recorded assistant replies in order, then terminates."""

    def __init__(self, replies: Iterable[str], name: str = "replay"):
        self.replies = list(replies)
        self.name = name
        self._i = 0

    def act(self, messages: list[dict[str, Any]], episode: Any) -> str:
        if self._i >= len(self.replies):
            return f"<reason>The recorded trajectory ends here.</reason>{TERMINATE}"
        reply = self.replies[self._i]
        self._i += 1
        return reply


class ScriptedPolicy:
    """A policy written as a function `(messages, episode) -> reply` (tests, benchmarks, data builders)."""

    def __init__(self, fn: Callable[[list[dict[str, Any]], Any], str], name: str = "scripted"):
        self.fn = fn
        self.name = name

    def act(self, messages: list[dict[str, Any]], episode: Any) -> str:
        return self.fn(messages, episode)
