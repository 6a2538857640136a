"""The image-context budget: which images of a conversation a model is shown.

Contract
--------
`apply_image_budget(messages, budget)` is the one rule for every path that feeds a model: the
episode (`Episode.context()`: evaluation, chat, UI), SFT rows (`training.messages.sft_example`)
and GRPO rollouts (`training.trl_multimodal.CanvasGRPOTrainer`, after every tool turn), so all
three hand the model the same messages for the same conversation.

* `budget` None keeps every image: the input list itself is returned, untouched.
* `budget` K (an int >= 0) keeps the K most recent images of *tool* messages. Every older tool
  image part becomes the text part ``omitted_text(asset_id)`` in its place, e.g.
  ``"[image Flip_0 omitted: over the image budget]\\n"``. The asset ID is the one the observation
  announced (``Output image saved as: ID``); an observation that carries an image without saving
  one (the latest asset attached to an error) names the newest ID of its imglist echo.
* The task's input images (user messages) are always kept and never counted: the instruction
  refers to them by ID, a task has one or two, and GRPO holds them in the prompt TRL tokenizes
  once per group. A prompt therefore holds at most ``K + len(task.images)`` images.
* Pure: the input is never mutated; a changed message is a shallow copy with a new content list,
  unchanged messages are the same objects.
* Message forms: content blocks with ``{"type": "image", "image": PIL}`` (episode, GRPO),
  ``{"type": "image"}`` placeholders filled from a separate ``images`` list in placeholder order
  (SFT rows; pass ``images=`` and get the kept ones back), or a plain string (no images).

What a budget means for training
--------------------------------
A model call at turn t sees the budget applied to the conversation so far, but SFT and GRPO
score a trajectory as one sequence, with the budget applied to the finished conversation. An
assistant turn followed by more than K tool images is thus trained with fewer images than it was
generated (GRPO) or will be run (evaluation) with; turns among the last K images see exactly their
own context. With K >= the trajectory's tool image count nothing changes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

Message = dict[str, Any]

_SAVED = re.compile(r"\[Output image saved as: (?P<id>[^\s.\]]+)\. now imglist is")
_IMGLIST = re.compile(r"imglist is \{(?P<ids>[^}]*)\}")


def omitted_text(asset_id: str) -> str:
    """The text that stands in for an image left out of the context."""
    return f"[image {asset_id} omitted: over the image budget]\n"


def check_budget(budget: Any) -> int | None:
    """`budget` as the setting's value (None or an int >= 0); raises ValueError otherwise."""
    if budget is None:
        return None
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
        raise ValueError(f"image_budget must be null (keep all) or an integer >= 0, got {budget!r}")
    return budget


def observation_asset_id(text: str) -> str | None:
    """The asset ID an observation text announces for its image (see the module doc)."""
    m = _SAVED.search(text)
    if m:
        return m.group("id")
    lists = _IMGLIST.findall(text)
    ids = [s.strip() for s in lists[-1].split(",") if s.strip()] if lists else []
    return ids[-1] if ids else None


@dataclass(frozen=True)
class Omission:
    """One tool image left out: `messages[message]["content"][part]`, the `image`-th image part
    of the conversation (user images included, in order), standing for `asset_id`."""

    message: int
    part: int
    image: int
    asset_id: str


def _text_of(content: list[Any]) -> str:
    return "".join(p.get("text") or "" for p in content if isinstance(p, dict) and p.get("type") == "text")


def omissions(messages: list[Message], budget: int | None) -> list[Omission]:
    """The tool images `apply_image_budget` leaves out, oldest first."""
    budget = check_budget(budget)
    if budget is None:
        return []
    tool_images: list[tuple[int, int, int]] = []
    n = 0
    for mi, msg in enumerate(messages):
        content = msg.get("content")
        if not isinstance(content, list):
            continue
        for pi, part in enumerate(content):
            if isinstance(part, dict) and part.get("type") == "image":
                if msg.get("role") == "tool":
                    tool_images.append((mi, pi, n))
                n += 1
    drop = tool_images[: max(0, len(tool_images) - budget)]
    return [Omission(mi, pi, k, observation_asset_id(_text_of(messages[mi]["content"])) or "unknown") for mi, pi, k in drop]


def apply_image_budget(
    messages: list[Message], budget: int | None, images: list[Any] | None = None
) -> tuple[list[Message], list[Any] | None]:
    """The conversation as a model sees it under `budget`, and the kept `images` (placeholder form).
    Returns `(messages, images)`: `images` is None when none was passed, else the passed list
    without the left-out images (for SFT rows whose image parts are placeholders)."""
    dropped = omissions(messages, budget)
    if not dropped:
        return messages, images
    out = list(messages)
    by_message: dict[int, dict[int, Omission]] = {}
    for o in dropped:
        by_message.setdefault(o.message, {})[o.part] = o
    for mi, parts in by_message.items():
        msg = messages[mi]
        content = [
            {"type": "text", "text": omitted_text(parts[pi].asset_id)} if pi in parts else part
            for pi, part in enumerate(msg["content"])
        ]
        out[mi] = {**msg, "content": content}
    if images is not None:
        gone = {o.image for o in dropped}
        images = [im for k, im in enumerate(images) if k not in gone]
    return out, images


def count_images(messages: list[Message]) -> int:
    """Image parts of a conversation (user and tool)."""
    return sum(
        1
        for m in messages
        if isinstance(m.get("content"), list)
        for p in m["content"]
        if isinstance(p, dict) and p.get("type") == "image"
    )
