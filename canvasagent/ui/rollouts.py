"""Reading GRPO trajectory dumps and evaluation runs for the rollout viewer (no Gradio here).

Two layouts are read:

* a GRPO dump (`TrajectoryDumper`): `<root>/rollouts.jsonl`, one line per rollout with `step`,
  `rollout`, `task_id`, `scores` (each reward component plus `hybrid`) and `path` (the
  rollout's `trajectory.json`, relative to the root). The root may also be the training output
  dir holding `trajectories/`.
* an evaluation run (`EvalRunner`): `<root>/trajectories/<task>/trajectory.json` and
  `result.json`, or `<task>/sample_<j>/` for several samples of one task.

A *group* is the set of rollouts of one prompt: in a GRPO step, the rollouts with the same task
id (TRL samples `num_generations` completions per prompt); in an eval run, the samples of one
task. The advantage is recomputed from the dumped hybrid rewards the way GRPO does it: the reward
minus its group's mean, divided by the group's sample standard deviation when `scale_rewards`
is "group" (or the batch's, for "batch"). Eval runs have no advantage.

Every file path read from a dump is resolved inside the root; a line pointing elsewhere, a
missing file or an unreadable line is skipped and reported in `RolloutSet.problems`, never
raised, so one bad rollout does not hide the others.
"""

from __future__ import annotations

import json
import logging
import math
import re
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rewards.hybrid import canonical_scores

log = logging.getLogger(__name__)

EVAL_STEP = "eval"
SORTS = ("reward ↓", "reward ↑", "advantage ↓", "advantage ↑", "order")
SCALES = ("group", "batch", "none")
_SAFE_ID = re.compile(r"^[A-Za-z0-9_.\-]{1,120}$")


class RolloutError(ValueError):
    """The folder is neither a GRPO dump nor an eval run."""


@dataclass
class Rollout:
    step: str  # the GRPO global step as text, or "eval"
    group: str  # the task id of the prompt
    index: int  # position in its step's batch (GRPO) or sample number (eval)
    path: Path  # the trajectory.json
    scores: dict[str, float] = field(default_factory=dict)
    reward: float = 0.0  # the scores' `hybrid`
    advantage: float | None = None
    stop_reason: str = ""
    tools: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # "turn k: code: message" for each failed turn
    instruction: str = ""

    @property
    def key(self) -> str:
        """A stable name for pickers: `step/group/#index`."""
        return f"{self.step}/{self.group}/#{self.index}"


@dataclass
class RolloutSet:
    root: Path
    kind: str  # "grpo" or "eval"
    rollouts: list[Rollout]
    problems: list[str] = field(default_factory=list)

    def steps(self) -> list[str]:
        return list(dict.fromkeys(r.step for r in self.rollouts))

    def groups(self, step: str | None = None) -> list[str]:
        return list(dict.fromkeys(r.group for r in self.rollouts if step in (None, "", r.step)))

    def get(self, key: str) -> Rollout:
        for r in self.rollouts:
            if r.key == key:
                return r
        raise KeyError(f"no rollout {key!r} in {self.root}")


def _inside(root: Path, rel: Any) -> Path | None:
    """`root/rel` if it stays inside `root` (no absolute path, no `..` escape), else None."""
    if not isinstance(rel, str) or not rel or "\x00" in rel:
        return None
    p = Path(rel)
    if p.is_absolute():
        return None
    full = (root / p).resolve()
    return full if full.is_relative_to(root.resolve()) else None


def _finite(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _int(v: Any, default: int) -> int:
    try:
        return int(v)
    except (TypeError, ValueError, OverflowError):
        return default


def _read_traj(path: Path) -> dict[str, Any] | None:
    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) and isinstance(d.get("turns"), list) else None


def _errors(traj: dict[str, Any]) -> list[str]:
    return [f"turn {_int(t.get('index'), i) + 1}: {t.get('error_code') or t.get('status')}: {t.get('error') or ''}".rstrip(": ")
            for i, t in enumerate(traj.get("turns", [])) if isinstance(t, dict) and t.get("status") not in ("ok", "terminate", None)]


def _tools(traj: dict[str, Any]) -> list[str]:
    return [t["call"]["name"] for t in traj.get("turns", []) if isinstance(t, dict) and isinstance(t.get("call"), dict) and "name" in t["call"]]


def advantages(rewards: list[float], groups: list[str], scale: str = "group", eps: float = 1e-4) -> list[float]:
    """GRPO advantages of `rewards` as TRL computes them: minus the group mean, then over the
    group's (or the batch's) sample standard deviation plus `eps`, unless `scale` is "none"."""
    if scale not in SCALES:
        raise ValueError(f"scale_rewards must be one of {', '.join(SCALES)}, not {scale!r}")
    by: dict[str, list[float]] = {}
    for r, g in zip(rewards, groups):
        by.setdefault(g, []).append(r)

    def std(xs: list[float]) -> float:  # with Bessel's correction, like TRL's nanstd
        if len(xs) < 2:
            return 0.0
        m = sum(xs) / len(xs)
        return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))

    batch_std = std(rewards) if rewards else 0.0
    out = []
    for r, g in zip(rewards, groups):
        xs = by[g]
        a = r - sum(xs) / len(xs)
        if scale == "group":
            a /= std(xs) + eps
        elif scale == "batch":
            a /= batch_std + eps
        out.append(a)
    return out


