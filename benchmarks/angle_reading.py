"""Whether the tiny model can learn to read, from the image, the angle that makes a turned picture upright.

    python benchmarks/angle_reading.py RUN [--from DIR] [--variants fresh:600 written:600 warmup:0.25:0.5:3200 ...]
        [--measure DIR ...] [--keep DIR] [--profile canvascraft] [--seed 0] [--results FILE]

RUN is a pipeline run folder (a seed folder of `benchmarks/train_evidence.py`) with its CanvasCraft
data. The testbed's Rotate tasks whose instruction does not state the angle ("get it the right way
up") need it read from the picture: the scene was turned 45, 90 or 180 degrees. After SFT the
policy writes the right angle at chance, on its own GRPO tasks too (docs/TRAINING.md), so GRPO
sees a right angle only by luck. This asks whether the tiny model can learn it at all.

* Each variant `KIND:STEPS` trains a copy of `--from` (default `RUN/sft/tiny_warm`, the text-only
  warmup's model) for STEPS steps of 8 examples on the SFT rows whose first call is such a Rotate:
  the first user turn with its image, no system turn, and the loss on the first assistant turn,
  AdamW at the text warmup's rate. `written`: the rows as they are (their own pictures and
  angles). `fresh`: each example's picture replaced by a scene drawn afresh and its angle by the
  one that undoes that scene's turn (`tiny_warmup.fresh_scene`, under `--profile`), as the
  warmup's angle share draws them. Examples and steps are the warmup's own (`warmup_example`
  with the picture, `train_step`).
* Each variant `warmup:BOX:ANGLE:STEPS` runs the real warmup
  (`canvasagent.training.tiny_warmup.warm_up`, box share BOX, angle share ANGLE, STEPS steps, seed
  `--seed`) from the run's untrained base `RUN/sft/tiny_base` on all of the run's SFT rows: what
  `model.tiny_warmup_angle_share` does in a pipeline.
* Each `--measure DIR` is a model folder measured as it is (e.g. `RUN/sft/tiny_warm`). The SFT
  checkpoint writes no call in this layout (it has only seen the system turn before the task).
* `--keep DIR` keeps each trained model under DIR (for `benchmarks/box_copy.py --warm`).

Measured greedily in the same layout (first user turn with its image, no system turn): the angle
of the reply's first Rotate call against the reference, on
* **held out**: the run's GRPO and evaluation tasks whose first reference call is a Rotate with an
  angle the instruction does not state;
* **SFT rows**: the rows trained on, their own pictures.
Columns: exact share and, per reference angle, how often each angle was written. Chance is 1/3.

Prints a markdown report and writes it to `--results`.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import re
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from toolserver.validation import Profile  # noqa: E402

ANGLES = (45, 90, 180)
CALL_ANGLE = re.compile(r'"angle": (\d+)')

Case = tuple[dict[str, Any], list[Any], int, dict[str, Any] | None]  # (user message, images, reference angle, SFT row)


def variant(text: str) -> tuple[str, int, float, float]:
    """"fresh:600" -> ("fresh", 600, 0, 0); "warmup:0.25:0.5:3200" -> ("warmup", 3200, 0.25, 0.5).
    Refuses anything else."""
    parts = text.split(":")
    try:
        if parts[0] in ("fresh", "written") and len(parts) == 2:
            out = parts[0], int(parts[1]), 0.0, 0.0
        elif parts[0] == "warmup" and len(parts) == 4:
            out = "warmup", int(parts[3]), float(parts[1]), float(parts[2])
        else:
            raise ValueError
    except ValueError:
        raise SystemExit(f"variant {text!r}: expected fresh:STEPS, written:STEPS or warmup:BOX:ANGLE:STEPS") from None
    if out[1] < 1 or not (0 <= out[2] and 0 <= out[3] and out[2] + out[3] <= 1):
        raise SystemExit(f"variant {text!r}: STEPS >= 1, shares >= 0 adding up to at most 1")
    return out


def sft_cases(run: Path) -> list[Case]:
    """The run's SFT rows whose first call is a Rotate of their picture by an angle left unstated
    (`tiny_warmup.turned_angle`)."""
    from box_copy import sft_rows

    from canvasagent.training.tiny_warmup import turned_angle

    return [(row["messages"][1], list(row["images"])[:1], angle, row) for row in sft_rows(run)
            if (angle := turned_angle(row)) is not None]


def held_out_cases(run: Path) -> list[Case]:
    """The run's GRPO and evaluation tasks whose first reference call is a Rotate with an unstated angle."""
    from argument_learning import held_out_tasks
    from chain_behaviour import stated

    from canvasagent.core.episode import user_content

    out: list[Case] = []
    for t in held_out_tasks(run):
        refs = t.meta.get("reference_calls") or []
        if refs and refs[0]["name"] == "Rotate" and len(t.images) == 1 and not stated(refs[0]["arguments"]["angle"], t.instruction):
            out.append(({"role": "user", "content": user_content(t)}, list(t.images)[:1], int(refs[0]["arguments"]["angle"]),
                        None))
    return out


def prompt(processor: Any, user: dict[str, Any]) -> str:
    msg = {"role": "user", "content": [p if p.get("type") != "image" else {"type": "image"} for p in user["content"]]}
    return processor.apply_chat_template([msg], add_generation_prompt=True, tokenize=False)


