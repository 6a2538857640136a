"""TRL `environment_factory` adapter: a thin shell over `canvasagent.core.episode.Episode`.

TRL makes one instance per rollout and calls `reset(**row)` before each episode; every public
method is a tool whose schema TRL derives from the signature and Google docstring. We generate
those methods from the tool registry (never a second tool list): each forwards its keyword
arguments to `Episode.call_tool`, so validation, asset IDs, execution and the trajectory record
are exactly those of every other user of the loop. A failing call is an observation, not an
exception, so the policy sees the same error text it would see at inference time.
"""

from __future__ import annotations

import inspect
import json
import logging
import threading
from typing import Any, Callable, Literal

from PIL import Image

from canvasagent.core.episode import Episode, EpisodeConfig
from canvasagent.core.protocol import parse_reply
from canvasagent.core.tasks import Task
from canvasagent.core.trajectory import Trajectory
from canvasagent.training.messages import reply_text
from toolserver.client import make_toolbox
from toolserver.config import ToolsConfig
from toolserver.registry import ArgSpec, ToolSpec, get_tool, tools

log = logging.getLogger(__name__)

_TOOLBOX_LOCK = threading.Lock()
_JSON_TO_PY = {"string": str, "integer": int, "number": float, "boolean": bool, "array": list, "object": dict}


def _hint(arg: ArgSpec) -> Any:
    if arg.choices:
        return Literal[tuple(arg.choices)]  # type: ignore[valid-type]  (-> JSON "enum")
    return _JSON_TO_PY.get(arg.json_type, str)


def _docstring(spec: ToolSpec) -> str:
    lines = [spec.description, ""]
    if spec.args:
        lines.append("Args:")
        lines += [f"    {a.name}: {a.description}" for a in spec.args]
    return "\n".join(lines)


def _tool_method(spec: ToolSpec) -> Callable:
    name = spec.name

    def method(self, **kwargs):
        return self._call(name, kwargs)

    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)] + [
        inspect.Parameter(a.name, inspect.Parameter.KEYWORD_ONLY,
                          default=inspect.Parameter.empty if a.required else None, annotation=_hint(a))
        for a in spec.args
    ]
    # The signature/annotations are what TRL (transformers.get_json_schema) reads; the body takes
    # **kwargs so unexpected or missing arguments reach the validator and the rule reward instead
    # of failing as a Python TypeError.
    method.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    method.__annotations__ = {a.name: _hint(a) for a in spec.args}
    method.__name__ = method.__qualname__ = name
    method.__doc__ = _docstring(spec)
    return method


def tool_specs(names: list[str] | tuple[str, ...] | None, family: str = "canvasagent") -> list[ToolSpec]:
    return [get_tool(n) for n in names] if names else list(tools(family))


def tool_functions(names: list[str] | tuple[str, ...] | None, family: str = "canvasagent") -> list[Callable]:
    """Plain functions with the env methods' schemas (for rendering the tool block without an env),
    sorted by name: the order TRL lists an environment's tools in, so SFT rows, GRPO rollouts and
    every evaluation of a checkpoint render the same tool block."""
    fns = []
    for spec in tool_specs(names, family):
        m = _tool_method(spec)
        sig = inspect.signature(m)
        m.__signature__ = sig.replace(parameters=list(sig.parameters.values())[1:])  # drop self
        fns.append(m)
    return sorted(fns, key=lambda f: f.__name__)


def task_from_row(row: dict[str, Any]) -> Task:
    """Rebuild the Task from a GRPO dataset row (`task` JSON + decoded `images`)."""
    data = row["task"]
    if isinstance(data, str):
        data = json.loads(data)
    task = Task.from_dict(data, list(row.get("images") or []))
    if row.get("reference_images"):
        task.meta["reference_images"] = list(row["reference_images"])
    return task


