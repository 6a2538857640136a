"""Whether the tiny model's text-only warmup teaches it to copy a box that the instruction states.

    python benchmarks/box_copy.py RUN [--variants 0:1600 0.25:1600 0.25:1600:written] [--warm DIR ...]
        [--seed 0] [--results FILE]

RUN is a pipeline run folder (`canvasagent pipeline --out RUN`, or a seed folder of
`benchmarks/train_evidence.py`) with its CanvasCraft data and `sft/tiny_base`.

* Each variant `SHARE:STEPS` runs the real warmup (`canvasagent.training.tiny_warmup.warm_up` with
  `box_share=SHARE`, STEPS steps, seed `--seed`) from the run's untrained base on the run's SFT
  rows, into a temporary folder. SHARE 0 is the warmup as the warm600 testbed runs it: every row
  drawn uniformly and used as written. `SHARE:STEPS:written` is the control: the same draws (the
  same rows in the same order) with each stated-box row's box as written (`fresh_box` draws its
  box and returns the row unchanged), so the share and the fresh boxes are told apart.
* Each `--warm DIR` is an existing warm folder measured as it is (e.g. `RUN/sft/tiny_warm`).

Measured greedily in the warmup's own layout (the first user turn as text, no system turn, no
image), the first `"bbox": "[...]"` argument of the reply against the stated box:
* **held out**: the run's GRPO and evaluation tasks whose instruction states a box that no SFT row
  states (any that one does are left out and counted in the report);
* **SFT rows**: the SFT rows whose instruction states a box, their own boxes.
Columns: exact (the call's box is the stated one), SFT box (on held-out tasks: the call writes a
box of an SFT row instead), digit accuracy (the share of the stated box's digits that the call's
box has in the same place of the same corner, units with units; a missing box scores 0; every
unit digit of these boxes is 0, so a wrong box of the same shape still scores about 0.4), and no
box. A model that learned its rows' boxes by heart, instruction by instruction, is exact on SFT
rows and not on held-out ones; the SFT box column says whether it also writes those boxes
elsewhere.

Prints a markdown report and writes it to `--results`.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

CALL_BOX = re.compile(r'"bbox": "(\[[^"\]]*\])"')


def variant(text: str) -> tuple[float, int, bool]:
    """"0.25:1600" -> (0.25, 1600, True); "0.25:1600:written" -> (0.25, 1600, False): (share,
    steps, fresh boxes). Refuses anything else."""
    parts = text.split(":")
    try:
        if len(parts) not in (2, 3) or parts[2:] not in ([], ["written"]):
            raise ValueError
        out = float(parts[0]), int(parts[1]), len(parts) == 2
    except ValueError:
        raise SystemExit(f"variant {text!r}: expected SHARE:STEPS or SHARE:STEPS:written, e.g. 0.25:1600") from None
    if not 0 <= out[0] <= 1 or out[1] < 1:
        raise SystemExit(f"variant {text!r}: SHARE in [0, 1], STEPS >= 1")
    return out


def digit_accuracy(got: str | None, want: str) -> float:
    """Share of `want`'s digits that `got` has in the same place (units with units) of the same
    corner; 0 without `got`."""
    wants, gots = re.findall(r"\d+", want), re.findall(r"\d+", got or "")
    right = sum(a == b for i, w in enumerate(wants) for a, b in zip(reversed(w), reversed(gots[i] if i < len(gots) else "")))
    return right / sum(len(w) for w in wants)


def sft_rows(run: Path) -> list[dict[str, Any]]:
    """The run's SFT rows as SFT renders them (the system turn left empty: the warmup drops it)."""
    from canvascraft.build import shard_files
    from canvascraft.formats import read_rows, trajectory_of

    from canvasagent.training.messages import sft_example

    files = shard_files(run / "data" / "canvascraft" / "sft", "sft")
    if not files:
        raise SystemExit(f"{run}: no SFT shards under data/canvascraft/sft")
    return [sft_example(trajectory_of(r), "") for r in read_rows(files)]


def held_out(run: Path) -> list[tuple[dict[str, Any], str]]:
    """(user message, stated box) of the run's GRPO and evaluation tasks whose instruction states a box."""
    from argument_learning import held_out_tasks

    from canvasagent.core.episode import user_content
    from canvasagent.training.tiny_warmup import STATED_BOX

    return [({"role": "user", "content": user_content(t)}, m.group(0))
            for t in held_out_tasks(run) if (m := STATED_BOX.search(t.instruction))]


