"""The episode runner: policy -> reply -> parse -> validate -> execute -> observation.

`Episode` is a small environment contract in the style of SkyRL's: `reset(task)` returns the
opening messages, `step(reply)` plays one assistant turn, `call_tool(name, args)` executes a call
that someone else already parsed (TRL's environment methods), and `trajectory` is the record.
`run_episode` drives an `Episode` with any `Policy`. Nothing in a turn raises on bad input:
malformed replies and failing tools become error observations the policy can learn from.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

from PIL import Image

from canvasagent.core.assets import AssetStore, Provenance
from canvasagent.core.image_budget import apply_image_budget, check_budget
from canvasagent.core.imageio import DEFAULT_MAX_INPUT_PIXELS, ImageLoadError
from canvasagent.core.protocol import ToolCall, echo_plain, echo_saved, parse_reply, render_system_prompt
from canvasagent.core.tasks import Task
from canvasagent.core.trajectory import Trajectory, Turn
from toolserver.registry import REGISTRY, Backend
from toolserver.request import ToolRequest
from toolserver.results import ToolResult
from toolserver.toolbox import Toolbox
from toolserver.validation import CallCheck, Profile, validate_call

log = logging.getLogger(__name__)

Message = dict[str, Any]
StatefulHandler = Callable[[ToolRequest], ToolResult]


@dataclass
class EpisodeConfig:
    max_turns: int = 12
    family: str = "canvasagent"
    max_input_pixels: int = DEFAULT_MAX_INPUT_PIXELS
    tools_in_system_prompt: bool = True
    # End the episode ("no_terminate") at a reply with neither a call nor <Terminate>, as a GRPO
    # rollout does; otherwise the reply gets an error observation and the policy is asked again.
    end_without_call: bool = False
    # canvasagent.core.image_budget: show the policy the last N tool images, older ones as text (None: all).
    image_budget: int | None = None

    def __post_init__(self) -> None:
        check_budget(self.image_budget)


@dataclass
class StepResult:
    turn: Turn
    observation: Message | None
    done: bool


def user_content(task: Task, images: bool = False) -> list[dict[str, Any]]:
    """The user turn: "img_i:" and each image, then the instruction. The images are placeholders
    (training rows: TRL fills them from the row's `images`) unless `images`, as a policy is shown them."""
    content: list[dict[str, Any]] = []
    for i, img in enumerate(task.images, start=1):
        content += [{"type": "text", "text": f"img_{i}:"}, {"type": "image", "image": img} if images else {"type": "image"}]
    content.append({"type": "text", "text": task.instruction})
    return content


def user_message(task: Task) -> Message:
    return {"role": "user", "content": user_content(task, images=True)}


def observation_message(text: str, image: Image.Image | None) -> Message:
    content: list[dict[str, Any]] = []
    if image is not None:
        content.append({"type": "image", "image": image})
    content.append({"type": "text", "text": text})
    return {"role": "tool", "content": content}


class Episode:
    def __init__(
        self,
        toolbox: Toolbox,
        config: EpisodeConfig | None = None,
        stateful: dict[str, StatefulHandler] | None = None,
    ):
        self.toolbox = toolbox
        self.config = config or EpisodeConfig()
        self.stateful = dict(stateful or {})
        self.messages: list[Message] = []
        self.trajectory: Trajectory | None = None
        self.done = False

    @property
    def profile(self) -> Profile:
        return getattr(self.toolbox, "profile", Profile.CANVASCRAFT)

    def _limits(self) -> dict[str, Any]:
        """The toolbox's configured text limit (tools config `limits:`), when it has one."""
        n = getattr(getattr(self.toolbox, "limits", None), "max_text_chars", None)
        return {"max_text_chars": n} if isinstance(n, int) else {}

    @property
    def assets(self) -> AssetStore:
        assert self.trajectory is not None, "call reset() first"
        return self.trajectory.assets

    def reset(self, task: Task) -> list[Message]:
        store = AssetStore()
        for img in task.images:
            if img.width * img.height > self.config.max_input_pixels:
                raise ImageLoadError(
                    f"input image is {img.width}x{img.height}, over the {self.config.max_input_pixels:,}-pixel limit"
                )
            store.add_input(img)
        system = render_system_prompt(task.family or self.config.family, include_tools=self.config.tools_in_system_prompt)
        self.trajectory = Trajectory(task=task, assets=store, system_prompt=system, meta={"profile": self.profile.value})
        self.messages = [{"role": "system", "content": [{"type": "text", "text": system}]}, user_message(task)]
        self.done = False
        return self.messages

    def context(self) -> list[Message]:
        """The messages a policy is shown now: `messages` under the config's image budget
        (`messages` itself when there is none)."""
        return apply_image_budget(self.messages, self.config.image_budget)[0]

    def step(self, reply: str, policy_s: float = 0.0) -> StepResult:
        traj = self._require_running()
        parsed = parse_reply(reply)
        turn = Turn(
            index=len(traj.turns),
            reply=parsed.text,
            reason=parsed.reason,
            findings=list(parsed.findings),
            n_calls=len(parsed.calls) or parsed.text.count("<tool_call>"),
            policy_s=policy_s,
        )
        self.messages.append({"role": "assistant", "content": [{"type": "text", "text": parsed.text}]})
        obs: Message | None = None
        if parsed.blocked:
            turn.status = "parse_error"
            blocking = [f for f in parsed.findings if f.blocking]
            turn.error_code = blocking[0].code.value
            turn.error = "; ".join(f.message for f in blocking)
            obs = self._error_observation(turn, turn.error)
        elif parsed.call is not None:
            obs = self._execute(parsed.call, turn)
            if parsed.terminate and not self.done:
                self._finish("terminate")
        elif parsed.terminate:
            turn.status = "terminate"
            turn.imglist = self.assets.ids()
            self._finish("terminate")
        else:
            turn.status = "no_call"
            turn.error_code = "no_action"
            turn.error = "no tool call and no <Terminate>: call one tool or end with <Terminate>"
            obs = self._error_observation(turn, turn.error)
        traj.turns.append(turn)
        if obs is not None:
            self.messages.append(obs)
        if not self.done and len(traj.turns) >= self.config.max_turns:
            self._finish("max_turns")
        elif not self.done and self.config.end_without_call and turn.status in ("parse_error", "no_call"):
            self._finish("no_terminate")
        return StepResult(turn, obs, self.done)

    def call_tool(self, name: str, arguments: dict[str, Any], reply: str = "") -> StepResult:
        """Execute an already-parsed call as one turn (TRL parses calls itself)."""
        traj = self._require_running()
        turn = Turn(index=len(traj.turns), reply=reply, n_calls=1)
        obs = self._execute(ToolCall(name, arguments), turn)
        traj.turns.append(turn)
        if not self.done and len(traj.turns) >= self.config.max_turns:
            self._finish("max_turns")
        return StepResult(turn, obs, self.done)

    def finish(self, reason: str, error: str | None = None) -> Trajectory:
        traj = self.trajectory
        assert traj is not None
        if not self.done:
            self._finish(reason)
        if error:
            traj.meta["error"] = error
        return traj

    def close(self) -> None:
        if self.trajectory is not None and not self.done:
            self._finish("interrupted")

    def _require_running(self) -> Trajectory:
        if self.trajectory is None:
            raise RuntimeError("call reset(task) before step()")
        if self.done:
            raise RuntimeError(f"episode already ended ({self.trajectory.stop_reason})")
        return self.trajectory

    def _finish(self, reason: str) -> None:
        self.done = True
        assert self.trajectory is not None
        self.trajectory.stop_reason = reason

    def _error_observation(self, turn: Turn, message: str) -> Message:
        turn.observation = echo_plain(f"Error: {message}", self.assets.imglist_text())
        turn.imglist = self.assets.ids()
        return observation_message(turn.observation, None)

    def _request(self, call: ToolCall, check: CallCheck) -> ToolRequest:
        spec = REGISTRY[call.name]
        images: dict[str, Image.Image] = {}
        for arg in spec.asset_args():
            aid = check.args.get(arg.name)
            if aid is not None:
                images[arg.name] = self.assets.get(aid).image
        if call.name == "Overlayer" and check.args.get("overlay_type") == "object":
            images["content"] = self.assets.get(check.args["content"]).image
        args = {k: v for k, v in check.args.items() if k != "__refs__"}
        return ToolRequest(call.name, args, images, dict(call.arguments), self.profile)

    def _execute(self, call: ToolCall, turn: Turn) -> Message:
        turn.call = call
        check = validate_call(call.name, call.arguments, self.assets, self.profile, **self._limits())
        turn.check = check.to_dict()
        if not check.executable:
            turn.status = "error"
            first = check.first_error()
            turn.error_code = first.code if first else "invalid_call"
            turn.error = check.error_message()
            return self._error_observation(turn, turn.error)

        spec = REGISTRY[call.name]
        request = self._request(call, check)
        t0 = time.perf_counter()
        handler = self.stateful.get(spec.name) if spec.backend is Backend.STATEFUL else self.toolbox.call
        result = handler(request) if handler else ToolResult.failure(
            "no_environment_state", f"{spec.name} needs an environment with a canvas (an EASEL task)")
        turn.tool_s = time.perf_counter() - t0
        turn.plumbing_only = result.plumbing_only
        turn.result_data = dict(result.data)
        turn.tool_text = result.text
        # A stateful environment can end the episode from a tool result, even a failed one
        # (a rejected stroke can spend the last step of an EASEL budget).
        end = result.data.get("end_episode") or ("submit" if result.data.get("submitted") else None)
        if not result.ok:
            turn.status = "error"
            turn.error_code = result.error_code or "tool_failed"
            turn.error = result.text
            obs = self._error_observation(turn, result.text)
            if end:
                self._finish(str(end))
            return obs

        turn.status = "ok"
        store = self.assets
        if spec.output.registers_asset and result.image is not None:
            kind = result.kind if result.kind.registers_asset else spec.output
            prov = Provenance(turn.index, spec.name, dict(call.arguments), tuple(check.referenced_ids()))
            asset = store.register_output(spec.name, result.image, kind, prov, result.plumbing_only)
            turn.output_id = asset.id
            turn.observation = echo_saved(result.text, asset.id, store.imglist_text())
        else:
            turn.observation = echo_plain(result.text, store.imglist_text())
        turn.imglist = store.ids()
        if end:
            self._finish(str(end))
        return observation_message(turn.observation, result.image)


TurnCallback = Callable[[Turn, Episode], None]


def run_episode(
    policy: Any,
    task: Task,
    toolbox: Toolbox,
    config: EpisodeConfig | None = None,
    stateful: dict[str, StatefulHandler] | None = None,
    on_turn: TurnCallback | None = None,
) -> Trajectory:
    """Run `policy` on `task` until <Terminate>, submit or the turn budget; always returns a trajectory."""
    ep = Episode(toolbox, config, stateful)
    ep.reset(task)
    traj = ep.trajectory
    assert traj is not None
    traj.meta["policy"] = getattr(policy, "name", type(policy).__name__)
    try:
        while not ep.done:
            t0 = time.perf_counter()
            try:
                reply = policy.act(ep.context(), ep)
            except Exception as e:  # an endpoint down or a crashing model: keep what we have
                log.warning("policy %s failed: %s", traj.meta["policy"], e)
                ep.finish("policy_error", f"{type(e).__name__}: {e}")
                break
            res = ep.step(reply, policy_s=time.perf_counter() - t0)
            if on_turn is not None:
                on_turn(res.turn, ep)
    except KeyboardInterrupt:
        ep.finish("interrupted")
    return traj