class CanvasEnv:
    """Base class; `make_env_class` adds the tool methods and the shared toolbox."""

    episode_config: EpisodeConfig = EpisodeConfig()
    _toolbox_factory: Callable[[], Any] | None = None
    _toolbox: Any = None  # one per process: the local toolbox is stateless, remote ones are clients
    # Opt-in: text-only observations (errors, OCR, an ended episode) also carry the latest asset
    # image. Off by default: SFT and evaluation render them without one (training/messages.py), so
    # GRPO would train on a layout never met at inference, and it costs image tokens per failed call.
    image_in_every_observation: bool = False

    def __init__(self) -> None:
        self.episode: Episode | None = None
        self._trajectory: Trajectory | None = None
        self.scores: dict[str, float] | None = None  # filled once per rollout by the reward adapter

    @classmethod
    def toolbox(cls) -> Any:
        # Rollouts call tools from a thread pool (trl_multimodal): the first callers may race here.
        if cls._toolbox is None:
            with _TOOLBOX_LOCK:
                if cls._toolbox is None:
                    assert cls._toolbox_factory is not None, "use make_env_class()"
                    cls._toolbox = cls._toolbox_factory()
        return cls._toolbox

    def reset(self, **row: Any) -> None:
        self.episode = Episode(self.toolbox(), self.episode_config)
        self.episode.reset(task_from_row(row))
        self._trajectory = None
        self.scores = None
        return None  # the prompt already holds the task; nothing to append

    def _call(self, name: str, arguments: dict[str, Any]) -> list[dict[str, Any]] | str:
        ep = self.episode
        assert ep is not None, "reset() first"
        if ep.done:
            return self._text_observation(f"Error: the episode has ended ({ep.trajectory.stop_reason}); reply with <Terminate>.")
        res = ep.call_tool(name, arguments)
        content = list((res.observation or {}).get("content") or [])
        if not any(p.get("type") == "image" for p in content):
            return self._text_observation("".join(p.get("text", "") for p in content))  # errors, OCR
        return content

    def _text_observation(self, text: str) -> list[dict[str, Any]] | str:
        if not self.image_in_every_observation:
            return text
        return [{"type": "image", "image": self._state_image()}, {"type": "text", "text": text}]

    def _state_image(self) -> Image.Image:
        last = self.episode.assets.last() if self.episode is not None else None
        # With no asset at all (a generation task before its first image) a small blank stands in.
        return last.image if last is not None else Image.new("RGB", (32, 32), (255, 255, 255))

    def _finalize(self, completion: list[dict[str, Any]]) -> Trajectory:
        """Complete the trajectory with the reply texts only the completion knows: each executed
        turn gets the raw reply that produced it (for the format checks), and a final reply without
        a call is stepped through the episode (terminate / no_call), as `run_episode` records it."""
        if self._trajectory is not None:
            return self._trajectory
        ep = self.episode
        assert ep is not None and ep.trajectory is not None
        traj = ep.trajectory
        turns = iter(list(traj.turns))
        for msg in completion:
            if msg.get("role") != "assistant":
                continue
            text = reply_text(msg)
            calls = msg.get("tool_calls") or []
            if calls:
                parsed = parse_reply(text)
                for j, _ in enumerate(calls):
                    turn = next(turns, None)
                    if turn is None:  # rolled back by TRL (over budget): nothing executed
                        break
                    turn.reply = text if j == 0 else ""
                    turn.reason = parsed.reason
                    turn.findings = list(parsed.findings) if j == 0 else []
                    turn.n_calls = len(calls) if j == 0 else 0
            elif not ep.done:
                ep.step(text)
        if not ep.done:
            ep.finish("max_turns" if len(traj.turns) >= ep.config.max_turns else "no_terminate")
        self._trajectory = traj
        return traj


def load_tools_config(cfg: Any):
    """The `ToolsConfig` a training config names (tools.config: a configs/tools name or a YAML path)."""
    tools_path = cfg.resolve(cfg.tools.config) if cfg.tools.config.endswith((".yaml", ".yml")) else None
    return ToolsConfig.load(str(tools_path) if tools_path else cfg.tools.config)


def toolbox_factory(cfg: Any) -> Callable[[], Any]:
    """Builds the toolbox on first use (a Ray/HTTP client connects only when a rollout needs it)."""
    return lambda: make_toolbox(load_tools_config(cfg))


def make_env_class(
    tool_names: list[str] | tuple[str, ...] | None,
    toolbox_factory: Callable[[], Any],
    max_turns: int,
    family: str = "canvasagent",
) -> type[CanvasEnv]:
    """A `CanvasEnv` subclass with one method per registry tool (schemas from the registry)."""
    specs = tool_specs(tool_names, family)
    attrs: dict[str, Any] = {s.name: _tool_method(s) for s in specs}
    for s in specs:
        attrs[s.name].__qualname__ = f"CanvasToolEnv.{s.name}"
    attrs["episode_config"] = EpisodeConfig(max_turns=max_turns, family=family, tools_in_system_prompt=False)
    attrs["_toolbox_factory"] = staticmethod(toolbox_factory)
    attrs["_toolbox"] = None
    attrs["tool_names"] = tuple(s.name for s in specs)
    return type("CanvasToolEnv", (CanvasEnv,), attrs)


def trajectory_of(env: CanvasEnv, completion: list[dict[str, Any]]) -> Trajectory:
    """The finished trajectory of one rollout (cached on the env until its next reset)."""
    return env._finalize(completion)