def train(start: Path, out: Path, rows: list[Case], kind: str, steps: int, seed: int, profile: Any) -> float:
    """Train a copy of `start` into `out` on `rows` (`fresh`: each with a scene drawn afresh,
    `tiny_warmup.fresh_scene`), through the warmup's own examples and step; returns seconds."""
    from canvasagent.core.models.loading import load_policy, load_processor
    from canvasagent.training.tiny_warmup import fresh_scene, save_beside, train_on_draws, warmup_example

    processor, model = load_processor(str(start)), load_policy(str(start))
    rng, pad = random.Random(seed), processor.tokenizer.pad_token_id or 0

    def draw() -> tuple:
        row = rng.choice(rows)[3]
        return warmup_example(processor, fresh_scene(row, rng, profile) if kind == "fresh" else row, images=True)

    t0 = time.perf_counter()
    train_on_draws(model, draw, steps, seed, pad, f"angle reading {kind}")
    save_beside(model, start, out)
    return time.perf_counter() - t0


def measure(model_dir: Path, sets: list[list[Case]]) -> list[dict[str, Any]]:
    """Per set: exact share, count and, per reference angle, the angles written (None: no Rotate angle)."""
    import torch

    from canvasagent.core.models.loading import load_policy, load_processor

    processor, model = load_processor(str(model_dir)), load_policy(str(model_dir))
    model.eval()
    tok = processor.tokenizer

    def columns(cases: list[Case]) -> dict[str, Any]:
        written: dict[int, Counter] = {a: Counter() for a in ANGLES}
        exact = 0
        for user, images, want, _ in cases:
            enc = processor(text=[prompt(processor, user)], images=images, return_tensors="pt")
            out = model.generate(**enc, max_new_tokens=64, do_sample=False)
            m = CALL_ANGLE.search(tok.decode(out[0, enc["input_ids"].shape[1]:]))
            got = int(m.group(1)) if m else None
            exact += got == want
            written.setdefault(want, Counter())[got] += 1
        return {"n": len(cases), "exact": exact, "written": written}

    with torch.inference_mode():
        return [columns(c) for c in sets]


def report(run: Path, results: list[tuple[str, list[dict[str, Any]], float | None]], seed: int) -> str:
    def spread(col: dict[str, Any]) -> str:
        return "; ".join(f"{a}: " + ", ".join(f"{k if k is not None else 'none'}×{v}" for k, v in sorted(c.items(), key=lambda kv: str(kv[0])))
                         for a, c in col["written"].items() if c)

    lines = [
        f"# Reading the correcting angle from the picture (`{run}`)",
        "",
        f"Seed {seed}, 8 examples a step. Greedy, first user turn with its image, no system "
        "turn; the first Rotate call's angle against the reference (chance 1/3). Written angles per reference angle.",
        "",
        "| model | held out: exact | written (reference: written×n) | SFT rows: exact | written | train s |",
        "|---|---|---|---|---|---|",
    ]
    for name, (h, s), secs in results:
        lines.append(f"| {name} | {h['exact'] / h['n']:.3f} ({h['exact']}/{h['n']}) | {spread(h)} | "
                     f"{s['exact'] / s['n']:.3f} ({s['exact']}/{s['n']}) | {spread(s)} | {'—' if secs is None else f'{secs:.0f}'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--from", dest="start", type=Path, help="model folder to train from (default RUN/sft/tiny_warm)")
    ap.add_argument("--variants", nargs="*", default=["written:600", "fresh:600"], help="KIND:STEPS trainings to run")
    ap.add_argument("--measure", nargs="*", type=Path, default=[], help="model folders to measure as they are")
    ap.add_argument("--keep", type=Path, help="keep each trained model in a folder under this one")
    ap.add_argument("--profile", choices=[p.value for p in Profile], default=Profile.CANVASCRAFT.value,
                    help="the profile of the run's toolbox, which decides which way a Rotate turns (the testbed's: canvascraft)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--results", type=Path)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    variants = [variant(v) for v in args.variants]
    start = args.start or args.run / "sft" / "tiny_warm"
    base = args.run / "sft" / "tiny_base"
    for d in [start] * any(v[0] != "warmup" for v in variants) + [base] * any(v[0] == "warmup" for v in variants) + args.measure:
        if not (d / "config.json").exists():
            raise SystemExit(f"{d}: not a model folder")
    rows, held = sft_cases(args.run), held_out_cases(args.run)
    if not rows or not held:
        raise SystemExit(f"{args.run}: {len(rows)} SFT rows and {len(held)} held-out tasks turn an unstated angle; need both")
    logging.info("%d SFT rows, %d held-out tasks", len(rows), len(held))
    results: list[tuple[str, list[dict[str, Any]], float | None]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind, steps, box, angle in variants:
            out = (args.keep or Path(tmp)) / (f"warmup_{box:g}_{angle:g}_{steps}" if kind == "warmup" else f"{kind}_{steps}")
            if kind == "warmup":
                from box_copy import sft_rows as warmup_rows

                from canvasagent.training.tiny_warmup import warm_up

                t0 = time.perf_counter()
                warm_up(base, warmup_rows(args.run), steps, out, seed=args.seed, box_share=box, angle_share=angle,
                        profile=Profile(args.profile))
                secs, name = time.perf_counter() - t0, f"warmup from the base, {steps} steps, box share {box:g}, angle share {angle:g}"
            else:
                if out.exists():
                    shutil.rmtree(out)
                secs = train(start, out, rows, kind, steps, args.seed, Profile(args.profile))
                name = f"from `{start}`: " + (f"fresh scenes, {steps} steps" if kind == "fresh" else f"rows as written, {steps} steps")
            results.append((name, measure(out, [held, rows]), secs))
            print(f"  {results[-1][0]}: held-out exact {results[-1][1][0]['exact']}/{len(held)}", file=sys.stderr, flush=True)
    for d in args.measure:
        results.append((f"`{d}`", measure(d, [held, rows]), None))
    from markdown_out import emit

    emit(report(args.run, results, args.seed), args.results)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
