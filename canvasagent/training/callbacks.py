"""Run hygiene: metric log + per-component reward curves (PNG), and trajectory dumps."""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from canvasagent.core.plotting import EMA_WEIGHT, ema, figure
from canvasagent.core.trajectory import Trajectory

log = logging.getLogger(__name__)


# Training diagnostics drawn by `plot_curves`: (panel title, metric keys). Keys are TRL's (`loss`,
# `reward`, `reward_std`, `frac_reward_zero_std`, `kl` (beta > 0 only), `entropy`, `clip_ratio/*`,
# `completions/*`, `tools/*`, `rewards/<reward function>/{mean,std}`), TRLRewards' logged-only ones
# included. Stand-ins: COMPONENTS/{mean,std} are the reward components' keys, "rewards/<name>/*"
# every per-source `<name>/<source>` (TRLRewards.PER_SOURCE). Panels without data are left out.
COMPONENTS = "COMPONENTS"
PANELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("loss", ("loss",)),
    ("reward (mean per component)", ("reward", f"{COMPONENTS}/mean")),
    ("reward per source (hybrid)", ("rewards/hybrid/*",)),
    ("reward std per component", ("reward_std", f"{COMPONENTS}/std")),
    ("groups without reward spread", ("frac_reward_zero_std",)),
    ("tool use", ("tools/call_frequency", "rewards/tool_calls/mean", "rewards/no_tool/mean", "tools/failure_frequency")),
    ("no-tool share per source", ("rewards/no_tool/*",)),
    ("format validity", ("rewards/format_validity/mean", "rewards/format_validity/*")),
    ("completion length (tokens)", ("completions/mean_length",)),
    ("KL and entropy", ("kl", "entropy")),
    ("clip ratio", ("clip_ratio/region_mean", "clip_ratio/low_mean", "clip_ratio/high_mean")),
    ("judge fallbacks", ("rewards/judge_fallbacks/mean",)),
    ("greedy members (reward; minus their group's samples)", ("greedy/reward", "greedy/minus_sampled")),
    ("SFT token accuracy", ("mean_token_accuracy",)),
)


