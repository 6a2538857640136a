"""EASEL tasks played by a CanvasAgent policy through the core episode runner.

``canvasagent easel bench --policy agent:SPEC`` lands here. SPEC is any policy
spec of :mod:`canvasagent.policy_spec` (``hf:PATH``, ``openai:MODEL@URL``,
``replay:PATH``, ``scripted:NAME``, ``human``) or an EASEL scripted policy
``easel:NAME`` (``random``, ``heuristic`` from :mod:`canvasagent.easel.heuristics`,
or ``blank`` = submit at once), which emits the same plans as tool calls.

Each task becomes a :class:`canvasagent.core.tasks.Task` of family ``easel``:

* reconstruction: ``img_1`` is the reference, ``img_2`` the blank canvas;
* semantic: ``img_1`` is the task image (the canvas, e.g. the maze).

``brush_stroke``/``undo``/``submit`` are the ``stateful`` handlers of a
:class:`CanvasSession`; every tool reply carries the updated canvas image and
``step k/B`` (and S for reconstruction); ``AgentConfig.image_budget`` sets which
images the policy sees. The budget is the category budget (or ``AgentConfig.budget``);
the runner's turn cap is budget + ``extra_turns`` so unparseable replies cannot loop
forever. A ``brush_stroke`` or ``undo`` refused by the runner's schema check still
costs its step (:func:`charge_refused`); a reply with no parseable call costs none. A
spent budget ends the episode as if submitted. Trajectories are saved under
``OUT/trajectories/<task id>/``; scores are computed from the session.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from canvasagent.core.episode import EpisodeConfig, run_episode
from canvasagent.core.protocol import format_reply, parse_reply
from canvasagent.core.tasks import Task
from toolserver.request import ToolRequest
from toolserver.results import ToolResult

from . import heuristics, render, semantic, tasks
from .bench import EpisodeResult
from .canvas import CanvasSession, to_pil
from .data import path_to_unit

log = logging.getLogger(__name__)

EASEL_SCRIPTS = ("blank",) + heuristics.PLANS


@dataclass(frozen=True)
class AgentConfig:
    budget: int | None = None  # override every task's step budget (smoke runs); None = task budget
    extra_turns: int = 2  # runner turns beyond the budget (room for submit / a malformed reply)
    # "int1000": EASEL-Data policies write integer 0-1000 path coordinates, rescaled before validation
    coords: str = "unit"
    # The image budget GRPO trains under (canvasagent.core.image_budget, TrainConfig.image_budget): the
    # policy sees the last N tool-reply canvases, older ones as text; the opening images stay. None: all.
    image_budget: int | None = None
    seed: int = 0


def task_id_of(task: Any, seed: int = 0) -> str:
    return getattr(task, "task_id", None) or f"{task.name}-{seed:04d}"


def is_reconstruction(task: Any) -> bool:
    return getattr(task, "reference", None) is not None


def outcome_scores(task: Any, canvas: np.ndarray) -> dict[str, float]:
    """`score` (S of `canvas`, or the semantic task's score) and, for reconstruction, `s_blank`
    (S of the blank canvas): what the `easel_reconstruction` check calibrates against."""
    out = {"score": float(task.score(canvas))}
    if is_reconstruction(task):
        out["s_blank"] = float(task.score(task.initial_canvas()))
    return out


def agent_task(task: Any, budget: int, task_id: str) -> Task:
    """The episode's Task: images and an instruction that states the budget and rules."""
    res = task.initial_canvas().shape[0]
    rules = (f"You have {budget} steps: every brush_stroke (accepted or rejected) and every undo costs one. "
             "A reply without a tool call costs none. "
             "Call submit when the canvas is finished. Each tool reply shows the updated canvas.")
    if is_reconstruction(task):
        images = [to_pil(task.reference), to_pil(task.initial_canvas())]
        text = (f"img_1 is the reference image and img_2 the blank {res}x{res} canvas. "
                f"{task.instruction} {rules}")
        kind = {"kind": "reconstruction", "category": task.category}
        # Scored by what the strokes achieved over the blank canvas (meta["easel"] score, s_blank).
        checks = [{"type": "easel_reconstruction", "threshold": 0.8}]
    else:
        images = [to_pil(task.initial_canvas())]
        text = (f"img_1 is the {res}x{res} canvas. {task.instruction} The brush appearance is fixed: "
                "rs, os, re, oe, cr, cg, cb must be given but are ignored; choose the path. " + rules)
        kind = {"kind": "semantic", "name": task.name}
        checks = []
    return Task(text, images, id=task_id, family="easel", checks=checks, meta={"easel": {**kind, "budget": budget}})


class NoToolbox:
    """EASEL episodes have no model or pure tools; a call to one is a failed turn."""

    def call(self, request: ToolRequest) -> ToolResult:
        return ToolResult.failure("wrong_family", f"{request.tool} is not available in an EASEL episode; "
                                  "use brush_stroke, undo or submit")

    def close(self) -> None:
        pass


class PlanPolicy:
    """Emits a precomputed stroke plan as brush_stroke calls, then submits."""

    def __init__(self, plan: np.ndarray, name: str):
        self.plan = np.asarray(plan, np.float64).reshape(-1, render.N_PARAMS)
        self.name = name
        self._i = 0

    def act(self, messages: list[dict[str, Any]], episode: Any = None) -> str:
        if self._i >= len(self.plan):
            return format_reply("The plan is complete.", {"name": "submit", "arguments": {}})
        p = self.plan[self._i]
        self._i += 1
        args = {k: round(float(v), 5) for k, v in render.params_to_dict(p).items()}
        return format_reply(f"Stroke {self._i} of {len(self.plan)}.", {"name": "brush_stroke", "arguments": args})


class Int1000Coords:
    """Wraps a policy whose brush_stroke coordinates are integers 0-1000 (EASEL-Data format)."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.name = getattr(inner, "name", type(inner).__name__)

    def act(self, messages: list[dict[str, Any]], episode: Any = None) -> str:
        reply = self.inner.act(messages, episode)
        parsed = parse_reply(reply)
        call = parsed.call
        if call is None or call.name != "brush_stroke" or not isinstance(call.arguments, dict):
            return reply
        args = path_to_unit(call.arguments)
        return format_reply(parsed.reason or "", {"name": "brush_stroke", "arguments": args}, parsed.terminate)


class AgentPolicySource:
    """One policy per episode from an ``agent:`` SPEC (heavy resources shared)."""

    def __init__(self, spec: str, cfg: AgentConfig = AgentConfig()):
        self.spec = spec
        self.cfg = cfg
        self._factory = None
        if spec.startswith("easel:"):
            name = spec.split(":", 1)[1]
            if name not in EASEL_SCRIPTS:
                raise ValueError(f"unknown EASEL scripted policy {name!r}; choose from {EASEL_SCRIPTS}")
        else:
            from canvasagent.policy_spec import PolicyFactory
            self._factory = PolicyFactory(spec)

    @property
    def name(self) -> str:
        return f"agent:{self.spec}"

    def for_task(self, easel_task: Any, task: Task, budget: int) -> Any:
        if self._factory is None:
            name = self.spec.split(":", 1)[1]
            plan = np.zeros((0, render.N_PARAMS)) if name == "blank" else \
                heuristics.plan_for(name, easel_task, self.cfg.seed)
            return PlanPolicy(plan[:budget], self.spec)
        policy = self._factory.for_task(task)
        if self.cfg.coords == "int1000":
            policy = Int1000Coords(policy)
        return policy

    def close(self) -> None:
        if self._factory is not None:
            self._factory.close()


def charge_refused(session: CanvasSession):
    """An `on_turn` callback: a brush_stroke or undo refused by the runner's schema check (it never
    reached the canvas handler) spends one step of `session`, the reply the policy sees says so,
    and the episode ends when that was the last step."""

    def on_turn(turn: Any, ep: Any) -> None:
        call = turn.call
        if call is None or call.name not in ("brush_stroke", "undo") or turn.status != "error" or "steps_used" in turn.result_data:
            return
        r = session.charge(call.name, call.arguments if isinstance(call.arguments, dict) else {}, f"refused: {turn.error}")
        turn.result_data = {**turn.result_data, "steps_used": r.steps_used, "budget": session.budget, "charged": True}
        note = f" This refused call used step {r.steps_used}/{session.budget}." + (" Episode finished." if r.done else "")
        turn.observation = (turn.observation or "") + note
        last = ep.messages[-1] if ep.messages else None
        if last is not None and last.get("role") == "tool":
            for part in reversed(last["content"]):
                if part.get("type") == "text":
                    part["text"] += note
                    break
        if r.done and not ep.done:
            ep.finish("budget")

    return on_turn


@dataclass
class AgentEpisode:
    task_id: str
    session: CanvasSession
    stop_reason: str
    turns: int
    seconds: float
    trajectory_dir: str | None


def play(source: AgentPolicySource, easel_task: Any, cfg: AgentConfig, out_dir: str | Path | None = None,
         seed: int = 0) -> AgentEpisode:
    """One episode of ``easel_task`` with the source's policy."""
    t0 = time.perf_counter()
    budget = cfg.budget or easel_task.budget
    tid = task_id_of(easel_task, seed)
    session = CanvasSession.for_task(easel_task)
    session.budget = budget
    task = agent_task(easel_task, budget, tid)
    policy = source.for_task(easel_task, task, budget)
    traj = run_episode(policy, task, NoToolbox(), EpisodeConfig(max_turns=budget + cfg.extra_turns, family="easel",
                                                                  image_budget=cfg.image_budget),
                       stateful=session.handlers(), on_turn=charge_refused(session))
    traj.meta["easel"] = {"steps_used": session.steps_used, "budget": budget,
                          "strokes": session.strokes.round(6).tolist(), "s_curve": list(session.s_curve),
                          **outcome_scores(easel_task, session.canvas)}
    tdir = None
    if out_dir is not None:
        tdir = str(Path(out_dir) / "trajectories" / tid)
        traj.save(tdir)
        to_pil(session.canvas).save(Path(tdir) / "final_canvas.png")
    log.info("%s %s: %s after %d turns", source.name, tid, traj.stop_reason, len(traj.turns))
    return AgentEpisode(tid, session, traj.stop_reason or "", len(traj.turns), time.perf_counter() - t0, tdir)


