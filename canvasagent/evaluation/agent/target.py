"""What is evaluated: one registry tool, a generation backend, or a policy spec, run on probes.

A tool (or a generation backend) is called once per probe through the episode runner, with the
probe's input as `img_1` and the probe's arguments, so the call goes through the same
validation and toolbox as training and evaluation. A policy gets the probe as a task (its
instruction, input images and expected tools) and runs its own episode; its last produced
image is the output. One toolbox serves a whole evaluation, so model backends load once.

`unavailable(plan)` says, before any probe, why a target cannot be evaluated with this tools
config (a model tool with no backend, a measurement that needs OCR when OCR has none); at run
time a `backend_not_configured` error or a random-weight (plumbing-only) result says the same.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from PIL import Image

from canvasagent.core.episode import EpisodeConfig, run_episode
from canvasagent.evaluation.agent.probes import SUITES, Case, Output
from canvasagent.evaluation.agent.types import Plan
from canvasagent.core.policies.replay import ScriptedPolicy
from canvasagent.core.protocol import format_reply
from canvasagent.core.tasks import Task
from toolserver.client import make_toolbox
from toolserver.config import ToolsConfig
from toolserver.registry import REGISTRY, ArgType, Backend
from toolserver.request import ToolRequest

log = logging.getLogger(__name__)

NOT_CONFIGURED = "backend_not_configured"


class Target:
    """`spec` is a registry tool name or a policy spec (`scripted:expected`, `openai:…`, `hf:…`)."""

    def __init__(self, spec: str, tools_config: str = "offline", max_turns: int = 6):
        self.spec = spec
        self.tools_config = tools_config
        self.max_turns = max_turns
        self.tool = spec if spec in REGISTRY else None
        self._factory: Any = None
        if self.tool is None:
            from canvasagent.policy_spec import PolicyFactory

            self._factory = PolicyFactory(spec)  # raises PolicySpecError for a bad spec
        self.kind = "policy" if self.tool is None else "tool"
        self._cfg = ToolsConfig.load(tools_config)
        self._toolbox: Any = None

    @property
    def toolbox(self) -> Any:
        if self._toolbox is None:
            self._toolbox = make_toolbox(self._cfg)
        return self._toolbox

    def _configured(self, tool: str) -> bool | None:
        """True/False for an in-process toolbox; None when only a call can tell (remote)."""
        if REGISTRY[tool].backend is not Backend.MODEL:
            return True
        if self._cfg.client != "local":
            return None
        b = self._cfg.backends.get(tool)
        return b is not None and b.name not in (None, "", "none")

    def unavailable(self, plan: Plan) -> str | None:
        if plan.property is None:
            return None
        if self.tool is not None and self._configured(self.tool) is False:
            what = "generation backend" if plan.target_kind == "generator" else "model backend"
            return f"{self.tool} needs a {what} and tools config '{self.tools_config}' configures none (set backends.{self.tool})"
        if SUITES[plan.property].needs_ocr and self._configured("OCR") is False:
            return f"measuring {plan.property} reads the output with OCR, and tools config '{self.tools_config}' has no OCR backend"
        return None

    def ocr(self, image: Image.Image) -> tuple[list[str], list[list[int]]]:
        """OCR lines and pixel boxes of an image (the measurement of text suites)."""
        r = self.toolbox.call(ToolRequest("OCR", {}, {"image": image}, {}, self.toolbox.profile))
        if not r.ok:
            raise RuntimeError(f"OCR failed while measuring: {r.text}")
        return list(r.data.get("lines") or []), [list(b) for b in r.data.get("boxes") or []]

    def _tool_policy(self, tool: str, case: Case) -> ScriptedPolicy:
        def act(messages: list[dict[str, Any]], episode: Any) -> str:
            if episode.trajectory.turns:
                return format_reply("Done.", terminate=True)
            args: dict[str, Any] = {a.name: "img_1" for a in REGISTRY[tool].args if a.type is ArgType.ASSET and a.required}
            args.update(case.args)
            return format_reply(f"Call {tool} on the probe.", {"name": tool, "arguments": args})

        return ScriptedPolicy(act, name=f"tool:{tool}")

    def run(self, case: Case, probe_id: str, out_dir: Path | None = None) -> Output:
        task = Task(case.instruction or f"Probe {probe_id}", list(case.images), id=probe_id, expected_tools=list(case.expected_tools))
        policy = self._tool_policy(self.tool, case) if self.tool else self._factory.for_task(task)
        traj = run_episode(policy, task, self.toolbox, EpisodeConfig(max_turns=self.max_turns))
        if out_dir is not None:
            traj.save(out_dir / probe_id)
        turns = [t for t in traj.turns if t.call is not None]
        final = traj.final_asset()
        out = Output(image=final.image if final is not None else None, plumbing_only=traj.plumbing_only)
        if turns:
            last = turns[-1]
            out.text, out.data = last.tool_text, dict(last.result_data)
            errs = [t for t in turns if t.error]
            if errs and (final is None and last.error):
                out.error, out.error_code = errs[-1].error, errs[-1].error_code
        elif traj.meta.get("error"):
            out.error = str(traj.meta["error"])
        if out.image is None and out.error is None and self.tool is None:
            out.error = f"the policy produced no image (stop: {traj.stop_reason}, {len(turns)} tool call(s))"
        return out

    def close(self) -> None:
        if self._toolbox is not None:
            self._toolbox.close()
        if self._factory is not None:
            self._factory.close()