def _series(history: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    pts = [(h["step"], float(h[key])) for h in history
           if "step" in h and isinstance(h.get(key), (int, float)) and math.isfinite(float(h[key]))]
    return ([x for x, _ in pts], [y for _, y in pts])


def _component_keys(keys: list[str], stat: str) -> list[str]:
    from canvasagent.training.rewarding import TRLRewards

    diagnostic = tuple(f"rewards/{n}/" for n in (*TRLRewards.LOGGED, *TRLRewards.PER_SOURCE))
    return [k for k in keys if k.startswith("rewards/") and k.endswith(f"/{stat}") and not k.startswith(diagnostic)]


def curve_panels(history: list[dict[str, Any]]) -> dict[str, list[str]]:
    """The panels `plot_curves` draws for this history: title -> the keys with at least one finite value."""
    keys = sorted({k for h in history for k in h})
    out: dict[str, list[str]] = {}
    for title, patterns in PANELS:
        chosen: list[str] = []
        for p in patterns:
            if p.startswith(COMPONENTS):
                matches = _component_keys(keys, p.rsplit("/", 1)[1])
            elif p.endswith("*"):  # per source: rewards/<name>/<source>/mean
                matches = [k for k in keys if k.startswith(p[:-1]) and k.endswith("/mean") and k.count("/") == 3]
            else:
                matches = [p]
            chosen += [k for k in matches if k not in chosen and _series(history, k)[0]]
        if chosen:
            out[title] = chosen
    return out


def _label(key: str) -> str:
    return key.removeprefix("rewards/").removesuffix("/mean")


def plot_curves(history: list[dict[str, Any]], path: Path, title: str = "") -> Path | None:
    """One panel per diagnostic in `PANELS` that has data: each key raw (thin) and smoothed (EMA,
    solid). Returns the PNG path, or None when nothing was logged."""
    panels = curve_panels(history)
    if not panels:
        return None
    ncols = min(3, len(panels))
    nrows = -(-len(panels) // ncols)
    path.parent.mkdir(parents=True, exist_ok=True)
    with figure(path, nrows, ncols, figsize=(5.2 * ncols, 3.3 * nrows), squeeze=False, save_dpi=80) as (fig, axes):
        flat = [ax for row in axes for ax in row]
        for ax, (panel, keys) in zip(flat, panels.items()):
            for i, k in enumerate(keys):
                xs, ys = _series(history, k)
                color = f"C{i % 10}"
                ax.plot(xs, ys, color=color, alpha=0.35, linewidth=0.8, marker="." if len(xs) < 40 else None)
                ax.plot(xs, ema(ys), color=color, linewidth=1.6, label=_label(k))
            ax.set_xlabel("step")
            ax.set_title(panel, fontsize=9)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=6)
        for ax in flat[len(panels):]:
            ax.axis("off")
        fig.suptitle((title + "  " if title else "") + f"(thin: raw, solid: EMA {EMA_WEIGHT})", fontsize=9)
    return path


@dataclass
class ToolCollapse:
    """The tool-collapse rule: warn when the share of rollouts that call no tool
    (`key`, TRLRewards' `no_tool` mean) is at least `share` on `steps` logged steps in a row.
    The warning is given once per streak; a step below `share` ends the streak."""

    share: float = 0.9
    steps: int = 3
    key: str = "rewards/no_tool/mean"
    streak: int = 0

    def update(self, logs: dict[str, Any], step: int) -> bool:
        """Feed one logged step; True (and a `logging` warning) when this step completes a collapse."""
        v = logs.get(self.key)
        if not isinstance(v, (int, float)) or not math.isfinite(float(v)):
            return False
        self.streak = self.streak + 1 if v >= self.share else 0
        if self.streak != self.steps:
            return False
        log.warning("tool use collapsed: %.0f%% or more of the rollouts called no tool on %d logged steps in a row "
                    "(step %d: %.0f%%)", 100 * self.share, self.steps, step, 100 * float(v))
        return True


def keep_logs_through(path: Path, step: int) -> int:
    """Rewrite the metrics log at `path` (if any) with only its records of steps <= `step`, in order;
    a line that is not a JSON object with an integer step (the half-written last line of a killed
    run) goes too. Returns how many lines were dropped. The steps after a resumed run's checkpoint
    are trained again, so their first logs describe updates the run no longer holds."""
    if not path.exists():
        return 0
    lines = path.read_text().splitlines()
    kept = [line for line in lines if (logged := _logged_step(line)) is not None and logged <= step]
    if len(kept) < len(lines):
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        os.replace(tmp, path)
        log.info("%s: dropped %d logged lines after step %d (the resumed run redoes them)", path, len(lines) - len(kept), step)
    return len(lines) - len(kept)


def _logged_step(line: str) -> int | None:
    try:
        rec = json.loads(line)
    except ValueError:
        return None
    step = rec.get("step") if isinstance(rec, dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


class RewardCurves(TrainerCallback):
    """Appends every log to `metrics.jsonl` and redraws `curves.png` at each save and at the end.

    The curve comes from `state.log_history`, which checkpoints carry, so a resumed run's picture
    includes the earlier steps. A log that completes a tool collapse (the `collapse` rule) carries
    `tool_collapse: 1` in metrics.jsonl. At the start of a run, metrics.jsonl keeps only the logs of
    the steps its checkpoint holds (`keep_logs_through`): a resumed run redoes the later ones.
    """

    def __init__(self, out_dir: Path, title: str = "", collapse: ToolCollapse | None = None):
        self.out_dir = Path(out_dir)
        self.title = title
        self.collapse = collapse or ToolCollapse()

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            keep_logs_through(self.out_dir / "metrics.jsonl", state.global_step)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and state.is_world_process_zero:
            extra = {"tool_collapse": 1} if self.collapse.update(logs, state.global_step) else {}
            self.out_dir.mkdir(parents=True, exist_ok=True)
            with open(self.out_dir / "metrics.jsonl", "a") as fh:
                fh.write(json.dumps({"step": state.global_step, **logs, **extra}, default=float) + "\n")

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            plot_curves([{**h, "step": h.get("step", 0)} for h in state.log_history], self.out_dir / "curves.png", self.title)

    on_train_end = on_save


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
    """Copy the base model's processor side files into each checkpoint so it loads standalone: the
    image-only processor (no torchvision) does not write the video processor config, and
    AutoProcessor refuses a Qwen3-VL folder without it."""

    FILES = ("video_preprocessor_config.json", "preprocessor_config.json", "chat_template.jinja")

    def __init__(self, base_dir: str | Path):
        self.base_dir = Path(base_dir)

    def on_save(self, args, state, control, **kwargs):
        ckpt = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if not ckpt.is_dir() or not self.base_dir.is_dir():
            return
        for name in self.FILES:
            if (self.base_dir / name).exists() and not (ckpt / name).exists():
                shutil.copy(self.base_dir / name, ckpt / name)
