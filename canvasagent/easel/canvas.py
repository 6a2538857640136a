"""A canvas session: the EASEL environment state an agent acts on.

Actions are executed by tool name and an arguments dict, as declared in
``toolserver.registry`` (family "easel"): ``brush_stroke`` (13 unit params, or
the 6 path params when the appearance is fixed), ``undo`` and ``submit``.

Step accounting: every ``brush_stroke`` (accepted or rejected) and every
``undo`` consumes one step of the budget; ``submit`` ends the episode without
consuming one. Invalid calls (unknown tool, bad arguments) also consume a
step, since a real agent spent a turn on them. After each step the
reconstruction similarity S is appended to the S curve (reconstruction tasks
only; semantic tasks are scored once at the end).

``CanvasSession.handlers()`` is the one adapter from the episode runner to the
canvas: the ``stateful`` handlers (``ToolRequest -> ToolResult``) that the EASEL
bench's agent runner and the GRPO ``EaselEnv`` both pass to their episode.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
from PIL import Image

from toolserver.registry import OutputKind
from toolserver.request import ToolRequest
from toolserver.results import ToolResult

from . import metrics, render

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepResult:
    ok: bool
    message: str
    done: bool
    steps_used: int
    s: float | None = None


@dataclass
class Event:
    step: int
    tool: str
    arguments: dict
    ok: bool
    message: str
    params: list[float] | None = None  # full 13-vector actually applied (or rejected)


@dataclass
class CanvasSession:
    """Canvas with an undo stack, history and optional reference for S.
    ``checker(params13, canvas) -> str | None`` may reject a stroke (maze walls)."""

    initial: np.ndarray
    budget: int
    reference: np.ndarray | None = None
    fixed_appearance: bool = False
    checker: Callable[[np.ndarray, np.ndarray], str | None] | None = None
    track_s: bool = True
    history: list[Event] = field(default_factory=list)
    s_curve: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.initial = np.asarray(self.initial, np.float32).copy()
        self._stack: list[tuple[np.ndarray, np.ndarray]] = []  # (params13, canvas before)
        self._canvas = self.initial.copy()
        self.steps_used = 0
        self.submitted = False
        self._ref_edges = metrics.edge_map(self.reference) if self.reference is not None else None

    @classmethod
    def for_task(cls, task: Any, track_s: bool = True) -> "CanvasSession":
        """Session for a ReconstructionTask or a semantic task (see tasks.py)."""
        ref = getattr(task, "reference", None)
        fixed = ref is None
        checker = getattr(task, "check_stroke", None) if fixed else None
        return cls(task.initial_canvas(), task.budget, reference=ref, fixed_appearance=fixed,
                   checker=checker, track_s=track_s and ref is not None)

    @property
    def canvas(self) -> np.ndarray:
        return self._canvas

    @property
    def strokes(self) -> np.ndarray:
        """Currently applied strokes (after undos), in paint order, (N, 13)."""
        return np.array([p for p, _ in self._stack], dtype=np.float64).reshape(-1, render.N_PARAMS)

    @property
    def done(self) -> bool:
        return self.submitted or self.steps_used >= self.budget

    @property
    def actions(self) -> list[list[float]]:
        """Every attempted stroke's parameters in order (for exact-repeat rate)."""
        return [e.params for e in self.history if e.tool == "brush_stroke" and e.params is not None]

    def similarity(self) -> metrics.Similarity | None:
        if self.reference is None:
            return None
        return metrics.similarity(self.reference, self._canvas, ref_edges=self._ref_edges)

    def diagnostics(self) -> metrics.TrajectoryDiagnostics:
        s0 = None
        if self.reference is not None:
            s0 = metrics.similarity(self.reference, self.initial, ref_edges=self._ref_edges).s
        return metrics.diagnostics(self.s_curve, self.actions, s0=s0)

    def _consume(self, tool: str, args: dict, ok: bool, msg: str, params=None) -> StepResult:
        self.steps_used += 1
        self.history.append(Event(self.steps_used, tool, dict(args), ok, msg,
                                  None if params is None else [float(v) for v in params]))
        s = None
        if self.track_s and self.reference is not None:
            s = self.similarity().s
            self.s_curve.append(s)
        return StepResult(ok, msg, self.done, self.steps_used, s)

    def charge(self, tool: str, arguments: dict | None, reason: str) -> StepResult:
        """Spend one step on a call refused before it reached the canvas (the episode runner's
        schema check), so a refused stroke costs what a rejected one does. Nothing is painted;
        a finished session is not charged."""
        if self.done:
            return StepResult(False, "episode finished", True, self.steps_used)
        return self._consume(str(tool), dict(arguments or {}), False, reason)

    def brush_stroke(self, params: np.ndarray | list[float]) -> StepResult:
        p = np.asarray(params, dtype=np.float64)
        if self.fixed_appearance and p.size == 6:
            p = render.expand_fixed(p)
        return self.call("brush_stroke", render.params_to_dict(p), _params13=p)

    def submit(self) -> StepResult:
        return self.call("submit", {})

    def call(self, name: str, arguments: dict | None = None, _params13: np.ndarray | None = None) -> StepResult:
        """Execute a tool call by name and arguments dict (the agent interface)."""
        args = dict(arguments or {})
        if self.done:
            return StepResult(False, "episode finished", True, self.steps_used)
        if name == "submit":
            self.submitted = True
            self.history.append(Event(self.steps_used, "submit", {}, True, "submitted"))
            return StepResult(True, "submitted", True, self.steps_used,
                              self.s_curve[-1] if self.s_curve else None)
        if name == "undo":
            if not self._stack:
                return self._consume("undo", args, False, "nothing to undo")
            _, before = self._stack.pop()
            self._canvas = before
            return self._consume("undo", args, True, "undid last stroke")
        if name != "brush_stroke":
            return self._consume(str(name), args, False, f"unknown tool {name!r}")
        try:
            if _params13 is not None:
                p = render.validate_params(_params13)
            elif self.fixed_appearance and not all(k in args for k in ("rs", "cr")):
                p = render.expand_fixed(render.params_from_dict(args, fixed=True))
            else:
                p = render.params_from_dict(args)
                if self.fixed_appearance:  # appearance is not the agent's to choose here
                    p = render.expand_fixed(p[:6])
        except ValueError as e:
            return self._consume("brush_stroke", args, False, f"invalid arguments: {e}")
        if self.checker is not None:
            reason = self.checker(p, self._canvas)
            if reason:
                return self._consume("brush_stroke", args, False, reason, params=p)
        before = self._canvas
        self._canvas = render.apply_stroke(before, p)
        self._stack.append((p, before))
        return self._consume("brush_stroke", args, True, "stroke applied", params=p)

    def handlers(self) -> dict[str, Callable[[ToolRequest], ToolResult]]:
        """``brush_stroke``/``undo``/``submit`` as ``stateful`` handlers of an episode: each result
        carries the canvas image and ``step k/B`` (plus S when tracked); ``data["end_episode"]`` ends
        the episode when the session accepts nothing more."""
        return {"brush_stroke": lambda req: self._result(self.call("brush_stroke", dict(req.args))),
                "undo": lambda req: self._result(self.call("undo", {})),
                "submit": self._submit_handler}

    def _result(self, r: StepResult) -> ToolResult:
        text = f"{r.message}. step {r.steps_used}/{self.budget}." + (f" S={r.s:.4f}." if r.s is not None else "")
        data: dict[str, Any] = {"steps_used": r.steps_used, "budget": self.budget}
        if r.s is not None:
            data["s"] = r.s
        if r.done:
            data["end_episode"] = "submit" if self.submitted else "budget"
            text += " Episode finished."
        if not r.ok:
            return ToolResult.failure("stroke_rejected" if "wall" in r.message else "canvas_refused", text, data=data)
        return ToolResult(True, text, kind=OutputKind.CANVAS, image=to_pil(self.canvas), data=data)

    def _submit_handler(self, req: ToolRequest) -> ToolResult:
        r = self.call("submit", {})
        return ToolResult(True, f"submitted after {r.steps_used} steps.", kind=OutputKind.NONE,
                          data={"end_episode": "submit", "steps_used": r.steps_used})


def to_pil(img: np.ndarray) -> Image.Image:
    return Image.fromarray(render.to_uint8(img))
