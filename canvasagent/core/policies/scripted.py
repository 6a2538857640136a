"""Named scripted policies for `scripted:NAME` specs: baselines, smoke tests and failure drills.

- `terminate`: ends at once (the do-nothing baseline).
- `expected`: calls the task's expected tools in order with generic arguments, then terminates
  (a chain-following baseline that needs no model).
- `oracle`: replays the task's reference solution (`task.meta["reference_calls"]`, written by
  the scripted task maker and the CanvasCraft RL builder), then terminates; a task without one
  is ended at once.
- `oracle_wrong_param`: the oracle with one wrong parameter in its first call that has one: the
  Rotate angle, else a bbox shifted by a quarter of the image, else (EASEL) the brush position
  of every stroke a quarter canvas off, else the image asset (an earlier asset, or one that
  does not exist).
- `flip`, `rotate90`, `crop_center`: one fixed edit of the newest image whatever was asked, then
  terminate (trivial policies a reward must score far below the oracle).
- `garbage`: emits unparseable text forever (drills the runner's guards).
"""

from __future__ import annotations

import json
from typing import Any, Callable

from canvasagent.core.policies.replay import ScriptedPolicy
from canvasagent.core.protocol import format_reply
from canvasagent.core.tasks import Task
from toolserver.registry import REGISTRY, ArgType, OutputKind

ScriptFn = Callable[[list[dict[str, Any]], Any], str]


def _newest(episode: Any, kinds: tuple[OutputKind, ...] = ()) -> str:
    """The newest asset of an acceptable kind (any image-like kind when `kinds` is empty)."""
    usable = kinds or (OutputKind.IMAGE, OutputKind.RGBA)
    for asset in reversed(list(episode.assets)):
        if asset.kind in usable:
            return asset.id
    ids = episode.assets.ids()
    return ids[-1] if ids else "img_1"


def generic_arguments(tool: str, episode: Any, instruction: str) -> dict[str, Any]:
    """Plausible arguments for `tool` from the registry alone (no understanding of the image)."""
    args: dict[str, Any] = {}
    for a in REGISTRY[tool].args:
        if a.type is ArgType.ASSET:
            args[a.name] = _newest(episode, tuple(a.asset_kinds))
        elif a.type is ArgType.BBOX:
            args[a.name] = [100, 100, 900, 900]
        elif a.type is ArgType.POSITION:
            args[a.name] = [500, 500]
        elif a.type is ArgType.CHOICE:
            args[a.name] = a.choices[0]
        elif a.type is ArgType.UNIT:
            args[a.name] = 0.5
        else:
            args[a.name] = instruction[:120] or "an image"
    if tool == "Overlayer":
        args["overlay_type"] = "text"
    return args


def _terminate(messages: list[dict[str, Any]], episode: Any) -> str:
    return format_reply("Nothing to do.", terminate=True)


def _one_edit(tool: str, extra: dict[str, Any], reason: str, done: str) -> ScriptFn:
    def act(messages: list[dict[str, Any]], episode: Any) -> str:
        if not episode.trajectory.turns:
            return format_reply(reason, {"name": tool, "arguments": {"image": _newest(episode), **extra}})
        return format_reply(done, terminate=True)

    return act


def _garbage(messages: list[dict[str, Any]], episode: Any) -> str:
    return '<tool_call>{"name": Flip, ]] no reason, no end'


def _expected(task: Task) -> ScriptFn:
    plan = [t for t in task.expected_tools if t in REGISTRY]

    def act(messages: list[dict[str, Any]], episode: Any) -> str:
        step = len(episode.trajectory.turns)
        if step >= len(plan):
            return format_reply("All expected tools have been applied.", terminate=True)
        tool = plan[step]
        call = {"name": tool, "arguments": generic_arguments(tool, episode, task.instruction)}
        return format_reply(f"Step {step + 1}: apply {tool}.", call)

    return act


_ANGLES = (45, 90, 180)


def wrong_param(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The calls with one parameter made wrong (see `oracle_wrong_param`); the input is kept."""
    out = [{"name": c["name"], "arguments": dict(c.get("arguments") or {})} for c in calls]
    for c in out:
        a = c["arguments"]
        if "angle" in a:
            a["angle"] = next(x for x in _ANGLES if str(x) != str(a["angle"]).strip())
            return out
    for c in out:
        a = c["arguments"]
        if "bbox" in a:
            box = json.loads(a["bbox"]) if isinstance(a["bbox"], str) else list(a["bbox"])
            x0, y0, x1, y1 = (float(v) for v in box)
            dx = 250 if x1 + 250 <= 1000 else -250  # stays inside the image, a quarter off
            a["bbox"] = [x0 + dx, y0, x1 + dx, y1]
            return out
    strokes = [c["arguments"] for c in out if c["name"] == "brush_stroke" and "xs" in c["arguments"]]
    if strokes:  # a painting's position: every stroke a quarter of the canvas to the side
        for a in strokes:
            for k in ("xs", "xc", "xe"):
                x = float(a[k])
                a[k] = round(x + 0.25 if x + 0.25 <= 1.0 else x - 0.25, 5)
        return out
    for c in out:
        a = c["arguments"]
        for key in ("image", "base_image"):
            if isinstance(a.get(key), str):
                a[key] = "img_1" if a[key] != "img_1" else "img_9"
                return out
    return out


def _replay_calls(calls: list[dict[str, Any]], label: str) -> ScriptFn:
    def act(messages: list[dict[str, Any]], episode: Any) -> str:
        step = len(episode.trajectory.turns)
        if step >= len(calls):
            why = "The reference solution is complete." if calls else "This task has no reference solution."
            return format_reply(why, terminate=True)
        c = calls[step]
        return format_reply(f"{label} step {step + 1}: {c['name']}.", {"name": c["name"], "arguments": c.get("arguments") or {}})

    return act


_STATELESS: dict[str, ScriptFn] = {
    "terminate": _terminate,
    "flip": _one_edit("Flip", {}, "Mirror the image.", "The image is mirrored."),
    "rotate90": _one_edit("Rotate", {"angle": 90}, "Rotate the image by 90 degrees.", "The image is rotated."),
    "crop_center": _one_edit("Crop", {"bbox": [250, 250, 750, 750]}, "Crop the centre of the image.", "The image is cropped."),
    "garbage": _garbage,
}
_PER_TASK = ("expected", "oracle", "oracle_wrong_param")
SCRIPT_NAMES: tuple[str, ...] = (*_STATELESS, *_PER_TASK)


def scripted_policy(name: str, task: Task | None = None) -> ScriptedPolicy:
    if name in _STATELESS:
        return ScriptedPolicy(_STATELESS[name], name=f"scripted:{name}")
    task = task or Task("")
    if name == "expected":
        return ScriptedPolicy(_expected(task), name="scripted:expected")
    calls = list(task.meta.get("reference_calls") or [])
    if name == "oracle":
        return ScriptedPolicy(_replay_calls(calls, "Reference"), name="scripted:oracle")
    if name == "oracle_wrong_param":
        return ScriptedPolicy(_replay_calls(wrong_param(calls), "Reference (one wrong parameter)"), name="scripted:oracle_wrong_param")
    raise ValueError(f"unknown scripted policy {name!r}; known: {', '.join(SCRIPT_NAMES)}")