def load(root: str | Path, scale_rewards: str = "group") -> RolloutSet:
    """Read a GRPO dump or an eval run under `root` (see the module doc). Raises RolloutError
    when `root` is neither; per-rollout problems go to `RolloutSet.problems`."""
    root = Path(root).expanduser()
    if not root.is_dir():
        raise RolloutError(f"{root} is not a folder")
    for cand in (root, root / "trajectories"):
        if (cand / "rollouts.jsonl").is_file():
            return _load_grpo(cand, scale_rewards)
    trajs = root / "trajectories" if (root / "trajectories").is_dir() else root
    if any(trajs.glob("*/trajectory.json")) or any(trajs.glob("*/sample_*/trajectory.json")):
        return _load_eval(trajs)
    raise RolloutError(f"{root} holds no GRPO dump (rollouts.jsonl) and no eval run (trajectories/<task>/trajectory.json)")


def _load_grpo(root: Path, scale: str) -> RolloutSet:
    rs = RolloutSet(root, "grpo", [])
    seen: set[tuple[str, int]] = set()
    for n, line in enumerate((root / "rollouts.jsonl").read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            step, idx = str(int(d["step"])), int(d["rollout"])
        except (ValueError, KeyError, TypeError, OverflowError):  # OverflowError: int(inf)
            rs.problems.append(f"rollouts.jsonl line {n}: not a rollout record")
            continue
        path = _inside(root, d.get("path"))
        if path is None:
            rs.problems.append(f"rollouts.jsonl line {n}: path {d.get('path')!r} is outside {root}")
            continue
        traj = _read_traj(path)
        if traj is None:
            rs.problems.append(f"rollouts.jsonl line {n}: {path} is missing or not a trajectory")
            continue
        if (step, idx) in seen:  # a resumed run can dump a step twice: keep the newest
            rs.rollouts = [r for r in rs.rollouts if (r.step, r.index) != (step, idx)]
        seen.add((step, idx))
        scores = _scores(d.get("scores"))
        rs.rollouts.append(Rollout(
            step, str(d.get("task_id") or (traj.get("task") or {}).get("id") or "?"), idx, path, scores,
            scores.get("hybrid", 0.0), None, str(d.get("stop_reason") or traj.get("stop_reason") or ""),
            _tools(traj), _errors(traj), str(d.get("instruction") or ""),
        ))
    for step in rs.steps():
        rows = [r for r in rs.rollouts if r.step == step]
        for r, a in zip(rows, advantages([r.reward for r in rows], [r.group for r in rows], scale)):
            r.advantage = a
    return rs


def _scores(saved: Any) -> dict[str, float]:
    """A saved score dict's finite values, in the reward vocabulary (legacy total names read as `hybrid`)."""
    return {str(k): f for k, v in canonical_scores(saved or {}).items() if (f := _finite(v)) is not None}


def _load_eval(trajs: Path) -> RolloutSet:
    rs = RolloutSet(trajs.parent, "eval", [])
    for task_dir in sorted(p for p in trajs.iterdir() if p.is_dir()):
        result: dict[str, Any] = {}
        with suppress(OSError, ValueError):  # not scored yet: shown with reward 0 and no scores
            result = json.loads((task_dir / "result.json").read_text())
        samples = sorted(task_dir.glob("sample_*/trajectory.json"), key=lambda p: int(p.parent.name.split("_")[1]) if p.parent.name.split("_")[1].isdigit() else 0)
        paths = samples or ([task_dir / "trajectory.json"] if (task_dir / "trajectory.json").is_file() else [])
        for j, path in enumerate(paths):
            traj = _read_traj(path)
            if traj is None:
                rs.problems.append(f"{path}: not a trajectory")
                continue
            scores = _scores(result.get("scores"))
            task = traj.get("task") or {}
            rs.rollouts.append(Rollout(
                EVAL_STEP, str(task.get("id") or task_dir.name), j, path, scores, scores.get("hybrid", 0.0), None,
                str(traj.get("stop_reason") or ""), _tools(traj), _errors(traj), str(task.get("instruction") or ""),
            ))
    return rs


def select(rs: RolloutSet, step: str | None = None, group: str | None = None, min_reward: float | None = None,
           errors_only: bool = False, sort: str = "reward ↓") -> list[Rollout]:
    """The rollouts of `step` and `group` (None or "" = all) with reward >= `min_reward`, sorted."""
    if sort not in SORTS:
        raise ValueError(f"sort must be one of {', '.join(SORTS)}, not {sort!r}")
    rows = [r for r in rs.rollouts if step in (None, "", r.step) and group in (None, "", r.group)
            and (min_reward is None or r.reward >= min_reward) and (r.errors or not errors_only)]
    if sort == "order":
        return rows
    field_ = "reward" if sort.startswith("reward") else "advantage"
    return sorted(rows, key=lambda r: getattr(r, field_) if getattr(r, field_) is not None else -math.inf,
                  reverse=sort.endswith("↓"))


def table(rows: list[Rollout]) -> list[list[Any]]:
    """Rows for the viewer's table: key, step, group, #, reward, advantage, stop, tools, errors."""
    return [[r.key, r.step, r.group, r.index, round(r.reward, 4), None if r.advantage is None else round(r.advantage, 4),
             r.stop_reason, " → ".join(r.tools), len(r.errors)] for r in rows]


TABLE_HEADERS = ["rollout", "step", "group", "#", "reward", "advantage", "stop", "tools", "errors"]


@dataclass
class TurnView:
    """One turn of a rollout as the viewer shows it."""

    n: int
    reason: str
    call: str  # "Tool {json}" or "" (no call)
    status: str
    observation: str
    image: Path | None  # the turn's output image, if it made one


@dataclass
class RolloutDetail:
    rollout: Rollout
    instruction: str
    inputs: list[Path]  # the input images
    turns: list[TurnView]
    final: Path | None

    def gallery(self) -> list[tuple[str, str]]:
        """(image file, caption) for every input and every turn that produced an image."""
        out = [(str(p), f"{p.stem} · input") for p in self.inputs]
        out += [(str(t.image), f"turn {t.n} · {t.image.stem}") for t in self.turns if t.image is not None]
        return out

    def markdown(self) -> str:
        r = self.rollout
        adv = "–" if r.advantage is None else f"{r.advantage:+.4f}"
        main = {k: v for k, v in r.scores.items() if "/" not in k and k not in ("hybrid", "fallbacks")}
        comps = " · ".join(f"**{k}** {v:.4f}" for k, v in main.items()) or "_no scores_"
        sub = " · ".join(f"{k} {v:.3g}" for k, v in r.scores.items() if "/" in k)
        lines = [f"### {r.key}", f"**reward** {r.reward:.4f} · **advantage** {adv} · stop: `{r.stop_reason}`",
                 f"components: {comps}"]
        if sub:
            lines.append(f"<details><summary>sub-terms</summary>\n\n{sub}\n\n</details>")
        lines.append(f"> {md_text(self.instruction)}")
        if r.errors:
            lines.append("**tool errors:**\n" + "\n".join(f"- {md_text(e)}" for e in r.errors))
        for t in self.turns:
            lines.append(f"**Turn {t.n}** — {md_text(t.reason) or '_(no reason)_'}  \n"
                         f"call: {('`' + t.call + '`') if t.call else '_none_'} · {t.status}  \n"
                         f"↳ {md_text(t.observation)}" + (f" · image **{t.image.stem}**" if t.image else ""))
        return "\n\n".join(lines)


def md_text(s: str) -> str:
    """Text (from a model, a tool or a file) safe to drop into Markdown: no raw HTML, one line."""
    return (s or "").replace("<", "&lt;").replace(">", "&gt;").replace("\n", " ").strip()


def detail(r: Rollout) -> RolloutDetail:
    """Read one rollout's turns and images (files inside its trajectory dir only)."""
    d = _read_traj(r.path) or {"turns": []}
    base = r.path.parent
    files: dict[str, Path] = {}
    for a in d.get("assets", []):
        if isinstance(a, dict) and isinstance(a.get("id"), str) and _SAFE_ID.match(a["id"]):
            p = _inside(base, a.get("file") or f"assets/{a['id']}.png")
            if p is not None and p.is_file():
                files[a["id"]] = p
    turns = []
    for t in d["turns"]:
        if not isinstance(t, dict):
            continue
        call = t.get("call") if isinstance(t.get("call"), dict) else None
        call_s = f"{call.get('name')} {json.dumps(call.get('arguments'), ensure_ascii=False)}" if call else ""
        out_id = t.get("output_id")
        status = str(t.get("status") or "")
        if status not in ("ok", "terminate") and t.get("error_code"):
            status = f"{status} ({t['error_code']})"
        turns.append(TurnView(_int(t.get("index"), len(turns)) + 1, str(t.get("reason") or ""), call_s, status,
                              str(t.get("observation") or t.get("error") or ""), files.get(out_id) if isinstance(out_id, str) else None))
    task = d.get("task") or {}
    n_inputs = len(task.get("images") or []) if isinstance(task.get("images"), list) else 0
    inputs = [p for k, p in files.items() if k.startswith("img_")] or [p for k, p in list(files.items())[:n_inputs]]
    fid = d.get("final_asset_id")
    return RolloutDetail(r, str(task.get("instruction") or r.instruction), inputs, turns, files.get(fid) if isinstance(fid, str) else None)
