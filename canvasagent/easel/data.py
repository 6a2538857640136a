"""EASEL-Data: painter trajectories -> next-action SFT samples.

For a reference R and its ordered stroke trajectory a_0..a_{N-1}, a sample at
state t shows (R, C_t) where C_t is the replay of a_0..a_{t-1} on a white
canvas, and the target is the assistant turn::

    <reason>...</reason><tool_call>{"name": "brush_stroke", "arguments": {...}}</tool_call>

Coordinates (xs, ys, xc, yc, xe, ye) are quantised to integers 0-1000 (the
environment divides them by 1000 with :func:`path_to_unit`);
radius, opacity and colour are written as floats with 3 decimals in [0, 1].

Curricula (paper Sec. 4):

* C1 (early reconstruction): states 0..C1_END-1 (default 50); every state
  0..15 is kept, later ones every ``c1_stride``-th.
* C2 (light completion): the whole trajectory at decreasing density,
  ``t_k = floor(N * (k / K) ** c2_power)`` for k = 0..K-1 (unique).

Records use the repo's shared message layout (``canvasagent.core.formats.sharegpt``):
``{"messages": [...], "images": [ref.png, canvas.png], ...metadata}``, with
``<image>`` placeholders in the user turn. Output: ``c1.jsonl``, ``c2.jsonl``
(+ ``.parquet`` through HF ``datasets``), PNGs under ``images/``.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from . import render

log = logging.getLogger(__name__)

COORD_KEYS = ("xs", "ys", "xc", "yc", "xe", "ye")

SYSTEM_PROMPT = (
    "You are painting on a canvas to reproduce a reference image. Each turn, call the brush_stroke tool "
    "once. A stroke is a quadratic Bezier from (xs, ys) through control (xc, yc) to (xe, ye), with "
    "coordinates as integers 0-1000 (0,0 = top-left); radius rs/re and opacity os/oe at its ends and "
    "colour cr, cg, cb are numbers in [0, 1]. Reply as <reason>...</reason><tool_call>{...}</tool_call>."
)


@dataclass(frozen=True)
class DataConfig:
    c1_end: int = 50
    c1_dense: int = 16
    c1_stride: int = 3
    c2_states: int = 12
    c2_power: float = 1.6
    image_format: str = "png"


def c1_indices(n: int, cfg: DataConfig = DataConfig()) -> list[int]:
    end = min(n, cfg.c1_end)
    return [t for t in range(end) if t < cfg.c1_dense or (t - cfg.c1_dense) % cfg.c1_stride == 0]


def c2_indices(n: int, cfg: DataConfig = DataConfig()) -> list[int]:
    k = max(1, min(cfg.c2_states, n))
    return sorted({min(n - 1, int(n * (i / k) ** cfg.c2_power)) for i in range(k)})


def quantised_arguments(p: Sequence[float]) -> dict:
    """13-vector -> tool arguments with integer 0-1000 coordinates."""
    p = np.clip(np.asarray(p, dtype=np.float64), 0, 1)
    return {k: int(round(v * 1000)) if k in COORD_KEYS else round(float(v), 3) for k, v in zip(render.PARAM_NAMES, p)}


def path_to_unit(args: dict) -> dict:
    """Tool arguments with integer 0-1000 path coordinates -> the registry's [0, 1] (numbers only:
    anything else is left as it is, for the validator to refuse with its own message)."""
    return {k: (v / 1000.0 if k in COORD_KEYS and isinstance(v, (int, float)) and not isinstance(v, bool) else v)
            for k, v in args.items()}


def path_to_int1000(args: dict) -> dict:
    """The inverse of :func:`path_to_unit`: [0, 1] path coordinates -> integers 0-1000."""
    return {k: (int(round(v * 1000)) if k in COORD_KEYS else v) for k, v in args.items()}


def _colour_word(rgb: Sequence[float]) -> str:
    r, g, b = (int(round(v * 255)) for v in rgb)
    return f"#{r:02x}{g:02x}{b:02x}"


def reason_text(p: Sequence[float], t: int, n: int, res: int) -> str:
    """Short templated rationale (no model): where, how big, which colour."""
    q = quantised_arguments(p)
    cx, cy = (q["xs"] + q["xe"]) // 2, (q["ys"] + q["ye"]) // 2
    rad = 0.5 * (p[6] + p[8])
    size = "broad" if rad > 0.25 else "medium" if rad > 0.08 else "fine"
    phase = "block in large colour regions" if t < n * 0.2 else "refine shapes" if t < n * 0.6 else "add detail"
    return (f"Stroke {t + 1} of {n}: {phase}. The canvas differs from the reference around ({cx}, {cy}); "
            f"a {size} {_colour_word(p[10:13])} stroke there reduces the difference.")


def assistant_turn(p: Sequence[float], t: int, n: int, res: int) -> str:
    call = {"name": "brush_stroke", "arguments": quantised_arguments(p)}
    return f"<reason>{reason_text(p, t, n, res)}</reason><tool_call>{json.dumps(call)}</tool_call>"


def user_turn(t: int, n: int) -> str:
    return (f"Reference image: <image>\nCurrent canvas after {t} of {n} strokes: <image>\n"
            "Paint the next stroke.")


def _save(img: np.ndarray, path: Path) -> None:
    from PIL import Image
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(render.to_uint8(img)).save(path)


def trajectory_samples(ref_id: str, ref: np.ndarray, strokes: np.ndarray, out_dir: str | Path,
                       cfg: DataConfig = DataConfig()) -> dict[str, list[dict]]:
    """Samples of one trajectory for both curricula; images written under out_dir/images."""
    out = Path(out_dir)
    strokes = np.asarray(strokes, dtype=np.float64).reshape(-1, render.N_PARAMS)
    n, res = strokes.shape[0], ref.shape[0]
    want = {"C1": c1_indices(n, cfg), "C2": c2_indices(n, cfg)}
    needed = sorted(set(want["C1"]) | set(want["C2"]))
    ref_path = out / "images" / ref_id / f"reference.{cfg.image_format}"
    _save(ref, ref_path)
    canvas = render.blank_canvas(res)
    paths: dict[int, str] = {}
    done = 0
    for t in needed:  # replay incrementally up to each kept state
        while done < t:
            canvas = render.apply_stroke(canvas, strokes[done])
            done += 1
        p = out / "images" / ref_id / f"state_{t:03d}.{cfg.image_format}"
        _save(canvas, p)
        paths[t] = str(p.relative_to(out))
    result: dict[str, list[dict]] = {"C1": [], "C2": []}
    for cur, idx in want.items():
        for t in idx:
            result[cur].append({
                "messages": [
                    {"role": "system", "content": SYSTEM_PROMPT},
                    {"role": "user", "content": user_turn(t, n)},
                    {"role": "assistant", "content": assistant_turn(strokes[t], t, n, res)},
                ],
                "images": [str(ref_path.relative_to(out)), paths[t]],
                "ref_id": ref_id, "step": t, "n_strokes": n, "curriculum": cur, "coord_format": "int1000",
            })
    return result


def write_records(records: Iterable[dict], path: str | Path, parquet: bool = True) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    recs = list(records)
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in recs)
    if parquet and recs:
        try:
            from datasets import Dataset
            Dataset.from_list(recs).to_parquet(str(path.with_suffix(".parquet")))
        except Exception as e:  # datasets missing or failing: JSONL is the primary output
            log.warning("parquet export skipped: %s", e)
    return path


def build_dataset(refs: Sequence[tuple[str, np.ndarray]], out_dir: str | Path, n_strokes: int = 250,
                  painter_cfg=None, workers: int = 1, cfg: DataConfig = DataConfig(),
                  trajectories: Sequence[np.ndarray] | None = None, parquet: bool = True,
                  ray: bool = False) -> dict[str, int]:
    """Paint each reference (unless ``trajectories`` are given) and write C1/C2 files."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if trajectories is None:
        from .painter import paint_many
        results = paint_many([r for _, r in refs], [n_strokes] * len(refs), painter_cfg, workers, ray=ray)
        trajectories = [r.strokes for r in results]
    c1: list[dict] = []
    c2: list[dict] = []
    traj_path = out / "trajectories.jsonl"
    with open(traj_path, "w") as f:
        for (rid, ref), strokes in zip(refs, trajectories):
            f.write(json.dumps({"ref_id": rid, "strokes": np.asarray(strokes).round(6).tolist()}) + "\n")
            s = trajectory_samples(rid, ref, strokes, out, cfg)
            c1 += s["C1"]
            c2 += s["C2"]
    write_records(c1, out / "c1.jsonl", parquet)
    write_records(c2, out / "c2.jsonl", parquet)
    log.info("EASEL-Data: %d C1 and %d C2 samples from %d references", len(c1), len(c2), len(refs))
    return {"C1": len(c1), "C2": len(c2), "references": len(refs)}
