"""Templated pure-tool tasks with reference solutions, run through the core loop.

This is our own small data source, independent of CanvasCraft: it lets SFT/GRPO and the CPU
pipeline run on a fresh offline machine. Each task is an instruction over one real photo
(scikit-image's bundled samples), solved by a chain of Crop/Flip/Rotate calls. The reference
replies are executed by `run_episode` + `ReplayPolicy`, so every SFT row is a real trajectory
with real tool outputs, and the reference calls double as the task's verifiable outcome check.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass
from typing import Any

from PIL import Image

from canvasagent.core.episode import Episode, EpisodeConfig, run_episode
from canvasagent.core.policies import ReplayPolicy
from canvasagent.core.protocol import TERMINATE, format_reply
from canvasagent.core.tasks import Task
from canvasagent.core.trajectory import Trajectory

_PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "immunohistochemistry", "hubble_deep_field", "camera", "coins")
_REGIONS = {
    "left half": "[0, 0, 500, 1000]",
    "right half": "[500, 0, 1000, 1000]",
    "top half": "[0, 0, 1000, 500]",
    "bottom half": "[0, 500, 1000, 1000]",
    "center": "[250, 250, 750, 750]",
}
_ANGLES = (90, 180)

#: The tools the scripted tasks need (all pure: real, deterministic, offline).
SCRIPTED_TOOLS: tuple[str, ...] = ("Crop", "Flip", "Rotate")


@dataclass(frozen=True)
class Step:
    tool: str
    args: dict[str, Any]  # without the image argument, which is filled from the chain
    phrase: str  # instruction fragment
    reason: str  # reply reason, with {src} for the input asset ID


@functools.cache
def _photo_cache() -> dict[str, Image.Image]:
    import numpy as np
    import skimage.data

    out = {}
    for name in _PHOTOS:
        arr = getattr(skimage.data, name)()
        if arr.ndim == 2:
            arr = np.stack([arr] * 3, axis=-1)
        out[name] = Image.fromarray(arr[..., :3].astype("uint8"), "RGB")
    return out


def sample_image(rng: random.Random, size: int) -> tuple[str, Image.Image]:
    """A random crop of a bundled photo, resized to size x size (different pixels per task)."""
    name = rng.choice(_PHOTOS)
    img = _photo_cache()[name]
    w, h = img.size
    side = int(min(w, h) * rng.uniform(0.5, 1.0))
    x, y = rng.randint(0, w - side), rng.randint(0, h - side)
    return name, img.crop((x, y, x + side, y + side)).resize((size, size), Image.Resampling.BILINEAR)


def _random_step(rng: random.Random) -> Step:
    tool = rng.choice(SCRIPTED_TOOLS)
    if tool == "Flip":
        return Step("Flip", {}, "mirror {src} horizontally", "Mirror {src} horizontally with Flip.")
    if tool == "Rotate":
        a = rng.choice(_ANGLES)
        return Step("Rotate", {"angle": a}, f"rotate {{src}} by {a} degrees", f"Rotate {{src}} by {a} degrees.")
    region = rng.choice(sorted(_REGIONS))
    return Step("Crop", {"bbox": _REGIONS[region]}, f"crop the {region} of {{src}}", f"Crop the {region} of {{src}}.")


def make_task(rng: random.Random, index: int, max_steps: int = 2, image_size: int = 64) -> tuple[Task, list[str]]:
    """One templated task and its reference replies (ending with <Terminate>)."""
    n = rng.randint(1, max_steps)
    steps = []
    while len(steps) < n:
        s = _random_step(rng)
        if steps and s.tool == steps[-1].tool:  # no adjacent repeats: the efficiency penalty dislikes them
            continue
        steps.append(s)
    photo, image = sample_image(rng, image_size)
    srcs, counters = ["img_1"], {}
    phrases, replies, calls = [], [], []
    for i, s in enumerate(steps):
        src = srcs[-1]
        # Later steps refer to "the result" in the instruction and to the concrete ID in the reply.
        phrases.append(s.phrase.format(src="img_1" if i == 0 else "the result"))
        args = {"image": src, **s.args}
        calls.append({"name": s.tool, "arguments": args})
        replies.append(format_reply(s.reason.format(src=src), {"name": s.tool, "arguments": args}))
        k = counters.get(s.tool, 0)
        counters[s.tool] = k + 1
        srcs.append(f"{s.tool}_{k}")
    replies.append(format_reply(f"{srcs[-1]} is the final image.", None, terminate=True))
    instruction = (", then ".join(phrases) + ".").capitalize()
    task = Task(
        instruction=instruction,
        images=[image],
        id=f"scripted-{index:05d}",
        expected_tools=[s.tool for s in steps],
        # The offline alignment judge compares the final image with the reference solution's
        # (`attach_reference` executes it and stores the image in meta["reference_images"]).
        # Pure tools are deterministic, so the target is exact.
        checks=[{"type": "reference_similarity", "image_index": 0, "exact": True}],
        labels={"steps": str(n)},
        meta={"source": "scripted", "photo": photo, "reference_calls": calls},
    )
    assert replies[-1].endswith(TERMINATE)
    return task, replies


def make_tasks(n: int, seed: int = 0, max_steps: int = 2, image_size: int = 64) -> list[tuple[Task, list[str]]]:
    rng = random.Random(seed)
    return [make_task(rng, i, max_steps, image_size) for i in range(n)]


def run_reference(task: Task, replies: list[str], toolbox: Any) -> Trajectory:
    """Execute the reference replies through the real episode runner."""
    traj = run_episode(ReplayPolicy(replies, name="scripted-reference"), task, toolbox, EpisodeConfig(max_turns=12))
    if traj.stop_reason != "terminate" or any(t.status not in ("ok", "terminate") for t in traj.turns):
        raise RuntimeError(f"reference solution of {task.id} did not run cleanly: {[t.error for t in traj.turns]}")
    return traj


def reference_image(task: Task, toolbox: Any) -> Image.Image | None:
    """Execute the task's reference calls on its inputs through the episode runner."""
    calls = task.meta.get("reference_calls") or []
    ep = Episode(toolbox, EpisodeConfig(max_turns=len(calls) + 1))
    ep.reset(task)
    for c in calls:
        ep.call_tool(c["name"], c["arguments"])
    last = ep.assets.last_produced()
    return last.image if last else None


def attach_reference(task: Task, toolbox: Any) -> Task:
    """Store the reference final image where the offline alignment judge looks for it."""
    if not task.meta.get("reference_images"):
        ref = reference_image(task, toolbox)
        task.meta["reference_images"] = [ref] if ref is not None else []
    return task
