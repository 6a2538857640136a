"""The request a tool implementation receives: validated arguments with images resolved."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from PIL import Image

from toolserver.validation import Profile


@dataclass
class ToolRequest:
    tool: str
    args: dict[str, Any]  # normalised by toolserver.validation (bbox -> list[float], ...)
    images: dict[str, Image.Image] = field(default_factory=dict)  # argument name -> image
    raw_args: dict[str, Any] = field(default_factory=dict)  # as the policy wrote them
    profile: Profile = Profile.CANVASCRAFT
