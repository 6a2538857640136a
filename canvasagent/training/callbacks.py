"""Run hygiene: metric log + per-component reward curves (PNG), and trajectory dumps."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from canvasagent.trajectory import Trajectory

log = logging.getLogger(__name__)


def plot_curves(history: list[dict[str, Any]], path: Path, title: str = "") -> Path | None:
    """One panel for the loss, one for every `rewards/<component>/mean` (and the total reward)."""
    import matplotlib

    matplotlib.use("Agg")  # headless: training machines have no display
    import matplotlib.pyplot as plt

    reward_keys = sorted({k for h in history for k in h if k.startswith("rewards/") and k.endswith("/mean")})
    if any("reward" in h for h in history):
        reward_keys.append("reward")
    has_loss = any("loss" in h for h in history)
    panels = (["loss"] if has_loss else []) + (["rewards"] if reward_keys else [])
    if not panels:
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 3.6), squeeze=False)
    for ax, panel in zip(axes[0], panels):
        keys = ["loss"] if panel == "loss" else reward_keys
        for k in keys:
            pts = [(h["step"], h[k]) for h in history if k in h and "step" in h]
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, ys, label=k.removeprefix("rewards/").removesuffix("/mean"), marker="." if len(xs) < 40 else None)
        ax.set_xlabel("step")
        ax.set_title(panel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


class RewardCurves(TrainerCallback):
    """Appends every log to `metrics.jsonl` and redraws `curves.png` at each save and at the end.

    The curve is drawn from `state.log_history`, which checkpoints carry, so a resumed run's
    picture includes the steps before the interruption.
    """

    def __init__(self, out_dir: Path, title: str = ""):
        self.out_dir = Path(out_dir)
        self.title = title

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and state.is_world_process_zero:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            with open(self.out_dir / "metrics.jsonl", "a") as fh:
                fh.write(json.dumps({"step": state.global_step, **logs}, default=float) + "\n")

    def _draw(self, state) -> None:
        if state.is_world_process_zero:
            plot_curves([{**h, "step": h.get("step", 0)} for h in state.log_history], self.out_dir / "curves.png", self.title)

    def on_save(self, args, state, control, **kwargs):
        self._draw(state)

    def on_train_end(self, args, state, control, **kwargs):
        self._draw(state)


class TrajectoryDumper:
    """Every `every` steps, saves that step's rollouts (trajectory.json + PNGs) and a JSONL index."""

    def __init__(self, out_dir: Path, every: int):
        self.out_dir = Path(out_dir)
        self.every = every
        self._done: set[int] = set()

    def __call__(self, step: int, trajs: list[Trajectory], scores: list[dict[str, float]]) -> None:
        if self.every <= 0 or step % self.every or step in self._done:
            return
        self._done.add(step)
        base = self.out_dir / f"step_{step:06d}"
        self.out_dir.mkdir(parents=True, exist_ok=True)
        with open(self.out_dir / "rollouts.jsonl", "a") as fh:
            for i, (traj, s) in enumerate(zip(trajs, scores)):
                path = traj.save(base / f"{i:03d}")
                fh.write(json.dumps({
                    "step": step, "rollout": i, "task_id": traj.task.id, "instruction": traj.task.instruction,
                    "stop_reason": traj.stop_reason, "tools": traj.tool_sequence, "scores": s,
                    "replies": [t.reply for t in traj.turns], "path": str(path.relative_to(self.out_dir)),
                }) + "\n")
        log.info("dumped %d rollouts of step %d to %s", len(trajs), step, base)


class CompleteCheckpoints(TrainerCallback):
    """Copy the base model's processor side files into each checkpoint so it loads standalone.

    The image-only processor (machines without torchvision) does not write the video processor
    config, and AutoProcessor refuses a Qwen3-VL folder without it.
    """

    FILES = ("video_preprocessor_config.json", "preprocessor_config.json", "chat_template.jinja")

    def __init__(self, base_dir: str | Path):
        self.base_dir = Path(base_dir)

    def on_save(self, args, state, control, **kwargs):
        import shutil

        ckpt = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if not ckpt.is_dir() or not self.base_dir.is_dir():
            return
        for name in self.FILES:
            if (self.base_dir / name).exists() and not (ckpt / name).exists():
                shutil.copy(self.base_dir / name, ckpt / name)