def reconstruction_result(ep: AgentEpisode, task: tasks.ReconstructionTask, policy: str) -> EpisodeResult:
    sim = ep.session.similarity()
    diag = ep.session.diagnostics()
    return EpisodeResult(task.task_id, task.category, policy, "aligned" if ep.session.budget == task.budget
                         else str(ep.session.budget), ep.session.budget, sim.s, sim.edge_iou, diag.as_dict(),
                         [float(v) for v in ep.session.s_curve], ep.seconds)


def run_reconstruction(spec: str, suite: Sequence[tasks.ReconstructionTask], cfg: AgentConfig = AgentConfig(),
                       out_dir: str | Path | None = None) -> list[EpisodeResult]:
    """Agent on reconstruction tasks -> bench rows (table.md/curves.png like the painter's)."""
    from . import bench
    source = AgentPolicySource(spec, cfg)
    results, eps = [], []
    t0 = time.perf_counter()
    try:
        for task in suite:
            ep = play(source, task, cfg, out_dir)
            eps.append(ep)
            results.append(reconstruction_result(ep, task, source.name))
    finally:
        source.close()
    if out_dir is not None:
        out = Path(out_dir)
        (out / "canvases").mkdir(parents=True, exist_ok=True)
        with open(out / "results.jsonl", "w") as f:
            for r, ep in zip(results, eps):
                f.write(json.dumps({**r.row(), "stop_reason": ep.stop_reason, "turns": ep.turns,
                                    "trajectory": ep.trajectory_dir}) + "\n")
                to_pil(ep.session.canvas).save(out / "canvases" / f"{r.task_id}_agent.png")
        (out / "table.md").write_text(bench.format_table(results, time.perf_counter() - t0))
        bench.plot_curves(results, out / "curves.png")
    return results


def run_semantic(spec: str, seeds: Sequence[int] = (0,), cfg: AgentConfig = AgentConfig(),
                 out_dir: str | Path | None = None, task_names: Sequence[str] = semantic.TASK_NAMES,
                 ocr: tasks.OCRFn | None = None) -> list[semantic.SemanticResult]:
    """Agent on the semantic tasks -> semantic rows (table.md/semantic.png)."""
    suite = semantic.make_tasks(task_names, seeds, ocr)
    source = AgentPolicySource(spec, cfg)
    results, canvases = [], []
    try:
        for seed, task in suite:
            ep = play(source, task, cfg, out_dir, seed)
            results.append(semantic.result_of(task, seed, source.name, ep.session, ep.seconds))
            canvases.append(ep.session.canvas)
    finally:
        source.close()
    if out_dir is not None:
        semantic.write_outputs(results, canvases, out_dir)
    return results
