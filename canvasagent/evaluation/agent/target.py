"""What the evaluation agent evaluates: one tool (e.g. ImageGeneration) or a whole policy.

Either way a probe becomes a core episode: a tool target is driven by a one-call script (the
probe's prompt fills the tool's text arguments), a policy target gets the probe as its task. The
episode's trajectory is then scored by the hybrid reward, whose judges run the probe's checks, so
the agent's evidence comes from the same tools and judges as training and evaluation.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable

from canvasagent.config import make_toolbox
from canvasagent.episode import EpisodeConfig, run_episode
from canvasagent.evaluation.agent.types import Probe, Sample
from canvasagent.policies.replay import ScriptedPolicy
from canvasagent.policies.scripted import generic_arguments
from canvasagent.protocol import format_reply
from canvasagent.tasks import Task
from canvasagent.trajectory import Trajectory
from toolserver.registry import REGISTRY, ArgType

log = logging.getLogger(__name__)

Scorer = Callable[[Trajectory], dict[str, float]]


class Target:
    def __init__(self, spec: str, tools_config: str = "offline", max_turns: int = 8):
        self.spec = spec
        self.tools_config = tools_config
        self.max_turns = max_turns
        self.tool = spec if spec in REGISTRY else None
        self._factory: Any = None
        if self.tool is None:
            from canvasagent.policies.spec import PolicyFactory

            self._factory = PolicyFactory(spec)  # raises PolicySpecError for a bad spec
        self.kind = "tool" if self.tool else "policy"

    def _tool_policy(self, probe: Probe) -> ScriptedPolicy:
        tool = self.tool
        assert tool is not None

        def act(messages: list[dict[str, Any]], episode: Any) -> str:
            if episode.trajectory.turns:
                return format_reply("The sample is produced.", terminate=True)
            args = generic_arguments(tool, episode, probe.prompt)
            for a in REGISTRY[tool].args:  # the probe's prompt is the text a generator is asked for
                if a.type is ArgType.TEXT:
                    args[a.name] = probe.prompt
            args.update(probe.args.get(tool, {}))
            return format_reply(f"Sample {tool} for the probe.", {"name": tool, "arguments": args})

        return ScriptedPolicy(act, name=f"tool:{tool}")

    def task(self, probe: Probe, task_id: str) -> Task:
        return Task(
            probe.prompt,
            probe.input_images(),
            id=task_id,
            expected_tools=[self.tool] if self.tool else [],
            checks=list(probe.checks),
        )

    def sample(self, probe: Probe, task_id: str, scorer: Scorer, out_dir: Path | None = None) -> Sample:
        task = self.task(probe, task_id)
        policy = self._tool_policy(probe) if self.tool else self._factory.for_task(task)
        toolbox = make_toolbox(self.tools_config)
        try:
            traj = run_episode(policy, task, toolbox, EpisodeConfig(max_turns=self.max_turns))
        finally:
            toolbox.close()
        output = None
        if out_dir is not None:
            traj.save(out_dir / task_id)
            final = traj.final_asset()
            if final is not None:
                output = f"{task_id}/assets/{final.id}.png"
        errors = [t.error for t in traj.turns if t.error]
        error = traj.meta.get("error") or (errors[-1] if errors and traj.final_asset() is None else None)
        try:
            scores = scorer(traj)
        except Exception as e:  # a judge failure is evidence too: recorded, not fatal
            log.warning("scoring sample %s failed: %s", task_id, e)
            scores, error = {}, error or f"scoring failed: {e}"
        checks = {k.split("/", 2)[2]: v for k, v in scores.items() if k.startswith("align/check/")}
        return Sample(
            prompt=probe.prompt,
            ok=traj.final_asset() is not None,
            scores={k: scores[k] for k in ("overall", "align", "aes", "traj", "rule") if k in scores},
            checks=checks,
            align_measured=scores.get("align/fallback", 1.0) < 0.5,
            error=error,
            output=output,
        )

    def close(self) -> None:
        if self._factory is not None:
            self._factory.close()
