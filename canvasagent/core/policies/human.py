"""A human typing replies at a prompt (or any input function, for tests and the UI)."""

from __future__ import annotations

import json
from typing import Any, Callable

from canvasagent.core.protocol import TERMINATE, format_reply

HELP = (
    "Type a tool call as  Tool {json arguments}  e.g.  Crop {\"image\": \"img_1\", \"bbox\": [0,0,500,500]}\n"
    "or a full reply with <reason>…</reason><tool_call>…</tool_call>, or 'done' to finish."
)


def human_reply(line: str) -> str:
    """Turn a short human command into a protocol reply; full protocol text passes through."""
    line = line.strip()
    if not line or line.lower() in ("done", "quit", "exit", "terminate"):
        return f"<reason>The user ended the session.</reason>{TERMINATE}"
    if line.startswith("<"):
        return line
    name, _, rest = line.partition(" ")
    try:
        args = json.loads(rest) if rest.strip() else {}
    except json.JSONDecodeError:
        # Keep it: the runner reports the malformed call as an observation, which is what a model would see.
        return f"<reason>User command.</reason><tool_call>{{\"name\": \"{name}\", \"arguments\": {rest}}}</tool_call>"
    return format_reply("User command.", {"name": name, "arguments": args})


class HumanPolicy:
    name = "human"

    def __init__(self, input_fn: Callable[[str], str] = input, show: Callable[[str], None] | None = None):
        self.input_fn = input_fn
        self.show = show

    def act(self, messages: list[dict[str, Any]], episode: Any) -> str:
        if self.show is not None:
            self.show(f"imglist: {episode.assets.imglist_text()}\n{HELP}")
        try:
            line = self.input_fn("you> ")
        except EOFError:
            line = "done"
        return human_reply(line)
