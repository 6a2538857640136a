"""What a tool call returns, whoever executed it (in-process, a Ray handle or HTTP)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from PIL import Image

from toolserver.registry import OutputKind


@dataclass
class ToolResult:
    ok: bool
    text: str
    kind: OutputKind = OutputKind.NONE
    image: Image.Image | None = None
    data: dict[str, Any] = field(default_factory=dict)  # structured output: boxes, OCR lines, ...
    error_code: str | None = None
    plumbing_only: bool = False  # produced by random weights: exercise the code path only
    backend: str | None = None
    elapsed_s: float = 0.0

    @classmethod
    def failure(cls, code: str, message: str, **kw: Any) -> "ToolResult":
        return cls(ok=False, text=message, error_code=code, **kw)


class ToolError(Exception):
    """A tool rejected its input. Becomes an error observation, never a crash."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def close_if_closable(obj: Any) -> None:
    """Call `obj.close()` if it has one: backends, toolboxes and judges need not."""
    close = getattr(obj, "close", None)
    if callable(close):
        close()
