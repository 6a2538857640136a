"""A task: what an episode is asked to do, shared by data building, GRPO, evaluation and UI."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from PIL import Image


@dataclass
class Task:
    instruction: str
    images: list[Image.Image] = field(default_factory=list)  # become img_1, img_2, ...
    id: str = "task"
    expected_tools: list[str] = field(default_factory=list)  # the expected tool set (public RL `path`)
    # Verifiable checks for the offline alignment judge, e.g. {"type": "ocr_contains", "text": "SALE"}.
    checks: list[dict[str, Any]] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)  # R/L/D difficulty axes
    family: str = "canvasagent"
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe description (images are saved separately by whoever serialises them)."""
        return {
            "id": self.id,
            "instruction": self.instruction,
            "n_images": len(self.images),
            "expected_tools": list(self.expected_tools),
            "checks": list(self.checks),
            "labels": dict(self.labels),
            "family": self.family,
            "meta": dict(self.meta),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any], images: list[Image.Image] | None = None) -> "Task":
        return cls(
            instruction=d.get("instruction", ""),
            images=list(images or []),
            id=d.get("id", "task"),
            expected_tools=list(d.get("expected_tools") or []),
            checks=list(d.get("checks") or []),
            labels=dict(d.get("labels") or {}),
            family=d.get("family", "canvasagent"),
            meta=dict(d.get("meta") or {}),
        )
