"""Replay the assistant turns of a recorded trajectory through our loop, and compare.

Pure tools are re-executed for real, so a replay checks that our tools reproduce the recorded
pixels and echo texts. Model-backed tools (Grounding, SAM, OCR, Gen/Edit, SR) are fed their
recorded outputs when the record has them, because their models may not be available here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image

from canvasagent.core.episode import EpisodeConfig, run_episode
from canvasagent.core.formats.sharegpt import PublicTrajectory
from canvasagent.core.imageio import images_equal
from canvasagent.core.policies import ReplayPolicy
from canvasagent.core.protocol import parse_reply
from canvasagent.core.tasks import Task
from canvasagent.core.trajectory import Trajectory, save_image, write_json_atomic
from toolserver.registry import REGISTRY, Backend
from toolserver.toolbox import LocalToolbox, RecordedOutput


@dataclass
class RecordedStep:
    observation: str | None = None  # the recorded tool reply, echo included
    text: str | None = None  # echo removed
    image: Image.Image | None = None
    ok: bool = True


@dataclass
class ReplayInput:
    task: Task
    replies: list[str]
    recorded: list[RecordedStep | None] = field(default_factory=list)


def from_public(pt: PublicTrajectory) -> ReplayInput:
    steps = []
    for rt in pt.tool_turns:
        if rt is None:
            steps.append(None)
        else:
            ok = not rt.text.lstrip().lower().startswith("error")
            steps.append(RecordedStep(rt.full_text, rt.text, rt.images[0] if rt.images else None, ok))
    return ReplayInput(pt.task, pt.replies, steps)


def from_trajectory(traj: Trajectory) -> ReplayInput:
    steps: list[RecordedStep | None] = []
    for t in traj.turns:
        img = traj.assets.get(t.output_id).image if t.output_id and t.output_id in traj.assets else None
        steps.append(RecordedStep(t.observation, t.tool_text, img, t.status == "ok") if t.observation is not None else None)
    return ReplayInput(traj.task, [t.reply for t in traj.turns], steps)


def _seed_recorded(toolbox: LocalToolbox, rin: ReplayInput) -> None:
    """Queue recorded outputs of model-backed calls, in call order, for the toolbox to hand back."""
    for reply, step in zip(rin.replies, rin.recorded):
        call = parse_reply(reply).call
        if call is None or step is None or call.name not in REGISTRY:
            continue
        if REGISTRY[call.name].backend is Backend.MODEL and step.text is not None:
            toolbox.add_recorded(call.name, RecordedOutput(step.text, step.image, step.ok))


def replay(rin: ReplayInput, toolbox: LocalToolbox, max_turns: int | None = None) -> tuple[Trajectory, dict[str, Any]]:
    _seed_recorded(toolbox, rin)
    cfg = EpisodeConfig(max_turns=max_turns or max(len(rin.replies) + 1, 1))
    traj = run_episode(ReplayPolicy(rin.replies), rin.task, toolbox, cfg)
    steps = []
    for turn in traj.turns:
        rec = rin.recorded[turn.index] if turn.index < len(rin.recorded) else None
        step: dict[str, Any] = {
            "turn": turn.index, "tool": turn.call.name if turn.call else None,
            "arguments": turn.call.arguments if turn.call else None,
            **{k: getattr(turn, k) for k in ("status", "error_code", "error", "output_id", "imglist",
                                             "observation")},
        }
        if rec is not None and rec.observation is not None and turn.observation is not None:
            step["echo_match"] = turn.observation.strip() == rec.observation.strip()
        if rec is not None and rec.image is not None and turn.output_id:
            step["pixels_match"] = images_equal(traj.assets.get(turn.output_id).image, rec.image)
        steps.append(step)
    echo = [s["echo_match"] for s in steps if "echo_match" in s]
    pixels = [s["pixels_match"] for s in steps if "pixels_match" in s]
    report = {
        "task_id": rin.task.id,
        "stop_reason": traj.stop_reason,
        "final_asset_id": traj.final_asset_id,
        "imglist": traj.assets.ids(),
        "steps": steps,
        "summary": {
            "turns": len(traj.turns),
            "ok": sum(s["status"] == "ok" for s in steps),
            "errors": sum(s["status"] in ("error", "parse_error") for s in steps),
            "echo_matches": f"{sum(echo)}/{len(echo)}",
            "pixel_matches": f"{sum(pixels)}/{len(pixels)}",
        },
    }
    return traj, report


def write_report(traj: Trajectory, report: dict[str, Any], out_dir: str | Path) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for a in traj.assets:
        save_image(a.image, out / a.id)
    traj.save(out / "trajectory")
    return write_json_atomic(out / "report.json", report)
