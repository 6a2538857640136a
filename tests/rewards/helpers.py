"""Build real trajectories for reward tests: the episode runner, a replay policy, real tools.

Model-backed tools (Grounding, SAM, ImageGeneration, OCR) have no offline backend, so tests
queue recorded outputs on a real `LocalToolbox` (`add_recorded`) — the same mechanism that
replays public trajectories — and pure tools run for real.
"""

from __future__ import annotations

import json
from typing import Any, Iterable

import numpy as np
from PIL import Image

from toolserver.client import make_toolbox
from canvasagent.core.episode import EpisodeConfig, run_episode
from canvasagent.core.policies.replay import ReplayPolicy
from canvasagent.core.tasks import Task
from canvasagent.core.trajectory import Trajectory
from toolserver.toolbox import RecordedOutput


def gradient(w: int = 64, h: int = 48) -> Image.Image:
    x, y = np.meshgrid(np.arange(w), np.arange(h))
    arr = np.stack([(x * 4) % 256, (y * 5) % 256, (x + 2 * y) % 256], axis=-1).astype(np.uint8)
    return Image.fromarray(arr, "RGB")


def mask(w: int = 64, h: int = 48) -> Image.Image:
    arr = np.zeros((h, w), np.uint8)
    arr[h // 4 : 3 * h // 4, w // 4 : 3 * w // 4] = 255
    return Image.fromarray(arr, "L")


def R(reason: str = "Do the next step.", name: str | None = None, args: Any = None, terminate: bool = False) -> str:
    """A well-formed reply."""
    s = f"<reason>{reason}</reason>"
    if name is not None:
        s += "<tool_call>" + json.dumps({"name": name, "arguments": {} if args is None else args}) + "</tool_call>"
    if terminate:
        s += "<Terminate>"
    return s


DONE = R("The task is complete.", terminate=True)


def run(
    replies: Iterable[str],
    images: list[Image.Image] | None = None,
    expected: list[str] | None = None,
    recorded: dict[str, list[RecordedOutput]] | None = None,
    checks: list[dict] | None = None,
    instruction: str = "Edit the image.",
    max_turns: int = 12,
    toolbox=None,
    meta: dict | None = None,
) -> Trajectory:
    tb = toolbox or make_toolbox("offline")
    for tool, outs in (recorded or {}).items():
        for o in outs:
            tb.add_recorded(tool, o)
    task = Task(
        instruction=instruction,
        images=[gradient()] if images is None else images,
        expected_tools=list(expected or []),
        checks=list(checks or []),
        meta=dict(meta or {}),
    )
    return run_episode(ReplayPolicy(list(replies)), task, tb, EpisodeConfig(max_turns=max_turns))
