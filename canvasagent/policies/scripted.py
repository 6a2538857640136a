"""Named scripted policies for `scripted:NAME` specs: baselines, smoke tests and failure drills.

- `terminate`: ends at once (the do-nothing baseline).
- `expected`: calls the task's expected tools in order with generic arguments, then terminates
  (a chain-following baseline that needs no model).
- `flip`: flips the newest image, then terminates (a one-step smoke test).
- `garbage`: emits unparseable text forever (drills the runner's guards).
"""

from __future__ import annotations

from typing import Any, Callable

from canvasagent.policies.replay import ScriptedPolicy
from canvasagent.protocol import format_reply
from canvasagent.tasks import Task
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


def _flip(messages: list[dict[str, Any]], episode: Any) -> str:
    if not episode.trajectory.turns:
        return format_reply("Mirror the image.", {"name": "Flip", "arguments": {"image": _newest(episode)}})
    return format_reply("The image is mirrored.", terminate=True)


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


_STATELESS: dict[str, ScriptFn] = {"terminate": _terminate, "flip": _flip, "garbage": _garbage}
SCRIPT_NAMES: tuple[str, ...] = (*_STATELESS, "expected")


def scripted_policy(name: str, task: Task | None = None) -> ScriptedPolicy:
    if name in _STATELESS:
        return ScriptedPolicy(_STATELESS[name], name=f"scripted:{name}")
    if name == "expected":
        return ScriptedPolicy(_expected(task or Task("")), name="scripted:expected")
    raise ValueError(f"unknown scripted policy {name!r}; known: {', '.join(SCRIPT_NAMES)}")