def measure(model_dir: Path, sets: list[list[tuple[dict[str, Any], str]]], sft_boxes: set[str]) -> list[dict[str, float]]:
    """The columns of each of `sets` ((user message, stated box) cases) for the model in `model_dir`, loaded once."""
    import torch

    from canvasagent.core.models.loading import load_policy, load_processor
    from canvasagent.training.tiny_warmup import warmup_prompt

    processor, model = load_processor(str(model_dir)), load_policy(str(model_dir))
    model.eval()
    tok = processor.tokenizer

    def columns(cases: list[tuple[dict[str, Any], str]]) -> dict[str, float]:
        exact = sft_box = none = 0
        digits = 0.0
        for user, want in cases:
            ids = tok(warmup_prompt(processor, user), return_tensors="pt")["input_ids"]
            out = model.generate(input_ids=ids, max_new_tokens=160, do_sample=False)
            m = CALL_BOX.search(tok.decode(out[0, ids.shape[1]:]))
            got = m.group(1) if m else None
            exact += got == want
            sft_box += got is not None and got != want and got in sft_boxes
            none += got is None
            digits += digit_accuracy(got, want)
        n = len(cases)
        return {"n": n, "exact": exact / n, "sft_box": sft_box / n, "digits": digits / n, "no_box": none / n}

    with torch.inference_mode():
        return [columns(c) for c in sets]


def report(run: Path, results: list[tuple[str, dict, dict, float | None]], n_rows: int, n_boxed: int, n_shared: int,
           seed: int) -> str:
    lines = [
        f"# Box copying after the tiny warmup (`{run}`)",
        "",
        f"SFT rows: {n_rows}, of which {n_boxed} state a box; held-out tasks whose box an SFT row states too, left "
        f"out: {n_shared}. Warmups drawn with seed {seed}. Greedy, text only, the warmup's layout; the reply's first "
        "bbox against the stated box (digits: about 0.4 for a wrong box, its unit digits being 0).",
        "",
        "| model | held out: exact | SFT box | digits | no box | SFT rows: exact | digits | warmup s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, h, s, secs in results:
        lines.append(
            f"| {name} | {h['exact']:.3f} ({round(h['exact'] * h['n'])}/{h['n']}) | {h['sft_box']:.3f} | {h['digits']:.3f} "
            f"| {h['no_box']:.3f} | {s['exact']:.3f} ({round(s['exact'] * s['n'])}/{s['n']}) | {s['digits']:.3f} | {'—' if secs is None else f'{secs:.0f}'} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--variants", nargs="*", default=["0:1600", "0.25:1600", "0.25:1600:written"],
                    help="SHARE:STEPS[:written] warmups to run")
    ap.add_argument("--warm", nargs="*", type=Path, default=[], help="existing warm folders to measure as they are")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--results", type=Path)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from unittest import mock

    from canvasagent.training import tiny_warmup
    from canvasagent.training.tiny_warmup import stated_box, warm_up

    variants = [variant(v) for v in args.variants]
    base = args.run / "sft" / "tiny_base"
    if variants and not (base / "config.json").exists():
        raise SystemExit(f"{args.run}: no untrained base at sft/tiny_base")
    for d in args.warm:
        if not (d / "config.json").exists():
            raise SystemExit(f"{d}: not a model folder")
    rows = sft_rows(args.run)
    boxed = [(r["messages"][1], b) for r in rows if (b := stated_box(r))]
    sft_boxes = {b for _, b in boxed}
    every = held_out(args.run)
    cases = [(u, b) for u, b in every if b not in sft_boxes]
    if not boxed or not cases:
        raise SystemExit(f"{args.run}: {len(boxed)} SFT rows and {len(cases)} held-out tasks state a box; need both")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for share, steps, fresh in variants:
            t0 = time.perf_counter()
            # The control draws a box, so the rows drawn are the same, and keeps each row's box as written.
            real = tiny_warmup.fresh_box
            with mock.patch.object(tiny_warmup, "fresh_box", real if fresh else lambda row, rng: (real(row, rng), row)[1]):
                warm = warm_up(base, rows, steps, Path(tmp) / f"warm_{share}_{steps}_{fresh}", seed=args.seed, box_share=share)
            secs = time.perf_counter() - t0
            name = f"warmup {steps} steps, box share {share:g}" + ("" if fresh or not share else ", boxes as written")
            results.append((name, *measure(warm, [cases, boxed], sft_boxes), secs))
            print(f"  {results[-1][0]}: held-out exact {results[-1][1]['exact']:.3f}", file=sys.stderr, flush=True)
    for d in args.warm:
        results.append((f"`{d}`", *measure(d, [cases, boxed], sft_boxes), None))
    from markdown_out import emit

    emit(report(args.run, results, len(rows), len(boxed), len(every) - len(cases), args.seed), args.results)


if __name__ == "__main__":
    main()
