"""Interactive EASEL painting: a person paints a reference stroke by stroke, sees the canvas and S.

`PaintSession` wraps a `CanvasSession` with a reference image and a save folder; the terminal
(`canvasagent chat --easel REF`) and the web UI (the Paint tab) both drive it:

    ps = PaintSession(load_reference("astronaut", 128), budget=20, out_dir="runs/paint")
    ps.command('{"xs": 0.2, "ys": 0.2, ... "cb": 0.3}')   # one brush_stroke (13 numbers in [0, 1])
    ps.command("undo")                                      # costs a step, as in EASEL
    ps.command("submit")                                    # ends the episode

Commands (`parse_command`): `undo`/`u`, `submit`/`s`/`done`, a JSON object of brush_stroke
arguments (optionally prefixed `brush_stroke`), or the 13 numbers in registry order separated by
spaces or commas. A command that does not parse, or a stroke outside [0, 1], raises
`PaintCommandError` and costs nothing: the front end asks again, so only real strokes, undos and
the submit are recorded. After every step the canvas (`canvas.png`), the S curve (`s_curve.png`)
and the history (`strokes.jsonl`) are rewritten in `out_dir`.
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from canvasagent.easel import render
from canvasagent.easel.canvas import CanvasSession, StepResult

log = logging.getLogger(__name__)

SAMPLES = ("astronaut", "chelsea", "coffee", "rocket")  # scikit-image photos shipped with the package
EXAMPLE_STROKE = {"xs": 0.1, "ys": 0.5, "xc": 0.5, "yc": 0.2, "xe": 0.9, "ye": 0.5,
                  "rs": 0.3, "os": 0.9, "re": 0.2, "oe": 0.9, "cr": 0.2, "cg": 0.3, "cb": 0.6}
HELP = ("Paint with: a JSON object of the 13 brush_stroke parameters in [0, 1] "
        f"({', '.join(render.PARAM_NAMES)}), or the 13 numbers in that order; 'undo'; 'submit'.")


class PaintCommandError(ValueError):
    """A paint command that does not parse or names a stroke outside the schema; nothing was done."""


def load_reference(source: str | Path, size: int = 128) -> np.ndarray:
    """A square float RGB reference in [0, 1], `size` x `size`: a scikit-image sample name
    (`SAMPLES`) or an image file, centre-cropped. Raises PaintCommandError for anything else."""
    if not 16 <= int(size) <= 1024:
        raise PaintCommandError(f"canvas size must be 16-1024 pixels, not {size}")
    name = str(source)
    if name in SAMPLES:
        import skimage.data

        arr = np.asarray(getattr(skimage.data, name)())
    else:
        path = Path(name).expanduser()
        if not path.is_file():
            raise PaintCommandError(f"no reference image {name!r}: give an image file or one of {', '.join(SAMPLES)}")
        try:
            arr = np.asarray(Image.open(path).convert("RGB"))
        except OSError as e:
            raise PaintCommandError(f"{path} is not a readable image ({e})") from None
    if arr.ndim == 2:
        arr = np.stack([arr] * 3, axis=-1)
    return centre_square(arr[..., :3].astype(np.float32) / 255.0, size)


def centre_square(img: np.ndarray, size: int) -> np.ndarray:
    """The largest centred square of `img`, resized (INTER_AREA) to `size` x `size`."""
    import cv2

    h, w = img.shape[:2]
    side = min(h, w)
    img = img[(h - side) // 2:(h + side) // 2, (w - side) // 2:(w + side) // 2]
    return cv2.resize(img, (int(size), int(size)), interpolation=cv2.INTER_AREA)


_NUMBERS = re.compile(r"^[\s,]*[-+0-9.eE]+([\s,]+[-+0-9.eE]+)*[\s,]*$")


def parse_command(text: str) -> tuple[str, dict[str, Any]]:
    """One paint command -> (tool name, arguments) with the stroke validated against the schema.
    Raises PaintCommandError naming what is wrong (and what is accepted)."""
    t = (text or "").strip()
    low = t.lower()
    if low in ("undo", "u"):
        return "undo", {}
    if low in ("submit", "s", "done"):
        return "submit", {}
    if not t:
        raise PaintCommandError("empty command. " + HELP)
    if low.startswith("brush_stroke"):
        t = t[len("brush_stroke"):].strip()
    if t.startswith("{"):
        try:
            args = json.loads(t)
        except ValueError as e:
            raise PaintCommandError(f"not valid JSON ({e}). " + HELP) from None
        if not isinstance(args, dict):
            raise PaintCommandError("the stroke must be a JSON object. " + HELP)
    elif _NUMBERS.match(t):
        try:
            vals = [float(v) for v in re.split(r"[\s,]+", t.strip(" ,")) if v]
        except ValueError:
            raise PaintCommandError("not a list of numbers. " + HELP) from None
        if len(vals) != render.N_PARAMS:
            raise PaintCommandError(f"expected {render.N_PARAMS} numbers, got {len(vals)}. " + HELP)
        args = dict(zip(render.PARAM_NAMES, vals))
    else:
        raise PaintCommandError(f"unknown command {t[:40]!r}. " + HELP)
    try:
        p = render.params_from_dict(args)
    except (ValueError, TypeError) as e:
        raise PaintCommandError(f"invalid stroke: {e}") from None
    return "brush_stroke", render.params_to_dict(p)


@dataclass
class PaintStep:
    tool: str
    result: StepResult


class PaintSession:
    """One painting episode on a blank canvas against `reference` (H x W x 3 floats in [0, 1])."""

    def __init__(self, reference: np.ndarray, budget: int = 20, out_dir: str | Path | None = None):
        if budget < 1:
            raise PaintCommandError(f"budget must be at least 1 step, not {budget}")
        self.reference = np.asarray(reference, np.float32)
        self.canvas_session = CanvasSession(render.blank_canvas(self.reference.shape[0], self.reference.shape[1]), int(budget),
                                            reference=self.reference)
        self.out_dir = Path(out_dir) if out_dir else None
        self.s0 = float(self.canvas_session.similarity().s)
        self.save()

    @property
    def done(self) -> bool:
        return self.canvas_session.done

    @property
    def canvas(self) -> np.ndarray:
        return self.canvas_session.canvas

    @property
    def s(self) -> float:
        return float(self.canvas_session.similarity().s)

    def command(self, text: str) -> PaintStep:
        """Run one command (see `parse_command`); PaintCommandError leaves the session untouched."""
        if self.done:
            raise PaintCommandError("the painting is finished (submitted or out of budget)")
        name, args = parse_command(text)
        res = self.canvas_session.call(name, args)
        self.save()
        return PaintStep(name, res)

    def status(self) -> str:
        cs = self.canvas_session
        state = "submitted" if cs.submitted else ("out of budget" if cs.done else "painting")
        return f"step {cs.steps_used}/{cs.budget} · S={self.s:.4f} (blank {self.s0:.4f}) · {len(cs.strokes)} stroke(s) on the canvas · {state}"

    def save(self) -> None:
        if self.out_dir is None:
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        Image.fromarray(render.to_uint8(self.canvas)).save(self.out_dir / "canvas.png")
        ref = self.out_dir / "reference.png"
        if not ref.exists():
            Image.fromarray(render.to_uint8(self.reference)).save(ref)
        with open(self.out_dir / "strokes.jsonl", "w") as fh:
            fh.writelines(json.dumps({"step": e.step, "name": e.tool, "arguments": e.arguments, "ok": e.ok, "message": e.message}) + "\n" for e in self.canvas_session.history)
        if self.canvas_session.s_curve:
            from canvasagent.easel.bench import plot_single_curve

            plot_single_curve(self.canvas_session.s_curve, self.out_dir / "s_curve.png", title=f"S after each step (blank canvas {self.s0:.3f})")


def paint_chat(ps: PaintSession, input_fn: Any = None, show: Any = print) -> PaintSession:
    """The terminal loop: ask for a command until the painting is submitted or out of budget,
    showing the step, S and where the canvas is saved after every stroke. A command that does
    not parse asks again; end of input submits what is painted."""
    import builtins

    ask = input_fn or (lambda prompt: builtins.input(prompt))
    where = f" (canvas: {ps.out_dir / 'canvas.png'})" if ps.out_dir else ""
    show(HELP)
    show(f"example: {json.dumps(EXAMPLE_STROKE)}")
    show(ps.status() + where)
    while not ps.done:
        try:
            text = ask("stroke> ")
        except (EOFError, KeyboardInterrupt):
            show("\ninput closed; submitting the canvas as it is")
            ps.command("submit")
            break
        try:
            step = ps.command(text)
        except PaintCommandError as e:
            show(f"{e} Try again.")
            continue
        r = step.result
        show(f"{step.tool}: {r.message} · {ps.status()}{where}")
    show(f"done: S={ps.s:.4f} after {ps.canvas_session.steps_used} step(s)" + (f"; saved in {ps.out_dir}" if ps.out_dir else ""))
    return ps


def run_paint(ref: str, size: int, budget: int, out: str | None) -> int:
    """`chat --easel REF` and `easel draw REF`: you paint `ref` in the terminal (`paint_chat`) into
    `out` (default runs/paint-<time>); returns exit code 0. A bad reference raises
    PaintCommandError, which the CLI's run_command reports."""
    out = out or f"runs/paint-{time.strftime('%Y%m%d-%H%M%S')}"
    paint_chat(PaintSession(load_reference(ref, size), budget, out_dir=out))
    return 0
